/* Probe (not part of the product): can TWO_CAPTURES be made with the
 * external flags instead of nodes added by hand? A record with
 * CU_EVENT_RECORD_EXTERNAL in one capture, a wait with CU_EVENT_WAIT_EXTERNAL
 * in another; does the driver accept it (fresh event, one used in ended
 * captures before, one recorded eagerly before, another context's), does the
 * second graph wait for the first's node at launch, and what does it cost
 * against the by-hand nodes (query, node, SET on each stream)?
 * gcc -std=c11 -O2 -I/usr/local/cuda/include tc_external.c -o tc_external -lcuda */
#define _POSIX_C_SOURCE 200809L
#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static const char *en(CUresult r) {
  const char *n = "?";
  cuGetErrorName(r, &n);
  return n;
}
#define CK(x)                                                  \
  do {                                                         \
    CUresult r_ = (x);                                         \
    if (r_ != CUDA_SUCCESS) {                                  \
      printf("FAIL line %d %s -> %s\n", __LINE__, #x, en(r_)); \
      exit(1);                                                 \
    }                                                          \
  } while (0)

static double now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e9 + ts.tv_nsec;
}

static CUstream s1, s2, la, lb;
static CUdeviceptr big, flag, out;
static size_t big_words = (size_t)1 << 28; /* 1 GiB */

/* One exchange s1 -> s2 in two captures (begun), by flags or by hand. */
static CUresult link_flags(CUevent ev, CUresult *wr) {
  CUresult r = cuEventRecordWithFlags(ev, s1, CU_EVENT_RECORD_EXTERNAL);
  *wr = r == CUDA_SUCCESS ? cuStreamWaitEvent(s2, ev, CU_EVENT_WAIT_EXTERNAL) : r;
  return r;
}
static void by_hand(CUstream s, CUevent ev, int record) {
  CUstreamCaptureStatus cs;
  cuuint64_t id;
  CUgraph g;
  const CUgraphNode *deps;
  const CUgraphEdgeData *ed;
  size_t n;
  CUgraphNode node;
  CK(cuStreamGetCaptureInfo(s, &cs, &id, &g, &deps, &ed, &n));
  if (record)
    CK(cuGraphAddEventRecordNode(&node, g, deps, n, ev));
  else
    CK(cuGraphAddEventWaitNode(&node, g, deps, n, ev));
  CK(cuStreamUpdateCaptureDependencies(s, &node, NULL, 1, CU_STREAM_SET_CAPTURE_DEPENDENCIES));
}

static void node_types(const char *what, CUgraph g) {
  CUgraphNode nodes[16];
  size_t n = 16;
  CK(cuGraphGetNodes(g, nodes, &n));
  printf("%s: %zu nodes:", what, n);
  for (size_t i = 0; i < n && i < 16; i++) {
    CUgraphNodeType t;
    size_t nd = 0;
    CK(cuGraphNodeGetType(nodes[i], &t));
    CK(cuGraphNodeGetDependencies(nodes[i], NULL, NULL, &nd));
    printf(" type%d(deps %zu)", (int)t, nd);
  }
  printf("\n");
}

/* Captures g1 = [slow memsets, flag = 7, record] and g2 = [wait, out =
 * flag], launches g1 on la and g2 on lb at once, returns out. */
static CUstreamCaptureMode ord_mode = CU_STREAM_CAPTURE_MODE_RELAXED;
static int ordered_run(const char *what, CUevent ev, int with_link, int repeat) {
  int stale = 0;
  for (int k = 0; k < repeat; k++) {
    CUgraph g1 = NULL, g2 = NULL;
    CUgraphExec x1, x2;
    CUresult wr = CUDA_SUCCESS, rr = CUDA_SUCCESS;
    unsigned v = 0;
    CK(cuMemsetD32(flag, 0, 1));
    CK(cuMemsetD32(out, 0xffffffffu, 1));
    CK(cuCtxSynchronize());
    CK(cuStreamBeginCapture(s1, ord_mode));
    CK(cuStreamBeginCapture(s2, ord_mode));
    for (int i = 0; i < 4; i++)
      CK(cuMemsetD32Async(big, (unsigned)i, big_words, s1));
    CK(cuMemsetD32Async(flag, 7, 1, s1));
    if (with_link)
      rr = link_flags(ev, &wr);
    CK(cuMemcpyDtoDAsync(out, flag, 4, s2));
    if (rr != CUDA_SUCCESS || wr != CUDA_SUCCESS)
      printf("%s: record %s wait %s\n", what, en(rr), en(wr));
    CK(cuStreamEndCapture(s2, &g2));
    CK(cuStreamEndCapture(s1, &g1));
    if (k == 0) {
      node_types("  g1", g1);
      node_types("  g2", g2);
    }
    CK(cuGraphInstantiateWithFlags(&x1, g1, 0));
    CK(cuGraphInstantiateWithFlags(&x2, g2, 0));
    CK(cuGraphLaunch(x1, la));
    CK(cuGraphLaunch(x2, lb));
    CK(cuCtxSynchronize());
    CK(cuMemcpyDtoH(&v, out, 4));
    stale += v != 7;
    cuGraphExecDestroy(x1);
    cuGraphExecDestroy(x2);
    cuGraphDestroy(g1);
    cuGraphDestroy(g2);
  }
  printf("%s: %d of %d launches read stale data\n", what, stale, repeat);
  return stale;
}

static void accept_as(const char *what, CUevent ev, CUstreamCaptureMode mode, int end_first_first) {
  CUgraph g1 = NULL, g2 = NULL;
  CUresult wr = CUDA_SUCCESS, rr, e1, e2;
  static const char *modes[] = {"GLOBAL", "THREAD_LOCAL", "RELAXED"};
  CK(cuStreamBeginCapture(s1, mode));
  CK(cuStreamBeginCapture(s2, mode));
  CK(cuMemsetD32Async(flag, 1, 1, s1));
  CK(cuMemsetD32Async(out, 1, 1, s2));
  rr = link_flags(ev, &wr);
  if (end_first_first) {
    e1 = cuStreamEndCapture(s1, &g1);
    e2 = cuStreamEndCapture(s2, &g2);
  } else {
    e2 = cuStreamEndCapture(s2, &g2);
    e1 = cuStreamEndCapture(s1, &g1);
  }
  printf("%s [%s, %s ended first]: record %s, wait %s, end %s / %s\n", what, modes[mode],
         end_first_first ? "recording capture" : "waiting capture", en(rr), en(wr), en(e1), en(e2));
  if (g1)
    cuGraphDestroy(g1);
  if (g2)
    cuGraphDestroy(g2);
  cuCtxSynchronize();
}

static void accept(const char *what, CUevent ev) {
  for (int m = 0; m < 3; m++)
    for (int f = 0; f < 2; f++)
      accept_as(what, ev, (CUstreamCaptureMode)m, f);
}

#define K 1000
static CUevent evs[K];
static double time_batch(int flags) {
  CUgraph g1 = NULL, g2 = NULL;
  double t0, t;
  CK(cuStreamBeginCapture(s1, CU_STREAM_CAPTURE_MODE_RELAXED));
  CK(cuStreamBeginCapture(s2, CU_STREAM_CAPTURE_MODE_RELAXED));
  CK(cuMemsetD32Async(flag, 1, 1, s1));
  CK(cuMemsetD32Async(out, 1, 1, s2));
  t0 = now_ns();
  for (int i = 0; i < K; i++) {
    if (flags) {
      CUresult wr;
      CK(link_flags(evs[i], &wr));
      CK(wr);
    } else {
      by_hand(s1, evs[i], 1);
      by_hand(s2, evs[i], 0);
    }
  }
  t = (now_ns() - t0) / K;
  CK(cuStreamEndCapture(s2, &g2));
  CK(cuStreamEndCapture(s1, &g1));
  cuGraphDestroy(g1);
  cuGraphDestroy(g2);
  return t;
}

static int cmpd(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

int main(void) {
  CUdevice dev;
  CUcontext a, b;
  CUevent fresh, used, eager, other, nolink;
  CK(cuInit(0));
  CK(cuDeviceGet(&dev, 0));
  CK(cuCtxCreate(&b, NULL, 0, dev));
  CK(cuEventCreate(&other, CU_EVENT_DISABLE_TIMING));
  CK(cuCtxCreate(&a, NULL, 0, dev));
  CK(cuCtxSetCurrent(a));
  CK(cuStreamCreate(&s1, CU_STREAM_NON_BLOCKING));
  CK(cuStreamCreate(&s2, CU_STREAM_NON_BLOCKING));
  CK(cuStreamCreate(&la, CU_STREAM_NON_BLOCKING));
  CK(cuStreamCreate(&lb, CU_STREAM_NON_BLOCKING));
  CK(cuMemAlloc(&big, big_words * 4));
  CK(cuMemAlloc(&flag, 4));
  CK(cuMemAlloc(&out, 4));
  CK(cuEventCreate(&fresh, CU_EVENT_DISABLE_TIMING));
  CK(cuEventCreate(&used, CU_EVENT_DISABLE_TIMING));
  CK(cuEventCreate(&eager, CU_EVENT_DISABLE_TIMING));
  CK(cuEventCreate(&nolink, CU_EVENT_DISABLE_TIMING));
  for (int i = 0; i < K; i++)
    CK(cuEventCreate(&evs[i], CU_EVENT_DISABLE_TIMING));

  accept("fresh event", fresh);
  accept("same event again (its record node was in an ended capture)", fresh);
  /* used by hand in a capture (record node) and a wait node, capture ended */
  {
    CUgraph g1 = NULL, g2 = NULL;
    CK(cuStreamBeginCapture(s1, CU_STREAM_CAPTURE_MODE_RELAXED));
    CK(cuStreamBeginCapture(s2, CU_STREAM_CAPTURE_MODE_RELAXED));
    by_hand(s1, used, 1);
    by_hand(s2, used, 0);
    CK(cuStreamEndCapture(s2, &g2));
    CK(cuStreamEndCapture(s1, &g1));
    cuGraphDestroy(g1);
    cuGraphDestroy(g2);
  }
  accept("event used by hand-added nodes of ended captures", used);
  CK(cuEventRecord(eager, la));
  CK(cuCtxSynchronize());
  accept("event recorded eagerly before", eager);
  accept("another context's event", other);
  /* a wait with the flag on an event whose external record was made in an
   * earlier, ended capture (the EAGER_TO_CAPTURE fact), then recorded again */
  {
    CUgraph g2 = NULL;
    CUresult r;
    CK(cuStreamBeginCapture(s2, CU_STREAM_CAPTURE_MODE_RELAXED));
    r = cuStreamWaitEvent(s2, fresh, CU_EVENT_WAIT_EXTERNAL);
    printf("external wait alone on an event last recorded in an ended capture: %s\n", en(r));
    r = cuStreamEndCapture(s2, &g2);
    printf("  its end: %s\n", en(r));
    if (g2)
      cuGraphDestroy(g2);
  }

  ordered_run("flags link (record ext + wait ext), RELAXED", fresh, 1, 50);
  ord_mode = CU_STREAM_CAPTURE_MODE_GLOBAL;
  ordered_run("flags link (record ext + wait ext), GLOBAL", fresh, 1, 50);
  ordered_run("control: no link", nolink, 0, 50);

  {
    double tf[9], th[9];
    time_batch(1);
    time_batch(0);
    for (int r = 0; r < 9; r++) {
      tf[r] = time_batch(1);
      th[r] = time_batch(0);
    }
    qsort(tf, 9, sizeof tf[0], cmpd);
    qsort(th, 9, sizeof th[0], cmpd);
    printf("cost per exchange, one node on each stream, median of 9 batches of %d: flags %.0f ns "
           "(%.0f-%.0f), by hand %.0f ns (%.0f-%.0f), flags/by hand %.2f\n",
           K, tf[4], tf[0], tf[8], th[4], th[0], th[8], tf[4] / th[4]);
  }
  printf("after: sync %s\n", en(cuCtxSynchronize()));
  return 0;
}
