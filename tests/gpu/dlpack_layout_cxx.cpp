/* SPDX-License-Identifier: Apache-2.0 */
// The real dlpack.h and dlsync's headers together in C++ (dlsync's first):
// dlsync's forward declarations name the same types as dlpack.h's
// definitions, so real DLPack structs pass to dlsync's functions unchanged.
#include "dlsync/dlsync.h"

#include DLSYNC_DLPACK_HEADER

#include <cstring>

extern "C" int dlpack_layout_cxx(void);

static int cxx_deleted = 0;

extern "C" int dlpack_layout_cxx(void) {
  DLManagedTensorVersioned t;
  uint32_t major = 0, minor = 0;
  std::memset(&t, 0, sizeof t);
  t.version.major = DLPACK_MAJOR_VERSION;
  t.version.minor = DLPACK_MINOR_VERSION;
  t.deleter = [](DLManagedTensorVersioned *) { cxx_deleted++; };
  if (dlsync_dlpack_version(&major, &minor, &t) != DLSYNC_SUCCESS || major != t.version.major)
    return 1;
  dlsync_dlpack_call_deleter(&t);
#ifdef DLSYNC_DLPACK_HAS_EXCHANGE_API
  {
    const DLPackExchangeAPI *none = nullptr;
    void *stream = nullptr;
    if (dlsync_env_stream_from_exchange_api(&stream, none, kDLCUDA, 0) !=
        DLSYNC_ERROR_INVALID_ARGUMENT)
      return 1;
  }
#endif
  return cxx_deleted == 1 ? 0 : 1;
}
