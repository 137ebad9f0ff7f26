/* SPDX-License-Identifier: Apache-2.0 */
/* A shared library that embeds libdlsync.a (and the fake driver), loaded and
 * unloaded again and again by tests/test_dlclose.c: each load makes a
 * context and eager releases whose deleters are slow, so that the library is
 * unloaded while its reclaimer runs them (or, with flush, while it is idle).
 * The last deleter destroys the context, from the reclaimer. Each load also
 * begins and ends an exchange and signals and waits for a fence, so that the
 * unload has the process-lifetime pools of those to give back. */
#include <stdatomic.h>
#include <time.h>

#include "order/internal.h"
#include "fake/fake_driver.h"

__attribute__((visibility("default"))) int embed_cycle_start(int nreleases);
__attribute__((visibility("default"))) int embed_cycle_wait(void);

static dlsync_context *ctx;
static CUstream stream;
static atomic_int left;
static atomic_int destroy_status;

static void slow_deleter(void *arg) {
  struct timespec ts = {0, 200 * 1000}; /* 0.2 ms: the unload finds one running */
  (void)arg;
  nanosleep(&ts, NULL);
  if (atomic_fetch_sub(&left, 1) == 1)
    atomic_store(&destroy_status, (int)dlsync_context_destroy(ctx));
}

/* 0, or where it failed (negative). */
int embed_cycle_start(int nreleases) {
  dlsync_lane lane;
  fake_reset(1);
  atomic_store(&destroy_status, -1);
  if (dlsync__context_create_with_driver(&ctx, NULL, fake_driver()) != DLSYNC_SUCCESS)
    return -1;
  stream = fake_stream_create(0, CU_STREAM_NON_BLOCKING);
  if (stream == NULL)
    return -2;
  lane = dlsync_lane_stream(stream);
  /* The process-lifetime pools: exchange records and fence memory. */
  {
    CUstream consumer = fake_stream_create(0, CU_STREAM_NON_BLOCKING);
    dlsync_lane then = dlsync_lane_stream(consumer);
    dlsync_exchange *ex = NULL;
    dlsync_fence *f = NULL;
    if (consumer == NULL)
      return -4;
    if (dlsync_exchange_begin(&ex, ctx, &lane, &then) != DLSYNC_SUCCESS ||
        dlsync_exchange_end(ex) != DLSYNC_SUCCESS)
      return -5;
    if (dlsync_fence_signal(&f, ctx, &lane) != DLSYNC_SUCCESS ||
        dlsync_fence_wait(f, &then) != DLSYNC_SUCCESS)
      return -6;
    dlsync_fence_release(f);
    fake_stream_destroy(consumer);
  }
  atomic_store(&left, nreleases);
  for (int i = 0; i < nreleases; i++)
    if (dlsync_release(ctx, &lane, slow_deleter, NULL) != DLSYNC_SUCCESS)
      return -3;
  return 0;
}

/* Waits (at most 5 s) until every deleter has run; the context's destroy
 * status, or -1. */
int embed_cycle_wait(void) {
  struct timespec ts = {0, 1000 * 1000};
  for (int i = 0; i < 5000 && atomic_load(&destroy_status) < 0; i++)
    nanosleep(&ts, NULL);
  return atomic_load(&destroy_status);
}

/* After dlsync's own destructors (a destructor with a priority runs after
 * those without): its reclaimer, which still uses the fake, is joined by then. */
__attribute__((destructor(101))) static void embed_cycle_unload(void) {
  if (atomic_load(&destroy_status) < 0)
    return; /* a deleter did not run: leave the fake to the leak report */
  fake_stream_destroy(stream);
  fake_shutdown();
}
