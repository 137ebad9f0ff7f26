/* SPDX-License-Identifier: Apache-2.0 */
/* dlsync private: the DLPack 1.x ABI, mirrored. Never installed.
 *
 * dlsync does not include dlpack.h. These structs repeat, under private
 * names, the layout of dlpack.h 1.3's DLManagedTensorVersioned and
 * DLPackExchangeAPI, field for field, so that their offsets are the official
 * ones. The code never accesses a producer's struct through these types: it
 * copies single fields out with memcpy at offsetof(mirror, field), so no
 * struct type is punned. tests/gpu/dlpack_layout_*.c checks every offset and
 * size against a real dlpack.h; the static asserts below pin them for the
 * LP64 targets dlsync is built for.
 *
 * DLDeviceType is an enum in dlpack.h (int32_t-sized; in C++ `enum :
 * int32_t`): the mirrors use int32_t, which every ABI passes the same way.
 */
#ifndef DLSYNC_PRIVATE_DLPACK_ABI_H
#define DLSYNC_PRIVATE_DLPACK_ABI_H

#include <stddef.h>
#include <stdint.h>

#include "dlsync/dlpack.h"

#ifdef __cplusplus
extern "C" {
#endif

/* DLPackVersion */
typedef struct dlsync__dlpack_version {
  uint32_t major;
  uint32_t minor;
} dlsync__dlpack_version;

/* DLDevice */
typedef struct dlsync__dlpack_device {
  int32_t device_type; /* DLDeviceType */
  int32_t device_id;
} dlsync__dlpack_device;

/* DLDataType */
typedef struct dlsync__dlpack_dtype {
  uint8_t code;
  uint8_t bits;
  uint16_t lanes;
} dlsync__dlpack_dtype;

/* DLTensor */
typedef struct dlsync__dlpack_tensor {
  void *data;
  dlsync__dlpack_device device;
  int32_t ndim;
  dlsync__dlpack_dtype dtype;
  int64_t *shape;
  int64_t *strides;
  uint64_t byte_offset;
} dlsync__dlpack_tensor;

/* DLManagedTensorVersioned. DLPack keeps everything up to `flags` where it is
 * in every future version, so that any consumer can call the deleter. */
typedef struct dlsync__dlpack_managed {
  dlsync__dlpack_version version;
  void *manager_ctx;
  void (*deleter)(struct DLManagedTensorVersioned *self);
  uint64_t flags;
  dlsync__dlpack_tensor dl_tensor;
} dlsync__dlpack_managed;

/* DLPackCurrentWorkStream */
typedef int (*dlsync__dlpack_current_work_stream_fn)(int32_t device_type, int32_t device_id,
                                                     void **out_current_stream);

/* A function pointer of a type dlsync never calls. */
typedef void (*dlsync__dlpack_fn)(void);

/* DLPackExchangeAPIHeader: stable across versions. */
typedef struct dlsync__dlpack_api_header {
  dlsync__dlpack_version version;
  struct dlsync__dlpack_api_header *prev_api; /* struct DLPackExchangeAPIHeader * */
} dlsync__dlpack_api_header;

/* DLPackExchangeAPI (DLPack 1.3). */
typedef struct dlsync__dlpack_exchange_api {
  dlsync__dlpack_api_header header;
  dlsync__dlpack_fn managed_tensor_allocator;
  dlsync__dlpack_fn managed_tensor_from_py_object_no_sync;
  dlsync__dlpack_fn managed_tensor_to_py_object_no_sync;
  dlsync__dlpack_fn dltensor_from_py_object_no_sync;
  dlsync__dlpack_current_work_stream_fn current_work_stream;
} dlsync__dlpack_exchange_api;

#if !defined(__cplusplus)
#define DLSYNC__STATIC_ASSERT _Static_assert
#else
#define DLSYNC__STATIC_ASSERT static_assert
#endif

#if defined(__LP64__) || defined(_LP64) || defined(__x86_64__) || defined(__aarch64__)
/* The DLPack 1.3 layout on LP64 (x86-64, aarch64). */
DLSYNC__STATIC_ASSERT(sizeof(dlsync__dlpack_version) == 8, "DLPackVersion");
DLSYNC__STATIC_ASSERT(sizeof(dlsync__dlpack_device) == 8, "DLDevice");
DLSYNC__STATIC_ASSERT(sizeof(dlsync__dlpack_dtype) == 4, "DLDataType");
DLSYNC__STATIC_ASSERT(offsetof(dlsync__dlpack_tensor, data) == 0, "DLTensor.data");
DLSYNC__STATIC_ASSERT(offsetof(dlsync__dlpack_tensor, device) == 8, "DLTensor.device");
DLSYNC__STATIC_ASSERT(offsetof(dlsync__dlpack_tensor, ndim) == 16, "DLTensor.ndim");
DLSYNC__STATIC_ASSERT(offsetof(dlsync__dlpack_tensor, dtype) == 20, "DLTensor.dtype");
DLSYNC__STATIC_ASSERT(offsetof(dlsync__dlpack_tensor, shape) == 24, "DLTensor.shape");
DLSYNC__STATIC_ASSERT(offsetof(dlsync__dlpack_tensor, strides) == 32, "DLTensor.strides");
DLSYNC__STATIC_ASSERT(offsetof(dlsync__dlpack_tensor, byte_offset) == 40, "DLTensor.byte_offset");
DLSYNC__STATIC_ASSERT(sizeof(dlsync__dlpack_tensor) == 48, "DLTensor");
DLSYNC__STATIC_ASSERT(offsetof(dlsync__dlpack_managed, version) == 0, "version");
DLSYNC__STATIC_ASSERT(offsetof(dlsync__dlpack_managed, manager_ctx) == 8, "manager_ctx");
DLSYNC__STATIC_ASSERT(offsetof(dlsync__dlpack_managed, deleter) == 16, "deleter");
DLSYNC__STATIC_ASSERT(offsetof(dlsync__dlpack_managed, flags) == 24, "flags");
DLSYNC__STATIC_ASSERT(offsetof(dlsync__dlpack_managed, dl_tensor) == 32, "dl_tensor");
DLSYNC__STATIC_ASSERT(sizeof(dlsync__dlpack_managed) == 80, "DLManagedTensorVersioned");
DLSYNC__STATIC_ASSERT(offsetof(dlsync__dlpack_api_header, version) == 0, "header.version");
DLSYNC__STATIC_ASSERT(offsetof(dlsync__dlpack_api_header, prev_api) == 8, "header.prev_api");
DLSYNC__STATIC_ASSERT(sizeof(dlsync__dlpack_api_header) == 16, "DLPackExchangeAPIHeader");
DLSYNC__STATIC_ASSERT(offsetof(dlsync__dlpack_exchange_api, header) == 0, "header");
DLSYNC__STATIC_ASSERT(offsetof(dlsync__dlpack_exchange_api, managed_tensor_allocator) == 16,
                      "managed_tensor_allocator");
DLSYNC__STATIC_ASSERT(offsetof(dlsync__dlpack_exchange_api,
                               managed_tensor_from_py_object_no_sync) == 24,
                      "managed_tensor_from_py_object_no_sync");
DLSYNC__STATIC_ASSERT(offsetof(dlsync__dlpack_exchange_api, managed_tensor_to_py_object_no_sync) ==
                          32,
                      "managed_tensor_to_py_object_no_sync");
DLSYNC__STATIC_ASSERT(offsetof(dlsync__dlpack_exchange_api, dltensor_from_py_object_no_sync) == 40,
                      "dltensor_from_py_object_no_sync");
DLSYNC__STATIC_ASSERT(offsetof(dlsync__dlpack_exchange_api, current_work_stream) == 48,
                      "current_work_stream");
DLSYNC__STATIC_ASSERT(sizeof(dlsync__dlpack_exchange_api) == 56, "DLPackExchangeAPI");
#endif

#ifdef __cplusplus
}
#endif

#endif
