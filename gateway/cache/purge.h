/* purge.h: purging cache entries by key prefix from the admin listener (issue 16, "Operating it").
 *
 * Tier 1 lives in each worker and only its thread may touch it, so the admin thread posts the
 * prefix to every worker's inbox and each worker applies what it finds there on its once-a-second
 * tick (a purge reaches tier 1 within about a second), to its tier 1 and to the keys its VMs
 * remember as missing (runtime.on_purge, lua/agg/cache.lua). Tier 2 is purged by the admin thread itself
 * over a blocking connection of its own (SCAN MATCH prefix* + UNLINK), bounded by a timeout.
 */
#ifndef AGW_CACHE_PURGE_H
#define AGW_CACHE_PURGE_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "redis/redis.h"

/* A worker's purge requests not yet applied. Any thread may post; the worker takes. */
typedef struct agw_cache_inbox {
    pthread_mutex_t lock;
    char **prefixes;                /* malloc'd prefixes (len-prefixed: see agw_cache_inbox_take) */
    size_t *lens;
    size_t n, cap;
} agw_cache_inbox_t;

/* An empty inbox. */
void agw_cache_inbox_init(agw_cache_inbox_t *in);

/* Frees what the inbox still holds. */
void agw_cache_inbox_free(agw_cache_inbox_t *in);

/* Posts a copy of prefix (len bytes). Thread-safe. Aborts on allocation failure. */
void agw_cache_inbox_post(agw_cache_inbox_t *in, const char *prefix, size_t len);

/* Calls apply(arg, prefix, len) for each prefix posted since the last call, oldest first, and
 * frees them. Thread-safe; apply runs without the lock held. Returns how many. */
size_t agw_cache_inbox_take(agw_cache_inbox_t *in, void (*apply)(void *arg, const char *prefix, size_t len), void *arg);

/* Deletes the keys of the Redis of conf that start with prefix (len bytes; glob characters in it
 * are escaped), with a blocking connection of its own: connect, AUTH/SELECT, SCAN and UNLINK each
 * bounded by max(timeout_ms, 1000) ms, the whole purge by AGW_CACHE_PURGE_BUDGET_S (a server whose
 * SCAN never ends, or a keyspace too large for one purge: -1, with what was deleted so far in
 * *deleted; each command is written and read within it). A reply whose arrays claim more than
 * AGW_CACHE_PURGE_MAX_ELEMENTS elements in all, or of more than AGW_CACHE_PURGE_MAX_BYTES bytes,
 * fails the purge (a server that lies about a length: hiredis would allocate what it claims). Returns 0 with the
 * count in *deleted, or -1 with a message in err. cancel (NULL: none), once set to nonzero by
 * another thread (atomics), stops the purge at its next read or round, as the deadline does (a read
 * waits at most max(timeout_ms, 1000) ms). It blocks: the admin listener runs it on a thread of its
 * own (front/admin.c). */
int agw_cache_redis_purge(const agw_redis_conf_t *conf, const char *prefix, size_t len, const int *cancel,
                          uint64_t *deleted, char *err, size_t errlen);

#define AGW_CACHE_PURGE_BUDGET_S 30.0
#define AGW_CACHE_PURGE_MAX_ELEMENTS 65536
#define AGW_CACHE_PURGE_MAX_BYTES ((size_t)16 << 20) /* a reply's bytes (a SCAN's: about 1,000 keys) */

/* agw_cache_redis_purge with a budget of budget_s seconds instead (the tests' own). */
int agw_cache_redis_purge_within(const agw_redis_conf_t *conf, const char *prefix, size_t len, double budget_s,
                                 const int *cancel, uint64_t *deleted, char *err, size_t errlen);

#endif
