/* SPDX-License-Identifier: Apache-2.0 */
/* Where a release's cost on the releasing thread goes: the driver calls a
 * release must make (the capture query, the stream's id, the record) and
 * the releasing side of several queue designs, each with a background
 * thread doing what that design's reclaimer does (consuming a
 * single-producer ring: synchronising the newest event, querying each
 * earlier one, freeing the producer's allocations, giving events back to a
 * locked pool), against one cuEventRecord of the same event, host ns per
 * operation (medians of 9 batches of 5000), twice; then dlsync_release
 * itself, with how many of its releases found the ring full. Also a design
 * without events: a stream memory write (cuStreamWriteValue32) of a word of
 * pinned host memory per release, which the background thread reads, and
 * first the rule it would rest on (the word is written after the stream's
 * earlier work is done). No target: it explains bench_release's figure
 * (docs/performance.md). */
#include <dlfcn.h>
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
static int mode; /* bg: 1 sync newest + query earlier; 2 sync newest; 3 free items too;
                    4 give events back to a locked pool */
static atomic_ulong consumed;
/* mode 4's pool: a locked LIFO stack of events */
static atomic_int pool_lock;
static CUevent pool_ev[RING + 64];
static unsigned pool_n;

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

/* The ring's head and tail for the background thread; false (after a nap)
 * when it is empty. */
static bool ring_taken(unsigned *h, unsigned *t) {
  *h = atomic_load_explicit(&head, memory_order_acquire);
  *t = atomic_load_explicit(&tail, memory_order_relaxed);
  if (*h != *t)
    return true;
  usleep(50);
  return false;
}

static void *bg(void *a) {
  (void)a;
  CHECK(D->CtxPushCurrent(E.cuctx) == CUDA_SUCCESS, "push");
  CUstreamCaptureMode m = CU_STREAM_CAPTURE_MODE_RELAXED;
  while (!atomic_load(&stopq)) {
    unsigned h, t;
    if (!ring_taken(&h, &t))
      continue;
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
    if (mode == 4) {
      dlsync__spin_lock(&pool_lock);
      for (unsigned i = t; i != h; i++)
        pool_ev[pool_n++] = ring[i & (ring_n - 1)].event;
      dlsync__spin_unlock(&pool_lock);
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
static void drain(void) {
  while (atomic_load(&tail) != atomic_load(&head))
    usleep(100);
}

/* Stream memory writes: the release writes a per-slot word of pinned host
 * memory in stream order; the background thread reads the words (no driver
 * call, no event). */
typedef CUresult (*wv32_fn)(CUstream, CUdeviceptr, cuuint32_t, unsigned);
typedef CUresult (*hostalloc_fn)(void **, size_t, unsigned);
typedef CUresult (*hostdp_fn)(CUdeviceptr *, void *, unsigned);
typedef CUresult (*attr_fn)(int *, CUdevice_attribute, CUdevice);
static wv32_fn WV32;
static volatile unsigned *flags; /* RING words, one cache line apart: 16 words each */
static CUdeviceptr flags_dev;
static unsigned seq;
static void op_wv(void) {
  CHECK(WV32(P, flags_dev, ++seq, 0) == CUDA_SUCCESS, "wv");
}
static CUresult wv_nb_result;
static void op_wv_nb(void) {
  CUresult r = WV32(P, flags_dev, ++seq, CU_STREAM_WRITE_VALUE_NO_MEMORY_BARRIER);
  if (r != CUDA_SUCCESS)
    wv_nb_result = r;
}
static void op_cap_wv(void) {
  CUstreamCaptureStatus s;
  CHECK(D->StreamIsCapturing(P, &s) == CUDA_SUCCESS, "cap");
  CHECK(WV32(P, flags_dev, ++seq, 0) == CUDA_SUCCESS, "wv");
}
static void op_slot_flag(void) {
  CUstreamCaptureStatus s;
  CHECK(D->StreamIsCapturing(P, &s) == CUDA_SUCCESS, "cap");
  unsigned h = atomic_load_explicit(&head, memory_order_relaxed);
  (void)ring_next();
  unsigned i = h & (ring_n - 1);
  CHECK(WV32(P, flags_dev + (CUdeviceptr)i * 64, h + 1, 0) == CUDA_SUCCESS, "wv");
  ring_publish();
}
static void *bg_flags(void *a) {
  (void)a;
  while (!atomic_load(&stopq)) {
    unsigned h, t;
    if (!ring_taken(&h, &t))
      continue;
    unsigned done = t;
    while (done != h && flags[(done & (ring_n - 1)) * 16] == done + 1)
      done++;
    if (done != t) {
      atomic_fetch_add_explicit(&consumed, done - t, memory_order_relaxed);
      atomic_store_explicit(&tail, done, memory_order_release);
    }
    usleep(50);
  }
  return NULL;
}
/* Runs `thread` beside the ring's producer: fn warmed up, then timed, then
 * one record timed; the ring drained and the thread stopped. */
static void time_beside(void *(*thread)(void *), op_fn fn, double *a, double *b) {
  pthread_t t;
  atomic_store(&stopq, false);
  CHECK(pthread_create(&t, NULL, thread, NULL) == 0, "thr");
  for (int i = 0; i < 2000; i++)
    fn();
  *a = tb(fn);
  *b = tb(op_rec);
  drain();
  atomic_store(&stopq, true);
  pthread_join(t, NULL);
}

static void with_flags(const char *name, op_fn fn) {
  double a, b;
  ring_n = RING;
  atomic_store(&head, 0);
  atomic_store(&tail, 0);
  tail_cache = 0;
  for (unsigned i = 0; i < RING; i++)
    flags[i * 16] = 0;
  time_beside(bg_flags, fn, &a, &b);
  printf("%-60s %7.1f ns  %5.2f x record (%.1f)\n", name, a, a / b, b);
}

/* The rule a flag design needs: a word written by cuStreamWriteValue32 is
 * written after the stream's earlier work is done. Slow memsets ahead, an
 * event recorded between them and the write; once the host reads the word,
 * the event must be complete. Checked that the word was not yet written
 * right after the calls (else the check could not fail). */
static void write_order_check(CUdeviceptr buf, size_t words) {
  int early = 0, bad = 0;
  CUevent before;
  CHECK(D->EventCreate(&before, CU_EVENT_DISABLE_TIMING) == 0, "e");
  for (int round = 0; round < 20; round++) {
    flags[0] = 0;
    for (int k = 0; k < 4; k++)
      CHECK(D->MemsetD32Async(buf, (unsigned)k, words, P) == 0, "memset");
    CHECK(D->EventRecord(before, P) == 0, "rec");
    CHECK(WV32(P, flags_dev, 7u + (unsigned)round, 0) == 0, "wv");
    if (flags[0] != 7u + (unsigned)round)
      early++;
    while (flags[0] != 7u + (unsigned)round)
      ;
    if (D->EventQuery(before) != CUDA_SUCCESS)
      bad++;
  }
  printf("write order: %d of 20 rounds pending after the calls (the check can fail), %d rounds "
         "read the word before the earlier work was done (rule: 0)\n",
         early, bad);
  CHECK(D->EventSynchronize(before) == 0, "sync");
  (void)D->EventDestroy(before);
}

/* Events from a locked LIFO stack that the background thread refills. */
static void op_slot_pool(void) {
  CUstreamCaptureStatus s;
  CHECK(D->StreamIsCapturing(P, &s) == CUDA_SUCCESS, "cap");
  slot *sl = ring_next();
  CHECK(D->StreamGetId(P, &sl->sid) == CUDA_SUCCESS, "id");
  dlsync__spin_lock(&pool_lock);
  CHECK(pool_n > 0, "pool empty");
  sl->event = pool_ev[--pool_n];
  dlsync__spin_unlock(&pool_lock);
  CHECK(D->EventRecord(sl->event, P) == CUDA_SUCCESS, "rec");
  ring_publish();
}

static void noop(void *a) {
  (void)a;
}
static void op_release(void) {
  CHECK(dlsync_release(E.ctx, &lane_p, noop, NULL) == 0, "rel");
}

static void with_bg(int m, unsigned n, const char *name, op_fn fn) {
  double a, b;
  mode = m;
  ring_n = n;
  atomic_store(&head, 0);
  atomic_store(&tail, 0);
  tail_cache = 0;
  atomic_store(&stopq, false);
  if (m == 4) {
    for (unsigned i = 0; i < RING; i++) {
      pool_ev[i] = ring[i].event;
      ring[i].event = NULL;
    }
    pool_n = RING;
  }
  time_beside(bg, fn, &a, &b);
  if (m == 4) {
    /* the slots name events of the pool: give each slot one back */
    for (unsigned i = 0; i < RING; i++)
      ring[i].event = NULL;
    for (unsigned i = 0; i < pool_n && i < RING; i++)
      ring[i].event = pool_ev[i];
    pool_n = 0;
  }
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
  {
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    hostalloc_fn ha = lib ? (hostalloc_fn)dlsym(lib, "cuMemHostAlloc") : NULL;
    hostdp_fn hd = lib ? (hostdp_fn)dlsym(lib, "cuMemHostGetDevicePointer_v2") : NULL;
    attr_fn at = lib ? (attr_fn)dlsym(lib, "cuDeviceGetAttribute") : NULL;
    int memops = -1;
    void *h = NULL;
    CUdeviceptr big;
    size_t words = (size_t)64 << 20;
    WV32 = lib ? (wv32_fn)dlsym(lib, "cuStreamWriteValue32_v2") : NULL;
    CHECK(WV32 && ha && hd && at, "memop symbols");
    (void)at(&memops, CU_DEVICE_ATTRIBUTE_CAN_USE_STREAM_MEM_OPS_V1, E.dev);
    printf("CAN_USE_STREAM_MEM_OPS_V1 %d\n", memops);
    CHECK(ha(&h, RING * 64, CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP) == 0,
          "hostalloc");
    CHECK(hd(&flags_dev, h, 0) == 0, "devptr");
    printf("pinned host %p device %p\n", h, (void *)flags_dev);
    flags = h;
    memset(h, 0, RING * 64);
    CHECK(D->MemAlloc(&big, words * 4) == 0, "alloc");
    write_order_check(big, words);
    (void)D->MemFree(big);
  }
  for (int rep = 0; rep < 2; rep++) {
    printf("-- rep %d on %s\n", rep, E.name);
    double r = tb(op_rec);
    printf("%-60s %7.1f ns\n", "record same event (R)", r);
    printf("%-60s %7.1f ns  %5.2f x R\n", "IsCapturing + record same", tb(op_cap_rec),
           tb(op_cap_rec) / r);
    printf("%-60s %7.1f ns  %5.2f x R\n", "IsCapturing + GetId + record same", tb(op_cap_id_rec),
           tb(op_cap_id_rec) / r);
    printf("%-60s %7.1f ns  %5.2f x R\n", "WriteValue32 pinned", tb(op_wv), tb(op_wv) / r);
    printf("%-60s %7.1f ns  %5.2f x R (result %d)\n", "WriteValue32 pinned, no barrier",
           tb(op_wv_nb), tb(op_wv_nb) / r, (int)wv_nb_result);
    printf("%-60s %7.1f ns  %5.2f x R\n", "IsCapturing + WriteValue32", tb(op_cap_wv),
           tb(op_cap_wv) / r);
    with_flags("slot flags(4096): IsCapturing + WriteValue32, bg reads words", op_slot_flag);
    with_bg(1, 4096, "slot events(4096), bg: sync newest + query each earlier", op_slot);
    with_bg(1, 1024, "slot events(1024), bg: sync newest + query each earlier", op_slot);
    with_bg(2, 4096, "slot events(4096), bg: sync newest only", op_slot);
    with_bg(2, 1024, "slot events(1024), bg: sync newest only", op_slot);
    with_bg(2, 4096, "slot events(4096) + GetId, bg: sync newest only", op_slot_id);
    with_bg(2, 4096, "one shared event + GetId, bg: sync newest only", op_shared);
    with_bg(3, 4096, "slot events(4096) + malloc freed by bg, bg: sync newest", op_slot_malloc);
    with_bg(4, 4096, "slot GetId, events of a locked pool bg gives back, sync newest",
            op_slot_pool);
    for (int i = 0; i < 2000; i++)
      op_release();
    size_t o0 = atomic_load(&dlsync__release_overflowed);
    double rel = tb(op_release), r2 = tb(op_rec);
    size_t o1 = atomic_load(&dlsync__release_overflowed);
    printf("%-60s %7.1f ns  %5.2f x record (%.1f), %zu of %d to the overflow\n",
           "dlsync_release (this tree)", rel, rel / r2, r2, o1 - o0, 9 * OPS);
    CHECK(dlsync_release_flush(E.ctx) == 0, "flush");
  }
  return 0;
}
