/* SPDX-License-Identifier: Apache-2.0 */
/* dlsync private, order/ only: what the exchange's files share.
 *
 *   exchange.c  the entry points: dlsync_order, dlsync_exchange_begin(_flags,
 *               _many), dlsync_exchange_end
 *   fast.h      the fast path's inline part (inlined into each entry point)
 *   fast.c      the fast path's steps out of line (a lane that captures)
 *   rows.h      the decision table's rows, one function each (inline, so that
 *               every path carries a row out without a call of its own)
 *   rows.c      the rows' cold parts: failures, refusals, the decision log
 *   general.c   the general path: lanes checked and opened, the row
 *               classified and carried out
 *   handles.c   exchange records and their handles
 *
 * Every path reaches a row through its function in rows.h: the fast path
 * with what it has read already, the general path and the graph lanes' path
 * through dlsync__order_row. */
#ifndef DLSYNC_ORDER_EXCHANGE_INT_H
#define DLSYNC_ORDER_EXCHANGE_INT_H

#include "order/order.h"
#include "order/table.h"

/* The two lanes' names in messages ("producer", "consumer", ...). A row's
 * failure messages take them beside the streams: a pointer to constant names
 * on the fast path, which the compiler keeps out of the way of success. */
typedef struct dlsync__roles {
  const char *first, *then;
} dlsync__roles;

/* Two streams being ordered (`then` after `first`): what the fast path has
 * before it writes any lane, and what a row's driver calls need. Two
 * pointers, passed by value in registers. */
typedef struct dlsync__pair {
  CUstream first, then;
} dlsync__pair;

static inline dlsync__pair dlsync__pair_of(const dlsync__lane_now *first,
                                           const dlsync__lane_now *then) {
  dlsync__pair p;
  p.first = first->stream;
  p.then = then->stream;
  return p;
}

static inline dlsync__roles dlsync__roles_of_lanes(const dlsync__lane_now *first,
                                                   const dlsync__lane_now *then) {
  dlsync__roles r;
  r.first = first->role;
  r.then = then->role;
  return r;
}

/* The two lanes' names for each operation. */
static inline const dlsync__roles *dlsync__roles_of(dlsync__op op) {
  static const dlsync__roles roles[] = {
      {"first", "then"},        /* DLSYNC__OP_ORDER */
      {"producer", "consumer"}, /* DLSYNC__OP_BEGIN */
      {"consumer", "producer"}, /* DLSYNC__OP_END: then (the producer) after first */
  };
  return &roles[op <= DLSYNC__OP_END ? op : DLSYNC__OP_ORDER];
}

/* The most consumers a fan-out's one record holds (EX_FAN): they take the
 * place of the wheres, which only EX_CROSS uses. */
#define EX_FAN_MAX 6

/* An exchange record. Records are not freed (until the unload): they are recycled, and the
 * handle given out names a record and its generation (see "Handles" below),
 * so a handle used after its end is recognised, never a touch of freed
 * memory and never the end of another exchange. */
struct dlsync_exchange {
  /* What begin's and end's fast paths touch: the first 64 bytes (a record
   * is 128 bytes, records are 64-byte aligned: one cache line). */
  /* The record's handle: its generation above its index (EX_INDEX_BITS),
   * odd while begun, even while free. */
  _Alignas(64) atomic_uint_fast64_t handle;
  _Atomic(dlsync_context *) ctx; /* atomic: read by the scan at context destroy */
  CUstream producer_stream;      /* stream lanes */
  CUstream consumer_stream;
  dlsync_lane *producer_ref; /* graph lanes: the caller's (EX_REFS) */
  dlsync_lane *consumer_ref;
  union {
    /* dlsync_exchange_begin_many: the exchanges of the distinct producers,
     * in begin order (EX_MANY). */
    dlsync_exchange **many;
    /* The capture begin found both streams in (EX_ONE_CAPTURE; for EX_FAN,
     * the producer and every consumer). */
    uint64_t capture_id;
  };
  uint8_t bits; /* EX_*: what end must do; one load on the fast path */
  uint32_t index;
  /* The rest. */
  struct dlsync_exchange *next_free;
  size_t nmany; /* EX_MANY: many's length; EX_FAN: fan's */
  union {
    struct {
      dlsync__where producer_where; /* EX_CROSS: where begin found each lane */
      dlsync__where consumer_where;
    };
    /* EX_FAN: the consumers' streams, in the caller's order (nmany). */
    CUstream fan[EX_FAN_MAX];
  };
};

_Static_assert(sizeof(struct dlsync_exchange) == 128, "an exchange record is two cache lines");

/* An exchange's bits. None of EX_SAME, EX_MANY and EX_REFS: two stream
 * lanes, which end's fast path orders; the fields named after a bit are
 * valid only while it is set, so begin's fast path writes the streams and
 * one byte. */
enum {
  EX_STABLE = 1, /* end may trust what begin found (DLSYNC_EXCHANGE_CAPTURE_STABLE) */
  EX_SAME = 2,   /* one stream: nothing to do at end */
  EX_MANY = 4,   /* dlsync_exchange_begin_many: many, nmany */
  EX_REFS = 8,   /* a graph lane: producer_ref, consumer_ref (either may be NULL) */
  EX_CROSS = 16, /* begin added a record node and a wait node: the wheres */
  /* Begin found both streams in one capture (or made the consumer join
   * the producer's), capture_id: end asks the consumer alone. While the
   * consumer is in that capture, so is the producer: a stream leaves a
   * capture only when the capture ends, with all its streams, and capture
   * ids are never reused (design.md R11). */
  EX_ONE_CAPTURE = 32,
  /* DLSYNC_EXCHANGE_KEEP_EDGE_DATA: end takes the general path, whose
   * SAME_CAPTURE row keeps the consumer's edge data. */
  EX_KEEP_EDGES = 64,
  /* dlsync_exchange_begin_fanout with stream lanes alone, each consumer's
   * row plain (EAGER_EAGER, JOIN, SAME_CAPTURE): one record for all,
   * producer_stream and fan[0..nmany); EX_STABLE as for one pair;
   * EX_ONE_CAPTURE when begin found the producer capturing (every consumer
   * in its capture, or joining it: then capture_id). Its end asks the
   * driver about the producer once at most. */
  EX_FAN = 128,
};

/* The pool to take an event from, as dlsync__lanes_open found it: the
 * context of the first stream lane, or the calling thread's current context
 * when both lanes are graphs (none for one graph). */
typedef struct pool_pick {
  dlsync__pool *pool;
  bool from_memo;  /* not checked against the driver yet */
  CUstream stream; /* the stream whose context it is, if any */
  const char *role;
  dlsync__thread *t; /* the calling thread's block, NULL: not looked up yet */
} pool_pick;

static DLSYNC__INLINE dlsync__thread *pick_thread(pool_pick *pk) {
  if (DLSYNC__UNLIKELY(pk->t == NULL))
    pk->t = dlsync__thread_get();
  return pk->t;
}

/* ---- the fast path (fast.h, fast.c) ---- */

typedef enum fast_query {
  FAST_QUERY_NONE,
  FAST_QUERY_THEN,
  FAST_QUERY_THEN_FULL,
  FAST_QUERY_BOTH,
  FAST_QUERY_BOTH_EAGER,
  FAST_QUERY_FIRST_IN /* FAST_QUERY_BOTH after EX_ONE_CAPTURE: `first` in that capture is enough */
} fast_query;

/* What the fast path of dlsync_order and begin has and has read (an end has
 * only the streams: none). `first`, `then`: the caller's lanes; `op`:
 * the call (their names in messages); `have`: both lanes read into `opened` (what FAST_QUERY_THEN
 * read when `then` was capturing, handed to the general path, which reads neither again). */
typedef struct fast_pre {
  dlsync_lane *first, *then;
  /* The op (its lanes' names: pre_roles; dlsync_order: the graph rows of
   * two streams go on here). An op, not a pointer to the names: one store
   * beside `have` on the fast path, the names looked up on failure only. */
  dlsync__op op;
  bool have;
  /* begin's record (else NULL): both streams in one capture
   * (SAME_CAPTURE) mark it EX_ONE_CAPTURE, with the id. */
  struct dlsync_exchange *ex;
  dlsync__lanes_opened opened; /* .a: first, .b: then */
} fast_pre;

/* The names of a fast_pre's lanes in messages. */
static inline const dlsync__roles *pre_roles(const fast_pre *pre) {
  return dlsync__roles_of(pre->op);
}

/* order_fast's answer when it did not carry the order out: the general path
 * must (nothing was queued). Never a status of the API. */
#define DLSYNC__GENERAL ((dlsync_status)-1)

/* What the fast path's out-of-line steps say. */
typedef enum fast_next {
  FAST_GO,      /* plain: record and wait */
  FAST_DONE,    /* *st says how it went (a failed query, or SAME_CAPTURE's update) */
  FAST_GENERAL, /* the general path must (nothing queued) */
} fast_next;

/* ---- handles (handles.c) ----
 *
 * Exchange records live in chunks that are never freed while the library
 * is loaded (recycled; the unload frees them), found by index. A handle is the record's index and
 * its generation (modulo 2^40), packed into the pointer value, and the
 * record keeps the handle of its last begin; end checks it with one
 * compare-and-swap, so a second end, or an end after the record was reused
 * by a later begin, is DLSYNC_ERROR_INVALID_ARGUMENT.
 * Each thread keeps one free record (no lock on the usual begin/end pair); an
 * end on another thread gives the record to that thread, or to the shared
 * free list; a thread's record goes back to the list when the thread exits. */
#define EX_INDEX_BITS 24
#define EX_CHUNK 1024u
#define EX_CHUNKS ((1u << EX_INDEX_BITS) / EX_CHUNK)
#define EX_GEN_ONE (UINT64_C(1) << EX_INDEX_BITS) /* the generation's lowest bit */

_Static_assert(sizeof(uintptr_t) == 8,
               "exchange handles pack an index and a generation in 64 bits");

extern DLSYNC__HIDDEN _Atomic(dlsync_exchange *) dlsync__ex_chunks[EX_CHUNKS];

/* A free record from the shared list or a new one; NULL when out of memory
 * or out of records. */
dlsync_exchange *dlsync__exchange_make(void);
/* Back to the thread's slot (keyed for its exit) or the shared list. */
DLSYNC__NOINLINE void dlsync__exchange_free_slow(dlsync__thread *t, dlsync_exchange *ex);
/* DLSYNC_ERROR_INVALID_ARGUMENT for a handle that is not begun (cold). */
DLSYNC__COLD dlsync_exchange *dlsync__exchange_refused(dlsync_exchange *handle, dlsync_status *st);

static DLSYNC__INLINE dlsync_exchange *exchange_alloc(dlsync__thread *t) {
  if (DLSYNC__LIKELY(dlsync__order_thread_of(t)->spare != NULL)) {
    dlsync_exchange *ex = dlsync__order_thread_of(t)->spare;
    dlsync__order_thread_of(t)->spare = NULL;
    return ex;
  }
  return dlsync__exchange_make();
}

/* Back to the thread's slot or the shared list; ex's generation is even. */
static DLSYNC__INLINE void exchange_free(dlsync__thread *t, dlsync_exchange *ex) {
  if (ex == NULL)
    return;
  if (DLSYNC__LIKELY(dlsync__order_thread_of(t)->spare == NULL &&
                     dlsync__order_thread_of(t)->spare_keyed)) {
    dlsync__order_thread_of(t)->spare = ex;
    return;
  }
  dlsync__exchange_free_slow(t, ex);
}

/* A begun record: fields set, then the generation made odd; the handle.
 * The generation is odd, so a handle is never NULL; it counts in the bits
 * above the index and wraps into them without touching the index. */
static DLSYNC__INLINE dlsync_exchange *exchange_publish(dlsync_exchange *ex, dlsync_context *ctx) {
  uint64_t h = atomic_load_explicit(&ex->handle, memory_order_relaxed) + EX_GEN_ONE;
  atomic_store_explicit(&ex->ctx, ctx, memory_order_relaxed);
  atomic_store_explicit(&ex->handle, h, memory_order_release);
  return (dlsync_exchange *)(uintptr_t)h;
}

/* The record a handle names, ended (its generation made even) by this call;
 * NULL with DLSYNC_ERROR_INVALID_ARGUMENT in *st (set only then) when it is
 * not a begun exchange.
 * Any index a handle holds is in range (EX_INDEX_BITS); an even generation
 * (NULL among them) is never begun; a record of a chunk that was made but
 * not handed out yet is at generation 0. The compare-and-swap is the whole
 * check: the record's handle must be this one (so begun, by this handle's
 * begin, and not ended since), and one end alone moves it on. */
static DLSYNC__INLINE dlsync_exchange *exchange_claim(dlsync_exchange *handle, dlsync_status *st) {
  uint64_t h = (uint64_t)(uintptr_t)handle;
  uint64_t idx = h & (EX_GEN_ONE - 1);
  dlsync_exchange *chunk, *ex;
  if (DLSYNC__UNLIKELY((h & EX_GEN_ONE) == 0))
    return dlsync__exchange_refused(handle, st);
  chunk = atomic_load_explicit(&dlsync__ex_chunks[idx / EX_CHUNK], memory_order_acquire);
  if (DLSYNC__UNLIKELY(chunk == NULL))
    return dlsync__exchange_refused(handle, st);
  ex = &chunk[idx % EX_CHUNK];
  if (DLSYNC__UNLIKELY(!atomic_compare_exchange_strong_explicit(
          &ex->handle, &h, h + EX_GEN_ONE, memory_order_acq_rel, memory_order_relaxed)))
    return dlsync__exchange_refused(handle, st);
  return ex; /* *st is left alone: its caller reads it only after a NULL */
}

/* ---- the general path (general.c) ---- */

/* What one classification and its row were asked and gave. */
typedef struct dlsync__order_step {
  dlsync__op op;
  /* OP_END: begin put a record node in the producer's graph and a wait node
   * in the consumer's, and both lanes are still where begin found them. */
  bool first_pending;
  /* SAME_CAPTURE hands first's edge data on to then's dependencies
   * (DLSYNC_EXCHANGE_KEEP_EDGE_DATA); false: full edges. */
  bool keep_edges;
  dlsync__row row; /* out: the row carried out */
} dlsync__order_step;

/* Checks both lanes and reads their states (their names in messages from
 * the op: dlsync__roles_of). opened->same: they are one stream (the table's
 * SAME_STREAM row: nothing to do). `read`: the fast path has read both into
 * opened->a and ->b already (not read again). */
dlsync_status dlsync__order_lanes(dlsync_context *ctx, dlsync__op op, dlsync_lane *first,
                                  dlsync_lane *then, dlsync__lanes_opened *opened);
/* The pool order_row takes an event from, as order_lanes found it. */
static inline pool_pick dlsync__pick_of(const dlsync__lanes_opened *opened) {
  pool_pick pk;
  pk.pool = opened->pool;
  pk.from_memo = opened->from_memo;
  pk.stream = opened->pool_stream;
  pk.role = opened->pool_role;
  pk.t = NULL;
  return pk;
}
/* The table: classify, then carry out the row (rows.h). */
DLSYNC__NOINLINE dlsync_status dlsync__order_row(dlsync_context *ctx, dlsync__order_step *step,
                                                 pool_pick *pk, dlsync__lane_now *first,
                                                 dlsync__lane_now *then);
/* dlsync_order with a graph built by hand on either side, for a thread
 * whose memo knows the stream lane's pool: how it went, or DLSYNC__GENERAL,
 * nothing done, when the general path must (a status returned, not an out
 * parameter, as order_fast does: no store and load of it in memory). */
DLSYNC__NOINLINE dlsync_status dlsync__order_graph_fast(dlsync_context *ctx, dlsync__thread *t,
                                                        dlsync_lane *first, dlsync_lane *then);

/* ---- the fast path's steps out of line (fast.c) ---- */

/* FAST_QUERY_THEN with `then` capturing, or FAST_QUERY_THEN_FULL. */
DLSYNC__NOINLINE fast_next dlsync__fast_then_queries(dlsync__thread *t, dlsync_context *ctx,
                                                     fast_pre *pre, dlsync_status *st);
/* An end's queries: FAST_QUERY_BOTH (and FAST_QUERY_BOTH_EAGER with
 * `first`, the consumer, capturing), and FAST_QUERY_FIRST_IN. */
DLSYNC__NOINLINE fast_next dlsync__fast_both_queries(dlsync__thread *t, const dlsync__driver *d,
                                                     CUstream first, CUstream then,
                                                     dlsync_status *st);
DLSYNC__NOINLINE fast_next dlsync__fast_first_in_queries(dlsync__thread *t, const dlsync__driver *d,
                                                         CUstream first, CUstream then,
                                                         dlsync_status *st);
/* A failed status or capture query of `s` (cold). */
DLSYNC__COLD dlsync_status dlsync__fast_query_failed(const dlsync__driver *d, CUresult r, bool full,
                                                     CUstream s, const char *role);
/* A failed record of the fast path: false when the general path must (a
 * stream handle reused in another context), else true with *st (cold). */
DLSYNC__COLD bool dlsync__fast_record_failed(dlsync_context *ctx, CUresult r, CUstream first,
                                             const char *first_role, dlsync_status *st);

/* ---- what exchange.c's entry points and fanout.c share ---- */

/* A caller's lane that is a plain stream (not a graph lane). */
static inline bool dlsync__plain_stream_lane(const dlsync_lane *l) {
  return l != NULL && l->kind == DLSYNC_LANE_STREAM && l->graph == NULL;
}
/* Two producers that are one: the same stream (legacy handles alike), or
 * the same dlsync_lane. */
static inline bool dlsync__same_producer(const dlsync_lane *a, const dlsync_lane *b) {
  if (a->kind == DLSYNC_LANE_STREAM && b->kind == DLSYNC_LANE_STREAM)
    return dlsync__same_stream(a->stream, b->stream);
  return a == b;
}
/* DLSYNC_ERROR_INVALID_ARGUMENT naming fn for flag bits it does not know. */
DLSYNC__COLD dlsync_status dlsync__refuse_flags_slow(const char *fn, uint32_t flags);
static inline dlsync_status dlsync__refuse_flags(const char *fn, uint32_t flags) {
  if (DLSYNC__LIKELY((flags & ~DLSYNC_EXCHANGE_FLAGS_ALL) == 0))
    return DLSYNC_SUCCESS;
  return dlsync__refuse_flags_slow(fn, flags);
}

/* The two sides of a begun exchange: the producer and consumer lanes the
 * caller gave, and p, c: as read. */
typedef struct exchange_sides {
  dlsync_lane *producer, *consumer;
  const dlsync__lane_now *p, *c;
} exchange_sides;
/* A begun exchange's record, as begin found the lanes and carried out the
 * row. */
void dlsync__exchange_fill(dlsync_exchange *ex, const exchange_sides *sides, dlsync__row row,
                           uint32_t flags);

/* A failure kept aside while more calls are made: status, message and the
 * driver's result, set again as the thread's last error by
 * dlsync__kept_restore. */
typedef struct kept_error {
  dlsync_status status;
  int driver_result;
  char msg[512];
} kept_error;
void dlsync__kept_save(kept_error *k, dlsync_status st);
dlsync_status dlsync__kept_restore(const kept_error *k);
/* st kept in *first when it is the first failure, or the first other than
 * a refusal (DLSYNC_ERROR_CAPTURE_ORDER): a failure of the driver's goes
 * before a refusal (the caller must see it: a refusal only says what cannot
 * be ordered). */
static inline void dlsync__keep_first(kept_error *first, dlsync_status st) {
  if (st != DLSYNC_SUCCESS &&
      (first->status == DLSYNC_SUCCESS ||
       (first->status == DLSYNC_ERROR_CAPTURE_ORDER && st != DLSYNC_ERROR_CAPTURE_ORDER)))
    dlsync__kept_save(first, st);
}
/* Ends parts[0..n) newest first; the first failure kept as keep_first does. */
dlsync_status dlsync__end_parts(dlsync_exchange **parts, size_t n);
/* An end's failure (st) of a record with `bits`, its message saying what to
 * do where nothing was queued (cold). */
DLSYNC__NOINLINE dlsync_status dlsync__end_failed(dlsync_status st, unsigned bits);
/* An end's order of consumer before producer, read in full (the general
 * path). */
dlsync_status dlsync__end_lanes(dlsync_context *ctx, dlsync_lane *consumer, dlsync_lane *producer,
                                unsigned bits, const dlsync_exchange *ex);
/* The end of an EX_FAN record (fanout.c): the streams taken, the record
 * freed, the consumers joined back. */
DLSYNC__NOINLINE dlsync_status dlsync__end_fan(dlsync__thread *t, dlsync_exchange *ex,
                                               dlsync_context *ctx);

#endif
