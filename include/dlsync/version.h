/* SPDX-License-Identifier: Apache-2.0 */
/* dlsync: version. DLSYNC_VERSION is MAJOR*10000 + MINOR*100 + PATCH.
 * DLSYNC_VERSION_STRING is "MAJOR.MINOR.PATCH", followed by ".devN" between
 * releases (the version the next release will have, as Python's
 * dlsync.__version__ says it too); the numbers are those of that release.
 * This file is the one place the version is written: CMake's project
 * VERSION, the SONAME, the CMake package, dlsync.pc and the wheel read it.
 *
 * What a version promises:
 *  - 0.x (now): a minor version (0.1 -> 0.2) may change the API and the ABI;
 *    what changed is in CHANGELOG.md. A patch version (0.2.0 -> 0.2.1) keeps
 *    both: a program built against 0.2.0 runs with any 0.2.y.
 *  - While the major is 0 the shared library's SONAME carries the minor
 *    (libdlsync.so.0.2), so that the loader never pairs a program with a
 *    library of another 0.x minor; find_package(dlsync 0.2) accepts 0.2.y
 *    only.
 *  - From 1.0: a minor adds to the API and keeps the ABI; only a major
 *    breaks it, and the SONAME carries the major.
 *  - The structs with a size and version field (dlsync_context_config,
 *    dlsync_device_info, dlsync_release_stats) only ever grow at the end;
 *    dlsync_lane and dlsync_lane_state are frozen as lane.h says.
 * While the major is 0, a program can check at run time that the library's
 * major and minor (dlsync_version() / 100) are those it was compiled
 * against (DLSYNC_VERSION / 100). */
#ifndef DLSYNC_VERSION_H
#define DLSYNC_VERSION_H

#include "dlsync/export.h"

#define DLSYNC_VERSION_MAJOR 0
#define DLSYNC_VERSION_MINOR 2
#define DLSYNC_VERSION_PATCH 0
#define DLSYNC_VERSION \
  (DLSYNC_VERSION_MAJOR * 10000 + DLSYNC_VERSION_MINOR * 100 + DLSYNC_VERSION_PATCH)
#define DLSYNC_VERSION_STRING "0.2.0.dev0"

#ifdef __cplusplus
extern "C" {
#endif

/* The version of the library linked at run time (compare with DLSYNC_VERSION,
 * the one compiled against), as a number and as DLSYNC_VERSION_STRING says it, e.g. "0.2.0" or
 * "0.2.0.dev0" (static storage).
 * Returns: the version; never fails.
 * Threads: any thread. Capture: no driver call; safe at any time. */
DLSYNC_API unsigned dlsync_version(void);
DLSYNC_API const char *dlsync_version_string(void);

#ifdef __cplusplus
}
#endif

#endif
