/* SPDX-License-Identifier: Apache-2.0 */
/* dlsync private: every layer's private header at once, for tests, tools
 * and bench. Never installed. The library's own sources include only their
 * layer's header: base.h, driver.h, stream.h, event.h, graph.h, table.h,
 * order.h (docs/design.md section 4). */
#ifndef DLSYNC_PRIVATE_INTERNAL_H
#define DLSYNC_PRIVATE_INTERNAL_H

#include "dlsync/dlsync.h"
#include "dlsync/private/base.h"
#include "dlsync/private/driver.h"
#include "dlsync/private/event.h"
#include "dlsync/private/graph.h"
#include "dlsync/private/order.h"
#include "dlsync/private/stream.h"
#include "dlsync/private/table.h"

#endif
