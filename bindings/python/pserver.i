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
 */
%module(package="pserver", threads="1") capi

%{
#define SWIG_FILE_WITH_INIT
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

/* A buffer view released after the call. */
struct PserverPyBuffer {
  Py_buffer view;
  int held = 0;
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

/* ---- writable buffers ---- */
%typemap(in) (void* out, size_t out_size) (PserverPyBuffer pybuf),
             (void* out, size_t size) (PserverPyBuffer pybuf) {
  if (PyObject_GetBuffer($input, &pybuf.view, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE) != 0) SWIG_fail;
  pybuf.held = 1;
  $1 = pybuf.view.buf;
  $2 = (size_t)pybuf.view.len;
}
%typemap(freearg) (void* out, size_t out_size), (void* out, size_t size) {
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
        "{s:I,s:O,s:K,s:K,s:K,s:K,s:K,s:K,s:d}",
        "index", (unsigned int)s->index, "initialized", s->initialized ? Py_True : Py_False,
        "parameters", (unsigned long long)s->parameters,
        "parameter_bytes", (unsigned long long)s->parameter_bytes,
        "optimizer_state_bytes", (unsigned long long)s->optimizer_state_bytes,
        "gradients_applied", (unsigned long long)s->gradients_applied,
        "gets_served", (unsigned long long)s->gets_served,
        "requests_rejected", (unsigned long long)s->requests_rejected,
        "uptime_seconds", s->uptime_seconds));
  }
  $result = SWIG_Python_AppendOutput($result, list);
}

/* ---- config text out ---- */
%typemap(in, numinputs=0) (char* out, size_t out_size) (char text[8192]) {
  $1 = text; $2 = sizeof(text);
}
%typemap(argout) (char* out, size_t out_size) {
  $result = SWIG_Python_AppendOutput($result, PyUnicode_FromString($1));
}

/* Python never sees a status handle. */
%ignore pserver_status_new;
%ignore pserver_status_delete;
%ignore pserver_status_code;
%ignore pserver_status_message;
%ignore pserver_status_set;

%include "cc/capi/pserver.h"
