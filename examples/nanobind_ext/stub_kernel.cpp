/* SPDX-License-Identifier: Apache-2.0 */
// The launcher's stand-in without CUDA (NB_EXAMPLE_CUDA=OFF), for the
// bad-input tests on a machine without a GPU: a stream handle that is never
// used by a driver (the tests stop before dlsync would), launches that fail
// with a message.
#include <cstddef>

int nb_example_launch_scale(float *, const float *, size_t, float, void *) {
  return 100;
}

int nb_example_stream_create(void **out) {
  static char not_a_stream;
  *out = &not_a_stream;
  return 0;
}

const char *nb_example_error_string(int) {
  return "built without CUDA (NB_EXAMPLE_CUDA=OFF)";
}
