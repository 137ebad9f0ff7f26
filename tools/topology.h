/* SPDX-License-Identifier: Apache-2.0 */
/* dlsync-info: the machine as hwloc sees it, behind plain structs.
 *
 * This is the only part of dlsync-info that knows hwloc; nothing here is part
 * of the library or its public API. Every string handed out is owned by the
 * struct that holds it and freed by the matching *_clear function; a cleared
 * (or zero-initialised) struct may be cleared again.
 *
 * Errors: functions return 0 on success and -1 on failure, with a message in
 * the caller's buffer (never longer than errlen - 1, always terminated).
 *
 * Threads: one topo_topology may be read from several threads at once, but
 * is created and destroyed by one.
 */
#ifndef DLSYNC_TOOLS_TOPOLOGY_H
#define DLSYNC_TOOLS_TOPOLOGY_H

#include <stddef.h>
#include <stdint.h>

typedef struct topo_topology topo_topology;

/* 1 in topology.c (hwloc, linked or loaded at run time), 0 in
 * topology_none.c (built without hwloc: every function below fails saying
 * so, and that is not a failure of the report). */
extern const int topo_built_in;

/* One NUMA node. */
typedef struct topo_numa {
  unsigned os_index;     /* the OS's number for it ("node 0") */
  char *cpus;            /* cpuset list, "0-15,32-47"; "" when it has no CPUs */
  uint64_t local_memory; /* bytes; 0 when unknown */
} topo_numa;

/* The whole machine. */
typedef struct topo_machine {
  unsigned packages;
  unsigned cores;
  unsigned pus;
  uint64_t total_memory; /* bytes, over all NUMA nodes; 0 when unknown */
  size_t numa_count;
  topo_numa *numa; /* numa_count entries, in logical order */
} topo_machine;

/* Where a PCI device sits: the CPUs and NUMA nodes of its closest non-I/O
 * ancestor. */
typedef struct topo_locality {
  char *cpus;           /* cpuset list of the local CPUs, "0-15" */
  char *numa_list;      /* nodeset list, "0" or "0-1"; "" when none is known */
  size_t numa_count;    /* entries in numa_nodes */
  unsigned *numa_nodes; /* OS indices of the local NUMA nodes */
  int whole_machine;    /* 1 when the device hangs off the root: no locality known */
} topo_locality;

/* Loads the topology of this machine, PCI devices included. Returns -2
 * (with the message) where this dlsync-info loads libhwloc at run time
 * (topology_dl.c, the wheel's) and none could be loaded: said, not a failure
 * of the report. */
int topo_load(topo_topology **out, char *err, size_t errlen);

/* NULL is a no-op. */
void topo_destroy(topo_topology *topo);

/* Fills *out; clear it with topo_machine_clear. */
int topo_machine_get(topo_machine *out, const topo_topology *topo, char *err, size_t errlen);
void topo_machine_clear(topo_machine *machine);

/* Splits "0000:19:00.0" (domain optional, hexadecimal fields) into its parts.
 * Returns 0, or -1 when the string is not a PCI bus id. */
int topo_parse_pci_bus_id(const char *bus_id, unsigned *domain, unsigned *bus, unsigned *dev,
                          unsigned *func);

/* Finds the PCI device with that bus id ("0000:19:00.0") and fills *out with
 * its locality; clear it with topo_locality_clear. Fails when the bus id does
 * not parse or hwloc does not know the device (a container may hide /sys). */
int topo_pci_locality(topo_locality *out, const topo_topology *topo, const char *bus_id, char *err,
                      size_t errlen);
void topo_locality_clear(topo_locality *loc);

#endif
