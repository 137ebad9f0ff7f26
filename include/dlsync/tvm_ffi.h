/* SPDX-License-Identifier: Apache-2.0 */
/* dlsync for TVM FFI kernel modules (header-only, optional, C++17).
 *
 * A function of a TVM FFI module launches on the env stream of its tensors'
 * device (TVMFFIEnvGetStream): tvm_ffi's Python calling convention sets it to
 * the caller's current stream (PyTorch's, under torch.cuda.graph the
 * capturing one) for the call. A module that runs its kernels on a side
 * stream of its own forks that stream from the env stream and joins it back
 * before it returns; dlsync::tvm_ffi::side does both the capture-aware way and
 * throws tvm::ffi::Error naming what failed:
 *
 *   #include <tvm/ffi/container/tensor.h>
 *   #include <tvm/ffi/function.h>
 *   #include <dlsync/tvm_ffi.h>
 *
 *   void scale(tvm::ffi::TensorView x, tvm::ffi::TensorView y) {
 *     dlsync::tvm_ffi::side fork(x.device(), my_stream);  // after the env stream's work
 *     kernel<<<grid, block, 0, my_stream>>>(...);
 *     fork.join();                                         // the env stream's later work after
 * mine
 *   }
 *   TVM_FFI_DLL_EXPORT_TYPED_FUNC(scale, scale);
 *
 * Needs tvm-ffi's headers (tvm_ffi.libinfo.include_paths()) and the module
 * linked with libtvm_ffi, as every TVM FFI module is; nothing else of dlsync
 * depends on TVM FFI. An unset env stream (NULL) is the legacy default
 * stream, as TVM FFI means it. Errors: ValueError for a device that is not
 * CUDA or a NULL side stream (nothing queued), RuntimeError for a failed
 * order (the dlsync status and message). join() must run before the
 * function returns (under capture it joins the side stream back); the
 * destructor joins too, but cannot throw: an error there is lost.
 */
#ifndef DLSYNC_TVM_FFI_H
#define DLSYNC_TVM_FFI_H

#include <tvm/ffi/error.h>
#include <tvm/ffi/extra/c_env_api.h>

#include <dlpack/dlpack.h>

#include "dlsync/dlsync.hpp"

namespace dlsync {
namespace tvm_ffi {

/* TVM FFI's env stream for a device (NULL: unset, the default stream). */
inline void *env_stream(DLDevice device) {
  return TVMFFIEnvGetStream(device.device_type, device.device_id);
}

/* A side stream forked from the env stream of `device` (kDLCUDA) until join(). */
class side {
public:
  side(DLDevice device, void *side_stream, dlsync_context *ctx = nullptr) {
    if (device.device_type != kDLCUDA)
      TVM_FFI_THROW(ValueError) << "dlsync::tvm_ffi::side: device type " << device.device_type
                                << " is not CUDA (" << static_cast<int>(kDLCUDA)
                                << "): nothing to order";
    if (side_stream == nullptr)
      TVM_FFI_THROW(ValueError) << "dlsync::tvm_ffi::side: the side stream is NULL (the legacy "
                                   "default stream cannot be a module's own stream)";
    ex_ = exchange(env_stream(device), side_stream, DLSYNC_EXCHANGE_CAPTURE_STABLE, ctx);
    if (!ex_.ok())
      TVM_FFI_THROW(RuntimeError) << "dlsync: ordering the side stream after TVM FFI's env stream "
                                     "of cuda:"
                                  << device.device_id << ": " << ex_.status_name() << ": "
                                  << ex_.message();
  }
  side(const side &) = delete;
  side &operator=(const side &) = delete;

  /* The env stream's later work runs after the side stream's. Once. */
  void join() {
    if (!ex_.active())
      return;
    if (ex_.end() != DLSYNC_SUCCESS)
      TVM_FFI_THROW(RuntimeError) << "dlsync: ordering TVM FFI's env stream after the side "
                                     "stream: "
                                  << ex_.status_name() << ": " << ex_.message();
  }

  bool active() const noexcept {
    return ex_.active();
  }

private:
  exchange ex_;
};

} // namespace tvm_ffi
} // namespace dlsync

#endif
