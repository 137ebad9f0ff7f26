/* Probe (not part of the product): what it costs to tie an event to a graph
 * built by hand, per event, and what the driver does with the references.
 * Each way is timed on a fresh graph per batch of K wait nodes in a chain
 * (host ns per node, median of ROUNDS batches), paired within a round:
 *   node          the wait node alone (the raw side of EAGER_TO_BUILT)
 *   create+move   + a user object per event, moved into the graph (the
 *                 bench's floor today: dlsync's own way)
 *   retain shared + one retain (no MOVE) of one user object made per batch
 *                 of 8 events (a shared hold retained once per event)
 *   retain same   + one retain of one user object made per graph
 *   create only   + cuUserObjectCreate and cuUserObjectRelease, no graph
 * Then: how many destructors ran, and when, for a user object retained 500
 * times by one graph and once by another (the driver must keep the object
 * until both are gone), and the resident memory over 2000 graphs each
 * retaining one object 500 times.
 * gcc -std=c11 -O2 -I/usr/local/cuda/include user_object_cost.c -o user_object_cost -lcuda */
#define _POSIX_C_SOURCE 200809L
#include <cuda.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
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

static double median(double *v, int n) {
  qsort(v, (size_t)n, sizeof v[0], cmp);
  return v[n / 2];
}

enum { ROUNDS = 21, K = 500, WAYS = 5 };
static CUevent ev[K];
static atomic_long ran;

static void count_destroy(void *p) {
  (void)p;
  atomic_fetch_add(&ran, 1);
}

static long rss_kib(void) {
  FILE *f = fopen("/proc/self/status", "r");
  char line[256];
  long v = -1;
  while (f != NULL && fgets(line, sizeof line, f) != NULL)
    if (strncmp(line, "VmRSS:", 6) == 0)
      v = strtol(line + 6, NULL, 10);
  if (f != NULL)
    fclose(f);
  return v;
}

static double time_way(int way) {
  CUgraph g;
  CUgraphNode dep, n;
  CUuserObject shared = NULL;
  double t0, t;
  CK(cuGraphCreate(&g, 0));
  CK(cuGraphAddEmptyNode(&dep, g, NULL, 0));
  t0 = now_ns();
  for (int i = 0; i < K; i++) {
    CUuserObject o;
    switch (way) {
    case 1:
      CK(cuUserObjectCreate(&o, NULL, count_destroy, 1, CU_USER_OBJECT_NO_DESTRUCTOR_SYNC));
      CK(cuGraphRetainUserObject(g, o, 1, CU_GRAPH_USER_OBJECT_MOVE));
      break;
    case 2:
      if (i % 8 == 0) {
        if (shared != NULL)
          CK(cuUserObjectRelease(shared, 1));
        CK(cuUserObjectCreate(&shared, NULL, count_destroy, 1, CU_USER_OBJECT_NO_DESTRUCTOR_SYNC));
      }
      CK(cuGraphRetainUserObject(g, shared, 1, 0));
      break;
    case 3:
      if (i == 0)
        CK(cuUserObjectCreate(&shared, NULL, count_destroy, 1, CU_USER_OBJECT_NO_DESTRUCTOR_SYNC));
      CK(cuGraphRetainUserObject(g, shared, 1, 0));
      break;
    case 4:
      CK(cuUserObjectCreate(&o, NULL, count_destroy, 1, CU_USER_OBJECT_NO_DESTRUCTOR_SYNC));
      CK(cuUserObjectRelease(o, 1));
      break;
    default:
      break;
    }
    if (way != 4) {
      CK(cuGraphAddEventWaitNode(&n, g, &dep, 1, ev[i]));
      dep = n;
    }
  }
  t = (now_ns() - t0) / K;
  if (shared != NULL)
    CK(cuUserObjectRelease(shared, 1));
  CK(cuGraphDestroy(g));
  return t;
}

int main(void) {
  CUdevice dev;
  CUcontext cx;
  static const char *names[WAYS] = {"node", "node + create+move", "node + retain shared (1 per 8)",
                                    "node + retain same (1 per graph)", "create+release only"};
  double r[WAYS][ROUNDS], ratio[WAYS][ROUNDS];
  CK(cuInit(0));
  CK(cuDeviceGet(&dev, 0));
  CK(cuDevicePrimaryCtxRetain(&cx, dev));
  CK(cuCtxSetCurrent(cx));
  for (int i = 0; i < K; i++)
    CK(cuEventCreate(&ev[i], CU_EVENT_DISABLE_TIMING));
  for (int w = 0; w < WAYS; w++) /* warm */
    (void)time_way(w);
  for (int k = 0; k < ROUNDS; k++)
    for (int w0 = 0; w0 < WAYS; w0++) {
      int w = (w0 + k) % WAYS; /* a different order in each round */
      r[w][k] = time_way(w);
    }
  for (int k = 0; k < ROUNDS; k++)
    for (int w = 0; w < WAYS; w++)
      ratio[w][k] = r[w][k] / r[0][k];
  printf("%-36s %10s %10s\n", "way (host ns per event, median)", "ns", "/ node");
  for (int w = 0; w < WAYS; w++) {
    double m = median(r[w], ROUNDS), q = median(ratio[w], ROUNDS);
    printf("%-36s %10.1f %10.3f\n", names[w], m, q);
  }

  /* Semantics: one object retained K times by g1 and once by g2 (both
   * instantiated); our own reference dropped at once. */
  {
    CUgraph g1, g2;
    CUgraphExec x1;
    CUgraphNode n1, n2;
    CUuserObject o;
    long before;
    struct timespec ts = {0, 50000000};
    atomic_store(&ran, 0);
    CK(cuGraphCreate(&g1, 0));
    CK(cuGraphCreate(&g2, 0));
    CK(cuGraphAddEmptyNode(&n1, g1, NULL, 0));
    CK(cuGraphAddEmptyNode(&n2, g2, NULL, 0));
    CK(cuUserObjectCreate(&o, NULL, count_destroy, 1, CU_USER_OBJECT_NO_DESTRUCTOR_SYNC));
    for (int i = 0; i < K; i++)
      CK(cuGraphRetainUserObject(g1, o, 1, 0));
    CK(cuGraphRetainUserObject(g2, o, 1, 0));
    CK(cuUserObjectRelease(o, 1));
    CK(cuGraphInstantiate(&x1, g1, 0));
    CK(cuGraphDestroy(g1));
    nanosleep(&ts, NULL);
    before = atomic_load(&ran);
    CK(cuGraphExecDestroy(x1));
    nanosleep(&ts, NULL);
    printf("semantics: after g1 destroyed (its exec alive, g2 alive): %ld ran; ", before);
    before = atomic_load(&ran);
    printf("after its exec destroyed (g2 alive): %ld ran; ", before);
    CK(cuGraphDestroy(g2));
    nanosleep(&ts, NULL);
    printf("after g2 destroyed: %ld ran (expect 0, 0, 1)\n", (long)atomic_load(&ran));
  }

  /* Memory: 2000 graphs, each retaining one object K times, against 2000
   * graphs retaining K objects once each. */
  for (int way = 0; way < 2; way++) {
    long r0 = rss_kib();
    double t0 = now_ns(), tdestroy = 0;
    for (int j = 0; j < 2000; j++) {
      CUgraph g;
      CUuserObject o;
      CK(cuGraphCreate(&g, 0));
      if (way == 0) {
        CK(cuUserObjectCreate(&o, NULL, count_destroy, 1, CU_USER_OBJECT_NO_DESTRUCTOR_SYNC));
        for (int i = 0; i < K; i++)
          CK(cuGraphRetainUserObject(g, o, 1, 0));
        CK(cuUserObjectRelease(o, 1));
      } else {
        for (int i = 0; i < K; i++) {
          CK(cuUserObjectCreate(&o, NULL, count_destroy, 1, CU_USER_OBJECT_NO_DESTRUCTOR_SYNC));
          CK(cuGraphRetainUserObject(g, o, 1, CU_GRAPH_USER_OBJECT_MOVE));
        }
      }
      double d0 = now_ns();
      CK(cuGraphDestroy(g));
      tdestroy += now_ns() - d0;
    }
    {
      struct timespec ts = {0, 200000000};
      nanosleep(&ts, NULL);
    }
    printf("memory: 2000 graphs x %d %s: RSS %+ld KiB, %.1f ns per retain, graph destroy %.1f us\n",
           K, way == 0 ? "retains of one object" : "objects made and moved", rss_kib() - r0,
           (now_ns() - t0) / (2000.0 * K), tdestroy / 2000 / 1000);
  }
  return 0;
}
