// The C ABI's handles and the helpers its forwarders share. Internal to
// cc/capi: every .cc here includes it; nothing else does.
//
// A handle wraps the C++ object it stands for (`rep`) and, for what is made
// from an in-process client, the local cluster that must outlive it. Every
// exported function is a forwarder of the form
//
//   void pserver_x(..., pserver_status_t* status) {
//     const pserver::CallOptions call = CallOf(status);
//     Run(status, [&]() -> absl::Status { ...check the arguments...; return rep->X(..., call); });
//   }
//
// so no exception crosses into C and every failure becomes a status.
#ifndef PSERVER_CC_CAPI_INTERNAL_H_
#define PSERVER_CC_CAPI_INTERNAL_H_

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "cc/capi/pserver.h"
#include "cc/client/cancellation.h"
#include "cc/client/client.h"
#include "cc/client/device_io.h"
#include "cc/client/table.h"
#include "cc/client/worker_group.h"
#include "cc/core/checkpoint_set.h"
#include "cc/core/element_type.h"
#include "cc/core/tensor.h"
#include "cc/etcd/etcd_client.h"
#include "cc/security/tls.h"
#include "cc/server/local_cluster.h"
#include "cc/server/server.h"
#include "pserver/v1/config.pb.h"
#include "pserver/v1/table.pb.h"

// ------------------------------------------------------------------ handles

struct pserver_status_t {
  int32_t code = PSERVER_OK;
  std::string message;
  int64_t timeout_ms = 0;  // > 0: blocking calls given this status end by then
  // Set: blocking calls given this status end when it is cancelled.
  std::shared_ptr<pserver::Cancellation> cancel;
};

struct pserver_cancel_t {
  std::shared_ptr<pserver::Cancellation> rep = std::make_shared<pserver::Cancellation>();
};

struct pserver_param_config_t {
  pserver::v1::ParameterConfig rep;
};

struct pserver_table_config_t {
  pserver::v1::TableConfig rep;
};

namespace pserver_capi {

// One named buffer of a batch, borrowed from the caller.
struct BatchEntry {
  std::string name;
  int32_t dtype;
  const void* in;  // inputs
  void* out;       // outputs
  size_t size;
};

// A local cluster shared by its handle and the clients made from it, so a
// client never outlives the stores it calls.
struct ClusterState {
  std::unique_ptr<pserver::LocalCluster> cluster;
  std::vector<std::string> addresses;
  std::atomic<bool> stopped{false};
};

// The DeviceIos (CUDA streams and pinned staging) of a client's _device
// calls, idle between calls, with their device ordinals.
struct DeviceIoPool {
  absl::Mutex mu;
  std::vector<std::pair<int, std::unique_ptr<pserver::DeviceIo>>> idle ABSL_GUARDED_BY(mu);
};

// What a table, KV worker or group keeps of its client: the client itself
// and, for an in-process client, its cluster (declared first: it outlives
// the client).
struct ClientRef {
  std::shared_ptr<ClusterState> cluster;
  std::shared_ptr<pserver::Client> client;
};

// A handle on something made from a client (a table, KV worker or group).
template <typename T>
struct MadeFromClient {
  ClientRef ref;
  std::unique_ptr<T> rep;
};

}  // namespace pserver_capi

struct pserver_batch_t {
  std::vector<pserver_capi::BatchEntry> entries;
};

struct pserver_client_options_t {
  pserver::ClientOptions rep;
};

struct pserver_client_t {
  std::shared_ptr<pserver_capi::ClusterState> cluster;  // in-process clients; outlives rep
  // Shared with the tables, KV workers and groups made from this client,
  // which may outlive its handle (convention 9).
  std::shared_ptr<pserver::Client> rep;
  pserver_capi::DeviceIoPool device_io;  // destroyed first: its DeviceIos point at rep
};

struct pserver_table_t : pserver_capi::MadeFromClient<pserver::Table> {};
struct pserver_kv_worker_t : pserver_capi::MadeFromClient<pserver::KvWorker> {};
struct pserver_group_t : pserver_capi::MadeFromClient<pserver::WorkerGroup> {};

struct pserver_etcd_t {
  std::unique_ptr<pserver::EtcdClient> rep;
};

struct pserver_etcd_kvs_t {
  std::vector<pserver::KeyValue> kvs;
};

struct pserver_server_options_t {
  pserver::ServerOptions rep;
};

struct pserver_server_t {
  std::unique_ptr<pserver::Server> rep;
};

struct pserver_local_cluster_t {
  std::shared_ptr<pserver_capi::ClusterState> state;
};

struct pserver_param_list_t {
  std::vector<pserver::v1::ParamListing> rep;
};

struct pserver_checkpoint_reader_t {
  std::unique_ptr<pserver::CheckpointSet> rep;
};

// ------------------------------------------------------------------ helpers

namespace pserver_capi {

// Writes the first `capacity` of `items` into `out` as C structs made by
// `fill(item, index, &c)` (zeroed first), each `struct_size` bytes apart
// (the caller's sizeof: convention 7); returns how many items there are.
template <typename CStruct, typename Item, typename Fill>
size_t WriteStructs(const std::vector<Item>& items, CStruct* out, size_t capacity,
                    size_t struct_size, Fill fill) {
  const size_t copy = std::min(struct_size, sizeof(CStruct));
  for (size_t i = 0; i < items.size() && i < capacity; ++i) {
    CStruct c;
    std::memset(&c, 0, sizeof c);
    fill(items[i], i, &c);
    std::memcpy(reinterpret_cast<char*>(out) + i * struct_size, &c, copy);
  }
  return items.size();
}

// Stores `s` in `status` (NULL: dropped).
void Set(pserver_status_t* status, const absl::Status& s);
// Stores the exception being handled as INTERNAL (RESOURCE_EXHAUSTED for
// bad_alloc).
void SetFromException(pserver_status_t* status);

// Runs `fn` (returning absl::Status) and stores the result in `status`. A
// blocking call made by `fn` ends when the status's cancellation (if any)
// is cancelled.
template <typename Fn>
void Run(pserver_status_t* status, Fn&& fn) {
  try {
    const pserver::Cancellation::Scope cancel_scope(status == nullptr ? nullptr
                                                                      : status->cancel.get());
    Set(status, fn());
  } catch (...) {
    SetFromException(status);
  }
}

// `new T`, or NULL when out of memory: the body of every pserver_X_new.
template <typename T>
T* NewHandle() {
  try {
    return new T;
  } catch (...) {
    return nullptr;
  }
}

// The per-call options of a blocking call given `status`: its timeout
// (pserver_status_set_timeout_ms), counted from now, and its cancellation.
pserver::CallOptions CallOf(const pserver_status_t* status);

// INVALID_ARGUMENT "<what> is NULL".
absl::Status Null(const char* what);
absl::Status CheckDtype(int32_t dtype);
// `name` as a string; INVALID_ARGUMENT when it is NULL.
absl::StatusOr<std::string> Name(const char* name);
// The `name_len` bytes at `name`, as they are (a lookup key).
absl::StatusOr<std::string> NameBytes(const char* name, size_t name_len);
// A parameter's or table's (`what`) name for the servers: INVALID_ARGUMENT
// "<what> name ..." for one that is empty, holds a NUL byte or is not
// UTF-8, before anything is sent (the servers refuse them too).
absl::StatusOr<std::string> NameOf(const char* name, size_t name_len, const char* what);
absl::StatusOr<std::string> ParamName(const char* name, size_t name_len);
// Writes a returned name's length to `name_len` (if set) and returns it.
const char* NameOut(const std::string* name, size_t* name_len);
// Copies `s` into out (NUL-terminated, cut to out_size); returns its length.
size_t WriteString(absl::string_view s, char* out, size_t out_size);
// "a:1, b:2" -> {"a:1", "b:2"}: endpoints split at commas, blanks dropped.
std::vector<std::string> SplitEndpoints(const char* endpoints);
// Sets `endpoints_out` and `cluster_out` (NULL or "": "default") from a
// caller's etcd endpoints; INVALID_ARGUMENT, changing nothing, for none.
absl::Status SetEtcd(const char* endpoints, const char* cluster,
                     std::vector<std::string>* endpoints_out, std::string* cluster_out);
// etcd over TLS from three PEM paths, each NULL or "" for none.
pserver::EtcdTlsOptions EtcdTlsOf(const char* ca, const char* cert, const char* key);

// Sets `tls` to the three files (each NULL or "" for none) and checks them
// (cc/security/tls.h CheckTlsOptions); on an error `tls` is left unchanged.
absl::Status SetTls(const char* cert, const char* key, const char* ca, pserver::TlsOptions* tls);

// Checks that a caller's buffer of `dtype` and `size` bytes fits a tensor
// of `type` and `shape`; `what` names it in the error.
absl::Status CheckBuffer(const std::string& what, pserver::ElementType type,
                         const pserver::Shape& shape, int32_t dtype, size_t size);
// Writes a shape for the caller (convention: *ndim, then what fits).
void WriteShape(const pserver::Shape& shape, int64_t* out, size_t capacity, size_t* ndim);

// UNAVAILABLE once the local cluster of an in-process client (`cluster`
// set) was stopped.
absl::Status ClusterRunning(const ClusterState* cluster);
absl::Status Alive(const pserver_client_t* client);
absl::Status AliveRef(const ClientRef& ref);

// A read-only view of a caller's buffer of `dtype` and `shape` (no copy);
// errors name parameter `name`, or "tensor" when it is NULL.
absl::StatusOr<pserver::Tensor> TensorOf(const char* name, int32_t dtype, const int64_t* shape,
                                         size_t ndim, const void* data, size_t size);

// "parameter '<name>'", how errors name a parameter.
std::string ParamWhat(const std::string& name);
// The shape of a gradient of `size` bytes of `dtype` for parameter `name`:
// the one its client knows (the buffer checked against it), or one
// dimension.
absl::StatusOr<pserver::Shape> GradientShape(const pserver::Client& client, const std::string& name,
                                             int32_t dtype, size_t size);

}  // namespace pserver_capi

#endif  // PSERVER_CC_CAPI_INTERNAL_H_
