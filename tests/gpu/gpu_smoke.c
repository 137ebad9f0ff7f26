/* SPDX-License-Identifier: Apache-2.0 */
/* GPU smoke test: the real driver loads through dlsync's table, the devices
 * dlsync reports match cuDeviceGetCount, and each one's facts can be read.
 * Exits 77 (skipped) where no driver or GPU is found. */
#include "gpu_common.h"

int main(void) {
  gpu_env e;
  int rc = gpu_env_init(&e);
  int n_driver = 0, n_dlsync = 0, driver_version = 0;
  if (rc != 0)
    return rc;
  if (e.d->DeviceGetCount(&n_driver) != CUDA_SUCCESS) {
    printf("FAIL: cuDeviceGetCount\n");
    return 1;
  }
  if (dlsync_device_count(&n_dlsync, e.ctx) != DLSYNC_SUCCESS || n_dlsync != n_driver) {
    printf("FAIL: dlsync_device_count says %d, cuDeviceGetCount %d (%s)\n", n_dlsync, n_driver,
           dlsync_last_error());
    return 1;
  }
  dlsync_context_driver_version(&driver_version, e.ctx);
  printf("driver %d, %d device(s)\n", driver_version, n_driver);
  for (int i = 0; i < n_dlsync; i++) {
    dlsync_device_info info = DLSYNC_DEVICE_INFO_INIT;
    char bus[32] = {0};
    CUdevice dev;
    if (dlsync_device_get_info(&info, e.ctx, i) != DLSYNC_SUCCESS) {
      printf("FAIL: device %d: %s\n", i, dlsync_last_error());
      return 1;
    }
    e.d->DeviceGet(&dev, i);
    e.d->DeviceGetPCIBusId(bus, (int)sizeof bus, dev);
    if (strcmp(bus, info.pci_bus_id) != 0 || info.total_memory == 0 || info.cc_major < 1) {
      printf("FAIL: device %d facts disagree with the driver\n", i);
      return 1;
    }
    printf("device %d: %s, pci %s, sm %d.%d, %.1f GiB, %d SMs\n", i, info.name, info.pci_bus_id,
           info.cc_major, info.cc_minor, (double)info.total_memory / (1024.0 * 1024 * 1024),
           info.multiprocessors);
  }
  if (dlsync_context_destroy(e.ctx) != DLSYNC_SUCCESS) {
    printf("FAIL: destroy: %s\n", dlsync_last_error());
    return 1;
  }
  printf("PASS gpu_smoke\n");
  return 0;
}
