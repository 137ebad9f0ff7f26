/* SPDX-License-Identifier: Apache-2.0 */
/* dlsync tests: the fake CUDA driver's model (see fake_driver.h): its state,
 * handles, the call log, graphs, streams, the eager op DAG, captures, teardown
 * and the entry gate every libcuda entry passes. */
#include "fake_int.h"

/* ---- the state ------------------------------------------------------------------------- */

pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
fake_state S = {.version = 13000, .free_head = SIZE_MAX};
_Thread_local fake_tls T;
unsigned long long g_next_stream_id = 1;
unsigned long long g_next_ctx_id = 1;
uint64_t g_next_capture_id = 1;
uint64_t g_next_event_serial = 1;
dlsync__driver g_table;

void tls_sync(void) {
  if (T.gen != S.gen) {
    T.gen = S.gen;
    T.mode = CU_STREAM_CAPTURE_MODE_GLOBAL;
    T.depth = 0;
  }
}

/* ---- the entries: names and pinned versions --------------------------------------------- */

static const char *const entry_names[DLSYNC__DRIVER_ENTRY_COUNT] = {
#define FAKE_ENTRY_NAME(name, pfn, ver, need) "cu" #name,
    DLSYNC__DRIVER_ENTRIES(FAKE_ENTRY_NAME)
#undef FAKE_ENTRY_NAME
};

int entry_find(const char *symbol) {
  if (!symbol)
    return -1;
  for (int i = 0; i < DLSYNC__DRIVER_ENTRY_COUNT; i++)
    if (strcmp(entry_names[i], symbol) == 0)
      return i;
  return -1;
}

/* ---- small utilities ------------------------------------------------------------------- */

void *xrealloc(void *p, size_t n) {
  void *q = realloc(p, n ? n : 1);
  if (!q) {
    fputs("fake_driver: out of host memory\n", stderr);
    abort();
  }
  return q;
}

void *xcalloc(size_t n, size_t size) {
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

bool edge_is_default(const CUgraphEdgeData *d) {
  static const CUgraphEdgeData zero;
  return memcmp(d, &zero, sizeof zero) == 0;
}

/* ---- handles: slots ---------------------------------------------------------------------- */

void *slot_new(unsigned kind, void *obj) {
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

void *slot_get(const void *h, unsigned kind) {
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

void log_clear(void) {
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

void hostfn_queue(CUhostFn fn, void *ud) {
  fcall c = {fn, ud};
  VEC_PUSH(S.hostfns, S.nhostfns, S.caphostfns, c);
}

/* Takes the queue out (under the lock) to be run after unlocking. */
fcall *take_queue(fcall **q, size_t *n, size_t *cap, size_t *out_n) {
  fcall *taken = *q;
  *out_n = *n;
  *q = NULL;
  *n = 0;
  *cap = 0;
  return taken;
}

void run_calls(fcall *calls, size_t n) {
  for (size_t i = 0; i < n; i++)
    calls[i].fn(calls[i].ud);
  free(calls);
}

/* ---- user objects ------------------------------------------------------------------------ */

void uobj_release(fuobj *o, unsigned n) {
  o->refs -= n;
  if (o->refs == 0) {
    dtor_queue(o->fn, o->ptr);
    slot_free(o->h);
    S.live_uobjs--;
    free(o);
  }
}

void urefs_add(furef **arr, size_t *n, size_t *cap, fuobj *o, unsigned count) {
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

fgraph *graph_new(void) {
  fgraph *g = xcalloc(1, sizeof *g);
  g->h = slot_new(FK_GRAPH, g);
  S.live_graphs++;
  return g;
}

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

void graph_free(fgraph *g) {
  for (size_t i = 0; i < g->n; i++)
    node_free(g->nodes[i]);
  free(g->nodes);
  urefs_release(g->urefs, g->nu);
  free(g->urefs);
  slot_free(g->h);
  S.live_graphs--;
  free(g);
}

fnode *node_new(fgraph *g, CUgraphNodeType type) {
  fnode *n = xcalloc(1, sizeof *n);
  n->g = g;
  n->type = type;
  n->h = slot_new(FK_NODE, n);
  VEC_PUSH(g->nodes, g->n, g->cap, n);
  return n;
}

void node_set_label(fnode *n, const char *label) {
  free(n->label);
  n->label = label ? xstrdup(label) : NULL;
}

void node_add_in(fnode *n, fnode *from, CUgraphEdgeData data) {
  fdep d = {from, data};
  VEC_PUSH(n->in, n->nin, n->capin, d);
}

bool node_has_in(const fnode *n, const fnode *from) {
  for (size_t i = 0; i < n->nin; i++)
    if (n->in[i].node == from)
      return true;
  return false;
}

/* A path of zero or more edges from `from` to `to`. Iterative to survive long chains. */
bool node_reaches(fnode *from, fnode *to) {
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
bool edge_valid(const CUgraphEdgeData *d, const fnode *from) {
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
CUresult deps_resolve(fgraph *g, const CUgraphNode *deps, const CUgraphEdgeData *data, size_t n,
                      fnode ***out) {
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
CUresult graph_add(fgraph *g, const CUgraphNode *deps, const CUgraphEdgeData *data, size_t n,
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

fstream *stream_new(fctx *c, unsigned flags, bool legacy, bool per_thread) {
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

void stream_free(fstream *s) {
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

fctx *cur_ctx(void) {
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
CUresult get_stream(CUstream h, bool touch, fstream **out) {
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
uint64_t op_new(fstream *s, const uint64_t *extra, size_t nextra) {
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

bool happens_before(uint64_t a, uint64_t b) {
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

fcapture *cap_find(uint64_t id) {
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
void cap_end(fcapture *c, bool keep_graph) {
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

void deps_add(fstream *s, fnode *node, CUgraphEdgeData data) {
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
fnode *capture_append(fstream *s, CUgraphNodeType type) {
  fnode *n = node_new(s->cap->graph, type);
  for (size_t i = 0; i < s->ndeps; i++)
    node_add_in(n, s->deps[i].node, s->deps[i].data);
  fdep d = {n, {0}};
  deps_set(s, &d, 1);
  return n;
}

/* Blocking streams of ctx in a capture (active or invalidated); invalidates
 * their captures when asked. */
bool legacy_conflict(fctx *c, bool invalidate) {
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
CUresult stream_enqueue_check(fstream *s) {
  if (s->legacy && legacy_conflict(s->ctx, true))
    return CUDA_ERROR_STREAM_CAPTURE_IMPLICIT;
  if (s->cap && s->cap->invalidated)
    return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
  return CUDA_SUCCESS;
}

/* Work on s: an op, or a node of `type` appended to its capture. */
CUresult enqueue(fstream *s, CUgraphNodeType type, const char *label, uint64_t *op_out,
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
bool unsafe_call_prohibited(void) {
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

bool event_captured_active(const fevent *e) {
  return e->state == EV_CAPTURED && cap_find(e->cap_id) != NULL;
}

bool event_node_active(const fevent *e) {
  return e->state == EV_NODE && cap_find(e->cap_id) != NULL;
}

void event_set_captured(fevent *e, fstream *s) {
  e->state = EV_CAPTURED;
  e->cap_id = s->cap->id;
  e->op = 0;
  free(e->nodes);
  e->nodes = s->ndeps ? xcalloc(s->ndeps, sizeof *e->nodes) : NULL;
  e->nnodes = s->ndeps;
  for (size_t i = 0; i < s->ndeps; i++)
    e->nodes[i] = s->deps[i].node->h;
}

void event_set_eager(fevent *e, uint64_t op) {
  e->state = EV_EAGER;
  e->op = op;
  e->cap_id = 0;
  free(e->nodes);
  e->nodes = NULL;
  e->nnodes = 0;
}

/* Is the event used by an event node of a live graph or executable? */
bool event_in_use_by_graphs(const fevent *e) {
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

fevent *event_new(fctx *c, unsigned flags) {
  fevent *e = xcalloc(1, sizeof *e);
  e->ctx = c;
  e->flags = flags;
  e->serial = g_next_event_serial++;
  e->h = slot_new(FK_EVENT, e);
  S.live_events++;
  return e;
}

void event_free(fevent *e) {
  slot_free(e->h);
  free(e->nodes);
  S.live_events--;
  free(e);
}

/* The event of a node if it still exists (serial match). */
fevent *node_event_alive(CUevent h, uint64_t serial) {
  fevent *e = GET_EVENT(h);
  return e && e->serial == serial ? e : NULL;
}

void exec_free(fexec *x) {
  urefs_release(x->urefs, x->nu);
  free(x->urefs);
  free(x->items);
  slot_free(x->h);
  S.live_execs--;
  free(x);
}

/* ---- whole-state teardown ---------------------------------------------------------------- */

void state_free(void) {
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

void state_create(int ndevices) {
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

void lock(void) {
  pthread_mutex_lock(&g_lock);
  tls_sync();
}

void unlock(void) {
  pthread_mutex_unlock(&g_lock);
}

static bool init_exempt(int idx) {
  return idx == DLSYNC__DRIVER_INDEX_Init || idx == DLSYNC__DRIVER_INDEX_DriverGetVersion ||
         idx == DLSYNC__DRIVER_INDEX_GetErrorName || idx == DLSYNC__DRIVER_INDEX_GetErrorString;
}

/* Takes the lock and accounts for the call. Returns false (lock released,
 * *r set) when the call is answered by an injected fault or by
 * CUDA_ERROR_NOT_INITIALIZED. */
bool enter(int idx, CUresult *r) {
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
CUresult leave(CUresult r) {
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
