/* SPDX-License-Identifier: Apache-2.0 */
/* libFuzzer harness over the fake driver.
 *
 * Each input is a little program: bytes pick operations (dlsync_order,
 * exchange begin (one producer or many)/end, fence signal/wait/release, another runtime's event
 * imported as a fence, dlsync_release, flush),
 * their lanes (streams of both kinds, the special handles, captures begun and
 * ended, graphs built by hand with fuzzed deps and capacity, lying counts, bad lanes) and
 * their flags, conditional nodes' bodies (made in those graphs, declared
 * by the context or by a second one, captured into, graph lanes on them),
 * dlsync_graph_launch of library graphs and bad handles, plus one fault: a driver call of the fake
 * failing (op 0), or one of dlsync's allocations (op 16), counted from there on. A program with a
 * fault op runs twice: once with the op ignored (the baseline: each operation's status), then with
 * the fault. After each run everything is ended and released, and the invariants are checked; a
 * broken one aborts (a crash for libFuzzer):
 *  - an allocation that failed during an operation was done without (the
 *    operation's status is the baseline's) or reported (OUT_OF_MEMORY, "out
 *    of memory");
 *  - no call illegal during a capture was made (fake_illegal_calls);
 *  - the pool is intact: no event still held by a graph or fence, what the
 *    pools count as alive is what the fake has, and every event is back in
 *    its pool;
 *  - each call to the conditional-body and graph-launch entry points returns
 *    a status its header documents; is_declared agrees with what each
 *    context declared and removed; a parent graph whose bodies were declared
 *    (by either context) at every dlsync call instantiates;
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
#define NBODIES 4
#define NLIBS 3        /* the library graphs dlsync_graph_launch runs (see world) */
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
  dlsync_context *ctx2; /* another context: it only declares bodies (ctx's rows refuse them) */
  CUstream streams[3];  /* non-blocking, non-blocking, blocking */
  bool capturing[3];
  CUgraph graphs[NGRAPHS];
  /* Conditional nodes' bodies made in graphs (op 17): the handle, its
   * parent's slot, whether it is declared now by ctx and by ctx2 (the
   * harness's model of dlsync_conditional_body_is_declared), whether a
   * dlsync call may have put a node in it while neither had declared it
   * (then its parent need not instantiate). */
  struct {
    CUgraph h;
    CUgraphNode node; /* its conditional node, in graphs[parent] */
    unsigned parent;
    bool alive, tainted;
    bool declared[2]; /* by ctx, by ctx2 */
  } bodies[NBODIES];
  int body_cap[3]; /* 1 + the body stream k captures into; 0: not a body */
  /* The library's graphs: kernels, one with an event-wait node, one with a
   * conditional node (no child graph); an executable of the first two; a
   * destroyed graph and executable. */
  CUgraph libs[NLIBS];
  CUgraphExec lib_exec[2];
  CUgraph gone_graph;
  CUgraphExec gone_exec;
  CUevent lib_event;
  CUgraphNode deps[NLANES][4];
  dlsync_lane lanes[NLANES]; /* stable storage: exchanges keep pointers to graph lanes */
  dlsync_exchange *ex[NSLOTS];
  dlsync_fence *fences[NSLOTS];
  unsigned imported; /* other runtimes' events imported (owned by dlsync since) */
  int expected[NRELEASES];
  unsigned nreleases;
  bool faulty; /* this run arms the input's fault (else: the baseline run) */
  bool fault_armed;
  bool fault_used; /* one fault per input: the invariants hold for any single fault */
  bool fault_fired;
  bool fault_alloc;       /* the fault is an allocation's */
  unsigned long fault_at; /* driver calls made when it was armed */
  unsigned fault_n;       /* the nth call (or allocation) from there */
  bool declaring;         /* this step's call only declares (adds no node) */
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
    unsigned cb = take(in), cap = cb % 5;
    CUgraph on = w->graphs[g];
    if (what & 64) { /* a graph lane on a body (declared or not) */
      unsigned b = (g + (what & 128 ? NGRAPHS : 0)) % NBODIES;
      on = w->bodies[b].alive ? w->bodies[b].h : NULL;
    }
    if (on == NULL)
      break; /* keep the old lane */
    for (unsigned k = 0; k < nd; k++)
      w->deps[i][k] = fake_graph_add_work(on, NULL, 0, "work");
    if (nd == 2 && (what & 16))
      w->deps[i][1] = w->deps[i][0]; /* a duplicate */
    *l = dlsync_lane_graph(on, (what & 32) ? NULL : w->deps[i], nd, cap);
    if (cb >= 0xF0) { /* a lying count: more nodes than any array holds */
      unsigned b = take(in);
      size_t huge = b == 255 ? SIZE_MAX : DLSYNC__LANE_MAX_NODES + 1 + ((size_t)(b % 15) << 60);
      dlsync_lane_state qs;
      dlsync_lane eager = dlsync_lane_stream(w->streams[0]);
      l->capacity = huge;
      if (cb & 1)
        l->ndeps = huge - (b & 3);
      check(dlsync_lane_query(&qs, w->ctx, l) == DLSYNC_ERROR_INVALID_ARGUMENT,
            "a lying count refused by dlsync_lane_query");
      check(dlsync_order(w->ctx, &eager, l) == DLSYNC_ERROR_INVALID_ARGUMENT,
            "a lying count refused by dlsync_order");
      check(strstr(dlsync_last_error(), "no array") != NULL, "a lying count named");
    }
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

/* A status among those a call documents (include/dlsync/), or out of
 * memory said so while an allocation fault is armed. */
static void check_documented(const world *w, dlsync_status st, const dlsync_status *ok, size_t n,
                             const char *what) {
  for (size_t i = 0; i < n; i++)
    if (st == ok[i])
      return;
  if (st == DLSYNC_ERROR_OUT_OF_MEMORY && w->st_reported)
    return;
  fprintf(stderr, "%s: %s (%s)\n", what, dlsync_status_name(st), dlsync_last_error());
  check(false, "each call's status a documented one");
}

/* The bodies of graph slot g go with it: their declarations removed first
 * (include/dlsync/conditional.h asks that), else a new graph reusing a
 * body's handle would be taken for one. */
static void body_parent_gone(world *w, unsigned g) {
  for (unsigned b = 0; b < NBODIES; b++) {
    if (!w->bodies[b].alive || w->bodies[b].parent != g)
      continue;
    for (unsigned c = 0; c < 2; c++)
      if (w->bodies[b].declared[c])
        check(dlsync_conditional_body_remove(c ? w->ctx2 : w->ctx, w->bodies[b].h) ==
                  DLSYNC_SUCCESS,
              "a declared body is removed");
    for (unsigned k = 0; k < 3; k++)
      if (w->body_cap[k] == 1 + (int)b) {
        CUgraph ended = NULL;
        /* Its capture ends first (the fake keeps the graph while a capture builds it). */
        (void)w->d->StreamEndCapture(w->streams[k], &ended);
        if (fake_capture_id(w->streams[k]) != 0)
          (void)w->d->StreamEndCapture(w->streams[k], &ended);
        w->capturing[k] = false;
        w->body_cap[k] = 0;
      }
    memset(&w->bodies[b], 0, sizeof w->bodies[b]);
  }
}

/* An IF (one or two bodies) or WHILE node in graph slot g; its first body
 * goes to body slot b (when free). */
static void conditional_node(world *w, input *in) {
  unsigned g = take(in) % NGRAPHS, b = take(in) % NBODIES, kind = take(in);
  CUgraphConditionalHandle h = 0;
  CUgraphNodeParams p;
  CUgraphNode node = NULL;
  if (w->graphs[g] == NULL || w->bodies[b].alive)
    return;
  if (w->d->GraphConditionalHandleCreate(&h, w->graphs[g], fake_primary_ctx(0), 1,
                                         CU_GRAPH_COND_ASSIGN_DEFAULT) != CUDA_SUCCESS)
    return;
  memset(&p, 0, sizeof p);
  p.type = CU_GRAPH_NODE_TYPE_CONDITIONAL;
  p.conditional.handle = h;
  p.conditional.type = (kind & 1) ? CU_GRAPH_COND_TYPE_WHILE : CU_GRAPH_COND_TYPE_IF;
  p.conditional.size = (kind & 3) == 2 ? 2 : 1;
  p.conditional.ctx = fake_primary_ctx(0);
  if (w->d->GraphAddNode(&node, w->graphs[g], NULL, NULL, 0, &p) != CUDA_SUCCESS)
    return;
  w->bodies[b].h = p.conditional.phGraph_out[0];
  w->bodies[b].node = node;
  w->bodies[b].parent = g;
  w->bodies[b].alive = true;
}

/* dlsync_conditional_body_add (add) or _remove of body slot s, NULL or a
 * handle that is no graph (the caller's word is taken: no driver call); an
 * add may be dlsync_conditional_node_declare with the body's parent and
 * conditional node (the rows then hoist instead of refusing). */
static void body_declare(world *w, input *in, bool add) {
  static const dlsync_status ok[] = {DLSYNC_SUCCESS, DLSYNC_ERROR_INVALID_ARGUMENT};
  unsigned which = take(in);
  unsigned b = which % NBODIES, c = (which >> 6) & 1; /* c: ctx2 declares */
  dlsync_context *ctx = c ? w->ctx2 : w->ctx;
  CUgraph g = (which & 16) ? NULL : (which & 32) ? (CUgraph)w->streams[0] : w->bodies[b].h;
  bool modelled = !(which & 48) && w->bodies[b].alive;
  dlsync_status st;
  w->declaring = true;
  if (!(which & 48) && !w->bodies[b].alive)
    return;
  if (add && (which & 128) && !(which & 32)) {
    /* Its two driver calls (the node's type, the parent's nodes) and its
     * allocation may meet the input's fault. */
    static const dlsync_status nok[] = {DLSYNC_SUCCESS, DLSYNC_ERROR_INVALID_ARGUMENT,
                                        DLSYNC_ERROR_DRIVER, DLSYNC_ERROR_OUT_OF_MEMORY};
    st = dlsync_conditional_node_declare(ctx, w->graphs[w->bodies[b].parent], w->bodies[b].node, &g,
                                         1);
    note(w, st);
    check_documented(w, st, nok, 4, "dlsync_conditional_node_declare");
    check(st == DLSYNC_SUCCESS ||
              strstr(dlsync_last_error(), "dlsync_conditional_node_declare") != NULL,
          "a refused declaration names the call");
    check(st != DLSYNC_ERROR_DRIVER || w->fault_armed, "a driver failure only under a fault");
    if (g == NULL)
      check(st == DLSYNC_ERROR_INVALID_ARGUMENT, "a NULL body refused");
    if (modelled) {
      check(st == DLSYNC_SUCCESS || st == DLSYNC_ERROR_DRIVER || st == DLSYNC_ERROR_OUT_OF_MEMORY,
            "a body is declared with its node");
      if (st == DLSYNC_SUCCESS)
        w->bodies[b].declared[c] = true;
    }
    return;
  }
  st = add ? dlsync_conditional_body_add(ctx, g) : dlsync_conditional_body_remove(ctx, g);
  note(w, st);
  check_documented(w, st, ok, 2,
                   add ? "dlsync_conditional_body_add" : "dlsync_conditional_body_remove");
  check(st == DLSYNC_SUCCESS || strstr(dlsync_last_error(), "dlsync_conditional_body") != NULL,
        "a refused declaration names the call");
  if (g == NULL)
    check(st == DLSYNC_ERROR_INVALID_ARGUMENT, "a NULL body refused");
  if (modelled) {
    if (add)
      check(st == DLSYNC_SUCCESS, "a body is declared");
    else
      check((st == DLSYNC_SUCCESS) == w->bodies[b].declared[c], "remove succeeds iff declared");
    w->bodies[b].declared[c] = add;
  }
}

/* dlsync_graph_launch: a library graph (kernels, one with an event-wait
 * node, one with a conditional node), NULL, a graph slot, a body, a handle
 * that is no graph or a destroyed graph; an executable, NULL, a destroyed
 * one; at a lane. */
static void graph_launch(world *w, input *in) {
  static const dlsync_status ok[] = {DLSYNC_SUCCESS,
                                     DLSYNC_ERROR_INVALID_ARGUMENT,
                                     DLSYNC_ERROR_INVALID_LANE,
                                     DLSYNC_ERROR_DRIVER,
                                     DLSYNC_ERROR_CAPTURE_INVALIDATED,
                                     DLSYNC_ERROR_DRIVER_TOO_OLD,
                                     DLSYNC_ERROR_CONDITIONAL_BODY,
                                     DLSYNC_ERROR_OUT_OF_MEMORY /* the driver's */,
                                     DLSYNC_ERROR_LEGACY_STREAM_IN_CAPTURE};
  unsigned gs = take(in), xs = take(in);
  CUgraph g = NULL;
  CUgraphExec x = NULL;
  dlsync_lane *l;
  dlsync_status st;
  switch (gs % 8) {
  case 0:
  case 1:
  case 2:
    g = w->libs[gs % 8];
    break;
  case 3:
    break;
  case 4:
    g = w->graphs[(gs >> 3) % NGRAPHS];
    break;
  case 5:
    g = w->bodies[(gs >> 3) % NBODIES].h;
    break;
  case 6:
    g = (CUgraph)w->streams[0]; /* no graph */
    break;
  default:
    g = w->gone_graph;
    break;
  }
  switch (xs % 4) {
  case 0:
    break;
  case 1:
  case 2:
    x = w->lib_exec[xs % 4 - 1];
    break;
  default:
    x = w->gone_exec;
    break;
  }
  l = lane_of(w, in);
  st = dlsync_graph_launch(w->ctx, g, x, l);
  note(w, st);
  check_documented(w, st, ok, sizeof ok / sizeof ok[0], "dlsync_graph_launch");
  if (st != DLSYNC_SUCCESS)
    check(dlsync_last_error()[0] != '\0', "a refused launch says why");
}

/* Another runtime's event, recorded on a stream (eagerly, or plainly in its
 * capture) and imported into fence slot s with a fuzzed provenance (some
 * contradicting the record, some unknown), owned by dlsync once imported. */
static void import_event(world *w, input *in, unsigned s) {
  static const dlsync_status ok[] = {DLSYNC_SUCCESS, DLSYNC_ERROR_INVALID_ARGUMENT,
                                     DLSYNC_ERROR_DRIVER, DLSYNC_ERROR_OUT_OF_MEMORY};
  unsigned k = take(in) % 3, p = take(in) % 6;
  CUstream st_ = w->streams[k];
  CUevent e;
  dlsync_fence *f = NULL;
  dlsync_status st;
  if (w->fences[s] != NULL)
    return;
  e = fake_event_create(0, CU_EVENT_DISABLE_TIMING);
  if (take(in) & 1)
    (void)w->d->EventRecord(e, st_);
  st = dlsync_fence_import(&f, w->ctx, e, (dlsync_provenance)p,
                           p == DLSYNC_PROVENANCE_CAPTURED ? fake_capture_id(st_) : 0,
                           DLSYNC_IMPORT_OWN);
  note(w, st);
  check_documented(w, st, ok, sizeof ok / sizeof ok[0], "dlsync_fence_import");
  check((st == DLSYNC_SUCCESS) == (f != NULL), "import: *out set iff success");
  if (f == NULL)
    fake_event_destroy(e); /* refused: still ours */
  else
    w->imported++;
  w->fences[s] = f;
}

static void step(world *w, input *in) {
  const dlsync__driver *d = w->d;
  unsigned op = take(in);
  unsigned s = take(in) % NSLOTS;
  unsigned o = op % 32;
  if (o > 23)
    o -= 16; /* 24..31: the first ops again */
  switch (o) {
  case 0:
  case 16:
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
      if (w->body_cap[k] != 0) {                             /* the body stays its parent's */
        (void)take(in); /* the launch byte, read as for any capture */
        if (!w->capturing[k])
          w->body_cap[k] = 0;
        break;
      }
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
      body_parent_gone(w, g);
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
    /* 0x80: an unknown flag; else CAPTURE_STABLE (bit 0), KEEP_EDGE_DATA (bit 1). */
    uint32_t flags =
        (fb & 4) ? 0x80u : (uint32_t)(fb & 1) | ((fb & 2) ? DLSYNC_EXCHANGE_KEEP_EDGE_DATA : 0);
    if (w->ex[s] == NULL) {
      dlsync_exchange *ex = NULL;
      dlsync_status st;
      if (fb & 8) { /* many producers (or consumers): a run of lanes from a (0 to 3 of them) */
        size_t first = (size_t)(a - w->lanes), n = (fb >> 4) % 4;
        if (n > NLANES - first)
          n = NLANES - first;
        if (fb & 64) /* one producer b, consumers a.. (b among them, or duplicates: refused) */
          st = dlsync_exchange_begin_fanout(&ex, w->ctx, b, a, n, flags);
        else
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
  case 17:
    conditional_node(w, in);
    break;
  case 18:
  case 19:
    body_declare(w, in, o == 18);
    break;
  case 20:
    for (unsigned b = 0; b < NBODIES; b++)
      if (w->bodies[b].alive)
        check(dlsync_conditional_body_is_declared(w->ctx, w->bodies[b].h) ==
                      w->bodies[b].declared[0] &&
                  dlsync_conditional_body_is_declared(w->ctx2, w->bodies[b].h) ==
                      w->bodies[b].declared[1],
              "is_declared says what each context declared");
    check(!dlsync_conditional_body_is_declared(w->ctx, NULL) &&
              !dlsync_conditional_body_is_declared(NULL, w->bodies[s].h),
          "is_declared: false for NULL");
    break;
  case 21: {
    unsigned k = take(in) % 3, b = take(in) % NBODIES;
    if (!w->capturing[k] && w->bodies[b].alive &&
        d->StreamBeginCaptureToGraph(w->streams[k], w->bodies[b].h, NULL, NULL, 0,
                                     CU_STREAM_CAPTURE_MODE_RELAXED) == CUDA_SUCCESS) {
      w->capturing[k] = true;
      w->body_cap[k] = 1 + (int)b;
    }
    break;
  }
  case 22:
    graph_launch(w, in);
    break;
  case 23:
    import_event(w, in, s);
    break;
  default:
    note(w, dlsync_release_flush(w->ctx));
    break;
  }
}

/* One step, and the allocation invariant: when the allocation fault fired
 * during a dlsync call of this step (or, with the reclaimer thread, while it
 * ran), the call's status is the baseline's (done without) or says so. */
static void run_step(world *w, input *in, size_t k) {
  static int trace = -1; /* FUZZ_TRACE=1: each step and its status on stderr */
  bool armed = w->fault_armed;
  if (trace < 0)
    trace = getenv("FUZZ_TRACE") != NULL;
  w->st = NO_STATUS;
  w->declaring = false;
  if (trace)
    fprintf(stderr, "%s step %zu: op %u\n", w->faulty ? "faulty" : "baseline", k,
            in->n > 0 ? in->p[0] % 32u : 0u);
  step(w, in);
  if (trace && w->st != NO_STATUS)
    fprintf(stderr, "  -> %s %s\n", dlsync_status_name((dlsync_status)w->st),
            w->st == DLSYNC_SUCCESS ? "" : dlsync_last_error());
  /* A call that may add nodes while a body is not declared may put an
   * event node in it: its parent need not instantiate (finish). */
  if (w->st != NO_STATUS && !w->declaring)
    for (unsigned b = 0; b < NBODIES; b++)
      if (w->bodies[b].alive && !w->bodies[b].declared[0] && !w->bodies[b].declared[1])
        w->bodies[b].tainted = true;
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
    /* An end is a dlsync call too (into a body's capture, say). */
    for (unsigned b = 0; b < NBODIES && w->ex[s] != NULL; b++)
      if (w->bodies[b].alive && !w->bodies[b].declared[0] && !w->bodies[b].declared[1])
        w->bodies[b].tainted = true;
    if (w->ex[s] != NULL)
      (void)dlsync_exchange_end(w->ex[s]);
    dlsync_fence_release(w->fences[s]);
  }
  for (unsigned k = 0; k < 3; k++) {
    CUgraph g = NULL;
    if (fake_capture_id(w->streams[k]) != 0 &&
        d->StreamEndCapture(w->streams[k], &g) == CUDA_SUCCESS && g != NULL && w->body_cap[k] == 0)
      graph_destroy(d, g);
    w->body_cap[k] = 0;
  }
  /* A parent whose bodies were declared whenever dlsync was called
   * instantiates: dlsync put no event node in them (rule R28 of the fake). */
  for (unsigned g = 0; g < NGRAPHS; g++) {
    bool has = false, clean = true;
    for (unsigned b = 0; b < NBODIES; b++)
      if (w->bodies[b].alive && w->bodies[b].parent == g) {
        has = true;
        clean = clean && !w->bodies[b].tainted;
      }
    if (has && clean) {
      CUgraphExec x = NULL;
      CUresult r = d->GraphInstantiateWithFlags(&x, w->graphs[g], 0);
      if (r != CUDA_SUCCESS) {
        fprintf(stderr, "graph %p: cuGraphInstantiate %d\n", (void *)w->graphs[g], (int)r);
        for (unsigned b = 0; b < NBODIES; b++)
          if (w->bodies[b].alive && w->bodies[b].parent == g)
            fprintf(stderr, "body %p: %zu nodes, %zu record, %zu wait, %zu graph, %zu host\n",
                    (void *)w->bodies[b].h, fake_graph_count_nodes(w->bodies[b].h, -1),
                    fake_graph_count_nodes(w->bodies[b].h, CU_GRAPH_NODE_TYPE_EVENT_RECORD),
                    fake_graph_count_nodes(w->bodies[b].h, CU_GRAPH_NODE_TYPE_WAIT_EVENT),
                    fake_graph_count_nodes(w->bodies[b].h, CU_GRAPH_NODE_TYPE_GRAPH),
                    fake_graph_count_nodes(w->bodies[b].h, CU_GRAPH_NODE_TYPE_HOST));
      }
      check(r == CUDA_SUCCESS, "a parent of declared bodies instantiates");
      (void)d->GraphExecDestroy(x);
    }
  }
  for (unsigned g = 0; g < NGRAPHS; g++)
    if (w->graphs[g] != NULL) {
      body_parent_gone(w, g);
      graph_destroy(d, w->graphs[g]);
    }
  for (unsigned x = 0; x < 2; x++)
    if (d->GraphExecDestroy(w->lib_exec[x]) != CUDA_SUCCESS)
      (void)d->GraphExecDestroy(w->lib_exec[x]);
  for (unsigned g = 0; g < NLIBS; g++)
    graph_destroy(d, w->libs[g]);
  fake_event_destroy(w->lib_event);
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
  /* An imported event is no pool's: once its fence and graphs are gone it is
   * destroyed (collected above), unless the driver refused that destroy. */
  check(ps.created - ps.destroyed == fake_live_events() || (kept_event && w->imported > 0),
        "the pools count the events alive");
  if (!kept_event)
    check(ps.free_events + batch == fake_live_events(),
          "every event is back in its pool (or in the thread's open batch)");
  check(dlsync_context_destroy(w->ctx2) == DLSYNC_SUCCESS, "the other context destroyed");
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

/* The library's graphs and executables (world), made before the program. */
static void libs_make(world *w) {
  const dlsync__driver *d = w->d;
  CUgraphConditionalHandle h = 0;
  CUgraphNodeParams p;
  CUgraphNode a, node = NULL;
  for (unsigned i = 0; i < NLIBS; i++) {
    check(d->GraphCreate(&w->libs[i], 0) == CUDA_SUCCESS, "a library graph");
    a = fake_graph_add_work(w->libs[i], NULL, 0, "lib a");
    (void)fake_graph_add_work(w->libs[i], &a, 1, "lib b");
  }
  w->lib_event = fake_event_create(0, CU_EVENT_DISABLE_TIMING);
  check(d->GraphAddEventWaitNode(&node, w->libs[1], NULL, 0, w->lib_event) == CUDA_SUCCESS,
        "a library graph's wait node");
  check(d->GraphConditionalHandleCreate(&h, w->libs[2], fake_primary_ctx(0), 1,
                                        CU_GRAPH_COND_ASSIGN_DEFAULT) == CUDA_SUCCESS,
        "a conditional handle");
  memset(&p, 0, sizeof p);
  p.type = CU_GRAPH_NODE_TYPE_CONDITIONAL;
  p.conditional.handle = h;
  p.conditional.type = CU_GRAPH_COND_TYPE_IF;
  p.conditional.size = 1;
  p.conditional.ctx = fake_primary_ctx(0);
  check(d->GraphAddNode(&node, w->libs[2], NULL, NULL, 0, &p) == CUDA_SUCCESS,
        "a library graph's conditional node");
  for (unsigned i = 0; i < 2; i++)
    check(d->GraphInstantiateWithFlags(&w->lib_exec[i], w->libs[i], 0) == CUDA_SUCCESS,
          "a library executable");
  check(d->GraphCreate(&w->gone_graph, 0) == CUDA_SUCCESS, "a graph");
  check(d->GraphInstantiateWithFlags(&w->gone_exec, w->gone_graph, 0) == CUDA_SUCCESS,
        "an executable");
  check(d->GraphExecDestroy(w->gone_exec) == CUDA_SUCCESS, "an executable destroyed");
  graph_destroy(d, w->gone_graph);
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
  check(dlsync__context_create_with_driver(&w.ctx2, NULL, w.d) == DLSYNC_SUCCESS, "context 2");
  w.streams[0] = fake_stream_create(0, CU_STREAM_NON_BLOCKING);
  w.streams[1] = fake_stream_create(0, CU_STREAM_NON_BLOCKING);
  w.streams[2] = fake_stream_create(0, 0);
  libs_make(&w);
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
