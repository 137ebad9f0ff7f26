/* SPDX-License-Identifier: Apache-2.0 */
/* libFuzzer harness over the fake driver (issue 13).
 *
 * Each input is a little program: bytes pick operations (dlsync_order,
 * exchange begin (one producer or many)/end, fence signal/wait/release, dlsync_release, flush),
 * their lanes (streams of both kinds, the special handles, captures begun and
 * ended, graphs built by hand with fuzzed deps and capacity, bad lanes) and
 * their flags, plus one fault: a driver call of the fake failing (op 0), or
 * one of dlsync's allocations (op 16), counted from there on.
 * A program with a fault op runs twice: once with the op ignored (the
 * baseline: each operation's status), then with the fault. After each run
 * everything is ended and released, and the invariants are checked; a
 * broken one aborts (a crash for libFuzzer):
 *  - an allocation that failed during an operation was done without (the
 *    operation's status is the baseline's) or reported (OUT_OF_MEMORY, "out
 *    of memory");
 *  - no call illegal during a capture was made (fake_illegal_calls);
 *  - the pool is intact: no event still held by a graph or fence, what the
 *    pools count as alive is what the fake has, and every event is back in
 *    its pool;
 *  - every deleter of a successful release ran exactly once, none of a failed
 *    one;
 *  - the context is destroyed cleanly and nothing leaked (the fake's leak
 *    report), after an allocation fault too; after a driver-call fault
 *    unless the call that failed was a cuEventDestroy or a
 *    cuUserObjectRelease, whose object the driver keeps (see finish).
 * Build: -DDLSYNC_BUILD_FUZZ=ON with CC=clang (scripts/dev.sh test runs it). */
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "order/internal.h"
#include "fake/fake_driver.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define NLANES 8
#define NSLOTS 4
#define NRELEASES 32
#define NGRAPHS 3
#define NSTEPS 512     /* more than an input of 512 bytes can make (2 bytes at least each) */
#define NO_STATUS (-1) /* a step that made no dlsync call */

typedef struct input {
  const uint8_t *p;
  size_t n;
} input;

static unsigned take(input *in) {
  if (in->n == 0)
    return 0;
  in->n--;
  return *in->p++;
}

static void check(bool ok, const char *what) {
  if (!ok) {
    fprintf(stderr, "fuzz invariant broken: %s (last error: %s)\n", what, dlsync_last_error());
    abort();
  }
}

static atomic_int deleter_calls[NRELEASES];

static void deleter(void *arg) {
  atomic_fetch_add(&deleter_calls[(uintptr_t)arg], 1);
}

static const CUresult faults[] = {
    CUDA_ERROR_UNKNOWN,        CUDA_ERROR_INVALID_VALUE,
    CUDA_ERROR_INVALID_HANDLE, CUDA_ERROR_INVALID_CONTEXT,
    CUDA_ERROR_OUT_OF_MEMORY,  CUDA_ERROR_STREAM_CAPTURE_INVALIDATED,
    CUDA_ERROR_NOT_PERMITTED,  CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED,
};

typedef struct world {
  const dlsync__driver *d;
  dlsync_context *ctx;
  CUstream streams[3]; /* non-blocking, non-blocking, blocking */
  bool capturing[3];
  CUgraph graphs[NGRAPHS];
  CUgraphNode deps[NLANES][4];
  dlsync_lane lanes[NLANES]; /* stable storage: exchanges keep pointers to graph lanes */
  dlsync_exchange *ex[NSLOTS];
  dlsync_fence *fences[NSLOTS];
  int expected[NRELEASES];
  unsigned nreleases;
  bool faulty; /* this run arms the input's fault (else: the baseline run) */
  bool fault_armed;
  bool fault_used; /* one fault per input: the invariants hold for any single fault */
  bool fault_fired;
  bool fault_alloc;       /* the fault is an allocation's */
  unsigned long fault_at; /* driver calls made when it was armed */
  unsigned fault_n;       /* the nth call (or allocation) from there */
  int st;                 /* this step's dlsync status, NO_STATUS when none */
  bool st_reported;       /* fake_fault_reported(FAKE_FAULT_ALLOC) right after that call */
  int *baseline;          /* NSTEPS statuses of the baseline run */
} world;

/* The status of the dlsync call a step makes (its first one). */
static void note(world *w, dlsync_status st) {
  w->st = (int)st;
  w->st_reported = fake_fault_reported(FAKE_FAULT_ALLOC);
}

static void sleep_ms(int ms) {
  struct timespec ts = {0, (long)ms * 1000000L};
  nanosleep(&ts, NULL);
}

/* The harness's own destroys: a fault armed for dlsync may hit them (one
 * shot); trying again keeps the harness from leaking what dlsync did not. */
static void graph_destroy(const dlsync__driver *d, CUgraph g) {
  if (d->GraphDestroy(g) != CUDA_SUCCESS)
    (void)d->GraphDestroy(g);
}

/* A lane in slot i, made from the input. */
static dlsync_lane *lane_of(world *w, input *in) {
  unsigned i = take(in) % NLANES;
  unsigned what = take(in);
  dlsync_lane *l = &w->lanes[i];
  switch (what % 8) {
  case 0:
  case 1:
  case 2:
    *l = dlsync_lane_stream(w->streams[what % 3]);
    break;
  case 3:
    *l = dlsync_lane_stream((what & 8) ? CU_STREAM_LEGACY : CU_STREAM_PER_THREAD);
    break;
  case 4:
  case 5: {
    unsigned g = take(in) % NGRAPHS;
    unsigned nd = take(in) % 3;
    unsigned cap = take(in) % 5;
    if (w->graphs[g] == NULL)
      break; /* keep the old lane */
    for (unsigned k = 0; k < nd; k++)
      w->deps[i][k] = fake_graph_add_work(w->graphs[g], NULL, 0, "work");
    if (nd == 2 && (what & 16))
      w->deps[i][1] = w->deps[i][0]; /* a duplicate */
    *l = dlsync_lane_graph(w->graphs[g], (what & 32) ? NULL : w->deps[i], nd, cap);
    break;
  }
  case 6:
    /* A bad lane: an unknown kind, or both a stream and a graph. */
    memset(l, 0, sizeof *l);
    l->kind = (dlsync_lane_kind)(what >> 3);
    l->stream = w->streams[0];
    l->graph = w->graphs[0];
    break;
  default:
    break; /* as it was (possibly zeroed: DLSYNC_LANE_NONE) */
  }
  return l;
}

static void step(world *w, input *in) {
  const dlsync__driver *d = w->d;
  unsigned op = take(in);
  unsigned s = take(in) % NSLOTS;
  switch (op % 16) {
  case 0:
    /* op 0: a driver call fails; op 16 (and any with that bit): an
     * allocation. The baseline run reads the same bytes and arms nothing. */
    if (!w->fault_used) {
      unsigned n = take(in), r = take(in);
      w->fault_used = true;
      if (!w->faulty)
        break;
      w->fault_alloc = (op & 16) != 0;
      w->fault_at = fake_calls_total();
      if (w->fault_alloc) {
        w->fault_n = 1 + n % 16;
        fake_fail_fault(FAKE_FAULT_ALLOC, w->fault_n);
      } else {
        w->fault_n = 1 + n % 24;
        fake_fail_call(w->fault_n, faults[r % (sizeof faults / sizeof faults[0])]);
      }
      w->fault_armed = true;
    }
    break;
  case 1: {
    unsigned k = take(in) % 3;
    CUstreamCaptureMode modes[] = {CU_STREAM_CAPTURE_MODE_GLOBAL,
                                   CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
                                   CU_STREAM_CAPTURE_MODE_RELAXED};
    if (!w->capturing[k] &&
        d->StreamBeginCapture(w->streams[k], modes[take(in) % 3]) == CUDA_SUCCESS)
      w->capturing[k] = true;
    break;
  }
  case 2: {
    unsigned k = take(in) % 3;
    CUgraph g = NULL;
    if (w->capturing[k]) {
      (void)d->StreamEndCapture(w->streams[k], &g);
      w->capturing[k] = fake_capture_id(w->streams[k]) != 0; /* a fault leaves it going */
      if (g != NULL && (take(in) & 1)) {
        CUgraphExec e = NULL;
        if (d->GraphInstantiateWithFlags(&e, g, 0) == CUDA_SUCCESS) {
          (void)d->GraphLaunch(e, w->streams[take(in) % 3]);
          if (d->GraphExecDestroy(e) != CUDA_SUCCESS)
            (void)d->GraphExecDestroy(e);
        }
      }
      if (g != NULL)
        graph_destroy(d, g);
    }
    break;
  }
  case 3: {
    unsigned g = take(in) % NGRAPHS;
    if (w->graphs[g] != NULL) {
      graph_destroy(d, w->graphs[g]);
      w->graphs[g] = NULL;
      /* Lanes naming it are left as they are: a destroyed graph is bad input. */
    } else {
      (void)d->GraphCreate(&w->graphs[g], 0);
    }
    break;
  }
  case 4:
  case 5: {
    dlsync_lane *a = lane_of(w, in), *b = lane_of(w, in);
    note(w, dlsync_order(w->ctx, a, b));
    break;
  }
  case 6:
  case 7: {
    dlsync_lane *a = lane_of(w, in), *b = lane_of(w, in);
    unsigned fb = take(in);
    uint32_t flags = (fb & 4) ? 2u : (uint32_t)(fb & 1); /* 2: an unknown flag */
    if (w->ex[s] == NULL) {
      dlsync_exchange *ex = NULL;
      dlsync_status st;
      if (fb & 8) { /* many producers: a run of lanes from a (0 to 3 of them) */
        size_t first = (size_t)(a - w->lanes), n = (fb >> 4) % 4;
        if (n > NLANES - first)
          n = NLANES - first;
        st = dlsync_exchange_begin_many(&ex, w->ctx, a, n, b, flags);
      } else {
        st = dlsync_exchange_begin_flags(&ex, w->ctx, a, b, flags);
      }
      note(w, st);
      check((st == DLSYNC_SUCCESS) == (ex != NULL), "begin: *out set iff success");
      w->ex[s] = ex;
    }
    break;
  }
  case 8: {
    if (w->ex[s] != NULL) {
      dlsync_exchange *ex = w->ex[s];
      note(w, dlsync_exchange_end(ex));
      w->ex[s] = NULL;
      if (take(in) & 1) /* misuse: ended again */
        check(dlsync_exchange_end(ex) == DLSYNC_ERROR_INVALID_ARGUMENT, "a second end refused");
    }
    break;
  }
  case 9:
    if (w->fences[s] == NULL) {
      dlsync_fence *f = NULL;
      dlsync_status st = dlsync_fence_signal(&f, w->ctx, lane_of(w, in));
      note(w, st);
      check((st == DLSYNC_SUCCESS) == (f != NULL), "signal: *out set iff success");
      w->fences[s] = f;
    }
    break;
  case 10:
    if (w->fences[s] != NULL)
      note(w, dlsync_fence_wait(w->fences[s], lane_of(w, in)));
    break;
  case 11:
    dlsync_fence_release(w->fences[s]);
    w->fences[s] = NULL;
    break;
  case 12:
    if (w->nreleases < NRELEASES) {
      unsigned r = w->nreleases++;
      dlsync_status st = dlsync_release(w->ctx, lane_of(w, in), deleter, (void *)(uintptr_t)r);
      note(w, st);
      w->expected[r] = st == DLSYNC_SUCCESS ? 1 : 0;
    }
    break;
  case 13:
    fake_work(w->streams[take(in) % 3], "work", NULL);
    break;
  case 14: {
    CUcontext cur = NULL;
    if (take(in) & 1)
      (void)d->CtxPushCurrent(fake_primary_ctx(0));
    else if (d->CtxGetCurrent(&cur) == CUDA_SUCCESS && cur != NULL)
      (void)d->CtxPopCurrent(&cur);
    break;
  }
  default:
    note(w, dlsync_release_flush(w->ctx));
    break;
  }
}

/* One step, and the allocation invariant: when the allocation fault fired
 * during a dlsync call of this step (or, with the reclaimer thread, while it
 * ran), the call's status is the baseline's (done without) or says so. */
static void run_step(world *w, input *in, size_t k) {
  bool armed = w->fault_armed;
  w->st = NO_STATUS;
  step(w, in);
  if (!w->faulty) {
    w->baseline[k] = w->st;
    return;
  }
  if (w->fault_armed && !fake_fail_pending()) {
    w->fault_fired = true;
    w->fault_armed = false;
    if (armed && w->fault_alloc && w->st != NO_STATUS && w->st != w->baseline[k] &&
        !(w->st == DLSYNC_ERROR_OUT_OF_MEMORY && w->st_reported)) {
      fprintf(stderr, "step %zu: %s, without the fault %s\n", k,
              dlsync_status_name((dlsync_status)w->st),
              w->baseline[k] == NO_STATUS ? "no call"
                                          : dlsync_status_name((dlsync_status)w->baseline[k]));
      check(false, "a failed allocation was done without or reported");
    }
  }
}

/* The driver call the armed fault failed: call fault_at + fault_n of the
 * fake's call log (kept since the input's start). Copied to buf; "" when
 * not found. */
static void failed_call(const world *w, char *buf, size_t len) {
  const char *log = fake_call_log();
  unsigned long want = w->fault_at + w->fault_n, i = 1;
  buf[0] = '\0';
  while (*log != '\0' && i < want) {
    if (*log++ == ',')
      i++;
  }
  if (i == want) {
    size_t n = strcspn(log, ",");
    snprintf(buf, len, "%.*s", (int)(n < len ? n : len - 1), log);
  }
}

static bool all_deleters_ran(const world *w) {
  for (unsigned r = 0; r < w->nreleases; r++)
    if (atomic_load(&deleter_calls[r]) != w->expected[r])
      return false;
  return true;
}

static void finish(world *w) {
  const dlsync__driver *d = w->d;
  dlsync__pool_stats ps;
  dlsync_release_stats rs = DLSYNC_RELEASE_STATS_INIT;
  char leaks[256] = {0}, call[64] = "";
  CUcontext cur = NULL;
  bool kept_event, kept_uobj;
  unsigned left;
  size_t unused, batch;
  int i;
  if (w->fault_armed && !fake_fail_pending())
    w->fault_fired = true;
  fake_fail_clear();
  for (unsigned s = 0; s < NSLOTS; s++) {
    if (w->ex[s] != NULL)
      (void)dlsync_exchange_end(w->ex[s]);
    dlsync_fence_release(w->fences[s]);
  }
  for (unsigned k = 0; k < 3; k++) {
    CUgraph g = NULL;
    if (fake_capture_id(w->streams[k]) != 0 &&
        d->StreamEndCapture(w->streams[k], &g) == CUDA_SUCCESS && g != NULL)
      graph_destroy(d, g);
  }
  for (unsigned g = 0; g < NGRAPHS; g++)
    if (w->graphs[g] != NULL)
      graph_destroy(d, w->graphs[g]);
  while (d->CtxGetCurrent(&cur) == CUDA_SUCCESS && cur != NULL)
    (void)d->CtxPopCurrent(&cur);
  fake_run_destructors();
  /* Every deleter exactly once (graph-owned ones go through the reclaimer
   * after their destructors ran). */
  for (i = 0; i < 5000; i++) {
    fake_run_destructors();
    check(dlsync_release_get_stats(&rs, w->ctx) == DLSYNC_SUCCESS, "release stats");
    if (all_deleters_ran(w) && rs.pending_eager == 0 && rs.pending_graph == 0)
      break;
    sleep_ms(1);
  }
  check(all_deleters_ran(w), "every deleter of a successful release ran once, none other");
  check(rs.pending_eager == 0 && rs.pending_graph == 0, "no release pending");
  /* What a fault may leave: only what the driver refused to destroy. After a
   * failed cuEventDestroy (a surplus event given back, or the pool's events
   * at context destroy) the fake keeps the event, the pool counts it alive
   * but not free, and context destroy returns the failure. After a failed
   * cuUserObjectRelease (on the error path of a hand-over to graphs, one of
   * which refused the object: a destroyed graph, say): given to one graph,
   * the fake keeps the user object with the reference nobody can drop (dlsync
   * ran its destructor itself); given to two, the graph that took it got the
   * reference left and nothing remains (graph/graph.c, the seed
   * fault_user_object_release_two_graphs). After any other driver call
   * failing, and after any allocation failing, dlsync frees everything: all
   * the checks below hold (the harness's own destroys retry: a fault on one
   * of them leaves nothing either). The call log is read here, with the
   * reclaimer idle: its calls grow it. */
  if (w->fault_fired && !w->fault_alloc)
    failed_call(w, call, sizeof call);
  kept_event =
      w->fault_fired && !w->fault_alloc && (call[0] == '\0' || strcmp(call, "cuEventDestroy") == 0);
  kept_uobj = w->fault_fired && !w->fault_alloc && strcmp(call, "cuUserObjectRelease") == 0;
  /* An event a graph or fence gave back while its pool could not grow (an
   * allocation failed) is destroyed at the next collection: now. */
  dlsync__orphans_collect();
  check(fake_illegal_calls() == 0, "no call illegal during capture");
  check(fake_dangling_event_uses() == 0, "no event destroyed while a graph uses it");
  dlsync__pool_stats_get(&ps, &w->ctx->pools);
  /* This thread's open batch for built graphs keeps its events, used or
   * not (they come back together once the thread lets go of it: context
   * destroy, below), and at most 7 unused per pool. */
  unused = dlsync__graph_built_unused(&w->ctx->pools);
  batch = dlsync__graph_built_held(&w->ctx->pools);
  check(unused <= (DLSYNC__BUILT_BATCH - 1) * DLSYNC__BUILT_MEMOS,
        "a thread keeps at most 7 unused events per pool");
  check(batch <= DLSYNC__BUILT_BATCH * DLSYNC__BUILT_MEMOS && unused <= batch,
        "an open batch holds at most 8 events per pool");
  check(ps.graph_owned == batch,
        "no event still held by a graph or fence (but the thread's open batch)");
  check(ps.created - ps.destroyed == fake_live_events(), "the pools count the events alive");
  if (!kept_event)
    check(ps.free_events + batch == fake_live_events(),
          "every event is back in its pool (or in the thread's open batch)");
  check(dlsync_context_destroy(w->ctx) == DLSYNC_SUCCESS || kept_event,
        "context destroy after everything ended");
  for (unsigned k = 0; k < 3; k++)
    fake_stream_destroy(w->streams[k]);
  fake_run_destructors();
  /* The thread's open batch, let go by context destroy: its destructor ran
   * just now (a driver thread's, after the pools were gone), so its events
   * are orphans, destroyed at the next collection. */
  dlsync__orphans_collect();
  left = fake_leak_report(leaks, sizeof leaks);
  if (left != 0 && !kept_event && !(kept_uobj && left == 1 && fake_live_user_objects() == 1)) {
    fprintf(stderr, "leaked: %s (fault: %s %s)\n", leaks,
            !w->fault_fired  ? "none"
            : w->fault_alloc ? "allocation"
                             : "driver call",
            call);
    check(false, "nothing leaked");
  }
}

/* The program on a fresh fake and context; faulty: with its fault. Returns
 * whether it has one. */
static bool run_program(const uint8_t *data, size_t size, bool faulty, int *baseline) {
  world w;
  input in = {data, size};
  size_t k = 0;
  memset(&w, 0, sizeof w);
  w.faulty = faulty;
  w.baseline = baseline;
  fake_reset(2);
  w.d = fake_driver();
  check(dlsync__context_create_with_driver(&w.ctx, NULL, w.d) == DLSYNC_SUCCESS, "context");
  w.streams[0] = fake_stream_create(0, CU_STREAM_NON_BLOCKING);
  w.streams[1] = fake_stream_create(0, CU_STREAM_NON_BLOCKING);
  w.streams[2] = fake_stream_create(0, 0);
  for (unsigned r = 0; r < NRELEASES; r++)
    atomic_store(&deleter_calls[r], 0);
  fake_log_reset();
  while (in.n > 0 && k < NSTEPS)
    run_step(&w, &in, k++);
  finish(&w);
  return w.fault_used;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  static int baseline[NSTEPS];
  if (size > 512)
    return 0; /* short programs only: each step is cheap, the state is small */
  if (run_program(data, size, false, baseline))
    run_program(data, size, true, baseline);
  return 0;
}
