// Helpers shared by the C ABI's forwarders (internal.h).
#include "cc/capi/internal.h"

#include <cstring>
#include <exception>
#include <new>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/time.h"
#include "cc/core/status_macros.h"

namespace pserver_capi {

using pserver::ElementType;

namespace {

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

}  // namespace

void Set(pserver_status_t* status, const absl::Status& s) {
  if (status == nullptr) return;
  status->code = static_cast<int32_t>(s.code());
  status->message = std::string(s.message());
}

void SetFromException(pserver_status_t* status) {
  try {
    throw;
  } catch (const std::bad_alloc&) {
    Set(status, absl::ResourceExhaustedError("pserver: out of memory"));
  } catch (const std::exception& e) {
    Set(status, absl::InternalError(absl::StrCat("pserver: unexpected exception: ", e.what())));
  } catch (...) {
    Set(status, absl::InternalError("pserver: unexpected exception"));
  }
}

pserver::CallOptions CallOf(const pserver_status_t* status) {
  pserver::CallOptions call;
  if (status != nullptr && status->timeout_ms > 0) {
    call.deadline = absl::Now() + absl::Milliseconds(status->timeout_ms);
  }
  if (status != nullptr) call.cancel = status->cancel.get();
  return call;
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

absl::StatusOr<std::string> NameBytes(const char* name, size_t name_len) {
  if (name == nullptr) return Null("name");
  return std::string(name, name_len);
}

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

size_t WriteString(absl::string_view s, char* out, size_t out_size) {
  if (out != nullptr && out_size > 0) {
    const size_t n = std::min(s.size(), out_size - 1);
    if (n > 0) std::memcpy(out, s.data(), n);
    out[n] = '\0';
  }
  return s.size();
}

absl::Status SetTls(const char* cert, const char* key, const char* ca, pserver::TlsOptions* tls) {
  pserver::TlsOptions candidate = *tls;
  candidate.cert = cert == nullptr ? "" : cert;
  candidate.key = key == nullptr ? "" : key;
  candidate.ca = ca == nullptr ? "" : ca;
  if (!candidate.enabled()) candidate.server_name.clear();
  PS_RETURN_IF_ERROR(pserver::CheckTlsOptions(candidate));
  *tls = std::move(candidate);
  return absl::OkStatus();
}

std::vector<std::string> SplitEndpoints(const char* endpoints) {
  std::vector<std::string> out;
  if (endpoints == nullptr) return out;
  for (absl::string_view part : absl::StrSplit(endpoints, ',')) {
    part = absl::StripAsciiWhitespace(part);
    if (!part.empty()) out.emplace_back(part);
  }
  return out;
}

absl::Status SetEtcd(const char* endpoints, const char* cluster,
                     std::vector<std::string>* endpoints_out, std::string* cluster_out) {
  std::vector<std::string> list = SplitEndpoints(endpoints);
  if (list.empty()) {
    return absl::InvalidArgumentError(
        "etcd endpoints are empty (want \"host:port[,host:port...]\")");
  }
  *endpoints_out = std::move(list);
  *cluster_out = cluster == nullptr || *cluster == '\0' ? "default" : cluster;
  return absl::OkStatus();
}

pserver::EtcdTlsOptions EtcdTlsOf(const char* ca, const char* cert, const char* key) {
  pserver::EtcdTlsOptions tls;
  tls.ca = ca == nullptr ? "" : ca;
  tls.cert = cert == nullptr ? "" : cert;
  tls.key = key == nullptr ? "" : key;
  return tls;
}

namespace {

// Bytes of a tensor of `type` and `shape` (0 for a bad shape).
size_t ByteSize(ElementType type, const pserver::Shape& shape) {
  absl::StatusOr<int64_t> n = pserver::NumElements(shape);
  return n.ok() ? static_cast<size_t>(*n) * pserver::ElementSize(type) : 0;
}

}  // namespace

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

absl::Status ClusterRunning(const ClusterState* cluster) {
  if (cluster != nullptr && cluster->stopped.load()) {
    return absl::UnavailableError("pserver: the local cluster of this client was stopped");
  }
  return absl::OkStatus();
}

absl::Status Alive(const pserver_client_t* client) {
  if (client == nullptr) return Null("client");
  return ClusterRunning(client->cluster.get());
}

absl::Status AliveRef(const ClientRef& ref) { return ClusterRunning(ref.cluster.get()); }

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
  return pserver::Tensor::View(type, std::move(s), data, size);
}

std::string ParamWhat(const std::string& name) { return absl::StrCat("parameter '", name, "'"); }

absl::StatusOr<pserver::Shape> GradientShape(const pserver::Client& client, const std::string& name,
                                             int32_t dtype, size_t size) {
  PS_RETURN_IF_ERROR(CheckDtype(dtype));
  const ElementType type = static_cast<ElementType>(dtype);
  const size_t esize = pserver::ElementSize(type);
  if (size % esize != 0) {
    return absl::InvalidArgumentError(absl::StrCat("gradient for parameter '", name, "': ", size,
                                                   " bytes is not a whole ", "number of ",
                                                   pserver::ElementTypeName(type), " elements"));
  }
  if (std::optional<pserver::ParamLayout> layout = client.KnownLayout(name)) {
    PS_RETURN_IF_ERROR(CheckBuffer(ParamWhat(name), layout->type, layout->shape, dtype, size));
    return layout->shape;
  }
  return pserver::Shape{static_cast<int64_t>(size / esize)};
}

}  // namespace pserver_capi
