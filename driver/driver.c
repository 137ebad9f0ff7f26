/* SPDX-License-Identifier: Apache-2.0 */
/* The CUDA driver table: libcuda.so.1 loaded with dlopen, each entry point
 * resolved once with cuGetProcAddress at the ABI version pinned in
 * driver/driver.h. This file is the only one that knows how
 * libcuda is found. */
#include <dlfcn.h>
#include <stdarg.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "driver/driver.h"

const dlsync__driver_entry_info dlsync__driver_entries[DLSYNC__DRIVER_ENTRY_COUNT] = {
#define DLSYNC__DRIVER_INFO(name, pfn, ver, need) \
  {"cu" #name, ver, need, offsetof(dlsync__driver, name)},
    DLSYNC__DRIVER_ENTRIES(DLSYNC__DRIVER_INFO)
#undef DLSYNC__DRIVER_INFO
};

/* Loaded tables, one per dlopen path, kept for the life of the process. */
typedef struct loaded_driver {
  struct loaded_driver *next;
  char *path;
  bool support; /* the SUPPORT entries resolved too (dlsync__driver_load_all) */
  dlsync__driver table;
} loaded_driver;

static pthread_mutex_t load_lock = PTHREAD_MUTEX_INITIALIZER;
static loaded_driver *loaded;

static void **entry_slot(dlsync__driver *d, size_t i) {
  return (void **)((char *)d + dlsync__driver_entries[i].offset);
}

static void *entry_value(const dlsync__driver *d, size_t i) {
  void *const *slot = (void *const *)((const char *)d + dlsync__driver_entries[i].offset);
  return *slot;
}

static dlsync_status load_one(dlsync__driver *t, const char *path, bool support) {
  dlsync_status st = DLSYNC_SUCCESS;
  PFN_cuGetProcAddress_v12000 get_proc = NULL;
  void *lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  CUresult r;
  if (lib == NULL) {
    const char *why = dlerror();
    st = dlsync__fail(DLSYNC_ERROR_NO_DRIVER,
                      "dlopen(\"%s\") failed: %s; no NVIDIA driver is installed, or its "
                      "libcuda.so.1 is not on the loader's path",
                      path, why != NULL ? why : "unknown error");
    goto cleanup;
  }
  /* cuGetProcAddress_v2 has existed since driver 12.0. */
  *(void **)&get_proc = dlsym(lib, "cuGetProcAddress_v2");
  if (get_proc == NULL) {
    st = dlsync__fail(DLSYNC_ERROR_DRIVER_TOO_OLD,
                      "%s has no cuGetProcAddress_v2: dlsync needs a CUDA 12.0 or newer driver",
                      path);
    goto cleanup;
  }
  for (size_t i = 0; i < DLSYNC__DRIVER_ENTRY_COUNT; i++) {
    const dlsync__driver_entry_info *e = &dlsync__driver_entries[i];
    void *fn = NULL;
    CUdriverProcAddressQueryResult found = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    if (e->need == DLSYNC__NEED_SUPPORT && !support)
      continue; /* the library never calls it: left NULL */
    r = get_proc(e->symbol, &fn, e->version, CU_GET_PROC_ADDRESS_DEFAULT, &found);
    *entry_slot(t, i) = (r == CUDA_SUCCESS && found == CU_GET_PROC_ADDRESS_SUCCESS) ? fn : NULL;
  }
  t->origin = path;
  if (t->Init == NULL || t->DriverGetVersion == NULL) {
    st = dlsync__fail(DLSYNC_ERROR_DRIVER_TOO_OLD, "%s lacks cuInit or cuDriverGetVersion", path);
    goto cleanup;
  }
  r = t->Init(0);
  if (r != CUDA_SUCCESS) {
    st = dlsync__fail_driver_as(DLSYNC_ERROR_NO_DRIVER, &(dlsync__driver_call){t, r, "cuInit"},
                                "%s was loaded but could not initialise: no usable GPU, or the "
                                "driver and kernel module disagree",
                                path);
    goto cleanup;
  }
  r = t->DriverGetVersion(&t->version);
  if (r != CUDA_SUCCESS) {
    st = dlsync__fail_driver(t, r, "cuDriverGetVersion", "%s", path);
    goto cleanup;
  }
  lib = NULL; /* kept loaded for the life of the process */
cleanup:
  if (lib != NULL)
    dlclose(lib);
  return st;
}

static dlsync_status load_cached(const dlsync__driver **out, const char *path, bool support) {
  dlsync_status st = DLSYNC_SUCCESS;
  loaded_driver *l = NULL;
  *out = NULL;
  if (path == NULL)
    path = "libcuda.so.1";
  if (path[0] == '\0')
    return dlsync__fail(DLSYNC_ERROR_INVALID_ARGUMENT,
                        "driver_path is \"\": give a path to libcuda, or NULL for libcuda.so.1");
  pthread_mutex_lock(&load_lock);
  for (loaded_driver *it = loaded; it != NULL; it = it->next) {
    if (it->support == support && strcmp(it->path, path) == 0) {
      *out = &it->table;
      goto cleanup;
    }
  }
  l = dlsync__calloc(1, sizeof *l);
  if (l == NULL || (l->path = dlsync__strdup(path)) == NULL) {
    st = dlsync__fail(DLSYNC_ERROR_OUT_OF_MEMORY, "loading the CUDA driver: out of memory");
    goto cleanup;
  }
  l->support = support;
  st = load_one(&l->table, l->path, support);
  if (st != DLSYNC_SUCCESS) {
    /* No driver is the one failure a user most likely did not expect: a
     * WARN line, once per process (every error is an INFO line anyway). */
    static atomic_bool warned;
    if (st == DLSYNC_ERROR_NO_DRIVER && !atomic_exchange(&warned, true))
      DLSYNC__LOG(DLSYNC__LOG_WARN, "no CUDA driver: %s", dlsync_last_error());
    goto cleanup;
  }
  l->table.origin = l->path;
  if (DLSYNC__UNLIKELY(dlsync__log_on(DLSYNC__LOG_INFO))) {
    Dl_info where;
    memset(&where, 0, sizeof where);
    if (dladdr(*(void **)&l->table.Init, &where) == 0 || where.dli_fname == NULL)
      where.dli_fname = "?";
    dlsync__log(DLSYNC__LOG_INFO, "driver loaded: %s (%s), CUDA driver version %d.%d", l->path,
                where.dli_fname, l->table.version / 1000, (l->table.version % 1000) / 10);
  }
  l->next = loaded;
  loaded = l;
  *out = &l->table;
  l = NULL;
cleanup:
  pthread_mutex_unlock(&load_lock);
  if (l != NULL) {
    dlsync__free(l->path);
    dlsync__free(l);
  }
  return st;
}

dlsync_status dlsync__driver_load(const dlsync__driver **out, const char *path) {
  return load_cached(out, path, false);
}

dlsync_status dlsync__driver_load_all(const dlsync__driver **out, const char *path) {
  return load_cached(out, path, true);
}

static dlsync_status too_old(const dlsync__driver *d, size_t i, const char *what) {
  const dlsync__driver_entry_info *e = &dlsync__driver_entries[i];
  return dlsync__fail(DLSYNC_ERROR_DRIVER_TOO_OLD,
                      "%s needs %s (driver %d.%d or newer); the driver found (%s) is %d.%d", what,
                      e->symbol, e->version / 1000, (e->version % 1000) / 10,
                      d->origin != NULL ? d->origin : "?", d->version / 1000,
                      (d->version % 1000) / 10);
}

dlsync_status dlsync__driver_require(const dlsync__driver *d, int need, const char *what) {
  for (size_t i = 0; i < DLSYNC__DRIVER_ENTRY_COUNT; i++)
    if (dlsync__driver_entries[i].need == need && entry_value(d, i) == NULL)
      return too_old(d, i, what);
  return DLSYNC_SUCCESS;
}

dlsync_status dlsync__driver_require_entry(const dlsync__driver *d, int index, const char *what) {
  return entry_value(d, (size_t)index) == NULL ? too_old(d, (size_t)index, what) : DLSYNC_SUCCESS;
}

const char *dlsync__driver_error_name(const dlsync__driver *d, CUresult r) {
  const char *name = NULL;
  if (d != NULL && d->GetErrorName != NULL && d->GetErrorName(r, &name) == CUDA_SUCCESS &&
      name != NULL)
    return name;
  switch (r) {
  case CUDA_SUCCESS:
    return "CUDA_SUCCESS";
  case CUDA_ERROR_INVALID_VALUE:
    return "CUDA_ERROR_INVALID_VALUE";
  case CUDA_ERROR_NOT_INITIALIZED:
    return "CUDA_ERROR_NOT_INITIALIZED";
  case CUDA_ERROR_NO_DEVICE:
    return "CUDA_ERROR_NO_DEVICE";
  default:
    return "CUDA_ERROR_UNKNOWN_CODE";
  }
}

/* ---- a driver call failed ---- */

static dlsync_status status_of_result(CUresult r) {
  switch (r) {
  case CUDA_ERROR_STREAM_CAPTURE_INVALIDATED:
    return DLSYNC_ERROR_CAPTURE_INVALIDATED;
  case CUDA_ERROR_STREAM_CAPTURE_IMPLICIT:
    return DLSYNC_ERROR_LEGACY_STREAM_IN_CAPTURE;
  case CUDA_ERROR_OUT_OF_MEMORY:
    return DLSYNC_ERROR_OUT_OF_MEMORY;
  default:
    return DLSYNC_ERROR_DRIVER;
  }
}

static dlsync_status fail_driverv(dlsync_status status, const dlsync__driver_call *c,
                                  const char *fmt, va_list ap) DLSYNC__PRINTF(3, 0);
static dlsync_status fail_driverv(dlsync_status status, const dlsync__driver_call *c,
                                  const char *fmt, va_list ap) {
  char prefix[160];
  bool context = fmt != NULL && fmt[0] != '\0';
  snprintf(prefix, sizeof prefix, "%s failed: %s%s", c->call,
           dlsync__driver_error_name(c->d, c->result), context ? " (" : "");
  dlsync__fail_site site = {status, (int)c->result, prefix, context ? ")" : NULL};
  return dlsync__fail_with(&site, fmt, ap);
}

dlsync_status dlsync__fail_driver(const dlsync__driver *d, CUresult result, const char *call,
                                  const char *fmt, ...) {
  dlsync__driver_call c = {d, result, call};
  dlsync_status st;
  va_list ap;
  va_start(ap, fmt);
  st = fail_driverv(status_of_result(result), &c, fmt, ap);
  va_end(ap);
  return st;
}

dlsync_status dlsync__fail_driver_as(dlsync_status status, const dlsync__driver_call *c,
                                     const char *fmt, ...) {
  dlsync_status st;
  va_list ap;
  va_start(ap, fmt);
  st = fail_driverv(status, c, fmt, ap);
  va_end(ap);
  return st;
}
