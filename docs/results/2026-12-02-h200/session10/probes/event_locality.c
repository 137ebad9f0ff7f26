/* Probe (not part of the product): does it matter to the driver's cost of
 * an EAGER_TO_CAPTURE pair (cuEventRecord on an eager stream, then
 * cuStreamWaitEvent(CU_EVENT_WAIT_EXTERNAL) on a capturing one) how its
 * events were made? Set A: 500 events made one after the other. Set B: 500
 * events made one at a time in between the nodes of a capture, as a pool
 * that grows while orders go into a capture makes them (dlsync's pool does).
 * Each batch: a fresh capture, 500 pairs, end, destroy; rounds alternate the
 * sets, A first then B first. Host ns per pair, median over the rounds, and
 * the median of the per-round ratios B / A.
 * gcc -std=c11 -O2 -I/usr/local/cuda/include event_locality.c -o event_locality -lcuda */
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

enum { K = 500, ROUNDS = 21, BATCHES = 5 };

static CUstream p, c;
static CUdeviceptr buf;

static double now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e9 + ts.tv_nsec;
}

static int cmp(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static double batch(CUevent *ev) {
  CUgraph g;
  double t0, t;
  CK(cuStreamBeginCapture(c, CU_STREAM_CAPTURE_MODE_RELAXED));
  t0 = now_ns();
  for (int i = 0; i < K; i++) {
    CK(cuEventRecord(ev[i], p));
    CK(cuStreamWaitEvent(c, ev[i], CU_EVENT_WAIT_EXTERNAL));
  }
  t = (now_ns() - t0) / K;
  CK(cuStreamEndCapture(c, &g));
  CK(cuGraphDestroy(g));
  return t;
}

static double run(CUevent *ev) {
  double t[BATCHES];
  for (int b = 0; b < BATCHES; b++)
    t[b] = batch(ev);
  qsort(t, BATCHES, sizeof t[0], cmp);
  return t[BATCHES / 2];
}

int main(void) {
  CUdevice dev;
  CUcontext cx;
  CUgraph g;
  static CUevent a[K], b[K];
  double ta[ROUNDS], tb[ROUNDS], ratio[ROUNDS];
  CK(cuInit(0));
  CK(cuDeviceGet(&dev, 0));
  CK(cuDevicePrimaryCtxRetain(&cx, dev));
  CK(cuCtxSetCurrent(cx));
  CK(cuStreamCreate(&p, CU_STREAM_NON_BLOCKING));
  CK(cuStreamCreate(&c, CU_STREAM_NON_BLOCKING));
  CK(cuMemAlloc(&buf, 4096));
  for (int i = 0; i < K; i++)
    CK(cuEventCreate(&a[i], CU_EVENT_DISABLE_TIMING));
  /* B: each made in between a capture's pairs, as a growing pool makes them. */
  CK(cuStreamBeginCapture(c, CU_STREAM_CAPTURE_MODE_RELAXED));
  for (int i = 0; i < K; i++) {
    CK(cuEventCreate(&b[i], CU_EVENT_DISABLE_TIMING));
    CK(cuEventRecord(b[i], p));
    CK(cuStreamWaitEvent(c, b[i], CU_EVENT_WAIT_EXTERNAL));
    CK(cuMemsetD32Async(buf, (unsigned)i, 1, c));
  }
  CK(cuStreamEndCapture(c, &g));
  CK(cuGraphDestroy(g));
  run(a);
  run(b);
  for (int k = 0; k < ROUNDS; k++) {
    if (k % 2 == 0) {
      ta[k] = run(a);
      tb[k] = run(b);
    } else {
      tb[k] = run(b);
      ta[k] = run(a);
    }
    ratio[k] = tb[k] / ta[k];
  }
  qsort(ta, ROUNDS, sizeof ta[0], cmp);
  qsort(tb, ROUNDS, sizeof tb[0], cmp);
  qsort(ratio, ROUNDS, sizeof ratio[0], cmp);
  printf("EAGER_TO_CAPTURE pair, host ns (median of %d rounds of %d batches of %d)\n", ROUNDS,
         BATCHES, K);
  printf("  A: events made one after the other    %8.1f\n", ta[ROUNDS / 2]);
  printf("  B: events made in between a capture's  %8.1f\n", tb[ROUNDS / 2]);
  printf("  B / A: %.3f [%.3f-%.3f]\n", ratio[ROUNDS / 2], ratio[0], ratio[ROUNDS - 1]);
  return 0;
}
