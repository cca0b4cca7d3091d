#include "cc/client/client.h"

#include <cmath>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "cc/client/call_group.h"
#include "cc/client/grpc_transport.h"
#include "cc/core/status_macros.h"

namespace pserver {
namespace {

absl::Status CheckOptions(const ClientOptions& options, size_t num_servers) {
  if (num_servers == 0) return absl::InvalidArgumentError("client options name no servers");
  if (options.block_bytes == 0) return absl::InvalidArgumentError("block_bytes must be > 0");
  if (options.max_request_bytes == 0) {
    return absl::InvalidArgumentError("max_request_bytes must be > 0");
  }
  if (options.timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("timeout must be > 0");
  }
  return absl::OkStatus();
}

absl::Status CheckName(const std::string& name) {
  if (name.empty()) return absl::InvalidArgumentError("parameter name is empty");
  return absl::OkStatus();
}

// Requests to one server, holding the indices of the items they carry.
struct Batch {
  int server;
  std::vector<size_t> items;
};

// Groups items per server into batches of about `max_bytes` payload each (an
// item larger than that travels alone), keeping the items' order.
std::vector<Batch> PackBatches(absl::Span<const int> servers, absl::Span<const size_t> bytes,
                               size_t max_bytes, int num_servers) {
  std::vector<Batch> batches;
  std::vector<int> open(num_servers, -1);
  std::vector<size_t> open_bytes(num_servers, 0);
  for (size_t i = 0; i < servers.size(); ++i) {
    const int s = servers[i];
    if (open[s] < 0 || open_bytes[s] + bytes[i] > max_bytes) {
      open[s] = static_cast<int>(batches.size());
      batches.push_back(Batch{s, {}});
      open_bytes[s] = 0;
    }
    batches[open[s]].items.push_back(i);
    open_bytes[s] += bytes[i];
  }
  return batches;
}

template <typename T>
double SumOfSquares(absl::string_view bytes) {
  const T* v = reinterpret_cast<const T*>(bytes.data());
  const size_t n = bytes.size() / sizeof(T);
  double sum = 0;
  for (size_t i = 0; i < n; ++i) sum += static_cast<double>(v[i]) * v[i];
  return sum;
}

double L2Norm(const Tensor& t) {
  double sum = 0;
  DispatchFloating(t.type(), [&](auto tag) {
    sum = SumOfSquares<typename decltype(tag)::type>(t.bytes());
  });
  return std::sqrt(sum);
}

}  // namespace

// A parameter being read back, block by block.
struct Client::Assembly {
  std::string name;
  std::optional<Layout> layout;
  std::string bytes;
  std::vector<bool> received;
};

struct Client::Fetch {
  size_t slot;            // index into the assemblies
  v1::ParamRef ref;
  int server;
  size_t expected_bytes;  // for packing requests; 0 when unknown
};

Client::Client(const ClientOptions& options, std::vector<std::unique_ptr<Transport>> transports)
    : options_(options),
      placement_(static_cast<int>(transports.size()), options.block_bytes),
      transports_(std::move(transports)) {}

Client::~Client() = default;

absl::StatusOr<std::unique_ptr<Client>> Client::Connect(const ClientOptions& options) {
  PS_RETURN_IF_ERROR(CheckOptions(options, options.servers.size()));
  std::vector<std::unique_ptr<Transport>> transports;
  for (const std::string& address : options.servers) {
    PS_ASSIGN_OR_RETURN(auto transport, GrpcTransport::Create(address));
    transports.push_back(std::move(transport));
  }
  return Create(options, std::move(transports));
}

absl::StatusOr<std::unique_ptr<Client>> Client::Create(
    const ClientOptions& options, std::vector<std::unique_ptr<Transport>> transports) {
  PS_RETURN_IF_ERROR(CheckOptions(options, transports.size()));
  for (const auto& transport : transports) {
    if (transport == nullptr) return absl::InvalidArgumentError("a transport is null");
  }
  return std::unique_ptr<Client>(new Client(options, std::move(transports)));
}

std::optional<Client::Layout> Client::FindLayout(const std::string& name) const {
  absl::ReaderMutexLock lock(&layouts_mu_);
  auto it = layouts_.find(name);
  if (it == layouts_.end()) return std::nullopt;
  return it->second;
}

void Client::RememberLayout(const std::string& name, Layout layout) {
  absl::MutexLock lock(&layouts_mu_);
  layouts_.insert_or_assign(name, std::move(layout));
}

absl::Status Client::InitParam(const std::string& name, const Tensor& value,
                               const v1::ParameterConfig& config) {
  return InitParams({ParamInit{name, value, config}});
}

absl::Status Client::InitParams(absl::Span<const ParamInit> params) {
  std::vector<v1::InitParamRequest> requests;
  std::vector<int> servers;
  std::vector<Layout> layouts;
  for (const ParamInit& p : params) {
    PS_RETURN_IF_ERROR(CheckName(p.name));
    PS_RETURN_IF_ERROR(ValidateStorableType(p.value.type(), absl::StrCat("parameter '", p.name, "'")));
    PS_ASSIGN_OR_RETURN(int64_t total, NumElements(p.value.shape()));
    if (total != p.value.num_elements() || total == 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "parameter '", p.name, "': shape ", ShapeString(p.value.shape()), " needs ", total,
          " values, the tensor holds ", p.value.num_elements()));
    }
    const size_t esize = ElementSize(p.value.type());
    std::vector<BlockSpec> blocks = placement_.Blocks(p.name, total, esize);
    for (const BlockSpec& b : blocks) {
      v1::InitParamRequest& request = requests.emplace_back();
      v1::Parameter* param = request.mutable_parameter();
      param->set_name(p.name);
      param->set_element_type(p.value.type());
      param->mutable_shape()->Assign(p.value.shape().begin(), p.value.shape().end());
      param->set_content(p.value.bytes().data() + b.offset * esize, b.elements * esize);
      param->mutable_block()->set_index(b.index);
      param->mutable_block()->set_count(b.count);
      param->mutable_block()->set_offset(b.offset);
      *request.mutable_config() = p.config;
      servers.push_back(b.server);
    }
    layouts.push_back(Layout{p.value.type(), p.value.shape(), static_cast<uint64_t>(total),
                             static_cast<uint32_t>(blocks.size())});
  }
  std::vector<v1::InitParamResponse> responses(requests.size());
  {
    CallGroup group;
    const absl::Time deadline = Deadline();
    for (size_t i = 0; i < requests.size(); ++i) {
      Transport& t = *transports_[servers[i]];
      t.InitParam(requests[i], &responses[i], deadline, group.Add(t.address()));
    }
    PS_RETURN_IF_ERROR(group.Wait());
  }
  for (size_t i = 0; i < params.size(); ++i) RememberLayout(params[i].name, layouts[i]);
  return absl::OkStatus();
}

absl::Status Client::FinishInitParams() {
  v1::FinishInitParamsRequest request;
  std::vector<v1::FinishInitParamsResponse> responses(transports_.size());
  CallGroup group;
  const absl::Time deadline = Deadline();
  for (size_t i = 0; i < transports_.size(); ++i) {
    transports_[i]->FinishInitParams(request, &responses[i], deadline,
                                     group.Add(transports_[i]->address()));
  }
  return group.Wait();
}

absl::Status Client::RunFetches(const std::vector<Fetch>& fetches,
                                std::vector<Assembly>& assemblies) {
  if (fetches.empty()) return absl::OkStatus();
  std::vector<int> servers;
  std::vector<size_t> bytes;
  for (const Fetch& f : fetches) {
    servers.push_back(f.server);
    bytes.push_back(f.expected_bytes);
  }
  const std::vector<Batch> batches =
      PackBatches(servers, bytes, options_.max_request_bytes, num_servers());
  std::vector<v1::GetParamsRequest> requests(batches.size());
  std::vector<v1::GetParamsResponse> responses(batches.size());
  {
    CallGroup group;
    const absl::Time deadline = Deadline();
    for (size_t b = 0; b < batches.size(); ++b) {
      for (size_t item : batches[b].items) *requests[b].add_params() = fetches[item].ref;
      Transport& t = *transports_[batches[b].server];
      t.GetParams(requests[b], &responses[b], deadline, group.Add(t.address()));
    }
    PS_RETURN_IF_ERROR(group.Wait());
  }
  for (size_t b = 0; b < batches.size(); ++b) {
    if (responses[b].parameters_size() != static_cast<int>(batches[b].items.size())) {
      return absl::DataLossError(absl::StrCat(
          "server ", transports_[batches[b].server]->address(), " returned ",
          responses[b].parameters_size(), " parameters for ", batches[b].items.size(),
          " asked"));
    }
    for (size_t j = 0; j < batches[b].items.size(); ++j) {
      Assembly& a = assemblies[fetches[batches[b].items[j]].slot];
      v1::Parameter& p = *responses[b].mutable_parameters(static_cast<int>(j));
      const std::string what = absl::StrCat("parameter '", a.name, "' from server ",
                                            transports_[batches[b].server]->address());
      if (!a.layout.has_value()) {
        PS_RETURN_IF_ERROR(ValidateStorableType(p.element_type(), what));
        Shape shape(p.shape().begin(), p.shape().end());
        PS_ASSIGN_OR_RETURN(int64_t total, NumElements(shape));
        Layout layout{p.element_type(), std::move(shape), static_cast<uint64_t>(total),
                      std::max<uint32_t>(1, p.block().count())};
        RememberLayout(a.name, layout);
        a.layout = std::move(layout);
      }
      const Layout& layout = *a.layout;
      const size_t esize = ElementSize(layout.type);
      const size_t total_bytes = layout.elements * esize;
      const uint32_t index = p.block().index();
      if (p.element_type() != layout.type || std::max<uint32_t>(1, p.block().count()) != layout.blocks ||
          index >= layout.blocks || p.block().offset() * esize + p.content().size() > total_bytes) {
        return absl::DataLossError(absl::StrCat(what, ": block ", index,
                                                " does not fit the parameter's layout"));
      }
      a.received.resize(layout.blocks, false);
      if (layout.blocks == 1) {
        a.bytes = std::move(*p.mutable_content());
      } else {
        a.bytes.resize(total_bytes);
        std::memcpy(a.bytes.data() + p.block().offset() * esize, p.content().data(),
                    p.content().size());
      }
      a.received[index] = true;
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<Tensor> Client::GetParam(const std::string& name) {
  PS_ASSIGN_OR_RETURN(std::vector<Tensor> tensors, GetParams({name}));
  return std::move(tensors[0]);
}

absl::StatusOr<std::vector<Tensor>> Client::GetParams(absl::Span<const std::string> names) {
  std::vector<Assembly> parts(names.size());
  std::vector<Fetch> first;  // block 0 of parameters whose layout is unknown
  for (size_t i = 0; i < names.size(); ++i) {
    PS_RETURN_IF_ERROR(CheckName(names[i]));
    parts[i].name = names[i];
    parts[i].layout = FindLayout(names[i]);
    if (!parts[i].layout.has_value()) {
      v1::ParamRef ref;
      ref.set_name(names[i]);
      first.push_back(Fetch{i, std::move(ref), placement_.HomeServer(names[i]), 0});
    }
  }
  PS_RETURN_IF_ERROR(RunFetches(first, parts));

  std::vector<Fetch> rest;
  for (size_t i = 0; i < parts.size(); ++i) {
    const Layout& layout = *parts[i].layout;
    const size_t block_bytes = layout.elements * ElementSize(layout.type) / layout.blocks;
    parts[i].received.resize(layout.blocks, false);
    for (uint32_t b = 0; b < layout.blocks; ++b) {
      if (parts[i].received[b]) continue;
      v1::ParamRef ref;
      ref.set_name(names[i]);
      ref.mutable_block()->set_index(b);
      ref.mutable_block()->set_count(layout.blocks);
      rest.push_back(Fetch{i, std::move(ref), placement_.ServerOf(names[i], b), block_bytes});
    }
  }
  PS_RETURN_IF_ERROR(RunFetches(rest, parts));

  std::vector<Tensor> out;
  out.reserve(parts.size());
  for (Assembly& a : parts) {
    PS_ASSIGN_OR_RETURN(Tensor t, Tensor::Create(a.layout->type, a.layout->shape,
                                                 std::move(a.bytes)));
    out.push_back(std::move(t));
  }
  return out;
}

absl::Status Client::CheckGradient(const NamedTensor& grad) const {
  PS_RETURN_IF_ERROR(CheckName(grad.name));
  const std::string what = absl::StrCat("gradient for parameter '", grad.name, "'");
  PS_RETURN_IF_ERROR(ValidateStorableType(grad.tensor.type(), what));
  if (grad.tensor.num_elements() == 0) {
    return absl::InvalidArgumentError(absl::StrCat(what, " is empty"));
  }
  std::optional<Layout> layout = FindLayout(grad.name);
  if (!layout.has_value()) return absl::OkStatus();  // the server checks it
  if (grad.tensor.type() != layout->type) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": element type ", ElementTypeName(grad.tensor.type()), " received, ",
        ElementTypeName(layout->type), " expected"));
  }
  if (static_cast<uint64_t>(grad.tensor.num_elements()) != layout->elements) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": ", grad.tensor.num_elements(), " values received, ", layout->elements,
        " expected (shape ", ShapeString(layout->shape), ")"));
  }
  const uint32_t blocks = placement_.BlockCount(layout->elements, ElementSize(layout->type));
  if (blocks != layout->blocks) {
    return absl::InvalidArgumentError(absl::StrCat(
        "parameter '", grad.name, "' is stored as ", layout->blocks,
        " blocks; this client's block_bytes gives ", blocks,
        ": every client of a cluster must use the same block size"));
  }
  return absl::OkStatus();
}

absl::Status Client::SendGrad(const std::string& name, const Tensor& grad) {
  return SendGrads({NamedTensor{name, grad}});
}

absl::Status Client::SendGrads(absl::Span<const NamedTensor> grads) {
  for (const NamedTensor& grad : grads) PS_RETURN_IF_ERROR(CheckGradient(grad));

  std::vector<v1::Gradient> parts;
  std::vector<int> servers;
  std::vector<size_t> bytes;
  for (const NamedTensor& grad : grads) {
    const size_t esize = ElementSize(grad.tensor.type());
    std::vector<BlockSpec> blocks =
        placement_.Blocks(grad.name, grad.tensor.num_elements(), esize);
    // Clip-by-norm on the servers must see the whole gradient's norm.
    std::optional<double> norm;
    if (blocks.size() > 1 && IsFloatingPoint(grad.tensor.type())) norm = L2Norm(grad.tensor);
    for (const BlockSpec& b : blocks) {
      v1::Gradient& g = parts.emplace_back();
      g.set_name(grad.name);
      g.set_element_type(grad.tensor.type());
      g.set_content(grad.tensor.bytes().data() + b.offset * esize, b.elements * esize);
      g.mutable_block()->set_index(b.index);
      g.mutable_block()->set_count(b.count);
      g.mutable_block()->set_offset(b.offset);
      if (norm.has_value()) g.set_global_norm(*norm);
      servers.push_back(b.server);
      bytes.push_back(b.elements * esize);
    }
  }
  const std::vector<Batch> batches =
      PackBatches(servers, bytes, options_.max_request_bytes, num_servers());
  std::vector<v1::SendGradsRequest> requests(batches.size());
  std::vector<v1::SendGradsResponse> responses(batches.size());
  CallGroup group;
  const absl::Time deadline = Deadline();
  for (size_t b = 0; b < batches.size(); ++b) {
    for (size_t item : batches[b].items) {
      *requests[b].add_gradients() = std::move(parts[item]);
    }
    Transport& t = *transports_[batches[b].server];
    t.SendGrads(requests[b], &responses[b], deadline, group.Add(t.address()));
  }
  return group.Wait();
}

absl::StatusOr<std::vector<v1::ServerStats>> Client::GetStats() {
  v1::GetStatsRequest request;
  std::vector<v1::GetStatsResponse> responses(transports_.size());
  {
    CallGroup group;
    const absl::Time deadline = Deadline();
    for (size_t i = 0; i < transports_.size(); ++i) {
      transports_[i]->GetStats(request, &responses[i], deadline,
                               group.Add(transports_[i]->address()));
    }
    PS_RETURN_IF_ERROR(group.Wait());
  }
  std::vector<v1::ServerStats> out;
  out.reserve(responses.size());
  for (auto& response : responses) out.push_back(std::move(*response.mutable_stats()));
  return out;
}

}  // namespace pserver
