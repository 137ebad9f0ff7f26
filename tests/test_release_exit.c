/* SPDX-License-Identifier: Apache-2.0 */
/* A release made while another thread is in exit(), once the unload has
 * joined the reclaimers: refused with DLSYNC_ERROR_UNLOADING and a message
 * saying so (not DLSYNC_ERROR_INTERNAL, which says dlsync has a bug), its
 * deleter not run.
 *
 * The main thread calls exit(); an atexit handler tells the releasing thread,
 * which waits until the reclaimer's thread is gone (the unload joined it),
 * then releases once and records what it got. A destructor of this program
 * that runs after dlsync's (one with a priority runs after those without)
 * judges it and ends the process with the verdict. */
#include <dirent.h>
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
static CUstream stream;
static atomic_bool exiting;
static atomic_int got = -1;
static atomic_int deleters;
static char message[512];

static void deleter(void *arg) {
  (void)arg;
  atomic_fetch_add(&deleters, 1);
}

static int threads_now(void) {
  int n = 0;
  DIR *d = opendir("/proc/self/task");
  struct dirent *e;
  if (d == NULL)
    return -1;
  while ((e = readdir(d)) != NULL)
    n += e->d_name[0] != '.';
  closedir(d);
  return n;
}

static void nap(void) {
  struct timespec ts = {0, 1000 * 1000};
  nanosleep(&ts, NULL);
}

static void *releaser(void *p) {
  dlsync_lane lane = dlsync_lane_stream(stream);
  int with_reclaimer;
  dlsync_status st;
  while (!atomic_load(&exiting))
    nap();
  with_reclaimer = *(const int *)p; /* written before exit() was called */
  /* The reclaimer joined: one thread fewer (within 5 s). */
  for (int i = 0; i < 5000 && threads_now() >= with_reclaimer; i++)
    nap();
  st = dlsync_release(ctx, &lane, deleter, NULL);
  snprintf(message, sizeof message, "%s", dlsync_last_error());
  atomic_store(&got, (int)st);
  return NULL;
}

static void at_exit(void) {
  atomic_store(&exiting, true);
}

/* After dlsync's unload: the verdict. */
__attribute__((destructor(101))) static void judge(void) {
  int st;
  for (int i = 0; i < 10000 && atomic_load(&got) < 0; i++)
    nap();
  st = atomic_load(&got);
  if (st < 0) {
    fprintf(stderr, "the release made during exit did not return\n");
    _exit(1);
  }
  if (st != DLSYNC_ERROR_UNLOADING || strstr(message, "unloaded") == NULL) {
    fprintf(stderr, "a release during exit returned %s: %s\n",
            dlsync_status_name((dlsync_status)st), message);
    _exit(1);
  }
  if (atomic_load(&deleters) != 1) {
    fprintf(stderr, "%d deleters ran, want 1 (the release before exit)\n", atomic_load(&deleters));
    _exit(1);
  }
  printf("a release during exit: %s (%s)\n", dlsync_status_name((dlsync_status)st), message);
  fflush(stdout);
  _exit(0);
}

int main(void) {
  dlsync_lane lane;
  pthread_t th;
  static int with_reclaimer;
  fake_reset(1);
  if (threads_now() < 0) {
    printf("no /proc/self/task: skipped\n");
    return 77;
  }
  if (dlsync__context_create_with_driver(&ctx, NULL, fake_driver()) != DLSYNC_SUCCESS)
    return 1;
  stream = fake_stream_create(0, CU_STREAM_NON_BLOCKING);
  lane = dlsync_lane_stream(stream);
  /* One release, so that the reclaimer runs; flushed. */
  if (dlsync_release(ctx, &lane, deleter, NULL) != DLSYNC_SUCCESS ||
      dlsync_release_flush(ctx) != DLSYNC_SUCCESS)
    return 1;
  if (atexit(at_exit) != 0 || pthread_create(&th, NULL, releaser, &with_reclaimer) != 0)
    return 1;
  with_reclaimer = threads_now(); /* main, the releaser, the reclaimer (and a sanitizer's) */
  (void)pthread_detach(th);
  exit(0);
}
