/* SPDX-License-Identifier: Apache-2.0 */
/* dlsync: symbol visibility. */
#ifndef DLSYNC_EXPORT_H
#define DLSYNC_EXPORT_H

#if defined(DLSYNC_STATIC_DEFINE)
#define DLSYNC_API
#elif defined(__GNUC__)
#define DLSYNC_API __attribute__((visibility("default")))
#else
#define DLSYNC_API
#endif

#endif
