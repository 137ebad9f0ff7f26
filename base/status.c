/* SPDX-License-Identifier: Apache-2.0 */
/* Status names and the per-thread last error (the bottom of the library:
 * it uses nothing of dlsync). */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "base/base.h"

#define DLSYNC__MESSAGE_MAX 512

typedef struct dlsync__last_error {
  dlsync_status status;
  int driver_result;
  char message[DLSYNC__MESSAGE_MAX];
  bool nothing_queued; /* dlsync__fail_nothing_queued */
} dlsync__last_error;

static _Thread_local dlsync__last_error last_error;

const char *dlsync_status_name(dlsync_status status) {
  switch (status) {
#define DLSYNC__NAME_CASE(name, value, text) \
  case DLSYNC_##name:                        \
    return "DLSYNC_" #name;
    DLSYNC_STATUS_LIST(DLSYNC__NAME_CASE)
#undef DLSYNC__NAME_CASE
  default:
    return "DLSYNC_STATUS_UNKNOWN";
  }
}

const char *dlsync_status_string(dlsync_status status) {
  switch (status) {
#define DLSYNC__TEXT_CASE(name, value, text) \
  case DLSYNC_##name:                        \
    return text;
    DLSYNC_STATUS_LIST(DLSYNC__TEXT_CASE)
#undef DLSYNC__TEXT_CASE
  default:
    return "unknown dlsync status";
  }
}

dlsync_status dlsync_last_status(void) {
  return last_error.status;
}

const char *dlsync_last_error(void) {
  return last_error.message;
}

int dlsync_last_driver_result(void) {
  return last_error.driver_result;
}

static void set_message(dlsync_status status, int driver_result, const char *prefix,
                        const char *fmt, va_list ap) DLSYNC__PRINTF(4, 0);
static void set_message(dlsync_status status, int driver_result, const char *prefix,
                        const char *fmt, va_list ap) {
  size_t used = 0;
  last_error.status = status;
  last_error.driver_result = driver_result;
  last_error.nothing_queued = false;
  last_error.message[0] = '\0';
  if (prefix != NULL) {
    int n = snprintf(last_error.message, sizeof last_error.message, "%s", prefix);
    used = n < 0 ? 0 : (size_t)n;
    if (used >= sizeof last_error.message)
      return;
  }
  if (fmt != NULL && fmt[0] != '\0')
    vsnprintf(last_error.message + used, sizeof last_error.message - used, fmt, ap);
}

/* Each error is an INFO line of the decision log. */
static void log_error(void) {
  DLSYNC__LOG(DLSYNC__LOG_INFO, "error %s: %s", dlsync_status_name(last_error.status),
              last_error.message);
}

dlsync_status dlsync__fail(dlsync_status status, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  set_message(status, 0, NULL, fmt, ap);
  va_end(ap);
  log_error();
  return status;
}

dlsync_status dlsync__fail_with(const dlsync__fail_site *site, const char *fmt, va_list ap) {
  set_message(site->status, site->driver_result, site->prefix, fmt, ap);
  if (site->suffix != NULL) {
    size_t len = strlen(last_error.message);
    snprintf(last_error.message + len, sizeof last_error.message - len, "%s", site->suffix);
  }
  log_error();
  return site->status;
}

dlsync_status dlsync__fail_result(dlsync_status status, int driver_result, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  set_message(status, driver_result, NULL, fmt, ap);
  va_end(ap);
  log_error();
  return status;
}

void dlsync__fail_nothing_queued(void) {
  last_error.nothing_queued = true;
}

bool dlsync__last_error_nothing_queued(void) {
  return last_error.nothing_queued;
}

void dlsync__last_error_append(const char *text) {
  size_t len = strlen(last_error.message);
  snprintf(last_error.message + len, sizeof last_error.message - len, "%s", text);
}
