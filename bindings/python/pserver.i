/* SWIG interface of the Python binding: pserver.h and nothing else.
 *
 * Generates pserver/capi.py and pserver/_capi.so. Users never import them:
 * the pure-Python package python/pserver wraps them (numpy, exceptions,
 * context managers). Built with `swig -c++ -python -threads`: every call
 * releases the GIL while the C function runs. Conventions here:
 *   - pserver_status_t* is never seen in Python: each call gets a fresh
 *     status, and a failure raises the exception class pserver._errors
 *     chooses for its code (pserver.NotFound, pserver.InvalidArgument, ...).
 *   - (const void* data, size_t size) and (void* out, size_t out_size) take
 *     any C-contiguous buffer (numpy arrays, bytes, bytearray); outputs must
 *     be writable. The pure-Python layer checks dtype and shape first.
 *   - shapes go in as sequences of ints (numpy.i's IN_ARRAY1) and come back
 *     as (dtype, shape tuple) from the *_param_info calls.
 *   - names of parameters and tables, (const char* name, size_t name_len),
 *     take a str (encoded UTF-8, lone surrogates from surrogateescape back
 *     to their bytes) or bytes; a str that cannot be encoded raises
 *     pserver.InvalidArgument. Returned names (size_t* name_len) come back
 *     as str, bytes that are not UTF-8 decoded with surrogateescape.
 *   - cancellation: pserver_py_swap_call_cancel sets, for the calling
 *     thread, a pserver_cancel_t that each call's fresh status carries
 *     (pserver_status_set_cancel). pserver._calls gives the main thread's
 *     blocking calls one made by pserver_py_cancel_new_interruptible: while
 *     such a call waits, the library runs Python's signal handlers on the
 *     main thread every 50 ms (pserver_cancel_set_check); one that raises
 *     (KeyboardInterrupt at Ctrl-C) cancels the call, and
 *     pserver_py_take_interrupt hands what it raised to pserver._calls.
 *   - per-call timeouts: pserver_py_swap_call_deadline_ns sets, for the
 *     calling thread, a time (time.monotonic_ns()) by which its blocking
 *     calls must end; each call's fresh status then carries the time left
 *     (pserver_status_set_timeout_ms). pserver._calls sets it around a
 *     method given `timeout=` and restores it after.
 *   - tables: keys (const uint64_t* keys / chunk_ids, size_t n) take any
 *     C-contiguous buffer of 8-byte items (numpy uint64 arrays); the
 *     pure-Python layer checks the dtype. pserver_table_stats returns a list
 *     of dicts; pserver_group_all_reduce and _broadcast write their
 *     (void* data, size_t size) buffer in place.
 *   - device memory: the device pointers of the *_device calls
 *     (const void* device_data, void* device_out) are Python ints, as
 *     __cuda_array_interface__ gives them; pserver._arrays checks the rest.
 *   - the one-call batches (pserver_client_send_grads_n, _get_params_n,
 *     _push_pull_n) take one list of (name, dtype, buffer) tuples, or
 *     (name, dtype, gradient, output) for push_pull_n, borrowed for the
 *     call: pserver._client makes each batched operation one C call.
 *   - etcd: pserver_etcd_get returns the value as bytes, and
 *     pserver_etcd_get_prefix a list of (key str, value bytes) tuples; the
 *     library's buffers are freed in the wrapper.
 */
%module(package="pserver", threads="1") capi

%{
#define SWIG_FILE_WITH_INIT
#include <string.h>
#include <time.h>
#include <vector>
#include "cc/capi/pserver.h"

/* Raises the exception pserver._errors picks for a status code. */
static void pserver_py_raise(int code, const char* message) {
  PyObject* module = PyImport_ImportModule("pserver._errors");
  if (module != NULL) {
    PyObject* exc = PyObject_CallMethod(module, "error_from_status", "is", code, message);
    Py_DECREF(module);
    if (exc != NULL) {
      PyErr_SetObject((PyObject*)Py_TYPE(exc), exc);
      Py_DECREF(exc);
      return;
    }
  }
  PyErr_Clear();
  PyErr_Format(PyExc_RuntimeError, "pserver error %d: %s", code, message);
}

/* The calling thread's call deadline: CLOCK_MONOTONIC nanoseconds (as
 * Python's time.monotonic_ns()), 0 for none. Read by the status typemap
 * while the thread holds the GIL. */
static thread_local int64_t pserver_py_deadline_ns = 0;

/* The calling thread's call cancellation (not owned), NULL for none. */
static thread_local pserver_cancel_t* pserver_py_cancel = NULL;

/* The time left until the thread's call deadline, in ms (at least 1), or
 * 0 without one. */
static int64_t pserver_py_timeout_ms(void) {
  if (pserver_py_deadline_ns <= 0) return 0;
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  const int64_t now = (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
  const int64_t left_ms = (pserver_py_deadline_ns - now) / 1000000;
  return left_ms < 1 ? 1 : left_ms;
}

/* A buffer view released after the call. */
struct PserverPyBuffer {
  Py_buffer view;
  int held = 0;
};

/* A name (str, encoded UTF-8 with surrogateescape, or bytes) as the ABI
 * takes it: *encoded holds the bytes of a str (the caller releases it).
 * Returns -1 with a Python exception set for anything else. */
static int pserver_py_name(PyObject* input, PyObject** encoded, const char** name,
                           size_t* name_len) {
  if (PyBytes_Check(input)) {
    *name = PyBytes_AS_STRING(input);
    *name_len = (size_t)PyBytes_GET_SIZE(input);
    return 0;
  }
  if (!PyUnicode_Check(input)) {
    PyErr_Format(PyExc_TypeError, "a name must be str or bytes, not %.100s",
                 Py_TYPE(input)->tp_name);
    return -1;
  }
  *encoded = PyUnicode_AsEncodedString(input, "utf-8", "surrogateescape");
  if (*encoded == NULL) {
    PyObject* repr = PyObject_Repr(input);
    PyErr_Clear();
    const char* shown = repr != NULL ? PyUnicode_AsUTF8(repr) : NULL;
    PyErr_Clear();
    char message[512];
    snprintf(message, sizeof message, "name %.400s cannot be encoded as UTF-8",
             shown != NULL ? shown : "?");
    Py_XDECREF(repr);
    pserver_py_raise(PSERVER_INVALID_ARGUMENT, message);
    return -1;
  }
  *name = PyBytes_AS_STRING(*encoded);
  *name_len = (size_t)PyBytes_GET_SIZE(*encoded);
  return 0;
}

/* The parallel arrays of the _n calls, from a sequence of tuples
 * (name, dtype, input buffer) / (name, dtype, output buffer) /
 * (name, dtype, input buffer, output buffer); every buffer borrowed (no
 * copy) and released after the call. */
struct PserverPyEntries {
  std::vector<const char*> names;
  std::vector<size_t> name_lens;
  std::vector<int32_t> dtypes;
  std::vector<const void*> data;
  std::vector<void*> outs;
  std::vector<size_t> sizes;
  std::vector<PyObject*> encoded;
  std::vector<Py_buffer> views;

  void Release() {
    for (Py_buffer& view : views) PyBuffer_Release(&view);
    for (PyObject* e : encoded) Py_XDECREF(e);
    views.clear();
    encoded.clear();
  }

  /* Borrows `input`'s buffer (writable for an output); -1 with a Python
   * exception when it has none or its size differs from the entry's. */
  int Borrow(PyObject* input, bool writable, void** buf, size_t* size) {
    Py_buffer view;
    int flags = PyBUF_C_CONTIGUOUS | (writable ? PyBUF_WRITABLE : 0);
    if (PyObject_GetBuffer(input, &view, flags) != 0) return -1;
    views.push_back(view);
    *buf = view.buf;
    *size = (size_t)view.len;
    return 0;
  }

  int Parse(PyObject* seq, bool with_in, bool with_out) {
    PyObject* fast = PySequence_Fast(seq, "a batch must be a sequence of tuples");
    if (fast == NULL) return -1;
    const Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
    const Py_ssize_t width = 2 + (with_in ? 1 : 0) + (with_out ? 1 : 0);
    int rc = 0;
    for (Py_ssize_t i = 0; i < n && rc == 0; ++i) {
      PyObject* t = PySequence_Fast_GET_ITEM(fast, i);
      if (!PyTuple_Check(t) || PyTuple_GET_SIZE(t) != width) {
        PyErr_Format(PyExc_TypeError, "batch entry %zd must be a tuple of %zd items", i, width);
        rc = -1;
        break;
      }
      PyObject* e = NULL;
      const char* name = NULL;
      size_t name_len = 0;
      rc = pserver_py_name(PyTuple_GET_ITEM(t, 0), &e, &name, &name_len);
      if (e != NULL) encoded.push_back(e);
      if (rc != 0) break;
      const long dtype = PyLong_AsLong(PyTuple_GET_ITEM(t, 1));
      if (dtype == -1 && PyErr_Occurred()) {
        rc = -1;
        break;
      }
      void* in = NULL;
      void* out = NULL;
      size_t size = 0, out_size = 0;
      if (with_in) rc = Borrow(PyTuple_GET_ITEM(t, 2), false, &in, &size);
      if (rc == 0 && with_out) {
        rc = Borrow(PyTuple_GET_ITEM(t, width - 1), true, &out, &out_size);
        if (rc == 0 && with_in && out_size != size) {
          char message[160];
          snprintf(message, sizeof message,
                   "batch entry %zd: an output of %zu bytes for a gradient of %zu", i, out_size,
                   size);
          pserver_py_raise(PSERVER_INVALID_ARGUMENT, message);
          rc = -1;
        }
        if (!with_in) size = out_size;
      }
      names.push_back(name);
      name_lens.push_back(name_len);
      dtypes.push_back((int32_t)dtype);
      data.push_back(in);
      outs.push_back(out);
      sizes.push_back(size);
    }
    Py_DECREF(fast);
    return rc;
  }
};
%}

%include "stdint.i"
%include "numpy.i"
%init %{
  import_array();
%}

/* ---- status: hidden, raised ---- */
%typemap(in, numinputs=0) pserver_status_t* status {
  $1 = pserver_status_new();
  if ($1 == NULL) { PyErr_NoMemory(); SWIG_fail; }
  pserver_status_set_timeout_ms($1, pserver_py_timeout_ms());
  pserver_status_set_cancel($1, pserver_py_cancel);
}
%typemap(argout) pserver_status_t* status {
  if (pserver_status_code($1) != PSERVER_OK) {
    pserver_py_raise(pserver_status_code($1), pserver_status_message($1));
    Py_XDECREF($result);
    $result = NULL;
    SWIG_fail;
  }
}
%typemap(freearg) pserver_status_t* status {
  pserver_status_delete($1);
}

/* ---- names in: str or bytes, with their length ---- */
%typemap(in) (const char* name, size_t name_len) (PyObject* encoded = NULL,
                                                  const char* chars = NULL) {
  if (pserver_py_name($input, &encoded, &chars, &$2) != 0) SWIG_fail;
  $1 = ($1_ltype)chars;
}
%typemap(freearg) (const char* name, size_t name_len) {
  Py_XDECREF(encoded$argnum);
}
%typemap(typecheck) (const char* name, size_t name_len) {
  $1 = PyBytes_Check($input) || PyUnicode_Check($input);
}

/* ---- names out: str (surrogateescape), None for NULL ---- */
%typemap(in, numinputs=0) size_t* name_len (size_t len = 0) {
  $1 = &len;
}
%typemap(argout) size_t* name_len {
  Py_XDECREF($result);
  if (result == NULL) {
    Py_INCREF(Py_None);
    $result = Py_None;
  } else {
    $result = PyUnicode_DecodeUTF8(result, (Py_ssize_t)*$1, "surrogateescape");
  }
}

/* ---- read-only buffers ---- */
%typemap(in) (const void* data, size_t size) (PserverPyBuffer pybuf) {
  if (PyObject_GetBuffer($input, &pybuf.view, PyBUF_C_CONTIGUOUS) != 0) SWIG_fail;
  pybuf.held = 1;
  $1 = pybuf.view.buf;
  $2 = (size_t)pybuf.view.len;
}
%typemap(freearg) (const void* data, size_t size) {
  if (pybuf$argnum.held) PyBuffer_Release(&pybuf$argnum.view);
}
%typemap(typecheck) (const void* data, size_t size) {
  $1 = PyObject_CheckBuffer($input);
}

/* ---- the _n calls' parallel arrays: a list of (name, dtype, buffer[, out]) ---- */
%typemap(in) (size_t n, const char* const* names, const size_t* name_lens,
              const int32_t* dtypes, const void* const* data, const size_t* sizes)
             (PserverPyEntries entries) {
  if (entries.Parse($input, true, false) != 0) SWIG_fail;
  $1 = entries.names.size();
  $2 = ($2_ltype)entries.names.data();
  $3 = ($3_ltype)entries.name_lens.data();
  $4 = ($4_ltype)entries.dtypes.data();
  $5 = ($5_ltype)entries.data.data();
  $6 = ($6_ltype)entries.sizes.data();
}
%typemap(in) (size_t n, const char* const* names, const size_t* name_lens,
              const int32_t* dtypes, void* const* outs, const size_t* sizes)
             (PserverPyEntries entries) {
  if (entries.Parse($input, false, true) != 0) SWIG_fail;
  $1 = entries.names.size();
  $2 = ($2_ltype)entries.names.data();
  $3 = ($3_ltype)entries.name_lens.data();
  $4 = ($4_ltype)entries.dtypes.data();
  $5 = ($5_ltype)entries.outs.data();
  $6 = ($6_ltype)entries.sizes.data();
}
%typemap(in) (size_t n, const char* const* names, const size_t* name_lens,
              const int32_t* dtypes, const void* const* data, void* const* outs,
              const size_t* sizes) (PserverPyEntries entries) {
  if (entries.Parse($input, true, true) != 0) SWIG_fail;
  $1 = entries.names.size();
  $2 = ($2_ltype)entries.names.data();
  $3 = ($3_ltype)entries.name_lens.data();
  $4 = ($4_ltype)entries.dtypes.data();
  $5 = ($5_ltype)entries.data.data();
  $6 = ($6_ltype)entries.outs.data();
  $7 = ($7_ltype)entries.sizes.data();
}
%typemap(freearg) (size_t n, const char* const* names, const size_t* name_lens,
                   const int32_t* dtypes, const void* const* data, const size_t* sizes),
                  (size_t n, const char* const* names, const size_t* name_lens,
                   const int32_t* dtypes, void* const* outs, const size_t* sizes),
                  (size_t n, const char* const* names, const size_t* name_lens,
                   const int32_t* dtypes, const void* const* data, void* const* outs,
                   const size_t* sizes) {
  entries$argnum.Release();
}

/* ---- writable buffers (also a checkpointed table's key and value buffers) ---- */
%typemap(in) (void* out, size_t out_size) (PserverPyBuffer pybuf),
             (void* out, size_t size) (PserverPyBuffer pybuf),
             (void* data, size_t size) (PserverPyBuffer pybuf),
             (uint64_t* keys, size_t keys_size) (PserverPyBuffer pybuf),
             (void* values, size_t values_size) (PserverPyBuffer pybuf) {
  if (PyObject_GetBuffer($input, &pybuf.view, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE) != 0) SWIG_fail;
  pybuf.held = 1;
  $1 = ($1_ltype)pybuf.view.buf;
  $2 = (size_t)pybuf.view.len;
}
%typemap(freearg) (void* out, size_t out_size), (void* out, size_t size),
                  (void* data, size_t size), (uint64_t* keys, size_t keys_size),
                  (void* values, size_t values_size) {
  if (pybuf$argnum.held) PyBuffer_Release(&pybuf$argnum.view);
}

/* ---- device pointers: a Python int (e.g. __cuda_array_interface__'s data[0]) ---- */
%typemap(in) const void* device_data, void* device_out {
  $1 = PyLong_AsVoidPtr($input);
  if (PyErr_Occurred()) SWIG_fail;
}
%typemap(typecheck) const void* device_data, void* device_out {
  $1 = PyLong_Check($input);
}

/* ---- checkpointed tables: (dim, dtype, rows) out ---- */
%typemap(in, numinputs=0) (uint32_t* dim, int32_t* dtype, uint64_t* rows)
    (uint32_t d = 0, int32_t t = 0, uint64_t r = 0) {
  $1 = &d; $2 = &t; $3 = &r;
}
%typemap(argout) (uint32_t* dim, int32_t* dtype, uint64_t* rows) {
  $result = SWIG_Python_AppendOutput(
      $result, Py_BuildValue("(IiK)", (unsigned int)*$1, (int)*$2, (unsigned long long)*$3));
}

/* ---- table keys: a buffer of 8-byte items ---- */
%typemap(in) (const uint64_t* keys, size_t n) (PserverPyBuffer pybuf),
             (const uint64_t* chunk_ids, size_t n) (PserverPyBuffer pybuf) {
  if (PyObject_GetBuffer($input, &pybuf.view, PyBUF_C_CONTIGUOUS) != 0) SWIG_fail;
  pybuf.held = 1;
  if (pybuf.view.itemsize != 8 || pybuf.view.len % 8 != 0) {
    PyErr_SetString(PyExc_TypeError, "keys must be a contiguous buffer of uint64");
    SWIG_fail;
  }
  $1 = (uint64_t*)pybuf.view.buf;
  $2 = (size_t)pybuf.view.len / 8;
}
%typemap(freearg) (const uint64_t* keys, size_t n), (const uint64_t* chunk_ids, size_t n) {
  if (pybuf$argnum.held) PyBuffer_Release(&pybuf$argnum.view);
}

/* ---- shapes in: any sequence of ints, converted with numpy.i's helpers ---- */
%typemap(in, fragment="NumPy_Fragments") (const int64_t* shape, size_t ndim)
    (PyArrayObject* array = NULL, int is_new = 0) {
  array = obj_to_array_contiguous_allow_conversion($input, NPY_INT64, &is_new);
  if (array == NULL || !require_dimensions(array, 1)) SWIG_fail;
  $1 = ($1_ltype)array_data(array);
  $2 = (size_t)array_size(array, 0);
}
%typemap(freearg) (const int64_t* shape, size_t ndim) {
  if (is_new$argnum && array$argnum) { Py_DECREF(array$argnum); }
}

/* ---- (dtype, shape) out ---- */
%typemap(in, numinputs=0) (int32_t* dtype, int64_t* shape, size_t shape_capacity, size_t* ndim)
    (int32_t dt = 0, int64_t dims[64], size_t nd = 0) {
  $1 = &dt; $2 = dims; $3 = 64; $4 = &nd;
}
%typemap(argout) (int32_t* dtype, int64_t* shape, size_t shape_capacity, size_t* ndim) {
  size_t n = *$4 < 64 ? *$4 : 64;
  PyObject* shape_tuple = PyTuple_New((Py_ssize_t)n);
  for (size_t i = 0; i < n; ++i) {
    PyTuple_SET_ITEM(shape_tuple, (Py_ssize_t)i, PyLong_FromLongLong((long long)$2[i]));
  }
  $result = SWIG_Python_AppendOutput($result, Py_BuildValue("(iN)", (int)*$1, shape_tuple));
}

/* ---- stats out: a list of dicts ---- */
%typemap(in, numinputs=0) (pserver_server_stats_t* out, size_t capacity, size_t struct_size)
    (std::vector<pserver_server_stats_t> stats) {
  stats.resize(4096);
  $1 = stats.data(); $2 = stats.size(); $3 = sizeof(pserver_server_stats_t);
}
%typemap(argout) (pserver_server_stats_t* out, size_t capacity, size_t struct_size) {
  size_t n = result < $2 ? result : $2;
  PyObject* list = PyList_New((Py_ssize_t)n);
  for (size_t i = 0; i < n; ++i) {
    const pserver_server_stats_t* s = &$1[i];
    PyList_SET_ITEM(list, (Py_ssize_t)i, Py_BuildValue(
        "{s:I,s:O,s:K,s:K,s:K,s:K,s:K,s:K,s:d,s:K}",
        "index", (unsigned int)s->index, "initialized", s->initialized ? Py_True : Py_False,
        "parameters", (unsigned long long)s->parameters,
        "parameter_bytes", (unsigned long long)s->parameter_bytes,
        "optimizer_state_bytes", (unsigned long long)s->optimizer_state_bytes,
        "gradients_applied", (unsigned long long)s->gradients_applied,
        "gets_served", (unsigned long long)s->gets_served,
        "requests_rejected", (unsigned long long)s->requests_rejected,
        "uptime_seconds", s->uptime_seconds,
        "bulk_aead_connections", (unsigned long long)s->bulk_aead_connections));
  }
  $result = SWIG_Python_AppendOutput($result, list);
}

/* ---- health out: a list of PSERVER_HEALTH_* ints ---- */
%typemap(in, numinputs=0) (int32_t* health_out, size_t capacity)
    (std::vector<int32_t> health) {
  health.resize(4096);
  $1 = health.data(); $2 = health.size();
}
%typemap(argout) (int32_t* health_out, size_t capacity) {
  size_t n = result < $2 ? result : $2;
  PyObject* list = PyList_New((Py_ssize_t)n);
  for (size_t i = 0; i < n; ++i) {
    PyList_SET_ITEM(list, (Py_ssize_t)i, PyLong_FromLong((long)$1[i]));
  }
  $result = SWIG_Python_AppendOutput($result, list);
}

/* ---- table stats out: a list of dicts ---- */
%typemap(in, numinputs=0) (pserver_table_stats_t* out, size_t capacity, size_t struct_size)
    (std::vector<pserver_table_stats_t> stats) {
  stats.resize(4096);
  $1 = stats.data(); $2 = stats.size(); $3 = sizeof(pserver_table_stats_t);
}
%typemap(argout) (pserver_table_stats_t* out, size_t capacity, size_t struct_size) {
  size_t n = result < $2 ? result : $2;
  PyObject* list = PyList_New((Py_ssize_t)n);
  for (size_t i = 0; i < n; ++i) {
    const pserver_table_stats_t* s = &$1[i];
    PyList_SET_ITEM(list, (Py_ssize_t)i, Py_BuildValue(
        "{s:I,s:K,s:K,s:K,s:K,s:K,s:K,s:L,s:I}",
        "server", (unsigned int)s->server, "rows", (unsigned long long)s->rows,
        "bytes", (unsigned long long)s->bytes, "evictions", (unsigned long long)s->evictions,
        "pending_keys", (unsigned long long)s->pending_keys,
        "keys_pulled", (unsigned long long)s->keys_pulled,
        "keys_pushed", (unsigned long long)s->keys_pushed,
        "min_clock", (long long)s->min_clock, "workers", (unsigned int)s->workers));
  }
  $result = SWIG_Python_AppendOutput($result, list);
}

/* ---- config text out ---- */
/* Empty until the call writes it: a call that fails writes nothing (its
 * status raises right after), and the text is never read uninitialized. */
%typemap(in, numinputs=0) (char* out, size_t out_size) (char text[8192]) {
  text[0] = '\0';
  $1 = text; $2 = sizeof(text);
}
%typemap(argout) (char* out, size_t out_size) {
  PyObject* text_out = PyUnicode_DecodeUTF8($1, (Py_ssize_t)strlen($1), "surrogateescape");
  if (text_out == NULL) SWIG_fail;
  $result = SWIG_Python_AppendOutput($result, text_out);
}

/* ---- etcd: values as bytes, prefix reads as [(key, value), ...] ---- */
%typemap(in, numinputs=0) (char** value, size_t* value_size) (char* buf = NULL, size_t len = 0) {
  $1 = &buf; $2 = &len;
}
%typemap(argout) (char** value, size_t* value_size) {
  PyObject* bytes = *$1 != NULL ? PyBytes_FromStringAndSize(*$1, (Py_ssize_t)*$2) : Py_None;
  if (bytes == Py_None) Py_INCREF(Py_None);
  $result = SWIG_Python_AppendOutput($result, bytes);
}
%typemap(freearg) (char** value, size_t* value_size) {
  pserver_buffer_delete(buf$argnum);
}
%typemap(out) pserver_etcd_kvs_t* pserver_etcd_get_prefix {
  const size_t n = pserver_etcd_kvs_size($1);
  $result = PyList_New((Py_ssize_t)n);
  for (size_t i = 0; $result != NULL && i < n; ++i) {
    const char* key = pserver_etcd_kvs_key($1, i);
    PyObject* pair = PyTuple_New(2);
    PyTuple_SET_ITEM(pair, 0,
                     PyUnicode_DecodeUTF8(key, (Py_ssize_t)strlen(key), "surrogateescape"));
    PyTuple_SET_ITEM(pair, 1,
                     PyBytes_FromStringAndSize(pserver_etcd_kvs_value($1, i),
                                               (Py_ssize_t)pserver_etcd_kvs_value_size($1, i)));
    PyList_SET_ITEM($result, (Py_ssize_t)i, pair);
  }
  pserver_etcd_kvs_delete($1);
}

/* Quick calls keep the GIL: releasing it costs more than they take, and
 * pserver._calls makes them around every blocking call. */
%nothread pserver_py_swap_call_deadline_ns;
%nothread pserver_py_call_deadline_ns;
%nothread pserver_py_swap_call_cancel;
%nothread pserver_cancel_new;
%nothread pserver_cancel_delete;
%nothread pserver_cancel_cancel;
%nothread pserver_cancel_cancelled;
%nothread pserver_py_cancel_new_interruptible;
%nothread pserver_py_take_interrupt;
%nothread pserver_py_checks;

/* For pserver._calls: sets the calling thread's call deadline (see the
 * conventions above) and returns the previous one. */
%inline %{
int64_t pserver_py_swap_call_deadline_ns(int64_t deadline_ns) {
  const int64_t previous = pserver_py_deadline_ns;
  pserver_py_deadline_ns = deadline_ns > 0 ? deadline_ns : 0;
  return previous;
}

/* The calling thread's call deadline (0: none). */
int64_t pserver_py_call_deadline_ns(void) { return pserver_py_deadline_ns; }
%}

%{
/* A cancellation for the main thread's blocking calls: while one waits,
 * Python's signal handlers run on the main thread every `every_ms`
 * (PyErr_CheckSignals, the GIL taken for it); the first one that raises
 * (KeyboardInterrupt at Ctrl-C) cancels the call, and what it raised is
 * kept for pserver_py_take_interrupt. Other threads run no handlers. */
static PyObject* pserver_py_interrupt = NULL; /* the exception raised, owned */
static uint64_t pserver_py_check_count = 0;   /* checks run (tests wait on it) */

static int pserver_py_check_signals(void* arg) {
  (void)arg;
  const PyGILState_STATE gil = PyGILState_Ensure();
  ++pserver_py_check_count;
  const int raised = PyErr_CheckSignals() != 0;
  if (raised) {
    PyObject *type, *value, *traceback;
    PyErr_Fetch(&type, &value, &traceback);
    PyErr_NormalizeException(&type, &value, &traceback);
    if (traceback != NULL && value != NULL) PyException_SetTraceback(value, traceback);
    Py_XDECREF(pserver_py_interrupt);
    pserver_py_interrupt = value;
    Py_XDECREF(type);
    Py_XDECREF(traceback);
  }
  PyGILState_Release(gil);
  return raised;
}
%}

%inline %{
pserver_cancel_t* pserver_py_cancel_new_interruptible(int32_t every_ms) {
  pserver_cancel_t* const cancel = pserver_cancel_new();
  pserver_cancel_set_check(cancel, pserver_py_check_signals, NULL, every_ms);
  return cancel;
}

/* What a signal handler raised during a call (and forgets it), or None. */
PyObject* pserver_py_take_interrupt(void) {
  PyObject* const raised = pserver_py_interrupt != NULL ? pserver_py_interrupt : Py_None;
  if (pserver_py_interrupt == NULL) Py_INCREF(Py_None);
  pserver_py_interrupt = NULL;
  return raised;
}

/* How many times the check has run: a test waits for a call to be waiting. */
uint64_t pserver_py_checks(void) { return pserver_py_check_count; }

/* Sets the calling thread's call cancellation (NULL: none); returns the
 * previous one. The caller keeps the handle alive while it is set. */
pserver_cancel_t* pserver_py_swap_call_cancel(pserver_cancel_t* cancel) {
  pserver_cancel_t* const previous = pserver_py_cancel;
  pserver_py_cancel = cancel;
  return previous;
}
%}

/* Python never sees a status handle; the check is set by
 * pserver_py_cancel_new_interruptible. */
%ignore pserver_cancel_set_check;
%ignore pserver_status_new;
%ignore pserver_status_delete;
%ignore pserver_status_code;
%ignore pserver_status_message;
%ignore pserver_status_set;
%ignore pserver_status_set_timeout_ms;
%ignore pserver_status_timeout_ms;
%ignore pserver_status_set_cancel;
%ignore pserver_buffer_delete;
%ignore pserver_etcd_kvs_delete;
%ignore pserver_etcd_kvs_size;
%ignore pserver_etcd_kvs_key;
%ignore pserver_etcd_kvs_value;
%ignore pserver_etcd_kvs_value_size;

/* SWIG does not follow #include: the headers pserver.h includes at its end,
 * in its order. */
%include "cc/capi/pserver.h"
%include "cc/capi/pserver_tables.h"
%include "cc/capi/pserver_cluster.h"
