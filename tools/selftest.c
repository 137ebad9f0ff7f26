/* SPDX-License-Identifier: Apache-2.0 */
/* dlsync-info --selftest. See selftest.h.
 *
 * The check is the GPU suite's (tests/gpu/gpu_suite.c) in small: a producer
 * that runs for a while (cuMemsetD32Async over a large buffer, a new value
 * each time) and a consumer that copies the buffer's last word into a slot
 * of its own. A consumer ordered after the producer reads the new value; one
 * that is not reads the previous one. Each row runs with dlsync (every read
 * must be right) and as a control without it (some read must be stale,
 * otherwise the row could not have failed and proves nothing). */
#include <dlfcn.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cuda.h>

#include "dlsync/dlsync.h"
#include "selftest.h"

#define TRIALS 12
/* 4 GiB of uint32, about 1.3 ms on an H200: long enough for an unordered
 * consumer to read early even after a capture and an instantiation (the GPU
 * suite's controls read stale data in 14 of 20 such trials); halved until
 * it fits. */
#define MAX_WORDS ((size_t)1 << 30)
#define MIN_WORDS ((size_t)1 << 24)
#define SLOTS 64

#define STR_(x) #x
#define STR(x) STR_(x) /* expands cuda.h's cuX -> cuX_v2 first */

/* The driver entry points used, by the names cuda.h maps them to. */
#define ENTRIES(X)                  \
  X(cuInit)                         \
  X(cuDriverGetVersion)             \
  X(cuDeviceGetCount)               \
  X(cuDeviceGet)                    \
  X(cuDevicePrimaryCtxRetain)       \
  X(cuDevicePrimaryCtxRelease)      \
  X(cuCtxPushCurrent)               \
  X(cuCtxPopCurrent)                \
  X(cuCtxSynchronize)               \
  X(cuMemGetInfo)                   \
  X(cuMemAlloc)                     \
  X(cuMemFree)                      \
  X(cuMemsetD32Async)               \
  X(cuMemcpyDtoDAsync)              \
  X(cuMemcpyDtoH)                   \
  X(cuStreamCreate)                 \
  X(cuStreamDestroy)                \
  X(cuStreamSynchronize)            \
  X(cuStreamBeginCapture)           \
  X(cuStreamEndCapture)             \
  X(cuGraphCreate)                  \
  X(cuGraphAddMemsetNode)           \
  X(cuGraphAddMemcpyNode)           \
  X(cuGraphGetNodes)                \
  X(cuGraphNodeGetType)             \
  X(cuGraphInstantiateWithFlags)    \
  X(cuGraphExecMemsetNodeSetParams) \
  X(cuGraphLaunch)                  \
  X(cuGraphExecDestroy)             \
  X(cuGraphDestroy)

static struct {
#define FIELD(name) __typeof__(&name) name;
  ENTRIES(FIELD)
#undef FIELD
} cu;

static CUdevice dev;
static CUcontext cuctx;
static dlsync_context *ctx;
static CUdeviceptr big, slots;
static size_t words;
static unsigned value;

typedef struct outcome {
  int runs;
  int stale; /* reads that saw another value than the producer's */
  int errors;
  char note[160];
} outcome;

#define CU(call)                                                                               \
  do {                                                                                         \
    CUresult r_ = (call);                                                                      \
    if (r_ != CUDA_SUCCESS) {                                                                  \
      if (o->note[0] == '\0')                                                                  \
        snprintf(o->note, sizeof o->note, "line %d: %s failed (CUresult %d)", __LINE__, #call, \
                 (int)r_);                                                                     \
      o->errors++;                                                                             \
      goto out;                                                                                \
    }                                                                                          \
  } while (0)

/* A dlsync call that must return `want`. */
#define DS(call, want)                                                                         \
  do {                                                                                         \
    dlsync_status s_ = (call);                                                                 \
    if (s_ != (want)) {                                                                        \
      if (o->note[0] == '\0')                                                                  \
        snprintf(o->note, sizeof o->note, "line %d: %s: %s", __LINE__, dlsync_status_name(s_), \
                 dlsync_last_error());                                                         \
      o->errors++;                                                                             \
      goto out;                                                                                \
    }                                                                                          \
  } while (0)

static CUresult produce(CUstream s, unsigned v) {
  return cu.cuMemsetD32Async(big, v, words, s);
}

static CUresult consume(CUstream s, int slot) {
  return cu.cuMemcpyDtoDAsync(slots + (CUdeviceptr)slot * 4, big + (words - 1) * 4, 4, s);
}

static void check_slot(outcome *o, int slot, unsigned want) {
  unsigned got = 0;
  if (cu.cuMemcpyDtoH(&got, slots + (CUdeviceptr)slot * 4, 4) != CUDA_SUCCESS) {
    o->errors++;
    return;
  }
  o->runs++;
  o->stale += got != want;
}

/* The buffer holds a known value, the slots another. */
static CUresult settle(CUstream s) {
  CUresult r = produce(s, ++value);
  if (r == CUDA_SUCCESS)
    r = cu.cuMemsetD32Async(slots, 0, SLOTS, s);
  return r == CUDA_SUCCESS ? cu.cuStreamSynchronize(s) : r;
}

static CUresult new_stream(CUstream *s) {
  return cu.cuStreamCreate(s, CU_STREAM_NON_BLOCKING);
}

static void drop(CUstream *streams, int n, CUgraph g, CUgraphExec x) {
  (void)cu.cuCtxSynchronize();
  if (x != NULL)
    (void)cu.cuGraphExecDestroy(x);
  if (g != NULL)
    (void)cu.cuGraphDestroy(g);
  for (int i = 0; i < n; i++)
    if (streams[i] != NULL)
      (void)cu.cuStreamDestroy(streams[i]);
}

static CUDA_MEMSET_NODE_PARAMS memset_params(unsigned v) {
  CUDA_MEMSET_NODE_PARAMS p;
  memset(&p, 0, sizeof p);
  p.dst = big;
  p.value = v;
  p.elementSize = 4;
  p.width = words;
  p.height = 1;
  return p;
}

static CUresult add_copy_node(CUgraphNode *n, CUgraph g, const CUgraphNode *deps, size_t nd,
                              int slot) {
  CUDA_MEMCPY3D c;
  memset(&c, 0, sizeof c);
  c.srcMemoryType = CU_MEMORYTYPE_DEVICE;
  c.srcDevice = big + (words - 1) * 4;
  c.dstMemoryType = CU_MEMORYTYPE_DEVICE;
  c.dstDevice = slots + (CUdeviceptr)slot * 4;
  c.WidthInBytes = 4;
  c.Height = 1;
  c.Depth = 1;
  return cu.cuGraphAddMemcpyNode(n, g, deps, nd, &c, cuctx);
}

/* Sets the value of the memset node of g (the producer) in its executable. */
static CUresult set_value(CUgraph g, CUgraphExec x, unsigned v) {
  CUgraphNode nodes[16];
  size_t n = 16;
  CUDA_MEMSET_NODE_PARAMS p = memset_params(v);
  CUresult r = cu.cuGraphGetNodes(g, nodes, &n);
  for (size_t i = 0; r == CUDA_SUCCESS && i < n && i < 16; i++) {
    CUgraphNodeType t;
    r = cu.cuGraphNodeGetType(nodes[i], &t);
    if (r == CUDA_SUCCESS && t == CU_GRAPH_NODE_TYPE_MEMSET)
      r = cu.cuGraphExecMemsetNodeSetParams(x, nodes[i], &p, cuctx);
  }
  return r;
}

/* Producer graph gp/xp launched on sp, then the consumer's xc (when not the
 * same) on sc, TRIALS times with a new value each; the slot checked after. */
static void replay(outcome *o, CUgraph gp, CUgraphExec xp, CUstream sp, CUgraphExec xc,
                   CUstream sc) {
  for (int t = 0; t < TRIALS; t++) {
    unsigned v = ++value;
    CU(set_value(gp, xp, v));
    CU(cu.cuGraphLaunch(xp, sp));
    if (xc != NULL && xc != xp)
      CU(cu.cuGraphLaunch(xc, sc));
    CU(cu.cuCtxSynchronize());
    check_slot(o, 0, v);
  }
out:
  return;
}

/* ---- the rows ---- */

static void row_eager_eager(outcome *o, bool use) {
  CUstream st[2] = {NULL, NULL};
  unsigned want[TRIALS];
  dlsync_lane lp, lc;
  CU(new_stream(&st[0]));
  CU(new_stream(&st[1]));
  CU(settle(st[0]));
  lp = dlsync_lane_stream(st[0]);
  lc = dlsync_lane_stream(st[1]);
  for (int t = 0; t < TRIALS; t++) {
    dlsync_exchange *ex = NULL;
    want[t] = ++value;
    CU(produce(st[0], want[t]));
    if (use)
      DS(dlsync_exchange_begin(&ex, ctx, &lp, &lc), DLSYNC_SUCCESS);
    CU(consume(st[1], t));
    if (use)
      DS(dlsync_exchange_end(ex), DLSYNC_SUCCESS);
  }
  CU(cu.cuCtxSynchronize());
  for (int t = 0; t < TRIALS; t++)
    check_slot(o, t, want[t]);
out:
  drop(st, 2, NULL, NULL);
}

/* Producer capturing, consumer eager: the consumer joins the capture. */
static void row_join(outcome *o, bool use) {
  CUstream st[3] = {NULL, NULL, NULL};
  CUgraph g = NULL;
  CUgraphExec x = NULL;
  dlsync_lane lp, lc;
  dlsync_exchange *ex = NULL;
  for (int i = 0; i < 3; i++)
    CU(new_stream(&st[i]));
  CU(settle(st[0]));
  lp = dlsync_lane_stream(st[0]);
  lc = dlsync_lane_stream(st[1]);
  CU(cu.cuStreamBeginCapture(st[0], CU_STREAM_CAPTURE_MODE_GLOBAL));
  CU(produce(st[0], 7));
  if (use)
    DS(dlsync_exchange_begin(&ex, ctx, &lp, &lc), DLSYNC_SUCCESS);
  CU(consume(st[1], 0));
  if (use)
    DS(dlsync_exchange_end(ex), DLSYNC_SUCCESS);
  CU(cu.cuStreamEndCapture(st[0], &g));
  CU(cu.cuGraphInstantiateWithFlags(&x, g, 0));
  CU(cu.cuCtxSynchronize());
  replay(o, g, x, st[2], NULL, st[2]);
out:
  drop(st, 3, g, x);
}

/* Two captures: a record node in the producer's, a wait node in the
 * consumer's; end cannot order the producer after a graph not yet launched
 * and says so (DLSYNC_ERROR_CAPTURE_ORDER). */
static void row_two_captures(outcome *o, bool use) {
  CUstream st[2] = {NULL, NULL};
  CUgraph g1 = NULL, g2 = NULL;
  CUgraphExec x1 = NULL, x2 = NULL;
  dlsync_lane lp, lc;
  dlsync_exchange *ex = NULL;
  CU(new_stream(&st[0]));
  CU(new_stream(&st[1]));
  CU(settle(st[0]));
  lp = dlsync_lane_stream(st[0]);
  lc = dlsync_lane_stream(st[1]);
  CU(cu.cuStreamBeginCapture(st[0], CU_STREAM_CAPTURE_MODE_GLOBAL));
  CU(cu.cuStreamBeginCapture(st[1], CU_STREAM_CAPTURE_MODE_GLOBAL));
  CU(produce(st[0], 7));
  if (use)
    DS(dlsync_exchange_begin(&ex, ctx, &lp, &lc), DLSYNC_SUCCESS);
  CU(consume(st[1], 0));
  if (use)
    DS(dlsync_exchange_end(ex), DLSYNC_ERROR_CAPTURE_ORDER);
  CU(cu.cuStreamEndCapture(st[1], &g2));
  CU(cu.cuStreamEndCapture(st[0], &g1));
  CU(cu.cuGraphInstantiateWithFlags(&x1, g1, 0));
  CU(cu.cuGraphInstantiateWithFlags(&x2, g2, 0));
  replay(o, g1, x1, st[0], x2, st[1]);
out:
  if (x2 != NULL)
    (void)cu.cuGraphExecDestroy(x2);
  if (g2 != NULL)
    (void)cu.cuGraphDestroy(g2);
  drop(st, 2, g1, x1);
}

/* Producer eager, consumer capturing: a wait node on an event recorded on
 * the producer; each graph launched once. */
static void row_eager_capturing(outcome *o, bool use) {
  CUstream st[3] = {NULL, NULL, NULL};
  dlsync_lane lp, lc;
  for (int i = 0; i < 3; i++)
    CU(new_stream(&st[i]));
  CU(settle(st[0]));
  lp = dlsync_lane_stream(st[0]);
  lc = dlsync_lane_stream(st[1]);
  for (int t = 0; t < TRIALS; t++) {
    CUgraph g = NULL;
    CUgraphExec x = NULL;
    dlsync_exchange *ex = NULL;
    unsigned v = ++value;
    CUresult r;
    CU(produce(st[0], v));
    CU(cu.cuStreamBeginCapture(st[1], CU_STREAM_CAPTURE_MODE_GLOBAL));
    if (use)
      DS(dlsync_exchange_begin(&ex, ctx, &lp, &lc), DLSYNC_SUCCESS);
    CU(consume(st[1], t));
    if (use)
      DS(dlsync_exchange_end(ex), DLSYNC_ERROR_CAPTURE_ORDER);
    CU(cu.cuStreamEndCapture(st[1], &g));
    r = cu.cuGraphInstantiateWithFlags(&x, g, 0);
    if (r == CUDA_SUCCESS)
      r = cu.cuGraphLaunch(x, st[2]);
    if (r == CUDA_SUCCESS)
      r = cu.cuCtxSynchronize();
    if (x != NULL)
      (void)cu.cuGraphExecDestroy(x);
    (void)cu.cuGraphDestroy(g);
    CU(r);
    check_slot(o, t, v);
  }
out:
  drop(st, 3, NULL, NULL);
}

/* Producer eager, consumer a graph built by hand: a wait node appended. */
static void row_eager_built(outcome *o, bool use) {
  CUstream st[2] = {NULL, NULL};
  dlsync_lane lp;
  CU(new_stream(&st[0]));
  CU(new_stream(&st[1]));
  CU(settle(st[0]));
  lp = dlsync_lane_stream(st[0]);
  for (int t = 0; t < TRIALS; t++) {
    CUgraph g = NULL;
    CUgraphExec x = NULL;
    CUgraphNode cp = NULL, deps[2];
    dlsync_lane lc;
    dlsync_exchange *ex = NULL;
    unsigned v = ++value;
    CUresult r;
    CU(cu.cuGraphCreate(&g, 0));
    lc = dlsync_lane_graph(g, deps, 0, 2);
    r = produce(st[0], v);
    if (r == CUDA_SUCCESS && use && dlsync_exchange_begin(&ex, ctx, &lp, &lc) != DLSYNC_SUCCESS) {
      snprintf(o->note, sizeof o->note, "begin: %s", dlsync_last_error());
      o->errors++;
    }
    if (r == CUDA_SUCCESS)
      r = add_copy_node(&cp, g, lc.deps, lc.ndeps, t);
    if (r == CUDA_SUCCESS && ex != NULL) {
      lc.deps[0] = cp;
      lc.ndeps = 1;
      if (dlsync_exchange_end(ex) != DLSYNC_ERROR_CAPTURE_ORDER) {
        snprintf(o->note, sizeof o->note, "end: %s", dlsync_last_error());
        o->errors++;
      }
    }
    if (r == CUDA_SUCCESS)
      r = cu.cuGraphInstantiateWithFlags(&x, g, 0);
    if (r == CUDA_SUCCESS)
      r = cu.cuGraphLaunch(x, st[1]);
    if (r == CUDA_SUCCESS)
      r = cu.cuCtxSynchronize();
    if (x != NULL)
      (void)cu.cuGraphExecDestroy(x);
    (void)cu.cuGraphDestroy(g);
    CU(r);
    check_slot(o, t, v);
  }
out:
  drop(st, 2, NULL, NULL);
}

/* Two graphs built by hand: a record node in the producer's, a wait node in
 * the consumer's. */
static void row_built_built(outcome *o, bool use) {
  CUstream st[2] = {NULL, NULL};
  CUgraph g1 = NULL, g2 = NULL;
  CUgraphExec x1 = NULL, x2 = NULL;
  CUgraphNode m = NULL, cp = NULL, pdeps[4], cdeps[4];
  CUDA_MEMSET_NODE_PARAMS p = memset_params(7);
  dlsync_lane lp, lc;
  dlsync_exchange *ex = NULL;
  CU(new_stream(&st[0]));
  CU(new_stream(&st[1]));
  CU(settle(st[0]));
  CU(cu.cuGraphCreate(&g1, 0));
  CU(cu.cuGraphCreate(&g2, 0));
  CU(cu.cuGraphAddMemsetNode(&m, g1, NULL, 0, &p, cuctx));
  pdeps[0] = m;
  lp = dlsync_lane_graph(g1, pdeps, 1, 4);
  lc = dlsync_lane_graph(g2, cdeps, 0, 4);
  if (use)
    DS(dlsync_exchange_begin(&ex, ctx, &lp, &lc), DLSYNC_SUCCESS);
  CU(add_copy_node(&cp, g2, lc.deps, lc.ndeps, 0));
  if (use) {
    lc.deps[0] = cp;
    lc.ndeps = 1;
    DS(dlsync_exchange_end(ex), DLSYNC_ERROR_CAPTURE_ORDER);
  }
  CU(cu.cuGraphInstantiateWithFlags(&x1, g1, 0));
  CU(cu.cuGraphInstantiateWithFlags(&x2, g2, 0));
  replay(o, g1, x1, st[0], x2, st[1]);
out:
  if (x2 != NULL)
    (void)cu.cuGraphExecDestroy(x2);
  if (g2 != NULL)
    (void)cu.cuGraphDestroy(g2);
  drop(st, 2, g1, x1);
}

/* A fence signalled after the producer, waited on by the consumer. */
static void row_fence(outcome *o, bool use) {
  CUstream st[2] = {NULL, NULL};
  unsigned want[TRIALS];
  dlsync_lane lp, lc;
  CU(new_stream(&st[0]));
  CU(new_stream(&st[1]));
  CU(settle(st[0]));
  lp = dlsync_lane_stream(st[0]);
  lc = dlsync_lane_stream(st[1]);
  for (int t = 0; t < TRIALS; t++) {
    dlsync_fence *f = NULL;
    want[t] = ++value;
    CU(produce(st[0], want[t]));
    if (use) {
      DS(dlsync_fence_signal(&f, ctx, &lp), DLSYNC_SUCCESS);
      if (dlsync_fence_wait(f, &lc) != DLSYNC_SUCCESS) {
        snprintf(o->note, sizeof o->note, "fence wait: %s", dlsync_last_error());
        o->errors++;
      }
      dlsync_fence_release(f);
    }
    CU(consume(st[1], t));
    /* The next producer must not overwrite the buffer before this read. */
    CU(cu.cuStreamSynchronize(st[1]));
  }
  CU(cu.cuCtxSynchronize());
  for (int t = 0; t < TRIALS; t++)
    check_slot(o, t, want[t]);
out:
  drop(st, 2, NULL, NULL);
}

typedef struct seen {
  unsigned value;
  CUresult r;
  int calls;
} seen;

/* A deleter that reads the buffer's last word (on dlsync's reclaimer thread
 * when released through dlsync). */
static void reading_deleter(void *arg) {
  seen *sn = arg;
  CUcontext popped;
  sn->r = cu.cuCtxPushCurrent(cuctx);
  if (sn->r == CUDA_SUCCESS) {
    sn->r = cu.cuMemcpyDtoH(&sn->value, big + (words - 1) * 4, 4);
    (void)cu.cuCtxPopCurrent(&popped);
  }
  __atomic_add_fetch(&sn->calls, 1, __ATOMIC_SEQ_CST);
}

/* Stream-ordered release: the deleter runs after the producer. The control
 * calls it at once, as a plain deleter would be. */
static void row_release(outcome *o, bool use) {
  CUstream st[1] = {NULL};
  dlsync_lane l;
  CU(new_stream(&st[0]));
  CU(settle(st[0]));
  l = dlsync_lane_stream(st[0]);
  for (int t = 0; t < TRIALS; t++) {
    seen sn;
    unsigned v = ++value;
    int waited = 0;
    memset(&sn, 0, sizeof sn);
    CU(produce(st[0], v));
    if (use) {
      DS(dlsync_release(ctx, &l, reading_deleter, &sn), DLSYNC_SUCCESS);
      while (__atomic_load_n(&sn.calls, __ATOMIC_SEQ_CST) == 0 && waited++ < 3000) {
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
      }
    } else {
      reading_deleter(&sn);
    }
    CU(cu.cuStreamSynchronize(st[0]));
    if (__atomic_load_n(&sn.calls, __ATOMIC_SEQ_CST) != 1 || sn.r != CUDA_SUCCESS) {
      snprintf(o->note, sizeof o->note, "the deleter ran %d times (CUresult %d)", sn.calls,
               (int)sn.r);
      o->errors++;
      goto out;
    }
    o->runs++;
    o->stale += sn.value != v;
  }
out:
  drop(st, 1, NULL, NULL);
}

/* The launch-time event rule that TWO_CAPTURES, CAPTURE_TO_BUILT and the
 * fences rest on: a wait node orders after the launch, issued before its
 * own graph's, of the graph holding the record node, on another stream. The
 * record graph's stream is idle in even trials and busy in odd ones (an
 * eager producer queued first, so that the record runs late): the waiting
 * graph, launched at once on an idle stream, must still read the record
 * graph's value. */
static void row_launch_rule(outcome *o, bool use) {
  CUstream st[2] = {NULL, NULL};
  CUgraph g1 = NULL, g2 = NULL;
  CUgraphExec x1 = NULL, x2 = NULL;
  dlsync_lane lp, lc;
  CU(new_stream(&st[0]));
  CU(new_stream(&st[1]));
  CU(settle(st[0]));
  lp = dlsync_lane_stream(st[0]);
  lc = dlsync_lane_stream(st[1]);
  CU(cu.cuStreamBeginCapture(st[0], CU_STREAM_CAPTURE_MODE_GLOBAL));
  CU(cu.cuStreamBeginCapture(st[1], CU_STREAM_CAPTURE_MODE_GLOBAL));
  CU(produce(st[0], 7));
  if (use)
    DS(dlsync_order(ctx, &lp, &lc), DLSYNC_SUCCESS); /* TWO_CAPTURES */
  CU(consume(st[1], 0));
  CU(cu.cuStreamEndCapture(st[1], &g2));
  CU(cu.cuStreamEndCapture(st[0], &g1));
  CU(cu.cuGraphInstantiateWithFlags(&x1, g1, 0));
  CU(cu.cuGraphInstantiateWithFlags(&x2, g2, 0));
  for (int t = 0; t < TRIALS; t++) {
    unsigned v = ++value;
    CU(set_value(g1, x1, v));
    if (t % 2 == 1)
      CU(produce(st[0], ++value)); /* the record graph's stream busy */
    CU(cu.cuGraphLaunch(x1, st[0]));
    CU(cu.cuGraphLaunch(x2, st[1]));
    CU(cu.cuCtxSynchronize());
    check_slot(o, 0, v);
  }
out:
  if (x2 != NULL)
    (void)cu.cuGraphExecDestroy(x2);
  if (g2 != NULL)
    (void)cu.cuGraphDestroy(g2);
  drop(st, 2, g1, x1);
}

typedef struct row {
  const char *name;
  void (*fn)(outcome *o, bool use);
} row;

static const row rows[] = {
    {"eager -> eager", row_eager_eager},
    {"join (capturing -> eager)", row_join},
    {"two captures", row_two_captures},
    {"eager -> capturing", row_eager_capturing},
    {"eager -> built", row_eager_built},
    {"built -> built", row_built_built},
    {"fence (eager)", row_fence},
    {"release (eager)", row_release},
    {"launch rule (2 streams)", row_launch_rule},
};

/* ---- setup ---- */

static int load_driver(FILE *f) {
  void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (lib == NULL) {
    fprintf(f, "selftest: no CUDA driver (%s): nothing to test\n", dlerror());
    return SELFTEST_NO_GPU;
  }
#define RESOLVE(name)                                          \
  *(void **)&cu.name = dlsym(lib, STR(name));                  \
  if (cu.name == NULL) {                                       \
    fprintf(f, "selftest: the driver has no %s\n", STR(name)); \
    return 1;                                                  \
  }
  ENTRIES(RESOLVE)
#undef RESOLVE
  return 0;
}

static int setup(FILE *f, int *driver_version) {
  int n = 0, rc;
  size_t free_b = 0, total_b = 0;
  if ((rc = load_driver(f)) != 0)
    return rc;
  if (cu.cuInit(0) != CUDA_SUCCESS || cu.cuDeviceGetCount(&n) != CUDA_SUCCESS || n == 0) {
    fprintf(f, "selftest: the driver finds no GPU: nothing to test\n");
    return SELFTEST_NO_GPU;
  }
  (void)cu.cuDriverGetVersion(driver_version);
  if (cu.cuDeviceGet(&dev, 0) != CUDA_SUCCESS ||
      cu.cuDevicePrimaryCtxRetain(&cuctx, dev) != CUDA_SUCCESS ||
      cu.cuCtxPushCurrent(cuctx) != CUDA_SUCCESS) {
    fprintf(f, "selftest: cannot make GPU 0's primary context current\n");
    return 1;
  }
  if (dlsync_context_create(&ctx, NULL) != DLSYNC_SUCCESS) {
    fprintf(f, "selftest: dlsync_context_create: %s\n", dlsync_last_error());
    return 1;
  }
  (void)cu.cuMemGetInfo(&free_b, &total_b);
  for (words = MAX_WORDS; words >= MIN_WORDS; words /= 2)
    if (words * 4 * 2 <= free_b && cu.cuMemAlloc(&big, words * 4) == CUDA_SUCCESS)
      break;
  if (words < MIN_WORDS || cu.cuMemAlloc(&slots, SLOTS * 4) != CUDA_SUCCESS) {
    fprintf(f, "selftest: cannot allocate the test buffers on GPU 0\n");
    return 1;
  }
  return 0;
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int selftest_run(FILE *f) {
  int rc, failed = 0, driver_version = 0;
  double t0 = now_s();
  CUcontext popped;
  /* Different values on each run: a stale slot from an earlier run never
   * passes for a right one. */
  value = (unsigned)time(NULL) * 2654435761u ^ (unsigned)getpid() << 8;
  rc = setup(f, &driver_version);
  if (rc != 0)
    goto cleanup;
  fprintf(f, "dlsync %s selftest on GPU 0, driver %d.%d, producer %zu MiB memset, %d trials\n",
          dlsync_version_string(), driver_version / 1000, driver_version % 1000 / 10,
          words * 4 >> 20, TRIALS);
  fprintf(f, "%-27s %-16s %-22s %s\n", "row", "with dlsync", "control (no ordering)", "result");
  for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
    outcome with, without;
    const char *verdict;
    memset(&with, 0, sizeof with);
    memset(&without, 0, sizeof without);
    rows[i].fn(&with, true);
    rows[i].fn(&without, false);
    if (with.errors != 0 || with.stale != 0 || with.runs == 0)
      verdict = "FAIL";
    else if (without.errors != 0 || without.stale == 0)
      verdict = "FAIL (the control could not fail)";
    else
      verdict = "ok";
    failed += verdict[0] != 'o';
    fprintf(f, "%-27s %2d/%d right%5s stale %2d/%d%10s %s\n", rows[i].name, with.runs - with.stale,
            with.runs, "", without.stale, without.runs, "", verdict);
    if (with.note[0] != '\0')
      fprintf(f, "  with dlsync: %s\n", with.note);
    if (without.note[0] != '\0')
      fprintf(f, "  control: %s\n", without.note);
  }
  fprintf(f, "selftest: %s (%zu rows, %.1f s)\n", failed == 0 ? "PASS" : "FAIL",
          sizeof rows / sizeof rows[0], now_s() - t0);
  rc = failed == 0 ? 0 : 1;
cleanup:
  if (ctx != NULL && dlsync_context_destroy(ctx) != DLSYNC_SUCCESS) {
    fprintf(f, "selftest: dlsync_context_destroy: %s\n", dlsync_last_error());
    rc = 1;
  }
  if (big != 0)
    (void)cu.cuMemFree(big);
  if (slots != 0)
    (void)cu.cuMemFree(slots);
  if (cuctx != NULL) {
    (void)cu.cuCtxPopCurrent(&popped);
    (void)cu.cuDevicePrimaryCtxRelease(dev);
  }
  return rc;
}
