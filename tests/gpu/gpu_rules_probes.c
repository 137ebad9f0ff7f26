/* SPDX-License-Identifier: Apache-2.0 */
/* CUDA behaviours dlsync relies on that the fake driver does not model
 * ([R14]..[R19], [R32] and [R33] of docs/design.md), checked on the real driver through
 * dlsync's driver table. Linked into gpu_rules, which runs them after the
 * fake's rules. Two are about cost; they compare calls made side by side in
 * the same run (medians of paired rounds) with margins far wider than the
 * spread seen between runs, so that only a changed behaviour fails them. */
#include <dlfcn.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../rules/driver_rules.h"
#include "gpu_common.h"
#include "gpu_rules_probes.h"

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static double median(double *v, int n) {
  qsort(v, (size_t)n, sizeof v[0], cmp_double);
  return v[n / 2];
}

static const char *said(char *why, size_t n, const dlsync__driver *d, const char *call, CUresult r,
                        const char *wanted) {
  snprintf(why, n, "%s returned %s, the rule says %s", call, dlsync__driver_error_name(d, r),
           wanted);
  return why;
}

#define TRY(call)                                                   \
  do {                                                              \
    CUresult r_ = (call);                                           \
    if (r_ != CUDA_SUCCESS) {                                       \
      res = said(why, n, d, #call, r_, "CUDA_SUCCESS (the setup)"); \
      goto done;                                                    \
    }                                                               \
  } while (0)

static CUstreamCaptureStatus status_of(const dlsync__driver *d, CUstream s) {
  CUstreamCaptureStatus cs = CU_STREAM_CAPTURE_STATUS_NONE;
  (void)d->StreamIsCapturing(s, &cs);
  return cs;
}

/* Ends s's capture if it still captures and destroys the graph. */
static void end_quietly(const dlsync__driver *d, CUstream s) {
  CUgraph g = NULL;
  if (s != NULL && status_of(d, s) != CU_STREAM_CAPTURE_STATUS_NONE) {
    (void)d->StreamEndCapture(s, &g);
    if (g != NULL)
      (void)d->GraphDestroy(g);
  }
}

/* ---- R14 ADD-REFUSED ---------------------------------------------------- */
/* cuStreamUpdateCaptureDependencies(ADD) of a capture's set into an eager
 * stream: ILLEGAL_STATE; into another capture's stream: INVALID_VALUE;
 * neither capture harmed (both end cleanly); an empty set is accepted. */
static const char *add_refused_rule(const dlsync__driver *d, CUdeviceptr buf, char *why, size_t n) {
  CUstream s[3] = {NULL, NULL, NULL};
  CUgraph g = NULL;
  const char *res = NULL;
  CUstreamCaptureStatus cs;
  cuuint64_t id;
  const CUgraphNode *deps = NULL;
  const CUgraphEdgeData *ed = NULL;
  size_t nd = 0;
  CUgraphNode copy[8];
  CUresult r;
  for (int i = 0; i < 3; i++)
    TRY(d->StreamCreate(&s[i], CU_STREAM_NON_BLOCKING));
  TRY(d->StreamBeginCapture(s[0], CU_STREAM_CAPTURE_MODE_RELAXED));
  TRY(d->MemsetD32Async(buf, 1, 1, s[0]));
  TRY(d->StreamGetCaptureInfo(s[0], &cs, &id, &g, &deps, &ed, &nd));
  if (nd == 0 || nd > 8) {
    res = "the capture's dependency set is not one node after one memset";
    goto done;
  }
  memcpy(copy, deps, nd * sizeof copy[0]);
  r = d->StreamUpdateCaptureDependencies(s[1], copy, NULL, nd, CU_STREAM_ADD_CAPTURE_DEPENDENCIES);
  if (r != CUDA_ERROR_ILLEGAL_STATE) {
    res = said(why, n, d, "ADD into an eager stream", r, "CUDA_ERROR_ILLEGAL_STATE");
    goto done;
  }
  if (status_of(d, s[0]) != CU_STREAM_CAPTURE_STATUS_ACTIVE ||
      status_of(d, s[1]) != CU_STREAM_CAPTURE_STATUS_NONE) {
    res = "after the refused ADD into an eager stream, a stream's capture status changed";
    goto done;
  }
  TRY(d->StreamBeginCapture(s[2], CU_STREAM_CAPTURE_MODE_RELAXED));
  r = d->StreamUpdateCaptureDependencies(s[2], copy, NULL, nd, CU_STREAM_ADD_CAPTURE_DEPENDENCIES);
  if (r != CUDA_ERROR_INVALID_VALUE) {
    res = said(why, n, d, "ADD of one capture's nodes into another capture's stream", r,
               "CUDA_ERROR_INVALID_VALUE");
    goto done;
  }
  r = d->StreamUpdateCaptureDependencies(s[2], NULL, NULL, 0, CU_STREAM_ADD_CAPTURE_DEPENDENCIES);
  if (r != CUDA_SUCCESS) {
    res = said(why, n, d, "ADD of an empty set", r, "CUDA_SUCCESS");
    goto done;
  }
  for (int i = 2; i >= 0; i -= 2) {
    CUgraph out = NULL;
    r = d->StreamEndCapture(s[i], &out);
    if (out != NULL)
      (void)d->GraphDestroy(out);
    if (r != CUDA_SUCCESS) {
      res = said(why, n, d, "cuStreamEndCapture after a refused ADD", r, "CUDA_SUCCESS");
      goto done;
    }
  }
done:
  for (int i = 0; i < 3; i++) {
    end_quietly(d, s[i]);
    if (s[i] != NULL)
      (void)d->StreamDestroy(s[i]);
  }
  return res;
}

/* ---- R15 NODE-ANY-CONTEXT ----------------------------------------------- */
/* Contexts of our own: cuCtxCreate and cuCtxDestroy are not in dlsync's
 * table (it never makes a context), so they come from libcuda through its
 * cuGetProcAddress: cuCtxCreate in its CUDA 12.5 form (params may be NULL),
 * else its CUDA 3.2 form; cuCtxDestroy in its CUDA 4.0 form. */
typedef CUresult (*ctx_create_v4_fn)(CUcontext *, CUctxCreateParams *, unsigned int, CUdevice);
typedef CUresult (*ctx_create_v2_fn)(CUcontext *, unsigned int, CUdevice);
typedef CUresult (*ctx_destroy_fn)(CUcontext);
typedef CUresult (*get_proc_fn)(const char *, void **, int, cuuint64_t,
                                CUdriverProcAddressQueryResult *);

typedef struct ctx_functions {
  ctx_create_v4_fn create_v4;
  ctx_create_v2_fn create_v2;
  ctx_destroy_fn destroy;
} ctx_functions;

static int ctx_functions_get(ctx_functions *f) {
  void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
  get_proc_fn get_proc = NULL;
  CUdriverProcAddressQueryResult q;
  memset(f, 0, sizeof *f);
  if (lib == NULL)
    return 0;
  *(void **)&get_proc = dlsym(lib, "cuGetProcAddress_v2");
  if (get_proc != NULL) {
    if (get_proc("cuCtxCreate", (void **)&f->create_v4, 12050, CU_GET_PROC_ADDRESS_DEFAULT, &q) !=
        CUDA_SUCCESS)
      f->create_v4 = NULL;
    if (f->create_v4 == NULL && get_proc("cuCtxCreate", (void **)&f->create_v2, 3020,
                                         CU_GET_PROC_ADDRESS_DEFAULT, &q) != CUDA_SUCCESS)
      f->create_v2 = NULL;
    if (get_proc("cuCtxDestroy", (void **)&f->destroy, 4000, CU_GET_PROC_ADDRESS_DEFAULT, &q) !=
        CUDA_SUCCESS)
      f->destroy = NULL;
  }
  dlclose(lib);
  return (f->create_v4 != NULL || f->create_v2 != NULL) && f->destroy != NULL;
}

/* A new context of dev, made current (pushed). */
static CUresult ctx_create(const ctx_functions *f, CUcontext *out, CUdevice dev) {
  return f->create_v4 != NULL ? f->create_v4(out, NULL, 0, dev) : f->create_v2(out, 0, dev);
}

/* One capture of stream s with a record node and a wait node on ev added by
 * hand, then an external record of ev; it must end, instantiate, launch and
 * finish. */
static const char *nodes_on(const dlsync__driver *d, CUstream s, CUevent ev, char *why, size_t n) {
  const char *res = NULL;
  CUgraph g = NULL, out = NULL;
  CUgraphExec x = NULL;
  CUresult r;
  TRY(d->StreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_RELAXED));
  for (int k = 0; k < 2; k++) {
    CUstreamCaptureStatus cs;
    cuuint64_t id;
    const CUgraphNode *deps = NULL;
    const CUgraphEdgeData *ed = NULL;
    size_t nd = 0;
    CUgraphNode node;
    TRY(d->StreamGetCaptureInfo(s, &cs, &id, &g, &deps, &ed, &nd));
    r = k == 0 ? d->GraphAddEventRecordNode(&node, g, deps, nd, ev)
               : d->GraphAddEventWaitNode(&node, g, deps, nd, ev);
    if (r != CUDA_SUCCESS) {
      res = said(why, n, d,
                 k == 0 ? "cuGraphAddEventRecordNode of another context's event"
                        : "cuGraphAddEventWaitNode of another context's event",
                 r, "CUDA_SUCCESS");
      goto done;
    }
    TRY(d->StreamUpdateCaptureDependencies(s, &node, NULL, 1, CU_STREAM_SET_CAPTURE_DEPENDENCIES));
  }
  /* An external record during capture takes it too (TWO_CAPTURES keeps its
   * context check for that reason). */
  r = d->EventRecordWithFlags(ev, s, CU_EVENT_RECORD_EXTERNAL);
  if (r != CUDA_SUCCESS) {
    res = said(why, n, d, "an external record of another context's event during capture", r,
               "CUDA_SUCCESS");
    goto done;
  }
  r = d->StreamEndCapture(s, &out);
  if (r != CUDA_SUCCESS) {
    res = said(why, n, d, "cuStreamEndCapture", r, "CUDA_SUCCESS");
    goto done;
  }
  r = d->GraphInstantiateWithFlags(&x, out, 0);
  if (r == CUDA_SUCCESS)
    r = d->GraphLaunch(x, s);
  if (r == CUDA_SUCCESS)
    r = d->StreamSynchronize(s);
  if (r != CUDA_SUCCESS)
    res = said(why, n, d, "instantiating, launching and finishing the graph", r, "CUDA_SUCCESS");
done:
  end_quietly(d, s);
  if (x != NULL)
    (void)d->GraphExecDestroy(x);
  if (out != NULL)
    (void)d->GraphDestroy(out);
  return res;
}

/* Event nodes added by hand to a capture of context A, and an external
 * record there, take an event of context B (same device), and the graph
 * runs; an eager cuEventRecord of that event on A's stream is refused with
 * INVALID_HANDLE. */
static const char *node_any_context_rule(const dlsync__driver *d, CUdeviceptr buf, char *why,
                                         size_t n) {
  ctx_functions f;
  CUcontext a = NULL, b = NULL, popped;
  CUdevice dev;
  CUstream sa = NULL;
  CUevent eb = NULL;
  CUresult r;
  const char *res = NULL;
  (void)buf;
  if (!ctx_functions_get(&f))
    return "cuCtxCreate or cuCtxDestroy not found through libcuda's cuGetProcAddress";
  TRY(d->CtxGetDevice(&dev));
  TRY(ctx_create(&f, &b, dev)); /* made current (pushed) */
  TRY(d->EventCreate(&eb, CU_EVENT_DISABLE_TIMING));
  TRY(d->CtxPopCurrent(&popped));
  TRY(ctx_create(&f, &a, dev));
  TRY(d->StreamCreate(&sa, CU_STREAM_NON_BLOCKING));
  r = d->EventRecord(eb, sa);
  if (r != CUDA_ERROR_INVALID_HANDLE) {
    res = said(why, n, d, "eager cuEventRecord of another context's event", r,
               "CUDA_ERROR_INVALID_HANDLE");
    goto done;
  }
  res = nodes_on(d, sa, eb, why, n);
done:
  if (sa != NULL)
    (void)d->StreamDestroy(sa);
  if (a != NULL) {
    (void)d->CtxPopCurrent(&popped);
    (void)f.destroy(a);
  }
  if (eb != NULL && b != NULL && d->CtxPushCurrent(b) == CUDA_SUCCESS) {
    (void)d->EventDestroy(eb);
    (void)d->CtxPopCurrent(&popped);
  }
  if (b != NULL)
    (void)f.destroy(b);
  return res;
}

/* ---- R16 EXTERNAL-PAIR-ORDERS ------------------------------------------- */
/* An external record in one capture and an external wait on it in another:
 * launched at once on two streams, the waiting graph reads what the
 * recording graph wrote before its record, in every launch; without the two
 * calls (the control) it reads stale data at least once, or the check could
 * not have failed. */
enum { PAIR_LAUNCHES = 20, SLOW_WORDS = 1 << 26 };

static const char *pair_launches(const dlsync__driver *d, CUstream s[4], CUevent ev,
                                 CUdeviceptr big, CUdeviceptr flag, CUdeviceptr out,
                                 CUstreamCaptureMode mode, int link, int *stale, char *why,
                                 size_t n) {
  const char *res = NULL;
  *stale = 0;
  for (int k = 0; k < PAIR_LAUNCHES && res == NULL; k++) {
    CUgraph g1 = NULL, g2 = NULL;
    CUgraphExec x1 = NULL, x2 = NULL;
    unsigned v = 0, seven = 7, zero = 0, ones = 0xffffffffu;
    TRY(d->MemcpyHtoD(flag, &zero, 4));
    TRY(d->MemcpyHtoD(out, &ones, 4));
    TRY(d->StreamBeginCapture(s[0], mode));
    TRY(d->StreamBeginCapture(s[1], mode));
    for (int i = 0; i < 4; i++)
      TRY(d->MemsetD32Async(big, (unsigned)i, SLOW_WORDS, s[0]));
    TRY(d->MemsetD32Async(flag, seven, 1, s[0]));
    if (link) {
      CUresult r = d->EventRecordWithFlags(ev, s[0], CU_EVENT_RECORD_EXTERNAL);
      if (r == CUDA_SUCCESS)
        r = d->StreamWaitEvent(s[1], ev, CU_EVENT_WAIT_EXTERNAL);
      if (r != CUDA_SUCCESS) {
        res = said(why, n, d, "the external record and wait", r, "CUDA_SUCCESS");
        goto done;
      }
    }
    TRY(d->MemcpyDtoDAsync(out, flag, 4, s[1]));
    TRY(d->StreamEndCapture(s[1], &g2));
    TRY(d->StreamEndCapture(s[0], &g1));
    TRY(d->GraphInstantiateWithFlags(&x1, g1, 0));
    TRY(d->GraphInstantiateWithFlags(&x2, g2, 0));
    TRY(d->GraphLaunch(x1, s[2]));
    TRY(d->GraphLaunch(x2, s[3]));
    TRY(d->CtxSynchronize());
    TRY(d->MemcpyDtoH(&v, out, 4));
    *stale += v != seven;
  done:
    end_quietly(d, s[1]);
    end_quietly(d, s[0]);
    if (x1 != NULL)
      (void)d->GraphExecDestroy(x1);
    if (x2 != NULL)
      (void)d->GraphExecDestroy(x2);
    if (g1 != NULL)
      (void)d->GraphDestroy(g1);
    if (g2 != NULL)
      (void)d->GraphDestroy(g2);
  }
  return res;
}

static const char *external_pair_orders_rule(const dlsync__driver *d, CUdeviceptr buf, char *why,
                                             size_t n) {
  static const CUstreamCaptureMode modes[2] = {CU_STREAM_CAPTURE_MODE_RELAXED,
                                               CU_STREAM_CAPTURE_MODE_GLOBAL};
  CUstream s[4] = {NULL, NULL, NULL, NULL};
  CUevent ev = NULL;
  CUdeviceptr big = 0, out = 0;
  const char *res = NULL;
  int stale = 0;
  for (int i = 0; i < 4; i++)
    TRY(d->StreamCreate(&s[i], CU_STREAM_NON_BLOCKING));
  TRY(d->EventCreate(&ev, CU_EVENT_DISABLE_TIMING));
  TRY(d->MemAlloc(&big, (size_t)SLOW_WORDS * 4));
  TRY(d->MemAlloc(&out, 4));
  for (int m = 0; m < 2; m++) {
    res = pair_launches(d, s, ev, big, buf, out, modes[m], 1, &stale, why, n);
    if (res == NULL && stale != 0) {
      snprintf(why, n, "%d of %d launches in %s mode read stale data", stale, PAIR_LAUNCHES,
               m == 0 ? "RELAXED" : "GLOBAL");
      res = why;
    }
    if (res != NULL)
      goto done;
  }
  res = pair_launches(d, s, ev, big, buf, out, modes[0], 0, &stale, why, n);
  if (res == NULL && stale == 0)
    res = "the control without the external pair never read stale data: the check proves nothing";
done:
  if (big != 0)
    (void)d->MemFree(big);
  if (out != 0)
    (void)d->MemFree(out);
  if (ev != NULL)
    (void)d->EventDestroy(ev);
  for (int i = 0; i < 4; i++)
    if (s[i] != NULL)
      (void)d->StreamDestroy(s[i]);
  return res;
}

/* ---- R17 QUERY-CHEAP ---------------------------------------------------- */
/* A capture query costs a small part of an eager record and wait (dlsync
 * asks at every call), and on a capturing stream asking for every output
 * costs about what the status and id alone cost (dlsync reads the
 * dependencies in the same call). Medians of paired rounds. */
enum { QUERY_ROUNDS = 15, QUERY_CALLS = 2000 };

static double time_query(const dlsync__driver *d, CUstream s, int full) {
  double t0 = gpu_now_ns();
  for (int i = 0; i < QUERY_CALLS; i++) {
    CUstreamCaptureStatus cs;
    cuuint64_t id;
    CUgraph g;
    const CUgraphNode *deps;
    const CUgraphEdgeData *ed;
    size_t nd;
    if (full)
      (void)d->StreamGetCaptureInfo(s, &cs, &id, &g, &deps, &ed, &nd);
    else
      (void)d->StreamGetCaptureInfo(s, &cs, &id, NULL, NULL, NULL, NULL);
  }
  return (gpu_now_ns() - t0) / QUERY_CALLS;
}

static double time_record_wait(const dlsync__driver *d, CUstream p, CUstream c, CUevent ev) {
  double t0 = gpu_now_ns();
  for (int i = 0; i < QUERY_CALLS / 10; i++) {
    (void)d->EventRecord(ev, p);
    (void)d->StreamWaitEvent(c, ev, 0);
  }
  return (gpu_now_ns() - t0) / (QUERY_CALLS / 10);
}

static const char *query_cheap_rule(const dlsync__driver *d, CUdeviceptr buf, char *why, size_t n) {
  CUstream e = NULL, c = NULL, p = NULL;
  CUevent ev = NULL;
  const char *res = NULL;
  double to_pair[QUERY_ROUNDS], full_to_id[QUERY_ROUNDS], q, fq;
  TRY(d->StreamCreate(&e, CU_STREAM_NON_BLOCKING));
  TRY(d->StreamCreate(&c, CU_STREAM_NON_BLOCKING));
  TRY(d->StreamCreate(&p, CU_STREAM_NON_BLOCKING));
  TRY(d->EventCreate(&ev, CU_EVENT_DISABLE_TIMING));
  TRY(d->StreamBeginCapture(c, CU_STREAM_CAPTURE_MODE_RELAXED));
  for (int i = 0; i < 300; i++)
    TRY(d->MemsetD32Async(buf, (unsigned)i, 1, c));
  (void)time_query(d, c, 1);
  (void)time_record_wait(d, p, e, ev);
  for (int k = 0; k < QUERY_ROUNDS; k++) {
    double eager = time_query(d, e, 1), id_only = time_query(d, c, 0), full = time_query(d, c, 1);
    double pair = time_record_wait(d, p, e, ev);
    to_pair[k] = (eager > full ? eager : full) / pair;
    full_to_id[k] = full / id_only;
  }
  q = median(to_pair, QUERY_ROUNDS);
  fq = median(full_to_id, QUERY_ROUNDS);
  if (q > 0.25) {
    snprintf(why, n, "a full capture query costs %.2f of an eager record and wait (rule: < 0.25)",
             q);
    res = why;
  } else if (fq > 1.5) {
    snprintf(why, n, "the full query costs %.2f of the status and id alone (rule: <= 1.5)", fq);
    res = why;
  }
done:
  end_quietly(d, c);
  if (p != NULL)
    (void)d->StreamSynchronize(p);
  if (e != NULL)
    (void)d->StreamSynchronize(e);
  if (ev != NULL)
    (void)d->EventDestroy(ev);
  if (e != NULL)
    (void)d->StreamDestroy(e);
  if (c != NULL)
    (void)d->StreamDestroy(c);
  if (p != NULL)
    (void)d->StreamDestroy(p);
  return res;
}

/* ---- R18 EVENT-ORIGIN --------------------------------------------------- */
/* How an event was made does not change what an EAGER_TO_CAPTURE pair
 * (eager record, external wait in a capture) costs: events made one after
 * the other against events made one at a time between a capture's nodes, as
 * a pool growing during a capture makes them. Median of paired rounds, in
 * alternating order, within [0.8, 1.25]. */
enum { ORIGIN_EVENTS = 500, ORIGIN_ROUNDS = 11, ORIGIN_BATCHES = 3 };

static double time_pairs(const dlsync__driver *d, CUstream p, CUstream c, const CUevent *ev,
                         CUresult *r) {
  double t[ORIGIN_BATCHES];
  for (int b = 0; b < ORIGIN_BATCHES; b++) {
    CUgraph g = NULL;
    double t0;
    *r = d->StreamBeginCapture(c, CU_STREAM_CAPTURE_MODE_RELAXED);
    t0 = gpu_now_ns();
    for (int i = 0; i < ORIGIN_EVENTS && *r == CUDA_SUCCESS; i++) {
      *r = d->EventRecord(ev[i], p);
      if (*r == CUDA_SUCCESS)
        *r = d->StreamWaitEvent(c, ev[i], CU_EVENT_WAIT_EXTERNAL);
    }
    t[b] = (gpu_now_ns() - t0) / ORIGIN_EVENTS;
    if (d->StreamEndCapture(c, &g) != CUDA_SUCCESS && *r == CUDA_SUCCESS)
      *r = CUDA_ERROR_UNKNOWN;
    if (g != NULL)
      (void)d->GraphDestroy(g);
    if (*r != CUDA_SUCCESS)
      return 0;
  }
  return median(t, ORIGIN_BATCHES);
}

static const char *event_origin_rule(const dlsync__driver *d, CUdeviceptr buf, char *why,
                                     size_t n) {
  static CUevent a[ORIGIN_EVENTS], b[ORIGIN_EVENTS];
  CUstream p = NULL, c = NULL;
  CUgraph g = NULL;
  CUresult r = CUDA_SUCCESS;
  const char *res = NULL;
  double ratio[ORIGIN_ROUNDS], q;
  memset(a, 0, sizeof a);
  memset(b, 0, sizeof b);
  TRY(d->StreamCreate(&p, CU_STREAM_NON_BLOCKING));
  TRY(d->StreamCreate(&c, CU_STREAM_NON_BLOCKING));
  for (int i = 0; i < ORIGIN_EVENTS; i++)
    TRY(d->EventCreate(&a[i], CU_EVENT_DISABLE_TIMING));
  TRY(d->StreamBeginCapture(c, CU_STREAM_CAPTURE_MODE_RELAXED));
  for (int i = 0; i < ORIGIN_EVENTS; i++) {
    TRY(d->EventCreate(&b[i], CU_EVENT_DISABLE_TIMING));
    TRY(d->EventRecord(b[i], p));
    TRY(d->StreamWaitEvent(c, b[i], CU_EVENT_WAIT_EXTERNAL));
    TRY(d->MemsetD32Async(buf, (unsigned)i, 1, c));
  }
  TRY(d->StreamEndCapture(c, &g));
  (void)d->GraphDestroy(g);
  (void)time_pairs(d, p, c, a, &r);
  (void)time_pairs(d, p, c, b, &r);
  for (int k = 0; k < ORIGIN_ROUNDS && r == CUDA_SUCCESS; k++) {
    double ta, tb;
    if (k % 2 == 0) {
      ta = time_pairs(d, p, c, a, &r);
      tb = time_pairs(d, p, c, b, &r);
    } else {
      tb = time_pairs(d, p, c, b, &r);
      ta = time_pairs(d, p, c, a, &r);
    }
    ratio[k] = ta > 0 ? tb / ta : 0;
  }
  if (r != CUDA_SUCCESS) {
    res = said(why, n, d, "an eager record and an external wait in a capture", r, "CUDA_SUCCESS");
    goto done;
  }
  q = median(ratio, ORIGIN_ROUNDS);
  if (q < 0.8 || q > 1.25) {
    snprintf(why, n,
             "pairs on events made between a capture's nodes cost %.2f of those on events made "
             "together (rule: 0.8 to 1.25)",
             q);
    res = why;
  }
done:
  end_quietly(d, c);
  if (p != NULL)
    (void)d->StreamSynchronize(p);
  for (int i = 0; i < ORIGIN_EVENTS; i++) {
    if (a[i] != NULL)
      (void)d->EventDestroy(a[i]);
    if (b[i] != NULL)
      (void)d->EventDestroy(b[i]);
  }
  if (p != NULL)
    (void)d->StreamDestroy(p);
  if (c != NULL)
    (void)d->StreamDestroy(c);
  return res;
}

/* ---- R19 USER-OBJECT-SHARED --------------------------------------------- */
/* One user object retained many times by one graph (instantiated) and once
 * by another: its destructor runs once, and only after both graphs and the
 * executable are gone. Retaining one object per event costs less than making
 * and moving a new object per event (median of paired rounds < 1). */
static atomic_int destructor_runs;

static void count_destructor(void *p) {
  (void)p;
  atomic_fetch_add(&destructor_runs, 1);
}

static void sleep_ms(long ms) {
  struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

enum { RETAINS = 500, RETAIN_ROUNDS = 11 };

/* Host ns per event for RETAINS wait nodes in a chain of a fresh graph, each
 * tied to the graph by a new object moved in (shared 0) or by one more
 * retain of one object (shared 1). */
static double time_ties(const dlsync__driver *d, CUevent ev, int shared, CUresult *r) {
  CUgraph g = NULL;
  CUgraphNode dep = NULL, node = NULL;
  CUuserObject one = NULL;
  double t0, t;
  *r = d->GraphCreate(&g, 0);
  if (*r == CUDA_SUCCESS)
    *r = d->GraphAddEmptyNode(&dep, g, NULL, 0);
  if (*r == CUDA_SUCCESS && shared)
    *r = d->UserObjectCreate(&one, NULL, count_destructor, 1, CU_USER_OBJECT_NO_DESTRUCTOR_SYNC);
  t0 = gpu_now_ns();
  for (int i = 0; i < RETAINS && *r == CUDA_SUCCESS; i++) {
    CUuserObject o;
    if (shared) {
      *r = d->GraphRetainUserObject(g, one, 1, 0);
    } else {
      *r = d->UserObjectCreate(&o, NULL, count_destructor, 1, CU_USER_OBJECT_NO_DESTRUCTOR_SYNC);
      if (*r == CUDA_SUCCESS)
        *r = d->GraphRetainUserObject(g, o, 1, CU_GRAPH_USER_OBJECT_MOVE);
    }
    if (*r == CUDA_SUCCESS)
      *r = d->GraphAddEventWaitNode(&node, g, &dep, 1, ev);
    dep = node;
  }
  t = (gpu_now_ns() - t0) / RETAINS;
  if (one != NULL)
    (void)d->UserObjectRelease(one, 1);
  if (g != NULL)
    (void)d->GraphDestroy(g);
  return t;
}

/* Waits up to 2 s for the destructor count to reach `want`. */
static int runs_reach(int want) {
  for (int i = 0; i < 200 && atomic_load(&destructor_runs) < want; i++)
    sleep_ms(10);
  return atomic_load(&destructor_runs);
}

static const char *user_object_shared_rule(const dlsync__driver *d, CUdeviceptr buf, char *why,
                                           size_t n) {
  CUgraph g1 = NULL, g2 = NULL;
  CUgraphExec x1 = NULL;
  CUgraphNode n1, n2;
  CUuserObject o = NULL;
  CUevent ev = NULL;
  CUresult r = CUDA_SUCCESS;
  const char *res = NULL;
  double ratio[RETAIN_ROUNDS], q;
  int runs;
  (void)buf;
  atomic_store(&destructor_runs, 0);
  TRY(d->GraphCreate(&g1, 0));
  TRY(d->GraphCreate(&g2, 0));
  TRY(d->GraphAddEmptyNode(&n1, g1, NULL, 0));
  TRY(d->GraphAddEmptyNode(&n2, g2, NULL, 0));
  TRY(d->UserObjectCreate(&o, NULL, count_destructor, 1, CU_USER_OBJECT_NO_DESTRUCTOR_SYNC));
  for (int i = 0; i < RETAINS; i++)
    TRY(d->GraphRetainUserObject(g1, o, 1, 0));
  TRY(d->GraphRetainUserObject(g2, o, 1, 0));
  TRY(d->UserObjectRelease(o, 1));
  TRY(d->GraphInstantiateWithFlags(&x1, g1, 0));
  TRY(d->GraphDestroy(g1));
  g1 = NULL;
  sleep_ms(50);
  TRY(d->GraphExecDestroy(x1));
  x1 = NULL;
  sleep_ms(50);
  if ((runs = atomic_load(&destructor_runs)) != 0) {
    snprintf(why, n, "the destructor ran %d times while a graph still held the object", runs);
    res = why;
    goto done;
  }
  TRY(d->GraphDestroy(g2));
  g2 = NULL;
  if ((runs = runs_reach(1)) != 1) {
    snprintf(why, n, "the destructor ran %d times after the last holder was gone (rule: once)",
             runs);
    res = why;
    goto done;
  }
  TRY(d->EventCreate(&ev, CU_EVENT_DISABLE_TIMING));
  (void)time_ties(d, ev, 0, &r);
  (void)time_ties(d, ev, 1, &r);
  for (int k = 0; k < RETAIN_ROUNDS && r == CUDA_SUCCESS; k++) {
    double made, retained;
    if (k % 2 == 0) {
      made = time_ties(d, ev, 0, &r);
      retained = time_ties(d, ev, 1, &r);
    } else {
      retained = time_ties(d, ev, 1, &r);
      made = time_ties(d, ev, 0, &r);
    }
    ratio[k] = made > 0 ? retained / made : 0;
  }
  if (r != CUDA_SUCCESS) {
    res = said(why, n, d, "tying events to a graph", r, "CUDA_SUCCESS");
    goto done;
  }
  q = median(ratio, RETAIN_ROUNDS);
  if (q >= 1.0) {
    snprintf(why, n,
             "a retain of one object per event costs %.2f of a new object moved in per event "
             "(rule: < 1)",
             q);
    res = why;
  }
done:
  if (x1 != NULL)
    (void)d->GraphExecDestroy(x1);
  if (g1 != NULL)
    (void)d->GraphDestroy(g1);
  if (g2 != NULL)
    (void)d->GraphDestroy(g2);
  if (ev != NULL)
    (void)d->EventDestroy(ev);
  return res;
}

/* ---- R32 STREAM-ORDER --------------------------------------------------- */
/* Events recorded on one stream complete in the order they were recorded:
 * once the later one is complete, so is the earlier one (the reclaimer
 * synchronises the newest event of each stream in a batch first). Slow work
 * (memsets of 256 MiB) ahead of the first event, so that it is still
 * pending when the second is recorded (checked: else the check could not
 * fail). */
enum { ORDER_ROUNDS = 50, ORDER_NEW_STREAMS = 32 };

static const char *stream_order_rule(const dlsync__driver *d, CUdeviceptr buf, char *why,
                                     size_t n) {
  const char *res = NULL;
  CUstream s = NULL;
  CUevent e1 = NULL, e2 = NULL;
  CUdeviceptr big = 0;
  int pending_seen = 0;
  TRY(d->MemAlloc(&big, (size_t)SLOW_WORDS * 4));
  TRY(d->StreamCreate(&s, CU_STREAM_NON_BLOCKING));
  TRY(d->EventCreate(&e1, CU_EVENT_DISABLE_TIMING));
  TRY(d->EventCreate(&e2, CU_EVENT_DISABLE_TIMING));
  for (int k = 0; k < ORDER_ROUNDS && res == NULL; k++) {
    CUresult q;
    for (int i = 0; i < 4; i++)
      TRY(d->MemsetD32Async(big, (unsigned)(k + i), SLOW_WORDS, s));
    TRY(d->EventRecord(e1, s));
    TRY(d->MemsetD32Async(buf, (unsigned)k, 1, s));
    TRY(d->EventRecord(e2, s));
    pending_seen += d->EventQuery(e1) == CUDA_ERROR_NOT_READY;
    TRY(d->EventSynchronize(e2));
    q = d->EventQuery(e1);
    if (q != CUDA_SUCCESS)
      res = said(why, n, d, "cuEventQuery of the earlier event after the later one's sync", q,
                 "CUDA_SUCCESS");
  }
  if (res == NULL && pending_seen == 0)
    res = "the first event was never pending when the second was recorded: the check could "
          "not fail";
done:
  if (s != NULL) {
    (void)d->StreamSynchronize(s);
    (void)d->StreamDestroy(s);
  }
  if (e1 != NULL)
    (void)d->EventDestroy(e1);
  if (e2 != NULL)
    (void)d->EventDestroy(e2);
  if (big != 0) {
    (void)d->CtxSynchronize();
    (void)d->MemFree(big);
  }
  return res;
}

/* ---- R33 HANDLE-REUSE --------------------------------------------------- */
/* A stream handle is not a stream's identity: a stream destroyed with work
 * pending may give its handle to a new stream while that work still runs
 * (how often is printed). So the reclaimer, which groups a batch's events
 * by handle, asks each earlier event of a handle before its deleter runs:
 * what it relies on is that cuEventQuery of an event whose work is pending
 * says CUDA_ERROR_NOT_READY, and of a complete one CUDA_SUCCESS, whatever
 * stream now has the handle. Checked with the old stream's event while new
 * streams are created (one of them perhaps with its handle). */
static const char *handle_reuse_rule(const dlsync__driver *d, CUdeviceptr buf, char *why,
                                     size_t n) {
  const char *res = NULL;
  CUstream gone = NULL, fresh[ORDER_NEW_STREAMS] = {0};
  CUevent e1 = NULL;
  CUdeviceptr big = 0;
  int reused_pending = 0, pending_seen = 0, made = 0;
  (void)buf;
  TRY(d->MemAlloc(&big, (size_t)SLOW_WORDS * 4));
  TRY(d->EventCreate(&e1, CU_EVENT_DISABLE_TIMING));
  for (int k = 0; k < 4 && res == NULL; k++) {
    CUresult q;
    TRY(d->StreamCreate(&gone, CU_STREAM_NON_BLOCKING));
    for (int i = 0; i < 4; i++)
      TRY(d->MemsetD32Async(big, (unsigned)i, SLOW_WORDS, gone));
    TRY(d->EventRecord(e1, gone));
    TRY(d->StreamDestroy(gone));
    for (int i = 0; i < ORDER_NEW_STREAMS; i++) {
      TRY(d->StreamCreate(&fresh[i], CU_STREAM_NON_BLOCKING));
      made++;
      q = d->EventQuery(e1);
      pending_seen += q == CUDA_ERROR_NOT_READY;
      if (q != CUDA_SUCCESS && q != CUDA_ERROR_NOT_READY) {
        res = said(why, n, d, "cuEventQuery of a destroyed stream's pending event", q,
                   "CUDA_ERROR_NOT_READY or CUDA_SUCCESS");
        break;
      }
      if (fresh[i] == gone && q == CUDA_ERROR_NOT_READY)
        reused_pending++;
    }
    if (res == NULL) {
      TRY(d->EventSynchronize(e1));
      q = d->EventQuery(e1);
      if (q != CUDA_SUCCESS)
        res = said(why, n, d, "cuEventQuery of a complete event", q, "CUDA_SUCCESS");
    }
    for (int i = 0; i < ORDER_NEW_STREAMS; i++) {
      (void)d->StreamDestroy(fresh[i]);
      fresh[i] = NULL;
    }
  }
  if (res == NULL && pending_seen == 0)
    res = "the destroyed stream's event was never pending: the check could not fail";
  if (res == NULL)
    snprintf(why, n,
             "a destroyed stream's handle named a new stream while its work ran: %d of %d "
             "new streams",
             reused_pending, made);
done:
  for (int i = 0; i < ORDER_NEW_STREAMS; i++)
    if (fresh[i] != NULL)
      (void)d->StreamDestroy(fresh[i]);
  if (e1 != NULL)
    (void)d->EventDestroy(e1);
  if (big != 0) {
    (void)d->CtxSynchronize();
    (void)d->MemFree(big);
  }
  return res;
}

const driver_rule gpu_probe_rules[] = {
    {"R14 ADD-REFUSED",
     "ADD of a capture's set into an eager stream: ILLEGAL_STATE, into another capture's: "
     "INVALID_VALUE, no capture harmed; an empty ADD accepted",
     add_refused_rule},
    {"R15 NODE-ANY-CONTEXT",
     "event nodes and an external record in a capture take another context's event and run; an "
     "eager record of it: INVALID_HANDLE",
     node_any_context_rule},
    {"R16 EXTERNAL-PAIR-ORDERS",
     "two captures linked by an external record and wait: the waiting graph reads the other's "
     "data at launch (a control without the link reads stale data)",
     external_pair_orders_rule},
    {"R17 QUERY-CHEAP",
     "a capture query costs < 0.25 of an eager record and wait; every output <= 1.5 x status "
     "and id",
     query_cheap_rule},
    {"R18 EVENT-ORIGIN",
     "an eager-to-capture pair costs the same (0.8-1.25) on events made during a capture",
     event_origin_rule},
    {"R19 USER-OBJECT-SHARED",
     "one user object retained by two graphs: destroyed once, after the last; a retain costs "
     "less than a new object",
     user_object_shared_rule},
    {"R32 STREAM-ORDER", "events of one stream complete in record order", stream_order_rule},
    {"R33 HANDLE-REUSE",
     "a pending event's query says NOT_READY, a complete one's SUCCESS, whatever stream has its "
     "handle now",
     handle_reuse_rule},
};

const size_t gpu_probe_rule_count = sizeof gpu_probe_rules / sizeof gpu_probe_rules[0];
