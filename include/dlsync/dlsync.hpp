/* SPDX-License-Identifier: Apache-2.0 */
/* dlsync for C++ (header-only, optional, C++17): RAII over the C API.
 *
 *   #include <dlsync/dlsync.hpp>
 *
 *   void my_op(cudaStream_t caller, cudaStream_t mine) {
 *     dlsync::exchange ex(caller, mine);    // mine waits for caller's earlier work
 *     if (!ex.ok()) return report(ex.message());
 *     kernel<<<grid, block, 0, mine>>>(...);
 *   }                                       // ends: caller's later work waits for mine
 *
 * The guard's destructor ends the exchange and never throws; the status of
 * the end is lost there, so code that must see it calls end() first (it
 * returns the status; the destructor then does nothing). Under stream capture
 * the end is what joins a side stream back into the caller's capture: keep
 * the guard's scope inside the capture.
 *
 * Errors: every call returns a dlsync_status; the guard and the fence keep
 * the first failure's status and message (copied from dlsync_last_error at
 * that moment, so a later failing call on the thread does not overwrite it).
 * With exceptions on (DLSYNC_HPP_EXCEPTIONS, by default 1 when the compiler
 * has them), the constructors taking dlsync::throw_on_error throw
 * dlsync::error instead; nothing else throws.
 *
 * Lanes: stream lanes are copied by dlsync; graph lanes are kept by pointer
 * until end (exchange.h), so the graph-lane constructors take references,
 * and dlsync::graph_position keeps a frontier at a fixed address (it cannot
 * be copied or moved). Threads: a guard or a fence object is used by one
 * thread at a time, as the C handles are.
 */
#ifndef DLSYNC_HPP
#define DLSYNC_HPP

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <utility>

#include "dlsync/dlsync.h"

#ifndef DLSYNC_HPP_EXCEPTIONS
#if defined(__cpp_exceptions) || defined(__EXCEPTIONS)
#define DLSYNC_HPP_EXCEPTIONS 1
#else
#define DLSYNC_HPP_EXCEPTIONS 0
#endif
#endif

#if DLSYNC_HPP_EXCEPTIONS
#include <stdexcept>
#include <string>
#endif

namespace dlsync {

using stream_t = struct CUstream_st *;
using graph_t = struct CUgraph_st *;
using node_t = struct CUgraphNode_st *;

/* ---- lanes ---- */

inline dlsync_lane stream_lane(stream_t stream) noexcept {
  return dlsync_lane_stream(stream);
}
/* Any pointer-sized stream handle (cudaStream_t, CUstream, void * from a framework). */
inline dlsync_lane stream_lane(void *stream) noexcept {
  return dlsync_lane_stream(static_cast<stream_t>(stream));
}
/* DLSYNC_STREAM_LEGACY and DLSYNC_STREAM_PER_THREAD without their C casts. */
inline const stream_t legacy_stream = reinterpret_cast<stream_t>(std::uintptr_t{1});
inline const stream_t per_thread_stream = reinterpret_cast<stream_t>(std::uintptr_t{2});

/* A position in a graph built by hand with room for N frontier nodes, at a
 * fixed address: lane() may be handed to an exchange, which keeps it. */
template <std::size_t N> class graph_position {
  static_assert(N > 0, "a frontier of one node always fits: N >= 1");

public:
  explicit graph_position(graph_t graph) noexcept : lane_(dlsync_lane_graph(graph, nodes_, 0, N)) {}
  /* Starts after `ndeps` nodes; more than N is refused with ok() false. */
  graph_position(graph_t graph, const node_t *deps, std::size_t ndeps) noexcept
      : graph_position(graph) {
    if (ndeps > N) {
      fits_ = false;
      return;
    }
    for (std::size_t i = 0; i < ndeps; i++)
      nodes_[i] = deps[i];
    lane_.ndeps = ndeps;
  }
  graph_position(const graph_position &) = delete;
  graph_position &operator=(const graph_position &) = delete;

  bool ok() const noexcept {
    return fits_;
  }
  dlsync_lane &lane() noexcept {
    return lane_;
  }
  const node_t *begin() const noexcept {
    return nodes_;
  }
  const node_t *end() const noexcept {
    return nodes_ + lane_.ndeps;
  }
  std::size_t size() const noexcept {
    return lane_.ndeps;
  }

private:
  node_t nodes_[N] = {};
  dlsync_lane lane_;
  bool fits_ = true;
};

/* What a lane is now (one capture query for a stream; legal during capture). */
inline dlsync_status query(dlsync_lane_state *out, dlsync_context *ctx,
                           const dlsync_lane &lane) noexcept {
  return dlsync_lane_query(out, ctx, &lane);
}

/* Whether a stream is capturing now: *out, and the status of the question
 * (DLSYNC_ERROR_NO_DRIVER where there is no driver: then nobody can say). */
inline dlsync_status capturing(bool *out, stream_t stream, dlsync_context *ctx = nullptr) noexcept {
  dlsync_lane_state st{};
  dlsync_lane lane = stream_lane(stream);
  dlsync_status s = DLSYNC_SUCCESS;
  *out = false;
  if (ctx == nullptr)
    s = dlsync_context_default(&ctx);
  if (s == DLSYNC_SUCCESS)
    s = dlsync_lane_query(&st, ctx, &lane);
  if (s == DLSYNC_SUCCESS)
    *out = st.kind == DLSYNC_LANE_CAPTURING;
  return s;
}

/* ---- errors ---- */

/* A status and the thread's message for it, kept by value. */
class outcome {
public:
  dlsync_status status() const noexcept {
    return status_;
  }
  bool ok() const noexcept {
    return status_ == DLSYNC_SUCCESS;
  }
  explicit operator bool() const noexcept {
    return ok();
  }
  /* "" when ok(). */
  const char *message() const noexcept {
    return message_;
  }
  const char *status_name() const noexcept {
    return dlsync_status_name(status_);
  }

protected:
  /* Keeps the first failure only; returns s. */
  dlsync_status note(dlsync_status s) noexcept {
    if (s != DLSYNC_SUCCESS && status_ == DLSYNC_SUCCESS) {
      status_ = s;
      std::snprintf(message_, sizeof message_, "%s", dlsync_last_error());
    }
    return s;
  }
  /* A failure of the wrapper itself (no C call made). */
  void refuse(dlsync_status s, const char *why) noexcept {
    if (status_ == DLSYNC_SUCCESS) {
      status_ = s;
      std::snprintf(message_, sizeof message_, "%s", why);
    }
  }
  void take(outcome &other) noexcept {
    status_ = other.status_;
    std::snprintf(message_, sizeof message_, "%s", other.message_);
    other.status_ = DLSYNC_SUCCESS;
    other.message_[0] = '\0';
  }

private:
  dlsync_status status_ = DLSYNC_SUCCESS;
  char message_[512] = {};
};

#if DLSYNC_HPP_EXCEPTIONS
class error : public std::runtime_error {
public:
  error(dlsync_status status, const char *message)
      : std::runtime_error(std::string(dlsync_status_name(status)) + ": " + message),
        status_(status) {}
  dlsync_status status() const noexcept {
    return status_;
  }

private:
  dlsync_status status_;
};

/* Pass to a constructor to have it throw dlsync::error on failure. */
struct throw_on_error_t {
  explicit throw_on_error_t() = default;
};
inline constexpr throw_on_error_t throw_on_error{};
#endif

/* Whether a stream is capturing now. A question that cannot be answered
 * (no driver: DLSYNC_ERROR_NO_DRIVER; a bad context) throws dlsync::error,
 * as dlsync.capturing raises in Python; without exceptions it is false then:
 * the status form above tells the two apart. */
inline bool capturing(stream_t stream,
                      dlsync_context *ctx = nullptr) noexcept(!DLSYNC_HPP_EXCEPTIONS) {
  bool yes = false;
  dlsync_status s = capturing(&yes, stream, ctx);
#if DLSYNC_HPP_EXCEPTIONS
  if (s != DLSYNC_SUCCESS)
    throw error(s, dlsync_last_error());
#else
  (void)s;
#endif
  return yes;
}

/* ---- the exchange guard ---- */

/* What exchange and exchange_many share: one dlsync_exchange handle, ended
 * once (by end() or the destructor), moved but never copied. */
class begun : public outcome {
public:
  begun(const begun &) = delete;
  begun &operator=(const begun &) = delete;
  begun(begun &&other) noexcept : outcome(), handle_(other.handle_) {
    other.handle_ = nullptr;
    take(other);
  }
  begun &operator=(begun &&other) noexcept {
    if (this != &other) {
      end();
      handle_ = other.handle_;
      other.handle_ = nullptr;
      take(other);
    }
    return *this;
  }
  ~begun() {
    end();
  }

  /* Ends the exchange (dlsync_exchange_end) once; later calls do nothing.
   * Returns the status of this end, or the first failure kept (begin's or an
   * earlier end's). The guard is inactive after a failed end too (the C
   * handle is ended whatever the result): when message() says that nothing
   * was queued, dlsync_order(ctx, consumer, producer) finishes the order
   * (exchange.h). */
  dlsync_status end() noexcept {
    dlsync_exchange *h = handle_;
    handle_ = nullptr;
    if (h != nullptr)
      note(dlsync_exchange_end(h));
    return status();
  }

  /* Begun and not yet ended. */
  bool active() const noexcept {
    return handle_ != nullptr;
  }
  dlsync_exchange *native() const noexcept {
    return handle_;
  }

protected:
  begun() noexcept = default;
  dlsync_exchange *handle_ = nullptr;
};

/* [[nodiscard]] on the class and on each constructor that begins something
 * (GCC reads only the latter, clang both): `dlsync::exchange(a, b);` would
 * end the exchange at its semicolon, before the work it was meant to order;
 * compilers warn (tests/check_nodiscard.cmake). */
class [[nodiscard]] exchange : public begun {
public:
  /* An empty guard: nothing begun, ok(). */
  exchange() noexcept = default;

  /* Begins an exchange between two streams on ctx (nullptr: the default
   * context). On failure ok() is false, message() says why, nothing was
   * queued and the destructor does nothing. */
  [[nodiscard]] exchange(stream_t producer, stream_t consumer, uint32_t flags = 0,
                         dlsync_context *ctx = nullptr) noexcept {
    dlsync_lane p = stream_lane(producer), c = stream_lane(consumer);
    start(p, c, flags, ctx);
  }
  [[nodiscard]] exchange(void *producer, void *consumer, uint32_t flags = 0,
                         dlsync_context *ctx = nullptr) noexcept
      : exchange(static_cast<stream_t>(producer), static_cast<stream_t>(consumer), flags, ctx) {}

  /* Any lanes; graph lanes must outlive the guard's end (exchange.h). */
  [[nodiscard]] exchange(dlsync_lane &producer, dlsync_lane &consumer, uint32_t flags = 0,
                         dlsync_context *ctx = nullptr) noexcept {
    start(producer, consumer, flags, ctx);
  }

#if DLSYNC_HPP_EXCEPTIONS
  [[nodiscard]] exchange(throw_on_error_t, stream_t producer, stream_t consumer, uint32_t flags = 0,
                         dlsync_context *ctx = nullptr)
      : exchange(producer, consumer, flags, ctx) {
    if (!ok())
      throw error(status(), message());
  }
  [[nodiscard]] exchange(throw_on_error_t, dlsync_lane &producer, dlsync_lane &consumer,
                         uint32_t flags = 0, dlsync_context *ctx = nullptr)
      : exchange(producer, consumer, flags, ctx) {
    if (!ok())
      throw error(status(), message());
  }
#endif

private:
  void start(dlsync_lane &producer, dlsync_lane &consumer, uint32_t flags,
             dlsync_context *ctx) noexcept {
    if (ctx == nullptr && note(dlsync_context_default(&ctx)) != DLSYNC_SUCCESS)
      return;
    note(dlsync_exchange_begin_flags(&handle_, ctx, &producer, &consumer, flags));
  }
};

/* ---- many producers, one consumer ---- */

/* dlsync_exchange_begin_many as a guard: the consumer waits for every
 * producer's earlier work; the end orders each producer's later work after
 * the consumer's. Lanes are copied by begin_many as by begin (stream lanes);
 * graph lanes must outlive the end. */
class [[nodiscard]] exchange_many : public begun {
public:
  exchange_many() noexcept = default;
  [[nodiscard]] exchange_many(dlsync_lane *producers, std::size_t n, dlsync_lane &consumer,
                              uint32_t flags = 0, dlsync_context *ctx = nullptr) noexcept {
    start(producers, n, consumer, flags, ctx);
  }
  /* Streams: up to 64 producers (more: DLSYNC_ERROR_INVALID_ARGUMENT). A
   * NULL producers array is refused as dlsync_exchange_begin_many refuses it. */
  [[nodiscard]] exchange_many(const stream_t *producers, std::size_t n, stream_t consumer,
                              uint32_t flags = 0, dlsync_context *ctx = nullptr) noexcept {
    dlsync_lane lanes[64];
    dlsync_lane c = stream_lane(consumer);
    if (producers == nullptr) {
      start(nullptr, n, c, flags, ctx); /* the C call's refusal and message */
      return;
    }
    if (n > 64) {
      refuse(DLSYNC_ERROR_INVALID_ARGUMENT,
             "dlsync::exchange_many: more than 64 producer streams; pass lanes instead");
      return;
    }
    for (std::size_t i = 0; i < n; i++)
      lanes[i] = stream_lane(producers[i]);
    start(lanes, n, c, flags, ctx);
  }
#if DLSYNC_HPP_EXCEPTIONS
  [[nodiscard]] exchange_many(throw_on_error_t, dlsync_lane *producers, std::size_t n,
                              dlsync_lane &consumer, uint32_t flags = 0,
                              dlsync_context *ctx = nullptr)
      : exchange_many(producers, n, consumer, flags, ctx) {
    if (!ok())
      throw error(status(), message());
  }
  [[nodiscard]] exchange_many(throw_on_error_t, const stream_t *producers, std::size_t n,
                              stream_t consumer, uint32_t flags = 0, dlsync_context *ctx = nullptr)
      : exchange_many(producers, n, consumer, flags, ctx) {
    if (!ok())
      throw error(status(), message());
  }
#endif
private:
  void start(dlsync_lane *producers, std::size_t n, dlsync_lane &consumer, uint32_t flags,
             dlsync_context *ctx) noexcept {
    if (ctx == nullptr && note(dlsync_context_default(&ctx)) != DLSYNC_SUCCESS)
      return;
    note(dlsync_exchange_begin_many(&handle_, ctx, producers, n, &consumer, flags));
  }
};

/* ---- one producer, many consumers ---- */

/* dlsync_exchange_begin_fanout as a guard: every consumer waits for the
 * producer's earlier work (eager: one event recorded once); the end (the
 * join) orders the producer's later work after each consumer's. Lanes are
 * copied as by begin (stream lanes); graph lanes must outlive the end. */
class [[nodiscard]] exchange_fanout : public begun {
public:
  exchange_fanout() noexcept = default;
  [[nodiscard]] exchange_fanout(dlsync_lane &producer, dlsync_lane *consumers, std::size_t n,
                                uint32_t flags = 0, dlsync_context *ctx = nullptr) noexcept {
    start(producer, consumers, n, flags, ctx);
  }
  /* Streams: up to 64 consumers (more: DLSYNC_ERROR_INVALID_ARGUMENT). A
   * NULL consumers array is refused as dlsync_exchange_begin_fanout refuses
   * it. */
  [[nodiscard]] exchange_fanout(stream_t producer, const stream_t *consumers, std::size_t n,
                                uint32_t flags = 0, dlsync_context *ctx = nullptr) noexcept {
    dlsync_lane lanes[64];
    dlsync_lane p = stream_lane(producer);
    if (consumers == nullptr) {
      start(p, nullptr, n, flags, ctx); /* the C call's refusal and message */
      return;
    }
    if (n > 64) {
      refuse(DLSYNC_ERROR_INVALID_ARGUMENT,
             "dlsync::exchange_fanout: more than 64 consumer streams; pass lanes instead");
      return;
    }
    for (std::size_t i = 0; i < n; i++)
      lanes[i] = stream_lane(consumers[i]);
    start(p, lanes, n, flags, ctx);
  }
#if DLSYNC_HPP_EXCEPTIONS
  [[nodiscard]] exchange_fanout(throw_on_error_t, dlsync_lane &producer, dlsync_lane *consumers,
                                std::size_t n, uint32_t flags = 0, dlsync_context *ctx = nullptr)
      : exchange_fanout(producer, consumers, n, flags, ctx) {
    if (!ok())
      throw error(status(), message());
  }
  [[nodiscard]] exchange_fanout(throw_on_error_t, stream_t producer, const stream_t *consumers,
                                std::size_t n, uint32_t flags = 0, dlsync_context *ctx = nullptr)
      : exchange_fanout(producer, consumers, n, flags, ctx) {
    if (!ok())
      throw error(status(), message());
  }
#endif
private:
  void start(dlsync_lane &producer, dlsync_lane *consumers, std::size_t n, uint32_t flags,
             dlsync_context *ctx) noexcept {
    if (ctx == nullptr && note(dlsync_context_default(&ctx)) != DLSYNC_SUCCESS)
      return;
    note(dlsync_exchange_begin_fanout(&handle_, ctx, &producer, consumers, n, flags));
  }
};

/* ---- fences ---- */

/* A shared reference to a dlsync_fence: copies retain, destruction releases. */
class [[nodiscard]] fence : public outcome {
public:
  fence() noexcept = default;
  /* Takes over one reference of an existing fence. */
  explicit fence(dlsync_fence *adopt) noexcept : f_(adopt) {}

  /* Signals on a lane (a stream: the work queued so far). On failure ok() is
   * false and valid() too. */
  [[nodiscard]] explicit fence(dlsync_lane &lane, dlsync_context *ctx = nullptr) noexcept {
    signal(lane, ctx);
  }
  [[nodiscard]] explicit fence(stream_t stream, dlsync_context *ctx = nullptr) noexcept {
    dlsync_lane lane = stream_lane(stream);
    signal(lane, ctx);
  }
#if DLSYNC_HPP_EXCEPTIONS
  [[nodiscard]] fence(throw_on_error_t, stream_t stream, dlsync_context *ctx = nullptr)
      : fence(stream, ctx) {
    if (!ok())
      throw error(status(), message());
  }
#endif

  fence(const fence &other) noexcept : outcome(other), f_(dlsync_fence_retain(other.f_)) {}
  fence &operator=(const fence &other) noexcept {
    if (this != &other) {
      dlsync_fence *keep = dlsync_fence_retain(other.f_);
      dlsync_fence_release(f_);
      f_ = keep;
      outcome::operator=(other);
    }
    return *this;
  }
  fence(fence &&other) noexcept : f_(other.f_) {
    other.f_ = nullptr;
    take(other);
  }
  fence &operator=(fence &&other) noexcept {
    if (this != &other) {
      dlsync_fence_release(f_);
      f_ = other.f_;
      other.f_ = nullptr;
      take(other);
    }
    return *this;
  }
  ~fence() {
    dlsync_fence_release(f_);
  }

  bool valid() const noexcept {
    return f_ != nullptr;
  }

  /* Orders the lane's later work after the fence; returns this wait's
   * status (DLSYNC_ERROR_INVALID_ARGUMENT for an empty fence). */
  dlsync_status wait(dlsync_lane &lane) noexcept {
    if (f_ == nullptr)
      return DLSYNC_ERROR_INVALID_ARGUMENT;
    return note(dlsync_fence_wait(f_, &lane));
  }
  dlsync_status wait(stream_t stream) noexcept {
    dlsync_lane lane = stream_lane(stream);
    return wait(lane);
  }

  dlsync_status kind(dlsync_fence_kind *out) const noexcept {
    return dlsync_fence_get_kind(out, f_);
  }
  dlsync_fence *native() const noexcept {
    return f_;
  }
  /* Gives up the reference without releasing it. */
  dlsync_fence *detach() noexcept {
    return std::exchange(f_, nullptr);
  }

private:
  void signal(dlsync_lane &lane, dlsync_context *ctx) noexcept {
    if (ctx == nullptr && note(dlsync_context_default(&ctx)) != DLSYNC_SUCCESS)
      return;
    note(dlsync_fence_signal(&f_, ctx, &lane));
  }

  dlsync_fence *f_ = nullptr;
};

/* ---- env streams ---- */

/* Sets the thread's current stream for a device for the guard's lifetime and
 * restores the previous one after. */
class [[nodiscard]] env_stream_scope {
public:
  [[nodiscard]] env_stream_scope(int32_t device_type, int32_t device_id, void *stream) noexcept
      : type_(device_type), id_(device_id) {
    status_ = dlsync_env_stream_set(&previous_, type_, id_, stream);
  }
  env_stream_scope(const env_stream_scope &) = delete;
  env_stream_scope &operator=(const env_stream_scope &) = delete;
  ~env_stream_scope() {
    dlsync_env_stream_set(nullptr, type_, id_, previous_);
  }
  dlsync_status status() const noexcept {
    return status_;
  }

private:
  int32_t type_, id_;
  void *previous_ = nullptr;
  dlsync_status status_;
};

} // namespace dlsync

#endif
