/* SPDX-License-Identifier: Apache-2.0 */
/* A shared library that embeds libdlsync.a (tests/CMakeLists.txt,
 * static_embedding_hidden): it must export its own function and no dlsync_*. */
#include <dlsync/dlsync.h>

__attribute__((visibility("default"))) unsigned embed_probe_version(void);

unsigned embed_probe_version(void) {
  return dlsync_version();
}
