/* SPDX-License-Identifier: Apache-2.0 */
// dlsync.hpp compiles as C++17 without exceptions (the throwing constructors
// are then absent) next to cuda.h's types.
#include <cuda.h>

#include "dlsync/dlsync.hpp"

#if DLSYNC_HPP_EXCEPTIONS
#error "DLSYNC_HPP_EXCEPTIONS must follow -fno-exceptions"
#endif

extern "C" int dlsync_headers_hpp_check(void);

extern "C" int dlsync_headers_hpp_check(void) {
  CUstream s = CU_STREAM_LEGACY;
  dlsync::exchange empty;
  dlsync::fence none;
  dlsync_lane lane = dlsync::stream_lane(s);
  dlsync::graph_position<2> pos(nullptr);
  return !(empty.ok() && !empty.active() && !none.valid() && lane.stream == dlsync::legacy_stream &&
           pos.size() == 0);
}
