/* SPDX-License-Identifier: Apache-2.0 */
/* dlsync: ordering work between a producer and a consumer.
 *
 * dlsync_order(ctx, first, then) makes the work that `then` queues from now on
 * run after the work `first` queued so far. dlsync_exchange_begin/end is the
 * pair a library uses around a borrowed tensor: begin orders the consumer
 * after the producer's earlier work (the data is ready), end orders the
 * producer's later work (mutation, free, the end of its capture) after the
 * consumer's work in between.
 *
 * What happens depends on what each lane is at the time of the call (read from
 * the driver each time):
 *
 *   first \ then          eager stream         capturing stream      graph lane
 *   same stream           nothing              nothing               -
 *   eager stream          event record+wait    eager record, external wait node in then's graph
 *   capturing (id N)      then joins capture N edges only (same N);  record node in first's graph,
 *                         (plain record/wait)  otherwise record node wait node in then's graph
 *                                              in N, wait node in the other
 *   graph lane            ERROR_CAPTURE_ORDER  record node in first's graph, wait node in then's
 *                                              (same graph: edges only, no node)
 *
 * Each case has a name (EAGER_EAGER, JOIN, TWO_CAPTURES, ...) that the decision
 * log (DLSYNC_DEBUG=TRACE) prints for every call; docs/design.md lists them.
 *
 * Where a record node and a wait node are placed in two different graphs, the
 * graph holding the record node must be launched before the one holding the
 * wait node, each time: a wait node waits for the event's state at launch.
 * Events placed in graphs belong to those graphs (user objects) and go back
 * to the pool only after the graphs and every executable made from them are
 * destroyed. Events for graphs built by hand come from the calling thread's
 * batch of up to 8, held by one user object that each such graph retains: the
 * events of a batch come back together, once every graph that took one of
 * them is gone and the thread has let go of the batch (at its last event, the
 * thread's exit, or dlsync_context_destroy on that thread); so a thread holds
 * at most 8 such events per CUDA context between its orders.
 *
 * An eager stream cannot wait for a graph that is not launched yet (the wait
 * would order nothing): such a request is DLSYNC_ERROR_CAPTURE_ORDER.
 *
 * Conditional bodies (dlsync/conditional.h): where a lane's graph is a
 * declared body of a conditional node, the cells above that add a record or
 * wait node there are DLSYNC_ERROR_CONDITIONAL_BODY (nothing queued, the
 * capture still valid); the edge-only cells (same stream, JOIN, the same
 * capture, the same graph) work as everywhere.
 *
 * Capture safety: no call made here queries or synchronises a stream or
 * event, allocates device memory, or touches the legacy stream unless a lane
 * names it; so dlsync never breaks a capture, in any capture mode, on this
 * thread or another. Events are created (allowed during capture) only when a
 * pool is empty.
 *
 * Devices: streams of two devices are ordered like any others (the driver
 * needs no peer access for an event wait; seen on two H200s). Should the
 * driver refuse such a wait, the status is DLSYNC_ERROR_CROSS_DEVICE and the
 * message names both devices.
 *
 * Errors leave nothing queued that the caller did not ask for, return pooled
 * events to the pool and leak nothing. One exception to "at once": a graph
 * takes its event before dlsync adds the node that uses it, so when adding
 * the node fails (DLSYNC_ERROR_FOREIGN_DEPENDENCY, say) the event comes back
 * when that graph is destroyed. Threads: any number of calls at once on one
 * context; one exchange handle is used by one thread at a time.
 */
#ifndef DLSYNC_EXCHANGE_H
#define DLSYNC_EXCHANGE_H

#include "dlsync/context.h"
#include "dlsync/export.h"
#include "dlsync/lane.h"
#include "dlsync/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Makes `then`'s later work run after `first`'s earlier work (table above).
 * Graph lanes (either side) get their new frontier written back. */
DLSYNC_API dlsync_status dlsync_order(dlsync_context *ctx, dlsync_lane *first, dlsync_lane *then);

typedef struct dlsync_exchange dlsync_exchange;

/* Orders the consumer after the producer (dlsync_order(ctx, producer,
 * consumer)) and returns a handle for the matching end.
 *
 * Stream lanes are copied; the streams must outlive the exchange (end orders
 * whatever stream a handle names by then: one destroyed before end whose
 * handle the driver gave to a new stream is not noticed inside a capture).
 * Graph lanes are kept by pointer: they must stay valid until end, which
 * reads their frontiers as they are then (the caller moves them on while
 * building) and writes the producer's new frontier.
 *
 * If the producer is capturing and the consumer is an eager stream, the
 * consumer joins the producer's capture: the consumer's work until end is
 * captured into the producer's graph and replays with it; end joins it back,
 * so the capture can end cleanly. Work queued on the consumer after end, while
 * that capture is still active, is captured too and must be joined back by
 * the caller (cuStreamEndCapture fails with CUDA_ERROR_STREAM_CAPTURE_UNJOINED
 * otherwise). On failure *out is NULL and nothing was queued. */
DLSYNC_API dlsync_status dlsync_exchange_begin(dlsync_exchange **out, dlsync_context *ctx,
                                               dlsync_lane *producer, dlsync_lane *consumer);

/* Flags of dlsync_exchange_begin_flags. */
typedef enum dlsync_exchange_flag {
  DLSYNC_EXCHANGE_DEFAULT = 0,
  /* A promise by the caller: between begin and end, no capture begins or
   * ends on either stream and neither stream joins another capture. That is
   * true of the usual pattern, where one library call begins, queues its work
   * and ends. With it, an end after a begin that found two eager streams
   * trusts what begin found and asks the driver nothing: two status queries
   * fewer per exchange. Inside one capture (both streams in it at begin, or
   * the consumer joined to the producer's there) end still reads the
   * consumer once, for the dependency set it hands the producer; a query and
   * that update cost less than a record and a wait.
   * Broken, the promise costs a capture: if the consumer began capturing in
   * between, end's wait makes the producer join that capture, so the
   * producer's later work is captured too and that capture's
   * cuStreamEndCapture fails with CUDA_ERROR_STREAM_CAPTURE_UNJOINED; if the
   * producer began capturing, end's wait on an eager event invalidates its
   * capture. Without the flag, end asks again and refuses the first case with
   * DLSYNC_ERROR_CAPTURE_ORDER and orders the second with a wait node. */
  DLSYNC_EXCHANGE_CAPTURE_STABLE = 1u << 0
} dlsync_exchange_flag;

/* dlsync_exchange_begin with flags (dlsync_exchange_flag bits); unknown bits
 * are DLSYNC_ERROR_INVALID_ARGUMENT. */
DLSYNC_API dlsync_status dlsync_exchange_begin_flags(dlsync_exchange **out, dlsync_context *ctx,
                                                     dlsync_lane *producer, dlsync_lane *consumer,
                                                     uint32_t flags);

/* Many producers, one consumer: a kernel that reads several tensors. Orders
 * the consumer after each distinct producer lane of `producers[0..n)` (stream
 * lanes are the same when they name the same stream; graph lanes when they
 * are the same dlsync_lane), as dlsync_exchange_begin_flags would one by one,
 * in array order, each pair by the table above with the consumer's state as
 * it is then. So a producer stream given twice costs one record and one wait;
 * several producers in one capture cost one join (the first joins an eager
 * consumer to the capture, the others find it there: edges only); a producer
 * that already shares the consumer's capture adds edges only. The matching
 * dlsync_exchange_end orders each distinct producer after the consumer's
 * work, newest first, and reports the first failure (it still ends all).
 *
 * n == 1 is dlsync_exchange_begin_flags. n == 0, producers == NULL with
 * n > 0, or n > DLSYNC_EXCHANGE_MANY_MAX: DLSYNC_ERROR_INVALID_ARGUMENT. Every
 * lane is checked before anything is queued; when a later producer fails
 * after earlier ones were ordered, those are ordered back (as end would, so
 * no capture is left with unjoined work) and *out is NULL. Graph lanes are
 * kept by pointer until end, as in dlsync_exchange_begin. */
#define DLSYNC_EXCHANGE_MANY_MAX 1024
DLSYNC_API dlsync_status dlsync_exchange_begin_many(dlsync_exchange **out, dlsync_context *ctx,
                                                    dlsync_lane *producers, size_t n,
                                                    dlsync_lane *consumer, uint32_t flags);

/* Orders the producer's later work after the consumer's work since begin
 * (dlsync_order(ctx, consumer, producer)) and frees the handle, whatever the
 * result. NULL is DLSYNC_ERROR_INVALID_ARGUMENT.
 *
 * DLSYNC_ERROR_CAPTURE_ORDER when the producer is an eager stream and the
 * consumer is capturing or a graph lane (the producer cannot wait for a graph
 * that is not launched), and when begin placed a record node in the
 * producer's graph and a wait node in the consumer's (another graph): the
 * producer's graph must be launched first, so it cannot also wait for the
 * consumer's. Nothing is queued then; order the producer after the launch
 * instead.
 *
 * Misuse is caught: a handle is a record's index and generation, and records
 * are recycled, never freed. Ending a handle a second time, a handle whose
 * record a later begin reused, a handle whose context was destroyed, or a
 * value that was never a handle is DLSYNC_ERROR_INVALID_ARGUMENT with a
 * message; it reads no freed memory and never ends another exchange. A
 * handle may be ended on any thread. Not detected: a generation that wrapped
 * (2^38 begin/end pairs on one record between the two ends). */
DLSYNC_API dlsync_status dlsync_exchange_end(dlsync_exchange *exchange);

#ifdef __cplusplus
}
#endif

#endif
