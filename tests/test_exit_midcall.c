/* SPDX-License-Identifier: Apache-2.0 */
/* A thread inside an exchange end while the process exits: dlsync's unload
 * runs on the exiting thread while the other is still in the call, and that
 * call then finishes. At exit() the process's memory goes back to the
 * system anyway, so the unload keeps what a call in progress may still
 * touch (the exchange records, fence memory); it gives it back only at the
 * dlclose of a library that embeds libdlsync.a (tests/test_dlclose.c), when
 * no call of that copy can be in progress.
 *
 * The ending thread is held inside its end by the driver table this test
 * gives its context: a cuStreamIsCapturing that waits until this program's
 * own destructor, which runs after dlsync's (one with a priority runs after
 * those without), lets it go; the end then gives its exchange record back.
 * A record freed by the unload would be written after its free: the
 * sanitizer builds (ASan) report that and fail; the verdict here checks that
 * the end returned. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "order/internal.h"
#include "fake/fake_driver.h"

static dlsync_context *ctx;
static CUstream producer, consumer;
static dlsync__driver table; /* the fake's, with a StreamIsCapturing that can hold */
static atomic_int hold;      /* 1: the next status query waits for `release` */
static atomic_int held;      /* a query is waiting */
static atomic_int release_it;
static atomic_int ended = -1;

static void nap(void) {
  struct timespec ts = {0, 1000 * 1000};
  nanosleep(&ts, NULL);
}

/* The end's first driver call waits here when `hold` is set. */
static void maybe_hold(void) {
  if (atomic_exchange(&hold, 0) == 1) {
    atomic_store(&held, 1);
    for (int i = 0; i < 10000 && atomic_load(&release_it) == 0; i++)
      nap();
  }
}

static CUresult held_is_capturing(CUstream s, CUstreamCaptureStatus *st) {
  maybe_hold();
  return fake_driver()->StreamIsCapturing(s, st);
}

static CUresult held_capture_info(CUstream s, CUstreamCaptureStatus *st, cuuint64_t *id, CUgraph *g,
                                  const CUgraphNode **deps, const CUgraphEdgeData **edges,
                                  size_t *n) {
  maybe_hold();
  return fake_driver()->StreamGetCaptureInfo(s, st, id, g, deps, edges, n);
}

static void *ender(void *p) {
  dlsync_exchange *ex = p;
  atomic_store(&hold, 1);
  atomic_store(&ended, (int)dlsync_exchange_end(ex));
  return NULL;
}

static atomic_int set_up; /* main got as far as exit(0) */

/* After dlsync's unload: the held end goes on; the verdict. */
__attribute__((destructor(101))) static void judge(void) {
  if (!atomic_load(&set_up))
    return; /* main failed first: its exit status stands */
  atomic_store(&release_it, 1);
  for (int i = 0; i < 10000 && atomic_load(&ended) < 0; i++)
    nap();
  if (atomic_load(&ended) < 0) {
    fprintf(stderr, "the end held during exit did not return\n");
    _exit(1);
  }
  printf("an end in progress during exit returned %s after the unload\n",
         dlsync_status_name((dlsync_status)atomic_load(&ended)));
  fflush(stdout);
  _exit(0);
}

int main(void) {
  dlsync_exchange *ex = NULL;
  dlsync_lane p, c;
  pthread_t th;
  fake_reset(1);
  memcpy(&table, fake_driver(), sizeof table);
  table.StreamIsCapturing = held_is_capturing;
  table.StreamGetCaptureInfo = held_capture_info;
  if (dlsync__context_create_with_driver(&ctx, NULL, &table) != DLSYNC_SUCCESS)
    return 1;
  producer = fake_stream_create(0, CU_STREAM_NON_BLOCKING);
  consumer = fake_stream_create(0, CU_STREAM_NON_BLOCKING);
  p = dlsync_lane_stream(producer);
  c = dlsync_lane_stream(consumer);
  if (dlsync_exchange_begin(&ex, ctx, &p, &c) != DLSYNC_SUCCESS)
    return 1;
  if (pthread_create(&th, NULL, ender, ex) != 0)
    return 1;
  for (int i = 0; i < 10000 && atomic_load(&held) == 0; i++)
    nap();
  if (atomic_load(&held) == 0) {
    fprintf(stderr, "the end never reached its status query\n");
    return 1;
  }
  (void)pthread_detach(th);
  atomic_store(&set_up, 1);
  exit(0); /* dlsync's unload runs now, the end still in progress */
}
