/* Probe (not part of the product): does cuStreamUpdateCaptureDependencies(ADD)
 * of one capturing stream's dependencies into another's order them as an
 * event record + wait would, and what does it cost?
 * gcc -std=c11 -D_POSIX_C_SOURCE=200809L -O2 -I/usr/local/cuda/include add_join.c -o add_join
 * -lcuda */
#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define CK(x)                                                      \
  do {                                                             \
    CUresult r_ = (x);                                             \
    if (r_ != CUDA_SUCCESS) {                                      \
      const char *n_ = "?";                                        \
      cuGetErrorName(r_, &n_);                                     \
      printf("FAIL %s:%d %s -> %s\n", __FILE__, __LINE__, #x, n_); \
      exit(1);                                                     \
    }                                                              \
  } while (0)

static const char *en(CUresult r) {
  const char *n = "?";
  cuGetErrorName(r, &n);
  return n;
}

static size_t ndeps(CUstream s, const CUgraphNode **deps) {
  CUstreamCaptureStatus cs;
  cuuint64_t id;
  CUgraph g;
  const CUgraphEdgeData *ed;
  size_t n = 0;
  CK(cuStreamGetCaptureInfo(s, &cs, &id, &g, deps, &ed, &n));
  return n;
}

static size_t node_deps(CUgraphNode nd, CUgraphNode *out) {
  size_t n = 8;
  CK(cuGraphNodeGetDependencies(nd, out, NULL, &n));
  return n;
}

static double now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e9 + ts.tv_nsec;
}

static int cmpd(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

int main(void) {
  CUdevice dev;
  CUcontext ctx;
  CUstream s0, s1, s2;
  CUevent e0, e1;
  CUdeviceptr buf;
  CUgraph g;
  const CUgraphNode *deps;
  CUgraphNode copy[8], A, B, C, D, E, dd[8];
  size_t n;
  int driver = 0;
  CK(cuInit(0));
  CK(cuDriverGetVersion(&driver));
  CK(cuDeviceGet(&dev, 0));
  CK(cuDevicePrimaryCtxRetain(&ctx, dev));
  CK(cuCtxSetCurrent(ctx));
  CK(cuStreamCreate(&s0, CU_STREAM_NON_BLOCKING));
  CK(cuStreamCreate(&s1, CU_STREAM_NON_BLOCKING));
  CK(cuStreamCreate(&s2, CU_STREAM_NON_BLOCKING));
  CK(cuEventCreate(&e0, CU_EVENT_DISABLE_TIMING));
  CK(cuEventCreate(&e1, CU_EVENT_DISABLE_TIMING));
  CK(cuMemAlloc(&buf, 64));
  printf("driver %d\n", driver);

  /* T1: ADD on an eager stream. */
  CK(cuStreamBeginCapture(s0, CU_STREAM_CAPTURE_MODE_RELAXED));
  CK(cuMemsetD32Async(buf, 1, 1, s0));
  n = ndeps(s0, &deps);
  memcpy(copy, deps, n * sizeof *copy);
  printf(
      "T1 ADD on an eager stream: %s\n",
      en(cuStreamUpdateCaptureDependencies(s1, copy, NULL, n, CU_STREAM_ADD_CAPTURE_DEPENDENCIES)));
  {
    CUstreamCaptureStatus cs;
    CK(cuStreamIsCapturing(s0, &cs));
    printf("T1 origin after: status %d\n", (int)cs);
    CK(cuStreamIsCapturing(s1, &cs));
    printf("T1 eager stream after: status %d\n", (int)cs);
  }
  g = NULL;
  printf("T1 end: %s\n", en(cuStreamEndCapture(s0, &g)));
  if (g)
    cuGraphDestroy(g);

  /* T2: ADD inside one capture, both directions, and as the join back. */
  CK(cuStreamBeginCapture(s0, CU_STREAM_CAPTURE_MODE_RELAXED));
  CK(cuMemsetD32Async(buf, 1, 1, s0));
  n = ndeps(s0, &deps);
  A = deps[0];
  CK(cuEventRecord(e0, s0));
  CK(cuStreamWaitEvent(s1, e0, 0));
  CK(cuMemsetD32Async(buf + 4, 2, 1, s1));
  n = ndeps(s1, &deps);
  B = deps[0];
  CK(cuMemsetD32Async(buf + 8, 3, 1, s0));
  n = ndeps(s0, &deps);
  C = deps[0];
  /* s0's array passed straight to the update of s1 (no copy). */
  CK(cuStreamUpdateCaptureDependencies(s1, (CUgraphNode *)deps, NULL, n,
                                       CU_STREAM_ADD_CAPTURE_DEPENDENCIES));
  n = ndeps(s1, &deps);
  printf("T2 s1 deps after ADD of s0's: %zu (want 2: B, C) %s\n", n,
         n == 2 && ((deps[0] == B && deps[1] == C) || (deps[0] == C && deps[1] == B)) ? "ok"
                                                                                      : "??");
  n = ndeps(s0, &deps);
  CK(cuStreamUpdateCaptureDependencies(s1, (CUgraphNode *)deps, NULL, n,
                                       CU_STREAM_ADD_CAPTURE_DEPENDENCIES));
  n = ndeps(s1, &deps);
  printf("T2 s1 deps after the same ADD again: %zu (2 if merged)\n", n);
  printf("T2 ADD of 0 nodes: %s\n", en(cuStreamUpdateCaptureDependencies(
                                        s1, NULL, NULL, 0, CU_STREAM_ADD_CAPTURE_DEPENDENCIES)));
  n = ndeps(s1, &deps);
  printf("T2 s1 deps after ADD of 0: %zu\n", n);
  CK(cuMemsetD32Async(buf + 12, 4, 1, s1));
  n = ndeps(s1, &deps);
  D = deps[0];
  n = node_deps(D, dd);
  printf("T2 D's dependencies: %zu (want 2: B, C) %s\n", n,
         n == 2 && ((dd[0] == B && dd[1] == C) || (dd[0] == C && dd[1] == B)) ? "ok" : "??");
  /* Join back by ADD alone. */
  n = ndeps(s1, &deps);
  CK(cuStreamUpdateCaptureDependencies(s0, (CUgraphNode *)deps, NULL, n,
                                       CU_STREAM_ADD_CAPTURE_DEPENDENCIES));
  CK(cuMemsetD32Async(buf + 16, 5, 1, s0));
  n = ndeps(s0, &deps);
  E = deps[0];
  n = node_deps(E, dd);
  printf("T2 E's dependencies: %zu (want 2: C, D) %s\n", n,
         n == 2 && ((dd[0] == C && dd[1] == D) || (dd[0] == D && dd[1] == C)) ? "ok" : "??");
  g = NULL;
  printf("T2 end after a join back by ADD only: %s\n", en(cuStreamEndCapture(s0, &g)));
  {
    CUstreamCaptureStatus cs;
    CK(cuStreamIsCapturing(s1, &cs));
    printf("T2 s1 after the end: status %d\n", (int)cs);
  }
  if (g) {
    size_t nn = 0, ne = 0;
    CK(cuGraphGetNodes(g, NULL, &nn));
    CK(cuGraphGetEdges(g, NULL, NULL, NULL, &ne));
    printf("T2 graph: %zu nodes, %zu edges (want 5, 5)\n", nn, ne);
    (void)A;
    cuGraphDestroy(g);
  }

  /* T3: a node of capture 1 added to a stream of capture 2. */
  CK(cuStreamBeginCapture(s0, CU_STREAM_CAPTURE_MODE_RELAXED));
  CK(cuMemsetD32Async(buf, 1, 1, s0));
  CK(cuStreamBeginCapture(s2, CU_STREAM_CAPTURE_MODE_RELAXED));
  n = ndeps(s0, &deps);
  printf("T3 ADD of capture 1's node into capture 2's stream: %s\n",
         en(cuStreamUpdateCaptureDependencies(s2, (CUgraphNode *)deps, NULL, n,
                                              CU_STREAM_ADD_CAPTURE_DEPENDENCIES)));
  g = NULL;
  printf("T3 end 2: %s\n", en(cuStreamEndCapture(s2, &g)));
  if (g)
    cuGraphDestroy(g);
  g = NULL;
  printf("T3 end 1: %s\n", en(cuStreamEndCapture(s0, &g)));
  if (g)
    cuGraphDestroy(g);

  /* T4: unjoined work with an ADD in one direction only: still UNJOINED? */
  CK(cuStreamBeginCapture(s0, CU_STREAM_CAPTURE_MODE_RELAXED));
  CK(cuMemsetD32Async(buf, 1, 1, s0));
  CK(cuEventRecord(e0, s0));
  CK(cuStreamWaitEvent(s1, e0, 0));
  CK(cuMemsetD32Async(buf + 4, 2, 1, s1));
  n = ndeps(s0, &deps);
  CK(cuStreamUpdateCaptureDependencies(s1, (CUgraphNode *)deps, NULL, n,
                                       CU_STREAM_ADD_CAPTURE_DEPENDENCIES));
  g = NULL;
  printf("T4 end with s1's work unjoined (ADD s0->s1 only): %s (want UNJOINED)\n",
         en(cuStreamEndCapture(s0, &g)));
  if (g)
    cuGraphDestroy(g);

  /* Timing inside one capture: the raw fork+join by events, by ADD, and
   * dlsync's would-be calls (3 queries + 2 ADDs). */
  {
    enum { N = 5000, R = 9, K = 6 };
    double t[K][R];
    const char *names[K] = {"record+wait x2 (raw)",
                            "query(deps)+ADD x2",
                            "3 queries + 2 ADD (dlsync-like)",
                            "3 queries + record+wait x2 (old floor)",
                            "status query (IsCapturing)",
                            "full query (deps, edges)"};
    for (int rep = 0; rep < R; rep++) {
      for (int k = 0; k < K; k++) {
        double t0, t1;
        CK(cuStreamBeginCapture(s0, CU_STREAM_CAPTURE_MODE_RELAXED));
        CK(cuMemsetD32Async(buf, 1, 1, s0));
        CK(cuEventRecord(e0, s0));
        CK(cuStreamWaitEvent(s1, e0, 0));
        CK(cuMemsetD32Async(buf + 4, 2, 1, s1));
        t0 = now_ns();
        for (int i = 0; i < N; i++) {
          CUstreamCaptureStatus cs;
          cuuint64_t id;
          const CUgraphEdgeData *ed;
          CUgraph cg;
          size_t m;
          switch (k) {
          case 0:
            cuEventRecord(e0, s0);
            cuStreamWaitEvent(s1, e0, 0);
            cuEventRecord(e1, s1);
            cuStreamWaitEvent(s0, e1, 0);
            break;
          case 1:
            cuStreamGetCaptureInfo(s0, &cs, &id, &cg, &deps, &ed, &m);
            cuStreamUpdateCaptureDependencies(s1, (CUgraphNode *)deps, NULL, m,
                                              CU_STREAM_ADD_CAPTURE_DEPENDENCIES);
            cuStreamGetCaptureInfo(s1, &cs, &id, &cg, &deps, &ed, &m);
            cuStreamUpdateCaptureDependencies(s0, (CUgraphNode *)deps, NULL, m,
                                              CU_STREAM_ADD_CAPTURE_DEPENDENCIES);
            break;
          case 2:
            cuStreamGetCaptureInfo(s1, &cs, &id, NULL, NULL, NULL, NULL);
            cuStreamGetCaptureInfo(s0, &cs, &id, &cg, &deps, &ed, &m);
            cuStreamUpdateCaptureDependencies(s1, (CUgraphNode *)deps, NULL, m,
                                              CU_STREAM_ADD_CAPTURE_DEPENDENCIES);
            cuStreamGetCaptureInfo(s1, &cs, &id, &cg, &deps, &ed, &m);
            cuStreamUpdateCaptureDependencies(s0, (CUgraphNode *)deps, NULL, m,
                                              CU_STREAM_ADD_CAPTURE_DEPENDENCIES);
            break;
          case 3:
            cuStreamGetCaptureInfo(s1, &cs, &id, NULL, NULL, NULL, NULL);
            cuStreamGetCaptureInfo(s0, &cs, &id, NULL, NULL, NULL, NULL);
            cuEventRecord(e0, s0);
            cuStreamWaitEvent(s1, e0, 0);
            cuStreamGetCaptureInfo(s1, &cs, &id, NULL, NULL, NULL, NULL);
            cuEventRecord(e1, s1);
            cuStreamWaitEvent(s0, e1, 0);
            break;
          case 4:
            cuStreamIsCapturing(s0, &cs);
            break;
          case 5:
            cuStreamGetCaptureInfo(s0, &cs, &id, &cg, &deps, &ed, &m);
            break;
          }
        }
        t1 = now_ns();
        t[k][rep] = (t1 - t0) / N;
        CK(cuEventRecord(e1, s1));
        CK(cuStreamWaitEvent(s0, e1, 0));
        g = NULL;
        CK(cuStreamEndCapture(s0, &g));
        cuGraphDestroy(g);
      }
    }
    printf("in capture, host ns per op (median of %d x %d):\n", R, N);
    for (int k = 0; k < K; k++) {
      qsort(t[k], R, sizeof(double), cmpd);
      printf("  %-42s %7.1f  (%.2f of raw)\n", names[k], t[k][R / 2], t[k][R / 2] / t[0][R / 2]);
    }
  }
  return 0;
}
