/* SPDX-License-Identifier: Apache-2.0 */
/* dlsync: capture-aware ordering of GPU work between libraries that exchange
 * tensors. The one header to include. See README.md for the overview. */
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
#include "dlsync/release.h"
#include "dlsync/conditional.h"
#include "dlsync/graph.h"

#endif
