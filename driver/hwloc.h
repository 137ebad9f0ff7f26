/* SPDX-License-Identifier: Apache-2.0 */
/* libhwloc, loaded at run time (driver/hwloc.c).
 *
 * dlsync never links libhwloc: libdlsync.so (and the Python wheel that
 * carries it) loads on a machine without it. The reclaimer threads of
 * order/release_reclaimer.c use hwloc only to bind themselves to the CPUs near their GPU; the
 * first use dlopens "libhwloc.so.15" (the hwloc 2.x ABI) and resolves a
 * small table of entry points. Where it is absent or too old, threads stay
 * unbound and dlsync__hwloc_status() says why. Thread-safe. */
#ifndef DLSYNC_PRIVATE_HWLOC_H
#define DLSYNC_PRIVATE_HWLOC_H

#include <stdbool.h>

/* The soname dlopened: hwloc 2.x (2.1 or newer for component filtering). */
#define DLSYNC__HWLOC_SONAME "libhwloc.so.15"

/* Binds the calling thread to the CPUs hwloc finds local to the PCI device
 * bus_id ("dddd:bb:dd.f", as cuDeviceGetPCIBusId writes it). Returns true
 * when bound; false (thread left as it was) when hwloc is absent, does not
 * know the device, or refuses. Topology loads are serialised. */
bool dlsync__hwloc_bind_near(const char *bus_id);

/* Loads hwloc if not done yet. Returns true when it is usable; *what is then
 * the path of the library loaded, otherwise why binding is skipped. The
 * string lives as long as the process. */
bool dlsync__hwloc_status(const char **what);

#endif
