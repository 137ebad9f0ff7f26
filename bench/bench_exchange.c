/* SPDX-License-Identifier: Apache-2.0 */
/* Host cost of an exchange against the raw driver calls it must make,
 * measured side by side in one run, and replay time of a captured chain of
 * exchanges against a hand-built graph with only the edges it needs.
 *
 * Each figure is the median over BATCHES batches of OPS operations (host
 * nanoseconds per operation, clock_gettime around the batch); the streams are
 * idle, so the figures are the host-side cost of the calls. Exits 77 where no
 * GPU is found. */
#include <dlfcn.h>
#include <malloc.h>
#include <pthread.h>
#include <stdatomic.h>
#include <libgen.h>
#include <sched.h>
#include <time.h>
#include <unistd.h>

#include "../tests/gpu/gpu_common.h"
#include "order/table.h"
#include "bench_util.h"

#define OPS 5000
#define BATCHES 9
#define CHAIN 100
#define REPLAYS 200
#define ROUNDS 15

static gpu_env E;
static const dlsync__driver *D;
/* The split section (run_split): while split_on, the timing copy of the
 * driver table adds up the time spent inside its calls. */
static bool split_active, split_on;
static double split_total_ns;
static CUstream P, C;
static CUevent e1, e2;
static CUdeviceptr scale_buf; /* 8 bytes: the scale runs' own nodes write here */

static double time_op(op_fn fn) {
  double t[BATCHES];
  for (int i = 0; i < 200; i++)
    fn(); /* warm-up: pools filled, caches warm */
  D->CtxSynchronize();
  for (int b = 0; b < BATCHES; b++) {
    double t0 = gpu_now_ns();
    split_on = split_active;
    for (int i = 0; i < OPS; i++)
      fn();
    split_on = false;
    t[b] = (gpu_now_ns() - t0) / OPS;
    split_total_ns += t[b] * OPS;
    D->CtxSynchronize();
  }
  return median(t, BATCHES);
}

static void op_query(void) {
  CUstreamCaptureStatus st;
  cuuint64_t id;
  CUgraph g;
  const CUgraphNode *deps;
  const CUgraphEdgeData *ed;
  size_t n;
  CHECK(D->StreamGetCaptureInfo(P, &st, &id, &g, &deps, &ed, &n) == CUDA_SUCCESS, "query");
}

static void op_is_capturing(void) {
  CUstreamCaptureStatus st;
  CHECK(D->StreamIsCapturing(P, &st) == CUDA_SUCCESS, "is capturing");
}

static void op_get_ctx(void) {
  CUcontext c;
  CHECK(D->StreamGetCtx(P, &c) == CUDA_SUCCESS, "get ctx");
}

static void op_malloc_free(void) {
  void *volatile p = malloc(128);
  free(p);
}

static dlsync__pool *bench_pool;
static void op_pool_get_put(void) {
  CUevent ev;
  CHECK(dlsync__pool_get(&ev, bench_pool) == DLSYNC_SUCCESS, "pool get");
  dlsync__pool_put(bench_pool, ev);
}

/* A plain record of `e` on `from` and a wait for it on `to` (inlined: the
 * raw figures are the driver calls alone). */
static inline __attribute__((always_inline)) void rec_wait(CUevent e, CUstream from, CUstream to) {
  CHECK(D->EventRecord(e, from) == CUDA_SUCCESS, "record");
  CHECK(D->StreamWaitEvent(to, e, 0) == CUDA_SUCCESS, "wait");
}

static void op_record_wait(void) {
  rec_wait(e1, P, C);
}

static void op_same_stream(void) {
  dlsync_lane l = dlsync_lane_stream(P);
  dlsync_exchange *ex;
  CHECK(dlsync_exchange_begin(&ex, E.ctx, &l, &l) == DLSYNC_SUCCESS, "begin");
  CHECK(dlsync_exchange_end(ex) == DLSYNC_SUCCESS, "end");
}

static void op_raw_fork_join(void) {
  rec_wait(e1, P, C);
  rec_wait(e2, C, P);
}

/* The same four calls with one event, as a per-thread scratch event does. */
static void op_raw_fork_join_one_event(void) {
  rec_wait(e1, P, C);
  rec_wait(e1, C, P);
}

/* A status query as dlsync makes it (cuStreamIsCapturing). */
static inline __attribute__((always_inline)) void q_is(CUstream s) {
  CUstreamCaptureStatus cs;
  CHECK(D->StreamIsCapturing(s, &cs) == CUDA_SUCCESS, "is capturing");
}

/* The full query (graph and dependencies too), as the general path reads a
 * capturing stream. */
static inline __attribute__((always_inline)) CUgraph q_full(CUstream s) {
  CUstreamCaptureStatus cs;
  cuuint64_t id;
  CUgraph g = NULL;
  const CUgraphNode *deps;
  const CUgraphEdgeData *ed;
  size_t n;
  CHECK(D->StreamGetCaptureInfo(s, &cs, &id, &g, &deps, &ed, &n) == CUDA_SUCCESS, "query");
  return g;
}

/* The floor of dlsync's design, which asks the driver at each call: begin
 * asks about the consumer (a status query), end about both (status queries,
 * while the thread's ends find eager streams), and the raw fork+join. */
static void op_raw_with_queries(void) {
  q_is(C);
  rec_wait(e1, P, C);
  q_is(C);
  q_is(P);
  rec_wait(e2, C, P);
}

/* The same with DLSYNC_EXCHANGE_CAPTURE_STABLE: one status query. */
static void op_raw_with_one_query(void) {
  CUstreamCaptureStatus b;
  CHECK(D->StreamIsCapturing(C, &b) == CUDA_SUCCESS, "q");
  rec_wait(e1, P, C);
  rec_wait(e2, C, P);
}

static void op_dlsync_eager(void) {
  dlsync_lane lp = dlsync_lane_stream(P), lc = dlsync_lane_stream(C);
  dlsync_exchange *ex;
  CHECK(dlsync_exchange_begin(&ex, E.ctx, &lp, &lc) == DLSYNC_SUCCESS, "begin");
  CHECK(dlsync_exchange_end(ex) == DLSYNC_SUCCESS, "end");
}

static void op_dlsync_stable(void) {
  dlsync_lane lp = dlsync_lane_stream(P), lc = dlsync_lane_stream(C);
  dlsync_exchange *ex;
  CHECK(dlsync_exchange_begin_flags(&ex, E.ctx, &lp, &lc, DLSYNC_EXCHANGE_CAPTURE_STABLE) ==
            DLSYNC_SUCCESS,
        "begin");
  CHECK(dlsync_exchange_end(ex) == DLSYNC_SUCCESS, "end");
}

/* The same exchanges through libdlsync.so, as a program linking the shared
 * library makes them (its thread-local state goes through __tls_get_addr,
 * where the static library's does not): loaded with dlopen, its own context.
 * `so` is this build's; `base`, where DLSYNC_BASELINE_LIBRARY names one, an
 * earlier build's, timed in the same run for the before/after table. */
typedef struct shlib {
  dlsync_status (*context_create)(dlsync_context **, const dlsync_context_config *);
  dlsync_status (*context_destroy)(dlsync_context *);
  dlsync_status (*begin)(dlsync_exchange **, dlsync_context *, dlsync_lane *, dlsync_lane *,
                         uint32_t);
  dlsync_status (*end)(dlsync_exchange *);
  dlsync_status (*order)(dlsync_context *, dlsync_lane *, dlsync_lane *);
  dlsync_context *ctx;
} shlib;

static shlib so, base;

static bool so_open(shlib *l, const char *path) {
  void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (h == NULL)
    return false;
  *(void **)&l->context_create = dlsym(h, "dlsync_context_create");
  *(void **)&l->context_destroy = dlsym(h, "dlsync_context_destroy");
  *(void **)&l->begin = dlsym(h, "dlsync_exchange_begin_flags");
  *(void **)&l->end = dlsym(h, "dlsync_exchange_end");
  *(void **)&l->order = dlsym(h, "dlsync_order");
  return l->context_create != NULL && l->context_destroy != NULL && l->begin != NULL &&
         l->end != NULL && l->order != NULL && l->context_create(&l->ctx, NULL) == DLSYNC_SUCCESS;
}

static bool so_load(char *path, size_t len) {
  char exe[4096];
  ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
  if (getenv("DLSYNC_LIBRARY") != NULL) {
    snprintf(path, len, "%s", getenv("DLSYNC_LIBRARY"));
  } else {
    if (n <= 0)
      return false;
    exe[n] = '\0';
    snprintf(path, len, "%s/../libdlsync.so", dirname(exe));
  }
  return so_open(&so, path);
}

static void lib_exchange(shlib *l, uint32_t flags) {
  dlsync_lane lp = dlsync_lane_stream(P), lc = dlsync_lane_stream(C);
  dlsync_exchange *ex;
  CHECK(l->begin(&ex, l->ctx, &lp, &lc, flags) == DLSYNC_SUCCESS, "begin (shared)");
  CHECK(l->end(ex) == DLSYNC_SUCCESS, "end (shared)");
}

static void op_so_eager(void) {
  lib_exchange(&so, 0);
}

static void op_so_stable(void) {
  lib_exchange(&so, DLSYNC_EXCHANGE_CAPTURE_STABLE);
}

static void op_base_eager(void) {
  lib_exchange(&base, 0);
}

static void op_base_stable(void) {
  lib_exchange(&base, DLSYNC_EXCHANGE_CAPTURE_STABLE);
}

static void op_event_per_call(void) {
  CUevent a, b;
  CHECK(D->EventCreate(&a, CU_EVENT_DISABLE_TIMING) == CUDA_SUCCESS, "create");
  CHECK(D->EventRecord(a, P) == CUDA_SUCCESS, "record");
  CHECK(D->StreamWaitEvent(C, a, 0) == CUDA_SUCCESS, "wait");
  CHECK(D->EventDestroy(a) == CUDA_SUCCESS, "destroy");
  CHECK(D->EventCreate(&b, CU_EVENT_DISABLE_TIMING) == CUDA_SUCCESS, "create");
  CHECK(D->EventRecord(b, C) == CUDA_SUCCESS, "record");
  CHECK(D->StreamWaitEvent(P, b, 0) == CUDA_SUCCESS, "wait");
  CHECK(D->EventDestroy(b) == CUDA_SUCCESS, "destroy");
}

/* "EAGER_EAGER <rest>": a measure named by its row of the decision table. */
static const char *row_label(dlsync__row row, const char *rest) {
  static char labels[16][64];
  static unsigned next;
  char *l = labels[next++ % 16];
  snprintf(l, sizeof labels[0], "%s %s", dlsync__row_name(row) + strlen("DLSYNC__ROW_"), rest);
  return l;
}

/* ---- the other rows of the table, in paired rounds ----
 *
 * Each row is timed three ways, one after the other within a round: dlsync
 * (one dlsync_order, or an exchange's begin+end), the same nodes and edges
 * made by hand ("raw": pre-created events, one per order, no user objects),
 * and the floor: the raw calls plus the driver calls dlsync must make on top
 * for that row (its capture queries, the user object that ties an event to a
 * built graph, the context lookups), made by hand too. dlsync / raw is the
 * row's figure against its target; floor / raw says how much of it is the
 * driver's price for asking at each call and for owning events; dlsync /
 * floor is dlsync's own cost. K_ROWS orders per batch on fresh captures or
 * graphs, destroyed after the batch; the pool is refilled (the graphs'
 * events back) before the next. */
#define K_ROWS 500
static CUevent kev[K_ROWS];

typedef enum row_kind {
  RK_IN_CAPTURE,
  RK_IN_CAPTURE_STABLE,
  RK_TWO_CAPTURES,
  RK_EAGER_TO_CAPTURE,
  RK_EAGER_TO_BUILT,
  RK_TWO_BUILT,
  RK_CAPTURE_TO_BUILT,
  RK_BUILT_TO_CAPTURE,
  RK_COUNT
} row_kind;

typedef enum row_side { SIDE_DLSYNC, SIDE_RAW, SIDE_FLOOR, SIDE_COUNT } row_side;

static const struct {
  dlsync__row row;
  const char *what;  /* dlsync's side */
  const char *raw;   /* the calls made by hand */
  const char *floor; /* what the floor adds */
} row_info[RK_COUNT] = {
    {DLSYNC__ROW_SAME_CAPTURE, "begin+end in capture", "record+wait x2",
     "= 3 queries + 2 ADDs, no raw call"},
    {DLSYNC__ROW_SAME_CAPTURE, "  with CAPTURE_STABLE", "record+wait x2",
     "= 3 queries + 2 ADDs, no raw call"},
    {DLSYNC__ROW_TWO_CAPTURES, "order", "2 queries, 2 nodes, 2 updates",
     "= 2 queries, cuStreamGetCtx, external record + wait"},
    {DLSYNC__ROW_EAGER_TO_CAPTURE, "order", "record + external wait",
     "+ a capture query, a status query"},
    {DLSYNC__ROW_EAGER_TO_BUILT, "order", "wait node + record",
     "+ 1 query, 1 retain (+ a user object per 8)"},
    {DLSYNC__ROW_TWO_BUILT, "order", "record node + wait node",
     "+ cuCtxGetCurrent, 2 retains (+ a user object per 8)"},
    {DLSYNC__ROW_CAPTURE_TO_BUILT, "order", "query, record node, update; wait node",
     "= query, cuStreamGetCtx, 1 retain (+ a user object and a retain per 8), external "
     "record, wait node"},
    {DLSYNC__ROW_BUILT_TO_CAPTURE, "order", "record node; query, wait node, update",
     "+ cuStreamGetCtx, 1 retain (+ a user object and a retain per 8)"},
};

static void noop_destructor(void *p) {
  (void)p;
}

/* What dlsync pays to tie the i-th event of a batch to built graphs (and to
 * a capture's graph, when the other lane is built): a retain by each graph
 * of one user object, made for every DLSYNC__BUILT_BATCH events and let go
 * by its maker once they are used (a thread's batch, graph/). A capture's
 * graph (cap, or NULL) retains it once per batch. */
static CUuserObject floor_uo;
/* The graph of the capture a row's batch records into (CAPTURE_TO_BUILT,
 * BUILT_TO_CAPTURE), read before the batch is timed: dlsync has it from the
 * query it makes anyway. */
static CUgraph row_capture_graph;

static void own_by(CUgraph *g, int n, CUgraph cap, int i) {
  if (i % DLSYNC__BUILT_BATCH == 0) {
    CHECK(D->UserObjectCreate(&floor_uo, NULL, noop_destructor, 1,
                              CU_USER_OBJECT_NO_DESTRUCTOR_SYNC) == CUDA_SUCCESS,
          "user object");
    if (cap != NULL)
      CHECK(D->GraphRetainUserObject(cap, floor_uo, 1, 0) == CUDA_SUCCESS, "retain");
  }
  for (int k = 0; k < n; k++)
    CHECK(D->GraphRetainUserObject(g[k], floor_uo, 1, 0) == CUDA_SUCCESS, "retain");
  if (i % DLSYNC__BUILT_BATCH == DLSYNC__BUILT_BATCH - 1 || i == K_ROWS - 1)
    CHECK(D->UserObjectRelease(floor_uo, 1) == CUDA_SUCCESS, "release");
}

/* Waits until the graphs' events are back in c's pools: all but those of
 * this thread's open batch for built graphs (they come back together once
 * the thread lets go of the batch, at its last event). */
static void wait_events_back_of(dlsync_context *c) {
  for (int i = 0; i < 4000; i++) {
    dlsync__pool_stats ps;
    dlsync__pool_stats_get(&ps, &c->pools);
    if (ps.graph_owned <= dlsync__graph_built_held(&c->pools))
      return;
    struct timespec ts = {0, 250000};
    nanosleep(&ts, NULL);
  }
}

static void wait_events_back(void) {
  wait_events_back_of(E.ctx);
}

/* One capturing stream's dependency set added to another's by hand: the
 * full query of `from`, and cuStreamUpdateCaptureDependencies (ADD) of its
 * array on `to` (rule R12), none for an empty set. */
static inline __attribute__((always_inline)) void add_set(CUstream from, CUstream to) {
  CUstreamCaptureStatus cs;
  cuuint64_t id;
  const CUgraphNode *deps;
  const CUgraphEdgeData *ed;
  size_t n;
  CHECK(D->StreamGetCaptureInfo(from, &cs, &id, NULL, &deps, &ed, &n) == CUDA_SUCCESS, "query");
  if (n > 0)
    CHECK(D->StreamUpdateCaptureDependencies(to, (CUgraphNode *)(uintptr_t)deps, NULL, n,
                                             CU_STREAM_ADD_CAPTURE_DEPENDENCIES) == CUDA_SUCCESS,
          "add");
}

/* A stream's full query, its dependencies kept (valid until the next call on
 * that stream). */
static inline __attribute__((always_inline)) void q_deps(CUstream s, const CUgraphNode **deps,
                                                         size_t *n) {
  CUstreamCaptureStatus cs;
  cuuint64_t id;
  const CUgraphEdgeData *ed;
  CHECK(D->StreamGetCaptureInfo(s, &cs, &id, NULL, deps, &ed, n) == CUDA_SUCCESS, "query");
}

/* deps[0..n) added to the dependencies of `to`, in its capture. */
static inline __attribute__((always_inline)) void add_deps(CUstream to, const CUgraphNode *deps,
                                                           size_t n) {
  if (n > 0)
    CHECK(D->StreamUpdateCaptureDependencies(to, (CUgraphNode *)(uintptr_t)deps, NULL, n,
                                             CU_STREAM_ADD_CAPTURE_DEPENDENCIES) == CUDA_SUCCESS,
          "add");
}

/* The in-capture fork+join by dependency sets: the same edges as a record and
 * a wait each way, the cheapest calls that make them by hand. */
static void op_raw_join_by_add(void) {
  add_set(P, C);
  add_set(C, P);
}

/* In a capture (the thread's calls find captures): begin reads both lanes in
 * full and adds the producer's set to the consumer's; end reads the
 * consumer in full (still begin's capture: the producer is in it too, rule
 * R11) and adds its set to the producer's. With CAPTURE_STABLE the same
 * calls: end's query gives the set it adds. */
static void op_floor_in_capture(void) {
  q_full(C);
  op_raw_join_by_add();
}

/* A record node appended to s's capture, or a wait node, or (child not
 * NULL) a child-graph node of child, by hand. */
static inline __attribute__((always_inline)) void append_node_by_hand(CUstream s, CUevent ev,
                                                                      bool record, CUgraph child) {
  CUstreamCaptureStatus st;
  cuuint64_t id;
  CUgraph g;
  const CUgraphNode *deps;
  const CUgraphEdgeData *ed;
  size_t n;
  CUgraphNode node;
  CHECK(D->StreamGetCaptureInfo(s, &st, &id, &g, &deps, &ed, &n) == CUDA_SUCCESS, "q");
  if (child != NULL)
    CHECK(D->GraphAddChildGraphNode(&node, g, deps, n, child) == CUDA_SUCCESS, "child node");
  else if (record)
    CHECK(D->GraphAddEventRecordNode(&node, g, deps, n, ev) == CUDA_SUCCESS, "record node");
  else
    CHECK(D->GraphAddEventWaitNode(&node, g, deps, n, ev) == CUDA_SUCCESS, "wait node");
  CHECK(D->StreamUpdateCaptureDependencies(s, &node, NULL, 1, CU_STREAM_SET_CAPTURE_DEPENDENCIES) ==
            CUDA_SUCCESS,
        "update");
}

static void append_by_hand(CUstream s, CUevent ev, bool record) {
  append_node_by_hand(s, ev, record, NULL);
}

/* Where SIDE_DLSYNC goes: NULL for the static library (E.ctx), else a
 * shared library (the before/after table). */
static shlib *row_lib;

static void ds_order(dlsync_lane *a, dlsync_lane *b) {
  CHECK((row_lib != NULL ? row_lib->order(row_lib->ctx, a, b) : dlsync_order(E.ctx, a, b)) ==
            DLSYNC_SUCCESS,
        "order");
}

static void ds_exchange(uint32_t flags) {
  if (row_lib != NULL)
    lib_exchange(row_lib, flags);
  else if (flags != 0)
    op_dlsync_stable();
  else
    op_dlsync_eager();
}

/* The in-capture rows' raw side by dependency sets (op_raw_join_by_add)
 * rather than records and waits (run_capture_add). */
static bool raw_by_add;

/* TWO_CAPTURES' raw side by the external flags rather than nodes added by
 * hand (run_two_captures_flags). */
static bool raw_by_flags;

/* What ends each batch: the graphs' events back in the pool (dlsync's side
 * waits for the driver's destructor thread, in steps of 250 us), then a rest
 * of DLSYNC_BENCH_ROW_REST_US on every side (default 0: none). With a rest,
 * no side starts its next batch from a host idle longer than the others';
 * with 3000 us the host's noise grew and dlsync's own cost with it
 * (TWO_CAPTURES 1.28-1.33 over its floor, against 1.12 without), so the
 * figures are taken without a rest (docs/performance.md). The
 * before/after table, whose libraries' pools are not visible here, always
 * rests 3000 us. */
static long row_rest_us = -1;

static void row_rest(void) {
  struct timespec ts;
  long us;
  if (row_rest_us < 0) {
    const char *v = getenv("DLSYNC_BENCH_ROW_REST_US");
    row_rest_us = v != NULL ? strtol(v, NULL, 10) : 0;
    if (row_rest_us < 0)
      row_rest_us = 0;
  }
  us = row_rest_us;
  if (row_lib == NULL)
    wait_events_back();
  else if (us == 0)
    us = 3000; /* a library's pools are not visible here: its destructors need the time */
  if (us == 0)
    return;
  ts.tv_sec = us / 1000000;
  ts.tv_nsec = (us % 1000000) * 1000;
  nanosleep(&ts, NULL);
}

/* One operation of row rk, side `side`, the i-th of its batch. */
static void row_op(row_kind rk, row_side side, int i, dlsync_lane *l1, dlsync_lane *l2) {
  dlsync_lane lp = dlsync_lane_stream(P), lc = dlsync_lane_stream(C);
  CUgraphNode n;
  CUcontext cur;
  switch (rk) {
  case RK_IN_CAPTURE:
  case RK_IN_CAPTURE_STABLE:
    if (side == SIDE_RAW)
      raw_by_add ? op_raw_join_by_add() : op_raw_fork_join();
    else if (side == SIDE_DLSYNC)
      ds_exchange(rk == RK_IN_CAPTURE ? 0 : DLSYNC_EXCHANGE_CAPTURE_STABLE);
    else
      op_floor_in_capture();
    return;
  case RK_TWO_CAPTURES:
    if (side == SIDE_DLSYNC) {
      ds_order(&lp, &lc);
      return;
    }
    if (side == SIDE_FLOOR) { /* dlsync's own calls */
      q_full(C);
      q_full(P);
      CHECK(D->StreamGetCtx(P, &cur) == CUDA_SUCCESS, "get ctx");
    }
    if (side == SIDE_FLOOR || raw_by_flags) {
      /* The same nodes by the external flags (rule R13). */
      CHECK(D->EventRecordWithFlags(kev[i], P, CU_EVENT_RECORD_EXTERNAL) == CUDA_SUCCESS, "record");
      CHECK(D->StreamWaitEvent(C, kev[i], CU_EVENT_WAIT_EXTERNAL) == CUDA_SUCCESS, "wait");
      return;
    }
    append_by_hand(P, kev[i], true);
    append_by_hand(C, kev[i], false);
    return;
  case RK_EAGER_TO_CAPTURE:
    if (side == SIDE_DLSYNC) {
      ds_order(&lp, &lc);
      return;
    }
    if (side == SIDE_FLOOR) { /* then's full query, first's status (eager, as last time) */
      q_full(C);
      q_is(P);
    }
    CHECK(D->EventRecord(kev[i], P) == CUDA_SUCCESS, "record");
    CHECK(D->StreamWaitEvent(C, kev[i], CU_EVENT_WAIT_EXTERNAL) == CUDA_SUCCESS, "wait");
    return;
  case RK_EAGER_TO_BUILT:
    if (side == SIDE_DLSYNC) {
      ds_order(&lp, l2);
      return;
    }
    if (side == SIDE_FLOOR) {
      q_full(P);
      own_by(&l2->graph, 1, NULL, i);
    }
    CHECK(D->EventRecord(kev[i], P) == CUDA_SUCCESS, "record");
    CHECK(D->GraphAddEventWaitNode(&n, l2->graph, l2->deps, 1, kev[i]) == CUDA_SUCCESS, "node");
    l2->deps[0] = n;
    return;
  case RK_CAPTURE_TO_BUILT:
    if (side == SIDE_DLSYNC) {
      ds_order(&lp, l2);
      return;
    }
    if (side == SIDE_FLOOR) { /* dlsync's own calls */
      q_full(P);
      CHECK(D->StreamGetCtx(P, &cur) == CUDA_SUCCESS, "get ctx");
      own_by(&l2->graph, 1, row_capture_graph, i);
      CHECK(D->EventRecordWithFlags(kev[i], P, CU_EVENT_RECORD_EXTERNAL) == CUDA_SUCCESS, "record");
    } else {
      append_by_hand(P, kev[i], true);
    }
    CHECK(D->GraphAddEventWaitNode(&n, l2->graph, l2->deps, 1, kev[i]) == CUDA_SUCCESS, "node");
    l2->deps[0] = n;
    return;
  case RK_BUILT_TO_CAPTURE:
    if (side == SIDE_DLSYNC) {
      ds_order(l1, &lc);
      return;
    }
    if (side == SIDE_FLOOR) {
      CHECK(D->StreamGetCtx(C, &cur) == CUDA_SUCCESS, "get ctx");
      own_by(&l1->graph, 1, row_capture_graph, i);
    }
    CHECK(D->GraphAddEventRecordNode(&n, l1->graph, l1->deps, 1, kev[i]) == CUDA_SUCCESS, "node");
    l1->deps[0] = n;
    append_by_hand(C, kev[i], false); /* its query: the one dlsync makes */
    return;
  case RK_TWO_BUILT:
  default:
    if (side == SIDE_DLSYNC) {
      ds_order(l1, l2);
      return;
    }
    if (side == SIDE_FLOOR) {
      CUgraph both[2] = {l1->graph, l2->graph};
      CHECK(D->CtxGetCurrent(&cur) == CUDA_SUCCESS, "current");
      own_by(both, 2, NULL, i);
    }
    CHECK(D->GraphAddEventRecordNode(&n, l1->graph, l1->deps, 1, kev[i]) == CUDA_SUCCESS, "node");
    l1->deps[0] = n;
    CHECK(D->GraphAddEventWaitNode(&n, l2->graph, l2->deps, 1, kev[i]) == CUDA_SUCCESS, "node");
    l2->deps[0] = n;
    return;
  }
}

/* ns per operation of row rk, side `side`: the median of BATCHES batches of
 * K_ROWS, each on a fresh capture or fresh graphs. */
static double time_row(row_kind rk, row_side side) {
  double t[BATCHES];
  for (int b = 0; b < BATCHES; b++) {
    CUgraph g1 = NULL, g2 = NULL, gc = NULL, gp = NULL;
    CUgraphNode d1[2], d2[2];
    dlsync_lane l1, l2;
    double t0;
    bool in_capture = rk == RK_IN_CAPTURE || rk == RK_IN_CAPTURE_STABLE;
    if (in_capture) {
      /* P captures; C joins it once before the batch (as the first exchange
       * of a capture does), so the batch is the steady state: both streams
       * in one capture. Each has a node of its own, as streams that
       * exchange tensors in a capture have (with empty dependency sets a
       * record and a wait cost half or less of what they cost with one
       * node, and there is no edge to make). */
      CHECK(D->StreamBeginCapture(P, CU_STREAM_CAPTURE_MODE_GLOBAL) == CUDA_SUCCESS, "capture");
      CHECK(D->MemsetD32Async(scale_buf, 1, 1, P) == CUDA_SUCCESS, "memset");
      CHECK(D->EventRecord(e1, P) == CUDA_SUCCESS, "fork");
      CHECK(D->StreamWaitEvent(C, e1, 0) == CUDA_SUCCESS, "fork");
      CHECK(D->MemsetD32Async(scale_buf + 4, 2, 1, C) == CUDA_SUCCESS, "memset");
    } else if (rk == RK_TWO_CAPTURES || rk == RK_EAGER_TO_CAPTURE) {
      if (rk == RK_TWO_CAPTURES)
        CHECK(D->StreamBeginCapture(P, CU_STREAM_CAPTURE_MODE_RELAXED) == CUDA_SUCCESS, "capture");
      CHECK(D->StreamBeginCapture(C, CU_STREAM_CAPTURE_MODE_RELAXED) == CUDA_SUCCESS, "capture");
    } else {
      /* A built graph for the later lane (g2) and one for the earlier (g1),
       * as the row needs; the other lane a capture. */
      if (rk != RK_BUILT_TO_CAPTURE) {
        CHECK(D->GraphCreate(&g2, 0) == CUDA_SUCCESS, "graph");
        CHECK(D->GraphAddEmptyNode(&d2[0], g2, NULL, 0) == CUDA_SUCCESS, "node");
      }
      if (rk == RK_TWO_BUILT || rk == RK_BUILT_TO_CAPTURE) {
        CHECK(D->GraphCreate(&g1, 0) == CUDA_SUCCESS, "graph");
        CHECK(D->GraphAddEmptyNode(&d1[0], g1, NULL, 0) == CUDA_SUCCESS, "node");
      }
      if (rk == RK_CAPTURE_TO_BUILT) {
        CHECK(D->StreamBeginCapture(P, CU_STREAM_CAPTURE_MODE_RELAXED) == CUDA_SUCCESS, "capture");
        row_capture_graph = q_full(P);
      }
      if (rk == RK_BUILT_TO_CAPTURE) {
        CHECK(D->StreamBeginCapture(C, CU_STREAM_CAPTURE_MODE_RELAXED) == CUDA_SUCCESS, "capture");
        row_capture_graph = q_full(C);
      }
    }
    l1 = dlsync_lane_graph(g1, d1, 1, 2);
    l2 = dlsync_lane_graph(g2, d2, 1, 2);
    t0 = gpu_now_ns();
    split_on = split_active;
    for (int i = 0; i < K_ROWS; i++)
      row_op(rk, side, i, &l1, &l2);
    split_on = false;
    t[b] = (gpu_now_ns() - t0) / K_ROWS;
    split_total_ns += t[b] * K_ROWS;
    if (in_capture) {
      CHECK(D->EventRecord(e2, C) == CUDA_SUCCESS, "join");
      CHECK(D->StreamWaitEvent(P, e2, 0) == CUDA_SUCCESS, "join");
      CHECK(D->StreamEndCapture(P, &gp) == CUDA_SUCCESS, "end capture");
    } else if (rk == RK_TWO_CAPTURES || rk == RK_EAGER_TO_CAPTURE || rk == RK_BUILT_TO_CAPTURE) {
      CHECK(D->StreamEndCapture(C, &gc) == CUDA_SUCCESS, "end capture");
      if (rk == RK_TWO_CAPTURES)
        CHECK(D->StreamEndCapture(P, &gp) == CUDA_SUCCESS, "end capture");
    } else if (rk == RK_CAPTURE_TO_BUILT) {
      CHECK(D->StreamEndCapture(P, &gp) == CUDA_SUCCESS, "end capture");
    }
    D->CtxSynchronize();
    CUgraph gs[4] = {g1, g2, gc, gp};
    for (int i = 0; i < 4; i++)
      if (gs[i] != NULL)
        D->GraphDestroy(gs[i]);
    row_rest();
  }
  return median(t, BATCHES);
}

/* The rows in ROW_ROUNDS rounds; per-round ratios. */
#define ROW_ROUNDS 9
typedef struct row_result {
  double ns[SIDE_COUNT];     /* medians over the rounds */
  double vs_raw[ROW_ROUNDS]; /* dlsync / raw, sorted */
  double floor_raw;          /* median of floor / raw */
  double own[ROW_ROUNDS];    /* dlsync / floor, sorted */
} row_result;

static void run_rows(row_result *res) {
  double ns[RK_COUNT][SIDE_COUNT][ROW_ROUNDS], fr[RK_COUNT][ROW_ROUNDS];
  for (int rk = 0; rk < RK_COUNT; rk++) /* warm: the pool grows to K_ROWS events */
    time_row((row_kind)rk, SIDE_DLSYNC);
  for (int k = 0; k < ROW_ROUNDS; k++)
    for (int rk = 0; rk < RK_COUNT; rk++)
      for (int sd = 0; sd < SIDE_COUNT; sd++)
        ns[rk][sd][k] = time_row((row_kind)rk, (row_side)sd);
  for (int rk = 0; rk < RK_COUNT; rk++) {
    row_result *r = &res[rk];
    for (int k = 0; k < ROW_ROUNDS; k++) {
      r->vs_raw[k] = ns[rk][SIDE_DLSYNC][k] / ns[rk][SIDE_RAW][k];
      r->own[k] = ns[rk][SIDE_DLSYNC][k] / ns[rk][SIDE_FLOOR][k];
      fr[rk][k] = ns[rk][SIDE_FLOOR][k] / ns[rk][SIDE_RAW][k];
    }
    for (int sd = 0; sd < SIDE_COUNT; sd++)
      r->ns[sd] = median(ns[rk][sd], ROW_ROUNDS);
    r->floor_raw = median(fr[rk], ROW_ROUNDS);
    (void)median(r->vs_raw, ROW_ROUNDS); /* sorts */
    (void)median(r->own, ROW_ROUNDS);
  }
}

/* ---- where a row's time goes ----
 *
 * The same rows, dlsync and its floor, through a copy of the driver table
 * whose entries the rows use time each call (rdtsc on x86, else the clock):
 * the time inside the driver's calls, and the rest. When dlsync's calls take
 * longer than the floor's same calls, the driver is slower for what dlsync
 * asks (its events, its arguments); the rest is dlsync's own code (and the
 * floor's loop). The timing costs each call the same on both sides. */
static dlsync__driver split_drv;
static const dlsync__driver *split_real;
static uint64_t split_ticks;
static unsigned long split_calls;

static inline uint64_t split_now(void) {
#if defined(__x86_64__)
  unsigned lo, hi;
  __asm__ volatile("rdtsc" : "=a"(lo), "=d"(hi));
  return ((uint64_t)hi << 32) | lo;
#else
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
#endif
}

#define SPLIT_WRAP(name, params, args)          \
  static CUresult CUDAAPI split_##name params { \
    uint64_t t0;                                \
    CUresult r;                                 \
    if (!split_on)                              \
      return split_real->name args;             \
    t0 = split_now();                           \
    r = split_real->name args;                  \
    split_ticks += split_now() - t0;            \
    split_calls++;                              \
    return r;                                   \
  }
SPLIT_WRAP(StreamGetCaptureInfo,
           (CUstream s, CUstreamCaptureStatus *st, cuuint64_t *id, CUgraph *g,
            const CUgraphNode **d, const CUgraphEdgeData **e, size_t *n),
           (s, st, id, g, d, e, n))
SPLIT_WRAP(StreamIsCapturing, (CUstream s, CUstreamCaptureStatus *st), (s, st))
SPLIT_WRAP(StreamGetCtx, (CUstream s, CUcontext *c), (s, c))
SPLIT_WRAP(EventRecord, (CUevent e, CUstream s), (e, s))
SPLIT_WRAP(EventRecordWithFlags, (CUevent e, CUstream s, unsigned f), (e, s, f))
SPLIT_WRAP(StreamWaitEvent, (CUstream s, CUevent e, unsigned f), (s, e, f))
SPLIT_WRAP(GraphAddEventRecordNode,
           (CUgraphNode * o, CUgraph g, const CUgraphNode *d, size_t n, CUevent e), (o, g, d, n, e))
SPLIT_WRAP(GraphAddEventWaitNode,
           (CUgraphNode * o, CUgraph g, const CUgraphNode *d, size_t n, CUevent e), (o, g, d, n, e))
SPLIT_WRAP(StreamUpdateCaptureDependencies,
           (CUstream s, CUgraphNode *d, const CUgraphEdgeData *e, size_t n, unsigned f),
           (s, d, e, n, f))
SPLIT_WRAP(CtxGetCurrent, (CUcontext * c), (c))
SPLIT_WRAP(UserObjectCreate, (CUuserObject * o, void *p, CUhostFn fn, unsigned c, unsigned f),
           (o, p, fn, c, f))
SPLIT_WRAP(UserObjectRelease, (CUuserObject o, unsigned c), (o, c))
SPLIT_WRAP(GraphRetainUserObject, (CUgraph g, CUuserObject o, unsigned c, unsigned f), (g, o, c, f))

/* Ticks per ns of split_now, against the clock over 20 ms. */
static double split_rate(void) {
  struct timespec ts = {0, 20000000};
  double t0 = gpu_now_ns();
  uint64_t k0 = split_now();
  nanosleep(&ts, NULL);
  return (double)(split_now() - k0) / (gpu_now_ns() - t0);
}

typedef struct split_side {
  double total, in, calls; /* per operation: ns, ns inside the calls, calls */
} split_side;

#define SPLIT_ROUNDS 5

/* Row rk (RK_COUNT: the eager begin+end, against the raw fork+join and its
 * status queries), one side, medians over SPLIT_ROUNDS rounds. */
static split_side split_measure(int rk, row_side side, double rate) {
  double total[SPLIT_ROUNDS], in[SPLIT_ROUNDS], calls = 0;
  for (int k = 0; k < SPLIT_ROUNDS; k++) {
    double ops = rk == RK_COUNT ? (double)BATCHES * OPS : (double)BATCHES * K_ROWS;
    split_ticks = 0;
    split_calls = 0;
    split_total_ns = 0;
    split_active = true;
    if (rk == RK_COUNT)
      (void)time_op(side == SIDE_DLSYNC ? op_dlsync_eager : op_raw_with_queries);
    else
      (void)time_row((row_kind)rk, side);
    split_active = false;
    total[k] = split_total_ns / ops;
    in[k] = (double)split_ticks / rate / ops;
    calls = (double)split_calls / ops;
  }
  return (split_side){median(total, SPLIT_ROUNDS), median(in, SPLIT_ROUNDS), calls};
}

static void run_split(void) {
  static const int rows[] = {
      RK_COUNT,          RK_IN_CAPTURE, RK_TWO_CAPTURES,     RK_EAGER_TO_CAPTURE,
      RK_EAGER_TO_BUILT, RK_TWO_BUILT,  RK_CAPTURE_TO_BUILT, RK_BUILT_TO_CAPTURE};
  dlsync_context *sctx = NULL, *real_ctx = E.ctx;
  double rate = split_rate();
  split_real = D;
  split_drv = *D;
  split_drv.StreamGetCaptureInfo = split_StreamGetCaptureInfo;
  split_drv.StreamIsCapturing = split_StreamIsCapturing;
  split_drv.StreamGetCtx = split_StreamGetCtx;
  split_drv.EventRecord = split_EventRecord;
  split_drv.EventRecordWithFlags = split_EventRecordWithFlags;
  split_drv.StreamWaitEvent = split_StreamWaitEvent;
  split_drv.GraphAddEventRecordNode = split_GraphAddEventRecordNode;
  split_drv.GraphAddEventWaitNode = split_GraphAddEventWaitNode;
  split_drv.StreamUpdateCaptureDependencies = split_StreamUpdateCaptureDependencies;
  split_drv.CtxGetCurrent = split_CtxGetCurrent;
  split_drv.UserObjectCreate = split_UserObjectCreate;
  split_drv.UserObjectRelease = split_UserObjectRelease;
  split_drv.GraphRetainUserObject = split_GraphRetainUserObject;
  CHECK(dlsync__context_create_with_driver(&sctx, NULL, &split_drv) == DLSYNC_SUCCESS,
        "split context");
  D = &split_drv;
  E.ctx = sctx;
  for (int i = 0; i < 200; i++) /* this thread's scratch event and memo of sctx */
    op_dlsync_eager();
  printf("\nwhere the time goes (host ns per operation, medians over %d rounds; dlsync and its "
         "floor through one copy of the driver table that times each call: inside the calls, "
         "and the rest)\n",
         SPLIT_ROUNDS);
  printf("%-40s %-7s %8s %9s %8s %8s\n", "row", "side", "total", "in calls", "rest", "calls");
  for (size_t r = 0; r < sizeof rows / sizeof rows[0]; r++) {
    int rk = rows[r];
    const char *label = rk == RK_COUNT ? row_label(DLSYNC__ROW_EAGER_EAGER, "begin+end")
                                       : row_label(row_info[rk].row, row_info[rk].what);
    split_side ds, fl;
    if (rk != RK_COUNT)
      (void)time_row((row_kind)rk, SIDE_DLSYNC); /* warm */
    ds = split_measure(rk, SIDE_DLSYNC, rate);
    fl = split_measure(rk, rk == RK_COUNT ? SIDE_RAW : SIDE_FLOOR, rate);
    printf("%-40s %-7s %8.1f %9.1f %8.1f %8.2f\n", label, "dlsync", ds.total, ds.in,
           ds.total - ds.in, ds.calls);
    printf("%-40s %-7s %8.1f %9.1f %8.1f %8.2f\n", "", "floor", fl.total, fl.in, fl.total - fl.in,
           fl.calls);
    printf("%-40s %-7s %8.1f %9.1f %8.1f\n", "", "ds-flr", ds.total - fl.total, ds.in - fl.in,
           (ds.total - ds.in) - (fl.total - fl.in));
  }
  D = split_real;
  E.ctx = real_ctx;
  wait_events_back_of(sctx);
  dlsync_context_destroy(sctx);
}

/* A row's raw side two ways, paired: the cheaper way to make the same nodes
 * or edges by hand (*cheap set) against the row's raw side, and dlsync
 * against the cheaper way. The two lines say what was timed. */
typedef struct reference_lines {
  row_kind rk;
  bool *cheap; /* the switch row_op reads for rk's raw side */
  const char *cheap_vs_raw, *what_cheap, *dlsync_vs_cheap, *what_dlsync;
} reference_lines;

static void run_reference(const reference_lines *rl) {
  double ch[ROW_ROUNDS], raw[ROW_ROUNDS], ds[ROW_ROUNDS], r1[ROW_ROUNDS], r2[ROW_ROUNDS];
  for (int k = 0; k < ROW_ROUNDS; k++) {
    *rl->cheap = k % 2 == 0; /* each pair in both orders */
    (*rl->cheap ? ch : raw)[k] = time_row(rl->rk, SIDE_RAW);
    *rl->cheap = !*rl->cheap;
    (*rl->cheap ? ch : raw)[k] = time_row(rl->rk, SIDE_RAW);
    *rl->cheap = false;
    ds[k] = time_row(rl->rk, SIDE_DLSYNC);
    r1[k] = ch[k] / raw[k];
    r2[k] = ds[k] / ch[k];
  }
  double m1 = median(r1, ROW_ROUNDS), m2 = median(r2, ROW_ROUNDS);
  printf("  %-53s %7.1f %7.1f %6.2f [%.2f-%.2f] (%s)\n", rl->cheap_vs_raw, median(ch, ROW_ROUNDS),
         median(raw, ROW_ROUNDS), m1, r1[0], r1[ROW_ROUNDS - 1], rl->what_cheap);
  printf("  %-53s %7.1f %7.1f %6.2f [%.2f-%.2f] (%s)\n", rl->dlsync_vs_cheap,
         median(ds, ROW_ROUNDS), median(ch, ROW_ROUNDS), m2, r2[0], r2[ROW_ROUNDS - 1],
         rl->what_dlsync);
}

/* Inside a capture: the same edges made by hand with dependency sets (query
 * + ADD each way) against records and waits (the row's raw side). */
static void run_capture_add(void) {
  const reference_lines rl = {RK_IN_CAPTURE,
                              &raw_by_add,
                              "in capture, by hand: query+ADD x2 vs record+wait x2:",
                              "reference: the same edges",
                              "in capture, dlsync begin+end vs query+ADD x2:",
                              "against the cheapest hand-made calls; dlsync adds one query"};
  run_reference(&rl);
}

/* Two captures: the external record and wait against the nodes added by
 * hand (the row's raw side). */
static void run_two_captures_flags(void) {
  const reference_lines rl = {
      RK_TWO_CAPTURES,
      &raw_by_flags,
      "two captures, by hand: external record+wait vs nodes:",
      "reference: the same nodes",
      "two captures, dlsync order vs external record+wait:",
      "against the cheapest hand-made calls; dlsync adds 2 queries and cuStreamGetCtx"};
  run_reference(&rl);
}

/* ---- a library's own graph launched inside a capture ----
 * dlsync_graph_launch on a capturing stream against what a library would
 * write by hand for the same node: the capture query (graph and
 * dependencies), cuGraphAddChildGraphNode at those dependencies,
 * cuStreamUpdateCaptureDependencies (SET) to the new node. Those calls are
 * also dlsync's floor: it makes no other on this path (no context lookup,
 * no event, no user object). The library's graph: LAUNCH_NODES memsets,
 * captured once. Each batch: K_ROWS launches into a fresh capture of P that
 * holds one node; the captured graph's node count, 1 + the launches' child
 * nodes, shows that dlsync adds none of its own. */
#define LAUNCH_NODES 4
static CUgraph launch_lib_graph;

static void op_launch_by_hand(void) {
  append_node_by_hand(P, NULL, false, launch_lib_graph);
}

/* ns per launch (median of BATCHES batches) and the nodes of the last
 * batch's captured graph. */
static double time_launch(bool with_dlsync, size_t *nodes) {
  double t[BATCHES];
  dlsync_lane lp = dlsync_lane_stream(P);
  for (int b = 0; b < BATCHES; b++) {
    CUgraph g = NULL;
    double t0;
    CHECK(D->StreamBeginCapture(P, CU_STREAM_CAPTURE_MODE_RELAXED) == CUDA_SUCCESS, "capture");
    CHECK(D->MemsetD32Async(scale_buf, 1, 1, P) == CUDA_SUCCESS, "memset");
    t0 = gpu_now_ns();
    for (int i = 0; i < K_ROWS; i++) {
      if (with_dlsync)
        CHECK(dlsync_graph_launch(E.ctx, launch_lib_graph, NULL, &lp) == DLSYNC_SUCCESS,
              "dlsync_graph_launch");
      else
        op_launch_by_hand();
    }
    t[b] = (gpu_now_ns() - t0) / K_ROWS;
    CHECK(D->StreamEndCapture(P, &g) == CUDA_SUCCESS, "end capture");
    *nodes = 0;
    CHECK(D->GraphGetNodes(g, NULL, nodes) == CUDA_SUCCESS, "nodes");
    D->GraphDestroy(g);
  }
  return median(t, BATCHES);
}

static void run_launch(void) {
  double ds[ROW_ROUNDS], raw[ROW_ROUNDS], ratio[ROW_ROUNDS];
  size_t nd = 0, nr = 0;
  CUgraph lib = NULL;
  CHECK(D->StreamBeginCapture(C, CU_STREAM_CAPTURE_MODE_RELAXED) == CUDA_SUCCESS, "capture");
  for (int i = 0; i < LAUNCH_NODES; i++)
    CHECK(D->MemsetD32Async(scale_buf, (unsigned)i, 2, C) == CUDA_SUCCESS, "memset");
  CHECK(D->StreamEndCapture(C, &lib) == CUDA_SUCCESS, "end capture");
  launch_lib_graph = lib;
  (void)time_launch(true, &nd); /* warm */
  (void)time_launch(false, &nr);
  for (int k = 0; k < ROW_ROUNDS; k++) { /* each side first in every other round */
    bool ds_first = k % 2 == 0;
    if (ds_first)
      ds[k] = time_launch(true, &nd);
    raw[k] = time_launch(false, &nr);
    if (!ds_first)
      ds[k] = time_launch(true, &nd);
    ratio[k] = ds[k] / raw[k];
  }
  D->GraphDestroy(lib);
  launch_lib_graph = NULL;
  {
    double r = median(ratio, ROW_ROUNDS), a = median(ds, ROW_ROUNDS), b = median(raw, ROW_ROUNDS);
    double lo = ratio[0], hi = ratio[ROW_ROUNDS - 1]; /* median() sorts in place */
    long extra = (long)nd - (long)nr;
    printf("\nin-capture launch of a library's graph (%d memset nodes; host ns per launch, medians "
           "over %d paired rounds of %d batches of %d; by hand = the floor: query, "
           "cuGraphAddChildGraphNode, cuStreamUpdateCaptureDependencies)\n",
           LAUNCH_NODES, ROW_ROUNDS, BATCHES, K_ROWS);
    printf("%-44s %10s %10s %8s %s\n", "measure", "dlsync", "by hand", "ratio", "target");
    printf("%-44s %10.1f %10.1f %8.2f %s [%.2f-%.2f]\n",
           "dlsync_graph_launch in capture vs by hand", a, b, r,
           r <= 1.25 ? "<= 1.25 ok" : "<= 1.25 MISSED", lo, hi);
    printf("%-44s %10zu %10zu %8ld %s\n", "  nodes in a batch's graph (1 + launches)", nd, nr,
           extra, extra == 0 ? "0 extra ok" : "0 extra MISSED");
  }
}

/* ---- one producer, three consumers, and the join back ----
 * dlsync_exchange_begin_fanout + end against the same calls by hand (one
 * record on the producer, a wait per consumer, a record per consumer and the
 * producer's wait on each), eager and inside a capture, with dlsync's floor:
 * the driver calls dlsync must make (eager: the raw calls, a status query
 * per consumer at begin, and at end the producer's status once and each
 * consumer's; CAPTURE_STABLE: the begin's only). In a capture the consumers
 * are joined to it before each timed batch and stay in it (a joined stream
 * leaves with the capture's end, R11), so every fan-out there is
 * SAME_CAPTURE: the floor is then each lane's full query and an ADD of the
 * producer's dependencies to each consumer's, and at end each consumer's
 * full query and ONE ADD of their dependencies (each node once) to the
 * producer's, no event. */
#define FAN_N 3
#define FAN_OPS 500
static CUstream fan_c[FAN_N];
static CUevent fan_ev[FAN_N + 1];

typedef enum fan_side {
  FAN_BY_HAND,
  FAN_FLOOR,
  FAN_FLOOR_STABLE,
  FAN_FLOOR_CAPTURE,
  FAN_DLSYNC,
  FAN_DLSYNC_STABLE
} fan_side;

static inline __attribute__((always_inline)) void fan_op(fan_side side) {
  dlsync_lane lp, lcs[FAN_N];
  dlsync_exchange *ex;
  switch (side) {
  case FAN_DLSYNC:
  case FAN_DLSYNC_STABLE:
    lp = dlsync_lane_stream(P);
    for (int i = 0; i < FAN_N; i++)
      lcs[i] = dlsync_lane_stream(fan_c[i]);
    CHECK(dlsync_exchange_begin_fanout(&ex, E.ctx, &lp, lcs, FAN_N,
                                       side == FAN_DLSYNC_STABLE ? DLSYNC_EXCHANGE_CAPTURE_STABLE
                                                                 : 0) == DLSYNC_SUCCESS,
          "begin_fanout");
    CHECK(dlsync_exchange_end(ex) == DLSYNC_SUCCESS, "end");
    return;
  case FAN_FLOOR_CAPTURE: {
    CUgraphNode all[32];
    const CUgraphNode *pd;
    size_t pn, nall = 0;
    q_deps(P, &pd, &pn);
    for (int i = 0; i < FAN_N; i++)
      (void)q_full(fan_c[i]);
    for (int i = 0; i < FAN_N; i++)
      add_deps(fan_c[i], pd, pn);
    for (int i = FAN_N; i-- > 0;) {
      const CUgraphNode *cd;
      size_t cn;
      q_deps(fan_c[i], &cd, &cn);
      for (size_t k = 0; k < cn; k++) {
        bool seen = false;
        for (size_t m = 0; m < nall && !seen; m++)
          seen = all[m] == cd[k];
        if (!seen && nall < 32)
          all[nall++] = cd[k];
      }
    }
    add_deps(P, all, nall);
    return;
  }
  default:
    break;
  }
  if (side != FAN_BY_HAND)
    for (int i = 0; i < FAN_N; i++)
      q_is(fan_c[i]);
  CHECK(D->EventRecord(fan_ev[0], P) == CUDA_SUCCESS, "record");
  for (int i = 0; i < FAN_N; i++)
    CHECK(D->StreamWaitEvent(fan_c[i], fan_ev[0], 0) == CUDA_SUCCESS, "wait");
  if (side == FAN_FLOOR)
    q_is(P);
  for (int i = FAN_N; i-- > 0;) {
    if (side == FAN_FLOOR)
      q_is(fan_c[i]);
    rec_wait(fan_ev[i + 1], fan_c[i], P);
  }
}

/* ns per fan-out and join (median of BATCHES batches of FAN_OPS); in a
 * capture, each batch a fresh capture of P holding one node. */
static double time_fan(fan_side side, bool capture) {
  double t[BATCHES];
  for (int b = 0; b < BATCHES; b++) {
    CUgraph g = NULL;
    double t0;
    if (capture) {
      CHECK(D->StreamBeginCapture(P, CU_STREAM_CAPTURE_MODE_RELAXED) == CUDA_SUCCESS, "capture");
      CHECK(D->MemsetD32Async(scale_buf, 1, 1, P) == CUDA_SUCCESS, "memset");
      /* The consumers join the capture before the timed part, so that every
       * side times SAME_CAPTURE (the floor's ADD into a stream not in the
       * capture would be refused: R14). */
      CHECK(D->EventRecord(fan_ev[0], P) == CUDA_SUCCESS, "record");
      for (int i = 0; i < FAN_N; i++)
        CHECK(D->StreamWaitEvent(fan_c[i], fan_ev[0], 0) == CUDA_SUCCESS, "join");
    }
    t0 = gpu_now_ns();
    for (int i = 0; i < FAN_OPS; i++)
      fan_op(side);
    t[b] = (gpu_now_ns() - t0) / FAN_OPS;
    if (capture) {
      CHECK(D->StreamEndCapture(P, &g) == CUDA_SUCCESS, "end capture");
      D->GraphDestroy(g);
    }
  }
  return median(t, BATCHES);
}

/* One line: dlsync against by hand (target <= 1.25), and the floor. */
static void fan_line(const char *what, fan_side ds_side, fan_side floor_side, bool capture,
                     fan_side hand_side) {
  double ds[ROW_ROUNDS], hand[ROW_ROUNDS], fl[ROW_ROUNDS], r[ROW_ROUNDS], rf[ROW_ROUNDS];
  (void)time_fan(ds_side, capture);      /* warm */
  for (int k = 0; k < ROW_ROUNDS; k++) { /* each side first in every other round */
    if (k % 2 == 0)
      ds[k] = time_fan(ds_side, capture);
    hand[k] = time_fan(hand_side, capture);
    fl[k] = time_fan(floor_side, capture);
    if (k % 2 != 0)
      ds[k] = time_fan(ds_side, capture);
    r[k] = ds[k] / hand[k];
    rf[k] = fl[k] / hand[k];
  }
  {
    double m = median(r, ROW_ROUNDS), mf = median(rf, ROW_ROUNDS);
    printf("%-44s %10.1f %10.1f %8.2f %s [%.2f-%.2f]\n", what, median(ds, ROW_ROUNDS),
           median(hand, ROW_ROUNDS), m, m <= 1.25 ? "<= 1.25 ok" : "<= 1.25 MISSED", r[0],
           r[ROW_ROUNDS - 1]);
    printf("%-44s %10.1f %10.1f %8.2f [%.2f-%.2f] (the floor: the queries dlsync must make)\n",
           "  its floor vs by hand", median(fl, ROW_ROUNDS), median(hand, ROW_ROUNDS), mf, rf[0],
           rf[ROW_ROUNDS - 1]);
  }
}

static void run_fanout(void) {
  for (int i = 0; i < FAN_N; i++)
    CHECK(D->StreamCreate(&fan_c[i], CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS, "stream");
  for (int i = 0; i <= FAN_N; i++)
    CHECK(D->EventCreate(&fan_ev[i], CU_EVENT_DISABLE_TIMING) == CUDA_SUCCESS, "event");
  printf("\nfan-out to %d consumers and the join back (host ns per fan-out+join; medians over %d "
         "paired rounds of %d batches of %d; by hand: one record on the producer, a wait per "
         "consumer, then a record per consumer and the producer's wait; in one capture the "
         "consumers are in it after the first, SAME_CAPTURE)\n",
         FAN_N, ROW_ROUNDS, BATCHES, FAN_OPS);
  printf("%-44s %10s %10s %8s %s\n", "measure", "dlsync", "by hand", "ratio", "target");
  fan_line("begin_fanout+end, eager vs by hand", FAN_DLSYNC, FAN_FLOOR, false, FAN_BY_HAND);
  fan_line("  with CAPTURE_STABLE vs by hand", FAN_DLSYNC_STABLE, FAN_FLOOR_STABLE, false,
           FAN_BY_HAND);
  fan_line("begin_fanout+end, one capture vs by hand", FAN_DLSYNC, FAN_FLOOR_CAPTURE, true,
           FAN_BY_HAND);
  for (int i = 0; i <= FAN_N; i++)
    D->EventDestroy(fan_ev[i]);
  for (int i = 0; i < FAN_N; i++)
    D->StreamDestroy(fan_c[i]);
}

static void print_rows(const row_result *res) {
  char rest[64] = "";
  if (row_rest_us > 0)
    snprintf(rest, sizeof rest, ", each followed by a %ld us rest on every side", row_rest_us);
  printf("\nrows of the table (host ns per operation; medians over %d paired rounds of %d batches "
         "of %d%s; target: dlsync <= 1.25 x the same nodes and edges made by hand)\n",
         ROW_ROUNDS, BATCHES, K_ROWS, rest);
  printf("%-40s %8s %8s %8s %7s %-21s %7s %7s  %s\n", "row", "dlsync", "raw", "floor", "ds/raw",
         "target [range]", "flr/raw", "ds/flr", "the floor adds");
  for (int rk = 0; rk < RK_COUNT; rk++) {
    const row_result *r = &res[rk];
    double ratio = r->vs_raw[ROW_ROUNDS / 2];
    char tgt[64];
    snprintf(tgt, sizeof tgt, "%s [%.2f-%.2f]", ratio <= 1.25 ? "ok" : "MISSED", r->vs_raw[0],
             r->vs_raw[ROW_ROUNDS - 1]);
    printf("%-40s %8.1f %8.1f %8.1f %7.2f %-21s %7.2f %7.2f  %s (raw: %s)\n",
           row_label(row_info[rk].row, row_info[rk].what), r->ns[SIDE_DLSYNC], r->ns[SIDE_RAW],
           r->ns[SIDE_FLOOR], ratio, tgt, r->floor_raw, r->own[ROW_ROUNDS / 2], row_info[rk].floor,
           row_info[rk].raw);
  }
}

/* ---- before and after: this build's libdlsync.so against an earlier one,
 * in the same run (DLSYNC_BASELINE_LIBRARY) ---- */

static void run_before_after(void) {
  enum { BA_ROUNDS = 15, BA = RK_COUNT + 2 };
  double r[BA][BA_ROUNDS], now[BA], was[BA];
  const char *names[BA];
  double tn[BA][BA_ROUNDS], tw[BA][BA_ROUNDS];
  /* Each pair in both orders (this first in even rounds, the baseline first
   * in odd ones), so that a drift of the host within a pair, or what the
   * first of the two leaves behind, does not favour either. */
  for (int k = 0; k < BA_ROUNDS; k++) {
    for (int turn = 0; turn < 2; turn++) {
      bool this_now = (turn == 0) == (k % 2 == 0);
      if (this_now) {
        tn[0][k] = time_op(op_so_eager);
        tn[1][k] = time_op(op_so_stable);
      } else {
        tw[0][k] = time_op(op_base_eager);
        tw[1][k] = time_op(op_base_stable);
      }
    }
    for (int rk = 0; rk < RK_COUNT; rk++) {
      for (int turn = 0; turn < 2; turn++) {
        bool this_now = (turn == 0) == (k % 2 == 0);
        row_lib = this_now ? &so : &base;
        (this_now ? tn : tw)[2 + rk][k] = time_row((row_kind)rk, SIDE_DLSYNC);
      }
      row_lib = NULL;
    }
  }
  names[0] = row_label(DLSYNC__ROW_EAGER_EAGER, "begin+end");
  names[1] = "  with CAPTURE_STABLE";
  for (int rk = 0; rk < RK_COUNT; rk++)
    names[2 + rk] = row_label(row_info[rk].row, row_info[rk].what);
  printf("\nbefore/after (ns per operation through each libdlsync.so, paired rounds of the same "
         "run, each pair in both orders; ratio: this build / the baseline, target <= 1.00, "
         "'noise' up to 1.03)\n");
  printf("  baseline: %s\n", getenv("DLSYNC_BASELINE_LIBRARY"));
  printf("%-44s %10s %10s %8s %s\n", "measure", "this", "baseline", "ratio", "[range]");
  for (int i = 0; i < BA; i++) {
    for (int k = 0; k < BA_ROUNDS; k++)
      r[i][k] = tn[i][k] / tw[i][k];
    now[i] = median(tn[i], BA_ROUNDS);
    was[i] = median(tw[i], BA_ROUNDS);
    double m = median(r[i], BA_ROUNDS);
    printf("%-44s %10.1f %10.1f %8.2f %s [%.2f-%.2f]\n", names[i], now[i], was[i], m,
           m <= 1.00   ? "not slower"
           : m <= 1.03 ? "noise"
                       : "SLOWER",
           r[i][0], r[i][BA_ROUNDS - 1]);
  }
}

/* ---- scale ---- */

/* ns per eager begin+end over n exchanges in one run; floor: the same
 * driver calls by hand (op_raw_with_queries) instead, which shows how much
 * the driver itself slows down over a long run (its queue of work fills). */
static double eager_run(long n, bool floor) {
  double t0 = gpu_now_ns();
  for (long i = 0; i < n; i++)
    floor ? op_raw_with_queries() : op_dlsync_eager();
  double t = (gpu_now_ns() - t0) / (double)n;
  D->CtxSynchronize();
  return t;
}

/* ns per exchange (begin+end only, each timed) inside one capture of n
 * exchanges, each between a tiny memset on P and one on C (the caller's own
 * nodes, 2 per exchange); *nodes: the captured graph's node count. use=false:
 * the raw fork+join instead of the exchange. */
static double capture_run(long n, bool use, size_t *nodes) {
  CUgraph g = NULL;
  double sum = 0;
  CHECK(D->StreamBeginCapture(P, CU_STREAM_CAPTURE_MODE_GLOBAL) == CUDA_SUCCESS, "capture");
  for (long i = 0; i < n; i++) {
    double t0;
    CHECK(D->MemsetD32Async(scale_buf, (unsigned)i, 1, P) == CUDA_SUCCESS, "memset");
    t0 = gpu_now_ns();
    if (use) {
      dlsync_lane lp = dlsync_lane_stream(P), lc = dlsync_lane_stream(C);
      dlsync_exchange *ex;
      CHECK(dlsync_exchange_begin(&ex, E.ctx, &lp, &lc) == DLSYNC_SUCCESS, "begin");
      sum += gpu_now_ns() - t0;
      CHECK(D->MemsetD32Async(scale_buf + 4, (unsigned)i, 1, C) == CUDA_SUCCESS, "memset");
      t0 = gpu_now_ns();
      CHECK(dlsync_exchange_end(ex) == DLSYNC_SUCCESS, "end");
    } else {
      CHECK(D->EventRecord(e1, P) == CUDA_SUCCESS, "record");
      CHECK(D->StreamWaitEvent(C, e1, 0) == CUDA_SUCCESS, "wait");
      sum += gpu_now_ns() - t0;
      CHECK(D->MemsetD32Async(scale_buf + 4, (unsigned)i, 1, C) == CUDA_SUCCESS, "memset");
      t0 = gpu_now_ns();
      CHECK(D->EventRecord(e2, C) == CUDA_SUCCESS, "record");
      CHECK(D->StreamWaitEvent(P, e2, 0) == CUDA_SUCCESS, "wait");
    }
    sum += gpu_now_ns() - t0;
  }
  CHECK(D->StreamEndCapture(P, &g) == CUDA_SUCCESS, "end capture");
  *nodes = 0;
  D->GraphGetNodes(g, NULL, nodes);
  D->GraphDestroy(g);
  return sum / (double)n;
}

/* The long runs three times each, dlsync's and the floor's in turn (each
 * first in one of them), and the medians: one long run of each, one after
 * the other, caught the host in different moods (0.52, 1.07 and 1.33 of the
 * short runs in three bench runs of one build: docs/performance.md, "Scale"). */
#define SCALE_LONG_RUNS 3

static void run_scale(void) {
  double e3[BATCHES], e6s[SCALE_LONG_RUNS], e6, f3[BATCHES], f6s[SCALE_LONG_RUNS], f6, c2[5],
      c4s[SCALE_LONG_RUNS], c4, r2[5], r4s[SCALE_LONG_RUNS], r4;
  size_t n2 = 0, n4 = 0, rn = 0;
  for (int b = 0; b < BATCHES; b++) {
    e3[b] = eager_run(1000, false);
    f3[b] = eager_run(1000, true);
  }
  for (int k = 0; k < SCALE_LONG_RUNS; k++) {
    if (k % 2 == 0) {
      e6s[k] = eager_run(1000000, false);
      f6s[k] = eager_run(1000000, true);
    } else {
      f6s[k] = eager_run(1000000, true);
      e6s[k] = eager_run(1000000, false);
    }
  }
  e6 = median(e6s, SCALE_LONG_RUNS);
  f6 = median(f6s, SCALE_LONG_RUNS);
  for (int b = 0; b < 5; b++) {
    c2[b] = capture_run(100, true, &n2);
    r2[b] = capture_run(100, false, &rn);
  }
  for (int k = 0; k < SCALE_LONG_RUNS; k++) {
    c4s[k] = capture_run(10000, true, &n4);
    r4s[k] = capture_run(10000, false, &rn);
  }
  c4 = median(c4s, SCALE_LONG_RUNS);
  r4 = median(r4s, SCALE_LONG_RUNS);
  double m3 = median(e3, BATCHES), mf3 = median(f3, BATCHES), m2 = median(c2, 5),
         mr2 = median(r2, 5);
  /* each long run's ratio, for the range: how much one run can move it */
  double ge[SCALE_LONG_RUNS], gf[SCALE_LONG_RUNS], gc[SCALE_LONG_RUNS], gr[SCALE_LONG_RUNS];
  for (int k = 0; k < SCALE_LONG_RUNS; k++) {
    ge[k] = e6s[k] / m3;
    gf[k] = f6s[k] / mf3;
    gc[k] = c4s[k] / m2;
    gr[k] = r4s[k] / mr2;
  }
  qsort(ge, SCALE_LONG_RUNS, sizeof ge[0], bench_cmp_double); /* [0] and [L]: the range */
  qsort(gf, SCALE_LONG_RUNS, sizeof gf[0], bench_cmp_double);
  qsort(gc, SCALE_LONG_RUNS, sizeof gc[0], bench_cmp_double);
  qsort(gr, SCALE_LONG_RUNS, sizeof gr[0], bench_cmp_double);
  enum { L = SCALE_LONG_RUNS - 1 };
  printf("\nscale (host ns per exchange, the long runs' median of %d; target: within 1.2 x of the "
         "small run, and no node in a captured graph beyond the caller's own)\n",
         SCALE_LONG_RUNS);
  printf("  eager, 10^6 exchanges vs 10^3:          %8.1f %8.1f %6.2f %s [%.2f-%.2f]\n", e6, m3,
         e6 / m3, e6 / m3 <= 1.2 ? "<= 1.20 ok" : "<= 1.20 MISSED", ge[0], ge[L]);
  printf(
      "  its floor there, 10^6 vs 10^3:          %8.1f %8.1f %6.2f [%.2f-%.2f] (the driver's own "
      "growth; dlsync's growth over it: %.2f)\n",
      f6, mf3, f6 / mf3, gf[0], gf[L], (e6 / m3) / (f6 / mf3));
  printf("  in one capture, 10^4 exchanges vs 10^2: %8.1f %8.1f %6.2f %s [%.2f-%.2f]\n", c4, m2,
         c4 / m2, c4 / m2 <= 1.2 ? "<= 1.20 ok" : "<= 1.20 MISSED", gc[0], gc[L]);
  printf(
      "  the raw fork+join there, 10^4 vs 10^2:  %8.1f %8.1f %6.2f [%.2f-%.2f] (the driver's own "
      "growth)\n",
      r4, mr2, r4 / mr2, gr[0], gr[L]);
  printf("  nodes in the graph of 10^4 exchanges:   %8zu (the caller's: %d) %s\n", n4, 2 * 10000,
         n4 == 2 * 10000 ? "ok" : "EXTRA NODES");
  printf("  nodes in the graph of 10^2 exchanges:   %8zu (the caller's: %d) %s\n", n2, 2 * 100,
         n2 == 2 * 100 ? "ok" : "EXTRA NODES");
}

/* ---- memory ---- */

static size_t heap_used(void) {
  struct mallinfo2 mi = mallinfo2();
  return mi.uordblks + mi.hblkhd;
}

typedef struct load_thread {
  CUstream p, c;
  int round;
} load_thread;

static pthread_barrier_t load_start, load_done;
static atomic_int load_stop;

/* A steady load: each round 2000 eager exchanges and one capture with 50
 * eager->capture orders (events into the graph, back when it goes). */
static void *load_main(void *arg) {
  load_thread *lt = arg;
  dlsync_lane lp = dlsync_lane_stream(lt->p), lc = dlsync_lane_stream(lt->c);
  CHECK(D->CtxPushCurrent(E.cuctx) == CUDA_SUCCESS, "context");
  for (;;) {
    pthread_barrier_wait(&load_start);
    if (atomic_load(&load_stop))
      return NULL;
    for (int i = 0; i < 2000; i++) {
      dlsync_exchange *ex;
      CHECK(dlsync_exchange_begin(&ex, E.ctx, &lp, &lc) == DLSYNC_SUCCESS, "begin");
      CHECK(dlsync_exchange_end(ex) == DLSYNC_SUCCESS, "end");
    }
    {
      CUgraph g = NULL;
      CHECK(D->StreamBeginCapture(lt->c, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL) == CUDA_SUCCESS,
            "capture");
      for (int i = 0; i < 50; i++)
        CHECK(dlsync_order(E.ctx, &lp, &lc) == DLSYNC_SUCCESS, "order");
      CHECK(D->StreamEndCapture(lt->c, &g) == CUDA_SUCCESS, "end capture");
      D->GraphDestroy(g);
    }
    pthread_barrier_wait(&load_done);
  }
}

static size_t thread_bytes;
static void *first_exchange_main(void *arg) {
  dlsync_lane lp = dlsync_lane_stream(P), lc = dlsync_lane_stream(C);
  dlsync_exchange *ex;
  size_t before = dlsync__alloc_live_bytes();
  (void)arg;
  CHECK(dlsync_exchange_begin(&ex, E.ctx, &lp, &lc) == DLSYNC_SUCCESS, "begin");
  CHECK(dlsync_exchange_end(ex) == DLSYNC_SUCCESS, "end");
  thread_bytes = dlsync__alloc_live_bytes() - before;
  return NULL;
}

static void run_memory(void) {
  enum { NT = 8, LOAD_ROUNDS = 8, NEV = 1000 };
  dlsync_context *c2 = NULL;
  size_t before, ctx_bytes, ev_dlsync, ev_raw;
  pthread_t th[NT];
  load_thread lt[NT];
  dlsync__pool_stats ps0, ps;
  CUevent evs[NEV];
  /* An idle context: created, not used (dlsync's own bytes). */
  before = dlsync__alloc_live_bytes();
  CHECK(dlsync_context_create(&c2, NULL) == DLSYNC_SUCCESS, "context");
  ctx_bytes = dlsync__alloc_live_bytes() - before;
  dlsync_context_destroy(c2);
  /* The driver's own host memory per event. */
  before = heap_used();
  for (int i = 0; i < NEV; i++)
    CHECK(D->EventCreate(&evs[i], CU_EVENT_DISABLE_TIMING) == CUDA_SUCCESS, "event");
  ev_raw = heap_used() - before;
  for (int i = 0; i < NEV; i++)
    D->EventDestroy(evs[i]);
  /* Per pooled event: NEV more events in the pool (given to a capture, back
   * when its graph goes). */
  dlsync__pool_stats_get(&ps0, &E.ctx->pools);
  before = dlsync__alloc_live_bytes();
  {
    dlsync_lane lp = dlsync_lane_stream(P), lc = dlsync_lane_stream(C);
    CUgraph g = NULL;
    CHECK(D->StreamBeginCapture(C, CU_STREAM_CAPTURE_MODE_RELAXED) == CUDA_SUCCESS, "capture");
    for (size_t i = 0; i < ps0.free_events + NEV; i++)
      CHECK(dlsync_order(E.ctx, &lp, &lc) == DLSYNC_SUCCESS, "order");
    CHECK(D->StreamEndCapture(C, &g) == CUDA_SUCCESS, "end capture");
    D->GraphDestroy(g);
    wait_events_back();
  }
  dlsync__pool_stats_get(&ps, &E.ctx->pools);
  ev_dlsync = dlsync__alloc_live_bytes() - before;
  pthread_create(&th[0], NULL, first_exchange_main, NULL);
  pthread_join(th[0], NULL);
  printf("\nmemory (dlsync's own host bytes, as its allocation function counts them; the "
         "driver's separately)\n");
  printf("  an idle context:                         %8zu\n", ctx_bytes);
  printf(
      "  per pooled event (%zu made):            %8.0f (the driver's own per event, heap: %.0f)\n",
      ps.created - ps0.created,
      (double)ev_dlsync / (double)(ps.created > ps0.created ? ps.created - ps0.created : 1),
      (double)ev_raw / NEV);
  printf("  per thread: block %zu B (thread-local) + %zu B heap at its first exchange\n",
         sizeof(dlsync__thread), thread_bytes);
  /* The steady 8-thread load. */
  pthread_barrier_init(&load_start, NULL, NT + 1);
  pthread_barrier_init(&load_done, NULL, NT + 1);
  for (int i = 0; i < NT; i++) {
    CHECK(D->StreamCreate(&lt[i].p, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS, "stream");
    CHECK(D->StreamCreate(&lt[i].c, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS, "stream");
    pthread_create(&th[i], NULL, load_main, &lt[i]);
  }
  printf("  8 threads, each round 2000 eager exchanges + 50 orders into a capture each:\n");
  printf("  %5s %12s %12s %12s %14s\n", "round", "events made", "in the pool", "held",
         "dlsync bytes");
  for (int r = 0; r < LOAD_ROUNDS; r++) {
    pthread_barrier_wait(&load_start);
    pthread_barrier_wait(&load_done);
    D->CtxSynchronize();
    wait_events_back();
    dlsync__pool_stats_get(&ps, &E.ctx->pools);
    printf("  %5d %12zu %12zu %12zu %14zu\n", r + 1, ps.created, ps.free_events, ps.graph_owned,
           dlsync__alloc_live_bytes());
  }
  atomic_store(&load_stop, 1);
  pthread_barrier_wait(&load_start);
  for (int i = 0; i < NT; i++) {
    pthread_join(th[i], NULL);
    D->StreamDestroy(lt[i].p);
    D->StreamDestroy(lt[i].c);
  }
}

/* Replay of a chain of CHAIN exchanges (producer memset, consumer copy),
 * captured through dlsync, against a hand-built graph with the same nodes and
 * only the edges the order needs. Returns microseconds per replay. */
static double replay_us(CUgraphExec x) {
  double t[BATCHES];
  for (int i = 0; i < 20; i++)
    D->GraphLaunch(x, P);
  D->StreamSynchronize(P);
  for (int b = 0; b < BATCHES; b++) {
    double t0 = gpu_now_ns();
    for (int r = 0; r < REPLAYS / 10; r++)
      CHECK(D->GraphLaunch(x, P) == CUDA_SUCCESS, "launch");
    CHECK(D->StreamSynchronize(P) == CUDA_SUCCESS, "sync");
    t[b] = (gpu_now_ns() - t0) / (REPLAYS / 10) / 1000.0;
  }
  return median(t, BATCHES);
}

static void replay_compare(double *captured_us, double *built_us, size_t *captured_nodes,
                           size_t *built_nodes) {
  const size_t words = 1 << 18; /* 1 MiB per memset */
  CUdeviceptr bufs, outs;
  CUgraph gc = NULL, gb = NULL;
  CUgraphExec xc = NULL, xb = NULL;
  CUgraphNode prev = NULL;
  CHECK(D->MemAlloc(&bufs, CHAIN * words * 4) == CUDA_SUCCESS, "alloc");
  CHECK(D->MemAlloc(&outs, CHAIN * 4) == CUDA_SUCCESS, "alloc");
  /* Captured: memset on P, exchange, copy on C, end. */
  CHECK(D->StreamBeginCapture(P, CU_STREAM_CAPTURE_MODE_GLOBAL) == CUDA_SUCCESS, "capture");
  for (int k = 0; k < CHAIN; k++) {
    dlsync_lane lp = dlsync_lane_stream(P), lc = dlsync_lane_stream(C);
    dlsync_exchange *ex;
    CUdeviceptr b = bufs + (CUdeviceptr)k * words * 4;
    CHECK(D->MemsetD32Async(b, (unsigned)k, words, P) == CUDA_SUCCESS, "memset");
    CHECK(dlsync_exchange_begin(&ex, E.ctx, &lp, &lc) == DLSYNC_SUCCESS, "begin");
    CHECK(D->MemcpyDtoDAsync(outs + (CUdeviceptr)k * 4, b + (words - 1) * 4, 4, C) == CUDA_SUCCESS,
          "copy");
    CHECK(dlsync_exchange_end(ex) == DLSYNC_SUCCESS, "end");
  }
  CHECK(D->StreamEndCapture(P, &gc) == CUDA_SUCCESS, "end capture");
  /* Hand-built: memset_k -> copy_k -> memset_k+1. */
  CHECK(D->GraphCreate(&gb, 0) == CUDA_SUCCESS, "graph");
  for (int k = 0; k < CHAIN; k++) {
    CUDA_MEMSET_NODE_PARAMS mp;
    CUDA_MEMCPY3D cp;
    CUgraphNode m, c;
    CUdeviceptr b = bufs + (CUdeviceptr)k * words * 4;
    memset(&mp, 0, sizeof mp);
    mp.dst = b;
    mp.value = (unsigned)k;
    mp.elementSize = 4;
    mp.width = words;
    mp.height = 1;
    CHECK(D->GraphAddMemsetNode(&m, gb, prev ? &prev : NULL, prev ? 1 : 0, &mp, E.cuctx) ==
              CUDA_SUCCESS,
          "memset node");
    memset(&cp, 0, sizeof cp);
    cp.srcMemoryType = CU_MEMORYTYPE_DEVICE;
    cp.srcDevice = b + (words - 1) * 4;
    cp.dstMemoryType = CU_MEMORYTYPE_DEVICE;
    cp.dstDevice = outs + (CUdeviceptr)k * 4;
    cp.WidthInBytes = 4;
    cp.Height = 1;
    cp.Depth = 1;
    CHECK(D->GraphAddMemcpyNode(&c, gb, &m, 1, &cp, E.cuctx) == CUDA_SUCCESS, "copy node");
    prev = c;
  }
  *captured_nodes = 0;
  *built_nodes = 0;
  D->GraphGetNodes(gc, NULL, captured_nodes);
  D->GraphGetNodes(gb, NULL, built_nodes);
  CHECK(D->GraphInstantiateWithFlags(&xc, gc, 0) == CUDA_SUCCESS, "instantiate");
  CHECK(D->GraphInstantiateWithFlags(&xb, gb, 0) == CUDA_SUCCESS, "instantiate");
  /* Interleave to share any drift; take each one's median. */
  *captured_us = replay_us(xc);
  *built_us = replay_us(xb);
  {
    double c2 = replay_us(xc), b2 = replay_us(xb);
    *captured_us = (*captured_us + c2) / 2;
    *built_us = (*built_us + b2) / 2;
  }
  D->GraphExecDestroy(xc);
  D->GraphExecDestroy(xb);
  D->GraphDestroy(gc);
  D->GraphDestroy(gb);
  D->MemFree(bufs);
  D->MemFree(outs);
}

int main(void) {
  int rc;
  dlsync__alloc_count_start(); /* the memory figures: before anything is allocated */
  rc = gpu_env_init(&E);
  double raw_one = 0, raw_queries = 0;
  double raw_one_query = 0;
  row_result rows[RK_COUNT];
  double ratio_eager[ROUNDS], ratio_same[ROUNDS], ratio_per[ROUNDS];
  double ratio_stable[ROUNDS], ratio_per_stable[ROUNDS];
  double ratio_so[ROUNDS], ratio_so_stable[ROUNDS];
  /* the floors over the raw calls, dlsync over its floors (own cost) */
  double ratio_floor[ROUNDS], ratio_floor_stable[ROUNDS], ratio_own[ROUNDS],
      ratio_own_stable[ROUNDS];
  double rf, rfst, ro, rost;
  double so_eager = 0, so_stable = 0, rso = 0, rsost = 0;
  char so_path[4200];
  bool have_so, have_base;
  double re, rs, rp, rst, rpst;
  double q, same, raw, eager, stable, per_call, rc_us, rb_us;
  size_t nc = 0, nb = 0;
  if (rc != 0)
    return rc;
  D = E.d;
  {
    /* One core for the whole run: no migrations inside a batch. */
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(sched_getcpu() >= 0 ? sched_getcpu() : 0, &set);
    sched_setaffinity(0, sizeof set, &set);
  }
  CHECK(D->StreamCreate(&P, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS, "stream");
  CHECK(D->StreamCreate(&C, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS, "stream");
  CHECK(D->EventCreate(&e1, CU_EVENT_DISABLE_TIMING) == CUDA_SUCCESS, "event");
  CHECK(D->EventCreate(&e2, CU_EVENT_DISABLE_TIMING) == CUDA_SUCCESS, "event");
  have_so = so_load(so_path, sizeof so_path);
  have_base = have_so && getenv("DLSYNC_BASELINE_LIBRARY") != NULL &&
              so_open(&base, getenv("DLSYNC_BASELINE_LIBRARY"));
  if (getenv("DLSYNC_BENCH_BEFORE_AFTER_ONLY") != NULL) {
    /* The before/after table alone (scripts/gpu-check.sh: this build against
     * a copy of itself, the table's own noise). */
    if (!have_base) {
      printf("before/after: no baseline library (DLSYNC_BASELINE_LIBRARY)\n");
      return 1;
    }
    for (int i = 0; i < K_ROWS; i++)
      CHECK(D->EventCreate(&kev[i], CU_EVENT_DISABLE_TIMING) == CUDA_SUCCESS, "event");
    run_before_after();
    for (int i = 0; i < K_ROWS; i++)
      D->EventDestroy(kev[i]);
    so.context_destroy(so.ctx);
    base.context_destroy(base.ctx);
    dlsync_context_destroy(E.ctx);
    return 0;
  }

  if (getenv("DLSYNC_BENCH_FANOUT_ONLY") != NULL) { /* the fan-out rows alone */
    CHECK(D->MemAlloc(&scale_buf, 8) == CUDA_SUCCESS, "alloc");
    run_fanout();
    D->MemFree(scale_buf);
    dlsync_context_destroy(E.ctx);
    return 0;
  }

  if (getenv("DLSYNC_BENCH_LAUNCH_ONLY") != NULL) { /* the in-capture launch alone */
    CHECK(D->MemAlloc(&scale_buf, 8) == CUDA_SUCCESS, "alloc");
    run_launch();
    D->MemFree(scale_buf);
    dlsync_context_destroy(E.ctx);
    return 0;
  }

  /* ROUNDS rounds, each measuring every operation in turn. The machine has
   * slow phases that last several batches (the raw calls alone moving by
   * 1.5x: docs/performance.md, "Paired rounds"), so each ratio is taken within a round,
   * between operations measured one after the other, and the median of the
   * per-round ratios is reported with their range. */
  {
    double r_q[ROUNDS], r_same[ROUNDS], r_raw[ROUNDS], r_eager[ROUNDS], r_per[ROUNDS];
    double r_one[ROUNDS], r_rq[ROUNDS], r_stable[ROUNDS], r_r1[ROUNDS];
    double r_so[ROUNDS], r_sost[ROUNDS];
    for (int k = 0; k < ROUNDS; k++) {
      /* dlsync's eager exchange between the raw calls and its floor, which
       * swap places every other round (so a drift within the round moves
       * neither ratio one way); CAPTURE_STABLE beside its floor likewise. */
      bool swap = k % 2 == 1;
      r_q[k] = time_op(op_query);
      r_same[k] = time_op(op_same_stream);
      if (swap)
        r_rq[k] = time_op(op_raw_with_queries);
      else
        r_raw[k] = time_op(op_raw_fork_join);
      r_eager[k] = time_op(op_dlsync_eager);
      if (swap)
        r_raw[k] = time_op(op_raw_fork_join);
      else
        r_rq[k] = time_op(op_raw_with_queries);
      if (swap)
        r_r1[k] = time_op(op_raw_with_one_query);
      r_stable[k] = time_op(op_dlsync_stable);
      if (!swap)
        r_r1[k] = time_op(op_raw_with_one_query);
      r_per[k] = time_op(op_event_per_call);
      r_one[k] = time_op(op_raw_fork_join_one_event);
      r_so[k] = have_so ? time_op(op_so_eager) : 0;
      r_sost[k] = have_so ? time_op(op_so_stable) : 0;
    }
    for (int k = 0; k < ROUNDS; k++) {
      ratio_own[k] = r_eager[k] / r_rq[k];
      ratio_own_stable[k] = r_stable[k] / r_r1[k];
      ratio_floor[k] = r_rq[k] / r_raw[k];
      ratio_floor_stable[k] = r_r1[k] / r_raw[k];
      ratio_eager[k] = r_eager[k] / r_raw[k];
      ratio_same[k] = r_same[k] / r_q[k];
      ratio_per[k] = r_per[k] / r_eager[k];
      ratio_stable[k] = r_stable[k] / r_raw[k];
      ratio_per_stable[k] = r_per[k] / r_stable[k];
      ratio_so[k] = r_so[k] / r_raw[k];
      ratio_so_stable[k] = r_sost[k] / r_raw[k];
    }
    so_eager = median(r_so, ROUNDS);
    so_stable = median(r_sost, ROUNDS);
    rso = median(ratio_so, ROUNDS);
    rsost = median(ratio_so_stable, ROUNDS);
    raw_one_query = median(r_r1, ROUNDS);
    stable = median(r_stable, ROUNDS);
    raw_one = median(r_one, ROUNDS);
    raw_queries = median(r_rq, ROUNDS);
    q = median(r_q, ROUNDS);
    same = median(r_same, ROUNDS);
    raw = median(r_raw, ROUNDS);
    eager = median(r_eager, ROUNDS);
    per_call = median(r_per, ROUNDS);
  }
  for (int i = 0; i < K_ROWS; i++)
    CHECK(D->EventCreate(&kev[i], CU_EVENT_DISABLE_TIMING) == CUDA_SUCCESS, "event");
  CHECK(D->MemAlloc(&scale_buf, 8) == CUDA_SUCCESS, "alloc");
  /* The context of the graph lanes' pool: device 0's, current already. */
  run_rows(rows);
  replay_compare(&rc_us, &rb_us, &nc, &nb);
  CHECK(dlsync__pool_for_stream(&bench_pool, NULL, &E.ctx->pools, P, "bench") == DLSYNC_SUCCESS,
        "pool");
  {
    struct {
      const char *name;
      op_fn fn;
    } parts[] = {{"cuStreamGetCaptureInfo", op_query},
                 {"cuStreamIsCapturing", op_is_capturing},
                 {"cuStreamGetCtx", op_get_ctx},
                 {"malloc+free (128 B)", op_malloc_free},
                 {"dlsync pool get+put", op_pool_get_put},
                 {"cuEventRecord+cuStreamWaitEvent", op_record_wait}};
    printf("\nparts (host ns per call, median of %d x %d)\n", BATCHES, OPS);
    for (size_t i = 0; i < sizeof parts / sizeof parts[0]; i++)
      printf("  %-40s %8.1f\n", parts[i].name, time_op(parts[i].fn));
  }

  rs = median(ratio_same, ROUNDS);
  re = median(ratio_eager, ROUNDS);
  rp = median(ratio_per, ROUNDS);
  rst = median(ratio_stable, ROUNDS);
  rpst = median(ratio_per_stable, ROUNDS);
  printf("\ndlsync bench on %s (host ns per operation: medians over %d rounds of %d batches of "
         "%d; ratios: median of the per-round ratios [min-max])\n",
         E.name, ROUNDS, BATCHES, OPS);
  printf("%-44s %10s %10s %8s %s\n", "measure", "dlsync", "baseline", "ratio", "target");
  printf("%-44s %10.1f %10.1f %8.2f %s [%.2f-%.2f]\n",
         row_label(DLSYNC__ROW_SAME_STREAM, "begin+end vs one query"), same, q, rs,
         rs <= 2.0 ? "<= 2.00 ok" : "<= 2.00 MISSED", ratio_same[0], ratio_same[ROUNDS - 1]);
  printf("%-44s %10.1f %10.1f %8.2f %s [%.2f-%.2f]\n",
         row_label(DLSYNC__ROW_EAGER_EAGER, "begin+end vs raw fork+join"), eager, raw, re,
         re <= 1.10 ? "<= 1.10 ok" : "<= 1.10 MISSED", ratio_eager[0], ratio_eager[ROUNDS - 1]);
  printf("%-44s %10.1f %10.1f %8.2f %s [%.2f-%.2f]\n", "  with CAPTURE_STABLE vs raw fork+join",
         stable, raw, rst, rst <= 1.10 ? "<= 1.10 ok" : "<= 1.10 MISSED", ratio_stable[0],
         ratio_stable[ROUNDS - 1]);
  if (have_so) {
    printf("%-44s %10.1f %10.1f %8.2f %s [%.2f-%.2f]\n", "  through libdlsync.so vs raw fork+join",
           so_eager, raw, rso, rso <= 1.10 ? "<= 1.10 ok" : "<= 1.10 MISSED", ratio_so[0],
           ratio_so[ROUNDS - 1]);
    printf("%-44s %10.1f %10.1f %8.2f %s [%.2f-%.2f]\n", "  libdlsync.so, CAPTURE_STABLE vs raw",
           so_stable, raw, rsost, rsost <= 1.10 ? "<= 1.10 ok" : "<= 1.10 MISSED",
           ratio_so_stable[0], ratio_so_stable[ROUNDS - 1]);
  } else {
    printf("  (libdlsync.so not loaded from %s: %s)\n", so_path, dlerror());
  }
  printf("%-44s %10.1f %10.1f %8.2f %s\n", "  raw fork+join with one event vs two", raw_one, raw,
         raw_one / raw, "(reference)");
  rf = median(ratio_floor, ROUNDS);
  rfst = median(ratio_floor_stable, ROUNDS);
  ro = median(ratio_own, ROUNDS);
  rost = median(ratio_own_stable, ROUNDS);
  printf("%-44s %10.1f %10.1f %8.2f [%.2f-%.2f] %s\n",
         "  raw fork+join + its 3 status queries vs raw", raw_queries, raw, rf, ratio_floor[0],
         ratio_floor[ROUNDS - 1], "(the floor of asking at each call)");
  printf("%-44s %10.1f %10.1f %8.2f [%.2f-%.2f] %s\n", "  raw fork+join + 1 status query vs raw",
         raw_one_query, raw, rfst, ratio_floor_stable[0], ratio_floor_stable[ROUNDS - 1],
         "(the floor with CAPTURE_STABLE)");
  printf("%-44s %10.1f %10.1f %8.2f %s [%.2f-%.2f] (dlsync's own cost)\n",
         "  eager begin+end vs its floor", eager, raw_queries, ro,
         ro <= 1.03 ? "<= 1.03 ok" : "<= 1.03 MISSED", ratio_own[0], ratio_own[ROUNDS - 1]);
  printf("%-44s %10.1f %10.1f %8.2f [%.2f-%.2f] (dlsync's own cost)\n",
         "  with CAPTURE_STABLE vs its floor", stable, raw_one_query, rost, ratio_own_stable[0],
         ratio_own_stable[ROUNDS - 1]);
  printf("%-44s %10.1f %10.1f %8.2f %s [%.2f-%.2f]\n", "eager begin+end vs event created per call",
         eager, per_call, rp, rp >= 1.5 ? "speedup >= 1.50 ok" : "speedup >= 1.50 MISSED",
         ratio_per[0], ratio_per[ROUNDS - 1]);
  printf("%-44s %10.1f %10.1f %8.2f %s [%.2f-%.2f]\n", "  with CAPTURE_STABLE vs event per call",
         stable, per_call, rpst, rpst >= 1.5 ? "speedup >= 1.50 ok" : "speedup >= 1.50 MISSED",
         ratio_per_stable[0], ratio_per_stable[ROUNDS - 1]);
  printf("%-44s %10.2f %10.2f %8.3f %s\n", "replay us: captured chain vs hand-built", rc_us, rb_us,
         rc_us / rb_us, rc_us / rb_us <= 1.05 ? "<= 1.05 ok" : "<= 1.05 MISSED");
  printf("%-44s %10zu %10zu\n", "  nodes in the two graphs", nc, nb);
  print_rows(rows);
  run_fanout();
  run_capture_add();
  run_two_captures_flags();
  run_split();
  run_launch();
  if (have_base)
    run_before_after();
  else if (getenv("DLSYNC_BASELINE_LIBRARY") != NULL)
    printf("\nbefore/after: the baseline %s did not load: %s\n", getenv("DLSYNC_BASELINE_LIBRARY"),
           dlerror());
  run_scale();
  run_memory();
  D->MemFree(scale_buf);
  for (int i = 0; i < K_ROWS; i++)
    D->EventDestroy(kev[i]);
  if (have_so)
    so.context_destroy(so.ctx);
  if (have_base)
    base.context_destroy(base.ctx);
  dlsync_context_destroy(E.ctx);
  return 0;
}
