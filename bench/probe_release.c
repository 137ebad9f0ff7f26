/* SPDX-License-Identifier: Apache-2.0 */
/* Where a release's cost on the releasing thread goes: the driver calls a
 * release must make (the capture query, the stream's id, the record) and
 * the releasing side of several queue designs, each with a background
 * thread doing what that design's reclaimer does (consuming a
 * single-producer ring: synchronising the newest event, querying each
 * earlier one, freeing the producer's allocations), against one
 * cuEventRecord of the same event, host ns per operation (medians of 9
 * batches of 5000), twice; then dlsync_release itself. No target: it
 * explains bench_release's figure (docs/performance.md). */
#include <pthread.h>
#include <stdatomic.h>
#include <unistd.h>
#include "../tests/gpu/gpu_common.h"
#include "bench_util.h"

static gpu_env E;
static const dlsync__driver *D;
static CUstream P;
static CUevent ev;
static dlsync_lane lane_p;
static int OPS = 5000;

#define RING 4096u
typedef struct slot {
  CUevent event;
  unsigned long long sid;
  void *item;
  char pad[40];
} slot;
static slot ring[RING];
static unsigned ring_n = RING; /* slots in use (power of two) */
static _Alignas(64) atomic_uint head;
static _Alignas(64) atomic_uint tail;
static _Alignas(64) unsigned tail_cache;
static atomic_bool stopq;
static int mode; /* bg: 1 sync newest + query earlier; 2 sync newest; 3 free items too */
static atomic_ulong consumed;

static double tb(op_fn fn) {
  double t[9];
  for (int b = 0; b < 9; b++) {
    double t0 = gpu_now_ns();
    for (int i = 0; i < OPS; i++)
      fn();
    t[b] = (gpu_now_ns() - t0) / OPS;
  }
  return median(t, 9);
}

static void *bg(void *a) {
  (void)a;
  CHECK(D->CtxPushCurrent(E.cuctx) == CUDA_SUCCESS, "push");
  CUstreamCaptureMode m = CU_STREAM_CAPTURE_MODE_RELAXED;
  while (!atomic_load(&stopq)) {
    unsigned h = atomic_load_explicit(&head, memory_order_acquire);
    unsigned t = atomic_load_explicit(&tail, memory_order_relaxed);
    if (h == t) {
      usleep(50);
      continue;
    }
    (void)D->ThreadExchangeStreamCaptureMode(&m);
    slot *newest = &ring[(h - 1) & (ring_n - 1)];
    (void)D->EventSynchronize(newest->event);
    for (unsigned i = t; i != h - 1; i++) {
      slot *s = &ring[i & (ring_n - 1)];
      if (mode == 1)
        (void)D->EventQuery(s->event);
      if (mode == 3) {
        free(s->item);
        s->item = NULL;
      }
    }
    if (mode == 3) {
      free(newest->item);
      newest->item = NULL;
    }
    atomic_fetch_add_explicit(&consumed, h - t, memory_order_relaxed);
    atomic_store_explicit(&tail, h, memory_order_release);
    usleep(50);
  }
  return NULL;
}

static inline slot *ring_next(void) {
  unsigned h = atomic_load_explicit(&head, memory_order_relaxed);
  while (h - tail_cache >= ring_n)
    tail_cache = atomic_load_explicit(&tail, memory_order_acquire);
  return &ring[h & (ring_n - 1)];
}
static inline void ring_publish(void) {
  unsigned h = atomic_load_explicit(&head, memory_order_relaxed);
  atomic_store(&head, h + 1); /* seq_cst, as a ring's push */
}

static void op_rec(void) {
  CHECK(D->EventRecord(ev, P) == CUDA_SUCCESS, "rec");
}
static void op_cap_rec(void) {
  CUstreamCaptureStatus s;
  CHECK(D->StreamIsCapturing(P, &s) == CUDA_SUCCESS, "cap");
  CHECK(D->EventRecord(ev, P) == CUDA_SUCCESS, "rec");
}
static void op_cap_id_rec(void) {
  CUstreamCaptureStatus s;
  unsigned long long id;
  CHECK(D->StreamIsCapturing(P, &s) == CUDA_SUCCESS, "cap");
  CHECK(D->StreamGetId(P, &id) == CUDA_SUCCESS, "id");
  CHECK(D->EventRecord(ev, P) == CUDA_SUCCESS, "rec");
}
/* An event per ring slot (thread-affine), recorded; the slot published. */
static void op_slot(void) {
  CUstreamCaptureStatus s;
  CHECK(D->StreamIsCapturing(P, &s) == CUDA_SUCCESS, "cap");
  slot *sl = ring_next();
  CHECK(D->EventRecord(sl->event, P) == CUDA_SUCCESS, "rec");
  ring_publish();
}
static void op_slot_id(void) {
  CUstreamCaptureStatus s;
  CHECK(D->StreamIsCapturing(P, &s) == CUDA_SUCCESS, "cap");
  slot *sl = ring_next();
  CHECK(D->StreamGetId(P, &sl->sid) == CUDA_SUCCESS, "id");
  CHECK(D->EventRecord(sl->event, P) == CUDA_SUCCESS, "rec");
  ring_publish();
}
/* One event per stream re-recorded (the slot names it). */
static CUevent shared_ev;
static void op_shared(void) {
  CUstreamCaptureStatus s;
  CHECK(D->StreamIsCapturing(P, &s) == CUDA_SUCCESS, "cap");
  slot *sl = ring_next();
  CHECK(D->StreamGetId(P, &sl->sid) == CUDA_SUCCESS, "id");
  CHECK(D->EventRecord(shared_ev, P) == CUDA_SUCCESS, "rec");
  sl->event = shared_ev;
  ring_publish();
}
static void op_slot_malloc(void) {
  CUstreamCaptureStatus s;
  CHECK(D->StreamIsCapturing(P, &s) == CUDA_SUCCESS, "cap");
  slot *sl = ring_next();
  sl->item = malloc(88);
  CHECK(D->EventRecord(sl->event, P) == CUDA_SUCCESS, "rec");
  ring_publish();
}
static void noop(void *a) {
  (void)a;
}
static void op_release(void) {
  CHECK(dlsync_release(E.ctx, &lane_p, noop, NULL) == 0, "rel");
}

static void drain(void) {
  while (atomic_load(&tail) != atomic_load(&head))
    usleep(100);
}

static void with_bg(int m, unsigned n, const char *name, op_fn fn) {
  pthread_t t;
  double a, b;
  mode = m;
  ring_n = n;
  atomic_store(&head, 0);
  atomic_store(&tail, 0);
  tail_cache = 0;
  atomic_store(&stopq, false);
  CHECK(pthread_create(&t, NULL, bg, NULL) == 0, "thr");
  for (int i = 0; i < 2000; i++)
    fn();
  a = tb(fn);
  b = tb(op_rec);
  drain();
  atomic_store(&stopq, true);
  pthread_join(t, NULL);
  /* the shared-event variant overwrote slot events */
  for (unsigned i = 0; i < RING; i++)
    if (ring[i].event == shared_ev)
      ring[i].event = NULL;
  for (unsigned i = 0; i < RING; i++)
    if (ring[i].event == NULL)
      CHECK(D->EventCreate(&ring[i].event, CU_EVENT_DISABLE_TIMING) == 0, "e");
  printf("%-60s %7.1f ns  %5.2f x record (%.1f)\n", name, a, a / b, b);
}

int main(void) {
  int rc = gpu_env_init(&E);
  if (rc)
    return rc;
  D = E.d;
  CHECK(D->StreamCreate(&P, CU_STREAM_NON_BLOCKING) == 0, "s");
  CHECK(D->EventCreate(&ev, CU_EVENT_DISABLE_TIMING) == 0, "e");
  CHECK(D->EventCreate(&shared_ev, CU_EVENT_DISABLE_TIMING) == 0, "e");
  for (unsigned i = 0; i < RING; i++)
    CHECK(D->EventCreate(&ring[i].event, CU_EVENT_DISABLE_TIMING) == 0, "e");
  lane_p = dlsync_lane_stream(P);
  for (int rep = 0; rep < 2; rep++) {
    printf("-- rep %d on %s\n", rep, E.name);
    double r = tb(op_rec);
    printf("%-60s %7.1f ns\n", "record same event (R)", r);
    printf("%-60s %7.1f ns  %5.2f x R\n", "IsCapturing + record same", tb(op_cap_rec),
           tb(op_cap_rec) / r);
    printf("%-60s %7.1f ns  %5.2f x R\n", "IsCapturing + GetId + record same", tb(op_cap_id_rec),
           tb(op_cap_id_rec) / r);
    with_bg(1, 4096, "slot events(4096), bg: sync newest + query each earlier", op_slot);
    with_bg(1, 1024, "slot events(1024), bg: sync newest + query each earlier", op_slot);
    with_bg(2, 4096, "slot events(4096), bg: sync newest only", op_slot);
    with_bg(2, 1024, "slot events(1024), bg: sync newest only", op_slot);
    with_bg(2, 4096, "slot events(4096) + GetId, bg: sync newest only", op_slot_id);
    with_bg(2, 4096, "one shared event + GetId, bg: sync newest only", op_shared);
    with_bg(3, 4096, "slot events(4096) + malloc freed by bg, bg: sync newest", op_slot_malloc);
    for (int i = 0; i < 2000; i++)
      op_release();
    double rel = tb(op_release), r2 = tb(op_rec);
    printf("%-60s %7.1f ns  %5.2f x record (%.1f)\n", "dlsync_release (this tree)", rel, rel / r2,
           r2);
    CHECK(dlsync_release_flush(E.ctx) == 0, "flush");
  }
  return 0;
}
