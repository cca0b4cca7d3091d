// The C ABI: a plain etcd client (what psctl and tools read and write).
#include <cstdlib>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "cc/capi/internal.h"
#include "cc/core/status_macros.h"

using pserver_capi::Null;
using pserver_capi::Run;

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

extern "C" {

pserver_etcd_t* pserver_etcd_new(const char* endpoints, int64_t timeout_ms,
                                 pserver_status_t* status) {
  return pserver_etcd_new_tls(endpoints, timeout_ms, nullptr, nullptr, nullptr, status);
}

pserver_etcd_t* pserver_etcd_new_tls(const char* endpoints, int64_t timeout_ms, const char* ca,
                                     const char* cert, const char* key, pserver_status_t* status) {
  pserver_etcd_t* out = nullptr;
  Run(status, [&]() -> absl::Status {
    pserver::EtcdClientOptions options;
    options.tls = pserver_capi::EtcdTlsOf(ca, cert, key);
    options.endpoints = pserver_capi::SplitEndpoints(endpoints);
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
