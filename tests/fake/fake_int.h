/* SPDX-License-Identifier: Apache-2.0 */
/* dlsync tests: the fake CUDA driver's own header, shared by its parts (the
 * model in fake_model.c, the libcuda entries in fake_entries.c, the fake's
 * API in fake_api.c); tests include fake_driver.h only. Everything declared
 * here is hidden: a shared library built on the fake (fake_libcuda.c) keeps
 * these names to itself. */
#ifndef DLSYNC_TESTS_FAKE_INT_H
#define DLSYNC_TESTS_FAKE_INT_H

#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif

#include "fake_driver.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#pragma GCC visibility push(hidden)

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

/* ---- the state (fake_model.c) ----------------------------------------------------------- */

typedef struct fake_state {
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
} fake_state;

/* Per-thread state, valid while its generation is the fake's. */
typedef struct fake_tls {
  unsigned gen;
  CUstreamCaptureMode mode;
  CUcontext stack[FAKE_CTX_STACK];
  int depth;
} fake_tls;

extern pthread_mutex_t g_lock;
extern fake_state S;
extern _Thread_local fake_tls T;
/* Process-wide counters that fake_reset keeps: ids unique for the process. */
extern unsigned long long g_next_stream_id;
extern unsigned long long g_next_ctx_id;
extern uint64_t g_next_capture_id;
extern uint64_t g_next_event_serial;
extern dlsync__driver g_table;

/* ---- growable arrays, handles, the entry gate ------------------------------------------- */

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

#define GET_CTX(h) ((fctx *)slot_get((h), FK_CTX))
#define GET_STREAM(h) ((fstream *)slot_get((h), FK_STREAM))
#define GET_EVENT(h) ((fevent *)slot_get((h), FK_EVENT))
#define GET_GRAPH(h) ((fgraph *)slot_get((h), FK_GRAPH))
#define GET_NODE(h) ((fnode *)slot_get((h), FK_NODE))
#define GET_EXEC(h) ((fexec *)slot_get((h), FK_EXEC))
#define GET_UOBJ(h) ((fuobj *)slot_get((h), FK_UOBJ))

#define ENTER(name)                                     \
  do {                                                  \
    CUresult enter_r_;                                  \
    if (!enter(DLSYNC__DRIVER_INDEX_##name, &enter_r_)) \
      return enter_r_;                                  \
  } while (0)

/* ---- the model (fake_model.c) ---------------------------------------------------------- */

void tls_sync(void);
int entry_find(const char *symbol);
void *xrealloc(void *p, size_t n);
void *xcalloc(size_t n, size_t size);
bool edge_is_default(const CUgraphEdgeData *d);
void *slot_new(unsigned kind, void *obj);
void *slot_get(const void *h, unsigned kind);
void log_clear(void);
void hostfn_queue(CUhostFn fn, void *ud);
fcall *take_queue(fcall **q, size_t *n, size_t *cap, size_t *out_n);
void run_calls(fcall *calls, size_t n);
void uobj_release(fuobj *o, unsigned n);
void urefs_add(furef **arr, size_t *n, size_t *cap, fuobj *o, unsigned count);
fgraph *graph_new(void);
void graph_free(fgraph *g);
fnode *node_new(fgraph *g, CUgraphNodeType type);
void node_set_label(fnode *n, const char *label);
void node_add_in(fnode *n, fnode *from, CUgraphEdgeData data);
bool node_has_in(const fnode *n, const fnode *from);
bool node_reaches(fnode *from, fnode *to);
bool edge_valid(const CUgraphEdgeData *d, const fnode *from);
CUresult deps_resolve(fgraph *g, const CUgraphNode *deps, const CUgraphEdgeData *data, size_t n,
                      fnode ***out);
CUresult graph_add(fgraph *g, const CUgraphNode *deps, const CUgraphEdgeData *data, size_t n,
                   CUgraphNodeType type, fnode **out);
fstream *stream_new(fctx *c, unsigned flags, bool legacy, bool per_thread);
void stream_free(fstream *s);
fctx *cur_ctx(void);
CUresult get_stream(CUstream h, bool touch, fstream **out);
uint64_t op_new(fstream *s, const uint64_t *extra, size_t nextra);
bool happens_before(uint64_t a, uint64_t b);
fcapture *cap_find(uint64_t id);
void cap_end(fcapture *c, bool keep_graph);
void deps_add(fstream *s, fnode *node, CUgraphEdgeData data);
fnode *capture_append(fstream *s, CUgraphNodeType type);
bool legacy_conflict(fctx *c, bool invalidate);
CUresult stream_enqueue_check(fstream *s);
CUresult enqueue(fstream *s, CUgraphNodeType type, const char *label, uint64_t *op_out,
                 fnode **node_out);
bool unsafe_call_prohibited(void);
bool event_captured_active(const fevent *e);
bool event_node_active(const fevent *e);
void event_set_captured(fevent *e, fstream *s);
void event_set_eager(fevent *e, uint64_t op);
bool event_in_use_by_graphs(const fevent *e);
fevent *event_new(fctx *c, unsigned flags);
void event_free(fevent *e);
fevent *node_event_alive(CUevent h, uint64_t serial);
void exec_free(fexec *x);
void state_free(void);
void state_create(int ndevices);
void lock(void);
void unlock(void);
bool enter(int idx, CUresult *r);
CUresult leave(CUresult r);

/* ---- the libcuda entries (fake_entries.c) ----------------------------------------------- */

bool dev_ok(CUdevice d);
void event_destroy(fevent *e);
size_t graph_edge_count(const fgraph *g);
void table_build(void);

#pragma GCC visibility pop

#endif /* DLSYNC_TESTS_FAKE_INT_H */
