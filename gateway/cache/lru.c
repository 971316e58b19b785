/* lru.c: the first cache tier (lru.h): chained hash table plus a doubly linked recency list. */
#include "cache/lru.h"
#include "base/mem.h"

#include <h2o/linklist.h>
#include <h2o/memory.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include "base/counter.h"

typedef struct entry {
    struct entry *hnext;              /* bucket chain */
    h2o_linklist_t link;              /* on the recency list */
    uint64_t hash;
    uint64_t expire_ms;
    size_t klen, vlen;
    uint32_t mark;                    /* the caller's, 0 when stored (agw_lru_get_mark) */
    char bytes[];                     /* key, then value */
} entry_t;

struct agw_lru {
    entry_t **buckets;
    size_t nbuckets;                  /* power of two */
    size_t count;
    size_t bytes, max_bytes;
    h2o_linklist_t recency;           /* entries, oldest first (entry_t.link) */
    agw_lru_stats_t *stats;
    agw_lru_stats_t own;
};

/* The hash's seed: drawn once per process (hash_seed_init), so that which keys share a bucket
 * differs from process to process and cannot be worked out offline from the cache's key format.
 * Keys hold what clients choose (paths, ids); whatever they find, AGW_LRU_CHAIN_MAX bounds what one
 * bucket costs a lookup. */
static uint64_t hash_seed;
static pthread_once_t hash_seed_once = PTHREAD_ONCE_INIT;

static void hash_seed_init(void)
{
    uint64_t s = 0;
    if (getrandom(&s, sizeof(s), 0) != (ssize_t)sizeof(s)) {
        struct timespec ts; /* (getrandom without flags fails only before the kernel's pool is ready) */
        clock_gettime(CLOCK_MONOTONIC, &ts);
        s = (uint64_t)ts.tv_nsec * 0x9E3779B97F4A7C15ull ^ (uint64_t)getpid() << 32 ^ (uint64_t)(uintptr_t)&ts;
    }
    hash_seed = s;
}

static uint64_t hash_key(const char *k, size_t n)
{
    uint64_t h = 1469598103934665603ull ^ hash_seed; /* FNV-1a from the seed, then a final mix */
    for (size_t i = 0; i < n; i++) {
        h ^= (unsigned char)k[i];
        h *= 1099511628211ull;
    }
    h ^= h >> 33 ^ hash_seed;
    h *= 0xff51afd7ed558ccdull;
    h ^= h >> 33;
    return h;
}

static size_t cost(const entry_t *e)
{
    return e->klen + e->vlen + AGW_LRU_OVERHEAD;
}

static void publish(agw_lru_t *c)
{
    AGW_M_SET(c->stats->bytes, c->bytes);
    AGW_M_SET(c->stats->entries, c->count);
}

agw_lru_t *agw_lru_new(size_t max_bytes, agw_lru_stats_t *stats)
{
    pthread_once(&hash_seed_once, hash_seed_init);
    agw_lru_t *c = agw_calloc(1, sizeof(*c));
    h2o_linklist_init_anchor(&c->recency);
    c->nbuckets = 1024;
    c->buckets = agw_calloc(c->nbuckets, sizeof(*c->buckets));
    c->max_bytes = max_bytes;
    c->stats = stats ? stats : &c->own;
    return c;
}

static entry_t *entry_of(h2o_linklist_t *l)
{
    return H2O_STRUCT_FROM_MEMBER(entry_t, link, l);
}

static void list_unlink(agw_lru_t *c, entry_t *e)
{
    (void)c;
    h2o_linklist_unlink(&e->link);
}

static void list_push_newest(agw_lru_t *c, entry_t *e)
{
    h2o_linklist_insert(&c->recency, &e->link); /* last */
}

static entry_t **find_slot(agw_lru_t *c, const char *key, size_t klen, uint64_t h)
{
    entry_t **p = &c->buckets[h & (c->nbuckets - 1)];
    while (*p && !((*p)->hash == h && (*p)->klen == klen && memcmp((*p)->bytes, key, klen) == 0))
        p = &(*p)->hnext;
    return p;
}

static void remove_entry(agw_lru_t *c, entry_t *e)
{
    entry_t **p = find_slot(c, e->bytes, e->klen, e->hash);
    *p = e->hnext;
    list_unlink(c, e);
    c->bytes -= cost(e);
    c->count--;
    free(e);
}

static void grow(agw_lru_t *c)
{
    size_t n = c->nbuckets * 2;
    entry_t **b = agw_calloc(n, sizeof(*b));
    for (size_t i = 0; i < c->nbuckets; i++) {
        entry_t *e = c->buckets[i];
        while (e) {
            entry_t *next = e->hnext;
            e->hnext = b[e->hash & (n - 1)];
            b[e->hash & (n - 1)] = e;
            e = next;
        }
    }
    free(c->buckets);
    c->buckets = b;
    c->nbuckets = n;
}

static void evict_to(agw_lru_t *c, size_t limit)
{
    while (c->bytes > limit && !h2o_linklist_is_empty(&c->recency)) {
        remove_entry(c, entry_of(c->recency.next));
        AGW_M_ADD(c->stats->evictions, 1);
    }
}

void agw_lru_free(agw_lru_t *c)
{
    if (!c)
        return;
    for (h2o_linklist_t *l = c->recency.prev; l != &c->recency;) {
        h2o_linklist_t *older = l->prev;
        free(entry_of(l));
        l = older;
    }
    c->bytes = c->count = 0;
    publish(c);
    free(c->buckets);
    free(c);
}

const char *agw_lru_get(agw_lru_t *c, const char *key, size_t klen, size_t *vlen, uint64_t now_ms)
{
    uint32_t *mark;
    return agw_lru_get_mark(c, key, klen, vlen, now_ms, &mark);
}

const char *agw_lru_get_mark(agw_lru_t *c, const char *key, size_t klen, size_t *vlen, uint64_t now_ms,
                             uint32_t **mark)
{
    uint64_t h = hash_key(key, klen);
    entry_t *e = *find_slot(c, key, klen, h);
    if (!e)
        return NULL;
    if (e->expire_ms <= now_ms) {
        remove_entry(c, e);
        publish(c);
        return NULL;
    }
    if (c->recency.prev != &e->link) {
        list_unlink(c, e);
        list_push_newest(c, e);
    }
    *vlen = e->vlen;
    *mark = &e->mark;
    return e->bytes + e->klen;
}

int agw_lru_set_parts(agw_lru_t *c, const char *key, size_t klen, const struct iovec *parts, size_t n,
                      uint64_t expire_ms)
{
    uint64_t h = hash_key(key, klen);
    entry_t **p = find_slot(c, key, klen, h);
    if (*p)
        remove_entry(c, *p);
    size_t vlen = 0;
    for (size_t i = 0; i < n; i++)
        vlen += parts[i].iov_len;
    size_t need = klen + vlen + AGW_LRU_OVERHEAD;
    if (need > c->max_bytes / 4) {
        publish(c);
        return -1;
    }
    evict_to(c, c->max_bytes - need);
    entry_t *e = agw_malloc(sizeof(*e) + klen + vlen);
    e->hash = h;
    e->expire_ms = expire_ms;
    e->klen = klen;
    e->vlen = vlen;
    e->link = (h2o_linklist_t){NULL, NULL}; /* not on the list yet (h2o_linklist_insert checks) */
    e->mark = 0;
    memcpy(e->bytes, key, klen);
    char *at = e->bytes + klen;
    for (size_t i = 0; i < n; i++) {
        if (parts[i].iov_len)
            memcpy(at, parts[i].iov_base, parts[i].iov_len);
        at += parts[i].iov_len;
    }
    if (c->count + 1 > c->nbuckets)
        grow(c);
    p = &c->buckets[h & (c->nbuckets - 1)];
    /* a bucket holds at most AGW_LRU_CHAIN_MAX entries: keys that share one (by chance, or found
     * by a client that makes keys) cost a lookup that many comparisons at most. The bucket's
     * entry whose freshness ends first makes room. */
    size_t chain = 0;
    entry_t *soonest = NULL;
    for (entry_t *o = *p; o; o = o->hnext, chain++)
        if (soonest == NULL || o->expire_ms < soonest->expire_ms)
            soonest = o;
    if (chain >= AGW_LRU_CHAIN_MAX) {
        remove_entry(c, soonest);
        AGW_M_ADD(c->stats->evictions, 1);
        p = &c->buckets[h & (c->nbuckets - 1)];
    }
    e->hnext = *p;
    *p = e;
    list_push_newest(c, e);
    c->bytes += need;
    c->count++;
    publish(c);
    return 0;
}

int agw_lru_set(agw_lru_t *c, const char *key, size_t klen, const char *value, size_t vlen, uint64_t expire_ms)
{
    struct iovec part = {(void *)value, vlen};
    return agw_lru_set_parts(c, key, klen, &part, 1, expire_ms);
}

int agw_lru_del(agw_lru_t *c, const char *key, size_t klen)
{
    entry_t *e = *find_slot(c, key, klen, hash_key(key, klen));
    if (!e)
        return 0;
    remove_entry(c, e);
    publish(c);
    return 1;
}

size_t agw_lru_purge_prefix(agw_lru_t *c, const char *prefix, size_t plen)
{
    size_t n = 0;
    for (h2o_linklist_t *l = c->recency.prev; l != &c->recency;) {
        h2o_linklist_t *older = l->prev;
        entry_t *e = entry_of(l);
        if (e->klen >= plen && memcmp(e->bytes, prefix, plen) == 0) {
            remove_entry(c, e);
            n++;
        }
        l = older;
    }
    publish(c);
    return n;
}

size_t agw_lru_longest_chain(const agw_lru_t *c)
{
    size_t longest = 0;
    for (size_t i = 0; i < c->nbuckets; i++) {
        size_t n = 0;
        for (const entry_t *e = c->buckets[i]; e; e = e->hnext)
            n++;
        if (n > longest)
            longest = n;
    }
    return longest;
}

size_t agw_lru_bucket_of(const agw_lru_t *c, const char *key, size_t klen)
{
    return (size_t)(hash_key(key, klen) & (c->nbuckets - 1));
}

void agw_lru_resize(agw_lru_t *c, size_t max_bytes)
{
    c->max_bytes = max_bytes;
    evict_to(c, max_bytes);
    publish(c);
}
