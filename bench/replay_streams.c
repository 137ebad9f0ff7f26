/* SPDX-License-Identifier: Apache-2.0 */
/* How many streams a captured graph's work runs on at replay, and its replay
 * time: a model-shaped capture (LAYERS layers; per layer the main stream's
 * work, then an exchange with a side stream: the side's work after the
 * layer's, the main stream's next work after the side's), issued in two
 * orders (side work before the main stream's second half of the layer, or
 * after it), ordered by dlsync and by hand.
 *
 *   dlsync            dlsync_exchange_begin(main -> side) / _end per layer
 *   by hand, 1 side   event record / wait fork and join on one side stream
 *   by hand, N sides  the same with a side stream of its own per layer
 *   by hand, late     forks per layer, every join deferred to the end (the
 *                     side work of all layers may run at once: a weaker
 *                     order, the widest graph a hand-written order makes)
 *
 * The streams are counted with CUPTI's activity records (each memset's and
 * kernel's streamId) by tools/cupti_streams.c, which dlsync.testing uses
 * too: libcupti loaded with dlopen (DLSYNC_CUPTI_LIB, else libcupti.so from
 * the loader's path or the CUDA toolkit's usual folders); the replay time is the median of ROUNDS
 * rounds of REPLAYS launches timed with events, CUPTI off. Without libcupti (or where CUPTI
 * refuses, another profiler attached) the stream counts read -1. Exits 77 without a GPU. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../tests/gpu/gpu_common.h"
#include "../tools/cupti_streams.h"
#include "bench_util.h"

#define LAYERS 64
#define WORDS ((size_t)1 << 16) /* 256 KiB per memset */
#define CUPTI_REPLAYS 5
#define REPLAYS 50
#define ROUNDS 7

static gpu_env E;
static const dlsync__driver *D;
static CUdeviceptr buf;

/* ---- the streams, counted by tools/cupti_streams.c ---- */

static bool have_cupti;

/* ---- the model ---- */

typedef enum variant { V_DLSYNC, V_ONE_SIDE, V_SIDES, V_LATE, V_COUNT } variant;
static const char *const variant_name[V_COUNT] = {"dlsync", "by hand, 1 side", "by hand, N sides",
                                                  "by hand, late joins"};

static CUstream main_s, sides[LAYERS];
static CUevent forks[LAYERS], joins[LAYERS];

static void work(CUstream s, int layer, int part) {
  CHECK(D->MemsetD32Async(buf + (CUdeviceptr)((layer * 3 + part) % 8) * WORDS * 4, (unsigned)layer,
                          WORDS, s) == CUDA_SUCCESS,
        "memset");
}

/* One layer's second half on main and the side's work, in `side_first`
 * order. */
static void halves(CUstream side, int layer, bool side_first) {
  if (side_first) {
    work(side, layer, 1);
    work(main_s, layer, 2);
  } else {
    work(main_s, layer, 2);
    work(side, layer, 1);
  }
}

static CUgraph capture(variant v, bool side_first) {
  CUgraph g = NULL;
  dlsync_lane lm = dlsync_lane_stream(main_s);
  CHECK(D->StreamBeginCapture(main_s, CU_STREAM_CAPTURE_MODE_RELAXED) == CUDA_SUCCESS, "begin");
  for (int i = 0; i < LAYERS; i++) {
    CUstream side = v == V_ONE_SIDE || v == V_DLSYNC ? sides[0] : sides[i];
    work(main_s, i, 0);
    if (v == V_DLSYNC) {
      dlsync_lane ls = dlsync_lane_stream(side);
      dlsync_exchange *ex = NULL;
      CHECK(dlsync_exchange_begin(&ex, E.ctx, &lm, &ls) == DLSYNC_SUCCESS, "exchange_begin");
      halves(side, i, side_first);
      CHECK(dlsync_exchange_end(ex) == DLSYNC_SUCCESS, "exchange_end");
      continue;
    }
    CHECK(D->EventRecord(forks[i], main_s) == CUDA_SUCCESS, "fork record");
    CHECK(D->StreamWaitEvent(side, forks[i], 0) == CUDA_SUCCESS, "fork wait");
    halves(side, i, side_first);
    CHECK(D->EventRecord(joins[i], side) == CUDA_SUCCESS, "join record");
    if (v != V_LATE)
      CHECK(D->StreamWaitEvent(main_s, joins[i], 0) == CUDA_SUCCESS, "join wait");
  }
  if (v == V_LATE)
    for (int i = 0; i < LAYERS; i++)
      CHECK(D->StreamWaitEvent(main_s, joins[i], 0) == CUDA_SUCCESS, "late join");
  CHECK(D->StreamEndCapture(main_s, &g) == CUDA_SUCCESS && g != NULL, "end capture");
  return g;
}

typedef struct result {
  int streams, records;
  double replay_us;
  size_t nodes, edges;
} result;

static result measure(CUgraph g, CUstream launch) {
  char why[256];
  result res;
  CUgraphExec x = NULL;
  CUevent t0 = NULL, t1 = NULL;
  double times[ROUNDS];
  res.nodes = 0;
  res.edges = 0;
  CHECK(D->GraphGetNodes(g, NULL, &res.nodes) == CUDA_SUCCESS, "graph nodes");
  CHECK(D->GraphGetEdges(g, NULL, NULL, NULL, &res.edges) == CUDA_SUCCESS, "graph edges");
  CHECK(D->GraphInstantiateWithFlags(&x, g, 0) == CUDA_SUCCESS, "instantiate");
  CHECK(D->EventCreate(&t0, 0) == CUDA_SUCCESS && D->EventCreate(&t1, 0) == CUDA_SUCCESS,
        "timing events");
  for (int i = 0; i < 3; i++)
    CHECK(D->GraphLaunch(x, launch) == CUDA_SUCCESS, "warm-up launch");
  CHECK(D->StreamSynchronize(launch) == CUDA_SUCCESS, "sync");
  /* Streams: CUPTI on for CUPTI_REPLAYS launches (-1: CUPTI refused). */
  res.streams = -1;
  res.records = -1;
  if (have_cupti && dlsync_cupti_streams_start(why, sizeof why) != 0) {
    printf("(%s: no stream counts)\n", why);
    have_cupti = false;
  }
  if (have_cupti) {
    for (int i = 0; i < CUPTI_REPLAYS; i++)
      CHECK(D->GraphLaunch(x, launch) == CUDA_SUCCESS, "launch");
    CHECK(D->StreamSynchronize(launch) == CUDA_SUCCESS, "sync");
    CHECK(dlsync_cupti_streams_stop(&res.streams, &res.records, why, sizeof why) == 0, why);
  }
  /* Time: CUPTI off. */
  for (int r = 0; r < ROUNDS; r++) {
    float ms = 0;
    CHECK(D->EventRecord(t0, launch) == CUDA_SUCCESS, "t0");
    for (int i = 0; i < REPLAYS; i++)
      CHECK(D->GraphLaunch(x, launch) == CUDA_SUCCESS, "launch");
    CHECK(D->EventRecord(t1, launch) == CUDA_SUCCESS, "t1");
    CHECK(D->EventSynchronize(t1) == CUDA_SUCCESS, "sync t1");
    CHECK(D->EventElapsedTime(&ms, t0, t1) == CUDA_SUCCESS, "elapsed");
    times[r] = (double)ms * 1000.0 / REPLAYS;
  }
  res.replay_us = median(times, ROUNDS);
  D->EventDestroy(t0);
  D->EventDestroy(t1);
  D->GraphExecDestroy(x);
  return res;
}

int main(void) {
  int rc = gpu_env_init(&E);
  CUstream launch = NULL;
  if (rc != 0)
    return rc;
  D = E.d;
  {
    char why[256];
    have_cupti = dlsync_cupti_streams_open(why, sizeof why) == 0;
    if (!have_cupti)
      printf("(%s: no stream counts)\n", why);
  }
  CHECK(D->MemAlloc(&buf, 8 * WORDS * 4) == CUDA_SUCCESS, "cuMemAlloc");
  CHECK(D->StreamCreate(&main_s, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS, "stream");
  CHECK(D->StreamCreate(&launch, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS, "stream");
  for (int i = 0; i < LAYERS; i++) {
    CHECK(D->StreamCreate(&sides[i], CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS, "stream");
    CHECK(D->EventCreate(&forks[i], CU_EVENT_DISABLE_TIMING) == CUDA_SUCCESS &&
              D->EventCreate(&joins[i], CU_EVENT_DISABLE_TIMING) == CUDA_SUCCESS,
          "events");
  }
  printf("replay_streams: %s, %d layers, a side-stream exchange per layer, %zu-word memsets\n",
         E.name, LAYERS, WORDS);
  printf("%-22s %-12s %6s %6s %8s %8s %12s\n", "order", "issue", "nodes", "edges", "streams",
         "records", "replay us");
  for (int v = 0; v < V_COUNT; v++) {
    for (int side_first = 1; side_first >= 0; side_first--) {
      CUgraph g = capture((variant)v, side_first != 0);
      result res = measure(g, launch);
      printf("%-22s %-12s %6zu %6zu %8d %8d %12.2f\n", variant_name[v],
             side_first ? "side first" : "main first", res.nodes, res.edges, res.streams,
             res.records, res.replay_us);
      D->GraphDestroy(g);
    }
  }
  printf("(records: memsets CUPTI saw over %d replays, %d expected per replay)\n", CUPTI_REPLAYS,
         LAYERS * 3);
  for (int i = 0; i < LAYERS; i++) {
    D->StreamDestroy(sides[i]);
    D->EventDestroy(forks[i]);
    D->EventDestroy(joins[i]);
  }
  D->StreamDestroy(main_s);
  D->StreamDestroy(launch);
  D->MemFree(buf);
  return 0;
}
