/* SPDX-License-Identifier: Apache-2.0 */
/* The run-time hwloc loader (driver/hwloc.c): what it reports matches what
 * the loader can open, bad bus ids are refused, and threads may bind at once
 * (topology loads are serialised; ThreadSanitizer runs this test). */
#include <dirent.h>
#include <dlfcn.h>
#include <pthread.h>
#include <sched.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "driver/hwloc.h"

static void status_matches_what_the_loader_finds(void **state) {
  const char *what = NULL;
  void *h = dlopen(DLSYNC__HWLOC_SONAME, RTLD_LAZY | RTLD_LOCAL);
  bool ok = dlsync__hwloc_status(&what);
  (void)state;
  assert_non_null(what);
  if (ok) {
    assert_non_null(h); /* usable means it was found */
    assert_non_null(strstr(what, "libhwloc"));
  } else {
    assert_non_null(strstr(what, "not bound"));
#if defined(DLSYNC_TEST_HWLOC_HEADERS)
    /* Built with the headers: where the library loads it must be usable. */
    assert_null(h);
#endif
  }
  /* Asked again: the same answer, the same string. */
  {
    const char *again = NULL;
    assert_int_equal(dlsync__hwloc_status(&again), ok);
    assert_ptr_equal(again, what);
  }
  if (h != NULL)
    dlclose(h);
}

static void bad_bus_ids_are_refused(void **state) {
  cpu_set_t before, after;
  (void)state;
  assert_int_equal(sched_getaffinity(0, sizeof before, &before), 0);
  assert_false(dlsync__hwloc_bind_near(""));
  assert_false(dlsync__hwloc_bind_near("not a bus id"));
  assert_false(dlsync__hwloc_bind_near("ffff:ff:1f.7")); /* well formed, no such device */
  assert_int_equal(sched_getaffinity(0, sizeof after, &after), 0);
  assert_true(CPU_EQUAL(&before, &after));
}

/* A device hwloc keeps (storage, network, display: what KEEP_IMPORTANT
 * keeps of PCI), found in sysfs: binding near it must succeed and leave the
 * thread on at least one CPU. Skipped without hwloc or such a device. */
static void binds_near_a_real_device(void **state) {
  const char *what;
  char found[256] = "", path[512];
  unsigned cls = 0;
  cpu_set_t before, after;
  DIR *d;
  struct dirent *e;
  (void)state;
  if (!dlsync__hwloc_status(&what))
    skip();
  d = opendir("/sys/bus/pci/devices");
  if (d == NULL)
    skip();
  while (found[0] == '\0' && (e = readdir(d)) != NULL) {
    FILE *f;
    if (e->d_name[0] == '.')
      continue;
    snprintf(path, sizeof path, "/sys/bus/pci/devices/%.256s/class", e->d_name);
    f = fopen(path, "r");
    if (f == NULL)
      continue;
    if (fscanf(f, "%x", &cls) == 1 && (cls >> 16 == 0x01 || cls >> 16 == 0x02 || cls >> 16 == 0x03))
      snprintf(found, sizeof found, "%.255s", e->d_name);
    fclose(f);
  }
  closedir(d);
  if (found[0] == '\0')
    skip();
  assert_int_equal(sched_getaffinity(0, sizeof before, &before), 0);
  assert_true(dlsync__hwloc_bind_near(found));
  assert_int_equal(sched_getaffinity(0, sizeof after, &after), 0);
  assert_true(CPU_COUNT(&after) > 0);
  assert_int_equal(sched_setaffinity(0, sizeof before, &before), 0);
}

static void *bind_some(void *arg) {
  (void)arg;
  for (int i = 0; i < 3; i++)
    (void)dlsync__hwloc_bind_near("0000:00:00.0");
  return NULL;
}

static void threads_bind_at_once(void **state) {
  pthread_t t[4];
  (void)state;
  for (int i = 0; i < 4; i++)
    assert_int_equal(pthread_create(&t[i], NULL, bind_some, NULL), 0);
  for (int i = 0; i < 4; i++)
    assert_int_equal(pthread_join(t[i], NULL), 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(status_matches_what_the_loader_finds),
      cmocka_unit_test(bad_bus_ids_are_refused),
      cmocka_unit_test(binds_near_a_real_device),
      cmocka_unit_test(threads_bind_at_once),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
