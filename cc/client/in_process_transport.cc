#include "cc/client/in_process_transport.h"

#include "absl/strings/str_cat.h"

namespace pserver {

InProcessTransport::InProcessTransport(ParameterStore* store, uint32_t index)
    : store_(store), index_(index), address_(absl::StrCat("in-process:", index)) {}

void InProcessTransport::InitParam(const v1::InitParamRequest& request, absl::Time, Done done) {
  done(store_->Init(request.parameter(), request.config()));
}

void InProcessTransport::FinishInitParams(absl::Time, Done done) {
  store_->FinishInit();
  done(absl::OkStatus());
}

void InProcessTransport::GetStats(v1::GetStatsResponse* response, absl::Time, Done done) {
  store_->FillStats(response->mutable_stats());
  response->mutable_stats()->set_index(index_);
  done(absl::OkStatus());
}

void InProcessTransport::Push(absl::Span<const GradientView> grads, absl::Time, Done done) {
  done(store_->ApplyGradients(grads));
}

absl::Status InProcessTransport::Read(absl::Span<const v1::ParamRef> refs,
                                      const BlockSink& sink) {
  v1::Parameter header;
  for (const v1::ParamRef& ref : refs) {
    header.Clear();
    absl::Status delivered;
    absl::Status read = store_->Read(ref, &header, [&](absl::string_view bytes) {
      delivered = sink(header, Segments{bytes});
    });
    if (!read.ok()) return read;
    if (!delivered.ok()) return delivered;
  }
  return absl::OkStatus();
}

void InProcessTransport::Pull(absl::Span<const v1::ParamRef> refs, BlockSink sink, absl::Time,
                              Done done) {
  done(Read(refs, sink));
}

void InProcessTransport::PushPull(absl::Span<const GradientView> grads,
                                  absl::Span<const v1::ParamRef> refs, BlockSink sink,
                                  absl::Time, Done done) {
  absl::Status status = store_->ApplyGradients(grads);
  if (status.ok()) status = Read(refs, sink);
  done(status);
}

std::vector<std::unique_ptr<Transport>> InProcessTransports(
    const std::vector<ParameterStore*>& stores) {
  std::vector<std::unique_ptr<Transport>> transports;
  for (size_t i = 0; i < stores.size(); ++i) {
    transports.push_back(std::make_unique<InProcessTransport>(stores[i], static_cast<uint32_t>(i)));
  }
  return transports;
}

}  // namespace pserver
