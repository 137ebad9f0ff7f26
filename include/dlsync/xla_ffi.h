/* SPDX-License-Identifier: Apache-2.0 */
/* dlsync for XLA FFI handlers (header-only, optional, C++17).
 *
 * A handler that runs its kernels on a stream of its own forks that stream
 * from XLA's (the PlatformStream<cudaStream_t> it is given) and joins it back
 * before it returns. XLA traces command-buffer-compatible handlers into a CUDA
 * graph on a capturing stream, so the same handler is called on an eager
 * stream in one run and on a capturing one in the next; dlsync::xla_ffi::side
 * orders the two streams the right way in both, and turns a failure into an
 * xla::ffi::Error naming it:
 *
 *   #include "xla/ffi/api/ffi.h"
 *   #include <dlsync/xla_ffi.h>
 *
 *   ffi::Error impl(cudaStream_t xla, ffi::Buffer<ffi::F32> x, ffi::ResultBuffer<ffi::F32> y) {
 *     dlsync::xla_ffi::side fork(xla, my_stream);   // my_stream after XLA's earlier work
 *     if (ffi::Error e = fork.error(); e.failure()) return e;
 *     kernel<<<grid, block, 0, my_stream>>>(...);
 *     return fork.join();                            // XLA's later work after mine
 *   }
 *   XLA_FFI_DEFINE_HANDLER_SYMBOL(handler, impl, ffi::Ffi::Bind()...,
 * {ffi::Traits::kCmdBufferCompatible});
 *
 * Include xla/ffi/api/ffi.h (from jax.ffi.include_dir()) first. Nothing else
 * of dlsync needs XLA; this header needs only dlsync.hpp and ffi.h (no CUDA
 * header). The exchange is begun with DLSYNC_EXCHANGE_CAPTURE_STABLE: a
 * handler's call neither begins nor ends a capture between its fork and its
 * join. join() must run before the handler returns (under tracing it is what
 * joins the side stream back into XLA's capture); the destructor joins too,
 * but loses the status.
 */
#ifndef DLSYNC_XLA_FFI_H
#define DLSYNC_XLA_FFI_H

#ifndef XLA_FFI_API_FFI_H_
#error "dlsync/xla_ffi.h: include \"xla/ffi/api/ffi.h\" (jax.ffi.include_dir()) before it"
#endif

#include <string>

#include "dlsync/dlsync.hpp"

namespace dlsync {
namespace xla_ffi {

/* The XLA FFI error code for a dlsync status. */
inline ::xla::ffi::ErrorCode error_code(dlsync_status s) noexcept {
  switch (s) {
  case DLSYNC_SUCCESS:
    return ::xla::ffi::ErrorCode::kOk;
  case DLSYNC_ERROR_INVALID_ARGUMENT:
  case DLSYNC_ERROR_INVALID_LANE:
  case DLSYNC_ERROR_FOREIGN_DEPENDENCY:
    return ::xla::ffi::ErrorCode::kInvalidArgument;
  case DLSYNC_ERROR_CAPTURE_ORDER:
  case DLSYNC_ERROR_LEGACY_STREAM_IN_CAPTURE:
  case DLSYNC_ERROR_CAPTURE_INVALIDATED:
  case DLSYNC_ERROR_CROSS_DEVICE:
    return ::xla::ffi::ErrorCode::kFailedPrecondition;
  case DLSYNC_ERROR_OUT_OF_MEMORY:
    return ::xla::ffi::ErrorCode::kResourceExhausted;
  case DLSYNC_ERROR_NO_DRIVER:
  case DLSYNC_ERROR_DRIVER_TOO_OLD:
    return ::xla::ffi::ErrorCode::kUnavailable;
  default:
    return ::xla::ffi::ErrorCode::kInternal;
  }
}

/* Success, or an error "dlsync: <what>: <status name>: <message>". */
inline ::xla::ffi::Error to_error(const outcome &o, const char *what) {
  if (o.ok())
    return ::xla::ffi::Error::Success();
  return ::xla::ffi::Error(error_code(o.status()), std::string("dlsync: ") + what + ": " +
                                                       o.status_name() + ": " + o.message());
}

/* A side stream forked from XLA's stream for a handler's call (an exchange
 * with XLA's stream as the producer). Either stream NULL is refused (XLA
 * never passes NULL; a handler that does has lost its stream): error() is
 * then kInvalidArgument and nothing was queued. */
class side {
public:
  side(void *xla_stream, void *side_stream, dlsync_context *ctx = nullptr) noexcept
      : null_(xla_stream == nullptr || side_stream == nullptr) {
    if (!null_)
      ex_ = exchange(xla_stream, side_stream, DLSYNC_EXCHANGE_CAPTURE_STABLE, ctx);
  }
  side(const side &) = delete;
  side &operator=(const side &) = delete;

  /* Success once forked; else what failed. */
  ::xla::ffi::Error error() const {
    if (null_)
      return ::xla::ffi::Error::InvalidArgument(
          "dlsync: xla_ffi::side: a NULL stream (XLA's stream and the side stream must both "
          "be streams of the handler's device)");
    return to_error(ex_, "ordering the side stream after XLA's stream");
  }

  /* Joins: XLA's later work runs after the side stream's. Once; returns the
   * fork's error if the fork failed. */
  ::xla::ffi::Error join() {
    if (null_)
      return error();
    ex_.end();
    return to_error(ex_, "ordering XLA's stream after the side stream");
  }

  bool ok() const noexcept {
    return !null_ && ex_.ok();
  }
  /* Forked and not yet joined. */
  bool active() const noexcept {
    return ex_.active();
  }

private:
  bool null_;
  exchange ex_;
};

} // namespace xla_ffi
} // namespace dlsync

#endif
