/* SPDX-License-Identifier: Apache-2.0 */
/* dlsync tests: the fake CUDA driver's libcuda entries (fk_*) and the table
 * that hands them out (see fake_driver.h for the model). */
#include "fake_int.h"

/* ---- the CUresult names (every code of cuda.h 13.0) ---------------------------------- */

#define FAKE_CURESULT_LIST(X)                                                                    \
  X(CUDA_SUCCESS, "no error")                                                                    \
  X(CUDA_ERROR_INVALID_VALUE, "invalid argument")                                                \
  X(CUDA_ERROR_OUT_OF_MEMORY, "out of memory")                                                   \
  X(CUDA_ERROR_NOT_INITIALIZED, "initialization error")                                          \
  X(CUDA_ERROR_DEINITIALIZED, "driver shutting down")                                            \
  X(CUDA_ERROR_PROFILER_DISABLED, "profiler disabled")                                           \
  X(CUDA_ERROR_PROFILER_NOT_INITIALIZED, "profiler not initialized")                             \
  X(CUDA_ERROR_PROFILER_ALREADY_STARTED, "profiler already started")                             \
  X(CUDA_ERROR_PROFILER_ALREADY_STOPPED, "profiler already stopped")                             \
  X(CUDA_ERROR_STUB_LIBRARY, "CUDA driver is a stub library")                                    \
  X(CUDA_ERROR_CALL_REQUIRES_NEWER_DRIVER, "CUDA driver version is insufficient for this call")  \
  X(CUDA_ERROR_DEVICE_UNAVAILABLE, "CUDA-capable device(s) is/are busy or unavailable")          \
  X(CUDA_ERROR_NO_DEVICE, "no CUDA-capable device is detected")                                  \
  X(CUDA_ERROR_INVALID_DEVICE, "invalid device ordinal")                                         \
  X(CUDA_ERROR_DEVICE_NOT_LICENSED, "device not licensed")                                       \
  X(CUDA_ERROR_INVALID_IMAGE, "device kernel image is invalid")                                  \
  X(CUDA_ERROR_INVALID_CONTEXT, "invalid device context")                                        \
  X(CUDA_ERROR_CONTEXT_ALREADY_CURRENT, "context already current")                               \
  X(CUDA_ERROR_MAP_FAILED, "map failed")                                                         \
  X(CUDA_ERROR_UNMAP_FAILED, "unmap failed")                                                     \
  X(CUDA_ERROR_ARRAY_IS_MAPPED, "array is mapped")                                               \
  X(CUDA_ERROR_ALREADY_MAPPED, "already mapped")                                                 \
  X(CUDA_ERROR_NO_BINARY_FOR_GPU, "no kernel image is available for execution on the device")    \
  X(CUDA_ERROR_ALREADY_ACQUIRED, "already acquired")                                             \
  X(CUDA_ERROR_NOT_MAPPED, "not mapped")                                                         \
  X(CUDA_ERROR_NOT_MAPPED_AS_ARRAY, "not mapped as array")                                       \
  X(CUDA_ERROR_NOT_MAPPED_AS_POINTER, "not mapped as pointer")                                   \
  X(CUDA_ERROR_ECC_UNCORRECTABLE, "uncorrectable ECC error encountered")                         \
  X(CUDA_ERROR_UNSUPPORTED_LIMIT, "unsupported limit")                                           \
  X(CUDA_ERROR_CONTEXT_ALREADY_IN_USE, "context already in use")                                 \
  X(CUDA_ERROR_PEER_ACCESS_UNSUPPORTED, "peer access unsupported")                               \
  X(CUDA_ERROR_INVALID_PTX, "invalid ptx")                                                       \
  X(CUDA_ERROR_INVALID_GRAPHICS_CONTEXT, "invalid graphics context")                             \
  X(CUDA_ERROR_NVLINK_UNCORRECTABLE, "nvlink uncorrectable")                                     \
  X(CUDA_ERROR_JIT_COMPILER_NOT_FOUND, "jit compiler not found")                                 \
  X(CUDA_ERROR_UNSUPPORTED_PTX_VERSION, "unsupported ptx version")                               \
  X(CUDA_ERROR_JIT_COMPILATION_DISABLED, "jit compilation disabled")                             \
  X(CUDA_ERROR_UNSUPPORTED_EXEC_AFFINITY, "unsupported exec affinity")                           \
  X(CUDA_ERROR_UNSUPPORTED_DEVSIDE_SYNC, "unsupported devside sync")                             \
  X(CUDA_ERROR_CONTAINED, "contained")                                                           \
  X(CUDA_ERROR_INVALID_SOURCE, "invalid source")                                                 \
  X(CUDA_ERROR_FILE_NOT_FOUND, "file not found")                                                 \
  X(CUDA_ERROR_SHARED_OBJECT_SYMBOL_NOT_FOUND, "shared object symbol not found")                 \
  X(CUDA_ERROR_SHARED_OBJECT_INIT_FAILED, "shared object init failed")                           \
  X(CUDA_ERROR_OPERATING_SYSTEM, "OS call failed or operation not supported on this OS")         \
  X(CUDA_ERROR_INVALID_HANDLE, "invalid resource handle")                                        \
  X(CUDA_ERROR_ILLEGAL_STATE, "the operation cannot be performed in the present state")          \
  X(CUDA_ERROR_LOSSY_QUERY, "attempted introspection would be semantically lossy")               \
  X(CUDA_ERROR_NOT_FOUND, "named symbol not found")                                              \
  X(CUDA_ERROR_NOT_READY, "device not ready")                                                    \
  X(CUDA_ERROR_ILLEGAL_ADDRESS, "an illegal memory access was encountered")                      \
  X(CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES, "too many resources requested for launch")               \
  X(CUDA_ERROR_LAUNCH_TIMEOUT, "the launch timed out and was terminated")                        \
  X(CUDA_ERROR_LAUNCH_INCOMPATIBLE_TEXTURING, "launch incompatible texturing")                   \
  X(CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED, "peer access is already enabled")                    \
  X(CUDA_ERROR_PEER_ACCESS_NOT_ENABLED, "peer access has not been enabled")                      \
  X(CUDA_ERROR_PRIMARY_CONTEXT_ACTIVE, "primary context active")                                 \
  X(CUDA_ERROR_CONTEXT_IS_DESTROYED, "context is destroyed")                                     \
  X(CUDA_ERROR_ASSERT, "assert")                                                                 \
  X(CUDA_ERROR_TOO_MANY_PEERS, "too many peers")                                                 \
  X(CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED, "host memory already registered")                 \
  X(CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED, "host memory not registered")                         \
  X(CUDA_ERROR_HARDWARE_STACK_ERROR, "hardware stack error")                                     \
  X(CUDA_ERROR_ILLEGAL_INSTRUCTION, "illegal instruction")                                       \
  X(CUDA_ERROR_MISALIGNED_ADDRESS, "misaligned address")                                         \
  X(CUDA_ERROR_INVALID_ADDRESS_SPACE, "invalid address space")                                   \
  X(CUDA_ERROR_INVALID_PC, "invalid pc")                                                         \
  X(CUDA_ERROR_LAUNCH_FAILED, "unspecified launch failure")                                      \
  X(CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE, "cooperative launch too large")                     \
  X(CUDA_ERROR_TENSOR_MEMORY_LEAK, "tensor memory leak")                                         \
  X(CUDA_ERROR_NOT_PERMITTED, "operation not permitted")                                         \
  X(CUDA_ERROR_NOT_SUPPORTED, "operation not supported")                                         \
  X(CUDA_ERROR_SYSTEM_NOT_READY, "system not ready")                                             \
  X(CUDA_ERROR_SYSTEM_DRIVER_MISMATCH,                                                           \
    "system has unsupported display driver / cuda driver combination")                           \
  X(CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE, "compat not supported on device")                 \
  X(CUDA_ERROR_MPS_CONNECTION_FAILED, "mps connection failed")                                   \
  X(CUDA_ERROR_MPS_RPC_FAILURE, "mps rpc failure")                                               \
  X(CUDA_ERROR_MPS_SERVER_NOT_READY, "mps server not ready")                                     \
  X(CUDA_ERROR_MPS_MAX_CLIENTS_REACHED, "mps max clients reached")                               \
  X(CUDA_ERROR_MPS_MAX_CONNECTIONS_REACHED, "mps max connections reached")                       \
  X(CUDA_ERROR_MPS_CLIENT_TERMINATED, "mps client terminated")                                   \
  X(CUDA_ERROR_CDP_NOT_SUPPORTED, "cdp not supported")                                           \
  X(CUDA_ERROR_CDP_VERSION_MISMATCH, "cdp version mismatch")                                     \
  X(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, "operation not permitted when stream is capturing")   \
  X(CUDA_ERROR_STREAM_CAPTURE_INVALIDATED,                                                       \
    "operation failed due to a previous error during capture")                                   \
  X(CUDA_ERROR_STREAM_CAPTURE_MERGE,                                                             \
    "operation would result in a merge of separate capture sequences")                           \
  X(CUDA_ERROR_STREAM_CAPTURE_UNMATCHED, "capture was not ended in the same stream as it began") \
  X(CUDA_ERROR_STREAM_CAPTURE_UNJOINED, "capturing stream has unjoined work")                    \
  X(CUDA_ERROR_STREAM_CAPTURE_ISOLATION,                                                         \
    "dependency created on uncaptured work in another stream")                                   \
  X(CUDA_ERROR_STREAM_CAPTURE_IMPLICIT,                                                          \
    "operation would make the legacy stream depend on a capturing blocking stream")              \
  X(CUDA_ERROR_CAPTURED_EVENT,                                                                   \
    "operation not permitted on an event last recorded in a capturing stream")                   \
  X(CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD,                                                      \
    "attempt to terminate a thread-local capture sequence from another thread")                  \
  X(CUDA_ERROR_TIMEOUT, "wait operation timed out")                                              \
  X(CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE,                                                        \
    "the graph update was not performed because it included changes which violated constraints " \
    "specific to instantiated graph update")                                                     \
  X(CUDA_ERROR_EXTERNAL_DEVICE, "external device")                                               \
  X(CUDA_ERROR_INVALID_CLUSTER_SIZE, "invalid cluster size")                                     \
  X(CUDA_ERROR_FUNCTION_NOT_LOADED, "function not loaded")                                       \
  X(CUDA_ERROR_INVALID_RESOURCE_TYPE, "invalid resource type")                                   \
  X(CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION, "invalid resource configuration")                 \
  X(CUDA_ERROR_KEY_ROTATION, "key rotation")                                                     \
  X(CUDA_ERROR_UNKNOWN, "unknown error")                                                         \
  /* end */

typedef struct fake_errname {
  CUresult code;
  const char *name;
  const char *text;
} fake_errname;

static const fake_errname errnames[] = {
#define FAKE_ERRNAME_ONE(code, text) {code, #code, text},
    FAKE_CURESULT_LIST(FAKE_ERRNAME_ONE)
#undef FAKE_ERRNAME_ONE
};

static const fake_errname *errname_find(CUresult r) {
  for (size_t i = 0; i < sizeof errnames / sizeof errnames[0]; i++)
    if (errnames[i].code == r)
      return &errnames[i];
  return NULL;
}

/* ---- devices ------------------------------------------------------------------------------ */

bool dev_ok(CUdevice d) {
  return d >= 0 && d < S.ndev;
}

static int dev_bus(CUdevice d) {
  return (0x10 + d) & 0xff;
}

static CUresult CUDAAPI fk_Init(unsigned int flags) {
  ENTER(Init);
  CUresult r = CUDA_SUCCESS;
  if (flags != 0)
    r = CUDA_ERROR_INVALID_VALUE;
  else if (S.ndev == 0)
    r = CUDA_ERROR_NO_DEVICE;
  else
    S.initialized = true;
  return leave(r);
}

static CUresult CUDAAPI fk_DriverGetVersion(int *v) {
  ENTER(DriverGetVersion);
  if (!v)
    return leave(CUDA_ERROR_INVALID_VALUE);
  *v = S.version;
  return leave(CUDA_SUCCESS);
}

static CUresult CUDAAPI fk_GetErrorName(CUresult error, const char **p) {
  ENTER(GetErrorName);
  if (!p)
    return leave(CUDA_ERROR_INVALID_VALUE);
  const fake_errname *e = errname_find(error);
  *p = e ? e->name : NULL;
  return leave(e ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE);
}

static CUresult CUDAAPI fk_GetErrorString(CUresult error, const char **p) {
  ENTER(GetErrorString);
  if (!p)
    return leave(CUDA_ERROR_INVALID_VALUE);
  const fake_errname *e = errname_find(error);
  *p = e ? e->text : NULL;
  return leave(e ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE);
}

static CUresult CUDAAPI fk_DeviceGetCount(int *n) {
  ENTER(DeviceGetCount);
  if (!n)
    return leave(CUDA_ERROR_INVALID_VALUE);
  *n = S.ndev;
  return leave(CUDA_SUCCESS);
}

static CUresult CUDAAPI fk_DeviceGet(CUdevice *d, int ordinal) {
  ENTER(DeviceGet);
  if (!d)
    return leave(CUDA_ERROR_INVALID_VALUE);
  if (!dev_ok(ordinal))
    return leave(CUDA_ERROR_INVALID_DEVICE);
  *d = ordinal;
  return leave(CUDA_SUCCESS);
}

static CUresult CUDAAPI fk_DeviceGetName(char *name, int len, CUdevice d) {
  ENTER(DeviceGetName);
  if (!name || len <= 0)
    return leave(CUDA_ERROR_INVALID_VALUE);
  if (!dev_ok(d))
    return leave(CUDA_ERROR_INVALID_DEVICE);
  snprintf(name, (size_t)len, "Fake GPU %d", d);
  return leave(CUDA_SUCCESS);
}

static CUresult CUDAAPI fk_DeviceGetAttribute(int *pi, CUdevice_attribute a, CUdevice d) {
  ENTER(DeviceGetAttribute);
  if (!pi || (int)a <= 0 || a >= CU_DEVICE_ATTRIBUTE_MAX)
    return leave(CUDA_ERROR_INVALID_VALUE);
  if (!dev_ok(d))
    return leave(CUDA_ERROR_INVALID_DEVICE);
  int v = 0;
  switch (a) {
  case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR:
    v = 9;
    break;
  case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR:
    v = 0;
    break;
  case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT:
    v = 132;
    break;
  case CU_DEVICE_ATTRIBUTE_PCI_BUS_ID:
    v = dev_bus(d);
    break;
  case CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID:
    v = 0;
    break;
  case CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID:
    v = 0;
    break;
  case CU_DEVICE_ATTRIBUTE_WARP_SIZE:
    v = 32;
    break;
  case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK:
    v = 1024;
    break;
  case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR:
    v = 2048;
    break;
  case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK:
    v = 49152;
    break;
  case CU_DEVICE_ATTRIBUTE_CLOCK_RATE:
    v = 1980000;
    break;
  case CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH:
    v = 6144;
    break;
  case CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE:
    v = 60 << 20;
    break;
  case CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING:
    v = 1;
    break;
  case CU_DEVICE_ATTRIBUTE_CONCURRENT_KERNELS:
    v = 1;
    break;
  case CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY:
    v = 1;
    break;
  case CU_DEVICE_ATTRIBUTE_ASYNC_ENGINE_COUNT:
    v = 3;
    break;
  case CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED:
    v = 1;
    break;
  case CU_DEVICE_ATTRIBUTE_STREAM_PRIORITIES_SUPPORTED:
    v = 1;
    break;
  case CU_DEVICE_ATTRIBUTE_ECC_ENABLED:
    v = 1;
    break;
  default:
    v = 0;
    break;
  }
  *pi = v;
  return leave(CUDA_SUCCESS);
}

static CUresult CUDAAPI fk_DeviceTotalMem(size_t *bytes, CUdevice d) {
  ENTER(DeviceTotalMem);
  if (!bytes)
    return leave(CUDA_ERROR_INVALID_VALUE);
  if (!dev_ok(d))
    return leave(CUDA_ERROR_INVALID_DEVICE);
  *bytes = (size_t)80 << 30;
  return leave(CUDA_SUCCESS);
}

static CUresult CUDAAPI fk_DeviceGetPCIBusId(char *buf, int len, CUdevice d) {
  ENTER(DeviceGetPCIBusId);
  if (!buf || len <= 0)
    return leave(CUDA_ERROR_INVALID_VALUE);
  if (!dev_ok(d))
    return leave(CUDA_ERROR_INVALID_DEVICE);
  snprintf(buf, (size_t)len, "0000:%02x:00.0", (unsigned)dev_bus(d));
  return leave(CUDA_SUCCESS);
}

static CUresult CUDAAPI fk_DeviceCanAccessPeer(int *can, CUdevice d, CUdevice peer) {
  ENTER(DeviceCanAccessPeer);
  if (!can)
    return leave(CUDA_ERROR_INVALID_VALUE);
  if (!dev_ok(d) || !dev_ok(peer))
    return leave(CUDA_ERROR_INVALID_DEVICE);
  *can = d != peer;
  return leave(CUDA_SUCCESS);
}

/* ---- contexts ----------------------------------------------------------------------------- */

static CUresult CUDAAPI fk_DevicePrimaryCtxRetain(CUcontext *pctx, CUdevice d) {
  ENTER(DevicePrimaryCtxRetain);
  if (!pctx)
    return leave(CUDA_ERROR_INVALID_VALUE);
  if (!dev_ok(d))
    return leave(CUDA_ERROR_INVALID_DEVICE);
  S.ctxs[d]->refs++;
  *pctx = S.ctxs[d]->h;
  return leave(CUDA_SUCCESS);
}

static CUresult CUDAAPI fk_DevicePrimaryCtxRelease(CUdevice d) {
  ENTER(DevicePrimaryCtxRelease);
  if (!dev_ok(d))
    return leave(CUDA_ERROR_INVALID_DEVICE);
  if (S.ctxs[d]->refs == 0)
    return leave(CUDA_ERROR_INVALID_CONTEXT);
  S.ctxs[d]->refs--;
  return leave(CUDA_SUCCESS);
}

static CUresult CUDAAPI fk_CtxPushCurrent(CUcontext c) {
  ENTER(CtxPushCurrent);
  if (!GET_CTX(c))
    return leave(CUDA_ERROR_INVALID_CONTEXT);
  if (T.depth == FAKE_CTX_STACK)
    return leave(CUDA_ERROR_OUT_OF_MEMORY);
  T.stack[T.depth++] = c;
  return leave(CUDA_SUCCESS);
}

static CUresult CUDAAPI fk_CtxPopCurrent(CUcontext *pctx) {
  ENTER(CtxPopCurrent);
  if (T.depth == 0)
    return leave(CUDA_ERROR_INVALID_CONTEXT);
  CUcontext c = T.stack[--T.depth];
  if (pctx)
    *pctx = c;
  return leave(CUDA_SUCCESS);
}

static CUresult CUDAAPI fk_CtxGetCurrent(CUcontext *pctx) {
  ENTER(CtxGetCurrent);
  if (!pctx)
    return leave(CUDA_ERROR_INVALID_VALUE);
  *pctx = T.depth ? T.stack[T.depth - 1] : NULL;
  return leave(CUDA_SUCCESS);
}

static CUresult CUDAAPI fk_CtxGetDevice(CUdevice *d) {
  ENTER(CtxGetDevice);
  if (!d)
    return leave(CUDA_ERROR_INVALID_VALUE);
  fctx *c = cur_ctx();
  if (!c)
    return leave(CUDA_ERROR_INVALID_CONTEXT);
  *d = c->dev;
  return leave(CUDA_SUCCESS);
}

static CUresult CUDAAPI fk_CtxGetId(CUcontext h, unsigned long long *id) {
  ENTER(CtxGetId);
  if (!id)
    return leave(CUDA_ERROR_INVALID_VALUE);
  fctx *c = h ? GET_CTX(h) : cur_ctx();
  if (!c)
    return leave(CUDA_ERROR_INVALID_CONTEXT);
  *id = c->id;
  return leave(CUDA_SUCCESS);
}

static CUresult CUDAAPI fk_CtxSynchronize(void) {
  ENTER(CtxSynchronize);
  fctx *c = cur_ctx();
  if (!c)
    return leave(CUDA_ERROR_INVALID_CONTEXT);
  if (unsafe_call_prohibited())
    return leave(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
  bool hit = false;
  for (size_t i = 0; i < S.nstreams; i++) {
    fstream *s = S.streams[i];
    if (s->ctx == c && s->cap) {
      s->cap->invalidated = true;
      hit = true;
    }
  }
  if (hit) {
    S.illegal++;
    return leave(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
  }
  return leave(CUDA_SUCCESS);
}

/* ---- streams ------------------------------------------------------------------------------- */

static CUresult CUDAAPI fk_StreamCreate(CUstream *ps, unsigned int flags) {
  ENTER(StreamCreate);
  if (!ps || (flags & ~(unsigned)CU_STREAM_NON_BLOCKING))
    return leave(CUDA_ERROR_INVALID_VALUE);
  fctx *c = cur_ctx();
  if (!c)
    return leave(CUDA_ERROR_INVALID_CONTEXT);
  *ps = stream_new(c, flags, false, false)->h;
  return leave(CUDA_SUCCESS);
}

static CUresult CUDAAPI fk_StreamDestroy(CUstream h) {
  ENTER(StreamDestroy);
  fstream *s = GET_STREAM(h);
  if (!s)
    return leave(CUDA_ERROR_INVALID_HANDLE);
  if (s->cap)
    return leave(CUDA_ERROR_NOT_SUPPORTED);
  stream_free(s);
  return leave(CUDA_SUCCESS);
}

static CUresult CUDAAPI fk_StreamGetCtx(CUstream h, CUcontext *pctx) {
  ENTER(StreamGetCtx);
  fstream *s;
  if (!pctx)
    return leave(CUDA_ERROR_INVALID_VALUE);
  CUresult r = get_stream(h, true, &s);
  if (r == CUDA_SUCCESS)
    *pctx = s->ctx->h;
  return leave(r);
}

static CUresult CUDAAPI fk_StreamGetId(CUstream h, unsigned long long *id) {
  ENTER(StreamGetId);
  fstream *s;
  if (!id)
    return leave(CUDA_ERROR_INVALID_VALUE);
  CUresult r = get_stream(h, true, &s);
  if (r == CUDA_SUCCESS)
    *id = s->id;
  return leave(r);
}

static CUresult CUDAAPI fk_StreamGetFlags(CUstream h, unsigned int *flags) {
  ENTER(StreamGetFlags);
  fstream *s;
  if (!flags)
    return leave(CUDA_ERROR_INVALID_VALUE);
  CUresult r = get_stream(h, true, &s);
  if (r == CUDA_SUCCESS)
    *flags = s->flags;
  return leave(r);
}

static CUresult CUDAAPI fk_StreamGetDevice(CUstream h, CUdevice *d) {
  ENTER(StreamGetDevice);
  fstream *s;
  if (!d)
    return leave(CUDA_ERROR_INVALID_VALUE);
  CUresult r = get_stream(h, true, &s);
  if (r == CUDA_SUCCESS)
    *d = s->ctx->dev;
  return leave(r);
}

static CUresult stream_sync_or_query(CUstream h) {
  fstream *s;
  CUresult r = get_stream(h, true, &s);
  if (r != CUDA_SUCCESS)
    return r;
  if (unsafe_call_prohibited())
    return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  if (s->cap) {
    s->cap->invalidated = true;
    S.illegal++;
    return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  }
  if (s->legacy && legacy_conflict(s->ctx, true))
    return CUDA_ERROR_STREAM_CAPTURE_IMPLICIT;
  return CUDA_SUCCESS;
}

static CUresult CUDAAPI fk_StreamSynchronize(CUstream h) {
  ENTER(StreamSynchronize);
  return leave(stream_sync_or_query(h));
}

static CUresult CUDAAPI fk_StreamQuery(CUstream h) {
  ENTER(StreamQuery);
  return leave(stream_sync_or_query(h));
}

/* ---- events --------------------------------------------------------------------------------- */

static CUresult CUDAAPI fk_EventCreate(CUevent *pe, unsigned int flags) {
  ENTER(EventCreate);
  const unsigned known = CU_EVENT_BLOCKING_SYNC | CU_EVENT_DISABLE_TIMING | CU_EVENT_INTERPROCESS;
  if (!pe || (flags & ~known) ||
      ((flags & CU_EVENT_INTERPROCESS) && !(flags & CU_EVENT_DISABLE_TIMING)))
    return leave(CUDA_ERROR_INVALID_VALUE);
  fctx *c = cur_ctx();
  if (!c)
    return leave(CUDA_ERROR_INVALID_CONTEXT);
  *pe = event_new(c, flags)->h;
  return leave(CUDA_SUCCESS);
}

void event_destroy(fevent *e) {
  if (event_in_use_by_graphs(e))
    S.dangling++;
  event_free(e);
}

static CUresult CUDAAPI fk_EventDestroy(CUevent h) {
  ENTER(EventDestroy);
  fevent *e = GET_EVENT(h);
  if (!e)
    return leave(CUDA_ERROR_INVALID_HANDLE);
  event_destroy(e);
  return leave(CUDA_SUCCESS);
}

static CUresult event_record(CUevent he, CUstream hs, unsigned flags) {
  if (flags & ~(unsigned)CU_EVENT_RECORD_EXTERNAL)
    return CUDA_ERROR_INVALID_VALUE;
  fevent *e = GET_EVENT(he);
  if (!e)
    return CUDA_ERROR_INVALID_HANDLE;
  fstream *s;
  CUresult r = get_stream(hs, true, &s);
  if (r != CUDA_SUCCESS)
    return r;
  /* An eager or plain record refuses another context's event; an external
   * record during capture takes it (the node is added and the graph
   * launches: design.md R15). */
  if (e->ctx != s->ctx && !((flags & CU_EVENT_RECORD_EXTERNAL) && s->cap))
    return CUDA_ERROR_INVALID_HANDLE;
  if (s->legacy && legacy_conflict(s->ctx, true))
    return CUDA_ERROR_STREAM_CAPTURE_IMPLICIT;
  if (flags & CU_EVENT_RECORD_EXTERNAL) {
    if (!s->cap)
      return CUDA_ERROR_ILLEGAL_STATE; /* [R7 EXTERNAL-OUTSIDE-CAPTURE] */
    if (s->cap->invalidated)
      return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
    /* [R6 EXTERNAL-RECORD] */
    fnode *n = capture_append(s, CU_GRAPH_NODE_TYPE_EVENT_RECORD);
    n->ev = e->h;
    n->ev_serial = e->serial;
    event_set_eager(e, 0);
    e->state = EV_NODE;
    e->cap_id = s->cap->id;
    return CUDA_SUCCESS;
  }
  if (s->cap) {
    if (s->cap->invalidated)
      return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
    event_set_captured(e, s);
    return CUDA_SUCCESS;
  }
  event_set_eager(e, op_new(s, NULL, 0));
  return CUDA_SUCCESS;
}

static CUresult CUDAAPI fk_EventRecord(CUevent e, CUstream s) {
  ENTER(EventRecord);
  return leave(event_record(e, s, 0));
}

static CUresult CUDAAPI fk_EventRecordWithFlags(CUevent e, CUstream s, unsigned int flags) {
  ENTER(EventRecordWithFlags);
  return leave(event_record(e, s, flags));
}

static CUresult stream_wait_event(CUstream hs, CUevent he, unsigned flags) {
  if (flags & ~(unsigned)CU_EVENT_WAIT_EXTERNAL)
    return CUDA_ERROR_INVALID_VALUE;
  fstream *s;
  CUresult r = get_stream(hs, true, &s);
  if (r != CUDA_SUCCESS)
    return r;
  fevent *e = GET_EVENT(he);
  if (!e)
    return CUDA_ERROR_INVALID_HANDLE;
  if (s->legacy && (legacy_conflict(s->ctx, true) || event_captured_active(e))) {
    if (event_captured_active(e))
      cap_find(e->cap_id)->invalidated = true;
    return CUDA_ERROR_STREAM_CAPTURE_IMPLICIT;
  }
  if (flags & CU_EVENT_WAIT_EXTERNAL) {
    if (!s->cap)
      return CUDA_ERROR_ILLEGAL_STATE; /* [R7 EXTERNAL-OUTSIDE-CAPTURE] */
    if (s->cap->invalidated)
      return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
    /* [R5 EXTERNAL-WAIT], also on the record node of another capture still
     * active: [R13 EXTERNAL-PAIR] */
    fnode *n = capture_append(s, CU_GRAPH_NODE_TYPE_WAIT_EVENT);
    n->ev = e->h;
    n->ev_serial = e->serial;
    return CUDA_SUCCESS;
  }
  if (event_node_active(e) && s->cap) { /* a capture's plain wait on another's record node */
    s->cap->invalidated = true;
    return CUDA_ERROR_INVALID_VALUE;
  }
  static const CUgraphEdgeData no_data;
  if (!s->cap) {
    if (event_node_active(e)) { /* [R10 RECORD-NODE-WAIT] an ordinary eager wait */
      op_new(s, NULL, 0);
      return CUDA_SUCCESS;
    }
    if (event_captured_active(e)) {
      fcapture *c = cap_find(e->cap_id);
      if (c->invalidated)
        return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
      s->cap = c; /* join: [R1 JOIN] */
      s->ndeps = 0;
      for (size_t i = 0; i < e->nnodes; i++) {
        fnode *n = GET_NODE(e->nodes[i]);
        if (n)
          deps_add(s, n, no_data);
      }
      return CUDA_SUCCESS;
    }
    uint64_t extra = e->state == EV_EAGER ? e->op : 0;
    op_new(s, &extra, 1);
    return CUDA_SUCCESS;
  }
  if (s->cap->invalidated)
    return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
  if (e->state == EV_CAPTURED && e->cap_id == s->cap->id) {
    for (size_t i = 0; i < e->nnodes; i++) {
      fnode *n = GET_NODE(e->nodes[i]);
      if (n)
        deps_add(s, n, no_data);
    }
    return CUDA_SUCCESS;
  }
  if (event_captured_active(e)) { /* [R4 MERGE] */
    s->cap->invalidated = true;
    cap_find(e->cap_id)->invalidated = true;
    return CUDA_ERROR_STREAM_CAPTURE_MERGE;
  }
  s->cap->invalidated = true; /* [R3 ISOLATION] */
  return CUDA_ERROR_STREAM_CAPTURE_ISOLATION;
}

static CUresult CUDAAPI fk_StreamWaitEvent(CUstream s, CUevent e, unsigned int flags) {
  ENTER(StreamWaitEvent);
  return leave(stream_wait_event(s, e, flags));
}

static CUresult event_sync_or_query(CUevent h, bool query) {
  fevent *e = GET_EVENT(h);
  if (!e)
    return CUDA_ERROR_INVALID_HANDLE;
  if (unsafe_call_prohibited())
    return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  if (e->state == EV_CAPTURED) {
    /* [R41 QUERY-CAPTURED-EVENT] a query's answer is CAPTURED_EVENT, and
     * the capture the event was recorded in, while active, is invalidated,
     * in any capture mode of the asking thread. (A synchronization gives
     * the same answer; what it does to the capture is not modelled.) */
    fcapture *c = cap_find(e->cap_id);
    if (query && c != NULL)
      c->invalidated = true; /* not counted: the capture's end tells */
    if (!query)
      S.illegal++;
    return CUDA_ERROR_CAPTURED_EVENT;
  }
  return CUDA_SUCCESS;
}

static CUresult CUDAAPI fk_EventQuery(CUevent e) {
  ENTER(EventQuery);
  return leave(event_sync_or_query(e, true));
}

static CUresult CUDAAPI fk_EventSynchronize(CUevent e) {
  ENTER(EventSynchronize);
  return leave(event_sync_or_query(e, false));
}

static CUresult CUDAAPI fk_EventElapsedTime(float *ms, CUevent ha, CUevent hb) {
  ENTER(EventElapsedTime);
  if (!ms)
    return leave(CUDA_ERROR_INVALID_VALUE);
  fevent *a = GET_EVENT(ha), *b = GET_EVENT(hb);
  if (!a || !b)
    return leave(CUDA_ERROR_INVALID_HANDLE);
  if (a->state == EV_CAPTURED || b->state == EV_CAPTURED) {
    S.illegal++;
    return leave(CUDA_ERROR_CAPTURED_EVENT);
  }
  if ((a->flags | b->flags) & CU_EVENT_DISABLE_TIMING)
    return leave(CUDA_ERROR_INVALID_HANDLE);
  if (a->state != EV_EAGER || b->state != EV_EAGER)
    return leave(CUDA_ERROR_INVALID_HANDLE);
  *ms = 0.0f;
  return leave(CUDA_SUCCESS);
}

static CUresult CUDAAPI fk_LaunchHostFunc(CUstream hs, CUhostFn fn, void *ud) {
  ENTER(LaunchHostFunc);
  if (!fn)
    return leave(CUDA_ERROR_INVALID_VALUE);
  fstream *s;
  CUresult r = get_stream(hs, true, &s);
  if (r != CUDA_SUCCESS)
    return leave(r);
  fnode *n;
  r = enqueue(s, CU_GRAPH_NODE_TYPE_HOST, NULL, NULL, &n);
  if (r == CUDA_SUCCESS) {
    if (n) {
      n->fn = fn;
      n->ud = ud;
    } else {
      hostfn_queue(fn, ud);
    }
  }
  return leave(r);
}

static CUresult CUDAAPI fk_ThreadExchangeStreamCaptureMode(CUstreamCaptureMode *mode) {
  ENTER(ThreadExchangeStreamCaptureMode);
  if (!mode ||
      (*mode != CU_STREAM_CAPTURE_MODE_GLOBAL && *mode != CU_STREAM_CAPTURE_MODE_THREAD_LOCAL &&
       *mode != CU_STREAM_CAPTURE_MODE_RELAXED))
    return leave(CUDA_ERROR_INVALID_VALUE);
  CUstreamCaptureMode old = T.mode;
  T.mode = *mode;
  *mode = old;
  return leave(CUDA_SUCCESS);
}

/* ---- stream capture ------------------------------------------------------------------------ */

static bool mode_ok(CUstreamCaptureMode m) {
  return m == CU_STREAM_CAPTURE_MODE_GLOBAL || m == CU_STREAM_CAPTURE_MODE_THREAD_LOCAL ||
         m == CU_STREAM_CAPTURE_MODE_RELAXED;
}

static CUresult begin_capture(CUstream hs, CUgraph hg, const CUgraphNode *deps,
                              const CUgraphEdgeData *data, size_t n, CUstreamCaptureMode mode) {
  if (!mode_ok(mode))
    return CUDA_ERROR_INVALID_VALUE;
  fstream *s;
  CUresult r = get_stream(hs, true, &s);
  if (r != CUDA_SUCCESS)
    return r;
  if (s->legacy)
    return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  if (s->cap)
    return CUDA_ERROR_ILLEGAL_STATE;
  fgraph *g = NULL;
  fnode **v = NULL;
  if (hg) {
    g = GET_GRAPH(hg);
    if (!g)
      return CUDA_ERROR_INVALID_VALUE;
    if (g->building)
      return CUDA_ERROR_ILLEGAL_STATE;
    r = deps_resolve(g, deps, data, n, &v);
    if (r != CUDA_SUCCESS)
      return r;
  } else {
    g = graph_new();
  }
  fcapture *c = xcalloc(1, sizeof *c);
  c->id = g_next_capture_id++;
  c->graph = g;
  c->origin = s;
  c->mode = mode;
  c->thread = pthread_self();
  c->to_graph = hg != NULL;
  g->building = c;
  VEC_PUSH(S.caps, S.ncaps, S.capcaps, c);
  s->cap = c;
  s->ndeps = 0;
  for (size_t i = 0; v && i < n; i++) {
    CUgraphEdgeData e = {0};
    if (data)
      e = data[i];
    deps_add(s, v[i], e);
  }
  free(v);
  return CUDA_SUCCESS;
}

static CUresult CUDAAPI fk_StreamBeginCapture(CUstream s, CUstreamCaptureMode mode) {
  ENTER(StreamBeginCapture);
  return leave(begin_capture(s, NULL, NULL, NULL, 0, mode));
}

static CUresult CUDAAPI fk_StreamBeginCaptureToGraph(CUstream s, CUgraph g, const CUgraphNode *deps,
                                                     const CUgraphEdgeData *data, size_t n,
                                                     CUstreamCaptureMode mode) {
  ENTER(StreamBeginCaptureToGraph);
  if (!g)
    return leave(CUDA_ERROR_INVALID_VALUE);
  return leave(begin_capture(s, g, deps, data, n, mode));
}

static CUresult end_capture(CUstream hs, CUgraph *pg) {
  if (!pg)
    return CUDA_ERROR_INVALID_VALUE;
  fstream *s;
  CUresult r = get_stream(hs, true, &s);
  if (r != CUDA_SUCCESS)
    return r;
  if (!s->cap)
    return CUDA_ERROR_ILLEGAL_STATE;
  fcapture *c = s->cap;
  *pg = NULL;
  if (c->origin != s) {
    c->invalidated = true;
    cap_end(c, false);
    return CUDA_ERROR_STREAM_CAPTURE_UNMATCHED;
  }
  if (c->mode != CU_STREAM_CAPTURE_MODE_RELAXED && !pthread_equal(c->thread, pthread_self())) {
    cap_end(c, false);
    return CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD;
  }
  if (c->invalidated) {
    cap_end(c, false);
    return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
  }
  for (size_t i = 0; i < S.nstreams; i++) {
    fstream *t = S.streams[i];
    if (t == s || t->cap != c)
      continue;
    for (size_t j = 0; j < t->ndeps; j++) {
      bool joined = false;
      for (size_t k = 0; k < s->ndeps && !joined; k++)
        joined = node_reaches(t->deps[j].node, s->deps[k].node);
      if (!joined) { /* [R2 UNJOINED] */
        cap_end(c, false);
        return CUDA_ERROR_STREAM_CAPTURE_UNJOINED;
      }
    }
  }
  CUgraph out = c->graph->h;
  cap_end(c, true);
  *pg = out;
  return CUDA_SUCCESS;
}

static CUresult CUDAAPI fk_StreamEndCapture(CUstream s, CUgraph *pg) {
  ENTER(StreamEndCapture);
  return leave(end_capture(s, pg));
}

static CUresult get_capture_info(CUstream hs, CUstreamCaptureStatus *status, cuuint64_t *id,
                                 CUgraph *graph, const CUgraphNode **deps,
                                 const CUgraphEdgeData **edata, size_t *ndeps) {
  if (!status || (edata && !deps))
    return CUDA_ERROR_INVALID_VALUE;
  fstream *s;
  CUresult r = get_stream(hs, true, &s);
  if (r != CUDA_SUCCESS)
    return r;
  if (s->legacy && legacy_conflict(s->ctx, false))
    return CUDA_ERROR_STREAM_CAPTURE_IMPLICIT; /* [R8 LEGACY-QUERY]: no invalidation */
  if (s->cap && !s->cap->invalidated && deps && !edata) {
    for (size_t i = 0; i < s->ndeps; i++)
      if (!edge_is_default(&s->deps[i].data))
        return CUDA_ERROR_LOSSY_QUERY;
  }
  if (id)
    *id = 0;
  if (graph)
    *graph = NULL;
  if (deps)
    *deps = NULL;
  if (edata)
    *edata = NULL;
  if (ndeps)
    *ndeps = 0;
  if (!s->cap) {
    *status = CU_STREAM_CAPTURE_STATUS_NONE;
    return CUDA_SUCCESS;
  }
  if (id)
    *id = s->cap->id;
  if (s->cap->invalidated) {
    *status = CU_STREAM_CAPTURE_STATUS_INVALIDATED;
    return CUDA_SUCCESS;
  }
  *status = CU_STREAM_CAPTURE_STATUS_ACTIVE;
  if (graph)
    *graph = s->cap->graph->h;
  if (ndeps)
    *ndeps = s->ndeps;
  if (deps && s->ndeps) {
    s->info_nodes = xcalloc(s->ndeps, sizeof *s->info_nodes);
    for (size_t i = 0; i < s->ndeps; i++)
      s->info_nodes[i] = s->deps[i].node->h;
    *deps = s->info_nodes;
  }
  if (edata && s->ndeps) {
    s->info_edges = xcalloc(s->ndeps, sizeof *s->info_edges);
    for (size_t i = 0; i < s->ndeps; i++)
      s->info_edges[i] = s->deps[i].data;
    *edata = s->info_edges;
  }
  return CUDA_SUCCESS;
}

static CUresult CUDAAPI fk_StreamGetCaptureInfo(CUstream s, CUstreamCaptureStatus *status,
                                                cuuint64_t *id, CUgraph *graph,
                                                const CUgraphNode **deps,
                                                const CUgraphEdgeData **edata, size_t *ndeps) {
  ENTER(StreamGetCaptureInfo);
  return leave(get_capture_info(s, status, id, graph, deps, edata, ndeps));
}

static CUresult stream_is_capturing(CUstream hs, CUstreamCaptureStatus *status) {
  if (!status)
    return CUDA_ERROR_INVALID_VALUE;
  fstream *s;
  CUresult r = get_stream(hs, true, &s);
  if (r != CUDA_SUCCESS)
    return r;
  if (s->legacy && legacy_conflict(s->ctx, false))
    return CUDA_ERROR_STREAM_CAPTURE_IMPLICIT;
  *status = !s->cap               ? CU_STREAM_CAPTURE_STATUS_NONE
            : s->cap->invalidated ? CU_STREAM_CAPTURE_STATUS_INVALIDATED
                                  : CU_STREAM_CAPTURE_STATUS_ACTIVE;
  return CUDA_SUCCESS;
}

static CUresult CUDAAPI fk_StreamIsCapturing(CUstream s, CUstreamCaptureStatus *status) {
  ENTER(StreamIsCapturing);
  return leave(stream_is_capturing(s, status));
}

static CUresult update_capture_deps(CUstream hs, CUgraphNode *nodes, const CUgraphEdgeData *data,
                                    size_t n, unsigned flags) {
  if (flags != CU_STREAM_ADD_CAPTURE_DEPENDENCIES && flags != CU_STREAM_SET_CAPTURE_DEPENDENCIES)
    return CUDA_ERROR_INVALID_VALUE;
  fstream *s;
  CUresult r = get_stream(hs, true, &s);
  if (r != CUDA_SUCCESS)
    return r;
  if (!s->cap)
    return CUDA_ERROR_ILLEGAL_STATE;
  if (s->cap->invalidated)
    return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
  if (n && !nodes)
    return CUDA_ERROR_INVALID_VALUE;
  for (size_t i = 0; i < n; i++) {
    fnode *d = GET_NODE(nodes[i]);
    if (!d || d->g != s->cap->graph || (data && !edge_valid(&data[i], d)))
      return CUDA_ERROR_INVALID_VALUE;
  }
  if (flags == CU_STREAM_SET_CAPTURE_DEPENDENCIES) /* [R9 MANUAL-APPEND] */
    s->ndeps = 0;
  for (size_t i = 0; i < n; i++) {
    CUgraphEdgeData e = {0};
    if (data)
      e = data[i];
    deps_add(s, GET_NODE(nodes[i]), e);
  }
  return CUDA_SUCCESS;
}

static CUresult CUDAAPI fk_StreamUpdateCaptureDependencies(CUstream s, CUgraphNode *nodes,
                                                           const CUgraphEdgeData *data, size_t n,
                                                           unsigned int flags) {
  ENTER(StreamUpdateCaptureDependencies);
  return leave(update_capture_deps(s, nodes, data, n, flags));
}

/* ---- graphs built by hand ------------------------------------------------------------------ */

static CUresult CUDAAPI fk_GraphCreate(CUgraph *pg, unsigned int flags) {
  ENTER(GraphCreate);
  if (!pg || flags != 0)
    return leave(CUDA_ERROR_INVALID_VALUE);
  *pg = graph_new()->h;
  return leave(CUDA_SUCCESS);
}

static CUresult CUDAAPI fk_GraphDestroy(CUgraph h) {
  ENTER(GraphDestroy);
  fgraph *g = GET_GRAPH(h);
  if (!g)
    return leave(CUDA_ERROR_INVALID_VALUE);
  if (g->building)
    return leave(CUDA_ERROR_ILLEGAL_STATE);
  if (g->owner) /* a body belongs to its node (not observed: the loud answer) */
    return leave(CUDA_ERROR_INVALID_VALUE);
  graph_free(g);
  return leave(CUDA_SUCCESS);
}

static CUresult add_event_node(CUgraphNode *out, CUgraph hg, const CUgraphNode *deps,
                               const CUgraphEdgeData *data, size_t n, CUevent he,
                               CUgraphNodeType type) {
  if (!out)
    return CUDA_ERROR_INVALID_VALUE;
  fgraph *g = GET_GRAPH(hg);
  fevent *e = GET_EVENT(he);
  if (!g || !e)
    return CUDA_ERROR_INVALID_VALUE;
  fnode *node;
  CUresult r = graph_add(g, deps, data, n, type, &node);
  if (r != CUDA_SUCCESS)
    return r;
  node->ev = e->h;
  node->ev_serial = e->serial;
  *out = node->h;
  return CUDA_SUCCESS;
}

static CUresult CUDAAPI fk_GraphAddEventRecordNode(CUgraphNode *out, CUgraph g,
                                                   const CUgraphNode *deps, size_t n, CUevent e) {
  ENTER(GraphAddEventRecordNode);
  return leave(add_event_node(out, g, deps, NULL, n, e, CU_GRAPH_NODE_TYPE_EVENT_RECORD));
}

static CUresult CUDAAPI fk_GraphAddEventWaitNode(CUgraphNode *out, CUgraph g,
                                                 const CUgraphNode *deps, size_t n, CUevent e) {
  ENTER(GraphAddEventWaitNode);
  return leave(add_event_node(out, g, deps, NULL, n, e, CU_GRAPH_NODE_TYPE_WAIT_EVENT));
}

static CUresult add_plain_node(CUgraphNode *out, CUgraph hg, const CUgraphNode *deps,
                               const CUgraphEdgeData *data, size_t n, CUgraphNodeType type,
                               fnode **node_out) {
  if (!out)
    return CUDA_ERROR_INVALID_VALUE;
  fgraph *g = GET_GRAPH(hg);
  if (!g)
    return CUDA_ERROR_INVALID_VALUE;
  fnode *node;
  CUresult r = graph_add(g, deps, data, n, type, &node);
  if (r != CUDA_SUCCESS)
    return r;
  *out = node->h;
  if (node_out)
    *node_out = node;
  return CUDA_SUCCESS;
}

static CUresult CUDAAPI fk_GraphAddEmptyNode(CUgraphNode *out, CUgraph g, const CUgraphNode *deps,
                                             size_t n) {
  ENTER(GraphAddEmptyNode);
  return leave(add_plain_node(out, g, deps, NULL, n, CU_GRAPH_NODE_TYPE_EMPTY, NULL));
}

/* ---- fake device memory -------------------------------------------------------------------- */

static bool dev_range_ok(CUdeviceptr p, size_t bytes) {
  for (size_t i = 0; i < S.nallocs; i++) {
    const falloc *a = &S.allocs[i];
    if (p >= a->ptr && p - a->ptr <= a->size && bytes <= a->size - (p - a->ptr))
      return true;
  }
  return false;
}

static bool memset_params_ok(const CUDA_MEMSET_NODE_PARAMS *m) {
  if (m->elementSize != 1 && m->elementSize != 2 && m->elementSize != 4)
    return false;
  if (m->dst % m->elementSize)
    return false;
  if (m->width == 0 || m->height == 0)
    return true;
  size_t row = m->width * m->elementSize;
  size_t bytes = m->height == 1 ? row : m->pitch * (m->height - 1) + row;
  return (m->height == 1 || m->pitch >= row) && dev_range_ok(m->dst, bytes);
}

static CUresult CUDAAPI fk_GraphAddMemsetNode(CUgraphNode *out, CUgraph g, const CUgraphNode *deps,
                                              size_t n, const CUDA_MEMSET_NODE_PARAMS *p,
                                              CUcontext ctx) {
  ENTER(GraphAddMemsetNode);
  if (!p || !memset_params_ok(p) || !GET_CTX(ctx))
    return leave(CUDA_ERROR_INVALID_VALUE);
  return leave(add_plain_node(out, g, deps, NULL, n, CU_GRAPH_NODE_TYPE_MEMSET, NULL));
}

static CUresult CUDAAPI fk_GraphAddMemcpyNode(CUgraphNode *out, CUgraph g, const CUgraphNode *deps,
                                              size_t n, const CUDA_MEMCPY3D *p, CUcontext ctx) {
  ENTER(GraphAddMemcpyNode);
  if (!p || !GET_CTX(ctx))
    return leave(CUDA_ERROR_INVALID_VALUE);
  return leave(add_plain_node(out, g, deps, NULL, n, CU_GRAPH_NODE_TYPE_MEMCPY, NULL));
}

static bool all_zero(const void *p, size_t n) {
  const unsigned char *b = p;
  for (size_t i = 0; i < n; i++)
    if (b[i])
      return false;
  return true;
}

/* [R28 COND-BODY] A conditional node (IF: 1 or 2 bodies, WHILE: 1, SWITCH:
 * any > 0) with a handle made by cuGraphConditionalHandleCreate (any
 * non-zero value here) in a context: its bodies are new empty graphs that
 * the node owns (phGraph_out points at the node's array). */
static CUresult add_conditional_node(CUgraphNode *out, CUgraph hg, const CUgraphNode *deps,
                                     const CUgraphEdgeData *data, size_t n,
                                     CUDA_CONDITIONAL_NODE_PARAMS *c) {
  fnode *node = NULL;
  CUresult r;
  bool size_ok = (c->type == CU_GRAPH_COND_TYPE_IF && (c->size == 1 || c->size == 2)) ||
                 (c->type == CU_GRAPH_COND_TYPE_WHILE && c->size == 1) ||
                 (c->type == CU_GRAPH_COND_TYPE_SWITCH && c->size > 0 && c->size <= 64);
  if (!size_ok || c->handle == 0 || !GET_CTX(c->ctx))
    return CUDA_ERROR_INVALID_VALUE;
  r = add_plain_node(out, hg, deps, data, n, CU_GRAPH_NODE_TYPE_CONDITIONAL, &node);
  if (r != CUDA_SUCCESS)
    return r;
  node->nbodies = c->size;
  node->bodies = xcalloc(c->size, sizeof *node->bodies);
  node->body_handles = xcalloc(c->size, sizeof *node->body_handles);
  for (unsigned i = 0; i < c->size; i++) {
    node->bodies[i] = graph_new();
    node->bodies[i]->owner = node;
    node->body_handles[i] = node->bodies[i]->h;
  }
  c->phGraph_out = node->body_handles;
  return CUDA_SUCCESS;
}

static CUresult graph_add_node(CUgraphNode *out, CUgraph hg, const CUgraphNode *deps,
                               const CUgraphEdgeData *data, size_t n, CUgraphNodeParams *p) {
  if (!out || !p || !all_zero(p->reserved0, sizeof p->reserved0) || p->reserved2 != 0)
    return CUDA_ERROR_INVALID_VALUE;
  fnode *node = NULL;
  CUresult r;
  switch (p->type) {
  case CU_GRAPH_NODE_TYPE_EMPTY:
    return add_plain_node(out, hg, deps, data, n, CU_GRAPH_NODE_TYPE_EMPTY, NULL);
  case CU_GRAPH_NODE_TYPE_EVENT_RECORD:
    return add_event_node(out, hg, deps, data, n, p->eventRecord.event,
                          CU_GRAPH_NODE_TYPE_EVENT_RECORD);
  case CU_GRAPH_NODE_TYPE_WAIT_EVENT:
    return add_event_node(out, hg, deps, data, n, p->eventWait.event,
                          CU_GRAPH_NODE_TYPE_WAIT_EVENT);
  case CU_GRAPH_NODE_TYPE_MEMSET: {
    CUDA_MEMSET_NODE_PARAMS m;
    m.dst = p->memset.dst;
    m.pitch = p->memset.pitch;
    m.value = p->memset.value;
    m.elementSize = p->memset.elementSize;
    m.width = p->memset.width;
    m.height = p->memset.height;
    if (!memset_params_ok(&m) || !GET_CTX(p->memset.ctx))
      return CUDA_ERROR_INVALID_VALUE;
    return add_plain_node(out, hg, deps, data, n, CU_GRAPH_NODE_TYPE_MEMSET, NULL);
  }
  case CU_GRAPH_NODE_TYPE_MEMCPY:
    if (p->memcpy.flags != 0 || p->memcpy.reserved != 0 || !GET_CTX(p->memcpy.copyCtx))
      return CUDA_ERROR_INVALID_VALUE;
    return add_plain_node(out, hg, deps, data, n, CU_GRAPH_NODE_TYPE_MEMCPY, NULL);
  case CU_GRAPH_NODE_TYPE_CONDITIONAL:
    return add_conditional_node(out, hg, deps, data, n, &p->conditional);
  case CU_GRAPH_NODE_TYPE_HOST:
    if (!p->host.fn)
      return CUDA_ERROR_INVALID_VALUE;
    r = add_plain_node(out, hg, deps, data, n, CU_GRAPH_NODE_TYPE_HOST, &node);
    if (r == CUDA_SUCCESS) {
      node->fn = p->host.fn;
      node->ud = p->host.userData;
    }
    return r;
  default:
    return CUDA_ERROR_NOT_SUPPORTED;
  }
}

static CUresult CUDAAPI fk_GraphAddNode(CUgraphNode *out, CUgraph g, const CUgraphNode *deps,
                                        const CUgraphEdgeData *data, size_t n,
                                        CUgraphNodeParams *p) {
  ENTER(GraphAddNode);
  return leave(graph_add_node(out, g, deps, data, n, p));
}

static CUresult graph_add_deps(CUgraph hg, const CUgraphNode *from, const CUgraphNode *to,
                               const CUgraphEdgeData *data, size_t n) {
  fgraph *g = GET_GRAPH(hg);
  if (!g)
    return CUDA_ERROR_INVALID_VALUE;
  if (n == 0)
    return CUDA_SUCCESS;
  if (!from || !to)
    return CUDA_ERROR_INVALID_VALUE;
  for (size_t i = 0; i < n; i++) {
    fnode *a = GET_NODE(from[i]), *b = GET_NODE(to[i]);
    if (!a || !b || a->g != g || b->g != g || a == b || node_has_in(b, a))
      return CUDA_ERROR_INVALID_VALUE;
    if (data && !edge_valid(&data[i], a))
      return CUDA_ERROR_INVALID_VALUE;
    for (size_t j = 0; j < i; j++)
      if (from[j] == from[i] && to[j] == to[i])
        return CUDA_ERROR_INVALID_VALUE;
  }
  for (size_t i = 0; i < n; i++) {
    CUgraphEdgeData e = {0};
    if (data)
      e = data[i];
    node_add_in(GET_NODE(to[i]), GET_NODE(from[i]), e);
  }
  return CUDA_SUCCESS;
}

static CUresult CUDAAPI fk_GraphAddDependencies(CUgraph g, const CUgraphNode *from,
                                                const CUgraphNode *to, const CUgraphEdgeData *data,
                                                size_t n) {
  ENTER(GraphAddDependencies);
  return leave(graph_add_deps(g, from, to, data, n));
}

static CUresult CUDAAPI fk_GraphNodeGetType(CUgraphNode h, CUgraphNodeType *type) {
  ENTER(GraphNodeGetType);
  fnode *n = GET_NODE(h);
  if (!n || !type)
    return leave(CUDA_ERROR_INVALID_VALUE);
  *type = n->type;
  return leave(CUDA_SUCCESS);
}

static CUresult CUDAAPI fk_GraphEventRecordNodeGetEvent(CUgraphNode h, CUevent *event_out) {
  ENTER(GraphEventRecordNodeGetEvent);
  fnode *n = GET_NODE(h);
  if (!n || !event_out || n->type != CU_GRAPH_NODE_TYPE_EVENT_RECORD)
    return leave(CUDA_ERROR_INVALID_VALUE);
  *event_out = n->ev;
  return leave(CUDA_SUCCESS);
}

static CUresult CUDAAPI fk_GraphGetNodes(CUgraph hg, CUgraphNode *nodes, size_t *num) {
  ENTER(GraphGetNodes);
  fgraph *g = GET_GRAPH(hg);
  if (!g || !num)
    return leave(CUDA_ERROR_INVALID_VALUE);
  if (!nodes) {
    *num = g->n;
    return leave(CUDA_SUCCESS);
  }
  for (size_t i = 0; i < *num; i++)
    nodes[i] = i < g->n ? g->nodes[i]->h : NULL;
  if (*num > g->n)
    *num = g->n;
  return leave(CUDA_SUCCESS);
}

size_t graph_edge_count(const fgraph *g) {
  size_t total = 0;
  for (size_t i = 0; i < g->n; i++)
    total += g->nodes[i]->nin;
  return total;
}

static CUresult graph_get_edges(CUgraph hg, CUgraphNode *from, CUgraphNode *to,
                                CUgraphEdgeData *data, size_t *num) {
  fgraph *g = GET_GRAPH(hg);
  if (!g || !num || (!from != !to) || (data && !from))
    return CUDA_ERROR_INVALID_VALUE;
  size_t total = graph_edge_count(g);
  if (!from) {
    *num = total;
    return CUDA_SUCCESS;
  }
  size_t want = *num, k = 0;
  if (!data) {
    for (size_t i = 0; i < g->n && k < want; i++)
      for (size_t j = 0; j < g->nodes[i]->nin && k < want; j++, k++)
        if (!edge_is_default(&g->nodes[i]->in[j].data))
          return CUDA_ERROR_LOSSY_QUERY;
  }
  k = 0;
  for (size_t i = 0; i < g->n; i++) {
    for (size_t j = 0; j < g->nodes[i]->nin && k < want; j++, k++) {
      from[k] = g->nodes[i]->in[j].node->h;
      to[k] = g->nodes[i]->h;
      if (data)
        data[k] = g->nodes[i]->in[j].data;
    }
  }
  for (; k < want; k++) {
    from[k] = NULL;
    to[k] = NULL;
    if (data)
      memset(&data[k], 0, sizeof data[k]);
  }
  if (want > total)
    *num = total;
  return CUDA_SUCCESS;
}

static CUresult CUDAAPI fk_GraphGetEdges(CUgraph g, CUgraphNode *from, CUgraphNode *to,
                                         CUgraphEdgeData *data, size_t *num) {
  ENTER(GraphGetEdges);
  return leave(graph_get_edges(g, from, to, data, num));
}

/* ---- user objects --------------------------------------------------------------------------- */

static CUresult CUDAAPI fk_UserObjectCreate(CUuserObject *out, void *ptr, CUhostFn fn,
                                            unsigned int initial, unsigned int flags) {
  ENTER(UserObjectCreate);
  if (!out || !fn || initial == 0 || flags != CU_USER_OBJECT_NO_DESTRUCTOR_SYNC)
    return leave(CUDA_ERROR_INVALID_VALUE);
  fuobj *o = xcalloc(1, sizeof *o);
  o->ptr = ptr;
  o->fn = fn;
  o->refs = initial;
  o->h = slot_new(FK_UOBJ, o);
  S.live_uobjs++;
  *out = o->h;
  return leave(CUDA_SUCCESS);
}

static CUresult CUDAAPI fk_UserObjectRelease(CUuserObject h, unsigned int n) {
  ENTER(UserObjectRelease);
  fuobj *o = GET_UOBJ(h);
  if (!o || n == 0 || n > o->refs)
    return leave(CUDA_ERROR_INVALID_VALUE);
  uobj_release(o, n);
  return leave(CUDA_SUCCESS);
}

static CUresult CUDAAPI fk_GraphRetainUserObject(CUgraph hg, CUuserObject h, unsigned int n,
                                                 unsigned int flags) {
  ENTER(GraphRetainUserObject);
  fgraph *g = GET_GRAPH(hg);
  fuobj *o = GET_UOBJ(h);
  if (!g || !o || n == 0 || (flags != 0 && flags != CU_GRAPH_USER_OBJECT_MOVE))
    return leave(CUDA_ERROR_INVALID_VALUE);
  if (flags == CU_GRAPH_USER_OBJECT_MOVE && n > o->refs)
    return leave(CUDA_ERROR_INVALID_VALUE);
  if (flags == 0)
    o->refs += n;
  urefs_add(&g->urefs, &g->nu, &g->capu, o, n);
  return leave(CUDA_SUCCESS);
}

/* ---- executables and launches ---------------------------------------------------------------- */

/* [R28 COND-BODY] Every node of a conditional body (at any depth) is a
 * kernel, empty, memset, memcpy or conditional node (cuda.h's list also has
 * child graphs, which the fake does not make); an event-record or
 * event-wait node there fails the parent's instantiation with
 * CUDA_ERROR_INVALID_VALUE, though it was accepted when it was added. */
static bool bodies_admissible(const fgraph *g, bool in_body) {
  for (size_t i = 0; i < g->n; i++) {
    const fnode *n = g->nodes[i];
    switch (n->type) {
    case CU_GRAPH_NODE_TYPE_KERNEL:
    case CU_GRAPH_NODE_TYPE_EMPTY:
    case CU_GRAPH_NODE_TYPE_MEMSET:
    case CU_GRAPH_NODE_TYPE_MEMCPY:
      break;
    case CU_GRAPH_NODE_TYPE_GRAPH:
      if (in_body && n->child && !bodies_admissible(n->child, true))
        return false;
      break;
    case CU_GRAPH_NODE_TYPE_CONDITIONAL:
      for (unsigned b = 0; b < n->nbodies; b++)
        if (!bodies_admissible(n->bodies[b], true))
          return false;
      break;
    default:
      if (in_body)
        return false;
      break;
    }
  }
  return true;
}

/* An executable's items: g's nodes, a child graph's nodes in its node's
 * place (its event and host nodes act at launch like the parent's own). */
static void exec_collect(fexec *x, size_t *cap, const fgraph *g) {
  for (size_t i = 0; i < g->n; i++) {
    const fnode *n = g->nodes[i];
    fexec_item it;
    memset(&it, 0, sizeof it);
    it.type = n->type;
    it.node = n->h;
    it.ev = n->ev;
    it.ev_serial = n->ev_serial;
    it.fn = n->fn;
    it.ud = n->ud;
    if ((n->type == CU_GRAPH_NODE_TYPE_EVENT_RECORD || n->type == CU_GRAPH_NODE_TYPE_WAIT_EVENT) &&
        !node_event_alive(n->ev, n->ev_serial))
      S.dangling++;
    VEC_PUSH(x->items, x->n, *cap, it);
    if (n->child)
      exec_collect(x, cap, n->child);
  }
}

/* Does g hold, at any depth of child graphs, a conditional node? */
static bool holds_conditional(const fgraph *g) {
  for (size_t i = 0; i < g->n; i++)
    if (g->nodes[i]->type == CU_GRAPH_NODE_TYPE_CONDITIONAL ||
        (g->nodes[i]->child && holds_conditional(g->nodes[i]->child)))
      return true;
  return false;
}

/* A copy of g's nodes and edges (labels, events, host functions), as a
 * child-graph node keeps (cuGraphAddChildGraphNode clones the graph). */
static fgraph *graph_clone(const fgraph *g) {
  fgraph *c = graph_new();
  for (size_t i = 0; i < g->n; i++) {
    const fnode *n = g->nodes[i];
    fnode *m = node_new(c, n->type);
    m->ev = n->ev;
    m->ev_serial = n->ev_serial;
    m->fn = n->fn;
    m->ud = n->ud;
    node_set_label(m, n->label);
    if (n->child)
      m->child = graph_clone(n->child);
    for (size_t k = 0; k < n->nin; k++)
      for (size_t j = 0; j < g->n; j++)
        if (g->nodes[j] == n->in[k].node)
          node_add_in(m, c->nodes[j], n->in[k].data);
  }
  return c;
}

/* A child-graph node: a copy of `child` (the caller may destroy it after);
 * a child holding conditional nodes: INVALID_VALUE (cuda.h: "If childGraph
 * contains allocation nodes, free nodes, or conditional nodes, this call
 * will return an error"; the fake has no memory nodes), as is a graph an
 * active capture builds (not observed). */
static CUresult CUDAAPI fk_GraphAddChildGraphNode(CUgraphNode *out, CUgraph hg,
                                                  const CUgraphNode *deps, size_t n,
                                                  CUgraph hchild) {
  ENTER(GraphAddChildGraphNode);
  fgraph *child = GET_GRAPH(hchild);
  fnode *node = NULL;
  CUresult r;
  if (!out || !child || child->building || hchild == hg || holds_conditional(child))
    return leave(CUDA_ERROR_INVALID_VALUE);
  r = add_plain_node(out, hg, deps, NULL, n, CU_GRAPH_NODE_TYPE_GRAPH, &node);
  if (r == CUDA_SUCCESS)
    node->child = graph_clone(child);
  return leave(r);
}

/* The graph a child-graph node holds (its copy, owned by the node). */
static CUresult CUDAAPI fk_GraphChildGraphNodeGetGraph(CUgraphNode h, CUgraph *out) {
  ENTER(GraphChildGraphNodeGetGraph);
  fnode *n = GET_NODE(h);
  if (!n || !out || n->type != CU_GRAPH_NODE_TYPE_GRAPH || !n->child)
    return leave(CUDA_ERROR_INVALID_VALUE);
  *out = n->child->h;
  return leave(CUDA_SUCCESS);
}

/* [R31 EXEC-UPDATE] cuGraphExecUpdate: the executable takes the node
 * parameters (events, host functions) of a graph whose nodes, flattened
 * through child graphs, have the same count and types in the same order
 * (edges are not compared: a simplification), else
 * CU_GRAPH_EXEC_UPDATE_ERROR_TOPOLOGY_CHANGED (count) or _NODE_TYPE_CHANGED
 * and CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE. User objects: the executable
 * keeps the references it took at instantiation and takes none of the new
 * graph's (the fake's guess, the harsher one: checked by gpu_rules). */
static CUresult CUDAAPI fk_GraphExecUpdate(CUgraphExec hx, CUgraph hg,
                                           CUgraphExecUpdateResultInfo *info) {
  ENTER(GraphExecUpdate);
  fexec *x = GET_EXEC(hx);
  fgraph *g = GET_GRAPH(hg);
  fexec tmp;
  size_t cap = 0;
  if (!x || !g || !info || g->building)
    return leave(CUDA_ERROR_INVALID_VALUE);
  memset(info, 0, sizeof *info);
  memset(&tmp, 0, sizeof tmp);
  exec_collect(&tmp, &cap, g);
  info->result = CU_GRAPH_EXEC_UPDATE_SUCCESS;
  if (tmp.n != x->n) {
    info->result = CU_GRAPH_EXEC_UPDATE_ERROR_TOPOLOGY_CHANGED;
  } else {
    for (size_t i = 0; i < tmp.n; i++)
      if (tmp.items[i].type != x->items[i].type) {
        info->result = CU_GRAPH_EXEC_UPDATE_ERROR_NODE_TYPE_CHANGED;
        info->errorNode = tmp.items[i].node;
        break;
      }
  }
  if (info->result != CU_GRAPH_EXEC_UPDATE_SUCCESS) {
    free(tmp.items);
    return leave(CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE);
  }
  free(x->items);
  x->items = tmp.items;
  return leave(CUDA_SUCCESS);
}

static CUresult CUDAAPI fk_GraphConditionalHandleCreate(CUgraphConditionalHandle *out, CUgraph hg,
                                                        CUcontext hc, unsigned int value,
                                                        unsigned int flags) {
  ENTER(GraphConditionalHandleCreate);
  static CUgraphConditionalHandle next = 1;
  (void)value;
  if (!out || !GET_GRAPH(hg) || !GET_CTX(hc) || (flags & ~CU_GRAPH_COND_ASSIGN_DEFAULT))
    return leave(CUDA_ERROR_INVALID_VALUE);
  *out = next++;
  return leave(CUDA_SUCCESS);
}

static CUresult CUDAAPI fk_GraphInstantiateWithFlags(CUgraphExec *px, CUgraph hg,
                                                     unsigned long long flags) {
  ENTER(GraphInstantiateWithFlags);
  fgraph *g = GET_GRAPH(hg);
  if (!px || !g)
    return leave(CUDA_ERROR_INVALID_VALUE);
  if (flags & ~(unsigned long long)(CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH |
                                    CUDA_GRAPH_INSTANTIATE_FLAG_USE_NODE_PRIORITY))
    return leave(CUDA_ERROR_NOT_SUPPORTED);
  if (g->building)
    return leave(CUDA_ERROR_ILLEGAL_STATE);
  if (!bodies_admissible(g, false))
    return leave(CUDA_ERROR_INVALID_VALUE);
  fexec *x = xcalloc(1, sizeof *x);
  size_t capi = 0;
  exec_collect(x, &capi, g);
  size_t capu = 0;
  for (size_t i = 0; i < g->nu; i++) {
    g->urefs[i].obj->refs += g->urefs[i].count;
    urefs_add(&x->urefs, &x->nu, &capu, g->urefs[i].obj, g->urefs[i].count);
  }
  x->h = slot_new(FK_EXEC, x);
  S.live_execs++;
  *px = x->h;
  return leave(CUDA_SUCCESS);
}

static CUresult CUDAAPI fk_GraphExecDestroy(CUgraphExec h) {
  ENTER(GraphExecDestroy);
  fexec *x = GET_EXEC(h);
  if (!x)
    return leave(CUDA_ERROR_INVALID_VALUE);
  exec_free(x);
  return leave(CUDA_SUCCESS);
}

static CUresult graph_launch(CUgraphExec hx, CUstream hs) {
  fexec *x = GET_EXEC(hx);
  if (!x)
    return CUDA_ERROR_INVALID_VALUE;
  fstream *s;
  CUresult r = get_stream(hs, true, &s);
  if (r != CUDA_SUCCESS)
    return r;
  r = stream_enqueue_check(s);
  if (r != CUDA_SUCCESS)
    return r;
  if (s->cap)
    return CUDA_ERROR_NOT_SUPPORTED;
  uint64_t *extra = x->n ? xcalloc(x->n, sizeof *extra) : NULL;
  size_t nextra = 0;
  for (size_t i = 0; i < x->n; i++) {
    if (x->items[i].type != CU_GRAPH_NODE_TYPE_WAIT_EVENT)
      continue;
    fevent *e = node_event_alive(x->items[i].ev, x->items[i].ev_serial);
    if (!e)
      S.dangling++;
    else if (e->state == EV_EAGER)
      extra[nextra++] = e->op;
  }
  uint64_t op = op_new(s, extra, nextra);
  free(extra);
  for (size_t i = 0; i < x->n; i++) {
    const fexec_item *it = &x->items[i];
    if (it->type == CU_GRAPH_NODE_TYPE_EVENT_RECORD) {
      fevent *e = node_event_alive(it->ev, it->ev_serial);
      if (!e)
        S.dangling++;
      else
        event_set_eager(e, op);
    } else if (it->type == CU_GRAPH_NODE_TYPE_HOST) {
      hostfn_queue(it->fn, it->ud);
    }
  }
  return CUDA_SUCCESS;
}

static CUresult CUDAAPI fk_GraphLaunch(CUgraphExec x, CUstream s) {
  ENTER(GraphLaunch);
  return leave(graph_launch(x, s));
}

static CUresult CUDAAPI fk_GraphExecMemsetNodeSetParams(CUgraphExec hx, CUgraphNode node,
                                                        const CUDA_MEMSET_NODE_PARAMS *p,
                                                        CUcontext ctx) {
  ENTER(GraphExecMemsetNodeSetParams);
  fexec *x = GET_EXEC(hx);
  if (!x || !p || !memset_params_ok(p) || !GET_CTX(ctx))
    return leave(CUDA_ERROR_INVALID_VALUE);
  for (size_t i = 0; i < x->n; i++)
    if (x->items[i].node == node && x->items[i].type == CU_GRAPH_NODE_TYPE_MEMSET)
      return leave(CUDA_SUCCESS);
  return leave(CUDA_ERROR_INVALID_VALUE);
}

/* ---- memory ------------------------------------------------------------------------------------
 */

static CUresult CUDAAPI fk_MemAlloc(CUdeviceptr *p, size_t bytes) {
  ENTER(MemAlloc);
  if (!p || bytes == 0)
    return leave(CUDA_ERROR_INVALID_VALUE);
  fctx *c = cur_ctx();
  if (!c)
    return leave(CUDA_ERROR_INVALID_CONTEXT);
  if (unsafe_call_prohibited())
    return leave(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
  if (S.next_devptr == 0)
    S.next_devptr = FAKE_DEVPTR_BASE;
  falloc a = {S.next_devptr, bytes, c};
  S.next_devptr += ((CUdeviceptr)bytes + 511u) & ~(CUdeviceptr)511u;
  VEC_PUSH(S.allocs, S.nallocs, S.capallocs, a);
  *p = a.ptr;
  return leave(CUDA_SUCCESS);
}

static CUresult CUDAAPI fk_MemFree(CUdeviceptr p) {
  ENTER(MemFree);
  for (size_t i = 0; i < S.nallocs; i++) {
    if (S.allocs[i].ptr == p) {
      S.allocs[i] = S.allocs[--S.nallocs];
      return leave(CUDA_SUCCESS);
    }
  }
  return leave(CUDA_ERROR_INVALID_VALUE);
}

static CUresult async_mem_op(CUstream hs, CUgraphNodeType type, uint64_t *op) {
  fstream *s;
  CUresult r = get_stream(hs, true, &s);
  if (r != CUDA_SUCCESS)
    return r;
  return enqueue(s, type, NULL, op, NULL);
}

static CUresult CUDAAPI fk_MemsetD32Async(CUdeviceptr dst, unsigned int v, size_t n, CUstream s) {
  ENTER(MemsetD32Async);
  (void)v;
  if ((dst & 3u) || !dev_range_ok(dst, n * 4))
    return leave(CUDA_ERROR_INVALID_VALUE);
  return leave(async_mem_op(s, CU_GRAPH_NODE_TYPE_MEMSET, NULL));
}

static CUresult CUDAAPI fk_MemcpyDtoDAsync(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s) {
  ENTER(MemcpyDtoDAsync);
  if (!dev_range_ok(dst, n) || !dev_range_ok(src, n))
    return leave(CUDA_ERROR_INVALID_VALUE);
  return leave(async_mem_op(s, CU_GRAPH_NODE_TYPE_MEMCPY, NULL));
}

static CUresult CUDAAPI fk_MemcpyDtoHAsync(void *dst, CUdeviceptr src, size_t n, CUstream s) {
  ENTER(MemcpyDtoHAsync);
  if ((n && !dst) || !dev_range_ok(src, n))
    return leave(CUDA_ERROR_INVALID_VALUE);
  uint64_t op = 0;
  CUresult r = async_mem_op(s, CU_GRAPH_NODE_TYPE_MEMCPY, &op);
  if (r == CUDA_SUCCESS && op && n)
    memset(dst, 0, n);
  return leave(r);
}

static CUresult sync_copy(void *dst_host, const void *src_host, CUdeviceptr dev, size_t n) {
  if ((n && !dst_host && !src_host) || !dev_range_ok(dev, n))
    return CUDA_ERROR_INVALID_VALUE;
  fctx *c = cur_ctx();
  if (!c)
    return CUDA_ERROR_INVALID_CONTEXT;
  if (unsafe_call_prohibited())
    return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  if (legacy_conflict(c, true))
    return CUDA_ERROR_STREAM_CAPTURE_IMPLICIT;
  op_new(c->legacy, NULL, 0);
  if (dst_host && n)
    memset(dst_host, 0, n);
  return CUDA_SUCCESS;
}

static CUresult CUDAAPI fk_MemcpyHtoD(CUdeviceptr dst, const void *src, size_t n) {
  ENTER(MemcpyHtoD);
  return leave(sync_copy(NULL, src, dst, n));
}

static CUresult CUDAAPI fk_MemcpyDtoH(void *dst, CUdeviceptr src, size_t n) {
  ENTER(MemcpyDtoH);
  return leave(sync_copy(dst, NULL, src, n));
}

/* ---- the table ------------------------------------------------------------------------------- */

/* Fills the table for the current version. Writes only when something
 * changed, so threads reading the table while a test asks for it again (or
 * resets) do not race with identical writes. */
void table_build(void) {
  dlsync__driver t;
  memset(&t, 0, sizeof t);
#define FAKE_TABLE_SET(name, pfn, ver, need) t.name = (ver) <= S.version ? fk_##name : NULL;
  DLSYNC__DRIVER_ENTRIES(FAKE_TABLE_SET)
#undef FAKE_TABLE_SET
  t.version = S.version;
  t.origin = "fake";
  if (memcmp(&t, &g_table, sizeof t) != 0)
    memcpy(&g_table, &t, sizeof t);
}
