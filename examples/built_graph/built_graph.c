/* SPDX-License-Identifier: Apache-2.0 */
/* Graphs built by hand (option B): a producer graph whose node fills a
 * buffer and a consumer graph whose node copies from it, built node by node
 * and ordered by one dlsync exchange, with no stream capture anywhere.
 *
 * A lane made with dlsync_lane_graph(graph, deps, ndeps, capacity) is the
 * graph's frontier: the nodes the next node will depend on. begin appends an
 * event-record node after the producer's frontier and an event-wait node to
 * the consumer's, and moves the consumer's frontier onto it; the copy node is
 * added with the frontier as its dependencies. end is asked to order the
 * producer's later work after the consumer; between two graphs that are not
 * launched yet it cannot, and says so (DLSYNC_ERROR_CAPTURE_ORDER): the
 * producer's graph must simply be launched first.
 *
 * Run: built_graph (links libdlsync; the CUDA driver is dlopened). Exit 0
 * when the consumer read the producer's value in every launch, 77 without a
 * GPU, 1 otherwise. */
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

#include <cuda.h>

#include <dlsync/dlsync.h>

#define WORDS ((size_t)1 << 26) /* 256 MiB */
#define LAUNCHES 10

#define STR_(x) #x
#define STR(x) STR_(x) /* cuda.h maps cuX to cuX_v2: take the mapped name */
#define ENTRIES(X)                  \
  X(cuInit)                         \
  X(cuDeviceGetCount)               \
  X(cuDeviceGet)                    \
  X(cuDevicePrimaryCtxRetain)       \
  X(cuCtxPushCurrent)               \
  X(cuCtxSynchronize)               \
  X(cuMemAlloc)                     \
  X(cuMemFree)                      \
  X(cuMemcpyDtoH)                   \
  X(cuStreamCreate)                 \
  X(cuStreamDestroy)                \
  X(cuGraphCreate)                  \
  X(cuGraphAddMemsetNode)           \
  X(cuGraphAddMemcpyNode)           \
  X(cuGraphInstantiateWithFlags)    \
  X(cuGraphExecMemsetNodeSetParams) \
  X(cuGraphLaunch)                  \
  X(cuGraphExecDestroy)             \
  X(cuGraphDestroy)

static struct {
#define FIELD(name) __typeof__(&name) name;
  ENTRIES(FIELD)
#undef FIELD
} cu;

#define CHECK(call)                                                \
  do {                                                             \
    CUresult r_ = (call);                                          \
    if (r_ != CUDA_SUCCESS) {                                      \
      fprintf(stderr, "%s failed: CUresult %d\n", #call, (int)r_); \
      goto cleanup;                                                \
    }                                                              \
  } while (0)

static int load_driver(void) {
  void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  int n = 0;
  if (lib == NULL) {
    printf("SKIP: no CUDA driver (%s)\n", dlerror());
    return 77;
  }
#define RESOLVE(name)                                     \
  *(void **)&cu.name = dlsym(lib, STR(name));             \
  if (cu.name == NULL) {                                  \
    fprintf(stderr, "the driver has no %s\n", STR(name)); \
    return 1;                                             \
  }
  ENTRIES(RESOLVE)
#undef RESOLVE
  if (cu.cuInit(0) != CUDA_SUCCESS || cu.cuDeviceGetCount(&n) != CUDA_SUCCESS || n == 0) {
    printf("SKIP: no GPU\n");
    return 77;
  }
  return 0;
}

int main(void) {
  int rc = 1, wrong = 0;
  CUdevice dev;
  CUcontext cuctx;
  CUdeviceptr buf = 0, out = 0;
  CUstream sp = NULL, sc = NULL;
  CUgraph producer = NULL, consumer = NULL;
  CUgraphExec xp = NULL, xc = NULL;
  CUgraphNode fill, copy, pdeps[4], cdeps[4];
  CUDA_MEMSET_NODE_PARAMS ms;
  CUDA_MEMCPY3D cp;
  dlsync_context *ctx = NULL;
  dlsync_exchange *ex = NULL;
  dlsync_lane lp, lc;
  dlsync_status st;

  if ((rc = load_driver()) != 0)
    return rc;
  rc = 1;
  CHECK(cu.cuDeviceGet(&dev, 0));
  CHECK(cu.cuDevicePrimaryCtxRetain(&cuctx, dev));
  CHECK(cu.cuCtxPushCurrent(cuctx));
  if (dlsync_context_create(&ctx, NULL) != DLSYNC_SUCCESS) {
    fprintf(stderr, "dlsync_context_create: %s\n", dlsync_last_error());
    goto cleanup;
  }
  CHECK(cu.cuMemAlloc(&buf, WORDS * 4));
  CHECK(cu.cuMemAlloc(&out, 4));
  CHECK(cu.cuStreamCreate(&sp, CU_STREAM_NON_BLOCKING));
  CHECK(cu.cuStreamCreate(&sc, CU_STREAM_NON_BLOCKING));

  /* The producer: one memset node filling the buffer. */
  CHECK(cu.cuGraphCreate(&producer, 0));
  memset(&ms, 0, sizeof ms);
  ms.dst = buf;
  ms.value = 1;
  ms.elementSize = 4;
  ms.width = WORDS;
  ms.height = 1;
  CHECK(cu.cuGraphAddMemsetNode(&fill, producer, NULL, 0, &ms, cuctx));

  /* The lanes: each graph with its frontier (room for 4 nodes). */
  CHECK(cu.cuGraphCreate(&consumer, 0));
  pdeps[0] = fill;
  lp = dlsync_lane_graph(producer, pdeps, 1, 4);
  lc = dlsync_lane_graph(consumer, cdeps, 0, 4);
  if (dlsync_exchange_begin(&ex, ctx, &lp, &lc) != DLSYNC_SUCCESS) {
    fprintf(stderr, "dlsync_exchange_begin: %s\n", dlsync_last_error());
    goto cleanup;
  }
  printf("begin: producer frontier %zu node(s), consumer frontier %zu node(s)\n", lp.ndeps,
         lc.ndeps);

  /* The consumer's node goes after the consumer's frontier (the wait). */
  memset(&cp, 0, sizeof cp);
  cp.srcMemoryType = CU_MEMORYTYPE_DEVICE;
  cp.srcDevice = buf + (WORDS - 1) * 4;
  cp.dstMemoryType = CU_MEMORYTYPE_DEVICE;
  cp.dstDevice = out;
  cp.WidthInBytes = 4;
  cp.Height = 1;
  cp.Depth = 1;
  CHECK(cu.cuGraphAddMemcpyNode(&copy, consumer, lc.deps, lc.ndeps, &cp, cuctx));
  lc.deps[0] = copy;
  lc.ndeps = 1;
  st = dlsync_exchange_end(ex);
  ex = NULL;
  if (st != DLSYNC_SUCCESS && st != DLSYNC_ERROR_CAPTURE_ORDER) {
    fprintf(stderr, "dlsync_exchange_end: %s\n", dlsync_last_error());
    goto cleanup;
  }
  printf("end: %s (the producer graph is launched first)\n", dlsync_status_name(st));

  /* Launch both on different streams, a new value each time. */
  CHECK(cu.cuGraphInstantiateWithFlags(&xp, producer, 0));
  CHECK(cu.cuGraphInstantiateWithFlags(&xc, consumer, 0));
  for (unsigned i = 0; i < LAUNCHES; i++) {
    unsigned got = 0;
    ms.value = 100 + i;
    CHECK(cu.cuGraphExecMemsetNodeSetParams(xp, fill, &ms, cuctx));
    CHECK(cu.cuGraphLaunch(xp, sp));
    CHECK(cu.cuGraphLaunch(xc, sc));
    CHECK(cu.cuCtxSynchronize());
    CHECK(cu.cuMemcpyDtoH(&got, out, 4));
    wrong += got != ms.value;
  }
  printf("%d of %d launches read the producer's value\n", LAUNCHES - wrong, LAUNCHES);
  rc = wrong == 0 ? 0 : 1;

cleanup:
  if (ex != NULL)
    (void)dlsync_exchange_end(ex);
  if (xc != NULL)
    (void)cu.cuGraphExecDestroy(xc);
  if (xp != NULL)
    (void)cu.cuGraphExecDestroy(xp);
  if (consumer != NULL)
    (void)cu.cuGraphDestroy(consumer);
  if (producer != NULL)
    (void)cu.cuGraphDestroy(producer);
  if (sc != NULL)
    (void)cu.cuStreamDestroy(sc);
  if (sp != NULL)
    (void)cu.cuStreamDestroy(sp);
  if (out != 0)
    (void)cu.cuMemFree(out);
  if (buf != 0)
    (void)cu.cuMemFree(buf);
  if (ctx != NULL && dlsync_context_destroy(ctx) != DLSYNC_SUCCESS) {
    fprintf(stderr, "dlsync_context_destroy: %s\n", dlsync_last_error());
    rc = 1;
  }
  return rc;
}
