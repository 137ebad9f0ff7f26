/* SPDX-License-Identifier: Apache-2.0 */
/* The rule checks (driver_rules.h). Driver calls only: no fake helper. */
#include "driver_rules.h"

#include <stdint.h>
#include <stdio.h>
#include <string.h>

/* Streams, events and graphs a check made, destroyed at the end whatever
 * happened (captures still going are ended first). */
typedef struct scope {
  const dlsync__driver *d;
  CUstream s[3];
  CUevent e[2];
  CUgraph g[4];
  int ng;
} scope;

static CUresult scope_open(scope *sc, const dlsync__driver *d) {
  CUresult r = CUDA_SUCCESS;
  memset(sc, 0, sizeof *sc);
  sc->d = d;
  for (int i = 0; i < 3 && r == CUDA_SUCCESS; i++)
    r = d->StreamCreate(&sc->s[i], CU_STREAM_NON_BLOCKING);
  for (int i = 0; i < 2 && r == CUDA_SUCCESS; i++)
    r = d->EventCreate(&sc->e[i], CU_EVENT_DISABLE_TIMING);
  return r;
}

static void scope_keep(scope *sc, CUgraph g) {
  if (g != NULL && sc->ng < 4)
    sc->g[sc->ng++] = g;
}

static void scope_close(scope *sc) {
  const dlsync__driver *d = sc->d;
  for (int i = 0; i < 3; i++) {
    CUstreamCaptureStatus cs = CU_STREAM_CAPTURE_STATUS_NONE;
    if (sc->s[i] != NULL && d->StreamIsCapturing(sc->s[i], &cs) == CUDA_SUCCESS &&
        cs != CU_STREAM_CAPTURE_STATUS_NONE) {
      CUgraph g = NULL;
      (void)d->StreamEndCapture(sc->s[i], &g);
      scope_keep(sc, g);
    }
  }
  for (int i = 0; i < sc->ng; i++)
    (void)d->GraphDestroy(sc->g[i]);
  for (int i = 0; i < 2; i++)
    if (sc->e[i] != NULL)
      (void)d->EventDestroy(sc->e[i]);
  for (int i = 0; i < 3; i++)
    if (sc->s[i] != NULL)
      (void)d->StreamDestroy(sc->s[i]);
}

static const char *said(char *why, size_t n, const dlsync__driver *d, const char *call, CUresult r,
                        const char *wanted) {
  snprintf(why, n, "%s returned %s, the rule says %s", call, dlsync__driver_error_name(d, r),
           wanted);
  return why;
}

#define BEGIN(s) d->StreamBeginCapture((s), CU_STREAM_CAPTURE_MODE_RELAXED)

static CUstreamCaptureStatus capture_status(const dlsync__driver *d, CUstream s) {
  CUstreamCaptureStatus cs = CU_STREAM_CAPTURE_STATUS_NONE;
  (void)d->StreamIsCapturing(s, &cs);
  return cs;
}

static uint64_t capture_id(const dlsync__driver *d, CUstream s) {
  CUstreamCaptureStatus cs;
  cuuint64_t id = 0;
  if (d->StreamGetCaptureInfo(s, &cs, &id, NULL, NULL, NULL, NULL) != CUDA_SUCCESS)
    return 0;
  return cs == CU_STREAM_CAPTURE_STATUS_ACTIVE ? id : 0;
}

/* Does graph g hold a node of `type`? */
static int has_node(const dlsync__driver *d, CUgraph g, CUgraphNodeType type) {
  CUgraphNode nodes[64];
  size_t n = 64;
  if (d->GraphGetNodes(g, nodes, &n) != CUDA_SUCCESS)
    return 0;
  for (size_t i = 0; i < n && i < 64; i++) {
    CUgraphNodeType t;
    if (d->GraphNodeGetType(nodes[i], &t) == CUDA_SUCCESS && t == type)
      return 1;
  }
  return 0;
}

/* Ends s's capture, which must end cleanly; with `type` >= 0 its graph must
 * hold a node of that type (`missing` otherwise). NULL when it holds. */
static const char *end_clean(scope *sc, CUstream s, int type, const char *missing, char *why,
                             size_t n) {
  const dlsync__driver *d = sc->d;
  CUgraph g = NULL;
  CUresult r = d->StreamEndCapture(s, &g);
  scope_keep(sc, g);
  if (r != CUDA_SUCCESS)
    return said(why, n, d, "cuStreamEndCapture", r, "CUDA_SUCCESS");
  if (type >= 0 && !has_node(d, g, (CUgraphNodeType)type))
    return missing;
  return NULL;
}

static const char *join_rule(const dlsync__driver *d, CUdeviceptr buf, char *why, size_t n) {
  scope sc;
  const char *res = "setup failed";
  CUresult r;
  CUgraph g = NULL;
  if (scope_open(&sc, d) != CUDA_SUCCESS || BEGIN(sc.s[0]) != CUDA_SUCCESS ||
      d->MemsetD32Async(buf, 1, 1, sc.s[0]) != CUDA_SUCCESS ||
      d->EventRecord(sc.e[0], sc.s[0]) != CUDA_SUCCESS)
    goto done;
  r = d->StreamWaitEvent(sc.s[1], sc.e[0], 0);
  if (r != CUDA_SUCCESS) {
    res = said(why, n, d, "cuStreamWaitEvent", r, "CUDA_SUCCESS (a join)");
    goto done;
  }
  if (capture_id(d, sc.s[1]) == 0 || capture_id(d, sc.s[1]) != capture_id(d, sc.s[0])) {
    res = "the waiting stream is not in the producer's capture";
    goto done;
  }
  /* Joined back: the capture ends cleanly. */
  if (d->MemsetD32Async(buf, 2, 1, sc.s[1]) != CUDA_SUCCESS ||
      d->EventRecord(sc.e[1], sc.s[1]) != CUDA_SUCCESS ||
      d->StreamWaitEvent(sc.s[0], sc.e[1], 0) != CUDA_SUCCESS)
    goto done;
  r = d->StreamEndCapture(sc.s[0], &g);
  scope_keep(&sc, g);
  res = r == CUDA_SUCCESS ? NULL : said(why, n, d, "cuStreamEndCapture", r, "CUDA_SUCCESS");
done:
  scope_close(&sc);
  return res;
}

static const char *unjoined_rule(const dlsync__driver *d, CUdeviceptr buf, char *why, size_t n) {
  scope sc;
  const char *res = "setup failed";
  CUresult r;
  CUgraph g = NULL;
  if (scope_open(&sc, d) != CUDA_SUCCESS || BEGIN(sc.s[0]) != CUDA_SUCCESS ||
      d->MemsetD32Async(buf, 1, 1, sc.s[0]) != CUDA_SUCCESS ||
      d->EventRecord(sc.e[0], sc.s[0]) != CUDA_SUCCESS ||
      d->StreamWaitEvent(sc.s[1], sc.e[0], 0) != CUDA_SUCCESS ||
      d->MemsetD32Async(buf, 2, 1, sc.s[1]) != CUDA_SUCCESS)
    goto done;
  r = d->StreamEndCapture(sc.s[0], &g);
  scope_keep(&sc, g);
  res = r == CUDA_ERROR_STREAM_CAPTURE_UNJOINED
            ? NULL
            : said(why, n, d, "cuStreamEndCapture", r, "CUDA_ERROR_STREAM_CAPTURE_UNJOINED");
done:
  scope_close(&sc);
  return res;
}

static const char *isolation_rule(const dlsync__driver *d, CUdeviceptr buf, char *why, size_t n) {
  scope sc;
  const char *res = "setup failed";
  CUresult r;
  if (scope_open(&sc, d) != CUDA_SUCCESS || d->EventRecord(sc.e[0], sc.s[0]) != CUDA_SUCCESS ||
      BEGIN(sc.s[1]) != CUDA_SUCCESS || d->MemsetD32Async(buf, 1, 1, sc.s[1]) != CUDA_SUCCESS)
    goto done;
  r = d->StreamWaitEvent(sc.s[1], sc.e[0], 0);
  if (r != CUDA_ERROR_STREAM_CAPTURE_ISOLATION)
    res = said(why, n, d, "cuStreamWaitEvent", r, "CUDA_ERROR_STREAM_CAPTURE_ISOLATION");
  else if (capture_status(d, sc.s[1]) != CU_STREAM_CAPTURE_STATUS_INVALIDATED)
    res = "the capture was not invalidated";
  else
    res = NULL;
done:
  scope_close(&sc);
  return res;
}

static const char *merge_rule(const dlsync__driver *d, CUdeviceptr buf, char *why, size_t n) {
  scope sc;
  const char *res = "setup failed";
  CUresult r;
  if (scope_open(&sc, d) != CUDA_SUCCESS || BEGIN(sc.s[0]) != CUDA_SUCCESS ||
      BEGIN(sc.s[1]) != CUDA_SUCCESS || d->MemsetD32Async(buf, 1, 1, sc.s[0]) != CUDA_SUCCESS ||
      d->EventRecord(sc.e[0], sc.s[0]) != CUDA_SUCCESS)
    goto done;
  r = d->StreamWaitEvent(sc.s[1], sc.e[0], 0);
  if (r != CUDA_ERROR_STREAM_CAPTURE_MERGE)
    res = said(why, n, d, "cuStreamWaitEvent", r, "CUDA_ERROR_STREAM_CAPTURE_MERGE");
  else if (capture_status(d, sc.s[0]) != CU_STREAM_CAPTURE_STATUS_INVALIDATED ||
           capture_status(d, sc.s[1]) != CU_STREAM_CAPTURE_STATUS_INVALIDATED)
    res = "the two captures were not both invalidated";
  else
    res = NULL;
done:
  scope_close(&sc);
  return res;
}

static const char *external_wait_rule(const dlsync__driver *d, CUdeviceptr buf, char *why,
                                      size_t n) {
  scope sc;
  const char *res = "setup failed";
  CUresult r;
  if (scope_open(&sc, d) != CUDA_SUCCESS || d->EventRecord(sc.e[0], sc.s[0]) != CUDA_SUCCESS ||
      BEGIN(sc.s[1]) != CUDA_SUCCESS || d->MemsetD32Async(buf, 1, 1, sc.s[1]) != CUDA_SUCCESS)
    goto done;
  r = d->StreamWaitEvent(sc.s[1], sc.e[0], CU_EVENT_WAIT_EXTERNAL);
  if (r != CUDA_SUCCESS) {
    res = said(why, n, d, "cuStreamWaitEvent(EXTERNAL)", r, "CUDA_SUCCESS");
    goto done;
  }
  res = end_clean(&sc, sc.s[1], CU_GRAPH_NODE_TYPE_WAIT_EVENT, "no event-wait node in the graph",
                  why, n);
done:
  scope_close(&sc);
  return res;
}

static const char *external_record_rule(const dlsync__driver *d, CUdeviceptr buf, char *why,
                                        size_t n) {
  scope sc;
  const char *res = "setup failed";
  CUresult r;
  if (scope_open(&sc, d) != CUDA_SUCCESS || BEGIN(sc.s[0]) != CUDA_SUCCESS ||
      d->MemsetD32Async(buf, 1, 1, sc.s[0]) != CUDA_SUCCESS)
    goto done;
  r = d->EventRecordWithFlags(sc.e[0], sc.s[0], CU_EVENT_RECORD_EXTERNAL);
  if (r != CUDA_SUCCESS) {
    res = said(why, n, d, "cuEventRecordWithFlags(EXTERNAL)", r, "CUDA_SUCCESS");
    goto done;
  }
  res = end_clean(&sc, sc.s[0], CU_GRAPH_NODE_TYPE_EVENT_RECORD,
                  "no event-record node in the graph", why, n);
done:
  scope_close(&sc);
  return res;
}

static const char *external_outside_rule(const dlsync__driver *d, CUdeviceptr buf, char *why,
                                         size_t n) {
  scope sc;
  const char *res = "setup failed";
  CUresult r;
  (void)buf;
  if (scope_open(&sc, d) != CUDA_SUCCESS)
    goto done;
  r = d->EventRecordWithFlags(sc.e[0], sc.s[0], CU_EVENT_RECORD_EXTERNAL);
  if (r != CUDA_ERROR_ILLEGAL_STATE) {
    res = said(why, n, d, "cuEventRecordWithFlags(EXTERNAL) outside capture", r,
               "CUDA_ERROR_ILLEGAL_STATE");
    goto done;
  }
  if (d->EventRecord(sc.e[0], sc.s[0]) != CUDA_SUCCESS)
    goto done;
  r = d->StreamWaitEvent(sc.s[1], sc.e[0], CU_EVENT_WAIT_EXTERNAL);
  res = r == CUDA_ERROR_ILLEGAL_STATE
            ? NULL
            : said(why, n, d, "cuStreamWaitEvent(EXTERNAL) outside capture", r,
                   "CUDA_ERROR_ILLEGAL_STATE");
done:
  scope_close(&sc);
  return res;
}

static const char *legacy_query_rule(const dlsync__driver *d, CUdeviceptr buf, char *why,
                                     size_t n) {
  scope sc;
  const char *res = "setup failed";
  CUresult r;
  CUstream blocking = NULL;
  CUstreamCaptureStatus cs;
  cuuint64_t id;
  CUgraph g = NULL;
  if (scope_open(&sc, d) != CUDA_SUCCESS || d->StreamCreate(&blocking, 0) != CUDA_SUCCESS ||
      d->StreamBeginCapture(blocking, CU_STREAM_CAPTURE_MODE_GLOBAL) != CUDA_SUCCESS ||
      d->MemsetD32Async(buf, 1, 1, blocking) != CUDA_SUCCESS)
    goto done;
  r = d->StreamGetCaptureInfo(CU_STREAM_LEGACY, &cs, &id, NULL, NULL, NULL, NULL);
  if (r != CUDA_ERROR_STREAM_CAPTURE_IMPLICIT) {
    res =
        said(why, n, d, "cuStreamGetCaptureInfo(legacy)", r, "CUDA_ERROR_STREAM_CAPTURE_IMPLICIT");
    goto done;
  }
  r = d->StreamEndCapture(blocking, &g);
  scope_keep(&sc, g);
  res = r == CUDA_SUCCESS ? NULL
                          : said(why, n, d, "cuStreamEndCapture after the query", r,
                                 "CUDA_SUCCESS (the capture goes on)");
done:
  if (blocking != NULL) {
    if (capture_status(d, blocking) != CU_STREAM_CAPTURE_STATUS_NONE) {
      (void)d->StreamEndCapture(blocking, &g);
      scope_keep(&sc, g);
    }
    (void)d->StreamDestroy(blocking);
  }
  scope_close(&sc);
  return res;
}

static const char *manual_append_rule(const dlsync__driver *d, CUdeviceptr buf, char *why,
                                      size_t n) {
  scope sc;
  const char *res = "setup failed";
  CUresult r;
  CUstreamCaptureStatus cs;
  cuuint64_t id;
  CUgraph cg = NULL;
  const CUgraphNode *deps = NULL;
  const CUgraphEdgeData *edges = NULL;
  size_t nd = 0;
  CUgraphNode node = NULL, copy[8];
  if (scope_open(&sc, d) != CUDA_SUCCESS || BEGIN(sc.s[0]) != CUDA_SUCCESS ||
      d->MemsetD32Async(buf, 1, 1, sc.s[0]) != CUDA_SUCCESS)
    goto done;
  r = d->StreamGetCaptureInfo(sc.s[0], &cs, &id, &cg, &deps, &edges, &nd);
  if (r != CUDA_SUCCESS || nd > 8) {
    res = said(why, n, d, "cuStreamGetCaptureInfo", r, "CUDA_SUCCESS");
    goto done;
  }
  memcpy(copy, deps, nd * sizeof *copy);
  r = d->GraphAddEventRecordNode(&node, cg, copy, nd, sc.e[0]);
  if (r != CUDA_SUCCESS) {
    res = said(why, n, d, "cuGraphAddEventRecordNode", r, "CUDA_SUCCESS");
    goto done;
  }
  r = d->StreamUpdateCaptureDependencies(sc.s[0], &node, NULL, 1,
                                         CU_STREAM_SET_CAPTURE_DEPENDENCIES);
  if (r != CUDA_SUCCESS) {
    res = said(why, n, d, "cuStreamUpdateCaptureDependencies(SET)", r, "CUDA_SUCCESS");
    goto done;
  }
  if (d->MemsetD32Async(buf, 2, 1, sc.s[0]) != CUDA_SUCCESS)
    goto done;
  res =
      end_clean(&sc, sc.s[0], CU_GRAPH_NODE_TYPE_EVENT_RECORD, "the appended node is gone", why, n);
done:
  scope_close(&sc);
  return res;
}

static const char *record_node_wait_rule(const dlsync__driver *d, CUdeviceptr buf, char *why,
                                         size_t n) {
  scope sc;
  const char *res = "setup failed";
  CUresult r;
  if (scope_open(&sc, d) != CUDA_SUCCESS || BEGIN(sc.s[0]) != CUDA_SUCCESS ||
      d->MemsetD32Async(buf, 1, 1, sc.s[0]) != CUDA_SUCCESS ||
      d->EventRecordWithFlags(sc.e[0], sc.s[0], CU_EVENT_RECORD_EXTERNAL) != CUDA_SUCCESS)
    goto done;
  r = d->StreamWaitEvent(sc.s[1], sc.e[0], 0);
  if (r != CUDA_SUCCESS) {
    res = said(why, n, d, "cuStreamWaitEvent on an active record node's event", r,
               "CUDA_SUCCESS (an ordinary eager wait)");
    goto done;
  }
  if (capture_status(d, sc.s[1]) != CU_STREAM_CAPTURE_STATUS_NONE) {
    snprintf(why, n, "the eager waiter joined capture %llu (the producer's is %llu)",
             (unsigned long long)capture_id(d, sc.s[1]),
             (unsigned long long)capture_id(d, sc.s[0]));
    res = why;
    goto done;
  }
  res = end_clean(&sc, sc.s[0], -1, NULL, why, n); /* the producer's capture is unharmed */
done:
  scope_close(&sc);
  return res;
}

/* How many of the n streams report capture `id` as active. */
static int active_in(const dlsync__driver *d, const CUstream *s, int n, uint64_t id) {
  int k = 0;
  for (int i = 0; i < n; i++)
    k += id != 0 && capture_id(d, s[i]) == id;
  return k;
}

/* Some of the n streams in capture `id` and some not: what each says. */
static const char *split_capture(const dlsync__driver *d, const CUstream *s, int n, uint64_t id,
                                 const char *after, char *why, size_t size) {
  int k = active_in(d, s, n, id);
  if (k == 0 || k == n)
    return NULL;
  snprintf(why, size, "after %s, %d of the capture's %d streams still report it active", after, k,
           n);
  return why;
}

/* A stream that joined a capture leaves it only with all the others: no
 * stream reports the capture active while another of its streams does not.
 * Tried: ending it on a stream that is not its origin, ending it on its
 * origin with a joined stream's work unjoined, ending it cleanly; and a new
 * capture never has an ended one's id. (Why end's fast path may ask the
 * consumer alone when begin found both streams in one capture.) */
static const char *stays_in_capture_rule(const dlsync__driver *d, CUdeviceptr buf, char *why,
                                         size_t n) {
  scope sc;
  const char *res = "setup failed";
  CUresult r;
  CUgraph g = NULL;
  uint64_t id;
  if (scope_open(&sc, d) != CUDA_SUCCESS)
    goto done;
  /* Ended on a joined stream (not the origin). */
  if (BEGIN(sc.s[0]) != CUDA_SUCCESS || d->MemsetD32Async(buf, 1, 1, sc.s[0]) != CUDA_SUCCESS ||
      d->EventRecord(sc.e[0], sc.s[0]) != CUDA_SUCCESS ||
      d->StreamWaitEvent(sc.s[1], sc.e[0], 0) != CUDA_SUCCESS ||
      d->StreamWaitEvent(sc.s[2], sc.e[0], 0) != CUDA_SUCCESS)
    goto done;
  id = capture_id(d, sc.s[0]);
  if (active_in(d, sc.s, 3, id) != 3) {
    res = "the joined streams do not report the origin's capture";
    goto done;
  }
  r = d->StreamEndCapture(sc.s[1], &g);
  scope_keep(&sc, g);
  if (r == CUDA_SUCCESS) {
    res = said(why, n, d, "cuStreamEndCapture on a joined stream", r, "an error");
    goto done;
  }
  if ((res = split_capture(d, sc.s, 3, id, "cuStreamEndCapture on a joined stream", why, n)))
    goto done;
  if (active_in(d, sc.s, 3, id) == 3) { /* still going: end it on its origin */
    if (d->EventRecord(sc.e[1], sc.s[1]) != CUDA_SUCCESS ||
        d->StreamWaitEvent(sc.s[0], sc.e[1], 0) != CUDA_SUCCESS)
      goto done;
    (void)d->StreamEndCapture(sc.s[0], &g);
    scope_keep(&sc, g);
  }
  for (int i = 0; i < 3; i++) /* a failed end may leave them invalidated: end that too */
    if (capture_status(d, sc.s[i]) != CU_STREAM_CAPTURE_STATUS_NONE) {
      g = NULL;
      (void)d->StreamEndCapture(sc.s[i], &g);
      scope_keep(&sc, g);
    }
  /* Ended on its origin with a joined stream's work unjoined. */
  res = "setup failed";
  if (BEGIN(sc.s[0]) != CUDA_SUCCESS || d->EventRecord(sc.e[0], sc.s[0]) != CUDA_SUCCESS ||
      d->StreamWaitEvent(sc.s[1], sc.e[0], 0) != CUDA_SUCCESS ||
      d->MemsetD32Async(buf, 2, 1, sc.s[1]) != CUDA_SUCCESS)
    goto done;
  id = capture_id(d, sc.s[0]);
  g = NULL;
  r = d->StreamEndCapture(sc.s[0], &g);
  scope_keep(&sc, g);
  if (r != CUDA_ERROR_STREAM_CAPTURE_UNJOINED) {
    res = said(why, n, d, "cuStreamEndCapture with unjoined work", r,
               "CUDA_ERROR_STREAM_CAPTURE_UNJOINED");
    goto done;
  }
  if (active_in(d, sc.s, 2, id) != 0) {
    snprintf(why, n, "after an UNJOINED end, %d stream(s) still report the capture active",
             active_in(d, sc.s, 2, id));
    res = why;
    goto done;
  }
  /* Ended cleanly; a new capture on the joined stream has a new id. */
  res = "setup failed";
  if (BEGIN(sc.s[0]) != CUDA_SUCCESS || d->EventRecord(sc.e[0], sc.s[0]) != CUDA_SUCCESS ||
      d->StreamWaitEvent(sc.s[1], sc.e[0], 0) != CUDA_SUCCESS ||
      d->EventRecord(sc.e[1], sc.s[1]) != CUDA_SUCCESS ||
      d->StreamWaitEvent(sc.s[0], sc.e[1], 0) != CUDA_SUCCESS)
    goto done;
  id = capture_id(d, sc.s[0]);
  if ((res = end_clean(&sc, sc.s[0], -1, NULL, why, n)))
    goto done;
  if (active_in(d, sc.s, 2, id) != 0) {
    res = "after a clean end, a joined stream still reports the capture active";
    goto done;
  }
  res = "setup failed";
  if (BEGIN(sc.s[1]) != CUDA_SUCCESS)
    goto done;
  res = capture_id(d, sc.s[1]) != id ? NULL : "a new capture has the id of an ended one";
done:
  scope_close(&sc);
  return res;
}

/* The dependency set of a capturing stream (full query): its first node
 * in *node, the count returned (0 on failure). */
static size_t deps_of(const dlsync__driver *d, CUstream s, const CUgraphNode **deps,
                      CUgraphNode *node) {
  CUstreamCaptureStatus cs;
  cuuint64_t id;
  const CUgraphEdgeData *edges = NULL;
  size_t n = 0;
  *deps = NULL;
  if (d->StreamGetCaptureInfo(s, &cs, &id, NULL, deps, &edges, &n) != CUDA_SUCCESS ||
      cs != CU_STREAM_CAPTURE_STATUS_ACTIVE)
    return 0;
  if (node != NULL && n > 0)
    *node = (*deps)[0];
  return n;
}

/* Does g hold the edge from -> to, and how many edges end at `to`? */
static int edges_into(const dlsync__driver *d, CUgraph g, CUgraphNode to, CUgraphNode a,
                      CUgraphNode b, int *total) {
  CUgraphNode from[32], dst[32];
  size_t n = 32;
  int in = 0, hit = 0;
  *total = -1;
  if (d->GraphGetEdges(g, from, dst, NULL, &n) != CUDA_SUCCESS || n > 32)
    return 0;
  *total = (int)n;
  for (size_t i = 0; i < n; i++)
    if (dst[i] == to) {
      in++;
      hit += from[i] == a || from[i] == b;
    }
  return in == 2 && hit == 2;
}

static CUresult add_from(const dlsync__driver *d, CUstream to, const CUgraphNode *deps, size_t n) {
  return d->StreamUpdateCaptureDependencies(to, (CUgraphNode *)(uintptr_t)deps, NULL, n,
                                            CU_STREAM_ADD_CAPTURE_DEPENDENCIES);
}

/* Inside one capture, adding one stream's dependency set to another's
 * (cuStreamUpdateCaptureDependencies, ADD, the first stream's array passed
 * as the query gave it) orders them as a record on the first and a wait on
 * the second would: the second's next node depends on both streams' last
 * nodes, a node added twice is there once, and the same add back joins the
 * second stream for the capture's end (it ends cleanly). On an eager stream
 * it is refused (ILLEGAL_STATE) and the capture goes on. (Why SAME_CAPTURE
 * adds dependencies in place of a record and a wait.) */
static const char *add_join_rule(const dlsync__driver *d, CUdeviceptr buf, char *why, size_t n) {
  scope sc;
  const char *res = "setup failed";
  CUresult r;
  CUgraph g = NULL;
  const CUgraphNode *deps;
  CUgraphNode b = NULL, c = NULL, dn = NULL, e = NULL;
  size_t nd;
  int total = 0;
  if (scope_open(&sc, d) != CUDA_SUCCESS || BEGIN(sc.s[0]) != CUDA_SUCCESS ||
      d->MemsetD32Async(buf, 1, 1, sc.s[0]) != CUDA_SUCCESS ||
      d->EventRecord(sc.e[0], sc.s[0]) != CUDA_SUCCESS ||
      d->StreamWaitEvent(sc.s[1], sc.e[0], 0) != CUDA_SUCCESS ||
      d->MemsetD32Async(buf, 2, 1, sc.s[1]) != CUDA_SUCCESS ||
      deps_of(d, sc.s[1], &deps, &b) != 1 ||
      d->MemsetD32Async(buf, 3, 1, sc.s[0]) != CUDA_SUCCESS ||
      (nd = deps_of(d, sc.s[0], &deps, &c)) != 1)
    goto done;
  for (int twice = 0; twice < 2; twice++) {
    nd = deps_of(d, sc.s[0], &deps, NULL);
    r = add_from(d, sc.s[1], deps, nd);
    if (r != CUDA_SUCCESS) {
      res = said(why, n, d, "cuStreamUpdateCaptureDependencies(ADD)", r, "CUDA_SUCCESS");
      goto done;
    }
  }
  nd = deps_of(d, sc.s[1], &deps, NULL);
  if (nd != 2) {
    snprintf(why, n, "after adding the other stream's one node twice, %zu dependencies (want 2)",
             nd);
    res = why;
    goto done;
  }
  res = "setup failed";
  if (d->MemsetD32Async(buf, 4, 1, sc.s[1]) != CUDA_SUCCESS ||
      (nd = deps_of(d, sc.s[1], &deps, &dn)) != 1)
    goto done;
  r = add_from(d, sc.s[0], deps, nd); /* the join back, by ADD alone */
  if (r != CUDA_SUCCESS) {
    res = said(why, n, d, "cuStreamUpdateCaptureDependencies(ADD) back", r, "CUDA_SUCCESS");
    goto done;
  }
  if (d->MemsetD32Async(buf, 5, 1, sc.s[0]) != CUDA_SUCCESS || deps_of(d, sc.s[0], &deps, &e) != 1)
    goto done;
  nd = deps_of(d, sc.s[0], &deps, NULL);
  r = add_from(d, sc.s[2], deps, nd);
  if (r != CUDA_ERROR_ILLEGAL_STATE) {
    res = said(why, n, d, "cuStreamUpdateCaptureDependencies(ADD) on an eager stream", r,
               "CUDA_ERROR_ILLEGAL_STATE");
    goto done;
  }
  r = d->StreamEndCapture(sc.s[0], &g);
  scope_keep(&sc, g);
  if (r != CUDA_SUCCESS) {
    res = said(why, n, d, "cuStreamEndCapture after a join back by ADD", r, "CUDA_SUCCESS");
    goto done;
  }
  if (!edges_into(d, g, dn, b, c, &total) || !edges_into(d, g, e, c, dn, &total) || total != 6) {
    snprintf(why, n,
             "the graph's edges are not a record and wait's (%d edges, want 6: the second "
             "stream's node after both streams' nodes, the first's after both again)",
             total);
    res = why;
    goto done;
  }
  res = NULL;
done:
  scope_close(&sc);
  return res;
}

/* The first node of s's dependency set is of `type`, and the set is that
 * one node. */
static bool deps_one_of(const dlsync__driver *d, CUstream s, CUgraphNodeType type) {
  const CUgraphNode *deps;
  CUgraphNode node = NULL;
  CUgraphNodeType t;
  return deps_of(d, s, &deps, &node) == 1 && d->GraphNodeGetType(node, &t) == CUDA_SUCCESS &&
         t == type;
}

/* An external record in one capture and an external wait on that event in
 * another, active capture: both accepted, each in every capture mode and
 * whichever capture ends first; the first stream's next node follows an
 * event-record node, the second's an event-wait node, and both end cleanly.
 * (How TWO_CAPTURES links two captures.) */
static const char *external_pair_rule(const dlsync__driver *d, CUdeviceptr buf, char *why,
                                      size_t n) {
  static const char *mode_names[] = {"GLOBAL", "THREAD_LOCAL", "RELAXED"};
  static const CUstreamCaptureMode modes[] = {CU_STREAM_CAPTURE_MODE_GLOBAL,
                                              CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
                                              CU_STREAM_CAPTURE_MODE_RELAXED};
  const char *res = NULL;
  for (int k = 0; k < 6 && res == NULL; k++) {
    scope sc;
    CUresult r;
    CUstream first_end, second_end;
    char what[96];
    res = "setup failed";
    if (scope_open(&sc, d) != CUDA_SUCCESS ||
        d->StreamBeginCapture(sc.s[0], modes[k / 2]) != CUDA_SUCCESS ||
        d->StreamBeginCapture(sc.s[1], modes[k / 2]) != CUDA_SUCCESS ||
        d->MemsetD32Async(buf, 1, 1, sc.s[0]) != CUDA_SUCCESS ||
        d->MemsetD32Async(buf, 2, 1, sc.s[1]) != CUDA_SUCCESS ||
        capture_id(d, sc.s[0]) == capture_id(d, sc.s[1]))
      goto next;
    snprintf(what, sizeof what, "cuEventRecordWithFlags(EXTERNAL) in a %s capture",
             mode_names[k / 2]);
    r = d->EventRecordWithFlags(sc.e[0], sc.s[0], CU_EVENT_RECORD_EXTERNAL);
    if (r != CUDA_SUCCESS) {
      res = said(why, n, d, what, r, "CUDA_SUCCESS");
      goto next;
    }
    snprintf(what, sizeof what,
             "cuStreamWaitEvent(EXTERNAL) in another %s capture on its record node's event",
             mode_names[k / 2]);
    r = d->StreamWaitEvent(sc.s[1], sc.e[0], CU_EVENT_WAIT_EXTERNAL);
    if (r != CUDA_SUCCESS) {
      res = said(why, n, d, what, r, "CUDA_SUCCESS");
      goto next;
    }
    if (!deps_one_of(d, sc.s[0], CU_GRAPH_NODE_TYPE_EVENT_RECORD) ||
        !deps_one_of(d, sc.s[1], CU_GRAPH_NODE_TYPE_WAIT_EVENT)) {
      res = "the streams' dependencies are not the record node and the wait node";
      goto next;
    }
    first_end = k % 2 == 0 ? sc.s[0] : sc.s[1];
    second_end = k % 2 == 0 ? sc.s[1] : sc.s[0];
    res = end_clean(&sc, first_end, -1, NULL, why, n);
    if (res == NULL)
      res = end_clean(&sc, second_end, -1, NULL, why, n);
    if (res == NULL &&
        (!has_node(d, sc.g[0],
                   k % 2 == 0 ? CU_GRAPH_NODE_TYPE_EVENT_RECORD : CU_GRAPH_NODE_TYPE_WAIT_EVENT) ||
         !has_node(d, sc.g[1],
                   k % 2 == 0 ? CU_GRAPH_NODE_TYPE_WAIT_EVENT : CU_GRAPH_NODE_TYPE_EVENT_RECORD)))
      res = "a graph lacks its event-record or event-wait node";
  next:
    scope_close(&sc);
  }
  return res;
}

static bool eager_answer(CUresult r) {
  return r == CUDA_SUCCESS || r == CUDA_ERROR_NOT_READY;
}

/* R40: in a GLOBAL capture of this thread, with the thread switched to
 * RELAXED: a query of an eagerly recorded event and of one recorded by an
 * external record node of the capture answers as for an eager event, and the
 * capture stays active and ends cleanly. */
static const char *query_in_capture_rule(const dlsync__driver *d, CUdeviceptr buf, char *why,
                                         size_t n) {
  scope sc;
  const char *res = "setup failed";
  CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_RELAXED;
  CUevent ext = NULL;
  CUresult q_eager, q_ext, r;
  bool switched = false;
  if (scope_open(&sc, d) != CUDA_SUCCESS ||
      d->EventCreate(&ext, CU_EVENT_DISABLE_TIMING) != CUDA_SUCCESS ||
      d->MemsetD32Async(buf, 3, 1, sc.s[2]) != CUDA_SUCCESS ||
      d->EventRecord(sc.e[1], sc.s[2]) != CUDA_SUCCESS ||
      d->StreamBeginCapture(sc.s[0], CU_STREAM_CAPTURE_MODE_GLOBAL) != CUDA_SUCCESS ||
      d->MemsetD32Async(buf, 1, 1, sc.s[0]) != CUDA_SUCCESS ||
      d->EventRecordWithFlags(ext, sc.s[0], CU_EVENT_RECORD_EXTERNAL) != CUDA_SUCCESS)
    goto done;
  r = d->ThreadExchangeStreamCaptureMode(&mode);
  if (r != CUDA_SUCCESS) {
    res = said(why, n, d, "cuThreadExchangeStreamCaptureMode(RELAXED) during a capture", r,
               "CUDA_SUCCESS");
    goto done;
  }
  switched = true;
  q_eager = d->EventQuery(sc.e[1]);
  q_ext = d->EventQuery(ext);
  r = d->ThreadExchangeStreamCaptureMode(&mode);
  switched = r != CUDA_SUCCESS;
  if (r != CUDA_SUCCESS || mode != CU_STREAM_CAPTURE_MODE_RELAXED) {
    res = "cuThreadExchangeStreamCaptureMode did not give back RELAXED when restoring";
    goto done;
  }
  if (!eager_answer(q_eager)) {
    res = said(why, n, d, "cuEventQuery (RELAXED) of an eagerly recorded event", q_eager,
               "CUDA_SUCCESS or CUDA_ERROR_NOT_READY");
    goto done;
  }
  if (!eager_answer(q_ext)) {
    res = said(why, n, d, "cuEventQuery (RELAXED) of an event recorded by an external record node",
               q_ext, "CUDA_SUCCESS or CUDA_ERROR_NOT_READY");
    goto done;
  }
  if (capture_status(d, sc.s[0]) != CU_STREAM_CAPTURE_STATUS_ACTIVE) {
    res = "the GLOBAL capture is no longer active after the queries";
    goto done;
  }
  res = end_clean(&sc, sc.s[0], CU_GRAPH_NODE_TYPE_EVENT_RECORD,
                  "the capture's graph lacks the external record node", why, n);
done:
  if (switched) { /* back to the thread's mode before the rule */
    mode = CU_STREAM_CAPTURE_MODE_GLOBAL;
    (void)d->ThreadExchangeStreamCaptureMode(&mode);
  }
  scope_close(&sc);
  if (ext != NULL)
    (void)d->EventDestroy(ext);
  return res;
}

/* R41: a query of an event plainly recorded in an active capture, even by a
 * thread switched to RELAXED: CUDA_ERROR_CAPTURED_EVENT, and that capture is
 * invalidated (so dlsync never queries an event declared CAPTURED). */
static const char *query_captured_event_rule(const dlsync__driver *d, CUdeviceptr buf, char *why,
                                             size_t n) {
  scope sc;
  const char *res = "setup failed";
  CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_RELAXED;
  CUresult q_plain, r;
  bool switched = false;
  if (scope_open(&sc, d) != CUDA_SUCCESS ||
      d->StreamBeginCapture(sc.s[0], CU_STREAM_CAPTURE_MODE_GLOBAL) != CUDA_SUCCESS ||
      d->MemsetD32Async(buf, 1, 1, sc.s[0]) != CUDA_SUCCESS ||
      d->EventRecord(sc.e[0], sc.s[0]) != CUDA_SUCCESS)
    goto done;
  r = d->ThreadExchangeStreamCaptureMode(&mode);
  if (r != CUDA_SUCCESS) {
    res = said(why, n, d, "cuThreadExchangeStreamCaptureMode(RELAXED) during a capture", r,
               "CUDA_SUCCESS");
    goto done;
  }
  switched = true;
  q_plain = d->EventQuery(sc.e[0]);
  r = d->ThreadExchangeStreamCaptureMode(&mode);
  switched = r != CUDA_SUCCESS;
  if (q_plain != CUDA_ERROR_CAPTURED_EVENT) {
    res = said(why, n, d, "cuEventQuery (RELAXED) of an event plainly recorded in the capture",
               q_plain, "CUDA_ERROR_CAPTURED_EVENT");
    goto done;
  }
  if (capture_status(d, sc.s[0]) != CU_STREAM_CAPTURE_STATUS_INVALIDATED) {
    res = "the capture is not invalidated after the query of its plainly recorded event";
    goto done;
  }
  res = NULL;
done:
  if (switched) {
    mode = CU_STREAM_CAPTURE_MODE_GLOBAL;
    (void)d->ThreadExchangeStreamCaptureMode(&mode);
  }
  {
    CUgraph g = NULL;
    if (capture_status(d, sc.s[0]) != CU_STREAM_CAPTURE_STATUS_NONE &&
        d->StreamEndCapture(sc.s[0], &g) == CUDA_SUCCESS && g != NULL)
      (void)d->GraphDestroy(g);
  }
  scope_close(&sc);
  return res;
}

/* A graph with one IF node (its handle made in the calling thread's
 * current context, default 1 at each launch): *parent owns it, *body is its
 * body. CUDA_SUCCESS or the first failing call's result. */
static CUresult if_node(const dlsync__driver *d, CUgraph *parent, CUgraph *body) {
  CUcontext c = NULL;
  CUgraphConditionalHandle h = 0;
  CUgraphNodeParams p;
  CUgraphNode node = NULL;
  CUresult r;
  *parent = NULL;
  *body = NULL;
  if ((r = d->CtxGetCurrent(&c)) != CUDA_SUCCESS || (r = d->GraphCreate(parent, 0)) != CUDA_SUCCESS)
    return r;
  r = d->GraphConditionalHandleCreate(&h, *parent, c, 1, CU_GRAPH_COND_ASSIGN_DEFAULT);
  if (r != CUDA_SUCCESS)
    return r;
  memset(&p, 0, sizeof p);
  p.type = CU_GRAPH_NODE_TYPE_CONDITIONAL;
  p.conditional.handle = h;
  p.conditional.type = CU_GRAPH_COND_TYPE_IF;
  p.conditional.size = 1;
  p.conditional.ctx = c;
  r = d->GraphAddNode(&node, *parent, NULL, NULL, 0, &p);
  if (r == CUDA_SUCCESS)
    *body = p.conditional.phGraph_out[0];
  return r;
}

/* Ends a capture into a body still going on s (a check that failed
 * midway), so that scope_close does not take the body for a graph of its
 * own: the parent owns it. */
static void end_body_capture(const dlsync__driver *d, CUstream s) {
  CUgraph g = NULL;
  if (s != NULL && capture_status(d, s) != CU_STREAM_CAPTURE_STATUS_NONE)
    (void)d->StreamEndCapture(s, &g);
}

/* Instantiates g (and destroys the executable): the driver's answer. */
static CUresult instantiate(const dlsync__driver *d, CUgraph g) {
  CUgraphExec x = NULL;
  CUresult r = d->GraphInstantiateWithFlags(&x, g, 0);
  if (r == CUDA_SUCCESS)
    (void)d->GraphExecDestroy(x);
  return r;
}

/* A capture into an IF node's body (cuStreamBeginCaptureToGraph): the
 * capture's graph is the body itself; an external wait there on an eager
 * event is accepted and the capture ends cleanly; the parent graph's
 * instantiation then fails with INVALID_VALUE (what EAGER_TO_CAPTURE would
 * do inside a body, and why dlsync refuses it); a body of a memset only
 * instantiates. (dlsync's refusal compares the capture's graph with the
 * declared bodies, include/dlsync/conditional.h.) */
static const char *cond_body_rule(const dlsync__driver *d, CUdeviceptr buf, char *why, size_t n) {
  scope sc;
  CUgraph parent = NULL, body = NULL, got = NULL, ended = NULL;
  CUstreamCaptureStatus cs;
  const char *res = "setup failed";
  CUresult r;
  for (int with_wait = 0; with_wait < 2; with_wait++) {
    if (scope_open(&sc, d) != CUDA_SUCCESS)
      goto done;
    r = if_node(d, &parent, &body);
    scope_keep(&sc, parent);
    if (r != CUDA_SUCCESS) {
      res = said(why, n, d, "making a graph with an IF node", r, "CUDA_SUCCESS");
      goto done;
    }
    r = d->StreamBeginCaptureToGraph(sc.s[0], body, NULL, NULL, 0, CU_STREAM_CAPTURE_MODE_RELAXED);
    if (r != CUDA_SUCCESS) {
      res = said(why, n, d, "cuStreamBeginCaptureToGraph into the IF body", r, "CUDA_SUCCESS");
      goto done;
    }
    r = d->StreamGetCaptureInfo(sc.s[0], &cs, NULL, &got, NULL, NULL, NULL);
    if (r != CUDA_SUCCESS || got != body) {
      snprintf(why, n, "the capture's graph (cuStreamGetCaptureInfo: %s) is %p, not the body %p",
               dlsync__driver_error_name(d, r), (void *)got, (void *)body);
      res = why;
      goto done;
    }
    if (d->MemsetD32Async(buf, 1, 1, sc.s[0]) != CUDA_SUCCESS)
      goto done;
    if (with_wait) {
      if (d->EventRecord(sc.e[0], sc.s[1]) != CUDA_SUCCESS)
        goto done;
      r = d->StreamWaitEvent(sc.s[0], sc.e[0], CU_EVENT_WAIT_EXTERNAL);
      if (r != CUDA_SUCCESS) {
        res = said(why, n, d, "cuStreamWaitEvent(EXTERNAL) in a capture into an IF body", r,
                   "CUDA_SUCCESS (accepted; the instantiation fails)");
        goto done;
      }
    }
    r = d->StreamEndCapture(sc.s[0], &ended);
    if (r != CUDA_SUCCESS) {
      res = said(why, n, d, "cuStreamEndCapture of the body's capture", r, "CUDA_SUCCESS");
      goto done;
    }
    r = instantiate(d, parent);
    if (r != (with_wait ? CUDA_ERROR_INVALID_VALUE : CUDA_SUCCESS)) {
      res = said(why, n, d,
                 with_wait ? "cuGraphInstantiate of the parent, an event-wait node in its body"
                           : "cuGraphInstantiate of the parent, a memset in its body",
                 r, with_wait ? "CUDA_ERROR_INVALID_VALUE" : "CUDA_SUCCESS");
      goto done;
    }
    scope_close(&sc);
    sc.d = NULL;
  }
  res = NULL;
done:
  if (sc.d != NULL) {
    end_body_capture(d, sc.s[0]);
    scope_close(&sc);
  }
  return res;
}

/* An event-wait node added by hand (cuGraphAddEventWaitNode) to an IF
 * node's body: the fake's guess, from the capture's case (R28), is that
 * the add is accepted and the parent's instantiation fails with
 * INVALID_VALUE. dlsync does not rely on it (it refuses the rows that would
 * add such a node to a declared body, whichever way); what the driver does
 * here says whether dlsync could find bodies itself, by the driver's answer
 * to such an add. */
static const char *cond_body_by_hand_rule(const dlsync__driver *d, CUdeviceptr buf, char *why,
                                          size_t n) {
  scope sc;
  CUgraph parent = NULL, body = NULL;
  CUgraphNode node = NULL;
  const char *res = "setup failed";
  CUresult r;
  (void)buf;
  if (scope_open(&sc, d) != CUDA_SUCCESS)
    goto done;
  r = if_node(d, &parent, &body);
  scope_keep(&sc, parent);
  if (r != CUDA_SUCCESS) {
    res = said(why, n, d, "making a graph with an IF node", r, "CUDA_SUCCESS");
    goto done;
  }
  if (d->EventRecord(sc.e[0], sc.s[1]) != CUDA_SUCCESS)
    goto done;
  r = d->GraphAddEventWaitNode(&node, body, NULL, 0, sc.e[0]);
  if (r != CUDA_SUCCESS) {
    res = said(why, n, d, "cuGraphAddEventWaitNode into an IF body (the driver refuses it at once)",
               r, "CUDA_SUCCESS, and the instantiation failing");
    goto done;
  }
  r = instantiate(d, parent);
  if (r != CUDA_ERROR_INVALID_VALUE) {
    res = said(why, n, d, "cuGraphInstantiate of the parent, a wait node added by hand in its body",
               r, "CUDA_ERROR_INVALID_VALUE");
    goto done;
  }
  res = NULL;
done:
  scope_close(&sc);
  return res;
}

/* Inside a capture into an IF node's body, the edge-only rows' calls work:
 * an eager stream joins the body's capture by a plain wait on an event
 * recorded there (JOIN), its work is added back by
 * cuStreamUpdateCaptureDependencies ADD (SAME_CAPTURE), the capture ends
 * cleanly and the parent instantiates and launches. */
static const char *cond_body_edges_rule(const dlsync__driver *d, CUdeviceptr buf, char *why,
                                        size_t n) {
  scope sc;
  CUgraph parent = NULL, body = NULL, ended = NULL;
  CUgraphExec x = NULL;
  const CUgraphNode *deps = NULL;
  size_t nd;
  const char *res = "setup failed";
  CUresult r;
  if (scope_open(&sc, d) != CUDA_SUCCESS)
    goto done;
  r = if_node(d, &parent, &body);
  scope_keep(&sc, parent);
  if (r != CUDA_SUCCESS) {
    res = said(why, n, d, "making a graph with an IF node", r, "CUDA_SUCCESS");
    goto done;
  }
  if (d->StreamBeginCaptureToGraph(sc.s[0], body, NULL, NULL, 0, CU_STREAM_CAPTURE_MODE_RELAXED) !=
          CUDA_SUCCESS ||
      d->MemsetD32Async(buf, 1, 1, sc.s[0]) != CUDA_SUCCESS ||
      d->EventRecord(sc.e[0], sc.s[0]) != CUDA_SUCCESS)
    goto done;
  r = d->StreamWaitEvent(sc.s[1], sc.e[0], 0);
  if (r != CUDA_SUCCESS || capture_id(d, sc.s[1]) != capture_id(d, sc.s[0])) {
    res = r != CUDA_SUCCESS
              ? said(why, n, d, "a plain wait joining the body's capture", r, "CUDA_SUCCESS")
              : "the waiting stream did not join the body's capture";
    goto done;
  }
  if (d->MemsetD32Async(buf, 2, 1, sc.s[1]) != CUDA_SUCCESS)
    goto done;
  nd = deps_of(d, sc.s[1], &deps, NULL);
  r = add_from(d, sc.s[0], deps, nd);
  if (r != CUDA_SUCCESS) {
    res = said(why, n, d, "cuStreamUpdateCaptureDependencies(ADD) inside the body's capture", r,
               "CUDA_SUCCESS");
    goto done;
  }
  r = d->StreamEndCapture(sc.s[0], &ended);
  if (r != CUDA_SUCCESS) {
    res =
        said(why, n, d, "cuStreamEndCapture of the body's capture after a join", r, "CUDA_SUCCESS");
    goto done;
  }
  r = d->GraphInstantiateWithFlags(&x, parent, 0);
  if (r != CUDA_SUCCESS) {
    res = said(why, n, d, "cuGraphInstantiate of the parent (edges only in its body)", r,
               "CUDA_SUCCESS");
    goto done;
  }
  r = d->GraphLaunch(x, sc.s[2]);
  if (r == CUDA_SUCCESS)
    r = d->StreamSynchronize(sc.s[2]);
  (void)d->GraphExecDestroy(x);
  if (r != CUDA_SUCCESS) {
    res = said(why, n, d, "launching the parent", r, "CUDA_SUCCESS");
    goto done;
  }
  res = NULL;
done:
  end_body_capture(d, sc.s[0]);
  scope_close(&sc);
  return res;
}

/* The hoist (dlsync_conditional_node_declare) into a parent being
 * captured: while stream 0 captures, an IF node added by hand to the
 * capture's graph at its dependencies and made its dependency (R9); a
 * capture into the IF's body on stream 1 (a memset). Into the capture's
 * graph, by hand and while both captures are active: an event-wait node with
 * no dependencies (cuGraphAddEventWaitNode) and an edge from it to the IF
 * node (cuGraphAddDependencies), then an event-record node after the IF
 * node (cuGraphAddEventRecordNode). Each call accepted, both captures end
 * cleanly, the parent instantiates and launches, and the record node's event
 * is complete after it. (That the wait orders the body's work: the GPU
 * suite's hoist rows.) */
static const char *cond_hoist_rule(const dlsync__driver *d, CUdeviceptr buf, char *why, size_t n) {
  scope sc;
  const char *res = "setup failed";
  CUresult r;
  CUstreamCaptureStatus cs;
  cuuint64_t id;
  CUcontext c = NULL;
  CUgraph cg = NULL, body = NULL, got = NULL;
  const CUgraphNode *deps = NULL;
  const CUgraphEdgeData *edges = NULL;
  size_t nd = 0;
  CUgraphConditionalHandle h = 0;
  CUgraphNodeParams p;
  CUgraphNode cond = NULL, wait = NULL, rec = NULL, copy[8];
  CUgraphExec x = NULL;
  if (scope_open(&sc, d) != CUDA_SUCCESS || d->CtxGetCurrent(&c) != CUDA_SUCCESS ||
      BEGIN(sc.s[0]) != CUDA_SUCCESS || d->MemsetD32Async(buf, 1, 1, sc.s[0]) != CUDA_SUCCESS)
    goto done;
  r = d->StreamGetCaptureInfo(sc.s[0], &cs, &id, &cg, &deps, &edges, &nd);
  if (r != CUDA_SUCCESS || nd > 8) {
    res = said(why, n, d, "cuStreamGetCaptureInfo", r, "CUDA_SUCCESS");
    goto done;
  }
  memcpy(copy, deps, nd * sizeof *copy);
  r = d->GraphConditionalHandleCreate(&h, cg, c, 1, CU_GRAPH_COND_ASSIGN_DEFAULT);
  if (r != CUDA_SUCCESS) {
    res =
        said(why, n, d, "cuGraphConditionalHandleCreate on the capture's graph", r, "CUDA_SUCCESS");
    goto done;
  }
  memset(&p, 0, sizeof p);
  p.type = CU_GRAPH_NODE_TYPE_CONDITIONAL;
  p.conditional.handle = h;
  p.conditional.type = CU_GRAPH_COND_TYPE_IF;
  p.conditional.size = 1;
  p.conditional.ctx = c;
  r = d->GraphAddNode(&cond, cg, copy, NULL, nd, &p);
  if (r == CUDA_SUCCESS)
    r = d->StreamUpdateCaptureDependencies(sc.s[0], &cond, NULL, 1,
                                           CU_STREAM_SET_CAPTURE_DEPENDENCIES);
  if (r != CUDA_SUCCESS) {
    res = said(why, n, d, "an IF node added to the capture's graph and made its dependency", r,
               "CUDA_SUCCESS");
    goto done;
  }
  body = p.conditional.phGraph_out[0];
  if (d->StreamBeginCaptureToGraph(sc.s[1], body, NULL, NULL, 0, CU_STREAM_CAPTURE_MODE_RELAXED) !=
          CUDA_SUCCESS ||
      d->MemsetD32Async(buf, 2, 1, sc.s[1]) != CUDA_SUCCESS)
    goto done;
  if (d->EventRecord(sc.e[0], sc.s[2]) != CUDA_SUCCESS)
    goto done;
  r = d->GraphAddEventWaitNode(&wait, cg, NULL, 0, sc.e[0]);
  if (r != CUDA_SUCCESS) {
    res =
        said(why, n, d, "cuGraphAddEventWaitNode (no dependencies) into an active capture's graph",
             r, "CUDA_SUCCESS");
    goto done;
  }
  r = d->GraphAddDependencies(cg, &wait, &cond, NULL, 1);
  if (r != CUDA_SUCCESS) {
    res = said(why, n, d,
               "cuGraphAddDependencies from a node added by hand to the captured IF node, the "
               "capture active",
               r, "CUDA_SUCCESS");
    goto done;
  }
  r = d->GraphAddEventRecordNode(&rec, cg, &cond, 1, sc.e[1]);
  if (r != CUDA_SUCCESS) {
    res =
        said(why, n, d, "cuGraphAddEventRecordNode after the IF node in an active capture's graph",
             r, "CUDA_SUCCESS");
    goto done;
  }
  r = d->StreamEndCapture(sc.s[1], &got);
  if (r != CUDA_SUCCESS) {
    res = said(why, n, d, "cuStreamEndCapture of the body's capture", r, "CUDA_SUCCESS");
    goto done;
  }
  if (d->MemsetD32Async(buf, 3, 1, sc.s[0]) != CUDA_SUCCESS)
    goto done;
  got = NULL;
  r = d->StreamEndCapture(sc.s[0], &got);
  scope_keep(&sc, got);
  if (r != CUDA_SUCCESS || got != cg) {
    res = said(why, n, d, "cuStreamEndCapture of the parent's capture", r,
               "CUDA_SUCCESS, the graph the nodes were added to");
    goto done;
  }
  r = d->GraphInstantiateWithFlags(&x, cg, 0);
  if (r != CUDA_SUCCESS) {
    res = said(why, n, d, "cuGraphInstantiate of the parent with the hoisted nodes", r,
               "CUDA_SUCCESS");
    goto done;
  }
  r = d->GraphLaunch(x, sc.s[0]);
  if (r == CUDA_SUCCESS)
    r = d->StreamSynchronize(sc.s[0]);
  if (r == CUDA_SUCCESS)
    r = d->EventQuery(sc.e[1]);
  (void)d->GraphExecDestroy(x);
  if (r != CUDA_SUCCESS) {
    res = said(why, n, d, "launching the parent, then its record node's event", r, "CUDA_SUCCESS");
    goto done;
  }
  res = NULL;
done:
  end_body_capture(d, sc.s[1]);
  scope_close(&sc);
  return res;
}

/* The edge data cuStreamGetCaptureInfo gives for a stream's dependencies is
 * taken back, with them, by cuStreamUpdateCaptureDependencies (ADD) on
 * another stream of the capture, and the next node there depends on them
 * through edges of that data (all default here: a memset node cannot have a
 * programmatic edge). (What DLSYNC_EXCHANGE_KEEP_EDGE_DATA's SAME_CAPTURE
 * does.) */
static const char *edge_data_back_rule(const dlsync__driver *d, CUdeviceptr buf, char *why,
                                       size_t n) {
  scope sc;
  const char *res = "setup failed";
  CUstreamCaptureStatus cs;
  cuuint64_t id;
  const CUgraphNode *deps = NULL;
  const CUgraphEdgeData *edges = NULL;
  CUgraphNode m = NULL, mine[1], x = NULL, from[32], to[32];
  CUgraphEdgeData mine_data[1], data[32];
  size_t nd = 0, ne = 32;
  CUgraph g = NULL;
  CUresult r;
  int found = 0;
  memset(mine_data, 0, sizeof mine_data);
  if (scope_open(&sc, d) != CUDA_SUCCESS || BEGIN(sc.s[0]) != CUDA_SUCCESS ||
      d->MemsetD32Async(buf, 1, 1, sc.s[0]) != CUDA_SUCCESS ||
      d->EventRecord(sc.e[0], sc.s[0]) != CUDA_SUCCESS ||
      d->StreamWaitEvent(sc.s[1], sc.e[0], 0) != CUDA_SUCCESS ||
      d->MemsetD32Async(buf, 2, 1, sc.s[0]) != CUDA_SUCCESS)
    goto done;
  r = d->StreamGetCaptureInfo(sc.s[0], &cs, &id, NULL, &deps, &edges, &nd);
  if (r != CUDA_SUCCESS || cs != CU_STREAM_CAPTURE_STATUS_ACTIVE || nd != 1) {
    res = r != CUDA_SUCCESS
              ? said(why, n, d, "cuStreamGetCaptureInfo with edge data", r, "CUDA_SUCCESS")
              : "the capturing stream does not have one dependency";
    goto done;
  }
  m = mine[0] = deps[0];
  if (edges != NULL)
    mine_data[0] = edges[0];
  r = d->StreamUpdateCaptureDependencies(sc.s[1], mine, mine_data, 1,
                                         CU_STREAM_ADD_CAPTURE_DEPENDENCIES);
  if (r != CUDA_SUCCESS) {
    res = said(why, n, d, "cuStreamUpdateCaptureDependencies (ADD) with the query's edge data", r,
               "CUDA_SUCCESS");
    goto done;
  }
  if (d->MemsetD32Async(buf, 3, 1, sc.s[1]) != CUDA_SUCCESS ||
      deps_of(d, sc.s[1], &deps, &x) != 1 || d->EventRecord(sc.e[1], sc.s[1]) != CUDA_SUCCESS ||
      d->StreamWaitEvent(sc.s[0], sc.e[1], 0) != CUDA_SUCCESS)
    goto done;
  r = d->StreamEndCapture(sc.s[0], &g);
  scope_keep(&sc, g);
  if (r != CUDA_SUCCESS) {
    res = said(why, n, d, "cuStreamEndCapture", r, "CUDA_SUCCESS");
    goto done;
  }
  r = d->GraphGetEdges(g, from, to, data, &ne);
  if (r != CUDA_SUCCESS || ne > 32) {
    res = r != CUDA_SUCCESS ? said(why, n, d, "cuGraphGetEdges", r, "CUDA_SUCCESS")
                            : "more edges than expected";
    goto done;
  }
  for (size_t i = 0; i < ne; i++)
    if (from[i] == m && to[i] == x)
      found =
          1 + (data[i].type == mine_data[0].type && data[i].from_port == mine_data[0].from_port);
  res = found == 2   ? NULL
        : found == 1 ? "the edge into the next node does not carry the edge data handed over"
                     : "the next node does not depend on the dependency handed over";
done:
  scope_close(&sc);
  return res;
}

const driver_rule driver_rules[] = {
    {"R1 JOIN", "a plain wait on an event of an active capture joins it", join_rule},
    {"R2 UNJOINED", "ending with a joined stream's work not joined back: UNJOINED", unjoined_rule},
    {"R3 ISOLATION", "a capture's plain wait on an eager event: ISOLATION, invalidated",
     isolation_rule},
    {"R4 MERGE", "a capture's plain wait on another capture's event: MERGE, both invalidated",
     merge_rule},
    {"R5 EXTERNAL-WAIT", "an external wait during capture: an event-wait node", external_wait_rule},
    {"R6 EXTERNAL-RECORD", "an external record during capture: an event-record node",
     external_record_rule},
    {"R7 EXTERNAL-OUTSIDE-CAPTURE", "external flags outside capture: ILLEGAL_STATE",
     external_outside_rule},
    {"R8 LEGACY-QUERY",
     "capture query of the legacy stream while a blocking stream captures: "
     "IMPLICIT, capture intact",
     legacy_query_rule},
    {"R9 MANUAL-APPEND", "a node appended by hand and made the capture's dependency",
     manual_append_rule},
    {"R10 RECORD-NODE-WAIT",
     "an eager plain wait on an active record node's event: an eager wait, no join",
     record_node_wait_rule},
    {"R11 STAYS-IN-CAPTURE",
     "a joined stream leaves its capture only with the others, whichever way it ends",
     stays_in_capture_rule},
    {"R12 ADD-JOIN",
     "in one capture, adding a stream's dependencies to another's orders them as a record and "
     "wait would, and joins back for the end",
     add_join_rule},
    {"R13 EXTERNAL-PAIR",
     "an external record in one capture and an external wait on it in another: both accepted, "
     "in every mode",
     external_pair_rule},
    {"R28 COND-BODY",
     "an external wait in a capture into an IF body: accepted, the capture's graph is the body, "
     "the parent fails to instantiate (INVALID_VALUE); a memset-only body instantiates",
     cond_body_rule},
    {"R29 COND-BODY-BY-HAND",
     "an event-wait node added by hand to an IF body: accepted, the parent fails to instantiate "
     "(the fake's guess; dlsync does not rely on it)",
     cond_body_by_hand_rule},
    {"R30 COND-BODY-EDGES",
     "in a capture into an IF body a join and an ADD of dependencies work; the parent "
     "instantiates and launches",
     cond_body_edges_rule},
    {"R40 QUERY-IN-CAPTURE",
     "with the thread switched to RELAXED during its GLOBAL capture, cuEventQuery of an eager "
     "record and of an external record node answers SUCCESS or NOT_READY; the capture stays "
     "active and ends cleanly",
     query_in_capture_rule},
    {"R41 QUERY-CAPTURED-EVENT",
     "cuEventQuery of an event plainly recorded in an active capture (the thread switched to "
     "RELAXED): CAPTURED_EVENT, and that capture is invalidated",
     query_captured_event_rule},
    {"R42 COND-HOIST",
     "into an active capture's graph holding a captured IF node: a wait node added by hand "
     "with an edge to the IF node, a record node after it; both captures end cleanly, the parent "
     "instantiates and launches",
     cond_hoist_rule},
    {"R43 EDGE-DATA-BACK",
     "the edge data a capture query gives is taken back, with its dependencies, by an ADD of "
     "them on another stream of the capture, and the next node's edges carry it",
     edge_data_back_rule},
};

const size_t driver_rule_count = sizeof driver_rules / sizeof driver_rules[0];
