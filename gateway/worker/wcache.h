/* wcache.h: a worker's stores for the response cache (part of agw_worker, owned by cache.c):
 * tier 1 in the worker's memory (cache/lru.h), tier 2's Redis client (redis/redis.h). Configured
 * when a generation becomes current (agw_worker_cache_configure), closed when the worker stops
 * (agw_worker_cache_close); zeroed memory is no cache.
 */
#ifndef AGW_WORKER_WCACHE_H
#define AGW_WORKER_WCACHE_H

#include <stdint.h>

#include "cache/lru.h"
#include "redis/redis.h"

typedef struct agw_worker_cache {
    agw_lru_t *lru;         /* the cache's tier 1: kept across reloads */
    agw_redis_t *redis;     /* the Redis client (the cache's and the limits'), NULL without redis
                               or with neither cache.redis nor a rule with store = "redis" */
    uint64_t redis_next_id; /* ids of core.redis_get, and the checks of the Redis rate limits' commands (limits.c) */
    int closing;            /* the worker stops: Redis answers no longer run Lua */
} agw_worker_cache_t;

#endif
