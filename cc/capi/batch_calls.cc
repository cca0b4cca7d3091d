// One call per operation: the batched client calls of pserver.h over the
// caller's arrays, so that Python and Go cross the ABI once per push, pull
// or push+pull. Pure forwarding over the public ABI: each builds the
// pserver_batch_t(s) the batched call takes and makes that call, so both
// answer identically by construction.
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>

#include "cc/capi/pserver.h"

namespace {

struct BatchDeleter {
  void operator()(pserver_batch_t* batch) const { pserver_batch_delete(batch); }
};
using Batch = std::unique_ptr<pserver_batch_t, BatchDeleter>;

// A new batch, or nullptr with RESOURCE_EXHAUSTED in `status`.
Batch NewBatch(pserver_status_t* status) {
  Batch batch(pserver_batch_new());
  if (batch == nullptr) pserver_status_set(status, PSERVER_RESOURCE_EXHAUSTED, "pserver: out of memory for a batch");
  return batch;
}

// INVALID_ARGUMENT in `status` when n > 0 and an array is NULL.
bool ArraysGiven(size_t n, std::initializer_list<const void*> arrays, pserver_status_t* status) {
  if (n == 0) return true;
  for (const void* a : arrays) {
    if (a == nullptr) {
      pserver_status_set(status, PSERVER_INVALID_ARGUMENT,
                         "pserver: a NULL array for a batch of entries");
      return false;
    }
  }
  return true;
}

}  // namespace

extern "C" {

void pserver_client_push_pull_one(pserver_client_t* client, const char* name, size_t name_len,
                                  int32_t dtype, const void* data, size_t size, void* out,
                                  size_t out_size, pserver_status_t* status) {
  Batch grads = NewBatch(status), outs = NewBatch(status);
  if (grads == nullptr || outs == nullptr) return;
  pserver_batch_add_input(grads.get(), name, name_len, dtype, data, size);
  pserver_batch_add_output(outs.get(), name, name_len, dtype, out, out_size);
  pserver_client_push_pull(client, grads.get(), outs.get(), status);
}

void pserver_client_send_grads_n(pserver_client_t* client, size_t n, const char* const* names,
                                 const size_t* name_lens, const int32_t* dtypes,
                                 const void* const* data, const size_t* sizes,
                                 pserver_status_t* status) {
  if (!ArraysGiven(n, {names, name_lens, dtypes, data, sizes}, status)) return;
  Batch grads = NewBatch(status);
  if (grads == nullptr) return;
  for (size_t i = 0; i < n; ++i) {
    pserver_batch_add_input(grads.get(), names[i], name_lens[i], dtypes[i], data[i], sizes[i]);
  }
  pserver_client_send_grads(client, grads.get(), status);
}

void pserver_client_get_params_n(pserver_client_t* client, size_t n, const char* const* names,
                                 const size_t* name_lens, const int32_t* dtypes,
                                 void* const* outs, const size_t* sizes,
                                 pserver_status_t* status) {
  if (!ArraysGiven(n, {names, name_lens, dtypes, outs, sizes}, status)) return;
  Batch batch = NewBatch(status);
  if (batch == nullptr) return;
  for (size_t i = 0; i < n; ++i) {
    pserver_batch_add_output(batch.get(), names[i], name_lens[i], dtypes[i], outs[i], sizes[i]);
  }
  pserver_client_get_params(client, batch.get(), status);
}

void pserver_client_push_pull_n(pserver_client_t* client, size_t n, const char* const* names,
                                const size_t* name_lens, const int32_t* dtypes,
                                const void* const* data, void* const* outs, const size_t* sizes,
                                pserver_status_t* status) {
  if (!ArraysGiven(n, {names, name_lens, dtypes, data, outs, sizes}, status)) return;
  Batch grads = NewBatch(status), results = NewBatch(status);
  if (grads == nullptr || results == nullptr) return;
  for (size_t i = 0; i < n; ++i) {
    pserver_batch_add_input(grads.get(), names[i], name_lens[i], dtypes[i], data[i], sizes[i]);
    pserver_batch_add_output(results.get(), names[i], name_lens[i], dtypes[i], outs[i], sizes[i]);
  }
  pserver_client_push_pull(client, grads.get(), results.get(), status);
}

}  // extern "C"
