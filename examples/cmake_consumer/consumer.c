/* SPDX-License-Identifier: Apache-2.0 */
/* A program that uses an installed dlsync (examples/cmake_consumer,
 * examples/pkgconfig_consumer). Checks that the library it runs with is the
 * one it was compiled against and asks for the default context: with no GPU
 * or driver that fails with a clear status, which is not an error here.
 * Exit 0 when the library works as far as this machine allows. */
#include <dlsync/dlsync.h>
#include <stdio.h>

int main(void) {
  dlsync_context *ctx = NULL;
  dlsync_status st;
  if (dlsync_version() != DLSYNC_VERSION) {
    fprintf(stderr, "compiled against dlsync %s, running with %s\n", DLSYNC_VERSION_STRING,
            dlsync_version_string());
    return 1;
  }
  st = dlsync_context_default(&ctx);
  printf("dlsync %s: default context: %s%s%s\n", dlsync_version_string(), dlsync_status_name(st),
         st == DLSYNC_SUCCESS ? "" : " - ", st == DLSYNC_SUCCESS ? "" : dlsync_last_error());
  return 0;
}
