/* SPDX-License-Identifier: Apache-2.0 */
/* The graph-capture regression suite, on a real GPU.
 *
 * Every row of the decision table (include/dlsync/exchange.h), in each capture
 * mode where a capture is involved: a producer that runs about a millisecond
 * (cuMemsetD32Async over a 4 GiB buffer, a new value each time) and a
 * consumer that copies the buffer's last word into a result slot. A consumer
 * that is not ordered after the producer reads the previous value. Captured
 * graphs are replayed many times with the memset value changed before each
 * launch (cuGraphExecMemsetNodeSetParams), and the slot is checked after each.
 *
 * Each scenario runs twice: with dlsync, where every read must be right and
 * every capture must end cleanly, and as a negative control without dlsync,
 * which must show wrong data or a broken capture (so the scenario is known to
 * be able to fail). One table is printed at the end; exit 0 when all pass,
 * 1 otherwise, 77 where no GPU is found.
 */
#include <dlfcn.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <unistd.h>

#include "order/table.h"
#include "gpu_common.h"

#define REPLAYS 50
#define TRIALS 20
#define BIG_WORDS ((size_t)1 << 30) /* 4 GiB of uint32 */
#define WORKER_WORDS ((size_t)1 << 28)
#define WORKERS 4
#define SLOTS 256

static gpu_env E;
static const dlsync__driver *D;
static CUdeviceptr big_buf;
static CUdeviceptr slots;
static unsigned value_base = 1000;

typedef struct outcome {
  int runs;
  int wrong;  /* reads that saw another value than the producer's */
  int broken; /* captures that failed to end, graphs that failed */
  char note[200];
} outcome;

typedef struct scenario {
  const char *name;
  const char *row;
  int (*fn)(const struct scenario *s, CUstreamCaptureMode mode, bool use, outcome *o);
  bool modes;            /* run in GLOBAL, THREAD_LOCAL and RELAXED */
  bool control_can_fail; /* false: stream order alone is enough (same stream) */
  /* Variants of the eager and join rows: the flags their begins pass, and
   * whether the join row warms its streams (one eager exchange first) so
   * that its begin in capture takes the fast path (which asks about the
   * consumer only) instead of the general one. */
  uint32_t flags;
  bool warm;
  /* The row of the decision table the scenario runs (DLSYNC__ROW_COUNT: a
   * mix, or none), printed by its name. */
  dlsync__row table_row;
} scenario;

static void note(outcome *o, const char *fmt, ...) {
  va_list ap;
  if (o->note[0] != '\0')
    return;
  va_start(ap, fmt);
  vsnprintf(o->note, sizeof o->note, fmt, ap);
  va_end(ap);
}

#define CU(call)                                                          \
  do {                                                                    \
    CUresult r_ = (call);                                                 \
    if (r_ != CUDA_SUCCESS) {                                             \
      note(o, "%s:%d %s: %s", __FILE__, __LINE__, #call, gpu_err(D, r_)); \
      o->broken++;                                                        \
      goto out;                                                           \
    }                                                                     \
  } while (0)

#define DS(call)                                                                         \
  do {                                                                                   \
    dlsync_status s_ = (call);                                                           \
    if (s_ != DLSYNC_SUCCESS) {                                                          \
      note(o, "line %d: %s: %s", __LINE__, dlsync_status_name(s_), dlsync_last_error()); \
      o->broken++;                                                                       \
      goto out;                                                                          \
    }                                                                                    \
  } while (0)

/* A call that must fail with `want` (end across graphs, for example). */
#define DS_EXPECT(call, want)                                                        \
  do {                                                                               \
    dlsync_status s_ = (call);                                                       \
    if (s_ != (want)) {                                                              \
      note(o, "line %d: got %s, expected %s (%s)", __LINE__, dlsync_status_name(s_), \
           dlsync_status_name(want), dlsync_last_error());                           \
      o->broken++;                                                                   \
      goto out;                                                                      \
    }                                                                                \
  } while (0)

/* Ends a capture that must end cleanly. */
#define END_CAPTURE(s, g)                                \
  do {                                                   \
    CUresult e_ = D->StreamEndCapture((s), (g));         \
    if (e_ != CUDA_SUCCESS) {                            \
      note(o, "cuStreamEndCapture: %s", gpu_err(D, e_)); \
      o->broken++;                                       \
      goto out;                                          \
    }                                                    \
  } while (0)

static CUresult produce(CUstream s, CUdeviceptr buf, size_t words, unsigned v) {
  return D->MemsetD32Async(buf, v, words, s);
}

static CUresult consume(CUstream s, CUdeviceptr buf, size_t words, int slot) {
  return D->MemcpyDtoDAsync(slots + (CUdeviceptr)slot * 4, buf + (words - 1) * 4, 4, s);
}

static CUresult read_slot(unsigned *out, int slot) {
  return D->MemcpyDtoH(out, slots + (CUdeviceptr)slot * 4, 4);
}

static CUresult new_stream(CUstream *s) {
  return D->StreamCreate(s, CU_STREAM_NON_BLOCKING);
}

static void drop_stream(CUstream s) {
  if (s != NULL)
    D->StreamDestroy(s);
}

static void drop_graph(CUgraph g, CUgraphExec x) {
  if (x != NULL)
    D->GraphExecDestroy(x);
  if (g != NULL)
    D->GraphDestroy(g);
}

/* Sets every memset node of `g` (in its executable `x`) to value v. */
static CUresult set_memset_value(CUgraph g, CUgraphExec x, unsigned v) {
  CUgraphNode nodes[64];
  size_t n = 64;
  CUresult r = D->GraphGetNodes(g, nodes, &n);
  if (r != CUDA_SUCCESS)
    return r;
  for (size_t i = 0; i < n && i < 64; i++) {
    CUgraphNodeType t;
    CUDA_MEMSET_NODE_PARAMS p;
    if ((r = D->GraphNodeGetType(nodes[i], &t)) != CUDA_SUCCESS)
      return r;
    if (t != CU_GRAPH_NODE_TYPE_MEMSET)
      continue;
    memset(&p, 0, sizeof p);
    p.dst = big_buf;
    p.value = v;
    p.elementSize = 4;
    p.width = BIG_WORDS;
    p.height = 1;
    p.pitch = 0;
    if ((r = D->GraphExecMemsetNodeSetParams(x, nodes[i], &p, E.cuctx)) != CUDA_SUCCESS)
      return r;
  }
  return CUDA_SUCCESS;
}

static size_t count_nodes(CUgraph g, CUgraphNodeType type) {
  CUgraphNode nodes[64];
  size_t n = 64, c = 0;
  if (D->GraphGetNodes(g, nodes, &n) != CUDA_SUCCESS)
    return (size_t)-1;
  for (size_t i = 0; i < n && i < 64; i++) {
    CUgraphNodeType t;
    if (D->GraphNodeGetType(nodes[i], &t) == CUDA_SUCCESS && t == type)
      c++;
  }
  return c;
}

/* Replays: producer graph gp/xp on sp and (if different) consumer graph
 * gc/xc on sc; the memset value changes before each launch; the slot is
 * checked after each. */
static int replay(outcome *o, CUgraph gp, CUgraphExec xp, CUstream sp, CUgraphExec xc, CUstream sc,
                  int slot) {
  for (int r = 0; r < REPLAYS; r++) {
    unsigned v = ++value_base, got = 0;
    CU(set_memset_value(gp, xp, v));
    CU(D->GraphLaunch(xp, sp));
    if (xc != NULL && xc != xp)
      CU(D->GraphLaunch(xc, sc));
    CU(D->StreamSynchronize(sp));
    CU(D->StreamSynchronize(sc));
    CU(read_slot(&got, slot));
    o->runs++;
    if (got != v)
      o->wrong++;
  }
out:
  return 0;
}

/* Settles a buffer to a known value before a scenario. */
static CUresult settle(CUstream s) {
  CUresult r = produce(s, big_buf, BIG_WORDS, ++value_base);
  if (r == CUDA_SUCCESS)
    r = D->StreamSynchronize(s);
  return r;
}

/* ---- A: plain streams ---- */

static int sc_same_stream(const scenario *s, CUstreamCaptureMode mode, bool use, outcome *o) {
  CUstream st = NULL;
  dlsync_lane l;
  (void)s;
  (void)mode;
  CU(new_stream(&st));
  CU(settle(st));
  l = dlsync_lane_stream(st);
  for (int t = 0; t < TRIALS; t++) {
    unsigned v = ++value_base, got = 0;
    dlsync_exchange *ex = NULL;
    CU(produce(st, big_buf, BIG_WORDS, v));
    if (use)
      DS(dlsync_exchange_begin(&ex, E.ctx, &l, &l));
    CU(consume(st, big_buf, BIG_WORDS, t));
    if (use)
      DS(dlsync_exchange_end(ex));
    CU(D->StreamSynchronize(st));
    CU(read_slot(&got, t));
    o->runs++;
    o->wrong += got != v;
  }
out:
  drop_stream(st);
  return 0;
}

static int sc_eager_eager(const scenario *s, CUstreamCaptureMode mode, bool use, outcome *o) {
  CUstream p = NULL, c = NULL;
  unsigned want[TRIALS];
  dlsync_lane lp, lc;
  (void)mode;
  CU(new_stream(&p));
  CU(new_stream(&c));
  CU(settle(p));
  lp = dlsync_lane_stream(p);
  lc = dlsync_lane_stream(c);
  /* No host sync between trials: end must keep trial t+1's memset from
   * overwriting the buffer before trial t's copy has read it. */
  for (int t = 0; t < TRIALS; t++) {
    dlsync_exchange *ex = NULL;
    want[t] = ++value_base;
    CU(produce(p, big_buf, BIG_WORDS, want[t]));
    if (use)
      DS(dlsync_exchange_begin_flags(&ex, E.ctx, &lp, &lc, s->flags));
    CU(consume(c, big_buf, BIG_WORDS, t));
    if (use)
      DS(dlsync_exchange_end(ex));
  }
  CU(D->CtxSynchronize());
  for (int t = 0; t < TRIALS; t++) {
    unsigned got = 0;
    CU(read_slot(&got, t));
    o->runs++;
    o->wrong += got != want[t];
  }
out:
  D->CtxSynchronize();
  drop_stream(p);
  drop_stream(c);
  return 0;
}

/* ---- many producers, one consumer (dlsync_exchange_begin_many) ---- */

#define HALF_WORDS (BIG_WORDS / 2)

/* Two eager producers, each writing one half of the buffer (2 GiB each), and
 * a consumer that reads the last word of both halves: ordered after each. */
static int sc_many_eager(const scenario *s, CUstreamCaptureMode mode, bool use, outcome *o) {
  CUstream p = NULL, q = NULL, c = NULL;
  unsigned want[TRIALS];
  dlsync_lane lps[3], lc;
  (void)s;
  (void)mode;
  CU(new_stream(&p));
  CU(new_stream(&q));
  CU(new_stream(&c));
  CU(settle(p));
  lps[0] = dlsync_lane_stream(p);
  lps[1] = dlsync_lane_stream(q);
  lps[2] = dlsync_lane_stream(p); /* given twice: ordered once */
  lc = dlsync_lane_stream(c);
  for (int t = 0; t < TRIALS / 2; t++) {
    dlsync_exchange *ex = NULL;
    want[t] = ++value_base;
    CU(produce(p, big_buf, HALF_WORDS, want[t]));
    CU(produce(q, big_buf + HALF_WORDS * 4, HALF_WORDS, want[t]));
    if (use)
      DS(dlsync_exchange_begin_many(&ex, E.ctx, lps, 3, &lc, 0));
    CU(consume(c, big_buf, HALF_WORDS, 2 * t));
    CU(consume(c, big_buf + HALF_WORDS * 4, HALF_WORDS, 2 * t + 1));
    if (use)
      DS(dlsync_exchange_end(ex));
  }
  CU(D->CtxSynchronize());
  for (int t = 0; t < TRIALS / 2; t++) {
    unsigned a = 0, b = 0;
    CU(read_slot(&a, 2 * t));
    CU(read_slot(&b, 2 * t + 1));
    o->runs++;
    o->wrong += a != want[t] || b != want[t];
  }
out:
  D->CtxSynchronize();
  drop_stream(p);
  drop_stream(q);
  drop_stream(c);
  return 0;
}

/* Two producers in one capture (q forked from p), an eager consumer: one
 * join for both, no event node, a clean end of capture, right replays. */
static int sc_many_join(const scenario *s, CUstreamCaptureMode mode, bool use, outcome *o) {
  CUstream p = NULL, q = NULL, c = NULL, launch = NULL;
  CUevent fork = NULL, join = NULL;
  CUgraph g = NULL;
  CUgraphExec x = NULL;
  dlsync_lane lps[2], lc;
  dlsync_exchange *ex = NULL;
  (void)s;
  CU(new_stream(&p));
  CU(new_stream(&q));
  CU(new_stream(&c));
  CU(new_stream(&launch));
  CU(D->EventCreate(&fork, CU_EVENT_DISABLE_TIMING));
  CU(D->EventCreate(&join, CU_EVENT_DISABLE_TIMING));
  CU(settle(p));
  lps[0] = dlsync_lane_stream(p);
  lps[1] = dlsync_lane_stream(q);
  lc = dlsync_lane_stream(c);
  CU(D->StreamBeginCapture(p, mode));
  CU(D->EventRecord(fork, p));
  CU(D->StreamWaitEvent(q, fork, 0));
  CU(produce(p, big_buf, BIG_WORDS, 7));
  CU(produce(q, big_buf, BIG_WORDS, 7));
  if (use)
    DS(dlsync_exchange_begin_many(&ex, E.ctx, lps, 2, &lc, 0));
  CU(consume(c, big_buf, BIG_WORDS, 0));
  if (use)
    DS(dlsync_exchange_end(ex));
  CU(D->EventRecord(join, q));
  CU(D->StreamWaitEvent(p, join, 0));
  END_CAPTURE(p, &g);
  if (use && (count_nodes(g, CU_GRAPH_NODE_TYPE_EVENT_RECORD) != 0 ||
              count_nodes(g, CU_GRAPH_NODE_TYPE_WAIT_EVENT) != 0)) {
    note(o, "begin_many in one capture added event nodes");
    o->broken++;
  }
  CU(D->GraphInstantiateWithFlags(&x, g, 0));
  CU(D->CtxSynchronize());
  replay(o, g, x, launch, NULL, launch, 0);
out:
  D->CtxSynchronize();
  drop_graph(g, x);
  drop_stream(p);
  drop_stream(q);
  drop_stream(c);
  drop_stream(launch);
  if (fork)
    D->EventDestroy(fork);
  if (join)
    D->EventDestroy(join);
  return 0;
}

/* ---- C: stream capture ---- */

/* Producer capturing, consumer an eager stream: the consumer joins. */
static int sc_join(const scenario *s, CUstreamCaptureMode mode, bool use, outcome *o) {
  CUstream p = NULL, c = NULL, launch = NULL;
  CUgraph g = NULL;
  CUgraphExec x = NULL;
  dlsync_lane lp, lc;
  dlsync_exchange *ex = NULL;
  CU(new_stream(&p));
  CU(new_stream(&c));
  CU(new_stream(&launch));
  CU(settle(p));
  lp = dlsync_lane_stream(p);
  lc = dlsync_lane_stream(c);
  if (use && s->warm) {
    DS(dlsync_exchange_begin_flags(&ex, E.ctx, &lp, &lc, s->flags));
    DS(dlsync_exchange_end(ex));
    ex = NULL;
  }
  CU(D->StreamBeginCapture(p, mode));
  CU(produce(p, big_buf, BIG_WORDS, 7));
  if (use)
    DS(dlsync_exchange_begin_flags(&ex, E.ctx, &lp, &lc, s->flags));
  CU(consume(c, big_buf, BIG_WORDS, 0));
  if (use)
    DS(dlsync_exchange_end(ex));
  END_CAPTURE(p, &g);
  if (use && (count_nodes(g, CU_GRAPH_NODE_TYPE_EVENT_RECORD) != 0 ||
              count_nodes(g, CU_GRAPH_NODE_TYPE_WAIT_EVENT) != 0)) {
    note(o, "the join added event nodes");
    o->broken++;
  }
  if (count_nodes(g, CU_GRAPH_NODE_TYPE_MEMSET) != 1) {
    note(o, "expected the producer as one memset node, found %zu",
         count_nodes(g, CU_GRAPH_NODE_TYPE_MEMSET));
    o->broken++;
  }
  CU(D->GraphInstantiateWithFlags(&x, g, 0));
  CU(D->CtxSynchronize());
  replay(o, g, x, launch, NULL, launch, 0);
out:
  D->CtxSynchronize();
  drop_graph(g, x);
  drop_stream(p);
  drop_stream(c);
  drop_stream(launch);
  return 0;
}

/* Both in one capture: the consumer was forked into it by the caller. */
static int sc_same_capture(const scenario *s, CUstreamCaptureMode mode, bool use, outcome *o) {
  CUstream p = NULL, c = NULL, launch = NULL;
  CUevent fork = NULL, join = NULL;
  CUgraph g = NULL;
  CUgraphExec x = NULL;
  dlsync_lane lp, lc;
  dlsync_exchange *ex = NULL;
  (void)s;
  CU(new_stream(&p));
  CU(new_stream(&c));
  CU(new_stream(&launch));
  CU(D->EventCreate(&fork, CU_EVENT_DISABLE_TIMING));
  CU(D->EventCreate(&join, CU_EVENT_DISABLE_TIMING));
  CU(settle(p));
  lp = dlsync_lane_stream(p);
  lc = dlsync_lane_stream(c);
  CU(D->StreamBeginCapture(p, mode));
  CU(D->EventRecord(fork, p));
  CU(D->StreamWaitEvent(c, fork, 0));
  CU(produce(p, big_buf, BIG_WORDS, 7));
  if (use)
    DS(dlsync_exchange_begin(&ex, E.ctx, &lp, &lc));
  CU(consume(c, big_buf, BIG_WORDS, 0));
  if (use) {
    DS(dlsync_exchange_end(ex));
  } else {
    CU(D->EventRecord(join, c));
    CU(D->StreamWaitEvent(p, join, 0));
  }
  END_CAPTURE(p, &g);
  if (use && (count_nodes(g, CU_GRAPH_NODE_TYPE_EVENT_RECORD) != 0 ||
              count_nodes(g, CU_GRAPH_NODE_TYPE_WAIT_EVENT) != 0)) {
    note(o, "same capture added event nodes");
    o->broken++;
  }
  CU(D->GraphInstantiateWithFlags(&x, g, 0));
  replay(o, g, x, launch, NULL, launch, 0);
out:
  D->CtxSynchronize();
  drop_graph(g, x);
  drop_stream(p);
  drop_stream(c);
  drop_stream(launch);
  if (fork)
    D->EventDestroy(fork);
  if (join)
    D->EventDestroy(join);
  return 0;
}

/* Instantiates g, launches it once on `launch`, waits, reads the slot and
 * destroys the graph and its executable whatever happened. */
static CUresult launch_once(CUgraph g, CUstream launch, int slot, unsigned *got) {
  CUgraphExec x = NULL;
  CUresult r = D->GraphInstantiateWithFlags(&x, g, 0);
  if (r == CUDA_SUCCESS)
    r = D->GraphLaunch(x, launch);
  if (r == CUDA_SUCCESS)
    r = D->StreamSynchronize(launch);
  if (r == CUDA_SUCCESS)
    r = read_slot(got, slot);
  drop_graph(g, x);
  return r;
}

/* Waits (up to a second) until graph-owned events are back in the pool: all
 * but those of this thread's open batch for built graphs (graph/: a batch's
 * events come back together once the thread lets go of it, at its last
 * event, its exit or context destroy). */
static bool events_came_back(void) {
  for (int i = 0; i < 1000; i++) {
    dlsync__pool_stats ps;
    dlsync__pool_stats_get(&ps, &E.ctx->pools);
    if (ps.graph_owned == dlsync__graph_built_held(&E.ctx->pools))
      return true;
    struct timespec ts = {0, 1000000};
    nanosleep(&ts, NULL);
  }
  return false;
}

/* Producer eager, consumer capturing: an external wait node. A fresh capture
 * per trial; each graph is launched once, then destroyed (its event must come
 * back to the pool). */
static int sc_eager_to_capture(const scenario *s, CUstreamCaptureMode mode, bool use, outcome *o) {
  CUstream p = NULL, c = NULL, launch = NULL;
  dlsync_lane lp, lc;
  (void)s;
  CU(new_stream(&p));
  CU(new_stream(&c));
  CU(new_stream(&launch));
  CU(settle(p));
  lp = dlsync_lane_stream(p);
  lc = dlsync_lane_stream(c);
  for (int t = 0; t < TRIALS; t++) {
    CUgraph g = NULL;
    dlsync_exchange *ex = NULL;
    unsigned v = ++value_base, got = 0;
    CUresult r;
    CU(produce(p, big_buf, BIG_WORDS, v));
    CU(D->StreamBeginCapture(c, mode));
    if (use)
      DS(dlsync_exchange_begin(&ex, E.ctx, &lp, &lc));
    CU(consume(c, big_buf, BIG_WORDS, t));
    if (use)
      DS_EXPECT(dlsync_exchange_end(ex), DLSYNC_ERROR_CAPTURE_ORDER);
    r = D->StreamEndCapture(c, &g);
    if (r != CUDA_SUCCESS) {
      note(o, "cuStreamEndCapture: %s", gpu_err(D, r));
      o->broken++;
      goto out;
    }
    if (use && count_nodes(g, CU_GRAPH_NODE_TYPE_WAIT_EVENT) != 1) {
      note(o, "expected one event-wait node");
      o->broken++;
    }
    r = launch_once(g, launch, t, &got);
    if (r != CUDA_SUCCESS) {
      note(o, "trial %d: %s", t, gpu_err(D, r));
      o->broken++;
      goto out;
    }
    CU(D->StreamSynchronize(p));
    o->runs++;
    o->wrong += got != v;
  }
  if (use && !events_came_back()) {
    note(o, "graph-owned events did not come back to the pool");
    o->broken++;
  }
out:
  D->CtxSynchronize();
  drop_stream(p);
  drop_stream(c);
  drop_stream(launch);
  return 0;
}

/* Two captures at once: record node in the producer's, wait node in the
 * consumer's; the producer's graph is launched first. */
static int sc_two_captures(const scenario *s, CUstreamCaptureMode mode, bool use, outcome *o) {
  CUstream p = NULL, c = NULL;
  CUgraph g1 = NULL, g2 = NULL;
  CUgraphExec x1 = NULL, x2 = NULL;
  dlsync_lane lp, lc;
  dlsync_exchange *ex = NULL;
  CUresult r1, r2;
  (void)s;
  CU(new_stream(&p));
  CU(new_stream(&c));
  CU(settle(p));
  lp = dlsync_lane_stream(p);
  lc = dlsync_lane_stream(c);
  CU(D->StreamBeginCapture(p, mode));
  CU(D->StreamBeginCapture(c, mode));
  CU(produce(p, big_buf, BIG_WORDS, 7));
  if (use)
    DS(dlsync_exchange_begin(&ex, E.ctx, &lp, &lc));
  CU(consume(c, big_buf, BIG_WORDS, 0));
  if (use)
    DS_EXPECT(dlsync_exchange_end(ex), DLSYNC_ERROR_CAPTURE_ORDER);
  r2 = D->StreamEndCapture(c, &g2);
  r1 = D->StreamEndCapture(p, &g1);
  if (r1 != CUDA_SUCCESS || r2 != CUDA_SUCCESS) {
    note(o, "cuStreamEndCapture: producer %s, consumer %s", gpu_err(D, r1), gpu_err(D, r2));
    o->broken++;
    goto out;
  }
  CU(D->GraphInstantiateWithFlags(&x1, g1, 0));
  CU(D->GraphInstantiateWithFlags(&x2, g2, 0));
  replay(o, g1, x1, p, x2, c, 0);
out:
  D->CtxSynchronize();
  drop_graph(g1, x1);
  drop_graph(g2, x2);
  drop_stream(p);
  drop_stream(c);
  if (use && !events_came_back()) {
    note(o, "graph-owned events did not come back to the pool");
    o->broken++;
  }
  return 0;
}

/* ---- B: graphs built by hand ---- */

static CUresult add_memset_node(CUgraphNode *n, CUgraph g, const CUgraphNode *deps, size_t nd) {
  CUDA_MEMSET_NODE_PARAMS p;
  memset(&p, 0, sizeof p);
  p.dst = big_buf;
  p.value = 7;
  p.elementSize = 4;
  p.width = BIG_WORDS;
  p.height = 1;
  return D->GraphAddMemsetNode(n, g, deps, nd, &p, E.cuctx);
}

static CUresult add_copy_node(CUgraphNode *n, CUgraph g, const CUgraphNode *deps, size_t nd,
                              int slot) {
  CUDA_MEMCPY3D c;
  memset(&c, 0, sizeof c);
  c.srcMemoryType = CU_MEMORYTYPE_DEVICE;
  c.srcDevice = big_buf + (BIG_WORDS - 1) * 4;
  c.dstMemoryType = CU_MEMORYTYPE_DEVICE;
  c.dstDevice = slots + (CUdeviceptr)slot * 4;
  c.WidthInBytes = 4;
  c.Height = 1;
  c.Depth = 1;
  return D->GraphAddMemcpyNode(n, g, deps, nd, &c, E.cuctx);
}

static int sc_built_same(const scenario *s, CUstreamCaptureMode mode, bool use, outcome *o) {
  CUstream launch = NULL;
  CUgraph g = NULL;
  CUgraphExec x = NULL;
  CUgraphNode m = NULL, cp = NULL, pdeps[4], cdeps[4];
  dlsync_lane lp, lc;
  dlsync_exchange *ex = NULL;
  (void)s;
  (void)mode;
  CU(new_stream(&launch));
  CU(settle(launch));
  CU(D->GraphCreate(&g, 0));
  CU(add_memset_node(&m, g, NULL, 0));
  pdeps[0] = m;
  lp = dlsync_lane_graph(g, pdeps, 1, 4);
  lc = dlsync_lane_graph(g, cdeps, 0, 4);
  if (use)
    DS(dlsync_exchange_begin(&ex, E.ctx, &lp, &lc));
  CU(add_copy_node(&cp, g, lc.deps, lc.ndeps, 0));
  if (use) {
    lc.deps[0] = cp;
    lc.ndeps = 1;
    DS(dlsync_exchange_end(ex));
    if (lp.ndeps != 2) {
      note(o, "producer frontier has %zu nodes, expected 2", lp.ndeps);
      o->broken++;
    }
    if (count_nodes(g, CU_GRAPH_NODE_TYPE_EVENT_RECORD) != 0) {
      note(o, "same graph got event nodes");
      o->broken++;
    }
  }
  CU(D->GraphInstantiateWithFlags(&x, g, 0));
  replay(o, g, x, launch, NULL, launch, 0);
out:
  D->CtxSynchronize();
  drop_graph(g, x);
  drop_stream(launch);
  return 0;
}

static int sc_built_two(const scenario *s, CUstreamCaptureMode mode, bool use, outcome *o) {
  CUstream sp = NULL, sc = NULL;
  CUgraph g1 = NULL, g2 = NULL;
  CUgraphExec x1 = NULL, x2 = NULL;
  CUgraphNode m = NULL, cp = NULL, pdeps[4], cdeps[4];
  dlsync_lane lp, lc;
  dlsync_exchange *ex = NULL;
  (void)s;
  (void)mode;
  CU(new_stream(&sp));
  CU(new_stream(&sc));
  CU(settle(sp));
  CU(D->GraphCreate(&g1, 0));
  CU(D->GraphCreate(&g2, 0));
  CU(add_memset_node(&m, g1, NULL, 0));
  pdeps[0] = m;
  lp = dlsync_lane_graph(g1, pdeps, 1, 4);
  lc = dlsync_lane_graph(g2, cdeps, 0, 4);
  if (use)
    DS(dlsync_exchange_begin(&ex, E.ctx, &lp, &lc));
  CU(add_copy_node(&cp, g2, lc.deps, lc.ndeps, 0));
  if (use) {
    lc.deps[0] = cp;
    lc.ndeps = 1;
    DS_EXPECT(dlsync_exchange_end(ex), DLSYNC_ERROR_CAPTURE_ORDER);
  }
  CU(D->GraphInstantiateWithFlags(&x1, g1, 0));
  CU(D->GraphInstantiateWithFlags(&x2, g2, 0));
  replay(o, g1, x1, sp, x2, sc, 0);
out:
  D->CtxSynchronize();
  drop_graph(g1, x1);
  drop_graph(g2, x2);
  drop_stream(sp);
  drop_stream(sc);
  return 0;
}

static int sc_eager_to_built(const scenario *s, CUstreamCaptureMode mode, bool use, outcome *o) {
  CUstream p = NULL, launch = NULL;
  dlsync_lane lp;
  (void)s;
  (void)mode;
  CU(new_stream(&p));
  CU(new_stream(&launch));
  CU(settle(p));
  lp = dlsync_lane_stream(p);
  for (int t = 0; t < TRIALS; t++) {
    CUgraph g = NULL;
    CUgraphNode cp = NULL, cdeps[2];
    dlsync_lane lc;
    dlsync_exchange *ex = NULL;
    unsigned v = ++value_base, got = 0;
    CUresult r;
    CU(D->GraphCreate(&g, 0));
    lc = dlsync_lane_graph(g, cdeps, 0, 2);
    CU(produce(p, big_buf, BIG_WORDS, v));
    if (use)
      DS(dlsync_exchange_begin(&ex, E.ctx, &lp, &lc));
    r = add_copy_node(&cp, g, lc.deps, lc.ndeps, t);
    if (use && r == CUDA_SUCCESS) {
      lc.deps[0] = cp;
      lc.ndeps = 1;
      DS_EXPECT(dlsync_exchange_end(ex), DLSYNC_ERROR_CAPTURE_ORDER);
    }
    if (r == CUDA_SUCCESS)
      r = launch_once(g, launch, t, &got);
    else
      drop_graph(g, NULL);
    if (r != CUDA_SUCCESS) {
      note(o, "trial %d: %s", t, gpu_err(D, r));
      o->broken++;
      goto out;
    }
    CU(D->StreamSynchronize(p));
    o->runs++;
    o->wrong += got != v;
  }
  if (use && !events_came_back()) {
    note(o, "graph-owned events did not come back to the pool");
    o->broken++;
  }
out:
  D->CtxSynchronize();
  drop_stream(p);
  drop_stream(launch);
  return 0;
}

/* Producer capturing, consumer a built graph. */
static int sc_capture_to_built(const scenario *s, CUstreamCaptureMode mode, bool use, outcome *o) {
  CUstream p = NULL, sc = NULL;
  CUgraph g1 = NULL, g2 = NULL;
  CUgraphExec x1 = NULL, x2 = NULL;
  CUgraphNode cp = NULL, cdeps[2];
  dlsync_lane lp, lc;
  dlsync_exchange *ex = NULL;
  (void)s;
  CU(new_stream(&p));
  CU(new_stream(&sc));
  CU(settle(p));
  CU(D->GraphCreate(&g2, 0));
  lp = dlsync_lane_stream(p);
  lc = dlsync_lane_graph(g2, cdeps, 0, 2);
  CU(D->StreamBeginCapture(p, mode));
  CU(produce(p, big_buf, BIG_WORDS, 7));
  if (use)
    DS(dlsync_exchange_begin(&ex, E.ctx, &lp, &lc));
  CU(add_copy_node(&cp, g2, lc.deps, lc.ndeps, 0));
  if (use) {
    lc.deps[0] = cp;
    lc.ndeps = 1;
    DS_EXPECT(dlsync_exchange_end(ex), DLSYNC_ERROR_CAPTURE_ORDER);
  }
  END_CAPTURE(p, &g1);
  CU(D->GraphInstantiateWithFlags(&x1, g1, 0));
  CU(D->GraphInstantiateWithFlags(&x2, g2, 0));
  replay(o, g1, x1, p, x2, sc, 0);
out:
  D->CtxSynchronize();
  drop_graph(g1, x1);
  drop_graph(g2, x2);
  drop_stream(p);
  drop_stream(sc);
  return 0;
}

/* Producer a built graph, consumer capturing. */
static int sc_built_to_capture(const scenario *s, CUstreamCaptureMode mode, bool use, outcome *o) {
  CUstream sp = NULL, c = NULL;
  CUgraph g1 = NULL, g2 = NULL;
  CUgraphExec x1 = NULL, x2 = NULL;
  CUgraphNode m = NULL, pdeps[2];
  dlsync_lane lp, lc;
  dlsync_exchange *ex = NULL;
  (void)s;
  CU(new_stream(&sp));
  CU(new_stream(&c));
  CU(settle(sp));
  CU(D->GraphCreate(&g1, 0));
  CU(add_memset_node(&m, g1, NULL, 0));
  pdeps[0] = m;
  lp = dlsync_lane_graph(g1, pdeps, 1, 2);
  lc = dlsync_lane_stream(c);
  CU(D->StreamBeginCapture(c, mode));
  if (use)
    DS(dlsync_exchange_begin(&ex, E.ctx, &lp, &lc));
  CU(consume(c, big_buf, BIG_WORDS, 0));
  if (use)
    DS_EXPECT(dlsync_exchange_end(ex), DLSYNC_ERROR_CAPTURE_ORDER);
  END_CAPTURE(c, &g2);
  CU(D->GraphInstantiateWithFlags(&x1, g1, 0));
  CU(D->GraphInstantiateWithFlags(&x2, g2, 0));
  replay(o, g1, x1, sp, x2, c, 0);
out:
  D->CtxSynchronize();
  drop_graph(g1, x1);
  drop_graph(g2, x2);
  drop_stream(sp);
  drop_stream(c);
  return 0;
}

/* ---- errors: each a status, nothing queued, the capture intact ---- */

static const char *mode_name(CUstreamCaptureMode m);

static int sc_errors(const scenario *s, CUstreamCaptureMode mode, bool use, outcome *o) {
  CUstream blocking = NULL, other = NULL, c2 = NULL;
  dlsync_lane lc2;
  CUevent eager_ev = NULL;
  CUgraph g = NULL, gb = NULL;
  CUgraphNode m = NULL, deps[2];
  dlsync_lane legacy = dlsync_lane_stream(DLSYNC_STREAM_LEGACY), lo, lb, none;
  dlsync_exchange *ex = NULL;
  dlsync__pool_stats before, after;
  size_t batch;
  CUresult r;
  (void)s;
  if (!use) {
    /* The control: the same misuse without dlsync breaks the capture. */
    CU(D->StreamCreate(&blocking, CU_STREAM_DEFAULT));
    CU(D->EventCreate(&eager_ev, CU_EVENT_DISABLE_TIMING));
    CU(D->StreamBeginCapture(blocking, mode));
    r = D->EventRecord(eager_ev, CU_STREAM_LEGACY);
    o->runs++;
    o->wrong += r != CUDA_SUCCESS;
    r = D->StreamEndCapture(blocking, &g);
    o->broken += r != CUDA_SUCCESS;
    goto out;
  }
  dlsync__pool_stats_get(&before, &E.ctx->pools);
  CU(D->StreamCreate(&blocking, CU_STREAM_DEFAULT));
  CU(new_stream(&other));
  lo = dlsync_lane_stream(other);
  lb = dlsync_lane_stream(blocking);
  /* 1. the legacy stream while a blocking stream captures */
  CU(D->StreamBeginCapture(blocking, mode));
  o->runs++;
  DS_EXPECT(dlsync_exchange_begin(&ex, E.ctx, &legacy, &lo), DLSYNC_ERROR_LEGACY_STREAM_IN_CAPTURE);
  r = D->StreamEndCapture(blocking, &g);
  if (r != CUDA_SUCCESS) {
    note(o, "the capture broke after the legacy-stream error: %s", gpu_err(D, r));
    o->broken++;
    goto out;
  }
  D->GraphDestroy(g);
  g = NULL;
  /* 2. an invalidated capture */
  CU(D->EventCreate(&eager_ev, CU_EVENT_DISABLE_TIMING));
  CU(D->EventRecord(eager_ev, other));
  CU(D->StreamBeginCapture(blocking, mode));
  r = D->StreamWaitEvent(blocking, eager_ev, 0); /* isolation: invalidates */
  o->runs++;
  DS_EXPECT(dlsync_exchange_begin(&ex, E.ctx, &lb, &lo), DLSYNC_ERROR_CAPTURE_INVALIDATED);
  r = D->StreamEndCapture(blocking, &g);
  if (g != NULL) {
    D->GraphDestroy(g);
    g = NULL;
  }
  /* 3. bad lanes */
  memset(&none, 0, sizeof none);
  o->runs++;
  DS_EXPECT(dlsync_exchange_begin(&ex, E.ctx, &none, &lo), DLSYNC_ERROR_INVALID_LANE);
  lb.graph = (CUgraph)&lb;
  o->runs++;
  DS_EXPECT(dlsync_exchange_begin(&ex, E.ctx, &lb, &lo), DLSYNC_ERROR_INVALID_LANE);
  /* 4. a built graph before an eager stream */
  CU(D->GraphCreate(&gb, 0));
  CU(add_memset_node(&m, gb, NULL, 0));
  deps[0] = m;
  {
    dlsync_lane lg = dlsync_lane_graph(gb, deps, 1, 2);
    o->runs++;
    DS_EXPECT(dlsync_exchange_begin(&ex, E.ctx, &lg, &lo), DLSYNC_ERROR_CAPTURE_ORDER);
  }
  /* 5. a graph lane whose dependency is from another graph */
  CU(D->GraphCreate(&g, 0));
  {
    dlsync_lane lg = dlsync_lane_graph(g, deps, 1, 2); /* m is gb's */
    o->runs++;
    DS_EXPECT(dlsync_exchange_begin(&ex, E.ctx, &lo, &lg), DLSYNC_ERROR_FOREIGN_DEPENDENCY);
  }
  CU(D->CtxSynchronize());
  drop_graph(g, NULL);
  g = NULL;
  drop_graph(gb, NULL);
  gb = NULL;
  /* 6. an invalidated capture met by the fast path: the streams are warm,
   * begin asks about the consumer only, and the record on the producer's
   * invalidated capture must say so and leave the consumer alone. */
  CU(new_stream(&c2));
  lc2 = dlsync_lane_stream(c2);
  lb = dlsync_lane_stream(blocking);
  for (int i = 0; i < 2; i++) {
    DS(dlsync_exchange_begin(&ex, E.ctx, &lb, &lc2));
    DS(dlsync_exchange_end(ex));
    ex = NULL;
  }
  CU(D->EventRecord(eager_ev, other));
  CU(D->StreamBeginCapture(blocking, mode));
  r = D->StreamWaitEvent(blocking, eager_ev, 0); /* invalidates */
  o->runs++;
  DS_EXPECT(dlsync_exchange_begin(&ex, E.ctx, &lb, &lc2), DLSYNC_ERROR_CAPTURE_INVALIDATED);
  {
    CUstreamCaptureStatus cs = CU_STREAM_CAPTURE_STATUS_ACTIVE;
    CU(D->StreamIsCapturing(c2, &cs));
    if (cs != CU_STREAM_CAPTURE_STATUS_NONE) {
      note(o, "the consumer joined an invalidated capture");
      o->broken++;
    }
  }
  r = D->StreamEndCapture(blocking, &g);
  if (g != NULL) {
    D->GraphDestroy(g);
    g = NULL;
  }
  /* 7. DLSYNC_EXCHANGE_CAPTURE_STABLE's promise broken, as exchange.h says:
   * (a) the consumer begins capturing between begin and end: end succeeds,
   * the producer joins that capture, and the capture fails to end once the
   * producer queued more; (b) the producer begins capturing: its capture is
   * invalidated. Both are checked against the driver and printed. */
  for (int i = 0; i < 2; i++) {
    DS(dlsync_exchange_begin_flags(&ex, E.ctx, &lo, &lc2, DLSYNC_EXCHANGE_CAPTURE_STABLE));
    DS(dlsync_exchange_end(ex));
    ex = NULL;
  }
  {
    dlsync_status se;
    CUresult ra, rb;
    CUstreamCaptureStatus cs = CU_STREAM_CAPTURE_STATUS_NONE;
    o->runs++;
    DS(dlsync_exchange_begin_flags(&ex, E.ctx, &lo, &lc2, DLSYNC_EXCHANGE_CAPTURE_STABLE));
    CU(D->StreamBeginCapture(c2, mode));
    CU(consume(c2, big_buf, 16, 0));
    se = dlsync_exchange_end(ex);
    ex = NULL;
    D->StreamIsCapturing(other, &cs);
    produce(other, big_buf, 16, 1);
    ra = D->StreamEndCapture(c2, &g);
    if (g != NULL) {
      D->GraphDestroy(g);
      g = NULL;
    }
    printf("  [%s] CAPTURE_STABLE broken by the consumer: end %s, producer %s, consumer's "
           "cuStreamEndCapture %s\n",
           mode_name(mode), dlsync_status_name(se),
           cs == CU_STREAM_CAPTURE_STATUS_ACTIVE ? "joined its capture" : "not capturing",
           gpu_err(D, ra));
    if (se != DLSYNC_SUCCESS || cs != CU_STREAM_CAPTURE_STATUS_ACTIVE ||
        ra != CUDA_ERROR_STREAM_CAPTURE_UNJOINED) {
      note(o, "a broken CAPTURE_STABLE promise (consumer) did not cost what exchange.h says");
      o->broken++;
    }
    CU(D->StreamIsCapturing(other, &cs));
    if (cs != CU_STREAM_CAPTURE_STATUS_NONE) {
      note(o, "the producer stayed in the consumer's failed capture");
      o->broken++;
      goto out;
    }
    o->runs++;
    DS(dlsync_exchange_begin_flags(&ex, E.ctx, &lo, &lc2, DLSYNC_EXCHANGE_CAPTURE_STABLE));
    CU(consume(c2, big_buf, 16, 0));
    CU(D->StreamBeginCapture(other, mode));
    se = dlsync_exchange_end(ex);
    ex = NULL;
    rb = D->StreamEndCapture(other, &g);
    if (g != NULL) {
      D->GraphDestroy(g);
      g = NULL;
    }
    printf("  [%s] CAPTURE_STABLE broken by the producer: end %s (%s), producer's "
           "cuStreamEndCapture %s\n",
           mode_name(mode), dlsync_status_name(se), se == DLSYNC_SUCCESS ? "" : dlsync_last_error(),
           gpu_err(D, rb));
    if (rb != CUDA_ERROR_STREAM_CAPTURE_INVALIDATED) {
      note(o, "a broken CAPTURE_STABLE promise (producer) did not cost what exchange.h says");
      o->broken++;
    }
  }
  if (!events_came_back()) {
    note(o, "graph-owned events did not come back");
    o->broken++;
  }
  dlsync__pool_stats_get(&after, &E.ctx->pools);
  batch = dlsync__graph_built_held(&E.ctx->pools);
  /* Every live event is back in the pool, or in this thread's open batch:
   * nothing leaked, nothing lost. */
  if (after.created - after.destroyed != after.free_events + batch || after.graph_owned != batch) {
    note(o,
         "pool not intact: %zu live, %zu free, %zu graph-owned, %zu in the thread's batch "
         "(before: %zu live, %zu free)",
         after.created - after.destroyed, after.free_events, after.graph_owned, batch,
         before.created - before.destroyed, before.free_events);
    o->broken++;
  }
out:
  D->CtxSynchronize();
  drop_graph(g, NULL);
  drop_graph(gb, NULL);
  drop_stream(blocking);
  drop_stream(other);
  drop_stream(c2);
  if (eager_ev)
    D->EventDestroy(eager_ev);
  return 0;
}

/* ---- threads: workers exchange eagerly (default GLOBAL mode for dlsync's
 * calls) while the main thread captures in the given mode ---- */

typedef struct worker {
  pthread_t thread;
  int index;
  bool use;
  int runs, wrong, broken;
  volatile int *stop;
  char note[160];
} worker;

static void *worker_main(void *arg) {
  worker *w = arg;
  CUstream p = NULL, c = NULL;
  CUdeviceptr buf = 0;
  dlsync_lane lp, lc;
  int slot = 64 + w->index * 32;
  bool announced = false;
  CUstreamCaptureMode relaxed;
  D->CtxPushCurrent(E.cuctx);
  if (D->StreamCreate(&p, CU_STREAM_NON_BLOCKING) != CUDA_SUCCESS ||
      D->StreamCreate(&c, CU_STREAM_NON_BLOCKING) != CUDA_SUCCESS) {
    w->broken++;
    goto out;
  }
  /* Allocated before the capture starts (main waits for *stop == 0). */
  if (D->MemAlloc(&buf, WORKER_WORDS * 4) != CUDA_SUCCESS) {
    w->broken++;
    goto out;
  }
  lp = dlsync_lane_stream(p);
  lc = dlsync_lane_stream(c);
  __atomic_add_fetch(w->stop, 1, __ATOMIC_SEQ_CST); /* ready */
  announced = true;
  while (__atomic_load_n(w->stop, __ATOMIC_SEQ_CST) < 1000) {
    unsigned want[8];
    for (int t = 0; t < 8; t++) {
      dlsync_exchange *ex = NULL;
      want[t] = (unsigned)(w->index * 1000000 + w->runs + t + 1);
      if (D->MemsetD32Async(buf, want[t], WORKER_WORDS, p) != CUDA_SUCCESS) {
        w->broken++;
        goto out;
      }
      if (w->use && dlsync_exchange_begin(&ex, E.ctx, &lp, &lc) != DLSYNC_SUCCESS) {
        snprintf(w->note, sizeof w->note, "begin: %s", dlsync_last_error());
        w->broken++;
        goto out;
      }
      if (D->MemcpyDtoDAsync(slots + (CUdeviceptr)(slot + t) * 4, buf + (WORKER_WORDS - 1) * 4, 4,
                             c) != CUDA_SUCCESS) {
        w->broken++;
        goto out;
      }
      if (w->use && dlsync_exchange_end(ex) != DLSYNC_SUCCESS) {
        snprintf(w->note, sizeof w->note, "end: %s", dlsync_last_error());
        w->broken++;
        goto out;
      }
    }
    /* The test's own checks synchronise; in RELAXED mode so that they do not
     * break the main thread's GLOBAL capture (dlsync's calls above need no
     * such care). */
    relaxed = CU_STREAM_CAPTURE_MODE_RELAXED;
    D->ThreadExchangeStreamCaptureMode(&relaxed);
    if (D->StreamSynchronize(c) != CUDA_SUCCESS || D->StreamSynchronize(p) != CUDA_SUCCESS)
      w->broken++;
    for (int t = 0; t < 8; t++) {
      unsigned got = 0;
      if (D->MemcpyDtoH(&got, slots + (CUdeviceptr)(slot + t) * 4, 4) != CUDA_SUCCESS)
        w->broken++;
      w->runs++;
      w->wrong += got != want[t];
    }
    D->ThreadExchangeStreamCaptureMode(&relaxed); /* back to what it was */
  }
out:
  if (!announced)
    __atomic_add_fetch(w->stop, 1, __ATOMIC_SEQ_CST);
  D->StreamSynchronize(p);
  D->StreamSynchronize(c);
  if (buf)
    D->MemFree(buf);
  drop_stream(p);
  drop_stream(c);
  {
    CUcontext popped;
    D->CtxPopCurrent(&popped);
  }
  return NULL;
}

static int sc_threads(const scenario *s, CUstreamCaptureMode mode, bool use, outcome *o) {
  worker w[WORKERS];
  volatile int ready = 0;
  int started = 0;
  memset(w, 0, sizeof w);
  for (int i = 0; i < WORKERS; i++) {
    w[i].index = i;
    w[i].use = use;
    w[i].stop = &ready;
    if (pthread_create(&w[i].thread, NULL, worker_main, &w[i]) != 0)
      break;
    started++;
  }
  while (__atomic_load_n(&ready, __ATOMIC_SEQ_CST) < started) {
    struct timespec ts = {0, 1000000};
    nanosleep(&ts, NULL);
  }
  /* The main thread captures and replays the join scenario meanwhile. */
  for (int k = 0; k < 4; k++) {
    outcome one;
    memset(&one, 0, sizeof one);
    sc_join(s, mode, use, &one);
    o->runs += one.runs;
    o->wrong += one.wrong;
    o->broken += one.broken;
    if (one.note[0] != '\0')
      note(o, "capture: %s", one.note);
  }
  __atomic_store_n(&ready, 1000, __ATOMIC_SEQ_CST);
  for (int i = 0; i < started; i++) {
    pthread_join(w[i].thread, NULL);
    o->runs += w[i].runs;
    o->wrong += w[i].wrong;
    o->broken += w[i].broken;
    if (w[i].note[0] != '\0')
      note(o, "worker %d: %s", i, w[i].note);
  }
  return 0;
}

/* ---- two devices: the producer on device 0, the consumer on device 1 ---- */

static CUcontext dev1_ctx; /* NULL: one GPU only, the scenarios are skipped */
static CUdeviceptr dev1_slots;

static CUresult new_stream_on(CUstream *s, CUcontext c) {
  CUcontext popped;
  CUresult r = D->CtxPushCurrent(c);
  if (r != CUDA_SUCCESS)
    return r;
  r = D->StreamCreate(s, CU_STREAM_NON_BLOCKING);
  D->CtxPopCurrent(&popped);
  return r;
}

static CUresult consume_on_dev1(CUstream s, int slot) {
  return D->MemcpyDtoDAsync(dev1_slots + (CUdeviceptr)slot * 4, big_buf + (BIG_WORDS - 1) * 4, 4,
                            s);
}

static int sc_two_devices_eager(const scenario *s, CUstreamCaptureMode mode, bool use, outcome *o) {
  CUstream p = NULL, c = NULL;
  unsigned want[TRIALS];
  dlsync_lane lp, lc;
  (void)mode;
  if (dev1_ctx == NULL)
    return 0;
  CU(new_stream(&p));
  CU(new_stream_on(&c, dev1_ctx));
  CU(settle(p));
  lp = dlsync_lane_stream(p);
  lc = dlsync_lane_stream(c);
  for (int t = 0; t < TRIALS; t++) {
    dlsync_exchange *ex = NULL;
    want[t] = ++value_base;
    CU(produce(p, big_buf, BIG_WORDS, want[t]));
    if (use)
      DS(dlsync_exchange_begin_flags(&ex, E.ctx, &lp, &lc, s->flags));
    CU(consume_on_dev1(c, t));
    if (use)
      DS(dlsync_exchange_end(ex));
  }
  CU(D->StreamSynchronize(c));
  CU(D->StreamSynchronize(p));
  for (int t = 0; t < TRIALS; t++) {
    unsigned got = 0;
    CU(D->MemcpyDtoH(&got, dev1_slots + (CUdeviceptr)t * 4, 4));
    o->runs++;
    o->wrong += got != want[t];
  }
out:
  D->StreamSynchronize(c);
  D->StreamSynchronize(p);
  drop_stream(p);
  drop_stream(c);
  return 0;
}

/* The producer captures on device 0; the consumer's stream on device 1
 * joins the capture: one graph over two devices. */
static int sc_two_devices_join(const scenario *s, CUstreamCaptureMode mode, bool use, outcome *o) {
  CUstream p = NULL, c = NULL, launch = NULL;
  CUgraph g = NULL;
  CUgraphExec x = NULL;
  dlsync_lane lp, lc;
  dlsync_exchange *ex = NULL;
  (void)s;
  if (dev1_ctx == NULL)
    return 0;
  CU(new_stream(&p));
  CU(new_stream(&launch));
  CU(new_stream_on(&c, dev1_ctx));
  CU(settle(p));
  lp = dlsync_lane_stream(p);
  lc = dlsync_lane_stream(c);
  CU(D->StreamBeginCapture(p, mode));
  CU(produce(p, big_buf, BIG_WORDS, 7));
  if (use)
    DS(dlsync_exchange_begin(&ex, E.ctx, &lp, &lc));
  CU(consume_on_dev1(c, 0));
  if (use)
    DS(dlsync_exchange_end(ex));
  END_CAPTURE(p, &g);
  CU(D->GraphInstantiateWithFlags(&x, g, 0));
  for (int k = 0; k < REPLAYS; k++) {
    unsigned v = ++value_base, got = 0;
    CU(set_memset_value(g, x, v));
    CU(D->GraphLaunch(x, launch));
    CU(D->StreamSynchronize(launch));
    CU(D->MemcpyDtoH(&got, dev1_slots, 4));
    o->runs++;
    o->wrong += got != v;
  }
out:
  D->CtxSynchronize();
  drop_graph(g, x);
  drop_stream(p);
  drop_stream(c);
  drop_stream(launch);
  return 0;
}

/* ---- lifetimes: stream-ordered release and fences ---- */

typedef struct seen {
  CUdeviceptr buf;
  size_t words;
  unsigned value;   /* what the deleter read from the buffer */
  int calls;        /* how often the deleter ran */
  pthread_t thread; /* where it ran */
  CUresult r;
} seen;

/* A deleter that reads the buffer's last word, as a real deleter's cudaFree
 * would have to wait for: it must see what the work before the release
 * wrote. It runs on dlsync's reclaimer thread. */
static void reading_deleter(void *arg) {
  seen *sn = arg;
  CUcontext popped;
  sn->thread = pthread_self();
  sn->r = D->CtxPushCurrent(E.cuctx);
  if (sn->r == CUDA_SUCCESS) {
    sn->r = D->MemcpyDtoH(&sn->value, sn->buf + (sn->words - 1) * 4, 4);
    D->CtxPopCurrent(&popped);
  }
  __atomic_add_fetch(&sn->calls, 1, __ATOMIC_SEQ_CST);
}

static bool wait_calls(seen *sn, int want) {
  for (int i = 0; i < 3000; i++) {
    if (__atomic_load_n(&sn->calls, __ATOMIC_SEQ_CST) >= want)
      return true;
    struct timespec ts = {0, 1000000};
    nanosleep(&ts, NULL);
  }
  return false;
}

/* A release made while a long producer (a 4 GiB memset) still runs: the
 * deleter must read the producer's value, never the previous one. The
 * control calls the deleter at once, as a plain deleter would be. */
static int sc_release_eager(const scenario *s, CUstreamCaptureMode mode, bool use, outcome *o) {
  CUstream st = NULL;
  dlsync_lane l;
  (void)s;
  (void)mode;
  CU(new_stream(&st));
  CU(settle(st));
  l = dlsync_lane_stream(st);
  for (int t = 0; t < TRIALS; t++) {
    seen sn;
    unsigned v = ++value_base;
    memset(&sn, 0, sizeof sn);
    sn.buf = big_buf;
    sn.words = BIG_WORDS;
    CU(produce(st, big_buf, BIG_WORDS, v));
    if (use) {
      DS(dlsync_release(E.ctx, &l, reading_deleter, &sn));
      if (!wait_calls(&sn, 1)) {
        note(o, "the deleter did not run within 3 s");
        o->broken++;
        goto out;
      }
      if (pthread_equal(sn.thread, pthread_self())) {
        note(o, "the deleter ran on the releasing thread");
        o->broken++;
      }
    } else {
      reading_deleter(&sn);
    }
    CU(D->StreamSynchronize(st));
    o->runs++;
    o->wrong += sn.value != v || sn.calls != 1 || sn.r != CUDA_SUCCESS;
  }
out:
  D->CtxSynchronize();
  drop_stream(st);
  return 0;
}

/* A buffer released inside a capture lives through 100 replays and is freed
 * once, after the graph and its executable are gone. The control frees it
 * at release time: the replays then run on a freed buffer (counted wrong). */
typedef struct freed_flag {
  int calls;
  pthread_t thread;
} freed_flag;

static void flag_deleter(void *arg) {
  freed_flag *f = arg;
  f->thread = pthread_self();
  __atomic_add_fetch(&f->calls, 1, __ATOMIC_SEQ_CST);
}

static int sc_release_capture(const scenario *s, CUstreamCaptureMode mode, bool use, outcome *o) {
  CUstream st = NULL, launch = NULL;
  CUgraph g = NULL;
  CUgraphExec x = NULL;
  dlsync_lane l;
  freed_flag f;
  (void)s;
  memset(&f, 0, sizeof f);
  CU(new_stream(&st));
  CU(new_stream(&launch));
  CU(settle(st));
  l = dlsync_lane_stream(st);
  CU(D->StreamBeginCapture(st, mode));
  CU(produce(st, big_buf, BIG_WORDS, 7));
  CU(consume(st, big_buf, BIG_WORDS, 0));
  if (use)
    DS(dlsync_release(E.ctx, &l, flag_deleter, &f));
  else
    flag_deleter(&f); /* freed while the graph still uses it */
  END_CAPTURE(st, &g);
  CU(D->GraphInstantiateWithFlags(&x, g, 0));
  CU(D->GraphDestroy(g)); /* the executable keeps it */
  g = NULL;
  for (int k = 0; k < 2 * REPLAYS; k++) {
    CU(D->GraphLaunch(x, launch));
    if (k % 10 == 9)
      CU(D->StreamSynchronize(launch));
    o->runs++;
    o->wrong += __atomic_load_n(&f.calls, __ATOMIC_SEQ_CST) != 0; /* used after free */
  }
  CU(D->StreamSynchronize(launch));
  CU(D->GraphExecDestroy(x));
  x = NULL;
  if (use) {
    for (int i = 0; i < 3000 && __atomic_load_n(&f.calls, __ATOMIC_SEQ_CST) == 0; i++) {
      struct timespec ts = {0, 1000000};
      nanosleep(&ts, NULL);
    }
    if (f.calls != 1) {
      note(o, "deleter ran %d times after the graph went (expected 1)", f.calls);
      o->broken++;
    } else if (pthread_equal(f.thread, pthread_self())) {
      note(o, "the deleter ran on the test's thread");
      o->broken++;
    }
  }
out:
  D->CtxSynchronize();
  drop_graph(g, x);
  drop_stream(st);
  drop_stream(launch);
  return 0;
}

/* A fence signalled in one capture and waited on in another; the graphs are
 * launched in that order, with a new producer value each time. */
static int sc_fence_two_captures(const scenario *s, CUstreamCaptureMode mode, bool use,
                                 outcome *o) {
  CUstream p = NULL, c = NULL;
  CUgraph g1 = NULL, g2 = NULL;
  CUgraphExec x1 = NULL, x2 = NULL;
  dlsync_lane lp, lc;
  dlsync_fence *f = NULL;
  CUresult r1, r2;
  (void)s;
  CU(new_stream(&p));
  CU(new_stream(&c));
  CU(settle(p));
  lp = dlsync_lane_stream(p);
  lc = dlsync_lane_stream(c);
  CU(D->StreamBeginCapture(p, mode));
  CU(produce(p, big_buf, BIG_WORDS, 7));
  if (use)
    DS(dlsync_fence_signal(&f, E.ctx, &lp));
  r1 = D->StreamEndCapture(p, &g1);
  CU(D->StreamBeginCapture(c, mode));
  if (use)
    DS(dlsync_fence_wait(f, &lc));
  CU(consume(c, big_buf, BIG_WORDS, 0));
  r2 = D->StreamEndCapture(c, &g2);
  if (r1 != CUDA_SUCCESS || r2 != CUDA_SUCCESS) {
    note(o, "cuStreamEndCapture: %s, %s", gpu_err(D, r1), gpu_err(D, r2));
    o->broken++;
    goto out;
  }
  dlsync_fence_release(f); /* the graphs hold the event now */
  f = NULL;
  CU(D->GraphInstantiateWithFlags(&x1, g1, 0));
  CU(D->GraphInstantiateWithFlags(&x2, g2, 0));
  replay(o, g1, x1, p, x2, c, 0);
out:
  if (f != NULL) {
    CUgraph junk = NULL;
    D->StreamEndCapture(c, &junk);
    drop_graph(junk, NULL);
  }
  dlsync_fence_release(f);
  D->CtxSynchronize();
  drop_graph(g1, x1);
  drop_graph(g2, x2);
  drop_stream(p);
  drop_stream(c);
  return 0;
}

/* A fence signalled in a capture is armed by each launch: an eager wait
 * issued after a launch orders after that launch's producer. */
static int sc_fence_eager_after_launch(const scenario *s, CUstreamCaptureMode mode, bool use,
                                       outcome *o) {
  CUstream p = NULL, c = NULL, launch = NULL;
  CUgraph g = NULL;
  CUgraphExec x = NULL;
  dlsync_lane lp, lc;
  dlsync_fence *f = NULL;
  (void)s;
  CU(new_stream(&p));
  CU(new_stream(&c));
  CU(new_stream(&launch));
  CU(settle(p));
  lp = dlsync_lane_stream(p);
  lc = dlsync_lane_stream(c);
  CU(D->StreamBeginCapture(p, mode));
  CU(produce(p, big_buf, BIG_WORDS, 7));
  DS(dlsync_fence_signal(&f, E.ctx, &lp));
  /* While the capture is active an eager wait is refused. */
  DS_EXPECT(dlsync_fence_wait(f, &lc), DLSYNC_ERROR_CAPTURE_ORDER);
  END_CAPTURE(p, &g);
  CU(D->GraphInstantiateWithFlags(&x, g, 0));
  for (int k = 0; k < REPLAYS; k++) {
    unsigned v = ++value_base, got = 0;
    CU(set_memset_value(g, x, v));
    CU(D->GraphLaunch(x, launch));
    if (use)
      DS(dlsync_fence_wait(f, &lc));
    CU(consume(c, big_buf, BIG_WORDS, 1));
    CU(D->StreamSynchronize(c));
    CU(D->StreamSynchronize(launch));
    CU(read_slot(&got, 1));
    o->runs++;
    o->wrong += got != v;
  }
out:
  D->CtxSynchronize();
  dlsync_fence_release(f);
  drop_graph(g, x);
  drop_stream(p);
  drop_stream(c);
  drop_stream(launch);
  return 0;
}

/* Eight threads: each produces into its own buffer and signals a fence; each
 * consumes its neighbour's buffer after waiting on the neighbour's fence, and
 * signals a fence back that the neighbour's next producer waits on. */
#define FTHREADS 8
#define FROUNDS 30
#define FWORDS ((size_t)1 << 28) /* 1 GiB each */

typedef struct fence_worker {
  pthread_t thread;
  int index;
  bool use;
  CUstream p, c;
  CUdeviceptr buf;
  dlsync_fence *produced; /* this thread's data is ready */
  dlsync_fence *consumed; /* this thread has read its neighbour's data */
  unsigned value;
  int runs, wrong, broken;
  char note[160];
} fence_worker;

static fence_worker fw[FTHREADS];
static pthread_barrier_t fbarrier;

static void *fence_worker_main(void *arg) {
  fence_worker *w = arg;
  fence_worker *next = &fw[(w->index + 1) % FTHREADS];
  fence_worker *prev = &fw[(w->index + FTHREADS - 1) % FTHREADS];
  dlsync_lane lp, lc;
  CUcontext popped;
  D->CtxPushCurrent(E.cuctx);
  lp = dlsync_lane_stream(w->p);
  lc = dlsync_lane_stream(w->c);
  for (int k = 0; k < FROUNDS; k++) {
    unsigned got = 0;
    /* Produce, after the previous thread finished reading our last value. */
    if (w->use && prev->consumed != NULL && dlsync_fence_wait(prev->consumed, &lp) != 0)
      w->broken++;
    w->value = (unsigned)(w->index * 100000 + k + 1);
    /* Two passes, so that the producer is still running when an unordered
     * consumer reads (it then sees the old value or the first pass's). */
    if (D->MemsetD32Async(w->buf, 0xDEAD, FWORDS, w->p) != CUDA_SUCCESS ||
        D->MemsetD32Async(w->buf, w->value, FWORDS, w->p) != CUDA_SUCCESS)
      w->broken++;
    dlsync_fence_release(w->produced);
    w->produced = NULL;
    if (w->use && dlsync_fence_signal(&w->produced, E.ctx, &lp) != 0) {
      snprintf(w->note, sizeof w->note, "signal: %s", dlsync_last_error());
      w->broken++;
    }
    pthread_barrier_wait(&fbarrier);
    /* Consume the next thread's buffer. */
    if (w->use && dlsync_fence_wait(next->produced, &lc) != 0) {
      snprintf(w->note, sizeof w->note, "wait: %s", dlsync_last_error());
      w->broken++;
    }
    if (D->MemcpyDtoDAsync(slots + (CUdeviceptr)(160 + w->index) * 4, next->buf + (FWORDS - 1) * 4,
                           4, w->c) != CUDA_SUCCESS)
      w->broken++;
    dlsync_fence_release(w->consumed);
    w->consumed = NULL;
    if (w->use && dlsync_fence_signal(&w->consumed, E.ctx, &lc) != 0)
      w->broken++;
    if (D->StreamSynchronize(w->c) != CUDA_SUCCESS ||
        D->MemcpyDtoH(&got, slots + (CUdeviceptr)(160 + w->index) * 4, 4) != CUDA_SUCCESS)
      w->broken++;
    w->runs++;
    w->wrong += got != next->value;
    pthread_barrier_wait(&fbarrier);
  }
  D->StreamSynchronize(w->p);
  D->CtxPopCurrent(&popped);
  return NULL;
}

static int sc_fence_threads(const scenario *s, CUstreamCaptureMode mode, bool use, outcome *o) {
  int started = 0;
  (void)s;
  (void)mode;
  memset(fw, 0, sizeof fw);
  pthread_barrier_init(&fbarrier, NULL, FTHREADS);
  for (int i = 0; i < FTHREADS; i++) {
    fw[i].index = i;
    fw[i].use = use;
    CU(new_stream(&fw[i].p));
    CU(new_stream(&fw[i].c));
    CU(D->MemAlloc(&fw[i].buf, FWORDS * 4));
    CU(D->MemsetD32Async(fw[i].buf, 0, FWORDS, fw[i].p));
  }
  CU(D->CtxSynchronize());
  for (int i = 0; i < FTHREADS; i++) {
    if (pthread_create(&fw[i].thread, NULL, fence_worker_main, &fw[i]) != 0) {
      note(o, "pthread_create failed");
      o->broken++;
      break;
    }
    started++;
  }
  for (int i = 0; i < started; i++)
    pthread_join(fw[i].thread, NULL);
out:
  D->CtxSynchronize();
  for (int i = 0; i < FTHREADS; i++) {
    o->runs += fw[i].runs;
    o->wrong += fw[i].wrong;
    o->broken += fw[i].broken;
    if (fw[i].note[0] != '\0')
      note(o, "thread %d: %s", i, fw[i].note);
    dlsync_fence_release(fw[i].produced);
    dlsync_fence_release(fw[i].consumed);
    if (fw[i].buf)
      D->MemFree(fw[i].buf);
    drop_stream(fw[i].p);
    drop_stream(fw[i].c);
  }
  pthread_barrier_destroy(&fbarrier);
  return 0;
}

/* ---- K: conditional nodes' bodies (include/dlsync/conditional.h) ---- */

/* A conditional node of `type` (one body) in g after deps, its handle's
 * value `dflt` at each launch: *node and its *body. */
static CUresult cond_node_h(CUgraph g, const CUgraphNode *deps, size_t nd,
                            CUgraphConditionalNodeType type, unsigned dflt, CUgraphNode *node,
                            CUgraph *body, CUgraphConditionalHandle *handle) {
  CUgraphConditionalHandle h = 0;
  CUgraphNodeParams p;
  CUresult r = D->GraphConditionalHandleCreate(&h, g, E.cuctx, dflt, CU_GRAPH_COND_ASSIGN_DEFAULT);
  if (r != CUDA_SUCCESS)
    return r;
  if (handle != NULL)
    *handle = h;
  memset(&p, 0, sizeof p);
  p.type = CU_GRAPH_NODE_TYPE_CONDITIONAL;
  p.conditional.handle = h;
  p.conditional.type = type;
  p.conditional.size = 1;
  p.conditional.ctx = E.cuctx;
  r = D->GraphAddNode(node, g, deps, NULL, nd, &p);
  if (r == CUDA_SUCCESS)
    *body = p.conditional.phGraph_out[0];
  return r;
}

static CUresult cond_node(CUgraph g, const CUgraphNode *deps, size_t nd,
                          CUgraphConditionalNodeType type, unsigned dflt, CUgraphNode *node,
                          CUgraph *body) {
  return cond_node_h(g, deps, nd, type, dflt, node, body, NULL);
}

/* ---- a WHILE body that runs: LOOP_TURNS turns, counted down on the GPU ----
 * dlsync_loop_turn(handle, counter) decrements the word at counter and sets
 * the WHILE node's condition to (the word != 0) with cudaGraphSetConditional,
 * a device function of libcudadevrt: the PTX is linked with it by the
 * driver's JIT linker (cuLinkAddFile, CU_JIT_INPUT_LIBRARY; DLSYNC_CUDADEVRT
 * names the archive, else the toolkit's usual folders). The parent sets the
 * word to LOOP_TURNS (a memset node) ahead of the WHILE node, whose condition
 * is 1 by default; a launch leaves the word 0 when the body ran LOOP_TURNS
 * times. Where the kernel cannot be built, the WHILE rows keep a body that
 * never runs (the condition 0) and say why in their note. */
#define LOOP_TURNS 3
#define LOOP_SLOT (SLOTS - 2) /* the countdown's word */

static const char loop_ptx[] = ".version 7.8\n"
                               ".target sm_90\n"
                               ".address_size 64\n"
                               ".extern .func cudaGraphSetConditional\n"
                               "(\n"
                               "  .param .b64 handle,\n"
                               "  .param .b32 value\n"
                               ")\n"
                               ";\n"
                               ".visible .entry dlsync_loop_turn(.param .u64 p_handle, "
                               ".param .u64 p_counter)\n"
                               "{\n"
                               "  .reg .pred %p<2>;\n"
                               "  .reg .b32 %r<4>;\n"
                               "  .reg .b64 %rd<4>;\n"
                               "  ld.param.u64 %rd1, [p_handle];\n"
                               "  ld.param.u64 %rd2, [p_counter];\n"
                               "  cvta.to.global.u64 %rd3, %rd2;\n"
                               "  ld.global.u32 %r1, [%rd3];\n"
                               "  sub.u32 %r2, %r1, 1;\n"
                               "  st.global.u32 [%rd3], %r2;\n"
                               "  setp.ne.u32 %p1, %r2, 0;\n"
                               "  selp.u32 %r3, 1, 0, %p1;\n"
                               "  {\n"
                               "    .param .b64 param0;\n"
                               "    .param .b32 param1;\n"
                               "    st.param.b64 [param0+0], %rd1;\n"
                               "    st.param.b32 [param1+0], %r3;\n"
                               "    call.uni cudaGraphSetConditional, (param0, param1);\n"
                               "  }\n"
                               "  ret;\n"
                               "}\n";

typedef CUresult (*pfn_link_create)(unsigned, CUjit_option *, void **, CUlinkState *);
typedef CUresult (*pfn_link_add_data)(CUlinkState, CUjitInputType, void *, size_t, const char *,
                                      unsigned, CUjit_option *, void **);
typedef CUresult (*pfn_link_add_file)(CUlinkState, CUjitInputType, const char *, unsigned,
                                      CUjit_option *, void **);
typedef CUresult (*pfn_link_complete)(CUlinkState, void **, size_t *);
typedef CUresult (*pfn_link_destroy)(CUlinkState);
typedef CUresult (*pfn_module_load)(CUmodule *, const void *);
typedef CUresult (*pfn_get_function)(CUfunction *, CUmodule, const char *);
typedef CUresult (*pfn_kernel_launch)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned,
                                      unsigned, unsigned, CUstream, void **, void **);

static CUfunction loop_fn;            /* NULL: not built (loop_why says why) */
static pfn_kernel_launch loop_launch; /* cuLaunchKernel */
static char loop_why[160];

/* Builds dlsync_loop_turn once; false (and loop_why) where it cannot. */
static bool loop_kernel(void) {
  static bool tried;
  static const char *const archives[] = {"/usr/local/cuda/lib64/libcudadevrt.a",
                                         "/usr/local/cuda/targets/x86_64-linux/lib/libcudadevrt.a",
                                         "/usr/local/cuda/targets/sbsa-linux/lib/libcudadevrt.a",
                                         "/usr/lib/x86_64-linux-gnu/libcudadevrt.a"};
  void *lib;
  pfn_link_create create = NULL;
  pfn_link_add_data add_data = NULL;
  pfn_link_add_file add_file = NULL;
  pfn_link_complete complete = NULL;
  pfn_link_destroy destroy = NULL;
  pfn_module_load load = NULL;
  pfn_get_function get = NULL;
  CUlinkState state = NULL;
  CUmodule mod = NULL;
  const char *archive = getenv("DLSYNC_CUDADEVRT");
  void *cubin = NULL;
  size_t size = 0;
  CUresult r;
  if (tried)
    return loop_fn != NULL;
  tried = true;
  lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (lib != NULL) {
    *(void **)&create = dlsym(lib, "cuLinkCreate_v2");
    *(void **)&add_data = dlsym(lib, "cuLinkAddData_v2");
    *(void **)&add_file = dlsym(lib, "cuLinkAddFile_v2");
    *(void **)&complete = dlsym(lib, "cuLinkComplete");
    *(void **)&destroy = dlsym(lib, "cuLinkDestroy");
    *(void **)&load = dlsym(lib, "cuModuleLoadData");
    *(void **)&get = dlsym(lib, "cuModuleGetFunction");
    *(void **)&loop_launch = dlsym(lib, "cuLaunchKernel");
  }
  if (create == NULL || add_data == NULL || add_file == NULL || complete == NULL ||
      destroy == NULL || load == NULL || get == NULL || loop_launch == NULL) {
    snprintf(loop_why, sizeof loop_why, "libcuda's link, module or launch entry points not found");
    return false;
  }
  if (archive == NULL || archive[0] == '\0') {
    archive = NULL;
    for (size_t i = 0; archive == NULL && i < sizeof archives / sizeof archives[0]; i++)
      if (access(archives[i], R_OK) == 0)
        archive = archives[i];
  }
  if (archive == NULL) {
    snprintf(loop_why, sizeof loop_why,
             "libcudadevrt.a not found (DLSYNC_CUDADEVRT names it): the WHILE body never runs");
    return false;
  }
  r = create(0, NULL, NULL, &state);
  if (r == CUDA_SUCCESS)
    r = add_data(state, CU_JIT_INPUT_PTX, (void *)(uintptr_t)loop_ptx, sizeof loop_ptx,
                 "dlsync_loop_turn.ptx", 0, NULL, NULL);
  if (r == CUDA_SUCCESS)
    r = add_file(state, CU_JIT_INPUT_LIBRARY, archive, 0, NULL, NULL);
  if (r == CUDA_SUCCESS)
    r = complete(state, &cubin, &size);
  if (r == CUDA_SUCCESS)
    r = load(&mod, cubin); /* before destroy: the cubin belongs to the link state */
  if (r == CUDA_SUCCESS)
    r = get(&loop_fn, mod, "dlsync_loop_turn");
  if (state != NULL)
    destroy(state);
  if (r != CUDA_SUCCESS) {
    loop_fn = NULL;
    snprintf(loop_why, sizeof loop_why, "the WHILE loop's kernel (linked with %s): %s", archive,
             gpu_err(D, r));
    return false;
  }
  return true;
}

/* A WHILE node in `parent` after a memset node that sets the countdown to
 * LOOP_TURNS, its condition 1 by default (0, and no memset, where the loop
 * kernel cannot be built: the body never runs). */
static CUresult while_node(CUgraph parent, CUgraphNode *node, CUgraph *body,
                           CUgraphConditionalHandle *h) {
  CUDA_MEMSET_NODE_PARAMS m;
  CUgraphNode reset = NULL;
  CUresult r;
  if (!loop_kernel())
    return cond_node_h(parent, NULL, 0, CU_GRAPH_COND_TYPE_WHILE, 0, node, body, h);
  memset(&m, 0, sizeof m);
  m.dst = slots + (CUdeviceptr)LOOP_SLOT * 4;
  m.value = LOOP_TURNS;
  m.elementSize = 4;
  m.width = 1;
  m.height = 1;
  r = D->GraphAddMemsetNode(&reset, parent, NULL, 0, &m, E.cuctx);
  if (r == CUDA_SUCCESS)
    r = cond_node_h(parent, &reset, 1, CU_GRAPH_COND_TYPE_WHILE, 1, node, body, h);
  return r;
}

/* The loop's turn at the end of the body: on a stream capturing into it
 * (s), or as a kernel node of `body` after deps (s NULL). Nothing where
 * the kernel cannot be built. */
static CUresult loop_turn(CUstream s, CUgraph body, const CUgraphNode *deps, size_t nd,
                          CUgraphConditionalHandle h) {
  CUdeviceptr counter = slots + (CUdeviceptr)LOOP_SLOT * 4;
  void *args[2];
  CUgraphNodeParams p;
  CUgraphNode n = NULL;
  if (loop_fn == NULL)
    return CUDA_SUCCESS;
  args[0] = &h;
  args[1] = &counter;
  if (s != NULL)
    return loop_launch(loop_fn, 1, 1, 1, 1, 1, 1, 0, s, args, NULL);
  memset(&p, 0, sizeof p);
  p.type = CU_GRAPH_NODE_TYPE_KERNEL;
  p.kernel.func = loop_fn;
  p.kernel.gridDimX = p.kernel.gridDimY = p.kernel.gridDimZ = 1;
  p.kernel.blockDimX = p.kernel.blockDimY = p.kernel.blockDimZ = 1;
  p.kernel.kernelParams = args;
  return D->GraphAddNode(&n, body, deps, NULL, nd, &p);
}

/* After a launch: the body ran LOOP_TURNS times (the countdown is 0). */
static void check_turns(outcome *o, int t) {
  unsigned left = 1;
  if (loop_fn == NULL) {
    note(o, "%s", loop_why);
    return;
  }
  if (read_slot(&left, LOOP_SLOT) != CUDA_SUCCESS || left != 0) {
    note(o, "trial %d: the WHILE body ran %d of %d turns", t, LOOP_TURNS - (int)left, LOOP_TURNS);
    o->wrong++;
  }
}

/* A scenario that failed midway may leave a capture going: ended (its
 * graph, maybe a body, left to its owner or leaked), so that the streams can
 * be destroyed. */
static void end_leftover_capture(CUstream s) {
  CUstreamCaptureStatus cs = CU_STREAM_CAPTURE_STATUS_NONE;
  CUgraph g = NULL;
  if (s != NULL && D->StreamIsCapturing(s, &cs) == CUDA_SUCCESS &&
      cs != CU_STREAM_CAPTURE_STATUS_NONE)
    (void)D->StreamEndCapture(s, &g);
}

static size_t event_nodes(CUgraph g) {
  return count_nodes(g, CU_GRAPH_NODE_TYPE_EVENT_RECORD) +
         count_nodes(g, CU_GRAPH_NODE_TYPE_WAIT_EVENT);
}

/* An exchange inside an IF body (the condition 1 at each launch): the
 * producer's stream captures into the body, the eager consumer joins it at
 * begin (JOIN) and is joined back at end: edges only, the parent
 * instantiates and each launch reads the producer's value. A fresh parent
 * per trial. Control: no exchange, the consumer's copy runs eagerly at once
 * and reads the previous value. */
static int sc_body_exchange(const scenario *s, CUstreamCaptureMode mode, bool use, outcome *o) {
  CUstream p = NULL, c = NULL, launch = NULL;
  dlsync_lane lp, lc;
  (void)s;
  CU(new_stream(&p));
  CU(new_stream(&c));
  CU(new_stream(&launch));
  CU(settle(p));
  lp = dlsync_lane_stream(p);
  lc = dlsync_lane_stream(c);
  for (int t = 0; t < TRIALS; t++) {
    CUgraph parent = NULL, body = NULL, ended = NULL;
    CUgraphNode node = NULL;
    dlsync_exchange *ex = NULL;
    unsigned v = ++value_base, got = 0;
    CUresult r;
    CU(D->GraphCreate(&parent, 0));
    r = cond_node(parent, NULL, 0, CU_GRAPH_COND_TYPE_IF, 1, &node, &body);
    if (r == CUDA_SUCCESS)
      r = D->StreamBeginCaptureToGraph(p, body, NULL, NULL, 0, mode);
    if (r != CUDA_SUCCESS) {
      note(o, "making the IF node and its capture: %s", gpu_err(D, r));
      o->broken++;
      D->GraphDestroy(parent);
      goto out;
    }
    if (use)
      DS(dlsync_conditional_body_add(E.ctx, body));
    CU(produce(p, big_buf, BIG_WORDS, v));
    if (use)
      DS(dlsync_exchange_begin(&ex, E.ctx, &lp, &lc));
    CU(consume(c, big_buf, BIG_WORDS, t));
    if (use)
      DS(dlsync_exchange_end(ex));
    END_CAPTURE(p, &ended);
    if (use)
      DS(dlsync_conditional_body_remove(E.ctx, body));
    if (event_nodes(body) != 0) {
      note(o, "trial %d: the body holds event nodes", t);
      o->broken++;
    }
    r = launch_once(parent, launch, t, &got);
    if (r != CUDA_SUCCESS) {
      note(o, "trial %d: the parent: %s", t, gpu_err(D, r));
      o->broken++;
      goto out;
    }
    CU(D->StreamSynchronize(p));
    CU(D->StreamSynchronize(c));
    if (!use)
      CU(read_slot(&got, t)); /* the eager copy's value */
    o->runs++;
    o->wrong += got != v;
  }
out:
  end_leftover_capture(p);
  end_leftover_capture(c);
  D->CtxSynchronize();
  drop_stream(p);
  drop_stream(c);
  drop_stream(launch);
  return 0;
}

/* An eager producer and a consumer captured into an IF body (torch.cond's
 * pattern: the parent captured on one stream, the IF node added to that
 * capture, the body captured on another). Ordering the consumer's body
 * capture after the eager producer (EAGER_TO_CAPTURE) is refused with
 * DLSYNC_ERROR_CONDITIONAL_BODY, the body's capture still valid; ordered
 * instead on the parent's capture before the IF node (a wait node in the
 * parent), the parent instantiates and each launch reads the producer's
 * value. Control: no order; the copy in the body does not wait for the slow
 * producer. */
static int sc_body_order_first(const scenario *s, CUstreamCaptureMode mode, bool use, outcome *o) {
  CUstream p = NULL, c = NULL, b = NULL, launch = NULL;
  dlsync_lane lp, lc, lb;
  (void)s;
  CU(new_stream(&p));
  CU(new_stream(&c));
  CU(new_stream(&b));
  CU(new_stream(&launch));
  CU(settle(p));
  lp = dlsync_lane_stream(p);
  lc = dlsync_lane_stream(c);
  lb = dlsync_lane_stream(b);
  for (int t = 0; t < TRIALS; t++) {
    CUgraph parent = NULL, body = NULL, ended = NULL, pg = NULL;
    CUgraphNode node = NULL;
    CUstreamCaptureStatus cs;
    const CUgraphNode *deps = NULL;
    size_t nd = 0;
    unsigned v = ++value_base, got = 0;
    CUresult r;
    CU(D->StreamBeginCapture(c, mode));
    /* Slow enough to outlast the parent's instantiation (launch_once makes
     * the executable first): eight passes over 4 GiB, the last with v. */
    for (int pass = 0; pass < 7; pass++)
      CU(produce(p, big_buf, BIG_WORDS, v + 0x40000000u));
    CU(produce(p, big_buf, BIG_WORDS, v));
    if (use)
      DS(dlsync_order(E.ctx, &lp, &lc)); /* on the parent, before the IF node */
    CU(D->StreamGetCaptureInfo(c, &cs, NULL, &pg, &deps, NULL, &nd));
    r = cond_node(pg, deps, nd, CU_GRAPH_COND_TYPE_IF, 1, &node, &body);
    if (r == CUDA_SUCCESS)
      r = D->StreamUpdateCaptureDependencies(c, &node, NULL, 1, CU_STREAM_SET_CAPTURE_DEPENDENCIES);
    if (r == CUDA_SUCCESS)
      r = D->StreamBeginCaptureToGraph(b, body, NULL, NULL, 0, mode);
    if (r != CUDA_SUCCESS) {
      note(o, "trial %d: the IF node in the capture: %s", t, gpu_err(D, r));
      o->broken++;
      goto out;
    }
    if (use) {
      DS(dlsync_conditional_body_add(E.ctx, body));
      DS_EXPECT(dlsync_order(E.ctx, &lp, &lb), DLSYNC_ERROR_CONDITIONAL_BODY);
      if (strstr(dlsync_last_error(), "EAGER_TO_CAPTURE") == NULL) {
        note(o, "the refusal does not name the row: %s", dlsync_last_error());
        o->broken++;
      }
    }
    CU(consume(b, big_buf, BIG_WORDS, t));
    END_CAPTURE(b, &ended);
    if (use)
      DS(dlsync_conditional_body_remove(E.ctx, body));
    END_CAPTURE(c, &parent);
    if (event_nodes(body) != 0 ||
        (use && count_nodes(parent, CU_GRAPH_NODE_TYPE_WAIT_EVENT) != 1)) {
      note(o, "trial %d: %zu event nodes in the body, %zu wait nodes in the parent", t,
           event_nodes(body), count_nodes(parent, CU_GRAPH_NODE_TYPE_WAIT_EVENT));
      o->broken++;
    }
    r = launch_once(parent, launch, t, &got);
    if (r != CUDA_SUCCESS) {
      note(o, "trial %d: the parent: %s", t, gpu_err(D, r));
      o->broken++;
      goto out;
    }
    CU(D->StreamSynchronize(p));
    o->runs++;
    o->wrong += got != v;
  }
out:
  end_leftover_capture(p);
  end_leftover_capture(c);
  end_leftover_capture(b);
  D->CtxSynchronize();
  drop_stream(p);
  drop_stream(c);
  drop_stream(b);
  drop_stream(launch);
  return 0;
}

/* Every row that would add an event node in a body, in an IF body and in a
 * WHILE body (its condition 0: the body never runs): EAGER_TO_CAPTURE,
 * TWO_CAPTURES both ways, CAPTURE_TO_BUILT, a fence signalled in the body's
 * capture, EAGER_TO_BUILT and TWO_BUILT on a graph lane on the body built by
 * hand: each refused with DLSYNC_ERROR_CONDITIONAL_BODY; the captures end
 * cleanly and every parent instantiates. Control: the same calls with no
 * body declared: they succeed, and the parents fail to instantiate. */
static int sc_body_refusals(const scenario *s, CUstreamCaptureMode mode, bool use, outcome *o) {
  static const CUgraphConditionalNodeType types[2] = {CU_GRAPH_COND_TYPE_IF,
                                                      CU_GRAPH_COND_TYPE_WHILE};
  CUstream p = NULL, c = NULL;
  dlsync_lane lp, lc;
  (void)s;
  CU(new_stream(&p));
  CU(new_stream(&c));
  lp = dlsync_lane_stream(p);
  lc = dlsync_lane_stream(c);
  for (int k = 0; k < 2; k++) {
    CUgraph parent = NULL, body = NULL, ended = NULL, other = NULL, built = NULL, bparent = NULL;
    CUgraph bbody = NULL;
    CUgraphNode node = NULL, bnode = NULL, own = NULL, bdeps[2], odeps[2];
    CUgraphExec x = NULL;
    dlsync_lane lbody, lother;
    dlsync_fence *f = NULL;
    dlsync_status want = use ? DLSYNC_ERROR_CONDITIONAL_BODY : DLSYNC_SUCCESS;
    CUresult r;
    unsigned dflt = types[k] == CU_GRAPH_COND_TYPE_IF ? 1 : 0;
    CU(D->GraphCreate(&parent, 0));
    CU(D->GraphCreate(&bparent, 0));
    CU(D->GraphCreate(&built, 0));
    r = cond_node(parent, NULL, 0, types[k], dflt, &node, &body);
    if (r == CUDA_SUCCESS)
      r = cond_node(bparent, NULL, 0, types[k], dflt, &bnode, &bbody);
    if (r != CUDA_SUCCESS) {
      note(o, "the conditional nodes: %s", gpu_err(D, r));
      o->broken++;
      goto next;
    }
    if (use) {
      DS(dlsync_conditional_body_add(E.ctx, body));
      DS(dlsync_conditional_body_add(E.ctx, bbody));
    }
    /* Captures: c into the body, p an ordinary capture. */
    CU(D->StreamBeginCaptureToGraph(c, body, NULL, NULL, 0, mode));
    CU(consume(c, big_buf, BIG_WORDS, 0));
    DS_EXPECT(dlsync_order(E.ctx, &lp, &lc), want); /* EAGER_TO_CAPTURE */
    CU(D->StreamBeginCapture(p, mode));
    CU(produce(p, big_buf, 1, 5));
    DS_EXPECT(dlsync_order(E.ctx, &lp, &lc), want); /* TWO_CAPTURES, wait node in the body */
    DS_EXPECT(dlsync_order(E.ctx, &lc, &lp), want); /* TWO_CAPTURES, record node in the body */
    CU(add_memset_node(&own, built, NULL, 0));
    odeps[0] = own;
    lother = dlsync_lane_graph(built, odeps, 1, 2);
    DS_EXPECT(dlsync_order(E.ctx, &lc, &lother), want); /* CAPTURE_TO_BUILT */
    DS_EXPECT(dlsync_fence_signal(&f, E.ctx, &lc), want);
    if (f != NULL)
      dlsync_fence_release(f);
    END_CAPTURE(p, &other);
    END_CAPTURE(c, &ended);
    /* A graph lane on the other body, built by hand. */
    CU(add_memset_node(&own, bbody, NULL, 0));
    bdeps[0] = own;
    lbody = dlsync_lane_graph(bbody, bdeps, 1, 2);
    DS_EXPECT(dlsync_order(E.ctx, &lp, &lbody), want);     /* EAGER_TO_BUILT */
    DS_EXPECT(dlsync_order(E.ctx, &lother, &lbody), want); /* TWO_BUILT */
    if (use) {
      DS(dlsync_conditional_body_remove(E.ctx, body));
      DS(dlsync_conditional_body_remove(E.ctx, bbody));
    }
    o->runs++;
    r = D->GraphInstantiateWithFlags(&x, parent, 0);
    if (x != NULL)
      D->GraphExecDestroy(x);
    x = NULL;
    if (r != CUDA_SUCCESS) {
      note(o, "%s body: the parent of the captured body: %s",
           types[k] == CU_GRAPH_COND_TYPE_IF ? "IF" : "WHILE", gpu_err(D, r));
      o->broken++;
    }
    r = D->GraphInstantiateWithFlags(&x, bparent, 0);
    if (x != NULL)
      D->GraphExecDestroy(x);
    if (r != CUDA_SUCCESS) {
      note(o, "%s body: the parent of the built body: %s",
           types[k] == CU_GRAPH_COND_TYPE_IF ? "IF" : "WHILE", gpu_err(D, r));
      o->broken++;
    }
  next:
    D->CtxSynchronize();
    if (other != NULL)
      D->GraphDestroy(other);
    if (built != NULL)
      D->GraphDestroy(built);
    if (parent != NULL)
      D->GraphDestroy(parent);
    if (bparent != NULL)
      D->GraphDestroy(bparent);
    (void)dlsync_conditional_body_remove(E.ctx, body);
    (void)dlsync_conditional_body_remove(E.ctx, bbody);
  }
out:
  end_leftover_capture(p);
  end_leftover_capture(c);
  D->CtxSynchronize();
  drop_stream(p);
  drop_stream(c);
  return 0;
}

/* ---- K: event nodes hoisted out of bodies (dlsync_conditional_node_declare) ---- */

/* The slow producer: eight passes over 4 GiB on s, the last with v (long
 * enough to outlast the instantiation and launch that follow). */
static CUresult slow_produce(CUstream s, unsigned v) {
  CUresult r = CUDA_SUCCESS;
  for (int pass = 0; pass < 7 && r == CUDA_SUCCESS; pass++)
    r = produce(s, big_buf, BIG_WORDS, v + 0x40000000u);
  return r == CUDA_SUCCESS ? produce(s, big_buf, BIG_WORDS, v) : r;
}

/* With dlsync the body holds no event node and the parent exactly `waits`
 * wait nodes and `records` record nodes. */
static void check_hoisted(outcome *o, int t, CUgraph parent, CUgraph body, size_t waits,
                          size_t records) {
  if (event_nodes(body) != 0 || count_nodes(parent, CU_GRAPH_NODE_TYPE_WAIT_EVENT) != waits ||
      count_nodes(parent, CU_GRAPH_NODE_TYPE_EVENT_RECORD) != records) {
    note(o, "trial %d: %zu event nodes in the body; %zu wait and %zu record nodes in the parent", t,
         event_nodes(body), count_nodes(parent, CU_GRAPH_NODE_TYPE_WAIT_EVENT),
         count_nodes(parent, CU_GRAPH_NODE_TYPE_EVENT_RECORD));
    o->broken++;
  }
}

/* An eager slow producer and a consumer in a conditional node's body, the
 * body declared with its parent (built by hand): dlsync_order hoists the wait
 * into the parent, ahead of the conditional node. s->flags: bit 0, a WHILE
 * node (else IF); bit 1, the body a graph lane built by hand
 * (EAGER_TO_BUILT; else a capture into it, EAGER_TO_CAPTURE). The IF's
 * condition is 1 at each launch; the WHILE's is 1 by default and its body
 * runs LOOP_TURNS turns (dlsync_loop_turn counts them down; checked after
 * each launch). The consumer's copy is in the body, on every turn (where the
 * loop's kernel cannot be built, the WHILE's condition is 0 and the copy a
 * node of the parent after the WHILE node, which the hoisted wait must
 * precede). Each of TRIALS launches of a fresh parent reads the producer's
 * value; the parent instantiates. Control: no declaration, no order; the
 * copy does not wait for the slow producer. */
static int sc_hoist_eager(const scenario *s, CUstreamCaptureMode mode, bool use, outcome *o) {
  bool is_while = (s->flags & 1) != 0, built = (s->flags & 2) != 0;
  CUstream p = NULL, b = NULL, launch = NULL;
  dlsync_lane lp, lb;
  CU(new_stream(&p));
  CU(new_stream(&b));
  CU(new_stream(&launch));
  CU(settle(p));
  lp = dlsync_lane_stream(p);
  lb = dlsync_lane_stream(b);
  for (int t = 0; t < TRIALS; t++) {
    CUgraph parent = NULL, body = NULL, ended = NULL;
    CUgraphNode node = NULL, first = NULL, cp = NULL, bdeps[2];
    CUgraphConditionalHandle h = 0;
    unsigned v = ++value_base, got = 0;
    CUresult r;
    CU(D->GraphCreate(&parent, 0));
    if (is_while)
      r = while_node(parent, &node, &body, &h);
    else
      r = cond_node(parent, NULL, 0, CU_GRAPH_COND_TYPE_IF, 1, &node, &body);
    if (r == CUDA_SUCCESS && is_while && loop_fn == NULL)
      r = add_copy_node(&cp, parent, &node, 1, t); /* the body never runs: the copy after it */
    if (r != CUDA_SUCCESS) {
      note(o, "trial %d: the conditional node: %s", t, gpu_err(D, r));
      o->broken++;
      D->GraphDestroy(parent);
      goto out;
    }
    if (use)
      DS(dlsync_conditional_node_declare(E.ctx, parent, node, &body, 1));
    CU(slow_produce(p, v));
    if (built) {
      CU(D->GraphAddEmptyNode(&first, body, NULL, 0));
      bdeps[0] = first;
      lb = dlsync_lane_graph(body, bdeps, 1, 2);
      if (use)
        DS(dlsync_order(E.ctx, &lp, &lb)); /* EAGER_TO_BUILT, hoisted */
      if (!is_while || loop_fn != NULL) {
        CU(add_copy_node(&cp, body, lb.deps, lb.ndeps, t));
        if (is_while)
          CU(loop_turn(NULL, body, &cp, 1, h));
      }
    } else {
      lb = dlsync_lane_stream(b);
      CU(D->StreamBeginCaptureToGraph(b, body, NULL, NULL, 0, mode));
      if (use)
        DS(dlsync_order(E.ctx, &lp, &lb)); /* EAGER_TO_CAPTURE, hoisted */
      if (is_while && loop_fn == NULL) {
        CU(D->MemsetD32Async(slots + (SLOTS - 1) * 4, 0, 1, b)); /* never runs */
      } else {
        CU(consume(b, big_buf, BIG_WORDS, t));
        if (is_while)
          CU(loop_turn(b, NULL, NULL, 0, h));
      }
      END_CAPTURE(b, &ended);
    }
    if (use)
      check_hoisted(o, t, parent, body, 1, 0);
    if (use)
      DS(dlsync_conditional_body_remove(E.ctx, body));
    r = launch_once(parent, launch, t, &got);
    if (r != CUDA_SUCCESS) {
      note(o, "trial %d: the parent: %s", t, gpu_err(D, r));
      o->broken++;
      goto out;
    }
    CU(D->StreamSynchronize(p));
    o->runs++;
    o->wrong += got != v;
    if (is_while)
      check_turns(o, t);
  }
out:
  end_leftover_capture(b);
  D->CtxSynchronize();
  drop_stream(p);
  drop_stream(b);
  drop_stream(launch);
  return 0;
}

/* torch.cond's pattern, hoisted: the parent captured on c, an IF node added
 * to that capture at its dependencies (and made its dependency), the body
 * captured on b and declared with the capture's graph as its parent; an
 * eager slow producer ordered before the body's capture (EAGER_TO_CAPTURE)
 * gets its wait node in the parent's capture, with an edge to the IF node
 * (gpu_rules R42). Both captures end cleanly, the parent instantiates and
 * each launch reads the producer's value. Control: no declaration, no order. */
static int sc_hoist_parent_capture(const scenario *s, CUstreamCaptureMode mode, bool use,
                                   outcome *o) {
  CUstream p = NULL, c = NULL, b = NULL, launch = NULL;
  dlsync_lane lp, lb;
  (void)s;
  CU(new_stream(&p));
  CU(new_stream(&c));
  CU(new_stream(&b));
  CU(new_stream(&launch));
  CU(settle(p));
  lp = dlsync_lane_stream(p);
  lb = dlsync_lane_stream(b);
  for (int t = 0; t < TRIALS; t++) {
    CUgraph parent = NULL, body = NULL, ended = NULL, pg = NULL;
    CUgraphNode node = NULL;
    CUstreamCaptureStatus cs;
    const CUgraphNode *deps = NULL;
    size_t nd = 0;
    unsigned v = ++value_base, got = 0;
    CUresult r;
    CU(D->StreamBeginCapture(c, mode));
    CU(D->MemsetD32Async(slots + (SLOTS - 1) * 4, 0, 1, c)); /* the parent's own work */
    CU(D->StreamGetCaptureInfo(c, &cs, NULL, &pg, &deps, NULL, &nd));
    r = cond_node(pg, deps, nd, CU_GRAPH_COND_TYPE_IF, 1, &node, &body);
    if (r == CUDA_SUCCESS)
      r = D->StreamUpdateCaptureDependencies(c, &node, NULL, 1, CU_STREAM_SET_CAPTURE_DEPENDENCIES);
    if (r == CUDA_SUCCESS)
      r = D->StreamBeginCaptureToGraph(b, body, NULL, NULL, 0, mode);
    if (r != CUDA_SUCCESS) {
      note(o, "trial %d: the IF node in the capture: %s", t, gpu_err(D, r));
      o->broken++;
      goto out;
    }
    if (use)
      DS(dlsync_conditional_node_declare(E.ctx, pg, node, &body, 1));
    CU(slow_produce(p, v));
    if (use)
      DS(dlsync_order(E.ctx, &lp, &lb)); /* hoisted into c's capture */
    CU(consume(b, big_buf, BIG_WORDS, t));
    END_CAPTURE(b, &ended);
    END_CAPTURE(c, &parent);
    if (use) {
      check_hoisted(o, t, parent, body, 1, 0);
      DS(dlsync_conditional_body_remove(E.ctx, body));
    }
    r = launch_once(parent, launch, t, &got);
    if (r != CUDA_SUCCESS) {
      note(o, "trial %d: the parent: %s", t, gpu_err(D, r));
      o->broken++;
      goto out;
    }
    CU(D->StreamSynchronize(p));
    o->runs++;
    o->wrong += got != v;
  }
out:
  end_leftover_capture(b);
  end_leftover_capture(c);
  D->CtxSynchronize();
  drop_stream(p);
  drop_stream(c);
  drop_stream(b);
  drop_stream(launch);
  return 0;
}

/* A slow producer in an IF body (captured on b, the condition 1 at each
 * launch) and a consumer in another graph built by hand (CAPTURE_TO_BUILT):
 * the record node is hoisted into the parent after the IF node, the wait
 * node goes at the consumer's frontier. The parent launched on one stream,
 * the consumer's graph right after on another: each of TRIALS reads the
 * producer's value. Control: no declaration, no order; the consumer's copy
 * does not wait for the parent. */
static int sc_hoist_body_producer(const scenario *s, CUstreamCaptureMode mode, bool use,
                                  outcome *o) {
  CUstream b = NULL, s1 = NULL, s2 = NULL;
  dlsync_lane lb;
  (void)s;
  CU(new_stream(&b));
  CU(new_stream(&s1));
  CU(new_stream(&s2));
  CU(settle(s1));
  lb = dlsync_lane_stream(b);
  for (int t = 0; t < TRIALS; t++) {
    CUgraph parent = NULL, body = NULL, ended = NULL, other = NULL;
    CUgraphExec xp = NULL, xo = NULL;
    CUgraphNode node = NULL, cp = NULL, odeps[2];
    dlsync_lane lo;
    unsigned v = ++value_base, got = 0;
    CUresult r;
    CU(D->GraphCreate(&parent, 0));
    CU(D->GraphCreate(&other, 0));
    r = cond_node(parent, NULL, 0, CU_GRAPH_COND_TYPE_IF, 1, &node, &body);
    if (r == CUDA_SUCCESS)
      r = D->StreamBeginCaptureToGraph(b, body, NULL, NULL, 0, mode);
    if (r != CUDA_SUCCESS) {
      note(o, "trial %d: the IF node and its capture: %s", t, gpu_err(D, r));
      o->broken++;
      drop_graph(parent, NULL);
      drop_graph(other, NULL);
      goto out;
    }
    if (use)
      DS(dlsync_conditional_node_declare(E.ctx, parent, node, &body, 1));
    lo = dlsync_lane_graph(other, odeps, 0, 2);
    CU(slow_produce(b, v));
    if (use)
      DS(dlsync_order(E.ctx, &lb, &lo)); /* CAPTURE_TO_BUILT, the record hoisted */
    END_CAPTURE(b, &ended);
    CU(add_copy_node(&cp, other, lo.deps, lo.ndeps, t));
    if (use) {
      check_hoisted(o, t, parent, body, 0, 1);
      DS(dlsync_conditional_body_remove(E.ctx, body));
    }
    r = D->GraphInstantiateWithFlags(&xp, parent, 0);
    if (r == CUDA_SUCCESS)
      r = D->GraphInstantiateWithFlags(&xo, other, 0);
    if (r == CUDA_SUCCESS)
      r = D->GraphLaunch(xp, s1);
    if (r == CUDA_SUCCESS)
      r = D->GraphLaunch(xo, s2);
    if (r == CUDA_SUCCESS)
      r = D->StreamSynchronize(s2);
    if (r == CUDA_SUCCESS)
      r = D->StreamSynchronize(s1);
    if (r == CUDA_SUCCESS)
      r = read_slot(&got, t);
    drop_graph(parent, xp);
    drop_graph(other, xo);
    if (r != CUDA_SUCCESS) {
      note(o, "trial %d: the graphs: %s", t, gpu_err(D, r));
      o->broken++;
      goto out;
    }
    o->runs++;
    o->wrong += got != v;
  }
out:
  end_leftover_capture(b);
  D->CtxSynchronize();
  drop_stream(b);
  drop_stream(s1);
  drop_stream(s2);
  return 0;
}

/* A memset node of value v over the big buffer, after deps. */
static CUresult add_memset_v(CUgraphNode *n, CUgraph g, const CUgraphNode *deps, size_t nd,
                             unsigned v) {
  CUDA_MEMSET_NODE_PARAMS p;
  memset(&p, 0, sizeof p);
  p.dst = big_buf;
  p.value = v;
  p.elementSize = 4;
  p.width = BIG_WORDS;
  p.height = 1;
  return D->GraphAddMemsetNode(n, g, deps, nd, &p, E.cuctx);
}

/* The slow producer as a chain of eight memset nodes in g (the last of
 * value v) after *last (NULL: a root); *last is then the chain's end. */
static CUresult slow_produce_nodes(CUgraph g, CUgraphNode *last, unsigned v) {
  CUresult r = CUDA_SUCCESS;
  for (int pass = 0; pass < 8 && r == CUDA_SUCCESS; pass++) {
    CUgraphNode n = NULL;
    r = add_memset_v(&n, g, *last != NULL ? last : NULL, *last != NULL ? 1 : 0,
                     pass < 7 ? v + 0x40000000u : v);
    *last = n;
  }
  return r;
}

/* The rows between two graphs with one lane in a body declared with its
 * parent (s->flags & 7): 0 TWO_CAPTURES, an ordinary capture's slow producer
 * and a consumer captured into the body; 1 TWO_CAPTURES, the producer
 * captured into the body and the consumer an ordinary capture; 2
 * BUILT_TO_CAPTURE, a producer graph built by hand and the consumer captured
 * into the body; 3 TWO_BUILT, the same with the consumer a graph lane in the
 * body; 4 TWO_BUILT, the producer a graph lane in the body and the consumer
 * another graph built by hand. s->flags & 8: a WHILE node (rows 0, 2 and 3
 * only; LOOP_TURNS turns, the consumer's copy in the body on each, the turns
 * checked after each launch; where the loop's kernel cannot be built, the
 * condition 0 and the copy a node of the parent after the WHILE node), else
 * IF (condition 1). The producer's graph
 * is launched on one stream, the consumer's right after on another; each of
 * TRIALS reads the producer's value, no body holds an event node and every
 * graph instantiates. Control: no declaration, no order. */
static int sc_hoist_two_graphs(const scenario *s, CUstreamCaptureMode mode, bool use, outcome *o) {
  int row = (int)(s->flags & 7);
  bool is_while = (s->flags & 8) != 0;
  bool producer_in_body = row == 1 || row == 4;
  CUstream p = NULL, b = NULL, s1 = NULL, s2 = NULL;
  CU(new_stream(&p));
  CU(new_stream(&b));
  CU(new_stream(&s1));
  CU(new_stream(&s2));
  CU(settle(s1));
  for (int t = 0; t < TRIALS; t++) {
    CUgraph parent = NULL, body = NULL, other = NULL, ended = NULL;
    CUgraph gp, gc;
    CUgraphExec xp = NULL, xc = NULL;
    CUgraphNode node = NULL, last = NULL, cp = NULL, first = NULL, ldeps[2];
    CUgraphConditionalHandle h = 0;
    dlsync_lane lp = dlsync_lane_stream(p), lb = dlsync_lane_stream(b), lg;
    unsigned v = ++value_base, got = 0;
    CUresult r;
    CU(D->GraphCreate(&parent, 0));
    if (is_while)
      r = while_node(parent, &node, &body, &h);
    else
      r = cond_node(parent, NULL, 0, CU_GRAPH_COND_TYPE_IF, 1, &node, &body);
    if (r == CUDA_SUCCESS && is_while && loop_fn == NULL)
      r = add_copy_node(&cp, parent, &node, 1, t); /* the body never runs: the copy after it */
    if (r != CUDA_SUCCESS) {
      note(o, "trial %d: the conditional node: %s", t, gpu_err(D, r));
      o->broken++;
      D->GraphDestroy(parent);
      goto out;
    }
    if (use)
      DS(dlsync_conditional_node_declare(E.ctx, parent, node, &body, 1));
    switch (row) {
    case 0: /* TWO_CAPTURES: p (ordinary capture) -> b (into the body) */
      CU(D->StreamBeginCapture(p, mode));
      CU(slow_produce(p, v));
      CU(D->StreamBeginCaptureToGraph(b, body, NULL, NULL, 0, mode));
      if (use)
        DS(dlsync_order(E.ctx, &lp, &lb));
      if (is_while && loop_fn == NULL) {
        CU(D->MemsetD32Async(slots + (SLOTS - 1) * 4, 0, 1, b)); /* never runs */
      } else {
        CU(consume(b, big_buf, BIG_WORDS, t));
        if (is_while)
          CU(loop_turn(b, NULL, NULL, 0, h));
      }
      END_CAPTURE(b, &ended);
      END_CAPTURE(p, &other);
      break;
    case 1: /* TWO_CAPTURES: b (into the body) -> p (ordinary capture) */
      CU(D->StreamBeginCaptureToGraph(b, body, NULL, NULL, 0, mode));
      CU(slow_produce(b, v));
      CU(D->StreamBeginCapture(p, mode));
      CU(D->MemsetD32Async(slots + (SLOTS - 1) * 4, 0, 1, p));
      if (use)
        DS(dlsync_order(E.ctx, &lb, &lp));
      CU(consume(p, big_buf, BIG_WORDS, t));
      END_CAPTURE(p, &other);
      END_CAPTURE(b, &ended);
      break;
    case 2: /* BUILT_TO_CAPTURE: a built graph -> b (into the body) */
    case 3: /* TWO_BUILT: a built graph -> a lane in the body */
      CU(D->GraphCreate(&other, 0));
      CU(slow_produce_nodes(other, &last, v));
      ldeps[0] = last;
      lg = dlsync_lane_graph(other, ldeps, 1, 2);
      if (row == 2) {
        CU(D->StreamBeginCaptureToGraph(b, body, NULL, NULL, 0, mode));
        if (use)
          DS(dlsync_order(E.ctx, &lg, &lb));
        if (is_while && loop_fn == NULL) {
          CU(D->MemsetD32Async(slots + (SLOTS - 1) * 4, 0, 1, b)); /* never runs */
        } else {
          CU(consume(b, big_buf, BIG_WORDS, t));
          if (is_while)
            CU(loop_turn(b, NULL, NULL, 0, h));
        }
        END_CAPTURE(b, &ended);
      } else {
        CUgraphNode bdeps[2];
        dlsync_lane lbody;
        CU(D->GraphAddEmptyNode(&first, body, NULL, 0));
        bdeps[0] = first;
        lbody = dlsync_lane_graph(body, bdeps, 1, 2);
        if (use)
          DS(dlsync_order(E.ctx, &lg, &lbody));
        if (!is_while || loop_fn != NULL) {
          CU(add_copy_node(&cp, body, lbody.deps, lbody.ndeps, t));
          if (is_while)
            CU(loop_turn(NULL, body, &cp, 1, h));
        }
      }
      break;
    default: { /* TWO_BUILT: a lane in the body -> a built graph */
      CUgraphNode bdeps[2];
      dlsync_lane lbody;
      CU(slow_produce_nodes(body, &last, v));
      bdeps[0] = last;
      lbody = dlsync_lane_graph(body, bdeps, 1, 2);
      CU(D->GraphCreate(&other, 0));
      lg = dlsync_lane_graph(other, ldeps, 0, 2);
      if (use)
        DS(dlsync_order(E.ctx, &lbody, &lg));
      CU(add_copy_node(&cp, other, lg.deps, lg.ndeps, t));
      break;
    }
    }
    if (use) {
      check_hoisted(o, t, parent, body, producer_in_body ? 0 : 1, producer_in_body ? 1 : 0);
      DS(dlsync_conditional_body_remove(E.ctx, body));
    }
    gp = producer_in_body ? parent : other;
    gc = producer_in_body ? other : parent;
    r = D->GraphInstantiateWithFlags(&xp, gp, 0);
    if (r == CUDA_SUCCESS)
      r = D->GraphInstantiateWithFlags(&xc, gc, 0);
    if (r == CUDA_SUCCESS)
      r = D->GraphLaunch(xp, s1);
    if (r == CUDA_SUCCESS)
      r = D->GraphLaunch(xc, s2);
    if (r == CUDA_SUCCESS)
      r = D->StreamSynchronize(s2);
    if (r == CUDA_SUCCESS)
      r = D->StreamSynchronize(s1);
    if (r == CUDA_SUCCESS)
      r = read_slot(&got, t);
    drop_graph(gp, xp);
    drop_graph(gc, xc);
    if (r != CUDA_SUCCESS) {
      note(o, "trial %d: the graphs: %s", t, gpu_err(D, r));
      o->broken++;
      goto out;
    }
    o->runs++;
    o->wrong += got != v;
    if (is_while)
      check_turns(o, t);
  }
out:
  end_leftover_capture(b);
  end_leftover_capture(p);
  D->CtxSynchronize();
  drop_stream(p);
  drop_stream(b);
  drop_stream(s1);
  drop_stream(s2);
  return 0;
}

/* ---- G: a library's own graph on any lane (include/dlsync/graph.h) ---- */

/* The library's graph: the consumer's copy of the buffer's last word into
 * `slot`, built by hand, and its executable. */
static CUresult library_graph(CUgraph *g, CUgraphExec *x, int slot) {
  CUgraphNode n = NULL;
  CUresult r = D->GraphCreate(g, 0);
  if (r == CUDA_SUCCESS)
    r = add_copy_node(&n, *g, NULL, 0, slot);
  if (r == CUDA_SUCCESS && x != NULL)
    r = D->GraphInstantiateWithFlags(x, *g, 0);
  return r;
}

/* dlsync_graph_launch of the library's graph after a slow producer, on the
 * lane kind s->flags names: 0 an eager stream (ordered after the producer's
 * stream by dlsync_order, then the executable launched), 1 a capturing
 * stream (a child node after the captured producer; the library's graph
 * destroyed at once; the capture replayed with fresh values), 2 a graph
 * lane built by hand (a child node after the producer's memset node;
 * replayed). Control: what a library without dlsync does: cuGraphLaunch of
 * its executable on the stream whatever it is (eager: unordered after the
 * producer's stream; capturing: refused, the capture broken), or, on a built
 * graph, its graph as a child with no dependency. */
static int sc_graph_launch(const scenario *s, CUstreamCaptureMode mode, bool use, outcome *o) {
  CUstream p = NULL, c = NULL, launch = NULL;
  CUgraph lg = NULL, g = NULL;
  CUgraphExec lx = NULL, x = NULL;
  CUgraphNode m = NULL, deps[2];
  dlsync_lane lp, lc, lb;
  CU(new_stream(&p));
  CU(new_stream(&c));
  CU(new_stream(&launch));
  CU(settle(p));
  lp = dlsync_lane_stream(p);
  lc = dlsync_lane_stream(c);
  if (s->flags == 0) {
    CU(library_graph(&lg, &lx, 0));
    for (int t = 0; t < TRIALS; t++) {
      unsigned v = ++value_base, got = 0;
      CU(produce(p, big_buf, BIG_WORDS, v));
      if (use) {
        DS(dlsync_order(E.ctx, &lp, &lc));
        DS(dlsync_graph_launch(E.ctx, lg, lx, &lc));
      } else {
        CU(D->GraphLaunch(lx, c));
      }
      CU(D->StreamSynchronize(c));
      CU(D->StreamSynchronize(p));
      CU(read_slot(&got, 0));
      o->runs++;
      o->wrong += got != v;
    }
    goto out;
  }
  if (s->flags == 1) {
    CUresult r;
    CU(library_graph(&lg, &lx, 0));
    CU(D->StreamBeginCapture(c, mode));
    CU(produce(c, big_buf, BIG_WORDS, 7));
    if (use) {
      DS(dlsync_graph_launch(E.ctx, lg, lx, &lc));
      drop_graph(lg, NULL); /* the caller may let its graph go at once */
      lg = NULL;
      r = CUDA_SUCCESS;
    } else {
      r = D->GraphLaunch(lx, c);
    }
    if (r != CUDA_SUCCESS) {
      note(o, "cuGraphLaunch in the capture: %s", gpu_err(D, r));
      o->broken++;
    }
    r = D->StreamEndCapture(c, &g);
    if (r != CUDA_SUCCESS) {
      note(o, "cuStreamEndCapture: %s", gpu_err(D, r));
      o->broken++;
      goto out;
    }
    if (use && (count_nodes(g, CU_GRAPH_NODE_TYPE_GRAPH) != 1 ||
                count_nodes(g, CU_GRAPH_NODE_TYPE_MEMSET) != 1)) {
      note(o, "expected the producer's memset and one child node, found %zu and %zu",
           count_nodes(g, CU_GRAPH_NODE_TYPE_MEMSET), count_nodes(g, CU_GRAPH_NODE_TYPE_GRAPH));
      o->broken++;
    }
  } else {
    CU(library_graph(&lg, NULL, 0));
    CU(D->GraphCreate(&g, 0));
    CU(add_memset_node(&m, g, NULL, 0));
    deps[0] = m;
    lb = dlsync_lane_graph(g, deps, 1, 2);
    if (use) {
      DS(dlsync_graph_launch(E.ctx, lg, NULL, &lb));
    } else {
      CUgraphNode child = NULL;
      CU(D->GraphAddChildGraphNode(&child, g, NULL, 0, lg));
    }
    drop_graph(lg, NULL);
    lg = NULL;
  }
  CU(D->GraphInstantiateWithFlags(&x, g, 0));
  replay(o, g, x, launch, NULL, launch, 0);
out:
  end_leftover_capture(c);
  D->CtxSynchronize();
  drop_graph(g, x);
  drop_graph(lg, lx);
  drop_stream(p);
  drop_stream(c);
  drop_stream(launch);
  return 0;
}

/* ---- U: recapture applied with cuGraphExecUpdate ---- */

static size_t graph_owned_now(void) {
  dlsync__pool_stats ps;
  dlsync__pool_stats_get(&ps, &E.ctx->pools);
  return ps.graph_owned;
}

/* One step: the slow producer eager on p, the consumer's capture on c
 * ordered after it (EAGER_TO_CAPTURE) and copying into slot 0. */
static int capture_step(outcome *o, CUstream p, CUstream c, CUstreamCaptureMode mode, bool use,
                        unsigned v, CUgraph *g) {
  dlsync_lane lp = dlsync_lane_stream(p), lc = dlsync_lane_stream(c);
  CU(produce(p, big_buf, BIG_WORDS, v));
  CU(D->StreamBeginCapture(c, mode));
  if (use)
    DS(dlsync_order(E.ctx, &lp, &lc));
  CU(consume(c, big_buf, BIG_WORDS, 0));
  END_CAPTURE(c, g);
  return 0;
out:
  end_leftover_capture(c);
  return -1;
}

/* A step recaptured each time with the same lane states (EAGER_TO_CAPTURE)
 * and applied to one executable with cuGraphExecUpdate, which must accept
 * it; the new graph is destroyed at once, then dlsync's pool is churned (8
 * orders from an idle stream into a capture thrown away, which take the
 * pool's free events, the new graph's too if they came back), then the
 * executable is launched and must read the producer's value. The node count
 * is the same every step. Printed once: whether the new graph's events
 * stayed owned (the executable took its user-object references) or came
 * back to the pool. Control: no order; stale reads. */
static int sc_recapture_update(const scenario *s, CUstreamCaptureMode mode, bool use, outcome *o) {
  CUstream p = NULL, c = NULL, q = NULL, t = NULL, launch = NULL;
  CUgraph g = NULL;
  CUgraphExec x = NULL;
  size_t nodes0 = 0;
  static bool told;
  (void)s;
  CU(new_stream(&p));
  CU(new_stream(&c));
  CU(new_stream(&q));
  CU(new_stream(&t));
  CU(new_stream(&launch));
  CU(settle(p));
  for (int k = 0; k < TRIALS; k++) {
    unsigned v = ++value_base, got = 0;
    CUgraph churn = NULL;
    dlsync_lane lq = dlsync_lane_stream(q), lt = dlsync_lane_stream(t);
    if (capture_step(o, p, c, mode, use, v, &g) != 0)
      goto out;
    if (k == 0) {
      nodes0 = count_nodes(g, CU_GRAPH_NODE_TYPE_WAIT_EVENT);
      CU(D->GraphInstantiateWithFlags(&x, g, 0));
      CU(D->GraphDestroy(g)); /* the executable holds what it needs */
      g = NULL;
    } else {
      CUgraphExecUpdateResultInfo info;
      size_t owned_before = graph_owned_now();
      CUresult r;
      memset(&info, 0, sizeof info);
      if (count_nodes(g, CU_GRAPH_NODE_TYPE_WAIT_EVENT) != nodes0) {
        note(o, "step %d: %zu wait nodes, the first step had %zu", k,
             count_nodes(g, CU_GRAPH_NODE_TYPE_WAIT_EVENT), nodes0);
        o->broken++;
      }
      r = D->GraphExecUpdate(x, g, &info);
      if (r != CUDA_SUCCESS) {
        note(o, "step %d: cuGraphExecUpdate: %s (update result %d)", k, gpu_err(D, r),
             (int)info.result);
        o->broken++;
        goto out;
      }
      CU(D->GraphDestroy(g));
      g = NULL;
      {
        /* The new graph's events back in the pool before the churn, if
         * they come back at all (the driver runs the destructors on a thread
         * of its own). */
        size_t owned_after = owned_before;
        for (int i = 0; i < (k == 1 ? 200 : 20) && use && owned_after >= owned_before; i++) {
          struct timespec ts = {0, 1000000};
          nanosleep(&ts, NULL);
          owned_after = graph_owned_now();
        }
        if (!use || told || k != 1)
          goto churn;
        printf("  U recapture update: dlsync's graph-owned events %zu before the first update "
               "(the executable's first graph, the new one), %zu within 200 ms of the new "
               "graph's destroy (the reads below say whether the executable still waits on "
               "its events)\n",
               owned_before, owned_after);
        told = true;
      }
    }
  churn:
    /* The churn: events taken from the pool and recorded on an idle stream. */
    CU(D->StreamBeginCapture(t, mode));
    for (int i = 0; i < 8 && use; i++)
      DS(dlsync_order(E.ctx, &lq, &lt));
    END_CAPTURE(t, &churn);
    CU(D->GraphDestroy(churn));
    CU(D->GraphLaunch(x, launch));
    CU(D->StreamSynchronize(launch));
    CU(D->StreamSynchronize(p));
    CU(read_slot(&got, 0));
    o->runs++;
    o->wrong += got != v;
  }
out:
  D->CtxSynchronize();
  drop_graph(g, x);
  drop_stream(p);
  drop_stream(c);
  drop_stream(q);
  drop_stream(t);
  drop_stream(launch);
  return 0;
}

/* TWO_CAPTURES recaptured each step (the producer's capture with the memset
 * of this step's value, a record node; the consumer's with a wait node and
 * the copy), both applied to their executables with cuGraphExecUpdate, the
 * new graphs destroyed and the pool churned from an idle stream, then the
 * producer's executable launched before the consumer's. Control: no order;
 * stale reads. */
static int sc_recapture_two(const scenario *s, CUstreamCaptureMode mode, bool use, outcome *o) {
  CUstream p = NULL, c = NULL, q = NULL, t = NULL;
  CUgraph gp = NULL, gc = NULL;
  CUgraphExec xp = NULL, xc = NULL;
  dlsync_lane lp, lc, lq, lt;
  (void)s;
  CU(new_stream(&p));
  CU(new_stream(&c));
  CU(new_stream(&q));
  CU(new_stream(&t));
  CU(settle(p));
  lp = dlsync_lane_stream(p);
  lc = dlsync_lane_stream(c);
  lq = dlsync_lane_stream(q);
  lt = dlsync_lane_stream(t);
  for (int k = 0; k < TRIALS; k++) {
    unsigned v = ++value_base, got = 0;
    CUgraph churn = NULL;
    CU(D->StreamBeginCapture(p, mode));
    CU(D->StreamBeginCapture(c, mode));
    CU(produce(p, big_buf, BIG_WORDS, v));
    if (use)
      DS(dlsync_order(E.ctx, &lp, &lc));
    CU(consume(c, big_buf, BIG_WORDS, 0));
    END_CAPTURE(c, &gc);
    END_CAPTURE(p, &gp);
    if (k == 0) {
      CU(D->GraphInstantiateWithFlags(&xp, gp, 0));
      CU(D->GraphInstantiateWithFlags(&xc, gc, 0));
    } else {
      CUgraphExecUpdateResultInfo ip, ic;
      CUresult rp, rc;
      memset(&ip, 0, sizeof ip);
      memset(&ic, 0, sizeof ic);
      rp = D->GraphExecUpdate(xp, gp, &ip);
      rc = D->GraphExecUpdate(xc, gc, &ic);
      if (rp != CUDA_SUCCESS || rc != CUDA_SUCCESS) {
        note(o, "step %d: cuGraphExecUpdate: producer %s (result %d), consumer %s (result %d)", k,
             gpu_err(D, rp), (int)ip.result, gpu_err(D, rc), (int)ic.result);
        o->broken++;
        goto out;
      }
    }
    CU(D->GraphDestroy(gp));
    CU(D->GraphDestroy(gc));
    gp = gc = NULL;
    for (int i = 0; i < 20; i++) { /* destructors run on a driver thread */
      struct timespec ts = {0, 1000000};
      nanosleep(&ts, NULL);
    }
    CU(D->StreamBeginCapture(t, mode));
    for (int i = 0; i < 8 && use; i++)
      DS(dlsync_order(E.ctx, &lq, &lt));
    END_CAPTURE(t, &churn);
    CU(D->GraphDestroy(churn));
    CU(D->GraphLaunch(xp, p));
    CU(D->GraphLaunch(xc, c));
    CU(D->StreamSynchronize(c));
    CU(D->StreamSynchronize(p));
    CU(read_slot(&got, 0));
    o->runs++;
    o->wrong += got != v;
  }
out:
  end_leftover_capture(p);
  end_leftover_capture(c);
  end_leftover_capture(t);
  D->CtxSynchronize();
  drop_graph(gp, xp);
  drop_graph(gc, xc);
  drop_stream(p);
  drop_stream(c);
  drop_stream(q);
  drop_stream(t);
  return 0;
}

/* ---- F: another runtime's event of unknown provenance, imported ----
 *
 * A foreign producer (a communication library, say) writes the buffer and
 * hands over only an event, recorded one of three ways; the consumer imports
 * it with that provenance (dlsync_fence_import) and waits on it from one
 * lane state. The control is what such a consumer does without dlsync:
 * nothing in a capture (the producer's event may be of another capture), a
 * plain wait elsewhere. s->flags: FOREIGN(provenance, consumer). */
enum { F_EAGER, F_EXTERNAL, F_CAPTURED };     /* how the producer recorded */
enum { C_EAGER, C_CAPTURE, C_BUILT, C_SAME }; /* the consumer's lane */
#define FOREIGN(prov, cons) ((uint32_t)(prov)*4u + (uint32_t)(cons))

/* The consumer's half, for one graph g2 to be built: a capture of c or a
 * graph built by hand, waiting on f (use) and copying the buffer's last word
 * into `slot`. */
static int foreign_consumer_graph(CUgraph *g2, int cons, CUstream c, CUstreamCaptureMode mode,
                                  dlsync_fence *f, bool use, int slot, outcome *o) {
  dlsync_lane lc = dlsync_lane_stream(c), lg;
  CUgraphNode deps[2], copy = NULL;
  *g2 = NULL;
  if (cons == C_CAPTURE) {
    CU(D->StreamBeginCapture(c, mode));
    if (use)
      DS(dlsync_fence_wait(f, &lc));
    CU(consume(c, big_buf, BIG_WORDS, slot));
    END_CAPTURE(c, g2);
  } else {
    CU(D->GraphCreate(g2, 0));
    lg = dlsync_lane_graph(*g2, deps, 0, 2);
    if (use)
      DS(dlsync_fence_wait(f, &lg));
    CU(add_copy_node(&copy, *g2, lg.deps, lg.ndeps, slot));
  }
  return 0;
out:
  if (cons == C_CAPTURE) {
    CUgraph junk = NULL;
    D->StreamEndCapture(c, &junk);
    drop_graph(junk, NULL);
  }
  return 1;
}

/* Eager record on p each trial; the consumer eager, in a capture (the
 * import made while that capture is active: R40's query) or a built graph. */
static int foreign_eager(int cons, CUstreamCaptureMode mode, bool use, outcome *o) {
  CUstream p = NULL, c = NULL;
  CUevent e = NULL;
  dlsync_lane lc;
  dlsync_fence *f = NULL;
  CU(new_stream(&p));
  CU(new_stream(&c));
  CU(D->EventCreate(&e, CU_EVENT_DISABLE_TIMING));
  CU(settle(p));
  lc = dlsync_lane_stream(c);
  for (int t = 0; t < TRIALS; t++) {
    CUgraph g2 = NULL;
    unsigned v = ++value_base, got = 0;
    CU(produce(p, big_buf, BIG_WORDS, v));
    CU(D->EventRecord(e, p)); /* the foreign runtime's record */
    if (cons == C_EAGER) {
      if (use) {
        DS(dlsync_fence_import(&f, E.ctx, e, DLSYNC_PROVENANCE_EAGER, 0, 0));
        DS(dlsync_fence_wait(f, &lc));
      }
      CU(consume(c, big_buf, BIG_WORDS, t));
      CU(D->StreamSynchronize(c));
      CU(read_slot(&got, t));
    } else {
      if (cons == C_CAPTURE && use) {
        /* Imported while c captures in `mode` on this thread. */
        CU(D->StreamBeginCapture(c, mode));
        DS(dlsync_fence_import(&f, E.ctx, e, DLSYNC_PROVENANCE_EAGER, 0, 0));
        DS(dlsync_fence_wait(f, &lc));
        CU(consume(c, big_buf, BIG_WORDS, t));
        END_CAPTURE(c, &g2);
      } else {
        if (use)
          DS(dlsync_fence_import(&f, E.ctx, e, DLSYNC_PROVENANCE_EAGER, 0, 0));
        if (foreign_consumer_graph(&g2, cons, c, mode, f, use, t, o) != 0)
          goto out;
      }
      CU(launch_once(g2, c, t, &got));
    }
    dlsync_fence_release(f);
    f = NULL;
    CU(D->StreamSynchronize(p));
    o->runs++;
    o->wrong += got != v;
  }
out:
  if (o->broken > 0 && c != NULL) { /* a failure inside the consumer's capture */
    CUstreamCaptureStatus cs = CU_STREAM_CAPTURE_STATUS_NONE;
    CUgraph junk = NULL;
    if (D->StreamIsCapturing(c, &cs) == CUDA_SUCCESS && cs != CU_STREAM_CAPTURE_STATUS_NONE &&
        D->StreamEndCapture(c, &junk) == CUDA_SUCCESS)
      drop_graph(junk, NULL);
  }
  D->CtxSynchronize();
  dlsync_fence_release(f);
  if (e != NULL)
    D->EventDestroy(e);
  drop_stream(p);
  drop_stream(c);
  return 0;
}

/* The producer's graph, captured in `mode`, ends with an external record of
 * e; each replay changes its memset value. */
static int foreign_external(int cons, CUstreamCaptureMode mode, bool use, outcome *o) {
  CUstream p = NULL, c = NULL, launch = NULL;
  CUevent e = NULL;
  CUgraph g1 = NULL, g2 = NULL;
  CUgraphExec x1 = NULL, x2 = NULL;
  dlsync_lane lc;
  dlsync_fence *f = NULL;
  CU(new_stream(&p));
  CU(new_stream(&c));
  CU(new_stream(&launch));
  CU(D->EventCreate(&e, CU_EVENT_DISABLE_TIMING));
  CU(settle(p));
  lc = dlsync_lane_stream(c);
  CU(D->StreamBeginCapture(p, mode));
  CU(produce(p, big_buf, BIG_WORDS, 7));
  CU(D->EventRecordWithFlags(e, p, CU_EVENT_RECORD_EXTERNAL));
  END_CAPTURE(p, &g1);
  CU(D->GraphInstantiateWithFlags(&x1, g1, 0));
  if (use)
    DS(dlsync_fence_import(&f, E.ctx, e, DLSYNC_PROVENANCE_EXTERNAL_RECORD, 0, 0));
  if (cons == C_EAGER) {
    for (int k = 0; k < REPLAYS; k++) {
      unsigned v = ++value_base, got = 0;
      CU(set_memset_value(g1, x1, v));
      CU(D->GraphLaunch(x1, launch));
      if (use)
        DS(dlsync_fence_wait(f, &lc)); /* after the launch */
      CU(consume(c, big_buf, BIG_WORDS, 1));
      CU(D->StreamSynchronize(c));
      CU(D->StreamSynchronize(launch));
      CU(read_slot(&got, 1));
      o->runs++;
      o->wrong += got != v;
    }
  } else {
    if (foreign_consumer_graph(&g2, cons, c, mode, f, use, 0, o) != 0)
      goto out;
    CU(D->GraphInstantiateWithFlags(&x2, g2, 0));
    replay(o, g1, x1, launch, x2, c, 0);
  }
out:
  D->CtxSynchronize();
  dlsync_fence_release(f);
  drop_graph(g1, x1);
  drop_graph(g2, x2);
  if (e != NULL)
    D->EventDestroy(e);
  drop_stream(p);
  drop_stream(c);
  drop_stream(launch);
  return 0;
}

/* A plain record of e inside p's capture. From that same capture (c joined
 * at its start): edges, replayed. From anywhere else dlsync refuses and both
 * captures end cleanly (one run); the control's plain wait joins or merges
 * the captures, or (built) orders nothing. */
static int foreign_captured(int cons, CUstreamCaptureMode mode, bool use, outcome *o) {
  CUstream p = NULL, c = NULL, launch = NULL;
  CUevent e = NULL, fork = NULL, join = NULL;
  CUgraph g1 = NULL, g2 = NULL;
  CUgraphExec x1 = NULL, x2 = NULL;
  CUgraphNode deps[2], wait = NULL, copy = NULL;
  CUstreamCaptureStatus cs = CU_STREAM_CAPTURE_STATUS_NONE;
  cuuint64_t id = 0;
  dlsync_lane lc, lg;
  dlsync_fence *f = NULL;
  CU(new_stream(&p));
  CU(new_stream(&c));
  CU(new_stream(&launch));
  CU(D->EventCreate(&e, CU_EVENT_DISABLE_TIMING));
  CU(D->EventCreate(&fork, CU_EVENT_DISABLE_TIMING));
  CU(D->EventCreate(&join, CU_EVENT_DISABLE_TIMING));
  CU(settle(p));
  lc = dlsync_lane_stream(c);
  CU(D->StreamBeginCapture(p, mode));
  if (cons == C_SAME) {
    CU(D->EventRecord(fork, p));
    CU(D->StreamWaitEvent(c, fork, 0)); /* c joins p's capture before the producer */
  }
  CU(produce(p, big_buf, BIG_WORDS, 7));
  CU(D->EventRecord(e, p)); /* the foreign runtime's plain record */
  CU(D->StreamGetCaptureInfo(p, &cs, &id, NULL, NULL, NULL, NULL));
  if (use)
    DS(dlsync_fence_import(&f, E.ctx, e, DLSYNC_PROVENANCE_CAPTURED, id, 0));
  if (cons == C_SAME) {
    if (use)
      DS(dlsync_fence_wait(f, &lc));
    CU(consume(c, big_buf, BIG_WORDS, 0));
    CU(D->EventRecord(join, c));
    CU(D->StreamWaitEvent(p, join, 0));
    END_CAPTURE(p, &g1);
    CU(D->GraphInstantiateWithFlags(&x1, g1, 0));
    replay(o, g1, x1, launch, NULL, launch, 0);
    goto out;
  }
  if (cons == C_CAPTURE)
    CU(D->StreamBeginCapture(c, mode));
  if (cons == C_BUILT) {
    CU(D->GraphCreate(&g2, 0));
    lg = dlsync_lane_graph(g2, deps, 0, 2);
  }
  if (use) {
    /* Refused, nothing queued: the consumer's lane goes on unharmed. */
    DS_EXPECT(dlsync_fence_wait(f, cons == C_BUILT ? &lg : &lc), DLSYNC_ERROR_CAPTURE_ORDER);
    if (cons == C_BUILT) {
      CU(add_copy_node(&copy, g2, NULL, 0, 0));
      if (count_nodes(g2, CU_GRAPH_NODE_TYPE_WAIT_EVENT) != 0) {
        note(o, "a wait node was added after the refusal");
        o->broken++;
      }
    } else {
      CU(consume(c, big_buf, BIG_WORDS, 0));
    }
    if (cons == C_CAPTURE) {
      END_CAPTURE(c, &g2);
      if (count_nodes(g2, CU_GRAPH_NODE_TYPE_WAIT_EVENT) != 0) {
        note(o, "a wait node was added after the refusal");
        o->broken++;
      }
    }
    END_CAPTURE(p, &g1);
    o->runs++;
    goto out;
  }
  /* The control: a plain wait (eager: c joins p's capture, which then ends
   * UNJOINED; another capture: MERGE) or, in a built graph, a wait node on
   * an event whose last record was in a capture (orders nothing, or fails). */
  if (cons == C_BUILT) {
    CU(D->GraphAddEventWaitNode(&wait, g2, NULL, 0, e));
    CU(add_copy_node(&copy, g2, &wait, 1, 0));
  } else {
    CU(D->StreamWaitEvent(c, e, 0));
    CU(consume(c, big_buf, BIG_WORDS, 0));
  }
  if (cons == C_CAPTURE)
    END_CAPTURE(c, &g2);
  END_CAPTURE(p, &g1);
  CU(D->GraphInstantiateWithFlags(&x1, g1, 0));
  if (cons == C_BUILT) {
    CU(D->GraphInstantiateWithFlags(&x2, g2, 0));
    replay(o, g1, x1, launch, x2, c, 0);
  } else {
    o->runs++;
  }
out:
  if (o->broken > 0) {
    CUgraph junk = NULL;
    if (D->StreamIsCapturing(c, &cs) == CUDA_SUCCESS && cs != CU_STREAM_CAPTURE_STATUS_NONE &&
        D->StreamEndCapture(c, &junk) == CUDA_SUCCESS)
      drop_graph(junk, NULL);
    junk = NULL;
    if (D->StreamIsCapturing(p, &cs) == CUDA_SUCCESS && cs != CU_STREAM_CAPTURE_STATUS_NONE &&
        D->StreamEndCapture(p, &junk) == CUDA_SUCCESS)
      drop_graph(junk, NULL);
  }
  D->CtxSynchronize();
  dlsync_fence_release(f);
  drop_graph(g1, x1);
  drop_graph(g2, x2);
  if (e != NULL)
    D->EventDestroy(e);
  if (fork != NULL)
    D->EventDestroy(fork);
  if (join != NULL)
    D->EventDestroy(join);
  drop_stream(p);
  drop_stream(c);
  drop_stream(launch);
  return 0;
}

static int sc_foreign(const scenario *s, CUstreamCaptureMode mode, bool use, outcome *o) {
  int prov = (int)(s->flags / 4), cons = (int)(s->flags % 4);
  if (prov == F_EAGER)
    return foreign_eager(cons, mode, use, o);
  if (prov == F_EXTERNAL)
    return foreign_external(cons, mode, use, o);
  return foreign_captured(cons, mode, use, o);
}

/* ---- A and C: one producer, three consumers, and the join back
 * (dlsync_exchange_begin_fanout) ---- */

#define FAN 3

/* An eager producer and three eager consumers, each copying the buffer's
 * last word into its slot; no host sync between trials: the join back keeps
 * trial t+1's memset from overwriting the buffer before trial t's copies
 * have read it. Control: no order; stale reads. */
static int sc_fanout_eager(const scenario *s, CUstreamCaptureMode mode, bool use, outcome *o) {
  CUstream p = NULL, c[FAN] = {NULL, NULL, NULL};
  unsigned want[TRIALS / 2];
  dlsync_lane lp, lcs[FAN];
  (void)mode;
  CU(new_stream(&p));
  for (int i = 0; i < FAN; i++)
    CU(new_stream(&c[i]));
  CU(settle(p));
  lp = dlsync_lane_stream(p);
  for (int i = 0; i < FAN; i++)
    lcs[i] = dlsync_lane_stream(c[i]);
  for (int t = 0; t < TRIALS / 2; t++) {
    dlsync_exchange *ex = NULL;
    want[t] = ++value_base;
    CU(produce(p, big_buf, BIG_WORDS, want[t]));
    if (use)
      DS(dlsync_exchange_begin_fanout(&ex, E.ctx, &lp, lcs, FAN, s->flags));
    for (int i = 0; i < FAN; i++)
      CU(consume(c[i], big_buf, BIG_WORDS, FAN * t + i));
    if (use)
      DS(dlsync_exchange_end(ex));
  }
  CU(D->CtxSynchronize());
  for (int t = 0; t < TRIALS / 2; t++)
    for (int i = 0; i < FAN; i++) {
      unsigned got = 0;
      CU(read_slot(&got, FAN * t + i));
      o->runs++;
      o->wrong += got != want[t];
    }
out:
  D->CtxSynchronize();
  drop_stream(p);
  for (int i = 0; i < FAN; i++)
    drop_stream(c[i]);
  return 0;
}

/* One capture of the step: p captures the memset, the three eager consumers
 * are ordered after it (each joins p's capture) and copy into slots
 * 0..FAN-1, the end joins them back; the capture must end cleanly. */
static int fanout_capture_step(outcome *o, CUstream p, CUstream *c, CUstreamCaptureMode mode,
                               bool use, uint32_t flags, CUgraph *g) {
  dlsync_lane lp = dlsync_lane_stream(p), lcs[FAN];
  dlsync_exchange *ex = NULL;
  for (int i = 0; i < FAN; i++)
    lcs[i] = dlsync_lane_stream(c[i]);
  CU(D->StreamBeginCapture(p, mode));
  CU(produce(p, big_buf, BIG_WORDS, ++value_base));
  if (use)
    DS(dlsync_exchange_begin_fanout(&ex, E.ctx, &lp, lcs, FAN, flags));
  for (int i = 0; i < FAN; i++)
    CU(consume(c[i], big_buf, BIG_WORDS, i));
  if (use) {
    dlsync_status st = dlsync_exchange_end(ex);
    ex = NULL;
    DS(st);
  }
  END_CAPTURE(p, g);
  return 0;
out:
  if (ex != NULL)
    (void)dlsync_exchange_end(ex);
  end_leftover_capture(p);
  return -1;
}

/* The step captured TRIALS / 4 times: the first instantiated, each later
 * one applied to that executable with cuGraphExecUpdate (same nodes: no
 * event node, FAN copies, one memset), then launched REPLAYS / 5 times with
 * a new memset value each; every consumer's slot must hold it. Control
 * (no order): the copies run eagerly at capture time, outside the graph, and
 * the slots keep stale values. */
static int sc_fanout_capture(const scenario *s, CUstreamCaptureMode mode, bool use, outcome *o) {
  CUstream p = NULL, launch = NULL, c[FAN] = {NULL, NULL, NULL};
  CUgraph g = NULL, g0 = NULL;
  CUgraphExec x = NULL;
  CU(new_stream(&p));
  CU(new_stream(&launch));
  for (int i = 0; i < FAN; i++)
    CU(new_stream(&c[i]));
  CU(settle(p));
  for (int k = 0; k < TRIALS / 4; k++) {
    if (fanout_capture_step(o, p, c, mode, use, s->flags, &g) != 0)
      goto out;
    if (use && (count_nodes(g, CU_GRAPH_NODE_TYPE_EVENT_RECORD) != 0 ||
                count_nodes(g, CU_GRAPH_NODE_TYPE_WAIT_EVENT) != 0 ||
                count_nodes(g, CU_GRAPH_NODE_TYPE_MEMCPY) != FAN ||
                count_nodes(g, CU_GRAPH_NODE_TYPE_MEMSET) != 1)) {
      note(o, "step %d: %zu record, %zu wait, %zu memcpy, %zu memset nodes (want 0, 0, %d, 1)", k,
           count_nodes(g, CU_GRAPH_NODE_TYPE_EVENT_RECORD),
           count_nodes(g, CU_GRAPH_NODE_TYPE_WAIT_EVENT), count_nodes(g, CU_GRAPH_NODE_TYPE_MEMCPY),
           count_nodes(g, CU_GRAPH_NODE_TYPE_MEMSET), FAN);
      o->broken++;
    }
    if (k == 0) {
      CU(D->GraphInstantiateWithFlags(&x, g, 0));
      g0 = g; /* kept: set_memset_value finds the memset node in it */
      g = NULL;
    } else {
      CUgraphExecUpdateResultInfo info;
      CUresult r;
      memset(&info, 0, sizeof info);
      r = D->GraphExecUpdate(x, g, &info);
      if (r != CUDA_SUCCESS) {
        note(o, "step %d: cuGraphExecUpdate: %s (update result %d)", k, gpu_err(D, r),
             (int)info.result);
        o->broken++;
        goto out;
      }
      CU(D->GraphDestroy(g));
      g = NULL;
    }
    CU(D->CtxSynchronize());
    for (int r = 0; r < REPLAYS / 5; r++) {
      unsigned v = ++value_base;
      /* The update kept g0's node handles valid for the executable. */
      CU(set_memset_value(g0, x, v));
      CU(D->GraphLaunch(x, launch));
      CU(D->StreamSynchronize(launch));
      for (int i = 0; i < FAN; i++) {
        unsigned got = 0;
        CU(read_slot(&got, i));
        o->runs++;
        o->wrong += got != v;
      }
    }
  }
out:
  D->CtxSynchronize();
  drop_graph(g, NULL);
  drop_graph(g0, x);
  drop_stream(p);
  drop_stream(launch);
  for (int i = 0; i < FAN; i++)
    drop_stream(c[i]);
  return 0;
}

/* ---- C: a PDL pair across an exchange (DLSYNC_EXCHANGE_KEEP_EDGE_DATA) ----
 * Two kernels (PTX, JIT-compiled by the driver for sm_90): `primary` writes a
 * value to buf[0]; `secondary`, which waits for its programmatic dependency
 * (griddepcontrol.wait), copies buf[0] to out[0]. In one capture, p launches
 * the primary and makes its next dependency programmatic (the edge data a
 * PDL launch after it would carry); c, forked into the capture, is ordered
 * after p by an exchange and launches the secondary. With the flag, the edge
 * primary -> secondary read back with cuGraphGetEdges is programmatic and
 * every launch copies the right value; the control (the same exchange
 * without the flag) makes it a full edge, counted as wrong. The kernel entry
 * points are looked up in libcuda directly (dlsync's table has none). */
static const char pdl_ptx[] = ".version 7.8\n"
                              ".target sm_90\n"
                              ".address_size 64\n"
                              ".visible .entry primary(.param .u64 p_buf, .param .u32 p_val)\n"
                              "{\n"
                              "  .reg .b64 %rd<2>;\n"
                              "  .reg .b32 %r<2>;\n"
                              "  ld.param.u64 %rd1, [p_buf];\n"
                              "  ld.param.u32 %r1, [p_val];\n"
                              "  cvta.to.global.u64 %rd1, %rd1;\n"
                              "  st.global.u32 [%rd1], %r1;\n"
                              "  ret;\n"
                              "}\n"
                              ".visible .entry secondary(.param .u64 p_buf, .param .u64 p_out)\n"
                              "{\n"
                              "  .reg .b64 %rd<3>;\n"
                              "  .reg .b32 %r<2>;\n"
                              "  griddepcontrol.wait;\n"
                              "  ld.param.u64 %rd1, [p_buf];\n"
                              "  ld.param.u64 %rd2, [p_out];\n"
                              "  cvta.to.global.u64 %rd1, %rd1;\n"
                              "  cvta.to.global.u64 %rd2, %rd2;\n"
                              "  ld.global.u32 %r1, [%rd1];\n"
                              "  st.global.u32 [%rd2], %r1;\n"
                              "  ret;\n"
                              "}\n";

typedef CUresult (*pfn_module_load_data)(CUmodule *, const void *);
typedef CUresult (*pfn_module_get_function)(CUfunction *, CUmodule, const char *);
typedef CUresult (*pfn_module_unload)(CUmodule);
typedef CUresult (*pfn_launch_kernel)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned,
                                      unsigned, unsigned, CUstream, void **, void **);

/* The type of the one edge between two kernel nodes of g (-1: none, -2: the
 * graph could not be read). */
static int kernel_edge_type(CUgraph g) {
  CUgraphNode from[64], to[64];
  CUgraphEdgeData data[64];
  size_t n = 64;
  if (D->GraphGetEdges(g, from, to, data, &n) != CUDA_SUCCESS || n > 64)
    return -2;
  for (size_t i = 0; i < n; i++) {
    CUgraphNodeType a, b;
    if (D->GraphNodeGetType(from[i], &a) == CUDA_SUCCESS &&
        D->GraphNodeGetType(to[i], &b) == CUDA_SUCCESS && a == CU_GRAPH_NODE_TYPE_KERNEL &&
        b == CU_GRAPH_NODE_TYPE_KERNEL)
      return (int)data[i].type;
  }
  return -1;
}

static int sc_pdl_edge(const scenario *s, CUstreamCaptureMode mode, bool use, outcome *o) {
  CUstream p = NULL, c = NULL, launch = NULL;
  CUevent fork = NULL;
  CUgraph g = NULL;
  CUgraphExec x = NULL;
  CUmodule mod = NULL;
  CUfunction fp = NULL, fs = NULL;
  void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  pfn_module_load_data load = NULL;
  pfn_module_get_function get = NULL;
  pfn_module_unload unload = NULL;
  pfn_launch_kernel kernel = NULL;
  dlsync_lane lp, lc;
  dlsync_exchange *ex = NULL;
  CUgraphNode primary_deps[8];
  CUgraphEdgeData pdl;
  const CUgraphNode *deps = NULL;
  const CUgraphEdgeData *edges = NULL;
  CUstreamCaptureStatus cs;
  cuuint64_t id;
  size_t nd = 0;
  unsigned v = 0;
  CUdeviceptr out = slots;
  void *pargs[2], *sargs[2];
  int type;
  (void)s;
  if (lib != NULL) {
    *(void **)&load = dlsym(lib, "cuModuleLoadData");
    *(void **)&get = dlsym(lib, "cuModuleGetFunction");
    *(void **)&unload = dlsym(lib, "cuModuleUnload");
    *(void **)&kernel = dlsym(lib, "cuLaunchKernel");
  }
  if (load == NULL || get == NULL || unload == NULL || kernel == NULL) {
    note(o, "libcuda's module and launch entry points not found");
    o->broken++;
    goto out;
  }
  CU(load(&mod, pdl_ptx));
  CU(get(&fp, mod, "primary"));
  CU(get(&fs, mod, "secondary"));
  CU(new_stream(&p));
  CU(new_stream(&c));
  CU(new_stream(&launch));
  CU(D->EventCreate(&fork, CU_EVENT_DISABLE_TIMING));
  lp = dlsync_lane_stream(p);
  lc = dlsync_lane_stream(c);
  v = ++value_base;
  pargs[0] = &big_buf;
  pargs[1] = &v;
  sargs[0] = &big_buf;
  sargs[1] = &out;
  CU(D->StreamBeginCapture(p, mode));
  CU(D->EventRecord(fork, p));
  CU(D->StreamWaitEvent(c, fork, 0)); /* c joins p's capture */
  CU(kernel(fp, 1, 1, 1, 1, 1, 1, 0, p, pargs, NULL));
  /* p's next dependency on the primary: programmatic. */
  CU(D->StreamGetCaptureInfo(p, &cs, &id, NULL, &deps, &edges, &nd));
  if (nd != 1) {
    note(o, "the primary's stream has %zu dependencies, want 1", nd);
    o->broken++;
    goto out;
  }
  primary_deps[0] = deps[0];
  memset(&pdl, 0, sizeof pdl);
  pdl.type = CU_GRAPH_DEPENDENCY_TYPE_PROGRAMMATIC;
  pdl.from_port = CU_GRAPH_KERNEL_NODE_PORT_PROGRAMMATIC;
  CU(D->StreamUpdateCaptureDependencies(p, primary_deps, &pdl, 1,
                                        CU_STREAM_SET_CAPTURE_DEPENDENCIES));
  DS(dlsync_exchange_begin_flags(&ex, E.ctx, &lp, &lc, use ? DLSYNC_EXCHANGE_KEEP_EDGE_DATA : 0));
  CU(kernel(fs, 1, 1, 1, 1, 1, 1, 0, c, sargs, NULL));
  {
    dlsync_status st = dlsync_exchange_end(ex);
    ex = NULL;
    DS(st);
  }
  END_CAPTURE(p, &g);
  type = kernel_edge_type(g);
  if (type < 0) {
    note(o, "no edge between the two kernel nodes (%d)", type);
    o->broken++;
    goto out;
  }
  o->runs++;
  o->wrong += type != CU_GRAPH_DEPENDENCY_TYPE_PROGRAMMATIC;
  CU(D->GraphInstantiateWithFlags(&x, g, 0));
  for (int r = 0; r < REPLAYS / 5; r++) {
    unsigned got = 0;
    CU(D->MemsetD32Async(big_buf, 0, 1, launch));
    CU(D->MemsetD32Async(out, 0, 1, launch));
    CU(D->GraphLaunch(x, launch));
    CU(D->StreamSynchronize(launch));
    CU(read_slot(&got, 0));
    o->runs++;
    o->wrong += got != v;
  }
out:
  if (ex != NULL)
    (void)dlsync_exchange_end(ex);
  if (p != NULL)
    end_leftover_capture(p);
  D->CtxSynchronize();
  drop_graph(g, x);
  drop_stream(p);
  drop_stream(c);
  drop_stream(launch);
  if (fork)
    D->EventDestroy(fork);
  if (mod != NULL)
    unload(mod);
  if (lib != NULL)
    dlclose(lib);
  return 0;
}

static const scenario scenarios[] = {
    {"A same stream", "stream S / S", sc_same_stream, false, false, 0, false,
     DLSYNC__ROW_SAME_STREAM},
    {"A eager->eager", "eager / eager", sc_eager_eager, false, true, 0, false,
     DLSYNC__ROW_EAGER_EAGER},
    {"A eager stable", "eager / eager, CAPTURE_STABLE", sc_eager_eager, false, true,
     DLSYNC_EXCHANGE_CAPTURE_STABLE, false, DLSYNC__ROW_EAGER_EAGER},
    {"A many eager", "eager p, q, p / eager", sc_many_eager, false, true, 0, false,
     DLSYNC__ROW_EAGER_EAGER},
    {"C many join", "capturing p, q / eager", sc_many_join, true, true, 0, false, DLSYNC__ROW_JOIN},
    {"A fanout eager", "eager p / eager c1, c2, c3", sc_fanout_eager, false, true, 0, false,
     DLSYNC__ROW_EAGER_EAGER},
    {"A fanout stable", "eager p / eager c1..c3, STABLE", sc_fanout_eager, false, true,
     DLSYNC_EXCHANGE_CAPTURE_STABLE, false, DLSYNC__ROW_EAGER_EAGER},
    {"C fanout join", "capturing p / eager c1..c3", sc_fanout_capture, true, true, 0, false,
     DLSYNC__ROW_JOIN},
    {"C pdl across an exchange", "capturing p / same capture, KEEP_EDGE_DATA", sc_pdl_edge, true,
     true, 0, false, DLSYNC__ROW_SAME_CAPTURE},
    {"C join", "capturing / eager", sc_join, true, true, 0, false, DLSYNC__ROW_JOIN},
    {"C join warm", "capturing / eager, fast path", sc_join, true, true, 0, true, DLSYNC__ROW_JOIN},
    {"C join stable", "capturing / eager, STABLE", sc_join, true, true,
     DLSYNC_EXCHANGE_CAPTURE_STABLE, true, DLSYNC__ROW_JOIN},
    {"C same capture", "capturing / same capture", sc_same_capture, true, true, 0, false,
     DLSYNC__ROW_SAME_CAPTURE},
    {"C eager->capture", "eager / capturing", sc_eager_to_capture, true, true, 0, false,
     DLSYNC__ROW_EAGER_TO_CAPTURE},
    {"C two captures", "capturing G1 / G2", sc_two_captures, true, true, 0, false,
     DLSYNC__ROW_TWO_CAPTURES},
    {"B same graph", "built g / g", sc_built_same, false, true, 0, false, DLSYNC__ROW_SAME_BUILT},
    {"B two graphs", "built g1 / g2", sc_built_two, false, true, 0, false, DLSYNC__ROW_TWO_BUILT},
    {"B eager->built", "eager / built", sc_eager_to_built, false, true, 0, false,
     DLSYNC__ROW_EAGER_TO_BUILT},
    {"B capture->built", "capturing / built", sc_capture_to_built, true, true, 0, false,
     DLSYNC__ROW_CAPTURE_TO_BUILT},
    {"B built->capture", "built / capturing", sc_built_to_capture, true, true, 0, false,
     DLSYNC__ROW_BUILT_TO_CAPTURE},
    {"errors", "invalid, legacy, bad lanes", sc_errors, true, true, 0, false, DLSYNC__ROW_COUNT},
    {"threads", "4 eager + 1 capture", sc_threads, true, true, 0, false, DLSYNC__ROW_COUNT},
    {"L release eager", "deleter after a 4 GiB memset", sc_release_eager, false, true, 0, false,
     DLSYNC__ROW_COUNT},
    {"L release capture", "freed after 100 replays", sc_release_capture, true, true, 0, false,
     DLSYNC__ROW_COUNT},
    {"L fence 2 captures", "signal G1 / wait G2", sc_fence_two_captures, true, true, 0, false,
     DLSYNC__ROW_TWO_CAPTURES},
    {"L fence eager", "signal capture / eager wait", sc_fence_eager_after_launch, true, true, 0,
     false, DLSYNC__ROW_LAUNCHED_TO_EAGER},
    {"L fence 8 threads", "signal + wait, 8 threads", sc_fence_threads, false, true, 0, false,
     DLSYNC__ROW_COUNT},
    {"2 GPUs eager", "eager dev0 / eager dev1", sc_two_devices_eager, false, true, 0, false,
     DLSYNC__ROW_EAGER_EAGER},
    {"2 GPUs join", "capturing dev0 / eager dev1", sc_two_devices_join, true, true, 0, false,
     DLSYNC__ROW_JOIN},
    {"K body exchange", "IF body capture / eager", sc_body_exchange, true, true, 0, false,
     DLSYNC__ROW_JOIN},
    {"K body order first", "eager / IF body, parent", sc_body_order_first, true, true, 0, false,
     DLSYNC__ROW_EAGER_TO_CAPTURE},
    {"G launch eager", "eager p / library graph", sc_graph_launch, false, true, 0, false,
     DLSYNC__ROW_EAGER_EAGER},
    {"G launch capture", "capturing / library graph", sc_graph_launch, true, false, 1, false,
     DLSYNC__ROW_COUNT},
    {"G launch built", "built / library graph", sc_graph_launch, false, true, 2, false,
     DLSYNC__ROW_COUNT},
    {"U recapture update", "eager / recaptured, updated", sc_recapture_update, true, true, 0, false,
     DLSYNC__ROW_EAGER_TO_CAPTURE},
    {"U recapture two", "capturing G1 / G2, updated", sc_recapture_two, true, true, 0, false,
     DLSYNC__ROW_TWO_CAPTURES},
    {"K body refusals", "IF, WHILE bodies: 7 rows", sc_body_refusals, true, true, 0, false,
     DLSYNC__ROW_COUNT},
    {"F eager/eager", "foreign eager / eager", sc_foreign, false, true, FOREIGN(F_EAGER, C_EAGER),
     false, DLSYNC__ROW_EAGER_EAGER},
    {"F eager/capture", "foreign eager / capturing", sc_foreign, true, true,
     FOREIGN(F_EAGER, C_CAPTURE), false, DLSYNC__ROW_EAGER_TO_CAPTURE},
    {"F eager/built", "foreign eager / built", sc_foreign, false, true, FOREIGN(F_EAGER, C_BUILT),
     false, DLSYNC__ROW_EAGER_TO_BUILT},
    {"F external/eager", "foreign ext. record / eager", sc_foreign, true, true,
     FOREIGN(F_EXTERNAL, C_EAGER), false, DLSYNC__ROW_LAUNCHED_TO_EAGER},
    {"F external/capture", "foreign ext. record / capture", sc_foreign, true, true,
     FOREIGN(F_EXTERNAL, C_CAPTURE), false, DLSYNC__ROW_BUILT_TO_CAPTURE},
    {"F external/built", "foreign ext. record / built", sc_foreign, true, true,
     FOREIGN(F_EXTERNAL, C_BUILT), false, DLSYNC__ROW_TWO_BUILT},
    {"F captured/same", "foreign in capture / same", sc_foreign, true, true,
     FOREIGN(F_CAPTURED, C_SAME), false, DLSYNC__ROW_SAME_CAPTURE},
    {"F captured/eager", "foreign in capture / eager", sc_foreign, true, true,
     FOREIGN(F_CAPTURED, C_EAGER), false, DLSYNC__ROW_REFUSE_CAPTURE_TO_EAGER},
    {"F captured/other", "foreign in capture / other", sc_foreign, true, true,
     FOREIGN(F_CAPTURED, C_CAPTURE), false, DLSYNC__ROW_COUNT},
    {"F captured/built", "foreign in capture / built", sc_foreign, true, true,
     FOREIGN(F_CAPTURED, C_BUILT), false, DLSYNC__ROW_COUNT},
    {"K hoist IF capt", "eager / IF body capture", sc_hoist_eager, true, true, 0, false,
     DLSYNC__ROW_EAGER_TO_CAPTURE},
    {"K hoist WHILE capt", "eager / WHILE body capture", sc_hoist_eager, true, true, 1, false,
     DLSYNC__ROW_EAGER_TO_CAPTURE},
    {"K hoist IF built", "eager / IF body lane", sc_hoist_eager, false, true, 2, false,
     DLSYNC__ROW_EAGER_TO_BUILT},
    {"K hoist WHILE blt", "eager / WHILE body lane", sc_hoist_eager, false, true, 3, false,
     DLSYNC__ROW_EAGER_TO_BUILT},
    {"K hoist parent cap", "eager / body, parent capt", sc_hoist_parent_capture, true, true, 0,
     false, DLSYNC__ROW_EAGER_TO_CAPTURE},
    {"K hoist body prod", "IF body capture / built", sc_hoist_body_producer, true, true, 0, false,
     DLSYNC__ROW_CAPTURE_TO_BUILT},
    {"K hoist IF 2capt in", "capture / IF body capture", sc_hoist_two_graphs, true, true, 0, false,
     DLSYNC__ROW_TWO_CAPTURES},
    {"K hoist WH 2capt in", "capture / WHILE body capt", sc_hoist_two_graphs, true, true, 8, false,
     DLSYNC__ROW_TWO_CAPTURES},
    {"K hoist IF 2capt out", "IF body capture / capture", sc_hoist_two_graphs, true, true, 1, false,
     DLSYNC__ROW_TWO_CAPTURES},
    {"K hoist IF blt>capt", "built / IF body capture", sc_hoist_two_graphs, true, true, 2, false,
     DLSYNC__ROW_BUILT_TO_CAPTURE},
    {"K hoist WH blt>capt", "built / WHILE body capture", sc_hoist_two_graphs, true, true, 10,
     false, DLSYNC__ROW_BUILT_TO_CAPTURE},
    {"K hoist IF 2blt in", "built / IF body lane", sc_hoist_two_graphs, false, true, 3, false,
     DLSYNC__ROW_TWO_BUILT},
    {"K hoist WH 2blt in", "built / WHILE body lane", sc_hoist_two_graphs, false, true, 11, false,
     DLSYNC__ROW_TWO_BUILT},
    {"K hoist IF 2blt out", "IF body lane / built", sc_hoist_two_graphs, false, true, 4, false,
     DLSYNC__ROW_TWO_BUILT},
};

/* The row's enum name without its prefix ("EAGER_EAGER"), "-" for none. */
static const char *row_label(const scenario *s) {
  if (s->table_row == DLSYNC__ROW_COUNT)
    return "-";
  return dlsync__row_name(s->table_row) + strlen("DLSYNC__ROW_");
}

static const char *mode_name(CUstreamCaptureMode m) {
  switch (m) {
  case CU_STREAM_CAPTURE_MODE_GLOBAL:
    return "global";
  case CU_STREAM_CAPTURE_MODE_THREAD_LOCAL:
    return "thread_local";
  default:
    return "relaxed";
  }
}

int main(int argc, char **argv) {
  int rc = gpu_env_init(&E);
  int failed = 0, total = 0;
  const char *only = argc > 1 ? argv[1] : NULL;
  static char lines[512][240]; /* a line per scenario and mode */
  int nlines = 0;
  int driver_version = 0;
  if (rc != 0)
    return rc;
  D = E.d;
  if (D->MemAlloc(&big_buf, BIG_WORDS * 4) != CUDA_SUCCESS ||
      D->MemAlloc(&slots, SLOTS * 4) != CUDA_SUCCESS) {
    printf("FAIL: cannot allocate %zu bytes\n", BIG_WORDS * 4);
    return 1;
  }
  {
    int ndev = 0;
    CUdevice d1;
    if (D->DeviceGetCount(&ndev) == CUDA_SUCCESS && ndev >= 2 &&
        D->DeviceGet(&d1, 1) == CUDA_SUCCESS &&
        D->DevicePrimaryCtxRetain(&dev1_ctx, d1) == CUDA_SUCCESS) {
      CUcontext popped;
      D->CtxPushCurrent(dev1_ctx);
      if (D->MemAlloc(&dev1_slots, SLOTS * 4) != CUDA_SUCCESS)
        dev1_ctx = NULL;
      D->CtxPopCurrent(&popped);
    }
  }
  dlsync_context_driver_version(&driver_version, E.ctx);
  printf("dlsync GPU suite: %s, driver %d.%d, %d replays / %d trials per scenario\n", E.name,
         driver_version / 1000, (driver_version % 1000) / 10, REPLAYS, TRIALS);
  for (size_t i = 0; i < sizeof scenarios / sizeof scenarios[0]; i++) {
    const scenario *s = &scenarios[i];
    CUstreamCaptureMode modes[3] = {CU_STREAM_CAPTURE_MODE_GLOBAL,
                                    CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
                                    CU_STREAM_CAPTURE_MODE_RELAXED};
    int nmodes = s->modes ? 3 : 1;
    if (only != NULL && strstr(s->name, only) == NULL)
      continue;
    if (nlines + nmodes > (int)(sizeof lines / sizeof lines[0])) {
      printf("FAIL: more scenario lines than the table holds (%zu)\n",
             sizeof lines / sizeof lines[0]);
      return 1;
    }
    if (dev1_ctx == NULL && strncmp(s->name, "2 GPUs", 6) == 0) {
      snprintf(lines[nlines++], sizeof lines[0], "%-18s %-26s %-30s %-12s   (skipped: one GPU)",
               s->name, s->row, row_label(s), "-");
      continue;
    }
    for (int m = 0; m < nmodes; m++) {
      outcome with, without;
      bool pass_with, control_failed, pass;
      memset(&with, 0, sizeof with);
      memset(&without, 0, sizeof without);
      s->fn(s, modes[m], true, &with);
      s->fn(s, modes[m], false, &without);
      pass_with = with.runs > 0 && with.wrong == 0 && with.broken == 0;
      control_failed = without.wrong > 0 || without.broken > 0;
      pass = pass_with && (control_failed || !s->control_can_fail);
      total++;
      failed += !pass;
      snprintf(lines[nlines++], sizeof lines[0],
               "%-18s %-26s %-30s %-12s %5d %5d %5d   %5d %5d   %s%s%s", s->name, s->row,
               row_label(s), s->modes ? mode_name(modes[m]) : "-", with.runs, with.wrong,
               with.broken, without.wrong, without.broken, pass ? "PASS" : "FAIL",
               !s->control_can_fail ? " (control n/a)" : "", "");
      if (with.note[0] != '\0')
        printf("  %s [%s] with dlsync: %s\n", s->name, mode_name(modes[m]), with.note);
      if (without.note[0] != '\0')
        printf("  %s [%s] control: %s\n", s->name, mode_name(modes[m]), without.note);
      fflush(stdout);
    }
  }
  printf("\n%-18s %-26s %-30s %-12s %5s %5s %5s   %5s %5s   %s\n", "scenario",
         "producer / consumer", "table row", "capture", "runs", "wrong", "broke", "ctl-w", "ctl-b",
         "verdict");
  for (int i = 0; i < nlines; i++)
    printf("%s\n", lines[i]);
  printf("\n%d passed, %d failed\n", total - failed, failed);
  D->MemFree(big_buf);
  D->MemFree(slots);
  dlsync_context_destroy(E.ctx);
  return failed == 0 ? 0 : 1;
}
