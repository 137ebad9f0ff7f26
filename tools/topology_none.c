/* SPDX-License-Identifier: Apache-2.0 */
/* dlsync-info built where hwloc's headers were not found:
 * topology.h's functions, each saying the topology is not built in. The
 * library itself still binds its threads with hwloc when libhwloc.so.15 is
 * there (driver/hwloc.c dlopens it). */
#include <stdio.h>
#include <string.h>

#include "topology.h"

const int topo_built_in = 0;

static int not_built(char *err, size_t errlen) {
  (void)snprintf(err, errlen,
                 "this dlsync-info was built without hwloc's headers: no "
                 "topology; a build with libhwloc-dev (hwloc >= 2.1) shows it");
  return -1;
}

int topo_load(topo_topology **out, char *err, size_t errlen) {
  *out = NULL;
  return not_built(err, errlen);
}

void topo_destroy(topo_topology *topo) {
  (void)topo;
}

int topo_machine_get(topo_machine *out, const topo_topology *topo, char *err, size_t errlen) {
  (void)topo;
  memset(out, 0, sizeof *out);
  return not_built(err, errlen);
}

void topo_machine_clear(topo_machine *machine) {
  (void)machine;
}

int topo_parse_pci_bus_id(const char *bus_id, unsigned *domain, unsigned *bus, unsigned *dev,
                          unsigned *func) {
  *domain = 0;
  if (sscanf(bus_id, "%x:%x:%x.%x", domain, bus, dev, func) == 4 ||
      sscanf(bus_id, "%x:%x.%x", bus, dev, func) == 3)
    return 0;
  return -1;
}

int topo_pci_locality(topo_locality *out, const topo_topology *topo, const char *bus_id, char *err,
                      size_t errlen) {
  (void)topo;
  (void)bus_id;
  memset(out, 0, sizeof *out);
  return not_built(err, errlen);
}

void topo_locality_clear(topo_locality *loc) {
  (void)loc;
}
