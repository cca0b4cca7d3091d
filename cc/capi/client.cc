// The C ABI: batches and the client (dense parameters). Gradients are sent
// from the caller's buffers and parameters read into them in place, through
// tensor views (cc/core/tensor.h): no copy of the values in this layer.
#include <cstring>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "cc/capi/internal.h"
#include "cc/core/status_macros.h"

using pserver_capi::Alive;
using pserver_capi::BatchEntry;
using pserver_capi::CallOf;
using pserver_capi::CheckBuffer;
using pserver_capi::CheckDtype;
using pserver_capi::NewHandle;
using pserver_capi::Null;
using pserver_capi::ParamName;
using pserver_capi::ParamWhat;
using pserver_capi::Run;

namespace {

// A batch entry's name (NULL: empty, refused when the batch is used).
std::string BatchName(const char* name, size_t name_len) {
  return name == nullptr ? std::string() : std::string(name, name_len);
}

// A gradient: a view of the caller's buffer, shaped as its parameter when
// the client knows it (and then checked against it).
absl::StatusOr<pserver::Tensor> GradientOf(const pserver::Client& client, const std::string& name,
                                           int32_t dtype, const void* data, size_t size) {
  PS_RETURN_IF_ERROR(CheckDtype(dtype));
  if (data == nullptr && size != 0) return Null("gradient data");
  PS_ASSIGN_OR_RETURN(pserver::Shape shape, pserver_capi::GradientShape(client, name, dtype, size));
  return pserver::Tensor::View(static_cast<pserver::ElementType>(dtype), std::move(shape), data,
                               size);
}

absl::Status GradientsOf(const pserver::Client& client, const pserver_batch_t* grads,
                         std::vector<pserver::NamedTensor>* out) {
  if (grads == nullptr) return Null("gradient batch");
  for (const BatchEntry& e : grads->entries) {
    PS_RETURN_IF_ERROR(ParamName(e.name.data(), e.name.size()).status());
    if (e.in == nullptr && e.out != nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("batch entry '", e.name, "' is an output; gradients are inputs"));
    }
    PS_ASSIGN_OR_RETURN(pserver::Tensor t, GradientOf(client, e.name, e.dtype, e.in, e.size));
    out->push_back(pserver::NamedTensor{e.name, std::move(t)});
  }
  return absl::OkStatus();
}

absl::Status CheckOutputs(const pserver_batch_t* outs) {
  if (outs == nullptr) return Null("output batch");
  for (const BatchEntry& e : outs->entries) {
    PS_RETURN_IF_ERROR(ParamName(e.name.data(), e.name.size()).status());
    if (e.out == nullptr && e.size != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("batch entry '", e.name, "' is not an output buffer"));
    }
    PS_RETURN_IF_ERROR(CheckDtype(e.dtype));
  }
  return absl::OkStatus();
}

// Where output `e` is read into: a view of its buffer when parameter
// `layout` is known (checked against it before anything is sent), else an
// empty tensor the client fills (and Deliver copies).
absl::StatusOr<pserver::Tensor> OutputOf(const std::optional<pserver::ParamLayout>& layout,
                                         const BatchEntry& e) {
  if (!layout.has_value()) return pserver::Tensor();
  PS_RETURN_IF_ERROR(CheckBuffer(ParamWhat(e.name), layout->type, layout->shape, e.dtype, e.size));
  return pserver::Tensor::MutableView(layout->type, layout->shape, e.out, e.size);
}

// True when `t` is output `e`'s buffer, already filled in place.
bool FilledInPlace(const pserver::Tensor& t, const BatchEntry& e) {
  return t.is_view() && t.data() == e.out;
}

// Copies the results not read in place into their outputs, after checking
// every one of them: nothing is copied unless everything fits.
absl::Status Deliver(absl::Span<const pserver::Tensor> results, absl::Span<const BatchEntry> outs) {
  for (size_t i = 0; i < results.size(); ++i) {
    const pserver::Tensor& t = results[i];
    if (FilledInPlace(t, outs[i])) continue;
    PS_RETURN_IF_ERROR(
        CheckBuffer(ParamWhat(outs[i].name), t.type(), t.shape(), outs[i].dtype, outs[i].size));
  }
  for (size_t i = 0; i < results.size(); ++i) {
    const pserver::Tensor& t = results[i];
    if (!FilledInPlace(t, outs[i]) && t.byte_size() > 0) {
      std::memcpy(outs[i].out, t.data(), t.byte_size());
    }
  }
  return absl::OkStatus();
}

// Reads the parameters of `outs` into their buffers.
absl::Status GetInto(pserver::Client& client, absl::Span<const BatchEntry> outs,
                     const pserver::CallOptions& call) {
  std::vector<std::string> names;
  std::vector<pserver::Tensor> results;
  for (const BatchEntry& e : outs) {
    PS_ASSIGN_OR_RETURN(pserver::Tensor t, OutputOf(client.KnownLayout(e.name), e));
    names.push_back(e.name);
    results.push_back(std::move(t));
  }
  PS_RETURN_IF_ERROR(client.GetParamsInto(names, absl::MakeSpan(results), call));
  return Deliver(results, outs);
}

// The outputs of a push_pull, views of the callers' buffers shaped as the
// gradients: one per gradient, for the same parameter, of its type and size.
absl::StatusOr<std::vector<pserver::Tensor>> PushPullOutputs(
    absl::Span<const pserver::NamedTensor> grads, const pserver_batch_t* outs) {
  PS_RETURN_IF_ERROR(CheckOutputs(outs));
  if (outs->entries.size() != grads.size()) {
    return absl::InvalidArgumentError(absl::StrCat("push_pull: ", grads.size(), " gradients but ",
                                                   outs->entries.size(), " outputs"));
  }
  std::vector<pserver::Tensor> results;
  for (size_t i = 0; i < grads.size(); ++i) {
    const BatchEntry& o = outs->entries[i];
    const pserver::Tensor& g = grads[i].tensor;
    if (o.name != grads[i].name) {
      return absl::InvalidArgumentError(absl::StrCat("push_pull: output ", i, " is '", o.name,
                                                     "', gradient ", i, " is for '", grads[i].name,
                                                     "'"));
    }
    PS_ASSIGN_OR_RETURN(pserver::Tensor t, OutputOf(pserver::ParamLayout{g.type(), g.shape()}, o));
    results.push_back(std::move(t));
  }
  return results;
}

}  // namespace

extern "C" {

// ------------------------------------------------------------------ batches

pserver_batch_t* pserver_batch_new(void) { return NewHandle<pserver_batch_t>(); }

void pserver_batch_delete(pserver_batch_t* batch) { delete batch; }

void pserver_batch_clear(pserver_batch_t* batch) {
  if (batch != nullptr) batch->entries.clear();
}

size_t pserver_batch_size(const pserver_batch_t* batch) {
  return batch == nullptr ? 0 : batch->entries.size();
}

void pserver_batch_add_input(pserver_batch_t* batch, const char* name, size_t name_len,
                             int32_t dtype, const void* data, size_t size) {
  try {
    if (batch == nullptr) return;
    batch->entries.push_back(BatchEntry{BatchName(name, name_len), dtype, data, nullptr, size});
  } catch (...) {
  }
}

void pserver_batch_add_output(pserver_batch_t* batch, const char* name, size_t name_len,
                              int32_t dtype, void* out, size_t size) {
  try {
    if (batch == nullptr) return;
    batch->entries.push_back(BatchEntry{BatchName(name, name_len), dtype, nullptr, out, size});
  } catch (...) {
  }
}

// ---------------------------------------------------------- client options

pserver_client_options_t* pserver_client_options_new(void) {
  return NewHandle<pserver_client_options_t>();
}

void pserver_client_options_delete(pserver_client_options_t* options) { delete options; }

void pserver_client_options_add_server(pserver_client_options_t* options, const char* address) {
  try {
    if (options != nullptr) options->rep.servers.push_back(address == nullptr ? "" : address);
  } catch (...) {
  }
}

void pserver_client_options_set_timeout_ms(pserver_client_options_t* options, int64_t timeout_ms) {
  if (options != nullptr) options->rep.timeout = absl::Milliseconds(timeout_ms);
}

void pserver_client_options_set_block_bytes(pserver_client_options_t* options,
                                            uint64_t block_bytes) {
  if (options != nullptr) options->rep.block_bytes = block_bytes;
}

void pserver_client_options_set_max_request_bytes(pserver_client_options_t* options,
                                                  uint64_t max_request_bytes) {
  if (options != nullptr) options->rep.max_request_bytes = max_request_bytes;
}

void pserver_client_options_set_channels_per_server(pserver_client_options_t* options,
                                                    int32_t channels) {
  if (options != nullptr) options->rep.channels_per_server = channels;
}

void pserver_client_options_set_etcd(pserver_client_options_t* options, const char* endpoints,
                                     const char* cluster, pserver_status_t* status) {
  Run(status, [&]() -> absl::Status {
    if (options == nullptr) return Null("options");
    return pserver_capi::SetEtcd(endpoints, cluster, &options->rep.etcd_endpoints,
                                 &options->rep.cluster);
  });
}

void pserver_client_options_set_discovery_timeout_ms(pserver_client_options_t* options,
                                                     int64_t timeout_ms) {
  if (options != nullptr) options->rep.discovery_timeout = absl::Milliseconds(timeout_ms);
}

void pserver_client_options_set_tls(pserver_client_options_t* options, const char* cert,
                                    const char* key, const char* ca, pserver_status_t* status) {
  Run(status, [&]() -> absl::Status {
    if (options == nullptr) return Null("options");
    return pserver_capi::SetTls(cert, key, ca, &options->rep.tls);
  });
}

void pserver_client_options_set_tls_server_name(pserver_client_options_t* options,
                                                const char* name) {
  try {
    if (options != nullptr) options->rep.tls.server_name = name == nullptr ? "" : name;
  } catch (...) {
  }
}

void pserver_client_options_set_tls_bulk_aead(pserver_client_options_t* options, int32_t on) {
  if (options != nullptr) options->rep.tls.bulk_aead = on != 0;
}

void pserver_client_options_set_token(pserver_client_options_t* options, const char* token) {
  try {
    if (options != nullptr) options->rep.token = token == nullptr ? "" : token;
  } catch (...) {
  }
}

void pserver_client_options_set_require_instance_id(pserver_client_options_t* options,
                                                    int32_t require) {
  if (options != nullptr) options->rep.require_instance_id = require != 0;
}

void pserver_client_options_set_etcd_tls(pserver_client_options_t* options, const char* ca,
                                         const char* cert, const char* key) {
  try {
    if (options != nullptr) options->rep.etcd_tls = pserver_capi::EtcdTlsOf(ca, cert, key);
  } catch (...) {
  }
}

// ------------------------------------------------------------------ client

pserver_client_t* pserver_client_new(const pserver_client_options_t* options,
                                     pserver_status_t* status) {
  pserver_client_t* out = nullptr;
  Run(status, [&]() -> absl::Status {
    if (options == nullptr) return Null("options");
    if (options->rep.timeout <= absl::ZeroDuration()) {
      return absl::InvalidArgumentError("the client timeout must be positive");
    }
    if (options->rep.channels_per_server < 1) {
      return absl::InvalidArgumentError("channels_per_server must be at least 1");
    }
    if (!options->rep.etcd_endpoints.empty() &&
        options->rep.discovery_timeout <= absl::ZeroDuration()) {
      return absl::InvalidArgumentError("the discovery timeout must be positive");
    }
    PS_ASSIGN_OR_RETURN(std::unique_ptr<pserver::Client> client,
                        pserver::Client::Connect(options->rep));
    auto handle = std::make_unique<pserver_client_t>();
    handle->rep = std::move(client);
    out = handle.release();
    return absl::OkStatus();
  });
  return out;
}

void pserver_client_delete(pserver_client_t* client) {
  delete client;  // NULL is fine; destructors do not throw
}

int32_t pserver_client_num_servers(const pserver_client_t* client) {
  return client == nullptr || client->rep == nullptr ? 0 : client->rep->num_servers();
}

size_t pserver_client_server_address(const pserver_client_t* client, int32_t i, char* out,
                                     size_t out_size) {
  try {
    if (client == nullptr || client->rep == nullptr || i < 0) return 0;
    std::vector<std::string> addresses = client->rep->addresses();
    if (static_cast<size_t>(i) >= addresses.size()) return 0;
    return pserver_capi::WriteString(addresses[i], out, out_size);
  } catch (...) {
    return 0;
  }
}

void pserver_client_init_param(pserver_client_t* client, const char* name, size_t name_len,
                               int32_t dtype, const int64_t* shape, size_t ndim, const void* data,
                               size_t size, const pserver_param_config_t* config,
                               pserver_status_t* status) {
  const pserver::CallOptions call = CallOf(status);
  Run(status, [&]() -> absl::Status {
    PS_RETURN_IF_ERROR(Alive(client));
    PS_ASSIGN_OR_RETURN(std::string n, ParamName(name, name_len));
    PS_ASSIGN_OR_RETURN(pserver::Tensor value,
                        pserver_capi::TensorOf(n.c_str(), dtype, shape, ndim, data, size));
    static const pserver::v1::ParameterConfig kDefault;
    return client->rep->InitParam(n, value, config == nullptr ? kDefault : config->rep, call);
  });
}

void pserver_client_finish_init(pserver_client_t* client, pserver_status_t* status) {
  const pserver::CallOptions call = CallOf(status);
  Run(status, [&]() -> absl::Status {
    PS_RETURN_IF_ERROR(Alive(client));
    return client->rep->FinishInitParams(call);
  });
}

void pserver_client_param_info(pserver_client_t* client, const char* name, size_t name_len,
                               int32_t* dtype, int64_t* shape, size_t shape_capacity, size_t* ndim,
                               pserver_status_t* status) {
  const pserver::CallOptions call = CallOf(status);
  Run(status, [&]() -> absl::Status {
    PS_RETURN_IF_ERROR(Alive(client));
    PS_ASSIGN_OR_RETURN(std::string n, ParamName(name, name_len));
    PS_ASSIGN_OR_RETURN(pserver::ParamLayout layout, client->rep->GetLayout(n, call));
    if (dtype != nullptr) *dtype = static_cast<int32_t>(layout.type);
    pserver_capi::WriteShape(layout.shape, shape, shape_capacity, ndim);
    return absl::OkStatus();
  });
}

void pserver_client_get_param(pserver_client_t* client, const char* name, size_t name_len,
                              int32_t dtype, void* out, size_t out_size, pserver_status_t* status) {
  const pserver::CallOptions call = CallOf(status);
  Run(status, [&]() -> absl::Status {
    PS_RETURN_IF_ERROR(Alive(client));
    PS_ASSIGN_OR_RETURN(std::string n, ParamName(name, name_len));
    PS_RETURN_IF_ERROR(CheckDtype(dtype));
    if (out == nullptr && out_size != 0) return Null("out");
    const BatchEntry entry{std::move(n), dtype, nullptr, out, out_size};
    return GetInto(*client->rep, absl::MakeConstSpan(&entry, 1), call);
  });
}

void pserver_client_get_params(pserver_client_t* client, pserver_batch_t* outs,
                               pserver_status_t* status) {
  const pserver::CallOptions call = CallOf(status);
  Run(status, [&]() -> absl::Status {
    PS_RETURN_IF_ERROR(Alive(client));
    PS_RETURN_IF_ERROR(CheckOutputs(outs));
    return GetInto(*client->rep, outs->entries, call);
  });
}

void pserver_client_send_grad(pserver_client_t* client, const char* name, size_t name_len,
                              int32_t dtype, const void* data, size_t size,
                              pserver_status_t* status) {
  const pserver::CallOptions call = CallOf(status);
  Run(status, [&]() -> absl::Status {
    PS_RETURN_IF_ERROR(Alive(client));
    PS_ASSIGN_OR_RETURN(std::string n, ParamName(name, name_len));
    PS_ASSIGN_OR_RETURN(pserver::Tensor grad, GradientOf(*client->rep, n, dtype, data, size));
    return client->rep->SendGrad(n, grad, call);
  });
}

void pserver_client_send_grads(pserver_client_t* client, const pserver_batch_t* grads,
                               pserver_status_t* status) {
  const pserver::CallOptions call = CallOf(status);
  Run(status, [&]() -> absl::Status {
    PS_RETURN_IF_ERROR(Alive(client));
    std::vector<pserver::NamedTensor> tensors;
    PS_RETURN_IF_ERROR(GradientsOf(*client->rep, grads, &tensors));
    return client->rep->SendGrads(tensors, call);
  });
}

void pserver_client_push_pull(pserver_client_t* client, const pserver_batch_t* grads,
                              pserver_batch_t* outs, pserver_status_t* status) {
  const pserver::CallOptions call = CallOf(status);
  Run(status, [&]() -> absl::Status {
    PS_RETURN_IF_ERROR(Alive(client));
    std::vector<pserver::NamedTensor> tensors;
    PS_RETURN_IF_ERROR(GradientsOf(*client->rep, grads, &tensors));
    PS_ASSIGN_OR_RETURN(std::vector<pserver::Tensor> results, PushPullOutputs(tensors, outs));
    PS_RETURN_IF_ERROR(client->rep->PushPull(tensors, absl::MakeSpan(results), call));
    return Deliver(results, outs->entries);
  });
}

void pserver_client_save_checkpoint(pserver_client_t* client, pserver_status_t* status) {
  const pserver::CallOptions call = CallOf(status);
  Run(status, [&]() -> absl::Status {
    PS_RETURN_IF_ERROR(Alive(client));
    return client->rep->SaveCheckpoint(call);
  });
}

size_t pserver_client_stats(pserver_client_t* client, pserver_server_stats_t* out, size_t capacity,
                            size_t struct_size, pserver_status_t* status) {
  const pserver::CallOptions call = CallOf(status);
  size_t n = 0;
  Run(status, [&]() -> absl::Status {
    PS_RETURN_IF_ERROR(Alive(client));
    if (out == nullptr && capacity != 0) return Null("out");
    PS_ASSIGN_OR_RETURN(std::vector<pserver::v1::ServerStats> stats, client->rep->GetStats(call));
    n = pserver_capi::WriteStructs(
        stats, out, capacity, struct_size,
        [](const pserver::v1::ServerStats& s, size_t, pserver_server_stats_t* c) {
          c->index = s.index();
          c->initialized = s.initialized() ? 1 : 0;
          c->parameters = s.parameters();
          c->parameter_bytes = s.parameter_bytes();
          c->optimizer_state_bytes = s.optimizer_state_bytes();
          c->gradients_applied = s.gradients_applied();
          c->gets_served = s.gets_served();
          c->requests_rejected = s.requests_rejected();
          c->uptime_seconds = s.uptime_seconds();
          c->bulk_aead_connections = s.bulk_aead_connections();
        });
    return absl::OkStatus();
  });
  return n;
}

pserver_param_list_t* pserver_client_list_params(pserver_client_t* client,
                                                 pserver_status_t* status) {
  const pserver::CallOptions call = CallOf(status);
  pserver_param_list_t* list = nullptr;
  Run(status, [&]() -> absl::Status {
    PS_RETURN_IF_ERROR(Alive(client));
    PS_ASSIGN_OR_RETURN(std::vector<pserver::v1::ParamListing> params,
                        client->rep->ListParams(call));
    list = new pserver_param_list_t{std::move(params)};
    return absl::OkStatus();
  });
  return list;
}

size_t pserver_param_list_size(const pserver_param_list_t* list) {
  return list == nullptr ? 0 : list->rep.size();
}

const char* pserver_param_list_name(const pserver_param_list_t* list, size_t i,
                                    size_t* name_len) {
  const bool in_range = list != nullptr && i < list->rep.size();
  return pserver_capi::NameOut(in_range ? &list->rep[i].name() : nullptr, name_len);
}

void pserver_param_list_info(const pserver_param_list_t* list, size_t i, int32_t* dtype,
                             int64_t* shape, size_t shape_capacity, size_t* ndim,
                             uint32_t* blocks_held, uint32_t* block_count,
                             const char** optimizer, pserver_status_t* status) {
  Run(status, [&]() -> absl::Status {
    if (list == nullptr) return pserver_capi::Null("list");
    if (i >= list->rep.size()) {
      return absl::OutOfRangeError(
          absl::StrCat("entry ", i, " of a list of ", list->rep.size(), " parameters"));
    }
    const pserver::v1::ParamListing& p = list->rep[i];
    if (dtype != nullptr) *dtype = static_cast<int32_t>(p.type());
    pserver_capi::WriteShape(pserver::Shape(p.shape().begin(), p.shape().end()), shape,
                             shape_capacity, ndim);
    if (blocks_held != nullptr) *blocks_held = p.blocks_held();
    if (block_count != nullptr) *block_count = p.block_count();
    if (optimizer != nullptr) *optimizer = p.optimizer().c_str();
    return absl::OkStatus();
  });
}

void pserver_param_list_delete(pserver_param_list_t* list) { delete list; }

size_t pserver_client_health(pserver_client_t* client, int32_t* health_out, size_t capacity,
                             pserver_status_t* status) {
  const pserver::CallOptions call = CallOf(status);
  size_t n = 0;
  Run(status, [&]() -> absl::Status {
    PS_RETURN_IF_ERROR(Alive(client));
    if (health_out == nullptr && capacity != 0) return Null("health_out");
    PS_ASSIGN_OR_RETURN(std::vector<pserver::Client::HealthStatus> health,
                        client->rep->CheckHealth(call));
    n = health.size();
    for (size_t i = 0; i < n && i < capacity; ++i) health_out[i] = static_cast<int32_t>(health[i]);
    return absl::OkStatus();
  });
  return n;
}

}  // extern "C"
