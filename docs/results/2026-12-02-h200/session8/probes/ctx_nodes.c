/* Probe (not part of the product): does the driver refuse an event of
 * another context in an event node added to a capture by hand?
 * gcc -std=c11 -O2 -I/usr/local/cuda/include ctx_nodes.c -o ctx_nodes -lcuda */
#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>

static const char *en(CUresult r) {
  const char *n = "?";
  cuGetErrorName(r, &n);
  return n;
}
#define CK(x)                                                  \
  do {                                                         \
    CUresult r_ = (x);                                         \
    if (r_ != CUDA_SUCCESS) {                                  \
      printf("FAIL line %d %s -> %s\n", __LINE__, #x, en(r_)); \
      exit(1);                                                 \
    }                                                          \
  } while (0)

static void try_nodes(const char *what, CUstream s, CUevent ev) {
  CUstreamCaptureStatus cs;
  cuuint64_t id;
  CUgraph g, out = NULL;
  const CUgraphNode *deps;
  const CUgraphEdgeData *ed;
  size_t n;
  CUgraphNode node;
  CUresult r;
  CK(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_RELAXED));
  CK(cuStreamGetCaptureInfo(s, &cs, &id, &g, &deps, &ed, &n));
  r = cuGraphAddEventRecordNode(&node, g, deps, n, ev);
  printf("%s: cuGraphAddEventRecordNode: %s\n", what, en(r));
  if (r == CUDA_SUCCESS)
    CK(cuStreamUpdateCaptureDependencies(s, &node, NULL, 1, CU_STREAM_SET_CAPTURE_DEPENDENCIES));
  CK(cuStreamGetCaptureInfo(s, &cs, &id, &g, &deps, &ed, &n));
  r = cuGraphAddEventWaitNode(&node, g, deps, n, ev);
  printf("%s: cuGraphAddEventWaitNode: %s\n", what, en(r));
  if (r == CUDA_SUCCESS)
    CK(cuStreamUpdateCaptureDependencies(s, &node, NULL, 1, CU_STREAM_SET_CAPTURE_DEPENDENCIES));
  r = cuStreamEndCapture(s, &out);
  printf("%s: end capture: %s\n", what, en(r));
  if (out) {
    CUgraphExec x = NULL;
    r = cuGraphInstantiateWithFlags(&x, out, 0);
    printf("%s: instantiate: %s\n", what, en(r));
    if (r == CUDA_SUCCESS) {
      r = cuGraphLaunch(x, s);
      printf("%s: launch: %s\n", what, en(r));
      printf("%s: sync: %s\n", what, en(cuStreamSynchronize(s)));
      cuGraphExecDestroy(x);
    }
    cuGraphDestroy(out);
  }
}

int main(void) {
  CUdevice dev;
  CUcontext a, b;
  CUstream sa;
  CUevent ea, eb;
  CK(cuInit(0));
  CK(cuDeviceGet(&dev, 0));
  CK(cuCtxCreate(&b, NULL, 0, dev));
  CK(cuEventCreate(&eb, CU_EVENT_DISABLE_TIMING));
  CK(cuCtxCreate(&a, NULL, 0, dev));
  CK(cuCtxSetCurrent(a));
  CK(cuStreamCreate(&sa, CU_STREAM_NON_BLOCKING));
  CK(cuEventCreate(&ea, CU_EVENT_DISABLE_TIMING));
  printf("eager cuEventRecord of another context's event: %s\n", en(cuEventRecord(eb, sa)));
  CK(cuStreamSynchronize(sa));
  try_nodes("same context", sa, ea);
  try_nodes("other context", sa, eb);
  printf("after: a sync %s\n", en(cuCtxSynchronize()));
  return 0;
}
