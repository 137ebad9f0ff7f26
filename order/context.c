/* SPDX-License-Identifier: Apache-2.0 */
/* Contexts, the default context, devices and capabilities. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "order/order.h"

uint32_t dlsync__capabilities_of(const dlsync__driver *d) {
  uint32_t caps = 0;
  if (d->StreamGetCaptureInfo != NULL && d->StreamUpdateCaptureDependencies != NULL)
    caps |= DLSYNC_CAP_CAPTURE_EDGE_DATA;
  if (d->StreamBeginCaptureToGraph != NULL)
    caps |= DLSYNC_CAP_CAPTURE_TO_USER_GRAPH;
  if (d->UserObjectCreate != NULL && d->GraphRetainUserObject != NULL &&
      d->UserObjectRelease != NULL)
    caps |= DLSYNC_CAP_USER_OBJECTS;
  if (d->GraphAddNode != NULL)
    caps |= DLSYNC_CAP_GRAPH_ADD_NODE_EDGE_DATA;
  return caps;
}

static atomic_uint_fast64_t generations;

static dlsync_status check_config(const dlsync_context_config *config) {
  if (config == NULL)
    return DLSYNC_SUCCESS;
  if (config->size < offsetof(dlsync_context_config, events_kept) + sizeof(uint32_t))
    return dlsync__fail(DLSYNC_ERROR_INVALID_ARGUMENT,
                        "dlsync_context_config.size is %zu, smaller than any version of the "
                        "struct (initialise it with DLSYNC_CONTEXT_CONFIG_INIT)",
                        config->size);
  if (config->version == 0 || config->version > DLSYNC_CONTEXT_CONFIG_VERSION)
    return dlsync__fail(DLSYNC_ERROR_INVALID_ARGUMENT,
                        "dlsync_context_config.version is %u; this library knows versions 1 to "
                        "%u (initialise it with DLSYNC_CONTEXT_CONFIG_INIT)",
                        config->version, DLSYNC_CONTEXT_CONFIG_VERSION);
  return DLSYNC_SUCCESS;
}

dlsync_status dlsync__context_create_with_driver(dlsync_context **out,
                                                 const dlsync_context_config *config,
                                                 const dlsync__driver *drv) {
  dlsync_status st = DLSYNC_SUCCESS;
  dlsync_context *ctx = NULL;
  bool lock_made = false;
  if (out == NULL)
    return dlsync__fail(DLSYNC_ERROR_INVALID_ARGUMENT, "dlsync_context_create: out is NULL");
  *out = NULL;
  if (drv == NULL)
    return dlsync__fail(DLSYNC_ERROR_INVALID_ARGUMENT, "no driver table given");
  DLSYNC_TRY(check_config(config));
  DLSYNC_TRY(dlsync__driver_require(drv, DLSYNC__NEED_CORE, "dlsync"));
  /* cuInit is idempotent; a table that was handed in may not have run it. */
  {
    CUresult r = drv->Init(0);
    if (r != CUDA_SUCCESS) {
      st = dlsync__fail_driver_as(DLSYNC_ERROR_NO_DRIVER, &(dlsync__driver_call){drv, r, "cuInit"},
                                  "the driver (%s) could not initialise: no usable GPU, or the "
                                  "driver and kernel module disagree",
                                  drv->origin != NULL ? drv->origin : "?");
      goto cleanup;
    }
  }
  ctx = dlsync__calloc(1, sizeof *ctx);
  if (ctx == NULL) {
    st = dlsync__fail(DLSYNC_ERROR_OUT_OF_MEMORY, "dlsync_context_create: out of memory");
    goto cleanup;
  }
  if (pthread_mutex_init(&ctx->pools.lock, NULL) != 0) {
    st = dlsync__fail(DLSYNC_ERROR_OUT_OF_MEMORY, "dlsync_context_create: no mutex");
    goto cleanup;
  }
  lock_made = true;
  ctx->drv = drv;
  DLSYNC_CU(drv, DriverGetVersion, (&ctx->driver_version), "asking the driver (%s) for its version",
            drv->origin != NULL ? drv->origin : "?");
  ctx->pools.drv = drv;
  ctx->pools.events_kept = (config != NULL && config->events_kept != 0) ? config->events_kept : 64;
  ctx->caps = dlsync__capabilities_of(drv);
  ctx->pools.generation = atomic_fetch_add(&generations, 1) + 1;
  atomic_init(&ctx->pools.list, NULL);
  atomic_init(&ctx->refs, 1);
  atomic_init(&ctx->live_fences, 0);
  atomic_init(&ctx->destroyed, false);
  DLSYNC_TRY(dlsync__release_book_new(&ctx->releases));
  dlsync__orphans_set_waker(dlsync__release_orphans_wake);
  dlsync__orphans_collect();
  DLSYNC__LOG(DLSYNC__LOG_INFO, "context %p created (driver %s, version %d.%d, events kept %u)",
              (void *)ctx, drv->origin != NULL ? drv->origin : "?", ctx->driver_version / 1000,
              (ctx->driver_version % 1000) / 10, (unsigned)ctx->pools.events_kept);
  *out = ctx;
  ctx = NULL;
cleanup:
  if (ctx != NULL) {
    (void)dlsync__release_book_close(ctx->releases, NULL);
    if (lock_made)
      pthread_mutex_destroy(&ctx->pools.lock);
    dlsync__free(ctx);
  }
  return st;
}

dlsync_status dlsync_context_create(dlsync_context **out, const dlsync_context_config *config) {
  DLSYNC__REFUSE_IN_FORKED_CHILD("dlsync_context_create");
  dlsync_status st = DLSYNC_SUCCESS;
  const dlsync__driver *drv = NULL;
  if (out == NULL)
    return dlsync__fail(DLSYNC_ERROR_INVALID_ARGUMENT, "dlsync_context_create: out is NULL");
  *out = NULL;
  DLSYNC_TRY(check_config(config));
  DLSYNC_TRY(dlsync__driver_load(&drv, config != NULL ? config->driver_path : NULL));
  DLSYNC_TRY(dlsync__context_create_with_driver(out, config, drv));
cleanup:
  return st;
}

void dlsync__context_ref(dlsync_context *ctx) {
  atomic_fetch_add_explicit(&ctx->refs, 1, memory_order_relaxed);
}

static void context_free(void *p) {
  dlsync_context *ctx = p;
  pthread_mutex_destroy(&ctx->pools.lock);
  dlsync__free(ctx);
  dlsync__orphans_collect(); /* the last fence's event, back in a dead pool */
}

void dlsync__context_unref(dlsync_context *ctx) {
  if (atomic_fetch_sub_explicit(&ctx->refs, 1, memory_order_acq_rel) == 1)
    context_free(ctx);
}

void dlsync__context_unref_elsewhere(dlsync_context *ctx) {
  if (atomic_fetch_sub_explicit(&ctx->refs, 1, memory_order_acq_rel) != 1)
    return;
  if (!dlsync__defer(context_free, ctx)) {
    /* No janitor: the memory now, the orphans at the next collection. */
    pthread_mutex_destroy(&ctx->pools.lock);
    dlsync__free(ctx);
  }
}

dlsync_status dlsync_context_destroy(dlsync_context *ctx) {
  DLSYNC__REFUSE_IN_FORKED_CHILD("dlsync_context_destroy");
  dlsync_status st, rst, pst;
  size_t abandoned, fences;
  dlsync__release_left left;
  if (ctx == NULL)
    return DLSYNC_SUCCESS;
  if (ctx->is_default)
    return dlsync__fail(DLSYNC_ERROR_INVALID_ARGUMENT,
                        "dlsync_context_destroy: the default context belongs to the library and "
                        "lives until the process ends");
  atomic_store(&ctx->destroyed, true);
  /* Its conditional-body declarations: no other context refuses them now. */
  dlsync__bodies_forget_all(&ctx->bodies);
  /* Exchanges still begun: ended here, ordering nothing (their handles are
   * invalid from now on). */
  abandoned = dlsync__exchanges_abandon(ctx);
  fences = atomic_load(&ctx->live_fences);
  /* Releases first: the eager ones give their events back to the pools. */
  rst = dlsync__release_book_close(ctx->releases, &left);
  /* Every thread's batches of events for built graphs of this context:
   * closed, so that their unused events come back once the graphs are gone
   * (the threads still alive included; graph/graph.c, the registry). */
  dlsync__graph_built_close(&ctx->pools);
  pst = dlsync__pools_destroy(&ctx->pools);
  /* A driver error of the pools is returned unless releases are left; what
   * is left is named, each kind with its count. */
  st = rst != DLSYNC_SUCCESS ? rst : pst;
  if (st == DLSYNC_SUCCESS && (abandoned > 0 || fences > 0))
    st = DLSYNC_ERROR_BUSY;
  if (st == DLSYNC_ERROR_BUSY) {
    const struct {
      size_t n;
      const char *what;
    } parts[] = {
        {abandoned, "exchange(s) begun and not ended (they are abandoned: their end is "
                    "DLSYNC_ERROR_INVALID_ARGUMENT and orders nothing)"},
        {fences, "fence(s) not released (they still work; the context's memory and their "
                 "events go with their last release)"},
        {left.graph_owned, "release(s) still owned by graphs (their deleters run when those "
                           "graphs and their executables are destroyed)"},
        {left.blocked, "eager release(s) blocked: the reclaimer cannot enter RELAXED capture "
                       "mode (they run once it can)"},
        {left.queued, "eager release(s) queued behind the deleter running (they still run)"},
    };
    char why[720];
    size_t used = 0, kinds = 0, seen = 0;
    why[0] = '\0';
    for (size_t i = 0; i < sizeof parts / sizeof parts[0]; i++)
      kinds += parts[i].n > 0;
    for (size_t i = 0; i < sizeof parts / sizeof parts[0] && used < sizeof why; i++) {
      int k;
      if (parts[i].n == 0)
        continue;
      k = snprintf(why + used, sizeof why - used, "%s%zu %s",
                   seen == 0           ? ""
                   : seen + 1 == kinds ? " and "
                                       : ", ",
                   parts[i].n, parts[i].what);
      used += k < 0 ? 0 : (size_t)k;
      seen++;
    }
    st = dlsync__fail(DLSYNC_ERROR_BUSY, "the context was destroyed%s with %s",
                      left.from_deleter ? " from a deleter" : "", why);
  }
  DLSYNC__LOG(DLSYNC__LOG_INFO, "context %p destroyed (%s)", (void *)ctx, dlsync_status_name(st));
  dlsync__context_unref(ctx);
  return st;
}

/* ---- the default context ---- */

/* Made once and kept: after that, a call is one acquire load. Until then
 * each call takes default_lock and tries dlsync_context_create(NULL), so
 * threads calling at once make one context between them. A failure is kept
 * only when trying again in this process cannot change it (default_stays);
 * any other is returned to the caller that met it, and the next call tries
 * again. What is kept is written under the lock before default_kept is
 * stored (release), and never written again. */
static pthread_mutex_t default_lock = PTHREAD_MUTEX_INITIALIZER;
static _Atomic(dlsync_context *) default_ctx;
static atomic_bool default_kept;
static dlsync_status default_status;
static char default_message[512];
static int default_driver_result;

/* The failures of dlsync_context_create(NULL) that stay. NO_DRIVER:
 * libcuda.so.1 is not on the loader's path (which a running process does not
 * change), or cuInit failed, whose result the driver itself keeps for the
 * process. DRIVER_TOO_OLD: the driver lacks entry points, and the library
 * loaded is the one every later attempt would load. Everything else it can
 * return is worth another try: OUT_OF_MEMORY (an allocation, a mutex,
 * CUDA_ERROR_OUT_OF_MEMORY) and a driver call's error (DLSYNC_ERROR_DRIVER
 * and the other statuses of dlsync__fail_driver); INVALID_ARGUMENT comes only
 * from a configuration, and the default one has none. */
static bool default_stays(dlsync_status st) {
  return st == DLSYNC_ERROR_NO_DRIVER || st == DLSYNC_ERROR_DRIVER_TOO_OLD;
}

static dlsync_status default_fail(dlsync_status st, int driver_result, const char *why) {
  return dlsync__fail_result(st, driver_result, "the default context could not be created: %s",
                             why);
}

dlsync_status dlsync_context_default(dlsync_context **out) {
  DLSYNC__REFUSE_IN_FORKED_CHILD("dlsync_context_default");
  dlsync_status st = DLSYNC_SUCCESS;
  dlsync_context *ctx;
  int driver_result = 0;
  char why[sizeof default_message];
  if (out == NULL)
    return dlsync__fail(DLSYNC_ERROR_INVALID_ARGUMENT, "dlsync_context_default: out is NULL");
  ctx = atomic_load_explicit(&default_ctx, memory_order_acquire);
  if (DLSYNC__LIKELY(ctx != NULL)) {
    *out = ctx;
    return DLSYNC_SUCCESS;
  }
  *out = NULL;
  if (!atomic_load_explicit(&default_kept, memory_order_acquire)) {
    pthread_mutex_lock(&default_lock);
    /* Another thread may have made it, or kept a failure, while this one
     * waited for the lock. */
    ctx = atomic_load_explicit(&default_ctx, memory_order_relaxed);
    if (ctx == NULL && !atomic_load_explicit(&default_kept, memory_order_relaxed)) {
      st = dlsync_context_create(&ctx, NULL);
      if (st == DLSYNC_SUCCESS) {
        ctx->is_default = true; /* before it is published: destroy refuses it */
        atomic_store_explicit(&default_ctx, ctx, memory_order_release);
      } else {
        /* Copied: default_fail writes the thread's message, where it is. */
        snprintf(why, sizeof why, "%s", dlsync_last_error());
        driver_result = dlsync_last_driver_result();
        if (default_stays(st)) {
          default_status = st;
          default_driver_result = driver_result;
          snprintf(default_message, sizeof default_message, "%s", why);
          atomic_store_explicit(&default_kept, true, memory_order_release);
        }
      }
    }
    pthread_mutex_unlock(&default_lock);
    if (ctx != NULL) {
      *out = ctx;
      return DLSYNC_SUCCESS;
    }
    if (st != DLSYNC_SUCCESS && !default_stays(st))
      return default_fail(st, driver_result, why); /* not kept: the next call tries again */
  }
  /* Kept (by this call or an earlier one): the same status, message and
   * driver result every time, whatever this thread's last error was. */
  return default_fail(default_status, default_driver_result, default_message);
}

/* ---- facts ---- */

dlsync_status dlsync_context_driver_version(int *out, const dlsync_context *ctx) {
  DLSYNC__REFUSE_IN_FORKED_CHILD("dlsync_context_driver_version");
  if (out == NULL || ctx == NULL)
    return dlsync__fail(DLSYNC_ERROR_INVALID_ARGUMENT, "dlsync_context_driver_version: %s is NULL",
                        out == NULL ? "out" : "ctx");
  *out = ctx->driver_version;
  return DLSYNC_SUCCESS;
}

dlsync_status dlsync_context_capabilities(uint32_t *out, const dlsync_context *ctx) {
  DLSYNC__REFUSE_IN_FORKED_CHILD("dlsync_context_capabilities");
  if (out == NULL || ctx == NULL)
    return dlsync__fail(DLSYNC_ERROR_INVALID_ARGUMENT, "dlsync_context_capabilities: %s is NULL",
                        out == NULL ? "out" : "ctx");
  *out = ctx->caps;
  return DLSYNC_SUCCESS;
}

const char *dlsync_capability_name(dlsync_capability cap) {
  switch (cap) {
  case DLSYNC_CAP_CAPTURE_EDGE_DATA:
    return "capture-edge-data";
  case DLSYNC_CAP_CAPTURE_TO_USER_GRAPH:
    return "capture-to-user-graph";
  case DLSYNC_CAP_USER_OBJECTS:
    return "user-objects";
  case DLSYNC_CAP_GRAPH_ADD_NODE_EDGE_DATA:
    return "graph-add-node-edge-data";
  default:
    return "unknown-capability";
  }
}

dlsync_status dlsync_context_require(const dlsync_context *ctx, dlsync_capability cap) {
  DLSYNC__REFUSE_IN_FORKED_CHILD("dlsync_context_require");
  const dlsync__driver *d;
  const char *what = dlsync_capability_name(cap);
  if (ctx == NULL)
    return dlsync__fail(DLSYNC_ERROR_INVALID_ARGUMENT, "dlsync_context_require: ctx is NULL");
  d = ctx->drv;
  if (cap != 0 && ((uint32_t)cap & ((uint32_t)cap - 1)) != 0) {
    /* Several bits: every one must be there; the first missing one is named. */
    for (uint32_t bit = 1; bit != 0; bit <<= 1) {
      dlsync_status st;
      if (((uint32_t)cap & bit) == 0)
        continue;
      st = dlsync_context_require(ctx, (dlsync_capability)bit);
      if (st != DLSYNC_SUCCESS)
        return st;
    }
    return DLSYNC_SUCCESS;
  }
  if (cap != 0 && (ctx->caps & (uint32_t)cap) == (uint32_t)cap)
    return DLSYNC_SUCCESS;
  switch (cap) {
  case DLSYNC_CAP_CAPTURE_EDGE_DATA:
  case DLSYNC_CAP_GRAPH_ADD_NODE_EDGE_DATA:
    return dlsync__driver_require(d, DLSYNC__NEED_CAPTURE, what);
  case DLSYNC_CAP_CAPTURE_TO_USER_GRAPH:
  case DLSYNC_CAP_USER_OBJECTS:
    break;
  default:
    return dlsync__fail(DLSYNC_ERROR_INVALID_ARGUMENT, "unknown capability 0x%x", (unsigned)cap);
  }
  return dlsync__fail(
      DLSYNC_ERROR_DRIVER_TOO_OLD,
      "%s needs %s (driver %s or newer); the driver found (%s) is %d.%d", what,
      cap == DLSYNC_CAP_USER_OBJECTS ? "cuUserObjectCreate" : "cuStreamBeginCaptureToGraph",
      cap == DLSYNC_CAP_USER_OBJECTS ? "11.3" : "12.3", d->origin != NULL ? d->origin : "?",
      d->version / 1000, (d->version % 1000) / 10);
}

dlsync_status dlsync_device_count(int *out, const dlsync_context *ctx) {
  DLSYNC__REFUSE_IN_FORKED_CHILD("dlsync_device_count");
  dlsync_status st = DLSYNC_SUCCESS;
  if (out == NULL || ctx == NULL)
    return dlsync__fail(DLSYNC_ERROR_INVALID_ARGUMENT, "dlsync_device_count: %s is NULL",
                        out == NULL ? "out" : "ctx");
  *out = 0;
  DLSYNC_CU(ctx->drv, DeviceGetCount, (out), "counting devices");
cleanup:
  return st;
}

dlsync_status dlsync_device_get_info(dlsync_device_info *info, const dlsync_context *ctx,
                                     int ordinal) {
  DLSYNC__REFUSE_IN_FORKED_CHILD("dlsync_device_get_info");
  dlsync_status st = DLSYNC_SUCCESS;
  const dlsync__driver *d;
  CUdevice dev = 0;
  dlsync_device_info tmp;
  if (info == NULL || ctx == NULL)
    return dlsync__fail(DLSYNC_ERROR_INVALID_ARGUMENT, "dlsync_device_get_info: %s is NULL",
                        info == NULL ? "info" : "ctx");
  if (info->size < sizeof(dlsync_device_info) || info->version != DLSYNC_DEVICE_INFO_VERSION)
    return dlsync__fail(DLSYNC_ERROR_INVALID_ARGUMENT,
                        "dlsync_device_info has size %zu version %u; initialise it with "
                        "DLSYNC_DEVICE_INFO_INIT",
                        info->size, info->version);
  d = ctx->drv;
  memset(&tmp, 0, sizeof tmp);
  tmp.size = sizeof tmp;
  tmp.version = DLSYNC_DEVICE_INFO_VERSION;
  tmp.ordinal = ordinal;
  DLSYNC_CU(d, DeviceGet, (&dev, ordinal), "device ordinal %d", ordinal);
  DLSYNC_CU(d, DeviceGetName, (tmp.name, (int)sizeof tmp.name, dev), "device %d", ordinal);
  DLSYNC_CU(d, DeviceGetPCIBusId, (tmp.pci_bus_id, (int)sizeof tmp.pci_bus_id, dev), "device %d",
            ordinal);
  DLSYNC_CU(d, DeviceGetAttribute,
            (&tmp.cc_major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev),
            "device %d compute capability", ordinal);
  DLSYNC_CU(d, DeviceGetAttribute,
            (&tmp.cc_minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev),
            "device %d compute capability", ordinal);
  DLSYNC_CU(d, DeviceGetAttribute,
            (&tmp.multiprocessors, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev),
            "device %d multiprocessors", ordinal);
  DLSYNC_CU(d, DeviceTotalMem, (&tmp.total_memory, dev), "device %d", ordinal);
  *info = tmp;
cleanup:
  return st;
}

/* ---- lanes ---- */

/* The pool for lanes a and b (b may be NULL), at least one on a stream or b
 * NULL (two graph lanes are opened inline, order.h): the context of the
 * first stream lane (out->pool_stream and pool_role name it), or, for one
 * graph lane, the calling thread's current context. */
static dlsync_status pool_of(dlsync__lanes_opened *out, dlsync_context *ctx, const dlsync_lane *a,
                             const dlsync_lane *b, const dlsync__lanes_ask *ask) {
  if (a->kind == DLSYNC_LANE_STREAM || (b != NULL && b->kind == DLSYNC_LANE_STREAM)) {
    const dlsync_lane *l = a->kind == DLSYNC_LANE_STREAM ? a : b;
    out->pool_stream = l->stream;
    out->pool_role = l == a ? ask->ra : ask->rb;
    return dlsync__pool_for_stream(&out->pool, ask->memo ? &out->from_memo : NULL, &ctx->pools,
                                   l->stream, out->pool_role);
  }
  return dlsync__pool_for_current(&out->pool, &ctx->pools, ask->graph_what);
}

dlsync_status dlsync__lanes_open_streams(dlsync__lanes_opened *out, dlsync_context *ctx,
                                         dlsync_lane *a, dlsync_lane *b,
                                         const dlsync__lanes_ask *ask) {
  dlsync_status st = DLSYNC_SUCCESS;
  out->pool = NULL;
  out->from_memo = false;
  out->pool_stream = NULL;
  out->pool_role = NULL;
  /* The lanes are read first: the legacy stream must be queried before
   * anything else touches it (while a blocking stream captures, the query
   * fails without harm, but other uses, cuStreamGetCtx included, invalidate
   * that capture: design.md R8, R22). A capture's dependencies are copied by the
   * read (up to DLSYNC__DEPS_INLINE); a longer array is valid only until the
   * next call on its stream, so such a lane is read again after the pool is
   * found, unless the per-thread memo named the pool (no call made). With
   * `memo` (the exchange's general path, which a capture sends there) one
   * full capture query per stream. */
  DLSYNC_TRY(dlsync__lane_read_as(&out->a, ctx->drv, a, ask->ra, ask->memo));
  if (b != NULL)
    DLSYNC_TRY(dlsync__lane_read_as(&out->b, ctx->drv, b, ask->rb, ask->memo));
  DLSYNC_TRY(pool_of(out, ctx, a, b, ask));
  if (out->from_memo)
    goto cleanup; /* no driver call since the reads: their arrays are valid */
  DLSYNC_TRY(dlsync__lane_refresh(&out->a, ctx->drv));
  if (b != NULL)
    DLSYNC_TRY(dlsync__lane_refresh(&out->b, ctx->drv));
cleanup:
  return st;
}
