// The C ABI: version, statuses, cancellation, codes, element types, buffers.
#include <algorithm>
#include <cstdlib>

#include "cc/capi/internal.h"

using pserver_capi::CheckDtype;
using pserver_capi::NewHandle;

extern "C" {

const char* pserver_version(void) { return "0.7.0"; }

// ------------------------------------------------------------------ status

pserver_status_t* pserver_status_new(void) { return NewHandle<pserver_status_t>(); }

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

pserver_cancel_t* pserver_cancel_new(void) { return NewHandle<pserver_cancel_t>(); }

void pserver_cancel_delete(pserver_cancel_t* cancel) { delete cancel; }

void pserver_cancel_cancel(pserver_cancel_t* cancel) {
  if (cancel != nullptr) cancel->rep->Cancel();
}

void pserver_cancel_set_check(pserver_cancel_t* cancel, int (*check)(void* arg), void* arg,
                              int32_t every_ms) {
  if (cancel == nullptr) return;
  if (check == nullptr) {
    cancel->rep->SetCheck(nullptr, absl::InfiniteDuration());
    return;
  }
  cancel->rep->SetCheck([check, arg] { return check(arg) != 0; },
                        absl::Milliseconds(std::max<int32_t>(every_ms, 1)));
}

uint8_t pserver_cancel_cancelled(const pserver_cancel_t* cancel) {
  return cancel != nullptr && cancel->rep->cancelled() ? 1 : 0;
}

void pserver_status_set_cancel(pserver_status_t* status, pserver_cancel_t* cancel) {
  if (status != nullptr) status->cancel = cancel == nullptr ? nullptr : cancel->rep;
}

void pserver_status_set(pserver_status_t* status, int32_t code, const char* message) {
  if (status == nullptr) return;
  try {
    status->code = code;
    status->message = message == nullptr ? "" : message;
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
  return pserver::ElementSize(static_cast<pserver::ElementType>(dtype));
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

// ------------------------------------------------------------------ buffers

void pserver_buffer_delete(void* buffer) { std::free(buffer); }

}  // extern "C"
