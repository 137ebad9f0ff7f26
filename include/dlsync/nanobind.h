/* SPDX-License-Identifier: Apache-2.0 */
/* dlsync for nanobind extensions (header-only, optional, C++17).
 *
 * nanobind's nb::ndarray argument imports a tensor by calling its
 * __dlpack__() with no stream: the producer orders its work before the
 * legacy default stream (CuPy does; under a capture that breaks it), or not
 * at all, and nothing orders the producer's later work after the extension's
 * kernels. dlsync::nanobind::tensor imports it onto a stream of the
 * extension's own instead:
 *
 *   #include <dlsync/nanobind.h>   // includes nanobind.h and ndarray.h
 *
 *   m.def("scale", [](nb::handle x, nb::handle out) {
 *     dlsync::nanobind::tensor<const float, nb::device::cuda> in(x, my_stream);
 *     dlsync::nanobind::tensor<float, nb::device::cuda> res(out, my_stream);
 *     launch(res.array().data(), in.array().data(), in.array().size(), my_stream);
 *     res.finish();  // the producer's later work runs after my_stream's
 *     in.finish();
 *   });
 *
 * How: the tensor is handed to the dlsync Python package (import dlsync: the
 * wheel, or DLSYNC_LIBRARY) as dlsync.wrap(x) inside a dlsync.scope(), and
 * that wrapper's __dlpack__ is called with the extension's stream. dlsync
 * finds the producer's stream (its __dlpack_c_exchange_api__, its
 * __cuda_stream__, PyTorch's or CuPy's current stream), orders the
 * extension's stream after it the capture-aware way (joining the producer's
 * capture under torch.cuda.graph) and asks the producer for its capsule with
 * stream=-1; a producer that exposes no stream (JAX) is handed the
 * extension's stream instead, and refused while a capture is on.
 * nb::ndarray<Ts...> is made from that capsule. finish() (or the destructor)
 * exits the scope: the producer's stream is ordered after the extension's,
 * and a side stream that joined a capture is joined back.
 *
 * Call with the GIL held (the default in a nanobind function); launch on the
 * stream given before finish(). Errors are Python exceptions: the producer's
 * own, dlsync.Error (status and message), nb::type_error when the tensor does
 * not match Ts...; on any of them nothing is left ordered or joined. Nothing
 * in libdlsync or its other headers depends on nanobind.
 */
#ifndef DLSYNC_NANOBIND_H
#define DLSYNC_NANOBIND_H

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <cstdint>
#include <string>
#include <utility>

#include "dlsync/dlsync.hpp"

namespace dlsync {
namespace nanobind {

namespace nb = ::nanobind;

/* The __dlpack__(stream=...) value of a CUDA stream handle: the handle, 1 for
 * the legacy default stream (NULL or DLSYNC_STREAM_LEGACY), 2 for the
 * per-thread one. */
inline std::intptr_t dlpack_stream_value(void *stream) noexcept {
  std::uintptr_t v = reinterpret_cast<std::uintptr_t>(stream);
  return v == 0 ? DLSYNC_DLPACK_STREAM_LEGACY : static_cast<std::intptr_t>(v);
}

/* The dlsync Python package, imported once per interpreter. */
inline nb::module_ python_package() {
  static nb::module_ *mod = nullptr;
  if (mod == nullptr)
    mod = new nb::module_(nb::module_::import_("dlsync")); // kept for the process
  return *mod;
}

/* A tensor argument imported onto `stream`, ordered after its producer, and
 * its producer ordered after `stream` by finish(). */
template <typename... Ts> class tensor {
public:
  /* obj: any __dlpack__ object. stream: the extension's stream (NULL: the
   * legacy default stream). stream_device: the CUDA ordinal of that stream
   * when the extension knows it (-1: not checked); a CUDA tensor of another
   * device is refused. producer: as dlsync.wrap's producer= (None: found
   * from obj). A tensor of another device type than CUDA is imported by
   * nanobind as it is, with nothing ordered. Raises (nb::type_error,
   * nb::value_error, nb::python_error with the producer's or dlsync's
   * exception) on failure, with nothing left ordered. */
  tensor(nb::handle obj, void *stream, int stream_device = -1, nb::handle producer = nb::none()) {
    if (!obj.is_valid() || obj.is_none())
      throw nb::type_error("dlsync::nanobind::tensor: the argument is None, not a tensor");
    if (!nb::hasattr(obj, "__dlpack__") || !nb::hasattr(obj, "__dlpack_device__"))
      throw nb::type_error(("dlsync::nanobind::tensor: " + type_of(obj) +
                            " has no __dlpack__ / __dlpack_device__: not a DLPack tensor")
                               .c_str());
    nb::object dev = obj.attr("__dlpack_device__")();
    int device_type = 0, device_id = 0;
    if (!nb::isinstance<nb::tuple>(dev) || nb::len(dev) != 2 ||
        !nb::try_cast<int>(dev[0], device_type) || !nb::try_cast<int>(dev[1], device_id))
      throw nb::type_error(("dlsync::nanobind::tensor: " + type_of(obj) +
                            ".__dlpack_device__() did not return a (device_type, device_id) "
                            "pair of ints")
                               .c_str());
    if (device_type != DLSYNC_DLPACK_DEVICE_CUDA) { // nothing to order: nanobind's own import
      if (!nb::try_cast<nb::ndarray<Ts...>>(obj, array_))
        throw mismatch(obj, device_type);
      return;
    }
    if (stream_device >= 0 && device_id != stream_device)
      throw nb::value_error(("dlsync::nanobind::tensor: the " + type_of(obj) +
                             " is on cuda:" + std::to_string(device_id) +
                             ", the extension's stream on cuda:" + std::to_string(stream_device))
                                .c_str());
    nb::module_ dl = python_package();
    scope_ = dl.attr("scope")();
    scope_.attr("__enter__")();
    try {
      nb::object wrapped = dl.attr("wrap")(obj, producer);
      nb::object capsule =
          wrapped.attr("__dlpack__")(nb::arg("stream") = dlpack_stream_value(stream),
                                     nb::arg("max_version") = nb::make_tuple(1, 1));
      if (!nb::try_cast<nb::ndarray<Ts...>>(capsule, array_))
        throw mismatch(obj, device_type);
    } catch (...) {
      abandon();
      throw;
    }
  }
  tensor(const tensor &) = delete;
  tensor &operator=(const tensor &) = delete;

  /* The imported array; valid until the extension's work on the stream
   * given is queued and finish() called. */
  nb::ndarray<Ts...> &array() noexcept {
    return array_;
  }

  /* Orders the producer's later work after the stream's (exits the scope).
   * Once; raises dlsync.Error when the end fails. */
  void finish() {
    if (!scope_.is_valid())
      return;
    nb::object s = std::move(scope_);
    s.attr("__exit__")(nb::none(), nb::none(), nb::none());
  }

  /* Finishes; an error here cannot be raised and is printed as unraisable. */
  ~tensor() {
    if (!scope_.is_valid())
      return;
    try {
      finish();
    } catch (nb::python_error &e) {
      e.discard_as_unraisable("dlsync::nanobind::tensor: ending the order");
    } catch (...) {
    }
  }

private:
  static std::string type_of(nb::handle obj) {
    return nb::type_name(obj.type()).c_str();
  }
  static nb::builtin_exception mismatch(nb::handle obj, int device_type) {
    return nb::type_error(("dlsync::nanobind::tensor: the " + type_of(obj) +
                           " (DLPack device type " + std::to_string(device_type) +
                           ") does not match the extension's ndarray (dtype, device, shape or "
                           "order)")
                              .c_str());
  }

  /* After a failed import: leaves the scope, keeping the first error. */
  void abandon() noexcept {
    nb::object s = std::move(scope_);
    if (!s.is_valid())
      return;
    try {
      s.attr("__exit__")(nb::none(), nb::none(), nb::none());
    } catch (...) {
    }
  }

  nb::object scope_;
  nb::ndarray<Ts...> array_;
};

} // namespace nanobind
} // namespace dlsync

#endif
