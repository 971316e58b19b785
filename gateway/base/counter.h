/* counter.h: the counters of the metrics (ops/metrics.h) and of the stores that keep their own
 * stats structs (redis/redis.h agw_redis_stats_t, cache/lru.h agw_lru_stats_t): uint64_t fields
 * with one writer thread (a worker) and any number of reader threads (the admin's /metrics),
 * read and written with relaxed atomics. A reader sees each field whole, not a consistent set of
 * fields. This header is all that redis/ and cache/ need of the metrics, so they do not include
 * ops/ (which embeds their stats structs): no include cycle between the folders.
 */
#ifndef AGW_BASE_COUNTER_H
#define AGW_BASE_COUNTER_H

#define AGW_M_GET(f) __atomic_load_n(&(f), __ATOMIC_RELAXED)
#define AGW_M_SET(f, v) __atomic_store_n(&(f), (v), __ATOMIC_RELAXED)
/* single writer: no read-modify-write instruction needed */
#define AGW_M_ADD(f, v) AGW_M_SET(f, AGW_M_GET(f) + (v))

#endif
