/* SPDX-License-Identifier: Apache-2.0 */
/* The log's levels and file name, one process per case (the environment is
 * read once):
 *   test_log version DIR   DLSYNC_DEBUG=VERSION: one line, dlsync's version
 *                          and the library file, in DIR/log.%h.%p (host name
 *                          and pid expanded); the missing driver is not
 *                          written (WARN is above VERSION).
 *   test_log warn DIR      DLSYNC_DEBUG=WARN: the version line first, then
 *                          the missing driver as one WARN line, however many
 *                          times it is found missing.
 * The driver is a path that does not exist: no driver on any machine. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dlsync/dlsync.h"

static int count(const char *text, const char *what) {
  int n = 0;
  for (const char *at = strstr(text, what); at != NULL; at = strstr(at + 1, what))
    n++;
  return n;
}

#define CHECK(cond, ...)                          \
  do {                                            \
    if (!(cond)) {                                \
      fprintf(stderr, "test_log: " __VA_ARGS__);  \
      fprintf(stderr, "\n-- the log:\n%s", text); \
      return 1;                                   \
    }                                             \
  } while (0)

int main(int argc, char **argv) {
  char pattern[4096], path[4096], host[256], text[16384], want[256];
  dlsync_context_config opts = DLSYNC_CONTEXT_CONFIG_INIT;
  dlsync_context *ctx = NULL;
  const char *mode;
  FILE *f;
  size_t n;
  int tries;
  if (argc != 3 || (strcmp(argv[1], "version") != 0 && strcmp(argv[1], "warn") != 0)) {
    fprintf(stderr, "usage: test_log version|warn DIR\n");
    return 2;
  }
  mode = argv[1];
  snprintf(pattern, sizeof pattern, "%s/log.%s.%%h.%%p", argv[2], mode);
  setenv("DLSYNC_DEBUG", strcmp(mode, "version") == 0 ? "VERSION" : "warn", 1);
  setenv("DLSYNC_DEBUG_FILE", pattern, 1);
  if (gethostname(host, sizeof host) != 0)
    snprintf(host, sizeof host, "?");
  host[sizeof host - 1] = '\0';
  snprintf(path, sizeof path, "%s/log.%s.%s.%ld", argv[2], mode, host, (long)getpid());
  unlink(path);

  opts.driver_path = "/nonexistent/dlsync-test/libcuda.so.1";
  text[0] = '\0';
  for (tries = 0; tries < 3; tries++) {
    dlsync_status st = dlsync_context_create(&ctx, &opts);
    CHECK(st == DLSYNC_ERROR_NO_DRIVER, "context on a missing driver: %s", dlsync_status_name(st));
  }

  f = fopen(path, "r");
  CHECK(f != NULL, "no log at %s (DLSYNC_DEBUG_FILE=%s: %%h, %%p not expanded?)", path, pattern);
  n = fread(text, 1, sizeof text - 1, f);
  text[n] = '\0';
  fclose(f);
  snprintf(want, sizeof want, " dlsync VERSION dlsync %s (", DLSYNC_VERSION_STRING);
  CHECK(count(text, want) == 1, "want one line with \"%s\"", want);
  CHECK(strstr(text, want) == strchr(text, ' '), "the version line is not the first");
  CHECK(count(text, "libdlsync") >= 1 || count(text, "test_log") >= 1,
        "the version line names no library file");
  if (strcmp(mode, "version") == 0) {
    CHECK(count(text, "\n") == 1, "DLSYNC_DEBUG=VERSION wrote more than the version line");
  } else {
    CHECK(count(text, " dlsync WARN no CUDA driver: ") == 1,
          "want one WARN line for the missing driver (3 attempts)");
    CHECK(count(text, "WARN no CUDA driver: dlopen(\"/nonexistent/dlsync-test/libcuda.so.1\")") ==
              1,
          "the WARN line does not name the driver path");
    CHECK(count(text, " dlsync INFO ") == 0, "INFO lines at WARN");
  }
  printf("test_log %s: ok (%s)\n", mode, path);
  return 0;
}
