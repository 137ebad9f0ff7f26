/* SPDX-License-Identifier: Apache-2.0 */
/* The decision log, in the manner of NCCL_DEBUG.
 *
 *   DLSYNC_DEBUG=WARN|INFO|TRACE   what to write (unset or anything else: off)
 *   DLSYNC_DEBUG_FILE=path         where (%p: the process id); default stderr
 *
 * Read once, on the first question (pthread_once). A line is formatted on the
 * stack and written with one write(2): thread-safe, no lock, no allocation,
 * and no driver call, so it is safe during a capture in any mode. Off costs
 * one predictable branch on a static level (dlsync__log_on). */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "base/base.h"

atomic_int dlsync__log_level_ = -1;

static pthread_once_t log_once = PTHREAD_ONCE_INIT;
static int log_fd = 2;
static char log_host[64];

static const char *level_name(int level) {
  switch (level) {
  case DLSYNC__LOG_WARN:
    return "WARN";
  case DLSYNC__LOG_INFO:
    return "INFO";
  default:
    return "TRACE";
  }
}

/* path with each %p replaced by the pid; false when it does not fit. */
static bool expand_path(char *out, size_t size, const char *path) {
  size_t used = 0;
  for (const char *c = path; *c != '\0'; c++) {
    int n;
    if (c[0] == '%' && c[1] == 'p') {
      n = snprintf(out + used, size - used, "%ld", (long)getpid());
      c++;
    } else {
      n = snprintf(out + used, size - used, "%c", *c);
    }
    if (n < 0 || (size_t)n >= size - used)
      return false;
    used += (size_t)n;
  }
  return true;
}

static void log_init(void) {
  const char *level = getenv("DLSYNC_DEBUG");
  const char *file = getenv("DLSYNC_DEBUG_FILE");
  int l = DLSYNC__LOG_OFF;
  if (level != NULL) {
    if (strcasecmp(level, "WARN") == 0)
      l = DLSYNC__LOG_WARN;
    else if (strcasecmp(level, "INFO") == 0)
      l = DLSYNC__LOG_INFO;
    else if (strcasecmp(level, "TRACE") == 0)
      l = DLSYNC__LOG_TRACE;
    else if (level[0] != '\0')
      fprintf(stderr, "dlsync: DLSYNC_DEBUG=%s is not one of WARN, INFO, TRACE: log off\n", level);
  }
  if (gethostname(log_host, sizeof log_host) != 0)
    snprintf(log_host, sizeof log_host, "?");
  log_host[sizeof log_host - 1] = '\0';
  if (l != DLSYNC__LOG_OFF && file != NULL && file[0] != '\0') {
    char path[4096];
    int fd = -1;
    if (expand_path(path, sizeof path, file))
      fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (fd >= 0)
      log_fd = fd;
    else
      fprintf(stderr, "dlsync: DLSYNC_DEBUG_FILE=%s cannot be opened (%s): logging to stderr\n",
              file, strerror(errno));
  }
  atomic_store_explicit(&dlsync__log_level_, l, memory_order_release);
}

bool dlsync__log_on_slow(int level) {
  pthread_once(&log_once, log_init);
  return atomic_load_explicit(&dlsync__log_level_, memory_order_acquire) >= level;
}

void dlsync__log(int level, const char *fmt, ...) {
  char line[1024];
  int n;
  size_t used;
  va_list ap;
  if (!dlsync__log_on_slow(level))
    return;
  n = snprintf(line, sizeof line, "%s:%ld:%ld dlsync %s ", log_host, (long)getpid(),
               (long)syscall(SYS_gettid), level_name(level));
  used = n < 0 ? 0 : (size_t)n;
  if (used < sizeof line) {
    va_start(ap, fmt);
    n = vsnprintf(line + used, sizeof line - used, fmt, ap);
    va_end(ap);
    used += n < 0 ? 0 : (size_t)n;
  }
  if (used > sizeof line - 2)
    used = sizeof line - 2; /* truncated */
  line[used++] = '\n';
  /* One write per line: lines of concurrent threads do not interleave. */
  while (used > 0) {
    ssize_t w = write(log_fd, line, used);
    if (w < 0 && errno == EINTR)
      continue;
    break;
  }
}
