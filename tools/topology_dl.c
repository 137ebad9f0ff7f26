/* SPDX-License-Identifier: Apache-2.0 */
/* The forwarders of topology_dl.h: libhwloc.so.15 loaded with dlopen, each
 * function taken with dlsym. Only topo_dl_open may be called before it has
 * succeeded; topology.c calls nothing of hwloc until then. */
#include "topology_dl.h"

#include <dlfcn.h>
#include <hwloc.h>
#include <stdio.h>

#if HWLOC_API_VERSION < 0x00020100
#error "dlsync-info needs hwloc 2.1 or newer"
#endif

/* The soname of hwloc 2.x, as the library's own driver/hwloc.c loads it. */
#define TOPO_DL_SONAME "libhwloc.so.15"

/* X(return type, name, parameters, arguments): every function of
 * topology_dl.h but hwloc_topology_destroy (void, below). */
#define TOPO_DL_FUNCTIONS(X)                                                                   \
  X(int, hwloc_bitmap_first, (hwloc_const_bitmap_t a), (a))                                    \
  X(int, hwloc_bitmap_isequal, (hwloc_const_bitmap_t a, hwloc_const_bitmap_t b), (a, b))       \
  X(int, hwloc_bitmap_iszero, (hwloc_const_bitmap_t a), (a))                                   \
  X(int, hwloc_bitmap_list_asprintf, (char **s, hwloc_const_bitmap_t a), (s, a))               \
  X(int, hwloc_bitmap_next, (hwloc_const_bitmap_t a, int prev), (a, prev))                     \
  X(int, hwloc_bitmap_weight, (hwloc_const_bitmap_t a), (a))                                   \
  X(unsigned, hwloc_get_api_version, (void), ())                                               \
  X(unsigned, hwloc_get_nbobjs_by_depth, (hwloc_topology_t t, int depth), (t, depth))          \
  X(hwloc_obj_t, hwloc_get_obj_by_depth, (hwloc_topology_t t, int depth, unsigned idx),        \
    (t, depth, idx))                                                                           \
  X(int, hwloc_get_type_depth, (hwloc_topology_t t, hwloc_obj_type_t type), (t, type))         \
  X(const char *, hwloc_obj_type_string, (hwloc_obj_type_t type), (type))                      \
  X(int, hwloc_topology_init, (hwloc_topology_t * t), (t))                                     \
  X(int, hwloc_topology_load, (hwloc_topology_t t), (t))                                       \
  X(int, hwloc_topology_set_components,                                                        \
    (hwloc_topology_t t, unsigned long flags, const char *name), (t, flags, name))             \
  X(int, hwloc_topology_set_io_types_filter, (hwloc_topology_t t, enum hwloc_type_filter_e f), \
    (t, f))

/* The field names are the renamed ones (the argument is expanded); the
 * symbol looked up is the name as written (#name is not). */
static struct {
#define TOPO_DL_FIELD(ret, name, params, args) ret(*name) params;
  TOPO_DL_FUNCTIONS(TOPO_DL_FIELD)
#undef TOPO_DL_FIELD
  void (*destroy)(hwloc_topology_t t);
} fns;

static int opened; /* 0: not tried, 1: loaded, -1: failed */
static char open_error[256];

int topo_dl_open(char *err, size_t errlen) {
  void *lib;
  if (opened == 0) {
    opened = -1;
    lib = dlopen(TOPO_DL_SONAME, RTLD_NOW | RTLD_LOCAL);
    if (lib == NULL) {
      (void)snprintf(open_error, sizeof open_error,
                     "%s not found (%s): no topology; install hwloc (libhwloc15) to see it",
                     TOPO_DL_SONAME, dlerror());
      goto done;
    }
#define TOPO_DL_LOAD(ret, name, params, args)                                                  \
  *(void **)&fns.name = dlsym(lib, #name);                                                     \
  if (fns.name == NULL) {                                                                      \
    (void)snprintf(open_error, sizeof open_error, "%s has no %s: no topology", TOPO_DL_SONAME, \
                   #name);                                                                     \
    dlclose(lib);                                                                              \
    goto done;                                                                                 \
  }
    TOPO_DL_FUNCTIONS(TOPO_DL_LOAD)
#undef TOPO_DL_LOAD
    *(void **)&fns.destroy = dlsym(lib, "hwloc_topology_destroy");
    if (fns.destroy == NULL) {
      (void)snprintf(open_error, sizeof open_error, "%s has no hwloc_topology_destroy: no topology",
                     TOPO_DL_SONAME);
      dlclose(lib);
      goto done;
    }
    opened = 1; /* kept loaded for the life of the process */
  }
done:
  if (opened == 1)
    return 0;
  if (err != NULL && errlen > 0)
    (void)snprintf(err, errlen, "%s", open_error);
  return -1;
}

#define TOPO_DL_FORWARD(ret, name, params, args) \
  ret name params {                              \
    return fns.name args;                        \
  }
TOPO_DL_FUNCTIONS(TOPO_DL_FORWARD)
#undef TOPO_DL_FORWARD

void hwloc_topology_destroy(hwloc_topology_t t) {
  fns.destroy(t);
}
