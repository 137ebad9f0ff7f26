/* SPDX-License-Identifier: Apache-2.0 */
/* dlsync: version. DLSYNC_VERSION is MAJOR*10000 + MINOR*100 + PATCH. */
#ifndef DLSYNC_VERSION_H
#define DLSYNC_VERSION_H

#include "dlsync/export.h"

#define DLSYNC_VERSION_MAJOR 0
#define DLSYNC_VERSION_MINOR 1
#define DLSYNC_VERSION_PATCH 0
#define DLSYNC_VERSION \
  (DLSYNC_VERSION_MAJOR * 10000 + DLSYNC_VERSION_MINOR * 100 + DLSYNC_VERSION_PATCH)
#define DLSYNC_VERSION_STRING "0.1.0"

#ifdef __cplusplus
extern "C" {
#endif

/* The version of the library linked at run time (compare with DLSYNC_VERSION,
 * the one compiled against). */
DLSYNC_API unsigned dlsync_version(void);
DLSYNC_API const char *dlsync_version_string(void);

#ifdef __cplusplus
}
#endif

#endif
