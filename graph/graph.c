/* Nodes dlsync appends to graphs, and events owned by graphs. */
#include <stdlib.h>
#include <string.h>

#include "dlsync/private/internal.h"

typedef struct owned_event {
  dlsync__pool *pool;
  CUevent event;
} owned_event;

/* User-object destructor: runs on a driver thread once every graph and
 * executable holding the event is gone. No CUDA call allowed here. */
static void owned_event_destroy(void *p) {
  owned_event *o = p;
  dlsync__pool_return_from_graph(o->pool, o->event);
  free(o);
}

dlsync_status dlsync__graph_own_event(dlsync_context *ctx, dlsync__pool *pool, CUevent event,
                                      CUgraph *graphs, int ngraphs) {
  dlsync_status st = DLSYNC_SUCCESS;
  const dlsync__driver *d = ctx->drv;
  owned_event *o = NULL;
  CUuserObject uo = NULL;
  unsigned held = 0; /* references still held by this function */
  o = malloc(sizeof *o);
  if (o == NULL) {
    st = dlsync__fail(DLSYNC_ERROR_OUT_OF_MEMORY, "giving an event to a graph: out of memory");
    goto cleanup;
  }
  o->pool = pool;
  o->event = event;
  DLSYNC_CU(d, cuUserObjectCreate,
            d->UserObjectCreate(&uo, o, owned_event_destroy, (unsigned)ngraphs,
                                CU_USER_OBJECT_NO_DESTRUCTOR_SYNC),
            "making event %p owned by graph %p", (void *)event, (void *)graphs[0]);
  /* From here the destructor owns `o` and the event. */
  dlsync__pool_note_graph_owned(pool);
  o = NULL;
  held = (unsigned)ngraphs;
  for (int i = 0; i < ngraphs; i++) {
    DLSYNC_CU(d, cuGraphRetainUserObject,
              d->GraphRetainUserObject(graphs[i], uo, 1, CU_GRAPH_USER_OBJECT_MOVE),
              "giving event %p to graph %p", (void *)event, (void *)graphs[i]);
    held--;
  }
cleanup:
  if (held > 0) {
    /* Graphs that took a reference keep the event until they are destroyed;
     * dropping ours runs the destructor now if none did (the event goes back
     * to the pool when the driver runs it). */
    (void)d->UserObjectRelease(uo, held);
  }
  if (o != NULL) {
    free(o);
    dlsync__pool_put(pool, event);
  }
  return st;
}

static dlsync_status add_event_node(dlsync_context *ctx, CUgraphNode *out, CUgraph graph,
                                    const CUgraphNode *deps, size_t ndeps, CUevent event,
                                    bool record, const char *role) {
  dlsync_status st = DLSYNC_SUCCESS;
  const dlsync__driver *d = ctx->drv;
  CUresult r;
  if (record)
    r = d->GraphAddEventRecordNode(out, graph, deps, ndeps, event);
  else
    r = d->GraphAddEventWaitNode(out, graph, deps, ndeps, event);
  if (r != CUDA_SUCCESS) {
    st = dlsync__fail_driver(d, r, record ? "cuGraphAddEventRecordNode" : "cuGraphAddEventWaitNode",
                             "%s lane, graph %p, after %zu node(s)", role, (void *)graph, ndeps);
    if (r == CUDA_ERROR_INVALID_VALUE && ndeps > 0) {
      /* Find out whether a dependency is from another graph (cold path). */
      size_t count = 0;
      CUgraphNode *nodes = NULL;
      bool foreign = false;
      if (d->GraphGetNodes(graph, NULL, &count) == CUDA_SUCCESS && count == 0) {
        foreign = true; /* an empty graph holds none of them */
      } else if ((nodes = calloc(count + 1, sizeof *nodes)) != NULL &&
                 d->GraphGetNodes(graph, nodes, &count) == CUDA_SUCCESS) {
        for (size_t i = 0; i < ndeps && !foreign; i++) {
          bool found = false;
          for (size_t j = 0; j < count && !found; j++)
            found = nodes[j] == deps[i];
          foreign = !found;
        }
      }
      free(nodes);
      if (foreign)
        st = dlsync__fail(DLSYNC_ERROR_FOREIGN_DEPENDENCY,
                          "the %s graph lane's dependencies include a node that is not in its "
                          "graph %p; a graph lane's deps must be nodes of that graph",
                          role, (void *)graph);
    }
  }
  return st;
}

dlsync_status dlsync__graph_append_event(dlsync_context *ctx, dlsync__lane_now *l, CUevent event,
                                         bool record) {
  dlsync_status st = DLSYNC_SUCCESS;
  const dlsync__driver *d = ctx->drv;
  CUgraphNode node = NULL;
  if (l->kind == DLSYNC_LANE_CAPTURING) {
    /* The capture's dependency array is only valid until the next call on
     * the stream; it is used right away. Edge data is not carried over: the
     * event node takes full (default) dependencies, which is never weaker. */
    DLSYNC_TRY(add_event_node(ctx, &node, l->graph, l->deps, l->ndeps, event, record, l->role));
    DLSYNC_CU(d, cuStreamUpdateCaptureDependencies,
              d->StreamUpdateCaptureDependencies(l->stream, &node, NULL, 1,
                                                 CU_STREAM_SET_CAPTURE_DEPENDENCIES),
              "%s stream %p: putting the event node at the end of its capture", l->role,
              (void *)l->stream);
    l->deps = NULL;
    l->ndeps = 0;
  } else {
    dlsync_lane *lane = l->lane;
    if (lane->capacity < 1) {
      st = dlsync__fail(DLSYNC_ERROR_INVALID_ARGUMENT,
                        "the %s graph lane has capacity 0: dlsync writes the lane's new "
                        "frontier (1 node) into deps",
                        l->role);
      goto cleanup;
    }
    DLSYNC_TRY(add_event_node(ctx, &node, l->graph, l->deps, l->ndeps, event, record, l->role));
    lane->deps[0] = node;
    lane->ndeps = 1;
    l->deps = (const CUgraphNode *)lane->deps;
    l->ndeps = 1;
  }
cleanup:
  return st;
}
