/* SPDX-License-Identifier: Apache-2.0 */
/* dlsync._native: the compiled backend of the Python binding (python/dlsync/_backend.py).
 *
 * A CPython extension on the stable ABI (Py_LIMITED_API 3.9): one abi3 module
 * for every CPython >= 3.9. It provides the calls made at every exchange, so
 * that `with dlsync.exchange(p, c):` costs little more than the C exchange:
 * stream-handle extraction, an exchange object whose __enter__ / __exit__ call
 * dlsync_exchange_begin_flags / dlsync_exchange_end, and the begin, end,
 * capture-query, DLPack-value and exchange-API calls of dlsync.wrap.
 *
 * It does not link libdlsync. dlsync/_loader.py has loaded exactly one
 * libdlsync with ctypes (DLSYNC_LIBRARY, the bundled file, a build folder,
 * the loader's path) and dlsync/_backend.py hands this module the addresses
 * of the functions it calls (_init), so that both backends use one library,
 * one default context and one per-thread last error. Until _init has run
 * every call raises RuntimeError; when this module is missing or refuses to
 * initialise, dlsync uses its ctypes backend (dlsync/_ctypes_impl.py).
 *
 * Behaviour is that of the ctypes backend, messages included (misuse too:
 * the words are dlsync/_errors.py's): python/tests/test_native.py compares
 * the two call for call, python/tests/test_backends.py runs one list of
 * misuses on both.
 */
#ifndef Py_LIMITED_API
#define Py_LIMITED_API 0x03090000
#endif
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "dlsync/arrow.h"
#include "dlsync/conditional.h"
#include "dlsync/dlpack.h"
#include "dlsync/env.h"
#include "dlsync/exchange.h"
#include "dlsync/fence.h"
#include "dlsync/foreign.h"
#include "dlsync/graph.h"
#include "dlsync/lane.h"
#include "dlsync/status.h"

/* The contract between _init and dlsync/_backend.py (NATIVE_ABI), which checks it. */
#define DLSYNC_PY_ABI 7

/* ---- the library's functions, by address ---- */

typedef dlsync_status dlsync_py_begin_fn(dlsync_exchange **out, dlsync_context *ctx,
                                         dlsync_lane *producer, dlsync_lane *consumer,
                                         uint32_t flags);
typedef dlsync_status dlsync_py_begin_many_fn(dlsync_exchange **out, dlsync_context *ctx,
                                              dlsync_lane *producers, size_t n,
                                              dlsync_lane *consumer, uint32_t flags);
typedef dlsync_status dlsync_py_end_fn(dlsync_exchange *exchange);
typedef dlsync_status dlsync_py_context_default_fn(dlsync_context **out);
typedef const char *dlsync_py_status_name_fn(dlsync_status status);
typedef const char *dlsync_py_last_error_fn(void);
typedef dlsync_status dlsync_py_lane_query_fn(dlsync_lane_state *out, dlsync_context *ctx,
                                              const dlsync_lane *lane);
typedef dlsync_status dlsync_py_dlpack_stream_fn(dlsync_lane *out, bool *ordered,
                                                 dlsync_context *ctx, int64_t stream_value,
                                                 const dlsync_lane *producer);
typedef dlsync_status dlsync_py_env_api_fn(void **out, const struct DLPackExchangeAPI *api,
                                           int32_t device_type, int32_t device_id);
typedef dlsync_status dlsync_py_graph_launch_fn(dlsync_context *ctx, struct CUgraph_st *graph,
                                                struct CUgraphExec_st *exec, dlsync_lane *lane);
typedef dlsync_status dlsync_py_body_fn(dlsync_context *ctx, struct CUgraph_st *body);
typedef int dlsync_py_body_declared_fn(dlsync_context *ctx, struct CUgraph_st *body);
/* Other runtimes' events (foreign.h), and the fence calls they need. */
typedef dlsync_status dlsync_py_fence_import_fn(dlsync_fence **out, dlsync_context *ctx,
                                                struct CUevent_st *event,
                                                dlsync_provenance provenance, uint64_t capture_id,
                                                unsigned int flags);
typedef dlsync_status dlsync_py_fence_export_event_fn(struct CUevent_st **out,
                                                      const dlsync_fence *fence);
typedef dlsync_status dlsync_py_fence_get_provenance_fn(dlsync_provenance *out,
                                                        const dlsync_fence *fence);
typedef dlsync_status dlsync_py_fence_get_kind_fn(dlsync_fence_kind *out,
                                                  const dlsync_fence *fence);
typedef void dlsync_py_fence_release_fn(dlsync_fence *fence);
/* graph compilers: fan-out and conditional nodes */
typedef dlsync_status dlsync_py_begin_fanout_fn(dlsync_exchange **out, dlsync_context *ctx,
                                                dlsync_lane *producer, dlsync_lane *consumers,
                                                size_t n, uint32_t flags);
typedef dlsync_status dlsync_py_order_fn(dlsync_context *ctx, dlsync_lane *first,
                                         dlsync_lane *then);
typedef dlsync_status dlsync_py_node_declare_fn(dlsync_context *ctx, struct CUgraph_st *parent,
                                                struct CUgraphNode_st *node,
                                                struct CUgraph_st *const *bodies, size_t nbodies);
/* The Arrow C Device data interface (include/dlsync/arrow.h). */
typedef dlsync_status dlsync_py_arrow_sync_event_fn(struct ArrowDeviceArray *array,
                                                    dlsync_arrow_sync *sync, dlsync_context *ctx,
                                                    dlsync_lane *lane);
typedef void dlsync_py_arrow_sync_release_fn(dlsync_arrow_sync *sync);
typedef dlsync_status dlsync_py_arrow_wait_fn(dlsync_context *ctx, dlsync_lane *lane,
                                              const struct ArrowDeviceArray *array,
                                              dlsync_provenance provenance, uint64_t capture_id);
typedef dlsync_status dlsync_py_arrow_release_fn(dlsync_context *ctx, dlsync_lane *lane,
                                                 struct ArrowDeviceArray *array);
/* PyObject_GetOptionalAttr (3.13) / _PyObject_LookupAttr (3.7 to 3.12): a
 * getattr that does not build an AttributeError for a missing attribute. */
typedef int dlsync_py_getattr_fn(PyObject *obj, PyObject *name, PyObject **result);

/* The typedefs are those of the headers (checked without referring to the
 * symbols, which this module never links). */
#define DLSYNC_PY_SAME_TYPE(fn, type) \
  _Static_assert(_Generic(&fn, type * : 1, default : 0), #fn ": not the type the binding calls")
DLSYNC_PY_SAME_TYPE(dlsync_exchange_begin_flags, dlsync_py_begin_fn);
DLSYNC_PY_SAME_TYPE(dlsync_exchange_begin_many, dlsync_py_begin_many_fn);
DLSYNC_PY_SAME_TYPE(dlsync_exchange_end, dlsync_py_end_fn);
DLSYNC_PY_SAME_TYPE(dlsync_context_default, dlsync_py_context_default_fn);
DLSYNC_PY_SAME_TYPE(dlsync_status_name, dlsync_py_status_name_fn);
DLSYNC_PY_SAME_TYPE(dlsync_last_error, dlsync_py_last_error_fn);
DLSYNC_PY_SAME_TYPE(dlsync_lane_query, dlsync_py_lane_query_fn);
DLSYNC_PY_SAME_TYPE(dlsync_dlpack_stream, dlsync_py_dlpack_stream_fn);
DLSYNC_PY_SAME_TYPE(dlsync_env_stream_from_exchange_api, dlsync_py_env_api_fn);
DLSYNC_PY_SAME_TYPE(dlsync_graph_launch, dlsync_py_graph_launch_fn);
DLSYNC_PY_SAME_TYPE(dlsync_conditional_body_add, dlsync_py_body_fn);
DLSYNC_PY_SAME_TYPE(dlsync_conditional_body_remove, dlsync_py_body_fn);
DLSYNC_PY_SAME_TYPE(dlsync_conditional_body_is_declared, dlsync_py_body_declared_fn);
DLSYNC_PY_SAME_TYPE(dlsync_fence_import, dlsync_py_fence_import_fn);
DLSYNC_PY_SAME_TYPE(dlsync_fence_export_event, dlsync_py_fence_export_event_fn);
DLSYNC_PY_SAME_TYPE(dlsync_fence_get_provenance, dlsync_py_fence_get_provenance_fn);
DLSYNC_PY_SAME_TYPE(dlsync_fence_get_kind, dlsync_py_fence_get_kind_fn);
DLSYNC_PY_SAME_TYPE(dlsync_fence_release, dlsync_py_fence_release_fn);
DLSYNC_PY_SAME_TYPE(dlsync_exchange_begin_fanout, dlsync_py_begin_fanout_fn);
DLSYNC_PY_SAME_TYPE(dlsync_conditional_node_declare, dlsync_py_node_declare_fn);
DLSYNC_PY_SAME_TYPE(dlsync_order, dlsync_py_order_fn);
DLSYNC_PY_SAME_TYPE(dlsync_arrow_sync_event, dlsync_py_arrow_sync_event_fn);
DLSYNC_PY_SAME_TYPE(dlsync_arrow_sync_release, dlsync_py_arrow_sync_release_fn);
DLSYNC_PY_SAME_TYPE(dlsync_arrow_wait, dlsync_py_arrow_wait_fn);
DLSYNC_PY_SAME_TYPE(dlsync_arrow_release, dlsync_py_arrow_release_fn);

typedef struct dlsync_py_api {
  dlsync_py_begin_fn *exchange_begin_flags;
  dlsync_py_begin_many_fn *exchange_begin_many;
  dlsync_py_end_fn *exchange_end;
  dlsync_py_context_default_fn *context_default;
  dlsync_py_status_name_fn *status_name;
  dlsync_py_last_error_fn *last_error;
  dlsync_py_lane_query_fn *lane_query;
  dlsync_py_dlpack_stream_fn *dlpack_stream;
  dlsync_py_env_api_fn *env_stream_from_exchange_api;
  dlsync_py_graph_launch_fn *graph_launch;
  dlsync_py_body_fn *body_add;
  dlsync_py_body_fn *body_remove;
  dlsync_py_body_declared_fn *body_declared;
  dlsync_py_fence_import_fn *fence_import;
  dlsync_py_fence_export_event_fn *fence_export_event;
  dlsync_py_fence_get_provenance_fn *fence_get_provenance;
  dlsync_py_fence_get_kind_fn *fence_get_kind;
  dlsync_py_fence_release_fn *fence_release;
  /* graph compilers: fan-out and conditional nodes */
  dlsync_py_begin_fanout_fn *begin_fanout;
  dlsync_py_node_declare_fn *node_declare;
  dlsync_py_order_fn *order;
  /* the Arrow C Device data interface */
  dlsync_py_arrow_sync_event_fn *arrow_sync_event;
  dlsync_py_arrow_sync_release_fn *arrow_sync_release;
  dlsync_py_arrow_wait_fn *arrow_wait;
  dlsync_py_arrow_release_fn *arrow_release;
} dlsync_py_api;

/* An address arrives as an integer (void *) and is stored as a function
 * pointer by copying its bytes: ISO C has no conversion between the two. */
_Static_assert(sizeof(void *) == sizeof(dlsync_py_end_fn *), "function and data pointers differ");

/* The symbols _init needs, by name (exported to Python as SYMBOLS). */
static const struct dlsync_py_symbol {
  const char *name;
  size_t offset;
} dlsync_py_symbols[] = {
    {"dlsync_exchange_begin_flags", offsetof(dlsync_py_api, exchange_begin_flags)},
    {"dlsync_exchange_begin_many", offsetof(dlsync_py_api, exchange_begin_many)},
    {"dlsync_exchange_end", offsetof(dlsync_py_api, exchange_end)},
    {"dlsync_context_default", offsetof(dlsync_py_api, context_default)},
    {"dlsync_status_name", offsetof(dlsync_py_api, status_name)},
    {"dlsync_last_error", offsetof(dlsync_py_api, last_error)},
    {"dlsync_lane_query", offsetof(dlsync_py_api, lane_query)},
    {"dlsync_dlpack_stream", offsetof(dlsync_py_api, dlpack_stream)},
    {"dlsync_env_stream_from_exchange_api", offsetof(dlsync_py_api, env_stream_from_exchange_api)},
    {"dlsync_graph_launch", offsetof(dlsync_py_api, graph_launch)},
    {"dlsync_conditional_body_add", offsetof(dlsync_py_api, body_add)},
    {"dlsync_conditional_body_remove", offsetof(dlsync_py_api, body_remove)},
    {"dlsync_conditional_body_is_declared", offsetof(dlsync_py_api, body_declared)},
    {"dlsync_fence_import", offsetof(dlsync_py_api, fence_import)},
    {"dlsync_fence_export_event", offsetof(dlsync_py_api, fence_export_event)},
    {"dlsync_fence_get_provenance", offsetof(dlsync_py_api, fence_get_provenance)},
    {"dlsync_fence_get_kind", offsetof(dlsync_py_api, fence_get_kind)},
    {"dlsync_fence_release", offsetof(dlsync_py_api, fence_release)},
    /* graph compilers: fan-out and conditional nodes */
    {"dlsync_exchange_begin_fanout", offsetof(dlsync_py_api, begin_fanout)},
    {"dlsync_conditional_node_declare", offsetof(dlsync_py_api, node_declare)},
    {"dlsync_order", offsetof(dlsync_py_api, order)},
    {"dlsync_arrow_sync_event", offsetof(dlsync_py_api, arrow_sync_event)},
    {"dlsync_arrow_sync_release", offsetof(dlsync_py_api, arrow_sync_release)},
    {"dlsync_arrow_wait", offsetof(dlsync_py_api, arrow_wait)},
    {"dlsync_arrow_release", offsetof(dlsync_py_api, arrow_release)},
};
#define DLSYNC_PY_NSYMBOLS (sizeof dlsync_py_symbols / sizeof dlsync_py_symbols[0])

/* Module state. The module is single-phase (one per process): the library is
 * one per process too. Everything is written with the GIL held. */
static dlsync_py_api dlsync_py_lib;
static bool dlsync_py_ready;
static dlsync_context *dlsync_py_ctx;    /* the default context, once it was created */
static PyObject *dlsync_py_error;        /* dlsync.Error */
static PyObject *dlsync_py_python_begin; /* dlsync's Python exchange for lists and tensors */
static dlsync_py_getattr_fn *dlsync_py_optional_getattr; /* NULL: PyObject_GetAttr */
static PyObject *dlsync_py_exchange_type;

/* Interned names and constants. */
static PyObject *dlsync_py_s_cuda_stream_protocol; /* "__cuda_stream__" */
static PyObject *dlsync_py_s_dlpack;               /* "__dlpack__" */
static PyObject *dlsync_py_s_attrs[3];             /* "cuda_stream", "ptr", "handle" */
static const char *const dlsync_py_attr_names[3] = {"cuda_stream", "ptr", "handle"};
static PyObject *dlsync_py_s_end;
static PyObject *dlsync_py_s_empty;
static PyObject *dlsync_py_s_capturing;
static PyObject *dlsync_py_s_eager;
static PyObject *dlsync_py_s_abandoned;
static PyObject *dlsync_py_s_value; /* "value" (ctypes.c_void_p's) */
static PyObject *dlsync_py_legacy;  /* the int 1 */

#define DLSYNC_PY_POINTER_BITS ((int)(sizeof(void *) * 8))

static int dlsync_py_check_ready(void) {
  if (dlsync_py_ready)
    return 0;
  PyErr_SetString(PyExc_RuntimeError,
                  "dlsync._native is not initialised (import dlsync initialises it)");
  return -1;
}

/* getattr(obj, name) that tells a missing attribute (0, *result NULL) from an
 * error (-1) and a value (1), as getattr(obj, name, None) does in Python. */
static int dlsync_py_getattr(PyObject *obj, PyObject *name, PyObject **result) {
  if (dlsync_py_optional_getattr != NULL)
    return dlsync_py_optional_getattr(obj, name, result);
  *result = PyObject_GetAttr(obj, name);
  if (*result != NULL)
    return 1;
  if (!PyErr_ExceptionMatches(PyExc_AttributeError))
    return -1;
  PyErr_Clear();
  return 0;
}

/* type(obj).__name__ (a new reference, NULL with an exception). */
static PyObject *dlsync_py_type_name(PyObject *obj) {
  return PyObject_GetAttrString((PyObject *)Py_TYPE(obj), "__name__");
}

/* ---- errors: dlsync.Error(status name, the library's message) ---- */

/* Raises dlsync.Error for a failed call, as _ctypes_impl.py's _check does:
 * dlsync_status_name and dlsync_last_error (decoded with errors="replace"),
 * the message after `prefix` when one is given. Returns NULL. */
static PyObject *dlsync_py_fail_prefixed(dlsync_status status, PyObject *prefix) {
  const char *message = dlsync_py_lib.last_error();
  PyObject *name = PyUnicode_FromString(dlsync_py_lib.status_name(status));
  PyObject *text = PyUnicode_DecodeUTF8(message, (Py_ssize_t)strlen(message), "replace");
  if (text != NULL && prefix != NULL) {
    PyObject *joined = PyUnicode_Concat(prefix, text);
    Py_DECREF(text);
    text = joined;
  }
  if (name != NULL && text != NULL) {
    PyObject *error = PyObject_CallFunctionObjArgs(dlsync_py_error, name, text, NULL);
    if (error != NULL) {
      PyErr_SetObject(dlsync_py_error, error);
      Py_DECREF(error);
    }
  }
  Py_XDECREF(name);
  Py_XDECREF(text);
  return NULL;
}

static PyObject *dlsync_py_fail(dlsync_status status) {
  return dlsync_py_fail_prefixed(status, NULL);
}

/* The default context, created on first use (with the GIL released: it calls
 * cuInit); NULL with dlsync.Error set when it cannot be. */
static dlsync_context *dlsync_py_context(void) {
  dlsync_context *ctx = dlsync_py_ctx;
  dlsync_status status;
  if (ctx != NULL)
    return ctx;
  {
    PyThreadState *released = PyEval_SaveThread();
    status = dlsync_py_lib.context_default(&ctx);
    PyEval_RestoreThread(released);
  }
  if (status != DLSYNC_SUCCESS) {
    dlsync_py_fail(status);
    return NULL;
  }
  dlsync_py_ctx = ctx;
  return ctx;
}

/* ---- stream handles: stream_handle() and checked_handle() of _ctypes_impl.py ---- */

/* Where a value came from, for messages: "the stream" (owner NULL) or
 * "<type(owner).__name__><suffix>". Built only when a message needs it. */
typedef struct dlsync_py_origin {
  PyObject *owner;
  const char *suffix;
} dlsync_py_origin;

static PyObject *dlsync_py_what(const dlsync_py_origin *origin) {
  PyObject *name, *what;
  if (origin->owner == NULL)
    return PyUnicode_FromString("the stream");
  name = dlsync_py_type_name(origin->owner);
  if (name == NULL)
    return NULL;
  what = PyUnicode_FromFormat("%U%s", name, origin->suffix);
  Py_DECREF(name);
  return what;
}

static void dlsync_py_not_an_int(PyObject *value, const dlsync_py_origin *origin) {
  PyObject *what = dlsync_py_what(origin);
  PyObject *type_name = what != NULL ? dlsync_py_type_name(value) : NULL;
  PyObject *repr = type_name != NULL ? PyObject_Repr(value) : NULL;
  if (repr != NULL)
    PyErr_Format(PyExc_TypeError,
                 "%U must be an int stream handle (CUstream / cudaStream_t), not %U %U", what,
                 type_name, repr);
  Py_XDECREF(what);
  Py_XDECREF(type_name);
  Py_XDECREF(repr);
}

static void dlsync_py_out_of_range(PyObject *value, const dlsync_py_origin *origin) {
  PyObject *what = dlsync_py_what(origin);
  PyObject *text = what != NULL ? PyObject_Format(value, dlsync_py_s_empty) : NULL;
  if (text != NULL)
    PyErr_Format(PyExc_ValueError,
                 "%U is %U: a stream handle is an unsigned pointer, 0 <= handle < 2**%d (0 and 1: "
                 "the legacy default stream, 2: the per-thread default stream)",
                 what, text, DLSYNC_PY_POINTER_BITS);
  Py_XDECREF(what);
  Py_XDECREF(text);
}

/* __cuda_stream__() gave a tuple that is not (version, handle). */
static void dlsync_py_not_a_pair(PyObject *value, const dlsync_py_origin *origin) {
  PyObject *what = dlsync_py_what(origin);
  PyObject *repr = what != NULL ? PyObject_Repr(value) : NULL;
  if (repr != NULL)
    PyErr_Format(PyExc_TypeError, "%U must return (version, handle), not a %zd-tuple %U", what,
                 PyTuple_Size(value), repr);
  Py_XDECREF(what);
  Py_XDECREF(repr);
}

/* A stream handle as the library takes it: an int (not a bool: ctypes would
 * have truncated floats and bools) with 0 <= value < 2**64. Returns a new
 * reference to value and its value in *out; TypeError or ValueError naming
 * the value otherwise. */
static PyObject *dlsync_py_checked(PyObject *value, const dlsync_py_origin *origin,
                                   uintptr_t *out) {
  unsigned long long v;
  if (PyBool_Check(value) || !PyLong_Check(value)) {
    dlsync_py_not_an_int(value, origin);
    return NULL;
  }
  v = PyLong_AsUnsignedLongLong(value);
  if (v == (unsigned long long)-1 && PyErr_Occurred()) {
    if (!PyErr_ExceptionMatches(PyExc_OverflowError))
      return NULL;
    PyErr_Clear();
    dlsync_py_out_of_range(value, origin);
    return NULL;
  }
  if (v > (unsigned long long)UINTPTR_MAX) {
    dlsync_py_out_of_range(value, origin);
    return NULL;
  }
  *out = (uintptr_t)v;
  Py_INCREF(value);
  return value;
}

/* stream_handle(stream): None (the legacy stream), an int, __cuda_stream__
 * (a method or a value; a (version, handle) pair), then the cuda_stream
 * (torch), ptr (CuPy) and handle attributes, in that order. */
static PyObject *dlsync_py_handle(PyObject *stream, uintptr_t *out) {
  dlsync_py_origin origin = {NULL, NULL};
  PyObject *value;
  int found;
  size_t i;
  if (stream == Py_None) {
    *out = 1;
    Py_INCREF(dlsync_py_legacy);
    return dlsync_py_legacy;
  }
  if (PyLong_Check(stream))
    return dlsync_py_checked(stream, &origin, out);
  found = dlsync_py_getattr(stream, dlsync_py_s_cuda_stream_protocol, &value);
  if (found < 0)
    return NULL;
  if (found > 0 && value != Py_None) {
    PyObject *handle;
    if (PyCallable_Check(value)) {
      PyObject *called = PyObject_CallObject(value, NULL);
      Py_DECREF(value);
      if (called == NULL)
        return NULL;
      value = called;
    }
    origin.owner = stream;
    origin.suffix = ".__cuda_stream__()";
    if (PyTuple_Check(value)) {
      PyObject *item;
      if (PyTuple_Size(value) != 2) {
        dlsync_py_not_a_pair(value, &origin);
        Py_DECREF(value);
        return NULL;
      }
      item = PyTuple_GetItem(value, 1);
      Py_XINCREF(item);
      Py_DECREF(value);
      if (item == NULL)
        return NULL;
      value = item;
    }
    handle = dlsync_py_checked(value, &origin, out);
    Py_DECREF(value);
    return handle;
  }
  Py_XDECREF(value);
  for (i = 0; i < sizeof dlsync_py_s_attrs / sizeof dlsync_py_s_attrs[0]; i++) {
    found = dlsync_py_getattr(stream, dlsync_py_s_attrs[i], &value);
    if (found < 0)
      return NULL;
    if (found > 0 && value != Py_None) {
      PyObject *handle;
      char suffix[16];
      suffix[0] = '.';
      strcpy(suffix + 1, dlsync_py_attr_names[i]);
      origin.owner = stream;
      origin.suffix = suffix;
      handle = dlsync_py_checked(value, &origin, out);
      Py_DECREF(value);
      return handle;
    }
    Py_XDECREF(value);
  }
  value = dlsync_py_type_name(stream);
  if (value != NULL) {
    PyErr_Format(PyExc_TypeError, "cannot find a CUDA stream handle in %U", value);
    Py_DECREF(value);
  }
  return NULL;
}

/* The handle only (no reference kept); -1 with an exception set. */
static int dlsync_py_handle_value(PyObject *stream, uintptr_t *out) {
  PyObject *handle = dlsync_py_handle(stream, out);
  if (handle == NULL)
    return -1;
  Py_DECREF(handle);
  return 0;
}

static dlsync_lane dlsync_py_lane(uintptr_t handle) {
  return dlsync_lane_stream((struct CUstream_st *)handle);
}

/* Begins an exchange between two stream handles; NULL with dlsync.Error set. */
static int dlsync_py_begin_handles(dlsync_exchange **out, uintptr_t producer, uintptr_t consumer,
                                   uint32_t flags) {
  dlsync_lane p = dlsync_py_lane(producer), c = dlsync_py_lane(consumer);
  dlsync_context *ctx = dlsync_py_context();
  PyThreadState *released;
  dlsync_status status;
  if (ctx == NULL)
    return -1;
  released = PyEval_SaveThread();
  status = dlsync_py_lib.exchange_begin_flags(out, ctx, &p, &c, flags);
  PyEval_RestoreThread(released);
  if (status != DLSYNC_SUCCESS) {
    dlsync_py_fail(status);
    return -1;
  }
  return 0;
}

static int dlsync_py_end_handle(dlsync_exchange *exchange) {
  PyThreadState *released = PyEval_SaveThread();
  dlsync_status status = dlsync_py_lib.exchange_end(exchange);
  PyEval_RestoreThread(released);
  if (status != DLSYNC_SUCCESS) {
    dlsync_py_fail(status);
    return -1;
  }
  return 0;
}

/* ---- the exchange object: dlsync.exchange(producer, consumer, capture_stable) ---- */

enum { DLSYNC_PY_IDLE, DLSYNC_PY_BUSY, DLSYNC_PY_ACTIVE };

typedef struct dlsync_py_exchange {
  PyObject ob_base; /* PyObject_HEAD, spelled out (clang-format) */
  PyObject *producer;
  PyObject *consumer;
  PyObject *capture_stable; /* its truth is taken at enter, as the contextmanager did */
  PyObject *python;         /* between enter and exit: the Python exchange (lists, tensors) */
  dlsync_exchange *handle;
  int state;
} dlsync_py_exchange;

#define DLSYNC_PY_EXCHANGE_SIGNATURE "dlsync.exchange(producer, consumer, capture_stable=False)"

/* Exchange(producer, consumer, capture_stable=False)'s arguments into
 * values[3] (borrowed), with the TypeError words of _ctypes_impl.py's
 * exchange_args; -1 with the error set. */
static int dlsync_py_exchange_args(PyObject *args, PyObject *kwds, PyObject *values[3]) {
  static const char *const names[3] = {"producer", "consumer", "capture_stable"};
  Py_ssize_t n = PyTuple_Size(args), pos = 0, i;
  PyObject *key, *value;
  if (n > 3) {
    PyErr_Format(PyExc_TypeError, DLSYNC_PY_EXCHANGE_SIGNATURE ": at most 3 arguments, %zd given",
                 n);
    return -1;
  }
  for (i = 0; i < 3; i++)
    values[i] = i < n ? PyTuple_GetItem(args, i) : NULL;
  while (kwds != NULL && PyDict_Next(kwds, &pos, &key, &value)) {
    for (i = 0; i < 3; i++)
      if (PyUnicode_Check(key) && PyUnicode_CompareWithASCIIString(key, names[i]) == 0)
        break;
    if (i == 3) {
      PyErr_Format(PyExc_TypeError, DLSYNC_PY_EXCHANGE_SIGNATURE ": no argument named %R", key);
      return -1;
    }
    if (values[i] != NULL) {
      PyErr_Format(PyExc_TypeError, DLSYNC_PY_EXCHANGE_SIGNATURE ": %s given twice", names[i]);
      return -1;
    }
    values[i] = value;
  }
  for (i = 0; i < 2; i++)
    if (values[i] == NULL) {
      PyErr_Format(PyExc_TypeError, DLSYNC_PY_EXCHANGE_SIGNATURE ": %s is missing", names[i]);
      return -1;
    }
  if (values[2] == NULL)
    values[2] = Py_False;
  return 0;
}

static PyObject *dlsync_py_exchange_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
  PyObject *values[3], *producer, *consumer, *stable;
  dlsync_py_exchange *self;
  if (dlsync_py_exchange_args(args, kwds, values) < 0)
    return NULL;
  producer = values[0];
  consumer = values[1];
  stable = values[2];
  self = (dlsync_py_exchange *)PyType_GenericAlloc(type, 0);
  if (self == NULL)
    return NULL;
  Py_INCREF(producer);
  Py_INCREF(consumer);
  Py_INCREF(stable);
  self->producer = producer;
  self->consumer = consumer;
  self->capture_stable = stable;
  return (PyObject *)self;
}

/* Whether dlsync.exchange hands the producer to dlsync's Python exchange: a list or tuple
 * of producers, or a tensor or array (anything with __dlpack__ that is not a
 * stream handle), whose stream _producers.find looks for. */
static int dlsync_py_needs_python(PyObject *producer) {
  PyObject *attr;
  int found;
  if (PyList_Check(producer) || PyTuple_Check(producer))
    return 1;
  if (producer == Py_None || PyLong_Check(producer))
    return 0;
  found = dlsync_py_getattr(producer, dlsync_py_s_dlpack, &attr);
  Py_XDECREF(attr);
  return found;
}

static PyObject *dlsync_py_exchange_enter(PyObject *op, PyObject *unused) {
  dlsync_py_exchange *self = (dlsync_py_exchange *)op;
  uintptr_t producer, consumer;
  uint32_t flags;
  int python, stable;
  (void)unused;
  if (dlsync_py_check_ready() < 0)
    return NULL;
  if (self->state != DLSYNC_PY_IDLE) {
    PyErr_SetString(PyExc_RuntimeError,
                    "dlsync.exchange: already entered (an exchange is entered once at a time)");
    return NULL;
  }
  stable = PyObject_IsTrue(self->capture_stable);
  if (stable < 0)
    return NULL;
  flags = stable ? (uint32_t)DLSYNC_EXCHANGE_CAPTURE_STABLE : 0u;
  python = dlsync_py_needs_python(self->producer);
  if (python < 0)
    return NULL;
  self->state = DLSYNC_PY_BUSY;
  if (python) {
    PyObject *flags_int = PyLong_FromUnsignedLong(flags);
    PyObject *ex = flags_int == NULL
                       ? NULL
                       : PyObject_CallFunctionObjArgs(dlsync_py_python_begin, self->producer,
                                                      self->consumer, flags_int, NULL);
    Py_XDECREF(flags_int);
    if (ex == NULL) {
      self->state = DLSYNC_PY_IDLE;
      return NULL;
    }
    self->python = ex;
  } else if (dlsync_py_handle_value(self->producer, &producer) < 0 ||
             dlsync_py_handle_value(self->consumer, &consumer) < 0 ||
             dlsync_py_begin_handles(&self->handle, producer, consumer, flags) < 0) {
    self->state = DLSYNC_PY_IDLE;
    return NULL;
  }
  self->state = DLSYNC_PY_ACTIVE;
  Py_RETURN_NONE;
}

/* Ends what enter began; -1 with the error set. The object is idle after it,
 * whatever the result (the library frees the handle in any case). */
static int dlsync_py_exchange_finish(dlsync_py_exchange *self) {
  int rc;
  self->state = DLSYNC_PY_BUSY;
  if (self->python != NULL) {
    PyObject *ex = self->python, *r;
    self->python = NULL;
    r = PyObject_CallMethodObjArgs(ex, dlsync_py_s_end, NULL);
    Py_DECREF(ex);
    rc = r == NULL ? -1 : 0;
    Py_XDECREF(r);
  } else if (self->handle != NULL) {
    dlsync_exchange *handle = self->handle;
    self->handle = NULL;
    rc = dlsync_py_end_handle(handle);
  } else {
    rc = 0; /* a Python exchange dropped by the garbage collector's clear */
  }
  self->state = DLSYNC_PY_IDLE;
  return rc;
}

static PyObject *dlsync_py_exchange_exit(PyObject *op, PyObject *args) {
  dlsync_py_exchange *self = (dlsync_py_exchange *)op;
  (void)args;
  if (self->state != DLSYNC_PY_ACTIVE) {
    PyErr_SetString(PyExc_RuntimeError, "dlsync.exchange: __exit__ without a matching __enter__");
    return NULL;
  }
  if (dlsync_py_exchange_finish(self) < 0)
    return NULL;
  Py_RETURN_FALSE;
}

static int dlsync_py_exchange_traverse(PyObject *op, visitproc visit, void *arg) {
  dlsync_py_exchange *self = (dlsync_py_exchange *)op;
  Py_VISIT(Py_TYPE(op));
  Py_VISIT(self->producer);
  Py_VISIT(self->consumer);
  Py_VISIT(self->capture_stable);
  Py_VISIT(self->python);
  return 0;
}

static int dlsync_py_exchange_clear(PyObject *op) {
  dlsync_py_exchange *self = (dlsync_py_exchange *)op;
  Py_CLEAR(self->producer);
  Py_CLEAR(self->consumer);
  Py_CLEAR(self->capture_stable);
  Py_CLEAR(self->python);
  return 0;
}

/* An exchange entered and never exited is ended when it goes, as the
 * generator of a contextlib.contextmanager runs its finally; an error then
 * is reported as unraisable. The collector calls this (tp_finalize, PEP 442)
 * before it clears an exchange caught in a reference cycle, while its
 * Python exchange (lists, tensors) is still there to be ended; dealloc
 * calls it for an exchange that goes the plain way. */
static void dlsync_py_exchange_finalize(PyObject *op) {
  dlsync_py_exchange *self = (dlsync_py_exchange *)op;
  PyObject *et, *ev, *tb;
  if (self->state != DLSYNC_PY_ACTIVE)
    return;
  PyErr_Fetch(&et, &ev, &tb);
  if (dlsync_py_exchange_finish(self) < 0)
    PyErr_WriteUnraisable(dlsync_py_s_abandoned);
  PyErr_Restore(et, ev, tb);
}

static void dlsync_py_exchange_dealloc(PyObject *op) {
  PyTypeObject *type = Py_TYPE(op);
  PyObject_GC_UnTrack(op);
  dlsync_py_exchange_finalize(op);
  dlsync_py_exchange_clear(op);
  PyObject_GC_Del(op);
  Py_DECREF(type);
}

static PyMethodDef dlsync_py_exchange_methods[] = {
    {"__enter__", dlsync_py_exchange_enter, METH_NOARGS,
     "Orders the consumer after the producer (dlsync_exchange_begin_flags)."},
    {"__exit__", dlsync_py_exchange_exit, METH_VARARGS,
     "Orders the producer's later work after the consumer's (dlsync_exchange_end); "
     "never suppresses the block's exception."},
    {NULL, NULL, 0, NULL},
};

/* Function slots are filled in by dlsync_py_fill_slots: a PyType_Slot holds a
 * void *, to which ISO C converts no function pointer. */
static PyType_Slot dlsync_py_exchange_slots[] = {
    {Py_tp_new, NULL},
    {Py_tp_dealloc, NULL},
    {Py_tp_traverse, NULL},
    {Py_tp_clear, NULL},
    {Py_tp_finalize, NULL},
    {Py_tp_methods, dlsync_py_exchange_methods},
    {Py_tp_doc, (void *)"Exchange(producer, consumer, capture_stable=False)\n--\n\n"
                        "The context manager of dlsync.exchange: __enter__ orders the consumer "
                        "after the producer, __exit__ the producer's later work after the "
                        "consumer's. Lists and tensors as producers are handed to the Python "
                        "code of dlsync."},
    {0, NULL},
};

static void *dlsync_py_slot_fn(void (*fn)(void)) {
  void *p;
  memcpy(&p, &fn, sizeof p);
  return p;
}

static void dlsync_py_fill_slots(void) {
  dlsync_py_exchange_slots[0].pfunc = dlsync_py_slot_fn((void (*)(void))dlsync_py_exchange_new);
  dlsync_py_exchange_slots[1].pfunc = dlsync_py_slot_fn((void (*)(void))dlsync_py_exchange_dealloc);
  dlsync_py_exchange_slots[2].pfunc =
      dlsync_py_slot_fn((void (*)(void))dlsync_py_exchange_traverse);
  dlsync_py_exchange_slots[3].pfunc = dlsync_py_slot_fn((void (*)(void))dlsync_py_exchange_clear);
  dlsync_py_exchange_slots[4].pfunc =
      dlsync_py_slot_fn((void (*)(void))dlsync_py_exchange_finalize);
}

static PyType_Spec dlsync_py_exchange_spec = {
    "dlsync._native.Exchange",
    sizeof(dlsync_py_exchange),
    0,
    Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    dlsync_py_exchange_slots,
};

/* ---- module functions ---- */

static PyObject *dlsync_py_stream_handle(PyObject *module, PyObject *stream) {
  uintptr_t handle;
  (void)module;
  return dlsync_py_handle(stream, &handle);
}

/* A begun exchange's handle: written into out (a ctypes.c_void_p, or None)
 * before control returns to Python, so that an exception raised as the call
 * returns (KeyboardInterrupt) leaves it where the caller ends it; returned
 * as an int. If out cannot take it, the exchange is ended and NULL returned. */
static PyObject *dlsync_py_begun(dlsync_exchange *exchange, PyObject *out) {
  PyObject *handle = PyLong_FromVoidPtr(exchange);
  if (handle != NULL && out != Py_None && PyObject_SetAttr(out, dlsync_py_s_value, handle) < 0)
    Py_CLEAR(handle);
  if (handle == NULL) {
    PyObject *et, *ev, *tb;
    PyErr_Fetch(&et, &ev, &tb);
    if (dlsync_py_end_handle(exchange) < 0)
      PyErr_Clear();
    PyErr_Restore(et, ev, tb);
  }
  return handle;
}

static PyObject *dlsync_py_begin(PyObject *module, PyObject *args) {
  PyObject *producer, *consumer, *out = Py_None;
  unsigned int flags = 0;
  uintptr_t p, c;
  dlsync_exchange *exchange = NULL;
  (void)module;
  if (!PyArg_ParseTuple(args, "OO|IO:begin", &producer, &consumer, &flags, &out))
    return NULL;
  if (dlsync_py_check_ready() < 0 || dlsync_py_handle_value(producer, &p) < 0 ||
      dlsync_py_handle_value(consumer, &c) < 0 ||
      dlsync_py_begin_handles(&exchange, p, c, (uint32_t)flags) < 0)
    return NULL;
  return dlsync_py_begun(exchange, out);
}

/* The streams of a list or tuple as lanes, in `stack` or, past its 16, in
 * an array of PyMem (dlsync_py_lanes_free gives it back). A TypeError with
 * `not_a_list` for anything else; -1 with an exception set. */
typedef struct dlsync_py_lanes {
  dlsync_lane stack[16];
  dlsync_lane *lanes;
  Py_ssize_t n;
} dlsync_py_lanes;

static void dlsync_py_lanes_free(dlsync_py_lanes *l) {
  if (l->lanes != l->stack)
    PyMem_Free(l->lanes);
  l->lanes = l->stack;
}

static int dlsync_py_lanes_read(dlsync_py_lanes *l, PyObject *seq, const char *not_a_list) {
  l->lanes = l->stack;
  l->n = 0;
  if (!PyList_Check(seq) && !PyTuple_Check(seq)) {
    PyErr_SetString(PyExc_TypeError, not_a_list);
    return -1;
  }
  l->n = PySequence_Size(seq);
  if (l->n < 0)
    return -1;
  if ((size_t)l->n > sizeof l->stack / sizeof l->stack[0]) {
    l->lanes = PyMem_Malloc((size_t)l->n * sizeof *l->lanes);
    if (l->lanes == NULL) {
      l->lanes = l->stack;
      PyErr_NoMemory();
      return -1;
    }
  }
  for (Py_ssize_t i = 0; i < l->n; i++) {
    uintptr_t h;
    PyObject *item = PySequence_GetItem(seq, i);
    int rc = item == NULL ? -1 : dlsync_py_handle_value(item, &h);
    Py_XDECREF(item);
    if (rc < 0) {
      dlsync_py_lanes_free(l);
      return -1;
    }
    l->lanes[i] = dlsync_py_lane(h);
  }
  return 0;
}

/* begin_many(producers, consumer, flags=0): dlsync_exchange_begin_many on a
 * list or tuple of streams; one handle for end(). */
static PyObject *dlsync_py_begin_many(PyObject *module, PyObject *args) {
  PyObject *producers, *consumer, *out = Py_None;
  unsigned int flags = 0;
  uintptr_t c;
  dlsync_py_lanes ps;
  dlsync_lane lc;
  dlsync_exchange *exchange = NULL;
  dlsync_context *ctx;
  PyThreadState *released;
  dlsync_status status;
  (void)module;
  if (!PyArg_ParseTuple(args, "OO|IO:begin_many", &producers, &consumer, &flags, &out) ||
      dlsync_py_check_ready() < 0 ||
      dlsync_py_lanes_read(&ps, producers,
                           "begin_many: the producers are a list or tuple of streams") < 0)
    return NULL;
  if (dlsync_py_handle_value(consumer, &c) < 0 || (ctx = dlsync_py_context()) == NULL) {
    dlsync_py_lanes_free(&ps);
    return NULL;
  }
  lc = dlsync_py_lane(c);
  released = PyEval_SaveThread();
  status = dlsync_py_lib.exchange_begin_many(&exchange, ctx, ps.lanes, (size_t)ps.n, &lc,
                                             (uint32_t)flags);
  PyEval_RestoreThread(released);
  dlsync_py_lanes_free(&ps);
  if (status != DLSYNC_SUCCESS)
    return dlsync_py_fail(status);
  return dlsync_py_begun(exchange, out);
}

static PyObject *dlsync_py_end(PyObject *module, PyObject *handle) {
  void *exchange;
  (void)module;
  if (dlsync_py_check_ready() < 0)
    return NULL;
  if (!PyLong_Check(handle) || PyBool_Check(handle)) {
    PyErr_SetString(PyExc_TypeError, "end: an exchange handle (int) from begin");
    return NULL;
  }
  exchange = PyLong_AsVoidPtr(handle);
  if (exchange == NULL && PyErr_Occurred())
    return NULL;
  if (dlsync_py_end_handle((dlsync_exchange *)exchange) < 0)
    return NULL;
  Py_RETURN_NONE;
}

/* dlsync_lane_query of a stream handle, the GIL released around the call;
 * -1 with the Python error set on failure. */
static int dlsync_py_query_stream(dlsync_lane_state *state, PyObject *stream) {
  uintptr_t handle;
  dlsync_lane lane;
  dlsync_context *ctx;
  PyThreadState *released;
  dlsync_status status;
  if (dlsync_py_check_ready() < 0 || dlsync_py_handle_value(stream, &handle) < 0)
    return -1;
  ctx = dlsync_py_context();
  if (ctx == NULL)
    return -1;
  lane = dlsync_py_lane(handle);
  released = PyEval_SaveThread();
  status = dlsync_py_lib.lane_query(state, ctx, &lane);
  PyEval_RestoreThread(released);
  if (status != DLSYNC_SUCCESS) {
    dlsync_py_fail(status);
    return -1;
  }
  return 0;
}

static PyObject *dlsync_py_capture_state(PyObject *module, PyObject *stream) {
  dlsync_lane_state state;
  PyObject *answer;
  (void)module;
  if (dlsync_py_query_stream(&state, stream) < 0)
    return NULL;
  answer = state.kind == DLSYNC_LANE_CAPTURING ? dlsync_py_s_capturing : dlsync_py_s_eager;
  Py_INCREF(answer);
  return answer;
}

/* capture_graph(stream): the graph its capture builds, or None when eager. */
static PyObject *dlsync_py_capture_graph(PyObject *module, PyObject *stream) {
  dlsync_lane_state state;
  (void)module;
  if (dlsync_py_query_stream(&state, stream) < 0)
    return NULL;
  if (state.kind != DLSYNC_LANE_CAPTURING)
    Py_RETURN_NONE;
  return PyLong_FromVoidPtr(state.graph);
}

static PyObject *dlsync_py_dlpack_stream(PyObject *module, PyObject *args) {
  long long value;
  PyObject *producer;
  dlsync_lane out;
  bool ordered = false;
  dlsync_status status;
  (void)module;
  if (!PyArg_ParseTuple(args, "LO:dlpack_stream", &value, &producer) || dlsync_py_check_ready() < 0)
    return NULL;
  if (producer == Py_None) {
    /* Only the value is checked: no context, no driver call. */
    status = dlsync_py_lib.dlpack_stream(&out, &ordered, NULL, (int64_t)value, NULL);
  } else {
    uintptr_t handle;
    dlsync_lane lane;
    dlsync_context *ctx;
    PyThreadState *released;
    if (dlsync_py_handle_value(producer, &handle) < 0)
      return NULL;
    ctx = dlsync_py_context();
    if (ctx == NULL)
      return NULL;
    lane = dlsync_py_lane(handle);
    released = PyEval_SaveThread();
    status = dlsync_py_lib.dlpack_stream(&out, &ordered, ctx, (int64_t)value, &lane);
    PyEval_RestoreThread(released);
  }
  if (status != DLSYNC_SUCCESS)
    return dlsync_py_fail(status);
  if (!ordered)
    Py_RETURN_NONE;
  return PyLong_FromVoidPtr(out.stream);
}

static PyObject *dlsync_py_env_stream(PyObject *module, PyObject *args) {
  PyObject *api, *cls;
  int device_type, device_id;
  void *api_ptr, *stream = NULL;
  dlsync_status status;
  (void)module;
  if (!PyArg_ParseTuple(args, "OiiO:env_stream", &api, &device_type, &device_id, &cls) ||
      dlsync_py_check_ready() < 0)
    return NULL;
  api_ptr = PyLong_AsVoidPtr(api);
  if (api_ptr == NULL && PyErr_Occurred())
    return NULL;
  /* With the GIL: the producer's current_work_stream may be Python code. */
  status = dlsync_py_lib.env_stream_from_exchange_api(
      &stream, (const struct DLPackExchangeAPI *)api_ptr, (int32_t)device_type, (int32_t)device_id);
  if (PyErr_Occurred())
    return NULL; /* the producer's own exception */
  if (status != DLSYNC_SUCCESS) {
    PyObject *name = PyObject_GetAttrString(cls, "__name__");
    PyObject *prefix =
        name != NULL ? PyUnicode_FromFormat("%U.__dlpack_c_exchange_api__: ", name) : NULL;
    Py_XDECREF(name);
    if (prefix == NULL)
      return NULL;
    dlsync_py_fail_prefixed(status, prefix);
    Py_DECREF(prefix);
    return NULL;
  }
  if (stream == NULL) { /* the producer's default stream: the legacy one on CUDA */
    Py_INCREF(dlsync_py_legacy);
    return dlsync_py_legacy;
  }
  return PyLong_FromVoidPtr(stream);
}

/* ---- structured graphs: graph_launch and the conditional bodies ---- */

/* A CUgraph / CUgraphExec handle: None (NULL) where none_ok, else an int
 * (not a bool) with 0 <= value < 2**64; TypeError or ValueError in the
 * words of _errors.py's not_a_handle / handle_out_of_range. 0 with *out
 * set, -1 with an exception. */
static int dlsync_py_graph_handle(PyObject *value, const char *what, const char *kind, int none_ok,
                                  void **out) {
  unsigned long long v;
  *out = NULL;
  if (value == Py_None && none_ok)
    return 0;
  if (PyBool_Check(value) || !PyLong_Check(value)) {
    PyObject *type_name = dlsync_py_type_name(value);
    PyObject *repr = type_name != NULL ? PyObject_Repr(value) : NULL;
    if (repr != NULL)
      PyErr_Format(PyExc_TypeError, "%s must be an int %s handle, not %U %U", what, kind, type_name,
                   repr);
    Py_XDECREF(type_name);
    Py_XDECREF(repr);
    return -1;
  }
  v = PyLong_AsUnsignedLongLong(value);
  if (v == (unsigned long long)-1 && PyErr_Occurred()) {
    PyObject *text;
    if (!PyErr_ExceptionMatches(PyExc_OverflowError))
      return -1;
    PyErr_Clear();
    text = PyObject_Format(value, dlsync_py_s_empty);
    if (text != NULL) {
      PyErr_Format(PyExc_ValueError,
                   "%s is %U: a %s handle is an unsigned pointer, 0 <= handle < 2**%d", what, text,
                   kind, DLSYNC_PY_POINTER_BITS);
      Py_DECREF(text);
    }
    return -1;
  }
  *out = (void *)(uintptr_t)v;
  return 0;
}

/* graph_launch(graph, exec, stream): dlsync_graph_launch on the stream's lane. */
static PyObject *dlsync_py_graph_launch(PyObject *module, PyObject *args) {
  PyObject *graph, *exec, *stream;
  void *g, *x;
  uintptr_t handle;
  dlsync_lane lane;
  dlsync_context *ctx;
  PyThreadState *released;
  dlsync_status status;
  (void)module;
  if (!PyArg_ParseTuple(args, "OOO:graph_launch", &graph, &exec, &stream) ||
      dlsync_py_check_ready() < 0 ||
      dlsync_py_graph_handle(graph, "the graph", "CUgraph", 1, &g) < 0 ||
      dlsync_py_graph_handle(exec, "the exec", "CUgraphExec", 1, &x) < 0 ||
      dlsync_py_handle_value(stream, &handle) < 0)
    return NULL;
  ctx = dlsync_py_context();
  if (ctx == NULL)
    return NULL;
  lane = dlsync_py_lane(handle);
  released = PyEval_SaveThread();
  status =
      dlsync_py_lib.graph_launch(ctx, (struct CUgraph_st *)g, (struct CUgraphExec_st *)x, &lane);
  PyEval_RestoreThread(released);
  if (status != DLSYNC_SUCCESS)
    return dlsync_py_fail(status);
  Py_RETURN_NONE;
}

/* The body argument and the context of the three body calls; -1 with an
 * exception. */
static int dlsync_py_body_args(PyObject *body, void **g, dlsync_context **ctx) {
  if (dlsync_py_check_ready() < 0 || dlsync_py_graph_handle(body, "the body", "CUgraph", 0, g) < 0)
    return -1;
  *ctx = dlsync_py_context();
  return *ctx == NULL ? -1 : 0;
}

static PyObject *dlsync_py_body_call(PyObject *body, dlsync_py_body_fn *fn) {
  void *g;
  dlsync_context *ctx;
  dlsync_status status;
  if (dlsync_py_body_args(body, &g, &ctx) < 0)
    return NULL;
  status = fn(ctx, (struct CUgraph_st *)g); /* no driver call: the GIL stays held */
  if (status != DLSYNC_SUCCESS)
    return dlsync_py_fail(status);
  Py_RETURN_NONE;
}

static PyObject *dlsync_py_body_add(PyObject *module, PyObject *body) {
  (void)module;
  return dlsync_py_body_call(body, dlsync_py_lib.body_add);
}

static PyObject *dlsync_py_body_remove(PyObject *module, PyObject *body) {
  (void)module;
  return dlsync_py_body_call(body, dlsync_py_lib.body_remove);
}

static PyObject *dlsync_py_body_declared(PyObject *module, PyObject *body) {
  void *g;
  dlsync_context *ctx;
  (void)module;
  if (dlsync_py_body_args(body, &g, &ctx) < 0)
    return NULL;
  return PyBool_FromLong(dlsync_py_lib.body_declared(ctx, (struct CUgraph_st *)g) != 0);
}

/* ---- other runtimes' events (include/dlsync/foreign.h): fence_import,
 * fence_export_event, fence_provenance and capture_id of _ctypes_impl.py ---- */

/* A capture id: an int (not a bool) with 0 <= value < 2**64, in the words of
 * _errors.py's not_a_capture_id / capture_id_out_of_range. */
static int dlsync_py_capture_id_value(PyObject *value, uint64_t *out) {
  unsigned long long v;
  if (PyBool_Check(value) || !PyLong_Check(value)) {
    PyObject *type_name = dlsync_py_type_name(value);
    PyObject *repr = type_name != NULL ? PyObject_Repr(value) : NULL;
    if (repr != NULL)
      PyErr_Format(PyExc_TypeError, "capture_id must be an int (a capture's id) or None, not %U %U",
                   type_name, repr);
    Py_XDECREF(type_name);
    Py_XDECREF(repr);
    return -1;
  }
  v = PyLong_AsUnsignedLongLong(value);
  if (v == (unsigned long long)-1 && PyErr_Occurred()) {
    PyObject *text;
    if (!PyErr_ExceptionMatches(PyExc_OverflowError))
      return -1;
    PyErr_Clear();
    text = PyObject_Format(value, dlsync_py_s_empty);
    if (text != NULL) {
      PyErr_Format(PyExc_ValueError, "capture_id is %U: a capture's id is an unsigned 64-bit int",
                   text);
      Py_DECREF(text);
    }
    return -1;
  }
  *out = (uint64_t)v;
  return 0;
}

/* fence_import(event, provenance, capture_id, flags, out=None): the fence,
 * written into out (a ctypes.c_void_p) first when given; released again if
 * out cannot take it. The GIL is released around the import (cuEventQuery). */
static PyObject *dlsync_py_fence_import(PyObject *module, PyObject *args) {
  PyObject *event, *capture, *out = Py_None, *handle;
  int provenance;
  unsigned int flags;
  void *e;
  uint64_t capture_id;
  dlsync_fence *fence = NULL;
  dlsync_context *ctx;
  PyThreadState *released;
  dlsync_status status;
  (void)module;
  if (!PyArg_ParseTuple(args, "OiOI|O:fence_import", &event, &provenance, &capture, &flags, &out) ||
      dlsync_py_check_ready() < 0 ||
      dlsync_py_graph_handle(event, "the event", "CUevent", 0, &e) < 0 ||
      dlsync_py_capture_id_value(capture, &capture_id) < 0)
    return NULL;
  ctx = dlsync_py_context();
  if (ctx == NULL)
    return NULL;
  released = PyEval_SaveThread();
  status = dlsync_py_lib.fence_import(&fence, ctx, (struct CUevent_st *)e,
                                      (dlsync_provenance)provenance, capture_id, flags);
  PyEval_RestoreThread(released);
  if (status != DLSYNC_SUCCESS)
    return dlsync_py_fail(status);
  handle = PyLong_FromVoidPtr(fence);
  if (handle != NULL && out != Py_None && PyObject_SetAttr(out, dlsync_py_s_value, handle) < 0)
    Py_CLEAR(handle);
  if (handle == NULL)
    dlsync_py_lib.fence_release(fence);
  return handle;
}

/* A fence handle given by dlsync's own Python code (an int); -1 with an
 * exception. */
static int dlsync_py_fence_value(PyObject *value, const dlsync_fence **out) {
  void *f = PyLong_AsVoidPtr(value);
  if (f == NULL && PyErr_Occurred())
    return -1;
  *out = (const dlsync_fence *)f;
  return 0;
}

/* fence_export_event(fence): the CUevent handle behind the fence (no driver call). */
static PyObject *dlsync_py_fence_export_event(PyObject *module, PyObject *value) {
  const dlsync_fence *fence;
  struct CUevent_st *event = NULL;
  dlsync_status status;
  (void)module;
  if (dlsync_py_check_ready() < 0 || dlsync_py_fence_value(value, &fence) < 0)
    return NULL;
  status = dlsync_py_lib.fence_export_event(&event, fence);
  if (status != DLSYNC_SUCCESS)
    return dlsync_py_fail(status);
  return PyLong_FromVoidPtr(event);
}

/* fence_provenance(fence): the provenance of an imported fence, None for a
 * fence dlsync signalled (no driver call). */
static PyObject *dlsync_py_fence_provenance(PyObject *module, PyObject *value) {
  const dlsync_fence *fence;
  dlsync_fence_kind kind = DLSYNC_FENCE_EAGER;
  dlsync_provenance provenance = DLSYNC_PROVENANCE_EAGER;
  dlsync_status status;
  (void)module;
  if (dlsync_py_check_ready() < 0 || dlsync_py_fence_value(value, &fence) < 0)
    return NULL;
  status = dlsync_py_lib.fence_get_kind(&kind, fence);
  if (status != DLSYNC_SUCCESS)
    return dlsync_py_fail(status);
  if (kind != DLSYNC_FENCE_IMPORTED)
    Py_RETURN_NONE;
  status = dlsync_py_lib.fence_get_provenance(&provenance, fence);
  if (status != DLSYNC_SUCCESS)
    return dlsync_py_fail(status);
  return PyLong_FromLong((long)provenance);
}

/* capture_id(stream): the id of the stream's capture, or None when eager. */
static PyObject *dlsync_py_capture_id(PyObject *module, PyObject *stream) {
  dlsync_lane_state state;
  (void)module;
  if (dlsync_py_query_stream(&state, stream) < 0)
    return NULL;
  if (state.kind != DLSYNC_LANE_CAPTURING)
    Py_RETURN_NONE;
  return PyLong_FromUnsignedLongLong((unsigned long long)state.capture_id);
}

/* ---- graph compilers: fan-out and conditional nodes ---- */

/* begin_fanout(producer, consumers, flags=0, out=None):
 * dlsync_exchange_begin_fanout on a producer stream and a list or tuple of
 * consumer streams; one handle for end(). */
static PyObject *dlsync_py_begin_fanout(PyObject *module, PyObject *args) {
  PyObject *producer, *consumers, *out = Py_None;
  unsigned int flags = 0;
  uintptr_t p;
  dlsync_py_lanes cs;
  dlsync_lane lp;
  dlsync_exchange *exchange = NULL;
  dlsync_context *ctx;
  PyThreadState *released;
  dlsync_status status;
  (void)module;
  if (!PyArg_ParseTuple(args, "OO|IO:begin_fanout", &producer, &consumers, &flags, &out) ||
      dlsync_py_check_ready() < 0)
    return NULL;
  if (!PyList_Check(consumers) && !PyTuple_Check(consumers)) {
    PyErr_SetString(PyExc_TypeError, "begin_fanout: the consumers are a list or tuple of streams");
    return NULL;
  }
  if (dlsync_py_handle_value(producer, &p) < 0 ||
      dlsync_py_lanes_read(&cs, consumers,
                           "begin_fanout: the consumers are a list or tuple of streams") < 0)
    return NULL;
  ctx = dlsync_py_context();
  if (ctx == NULL) {
    dlsync_py_lanes_free(&cs);
    return NULL;
  }
  lp = dlsync_py_lane(p);
  released = PyEval_SaveThread();
  status = dlsync_py_lib.begin_fanout(&exchange, ctx, &lp, cs.lanes, (size_t)cs.n, (uint32_t)flags);
  PyEval_RestoreThread(released);
  dlsync_py_lanes_free(&cs);
  if (status != DLSYNC_SUCCESS)
    return dlsync_py_fail(status);
  return dlsync_py_begun(exchange, out);
}

/* order(first, then): dlsync_order on two streams. */
static PyObject *dlsync_py_order(PyObject *module, PyObject *args) {
  PyObject *first, *then;
  uintptr_t f, t;
  dlsync_lane lf, lt;
  dlsync_context *ctx;
  PyThreadState *released;
  dlsync_status status;
  (void)module;
  if (!PyArg_ParseTuple(args, "OO:order", &first, &then) || dlsync_py_check_ready() < 0 ||
      dlsync_py_handle_value(first, &f) < 0 || dlsync_py_handle_value(then, &t) < 0)
    return NULL;
  ctx = dlsync_py_context();
  if (ctx == NULL)
    return NULL;
  lf = dlsync_py_lane(f);
  lt = dlsync_py_lane(t);
  released = PyEval_SaveThread();
  status = dlsync_py_lib.order(ctx, &lf, &lt);
  PyEval_RestoreThread(released);
  if (status != DLSYNC_SUCCESS)
    return dlsync_py_fail(status);
  Py_RETURN_NONE;
}

/* node_declare(parent, node, bodies): dlsync_conditional_node_declare; the
 * handles ints, bodies a list or tuple of them. */
static PyObject *dlsync_py_node_declare(PyObject *module, PyObject *args) {
  PyObject *parent, *node, *bodies;
  void *g, *nd;
  struct CUgraph_st *stack_bodies[DLSYNC_CONDITIONAL_BODIES], **array = stack_bodies;
  dlsync_context *ctx;
  PyThreadState *released;
  dlsync_status status;
  Py_ssize_t n, i;
  (void)module;
  if (!PyArg_ParseTuple(args, "OOO:node_declare", &parent, &node, &bodies) ||
      dlsync_py_check_ready() < 0 ||
      dlsync_py_graph_handle(parent, "the parent", "CUgraph", 0, &g) < 0 ||
      dlsync_py_graph_handle(node, "the node", "CUgraphNode", 0, &nd) < 0)
    return NULL;
  if (!PyList_Check(bodies) && !PyTuple_Check(bodies)) {
    PyErr_SetString(PyExc_TypeError,
                    "node_declare: the bodies are a list or tuple of CUgraph handles");
    return NULL;
  }
  n = PySequence_Size(bodies);
  if (n < 0)
    return NULL;
  if ((size_t)n > sizeof stack_bodies / sizeof stack_bodies[0]) {
    array = PyMem_Malloc((size_t)n * sizeof *array);
    if (array == NULL)
      return PyErr_NoMemory();
  }
  for (i = 0; i < n; i++) {
    char what[48];
    void *b;
    PyObject *item = PySequence_GetItem(bodies, i);
    int rc;
    PyOS_snprintf(what, sizeof what, "bodies[%zd]", i);
    rc = item == NULL ? -1 : dlsync_py_graph_handle(item, what, "CUgraph", 0, &b);
    Py_XDECREF(item);
    if (rc < 0)
      goto fail;
    array[i] = (struct CUgraph_st *)b;
  }
  ctx = dlsync_py_context();
  if (ctx == NULL)
    goto fail;
  released = PyEval_SaveThread(); /* two graph queries */
  status = dlsync_py_lib.node_declare(ctx, (struct CUgraph_st *)g, (struct CUgraphNode_st *)nd,
                                      array, (size_t)n);
  PyEval_RestoreThread(released);
  if (array != stack_bodies)
    PyMem_Free(array);
  if (status != DLSYNC_SUCCESS)
    return dlsync_py_fail(status);
  Py_RETURN_NONE;
fail:
  if (array != stack_bodies)
    PyMem_Free(array);
  return NULL;
}

/* ---- end graph compilers ---- */

/* ---- the Arrow C Device data interface: the calls of dlsync/_arrow.py,
 * which owns the structures and hands their addresses (ints) ---- */

/* An address given as an int (dlsync/_arrow.py's ctypes.addressof). */
static int dlsync_py_address(PyObject *value, const char *what, void **out) {
  if (PyBool_Check(value) || !PyLong_Check(value)) {
    PyErr_Format(PyExc_TypeError, "%s must be an int address", what);
    return -1;
  }
  *out = PyLong_AsVoidPtr(value);
  return *out == NULL && PyErr_Occurred() ? -1 : 0;
}

/* arrow_sync_event(array, sync, stream): dlsync_arrow_sync_event. */
static PyObject *dlsync_py_arrow_sync_event(PyObject *module, PyObject *args) {
  PyObject *array, *sync, *stream;
  void *a, *y;
  uintptr_t handle;
  dlsync_lane lane;
  dlsync_context *ctx;
  PyThreadState *released;
  dlsync_status status;
  (void)module;
  if (!PyArg_ParseTuple(args, "OOO:arrow_sync_event", &array, &sync, &stream) ||
      dlsync_py_check_ready() < 0 || dlsync_py_handle_value(stream, &handle) < 0 ||
      dlsync_py_address(array, "the array", &a) < 0 || dlsync_py_address(sync, "the sync", &y) < 0)
    return NULL;
  ctx = dlsync_py_context();
  if (ctx == NULL)
    return NULL;
  lane = dlsync_py_lane(handle);
  released = PyEval_SaveThread();
  status = dlsync_py_lib.arrow_sync_event((struct ArrowDeviceArray *)a, (dlsync_arrow_sync *)y, ctx,
                                          &lane);
  PyEval_RestoreThread(released);
  if (status != DLSYNC_SUCCESS)
    return dlsync_py_fail(status);
  Py_RETURN_NONE;
}

/* arrow_sync_release(sync): dlsync_arrow_sync_release. */
static PyObject *dlsync_py_arrow_sync_release(PyObject *module, PyObject *sync) {
  void *y;
  PyThreadState *released;
  (void)module;
  if (dlsync_py_check_ready() < 0 || dlsync_py_address(sync, "the sync", &y) < 0)
    return NULL;
  released = PyEval_SaveThread();
  dlsync_py_lib.arrow_sync_release((dlsync_arrow_sync *)y);
  PyEval_RestoreThread(released);
  Py_RETURN_NONE;
}

/* arrow_wait(array, stream, provenance): dlsync_arrow_wait (capture id 0). */
static PyObject *dlsync_py_arrow_wait(PyObject *module, PyObject *args) {
  PyObject *array, *stream;
  int provenance;
  void *a;
  uintptr_t handle;
  dlsync_lane lane;
  dlsync_context *ctx;
  PyThreadState *released;
  dlsync_status status;
  (void)module;
  if (!PyArg_ParseTuple(args, "OOi:arrow_wait", &array, &stream, &provenance) ||
      dlsync_py_check_ready() < 0 || dlsync_py_handle_value(stream, &handle) < 0 ||
      dlsync_py_address(array, "the array", &a) < 0)
    return NULL;
  ctx = dlsync_py_context();
  if (ctx == NULL)
    return NULL;
  lane = dlsync_py_lane(handle);
  released = PyEval_SaveThread();
  status = dlsync_py_lib.arrow_wait(ctx, &lane, (const struct ArrowDeviceArray *)a,
                                    (dlsync_provenance)provenance, 0);
  PyEval_RestoreThread(released);
  if (status != DLSYNC_SUCCESS)
    return dlsync_py_fail(status);
  Py_RETURN_NONE;
}

/* arrow_release(array, stream): dlsync_arrow_release. */
static PyObject *dlsync_py_arrow_release(PyObject *module, PyObject *args) {
  PyObject *array, *stream;
  void *a;
  uintptr_t handle;
  dlsync_lane lane;
  dlsync_context *ctx;
  PyThreadState *released;
  dlsync_status status;
  (void)module;
  if (!PyArg_ParseTuple(args, "OO:arrow_release", &array, &stream) || dlsync_py_check_ready() < 0 ||
      dlsync_py_handle_value(stream, &handle) < 0 || dlsync_py_address(array, "the array", &a) < 0)
    return NULL;
  ctx = dlsync_py_context();
  if (ctx == NULL)
    return NULL;
  lane = dlsync_py_lane(handle);
  released = PyEval_SaveThread();
  status = dlsync_py_lib.arrow_release(ctx, &lane, (struct ArrowDeviceArray *)a);
  PyEval_RestoreThread(released);
  if (status != DLSYNC_SUCCESS)
    return dlsync_py_fail(status);
  Py_RETURN_NONE;
}

static PyObject *dlsync_py_init(PyObject *module, PyObject *args) {
  PyObject *symbols, *error, *python_begin, *getattr_address;
  dlsync_py_api lib;
  dlsync_py_getattr_fn *getattr_fn = NULL;
  size_t i;
  (void)module;
  if (!PyArg_ParseTuple(args, "O!OOO:_init", &PyDict_Type, &symbols, &error, &python_begin,
                        &getattr_address))
    return NULL;
  if (!PyType_Check(error) || !PyCallable_Check(python_begin)) {
    PyErr_SetString(PyExc_TypeError, "_init: an exception type and a callable");
    return NULL;
  }
  memset(&lib, 0, sizeof lib);
  for (i = 0; i < DLSYNC_PY_NSYMBOLS; i++) {
    PyObject *value = PyDict_GetItemString(symbols, dlsync_py_symbols[i].name);
    void *address = value != NULL && PyLong_Check(value) ? PyLong_AsVoidPtr(value) : NULL;
    if (address == NULL) {
      if (!PyErr_Occurred())
        PyErr_Format(PyExc_ValueError, "_init: no address for %s", dlsync_py_symbols[i].name);
      return NULL;
    }
    memcpy((char *)&lib + dlsync_py_symbols[i].offset, &address, sizeof address);
  }
  if (getattr_address != Py_None) {
    void *address = PyLong_AsVoidPtr(getattr_address);
    if (address == NULL && PyErr_Occurred())
      return NULL;
    memcpy(&getattr_fn, &address, sizeof address);
  }
  Py_INCREF(error);
  Py_INCREF(python_begin);
  Py_XDECREF(dlsync_py_error);
  Py_XDECREF(dlsync_py_python_begin);
  dlsync_py_error = error;
  dlsync_py_python_begin = python_begin;
  dlsync_py_lib = lib;
  dlsync_py_optional_getattr = getattr_fn;
  dlsync_py_ctx = NULL;
  dlsync_py_ready = true;
  Py_RETURN_NONE;
}

static PyMethodDef dlsync_py_functions[] = {
    {"_init", dlsync_py_init, METH_VARARGS,
     "_init(symbols, error, python_begin, getattr_address)\n--\n\n"
     "Hands the module the library dlsync loaded: symbols maps each name of SYMBOLS to "
     "its address; error is dlsync.Error; python_begin(producer, consumer, flags) begins the "
     "exchanges of list and tensor producers (an object with end()); getattr_address is "
     "PyObject_GetOptionalAttr or _PyObject_LookupAttr, or None."},
    {"stream_handle", dlsync_py_stream_handle, METH_O,
     "stream_handle(stream)\n--\n\n"
     "The CUstream handle of a stream object or integer.\n\n"
     "Accepts ints, objects with ``__cuda_stream__`` (returning ``(version,\n"
     "handle)``), ``torch.cuda.Stream`` (``cuda_stream``), CuPy streams\n"
     "(``ptr``) and objects with a ``handle`` attribute. ``None`` is the legacy\n"
     "default stream."},
    {"capture_state", dlsync_py_capture_state, METH_O,
     "capture_state(stream)\n--\n\n'eager' or 'capturing' (the driver asked now)."},
    {"capture_graph", dlsync_py_capture_graph, METH_O,
     "capture_graph(stream)\n--\n\nThe graph the stream's capture builds, or None when eager."},
    {"begin", dlsync_py_begin, METH_VARARGS,
     "begin(producer, consumer, flags=0, out=None)\n--\n\n"
     "dlsync_exchange_begin_flags on two streams; the exchange's handle (an int) for end(), "
     "written into out (a ctypes.c_void_p) first when given."},
    {"begin_many", dlsync_py_begin_many, METH_VARARGS,
     "begin_many(producers, consumer, flags=0, out=None)\n--\n\n"
     "dlsync_exchange_begin_many on a list or tuple of producer streams and a consumer stream; "
     "one handle (an int) for end(), written into out (a ctypes.c_void_p) first when given."},
    {"end", dlsync_py_end, METH_O, "end(handle)\n--\n\ndlsync_exchange_end."},
    {"dlpack_stream", dlsync_py_dlpack_stream, METH_VARARGS,
     "dlpack_stream(value, producer)\n--\n\n"
     "dlsync_dlpack_stream: the consumer's stream handle for a __dlpack__ stream value, or "
     "None for -1. With producer None only the value is checked (no driver call)."},
    {"env_stream", dlsync_py_env_stream, METH_VARARGS,
     "env_stream(api, device_type, device_id, cls)\n--\n\n"
     "dlsync_env_stream_from_exchange_api with the GIL held: the producer's current work "
     "stream (1, the legacy stream, for NULL). Errors name cls.__dlpack_c_exchange_api__."},
    {"graph_launch", dlsync_py_graph_launch, METH_VARARGS,
     "graph_launch(graph, exec, stream)\n--\n\n"
     "dlsync_graph_launch on the stream's lane; graph and exec are int handles or None."},
    {"body_add", dlsync_py_body_add, METH_O, "body_add(graph)\n--\n\ndlsync_conditional_body_add."},
    {"body_remove", dlsync_py_body_remove, METH_O,
     "body_remove(graph)\n--\n\ndlsync_conditional_body_remove."},
    {"body_declared", dlsync_py_body_declared, METH_O,
     "body_declared(graph)\n--\n\ndlsync_conditional_body_is_declared, as a bool."},
    {"fence_import", dlsync_py_fence_import, METH_VARARGS,
     "fence_import(event, provenance, capture_id, flags, out=None)\n--\n\n"
     "dlsync_fence_import of a CUevent handle: the fence's handle (an int), written into out (a "
     "ctypes.c_void_p) first when given."},
    {"fence_export_event", dlsync_py_fence_export_event, METH_O,
     "fence_export_event(fence)\n--\n\ndlsync_fence_export_event: the CUevent handle."},
    {"fence_provenance", dlsync_py_fence_provenance, METH_O,
     "fence_provenance(fence)\n--\n\n"
     "dlsync_fence_get_provenance of an imported fence; None for a fence dlsync signalled."},
    {"capture_id", dlsync_py_capture_id, METH_O,
     "capture_id(stream)\n--\n\nThe id of the stream's capture, or None when eager."},
    /* graph compilers: fan-out and conditional nodes */
    {"begin_fanout", dlsync_py_begin_fanout, METH_VARARGS,
     "begin_fanout(producer, consumers, flags=0, out=None)\n--\n\n"
     "dlsync_exchange_begin_fanout on a producer stream and a list or tuple of consumer "
     "streams; one handle (an int) for end(), written into out (a ctypes.c_void_p) first "
     "when given."},
    {"order", dlsync_py_order, METH_VARARGS,
     "order(first, then)\n--\n\ndlsync_order on two streams: then's later work after first's "
     "work so far."},
    {"node_declare", dlsync_py_node_declare, METH_VARARGS,
     "node_declare(parent, node, bodies)\n--\n\n"
     "dlsync_conditional_node_declare; parent, node and each body int handles."},
    /* the Arrow C Device data interface (addresses from dlsync/_arrow.py) */
    {"arrow_sync_event", dlsync_py_arrow_sync_event, METH_VARARGS,
     "arrow_sync_event(array, sync, stream)\n--\n\n"
     "dlsync_arrow_sync_event on the stream's lane; array and sync are int addresses."},
    {"arrow_sync_release", dlsync_py_arrow_sync_release, METH_O,
     "arrow_sync_release(sync)\n--\n\ndlsync_arrow_sync_release; sync is an int address."},
    {"arrow_wait", dlsync_py_arrow_wait, METH_VARARGS,
     "arrow_wait(array, stream, provenance)\n--\n\n"
     "dlsync_arrow_wait on the stream's lane (capture id 0); array is an int address."},
    {"arrow_release", dlsync_py_arrow_release, METH_VARARGS,
     "arrow_release(array, stream)\n--\n\n"
     "dlsync_arrow_release on the stream's lane; array is an int address."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef dlsync_py_module = {
    PyModuleDef_HEAD_INIT,
    "dlsync._native",
    "The compiled part of the dlsync binding (stable ABI); dlsync uses it when it imports.",
    -1,
    dlsync_py_functions,
    NULL,
    NULL,
    NULL,
    NULL,
};

static int dlsync_py_add(PyObject *module, const char *name, PyObject *value) {
  if (value == NULL)
    return -1;
  if (PyModule_AddObject(module, name, value) < 0) {
    Py_DECREF(value);
    return -1;
  }
  return 0;
}

static int dlsync_py_intern(PyObject **slot, const char *text) {
  *slot = PyUnicode_InternFromString(text);
  return *slot == NULL ? -1 : 0;
}

PyMODINIT_FUNC PyInit__native(void);

PyMODINIT_FUNC PyInit__native(void) {
  PyObject *module, *names;
  size_t i;
  if (dlsync_py_intern(&dlsync_py_s_cuda_stream_protocol, "__cuda_stream__") < 0 ||
      dlsync_py_intern(&dlsync_py_s_dlpack, "__dlpack__") < 0 ||
      dlsync_py_intern(&dlsync_py_s_end, "end") < 0 ||
      dlsync_py_intern(&dlsync_py_s_value, "value") < 0 ||
      dlsync_py_intern(&dlsync_py_s_empty, "") < 0 ||
      dlsync_py_intern(&dlsync_py_s_capturing, "capturing") < 0 ||
      dlsync_py_intern(&dlsync_py_s_eager, "eager") < 0 ||
      dlsync_py_intern(&dlsync_py_s_abandoned,
                       "dlsync.exchange, entered and never exited, ending as it goes") < 0)
    return NULL;
  for (i = 0; i < sizeof dlsync_py_s_attrs / sizeof dlsync_py_s_attrs[0]; i++)
    if (dlsync_py_intern(&dlsync_py_s_attrs[i], dlsync_py_attr_names[i]) < 0)
      return NULL;
  dlsync_py_legacy = PyLong_FromLong(1);
  if (dlsync_py_legacy == NULL)
    return NULL;
  module = PyModule_Create(&dlsync_py_module);
  if (module == NULL)
    return NULL;
  dlsync_py_fill_slots();
  dlsync_py_exchange_type = PyType_FromSpec(&dlsync_py_exchange_spec);
  if (dlsync_py_exchange_type == NULL)
    goto fail;
  Py_INCREF(dlsync_py_exchange_type);
  if (dlsync_py_add(module, "Exchange", dlsync_py_exchange_type) < 0)
    goto fail;
  names = PyTuple_New((Py_ssize_t)DLSYNC_PY_NSYMBOLS);
  if (names == NULL)
    goto fail;
  for (i = 0; i < DLSYNC_PY_NSYMBOLS; i++) {
    PyObject *name = PyUnicode_FromString(dlsync_py_symbols[i].name);
    if (name == NULL || PyTuple_SetItem(names, (Py_ssize_t)i, name) < 0) {
      Py_DECREF(names);
      goto fail;
    }
  }
  if (dlsync_py_add(module, "SYMBOLS", names) < 0 ||
      PyModule_AddIntConstant(module, "ABI", DLSYNC_PY_ABI) < 0 ||
      PyModule_AddIntConstant(module, "POINTER_BITS", DLSYNC_PY_POINTER_BITS) < 0)
    goto fail;
  return module;
fail:
  Py_DECREF(module);
  return NULL;
}
