/* SPDX-License-Identifier: Apache-2.0 */
/* dlsync-info: what dlsync finds on this machine.
 *
 * Prints the library version, the CUDA driver dlsync loads, each GPU with
 * its NUMA locality, the driver's capabilities and the machine's topology,
 * as text or (--json) as one JSON object. Uses only dlsync's public API; the
 * topology comes from hwloc through topology.h.
 *
 * --version says which libdlsync and libcuda were loaded (and their
 * versions); --selftest runs each row of the decision table on GPU 0
 * (selftest.c).
 *
 * Exit status: 0 when everything could be read (no driver at all is a normal
 * answer, not an error), 1 when something failed, 2 on bad usage; --selftest
 * exits 77 where there is no GPU (nothing tested).
 */
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if defined(__linux__)
#include <dlfcn.h>
#include <getopt.h>
#include <link.h>
#include <limits.h>
#endif

#include "dlsync/context.h"
#include "dlsync/status.h"
#include "dlsync/version.h"
#include "selftest.h"
#include "topology.h"

#define DEFAULT_DRIVER "libcuda.so.1" /* what dlsync opens with a NULL config */
#define GIB (1024.0 * 1024.0 * 1024.0)

/* Something that went wrong: a dlsync status name (or NULL when the failure
 * is not dlsync's) and a message. */
typedef struct problem {
  const char *status;
  char *message;
} problem;

typedef struct gpu_entry {
  dlsync_device_info info;
  problem error; /* dlsync_device_get_info failed */
  topo_locality loc;
  char *loc_error; /* NULL when loc holds the locality */
} gpu_entry;

typedef struct cap_entry {
  uint32_t bit;
  const char *name;
  int present;
  char *message; /* why it is missing */
} cap_entry;

typedef struct report {
  const char *version;
  unsigned version_number;

  int have_driver;      /* a context was created */
  problem driver_error; /* why not, or a later context call that failed */
  int no_driver;        /* the reason is DLSYNC_ERROR_NO_DRIVER: not a failure */
  int driver_version;   /* 0 when unknown */
  char *driver_path;    /* the file libcuda.so.1 resolved to; NULL when unknown */

  int gpu_count;
  gpu_entry *gpus;
  problem gpu_error; /* dlsync_device_count failed */

  size_t cap_count;
  cap_entry caps[32];
  problem cap_error; /* dlsync_context_capabilities failed */

  int have_machine;
  topo_machine machine;
  char *machine_error;

  int failed; /* something besides a missing driver went wrong: exit 1 */
} report;

/* The capabilities listed even when missing; any other bit is listed when
 * the library reports it. */
static const uint32_t known_caps[] = {
    DLSYNC_CAP_CAPTURE_EDGE_DATA,
    DLSYNC_CAP_CAPTURE_TO_USER_GRAPH,
    DLSYNC_CAP_USER_OBJECTS,
    DLSYNC_CAP_GRAPH_ADD_NODE_EDGE_DATA,
};

/* ---- small helpers ---- */

static char *dup_string(const char *s) {
  size_t n;
  char *copy;
  if (s == NULL)
    s = "";
  n = strlen(s) + 1;
  copy = malloc(n);
  if (copy != NULL)
    memcpy(copy, s, n);
  return copy;
}

/* Records the calling thread's last dlsync error as *p. -1 when out of
 * memory. */
static int problem_from_dlsync(problem *p, dlsync_status st) {
  p->status = dlsync_status_name(st);
  p->message = dup_string(dlsync_last_error());
  return p->message != NULL ? 0 : -1;
}

static void problem_clear(problem *p) {
  free(p->message);
  p->message = NULL;
  p->status = NULL;
}

/* "13.0" for 13000, "12.3" for 12030. */
static void format_driver_version(char *buf, size_t len, int version) {
  (void)snprintf(buf, len, "%d.%d", version / 1000, (version % 1000) / 10);
}

static const char *plural(unsigned long long n, const char *one, const char *many) {
  return n == 1 ? one : many;
}

/* The file the dynamic loader picked for libcuda.so.1, when dlsync has it
 * loaded: on a machine with CUDA's forward-compatibility libraries or several
 * drivers installed, which one was found is the first thing to know. NULL
 * when unknown; malloc'ed. */
static char *loaded_driver_path(void) {
  char *path = NULL;
#if defined(__linux__) && defined(RTLD_NOLOAD)
  struct link_map *map = NULL;
  void *handle = dlopen(DEFAULT_DRIVER, RTLD_LAZY | RTLD_NOLOAD);
  if (handle == NULL)
    return NULL;
  if (dlinfo(handle, RTLD_DI_LINKMAP, &map) == 0 && map != NULL && map->l_name != NULL &&
      map->l_name[0] != '\0') {
    char resolved[PATH_MAX];
    path = dup_string(realpath(map->l_name, resolved) != NULL ? resolved : map->l_name);
  }
  (void)dlclose(handle);
#endif
  return path;
}

/* ---- gathering ---- */

static int collect_gpus(report *r, const dlsync_context *ctx, const topo_topology *topo) {
  dlsync_status st;
  int count = 0;
  char err[256];

  st = dlsync_device_count(&count, ctx);
  if (st != DLSYNC_SUCCESS) {
    r->failed = 1;
    return problem_from_dlsync(&r->gpu_error, st);
  }
  if (count <= 0)
    return 0;
  r->gpus = calloc((size_t)count, sizeof *r->gpus);
  if (r->gpus == NULL)
    return -1;
  r->gpu_count = count;

  for (int i = 0; i < count; i++) {
    gpu_entry *g = &r->gpus[i];
    dlsync_device_info init = DLSYNC_DEVICE_INFO_INIT;
    g->info = init;
    st = dlsync_device_get_info(&g->info, ctx, i);
    if (st != DLSYNC_SUCCESS) {
      r->failed = 1;
      if (problem_from_dlsync(&g->error, st) != 0)
        return -1;
      continue;
    }
    /* Be safe with whatever the driver wrote. */
    g->info.name[sizeof g->info.name - 1] = '\0';
    g->info.pci_bus_id[sizeof g->info.pci_bus_id - 1] = '\0';
    if (topo == NULL) {
      g->loc_error = dup_string("no topology (see machine)");
    } else if (topo_pci_locality(&g->loc, topo, g->info.pci_bus_id, err, sizeof err) != 0) {
      /* Not fatal: containers often hide the PCI tree. */
      g->loc_error = dup_string(err);
    } else {
      continue;
    }
    if (g->loc_error == NULL)
      return -1;
  }
  return 0;
}

static int collect_caps(report *r, const dlsync_context *ctx) {
  uint32_t mask = 0;
  dlsync_status st = dlsync_context_capabilities(&mask, ctx);
  if (st != DLSYNC_SUCCESS) {
    r->failed = 1;
    return problem_from_dlsync(&r->cap_error, st);
  }
  for (unsigned b = 0; b < 32 && r->cap_count < sizeof r->caps / sizeof r->caps[0]; b++) {
    uint32_t bit = UINT32_C(1) << b;
    int known = 0;
    cap_entry *c;
    for (size_t k = 0; k < sizeof known_caps / sizeof known_caps[0]; k++) {
      if (known_caps[k] == bit)
        known = 1;
    }
    if (!known && !(mask & bit))
      continue;
    c = &r->caps[r->cap_count++];
    c->bit = bit;
    c->name = dlsync_capability_name((dlsync_capability)bit);
    c->present = (mask & bit) != 0;
    if (c->present)
      continue;
    st = dlsync_context_require(ctx, (dlsync_capability)bit);
    c->message = dup_string(st != DLSYNC_SUCCESS
                                ? dlsync_last_error()
                                : "missing from the capability mask, yet dlsync_context_require "
                                  "accepts it");
    if (c->message == NULL)
      return -1;
  }
  return 0;
}

/* Fills *r. Returns -1 only when out of memory; every other failure is
 * recorded in *r. */
static int collect(report *r) {
  int rc = -1;
  dlsync_context *ctx = NULL;
  topo_topology *topo = NULL;
  dlsync_status st;
  char err[256];
  int loaded;

  r->version = dlsync_version_string();
  r->version_number = dlsync_version();

  loaded = topo_load(&topo, err, sizeof err);
  if (loaded != 0 || topo_machine_get(&r->machine, topo, err, sizeof err) != 0) {
    /* Without hwloc (not built in, or no libhwloc to load): said, not a
     * failure. */
    r->failed = topo_built_in && loaded != -2;
    r->machine_error = dup_string(err);
    if (r->machine_error == NULL)
      goto cleanup;
    topo_destroy(topo);
    topo = NULL;
  } else {
    r->have_machine = 1;
  }

  st = dlsync_context_create(&ctx, NULL);
  if (st != DLSYNC_SUCCESS) {
    if (st == DLSYNC_ERROR_NO_DRIVER) {
      r->no_driver = 1;
    } else {
      r->failed = 1;
    }
    if (problem_from_dlsync(&r->driver_error, st) != 0)
      goto cleanup;
    rc = 0;
    goto cleanup;
  }
  r->have_driver = 1;
  r->driver_path = loaded_driver_path();

  st = dlsync_context_driver_version(&r->driver_version, ctx);
  if (st != DLSYNC_SUCCESS) {
    r->failed = 1;
    r->driver_version = 0;
    if (problem_from_dlsync(&r->driver_error, st) != 0)
      goto cleanup;
  }
  if (collect_gpus(r, ctx, topo) != 0)
    goto cleanup;
  if (collect_caps(r, ctx) != 0)
    goto cleanup;
  rc = 0;

cleanup:
  if (ctx != NULL) {
    st = dlsync_context_destroy(ctx);
    if (st != DLSYNC_SUCCESS) {
      (void)fprintf(stderr, "dlsync-info: dlsync_context_destroy: %s: %s\n", dlsync_status_name(st),
                    dlsync_last_error());
      r->failed = 1;
    }
  }
  topo_destroy(topo);
  return rc;
}

static void report_clear(report *r) {
  problem_clear(&r->driver_error);
  free(r->driver_path);
  for (int i = 0; i < r->gpu_count; i++) {
    problem_clear(&r->gpus[i].error);
    topo_locality_clear(&r->gpus[i].loc);
    free(r->gpus[i].loc_error);
  }
  free(r->gpus);
  problem_clear(&r->gpu_error);
  for (size_t i = 0; i < r->cap_count; i++)
    free(r->caps[i].message);
  problem_clear(&r->cap_error);
  topo_machine_clear(&r->machine);
  free(r->machine_error);
  memset(r, 0, sizeof *r);
}

/* ---- text ---- */

static void print_text_gpu(FILE *f, const report *r, const gpu_entry *g, int index) {
  char prefix[32];
  int indent = snprintf(prefix, sizeof prefix, "GPU %d: ", index);
  const dlsync_device_info *d = &g->info;

  if (indent < 0)
    indent = 0;
  if (g->error.message != NULL) {
    (void)fprintf(f, "%serror %s (%s)\n", prefix, g->error.status, g->error.message);
    return;
  }
  (void)fprintf(f, "%s%s  pci %s  sm %d.%d  %.1f GiB  %d SMs\n", prefix, d->name, d->pci_bus_id,
                d->cc_major, d->cc_minor, (double)d->total_memory / GIB, d->multiprocessors);
  if (g->loc_error != NULL) {
    (void)fprintf(f, "%*snuma unknown (%s)\n", indent, "", g->loc_error);
    return;
  }
  if (g->loc.numa_count == 0) {
    (void)fprintf(f, "%*snuma unknown, local cpus %s", indent, "", g->loc.cpus);
  } else {
    (void)fprintf(f, "%*snuma %s %s, local cpus %s", indent, "",
                  plural(g->loc.numa_count, "node", "nodes"), g->loc.numa_list, g->loc.cpus);
  }
  /* On a machine of one NUMA node, hanging off the root is the normal case. */
  if (g->loc.whole_machine && r->have_machine && r->machine.numa_count > 1) {
    (void)fprintf(f, " (the whole machine: no closer locality known)");
  }
  (void)fputc('\n', f);
}

static void print_text(FILE *f, const report *r) {
  char ver[32];

  (void)fprintf(f, "dlsync %s\n", r->version);

  if (!r->have_driver) {
    if (r->no_driver) {
      (void)fprintf(f, "driver: none found (%s)\n", r->driver_error.message);
    } else {
      (void)fprintf(f, "driver: error %s (%s)\n", r->driver_error.status, r->driver_error.message);
    }
  } else {
    if (r->driver_error.message != NULL) {
      (void)fprintf(f, "driver: CUDA, version unknown: %s (%s)", r->driver_error.status,
                    r->driver_error.message);
    } else {
      format_driver_version(ver, sizeof ver, r->driver_version);
      (void)fprintf(f, "driver: CUDA %s", ver);
    }
    (void)fprintf(f, " (%s)\n", r->driver_path != NULL ? r->driver_path : DEFAULT_DRIVER);

    if (r->gpu_error.message != NULL) {
      (void)fprintf(f, "GPUs: error %s (%s)\n", r->gpu_error.status, r->gpu_error.message);
    } else if (r->gpu_count == 0) {
      (void)fprintf(f, "GPUs: none\n");
    }
    for (int i = 0; i < r->gpu_count; i++)
      print_text_gpu(f, r, &r->gpus[i], i);

    if (r->cap_error.message != NULL) {
      (void)fprintf(f, "capabilities: error %s (%s)\n", r->cap_error.status, r->cap_error.message);
    } else {
      (void)fprintf(f, "capabilities:");
      for (size_t i = 0; i < r->cap_count; i++) {
        (void)fprintf(f, "%s %s %s", i == 0 ? "" : ",", r->caps[i].name,
                      r->caps[i].present ? "yes" : "no");
      }
      (void)fputc('\n', f);
      for (size_t i = 0; i < r->cap_count; i++) {
        const cap_entry *c = &r->caps[i];
        if (c->present)
          continue;
        /* dlsync's message names the capability itself ("user-objects
         * needs ..."); name it here only when it does not. */
        if (strncmp(c->message, c->name, strlen(c->name)) == 0) {
          (void)fprintf(f, "  %s\n", c->message);
        } else {
          (void)fprintf(f, "  %s: %s\n", c->name, c->message);
        }
      }
    }
  }

  if (!r->have_machine) {
    (void)fprintf(f, "machine: unknown (%s)\n", r->machine_error);
    return;
  }
  {
    const topo_machine *m = &r->machine;
    (void)fprintf(f, "machine: %u %s, %u %s, %u %s, %zu %s\n", m->packages,
                  plural(m->packages, "package", "packages"), m->cores,
                  plural(m->cores, "core", "cores"), m->pus, plural(m->pus, "PU", "PUs"),
                  m->numa_count, plural(m->numa_count, "NUMA node", "NUMA nodes"));
    for (size_t i = 0; i < m->numa_count; i++) {
      const topo_numa *n = &m->numa[i];
      if (n->cpus[0] != '\0') {
        (void)fprintf(f, "  numa %u: cpus %s, %.1f GiB\n", n->os_index, n->cpus,
                      (double)n->local_memory / GIB);
      } else {
        (void)fprintf(f, "  numa %u: no cpus, %.1f GiB\n", n->os_index,
                      (double)n->local_memory / GIB);
      }
    }
  }
}

/* ---- JSON ---- */

#define JSON_MAX_DEPTH 16

typedef struct json_writer {
  FILE *f;
  int depth;
  int count[JSON_MAX_DEPTH]; /* values written so far at each depth */
} json_writer;

/* Writes s as a JSON string: quotes, backslashes and control characters
 * escaped, valid UTF-8 passed through, every invalid byte replaced by
 * U+FFFD so that the output stays valid JSON whatever a driver reports. */
static void json_string(FILE *f, const char *s) {
  const unsigned char *p = (const unsigned char *)s;
  (void)fputc('"', f);
  while (*p != '\0') {
    unsigned char c = *p;
    size_t len = 0;
    if (c == '"' || c == '\\') {
      (void)fputc('\\', f);
      (void)fputc(c, f);
      p++;
      continue;
    }
    if (c < 0x20) {
      switch (c) {
      case '\b':
        (void)fputs("\\b", f);
        break;
      case '\f':
        (void)fputs("\\f", f);
        break;
      case '\n':
        (void)fputs("\\n", f);
        break;
      case '\r':
        (void)fputs("\\r", f);
        break;
      case '\t':
        (void)fputs("\\t", f);
        break;
      default:
        (void)fprintf(f, "\\u%04x", (unsigned)c);
        break;
      }
      p++;
      continue;
    }
    if (c < 0x80) {
      (void)fputc(c, f);
      p++;
      continue;
    }
    /* A multi-byte sequence: its length and the range of its second byte
     * (which rules out overlong forms, surrogates and values past U+10FFFF). */
    {
      unsigned char lo = 0x80, hi = 0xbf;
      if (c >= 0xc2 && c <= 0xdf) {
        len = 2;
      } else if (c >= 0xe0 && c <= 0xef) {
        len = 3;
        if (c == 0xe0)
          lo = 0xa0;
        if (c == 0xed)
          hi = 0x9f;
      } else if (c >= 0xf0 && c <= 0xf4) {
        len = 4;
        if (c == 0xf0)
          lo = 0x90;
        if (c == 0xf4)
          hi = 0x8f;
      }
      if (len != 0 && (p[1] < lo || p[1] > hi))
        len = 0;
      for (size_t k = 2; k < len; k++) {
        if (p[k] < 0x80 || p[k] > 0xbf)
          len = 0;
      }
    }
    if (len == 0) {
      (void)fputs("\\ufffd", f);
      p++;
    } else {
      (void)fwrite(p, 1, len, f);
      p += len;
    }
  }
  (void)fputc('"', f);
}

/* Starts a value: the comma and line break before it, then "key": when
 * key is not NULL (inside an object). */
static void json_key(json_writer *w, const char *key) {
  if (w->depth > 0) {
    if (w->count[w->depth - 1]++ > 0)
      (void)fputc(',', w->f);
    (void)fprintf(w->f, "\n%*s", 2 * w->depth, "");
  }
  if (key != NULL) {
    json_string(w->f, key);
    (void)fputs(": ", w->f);
  }
}

static void json_open(json_writer *w, const char *key, char bracket) {
  json_key(w, key);
  (void)fputc(bracket, w->f);
  if (w->depth < JSON_MAX_DEPTH)
    w->count[w->depth] = 0;
  w->depth++;
}

static void json_close(json_writer *w, char bracket) {
  w->depth--;
  if (w->depth < JSON_MAX_DEPTH && w->count[w->depth] > 0) {
    (void)fprintf(w->f, "\n%*s", 2 * w->depth, "");
  }
  (void)fputc(bracket, w->f);
}

static void json_str(json_writer *w, const char *key, const char *value) {
  json_key(w, key);
  if (value == NULL) {
    (void)fputs("null", w->f);
  } else {
    json_string(w->f, value);
  }
}

static void json_int(json_writer *w, const char *key, long long value) {
  json_key(w, key);
  (void)fprintf(w->f, "%lld", value);
}

static void json_u64(json_writer *w, const char *key, uint64_t value) {
  json_key(w, key);
  (void)fprintf(w->f, "%" PRIu64, value);
}

static void json_bool(json_writer *w, const char *key, int value) {
  json_key(w, key);
  (void)fputs(value ? "true" : "false", w->f);
}

/* "error": {"status": ..., "message": ...}, or nothing when p is empty. */
static void json_problem(json_writer *w, const char *key, const problem *p) {
  if (p->message == NULL)
    return;
  json_open(w, key, '{');
  json_str(w, "status", p->status);
  json_str(w, "message", p->message);
  json_close(w, '}');
}

static void print_json_gpu(json_writer *w, const gpu_entry *g, int index) {
  const dlsync_device_info *d = &g->info;
  char cc[32];

  json_open(w, NULL, '{');
  json_int(w, "ordinal", index);
  if (g->error.message != NULL) {
    json_problem(w, "error", &g->error);
    json_close(w, '}');
    return;
  }
  (void)snprintf(cc, sizeof cc, "%d.%d", d->cc_major, d->cc_minor);
  json_str(w, "name", d->name);
  json_str(w, "pci_bus_id", d->pci_bus_id);
  json_str(w, "compute_capability", cc);
  json_u64(w, "total_memory_bytes", (uint64_t)d->total_memory);
  json_int(w, "multiprocessors", d->multiprocessors);
  if (g->loc_error != NULL) {
    json_str(w, "locality_error", g->loc_error);
  } else {
    json_open(w, "numa_nodes", '[');
    for (size_t i = 0; i < g->loc.numa_count; i++)
      json_u64(w, NULL, g->loc.numa_nodes[i]);
    json_close(w, ']');
    json_str(w, "local_cpus", g->loc.cpus);
    json_bool(w, "locality_is_whole_machine", g->loc.whole_machine);
  }
  json_close(w, '}');
}

static void print_json(FILE *f, const report *r) {
  json_writer w;
  char ver[32];

  memset(&w, 0, sizeof w);
  w.f = f;
  json_open(&w, NULL, '{');

  json_open(&w, "dlsync", '{');
  json_str(&w, "version", r->version);
  json_u64(&w, "version_number", r->version_number);
  json_close(&w, '}');

  json_open(&w, "driver", '{');
  json_bool(&w, "found", r->have_driver);
  json_str(&w, "library", DEFAULT_DRIVER);
  if (r->have_driver) {
    json_str(&w, "path", r->driver_path);
    if (r->driver_version != 0) {
      format_driver_version(ver, sizeof ver, r->driver_version);
      json_int(&w, "version", r->driver_version);
      json_str(&w, "version_string", ver);
    }
  }
  json_problem(&w, "error", &r->driver_error);
  json_close(&w, '}');

  json_open(&w, "gpus", '[');
  for (int i = 0; i < r->gpu_count; i++)
    print_json_gpu(&w, &r->gpus[i], i);
  json_close(&w, ']');
  json_problem(&w, "gpus_error", &r->gpu_error);

  json_open(&w, "capabilities", '{');
  for (size_t i = 0; i < r->cap_count; i++) {
    json_open(&w, r->caps[i].name, '{');
    json_bool(&w, "supported", r->caps[i].present);
    if (r->caps[i].message != NULL)
      json_str(&w, "message", r->caps[i].message);
    json_close(&w, '}');
  }
  json_close(&w, '}');
  json_problem(&w, "capabilities_error", &r->cap_error);

  json_open(&w, "machine", '{');
  if (!r->have_machine) {
    json_str(&w, "error", r->machine_error);
  } else {
    const topo_machine *m = &r->machine;
    json_u64(&w, "packages", m->packages);
    json_u64(&w, "cores", m->cores);
    json_u64(&w, "pus", m->pus);
    json_u64(&w, "total_memory_bytes", m->total_memory);
    json_open(&w, "numa_nodes", '[');
    for (size_t i = 0; i < m->numa_count; i++) {
      json_open(&w, NULL, '{');
      json_u64(&w, "os_index", m->numa[i].os_index);
      json_str(&w, "cpus", m->numa[i].cpus);
      json_u64(&w, "memory_bytes", m->numa[i].local_memory);
      json_close(&w, '}');
    }
    json_close(&w, ']');
  }
  json_close(&w, '}');

  json_bool(&w, "ok", !r->failed);
  json_close(&w, '}');
  (void)fputc('\n', f);
}

/* ---- main ---- */

static void usage(FILE *f) {
  (void)fputs("usage: dlsync-info [--json] [--version] [--selftest] [--help]\n"
              "\n"
              "Prints the dlsync version, the CUDA driver it loads, each GPU with its NUMA\n"
              "locality, the driver's capabilities and the machine's topology (hwloc).\n"
              "\n"
              "  --json      print one JSON object instead of text (the report, or with\n"
              "              --version the versions and paths)\n"
              "  --version   the library and header versions, the paths of the loaded\n"
              "              libdlsync, libcuda and libhwloc, the driver version\n"
              "  --selftest  run each row of the decision table on GPU 0 with a data check\n"
              "              and a negative control; exit 0 when all pass, 77 without a GPU\n"
              "  --help      print this help and exit\n"
              "\n"
              "--version and --selftest together run both, in that order. --help with\n"
              "valid options prints this; an unknown option or argument anywhere, or\n"
              "--json with --selftest, is bad usage.\n"
              "\n"
              "Exit status: 0 when everything could be read (no driver is not an error),\n"
              "1 when something failed, 2 on bad usage; with --selftest its own status\n"
              "(77: no GPU) unless --version failed first.\n",
              f);
}

/* The file a loaded library came from: dladdr on one of its symbols. */
static const char *path_of(const void *symbol, char *buf, size_t len) {
#if defined(__linux__)
  Dl_info info;
  if (dladdr(symbol, &info) != 0 && info.dli_fname != NULL) {
    char resolved[PATH_MAX];
    (void)snprintf(buf, len, "%s",
                   realpath(info.dli_fname, resolved) != NULL ? resolved : info.dli_fname);
    return buf;
  }
#endif
  (void)snprintf(buf, len, "(unknown)");
  return buf;
}

/* The path of a library already loaded or loadable by soname, or NULL. */
static char *soname_path(const char *soname) {
  char *path = NULL;
#if defined(__linux__)
  struct link_map *map = NULL;
  void *handle = dlopen(soname, RTLD_LAZY);
  if (handle == NULL)
    return NULL;
  if (dlinfo(handle, RTLD_DI_LINKMAP, &map) == 0 && map != NULL && map->l_name != NULL) {
    char resolved[PATH_MAX];
    path = dup_string(realpath(map->l_name, resolved) != NULL ? resolved : map->l_name);
  }
  (void)dlclose(handle);
#else
  (void)soname;
#endif
  return path;
}

/* --version (json: one JSON object). Exit 1 when the library is not the
 * version of the headers this program was compiled with. */
static int print_version(FILE *f, int json) {
  char buf[4096], dv[32];
  dlsync_context *ctx = NULL;
  int driver_version = 0;
  int match = dlsync_version() == DLSYNC_VERSION;
  char *cuda, *hwloc;
  const char *lib;
  dlsync_status st;
  unsigned (*fn)(void) = dlsync_version;
  const void *sym;
  memcpy(&sym, &fn, sizeof sym); /* a function's address as dladdr takes it */
  lib = path_of(sym, buf, sizeof buf);
  st = dlsync_context_default(&ctx); /* loads the driver as any user would */
  cuda = loaded_driver_path();
  if (st == DLSYNC_SUCCESS && dlsync_context_driver_version(&driver_version, ctx) == DLSYNC_SUCCESS)
    format_driver_version(dv, sizeof dv, driver_version);
  else
    (void)snprintf(dv, sizeof dv, "unknown");
  hwloc = soname_path("libhwloc.so.15");
  if (json) {
    json_writer w;
    memset(&w, 0, sizeof w);
    w.f = f;
    json_open(&w, NULL, '{');
    json_str(&w, "library_version", dlsync_version_string());
    json_u64(&w, "library_version_number", dlsync_version());
    json_str(&w, "headers_version", DLSYNC_VERSION_STRING);
    json_u64(&w, "headers_version_number", (unsigned)DLSYNC_VERSION);
    json_bool(&w, "versions_match", match);
    json_str(&w, "libdlsync", lib);
    if (cuda != NULL) {
      json_str(&w, "libcuda", cuda);
      json_str(&w, "driver_version", dv);
    } else {
      json_str(&w, "libcuda", NULL);
      json_str(&w, "libcuda_error", st == DLSYNC_SUCCESS ? "(no path known)" : dlsync_last_error());
    }
    json_str(&w, "libhwloc", hwloc);
    json_close(&w, '}');
    (void)fputc('\n', f);
  } else {
    (void)fprintf(f, "dlsync library %s (%u), headers %s (%u)%s\n", dlsync_version_string(),
                  dlsync_version(), DLSYNC_VERSION_STRING, (unsigned)DLSYNC_VERSION,
                  match ? "" : ": MISMATCH");
    (void)fprintf(f, "libdlsync: %s\n", lib);
    if (cuda != NULL)
      (void)fprintf(f, "libcuda: %s (driver %s)\n", cuda, dv);
    else
      (void)fprintf(f, "libcuda: not loaded: %s\n",
                    st == DLSYNC_SUCCESS ? "(no path known)" : dlsync_last_error());
    (void)fprintf(f, "libhwloc: %s\n",
                  hwloc != NULL ? hwloc
                                : "libhwloc.so.15 not found: reclaimer threads are not bound "
                                  "near their GPU");
  }
  free(cuda);
  free(hwloc);
  return match ? 0 : 1;
}

/* "dlsync-info: <what> '<arg>'" (arg NULL: none), then usage; exit 2. */
static int usage_error(const char *what, const char *arg) {
  if (arg != NULL)
    (void)fprintf(stderr, "dlsync-info: %s '%s'\n", what, arg);
  else
    (void)fprintf(stderr, "dlsync-info: %s\n", what);
  usage(stderr);
  return 2;
}

int main(int argc, char **argv) {
  static const struct option options[] = {{"json", no_argument, NULL, 'j'},
                                          {"version", no_argument, NULL, 'V'},
                                          {"selftest", no_argument, NULL, 's'},
                                          {"help", no_argument, NULL, 'h'},
                                          {NULL, 0, NULL, 0}};
  report r;
  int json = 0, version = 0, selftest = 0, help = 0;
  int status = 1;
  int c;

  /* Every option is read before anything runs: a bad one anywhere is a
   * usage error (exit 2), whatever else was asked. "+": stop at the first
   * argument that is not an option (none is taken). */
  opterr = 0;
  while ((c = getopt_long(argc, argv, "+h", options, NULL)) != -1) {
    switch (c) {
    case 'j':
      json = 1;
      break;
    case 'V':
      version = 1;
      break;
    case 's':
      selftest = 1;
      break;
    case 'h':
      help = 1;
      break;
    default:
      /* A long option is named as written: getopt_long gives optopt the
       * option's value (not a letter the user typed) when a known option
       * was given a value it takes none of (--version=1), 0 when unknown. */
      if (strncmp(argv[optind - 1], "--", 2) == 0)
        return usage_error(optopt != 0 && strchr(argv[optind - 1], '=') != NULL
                               ? "option takes no value"
                               : "unknown option",
                           argv[optind - 1]);
      if (optopt != 0 && optopt != '?')
        return usage_error("unknown option", (char[]){'-', (char)optopt, '\0'});
      return usage_error("unknown option", argv[optind - 1]);
    }
  }
  if (optind < argc)
    return usage_error("unexpected argument", argv[optind]);
  if (json && selftest)
    return usage_error("--selftest has no JSON form: run it without --json", NULL);
  if (help) {
    usage(stdout);
    return fflush(stdout) == 0 ? 0 : 1;
  }
  /* --version and --selftest: each runs, in that order; the exit status
   * is the first that is not 0. */
  if (version || selftest) {
    status = 0;
    if (version)
      status = print_version(stdout, json);
    if (selftest) {
      int st = selftest_run(stdout);
      if (status == 0)
        status = st;
    }
    return fflush(stdout) == 0 ? status : 1;
  }
  memset(&r, 0, sizeof r);
  if (collect(&r) != 0) {
    (void)fprintf(stderr, "dlsync-info: out of memory\n");
    goto cleanup;
  }
  if (json) {
    print_json(stdout, &r);
  } else {
    print_text(stdout, &r);
  }
  if (fflush(stdout) != 0 || ferror(stdout)) {
    (void)fprintf(stderr, "dlsync-info: writing the report failed\n");
    goto cleanup;
  }
  status = r.failed ? 1 : 0;

cleanup:
  report_clear(&r);
  return status;
}
