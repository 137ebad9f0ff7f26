/* SPDX-License-Identifier: Apache-2.0 */
/* dlsync private: the CUDA driver table. Never installed.
 *
 * This is the only place that names libcuda's entry points. The library loads
 * libcuda.so.1 with dlopen at run time and fills one dlsync__driver with
 * cuGetProcAddress, each entry at the ABI version pinned in the list below
 * (the PFN_*_v<version> typedefs of cudaTypedefs.h). Tests hand a context a
 * table of their own (tests/fake/).
 *
 * Fields are named after the driver function without its "cu" prefix
 * (d->StreamWaitEvent is cuStreamWaitEvent) because cuda.h #defines many of the
 * plain names to versioned ones.
 */
#ifndef DLSYNC_PRIVATE_DRIVER_H
#define DLSYNC_PRIVATE_DRIVER_H

#include <cuda.h>
#include <cudaTypedefs.h>

#include "base/base.h"
#include "dlsync/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* What an entry is needed for (tests/test_context.c checks the first and the
 * last: a table with only the CORE, CAPTURE and OPTIONAL entries makes a
 * working context).
 *   CORE      called by the library outside the capture-aware paths; a
 *             context cannot be created without every one.
 *   CAPTURE   called by the capture-aware paths; the exchange fails with
 *             DLSYNC_ERROR_DRIVER_TOO_OLD naming the entry when one is missing.
 *   OPTIONAL  called when present: a feature reported by capabilities or
 *             refused without it (capture into a graph, dlsync_graph_launch),
 *             or a cheaper path (the release path's cuStreamGetId and
 *             cuEventQuery).
 *   SUPPORT   never called by the library, which does not load them
 *             (dlsync__driver_load leaves them NULL): the GPU tests, bench and
 *             the fake's tests call them, through dlsync__driver_load_all. */
enum {
  DLSYNC__NEED_CORE = 0,
  DLSYNC__NEED_CAPTURE = 1,
  DLSYNC__NEED_OPTIONAL = 2,
  DLSYNC__NEED_SUPPORT = 3
};

/* X(field, PFN type, pinned version, need) */
#define DLSYNC__DRIVER_ENTRIES(X)                                                               \
  X(Init, PFN_cuInit_v2000, 2000, DLSYNC__NEED_CORE)                                            \
  X(DriverGetVersion, PFN_cuDriverGetVersion_v2020, 2020, DLSYNC__NEED_CORE)                    \
  X(GetErrorName, PFN_cuGetErrorName_v6000, 6000, DLSYNC__NEED_CORE)                            \
  X(GetErrorString, PFN_cuGetErrorString_v6000, 6000, DLSYNC__NEED_SUPPORT)                     \
  X(DeviceGetCount, PFN_cuDeviceGetCount_v2000, 2000, DLSYNC__NEED_CORE)                        \
  X(DeviceGet, PFN_cuDeviceGet_v2000, 2000, DLSYNC__NEED_CORE)                                  \
  X(DeviceGetName, PFN_cuDeviceGetName_v2000, 2000, DLSYNC__NEED_CORE)                          \
  X(DeviceGetAttribute, PFN_cuDeviceGetAttribute_v2000, 2000, DLSYNC__NEED_CORE)                \
  X(DeviceTotalMem, PFN_cuDeviceTotalMem_v3020, 3020, DLSYNC__NEED_CORE)                        \
  X(DeviceGetPCIBusId, PFN_cuDeviceGetPCIBusId_v4010, 4010, DLSYNC__NEED_CORE)                  \
  X(DeviceCanAccessPeer, PFN_cuDeviceCanAccessPeer_v4000, 4000, DLSYNC__NEED_SUPPORT)           \
  X(DevicePrimaryCtxRetain, PFN_cuDevicePrimaryCtxRetain_v7000, 7000, DLSYNC__NEED_SUPPORT)     \
  X(DevicePrimaryCtxRelease, PFN_cuDevicePrimaryCtxRelease_v11000, 11000, DLSYNC__NEED_SUPPORT) \
  X(CtxPushCurrent, PFN_cuCtxPushCurrent_v4000, 4000, DLSYNC__NEED_CORE)                        \
  X(CtxPopCurrent, PFN_cuCtxPopCurrent_v4000, 4000, DLSYNC__NEED_CORE)                          \
  X(CtxGetCurrent, PFN_cuCtxGetCurrent_v4000, 4000, DLSYNC__NEED_CORE)                          \
  X(CtxGetDevice, PFN_cuCtxGetDevice_v2000, 2000, DLSYNC__NEED_CORE)                            \
  X(CtxGetId, PFN_cuCtxGetId_v12000, 12000, DLSYNC__NEED_SUPPORT)                               \
  X(StreamGetCtx, PFN_cuStreamGetCtx_v9020, 9020, DLSYNC__NEED_CORE)                            \
  X(StreamGetId, PFN_cuStreamGetId_v12000, 12000, DLSYNC__NEED_OPTIONAL)                        \
  X(StreamGetFlags, PFN_cuStreamGetFlags_v5050, 5050, DLSYNC__NEED_SUPPORT)                     \
  X(StreamWaitEvent, PFN_cuStreamWaitEvent_v3020, 3020, DLSYNC__NEED_CORE)                      \
  X(EventCreate, PFN_cuEventCreate_v2000, 2000, DLSYNC__NEED_CORE)                              \
  X(EventDestroy, PFN_cuEventDestroy_v4000, 4000, DLSYNC__NEED_CORE)                            \
  X(EventRecord, PFN_cuEventRecord_v2000, 2000, DLSYNC__NEED_CORE)                              \
  X(EventRecordWithFlags, PFN_cuEventRecordWithFlags_v11010, 11010, DLSYNC__NEED_CAPTURE)       \
  X(EventQuery, PFN_cuEventQuery_v2000, 2000, DLSYNC__NEED_OPTIONAL)                            \
  X(EventSynchronize, PFN_cuEventSynchronize_v2000, 2000, DLSYNC__NEED_CORE)                    \
  X(LaunchHostFunc, PFN_cuLaunchHostFunc_v10000, 10000, DLSYNC__NEED_SUPPORT)                   \
  X(ThreadExchangeStreamCaptureMode, PFN_cuThreadExchangeStreamCaptureMode_v10010, 10010,       \
    DLSYNC__NEED_CORE)                                                                          \
  X(GraphAddEventRecordNode, PFN_cuGraphAddEventRecordNode_v11010, 11010, DLSYNC__NEED_CORE)    \
  X(GraphAddEventWaitNode, PFN_cuGraphAddEventWaitNode_v11010, 11010, DLSYNC__NEED_CORE)        \
  X(GraphAddEmptyNode, PFN_cuGraphAddEmptyNode_v10000, 10000, DLSYNC__NEED_SUPPORT)             \
  X(GraphNodeGetType, PFN_cuGraphNodeGetType_v10000, 10000, DLSYNC__NEED_CORE)                  \
  X(GraphEventRecordNodeGetEvent, PFN_cuGraphEventRecordNodeGetEvent_v11010, 11010,             \
    DLSYNC__NEED_CORE)                                                                          \
  X(GraphGetNodes, PFN_cuGraphGetNodes_v10000, 10000, DLSYNC__NEED_CORE)                        \
  X(UserObjectCreate, PFN_cuUserObjectCreate_v11030, 11030, DLSYNC__NEED_CORE)                  \
  X(UserObjectRelease, PFN_cuUserObjectRelease_v11030, 11030, DLSYNC__NEED_CORE)                \
  X(GraphRetainUserObject, PFN_cuGraphRetainUserObject_v11030, 11030, DLSYNC__NEED_CORE)        \
  X(StreamIsCapturing, PFN_cuStreamIsCapturing_v10000, 10000, DLSYNC__NEED_CORE)                \
  X(StreamGetCaptureInfo, PFN_cuStreamGetCaptureInfo_v12030, 12030, DLSYNC__NEED_CAPTURE)       \
  X(StreamUpdateCaptureDependencies, PFN_cuStreamUpdateCaptureDependencies_v12030, 12030,       \
    DLSYNC__NEED_CAPTURE)                                                                       \
  X(GraphAddNode, PFN_cuGraphAddNode_v12030, 12030, DLSYNC__NEED_CAPTURE)                       \
  X(GraphAddDependencies, PFN_cuGraphAddDependencies_v12030, 12030, DLSYNC__NEED_OPTIONAL)      \
  X(GraphGetEdges, PFN_cuGraphGetEdges_v12030, 12030, DLSYNC__NEED_SUPPORT)                     \
  X(StreamBeginCaptureToGraph, PFN_cuStreamBeginCaptureToGraph_v12030, 12030,                   \
    DLSYNC__NEED_OPTIONAL)                                                                      \
  X(StreamGetDevice, PFN_cuStreamGetDevice_v12080, 12080, DLSYNC__NEED_SUPPORT)                 \
  X(StreamCreate, PFN_cuStreamCreate_v2000, 2000, DLSYNC__NEED_SUPPORT)                         \
  X(StreamDestroy, PFN_cuStreamDestroy_v4000, 4000, DLSYNC__NEED_SUPPORT)                       \
  X(StreamBeginCapture, PFN_cuStreamBeginCapture_v10010, 10010, DLSYNC__NEED_SUPPORT)           \
  X(StreamEndCapture, PFN_cuStreamEndCapture_v10000, 10000, DLSYNC__NEED_SUPPORT)               \
  X(StreamSynchronize, PFN_cuStreamSynchronize_v2000, 2000, DLSYNC__NEED_SUPPORT)               \
  X(StreamQuery, PFN_cuStreamQuery_v2000, 2000, DLSYNC__NEED_SUPPORT)                           \
  X(CtxSynchronize, PFN_cuCtxSynchronize_v2000, 2000, DLSYNC__NEED_SUPPORT)                     \
  X(MemAlloc, PFN_cuMemAlloc_v3020, 3020, DLSYNC__NEED_SUPPORT)                                 \
  X(MemFree, PFN_cuMemFree_v3020, 3020, DLSYNC__NEED_SUPPORT)                                   \
  X(MemsetD32Async, PFN_cuMemsetD32Async_v3020, 3020, DLSYNC__NEED_SUPPORT)                     \
  X(MemcpyHtoD, PFN_cuMemcpyHtoD_v3020, 3020, DLSYNC__NEED_SUPPORT)                             \
  X(MemcpyDtoH, PFN_cuMemcpyDtoH_v3020, 3020, DLSYNC__NEED_SUPPORT)                             \
  X(MemcpyDtoHAsync, PFN_cuMemcpyDtoHAsync_v3020, 3020, DLSYNC__NEED_SUPPORT)                   \
  X(MemcpyDtoDAsync, PFN_cuMemcpyDtoDAsync_v3020, 3020, DLSYNC__NEED_SUPPORT)                   \
  X(EventElapsedTime, PFN_cuEventElapsedTime_v2000, 2000, DLSYNC__NEED_SUPPORT)                 \
  X(GraphCreate, PFN_cuGraphCreate_v10000, 10000, DLSYNC__NEED_SUPPORT)                         \
  X(GraphDestroy, PFN_cuGraphDestroy_v10000, 10000, DLSYNC__NEED_SUPPORT)                       \
  X(GraphAddMemsetNode, PFN_cuGraphAddMemsetNode_v10000, 10000, DLSYNC__NEED_SUPPORT)           \
  X(GraphAddMemcpyNode, PFN_cuGraphAddMemcpyNode_v10000, 10000, DLSYNC__NEED_SUPPORT)           \
  X(GraphInstantiateWithFlags, PFN_cuGraphInstantiateWithFlags_v11040, 11040,                   \
    DLSYNC__NEED_SUPPORT)                                                                       \
  X(GraphExecDestroy, PFN_cuGraphExecDestroy_v10000, 10000, DLSYNC__NEED_SUPPORT)               \
  X(GraphLaunch, PFN_cuGraphLaunch_v10000, 10000, DLSYNC__NEED_OPTIONAL)                        \
  X(GraphExecMemsetNodeSetParams, PFN_cuGraphExecMemsetNodeSetParams_v10020, 10020,             \
    DLSYNC__NEED_SUPPORT)                                                                       \
  X(GraphConditionalHandleCreate, PFN_cuGraphConditionalHandleCreate_v12030, 12030,             \
    DLSYNC__NEED_SUPPORT)                                                                       \
  X(GraphAddChildGraphNode, PFN_cuGraphAddChildGraphNode_v10000, 10000, DLSYNC__NEED_OPTIONAL)  \
  X(GraphChildGraphNodeGetGraph, PFN_cuGraphChildGraphNodeGetGraph_v10000, 10000,               \
    DLSYNC__NEED_OPTIONAL)                                                                      \
  X(GraphExecUpdate, PFN_cuGraphExecUpdate_v12000, 12000, DLSYNC__NEED_SUPPORT)

typedef struct dlsync__driver {
#define DLSYNC__DRIVER_FIELD(name, pfn, ver, need) pfn name;
  DLSYNC__DRIVER_ENTRIES(DLSYNC__DRIVER_FIELD)
#undef DLSYNC__DRIVER_FIELD
  int version;        /* cuDriverGetVersion, e.g. 13000 */
  const char *origin; /* "libcuda.so.1" or the fake's name, for messages */
} dlsync__driver;

/* Number of entries, and a name/version/need for entry i, in list order. */
enum {
#define DLSYNC__DRIVER_COUNT_ONE(name, pfn, ver, need) DLSYNC__DRIVER_INDEX_##name,
  DLSYNC__DRIVER_ENTRIES(DLSYNC__DRIVER_COUNT_ONE)
#undef DLSYNC__DRIVER_COUNT_ONE
      DLSYNC__DRIVER_ENTRY_COUNT
};

typedef struct dlsync__driver_entry_info {
  const char *symbol; /* "cuStreamWaitEvent" */
  int version;        /* pinned ABI version */
  int need;           /* DLSYNC__NEED_* */
  size_t offset;      /* offset of the field in dlsync__driver */
} dlsync__driver_entry_info;

extern const dlsync__driver_entry_info dlsync__driver_entries[DLSYNC__DRIVER_ENTRY_COUNT];

/* Loads libcuda (path NULL: "libcuda.so.1") once per process and path, and
 * calls cuInit(0). On failure returns DLSYNC_ERROR_NO_DRIVER or
 * DLSYNC_ERROR_DRIVER and sets the thread's message. Thread-safe; the table
 * lives until the process ends. The SUPPORT entries are left NULL. */
dlsync_status dlsync__driver_load(const dlsync__driver **out, const char *path);

/* dlsync__driver_load with the SUPPORT entries resolved too, for the GPU
 * tests and the bench; the library never calls it. */
dlsync_status dlsync__driver_load_all(const dlsync__driver **out, const char *path);

/* Checks that every entry of a given need is present; on a missing one sets
 * DLSYNC_ERROR_DRIVER_TOO_OLD with the entry, its version and the driver's. */
dlsync_status dlsync__driver_require(const dlsync__driver *d, int need, const char *what);

/* The same for one entry (DLSYNC__DRIVER_INDEX_<name>): DLSYNC_SUCCESS when
 * it is present, else DLSYNC_ERROR_DRIVER_TOO_OLD naming it. */
dlsync_status dlsync__driver_require_entry(const dlsync__driver *d, int index, const char *what);

/* Name of a CUresult ("CUDA_ERROR_INVALID_VALUE"), through the table when it
 * can, never NULL. */
const char *dlsync__driver_error_name(const dlsync__driver *d, CUresult r);

/* ---- a driver call failed (driver/driver.c) ---- */

/* The message reads "<call> failed: <CUDA_ERROR_NAME> (<context>)"; the
 * status is DLSYNC_ERROR_DRIVER unless the result maps to a more precise one
 * (invalidated capture, legacy stream during capture, out of memory). */
DLSYNC__COLD dlsync_status dlsync__fail_driver(const dlsync__driver *d, CUresult result,
                                               const char *call, const char *fmt, ...)
    DLSYNC__PRINTF(4, 5);

/* The same message, reported as `status` whatever the result ("this driver
 * call failed: report it as status X"). The call that failed: */
typedef struct dlsync__driver_call {
  const dlsync__driver *d;
  CUresult result;
  const char *call; /* its name, "cuInit" */
} dlsync__driver_call;
DLSYNC__COLD dlsync_status dlsync__fail_driver_as(dlsync_status status,
                                                  const dlsync__driver_call *c, const char *fmt,
                                                  ...) DLSYNC__PRINTF(3, 4);

/* DLSYNC_CU(d, StreamWaitEvent, (s, e, 0), "fmt", args...): calls
 * d->StreamWaitEvent(s, e, 0); on failure sets `st` to the failure, named
 * "cuStreamWaitEvent" in its message (the name comes from the call itself,
 * so the two cannot drift apart), and jumps to `cleanup`. */
#define DLSYNC_CU(d, name, args, ...)                                \
  do {                                                               \
    CUresult cu_r_ = (d)->name args;                                 \
    if (DLSYNC__UNLIKELY(cu_r_ != CUDA_SUCCESS)) {                   \
      st = dlsync__fail_driver((d), cu_r_, "cu" #name, __VA_ARGS__); \
      goto cleanup;                                                  \
    }                                                                \
  } while (0)

#ifdef __cplusplus
}
#endif

#endif
