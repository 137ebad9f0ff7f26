/* SPDX-License-Identifier: Apache-2.0 */
/* dlsync: capture-aware ordering of GPU work between libraries that exchange
 * tensors. The one header to include; it needs no cuda.h.
 *
 * Caller's rules:
 *  - Every function that can fail returns a dlsync_status; the message of a
 *    failure is the thread's dlsync_last_error() (status.h).
 *  - Every call that orders work is legal during capture, in every mode, and
 *    never breaks a capture; only creating a context must happen outside one.
 *  - Each header opens with its own rules and gives each function its
 *    Returns, Errors, Threads and Capture; docs/design.md explains the
 *    mechanism.
 */
#ifndef DLSYNC_DLSYNC_H
#define DLSYNC_DLSYNC_H

#include "dlsync/export.h"
#include "dlsync/version.h"
#include "dlsync/status.h"
#include "dlsync/context.h"
#include "dlsync/lane.h"
#include "dlsync/exchange.h"
#include "dlsync/dlpack.h"
#include "dlsync/env.h"
#include "dlsync/fence.h"
#include "dlsync/foreign.h"
#include "dlsync/release.h"
#include "dlsync/conditional.h"
#include "dlsync/graph.h"

#endif
