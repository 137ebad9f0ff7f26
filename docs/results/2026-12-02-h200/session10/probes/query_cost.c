/* Probe (not part of the product): what a capture query costs, by what it
 * asks for, on an eager stream and on a capturing one (a capture with a few
 * hundred nodes, the stream's frontier one node): cuStreamGetCaptureInfo
 * with every output (status, id, graph, dependencies, edges, count), with
 * status and id only, with status, id and graph, and cuStreamIsCapturing.
 * Host ns per call, median of 15 rounds of 2000 calls.
 * gcc -std=c11 -O2 -I/usr/local/cuda/include query_cost.c -o query_cost -lcuda */
#define _POSIX_C_SOURCE 200809L
#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#define CK(x)                                                   \
  do {                                                          \
    CUresult r_ = (x);                                          \
    if (r_ != CUDA_SUCCESS) {                                   \
      printf("FAIL line %d %s -> %d\n", __LINE__, #x, (int)r_); \
      exit(1);                                                  \
    }                                                           \
  } while (0)

static double now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e9 + ts.tv_nsec;
}

static int cmp(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

enum { ROUNDS = 15, N = 2000 };

static double time_kind(CUstream s, int kind) {
  double r[ROUNDS];
  for (int k = 0; k < ROUNDS; k++) {
    double t0 = now_ns();
    for (int i = 0; i < N; i++) {
      CUstreamCaptureStatus cs;
      cuuint64_t id;
      CUgraph g;
      const CUgraphNode *deps;
      const CUgraphEdgeData *ed;
      size_t n;
      switch (kind) {
      case 0:
        CK(cuStreamGetCaptureInfo(s, &cs, &id, &g, &deps, &ed, &n));
        break;
      case 1:
        CK(cuStreamGetCaptureInfo(s, &cs, &id, NULL, NULL, NULL, NULL));
        break;
      case 2:
        CK(cuStreamGetCaptureInfo(s, &cs, &id, &g, NULL, NULL, NULL));
        break;
      case 3:
        CK(cuStreamIsCapturing(s, &cs));
        break;
      case 4:
        CK(cuStreamGetCaptureInfo(s, &cs, NULL, NULL, NULL, NULL, NULL));
        break;
      }
    }
    r[k] = (now_ns() - t0) / N;
  }
  qsort(r, ROUNDS, sizeof r[0], cmp);
  return r[ROUNDS / 2];
}

int main(void) {
  CUdevice dev;
  CUcontext cx;
  CUstream e, c;
  CUdeviceptr buf;
  CUgraph g;
  static const char *names[] = {"GetCaptureInfo, every output", "GetCaptureInfo, status + id",
                                "GetCaptureInfo, status + id + graph", "IsCapturing",
                                "GetCaptureInfo, status only"};
  CK(cuInit(0));
  CK(cuDeviceGet(&dev, 0));
  CK(cuDevicePrimaryCtxRetain(&cx, dev));
  CK(cuCtxSetCurrent(cx));
  CK(cuStreamCreate(&e, CU_STREAM_NON_BLOCKING));
  CK(cuStreamCreate(&c, CU_STREAM_NON_BLOCKING));
  CK(cuMemAlloc(&buf, 4096));
  CK(cuStreamBeginCapture(c, CU_STREAM_CAPTURE_MODE_RELAXED));
  for (int i = 0; i < 300; i++)
    CK(cuMemsetD32Async(buf, (unsigned)i, 16, c));
  printf("%-40s %10s %10s\n", "query (host ns per call, median)", "eager", "capturing");
  for (int pass = 0; pass < 2; pass++) /* the first pass warms up */
    for (int k = 0; k < 5; k++) {
      double te = time_kind(e, k), tc = time_kind(c, k);
      if (pass == 1)
        printf("%-40s %10.1f %10.1f\n", names[k], te, tc);
    }
  CK(cuStreamEndCapture(c, &g));
  CK(cuGraphDestroy(g));
  return 0;
}
