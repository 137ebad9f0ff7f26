/* SPDX-License-Identifier: Apache-2.0 */
/* The library's teardown at a normal exit: a deleter that set an env stream
 * on the reclaimer thread gives the thread a table of its own, which the
 * thread's exit hook frees when the unload joins the thread. Asserted by
 * the leak check at exit (an AddressSanitizer build with detect_leaks=1):
 * the table must not be left behind. The process otherwise only checks that
 * the deleter ran and set the stream. */
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>

#include "order/internal.h"
#include "fake/fake_driver.h"

static atomic_int set_status = -1;

static void env_setting_deleter(void *arg) {
  void *prev = NULL;
  atomic_store(&set_status, (int)dlsync_env_stream_set(&prev, DLSYNC_DLPACK_DEVICE_CUDA, 0, arg));
}

int main(void) {
  dlsync_context *ctx = NULL;
  dlsync_lane lane;
  CUstream s;
  fake_reset(1);
  if (dlsync__context_create_with_driver(&ctx, NULL, fake_driver()) != DLSYNC_SUCCESS) {
    fprintf(stderr, "context: %s\n", dlsync_last_error());
    return 1;
  }
  s = fake_stream_create(0, CU_STREAM_NON_BLOCKING);
  lane = dlsync_lane_stream(s);
  if (dlsync_release(ctx, &lane, env_setting_deleter, (void *)(uintptr_t)0x5a) != DLSYNC_SUCCESS ||
      dlsync_release_flush(ctx) != DLSYNC_SUCCESS) {
    fprintf(stderr, "release: %s\n", dlsync_last_error());
    return 1;
  }
  if (atomic_load(&set_status) != DLSYNC_SUCCESS) {
    fprintf(stderr, "the deleter's dlsync_env_stream_set returned %d\n", atomic_load(&set_status));
    return 1;
  }
  if (dlsync_context_destroy(ctx) != DLSYNC_SUCCESS) {
    fprintf(stderr, "destroy: %s\n", dlsync_last_error());
    return 1;
  }
  fake_stream_destroy(s);
  printf("a deleter set an env stream on the reclaimer; exit leaves its table to the unload\n");
  return 0; /* the leak check runs at exit */
}
