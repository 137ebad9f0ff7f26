/* SPDX-License-Identifier: Apache-2.0 */
/* dlsync private: every layer's private header at once, for tests, tools
 * and bench. Never installed. The library's own sources include only their
 * layer's header: base.h, driver.h, stream.h, event.h, graph.h, table.h,
 * order.h (docs/design.md section 4). */
#ifndef DLSYNC_PRIVATE_INTERNAL_H
#define DLSYNC_PRIVATE_INTERNAL_H

#include "dlsync/dlsync.h"
#include "base/base.h"
#include "driver/driver.h"
#include "event/event.h"
#include "graph/graph.h"
#include "order/order.h"
#include "stream/stream.h"
#include "order/table.h"

#endif
