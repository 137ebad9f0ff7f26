/* SPDX-License-Identifier: Apache-2.0 */
/* Runs one row of the decision table N times through a libdlsync.so loaded
 * with dlopen, over the fake libcuda.so.1 (fake_libcuda.c) found on the
 * loader's path: scripts/instr-count.sh runs it under callgrind and counts
 * the instructions spent inside the library per operation. The rows are the
 * bench's (bench/bench_exchange.c): each batch of 100 operations on a fresh
 * capture or fresh graphs, which are ended and destroyed after it.
 *
 *   instr_rows LIBDLSYNC ROW N [--log]
 *
 * ROW: eager, eager-stable, in-capture, in-capture-stable, two-captures,
 * eager-to-capture, eager-to-built, two-built, capture-to-built, built-to-capture,
 * release (dlsync_release on an eager stream, a no-op deleter; the releases
 * flushed after each batch), fanout, fanout-stable, fanout-in-capture (one
 * producer, three consumers: dlsync_exchange_begin_fanout and its end; eager,
 * eager with DLSYNC_EXCHANGE_CAPTURE_STABLE, or the consumers in the
 * producer's capture, joined once per batch as in the bench).
 * --log prints the driver calls
 * of the last operation. The thread makes two eager exchanges first, as the
 * bench's thread has (its scratch event and memo are warm). */
#include <dlfcn.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda.h>

#include "dlsync/dlsync.h"

#define BATCH 100
#define FAN_N 3

typedef struct api {
  dlsync_status (*create)(dlsync_context **, const dlsync_context_config *);
  dlsync_status (*begin)(dlsync_exchange **, dlsync_context *, dlsync_lane *, dlsync_lane *,
                         uint32_t);
  dlsync_status (*end)(dlsync_exchange *);
  dlsync_status (*fanout)(dlsync_exchange **, dlsync_context *, dlsync_lane *, dlsync_lane *,
                          size_t, uint32_t);
  dlsync_status (*order)(dlsync_context *, dlsync_lane *, dlsync_lane *);
  dlsync_status (*release)(dlsync_context *, dlsync_lane *, dlsync_deleter, void *);
  dlsync_status (*flush)(dlsync_context *);
  const char *(*last_error)(void);
} api;

typedef struct drv {
  CUresult (*graph_create)(CUgraph *, unsigned);
  CUresult (*empty_node)(CUgraphNode *, CUgraph, const CUgraphNode *, size_t);
  CUresult (*graph_destroy)(CUgraph);
  CUresult (*begin_capture)(CUstream, CUstreamCaptureMode);
  CUresult (*end_capture)(CUstream, CUgraph *);
  CUresult (*record)(CUevent, CUstream);
  CUresult (*wait)(CUstream, CUevent, unsigned);
  CUresult (*event_create)(CUevent *, unsigned);
  CUresult (*retain_primary)(CUcontext *, CUdevice);
  CUresult (*push)(CUcontext);
  CUresult (*mem_alloc)(CUdeviceptr *, size_t);
  CUresult (*memset)(CUdeviceptr, unsigned, size_t, CUstream);
} drv;

typedef enum row {
  ROW_EAGER,
  ROW_EAGER_STABLE,
  ROW_IN_CAPTURE,
  ROW_IN_CAPTURE_STABLE,
  ROW_TWO_CAPTURES,
  ROW_EAGER_TO_CAPTURE,
  ROW_EAGER_TO_BUILT,
  ROW_TWO_BUILT,
  ROW_CAPTURE_TO_BUILT,
  ROW_BUILT_TO_CAPTURE,
  ROW_RELEASE,
  ROW_FANOUT,
  ROW_FANOUT_STABLE,
  ROW_FANOUT_IN_CAPTURE,
  ROW_COUNT
} row;

static const char *const row_names[ROW_COUNT] = {"eager",
                                                 "eager-stable",
                                                 "in-capture",
                                                 "in-capture-stable",
                                                 "two-captures",
                                                 "eager-to-capture",
                                                 "eager-to-built",
                                                 "two-built",
                                                 "capture-to-built",
                                                 "built-to-capture",
                                                 "release",
                                                 "fanout",
                                                 "fanout-stable",
                                                 "fanout-in-capture"};

static void noop_deleter(void *arg) {
  (void)arg;
}

static void *need(void *lib, const char *name) {
  void *p = dlsym(lib, name);
  if (p == NULL) {
    fprintf(stderr, "instr_rows: %s not found\n", name);
    exit(2);
  }
  return p;
}

static void *entry(CUresult (*gpa)(const char *, void **, int, cuuint64_t,
                                   CUdriverProcAddressQueryResult *),
                   const char *name) {
  void *p = NULL;
  if (gpa(name, &p, 13000, 0, NULL) != CUDA_SUCCESS || p == NULL) {
    fprintf(stderr, "instr_rows: the fake has no %s\n", name);
    exit(2);
  }
  return p;
}

static void check(bool ok, const char *what) {
  if (!ok) {
    fprintf(stderr, "instr_rows: %s failed\n", what);
    exit(1);
  }
}

/* One fan-out and its end: instr-count.sh collects inside this function
 * (the end of a fan-out calls dlsync_exchange_end again inside, which a
 * toggle on it would count only in part). */
__attribute__((noinline)) dlsync_status instr_fan_once(const api *a, dlsync_context *ctx,
                                                       dlsync_lane *lp, dlsync_lane *lcs,
                                                       uint32_t flags);
__attribute__((noinline)) dlsync_status instr_fan_once(const api *a, dlsync_context *ctx,
                                                       dlsync_lane *lp, dlsync_lane *lcs,
                                                       uint32_t flags) {
  dlsync_exchange *ex;
  dlsync_status st = a->fanout(&ex, ctx, lp, lcs, FAN_N, flags);
  if (st == DLSYNC_SUCCESS)
    st = a->end(ex);
  return st;
}

int main(int argc, char **argv) {
  void *lib, *cu;
  api a;
  drv d;
  CUresult (*gpa)(const char *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *);
  CUstream (*stream_create)(void);
  const char *(*call_log)(void);
  void (*call_log_reset)(void);
  dlsync_context *ctx = NULL;
  CUcontext cx = NULL;
  CUstream p, c, fc[FAN_N];
  CUevent join;
  CUdeviceptr buf;
  dlsync_lane lp, lc, lfc[FAN_N];
  row r = ROW_COUNT;
  long n;
  bool log;
  if (argc < 4) {
    fprintf(stderr, "usage: instr_rows LIBDLSYNC ROW N [--log]\n");
    return 2;
  }
  for (int i = 0; i < ROW_COUNT; i++)
    if (strcmp(argv[2], row_names[i]) == 0)
      r = (row)i;
  n = atol(argv[3]);
  log = argc > 4 && strcmp(argv[4], "--log") == 0;
  if (r == ROW_COUNT || n < BATCH) {
    fprintf(stderr, "instr_rows: unknown row %s or N < %d\n", argv[2], BATCH);
    return 2;
  }
  lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  cu = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (lib == NULL || cu == NULL) {
    fprintf(stderr, "instr_rows: %s\n", dlerror());
    return 2;
  }
  a.create = need(lib, "dlsync_context_create");
  a.begin = need(lib, "dlsync_exchange_begin_flags");
  a.end = need(lib, "dlsync_exchange_end");
  a.fanout = need(lib, "dlsync_exchange_begin_fanout");
  a.order = need(lib, "dlsync_order");
  a.release = need(lib, "dlsync_release");
  a.flush = need(lib, "dlsync_release_flush");
  a.last_error = need(lib, "dlsync_last_error");
  gpa = need(cu, "cuGetProcAddress_v2");
  stream_create = need(cu, "instr_stream_create");
  call_log = need(cu, "instr_call_log");
  call_log_reset = need(cu, "instr_call_log_reset");
  d.graph_create = entry(gpa, "cuGraphCreate");
  d.empty_node = entry(gpa, "cuGraphAddEmptyNode");
  d.graph_destroy = entry(gpa, "cuGraphDestroy");
  d.begin_capture = entry(gpa, "cuStreamBeginCapture");
  d.end_capture = entry(gpa, "cuStreamEndCapture");
  d.record = entry(gpa, "cuEventRecord");
  d.wait = entry(gpa, "cuStreamWaitEvent");
  d.event_create = entry(gpa, "cuEventCreate");
  d.retain_primary = entry(gpa, "cuDevicePrimaryCtxRetain");
  d.push = entry(gpa, "cuCtxPushCurrent");
  d.mem_alloc = entry(gpa, "cuMemAlloc");
  d.memset = entry(gpa, "cuMemsetD32Async");
  if (a.create(&ctx, NULL) != DLSYNC_SUCCESS) {
    fprintf(stderr, "instr_rows: dlsync_context_create: %s\n", a.last_error());
    return 1;
  }
  check(d.retain_primary(&cx, 0) == CUDA_SUCCESS && d.push(cx) == CUDA_SUCCESS, "current context");
  p = stream_create();
  c = stream_create();
  check(d.event_create(&join, 0) == CUDA_SUCCESS, "event");
  check(d.mem_alloc(&buf, 8) == CUDA_SUCCESS, "memory");
  lp = dlsync_lane_stream(p);
  lc = dlsync_lane_stream(c);
  for (int i = 0; i < FAN_N; i++) {
    fc[i] = stream_create();
    lfc[i] = dlsync_lane_stream(fc[i]);
  }
  for (int i = 0; i < 2; i++) { /* warm, as the bench's thread is */
    dlsync_exchange *ex;
    check(a.begin(&ex, ctx, &lp, &lc, 0) == DLSYNC_SUCCESS && a.end(ex) == DLSYNC_SUCCESS, "warm");
  }
  for (long b = 0; b < n / BATCH; b++) {
    CUgraph g1 = NULL, g2 = NULL, g;
    CUgraphNode d1[2], d2[2];
    dlsync_lane l1, l2;
    bool in_capture = r == ROW_IN_CAPTURE || r == ROW_IN_CAPTURE_STABLE;
    if (in_capture) { /* C joins P's capture once: the batch is the steady state */
      check(d.begin_capture(p, CU_STREAM_CAPTURE_MODE_GLOBAL) == CUDA_SUCCESS, "capture");
      /* a node on each stream, as in the bench: sets that are not empty */
      check(d.memset(buf, 1, 1, p) == CUDA_SUCCESS, "memset");
      check(d.record(join, p) == CUDA_SUCCESS && d.wait(c, join, 0) == CUDA_SUCCESS, "fork");
      check(d.memset(buf + 4, 2, 1, c) == CUDA_SUCCESS, "memset");
    }
    if (r == ROW_FANOUT_IN_CAPTURE) { /* the consumers join P's capture once */
      check(d.begin_capture(p, CU_STREAM_CAPTURE_MODE_GLOBAL) == CUDA_SUCCESS, "capture");
      check(d.memset(buf, 1, 1, p) == CUDA_SUCCESS, "memset");
      check(d.record(join, p) == CUDA_SUCCESS, "fork");
      for (int k = 0; k < FAN_N; k++)
        check(d.wait(fc[k], join, 0) == CUDA_SUCCESS, "fork");
    }
    if (r == ROW_TWO_CAPTURES)
      check(d.begin_capture(p, CU_STREAM_CAPTURE_MODE_RELAXED) == CUDA_SUCCESS, "capture");
    if (r == ROW_TWO_CAPTURES || r == ROW_EAGER_TO_CAPTURE)
      check(d.begin_capture(c, CU_STREAM_CAPTURE_MODE_RELAXED) == CUDA_SUCCESS, "capture");
    if (r == ROW_CAPTURE_TO_BUILT)
      check(d.begin_capture(p, CU_STREAM_CAPTURE_MODE_RELAXED) == CUDA_SUCCESS, "capture");
    if (r == ROW_BUILT_TO_CAPTURE)
      check(d.begin_capture(c, CU_STREAM_CAPTURE_MODE_RELAXED) == CUDA_SUCCESS, "capture");
    if (r == ROW_EAGER_TO_BUILT || r == ROW_TWO_BUILT || r == ROW_CAPTURE_TO_BUILT)
      check(d.graph_create(&g2, 0) == CUDA_SUCCESS && d.empty_node(&d2[0], g2, NULL, 0) == 0,
            "graph");
    if (r == ROW_TWO_BUILT || r == ROW_BUILT_TO_CAPTURE)
      check(d.graph_create(&g1, 0) == CUDA_SUCCESS && d.empty_node(&d1[0], g1, NULL, 0) == 0,
            "graph");
    l1 = dlsync_lane_graph(g1, d1, 1, 2);
    l2 = dlsync_lane_graph(g2, d2, 1, 2);
    for (int i = 0; i < BATCH; i++) {
      bool last = log && b == n / BATCH - 1 && i == BATCH - 1;
      dlsync_status st;
      if (last)
        call_log_reset();
      switch (r) {
      case ROW_TWO_BUILT:
        st = a.order(ctx, &l1, &l2);
        break;
      case ROW_EAGER_TO_BUILT:
      case ROW_CAPTURE_TO_BUILT: /* lp eager or capturing: the batch says */
        st = a.order(ctx, &lp, &l2);
        break;
      case ROW_BUILT_TO_CAPTURE:
        st = a.order(ctx, &l1, &lc);
        break;
      case ROW_TWO_CAPTURES:
      case ROW_EAGER_TO_CAPTURE:
        st = a.order(ctx, &lp, &lc);
        break;
      case ROW_RELEASE:
        st = a.release(ctx, &lp, noop_deleter, NULL);
        break;
      case ROW_FANOUT:
      case ROW_FANOUT_STABLE:
      case ROW_FANOUT_IN_CAPTURE:
        st = instr_fan_once(&a, ctx, &lp, lfc,
                            r == ROW_FANOUT_STABLE ? DLSYNC_EXCHANGE_CAPTURE_STABLE : 0);
        break;
      default: {
        dlsync_exchange *ex;
        uint32_t flags = r == ROW_EAGER_STABLE || r == ROW_IN_CAPTURE_STABLE
                             ? DLSYNC_EXCHANGE_CAPTURE_STABLE
                             : 0;
        st = a.begin(&ex, ctx, &lp, &lc, flags);
        if (st == DLSYNC_SUCCESS)
          st = a.end(ex);
      }
      }
      if (st != DLSYNC_SUCCESS) {
        fprintf(stderr, "instr_rows: %s, operation %ld: %s\n", row_names[r], b * BATCH + i,
                a.last_error());
        return 1;
      }
      if (last)
        printf("%s\n", call_log());
    }
    if (in_capture) {
      check(d.record(join, c) == CUDA_SUCCESS && d.wait(p, join, 0) == CUDA_SUCCESS, "join");
      check(d.end_capture(p, &g) == CUDA_SUCCESS && d.graph_destroy(g) == CUDA_SUCCESS, "end");
    }
    if (r == ROW_FANOUT_IN_CAPTURE) {
      for (int k = 0; k < FAN_N; k++)
        check(d.record(join, fc[k]) == CUDA_SUCCESS && d.wait(p, join, 0) == CUDA_SUCCESS, "join");
      check(d.end_capture(p, &g) == CUDA_SUCCESS && d.graph_destroy(g) == CUDA_SUCCESS, "end");
    }
    if (r == ROW_TWO_CAPTURES || r == ROW_EAGER_TO_CAPTURE || r == ROW_BUILT_TO_CAPTURE)
      check(d.end_capture(c, &g) == CUDA_SUCCESS && d.graph_destroy(g) == CUDA_SUCCESS, "end");
    if (r == ROW_TWO_CAPTURES || r == ROW_CAPTURE_TO_BUILT)
      check(d.end_capture(p, &g) == CUDA_SUCCESS && d.graph_destroy(g) == CUDA_SUCCESS, "end");
    if (r == ROW_RELEASE)
      check(a.flush(ctx) == DLSYNC_SUCCESS, "flush");
    if (g1 != NULL)
      d.graph_destroy(g1);
    if (g2 != NULL)
      d.graph_destroy(g2);
  }
  return 0;
}
