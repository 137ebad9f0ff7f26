/* SPDX-License-Identifier: Apache-2.0 */
/* dlsync tests: the fake CUDA driver (see fake_driver.h for the model). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif

#include "fake_driver.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

/* ---- the entries: names and pinned versions --------------------------------------------- */

static const char *const entry_names[DLSYNC__DRIVER_ENTRY_COUNT] = {
#define FAKE_ENTRY_NAME(name, pfn, ver, need) "cu" #name,
    DLSYNC__DRIVER_ENTRIES(FAKE_ENTRY_NAME)
#undef FAKE_ENTRY_NAME
};

static int entry_find(const char *symbol) {
  if (!symbol)
    return -1;
  for (int i = 0; i < DLSYNC__DRIVER_ENTRY_COUNT; i++)
    if (strcmp(entry_names[i], symbol) == 0)
      return i;
  return -1;
}

/* ---- model types ------------------------------------------------------------------------- */

enum { FK_FREE = 0, FK_CTX = 1, FK_STREAM, FK_EVENT, FK_GRAPH, FK_NODE, FK_EXEC, FK_UOBJ };

#define FAKE_MAX_DEVICES 64
#define FAKE_CTX_STACK 64
#define FAKE_LOG_MAX (4u << 20)
#define FAKE_DEVPTR_BASE 0x7f0000000000ull

typedef struct fctx fctx;
typedef struct fstream fstream;
typedef struct fevent fevent;
typedef struct fgraph fgraph;
typedef struct fnode fnode;
typedef struct fexec fexec;
typedef struct fuobj fuobj;
typedef struct fcapture fcapture;

typedef struct fslot {
  unsigned kind;
  size_t next_free;
  void *obj;
} fslot;

typedef struct fdep { /* an incoming edge of a node, or a pending capture dependency */
  fnode *node;
  CUgraphEdgeData data;
} fdep;

typedef struct furef {
  fuobj *obj;
  unsigned count;
} furef;

struct fctx {
  CUcontext h;
  int dev;
  unsigned long long id;
  int refs;
  fstream *legacy;
};

struct fstream {
  CUstream h; /* CU_STREAM_LEGACY / CU_STREAM_PER_THREAD for the implicit ones */
  fctx *ctx;
  unsigned flags;
  unsigned long long id;
  bool legacy, per_thread;
  pthread_t owner; /* per-thread streams */
  uint64_t last_op;
  fcapture *cap; /* NULL: not capturing */
  fdep *deps;    /* capture dependencies (cap != NULL) */
  size_t ndeps, capdeps;
  CUgraphNode *info_nodes; /* last arrays handed out by cuStreamGetCaptureInfo */
  CUgraphEdgeData *info_edges;
};

enum { EV_NEVER = 0, EV_EAGER = 1, EV_CAPTURED = 2, EV_NODE = 3 };

struct fevent {
  CUevent h;
  fctx *ctx;
  unsigned flags;
  uint64_t serial;
  int state;
  uint64_t op;        /* EV_EAGER */
  uint64_t cap_id;    /* EV_CAPTURED, EV_NODE */
  CUgraphNode *nodes; /* EV_CAPTURED: the recording stream's dependencies */
  size_t nnodes;
};

struct fnode {
  CUgraphNode h;
  fgraph *g;
  CUgraphNodeType type;
  CUevent ev; /* record / wait nodes */
  uint64_t ev_serial;
  CUhostFn fn; /* host nodes */
  void *ud;
  char *label;
  fdep *in;
  size_t nin, capin;
  uint64_t mark;
  /* Conditional nodes: their bodies, owned by the node ([R28 COND-BODY]);
   * body_handles is the array phGraph_out points to. */
  fgraph **bodies;
  CUgraph *body_handles;
  unsigned nbodies;
  fgraph *child; /* child-graph nodes: the node's own copy of the graph */
};

struct fgraph {
  CUgraph h;
  fnode **nodes;
  size_t n, cap;
  furef *urefs;
  size_t nu, capu;
  fcapture *building; /* the active capture that builds this graph */
  fnode *owner;       /* a conditional node's body: that node ([R28 COND-BODY]) */
};

typedef struct fexec_item {
  CUgraphNodeType type;
  CUgraphNode node;
  CUevent ev;
  uint64_t ev_serial;
  CUhostFn fn;
  void *ud;
} fexec_item;

struct fexec {
  CUgraphExec h;
  fexec_item *items;
  size_t n;
  furef *urefs;
  size_t nu;
};

struct fuobj {
  CUuserObject h;
  void *ptr;
  CUhostFn fn;
  unsigned refs;
};

struct fcapture {
  uint64_t id;
  fgraph *graph;
  fstream *origin;
  CUstreamCaptureMode mode;
  pthread_t thread;
  bool invalidated;
  bool to_graph; /* the graph is the user's (cuStreamBeginCaptureToGraph) */
};

typedef struct fop {
  uint64_t *deps;
  size_t n;
} fop;

typedef struct falloc {
  CUdeviceptr ptr;
  size_t size;
  fctx *ctx;
} falloc;

typedef struct fcall {
  CUhostFn fn;
  void *ud;
} fcall;

/* ---- the state ------------------------------------------------------------------------- */

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;

static struct {
  unsigned gen; /* bumped by every reset; 0: never reset */
  bool initialized;
  int version;
  int ndev;
  fctx *ctxs[FAKE_MAX_DEVICES];

  fslot *slots;
  size_t nslots, capslots, free_head;

  fstream **streams; /* every stream: created, legacy and per-thread */
  size_t nstreams, capstreams;
  fcapture **caps; /* active captures */
  size_t ncaps, capcaps;
  fop *ops; /* op id i is ops[i - 1] */
  size_t nops, capops;
  falloc *allocs;
  size_t nallocs, capallocs;
  fcall *dtors, *hostfns;
  size_t ndtors, capdtors, nhostfns, caphostfns;
  bool dtors_inline, hostfns_inline;

  unsigned live_events, live_streams, live_graphs, live_execs, live_uobjs;
  CUdeviceptr next_devptr;
  unsigned illegal, dangling;
  uint64_t mark_stamp;

  char *log;
  size_t loglen, logcap;
  bool log_full;
  unsigned long total;                         /* since log reset */
  unsigned counts[DLSYNC__DRIVER_ENTRY_COUNT]; /* since log reset */
  unsigned long long abs_total;                /* since fake reset */
  unsigned long long abs_counts[DLSYNC__DRIVER_ENTRY_COUNT];
  unsigned long long fail_nth_at[DLSYNC__DRIVER_ENTRY_COUNT];
  CUresult fail_nth_r[DLSYNC__DRIVER_ENTRY_COUNT];
  bool fail_always[DLSYNC__DRIVER_ENTRY_COUNT];
  CUresult fail_always_r[DLSYNC__DRIVER_ENTRY_COUNT];
  unsigned long long fail_any_at;
  CUresult fail_any_r;
} S = {.version = 13000, .free_head = SIZE_MAX};

/* Process-wide counters that fake_reset keeps: ids unique for the process. */
static unsigned long long g_next_stream_id = 1;
static unsigned long long g_next_ctx_id = 1;
static uint64_t g_next_capture_id = 1;
static uint64_t g_next_event_serial = 1;

static dlsync__driver g_table;

/* Per-thread state, valid while its generation is the fake's. */
static _Thread_local struct {
  unsigned gen;
  CUstreamCaptureMode mode;
  CUcontext stack[FAKE_CTX_STACK];
  int depth;
} T;

static void tls_sync(void) {
  if (T.gen != S.gen) {
    T.gen = S.gen;
    T.mode = CU_STREAM_CAPTURE_MODE_GLOBAL;
    T.depth = 0;
  }
}

/* ---- small utilities ------------------------------------------------------------------- */

static void *xrealloc(void *p, size_t n) {
  void *q = realloc(p, n ? n : 1);
  if (!q) {
    fputs("fake_driver: out of host memory\n", stderr);
    abort();
  }
  return q;
}

static void *xcalloc(size_t n, size_t size) {
  void *p = calloc(n ? n : 1, size ? size : 1);
  if (!p) {
    fputs("fake_driver: out of host memory\n", stderr);
    abort();
  }
  return p;
}

static char *xstrdup(const char *s) {
  size_t n = strlen(s) + 1;
  char *d = xrealloc(NULL, n);
  memcpy(d, s, n);
  return d;
}

#define VEC_GROW(arr, n, cap)                         \
  do {                                                \
    if ((n) == (cap)) {                               \
      (cap) = (cap) ? 2 * (cap) : 8;                  \
      (arr) = xrealloc((arr), (cap) * sizeof *(arr)); \
    }                                                 \
  } while (0)

#define VEC_PUSH(arr, n, cap, val) \
  do {                             \
    VEC_GROW(arr, n, cap);         \
    (arr)[(n)++] = (val);          \
  } while (0)

static bool edge_is_default(const CUgraphEdgeData *d) {
  static const CUgraphEdgeData zero;
  return memcmp(d, &zero, sizeof zero) == 0;
}

/* ---- handles: slots ---------------------------------------------------------------------- */

static void *slot_new(unsigned kind, void *obj) {
  size_t i;
  if (S.free_head != SIZE_MAX) {
    i = S.free_head;
    S.free_head = S.slots[i].next_free;
  } else {
    VEC_GROW(S.slots, S.nslots, S.capslots);
    i = S.nslots++;
  }
  S.slots[i].kind = kind;
  S.slots[i].obj = obj;
  S.slots[i].next_free = SIZE_MAX;
  return (void *)(uintptr_t)((((uintptr_t)i + 1) << 4) | kind);
}

static bool slot_decode(const void *h, size_t *idx, unsigned *kind) {
  uintptr_t v = (uintptr_t)h;
  if ((v >> 4) == 0)
    return false;
  *idx = (size_t)(v >> 4) - 1;
  *kind = (unsigned)(v & 15u);
  return *idx < S.nslots;
}

static void *slot_get(const void *h, unsigned kind) {
  size_t i;
  unsigned k;
  if (!slot_decode(h, &i, &k) || k != kind || S.slots[i].kind != kind)
    return NULL;
  return S.slots[i].obj;
}

static void slot_free(const void *h) {
  size_t i;
  unsigned k;
  if (!slot_decode(h, &i, &k) || S.slots[i].kind == FK_FREE)
    return;
  S.slots[i].kind = FK_FREE;
  S.slots[i].obj = NULL;
  S.slots[i].next_free = S.free_head;
  S.free_head = i;
}

#define GET_CTX(h) ((fctx *)slot_get((h), FK_CTX))
#define GET_STREAM(h) ((fstream *)slot_get((h), FK_STREAM))
#define GET_EVENT(h) ((fevent *)slot_get((h), FK_EVENT))
#define GET_GRAPH(h) ((fgraph *)slot_get((h), FK_GRAPH))
#define GET_NODE(h) ((fnode *)slot_get((h), FK_NODE))
#define GET_EXEC(h) ((fexec *)slot_get((h), FK_EXEC))
#define GET_UOBJ(h) ((fuobj *)slot_get((h), FK_UOBJ))

/* ---- the call log -------------------------------------------------------------------------- */

static void log_append(const char *name) {
  if (S.log_full)
    return;
  size_t n = strlen(name);
  size_t need = S.loglen + n + 2;
  if (need > FAKE_LOG_MAX) {
    need = S.loglen + 5;
    if (need > S.logcap) {
      S.logcap = need;
      S.log = xrealloc(S.log, S.logcap);
    }
    memcpy(S.log + S.loglen, ",...", 5);
    S.loglen += 4;
    S.log_full = true;
    return;
  }
  if (need > S.logcap) {
    S.logcap = need > 2 * S.logcap ? need : 2 * S.logcap;
    S.log = xrealloc(S.log, S.logcap);
  }
  if (S.loglen)
    S.log[S.loglen++] = ',';
  memcpy(S.log + S.loglen, name, n + 1);
  S.loglen += n;
}

static void log_clear(void) {
  S.loglen = 0;
  S.log_full = false;
  if (S.log)
    S.log[0] = '\0';
  S.total = 0;
  memset(S.counts, 0, sizeof S.counts);
}

/* ---- deferred host work ---------------------------------------------------------------- */

static void dtor_queue(CUhostFn fn, void *ud) {
  fcall c = {fn, ud};
  VEC_PUSH(S.dtors, S.ndtors, S.capdtors, c);
}

static void hostfn_queue(CUhostFn fn, void *ud) {
  fcall c = {fn, ud};
  VEC_PUSH(S.hostfns, S.nhostfns, S.caphostfns, c);
}

/* Takes the queue out (under the lock) to be run after unlocking. */
static fcall *take_queue(fcall **q, size_t *n, size_t *cap, size_t *out_n) {
  fcall *taken = *q;
  *out_n = *n;
  *q = NULL;
  *n = 0;
  *cap = 0;
  return taken;
}

static void run_calls(fcall *calls, size_t n) {
  for (size_t i = 0; i < n; i++)
    calls[i].fn(calls[i].ud);
  free(calls);
}

/* ---- user objects ------------------------------------------------------------------------ */

static void uobj_release(fuobj *o, unsigned n) {
  o->refs -= n;
  if (o->refs == 0) {
    dtor_queue(o->fn, o->ptr);
    slot_free(o->h);
    S.live_uobjs--;
    free(o);
  }
}

static void urefs_add(furef **arr, size_t *n, size_t *cap, fuobj *o, unsigned count) {
  for (size_t i = 0; i < *n; i++) {
    if ((*arr)[i].obj == o) {
      (*arr)[i].count += count;
      return;
    }
  }
  furef r = {o, count};
  VEC_PUSH(*arr, *n, *cap, r);
}

static void urefs_release(furef *arr, size_t n) {
  for (size_t i = 0; i < n; i++)
    uobj_release(arr[i].obj, arr[i].count);
}

/* ---- graphs and nodes --------------------------------------------------------------------- */

static fgraph *graph_new(void) {
  fgraph *g = xcalloc(1, sizeof *g);
  g->h = slot_new(FK_GRAPH, g);
  S.live_graphs++;
  return g;
}

static void graph_free(fgraph *g);

static void node_free(fnode *n) {
  for (unsigned i = 0; i < n->nbodies; i++)
    graph_free(n->bodies[i]);
  if (n->child)
    graph_free(n->child);
  free(n->bodies);
  free(n->body_handles);
  slot_free(n->h);
  free(n->in);
  free(n->label);
  free(n);
}

static void graph_free(fgraph *g) {
  for (size_t i = 0; i < g->n; i++)
    node_free(g->nodes[i]);
  free(g->nodes);
  urefs_release(g->urefs, g->nu);
  free(g->urefs);
  slot_free(g->h);
  S.live_graphs--;
  free(g);
}

static fnode *node_new(fgraph *g, CUgraphNodeType type) {
  fnode *n = xcalloc(1, sizeof *n);
  n->g = g;
  n->type = type;
  n->h = slot_new(FK_NODE, n);
  VEC_PUSH(g->nodes, g->n, g->cap, n);
  return n;
}

static void node_set_label(fnode *n, const char *label) {
  free(n->label);
  n->label = label ? xstrdup(label) : NULL;
}

static void node_add_in(fnode *n, fnode *from, CUgraphEdgeData data) {
  fdep d = {from, data};
  VEC_PUSH(n->in, n->nin, n->capin, d);
}

static bool node_has_in(const fnode *n, const fnode *from) {
  for (size_t i = 0; i < n->nin; i++)
    if (n->in[i].node == from)
      return true;
  return false;
}

/* A path of zero or more edges from `from` to `to`. Iterative to survive long chains. */
static bool node_reaches(fnode *from, fnode *to) {
  uint64_t stamp = ++S.mark_stamp;
  fnode **stack = NULL;
  size_t n = 0, cap = 0;
  bool found = false;
  VEC_PUSH(stack, n, cap, to);
  to->mark = stamp;
  while (n && !found) {
    fnode *cur = stack[--n];
    if (cur == from) {
      found = true;
      break;
    }
    for (size_t i = 0; i < cur->nin; i++) {
      fnode *p = cur->in[i].node;
      if (p->mark != stamp) {
        p->mark = stamp;
        VEC_PUSH(stack, n, cap, p);
      }
    }
  }
  free(stack);
  return found;
}

/* Checks an edge-data array entry; `from` is the upstream node. */
static bool edge_valid(const CUgraphEdgeData *d, const fnode *from) {
  for (size_t i = 0; i < sizeof d->reserved; i++)
    if (d->reserved[i])
      return false;
  if (d->to_port != 0)
    return false;
  if (d->type > CU_GRAPH_DEPENDENCY_TYPE_PROGRAMMATIC)
    return false;
  if ((d->from_port != 0 || d->type != CU_GRAPH_DEPENDENCY_TYPE_DEFAULT) && from &&
      from->type != CU_GRAPH_NODE_TYPE_KERNEL)
    return false;
  return true;
}

/* Resolves and checks a dependency list for a node of g: every node of g,
 * no duplicates, valid edge data. out gets n node pointers. */
static CUresult deps_resolve(fgraph *g, const CUgraphNode *deps, const CUgraphEdgeData *data,
                             size_t n, fnode ***out) {
  *out = NULL;
  if (n == 0)
    return CUDA_SUCCESS;
  if (!deps)
    return CUDA_ERROR_INVALID_VALUE;
  fnode **v = xcalloc(n, sizeof *v);
  for (size_t i = 0; i < n; i++) {
    fnode *d = GET_NODE(deps[i]);
    if (!d || d->g != g)
      goto bad;
    for (size_t j = 0; j < i; j++)
      if (v[j] == d)
        goto bad;
    if (data && !edge_valid(&data[i], d))
      goto bad;
    v[i] = d;
  }
  *out = v;
  return CUDA_SUCCESS;
bad:
  free(v);
  return CUDA_ERROR_INVALID_VALUE;
}

/* Adds a node of `type` to g after deps (checked). */
static CUresult graph_add(fgraph *g, const CUgraphNode *deps, const CUgraphEdgeData *data, size_t n,
                          CUgraphNodeType type, fnode **out) {
  fnode **v;
  CUresult r = deps_resolve(g, deps, data, n, &v);
  if (r != CUDA_SUCCESS)
    return r;
  fnode *node = node_new(g, type);
  for (size_t i = 0; i < n; i++) {
    CUgraphEdgeData e = {0};
    if (data)
      e = data[i];
    node_add_in(node, v[i], e);
  }
  free(v);
  *out = node;
  return CUDA_SUCCESS;
}

/* ---- streams --------------------------------------------------------------------------- */

static void info_free(fstream *s) {
  free(s->info_nodes);
  free(s->info_edges);
  s->info_nodes = NULL;
  s->info_edges = NULL;
}

static fstream *stream_new(fctx *c, unsigned flags, bool legacy, bool per_thread) {
  fstream *s = xcalloc(1, sizeof *s);
  s->ctx = c;
  s->flags = flags;
  s->id = g_next_stream_id++;
  s->legacy = legacy;
  s->per_thread = per_thread;
  if (legacy)
    s->h = CU_STREAM_LEGACY;
  else if (per_thread)
    s->h = CU_STREAM_PER_THREAD;
  else {
    s->h = slot_new(FK_STREAM, s);
    S.live_streams++;
  }
  VEC_PUSH(S.streams, S.nstreams, S.capstreams, s);
  return s;
}

static void stream_free(fstream *s) {
  for (size_t i = 0; i < S.nstreams; i++) {
    if (S.streams[i] == s) {
      S.streams[i] = S.streams[--S.nstreams];
      break;
    }
  }
  if (!s->legacy && !s->per_thread) {
    slot_free(s->h);
    S.live_streams--;
  }
  info_free(s);
  free(s->deps);
  free(s);
}

static bool stream_blocking(const fstream *s) {
  return !s->legacy && !(s->flags & CU_STREAM_NON_BLOCKING);
}

static fctx *cur_ctx(void) {
  return T.depth ? GET_CTX(T.stack[T.depth - 1]) : NULL;
}

static fstream *per_thread_stream(fctx *c) {
  pthread_t self = pthread_self();
  for (size_t i = 0; i < S.nstreams; i++) {
    fstream *s = S.streams[i];
    if (s->per_thread && s->ctx == c && pthread_equal(s->owner, self))
      return s;
  }
  fstream *s = stream_new(c, 0, false, true);
  s->owner = self;
  return s;
}

/* Resolves a stream handle. `touch`: a driver call naming the stream, which
 * ends the validity of the arrays of the last cuStreamGetCaptureInfo. */
static CUresult get_stream(CUstream h, bool touch, fstream **out) {
  fstream *s;
  if (h == NULL || h == CU_STREAM_LEGACY || h == CU_STREAM_PER_THREAD) {
    fctx *c = cur_ctx();
    if (!c)
      return CUDA_ERROR_INVALID_CONTEXT;
    s = h == CU_STREAM_PER_THREAD ? per_thread_stream(c) : c->legacy;
  } else {
    s = GET_STREAM(h);
    if (!s)
      return CUDA_ERROR_INVALID_HANDLE;
  }
  if (touch)
    info_free(s);
  *out = s;
  return CUDA_SUCCESS;
}

/* ---- ops: the eager happens-before DAG ---------------------------------------------------- */

static void op_dep(fop *op, size_t *cap, uint64_t d) {
  if (d == 0)
    return;
  for (size_t i = 0; i < op->n; i++)
    if (op->deps[i] == d)
      return;
  VEC_PUSH(op->deps, op->n, *cap, d);
}

/* A new eager op on s after its previous op, the legacy-stream rules and extra. */
static uint64_t op_new(fstream *s, const uint64_t *extra, size_t nextra) {
  fop op = {NULL, 0};
  size_t cap = 0;
  op_dep(&op, &cap, s->last_op);
  if (s->legacy) {
    for (size_t i = 0; i < S.nstreams; i++) {
      fstream *t = S.streams[i];
      if (t->ctx == s->ctx && stream_blocking(t))
        op_dep(&op, &cap, t->last_op);
    }
  } else if (stream_blocking(s)) {
    op_dep(&op, &cap, s->ctx->legacy->last_op);
  }
  for (size_t i = 0; i < nextra; i++)
    op_dep(&op, &cap, extra[i]);
  VEC_PUSH(S.ops, S.nops, S.capops, op);
  s->last_op = S.nops;
  return S.nops;
}

static bool happens_before(uint64_t a, uint64_t b) {
  if (a == 0 || b == 0 || a >= b || b > S.nops)
    return false;
  unsigned char *seen = xcalloc((size_t)b + 1, 1);
  uint64_t *stack = NULL;
  size_t n = 0, cap = 0;
  bool found = false;
  VEC_PUSH(stack, n, cap, b);
  while (n && !found) {
    uint64_t cur = stack[--n];
    const fop *op = &S.ops[cur - 1];
    for (size_t i = 0; i < op->n; i++) {
      uint64_t d = op->deps[i];
      if (d == a) {
        found = true;
        break;
      }
      if (d > a && !seen[d]) {
        seen[d] = 1;
        VEC_PUSH(stack, n, cap, d);
      }
    }
  }
  free(stack);
  free(seen);
  return found;
}

/* ---- captures ----------------------------------------------------------------------------- */

static fcapture *cap_find(uint64_t id) {
  if (id == 0)
    return NULL;
  for (size_t i = 0; i < S.ncaps; i++)
    if (S.caps[i]->id == id)
      return S.caps[i];
  return NULL;
}

static void stream_leave_capture(fstream *s) {
  s->cap = NULL;
  s->ndeps = 0;
  info_free(s);
}

/* Ends a capture: every stream returns to NONE; the graph is freed unless it
 * is handed out (keep_graph) or the user's. */
static void cap_end(fcapture *c, bool keep_graph) {
  for (size_t i = 0; i < S.nstreams; i++)
    if (S.streams[i]->cap == c)
      stream_leave_capture(S.streams[i]);
  c->graph->building = NULL;
  if (!keep_graph && !c->to_graph)
    graph_free(c->graph);
  for (size_t i = 0; i < S.ncaps; i++) {
    if (S.caps[i] == c) {
      S.caps[i] = S.caps[--S.ncaps];
      break;
    }
  }
  free(c);
}

static void deps_set(fstream *s, const fdep *d, size_t n) {
  s->ndeps = 0;
  for (size_t i = 0; i < n; i++)
    VEC_PUSH(s->deps, s->ndeps, s->capdeps, d[i]);
}

static void deps_add(fstream *s, fnode *node, CUgraphEdgeData data) {
  for (size_t i = 0; i < s->ndeps; i++) {
    if (s->deps[i].node == node) {
      s->deps[i].data = data;
      return;
    }
  }
  fdep d = {node, data};
  VEC_PUSH(s->deps, s->ndeps, s->capdeps, d);
}

/* Appends a node after the stream's capture dependencies, which become {node}. */
static fnode *capture_append(fstream *s, CUgraphNodeType type) {
  fnode *n = node_new(s->cap->graph, type);
  for (size_t i = 0; i < s->ndeps; i++)
    node_add_in(n, s->deps[i].node, s->deps[i].data);
  fdep d = {n, {0}};
  deps_set(s, &d, 1);
  return n;
}

/* Blocking streams of ctx in a capture (active or invalidated); invalidates
 * their captures when asked. */
static bool legacy_conflict(fctx *c, bool invalidate) {
  bool hit = false;
  for (size_t i = 0; i < S.nstreams; i++) {
    fstream *t = S.streams[i];
    if (t->cap && t->ctx == c && stream_blocking(t)) {
      hit = true;
      if (invalidate)
        t->cap->invalidated = true;
    }
  }
  return hit;
}

/* The checks every piece of work enqueued on a stream goes through. */
static CUresult stream_enqueue_check(fstream *s) {
  if (s->legacy && legacy_conflict(s->ctx, true))
    return CUDA_ERROR_STREAM_CAPTURE_IMPLICIT;
  if (s->cap && s->cap->invalidated)
    return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
  return CUDA_SUCCESS;
}

/* Work on s: an op, or a node of `type` appended to its capture. */
static CUresult enqueue(fstream *s, CUgraphNodeType type, const char *label, uint64_t *op_out,
                        fnode **node_out) {
  CUresult r = stream_enqueue_check(s);
  if (op_out)
    *op_out = 0;
  if (node_out)
    *node_out = NULL;
  if (r != CUDA_SUCCESS)
    return r;
  if (s->cap) {
    fnode *n = capture_append(s, type);
    node_set_label(n, label);
    if (node_out)
      *node_out = n;
  } else {
    uint64_t op = op_new(s, NULL, 0);
    if (op_out)
      *op_out = op;
  }
  return CUDA_SUCCESS;
}

/* The "potentially unsafe API call" rule of cuThreadExchangeStreamCaptureMode.
 * Returns true when the calling thread may not make one now; then the
 * captures concerned are invalidated and the call is counted. */
static bool unsafe_call_prohibited(void) {
  if (T.mode == CU_STREAM_CAPTURE_MODE_RELAXED)
    return false;
  pthread_t self = pthread_self();
  bool hit = false;
  for (size_t i = 0; i < S.ncaps; i++) {
    fcapture *c = S.caps[i];
    bool own = pthread_equal(c->thread, self) != 0;
    if ((own && c->mode != CU_STREAM_CAPTURE_MODE_RELAXED) ||
        (!own && T.mode == CU_STREAM_CAPTURE_MODE_GLOBAL &&
         c->mode == CU_STREAM_CAPTURE_MODE_GLOBAL)) {
      c->invalidated = true;
      hit = true;
    }
  }
  if (hit)
    S.illegal++;
  return hit;
}

static bool event_captured_active(const fevent *e) {
  return e->state == EV_CAPTURED && cap_find(e->cap_id) != NULL;
}

static bool event_node_active(const fevent *e) {
  return e->state == EV_NODE && cap_find(e->cap_id) != NULL;
}

static void event_set_captured(fevent *e, fstream *s) {
  e->state = EV_CAPTURED;
  e->cap_id = s->cap->id;
  e->op = 0;
  free(e->nodes);
  e->nodes = s->ndeps ? xcalloc(s->ndeps, sizeof *e->nodes) : NULL;
  e->nnodes = s->ndeps;
  for (size_t i = 0; i < s->ndeps; i++)
    e->nodes[i] = s->deps[i].node->h;
}

static void event_set_eager(fevent *e, uint64_t op) {
  e->state = EV_EAGER;
  e->op = op;
  e->cap_id = 0;
  free(e->nodes);
  e->nodes = NULL;
  e->nnodes = 0;
}

/* Is the event used by an event node of a live graph or executable? */
static bool event_in_use_by_graphs(const fevent *e) {
  for (size_t i = 0; i < S.nslots; i++) {
    if (S.slots[i].kind == FK_NODE) {
      const fnode *n = S.slots[i].obj;
      if ((n->type == CU_GRAPH_NODE_TYPE_EVENT_RECORD ||
           n->type == CU_GRAPH_NODE_TYPE_WAIT_EVENT) &&
          n->ev == e->h && n->ev_serial == e->serial)
        return true;
    } else if (S.slots[i].kind == FK_EXEC) {
      const fexec *x = S.slots[i].obj;
      for (size_t j = 0; j < x->n; j++)
        if (x->items[j].ev == e->h && x->items[j].ev_serial == e->serial)
          return true;
    }
  }
  return false;
}

static fevent *event_new(fctx *c, unsigned flags) {
  fevent *e = xcalloc(1, sizeof *e);
  e->ctx = c;
  e->flags = flags;
  e->serial = g_next_event_serial++;
  e->h = slot_new(FK_EVENT, e);
  S.live_events++;
  return e;
}

static void event_free(fevent *e) {
  slot_free(e->h);
  free(e->nodes);
  S.live_events--;
  free(e);
}

/* The event of a node if it still exists (serial match). */
static fevent *node_event_alive(CUevent h, uint64_t serial) {
  fevent *e = GET_EVENT(h);
  return e && e->serial == serial ? e : NULL;
}

static void exec_free(fexec *x) {
  urefs_release(x->urefs, x->nu);
  free(x->urefs);
  free(x->items);
  slot_free(x->h);
  S.live_execs--;
  free(x);
}

/* ---- whole-state teardown ---------------------------------------------------------------- */

static void state_free(void) {
  unsigned dropped = (unsigned)S.ndtors + S.live_uobjs;
  if (dropped)
    fprintf(stderr,
            "fake_driver: reset drops %zu pending user-object destructor(s) and %u live user "
            "object(s) without running them\n",
            S.ndtors, S.live_uobjs);
  while (S.ncaps)
    cap_end(S.caps[S.ncaps - 1], true); /* graphs freed below with the other graphs */
  for (size_t i = 0; i < S.nslots; i++) {
    fslot *sl = &S.slots[i];
    switch (sl->kind) {
    case FK_EVENT:
      event_free(sl->obj);
      break;
    case FK_EXEC: {
      fexec *x = sl->obj;
      free(x->urefs);
      free(x->items);
      free(x);
      break;
    }
    case FK_UOBJ:
      free(sl->obj);
      break;
    default:
      break;
    }
  }
  for (size_t i = 0; i < S.nslots; i++) {
    if (S.slots[i].kind == FK_GRAPH) {
      fgraph *g = S.slots[i].obj;
      for (size_t j = 0; j < g->n; j++) {
        free(g->nodes[j]->bodies); /* the bodies are graphs of their own slots */
        free(g->nodes[j]->body_handles);
        free(g->nodes[j]->in);
        free(g->nodes[j]->label);
        free(g->nodes[j]);
      }
      free(g->nodes);
      free(g->urefs);
      free(g);
    }
  }
  while (S.nstreams) {
    fstream *s = S.streams[S.nstreams - 1];
    S.nstreams--;
    info_free(s);
    free(s->deps);
    free(s);
  }
  for (int d = 0; d < S.ndev; d++)
    free(S.ctxs[d]);
  for (size_t i = 0; i < S.nops; i++)
    free(S.ops[i].deps);
  free(S.ops);
  free(S.slots);
  free(S.streams);
  free(S.caps);
  free(S.allocs);
  free(S.dtors);
  free(S.hostfns);
  free(S.log);
  unsigned gen = S.gen;
  memset(&S, 0, sizeof S);
  S.gen = gen + 1;
  S.free_head = SIZE_MAX;
  S.version = 13000;
}

static void state_create(int ndevices) {
  if (ndevices < 0)
    ndevices = 0;
  if (ndevices > FAKE_MAX_DEVICES)
    ndevices = FAKE_MAX_DEVICES;
  S.ndev = ndevices;
  for (int d = 0; d < ndevices; d++) {
    fctx *c = xcalloc(1, sizeof *c);
    c->dev = d;
    c->id = g_next_ctx_id++;
    c->h = slot_new(FK_CTX, c);
    S.ctxs[d] = c;
    c->legacy = stream_new(c, 0, true, false);
  }
  S.initialized = true;
}

/* ---- entry gate: lock, log, faults, initialization --------------------------------------- */

static void lock(void) {
  pthread_mutex_lock(&g_lock);
  tls_sync();
}

static void unlock(void) {
  pthread_mutex_unlock(&g_lock);
}

static bool init_exempt(int idx) {
  return idx == DLSYNC__DRIVER_INDEX_Init || idx == DLSYNC__DRIVER_INDEX_DriverGetVersion ||
         idx == DLSYNC__DRIVER_INDEX_GetErrorName || idx == DLSYNC__DRIVER_INDEX_GetErrorString;
}

/* Takes the lock and accounts for the call. Returns false (lock released,
 * *r set) when the call is answered by an injected fault or by
 * CUDA_ERROR_NOT_INITIALIZED. */
static bool enter(int idx, CUresult *r) {
  lock();
  S.total++;
  S.counts[idx]++;
  S.abs_total++;
  S.abs_counts[idx]++;
  log_append(entry_names[idx]);
  bool hit = false;
  CUresult inj = CUDA_SUCCESS;
  if (S.fail_nth_at[idx] && S.abs_counts[idx] == S.fail_nth_at[idx]) {
    hit = true;
    inj = S.fail_nth_r[idx];
    S.fail_nth_at[idx] = 0;
  }
  if (S.fail_any_at && S.abs_total == S.fail_any_at) {
    if (!hit)
      inj = S.fail_any_r;
    hit = true;
    S.fail_any_at = 0;
  }
  if (!hit && S.fail_always[idx]) {
    hit = true;
    inj = S.fail_always_r[idx];
  }
  if (!hit && !S.initialized && !init_exempt(idx)) {
    hit = true;
    inj = CUDA_ERROR_NOT_INITIALIZED;
  }
  if (hit) {
    unlock();
    *r = inj;
    return false;
  }
  return true;
}

/* Releases the lock, then runs the host work due inline. */
static CUresult leave(CUresult r) {
  fcall *d = NULL, *h = NULL;
  size_t nd = 0, nh = 0;
  if (S.dtors_inline && S.ndtors)
    d = take_queue(&S.dtors, &S.ndtors, &S.capdtors, &nd);
  if (S.hostfns_inline && S.nhostfns)
    h = take_queue(&S.hostfns, &S.nhostfns, &S.caphostfns, &nh);
  unlock();
  if (h)
    run_calls(h, nh);
  if (d)
    run_calls(d, nd);
  return r;
}

#define ENTER(name)                                     \
  do {                                                  \
    CUresult enter_r_;                                  \
    if (!enter(DLSYNC__DRIVER_INDEX_##name, &enter_r_)) \
      return enter_r_;                                  \
  } while (0)

/* ---- devices ------------------------------------------------------------------------------ */

static bool dev_ok(CUdevice d) {
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

static void event_destroy(fevent *e) {
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

static CUresult event_sync_or_query(CUevent h) {
  fevent *e = GET_EVENT(h);
  if (!e)
    return CUDA_ERROR_INVALID_HANDLE;
  if (unsafe_call_prohibited())
    return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  if (e->state == EV_CAPTURED) {
    S.illegal++;
    return CUDA_ERROR_CAPTURED_EVENT;
  }
  return CUDA_SUCCESS;
}

static CUresult CUDAAPI fk_EventQuery(CUevent e) {
  ENTER(EventQuery);
  return leave(event_sync_or_query(e));
}

static CUresult CUDAAPI fk_EventSynchronize(CUevent e) {
  ENTER(EventSynchronize);
  return leave(event_sync_or_query(e));
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

static size_t graph_edge_count(const fgraph *g) {
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
static void table_build(void) {
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

/* ---- the fake's own API ---------------------------------------------------------------------- */

void fake_reset(int ndevices) {
  lock();
  state_free();
  tls_sync();
  state_create(ndevices);
  table_build();
  unlock();
}

void fake_shutdown(void) {
  lock();
  state_free();
  tls_sync();
  S.initialized = false;
  table_build();
  unlock();
}

const dlsync__driver *fake_driver(void) {
  lock();
  table_build();
  unlock();
  return &g_table;
}

void fake_set_driver_version(int v) {
  lock();
  S.version = v;
  table_build();
  unlock();
}

void fake_set_initialized(bool initialized) {
  lock();
  S.initialized = initialized;
  unlock();
}

static int entry_or_die(const char *symbol) {
  int idx = entry_find(symbol);
  if (idx < 0) {
    fprintf(stderr, "fake_driver: no driver entry named \"%s\"\n", symbol ? symbol : "(null)");
    abort();
  }
  return idx;
}

void fake_fail_nth(const char *symbol, unsigned nth, CUresult r) {
  int idx = entry_or_die(symbol);
  lock();
  S.fail_nth_at[idx] = nth ? S.abs_counts[idx] + nth : 0;
  S.fail_nth_r[idx] = r;
  unlock();
}

void fake_fail_always(const char *symbol, CUresult r) {
  int idx = entry_or_die(symbol);
  lock();
  S.fail_always[idx] = true;
  S.fail_always_r[idx] = r;
  unlock();
}

void fake_fail_call(unsigned n, CUresult r) {
  lock();
  S.fail_any_at = n ? S.abs_total + n : 0;
  S.fail_any_r = r;
  unlock();
}

void fake_fail_alloc(unsigned n) {
  dlsync__alloc_fail_nth(n);
}

void fake_fail_fault(fake_fault kind, unsigned n) {
  if (kind == FAKE_FAULT_ALLOC)
    fake_fail_alloc(n);
  else
    fake_fail_call(n, CUDA_ERROR_UNKNOWN);
}

const char *fake_fault_name(fake_fault kind) {
  return kind == FAKE_FAULT_ALLOC ? "allocation" : "driver call";
}

bool fake_fault_reported(fake_fault kind) {
  if (kind == FAKE_FAULT_ALLOC)
    return dlsync_last_status() == DLSYNC_ERROR_OUT_OF_MEMORY &&
           strstr(dlsync_last_error(), "out of memory") != NULL;
  return strstr(dlsync_last_error(), "CUDA_ERROR_UNKNOWN") != NULL &&
         dlsync_last_driver_result() == CUDA_ERROR_UNKNOWN;
}

bool fake_fail_pending(void) {
  lock();
  bool pending = S.fail_any_at != 0 || dlsync__alloc_fail_pending();
  for (int i = 0; i < DLSYNC__DRIVER_ENTRY_COUNT && !pending; i++)
    pending = S.fail_nth_at[i] != 0;
  unlock();
  return pending;
}

void fake_fail_clear(void) {
  dlsync__alloc_fail_nth(0);
  lock();
  S.fail_any_at = 0;
  memset(S.fail_nth_at, 0, sizeof S.fail_nth_at);
  memset(S.fail_always, 0, sizeof S.fail_always);
  unlock();
}

unsigned long fake_calls_total(void) {
  lock();
  unsigned long n = S.total;
  unlock();
  return n;
}

unsigned fake_call_count(const char *symbol) {
  int idx = entry_find(symbol);
  if (idx < 0)
    return 0;
  lock();
  unsigned n = S.counts[idx];
  unlock();
  return n;
}

void fake_log_reset(void) {
  lock();
  log_clear();
  unlock();
}

const char *fake_call_log(void) {
  lock();
  const char *s = S.loglen ? S.log : "";
  unlock();
  return s;
}

#define FAKE_GETTER(type, fn, expr) \
  type fn(void) {                   \
    lock();                         \
    type v_ = (type)(expr);         \
    unlock();                       \
    return v_;                      \
  }

FAKE_GETTER(unsigned, fake_illegal_calls, S.illegal)
FAKE_GETTER(unsigned, fake_dangling_event_uses, S.dangling)
FAKE_GETTER(unsigned, fake_live_events, S.live_events)
FAKE_GETTER(unsigned, fake_live_streams, S.live_streams)
FAKE_GETTER(unsigned, fake_live_graphs, S.live_graphs)
FAKE_GETTER(unsigned, fake_live_execs, S.live_execs)
FAKE_GETTER(unsigned, fake_live_user_objects, S.live_uobjs)
FAKE_GETTER(unsigned, fake_live_allocs, S.nallocs)
FAKE_GETTER(unsigned, fake_active_captures, S.ncaps)
FAKE_GETTER(unsigned, fake_pending_destructors, S.ndtors)
FAKE_GETTER(unsigned, fake_pending_host_funcs, S.nhostfns)

int fake_primary_ctx_refs(int device) {
  lock();
  int v = dev_ok(device) ? S.ctxs[device]->refs : -1;
  unlock();
  return v;
}

static void report_add(char *buf, size_t len, size_t *pos, unsigned *kinds, unsigned long n,
                       const char *one, const char *many) {
  if (n == 0)
    return;
  (*kinds)++;
  if (!buf || len == 0)
    return;
  int w = snprintf(buf + *pos, len - *pos, "%s%lu %s", *pos ? ", " : "", n, n == 1 ? one : many);
  if (w > 0)
    *pos = (size_t)w + *pos < len ? *pos + (size_t)w : len - 1;
}

unsigned fake_leak_report(char *buf, size_t len) {
  unsigned kinds = 0;
  size_t pos = 0;
  if (buf && len)
    buf[0] = '\0';
  lock();
  unsigned long refs = 0;
  for (int d = 0; d < S.ndev; d++)
    refs += (unsigned long)S.ctxs[d]->refs;
  report_add(buf, len, &pos, &kinds, S.live_events, "event", "events");
  report_add(buf, len, &pos, &kinds, S.live_streams, "stream", "streams");
  report_add(buf, len, &pos, &kinds, S.live_graphs, "graph", "graphs");
  report_add(buf, len, &pos, &kinds, S.live_execs, "graph exec", "graph execs");
  report_add(buf, len, &pos, &kinds, S.live_uobjs, "user object", "user objects");
  report_add(buf, len, &pos, &kinds, S.nallocs, "allocation", "allocations");
  report_add(buf, len, &pos, &kinds, refs, "primary context reference",
             "primary context references");
  report_add(buf, len, &pos, &kinds, S.ncaps, "active capture", "active captures");
  report_add(buf, len, &pos, &kinds, S.ndtors, "pending destructor", "pending destructors");
  report_add(buf, len, &pos, &kinds, S.nhostfns, "pending host function", "pending host functions");
  unlock();
  return kinds;
}

unsigned fake_run_destructors(void) {
  size_t n;
  lock();
  fcall *c = take_queue(&S.dtors, &S.ndtors, &S.capdtors, &n);
  unlock();
  run_calls(c, n);
  return (unsigned)n;
}

unsigned fake_run_host_funcs(void) {
  size_t n;
  lock();
  fcall *c = take_queue(&S.hostfns, &S.nhostfns, &S.caphostfns, &n);
  unlock();
  run_calls(c, n);
  return (unsigned)n;
}

void fake_set_destructors_inline(bool inline_) {
  lock();
  S.dtors_inline = inline_;
  unlock();
}

void fake_set_host_funcs_inline(bool inline_) {
  lock();
  S.hostfns_inline = inline_;
  unlock();
}

CUstream fake_stream_create(int device, unsigned flags) {
  CUstream h = NULL;
  lock();
  if (dev_ok(device) && !(flags & ~(unsigned)CU_STREAM_NON_BLOCKING))
    h = stream_new(S.ctxs[device], flags, false, false)->h;
  unlock();
  return h;
}

void fake_stream_destroy(CUstream h) {
  lock();
  fstream *s = GET_STREAM(h);
  if (s && !s->cap)
    stream_free(s);
  unlock();
}

CUevent fake_event_create(int device, unsigned flags) {
  CUevent h = NULL;
  lock();
  if (dev_ok(device))
    h = event_new(S.ctxs[device], flags)->h;
  unlock();
  return h;
}

void fake_event_destroy(CUevent h) {
  lock();
  fevent *e = GET_EVENT(h);
  if (e)
    event_destroy(e);
  unlock();
}

CUcontext fake_primary_ctx(int device) {
  lock();
  CUcontext c = dev_ok(device) ? S.ctxs[device]->h : NULL;
  unlock();
  return c;
}

CUresult fake_work_ex(CUstream hs, const char *label, uint64_t *op_out, CUgraphNode *node_out) {
  fstream *s;
  fnode *n = NULL;
  uint64_t op = 0;
  lock();
  CUresult r = get_stream(hs, true, &s);
  if (r == CUDA_SUCCESS)
    r = enqueue(s, CU_GRAPH_NODE_TYPE_KERNEL, label, &op, &n);
  unlock();
  if (op_out)
    *op_out = op;
  if (node_out)
    *node_out = n ? n->h : NULL;
  return r;
}

uint64_t fake_work(CUstream s, const char *label, CUgraphNode *node_out) {
  uint64_t op = 0;
  fake_work_ex(s, label, &op, node_out);
  return op;
}

bool fake_happens_before(uint64_t a, uint64_t b) {
  lock();
  bool v = happens_before(a, b);
  unlock();
  return v;
}

uint64_t fake_stream_last_op(CUstream h) {
  fstream *s;
  lock();
  uint64_t v = get_stream(h, false, &s) == CUDA_SUCCESS ? s->last_op : 0;
  unlock();
  return v;
}

fake_event_state fake_event_get_state(CUevent h) {
  lock();
  fevent *e = GET_EVENT(h);
  fake_event_state v = e ? (fake_event_state)e->state : FAKE_EVENT_INVALID;
  unlock();
  return v;
}

uint64_t fake_event_op(CUevent h) {
  lock();
  fevent *e = GET_EVENT(h);
  uint64_t v = e && e->state == EV_EAGER ? e->op : 0;
  unlock();
  return v;
}

uint64_t fake_event_capture_id(CUevent h) {
  lock();
  fevent *e = GET_EVENT(h);
  uint64_t v = e && (e->state == EV_CAPTURED || e->state == EV_NODE) ? e->cap_id : 0;
  unlock();
  return v;
}

CUstreamCaptureStatus fake_capture_status(CUstream h) {
  fstream *s;
  CUstreamCaptureStatus v = CU_STREAM_CAPTURE_STATUS_NONE;
  lock();
  if (get_stream(h, false, &s) == CUDA_SUCCESS && s->cap)
    v = s->cap->invalidated ? CU_STREAM_CAPTURE_STATUS_INVALIDATED
                            : CU_STREAM_CAPTURE_STATUS_ACTIVE;
  unlock();
  return v;
}

CUgraph fake_capture_graph(CUstream h) {
  fstream *s;
  CUgraph g = NULL;
  lock();
  if (get_stream(h, false, &s) == CUDA_SUCCESS && s->cap)
    g = s->cap->graph->h;
  unlock();
  return g;
}

uint64_t fake_capture_id(CUstream h) {
  fstream *s;
  uint64_t id = 0;
  lock();
  if (get_stream(h, false, &s) == CUDA_SUCCESS && s->cap)
    id = s->cap->id;
  unlock();
  return id;
}

size_t fake_capture_deps(CUstream h, CUgraphNode *out, size_t max) {
  fstream *s;
  size_t n = 0;
  lock();
  if (get_stream(h, false, &s) == CUDA_SUCCESS && s->cap) {
    n = s->ndeps;
    for (size_t i = 0; out && i < n && i < max; i++)
      out[i] = s->deps[i].node->h;
  }
  unlock();
  return n;
}

size_t fake_graph_count_nodes(CUgraph h, int type) {
  size_t n = 0;
  lock();
  fgraph *g = GET_GRAPH(h);
  for (size_t i = 0; g && i < g->n; i++)
    if (type < 0 || (int)g->nodes[i]->type == type)
      n++;
  unlock();
  return n;
}

size_t fake_graph_count_edges(CUgraph h) {
  lock();
  fgraph *g = GET_GRAPH(h);
  size_t n = g ? graph_edge_count(g) : 0;
  unlock();
  return n;
}

bool fake_graph_has_path(CUgraph hg, CUgraphNode hfrom, CUgraphNode hto) {
  bool v = false;
  lock();
  fgraph *g = GET_GRAPH(hg);
  fnode *from = GET_NODE(hfrom), *to = GET_NODE(hto);
  if (g && from && to && from->g == g && to->g == g) {
    for (size_t i = 0; i < to->nin && !v; i++)
      v = node_reaches(from, to->in[i].node);
  }
  unlock();
  return v;
}

bool fake_graph_has_edge(CUgraph hg, CUgraphNode hfrom, CUgraphNode hto) {
  bool v = false;
  lock();
  fgraph *g = GET_GRAPH(hg);
  fnode *from = GET_NODE(hfrom), *to = GET_NODE(hto);
  if (g && from && to && from->g == g && to->g == g)
    v = node_has_in(to, from);
  unlock();
  return v;
}

CUevent fake_node_event(CUgraphNode h) {
  lock();
  fnode *n = GET_NODE(h);
  CUevent e =
      n && (n->type == CU_GRAPH_NODE_TYPE_EVENT_RECORD || n->type == CU_GRAPH_NODE_TYPE_WAIT_EVENT)
          ? n->ev
          : NULL;
  unlock();
  return e;
}

int fake_node_type(CUgraphNode h) {
  lock();
  fnode *n = GET_NODE(h);
  int t = n ? (int)n->type : -1;
  unlock();
  return t;
}

const char *fake_node_label(CUgraphNode h) {
  lock();
  fnode *n = GET_NODE(h);
  const char *l = n ? (n->label ? n->label : "") : NULL;
  unlock();
  return l;
}

CUgraph fake_node_child_graph(CUgraphNode h) {
  lock();
  fnode *n = GET_NODE(h);
  CUgraph g = n && n->child ? n->child->h : NULL;
  unlock();
  return g;
}

bool fake_graph_is_body(CUgraph h) {
  lock();
  fgraph *g = GET_GRAPH(h);
  bool body = g && g->owner;
  unlock();
  return body;
}

CUgraph fake_node_graph(CUgraphNode h) {
  lock();
  fnode *n = GET_NODE(h);
  CUgraph g = n ? n->g->h : NULL;
  unlock();
  return g;
}

CUgraphNode fake_graph_add_work(CUgraph hg, const CUgraphNode *deps, size_t ndeps,
                                const char *label) {
  CUgraphNode out = NULL;
  lock();
  fgraph *g = GET_GRAPH(hg);
  fnode *n;
  if (g && graph_add(g, deps, NULL, ndeps, CU_GRAPH_NODE_TYPE_KERNEL, &n) == CUDA_SUCCESS) {
    node_set_label(n, label);
    out = n->h;
  }
  unlock();
  return out;
}

unsigned fake_user_object_refs(CUuserObject h) {
  lock();
  fuobj *o = GET_UOBJ(h);
  unsigned v = o ? o->refs : 0;
  unlock();
  return v;
}
