/* SPDX-License-Identifier: Apache-2.0 */
// The public headers compile as C++ (with and without cuda.h first) and the
// handle types of cuda.h pass to them unchanged.
#include <cuda.h>

#include "dlsync/dlsync.h"

extern "C" int dlsync_headers_cxx_check(void);

extern "C" int dlsync_headers_cxx_check(void) {
  CUstream s = CU_STREAM_LEGACY;
  dlsync_lane lane = dlsync_lane_stream(s);
  CUgraph g = nullptr;
  CUgraphNode nodes[2] = {nullptr, nullptr};
  dlsync_lane glane = dlsync_lane_graph(g, nodes, 0, 2);
  dlsync_device_info info = DLSYNC_DEVICE_INFO_INIT;
  if (lane.stream != DLSYNC_STREAM_LEGACY || glane.capacity != 2 || info.size != sizeof info)
    return 1;
  return dlsync_status_string(DLSYNC_SUCCESS)[0] == '\0';
}
