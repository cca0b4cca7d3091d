#include "cc/client/client.h"

#include <algorithm>
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
  if (options.channels_per_server < 1) {
    return absl::InvalidArgumentError("channels_per_server must be >= 1");
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

v1::ParamRef BlockRefOf(const std::string& name, uint32_t index, uint32_t count) {
  v1::ParamRef ref;
  ref.set_name(name);
  ref.mutable_block()->set_index(index);
  ref.mutable_block()->set_count(count);
  return ref;
}

// A gradient's name and values, borrowed.
struct NamedTensorView {
  const std::string& name;
  const Tensor& tensor;
};

}  // namespace

// A parameter being read back, block by block, into `dest`. Blocks of one
// parameter may arrive concurrently: they write disjoint bytes and flags, and
// the layout and buffer are settled before more than one block is in flight.
struct Client::Assembly {
  std::string name;
  std::optional<Layout> layout;
  Tensor* dest = nullptr;
  std::vector<uint8_t> received;

  // Makes `dest` fit the layout, keeping its buffer when it already does.
  void Prepare() {
    const Layout& l = *layout;
    if (dest->type() != l.type || dest->shape() != l.shape) {
      *dest = *Tensor::Zeros(l.type, l.shape);  // the layout was validated
    }
    received.assign(l.blocks, 0);
  }
};

// One unit of work for one server: a gradient block to push, a block to read
// back into assemblies[slot], or both (push-pull).
struct Client::Item {
  int server;
  std::optional<GradientView> grad;
  std::optional<v1::ParamRef> ref;
  size_t slot = 0;
  size_t bytes = 0;  // payload, for packing requests
};

// What one request to one server carries.
struct Client::Exchange {
  int server;
  std::vector<GradientView> grads;
  std::vector<v1::ParamRef> refs;
  std::vector<size_t> slots;
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
    PS_ASSIGN_OR_RETURN(auto transport,
                        GrpcTransport::Create(address, options.channels_per_server));
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

// ---- init and control ---------------------------------------------------------------

std::vector<Client::GradRef> Client::RefsOf(absl::Span<const NamedTensor> grads) {
  std::vector<GradRef> refs;
  refs.reserve(grads.size());
  for (const NamedTensor& g : grads) refs.push_back(GradRef{&g.name, &g.tensor});
  return refs;
}

absl::Status Client::InitParam(const std::string& name, const Tensor& value,
                               const v1::ParameterConfig& config) {
  const InitRef ref{&name, &value, &config};
  return DoInitParams(absl::MakeConstSpan(&ref, 1));
}

absl::Status Client::InitParams(absl::Span<const ParamInit> params) {
  std::vector<InitRef> refs;
  refs.reserve(params.size());
  for (const ParamInit& p : params) refs.push_back(InitRef{&p.name, &p.value, &p.config});
  return DoInitParams(refs);
}

absl::Status Client::DoInitParams(absl::Span<const InitRef> params) {
  std::vector<v1::InitParamRequest> requests;
  std::vector<int> servers;
  std::vector<Layout> layouts;
  for (const InitRef& ref : params) {
    const ParamInit p{*ref.name, Tensor(), *ref.config};  // name and config only
    const Tensor& value = *ref.value;
    PS_RETURN_IF_ERROR(CheckName(p.name));
    PS_RETURN_IF_ERROR(
        ValidateStorableType(value.type(), absl::StrCat("parameter '", p.name, "'")));
    PS_ASSIGN_OR_RETURN(int64_t total, NumElements(value.shape()));
    if (total != value.num_elements() || total == 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "parameter '", p.name, "': shape ", ShapeString(value.shape()), " needs ", total,
          " values, the tensor holds ", value.num_elements()));
    }
    const size_t esize = ElementSize(value.type());
    std::vector<BlockSpec> blocks = placement_.Blocks(p.name, total, esize);
    for (const BlockSpec& b : blocks) {
      v1::InitParamRequest& request = requests.emplace_back();
      v1::Parameter* param = request.mutable_parameter();
      param->set_name(p.name);
      param->set_element_type(value.type());
      param->mutable_shape()->Assign(value.shape().begin(), value.shape().end());
      param->set_content(value.bytes().data() + b.offset * esize, b.elements * esize);
      param->mutable_block()->set_index(b.index);
      param->mutable_block()->set_count(b.count);
      param->mutable_block()->set_offset(b.offset);
      *request.mutable_config() = p.config;
      servers.push_back(b.server);
    }
    layouts.push_back(Layout{value.type(), value.shape(), static_cast<uint64_t>(total),
                             static_cast<uint32_t>(blocks.size())});
  }
  {
    CallGroup group;
    const absl::Time deadline = Deadline();
    for (size_t i = 0; i < requests.size(); ++i) {
      Transport& t = *transports_[servers[i]];
      t.InitParam(requests[i], deadline, group.Add(t.address()));
    }
    PS_RETURN_IF_ERROR(group.Wait());
  }
  for (size_t i = 0; i < params.size(); ++i) RememberLayout(*params[i].name, layouts[i]);
  return absl::OkStatus();
}

absl::Status Client::FinishInitParams() {
  CallGroup group;
  const absl::Time deadline = Deadline();
  for (auto& transport : transports_) {
    transport->FinishInitParams(deadline, group.Add(transport->address()));
  }
  return group.Wait();
}

absl::StatusOr<std::vector<v1::ServerStats>> Client::GetStats() {
  std::vector<v1::GetStatsResponse> responses(transports_.size());
  {
    CallGroup group;
    const absl::Time deadline = Deadline();
    for (size_t i = 0; i < transports_.size(); ++i) {
      transports_[i]->GetStats(&responses[i], deadline, group.Add(transports_[i]->address()));
    }
    PS_RETURN_IF_ERROR(group.Wait());
  }
  std::vector<v1::ServerStats> out;
  out.reserve(responses.size());
  for (auto& response : responses) out.push_back(std::move(*response.mutable_stats()));
  return out;
}

// ---- the bulk path ------------------------------------------------------------------

absl::Status Client::PlaceBlock(Assembly& a, const v1::Parameter& header,
                                const Segments& content, const std::string& from) {
  const std::string what = absl::StrCat("parameter '", a.name, "' from server ", from);
  if (!a.layout.has_value()) {
    // The first block of a parameter this client has not seen: learn its layout.
    PS_RETURN_IF_ERROR(ValidateStorableType(header.element_type(), what));
    Shape shape(header.shape().begin(), header.shape().end());
    PS_ASSIGN_OR_RETURN(int64_t total, NumElements(shape));
    Layout layout{header.element_type(), std::move(shape), static_cast<uint64_t>(total),
                  std::max<uint32_t>(1, header.block().count())};
    RememberLayout(a.name, layout);
    a.layout = std::move(layout);
    a.Prepare();
  }
  const Layout& layout = *a.layout;
  const size_t esize = ElementSize(layout.type);
  const size_t size = SegmentsSize(content);
  const uint32_t index = header.block().index();
  if (header.name() != a.name || header.element_type() != layout.type ||
      std::max<uint32_t>(1, header.block().count()) != layout.blocks ||
      index >= layout.blocks || header.block().offset() > layout.elements ||
      size > (layout.elements - header.block().offset()) * esize) {
    return absl::DataLossError(
        absl::StrCat(what, ": block ", index, " does not fit the parameter's layout"));
  }
  CopySegments(content, a.dest->mutable_data() + header.block().offset() * esize);
  a.received[index] = 1;
  return absl::OkStatus();
}

absl::Status Client::Run(const std::vector<Item>& items, std::vector<Assembly>& assemblies) {
  if (items.empty()) return absl::OkStatus();
  std::vector<int> servers;
  std::vector<size_t> bytes;
  for (const Item& item : items) {
    servers.push_back(item.server);
    bytes.push_back(item.bytes);
  }
  std::vector<Exchange> exchanges;
  for (const Batch& batch :
       PackBatches(servers, bytes, options_.max_request_bytes, num_servers())) {
    Exchange& x = exchanges.emplace_back();
    x.server = batch.server;
    for (size_t i : batch.items) {
      if (items[i].grad.has_value()) x.grads.push_back(*items[i].grad);
      if (items[i].ref.has_value()) {
        x.refs.push_back(*items[i].ref);
        x.slots.push_back(items[i].slot);
      }
    }
  }
  CallGroup group;
  const absl::Time deadline = Deadline();
  for (Exchange& x : exchanges) {
    Transport& t = *transports_[x.server];
    if (x.refs.empty()) {
      t.Push(x.grads, deadline, group.Add(t.address()));
      continue;
    }
    // Blocks come back in request order; the sink runs them one at a time.
    auto next = std::make_shared<size_t>(0);
    Transport::BlockSink sink = [this, &x, &assemblies, &t, next](
                                    const v1::Parameter& header, const Segments& content) {
      if (*next >= x.slots.size()) {
        return absl::DataLossError(
            absl::StrCat("server ", t.address(), " returned more blocks than asked"));
      }
      return PlaceBlock(assemblies[x.slots[(*next)++]], header, content, t.address());
    };
    if (x.grads.empty()) {
      t.Pull(x.refs, std::move(sink), deadline, group.Add(t.address()));
    } else {
      t.PushPull(x.grads, x.refs, std::move(sink), deadline, group.Add(t.address()));
    }
  }
  return group.Wait();
}

absl::StatusOr<Tensor> Client::GetParam(const std::string& name) {
  PS_ASSIGN_OR_RETURN(std::vector<Tensor> tensors, GetParams({name}));
  return std::move(tensors[0]);
}

absl::StatusOr<std::vector<Tensor>> Client::GetParams(absl::Span<const std::string> names) {
  std::vector<Tensor> out(names.size());
  PS_RETURN_IF_ERROR(GetParamsInto(names, absl::MakeSpan(out)));
  return out;
}

absl::Status Client::GetParamsInto(absl::Span<const std::string> names,
                                   absl::Span<Tensor> outs) {
  if (outs.size() != names.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "GetParamsInto: ", names.size(), " names but ", outs.size(), " output tensors"));
  }
  std::vector<Assembly> parts(names.size());
  std::vector<Item> first;  // block 0 of parameters whose layout is unknown
  for (size_t i = 0; i < names.size(); ++i) {
    PS_RETURN_IF_ERROR(CheckName(names[i]));
    parts[i].name = names[i];
    parts[i].dest = &outs[i];
    parts[i].layout = FindLayout(names[i]);
    if (parts[i].layout.has_value()) {
      parts[i].Prepare();
    } else {
      v1::ParamRef ref;
      ref.set_name(names[i]);
      first.push_back(Item{placement_.HomeServer(names[i]), std::nullopt, std::move(ref), i, 0});
    }
  }
  PS_RETURN_IF_ERROR(Run(first, parts));

  std::vector<Item> rest;
  for (size_t i = 0; i < parts.size(); ++i) {
    const Layout& layout = *parts[i].layout;
    const size_t block_bytes = layout.elements * ElementSize(layout.type) / layout.blocks;
    for (uint32_t b = 0; b < layout.blocks; ++b) {
      if (parts[i].received[b]) continue;
      rest.push_back(Item{placement_.ServerOf(names[i], b), std::nullopt,
                          BlockRefOf(names[i], b, layout.blocks), i, block_bytes});
    }
  }
  PS_RETURN_IF_ERROR(Run(rest, parts));
  for (const Assembly& a : parts) {
    const auto got = std::count(a.received.begin(), a.received.end(), 1);
    if (got != static_cast<long>(a.received.size())) {
      return absl::DataLossError(absl::StrCat("parameter '", a.name, "': received ", got,
                                              " of ", a.received.size(), " blocks"));
    }
  }
  return absl::OkStatus();
}

absl::Status Client::CheckGradient(const GradRef& ref) const {
  const NamedTensorView grad{*ref.name, *ref.tensor};
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

std::vector<GradientView> Client::GradientBlocks(const GradRef& ref,
                                                 std::vector<int>* servers) const {
  const NamedTensorView grad{*ref.name, *ref.tensor};
  const size_t esize = ElementSize(grad.tensor.type());
  const std::vector<BlockSpec> blocks =
      placement_.Blocks(grad.name, grad.tensor.num_elements(), esize);
  // Clip-by-norm on the servers must see the whole gradient's norm.
  std::optional<double> norm;
  if (blocks.size() > 1 && IsFloatingPoint(grad.tensor.type())) norm = L2Norm(grad.tensor);
  std::vector<GradientView> views;
  for (const BlockSpec& b : blocks) {
    GradientView& v = views.emplace_back();
    v.name = grad.name;
    v.type = grad.tensor.type();
    v.block.set_index(b.index);
    v.block.set_count(b.count);
    v.block.set_offset(b.offset);
    v.global_norm = norm;
    v.content = absl::string_view(grad.tensor.bytes()).substr(b.offset * esize, b.elements * esize);
    servers->push_back(b.server);
  }
  return views;
}

absl::Status Client::SendGrad(const std::string& name, const Tensor& grad) {
  const GradRef ref{&name, &grad};
  return DoSendGrads(absl::MakeConstSpan(&ref, 1));
}

absl::Status Client::SendGrads(absl::Span<const NamedTensor> grads) {
  return DoSendGrads(RefsOf(grads));
}

absl::Status Client::DoSendGrads(absl::Span<const GradRef> grads) {
  for (const GradRef& grad : grads) PS_RETURN_IF_ERROR(CheckGradient(grad));
  std::vector<Item> items;
  for (const GradRef& grad : grads) {
    std::vector<int> servers;
    std::vector<GradientView> views = GradientBlocks(grad, &servers);
    for (size_t b = 0; b < views.size(); ++b) {
      items.push_back(Item{servers[b], views[b], std::nullopt, 0, views[b].content.size()});
    }
  }
  std::vector<Assembly> none;
  return Run(items, none);
}

absl::Status Client::PushPull(absl::Span<const NamedTensor> grads, absl::Span<Tensor> outs) {
  return DoPushPull(RefsOf(grads), outs);
}

absl::Status Client::DoPushPull(absl::Span<const GradRef> grads, absl::Span<Tensor> outs) {
  if (outs.size() != grads.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "PushPull: ", grads.size(), " gradients but ", outs.size(), " output tensors"));
  }
  std::vector<Assembly> parts(grads.size());
  std::vector<Item> items;
  for (size_t i = 0; i < grads.size(); ++i) {
    PS_RETURN_IF_ERROR(CheckGradient(grads[i]));
    std::vector<int> servers;
    std::vector<GradientView> views = GradientBlocks(grads[i], &servers);
    const NamedTensorView grad{*grads[i].name, *grads[i].tensor};
    // The parameter has the gradient's type and shape (or what we know of it).
    Assembly& a = parts[i];
    a.name = grad.name;
    a.dest = &outs[i];
    a.layout = FindLayout(grad.name);
    if (!a.layout.has_value()) {
      a.layout = Layout{grad.tensor.type(), grad.tensor.shape(),
                        static_cast<uint64_t>(grad.tensor.num_elements()),
                        static_cast<uint32_t>(views.size())};
    }
    a.Prepare();
    for (size_t b = 0; b < views.size(); ++b) {
      items.push_back(Item{servers[b], views[b],
                           BlockRefOf(grad.name, static_cast<uint32_t>(b),
                                      static_cast<uint32_t>(views.size())),
                           i, 2 * views[b].content.size()});
    }
  }
  PS_RETURN_IF_ERROR(Run(items, parts));
  for (const Assembly& a : parts) {
    if (std::count(a.received.begin(), a.received.end(), 1) !=
        static_cast<long>(a.received.size())) {
      return absl::DataLossError(absl::StrCat("parameter '", a.name, "': blocks missing"));
    }
  }
  return absl::OkStatus();
}

}  // namespace pserver
