/* SPDX-License-Identifier: Apache-2.0 */
/* A shared library that embeds libdlsync.a (tests/embed/embed_cycle.c) is
 * loaded and unloaded 100 times: half the times with its releases still
 * running (a deleter in progress, more queued), half with its reclaimer
 * idle. No thread of it may be left (each unload joins them), nothing may
 * run its code once it is unmapped (no crash), and every release it made
 * runs, its context destroyed by the last one. Each load also uses the
 * library's process-lifetime pools (exchange records, fence memory): the
 * unload gives them back, so the heap does not grow from cycle to cycle
 * (measured with mallinfo2 where malloc is glibc's; under a sanitizer, whose
 * allocator mallinfo2 does not see, the leak check at exit says it). */
#define _GNU_SOURCE
#include <dirent.h>
#include <dlfcn.h>
#include <malloc.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

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

/* The count once it settles (a joined thread's task may linger in /proc a
 * moment after pthread_join returns): the first equal to want, within 2 s. */
static int threads_settled(int want) {
  int n = threads_now();
  struct timespec ts = {0, 1000 * 1000};
  for (int i = 0; i < 2000 && n != want; i++) {
    nanosleep(&ts, NULL);
    n = threads_now();
  }
  return n;
}

/* Bytes malloc has handed out and not had back (mmapped blocks too). */
static size_t heap_in_use(void) {
#if defined(__GLIBC__) && (__GLIBC__ > 2 || __GLIBC_MINOR__ >= 33)
  struct mallinfo2 mi = mallinfo2();
  return mi.uordblks + mi.hblkhd;
#else
  return 0;
#endif
}

/* Growth allowed per cycle: none is expected; a little for the loader's
 * own bookkeeping and the allocator's rounding. */
#define GROWTH_PER_CYCLE 2048

int main(int argc, char **argv) {
  int first, baseline = -1, cycles = 101;
  size_t heap_before = 0;
  if (argc < 2) {
    fprintf(stderr, "usage: %s path/to/libembed_cycle.so\n", argv[0]);
    return 2;
  }
  first = threads_now();
  if (first < 0) {
    printf("no /proc/self/task: skipped\n");
    return 77;
  }
  for (int i = 0; i < cycles; i++) {
    bool in_flight = i % 2 == 1;
    int (*start)(int), (*wait_all)(void), st, now;
    void *h = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    if (h == NULL) {
      fprintf(stderr, "cycle %d: dlopen: %s\n", i, dlerror());
      return 1;
    }
    *(void **)&start = dlsym(h, "embed_cycle_start");
    *(void **)&wait_all = dlsym(h, "embed_cycle_wait");
    if (start == NULL || wait_all == NULL) {
      fprintf(stderr, "cycle %d: dlsym: %s\n", i, dlerror());
      return 1;
    }
    st = start(8);
    if (st == 77) {
      printf("no GPU: skipped\n");
      return 77;
    }
    if (st != 0) {
      fprintf(stderr, "cycle %d: embed_cycle_start failed (%d)\n", i, st);
      return 1;
    }
    if (!in_flight && wait_all() < 0) {
      fprintf(stderr, "cycle %d: the releases did not run within 5 s\n", i);
      return 1;
    }
    if (dlclose(h) != 0) {
      fprintf(stderr, "cycle %d: dlclose: %s\n", i, dlerror());
      return 1;
    }
    /* The first cycle is idle and sets the baseline: a sanitizer's own
     * thread starts with the first thread the process makes. */
    if (i == 0)
      baseline = threads_settled(first);
    now = threads_settled(baseline);
    if (now != baseline) {
      fprintf(stderr, "cycle %d (%s): %d thread(s) after dlclose, %d before the first load\n", i,
              in_flight ? "releases in flight" : "idle", now, baseline);
      return 1;
    }
    /* Still mapped? (RTLD_NOLOAD finds it only if it is.) */
    h = dlopen(argv[1], RTLD_NOW | RTLD_NOLOAD);
    if (h != NULL) {
      fprintf(stderr, "cycle %d: the library is still loaded after dlclose\n", i);
      return 1;
    }
    /* From the third cycle on: the first two load what the process keeps
     * for good (the loader's and libc's own state). */
    if (i == 1)
      heap_before = heap_in_use();
  }
  if (heap_in_use() > heap_before + (size_t)GROWTH_PER_CYCLE * (cycles - 2)) {
    fprintf(stderr, "the heap grew by %zu bytes over %d loads and unloads (%zu a cycle)\n",
            heap_in_use() - heap_before, cycles - 2,
            (heap_in_use() - heap_before) / (size_t)(cycles - 2));
    return 1;
  }
  printf("%d loads and unloads (half with releases in flight): no thread left, no crash, "
         "the heap not grown\n",
         cycles);
  return 0;
}
