/* SPDX-License-Identifier: Apache-2.0 */
/* The decision log, in the manner of NCCL_DEBUG.
 *
 *   DLSYNC_DEBUG=VERSION|WARN|INFO|TRACE  what to write (unset or anything
 *                                         else: off)
 *   DLSYNC_DEBUG_FILE=path   where (%p: the process id, %h: the host name,
 *                            %%: a %); default stderr
 *
 * At any level the first line is dlsync's version and the file libdlsync
 * was loaded from, written once when the log is first asked for (the first
 * context, the first error).
 *
 * Read once, on the first question (pthread_once). A line is formatted on the
 * stack and written with one write(2): thread-safe, no lock, no allocation,
 * and no driver call, so it is safe during a capture in any mode. Off costs
 * one predictable branch on a static level (dlsync__log_on). */
#include <dlfcn.h>
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
#include "dlsync/version.h"

atomic_int dlsync__log_level_ = -1;

static pthread_once_t log_once = PTHREAD_ONCE_INIT;
static int log_fd = 2;
static char log_host[64];

static const char *level_name(int level) {
  switch (level) {
  case DLSYNC__LOG_VERSION:
    return "VERSION";
  case DLSYNC__LOG_WARN:
    return "WARN";
  case DLSYNC__LOG_INFO:
    return "INFO";
  default:
    return "TRACE";
  }
}

/* path with each %p replaced by the pid, %h by the host name and %% by %;
 * false when it does not fit. */
static bool expand_path(char *out, size_t size, const char *path) {
  size_t used = 0;
  for (const char *c = path; *c != '\0'; c++) {
    int n;
    if (c[0] == '%' && c[1] == 'p') {
      n = snprintf(out + used, size - used, "%ld", (long)getpid());
      c++;
    } else if (c[0] == '%' && c[1] == 'h') {
      n = snprintf(out + used, size - used, "%s", log_host);
      c++;
    } else if (c[0] == '%' && c[1] == '%') {
      n = snprintf(out + used, size - used, "%%");
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

/* One line: the prefix, the message, a newline, one write(2). */
static void write_line(int level, const char *fmt, va_list ap) DLSYNC__PRINTF(2, 0);
static void write_line(int level, const char *fmt, va_list ap) {
  char line[1024];
  int n;
  size_t used;
  n = snprintf(line, sizeof line, "%s:%ld:%ld dlsync %s ", log_host, (long)getpid(),
               (long)syscall(SYS_gettid), level_name(level));
  used = n < 0 ? 0 : (size_t)n;
  if (used < sizeof line) {
    n = vsnprintf(line + used, sizeof line - used, fmt, ap);
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

static void write_linef(int level, const char *fmt, ...) DLSYNC__PRINTF(2, 3);
static void write_linef(int level, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  write_line(level, fmt, ap);
  va_end(ap);
}

static void log_init(void) {
  const char *level = getenv("DLSYNC_DEBUG");
  const char *file = getenv("DLSYNC_DEBUG_FILE");
  int l = DLSYNC__LOG_OFF;
  if (level != NULL) {
    if (strcasecmp(level, "VERSION") == 0)
      l = DLSYNC__LOG_VERSION;
    else if (strcasecmp(level, "WARN") == 0)
      l = DLSYNC__LOG_WARN;
    else if (strcasecmp(level, "INFO") == 0)
      l = DLSYNC__LOG_INFO;
    else if (strcasecmp(level, "TRACE") == 0)
      l = DLSYNC__LOG_TRACE;
    else if (level[0] != '\0')
      fprintf(stderr, "dlsync: DLSYNC_DEBUG=%s is not one of VERSION, WARN, INFO, TRACE: log off\n",
              level);
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
  if (l != DLSYNC__LOG_OFF) {
    /* The version line, once: before any other line (pthread_once). */
    Dl_info where;
    memset(&where, 0, sizeof where);
    if (dladdr(&log_host, &where) == 0 || where.dli_fname == NULL)
      where.dli_fname = "?";
    write_linef(DLSYNC__LOG_VERSION, "dlsync %s (%s), log level %s", DLSYNC_VERSION_STRING,
                where.dli_fname, level_name(l));
  }
  atomic_store_explicit(&dlsync__log_level_, l, memory_order_release);
}

bool dlsync__log_on_slow(int level) {
  pthread_once(&log_once, log_init);
  return atomic_load_explicit(&dlsync__log_level_, memory_order_acquire) >= level;
}

void dlsync__log(int level, const char *fmt, ...) {
  va_list ap;
  if (!dlsync__log_on_slow(level))
    return;
  va_start(ap, fmt);
  write_line(level, fmt, ap);
  va_end(ap);
}
