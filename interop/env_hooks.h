/* SPDX-License-Identifier: Apache-2.0 */
/* dlsync private: test hooks of the env stream table (interop/env.c). Never
 * installed. */
#ifndef DLSYNC_PRIVATE_ENV_HOOKS_H
#define DLSYNC_PRIVATE_ENV_HOOKS_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The allocator the table grows with (realloc semantics); NULL restores
 * realloc. For tests of the out-of-memory path; not thread-safe: set it while
 * no other thread uses env streams. */
typedef void *(*dlsync__env_realloc_fn)(void *ptr, size_t size);
void dlsync__env_set_realloc(dlsync__env_realloc_fn fn);

/* Slots allocated for the calling thread's table (0: no table). */
size_t dlsync__env_capacity(void);

#ifdef __cplusplus
}
#endif

#endif
