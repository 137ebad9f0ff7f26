/* SPDX-License-Identifier: Apache-2.0 */
/* dlsync tests: the fake CUDA driver's own API, the fake_* functions of
 * fake_driver.h. */
#include "fake_int.h"

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
