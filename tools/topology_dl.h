/* SPDX-License-Identifier: Apache-2.0 */
/* dlsync-info with libhwloc loaded at run time (the wheel's: it may link
 * nothing but libc). Included by topology.c before <hwloc.h> when built
 * with TOPO_HWLOC_DLOPEN: each hwloc function topology.c calls, directly or
 * through hwloc's inline helpers, is renamed to a forwarder in
 * topology_dl.c, which calls the function of that name in libhwloc.so.15.
 * A function missing from this list is an undefined symbol at link time,
 * never a silent fallback. */
#ifndef DLSYNC_TOOLS_TOPOLOGY_DL_H
#define DLSYNC_TOOLS_TOPOLOGY_DL_H

#include <stddef.h>

#define hwloc_bitmap_first topo_dl_hwloc_bitmap_first
#define hwloc_bitmap_isequal topo_dl_hwloc_bitmap_isequal
#define hwloc_bitmap_iszero topo_dl_hwloc_bitmap_iszero
#define hwloc_bitmap_list_asprintf topo_dl_hwloc_bitmap_list_asprintf
#define hwloc_bitmap_next topo_dl_hwloc_bitmap_next
#define hwloc_bitmap_weight topo_dl_hwloc_bitmap_weight
#define hwloc_get_api_version topo_dl_hwloc_get_api_version
#define hwloc_get_nbobjs_by_depth topo_dl_hwloc_get_nbobjs_by_depth
#define hwloc_get_obj_by_depth topo_dl_hwloc_get_obj_by_depth
#define hwloc_get_type_depth topo_dl_hwloc_get_type_depth
#define hwloc_obj_type_string topo_dl_hwloc_obj_type_string
#define hwloc_topology_destroy topo_dl_hwloc_topology_destroy
#define hwloc_topology_init topo_dl_hwloc_topology_init
#define hwloc_topology_load topo_dl_hwloc_topology_load
#define hwloc_topology_set_components topo_dl_hwloc_topology_set_components
#define hwloc_topology_set_io_types_filter topo_dl_hwloc_topology_set_io_types_filter

/* Loads libhwloc.so.15 and every function above, once; later calls return
 * what the first did. Returns 0, or -1 with a message naming the library or
 * the function that is missing. Threads: called by topo_load, which one
 * thread calls. */
int topo_dl_open(char *err, size_t errlen);

#endif
