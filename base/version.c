/* SPDX-License-Identifier: Apache-2.0 */
/* The library's version (include/dlsync/version.h). */
#include "base/base.h"
#include "dlsync/version.h"

unsigned dlsync_version(void) {
  return DLSYNC_VERSION;
}

const char *dlsync_version_string(void) {
  return DLSYNC_VERSION_STRING;
}
