/* SPDX-License-Identifier: Apache-2.0 */
/* dlsync: symbol visibility.
 *
 * Caller's rules:
 *  - Linking libdlsync.so: nothing to define.
 *  - Linking libdlsync.a: define DLSYNC_STATIC_DEFINE (the CMake target
 *    dlsync::dlsync_static and `pkg-config --static` do), so that no dlsync_
 *    symbol is exported from the program or library it is linked into.
 */
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
