/* SPDX-License-Identifier: Apache-2.0 */
/* dlsync: ordering work between a producer and a consumer.
 *
 * Caller's rules:
 *  - Queue the consumer's work on a borrowed tensor between a successful
 *    dlsync_exchange_begin* and its one dlsync_exchange_end (on any thread).
 *  - Keep stream lanes' streams alive until end; graph lanes are kept by
 *    pointer and must stay valid until end (move their frontier on as you
 *    build: end reads it as it is then).
 *  - Where an order puts a record node in one graph and a wait node in
 *    another, launch the graph with the record node first, every time.
 *  - An eager stream cannot wait for a graph that is not launched yet: such
 *    an order is DLSYNC_ERROR_CAPTURE_ORDER and queues nothing; order it
 *    after the launch instead.
 *  - Every call here is legal during capture, in every capture mode, on this
 *    thread or another: none queries or synchronises a stream or an event,
 *    allocates device memory, or touches the legacy stream unless a lane
 *    names it.
 *
 * What each pair of lanes gets (the decision table: EAGER_EAGER, JOIN,
 * SAME_CAPTURE, TWO_CAPTURES, ...), how events in graphs are owned and given
 * back, and why: docs/design.md section 3. The decision log
 * (DLSYNC_DEBUG=TRACE) names the row of every call.
 *
 * Conditional bodies (dlsync/conditional.h): where a lane's graph is a
 * declared body of a conditional node, an order that would add a record or
 * wait node there puts it in the body's parent instead when the body was
 * declared with its parent and node, and is DLSYNC_ERROR_CONDITIONAL_BODY
 * otherwise (nothing queued, the capture still valid); the edge-only rows
 * (same stream, JOIN, the same capture, the same graph) work as everywhere.
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

/* Makes the work `then` queues from now on run after the work `first` queued
 * so far. Graph lanes (either side) get their new frontier written back.
 * Returns: DLSYNC_SUCCESS, the order in place.
 * Errors: DLSYNC_ERROR_INVALID_ARGUMENT, DLSYNC_ERROR_INVALID_LANE,
 *   DLSYNC_ERROR_CAPTURE_INVALIDATED, DLSYNC_ERROR_LEGACY_STREAM_IN_CAPTURE,
 *   DLSYNC_ERROR_CAPTURE_ORDER (an eager `then` after a graph not launched),
 *   DLSYNC_ERROR_FOREIGN_DEPENDENCY, DLSYNC_ERROR_CROSS_DEVICE (the driver
 *   refused a wait across devices; the message names both),
 *   DLSYNC_ERROR_DRIVER, DLSYNC_ERROR_OUT_OF_MEMORY, DLSYNC_ERROR_INTERNAL.
 *   A failure queues nothing and returns pooled events to the pool, except
 *   that a graph keeps an event it took before a node could not be added
 *   (it comes back when that graph is destroyed).
 * Threads: any number of calls at once on one context; a graph lane is
 *   written by one thread at a time.
 * Capture: legal in every mode; it never breaks a capture. */
DLSYNC_API dlsync_status dlsync_order(dlsync_context *ctx, dlsync_lane *first, dlsync_lane *then);

typedef struct dlsync_exchange dlsync_exchange;

/* Orders the consumer after the producer (dlsync_order(ctx, producer,
 * consumer)) and returns a handle for the matching end.
 *
 * Stream lanes are copied; the streams must outlive the exchange (end orders
 * whatever stream a handle names by then: one destroyed before end whose
 * handle the driver gave to a new stream is not noticed inside a capture).
 * Graph lanes are kept by pointer: they must stay valid until end, which
 * reads their frontiers as they are then and writes the producer's new
 * frontier.
 *
 * If the producer is capturing and the consumer is an eager stream, the
 * consumer joins the producer's capture: the consumer's work until end is
 * captured into the producer's graph and replays with it; end joins it back,
 * so the capture can end cleanly. Work queued on the consumer after end, while
 * that capture is still active, is captured too and must be joined back by
 * the caller (cuStreamEndCapture fails with CUDA_ERROR_STREAM_CAPTURE_UNJOINED
 * otherwise).
 * Returns: DLSYNC_SUCCESS and *out the handle for dlsync_exchange_end.
 * Errors: those of dlsync_order; on failure *out is NULL and nothing was
 *   queued.
 * Threads: any number at once on one context; the handle is used by one
 *   thread at a time (end may run on another thread).
 * Capture: legal in every mode; it never breaks a capture. */
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
   * consumer once, for the dependency set it hands the producer.
   * Broken, the promise costs a capture: if the consumer began capturing in
   * between, end's wait makes the producer join that capture, so the
   * producer's later work is captured too and that capture's
   * cuStreamEndCapture fails with CUDA_ERROR_STREAM_CAPTURE_UNJOINED; if the
   * producer began capturing, end's wait on an eager event invalidates its
   * capture. Without the flag, end asks again and refuses the first case with
   * DLSYNC_ERROR_CAPTURE_ORDER and orders the second with a wait node. */
  DLSYNC_EXCHANGE_CAPTURE_STABLE = 1u << 0,
  /* Keep the edge data of the producer's capture (CUgraphEdgeData: a
   * programmatic, PDL, edge between two kernels) where the order adds no node:
   * when both lanes are streams of one capture (the SAME_CAPTURE row, at
   * begin and at end), the consumer's next node depends on the producer's
   * last nodes through edges of the type the producer's stream would give
   * its own next node. Without the flag those edges are full edges: safe,
   * but the overlap a programmatic edge allows is lost. Opt-in, for a
   * programmatic edge makes the consumer's kernel start before the
   * producer's has finished: only a consumer whose first kernel waits for
   * it (cudaGridDependencySynchronize, griddepcontrol.wait) reads correct
   * data then, which dlsync cannot know across a library boundary. Every
   * other row makes full edges whatever the flag (docs/design.md: "Edge
   * data"). It costs one cuStreamGetCaptureInfo more per SAME_CAPTURE order
   * (the producer's dependencies read again with their edge data) and takes
   * the general path. */
  DLSYNC_EXCHANGE_KEEP_EDGE_DATA = 1u << 1
} dlsync_exchange_flag;

/* Every flag of dlsync_exchange_flag. */
#define DLSYNC_EXCHANGE_FLAGS_ALL \
  ((uint32_t)DLSYNC_EXCHANGE_CAPTURE_STABLE | (uint32_t)DLSYNC_EXCHANGE_KEEP_EDGE_DATA)

/* dlsync_exchange_begin with flags (dlsync_exchange_flag bits).
 * Returns: as dlsync_exchange_begin.
 * Errors: as dlsync_exchange_begin; unknown bits are
 *   DLSYNC_ERROR_INVALID_ARGUMENT.
 * Threads, Capture: as dlsync_exchange_begin. */
DLSYNC_API dlsync_status dlsync_exchange_begin_flags(dlsync_exchange **out, dlsync_context *ctx,
                                                     dlsync_lane *producer, dlsync_lane *consumer,
                                                     uint32_t flags);

/* Many producers, one consumer: a kernel that reads several tensors. Orders
 * the consumer after each distinct producer lane of `producers[0..n)` (stream
 * lanes are the same when they name the same stream; graph lanes when they
 * are the same dlsync_lane), as dlsync_exchange_begin_flags would one by one,
 * in array order, each pair by the table with the consumer's state as it is
 * then. So a producer stream given twice costs one record and one wait;
 * several producers in one capture cost one join; a producer that already
 * shares the consumer's capture adds edges only. The matching
 * dlsync_exchange_end orders each distinct producer after the consumer's
 * work, newest first, and reports the first failure (it still ends all; a
 * driver's failure is reported before a DLSYNC_ERROR_CAPTURE_ORDER refusal).
 * Stream producers some of which are capturing and some eager are refused
 * (DLSYNC_ERROR_CAPTURE_ORDER, naming which are which, nothing queued): the
 * consumer would join the capture, and no end could order the eager
 * producers' later work after a graph that is not launched yet. Capture
 * those producers too, or order the consumer after them with dlsync_order
 * and their later work after the launch. Finding that out costs one status query per
 * distinct stream producer (n >= 2).
 * n == 1 is dlsync_exchange_begin_flags. Graph lanes are kept by pointer until
 * end, as in dlsync_exchange_begin.
 * Returns: DLSYNC_SUCCESS and *out the handle.
 * Errors: as dlsync_exchange_begin_flags; n == 0, producers == NULL with
 *   n > 0, or n > DLSYNC_EXCHANGE_MANY_MAX: DLSYNC_ERROR_INVALID_ARGUMENT.
 *   Every lane is checked before anything is queued; when a later producer
 *   fails after earlier ones were ordered, those are ordered back (as end
 *   would, so no capture is left with unjoined work) and *out is NULL.
 * Threads, Capture: as dlsync_exchange_begin. */
#define DLSYNC_EXCHANGE_MANY_MAX 1024
DLSYNC_API dlsync_status dlsync_exchange_begin_many(dlsync_exchange **out, dlsync_context *ctx,
                                                    dlsync_lane *producers, size_t n,
                                                    dlsync_lane *consumer, uint32_t flags);

/* One producer, many consumers, and the join back: a fork and its join, as
 * a graph compiler emits them (one tensor read by kernels on several
 * streams, or an FFI handler given several auxiliary streams). Orders each
 * consumer lane of `consumers[0..n)` after the work `producer` queued so
 * far, with the fewest calls, nodes and edges the table allows:
 *  - eager producer, eager consumers (EAGER_EAGER): ONE pooled event
 *    recorded on the producer, one cuStreamWaitEvent per consumer;
 *  - capturing producer, eager consumers (JOIN): the same one plain record
 *    and one wait each: each consumer joins the producer's capture (its
 *    work until end is captured and replays with the graph);
 *  - consumers in the producer's capture (SAME_CAPTURE): edges only, one
 *    cuStreamUpdateCaptureDependencies per consumer, no event;
 *  - consumers in another capture or a graph built by hand, or a producer
 *    that is a graph lane (the rows that add nodes): one record node in the
 *    producer's graph and one wait node per distinct consumer graph; further
 *    consumers in a graph that got its wait node take edges from the first
 *    consumer lane of that graph (so they also follow that lane's work
 *    before the call).
 * Stream lanes whose rows are EAGER_EAGER, JOIN or SAME_CAPTURE (up to 6
 * consumers) are asked about once each: each consumer's status query while
 * this thread's fan-outs find them eager (the producer is not asked:
 * EAGER_EAGER and JOIN make the same calls), else one full query per lane;
 * the other rows read a capturing producer again (each record node moves
 * its frontier), and an eager one again for a graph lane consumer.
 * Each consumer's row is the one dlsync_exchange_begin_flags would take
 * (the table at the top of this header), decided from the lanes as they are at the call; the
 * same lanes in the same states give the same calls, nodes and edges at
 * every call, so a recaptured step has the same topology (cuGraphExecUpdate
 * accepts it). Graph lanes get their new frontiers written back, one per
 * consumer (XLA's per-stream frontiers).
 * The matching dlsync_exchange_end is the join: it orders the producer's
 * later work after each consumer's work since begin, newest consumer first,
 * as each pair's dlsync_exchange_end would (eager: the producer's status
 * asked once, each consumer's, and per consumer a record and the
 * producer's wait; none of those queries with DLSYNC_EXCHANGE_CAPTURE_STABLE;
 * in one capture: each consumer's full query and ONE
 * cuStreamUpdateCaptureDependencies adding all their dependencies to the
 * producer's, or one per consumer past 32 nodes), and reports the first
 * failure (it still ends all; a driver's failure before a
 * DLSYNC_ERROR_CAPTURE_ORDER refusal).
 * n == 1 is dlsync_exchange_begin_flags (after the checks below). Graph
 * lanes are kept by pointer until end, as in dlsync_exchange_begin.
 * Returns: DLSYNC_SUCCESS and *out the handle for dlsync_exchange_end.
 * Errors: as dlsync_exchange_begin_flags, and DLSYNC_ERROR_INVALID_ARGUMENT,
 *   naming what was wrong, for: out or ctx NULL, n == 0, consumers NULL,
 *   n > DLSYNC_EXCHANGE_MANY_MAX, unknown flags, a consumer that is the
 *   producer, two consumers that are the same lane: the same stream (NULL
 *   and CU_STREAM_LEGACY alike), the same dlsync_lane, or graph lanes of one
 *   graph that share their frontier's array (each would write its new
 *   frontier over the other's). DLSYNC_ERROR_CAPTURE_ORDER, with nothing queued, when a
 *   consumer is an eager stream and the producer a graph built by hand.
 *   Every lane is checked and read before anything is queued; when a later
 *   consumer fails after earlier ones were ordered, those are ordered back
 *   (as end would, so no capture is left with unjoined work) and *out is
 *   NULL.
 * Threads: any number at once on one context; the handle is used by one
 *   thread at a time (end may run on another thread).
 * Capture: legal in every mode; it never breaks a capture. */
DLSYNC_API dlsync_status dlsync_exchange_begin_fanout(dlsync_exchange **out, dlsync_context *ctx,
                                                      dlsync_lane *producer, dlsync_lane *consumers,
                                                      size_t n, uint32_t flags);

/* Orders the producer's later work after the consumer's work since begin
 * (dlsync_order(ctx, consumer, producer)) and frees the handle, whatever the
 * result.
 * A failed end may leave the order undone: a consumer that joined the
 * producer's capture then stays joined, and that capture's
 * cuStreamEndCapture fails with CUDA_ERROR_STREAM_CAPTURE_UNJOINED. When a
 * driver call that queues nothing failed before anything was queued (a
 * capture query, cuStreamGetCtx, the dependency update inside one capture),
 * the message says "nothing was queued: dlsync_order(ctx, consumer,
 * producer) does what this end would have done": that call (for
 * dlsync_exchange_begin_many, one per producer; for
 * dlsync_exchange_begin_fanout, one per consumer) finishes the exchange, and
 * the capture then ends cleanly. (Never said after a begin that put a record
 * node in the producer's graph and a wait node in the consumer's: such an
 * end refuses, below.) The handle itself is ended either way (a
 * second end is DLSYNC_ERROR_INVALID_ARGUMENT).
 * Returns: DLSYNC_SUCCESS, the order in place.
 * Errors: those of dlsync_order, and:
 *   DLSYNC_ERROR_CAPTURE_ORDER when the producer is an eager stream and the
 *   consumer is capturing or a graph lane (the producer cannot wait for a
 *   graph that is not launched), and when begin placed a record node in the
 *   producer's graph and a wait node in the consumer's (another graph): the
 *   producer's graph must be launched first, so it cannot also wait for the
 *   consumer's. Nothing is queued then; order the producer after the launch
 *   instead.
 *   DLSYNC_ERROR_INVALID_ARGUMENT, with a message, for NULL, a handle ended
 *   before, a handle whose record a later begin reused, a handle whose
 *   context was destroyed, or a value that was never a handle: a handle is a
 *   record's index and generation and records are recycled, never freed, so
 *   this reads no freed memory and never ends another exchange. Not
 *   detected: a generation that wrapped (2^38 begin/end pairs on one record
 *   between the two ends).
 * Threads: any thread, one at a time per handle.
 * Capture: legal in every mode; it never breaks a capture. */
DLSYNC_API dlsync_status dlsync_exchange_end(dlsync_exchange *exchange);

#ifdef __cplusplus
}
#endif

#endif
