/* SPDX-License-Identifier: Apache-2.0 */
/* dlsync-info: the hwloc side. See topology.h.
 *
 * PCI devices are found from the bus id the CUDA driver reports, never
 * through hwloc/cuda.h or hwloc/nvml.h: those link libcuda or NVML, and
 * dlsync-info must start on a machine without either.
 */
#include "topology.h"

#include <errno.h>
#ifdef TOPO_HWLOC_DLOPEN
/* The wheel's dlsync-info: hwloc's functions are forwarders to
 * libhwloc.so.15 loaded at run time; nothing of hwloc is linked. */
#include "topology_dl.h"
#endif
#include <hwloc.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if HWLOC_API_VERSION < 0x00020000
#error "dlsync-info needs hwloc 2.0 or newer"
#endif

#if defined(__GNUC__)
#define TOPO_PRINTF(fmt, args) __attribute__((format(printf, fmt, args)))
#else
#define TOPO_PRINTF(fmt, args)
#endif

struct topo_topology {
  hwloc_topology_t h;
};

static int fail(char *err, size_t errlen, const char *fmt, ...) TOPO_PRINTF(3, 4);

static int fail(char *err, size_t errlen, const char *fmt, ...) {
  if (err != NULL && errlen > 0) {
    va_list ap;
    va_start(ap, fmt);
    (void)vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
  }
  return -1;
}

/* A malloc'ed list string of a bitmap ("0-15,32"); "" for NULL or empty. */
static char *bitmap_list(hwloc_const_bitmap_t set) {
  char *s = NULL;
  if (set == NULL || hwloc_bitmap_iszero(set)) {
    s = malloc(1);
    if (s != NULL)
      s[0] = '\0';
    return s;
  }
  if (hwloc_bitmap_list_asprintf(&s, set) < 0) {
    free(s);
    return NULL;
  }
  return s;
}

/* Discovery components kept out of the topology. The GPU ones (cuda, nvml,
 * opencl, rsmi, levelzero, gl) would load vendor libraries, libcuda among
 * them, and open the devices; dlsync-info finds GPUs through dlsync and only
 * asks hwloc where their PCI bus ids sit. On Linux the "linux" component reads
 * PCI devices from sysfs, so libpciaccess ("pci") is not needed either; it
 * also keeps a cache of PCI names that is never freed. */
static const char *const excluded_components[] = {
    "cuda", "nvml", "opencl", "rsmi", "levelzero", "gl",
#if defined(__linux__)
    "pci",
#endif
};

const int topo_built_in = 1;

int topo_load(topo_topology **out, char *err, size_t errlen) {
  int rc = -1;
  topo_topology *topo = NULL;
  int initialised = 0;

  if (out == NULL)
    return fail(err, errlen, "topo_load: out is NULL");
  *out = NULL;
#ifdef TOPO_HWLOC_DLOPEN
  if (topo_dl_open(err, errlen) != 0)
    return -2;
#endif

  /* The library loaded at run time must speak the ABI compiled against. */
  if ((hwloc_get_api_version() >> 16) != (HWLOC_API_VERSION >> 16)) {
    rc = fail(err, errlen, "hwloc library API 0x%x does not match headers 0x%x",
              hwloc_get_api_version(), (unsigned)HWLOC_API_VERSION);
    goto cleanup;
  }
  topo = calloc(1, sizeof *topo);
  if (topo == NULL) {
    rc = fail(err, errlen, "out of memory");
    goto cleanup;
  }
  if (hwloc_topology_init(&topo->h) != 0) {
    rc = fail(err, errlen, "hwloc_topology_init failed: %s", strerror(errno));
    goto cleanup;
  }
  initialised = 1;
  /* PCI devices are off by default; keep the ones that matter (GPUs among
   * them) and the bridges that place them. */
  if (hwloc_topology_set_io_types_filter(topo->h, HWLOC_TYPE_FILTER_KEEP_IMPORTANT) != 0) {
    rc = fail(err, errlen, "hwloc_topology_set_io_types_filter failed: %s", strerror(errno));
    goto cleanup;
  }
  for (size_t i = 0; i < sizeof excluded_components / sizeof excluded_components[0]; i++) {
    /* EINVAL: this hwloc has no such component, so nothing to exclude. */
    if (hwloc_topology_set_components(topo->h, HWLOC_TOPOLOGY_COMPONENTS_FLAG_BLACKLIST,
                                      excluded_components[i]) != 0 &&
        errno != EINVAL) {
      rc = fail(err, errlen, "hwloc_topology_set_components(\"%s\") failed: %s",
                excluded_components[i], strerror(errno));
      goto cleanup;
    }
  }
  if (hwloc_topology_load(topo->h) != 0) {
    rc = fail(err, errlen, "hwloc_topology_load failed: %s", strerror(errno));
    goto cleanup;
  }
  *out = topo;
  topo = NULL;
  rc = 0;

cleanup:
  if (topo != NULL) {
    if (initialised)
      hwloc_topology_destroy(topo->h);
    free(topo);
  }
  return rc;
}

void topo_destroy(topo_topology *topo) {
  if (topo == NULL)
    return;
  hwloc_topology_destroy(topo->h);
  free(topo);
}

static int count_type(unsigned *out, hwloc_topology_t h, hwloc_obj_type_t type, char *err,
                      size_t errlen) {
  int n = hwloc_get_nbobjs_by_type(h, type);
  if (n < 0) {
    return fail(err, errlen, "hwloc finds %s objects at several depths",
                hwloc_obj_type_string(type));
  }
  *out = (unsigned)n;
  return 0;
}

int topo_machine_get(topo_machine *out, const topo_topology *topo, char *err, size_t errlen) {
  int rc = -1;
  topo_machine m;
  hwloc_obj_t root;
  unsigned numa = 0;

  memset(&m, 0, sizeof m);
  if (out == NULL || topo == NULL)
    return fail(err, errlen, "topo_machine_get: NULL argument");
  memset(out, 0, sizeof *out);

  if (count_type(&m.packages, topo->h, HWLOC_OBJ_PACKAGE, err, errlen) != 0)
    goto cleanup;
  if (count_type(&m.cores, topo->h, HWLOC_OBJ_CORE, err, errlen) != 0)
    goto cleanup;
  if (count_type(&m.pus, topo->h, HWLOC_OBJ_PU, err, errlen) != 0)
    goto cleanup;
  if (count_type(&numa, topo->h, HWLOC_OBJ_NUMANODE, err, errlen) != 0)
    goto cleanup;

  root = hwloc_get_root_obj(topo->h);
  if (root != NULL)
    m.total_memory = root->total_memory;

  if (numa > 0) {
    m.numa = calloc(numa, sizeof *m.numa);
    if (m.numa == NULL) {
      rc = fail(err, errlen, "out of memory");
      goto cleanup;
    }
  }
  for (unsigned i = 0; i < numa; i++) {
    hwloc_obj_t node = hwloc_get_obj_by_type(topo->h, HWLOC_OBJ_NUMANODE, i);
    topo_numa *n = &m.numa[m.numa_count];
    if (node == NULL) {
      rc = fail(err, errlen, "hwloc has no NUMA node of logical index %u", i);
      goto cleanup;
    }
    n->os_index = node->os_index;
    n->local_memory = node->attr != NULL ? node->attr->numanode.local_memory : 0;
    n->cpus = bitmap_list(node->cpuset);
    if (n->cpus == NULL) {
      rc = fail(err, errlen, "out of memory");
      goto cleanup;
    }
    m.numa_count++;
  }
  *out = m;
  memset(&m, 0, sizeof m);
  rc = 0;

cleanup:
  topo_machine_clear(&m);
  return rc;
}

void topo_machine_clear(topo_machine *machine) {
  if (machine == NULL)
    return;
  for (size_t i = 0; i < machine->numa_count; i++)
    free(machine->numa[i].cpus);
  free(machine->numa);
  memset(machine, 0, sizeof *machine);
}

static int hex_digit(char c) {
  if (c >= '0' && c <= '9')
    return c - '0';
  if (c >= 'a' && c <= 'f')
    return c - 'a' + 10;
  if (c >= 'A' && c <= 'F')
    return c - 'A' + 10;
  return -1;
}

/* Reads 1 to 8 hex digits at *p and advances past them. */
static int parse_hex_field(const char **p, unsigned *out) {
  unsigned v = 0;
  int digits = 0;
  int d;
  while (digits < 8 && (d = hex_digit(**p)) >= 0) {
    v = v * 16u + (unsigned)d;
    (*p)++;
    digits++;
  }
  if (digits == 0 || hex_digit(**p) >= 0)
    return -1; /* none, or more than 8 */
  *out = v;
  return 0;
}

int topo_parse_pci_bus_id(const char *bus_id, unsigned *domain, unsigned *bus, unsigned *dev,
                          unsigned *func) {
  const char *p = bus_id;
  unsigned a, b, c = 0, f;
  int has_domain = 0;

  if (p == NULL)
    return -1;
  if (parse_hex_field(&p, &a) != 0 || *p++ != ':')
    return -1;
  if (parse_hex_field(&p, &b) != 0)
    return -1;
  if (*p == ':') {
    p++;
    if (parse_hex_field(&p, &c) != 0)
      return -1;
    has_domain = 1;
  }
  if (*p++ != '.' || parse_hex_field(&p, &f) != 0 || *p != '\0')
    return -1;

  if (!has_domain) {
    c = b;
    b = a;
    a = 0;
  }
  if (b > 0xffu || c > 0x1fu || f > 0x7u)
    return -1;
  if (domain != NULL)
    *domain = a;
  if (bus != NULL)
    *bus = b;
  if (dev != NULL)
    *dev = c;
  if (func != NULL)
    *func = f;
  return 0;
}

int topo_pci_locality(topo_locality *out, const topo_topology *topo, const char *bus_id, char *err,
                      size_t errlen) {
  int rc = -1;
  topo_locality loc;
  unsigned domain, bus, dev, func;
  hwloc_obj_t pci, anc, root;
  int weight;

  memset(&loc, 0, sizeof loc);
  if (out == NULL || topo == NULL || bus_id == NULL) {
    return fail(err, errlen, "topo_pci_locality: NULL argument");
  }
  memset(out, 0, sizeof *out);

  if (topo_parse_pci_bus_id(bus_id, &domain, &bus, &dev, &func) != 0) {
    rc = fail(err, errlen, "\"%s\" is not a PCI bus id", bus_id);
    goto cleanup;
  }
  pci = hwloc_get_pcidev_by_busid(topo->h, domain, bus, dev, func);
  if (pci == NULL) {
    rc = fail(err, errlen, "hwloc does not see PCI device %s", bus_id);
    goto cleanup;
  }
  anc = hwloc_get_non_io_ancestor_obj(topo->h, pci);
  if (anc == NULL || anc->cpuset == NULL) {
    rc = fail(err, errlen, "hwloc gives PCI device %s no CPU ancestor", bus_id);
    goto cleanup;
  }
  root = hwloc_get_root_obj(topo->h);
  loc.whole_machine =
      root != NULL && root->cpuset != NULL && hwloc_bitmap_isequal(anc->cpuset, root->cpuset);

  loc.cpus = bitmap_list(anc->cpuset);
  loc.numa_list = bitmap_list(anc->nodeset);
  if (loc.cpus == NULL || loc.numa_list == NULL) {
    rc = fail(err, errlen, "out of memory");
    goto cleanup;
  }
  weight = anc->nodeset != NULL ? hwloc_bitmap_weight(anc->nodeset) : 0;
  if (weight < 0) {
    rc = fail(err, errlen, "hwloc gives PCI device %s an infinite nodeset", bus_id);
    goto cleanup;
  }
  if (weight > 0) {
    int idx;
    loc.numa_nodes = calloc((size_t)weight, sizeof *loc.numa_nodes);
    if (loc.numa_nodes == NULL) {
      rc = fail(err, errlen, "out of memory");
      goto cleanup;
    }
    for (idx = hwloc_bitmap_first(anc->nodeset); idx >= 0 && loc.numa_count < (size_t)weight;
         idx = hwloc_bitmap_next(anc->nodeset, idx)) {
      loc.numa_nodes[loc.numa_count++] = (unsigned)idx;
    }
  }
  *out = loc;
  memset(&loc, 0, sizeof loc);
  rc = 0;

cleanup:
  topo_locality_clear(&loc);
  return rc;
}

void topo_locality_clear(topo_locality *loc) {
  if (loc == NULL)
    return;
  free(loc->cpus);
  free(loc->numa_list);
  free(loc->numa_nodes);
  memset(loc, 0, sizeof *loc);
}
