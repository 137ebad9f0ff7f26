/* SPDX-License-Identifier: Apache-2.0 */
// A nanobind extension with a stream of its own: scale(x, out, a, mode)
// writes out = a * x with its kernel on that stream.
//   mode "dlsync": x and out imported through dlsync::nanobind::tensor (the
//                  producer's stream found, the extension's stream ordered
//                  after it, capture-aware, and the producer's after it at
//                  return);
//   mode "plain":  the control, nanobind's own nb::ndarray import (its
//                  __dlpack__() called without a stream), the kernel then on
//                  the extension's stream with nothing more.
#include <stdexcept>
#include <string>

#include <dlsync/nanobind.h>
#include <nanobind/stl/string.h>

namespace nb = nanobind;

int nb_example_launch_scale(float *dst, const float *src, size_t n, float a, void *stream);
int nb_example_stream_create(void **out);
const char *nb_example_error_string(int rc);

namespace {

using in_array = nb::ndarray<const float, nb::device::cuda, nb::c_contig>;
using out_array = nb::ndarray<float, nb::device::cuda, nb::c_contig>;

// Made on first use (call once eagerly before a capture): importing the
// module needs no GPU.
void *own_stream() {
  static void *stream = nullptr;
  if (stream == nullptr) {
    int rc = nb_example_stream_create(&stream);
    if (rc != 0)
      throw std::runtime_error(std::string("dlsync_nb_example: cudaStreamCreateWithFlags: ") +
                               nb_example_error_string(rc));
  }
  return stream;
}

void launch(out_array &out, const in_array &x, float a, void *stream) {
  if (out.size() != x.size())
    throw nb::value_error("dlsync_nb_example.scale: x and out differ in size");
  int rc = nb_example_launch_scale(out.data(), x.data(), x.size(), a, stream);
  if (rc != 0)
    throw std::runtime_error(std::string("dlsync_nb_example.scale: launch: ") +
                             nb_example_error_string(rc));
}

void scale(nb::handle x, nb::handle out, float a, const std::string &mode, int device) {
  if (mode == "dlsync") {
    void *mine = own_stream();
    dlsync::nanobind::tensor<const float, nb::device::cuda, nb::c_contig> in(x, mine, device);
    dlsync::nanobind::tensor<float, nb::device::cuda, nb::c_contig> res(out, mine, device);
    launch(res.array(), in.array(), a, mine);
    res.finish();
    in.finish();
  } else if (mode == "plain") {
    in_array in = nb::cast<in_array>(x); // nanobind's import: __dlpack__() without a stream
    out_array res = nb::cast<out_array>(out);
    launch(res, in, a, own_stream());
  } else {
    throw nb::value_error(
        ("dlsync_nb_example.scale: mode is \"dlsync\" or \"plain\", not \"" + mode + "\"").c_str());
  }
}

} // namespace

NB_MODULE(dlsync_nb_example, m) {
  m.def("scale", &scale, nb::arg("x").none(), nb::arg("out").none(), nb::arg("a"),
        nb::arg("mode") = "dlsync", nb::arg("device") = 0,
        "out = a * x on the extension's own stream (made on the current CUDA device at first "
        "use); mode \"dlsync\" or \"plain\" (the control); device: that stream's CUDA "
        "ordinal, checked against the tensors' (-1: not checked)");
  m.def(
      "stream", []() { return reinterpret_cast<std::uintptr_t>(own_stream()); },
      "the extension's own stream (a cudaStream_t handle)");
}
