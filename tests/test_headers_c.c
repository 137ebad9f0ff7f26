/* SPDX-License-Identifier: Apache-2.0 */
/* The public headers compile as strict C11 on their own, without cuda.h. */
#include "dlsync/dlsync.h"

#include <stdio.h>
#include <string.h>

int dlsync_headers_cxx_check(void);
int dlsync_headers_hpp_check(void);

int main(void) {
  dlsync_lane lane = dlsync_lane_stream(DLSYNC_STREAM_LEGACY);
  dlsync_context_config cfg = DLSYNC_CONTEXT_CONFIG_INIT;
  if (lane.kind != DLSYNC_LANE_STREAM || cfg.size != sizeof cfg)
    return 1;
  if (strcmp(dlsync_status_name(DLSYNC_ERROR_CAPTURE_ORDER), "DLSYNC_ERROR_CAPTURE_ORDER") != 0)
    return 1;
  if (dlsync_version() != DLSYNC_VERSION)
    return 1;
  if (dlsync_headers_cxx_check() != 0 || dlsync_headers_hpp_check() != 0)
    return 1;
  puts("public headers: C11, C++ and dlsync.hpp ok");
  return 0;
}
