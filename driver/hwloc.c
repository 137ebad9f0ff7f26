/* SPDX-License-Identifier: Apache-2.0 */
/* libhwloc loaded at run time: see driver/hwloc.h.
 *
 * Only hwloc's types come from <hwloc.h> (when the build found its headers);
 * every call goes through the table below, never through hwloc's inline
 * helpers, which would call libhwloc directly and make it a link dependency.
 * The object structs are read as hwloc 2.x lays them out, which the soname
 * (libhwloc.so.15) and the API version check at load time guarantee. */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "driver/hwloc.h"

#if defined(DLSYNC_HAVE_HWLOC_H)
#include <hwloc.h>
#if HWLOC_API_VERSION < 0x00020100 || HWLOC_API_VERSION >= 0x00030000
#error "dlsync reads hwloc 2.x objects: needs hwloc 2.1 to 2.x headers"
#endif

typedef struct hwloc_table {
  unsigned (*get_api_version)(void);
  int (*topology_init)(hwloc_topology_t *topology);
  int (*topology_set_components)(hwloc_topology_t topology, unsigned long flags, const char *name);
  int (*topology_set_io_types_filter)(hwloc_topology_t topology, enum hwloc_type_filter_e filter);
  int (*topology_load)(hwloc_topology_t topology);
  void (*topology_destroy)(hwloc_topology_t topology);
  int (*get_nbobjs_by_depth)(hwloc_topology_t topology, int depth);
  hwloc_obj_t (*get_obj_by_depth)(hwloc_topology_t topology, int depth, unsigned idx);
  int (*bitmap_iszero)(hwloc_const_bitmap_t bitmap);
  int (*set_cpubind)(hwloc_topology_t topology, hwloc_const_cpuset_t set, int flags);
} hwloc_table;

#define HWLOC_ENTRIES(X)          \
  X(get_api_version)              \
  X(topology_init)                \
  X(topology_set_components)      \
  X(topology_set_io_types_filter) \
  X(topology_load)                \
  X(topology_destroy)             \
  X(get_nbobjs_by_depth)          \
  X(get_obj_by_depth)             \
  X(bitmap_iszero)                \
  X(set_cpubind)

static hwloc_table table;
#endif

static pthread_once_t load_once = PTHREAD_ONCE_INIT;
static bool usable;
static char what_buf[512];

/* One topology load at a time: reclaimers of several GPUs start together, and
 * hwloc's Linux backend goes through libudev, whose global state is not safe
 * to initialise from two threads at once (ThreadSanitizer sees the race). */
static pthread_mutex_t topology_lock = PTHREAD_MUTEX_INITIALIZER;

static void load(void) {
#if defined(DLSYNC_HAVE_HWLOC_H)
  Dl_info info;
  unsigned api;
  const char *why;
  void *lib = dlopen(DLSYNC__HWLOC_SONAME, RTLD_NOW | RTLD_LOCAL);
  if (lib == NULL) {
    why = dlerror();
    snprintf(what_buf, sizeof what_buf,
             "%s not loaded (%s): reclaimer threads are not bound near their GPU",
             DLSYNC__HWLOC_SONAME, why != NULL ? why : "unknown error");
    goto cleanup;
  }
#define HWLOC_RESOLVE(name)                                                                     \
  *(void **)&table.name = dlsym(lib, "hwloc_" #name);                                           \
  if (table.name == NULL) {                                                                     \
    snprintf(what_buf, sizeof what_buf,                                                         \
             "%s has no hwloc_" #name " (hwloc 2.1 or newer is needed): reclaimer threads are " \
             "not bound near their GPU",                                                        \
             DLSYNC__HWLOC_SONAME);                                                             \
    goto cleanup;                                                                               \
  }
  HWLOC_ENTRIES(HWLOC_RESOLVE)
#undef HWLOC_RESOLVE
  api = table.get_api_version();
  if ((api >> 16) != (HWLOC_API_VERSION >> 16)) {
    snprintf(what_buf, sizeof what_buf,
             "%s has API 0x%x, not hwloc 2.x: reclaimer threads are not bound near their GPU",
             DLSYNC__HWLOC_SONAME, api);
    goto cleanup;
  }
  if (dladdr(*(void **)&table.topology_init, &info) != 0 && info.dli_fname != NULL)
    snprintf(what_buf, sizeof what_buf, "%s", info.dli_fname);
  else
    snprintf(what_buf, sizeof what_buf, "%s", DLSYNC__HWLOC_SONAME);
  usable = true;
cleanup:
  /* A library that was found but cannot be used stays loaded: dlclose of
   * a library with constructors is not worth the risk for a few KiB. */
  return;
#else
  snprintf(what_buf, sizeof what_buf,
           "dlsync was built without hwloc's headers: reclaimer threads are not bound near "
           "their GPU");
#endif
}

bool dlsync__hwloc_status(const char **what) {
  pthread_once(&load_once, load);
  *what = what_buf;
  return usable;
}

#if defined(DLSYNC_HAVE_HWLOC_H)
static const char *const skipped_components[] = {
    "cuda", "nvml", "opencl", "rsmi", "levelzero", "gl",
#if defined(__linux__)
    "pci",
#endif
};

/* The PCI device with this bus id, or NULL. */
static hwloc_obj_t find_pcidev(hwloc_topology_t topo, unsigned dom, unsigned bus, unsigned dev,
                               unsigned fn) {
  int n = table.get_nbobjs_by_depth(topo, HWLOC_TYPE_DEPTH_PCI_DEVICE);
  for (int i = 0; i < n; i++) {
    hwloc_obj_t o = table.get_obj_by_depth(topo, HWLOC_TYPE_DEPTH_PCI_DEVICE, (unsigned)i);
    if (o != NULL && o->attr != NULL && o->attr->pcidev.domain == dom &&
        o->attr->pcidev.bus == bus && o->attr->pcidev.dev == dev && o->attr->pcidev.func == fn)
      return o;
  }
  return NULL;
}

/* The first ancestor with CPUs (I/O objects have no cpuset). */
static hwloc_obj_t non_io_ancestor(hwloc_obj_t o) {
  while (o != NULL && o->cpuset == NULL)
    o = o->parent;
  return o;
}
#endif

bool dlsync__hwloc_bind_near(const char *bus_id) {
  bool bound = false;
#if defined(DLSYNC_HAVE_HWLOC_H)
  const char *what;
  hwloc_topology_t topo;
  unsigned dom = 0, bus = 0, dev = 0, fn = 0;
  hwloc_obj_t anc;
  if (sscanf(bus_id, "%x:%x:%x.%x", &dom, &bus, &dev, &fn) != 4 || !dlsync__hwloc_status(&what))
    return false;
  pthread_mutex_lock(&topology_lock);
  if (table.topology_init(&topo) != 0) {
    pthread_mutex_unlock(&topology_lock);
    return false;
  }
  /* Only where PCI devices sit is needed: no GPU discovery plugins (they
   * would load libcuda or NVML themselves), and on Linux sysfs is read
   * directly instead of through libpciaccess, which keeps a cache it never
   * frees. An unknown component name is not an error. */
  for (size_t i = 0; i < sizeof skipped_components / sizeof skipped_components[0]; i++)
    (void)table.topology_set_components(topo, HWLOC_TOPOLOGY_COMPONENTS_FLAG_BLACKLIST,
                                        skipped_components[i]);
  if (table.topology_set_io_types_filter(topo, HWLOC_TYPE_FILTER_KEEP_IMPORTANT) == 0 &&
      table.topology_load(topo) == 0) {
    anc = non_io_ancestor(find_pcidev(topo, dom, bus, dev, fn));
    if (anc != NULL && anc->cpuset != NULL && !table.bitmap_iszero(anc->cpuset))
      bound = table.set_cpubind(topo, anc->cpuset, HWLOC_CPUBIND_THREAD) == 0;
  }
  table.topology_destroy(topo);
  pthread_mutex_unlock(&topology_lock);
#else
  (void)bus_id;
#endif
  return bound;
}
