// The C ABI over the C++ client, server, local cluster and checkpoint reader.
// Every function catches everything and turns it into a status: no exception
// crosses into C.
#include "cc/capi/pserver.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "cc/client/cancellation.h"
#include "cc/client/client.h"
#include "cc/client/device_io.h"
#include "cc/client/in_process_transport.h"
#include "cc/client/table.h"
#include "cc/client/worker_group.h"
#include "cc/core/checkpoint.h"
#include "cc/core/element_type.h"
#include "cc/core/status_macros.h"
#include "cc/core/tensor.h"
#include "cc/etcd/etcd_client.h"
#include "cc/rpc/grpc_status.h"
#include "cc/server/local_cluster.h"
#include "cc/server/server.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/io/tokenizer.h"
#include "google/protobuf/message.h"
#include "google/protobuf/text_format.h"
#include "grpcpp/grpcpp.h"
#include "pserver/v1/config.pb.h"
#include "pserver/v1/service.grpc.pb.h"
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

namespace {
struct BatchEntry {
  std::string name;
  int32_t dtype;
  const void* in;  // inputs
  void* out;       // outputs
  size_t size;
};
}  // namespace

struct pserver_batch_t {
  std::vector<BatchEntry> entries;
};

namespace {
// A batch entry's name (NULL: empty, refused when the batch is used).
std::string BatchName(const char* name, size_t name_len) {
  return name == nullptr ? std::string() : std::string(name, name_len);
}
}  // namespace

struct pserver_client_options_t {
  pserver::ClientOptions rep;
};

namespace {
// A local cluster shared by its handle and the clients made from it, so a
// client never outlives the stores it calls.
struct ClusterState {
  std::unique_ptr<pserver::LocalCluster> cluster;
  std::vector<std::string> addresses;
  std::atomic<bool> stopped{false};
};

struct Layout {
  pserver::ElementType type;
  pserver::Shape shape;
};
}  // namespace

namespace {
// The DeviceIos (CUDA streams and pinned staging) of a client's _device
// calls, idle between calls, with their device ordinals.
struct DeviceIoPool {
  absl::Mutex mu;
  std::vector<std::pair<int, std::unique_ptr<pserver::DeviceIo>>> idle ABSL_GUARDED_BY(mu);
};
}  // namespace

struct pserver_client_t {
  std::shared_ptr<ClusterState> cluster;  // set for in-process clients; outlives rep
  // Shared with the tables, KV workers and groups made from this client,
  // which may outlive its handle (convention 9).
  std::shared_ptr<pserver::Client> rep;
  pserver::ClientOptions options;  // servers and timeout, for the Save RPC
  absl::Mutex mu;
  absl::flat_hash_map<std::string, Layout> layouts ABSL_GUARDED_BY(mu);
  DeviceIoPool device_io;  // destroyed first: its DeviceIos point at rep
};

struct pserver_table_config_t {
  pserver::v1::TableConfig rep;
};

namespace {
// What a table, KV worker or group keeps of its client: the client itself
// and, for an in-process client, its cluster (declared first: it outlives
// the client).
struct ClientRef {
  std::shared_ptr<ClusterState> cluster;
  std::shared_ptr<pserver::Client> client;
};
}  // namespace

struct pserver_table_t {
  ClientRef ref;
  std::unique_ptr<pserver::Table> rep;
};

struct pserver_kv_worker_t {
  ClientRef ref;
  std::unique_ptr<pserver::KvWorker> rep;
};

struct pserver_group_t {
  ClientRef ref;
  std::unique_ptr<pserver::WorkerGroup> rep;
};

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
  std::shared_ptr<ClusterState> state;
};

namespace {
struct CheckpointParam {
  pserver::ElementType type = pserver::v1::ELEMENT_TYPE_UNSPECIFIED;
  pserver::Shape shape;
  uint32_t count = 1;
  // block index -> (reader, index into its manifest's parameters)
  std::map<uint32_t, std::pair<const pserver::CheckpointReader*, int>> blocks;
};
}  // namespace

struct pserver_checkpoint_reader_t {
  std::vector<std::unique_ptr<pserver::CheckpointReader>> readers;
  std::map<std::string, CheckpointParam> params;
  std::vector<std::string> names;  // sorted
  // table name -> (reader, index into its manifest's extensions)
  std::map<std::string, std::vector<std::pair<const pserver::CheckpointReader*, int>>> tables;
  std::vector<std::string> table_names;  // sorted
};

// ------------------------------------------------------------------ helpers

namespace {

using pserver::ElementType;

void Clear(pserver_status_t* status) {
  if (status == nullptr) return;
  status->code = PSERVER_OK;
  status->message.clear();
}

void Set(pserver_status_t* status, const absl::Status& s) {
  if (status == nullptr) return;
  status->code = static_cast<int32_t>(s.code());
  status->message = std::string(s.message());
}

void Set(pserver_status_t* status, int32_t code, std::string message) {
  if (status == nullptr) return;
  status->code = code;
  status->message = std::move(message);
}

void SetFromException(pserver_status_t* status) {
  try {
    throw;
  } catch (const std::bad_alloc&) {
    Set(status, PSERVER_RESOURCE_EXHAUSTED, "pserver: out of memory");
  } catch (const std::exception& e) {
    Set(status, PSERVER_INTERNAL, absl::StrCat("pserver: unexpected exception: ", e.what()));
  } catch (...) {
    Set(status, PSERVER_INTERNAL, "pserver: unexpected exception");
  }
}

// Runs `fn` (returning absl::Status) and stores the result in `status`.
// A blocking call made by `fn` ends when the status's cancellation (if
// any) is cancelled.
template <typename Fn>
void Run(pserver_status_t* status, Fn&& fn) {
  try {
    const pserver::Cancellation::Scope cancel_scope(status == nullptr ? nullptr
                                                                      : status->cancel.get());
    absl::Status s = fn();
    if (s.ok()) {
      Clear(status);
    } else {
      Set(status, s);
    }
  } catch (...) {
    SetFromException(status);
  }
}

absl::Status Null(const char* what) {
  return absl::InvalidArgumentError(absl::StrCat(what, " is NULL"));
}

absl::Status CheckDtype(int32_t dtype) {
  if (dtype < PSERVER_INT32 || dtype > PSERVER_FLOAT64) {
    return absl::InvalidArgumentError(absl::StrCat("unknown element type ", dtype,
                                                   " (want 1..6: int32, uint32, int64, "
                                                   "uint64, float32, float64)"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> Name(const char* name) {
  if (name == nullptr) return Null("name");
  return std::string(name);
}

// The offset of the first byte of `s` that is not part of well-formed UTF-8
// (no overlong forms, surrogates or code points past U+10FFFF), or npos.
size_t InvalidUtf8At(absl::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    const unsigned char c = s[i];
    size_t len = 0;
    unsigned char lo = 0x80, hi = 0xBF;  // bounds of the second byte
    if (c < 0x80) {
      len = 1;
    } else if (c >= 0xC2 && c <= 0xDF) {
      len = 2;
    } else if (c >= 0xE0 && c <= 0xEF) {
      len = 3;
      if (c == 0xE0) lo = 0xA0;
      if (c == 0xED) hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
      len = 4;
      if (c == 0xF0) lo = 0x90;
      if (c == 0xF4) hi = 0x8F;
    } else {
      return i;
    }
    if (s.size() - i < len) return i;
    for (size_t k = 1; k < len; ++k) {
      const unsigned char b = s[i + k];
      if (k == 1 ? (b < lo || b > hi) : (b < 0x80 || b > 0xBF)) return i;
    }
    i += len;
  }
  return absl::string_view::npos;
}

// The `name_len` bytes at `name`, as they are (a lookup key).
absl::StatusOr<std::string> NameBytes(const char* name, size_t name_len) {
  if (name == nullptr) return Null("name");
  return std::string(name, name_len);
}

// `name` for a message: printable ASCII as is, every other byte as \xHH.
std::string QuoteName(absl::string_view name) {
  std::string out = "\"";
  for (const unsigned char c : name) {
    if (c >= 0x20 && c < 0x7F && c != '"' && c != '\\') {
      out.push_back(static_cast<char>(c));
    } else {
      absl::StrAppend(&out, "\\x", absl::Hex(c, absl::kZeroPad2));
    }
  }
  out.push_back('"');
  return out;
}

// A parameter's or table's (`what`) name for the servers: INVALID_ARGUMENT
// "<what> name ..." for one that is empty, holds a NUL byte or is not
// UTF-8, before anything is sent (the servers refuse them too).
absl::StatusOr<std::string> NameOf(const char* name, size_t name_len, const char* what) {
  PS_ASSIGN_OR_RETURN(std::string n, NameBytes(name, name_len));
  if (n.empty()) return absl::InvalidArgumentError(absl::StrCat(what, " name is empty"));
  const auto refuse = [&](absl::string_view why, size_t at) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " name ", QuoteName(n), " ", why, " (byte ", at, ")"));
  };
  if (size_t at = n.find('\0'); at != std::string::npos) return refuse("holds a NUL byte", at);
  if (size_t at = InvalidUtf8At(n); at != absl::string_view::npos) {
    return refuse("is not valid UTF-8", at);
  }
  return n;
}

absl::StatusOr<std::string> ParamName(const char* name, size_t name_len) {
  return NameOf(name, name_len, "parameter");
}

// Writes a returned name's length to `name_len` (if set) and returns it.
const char* NameOut(const std::string* name, size_t* name_len) {
  if (name_len != nullptr) *name_len = name == nullptr ? 0 : name->size();
  return name == nullptr ? nullptr : name->c_str();
}

// Bytes of a tensor of `layout`.
size_t ByteSize(ElementType type, const pserver::Shape& shape) {
  absl::StatusOr<int64_t> n = pserver::NumElements(shape);
  return n.ok() ? static_cast<size_t>(*n) * pserver::ElementSize(type) : 0;
}

// Checks that a caller's buffer of `dtype` and `size` bytes fits `layout`.
absl::Status CheckBuffer(const std::string& what, ElementType type, const pserver::Shape& shape,
                         int32_t dtype, size_t size) {
  if (dtype != static_cast<int32_t>(type)) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " has element type ", pserver::ElementTypeName(type), ", the buffer is ",
                     pserver::ElementTypeName(static_cast<ElementType>(dtype))));
  }
  const size_t want = ByteSize(type, shape);
  if (size != want) {
    return absl::InvalidArgumentError(absl::StrCat(what, " (", pserver::ElementTypeName(type),
                                                   pserver::ShapeString(shape), ") needs ", want,
                                                   " bytes, the buffer has ", size));
  }
  return absl::OkStatus();
}

void WriteShape(const pserver::Shape& shape, int64_t* out, size_t capacity, size_t* ndim) {
  if (ndim != nullptr) *ndim = shape.size();
  if (out == nullptr) return;
  for (size_t i = 0; i < shape.size() && i < capacity; ++i) out[i] = shape[i];
}

absl::Status SaveAll(pserver::LocalCluster& cluster) {
  for (int i = 0; i < cluster.size(); ++i) {
    PS_RETURN_IF_ERROR(cluster.server(i).Save().status());
  }
  return absl::OkStatus();
}

// The per-call options of a blocking call given `status`: its timeout
// (pserver_status_set_timeout_ms), counted from now, as the deadline.
pserver::CallOptions CallOf(const pserver_status_t* status) {
  pserver::CallOptions call;
  if (status != nullptr && status->timeout_ms > 0) {
    call.deadline = absl::Now() + absl::Milliseconds(status->timeout_ms);
  }
  if (status != nullptr) call.cancel = status->cancel.get();
  return call;
}

// UNAVAILABLE once the local cluster of an in-process client (`cluster`
// set) was stopped.
absl::Status ClusterRunning(const ClusterState* cluster) {
  if (cluster != nullptr && cluster->stopped.load()) {
    return absl::UnavailableError("pserver: the local cluster of this client was stopped");
  }
  return absl::OkStatus();
}

absl::Status Alive(pserver_client_t* client) {
  if (client == nullptr) return Null("client");
  return ClusterRunning(client->cluster.get());
}

absl::Status AliveRef(const ClientRef& ref) { return ClusterRunning(ref.cluster.get()); }

void Remember(pserver_client_t* client, const std::string& name, const pserver::Tensor& t) {
  absl::MutexLock lock(&client->mu);
  client->layouts[name] = Layout{t.type(), t.shape()};
}

std::optional<Layout> Known(pserver_client_t* client, const std::string& name) {
  absl::MutexLock lock(&client->mu);
  auto it = client->layouts.find(name);
  if (it == client->layouts.end()) return std::nullopt;
  return it->second;
}

// A gradient tensor from a caller's buffer (one copy: Tensor owns its bytes).
absl::StatusOr<pserver::Tensor> GradientTensor(pserver_client_t* client, const std::string& name,
                                               int32_t dtype, const void* data, size_t size) {
  PS_RETURN_IF_ERROR(CheckDtype(dtype));
  if (data == nullptr && size != 0) return Null("gradient data");
  const ElementType type = static_cast<ElementType>(dtype);
  const size_t esize = pserver::ElementSize(type);
  if (size % esize != 0) {
    return absl::InvalidArgumentError(absl::StrCat("gradient for parameter '", name, "': ", size,
                                                   " bytes is not a whole ", "number of ",
                                                   pserver::ElementTypeName(type), " elements"));
  }
  pserver::Shape shape = {static_cast<int64_t>(size / esize)};
  if (std::optional<Layout> layout = Known(client, name); layout.has_value()) {
    PS_RETURN_IF_ERROR(CheckBuffer(absl::StrCat("parameter '", name, "'"), layout->type,
                                   layout->shape, dtype, size));
    shape = layout->shape;
  }
  return pserver::Tensor::Create(
      type, std::move(shape),
      std::string(static_cast<const char*>(data), data == nullptr ? 0 : size));
}

absl::Status GradientsOf(pserver_client_t* client, const pserver_batch_t* grads,
                         std::vector<pserver::NamedTensor>* out) {
  if (grads == nullptr) return Null("gradient batch");
  for (const BatchEntry& e : grads->entries) {
    PS_RETURN_IF_ERROR(ParamName(e.name.data(), e.name.size()).status());
    if (e.in == nullptr && e.out != nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("batch entry '", e.name, "' is an output; gradients are inputs"));
    }
    PS_ASSIGN_OR_RETURN(pserver::Tensor t, GradientTensor(client, e.name, e.dtype, e.in, e.size));
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

// Checks every fetched tensor against its output, then copies them all:
// nothing is written unless everything fits.
absl::Status CopyOut(pserver_client_t* client, const std::vector<std::string>& names,
                     const std::vector<pserver::Tensor>& tensors, pserver_batch_t* outs) {
  for (size_t i = 0; i < tensors.size(); ++i) {
    Remember(client, names[i], tensors[i]);
    const BatchEntry& e = outs->entries[i];
    PS_RETURN_IF_ERROR(CheckBuffer(absl::StrCat("parameter '", names[i], "'"), tensors[i].type(),
                                   tensors[i].shape(), e.dtype, e.size));
  }
  for (size_t i = 0; i < tensors.size(); ++i) {
    const pserver::Tensor& t = tensors[i];
    if (t.byte_size() > 0) std::memcpy(outs->entries[i].out, t.bytes().data(), t.byte_size());
  }
  return absl::OkStatus();
}

// A tensor copied from a caller's buffer of `dtype` and `shape`, checked;
// errors name parameter `name`, or "tensor" when it is NULL.
absl::StatusOr<pserver::Tensor> TensorOf(const char* name, int32_t dtype, const int64_t* shape,
                                         size_t ndim, const void* data, size_t size) {
  PS_RETURN_IF_ERROR(CheckDtype(dtype));
  if (shape == nullptr && ndim != 0) return Null("shape");
  if (data == nullptr && size != 0) return Null("data");
  const ElementType type = static_cast<ElementType>(dtype);
  pserver::Shape s(shape, shape + ndim);
  PS_ASSIGN_OR_RETURN(int64_t elements, pserver::NumElements(s));
  const size_t want = static_cast<size_t>(elements) * pserver::ElementSize(type);
  if (size != want) {
    return absl::InvalidArgumentError(
        absl::StrCat(name == nullptr ? "tensor " : absl::StrCat("parameter '", name, "': "),
                     pserver::ElementTypeName(type), pserver::ShapeString(s), " needs ", want,
                     " bytes, the buffer has ", size));
  }
  return pserver::Tensor::Create(
      type, std::move(s), std::string(static_cast<const char*>(data), data == nullptr ? 0 : size));
}

// ------------------------------------------------------------ config setters

// Keeps the first text-format parse error instead of logging it.
class TextErrors : public google::protobuf::io::ErrorCollector {
 public:
  void AddError(int line, google::protobuf::io::ColumnNumber column,
                const std::string& message) override {
    if (this->message.empty()) {
      this->message = absl::StrCat(line + 1, ":", column + 1, ": ", message);
    }
  }
  std::string message;
};

namespace pb = google::protobuf;

// Parses `text` (protobuf text format) into *out, all or nothing:
// INVALID_ARGUMENT naming the message type and the first error's place.
absl::Status ParseText(const char* text, pb::Message* out) {
  if (text == nullptr) return Null("text");
  std::unique_ptr<pb::Message> parsed(out->New());
  TextErrors errors;
  pb::TextFormat::Parser parser;
  parser.RecordErrorsTo(&errors);
  if (!parser.ParseFromString(text, parsed.get())) {
    return absl::InvalidArgumentError(
        absl::StrCat("not a ", out->GetTypeName(), " in text format: ", errors.message));
  }
  out->GetReflection()->Swap(out, parsed.get());
  return absl::OkStatus();
}

// Chooses member `name` of a oneof of `msg` (its optimizer, schedule or
// initializer), clearing its settings.
absl::Status ChooseKind(pb::Message* msg, const char* name, const char* what,
                        absl::Span<const char* const> valid) {
  if (name == nullptr) return Null(what);
  if (std::none_of(valid.begin(), valid.end(), [&](absl::string_view v) { return v == name; })) {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown ", what, " '", name, "'; want one of ", absl::StrJoin(valid, ", ")));
  }
  const pb::FieldDescriptor* f = msg->GetDescriptor()->FindFieldByName(name);
  msg->GetReflection()->ClearField(msg, f);
  msg->GetReflection()->MutableMessage(msg, f);
  return absl::OkStatus();
}

// `msg` in one line of text format into out (NUL-terminated, cut to
// out_size); returns the whole text's length.
size_t WriteText(const pb::Message* msg, char* out, size_t out_size) {
  try {
    std::string text;
    if (msg != nullptr) {
      google::protobuf::TextFormat::Printer printer;
      printer.SetSingleLineMode(true);
      printer.PrintToString(*msg, &text);
      while (!text.empty() && text.back() == ' ') text.pop_back();
    }
    if (out != nullptr && out_size > 0) {
      const size_t n = std::min(text.size(), out_size - 1);
      std::memcpy(out, text.data(), n);
      out[n] = '\0';
    }
    return text.size();
  } catch (...) {
    if (out != nullptr && out_size > 0) out[0] = '\0';
    return 0;
  }
}

const char* const kOptimizers[] = {"sgd", "adagrad", "adadelta", "rmsprop", "adam", "adamw", "add"};
const char* const kSchedules[] = {"constant", "linear", "step", "cosine"};

// The message of the chosen member of `oneof` in `msg`, or nullptr.
pb::Message* Chosen(pb::Message* msg, const char* oneof) {
  const pb::Reflection* r = msg->GetReflection();
  const pb::OneofDescriptor* o = msg->GetDescriptor()->FindOneofByName(oneof);
  const pb::FieldDescriptor* f = r->GetOneofFieldDescriptor(*msg, o);
  return f == nullptr ? nullptr : r->MutableMessage(msg, f);
}

absl::Status SetField(pb::Message* msg, const pb::FieldDescriptor* f, const std::string& key,
                      double value) {
  const pb::Reflection* r = msg->GetReflection();
  if (!std::isfinite(value)) {
    return absl::InvalidArgumentError(
        absl::StrCat("config setting '", key, "' is ", value, "; want a finite number"));
  }
  switch (f->cpp_type()) {
    case pb::FieldDescriptor::CPPTYPE_DOUBLE:
      r->SetDouble(msg, f, value);
      return absl::OkStatus();
    case pb::FieldDescriptor::CPPTYPE_BOOL:
      if (value != 0 && value != 1) {
        return absl::InvalidArgumentError(
            absl::StrCat("config setting '", key, "' is a boolean (0 or 1), got ", value));
      }
      r->SetBool(msg, f, value == 1);
      return absl::OkStatus();
    case pb::FieldDescriptor::CPPTYPE_UINT64:
      if (value < 0 || value != std::floor(value) || value >= 18446744073709551616.0) {
        return absl::InvalidArgumentError(absl::StrCat(
            "config setting '", key, "' is a count (a whole number >= 0), got ", value));
      }
      r->SetUInt64(msg, f, static_cast<uint64_t>(value));
      return absl::OkStatus();
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("config setting '", key, "' cannot be set from a number"));
  }
}

// Scalar fields of `msg`, for error messages.
void ScalarFields(const pb::Message& msg, std::vector<std::string>* out) {
  const pb::Descriptor* d = msg.GetDescriptor();
  for (int i = 0; i < d->field_count(); ++i) {
    if (d->field(i)->cpp_type() != pb::FieldDescriptor::CPPTYPE_MESSAGE) {
      out->push_back(d->field(i)->name());
    }
  }
}

absl::Status SetConfig(pserver::v1::ParameterConfig* config, std::string key, double value) {
  if (key == "lr") key = "learning_rate";
  pb::Message* optimizer = Chosen(config->mutable_optimizer(), "kind");
  if (optimizer == nullptr) optimizer = config->mutable_optimizer()->mutable_sgd();
  pserver::v1::LearningRateSchedule* schedule = config->mutable_learning_rate();
  pb::Message* decay = Chosen(schedule, "decay");
  std::vector<pb::Message*> places = {optimizer, schedule};
  if (decay != nullptr) places.push_back(decay);
  places.push_back(config->mutable_clipping());
  for (pb::Message* msg : places) {
    const pb::FieldDescriptor* f = msg->GetDescriptor()->FindFieldByName(key);
    if (f != nullptr && f->cpp_type() != pb::FieldDescriptor::CPPTYPE_MESSAGE) {
      return SetField(msg, f, key, value);
    }
  }
  std::vector<std::string> valid;
  for (pb::Message* msg : places) ScalarFields(*msg, &valid);
  valid.push_back("lr");
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown config setting '", key, "' for optimizer ", optimizer->GetDescriptor()->name(),
      "; valid settings: ", absl::StrJoin(valid, ", ")));
}

// --------------------------------------------------------- checkpoint files

namespace fs = std::filesystem;

// The newest checkpoint under a server's directory that opens, or an error.
absl::StatusOr<std::unique_ptr<pserver::CheckpointReader>> OpenNewest(
    const std::vector<pserver::CheckpointEntry>& entries) {
  absl::Status first;
  for (auto it = entries.rbegin(); it != entries.rend(); ++it) {
    absl::StatusOr<std::unique_ptr<pserver::CheckpointReader>> r =
        pserver::CheckpointReader::Open(it->path);
    if (r.ok()) return r;
    if (first.ok()) first = r.status();
  }
  return first;
}

absl::Status OpenCheckpoints(const std::string& path, pserver_checkpoint_reader_t* out) {
  std::error_code ec;
  if (!fs::exists(path, ec)) {
    return absl::NotFoundError(absl::StrCat("no checkpoint at ", path, ": it does not exist"));
  }
  if (fs::exists(fs::path(path) / pserver::kManifestFileName, ec)) {
    PS_ASSIGN_OR_RETURN(auto reader, pserver::CheckpointReader::Open(path));
    out->readers.push_back(std::move(reader));
    return absl::OkStatus();
  }
  PS_ASSIGN_OR_RETURN(std::vector<pserver::CheckpointEntry> entries,
                      pserver::ListCheckpoints(path));
  if (!entries.empty()) {
    PS_ASSIGN_OR_RETURN(auto reader, OpenNewest(entries));
    out->readers.push_back(std::move(reader));
    return absl::OkStatus();
  }
  std::vector<std::string> subdirs;
  for (const fs::directory_entry& e : fs::directory_iterator(path, ec)) {
    if (e.is_directory(ec)) subdirs.push_back(e.path().string());
  }
  if (ec) return absl::InternalError(absl::StrCat("cannot list ", path, ": ", ec.message()));
  std::sort(subdirs.begin(), subdirs.end());
  for (const std::string& sub : subdirs) {
    PS_ASSIGN_OR_RETURN(std::vector<pserver::CheckpointEntry> shard, pserver::ListCheckpoints(sub));
    if (shard.empty()) continue;
    PS_ASSIGN_OR_RETURN(auto reader, OpenNewest(shard));
    out->readers.push_back(std::move(reader));
  }
  if (out->readers.empty()) {
    return absl::NotFoundError(absl::StrCat("no checkpoint at ", path,
                                            ": no MANIFEST, no ckpt-* directory in it or in "
                                            "its subdirectories"));
  }
  return absl::OkStatus();
}

absl::Status IndexCheckpoints(pserver_checkpoint_reader_t* out) {
  for (const auto& reader : out->readers) {
    const auto& params = reader->manifest().parameters();
    for (int i = 0; i < params.size(); ++i) {
      const pserver::v1::CheckpointParameter& p = params[i];
      const uint32_t count = std::max<uint32_t>(1, p.block().count());
      pserver::Shape shape(p.shape().begin(), p.shape().end());
      auto [it, fresh] = out->params.try_emplace(p.name());
      CheckpointParam& cp = it->second;
      if (fresh) {
        cp.type = p.element_type();
        cp.shape = shape;
        cp.count = count;
      } else if (cp.type != p.element_type() || cp.shape != shape || cp.count != count) {
        return absl::DataLossError(absl::StrCat(
            "checkpoints disagree on parameter '", p.name(),
            "': ", pserver::ElementTypeName(cp.type), pserver::ShapeString(cp.shape), " in ",
            cp.count, " blocks vs ", pserver::ElementTypeName(p.element_type()),
            pserver::ShapeString(shape), " in ", count, " blocks (", reader->path(), ")"));
      }
      if (!cp.blocks.emplace(p.block().index(), std::make_pair(reader.get(), i)).second) {
        return absl::DataLossError(
            absl::StrCat("parameter '", p.name(), "' block ", p.block().index(),
                         " is in two opened checkpoints, the second ", reader->path()));
      }
    }
  }
  for (const auto& [name, param] : out->params) out->names.push_back(name);
  for (const auto& reader : out->readers) {
    const auto& extensions = reader->manifest().extensions();
    for (int i = 0; i < extensions.size(); ++i) {
      absl::string_view name = extensions[i].name();
      if (absl::ConsumePrefix(&name, "table/")) {
        out->tables[std::string(name)].emplace_back(reader.get(), i);
      }
    }
  }
  for (const auto& [name, parts] : out->tables) out->table_names.push_back(name);
  return absl::OkStatus();
}

// Table `name`'s snapshots, one per checkpoint that holds some of it,
// checked for consistent configs and sizes.
absl::StatusOr<std::vector<pserver::v1::SparseTableSnapshot>> ReadTableSnapshots(
    const pserver_checkpoint_reader_t* r, const std::string& name) {
  auto it = r->tables.find(name);
  if (it == r->tables.end()) {
    return absl::NotFoundError(absl::StrCat("table '", name, "' is not in the checkpoint"));
  }
  std::vector<pserver::v1::SparseTableSnapshot> out;
  for (const auto& [ckpt, index] : it->second) {
    const pserver::v1::CheckpointExtension& ext = ckpt->manifest().extensions(index);
    PS_ASSIGN_OR_RETURN(std::string bytes, ckpt->ReadData(ext.data()));
    pserver::v1::SparseTableSnapshot snapshot;
    if (!snapshot.ParseFromString(bytes)) {
      return absl::DataLossError(absl::StrCat("extension '", ext.name(), "' in ", ckpt->path(),
                                              " is not a table snapshot"));
    }
    pserver::v1::TableConfig& config = *snapshot.mutable_config();
    if (config.element_type() == pserver::v1::ELEMENT_TYPE_UNSPECIFIED) {
      config.set_element_type(pserver::v1::FLOAT32);
    }
    const size_t esize = pserver::ElementSize(config.element_type());
    if (config.dim() == 0 || esize == 0 || snapshot.keys().size() != snapshot.rows() * 8 ||
        snapshot.values().size() != snapshot.rows() * config.dim() * esize) {
      return absl::DataLossError(absl::StrCat("table '", name, "' in ", ckpt->path(),
                                              ": its keys and values do not match ",
                                              snapshot.rows(), " rows"));
    }
    if (!out.empty() && (out[0].config().dim() != config.dim() ||
                         out[0].config().element_type() != config.element_type())) {
      return absl::DataLossError(absl::StrCat("checkpoints disagree on table '", name, "': dim ",
                                              out[0].config().dim(), " vs ", config.dim(), " (",
                                              ckpt->path(), ")"));
    }
    out.push_back(std::move(snapshot));
  }
  return out;
}

absl::StatusOr<const CheckpointParam*> FindCheckpointParam(const pserver_checkpoint_reader_t* r,
                                                           const std::string& name) {
  auto it = r->params.find(name);
  if (it == r->params.end()) {
    return absl::NotFoundError(absl::StrCat("parameter '", name, "' is not in the checkpoint"));
  }
  return &it->second;
}

}  // namespace

// ===================================================================== ABI

extern "C" {

const char* pserver_version(void) { return "0.2.0"; }

// ------------------------------------------------------------------ status

pserver_status_t* pserver_status_new(void) {
  try {
    return new pserver_status_t;
  } catch (...) {
    return nullptr;
  }
}

void pserver_status_delete(pserver_status_t* status) { delete status; }

int32_t pserver_status_code(const pserver_status_t* status) {
  return status == nullptr ? PSERVER_OK : status->code;
}

const char* pserver_status_message(const pserver_status_t* status) {
  return status == nullptr ? "" : status->message.c_str();
}

void pserver_status_set_timeout_ms(pserver_status_t* status, int64_t timeout_ms) {
  if (status != nullptr) status->timeout_ms = timeout_ms > 0 ? timeout_ms : 0;
}

int64_t pserver_status_timeout_ms(const pserver_status_t* status) {
  return status == nullptr ? 0 : status->timeout_ms;
}

pserver_cancel_t* pserver_cancel_new(void) {
  try {
    return new pserver_cancel_t;
  } catch (...) {
    return nullptr;
  }
}

void pserver_cancel_delete(pserver_cancel_t* cancel) { delete cancel; }

void pserver_cancel_cancel(pserver_cancel_t* cancel) {
  if (cancel != nullptr) cancel->rep->Cancel();
}

uint8_t pserver_cancel_cancelled(const pserver_cancel_t* cancel) {
  return cancel != nullptr && cancel->rep->cancelled() ? 1 : 0;
}

void pserver_status_set_cancel(pserver_status_t* status, pserver_cancel_t* cancel) {
  if (status != nullptr) status->cancel = cancel == nullptr ? nullptr : cancel->rep;
}

void pserver_status_set(pserver_status_t* status, int32_t code, const char* message) {
  try {
    Set(status, code, message == nullptr ? "" : message);
  } catch (...) {
  }
}

const char* pserver_code_name(int32_t code) {
  static const char* const kNames[] = {"OK",
                                       "CANCELLED",
                                       "UNKNOWN",
                                       "INVALID_ARGUMENT",
                                       "DEADLINE_EXCEEDED",
                                       "NOT_FOUND",
                                       "ALREADY_EXISTS",
                                       "PERMISSION_DENIED",
                                       "RESOURCE_EXHAUSTED",
                                       "FAILED_PRECONDITION",
                                       "ABORTED",
                                       "OUT_OF_RANGE",
                                       "UNIMPLEMENTED",
                                       "INTERNAL",
                                       "UNAVAILABLE",
                                       "DATA_LOSS",
                                       "UNAUTHENTICATED"};
  if (code < 0 || code > 16) return "UNKNOWN_CODE";
  return kNames[code];
}

// ------------------------------------------------------------------ dtypes

size_t pserver_dtype_size(int32_t dtype) {
  if (!CheckDtype(dtype).ok()) return 0;
  return pserver::ElementSize(static_cast<ElementType>(dtype));
}

const char* pserver_dtype_name(int32_t dtype) {
  switch (dtype) {
    case PSERVER_INT32:
      return "int32";
    case PSERVER_UINT32:
      return "uint32";
    case PSERVER_INT64:
      return "int64";
    case PSERVER_UINT64:
      return "uint64";
    case PSERVER_FLOAT32:
      return "float32";
    case PSERVER_FLOAT64:
      return "float64";
    default:
      return "unknown";
  }
}

// ------------------------------------------------------------------ config

pserver_param_config_t* pserver_param_config_new(void) {
  try {
    return new pserver_param_config_t;
  } catch (...) {
    return nullptr;
  }
}

void pserver_param_config_delete(pserver_param_config_t* config) { delete config; }

void pserver_param_config_set_optimizer(pserver_param_config_t* config, const char* optimizer,
                                        pserver_status_t* status) {
  Run(status, [&]() -> absl::Status {
    if (config == nullptr) return Null("config");
    return ChooseKind(config->rep.mutable_optimizer(), optimizer, "optimizer", kOptimizers);
  });
}

void pserver_param_config_set_schedule(pserver_param_config_t* config, const char* schedule,
                                       pserver_status_t* status) {
  Run(status, [&]() -> absl::Status {
    if (config == nullptr) return Null("config");
    return ChooseKind(config->rep.mutable_learning_rate(), schedule, "schedule", kSchedules);
  });
}

void pserver_param_config_set(pserver_param_config_t* config, const char* key, double value,
                              pserver_status_t* status) {
  Run(status, [&]() -> absl::Status {
    if (config == nullptr) return Null("config");
    if (key == nullptr) return Null("key");
    // Work on a copy: a failed set changes nothing.
    pserver::v1::ParameterConfig copy = config->rep;
    PS_RETURN_IF_ERROR(SetConfig(&copy, key, value));
    config->rep = std::move(copy);
    return absl::OkStatus();
  });
}

void pserver_param_config_parse(pserver_param_config_t* config, const void* data, size_t size,
                                pserver_status_t* status) {
  Run(status, [&]() -> absl::Status {
    if (config == nullptr) return Null("config");
    if (data == nullptr && size != 0) return Null("data");
    pserver::v1::ParameterConfig parsed;
    if (size > static_cast<size_t>(INT32_MAX) ||
        !parsed.ParseFromArray(data, static_cast<int>(size))) {
      return absl::InvalidArgumentError("not a serialized pserver.v1.ParameterConfig");
    }
    config->rep = std::move(parsed);
    return absl::OkStatus();
  });
}

void pserver_param_config_parse_text(pserver_param_config_t* config, const char* text,
                                     pserver_status_t* status) {
  Run(status, [&]() -> absl::Status {
    if (config == nullptr) return Null("config");
    return ParseText(text, &config->rep);
  });
}

size_t pserver_param_config_text(const pserver_param_config_t* config, char* out, size_t out_size) {
  return WriteText(config == nullptr ? nullptr : &config->rep, out, out_size);
}

// ------------------------------------------------------------------ batches

pserver_batch_t* pserver_batch_new(void) {
  try {
    return new pserver_batch_t;
  } catch (...) {
    return nullptr;
  }
}

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

// ------------------------------------------------------------------ client

pserver_client_options_t* pserver_client_options_new(void) {
  try {
    return new pserver_client_options_t;
  } catch (...) {
    return nullptr;
  }
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

namespace {
// "a:1, b:2" -> {"a:1", "b:2"}: endpoints split at commas, blanks dropped.
std::vector<std::string> SplitEndpoints(const char* endpoints) {
  std::vector<std::string> out;
  if (endpoints == nullptr) return out;
  for (absl::string_view part : absl::StrSplit(endpoints, ',')) {
    part = absl::StripAsciiWhitespace(part);
    if (!part.empty()) out.emplace_back(part);
  }
  return out;
}
}  // namespace

void pserver_client_options_set_etcd(pserver_client_options_t* options, const char* endpoints,
                                     const char* cluster, pserver_status_t* status) {
  Run(status, [&]() -> absl::Status {
    if (options == nullptr) return Null("options");
    std::vector<std::string> list = SplitEndpoints(endpoints);
    if (list.empty()) {
      return absl::InvalidArgumentError(
          "etcd endpoints are empty (want \"host:port[,host:port...]\")");
    }
    options->rep.etcd_endpoints = std::move(list);
    options->rep.cluster = cluster == nullptr || *cluster == '\0' ? "default" : cluster;
    return absl::OkStatus();
  });
}

void pserver_client_options_set_discovery_timeout_ms(pserver_client_options_t* options,
                                                     int64_t timeout_ms) {
  if (options != nullptr) options->rep.discovery_timeout = absl::Milliseconds(timeout_ms);
}

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
    handle->options = options->rep;
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
    const std::string& a = addresses[i];
    if (out != nullptr && out_size > 0) {
      const size_t n = std::min(a.size(), out_size - 1);
      std::memcpy(out, a.data(), n);
      out[n] = '\0';
    }
    return a.size();
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
    PS_ASSIGN_OR_RETURN(pserver::Tensor value, TensorOf(n.c_str(), dtype, shape, ndim, data, size));
    static const pserver::v1::ParameterConfig kDefault;
    PS_RETURN_IF_ERROR(
        client->rep->InitParam(n, value, config == nullptr ? kDefault : config->rep, call));
    Remember(client, n, value);
    return absl::OkStatus();
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
    std::optional<Layout> layout = Known(client, n);
    if (!layout.has_value()) {
      PS_ASSIGN_OR_RETURN(pserver::Tensor t, client->rep->GetParam(n, call));
      Remember(client, n, t);
      layout = Layout{t.type(), t.shape()};
    }
    if (dtype != nullptr) *dtype = static_cast<int32_t>(layout->type);
    WriteShape(layout->shape, shape, shape_capacity, ndim);
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
    const std::string what = absl::StrCat("parameter '", n, "'");
    // Fail before the round trip when the layout is known.
    if (std::optional<Layout> layout = Known(client, n); layout.has_value()) {
      PS_RETURN_IF_ERROR(CheckBuffer(what, layout->type, layout->shape, dtype, out_size));
    }
    PS_ASSIGN_OR_RETURN(pserver::Tensor t, client->rep->GetParam(n, call));
    Remember(client, n, t);
    PS_RETURN_IF_ERROR(CheckBuffer(what, t.type(), t.shape(), dtype, out_size));
    if (t.byte_size() > 0) std::memcpy(out, t.bytes().data(), t.byte_size());
    return absl::OkStatus();
  });
}

void pserver_client_get_params(pserver_client_t* client, pserver_batch_t* outs,
                               pserver_status_t* status) {
  const pserver::CallOptions call = CallOf(status);
  Run(status, [&]() -> absl::Status {
    PS_RETURN_IF_ERROR(Alive(client));
    PS_RETURN_IF_ERROR(CheckOutputs(outs));
    std::vector<std::string> names;
    for (const BatchEntry& e : outs->entries) {
      if (std::optional<Layout> layout = Known(client, e.name); layout.has_value()) {
        PS_RETURN_IF_ERROR(CheckBuffer(absl::StrCat("parameter '", e.name, "'"), layout->type,
                                       layout->shape, e.dtype, e.size));
      }
      names.push_back(e.name);
    }
    PS_ASSIGN_OR_RETURN(std::vector<pserver::Tensor> tensors, client->rep->GetParams(names, call));
    return CopyOut(client, names, tensors, outs);
  });
}

void pserver_client_send_grad(pserver_client_t* client, const char* name, size_t name_len,
                              int32_t dtype, const void* data, size_t size,
                              pserver_status_t* status) {
  const pserver::CallOptions call = CallOf(status);
  Run(status, [&]() -> absl::Status {
    PS_RETURN_IF_ERROR(Alive(client));
    PS_ASSIGN_OR_RETURN(std::string n, ParamName(name, name_len));
    PS_ASSIGN_OR_RETURN(pserver::Tensor grad, GradientTensor(client, n, dtype, data, size));
    return client->rep->SendGrad(n, grad, call);
  });
}

void pserver_client_send_grads(pserver_client_t* client, const pserver_batch_t* grads,
                               pserver_status_t* status) {
  const pserver::CallOptions call = CallOf(status);
  Run(status, [&]() -> absl::Status {
    PS_RETURN_IF_ERROR(Alive(client));
    std::vector<pserver::NamedTensor> tensors;
    PS_RETURN_IF_ERROR(GradientsOf(client, grads, &tensors));
    return client->rep->SendGrads(tensors, call);
  });
}

void pserver_client_push_pull(pserver_client_t* client, const pserver_batch_t* grads,
                              pserver_batch_t* outs, pserver_status_t* status) {
  const pserver::CallOptions call = CallOf(status);
  Run(status, [&]() -> absl::Status {
    PS_RETURN_IF_ERROR(Alive(client));
    std::vector<pserver::NamedTensor> tensors;
    PS_RETURN_IF_ERROR(GradientsOf(client, grads, &tensors));
    PS_RETURN_IF_ERROR(CheckOutputs(outs));
    if (outs->entries.size() != tensors.size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "push_pull: ", tensors.size(), " gradients but ", outs->entries.size(), " outputs"));
    }
    std::vector<std::string> names;
    for (size_t i = 0; i < tensors.size(); ++i) {
      const BatchEntry& o = outs->entries[i];
      const pserver::Tensor& g = tensors[i].tensor;
      if (o.name != tensors[i].name) {
        return absl::InvalidArgumentError(absl::StrCat("push_pull: output ", i, " is '", o.name,
                                                       "', gradient ", i, " is for '",
                                                       tensors[i].name, "'"));
      }
      // The parameter has the gradient's type and size: check the output
      // before anything is applied.
      PS_RETURN_IF_ERROR(CheckBuffer(absl::StrCat("parameter '", o.name, "'"), g.type(), g.shape(),
                                     o.dtype, o.size));
      names.push_back(o.name);
    }
    std::vector<pserver::Tensor> results(tensors.size());
    PS_RETURN_IF_ERROR(client->rep->PushPull(tensors, absl::MakeSpan(results), call));
    return CopyOut(client, names, results, outs);
  });
}

void pserver_client_save_checkpoint(pserver_client_t* client, pserver_status_t* status) {
  const pserver::CallOptions call = CallOf(status);
  Run(status, [&]() -> absl::Status {
    PS_RETURN_IF_ERROR(Alive(client));
    if (client->cluster != nullptr) return SaveAll(*client->cluster->cluster);
    // One Save RPC per server, in parallel.
    // The current addresses: with etcd, as the servers last registered.
    const std::vector<std::string> servers = client->rep->addresses();
    std::vector<absl::Status> results(servers.size());
    std::vector<std::thread> threads;
    for (size_t i = 0; i < servers.size(); ++i) {
      threads.emplace_back([&, i] {
        try {
          auto stub = pserver::v1::ParameterServer::NewStub(
              grpc::CreateChannel(servers[i], grpc::InsecureChannelCredentials()));
          auto context = std::make_shared<grpc::ClientContext>();
          context->set_deadline(
              absl::ToChronoTime(std::min(absl::Now() + client->options.timeout, call.deadline)));
          pserver::Cancellation::Registration cancel_registration;
          if (call.cancel != nullptr) {
            cancel_registration = call.cancel->OnCancel([context] { context->TryCancel(); });
          }
          pserver::v1::SaveRequest request;
          pserver::v1::SaveResponse response;
          absl::Status s = pserver::FromGrpcStatus(stub->Save(context.get(), request, &response));
          if (!s.ok()) {
            s = absl::Status(s.code(), absl::StrCat("save on ", servers[i], ": ", s.message()));
          }
          results[i] = s;
        } catch (...) {
          results[i] = absl::InternalError("save: unexpected exception");
        }
      });
    }
    for (std::thread& t : threads) t.join();
    for (const absl::Status& s : results) PS_RETURN_IF_ERROR(s);
    return absl::OkStatus();
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
    n = stats.size();
    const size_t copy = std::min(struct_size, sizeof(pserver_server_stats_t));
    for (size_t i = 0; i < n && i < capacity; ++i) {
      const pserver::v1::ServerStats& s = stats[i];
      pserver_server_stats_t c;
      std::memset(&c, 0, sizeof c);
      c.index = s.index();
      c.initialized = s.initialized() ? 1 : 0;
      c.parameters = s.parameters();
      c.parameter_bytes = s.parameter_bytes();
      c.optimizer_state_bytes = s.optimizer_state_bytes();
      c.gradients_applied = s.gradients_applied();
      c.gets_served = s.gets_served();
      c.requests_rejected = s.requests_rejected();
      c.uptime_seconds = s.uptime_seconds();
      std::memcpy(reinterpret_cast<char*>(out) + i * struct_size, &c, copy);
    }
    return absl::OkStatus();
  });
  return n;
}

// ------------------------------------------------------------------ tables

namespace {

const char* const kTableOptimizers[] = {"sgd", "adagrad", "adam", "ftrl", "add"};
const char* const kInitializers[] = {"zeros", "uniform", "normal"};

// Sets a scalar field of a table config's message from a number, checking
// that it fits (uint32 and uint64 counts, doubles).
absl::Status SetTableField(pb::Message* msg, const pb::FieldDescriptor* f, const std::string& key,
                           double value) {
  if (f->cpp_type() != pb::FieldDescriptor::CPPTYPE_UINT32) return SetField(msg, f, key, value);
  if (!std::isfinite(value) || value < 0 || value != std::floor(value) || value > 4294967295.0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "table setting '", key, "' is a count (a whole number in [0, 2^32)), got ", value));
  }
  msg->GetReflection()->SetUInt32(msg, f, static_cast<uint32_t>(value));
  return absl::OkStatus();
}

absl::Status SetTableConfig(pserver::v1::TableConfig* config, std::string key, double value) {
  if (key == "lr") key = "learning_rate";
  pb::Message* optimizer = Chosen(config->mutable_optimizer(), "kind");
  if (optimizer == nullptr) optimizer = config->mutable_optimizer()->mutable_sgd();
  std::vector<pb::Message*> places = {optimizer};
  if (pb::Message* init = Chosen(config->mutable_initializer(), "kind"); init != nullptr) {
    places.push_back(init);
  }
  places.push_back(config->mutable_initializer());
  places.push_back(config->mutable_eviction());
  places.push_back(config->mutable_consistency());
  places.push_back(config);
  auto settable = [](const pb::FieldDescriptor* f) {
    return f != nullptr && f->cpp_type() != pb::FieldDescriptor::CPPTYPE_MESSAGE &&
           f->cpp_type() != pb::FieldDescriptor::CPPTYPE_ENUM;
  };
  for (pb::Message* msg : places) {
    const pb::FieldDescriptor* f = msg->GetDescriptor()->FindFieldByName(key);
    if (settable(f)) return SetTableField(msg, f, key, value);
  }
  std::vector<std::string> valid;
  for (pb::Message* msg : places) {
    const pb::Descriptor* d = msg->GetDescriptor();
    for (int i = 0; i < d->field_count(); ++i) {
      if (settable(d->field(i))) valid.push_back(d->field(i)->name());
    }
  }
  valid.push_back("lr");
  return absl::InvalidArgumentError(absl::StrCat("unknown table setting '", key, "' for optimizer ",
                                                 optimizer->GetDescriptor()->name(),
                                                 "; valid settings: ", absl::StrJoin(valid, ", ")));
}

absl::Status CheckKeys(const uint64_t* keys, size_t n) {
  if (keys == nullptr && n != 0) return Null("keys");
  return absl::OkStatus();
}

absl::Span<const uint64_t> KeySpan(const uint64_t* keys, size_t n) {
  return n == 0 ? absl::Span<const uint64_t>() : absl::Span<const uint64_t>(keys, n);
}

// Checks a caller's buffer of rows: exactly `rows` rows of the table.
absl::Status CheckRows(const pserver::Table& table, const char* verb, const void* data, size_t size,
                       size_t rows, const char* unit) {
  if (data == nullptr && size != 0) return Null("buffer");
  const size_t want = rows * table.row_bytes();
  if (size != want) {
    return absl::InvalidArgumentError(
        absl::StrCat(verb, " table '", table.name(), "': ", rows, " ", unit, " of ", table.dim(),
                     " ", pserver::ElementTypeName(table.element_type()), " need ", want,
                     " bytes, the buffer has ", size));
  }
  return absl::OkStatus();
}

absl::Status AliveTable(const pserver_table_t* table) {
  if (table == nullptr) return Null("table");
  return AliveRef(table->ref);
}

absl::Status AliveWorker(const pserver_kv_worker_t* worker) {
  if (worker == nullptr) return Null("worker");
  return AliveRef(worker->ref);
}

absl::Status AliveGroup(const pserver_group_t* group) {
  if (group == nullptr) return Null("group");
  return AliveRef(group->ref);
}

void CopyBack(const pserver::Tensor& t, void* data, size_t size) {
  if (t.byte_size() > 0 && t.byte_size() == size) std::memcpy(data, t.bytes().data(), size);
}

}  // namespace

pserver_table_config_t* pserver_table_config_new(void) {
  try {
    auto* config = new pserver_table_config_t;
    config->rep.set_dim(1);
    return config;
  } catch (...) {
    return nullptr;
  }
}

void pserver_table_config_delete(pserver_table_config_t* config) { delete config; }

void pserver_table_config_set_dim(pserver_table_config_t* config, uint32_t dim,
                                  pserver_status_t* status) {
  Run(status, [&]() -> absl::Status {
    if (config == nullptr) return Null("config");
    if (dim < 1 || dim > (1u << 20)) {
      return absl::InvalidArgumentError(absl::StrCat("dim must be in [1, 2^20], got ", dim));
    }
    config->rep.set_dim(dim);
    return absl::OkStatus();
  });
}

void pserver_table_config_set_dtype(pserver_table_config_t* config, int32_t dtype,
                                    pserver_status_t* status) {
  Run(status, [&]() -> absl::Status {
    if (config == nullptr) return Null("config");
    if (dtype != PSERVER_FLOAT32 && dtype != PSERVER_FLOAT64) {
      return absl::InvalidArgumentError(
          absl::StrCat("a table holds float32 or float64 values, not ", pserver_dtype_name(dtype)));
    }
    config->rep.set_element_type(static_cast<ElementType>(dtype));
    return absl::OkStatus();
  });
}

void pserver_table_config_set_initializer(pserver_table_config_t* config, const char* kind,
                                          pserver_status_t* status) {
  Run(status, [&]() -> absl::Status {
    if (config == nullptr) return Null("config");
    return ChooseKind(config->rep.mutable_initializer(), kind, "initializer", kInitializers);
  });
}

void pserver_table_config_set_optimizer(pserver_table_config_t* config, const char* optimizer,
                                        pserver_status_t* status) {
  Run(status, [&]() -> absl::Status {
    if (config == nullptr) return Null("config");
    return ChooseKind(config->rep.mutable_optimizer(), optimizer, "table optimizer",
                      kTableOptimizers);
  });
}

void pserver_table_config_set_partitioning(pserver_table_config_t* config, int32_t kind,
                                           uint64_t range_begin, uint64_t range_end,
                                           pserver_status_t* status) {
  Run(status, [&]() -> absl::Status {
    if (config == nullptr) return Null("config");
    pserver::v1::Partitioning* p = config->rep.mutable_partitioning();
    if (kind == PSERVER_PARTITION_HASH) {
      p->Clear();
      return absl::OkStatus();
    }
    if (kind != PSERVER_PARTITION_RANGE) {
      return absl::InvalidArgumentError(
          absl::StrCat("unknown partitioning ", kind, " (want 0: hash, 1: range)"));
    }
    if (range_end != 0 && range_end <= range_begin) {
      return absl::InvalidArgumentError(
          absl::StrCat("range partitioning needs range_begin < range_end, got [", range_begin, ", ",
                       range_end, ")"));
    }
    p->set_kind(pserver::v1::Partitioning::RANGE);
    p->set_range_begin(range_begin);
    p->set_range_end(range_end);
    return absl::OkStatus();
  });
}

void pserver_table_config_set_consistency(pserver_table_config_t* config, int32_t model,
                                          uint32_t staleness, pserver_status_t* status) {
  Run(status, [&]() -> absl::Status {
    if (config == nullptr) return Null("config");
    if (model < PSERVER_ASP || model > PSERVER_SSP) {
      return absl::InvalidArgumentError(
          absl::StrCat("unknown consistency model ", model, " (want 0: ASP, 1: BSP, 2: SSP)"));
    }
    pserver::v1::Consistency* c = config->rep.mutable_consistency();
    c->set_model(static_cast<pserver::v1::Consistency::Model>(model));
    c->set_staleness(model == PSERVER_SSP ? staleness : 0);
    return absl::OkStatus();
  });
}

void pserver_table_config_set(pserver_table_config_t* config, const char* key, double value,
                              pserver_status_t* status) {
  Run(status, [&]() -> absl::Status {
    if (config == nullptr) return Null("config");
    if (key == nullptr) return Null("key");
    pserver::v1::TableConfig copy = config->rep;  // a failed set changes nothing
    PS_RETURN_IF_ERROR(SetTableConfig(&copy, key, value));
    config->rep = std::move(copy);
    return absl::OkStatus();
  });
}

void pserver_table_config_parse_text(pserver_table_config_t* config, const char* text,
                                     pserver_status_t* status) {
  Run(status, [&]() -> absl::Status {
    if (config == nullptr) return Null("config");
    return ParseText(text, &config->rep);
  });
}

size_t pserver_table_config_text(const pserver_table_config_t* config, char* out, size_t out_size) {
  return WriteText(config == nullptr ? nullptr : &config->rep, out, out_size);
}

pserver_table_t* pserver_client_create_table(pserver_client_t* client, const char* name,
                                             size_t name_len, const pserver_table_config_t* config,
                                             pserver_status_t* status) {
  const pserver::CallOptions call = CallOf(status);
  pserver_table_t* out = nullptr;
  Run(status, [&]() -> absl::Status {
    PS_RETURN_IF_ERROR(Alive(client));
    PS_ASSIGN_OR_RETURN(std::string n, NameOf(name, name_len, "table"));
    pserver::v1::TableConfig defaults;
    defaults.set_dim(1);
    PS_ASSIGN_OR_RETURN(pserver::Table table,
                        pserver::Table::Create(*client->rep, std::move(n),
                                               config == nullptr ? defaults : config->rep, call));
    auto handle = std::make_unique<pserver_table_t>();
    handle->ref = ClientRef{client->cluster, client->rep};
    handle->rep = std::make_unique<pserver::Table>(std::move(table));
    out = handle.release();
    return absl::OkStatus();
  });
  return out;
}

void pserver_table_delete(pserver_table_t* table) {
  delete table;  // NULL is fine; destructors do not throw
}

const char* pserver_table_name(const pserver_table_t* table, size_t* name_len) {
  static const std::string* const kNone = new std::string();
  return NameOut(table == nullptr ? kNone : &table->rep->name(), name_len);
}

uint32_t pserver_table_dim(const pserver_table_t* table) {
  return table == nullptr ? 0 : table->rep->dim();
}

int32_t pserver_table_dtype(const pserver_table_t* table) {
  return table == nullptr ? PSERVER_DTYPE_UNSPECIFIED
                          : static_cast<int32_t>(table->rep->element_type());
}

size_t pserver_table_row_bytes(const pserver_table_t* table) {
  return table == nullptr ? 0 : table->rep->row_bytes();
}

uint32_t pserver_table_chunk_size(const pserver_table_t* table) {
  return table == nullptr ? 0 : std::max<uint32_t>(1, table->rep->config().chunk_size());
}

size_t pserver_table_config_text_of(const pserver_table_t* table, char* out, size_t out_size) {
  return WriteText(table == nullptr ? nullptr : &table->rep->config(), out, out_size);
}

int32_t pserver_table_server_of(const pserver_table_t* table, uint64_t key,
                                pserver_status_t* status) {
  int32_t server = -1;
  Run(status, [&]() -> absl::Status {
    if (table == nullptr) return Null("table");
    PS_ASSIGN_OR_RETURN(int s, table->rep->ServerOf(key));
    server = s;
    return absl::OkStatus();
  });
  return server;
}

void pserver_table_pull(pserver_table_t* table, const uint64_t* keys, size_t n, void* out,
                        size_t out_size, pserver_status_t* status) {
  const pserver::CallOptions call = CallOf(status);
  Run(status, [&]() -> absl::Status {
    PS_RETURN_IF_ERROR(AliveTable(table));
    PS_RETURN_IF_ERROR(CheckKeys(keys, n));
    PS_RETURN_IF_ERROR(CheckRows(*table->rep, "pull from", out, out_size, n, "keys"));
    return table->rep->Pull(KeySpan(keys, n), absl::Span<char>(static_cast<char*>(out), out_size),
                            call);
  });
}

void pserver_table_push(pserver_table_t* table, const uint64_t* keys, size_t n, const void* data,
                        size_t size, pserver_status_t* status) {
  const pserver::CallOptions call = CallOf(status);
  Run(status, [&]() -> absl::Status {
    PS_RETURN_IF_ERROR(AliveTable(table));
    PS_RETURN_IF_ERROR(CheckKeys(keys, n));
    PS_RETURN_IF_ERROR(CheckRows(*table->rep, "push to", data, size, n, "keys"));
    return table->rep->Push(
        KeySpan(keys, n), absl::string_view(size == 0 ? "" : static_cast<const char*>(data), size),
        call);
  });
}

size_t pserver_table_stats(pserver_table_t* table, pserver_table_stats_t* out, size_t capacity,
                           size_t struct_size, pserver_status_t* status) {
  const pserver::CallOptions call = CallOf(status);
  size_t n = 0;
  Run(status, [&]() -> absl::Status {
    PS_RETURN_IF_ERROR(AliveTable(table));
    if (out == nullptr && capacity != 0) return Null("out");
    PS_ASSIGN_OR_RETURN(std::vector<pserver::v1::TableStats> stats, table->rep->Stats(call));
    n = stats.size();
    const size_t copy = std::min(struct_size, sizeof(pserver_table_stats_t));
    for (size_t i = 0; i < n && i < capacity; ++i) {
      const pserver::v1::TableStats& s = stats[i];
      pserver_table_stats_t c;
      std::memset(&c, 0, sizeof c);
      c.server = static_cast<uint32_t>(i);
      c.rows = s.rows();
      c.bytes = s.bytes();
      c.evictions = s.evictions();
      c.pending_keys = s.pending_keys();
      c.keys_pulled = s.keys_pulled();
      c.keys_pushed = s.keys_pushed();
      c.min_clock = s.min_clock();
      c.workers = s.workers();
      std::memcpy(reinterpret_cast<char*>(out) + i * struct_size, &c, copy);
    }
    return absl::OkStatus();
  });
  return n;
}

// -------------------------------------------------------------- KV workers

pserver_kv_worker_t* pserver_kv_worker_join(pserver_table_t* table, const char* worker_id,
                                            pserver_status_t* status) {
  const pserver::CallOptions call = CallOf(status);
  pserver_kv_worker_t* out = nullptr;
  Run(status, [&]() -> absl::Status {
    PS_RETURN_IF_ERROR(AliveTable(table));
    if (worker_id == nullptr) return Null("worker_id");
    PS_ASSIGN_OR_RETURN(std::unique_ptr<pserver::KvWorker> worker,
                        pserver::KvWorker::Join(*table->rep, worker_id, call));
    auto handle = std::make_unique<pserver_kv_worker_t>();
    handle->ref = table->ref;
    handle->rep = std::move(worker);
    out = handle.release();
    return absl::OkStatus();
  });
  return out;
}

void pserver_kv_worker_delete(pserver_kv_worker_t* worker) {
  try {
    if (worker == nullptr) return;
    if (worker->rep != nullptr && AliveRef(worker->ref).ok()) {
      // Leave with a bounded wait; the destructor then has nothing to do.
      pserver::CallOptions call;
      call.deadline = absl::Now() + absl::Seconds(5);
      worker->rep->Leave(call).IgnoreError();
    }
    delete worker;
  } catch (...) {
  }
}

const char* pserver_kv_worker_id(const pserver_kv_worker_t* worker) {
  return worker == nullptr ? "" : worker->rep->id().c_str();
}

int64_t pserver_kv_worker_current_clock(const pserver_kv_worker_t* worker) {
  return worker == nullptr ? 0 : worker->rep->clock();
}

void pserver_kv_worker_get(pserver_kv_worker_t* worker, const uint64_t* keys, size_t n, void* out,
                           size_t out_size, pserver_status_t* status) {
  const pserver::CallOptions call = CallOf(status);
  Run(status, [&]() -> absl::Status {
    PS_RETURN_IF_ERROR(AliveWorker(worker));
    PS_RETURN_IF_ERROR(CheckKeys(keys, n));
    PS_RETURN_IF_ERROR(CheckRows(worker->rep->table(), "get from", out, out_size, n, "keys"));
    return worker->rep->Get(KeySpan(keys, n), absl::Span<char>(static_cast<char*>(out), out_size),
                            call);
  });
}

void pserver_kv_worker_add(pserver_kv_worker_t* worker, const uint64_t* keys, size_t n,
                           const void* data, size_t size, pserver_status_t* status) {
  const pserver::CallOptions call = CallOf(status);
  Run(status, [&]() -> absl::Status {
    PS_RETURN_IF_ERROR(AliveWorker(worker));
    PS_RETURN_IF_ERROR(CheckKeys(keys, n));
    PS_RETURN_IF_ERROR(CheckRows(worker->rep->table(), "add to", data, size, n, "keys"));
    return worker->rep->Add(
        KeySpan(keys, n), absl::string_view(size == 0 ? "" : static_cast<const char*>(data), size),
        call);
  });
}

void pserver_kv_worker_get_chunk(pserver_kv_worker_t* worker, const uint64_t* chunk_ids, size_t n,
                                 void* out, size_t out_size, pserver_status_t* status) {
  const pserver::CallOptions call = CallOf(status);
  Run(status, [&]() -> absl::Status {
    PS_RETURN_IF_ERROR(AliveWorker(worker));
    PS_RETURN_IF_ERROR(CheckKeys(chunk_ids, n));
    const pserver::Table& t = worker->rep->table();
    const size_t chunk = std::max<uint32_t>(1, t.config().chunk_size());
    PS_RETURN_IF_ERROR(CheckRows(t, "get chunks from", out, out_size, n * chunk, "rows"));
    return worker->rep->GetChunk(KeySpan(chunk_ids, n),
                                 absl::Span<char>(static_cast<char*>(out), out_size), call);
  });
}

void pserver_kv_worker_add_chunk(pserver_kv_worker_t* worker, const uint64_t* chunk_ids, size_t n,
                                 const void* data, size_t size, pserver_status_t* status) {
  const pserver::CallOptions call = CallOf(status);
  Run(status, [&]() -> absl::Status {
    PS_RETURN_IF_ERROR(AliveWorker(worker));
    PS_RETURN_IF_ERROR(CheckKeys(chunk_ids, n));
    const pserver::Table& t = worker->rep->table();
    const size_t chunk = std::max<uint32_t>(1, t.config().chunk_size());
    PS_RETURN_IF_ERROR(CheckRows(t, "add chunks to", data, size, n * chunk, "rows"));
    return worker->rep->AddChunk(
        KeySpan(chunk_ids, n),
        absl::string_view(size == 0 ? "" : static_cast<const char*>(data), size), call);
  });
}

void pserver_kv_worker_clock(pserver_kv_worker_t* worker, pserver_status_t* status) {
  const pserver::CallOptions call = CallOf(status);
  Run(status, [&]() -> absl::Status {
    PS_RETURN_IF_ERROR(AliveWorker(worker));
    return worker->rep->Clock(call);
  });
}

void pserver_kv_worker_leave(pserver_kv_worker_t* worker, pserver_status_t* status) {
  const pserver::CallOptions call = CallOf(status);
  Run(status, [&]() -> absl::Status {
    PS_RETURN_IF_ERROR(AliveWorker(worker));
    return worker->rep->Leave(call);
  });
}

// ------------------------------------------------------------- collectives

pserver_group_t* pserver_group_new(pserver_client_t* client, const char* name, uint32_t size,
                                   const char* participant, pserver_status_t* status) {
  pserver_group_t* out = nullptr;
  Run(status, [&]() -> absl::Status {
    PS_RETURN_IF_ERROR(Alive(client));
    PS_ASSIGN_OR_RETURN(std::string n, Name(name));
    if (n.empty()) return absl::InvalidArgumentError("a group needs a name");
    if (size < 1) return absl::InvalidArgumentError("a group needs at least 1 member");
    if (participant == nullptr) return Null("participant");
    if (*participant == '\0') {
      return absl::InvalidArgumentError("a group member needs a non-empty participant id");
    }
    auto handle = std::make_unique<pserver_group_t>();
    handle->ref = ClientRef{client->cluster, client->rep};
    handle->rep = std::make_unique<pserver::WorkerGroup>(*client->rep, std::move(n), size,
                                                         std::string(participant));
    out = handle.release();
    return absl::OkStatus();
  });
  return out;
}

void pserver_group_delete(pserver_group_t* group) {
  delete group;  // NULL is fine; destructors do not throw
}

void pserver_group_barrier(pserver_group_t* group, int32_t scope, pserver_status_t* status) {
  const pserver::CallOptions call = CallOf(status);
  Run(status, [&]() -> absl::Status {
    PS_RETURN_IF_ERROR(AliveGroup(group));
    if (scope < PSERVER_BARRIER_WORKERS || scope > PSERVER_BARRIER_ALL) {
      return absl::InvalidArgumentError(
          absl::StrCat("unknown barrier scope ", scope, " (want 0: workers, 1: servers, 2: all)"));
    }
    const pserver::BarrierScope s =
        scope == PSERVER_BARRIER_WORKERS   ? pserver::BarrierScope::kWorkers
        : scope == PSERVER_BARRIER_SERVERS ? pserver::BarrierScope::kServers
                                           : pserver::BarrierScope::kAll;
    return group->rep->Barrier(s, call);
  });
}

void pserver_group_all_reduce(pserver_group_t* group, int32_t dtype, const int64_t* shape,
                              size_t ndim, void* data, size_t size, int32_t op,
                              pserver_status_t* status) {
  const pserver::CallOptions call = CallOf(status);
  Run(status, [&]() -> absl::Status {
    PS_RETURN_IF_ERROR(AliveGroup(group));
    if (op != PSERVER_REDUCE_SUM && op != PSERVER_REDUCE_MEAN) {
      return absl::InvalidArgumentError(
          absl::StrCat("unknown reduce op ", op, " (want 0: sum, 1: mean)"));
    }
    PS_ASSIGN_OR_RETURN(pserver::Tensor t, TensorOf(nullptr, dtype, shape, ndim, data, size));
    PS_RETURN_IF_ERROR(group->rep->AllReduce(
        &t, op == PSERVER_REDUCE_MEAN ? pserver::ReduceOp::kMean : pserver::ReduceOp::kSum, call));
    CopyBack(t, data, size);
    return absl::OkStatus();
  });
}

void pserver_group_broadcast(pserver_group_t* group, int32_t dtype, const int64_t* shape,
                             size_t ndim, void* data, size_t size, uint8_t root,
                             pserver_status_t* status) {
  const pserver::CallOptions call = CallOf(status);
  Run(status, [&]() -> absl::Status {
    PS_RETURN_IF_ERROR(AliveGroup(group));
    PS_ASSIGN_OR_RETURN(pserver::Tensor t, TensorOf(nullptr, dtype, shape, ndim, data, size));
    PS_RETURN_IF_ERROR(group->rep->Broadcast(&t, root != 0, call));
    if (root == 0) CopyBack(t, data, size);
    return absl::OkStatus();
  });
}

// ------------------------------------------------------------------ server

pserver_server_options_t* pserver_server_options_new(void) {
  try {
    return new pserver_server_options_t;
  } catch (...) {
    return nullptr;
  }
}

void pserver_server_options_delete(pserver_server_options_t* options) { delete options; }

void pserver_server_options_set_host(pserver_server_options_t* options, const char* host) {
  try {
    if (options != nullptr) options->rep.host = host == nullptr ? "" : host;
  } catch (...) {
  }
}

void pserver_server_options_set_port(pserver_server_options_t* options, int32_t port) {
  if (options != nullptr) options->rep.port = port;
}

void pserver_server_options_set_index(pserver_server_options_t* options, uint32_t index) {
  if (options != nullptr) options->rep.index = index;
}

void pserver_server_options_set_num_threads(pserver_server_options_t* options,
                                            int32_t num_threads) {
  if (options != nullptr) options->rep.num_threads = num_threads;
}

void pserver_server_options_set_checkpoint_dir(pserver_server_options_t* options, const char* dir) {
  try {
    if (options != nullptr) options->rep.checkpoint_dir = dir == nullptr ? "" : dir;
  } catch (...) {
  }
}

void pserver_server_save_checkpoint(pserver_server_t* server, pserver_status_t* status) {
  Run(status, [&]() -> absl::Status {
    if (server == nullptr) return Null("server");
    return server->rep->Save().status();
  });
}

pserver_server_t* pserver_server_new(const pserver_server_options_t* options,
                                     pserver_status_t* status) {
  pserver_server_t* out = nullptr;
  Run(status, [&]() -> absl::Status {
    const pserver::ServerOptions defaults;
    PS_ASSIGN_OR_RETURN(std::unique_ptr<pserver::Server> server,
                        pserver::Server::Start(options == nullptr ? defaults : options->rep));
    out = new pserver_server_t{std::move(server)};
    return absl::OkStatus();
  });
  return out;
}

void pserver_server_delete(pserver_server_t* server) {
  delete server;  // NULL is fine; destructors do not throw
}

const char* pserver_server_address(const pserver_server_t* server) {
  return server == nullptr ? "" : server->rep->address().c_str();
}

int32_t pserver_server_port(const pserver_server_t* server) {
  return server == nullptr ? 0 : server->rep->port();
}

void pserver_server_stop(pserver_server_t* server, int64_t grace_ms) {
  try {
    if (server != nullptr)
      server->rep->Shutdown(absl::Milliseconds(std::max<int64_t>(0, grace_ms)));
  } catch (...) {
  }
}

// ----------------------------------------------------------- local cluster

pserver_local_cluster_t* pserver_local_cluster_new(int32_t num_servers, pserver_status_t* status) {
  return pserver_local_cluster_new_with_options(num_servers, nullptr, status);
}

void pserver_local_cluster_save_checkpoint(pserver_local_cluster_t* cluster,
                                           pserver_status_t* status) {
  Run(status, [&]() -> absl::Status {
    if (cluster == nullptr) return Null("cluster");
    if (cluster->state->stopped.load()) {
      return absl::FailedPreconditionError("pserver: the local cluster was stopped");
    }
    return SaveAll(*cluster->state->cluster);
  });
}

pserver_local_cluster_t* pserver_local_cluster_new_with_options(
    int32_t num_servers, const pserver_server_options_t* base, pserver_status_t* status) {
  pserver_local_cluster_t* out = nullptr;
  Run(status, [&]() -> absl::Status {
    const pserver::ServerOptions defaults;
    PS_ASSIGN_OR_RETURN(
        std::unique_ptr<pserver::LocalCluster> cluster,
        pserver::LocalCluster::Start(num_servers, base == nullptr ? defaults : base->rep));
    auto state = std::make_shared<ClusterState>();
    state->addresses = cluster->addresses();
    state->cluster = std::move(cluster);
    out = new pserver_local_cluster_t{std::move(state)};
    return absl::OkStatus();
  });
  return out;
}

void pserver_local_cluster_delete(pserver_local_cluster_t* cluster) {
  try {
    if (cluster == nullptr) return;
    pserver_local_cluster_stop(cluster);
    delete cluster;
  } catch (...) {
  }
}

int32_t pserver_local_cluster_size(const pserver_local_cluster_t* cluster) {
  return cluster == nullptr ? 0 : static_cast<int32_t>(cluster->state->addresses.size());
}

const char* pserver_local_cluster_address(const pserver_local_cluster_t* cluster, int32_t i) {
  if (cluster == nullptr || i < 0 || static_cast<size_t>(i) >= cluster->state->addresses.size()) {
    return nullptr;
  }
  return cluster->state->addresses[i].c_str();
}

pserver_client_t* pserver_local_cluster_client(pserver_local_cluster_t* cluster,
                                               const pserver_client_options_t* options,
                                               pserver_status_t* status) {
  pserver_client_t* out = nullptr;
  Run(status, [&]() -> absl::Status {
    if (cluster == nullptr) return Null("cluster");
    if (cluster->state->stopped.load()) {
      return absl::FailedPreconditionError("pserver: the local cluster was stopped");
    }
    pserver::ClientOptions client_options;
    if (options != nullptr) client_options = options->rep;
    client_options.servers = cluster->state->addresses;  // names only: calls stay in process
    PS_ASSIGN_OR_RETURN(
        std::unique_ptr<pserver::Client> client,
        pserver::Client::Create(client_options,
                                pserver::InProcessTransports(cluster->state->cluster->stores(),
                                                             cluster->state->cluster->tables())));
    auto handle = std::make_unique<pserver_client_t>();
    handle->cluster = cluster->state;
    handle->rep = std::move(client);
    handle->options = client_options;
    out = handle.release();
    return absl::OkStatus();
  });
  return out;
}

void pserver_local_cluster_stop(pserver_local_cluster_t* cluster) {
  try {
    if (cluster == nullptr) return;
    if (!cluster->state->stopped.exchange(true)) cluster->state->cluster->Shutdown();
  } catch (...) {
  }
}

// ------------------------------------------------------- checkpoint reader

pserver_checkpoint_reader_t* pserver_checkpoint_reader_new(const char* path,
                                                           pserver_status_t* status) {
  pserver_checkpoint_reader_t* out = nullptr;
  Run(status, [&]() -> absl::Status {
    if (path == nullptr) return Null("path");
    auto reader = std::make_unique<pserver_checkpoint_reader_t>();
    PS_RETURN_IF_ERROR(OpenCheckpoints(path, reader.get()));
    PS_RETURN_IF_ERROR(IndexCheckpoints(reader.get()));
    out = reader.release();
    return absl::OkStatus();
  });
  return out;
}

void pserver_checkpoint_reader_delete(pserver_checkpoint_reader_t* reader) { delete reader; }

size_t pserver_checkpoint_reader_num_checkpoints(const pserver_checkpoint_reader_t* reader) {
  return reader == nullptr ? 0 : reader->readers.size();
}

const char* pserver_checkpoint_reader_checkpoint_path(const pserver_checkpoint_reader_t* reader,
                                                      size_t i) {
  if (reader == nullptr || i >= reader->readers.size()) return nullptr;
  return reader->readers[i]->path().c_str();
}

size_t pserver_checkpoint_reader_num_params(const pserver_checkpoint_reader_t* reader) {
  return reader == nullptr ? 0 : reader->names.size();
}

const char* pserver_checkpoint_reader_param_name(const pserver_checkpoint_reader_t* reader,
                                                 size_t i, size_t* name_len) {
  const bool in_range = reader != nullptr && i < reader->names.size();
  return NameOut(in_range ? &reader->names[i] : nullptr, name_len);
}

void pserver_checkpoint_reader_param_info(const pserver_checkpoint_reader_t* reader,
                                          const char* name, size_t name_len, int32_t* dtype,
                                          int64_t* shape, size_t shape_capacity, size_t* ndim,
                                          pserver_status_t* status) {
  Run(status, [&]() -> absl::Status {
    if (reader == nullptr) return Null("reader");
    PS_ASSIGN_OR_RETURN(const std::string n, NameBytes(name, name_len));
    PS_ASSIGN_OR_RETURN(const CheckpointParam* p, FindCheckpointParam(reader, n));
    if (dtype != nullptr) *dtype = static_cast<int32_t>(p->type);
    WriteShape(p->shape, shape, shape_capacity, ndim);
    return absl::OkStatus();
  });
}

void pserver_checkpoint_reader_read(const pserver_checkpoint_reader_t* reader, const char* name,
                                    size_t name_len, int32_t dtype, void* out, size_t out_size,
                                    pserver_status_t* status) {
  Run(status, [&]() -> absl::Status {
    if (reader == nullptr) return Null("reader");
    PS_ASSIGN_OR_RETURN(const std::string n, NameBytes(name, name_len));
    PS_ASSIGN_OR_RETURN(const CheckpointParam* p, FindCheckpointParam(reader, n));
    PS_RETURN_IF_ERROR(CheckDtype(dtype));
    if (out == nullptr && out_size != 0) return Null("out");
    const std::string what = absl::StrCat("parameter '", n, "'");
    PS_RETURN_IF_ERROR(CheckBuffer(what, p->type, p->shape, dtype, out_size));
    const size_t esize = pserver::ElementSize(p->type);
    // Read and check every block before writing any of it.
    std::vector<std::pair<size_t, std::string>> parts;
    size_t total = 0;
    for (uint32_t b = 0; b < p->count; ++b) {
      auto it = p->blocks.find(b);
      if (it == p->blocks.end()) {
        return absl::DataLossError(
            absl::StrCat(what, " is cut into ", p->count, " blocks and block ", b,
                         " is in none of the opened checkpoints (open the directory holding every "
                         "shard's checkpoints)"));
      }
      const auto& [ckpt, index] = it->second;
      const pserver::v1::CheckpointParameter& cp = ckpt->manifest().parameters(index);
      PS_ASSIGN_OR_RETURN(std::string bytes, ckpt->ReadData(cp.content()));
      const size_t offset = static_cast<size_t>(cp.block().offset()) * esize;
      if (offset > out_size || bytes.size() > out_size - offset) {
        return absl::DataLossError(
            absl::StrCat(what, " block ", b, " in ", ckpt->path(), " lies outside the parameter"));
      }
      total += bytes.size();
      parts.emplace_back(offset, std::move(bytes));
    }
    if (total != out_size) {
      return absl::DataLossError(
          absl::StrCat(what, ": its blocks hold ", total, " bytes, the parameter has ", out_size));
    }
    for (const auto& [offset, bytes] : parts) {
      if (!bytes.empty()) std::memcpy(static_cast<char*>(out) + offset, bytes.data(), bytes.size());
    }
    return absl::OkStatus();
  });
}

void pserver_checkpoint_reader_verify(const pserver_checkpoint_reader_t* reader,
                                      pserver_status_t* status) {
  Run(status, [&]() -> absl::Status {
    if (reader == nullptr) return Null("reader");
    for (const auto& r : reader->readers) PS_RETURN_IF_ERROR(r->Verify());
    return absl::OkStatus();
  });
}

size_t pserver_checkpoint_reader_num_tables(const pserver_checkpoint_reader_t* reader) {
  return reader == nullptr ? 0 : reader->table_names.size();
}

const char* pserver_checkpoint_reader_table_name(const pserver_checkpoint_reader_t* reader,
                                                 size_t i, size_t* name_len) {
  const bool in_range = reader != nullptr && i < reader->table_names.size();
  return NameOut(in_range ? &reader->table_names[i] : nullptr, name_len);
}

void pserver_checkpoint_reader_table_info(const pserver_checkpoint_reader_t* reader,
                                          const char* name, size_t name_len, uint32_t* dim,
                                          int32_t* dtype, uint64_t* rows,
                                          pserver_status_t* status) {
  Run(status, [&]() -> absl::Status {
    if (reader == nullptr) return Null("reader");
    PS_ASSIGN_OR_RETURN(const std::string n, NameBytes(name, name_len));
    PS_ASSIGN_OR_RETURN(std::vector<pserver::v1::SparseTableSnapshot> parts,
                        ReadTableSnapshots(reader, n));
    uint64_t total = 0;
    for (const auto& p : parts) total += p.rows();
    if (dim != nullptr) *dim = parts[0].config().dim();
    if (dtype != nullptr) *dtype = static_cast<int32_t>(parts[0].config().element_type());
    if (rows != nullptr) *rows = total;
    return absl::OkStatus();
  });
}

void pserver_checkpoint_reader_read_table(const pserver_checkpoint_reader_t* reader,
                                          const char* name, size_t name_len, uint64_t* keys,
                                          size_t keys_size, void* values, size_t values_size,
                                          pserver_status_t* status) {
  Run(status, [&]() -> absl::Status {
    if (reader == nullptr) return Null("reader");
    PS_ASSIGN_OR_RETURN(const std::string n, NameBytes(name, name_len));
    PS_ASSIGN_OR_RETURN(std::vector<pserver::v1::SparseTableSnapshot> parts,
                        ReadTableSnapshots(reader, n));
    const pserver::v1::TableConfig& config = parts[0].config();
    const size_t row = config.dim() * pserver::ElementSize(config.element_type());
    uint64_t total = 0;
    for (const auto& p : parts) total += p.rows();
    if (keys_size != total * 8 || values_size != total * row) {
      return absl::InvalidArgumentError(absl::StrCat(
          "table '", n, "': ", total, " rows need ", total * 8, " bytes of keys and ", total * row,
          " of values, the buffers have ", keys_size, " and ", values_size));
    }
    if (total > 0 && (keys == nullptr || values == nullptr)) return Null("keys or values");
    // (key, part, row in part), sorted by key.
    std::vector<std::tuple<uint64_t, size_t, size_t>> order;
    order.reserve(total);
    for (size_t p = 0; p < parts.size(); ++p) {
      for (size_t i = 0; i < parts[p].rows(); ++i) {
        uint64_t k;
        std::memcpy(&k, parts[p].keys().data() + i * 8, 8);
        order.emplace_back(k, p, i);
      }
    }
    std::sort(order.begin(), order.end());
    for (size_t j = 0; j < order.size(); ++j) {
      const auto& [k, p, i] = order[j];
      keys[j] = k;
      std::memcpy(static_cast<char*>(values) + j * row, parts[p].values().data() + i * row, row);
    }
    return absl::OkStatus();
  });
}

// ------------------------------------------------------------------ buffers

void pserver_buffer_delete(void* buffer) { std::free(buffer); }

// ------------------------------------------------------------------ etcd

namespace {
absl::Status AliveEtcd(const pserver_etcd_t* etcd) {
  if (etcd == nullptr || etcd->rep == nullptr) return Null("etcd");
  return absl::OkStatus();
}

absl::StatusOr<std::string> Key(const char* key, const char* what) {
  if (key == nullptr) return Null(what);
  if (*key == '\0') return absl::InvalidArgumentError(absl::StrCat(what, " is empty"));
  return std::string(key);
}
}  // namespace

pserver_etcd_t* pserver_etcd_new(const char* endpoints, int64_t timeout_ms,
                                 pserver_status_t* status) {
  pserver_etcd_t* out = nullptr;
  Run(status, [&]() -> absl::Status {
    pserver::EtcdClientOptions options;
    options.endpoints = SplitEndpoints(endpoints);
    if (options.endpoints.empty()) {
      return absl::InvalidArgumentError(
          "etcd endpoints are empty (want \"host:port[,host:port...]\")");
    }
    if (timeout_ms <= 0) return absl::InvalidArgumentError("the etcd timeout must be positive");
    options.timeout = absl::Milliseconds(timeout_ms);
    PS_ASSIGN_OR_RETURN(std::unique_ptr<pserver::EtcdClient> client,
                        pserver::EtcdClient::Connect(std::move(options)));
    auto handle = std::make_unique<pserver_etcd_t>();
    handle->rep = std::move(client);
    out = handle.release();
    return absl::OkStatus();
  });
  return out;
}

void pserver_etcd_delete(pserver_etcd_t* etcd) {
  delete etcd;  // NULL is fine; destructors do not throw
}

void pserver_etcd_get(pserver_etcd_t* etcd, const char* key, char** value, size_t* value_size,
                      pserver_status_t* status) {
  if (value != nullptr) *value = nullptr;
  if (value_size != nullptr) *value_size = 0;
  Run(status, [&]() -> absl::Status {
    PS_RETURN_IF_ERROR(AliveEtcd(etcd));
    PS_ASSIGN_OR_RETURN(std::string k, Key(key, "key"));
    if (value == nullptr) return Null("value");
    PS_ASSIGN_OR_RETURN(pserver::KeyValue kv, etcd->rep->Get(k));
    char* buffer = static_cast<char*>(std::malloc(kv.value.size() + 1));
    if (buffer == nullptr) return absl::ResourceExhaustedError("pserver: out of memory");
    std::memcpy(buffer, kv.value.data(), kv.value.size());
    buffer[kv.value.size()] = '\0';
    *value = buffer;
    if (value_size != nullptr) *value_size = kv.value.size();
    return absl::OkStatus();
  });
}

pserver_etcd_kvs_t* pserver_etcd_get_prefix(pserver_etcd_t* etcd, const char* prefix,
                                            pserver_status_t* status) {
  pserver_etcd_kvs_t* out = nullptr;
  Run(status, [&]() -> absl::Status {
    PS_RETURN_IF_ERROR(AliveEtcd(etcd));
    PS_ASSIGN_OR_RETURN(std::string p, Key(prefix, "prefix"));
    PS_ASSIGN_OR_RETURN(std::vector<pserver::KeyValue> kvs, etcd->rep->GetPrefix(p));
    auto handle = std::make_unique<pserver_etcd_kvs_t>();
    handle->kvs = std::move(kvs);
    out = handle.release();
    return absl::OkStatus();
  });
  return out;
}

void pserver_etcd_put(pserver_etcd_t* etcd, const char* key, const void* data, size_t size,
                      pserver_status_t* status) {
  Run(status, [&]() -> absl::Status {
    PS_RETURN_IF_ERROR(AliveEtcd(etcd));
    PS_ASSIGN_OR_RETURN(std::string k, Key(key, "key"));
    if (data == nullptr && size != 0) return Null("data");
    return etcd->rep->Put(k,
                          absl::string_view(size == 0 ? "" : static_cast<const char*>(data), size));
  });
}

void pserver_etcd_delete_key(pserver_etcd_t* etcd, const char* key, pserver_status_t* status) {
  Run(status, [&]() -> absl::Status {
    PS_RETURN_IF_ERROR(AliveEtcd(etcd));
    PS_ASSIGN_OR_RETURN(std::string k, Key(key, "key"));
    return etcd->rep->Delete(k);
  });
}

void pserver_etcd_kvs_delete(pserver_etcd_kvs_t* kvs) { delete kvs; }

size_t pserver_etcd_kvs_size(const pserver_etcd_kvs_t* kvs) {
  return kvs == nullptr ? 0 : kvs->kvs.size();
}

const char* pserver_etcd_kvs_key(const pserver_etcd_kvs_t* kvs, size_t i) {
  if (kvs == nullptr || i >= kvs->kvs.size()) return nullptr;
  return kvs->kvs[i].key.c_str();
}

const char* pserver_etcd_kvs_value(const pserver_etcd_kvs_t* kvs, size_t i) {
  if (kvs == nullptr || i >= kvs->kvs.size()) return nullptr;
  return kvs->kvs[i].value.c_str();
}

size_t pserver_etcd_kvs_value_size(const pserver_etcd_kvs_t* kvs, size_t i) {
  if (kvs == nullptr || i >= kvs->kvs.size()) return 0;
  return kvs->kvs[i].value.size();
}

}  // extern "C"

// ---- device memory ----------------------------------------------------------------

namespace {

// Runs `fn` with an idle DeviceIo of `device` from the client's pool (a new
// one if none is idle: UNAVAILABLE without a device), and puts it back.
absl::Status WithDeviceIo(pserver_client_t* client, int32_t device,
                          const std::function<absl::Status(pserver::DeviceIo&)>& fn) {
  std::unique_ptr<pserver::DeviceIo> io;
  {
    absl::MutexLock lock(&client->device_io.mu);
    auto& idle = client->device_io.idle;
    for (auto it = idle.begin(); it != idle.end(); ++it) {
      if (it->first == device) {
        io = std::move(it->second);
        idle.erase(it);
        break;
      }
    }
  }
  if (io == nullptr) {
    PS_ASSIGN_OR_RETURN(io, pserver::DeviceIo::ForCuda(client->rep.get(), device));
  }
  absl::Status status = fn(*io);
  absl::MutexLock lock(&client->device_io.mu);
  client->device_io.idle.emplace_back(device, std::move(io));
  return status;
}

// The shape of a gradient of `size` bytes for parameter `name`: the one the
// handle knows, or one dimension.
absl::StatusOr<pserver::Shape> DeviceGradientShape(pserver_client_t* client,
                                                   const std::string& name, int32_t dtype,
                                                   size_t size) {
  PS_RETURN_IF_ERROR(CheckDtype(dtype));
  const ElementType type = static_cast<ElementType>(dtype);
  const size_t esize = pserver::ElementSize(type);
  if (size % esize != 0) {
    return absl::InvalidArgumentError(absl::StrCat("gradient for parameter '", name, "': ", size,
                                                   " bytes is not a whole ", "number of ",
                                                   pserver::ElementTypeName(type), " elements"));
  }
  if (std::optional<Layout> layout = Known(client, name); layout.has_value()) {
    PS_RETURN_IF_ERROR(CheckBuffer(absl::StrCat("parameter '", name, "'"), layout->type,
                                   layout->shape, dtype, size));
    return layout->shape;
  }
  return pserver::Shape{static_cast<int64_t>(size / esize)};
}

}  // namespace

extern "C" {

void pserver_client_send_grad_device(pserver_client_t* client, const char* name, size_t name_len,
                                     int32_t dtype, const void* device_data, size_t size,
                                     int32_t device, pserver_status_t* status) {
  const pserver::CallOptions call = CallOf(status);
  Run(status, [&]() -> absl::Status {
    PS_RETURN_IF_ERROR(Alive(client));
    PS_ASSIGN_OR_RETURN(std::string n, ParamName(name, name_len));
    PS_ASSIGN_OR_RETURN(pserver::Shape shape, DeviceGradientShape(client, n, dtype, size));
    return WithDeviceIo(client, device, [&](pserver::DeviceIo& io) {
      return io.SendGrad(n, static_cast<ElementType>(dtype), shape, device_data, call);
    });
  });
}

void pserver_client_get_param_device(pserver_client_t* client, const char* name, size_t name_len,
                                     int32_t dtype, void* device_out, size_t out_size,
                                     int32_t device, pserver_status_t* status) {
  const pserver::CallOptions call = CallOf(status);
  Run(status, [&]() -> absl::Status {
    PS_RETURN_IF_ERROR(Alive(client));
    PS_ASSIGN_OR_RETURN(std::string n, ParamName(name, name_len));
    PS_RETURN_IF_ERROR(CheckDtype(dtype));
    if (std::optional<Layout> layout = Known(client, n); layout.has_value()) {
      PS_RETURN_IF_ERROR(CheckBuffer(absl::StrCat("parameter '", n, "'"), layout->type,
                                     layout->shape, dtype, out_size));
    }
    return WithDeviceIo(client, device, [&](pserver::DeviceIo& io) {
      return io.GetParam(n, device_out, out_size, static_cast<ElementType>(dtype), call);
    });
  });
}

void pserver_client_push_pull_device(pserver_client_t* client, const char* name, size_t name_len,
                                     int32_t dtype, const void* device_data, void* device_out,
                                     size_t size, int32_t device, pserver_status_t* status) {
  const pserver::CallOptions call = CallOf(status);
  Run(status, [&]() -> absl::Status {
    PS_RETURN_IF_ERROR(Alive(client));
    PS_ASSIGN_OR_RETURN(std::string n, ParamName(name, name_len));
    PS_ASSIGN_OR_RETURN(pserver::Shape shape, DeviceGradientShape(client, n, dtype, size));
    return WithDeviceIo(client, device, [&](pserver::DeviceIo& io) {
      return io.PushPull(n, static_cast<ElementType>(dtype), shape, device_data, device_out, call);
    });
  });
}

}  // extern "C"
