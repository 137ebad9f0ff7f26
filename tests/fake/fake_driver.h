/* SPDX-License-Identifier: Apache-2.0 */
/* dlsync tests: the fake CUDA driver.
 *
 * A small stateful model of libcuda behind a dlsync__driver table, for unit
 * tests on machines without a GPU. It models devices, primary contexts, the
 * per-thread context stack, streams, events, eager work as a happens-before
 * DAG of "ops", stream capture (join, MERGE, ISOLATION, IMPLICIT, UNJOINED,
 * UNSUPPORTED, external record/wait nodes, capture into a user's graph), graphs
 * built by hand, executables, launches, user objects and fake device memory,
 * with the rules of docs/design.md section 6 (CUDA 13.0, driver 580; R1-R13
 * below are checked on the real driver by tests/gpu/gpu_rules). Where the driver's behaviour was
 * not observed, the fake picks the loud answer and says so next to the function below.
 *
 * Ownership and threads: the fake is one process-global object (driver entry
 * points carry no user data) guarded by one mutex; every driver entry and
 * every fake_* function may be called from any thread. Per-thread state (the
 * context stack and the stream capture mode) lives in thread-local storage
 * and is forgotten by fake_reset. Call fake_reset before anything else.
 *
 * Handles: every handle (context, stream, event, graph, node, executable,
 * user object) is a small tagged integer, never a pointer; a handle of the
 * wrong kind or a destroyed one is rejected with CUDA_ERROR_INVALID_HANDLE
 * (CUDA_ERROR_INVALID_VALUE for graph nodes and user objects). Like the real
 * driver, handles of destroyed objects are reused (last freed, first reused):
 * creating a stream right after destroying one returns the same CUstream, with
 * a new cuStreamGetId. Stream and capture ids are unique for the process.
 *
 * Time: there is none. Every eager operation completes at once, so
 * synchronizations and queries succeed outside capture, and what the tests
 * check is order: fake_happens_before on op ids, fake_graph_has_path on nodes.
 *
 * Host code the driver would run on its own threads (user-object destructors,
 * cuLaunchHostFunc functions and host nodes of launched graphs) is deferred
 * by default and run by fake_run_destructors / fake_run_host_funcs, on the
 * caller's thread and outside the fake's lock.
 *
 * Test-side helpers (fake_stream_create, fake_work, ...) are not driver calls:
 * they are not logged, not counted, and fault injection never hits them.
 *
 * Rules. The capture rules the library's rows rest on, each tagged; the same
 * tag marks the branch of the fake (fake_model.c, fake_entries.c) that
 * implements it. Those checked against the real driver too
 * (tests/rules/driver_rules.c: test_driver_rules on the fake, gpu_rules on a
 * GPU) say "checked".
 *
 *   [R1 JOIN] a stream that waits (flags 0) on an event last recorded in an
 *       active capture joins that capture (same capture id). Checked.
 *   [R2 UNJOINED] ending a capture while a joined stream has work not joined
 *       back fails with CUDA_ERROR_STREAM_CAPTURE_UNJOINED. Checked.
 *   [R3 ISOLATION] a capturing stream that waits (flags 0) on an eagerly
 *       recorded event fails with ..._ISOLATION and invalidates its capture.
 *       Checked.
 *   [R4 MERGE] a capturing stream that waits (flags 0) on an event recorded in
 *       another active capture fails with ..._MERGE; both are invalidated.
 *       Checked.
 *   [R5 EXTERNAL-WAIT] CU_EVENT_WAIT_EXTERNAL during capture adds an
 *       event-wait node. Checked.
 *   [R6 EXTERNAL-RECORD] CU_EVENT_RECORD_EXTERNAL during capture adds an
 *       event-record node. Checked.
 *   [R7 EXTERNAL-OUTSIDE-CAPTURE] either external flag outside capture:
 *       CUDA_ERROR_ILLEGAL_STATE. Checked.
 *   [R8 LEGACY-QUERY] cuStreamGetCaptureInfo on the legacy stream while a
 *       blocking stream of its context captures: ..._IMPLICIT, and the
 *       capture goes on. Checked.
 *   [R9 MANUAL-APPEND] a node added by hand after a capture's dependencies
 *       and made its dependency (cuStreamUpdateCaptureDependencies, SET):
 *       the capture continues after it and ends cleanly. Checked.
 *   [R10 RECORD-NODE-WAIT] while the capture holding an event's record node
 *       is active, a plain wait on that event from an eager stream succeeds
 *       and is an ordinary eager wait: the waiter does not join the capture
 *       (the record node is not an eager record). Checked (design.md
 *       R10).
 *       A plain wait from another capture on such an event: INVALID_VALUE
 *       and that capture invalidated (not checked).
 *   [R11 STAYS-IN-CAPTURE] a stream that joined a capture leaves it only
 *       when the capture ends, with all its other streams: ending it on a
 *       stream that is not its origin (UNMATCHED), ending it with unjoined
 *       work (UNJOINED) and a clean end each leave no stream in it; a new
 *       capture never has an ended one's id. Checked (design.md R11);
 *       end's fast path relies on it (EX_ONE_CAPTURE).
 *   [R12 ADD-JOIN] inside one capture, cuStreamUpdateCaptureDependencies
 *       (ADD) of one stream's dependency set into another's gives the
 *       second stream's next node edges from both sets, as a record and a
 *       wait would (a node already there is not added again), and the same
 *       add back counts as the join for the capture's end (R2 looks at what
 *       the origin's dependencies reach). On an eager stream: ILLEGAL_STATE,
 *       nothing harmed; a node of another capture's graph: INVALID_VALUE.
 *       Checked (design.md R12; the last two cases: R14);
 *       SAME_CAPTURE relies on it.
 *   [R13 EXTERNAL-PAIR] an external record (CU_EVENT_RECORD_EXTERNAL) in one
 *       capture and an external wait (CU_EVENT_WAIT_EXTERNAL) on that event
 *       in another, active capture: both accepted, in every capture mode; an
 *       event-record node in the first graph, an event-wait node in the
 *       second, both captures end cleanly, whichever ends first. Checked
 *       (design.md R13; that the second graph waits for the first's node at
 *       launch: R16); TWO_CAPTURES relies on it.
 *   [R28 COND-BODY] a conditional node (cuGraphAddNode, IF / WHILE / SWITCH,
 *       a handle from cuGraphConditionalHandleCreate) owns its bodies
 *       (phGraph_out; cuGraphDestroy of a body: INVALID_VALUE, not
 *       observed). A capture into a body (cuStreamBeginCaptureToGraph) has
 *       the body as its graph (cuStreamGetCaptureInfo); an external wait
 *       there is accepted and the capture ends cleanly, but the parent's
 *       cuGraphInstantiate fails with INVALID_VALUE while any body, at any
 *       depth, holds a node other than kernel, empty, memset, memcpy, child
 *       graph or conditional. Checked (gpu_rules; the H200 run saw
 *       the same for EAGER_TO_CAPTURE in an IF body). dlsync's refusal of
 *       the rows that add event nodes to a declared body rests on it.
 *   [R29 COND-BODY-BY-HAND] an event-wait node added by hand
 *       (cuGraphAddEventWaitNode) to a body is accepted too, and the
 *       parent's instantiation fails: the fake's guess from R28, checked by
 *       gpu_rules; dlsync does not rely on it.
 *   [R30 COND-BODY-EDGES] in a capture into a body, a join by a plain wait
 *       and cuStreamUpdateCaptureDependencies ADD work as in any capture;
 *       the parent instantiates. Checked; JOIN and SAME_CAPTURE rely on it
 *       inside a body.
 *   [R31 EXEC-UPDATE] cuGraphExecUpdate accepts a graph whose nodes (through
 *       child graphs) have the executable's count and types, taking its
 *       events; it moves no user-object reference (the executable keeps
 *       those of its instantiation): the fake's guess, the harsher one. Not
 *       a gpu_rules rule: the GPU suite's "U recapture update" row prints
 *       what the driver does with the new graph's user objects.
 *   [R40 QUERY-IN-CAPTURE] a thread switched to the RELAXED interaction
 *       mode (cuThreadExchangeStreamCaptureMode) may call cuEventQuery of an
 *       event recorded eagerly or by an external record node while it
 *       captures in GLOBAL mode: the capture stays active, the answer is
 *       CUDA_SUCCESS (the fake's events are complete at once) or NOT_READY.
 *       Checked; dlsync_fence_import's provenance check relies on it.
 *   [R41 QUERY-CAPTURED-EVENT] a query of an event last recorded by a plain
 *       record in an active capture answers CUDA_ERROR_CAPTURED_EVENT and
 *       invalidates that capture, whatever the asking thread's mode (not
 *       counted as an illegal call: the capture's end fails). Checked;
 *       dlsync_fence_import never queries an
 *       event declared CAPTURED.
 */
#ifndef DLSYNC_TESTS_FAKE_DRIVER_H
#define DLSYNC_TESTS_FAKE_DRIVER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <cuda.h>

#include "driver/driver.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- lifecycle and the table ---------------------------------------------------------- */

/* (Re)creates the fake with `ndevices` devices (0..64), driver version 13000,
 * cuInit already done (as dlsync__driver_load leaves a real driver), every
 * primary context's refcount 0, no faults armed, empty log and counters.
 * Frees everything of the previous state. User-object destructors still
 * pending, and user objects still alive, are NOT run: a line on stderr names
 * how many were dropped. Forgets every thread's context stack and capture
 * mode (threads start with no current context, mode GLOBAL). Host work is
 * deferred again (fake_set_*_inline(false)). */
void fake_reset(int ndevices);

/* Frees everything (like fake_reset) and leaves a fake with no device that
 * answers CUDA_ERROR_NOT_INITIALIZED; for the end of a test binary. */
void fake_shutdown(void);

/* The driver table: every field of DLSYNC__DRIVER_ENTRIES set (except those
 * NULLed by fake_set_driver_version), version = the driver version, origin
 * "fake". The same static table each time; valid until the process ends. */
const dlsync__driver *fake_driver(void);

/* Emulates an older driver: entries whose pinned version (3rd argument of
 * DLSYNC__DRIVER_ENTRIES) is greater than v become NULL in the table, and
 * cuDriverGetVersion and the table's `version` report v. fake_reset restores
 * 13000. */
void fake_set_driver_version(int v);

/* Makes the fake answer CUDA_ERROR_NOT_INITIALIZED to every entry but cuInit,
 * cuDriverGetVersion and cuGetError{Name,String} until cuInit(0) is called
 * (initialized = false), or marks it initialized. */
void fake_set_initialized(bool initialized);

/* ---- fault injection and the call log --------------------------------------------------- */

/* The nth call (1-based, counted from now) of entry `symbol` ("cuStreamWaitEvent")
 * returns r and does nothing else (outputs untouched). One-shot; arming the
 * same symbol again replaces it. Aborts on an unknown symbol. */
void fake_fail_nth(const char *symbol, unsigned nth, CUresult r);

/* Every call of entry `symbol` returns r and does nothing, until cleared. */
void fake_fail_always(const char *symbol, CUresult r);

/* The nth driver call of any entry, counted from now (1 = the next call),
 * returns r and does nothing else. One-shot. To reach every failure path of an
 * operation: for n = 1, 2, ... arm fake_fail_call(n, r), run the operation,
 * and stop once it completed without reaching call n (fake_fail_pending()). */
void fake_fail_call(unsigned n, CUresult r);

/* The nth allocation dlsync makes, counted from now (1 = the next one;
 * dlsync__malloc and friends, any thread), returns NULL. One-shot. Sweep it
 * like fake_fail_call. */
void fake_fail_alloc(unsigned n);

/* What a fault sweep fails: the nth driver call (with CUDA_ERROR_UNKNOWN) or
 * the nth allocation. fake_fail_fault arms one; fake_fault_name names it for
 * messages; fake_fault_reported says whether the thread's last error is the
 * one such a fault must leave (the driver's CUDA_ERROR_UNKNOWN, or
 * DLSYNC_ERROR_OUT_OF_MEMORY). */
typedef enum fake_fault { FAKE_FAULT_CALL, FAKE_FAULT_ALLOC } fake_fault;
void fake_fail_fault(fake_fault kind, unsigned n);
const char *fake_fault_name(fake_fault kind);
bool fake_fault_reported(fake_fault kind);

/* True while a fake_fail_call, fake_fail_nth or fake_fail_alloc is armed and
 * has not fired. */
bool fake_fail_pending(void);

/* Disarms every injected fault (allocation faults too). */
void fake_fail_clear(void);

/* Driver calls since fake_reset or fake_log_reset, in all / of one entry
 * ("cuEventRecord"; 0 for an unknown name). Failed calls count. */
unsigned long fake_calls_total(void);
unsigned fake_call_count(const char *symbol);

/* Clears the call log and the call counters (not the faults, not the other
 * counters). */
void fake_log_reset(void);

/* The entries called since fake_reset / fake_log_reset, with their "cu"
 * prefix, comma-separated ("cuStreamGetCaptureInfo,cuEventRecord"); "" when
 * none. Internal buffer: valid until the next driver call or fake_log_reset.
 * Stops growing (ends with ",...") past 4 MiB. */
const char *fake_call_log(void);

/* Calls made while a capture forbade them (see "illegal during capture"
 * below): cuStreamQuery, cuStreamSynchronize, cuEventQuery, cuEventSynchronize,
 * cuCtxSynchronize, cuMemAlloc, cuMemcpyHtoD, cuMemcpyDtoH answered with
 * CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, plus synchronizations and elapsed
 * times of an event last recorded in a capture (CUDA_ERROR_CAPTURED_EVENT;
 * a query of one is not counted but invalidates its capture, R41). Reset only by
 * fake_reset; tests assert it stays 0. */
unsigned fake_illegal_calls(void);

/* Times an event still used by a record or wait node of a live graph or
 * executable was destroyed, or an executable was instantiated/launched with
 * such a node whose event no longer exists. Reset only by fake_reset. */
unsigned fake_dangling_event_uses(void);

/* ---- leak accounting (creates minus destroys) ---------------------------------------- */

unsigned fake_live_events(void);
unsigned fake_live_streams(void); /* created streams; not legacy/per-thread */
unsigned fake_live_graphs(void);  /* includes graphs of captures in progress */
unsigned fake_live_execs(void);
unsigned fake_live_user_objects(void); /* user objects whose refcount is > 0 */
unsigned fake_live_allocs(void);       /* cuMemAlloc without cuMemFree */
int fake_primary_ctx_refs(int device); /* -1 for a bad device */
unsigned fake_active_captures(void);   /* begun, not yet ended */

/* Writes a one-line summary of what is still alive or pending into buf
 * ("2 events, 1 graph, 1 pending destructor"; "" when clean) and returns the
 * number of categories not at zero (events, streams, graphs, execs, user
 * objects, allocations, primary context references, captures, pending
 * destructors, pending host functions). buf may be NULL. */
unsigned fake_leak_report(char *buf, size_t len);

/* ---- host work the driver runs on its own threads ------------------------------------ */

/* Runs the pending user-object destructors on the caller's thread, outside the
 * fake's lock, in the order their objects died; returns how many ran. */
unsigned fake_run_destructors(void);
unsigned fake_pending_destructors(void);

/* Destructors run as soon as the refcount reaches 0, on the thread that made
 * the driver call that released the last reference, after that call has left
 * the fake's lock (default false: deferred). */
void fake_set_destructors_inline(bool inline_);

/* Same for host functions: cuLaunchHostFunc on an eager stream, and host
 * nodes of a launched graph, queue (fn, userData); these run them. */
unsigned fake_run_host_funcs(void);
unsigned fake_pending_host_funcs(void);
void fake_set_host_funcs_inline(bool inline_);

/* ---- streams, events and eager work ----------------------------------------------------- */

/* A stream in device's primary context (flags: 0 or CU_STREAM_NON_BLOCKING);
 * NULL on a bad device or flags. Counts in fake_live_streams. */
CUstream fake_stream_create(int device, unsigned flags);
/* Destroys a stream made by fake_stream_create or cuStreamCreate (not a
 * driver call); does nothing while the stream is in a capture. */
void fake_stream_destroy(CUstream s);

/* An event in device's primary context; NULL on a bad device. */
CUevent fake_event_create(int device, unsigned flags);
void fake_event_destroy(CUevent e);

/* The primary context of a device (NULL for a bad device); does not retain. */
CUcontext fake_primary_ctx(int device);

/* User work (a kernel launch) on stream s, which may be NULL, CU_STREAM_LEGACY
 * or CU_STREAM_PER_THREAD (then the calling thread's current context names
 * it). Eager: an op after the stream's previous op; returns its id (> 0) and
 * *node_out = NULL. Capturing: a kernel node (CU_GRAPH_NODE_TYPE_KERNEL)
 * labelled `label` appended to the capture graph after the stream's current
 * dependencies, which become {that node}; returns 0 and *node_out = the node.
 * Under the same rules as a real launch (legacy stream during capture:
 * IMPLICIT and invalidation; invalidated capture: refused). On failure returns
 * 0 and *node_out = NULL. node_out may be NULL. */
uint64_t fake_work(CUstream s, const char *label, CUgraphNode *node_out);

/* The same, with the CUresult a launch would return. Outputs may be NULL. */
CUresult fake_work_ex(CUstream s, const char *label, uint64_t *op_out, CUgraphNode *node_out);

/* Is op a ordered before op b (b depends on a through the DAG of stream
 * order, event waits, legacy-stream synchronization and graph launches)?
 * False when a == b or either is 0 or unknown. */
bool fake_happens_before(uint64_t a, uint64_t b);

/* The last eager op issued on a stream (0: none; also 0 for a bad handle).
 * The stream may be NULL / legacy / per-thread as for fake_work. */
uint64_t fake_stream_last_op(CUstream s);

/* Event state. EAGER: op is fake_event_op. CAPTURED: plain record during a
 * capture (capture id fake_event_capture_id, no node). NODE: last recorded by
 * an event-record node appended by CU_EVENT_RECORD_EXTERNAL during capture,
 * not yet launched (a launch of an executable holding a record node for the
 * event turns it EAGER with the launch's op). */
typedef enum fake_event_state {
  FAKE_EVENT_INVALID = -1, /* not an event */
  FAKE_EVENT_NEVER = 0,
  FAKE_EVENT_EAGER = 1,
  FAKE_EVENT_CAPTURED = 2,
  FAKE_EVENT_NODE = 3
} fake_event_state;
fake_event_state fake_event_get_state(CUevent e);
uint64_t fake_event_op(CUevent e);
uint64_t fake_event_capture_id(CUevent e);

/* ---- capture and graph inspection --------------------------------------------------------- */

/* NONE / ACTIVE / INVALIDATED, for any stream handle (legacy: NONE; bad
 * handle: NONE). Never an error, never invalidates, not logged. */
CUstreamCaptureStatus fake_capture_status(CUstream s);
/* The graph the stream's capture builds (NULL when not capturing). */
CUgraph fake_capture_graph(CUstream s);
/* The stream's capture id (0 when not capturing). */
uint64_t fake_capture_id(CUstream s);
/* Copies up to max of the stream's current capture dependencies into out
 * (may be NULL) and returns how many there are. */
size_t fake_capture_deps(CUstream s, CUgraphNode *out, size_t max);

/* Nodes of graph g of a given CUgraphNodeType, or all of them with type -1. */
size_t fake_graph_count_nodes(CUgraph g, int type);
/* Number of edges of g. */
size_t fake_graph_count_edges(CUgraph g);
/* Is there a path of one or more edges from `from` to `to` in g? */
bool fake_graph_has_path(CUgraph g, CUgraphNode from, CUgraphNode to);
/* Does `to` depend directly on `from` (one edge)? */
bool fake_graph_has_edge(CUgraph g, CUgraphNode from, CUgraphNode to);
/* The event of an event-record or event-wait node (NULL otherwise). */
CUevent fake_node_event(CUgraphNode n);
/* The node's type, -1 for a bad handle. */
int fake_node_type(CUgraphNode n);
/* The label given to fake_work / fake_graph_add_work ("" when none; NULL for
 * a bad handle). Valid while the graph lives. */
const char *fake_node_label(CUgraphNode n);
/* A child-graph node's own copy of its graph (NULL for other nodes). */
CUgraph fake_node_child_graph(CUgraphNode n);
/* Is g a conditional node's body ([R28 COND-BODY])? */
bool fake_graph_is_body(CUgraph g);
/* The graph a node belongs to. */
CUgraph fake_node_graph(CUgraphNode n);

/* A kernel node added by hand to g after deps (the graph-built-by-hand lane's
 * user work); NULL on a bad graph or dependency. */
CUgraphNode fake_graph_add_work(CUgraph g, const CUgraphNode *deps, size_t ndeps,
                                const char *label);

/* Reference count of a user object (0 when it is dead or not one). */
unsigned fake_user_object_refs(CUuserObject o);

/* ---- what the driver entries do ----------------------------------------------------------
 *
 * Devices: "Fake GPU <n>", compute capability 9.0, 132 SMs, 80 GiB, PCI bus id
 * "0000:<0x10+n>:00.0"; cuDeviceCanAccessPeer is 1 between distinct devices,
 * 0 for a device with itself. cuGetErrorName/String know every CUresult of
 * cuda.h 13.0; unknown codes: CUDA_ERROR_INVALID_VALUE and *pStr = NULL.
 *
 * Contexts: one primary context per device, retained/released with a count
 * (releasing at 0: CUDA_ERROR_INVALID_CONTEXT); the context stack is per
 * thread. Stream, event and allocation calls that need a context use the
 * current one (CUDA_ERROR_INVALID_CONTEXT without).
 *
 * Streams: NULL and CU_STREAM_LEGACY name the current context's legacy
 * stream, CU_STREAM_PER_THREAD the calling thread's per-thread stream (a
 * blocking stream). Eager ops on the legacy stream wait for the last op of
 * every blocking stream of its context, and ops on blocking streams wait for
 * the legacy stream's last op. cuStreamDestroy of a stream in a capture:
 * CUDA_ERROR_NOT_SUPPORTED (not observed), nothing done.
 *
 * Stream capture (docs/design.md section 6):
 *  - Begin: new capture (id, graph, origin stream, mode, calling thread).
 *    The legacy stream: CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED; a stream
 *    already capturing: CUDA_ERROR_ILLEGAL_STATE. BeginCaptureToGraph
 *    captures into the user's graph after the given nodes (and edge data).
 *  - cuStreamGetCaptureInfo (v3): the dependency and edge-data arrays are a
 *    fresh allocation each call, freed at the next call naming that stream
 *    (so ASan catches a caller that keeps them). Non-default edge data pending
 *    and edgeData_out NULL: CUDA_ERROR_LOSSY_QUERY. On the legacy stream while
 *    a blocking stream of its context captures: CUDA_ERROR_STREAM_CAPTURE_IMPLICIT,
 *    nothing invalidated (cuStreamIsCapturing likewise). id_out is set for
 *    ACTIVE and INVALIDATED.
 *  - Work, records and waits on the legacy stream while a blocking stream of
 *    its context captures: IMPLICIT, and those captures are invalidated.
 *  - Work on a stream of an invalidated capture: CUDA_ERROR_STREAM_CAPTURE_INVALIDATED.
 *  - Plain record on a capturing stream: the event is CAPTURED with the
 *    stream's current dependencies, no node. Plain wait:
 *      eager stream, event CAPTURED by an active capture: the stream joins it
 *        (same id, dependencies = the event's nodes), nothing added; the
 *        capture invalidated: CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, no join;
 *      eager stream, event CAPTURED by a capture that has ended, or NODE of an
 *        ended capture: an op that orders nothing more (not observed for the
 *        CAPTURED case);
 *      capturing stream, same capture: dependencies |= the event's nodes;
 *      capturing stream, another active capture: MERGE, both invalidated;
 *      capturing stream, event eager, never recorded, or of an ended capture:
 *        ISOLATION, invalidated (never-recorded/ended: not observed, loud);
 *      capturing stream, event NODE of a capture still active: INVALID_VALUE,
 *        the waiter's capture invalidated (not checked); eager stream: R10.
 *  - CU_EVENT_RECORD_EXTERNAL: capturing: an event-record node appended, the
 *    event becomes NODE; eager: CUDA_ERROR_ILLEGAL_STATE.
 *    An external record during capture takes an event of another context
 *    too (design.md R15); a plain or eager record
 *    refuses it (INVALID_HANDLE).
 *    CU_EVENT_WAIT_EXTERNAL: capturing: an event-wait node appended, also
 *    for an event NODE of another capture still active (R13); eager:
 *    CUDA_ERROR_ILLEGAL_STATE.
 *  - Illegal during capture (cuStreamQuery, cuStreamSynchronize, cuEventQuery,
 *    cuEventSynchronize, cuCtxSynchronize, cuMemAlloc, cuMemcpyHtoD,
 *    cuMemcpyDtoH), following cuThreadExchangeStreamCaptureMode's rules: a
 *    thread in GLOBAL mode (the default) is prohibited while it has a capture
 *    begun in GLOBAL or THREAD_LOCAL mode, or any other thread has one begun
 *    in GLOBAL mode; a THREAD_LOCAL thread only by its own non-RELAXED
 *    captures; a RELAXED thread never. Prohibited: CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED,
 *    the captures concerned invalidated, fake_illegal_calls() + 1.
 *    Independently of modes, synchronizing or querying a capturing stream
 *    (or cuCtxSynchronize with one in the context) is UNSUPPORTED and
 *    invalidates it, and cuEventQuery/cuEventSynchronize/cuEventElapsedTime
 *    of a CAPTURED event give CUDA_ERROR_CAPTURED_EVENT; both count too,
 *    except that query, which invalidates the event's capture (R41).
 *  - cuStreamUpdateCaptureDependencies: ADD (duplicates merged) or SET; nodes
 *    not in the capture graph: CUDA_ERROR_INVALID_VALUE.
 *  - End: not capturing: ILLEGAL_STATE; not the origin: UNMATCHED; begun in
 *    GLOBAL/THREAD_LOCAL mode by another thread: WRONG_THREAD (not observed);
 *    invalidated: INVALIDATED; a joined stream whose dependencies are not all
 *    ancestors-or-equal of the origin's: UNJOINED. In every case the capture
 *    ends: all its streams return to NONE, and the graph is freed when none
 *    is returned (*phGraph = NULL) unless it is the user's (ToGraph).
 *
 * Graphs: nodes of other graphs as dependencies, duplicated dependencies, or
 * an existing edge added again: CUDA_ERROR_INVALID_VALUE. cuGraphAddNode
 * supports EMPTY, EVENT_RECORD, WAIT_EVENT, MEMSET, MEMCPY, HOST and
 * CONDITIONAL params (others: CUDA_ERROR_NOT_SUPPORTED; conditional
 * bodies: R28). cuGraphAddChildGraphNode copies the child (nodes, edges,
 * events); a child holding conditional nodes: INVALID_VALUE (cuda.h); an
 * executable runs a child's event and host nodes as its own. cuGraphGetNodes/GetEdges follow the
 * driver's "NULL array: count only" convention (GetEdges without edge data
 * while an edge has some: CUDA_ERROR_LOSSY_QUERY). Destroying or instantiating
 * a graph that an active capture builds: CUDA_ERROR_ILLEGAL_STATE (not observed).
 * cuGraphLaunch: one eager op on the stream, after the stream's previous op and,
 * for each event-wait node, after the op of that event's last eager record at
 * launch time; afterwards each record node's event is EAGER with this op; host
 * nodes queue their function. Launching on a capturing stream:
 * CUDA_ERROR_NOT_SUPPORTED (not modelled).
 *
 * User objects: flags must be CU_USER_OBJECT_NO_DESTRUCTOR_SYNC, initial
 * count and release count > 0, releasing more than held: INVALID_VALUE. A
 * graph's references are released when it is destroyed (or when a capture
 * that built it fails); an executable takes references to every user object
 * of its graph at instantiation and releases them at cuGraphExecDestroy.
 *
 * Memory: fake device pointers (no contents; device-to-host copies write
 * zeros); async memsets and copies are ops or captured MEMSET/MEMCPY nodes and
 * must stay inside live allocations (else INVALID_VALUE); cuMemcpyHtoD/DtoH
 * are illegal during capture and otherwise ops on the legacy stream.
 * Synchronizations and queries succeed at once outside capture;
 * cuEventElapsedTime gives 0 (INVALID_HANDLE for DISABLE_TIMING or
 * never-recorded events).
 */

#ifdef __cplusplus
}
#endif

#endif
