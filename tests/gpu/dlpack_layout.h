/* SPDX-License-Identifier: Apache-2.0 */
/* dlsync's DLPack mirrors against a real dlpack.h (tests/gpu/dlpack_layout*.c).
 *
 * Included after both the real dlpack.h (DLSYNC_DLPACK_HEADER, a path given
 * by CMake) and dlsync's headers, in either order: every offset and size of
 * dlsync's private mirror must equal the official one, checked at compile
 * time; the run-time half (layout_run_checks) hands real DLPack structs to
 * dlsync's functions. DLSYNC_DLPACK_HAS_EXCHANGE_API is defined by CMake when
 * that dlpack.h declares DLPackExchangeAPI (DLPack 1.3). */
#ifndef DLSYNC_TESTS_GPU_DLPACK_LAYOUT_H
#define DLSYNC_TESTS_GPU_DLPACK_LAYOUT_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "interop/dlpack_abi.h"

#define LAYOUT_SAME(real, mirror, field)                                              \
  _Static_assert(offsetof(real, field) == offsetof(mirror, field), #real "." #field); \
  _Static_assert(sizeof(((real *)0)->field) == sizeof(((mirror *)0)->field),          \
                 #real "." #field " size")

LAYOUT_SAME(DLPackVersion, dlsync__dlpack_version, major);
LAYOUT_SAME(DLPackVersion, dlsync__dlpack_version, minor);
_Static_assert(sizeof(DLPackVersion) == sizeof(dlsync__dlpack_version), "DLPackVersion");
LAYOUT_SAME(DLDevice, dlsync__dlpack_device, device_type);
LAYOUT_SAME(DLDevice, dlsync__dlpack_device, device_id);
_Static_assert(sizeof(DLDevice) == sizeof(dlsync__dlpack_device), "DLDevice");
LAYOUT_SAME(DLDataType, dlsync__dlpack_dtype, code);
LAYOUT_SAME(DLDataType, dlsync__dlpack_dtype, bits);
LAYOUT_SAME(DLDataType, dlsync__dlpack_dtype, lanes);
_Static_assert(sizeof(DLDataType) == sizeof(dlsync__dlpack_dtype), "DLDataType");
LAYOUT_SAME(DLTensor, dlsync__dlpack_tensor, data);
LAYOUT_SAME(DLTensor, dlsync__dlpack_tensor, device);
LAYOUT_SAME(DLTensor, dlsync__dlpack_tensor, ndim);
LAYOUT_SAME(DLTensor, dlsync__dlpack_tensor, dtype);
LAYOUT_SAME(DLTensor, dlsync__dlpack_tensor, shape);
LAYOUT_SAME(DLTensor, dlsync__dlpack_tensor, strides);
LAYOUT_SAME(DLTensor, dlsync__dlpack_tensor, byte_offset);
_Static_assert(sizeof(DLTensor) == sizeof(dlsync__dlpack_tensor), "DLTensor");
LAYOUT_SAME(struct DLManagedTensorVersioned, dlsync__dlpack_managed, version);
LAYOUT_SAME(struct DLManagedTensorVersioned, dlsync__dlpack_managed, manager_ctx);
LAYOUT_SAME(struct DLManagedTensorVersioned, dlsync__dlpack_managed, deleter);
LAYOUT_SAME(struct DLManagedTensorVersioned, dlsync__dlpack_managed, flags);
LAYOUT_SAME(struct DLManagedTensorVersioned, dlsync__dlpack_managed, dl_tensor);
_Static_assert(sizeof(struct DLManagedTensorVersioned) == sizeof(dlsync__dlpack_managed),
               "DLManagedTensorVersioned");
/* The device type constants dlsync names. */
_Static_assert(kDLCPU == DLSYNC_DLPACK_DEVICE_CPU, "kDLCPU");
_Static_assert(kDLCUDA == DLSYNC_DLPACK_DEVICE_CUDA, "kDLCUDA");
_Static_assert(kDLROCM == DLSYNC_DLPACK_DEVICE_ROCM, "kDLROCM");
_Static_assert(sizeof(DLDeviceType) == sizeof(int32_t), "DLDeviceType is int32_t-sized");
_Static_assert(DLPACK_MAJOR_VERSION == DLSYNC_DLPACK_MAJOR_VERSION, "DLPack major version");

#ifdef DLSYNC_DLPACK_HAS_EXCHANGE_API
LAYOUT_SAME(struct DLPackExchangeAPIHeader, dlsync__dlpack_api_header, version);
LAYOUT_SAME(struct DLPackExchangeAPIHeader, dlsync__dlpack_api_header, prev_api);
_Static_assert(sizeof(struct DLPackExchangeAPIHeader) == sizeof(dlsync__dlpack_api_header),
               "DLPackExchangeAPIHeader");
LAYOUT_SAME(struct DLPackExchangeAPI, dlsync__dlpack_exchange_api, header);
LAYOUT_SAME(struct DLPackExchangeAPI, dlsync__dlpack_exchange_api, managed_tensor_allocator);
LAYOUT_SAME(struct DLPackExchangeAPI, dlsync__dlpack_exchange_api,
            managed_tensor_from_py_object_no_sync);
LAYOUT_SAME(struct DLPackExchangeAPI, dlsync__dlpack_exchange_api,
            managed_tensor_to_py_object_no_sync);
LAYOUT_SAME(struct DLPackExchangeAPI, dlsync__dlpack_exchange_api, dltensor_from_py_object_no_sync);
LAYOUT_SAME(struct DLPackExchangeAPI, dlsync__dlpack_exchange_api, current_work_stream);
_Static_assert(sizeof(struct DLPackExchangeAPI) == sizeof(dlsync__dlpack_exchange_api),
               "DLPackExchangeAPI");
#endif

/* Run-time checks with real structs, compiled in each translation unit (the
 * include order differs). Returns the number of failures, printed. */
static int layout_deleted;

static void layout_deleter(struct DLManagedTensorVersioned *self) {
  (void)self;
  layout_deleted++;
}

#ifdef DLSYNC_DLPACK_HAS_EXCHANGE_API
static int layout_current_work_stream(DLDeviceType device_type, int32_t device_id, void **out) {
  *out = (void *)(uintptr_t)(0x1000u + (unsigned)device_type * 16u + (unsigned)device_id);
  return 0;
}
#endif

static int layout_run_checks(const char *unit) {
  int failures = 0;
  struct DLManagedTensorVersioned t;
  uint32_t major = 0, minor = 0;
  memset(&t, 0, sizeof t);
  t.version.major = DLPACK_MAJOR_VERSION;
  t.version.minor = DLPACK_MINOR_VERSION;
  t.deleter = layout_deleter;
  t.dl_tensor.device.device_type = kDLCUDA;
  layout_deleted = 0;
  if (dlsync_dlpack_version(&major, &minor, &t) != DLSYNC_SUCCESS || major != t.version.major ||
      minor != t.version.minor) {
    printf("FAIL %s: dlsync_dlpack_version read %u.%u from a %u.%u tensor\n", unit, major, minor,
           t.version.major, t.version.minor);
    failures++;
  }
  dlsync_dlpack_call_deleter(&t);
  if (layout_deleted != 1) {
    printf("FAIL %s: the deleter ran %d times\n", unit, layout_deleted);
    failures++;
  }
#ifdef DLSYNC_DLPACK_HAS_EXCHANGE_API
  {
    DLPackExchangeAPI api;
    void *stream = NULL;
    memset(&api, 0, sizeof api);
    api.header.version.major = DLPACK_MAJOR_VERSION;
    api.header.version.minor = DLPACK_MINOR_VERSION;
    api.header.prev_api = NULL;
    api.current_work_stream = layout_current_work_stream;
    if (dlsync_env_stream_from_exchange_api(&stream, &api, kDLCUDA, 3) != DLSYNC_SUCCESS ||
        stream != (void *)(uintptr_t)(0x1000u + 2u * 16u + 3u)) {
      printf("FAIL %s: the exchange API's stream came back as %p (%s)\n", unit, stream,
             dlsync_last_error());
      failures++;
    }
  }
#endif
  return failures;
}

#endif
