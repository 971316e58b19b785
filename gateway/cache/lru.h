/* lru.h: the cache's first tier: an in-process map from key to bytes, bounded by bytes, evicting
 * the least recently used entry first (issue 16, "Tiers").
 *
 * One per worker, used by that worker's thread only (no lock on a page's path); a reload keeps it
 * (the worker owns it, not the generation), and the cache's keys carry a digest of the upstream's
 * cache settings, so entries of an upstream whose settings changed are simply never asked for
 * again and age out. An entry carries an expiry (ms on the caller's clock): past it, a lookup
 * drops it and misses. Values are opaque bytes (the cache's serialized entries, see
 * lua/agg/cache.lua).
 *
 * Cost of an entry against the bound: key + value + AGW_LRU_OVERHEAD bytes. An entry larger than
 * a quarter of the bound is refused (it would flush the whole tier for one value).
 */
#ifndef AGW_LRU_H
#define AGW_LRU_H

#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

#define AGW_LRU_OVERHEAD 64 /* bytes charged per entry for its bookkeeping */
/* Most entries one bucket of the hash table holds (a store into a full one drops the bucket's
 * entry whose freshness ends first): keys are made of what clients choose, and the hash is seeded
 * per process, so no client can make one lookup cost more than this many key comparisons. */
#define AGW_LRU_CHAIN_MAX 8

typedef struct agw_lru agw_lru_t;

/* Counters of one tier, written by its thread only (metrics.h's AGW_M_* rule). */
typedef struct agw_lru_stats {
    uint64_t bytes;       /* gauge: bytes charged now */
    uint64_t entries;     /* gauge: entries now */
    uint64_t evictions;   /* entries dropped to make room (expired ones are not counted) */
} agw_lru_stats_t;

/* A tier of at most max_bytes; counters go to stats (must outlive it) or nowhere (NULL). Aborts on
 * allocation failure. */
agw_lru_t *agw_lru_new(size_t max_bytes, agw_lru_stats_t *stats);

/* Frees the tier and every entry (NULL is ignored). */
void agw_lru_free(agw_lru_t *c);

/* The value of key (klen bytes) and its length in *vlen, or NULL when absent or expired (expire_ms
 * <= now_ms; the entry is dropped). A hit becomes the most recently used. The bytes stay valid
 * until the next agw_lru_set, agw_lru_del or agw_lru_purge_prefix on c. */
const char *agw_lru_get(agw_lru_t *c, const char *key, size_t klen, size_t *vlen, uint64_t now_ms);

/* As agw_lru_get, and *mark points to the entry's mark: a word the caller owns, 0 when the value
 * was stored and gone with it, where the caller remembers what it learnt about these bytes so
 * that the next hit skips the work (worker/cache.c: the body was validated as JSON). Valid as
 * long as the returned bytes are. */
const char *agw_lru_get_mark(agw_lru_t *c, const char *key, size_t klen, size_t *vlen, uint64_t now_ms,
                             uint32_t **mark);

/* Stores a copy of value (vlen bytes) under key until expire_ms, replacing any previous value and
 * evicting the least recently used entries until it fits. Returns 0, or -1 when the entry alone
 * costs more than a quarter of the bound (nothing stored; a previous value is dropped). */
int agw_lru_set(agw_lru_t *c, const char *key, size_t klen, const char *value, size_t vlen, uint64_t expire_ms);

/* As agw_lru_set, the value being the n parts (an entry's first line, its headers, its body)
 * one after the other: copied once, into the entry, with no joined copy made first. */
int agw_lru_set_parts(agw_lru_t *c, const char *key, size_t klen, const struct iovec *parts, size_t n,
                      uint64_t expire_ms);

/* Drops key if present. Returns 1 when it was. */
int agw_lru_del(agw_lru_t *c, const char *key, size_t klen);

/* Drops every entry whose key starts with prefix (plen bytes; 0 drops all). Returns how many. */
size_t agw_lru_purge_prefix(agw_lru_t *c, const char *prefix, size_t plen);

/* The most entries one bucket holds now (at most AGW_LRU_CHAIN_MAX): for tests and checks. */
size_t agw_lru_longest_chain(const agw_lru_t *c);

/* The bucket key (klen bytes) falls in now (under this process's seed), 0 to the table's size - 1:
 * for tests that fill one bucket. */
size_t agw_lru_bucket_of(const agw_lru_t *c, const char *key, size_t klen);

/* Changes the bound (a reload that changed cache.memory_bytes), evicting as needed. */
void agw_lru_resize(agw_lru_t *c, size_t max_bytes);

#endif
