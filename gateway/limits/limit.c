/* limit.c: GCRA rates and fixed-window quotas in a lock-free table (see limit.h). */
#include "limits/limit.h"
#include "limits/limit_seen.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

/* One key's count. key: the hash owning the slot (0: never used). state: a rate's theoretical
 * arrival time (µs since the epoch), or a quota's window number << 40 | count. expires_ms: when
 * the count no longer matters (the slot may then be taken over). */
typedef struct slot {
    uint64_t key;
    uint64_t state;
    uint64_t expires_ms;
} slot_t;

struct agw_limit_store {
    slot_t *slots;
    size_t mask;
    uint64_t full;  /* checks that found no slot (atomic) */
    pthread_mutex_t names_lock;                      /* adding a counter */
    uint32_t num_counts;                             /* published with release order */
    agw_limit_counts_t counts[AGW_LIMIT_COUNTERS_MAX];
    agw_limit_seen_t *seen;                          /* the Redis rules' side (limit_seen.h) */
};

#define QUOTA_COUNT_BITS 40
#define QUOTA_COUNT_MASK ((UINT64_C(1) << QUOTA_COUNT_BITS) - 1)

/* ---- hashing -------------------------------------------------------------------------------- */

static uint64_t salt;
static pthread_once_t salt_once = PTHREAD_ONCE_INIT;

static void init_salt(void)
{
    if (getrandom(&salt, sizeof(salt), 0) != (ssize_t)sizeof(salt))
        salt = (uint64_t)time(NULL) * UINT64_C(0x9e3779b97f4a7c15);
}

static uint64_t mix(uint64_t x) /* splitmix64's finalizer */
{
    x ^= x >> 30;
    x *= UINT64_C(0xbf58476d1ce4e5b9);
    x ^= x >> 27;
    x *= UINT64_C(0x94d049bb133111eb);
    return x ^ (x >> 31);
}

static uint64_t fnv(uint64_t h, const void *p, size_t len)
{
    const unsigned char *b = p;
    for (size_t i = 0; i < len; i++)
        h = (h ^ b[i]) * UINT64_C(0x100000001b3);
    return h;
}

void agw_limit_rule_seal(agw_limit_rule_t *r)
{
    uint64_t h = UINT64_C(0xcbf29ce484222325);
    h = fnv(h, r->name, strlen(r->name) + 1);
    uint64_t nums[7] = {(uint64_t)r->key, (uint64_t)r->is_quota, r->rate, r->per_s, r->burst, r->quota,
                        (uint64_t)r->window};
    h = fnv(h, nums, sizeof(nums));
    if (r->header)
        h = fnv(h, r->header, strlen(r->header));
    r->seed = h;
}

uint64_t agw_limit_hash(const agw_limit_rule_t *r, const char *key, size_t len)
{
    pthread_once(&salt_once, init_salt);
    uint64_t h = mix(fnv(r->seed ^ salt, key, len));
    return h ? h : 1; /* 0 marks an unused slot */
}

/* ---- the table ------------------------------------------------------------------------------ */

agw_limit_store_t *agw_limit_store_new(size_t slots)
{
    size_t n = 64;
    while (n < slots)
        n <<= 1;
    agw_limit_store_t *s = calloc(1, sizeof(*s));
    if (s == NULL || (s->slots = calloc(n, sizeof(*s->slots))) == NULL)
        abort();
    s->mask = n - 1;
    s->seen = agw_limit_seen_new();
    pthread_mutex_init(&s->names_lock, NULL);
    return s;
}

/* The counter index + 1 of r's name (taken once per rule), or -1 when there is no room. */
static int counter_of(agw_limit_store_t *s, agw_limit_rule_t *r)
{
    int c = __atomic_load_n(&r->counter, __ATOMIC_ACQUIRE);
    if (c == 0) {
        pthread_mutex_lock(&s->names_lock);
        uint32_t n = s->num_counts;
        for (uint32_t i = 0; i < n && c == 0; i++)
            if (strcmp(s->counts[i].name, r->name) == 0)
                c = (int)i + 1;
        if (c == 0 && n < AGW_LIMIT_COUNTERS_MAX) {
            snprintf(s->counts[n].name, sizeof(s->counts[n].name), "%s", r->name);
            __atomic_store_n(&s->num_counts, n + 1, __ATOMIC_RELEASE);
            c = (int)n + 1;
        }
        pthread_mutex_unlock(&s->names_lock);
        if (c == 0)
            c = -1; /* no room: not counted */
        __atomic_store_n(&r->counter, c, __ATOMIC_RELEASE);
    }
    return c;
}

void agw_limit_count(agw_limit_store_t *s, agw_limit_rule_t *r, int allowed)
{
    int c = counter_of(s, r);
    if (c > 0)
        __atomic_add_fetch(allowed ? &s->counts[c - 1].allowed : &s->counts[c - 1].limited, 1, __ATOMIC_RELAXED);
}

void agw_limit_count_error(agw_limit_store_t *s, agw_limit_rule_t *r, int redis)
{
    int c = counter_of(s, r);
    if (c > 0)
        __atomic_add_fetch(redis ? &s->counts[c - 1].redis_errors : &s->counts[c - 1].key_errors, 1, __ATOMIC_RELAXED);
}

size_t agw_limit_counters(const agw_limit_store_t *s, const agw_limit_counts_t **out)
{
    *out = s->counts;
    return __atomic_load_n(&s->num_counts, __ATOMIC_ACQUIRE);
}

void agw_limit_store_free(agw_limit_store_t *s)
{
    if (s == NULL)
        return;
    free(s->slots);
    agw_limit_seen_free(s->seen);
    pthread_mutex_destroy(&s->names_lock);
    free(s);
}

agw_limit_seen_t *agw_limit_store_seen(agw_limit_store_t *s)
{
    return s->seen;
}

size_t agw_limit_store_slots(const agw_limit_store_t *s)
{
    return s->mask + 1;
}

uint64_t agw_limit_store_full(const agw_limit_store_t *s)
{
    return __atomic_load_n(&s->full, __ATOMIC_RELAXED);
}

/* The slot of h: its own, a never-used one it claims, or one whose count expired before now_ms,
 * taken over (its state cleared). NULL when every probed slot holds a live key. create: 0 only
 * looks (peek). */
static slot_t *find_slot(agw_limit_store_t *s, uint64_t h, uint64_t now_ms, int create)
{
    slot_t *expired = NULL;
    for (size_t i = 0; i < AGW_LIMIT_PROBE; i++) {
        slot_t *sl = &s->slots[(h + i) & s->mask];
        uint64_t k = __atomic_load_n(&sl->key, __ATOMIC_ACQUIRE);
        if (k == h)
            return sl;
        if (k == 0) {
            if (!create)
                return NULL;
            uint64_t zero = 0;
            if (__atomic_compare_exchange_n(&sl->key, &zero, h, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
                return sl; /* never used: its state is 0 */
            if (zero == h)
                return sl; /* another worker claimed it for the same key */
            continue;
        }
        if (expired == NULL && __atomic_load_n(&sl->expires_ms, __ATOMIC_RELAXED) <= now_ms)
            expired = sl;
    }
    if (!create || expired == NULL)
        return NULL;
    uint64_t old = __atomic_load_n(&expired->key, __ATOMIC_ACQUIRE);
    if (old == h)
        return expired;
    if (!__atomic_compare_exchange_n(&expired->key, &old, h, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
        return old == h ? expired : NULL;
    __atomic_store_n(&expired->state, 0, __ATOMIC_RELEASE);
    __atomic_store_n(&expired->expires_ms, 0, __ATOMIC_RELEASE);
    return expired;
}

/* ---- windows -------------------------------------------------------------------------------- */

static uint64_t days_from_civil(int64_t y, unsigned m, unsigned d) /* days since 1970-01-01 */
{
    y -= m <= 2;
    int64_t era = (y >= 0 ? y : y - 399) / 400;
    unsigned yoe = (unsigned)(y - era * 400);
    unsigned doy = (153 * (m + (m > 2 ? -3 : 9)) + 2) / 5 + d - 1;
    unsigned doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    return (uint64_t)(era * 146097 + (int64_t)doe - 719468);
}

void agw_limit_window_bounds(agw_limit_window_t w, uint64_t now_ms, uint64_t *start_ms, uint64_t *end_ms)
{
    if (w == AGW_LIMIT_HOUR || w == AGW_LIMIT_DAY) {
        uint64_t len = w == AGW_LIMIT_HOUR ? 3600000 : 86400000;
        *start_ms = now_ms / len * len;
        *end_ms = *start_ms + len;
        return;
    }
    time_t t = (time_t)(now_ms / 1000);
    struct tm tm;
    gmtime_r(&t, &tm);
    int64_t y = tm.tm_year + 1900;
    unsigned m = (unsigned)tm.tm_mon + 1;
    *start_ms = days_from_civil(y, m, 1) * 86400000;
    *end_ms = days_from_civil(m == 12 ? y + 1 : y, m == 12 ? 1 : m + 1, 1) * 86400000;
}

/* A window's number: hours, days or months since the epoch (fits the state's 24 high bits). */
static uint64_t window_number(agw_limit_window_t w, uint64_t start_ms)
{
    if (w == AGW_LIMIT_HOUR)
        return start_ms / 3600000;
    if (w == AGW_LIMIT_DAY)
        return start_ms / 86400000;
    time_t t = (time_t)(start_ms / 1000);
    struct tm tm;
    gmtime_r(&t, &tm);
    return (uint64_t)(tm.tm_year - 70) * 12 + (uint64_t)tm.tm_mon;
}

/* ---- rates (GCRA) --------------------------------------------------------------------------- */

static uint64_t div_up(uint64_t a, uint64_t b)
{
    return (a + b - 1) / b;
}

static void rate_policy(const agw_limit_rule_t *r, agw_limit_result_t *out)
{
    out->limit = r->burst;
    out->window_s = div_up(r->burst * r->per_s, r->rate);
    if (out->window_s == 0)
        out->window_s = 1;
}

/* The answer for a state tat (µs) at now (µs), with the request counted (counted = 1) or not. */
static void rate_answer(const agw_limit_rule_t *r, uint64_t tat, uint64_t now, agw_limit_result_t *out)
{
    uint64_t t = agw_limit_emission_us(r), tau = t * r->burst;
    if (tat < now)
        tat = now;
    uint64_t used = tat - now; /* the bucket's fill, in time */
    out->remaining = used >= tau ? 0 : (tau - used) / t;
    out->reset_ms = div_up(used, 1000);
}

static int rate_take(slot_t *sl, const agw_limit_rule_t *r, uint64_t now_ms, agw_limit_result_t *out)
{
    uint64_t t = agw_limit_emission_us(r), tau = t * r->burst, now = now_ms * 1000;
    uint64_t old = __atomic_load_n(&sl->state, __ATOMIC_ACQUIRE);
    for (;;) {
        uint64_t tat = old > now ? old : now;
        uint64_t next = tat + t;
        if (next - now > tau) { /* refused: not counted */
            out->allowed = 0;
            out->remaining = 0;
            out->reset_ms = div_up(next - tau - now, 1000);
            if (out->reset_ms == 0)
                out->reset_ms = 1;
            return 0;
        }
        if (__atomic_compare_exchange_n(&sl->state, &old, next, 1, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
            __atomic_store_n(&sl->expires_ms, div_up(next, 1000), __ATOMIC_RELAXED);
            out->allowed = 1;
            rate_answer(r, next, now, out);
            return 1;
        }
    }
}

/* ---- quotas --------------------------------------------------------------------------------- */

static int quota_take(slot_t *sl, const agw_limit_rule_t *r, uint64_t now_ms, agw_limit_result_t *out)
{
    uint64_t start, end;
    agw_limit_window_bounds(r->window, now_ms, &start, &end);
    uint64_t win = window_number(r->window, start);
    out->reset_ms = end - now_ms;
    uint64_t old = __atomic_load_n(&sl->state, __ATOMIC_ACQUIRE);
    for (;;) {
        uint64_t count = (old >> QUOTA_COUNT_BITS) == win ? old & QUOTA_COUNT_MASK : 0;
        if (count >= r->quota) {
            out->allowed = 0;
            out->remaining = 0;
            return 0;
        }
        if (__atomic_compare_exchange_n(&sl->state, &old, win << QUOTA_COUNT_BITS | (count + 1), 1, __ATOMIC_ACQ_REL,
                                        __ATOMIC_ACQUIRE)) {
            __atomic_store_n(&sl->expires_ms, end, __ATOMIC_RELAXED);
            out->allowed = 1;
            out->remaining = r->quota - count - 1;
            return 1;
        }
    }
}

static void quota_policy(const agw_limit_rule_t *r, uint64_t now_ms, agw_limit_result_t *out)
{
    uint64_t start, end;
    agw_limit_window_bounds(r->window, now_ms, &start, &end);
    out->limit = r->quota;
    out->window_s = (end - start) / 1000;
}

void agw_limits_conf_clear(agw_limits_conf_t *c)
{
    for (size_t i = 0; c->rules && i < c->num_rules; i++) {
        free(c->rules[i].name);
        free(c->rules[i].header);
    }
    free(c->rules);
    memset(c, 0, sizeof(*c));
}

void agw_limit_policy(const agw_limit_rule_t *r, uint64_t now_ms, agw_limit_result_t *out)
{
    if (r->is_quota)
        quota_policy(r, now_ms, out);
    else
        rate_policy(r, out);
}

int agw_limit_decide(agw_limit_verdict_t *v, size_t num)
{
    v->allowed = 1;
    v->decisive = -1;
    for (size_t i = 0; i < num; i++)
        if (!v->results[i].allowed)
            v->allowed = 0;
    for (size_t i = 0; i < num; i++) {
        const agw_limit_result_t *r = &v->results[i], *d = v->decisive >= 0 ? &v->results[v->decisive] : NULL;
        if (!v->allowed) {
            if (!r->allowed && (d == NULL || r->reset_ms > d->reset_ms))
                v->decisive = (int)i;
        } else if (d == NULL || r->remaining < d->remaining ||
                   (r->remaining == d->remaining && r->reset_ms < d->reset_ms)) {
            v->decisive = (int)i;
        }
    }
    return v->allowed;
}

/* ---- the public checks ---------------------------------------------------------------------- */

int agw_limit_take(agw_limit_store_t *s, const agw_limit_rule_t *r, uint64_t h, uint64_t now_ms,
                   agw_limit_result_t *out)
{
    if (r->is_quota)
        quota_policy(r, now_ms, out);
    else
        rate_policy(r, out);
    slot_t *sl = find_slot(s, h, now_ms, 1);
    if (sl == NULL) { /* the table is full here: let through, uncounted (limit.h) */
        __atomic_add_fetch(&s->full, 1, __ATOMIC_RELAXED);
        out->allowed = 1;
        out->remaining = out->limit;
        out->reset_ms = 0;
        return 1;
    }
    return r->is_quota ? quota_take(sl, r, now_ms, out) : rate_take(sl, r, now_ms, out);
}

void agw_limit_give_back(agw_limit_store_t *s, const agw_limit_rule_t *r, uint64_t h, uint64_t now_ms)
{
    slot_t *sl = find_slot(s, h, now_ms, 0);
    if (sl == NULL)
        return;
    uint64_t old = __atomic_load_n(&sl->state, __ATOMIC_ACQUIRE), next;
    do {
        if (r->is_quota) {
            if ((old & QUOTA_COUNT_MASK) == 0)
                return;
            next = old - 1; /* in an older window the count is ignored anyway */
        } else {
            uint64_t t = agw_limit_emission_us(r);
            next = old > t ? old - t : 0;
        }
    } while (!__atomic_compare_exchange_n(&sl->state, &old, next, 1, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE));
}

void agw_limit_peek(agw_limit_store_t *s, const agw_limit_rule_t *r, uint64_t h, uint64_t now_ms,
                    agw_limit_result_t *out)
{
    slot_t *sl = find_slot(s, h, now_ms, 0);
    uint64_t state = sl ? __atomic_load_n(&sl->state, __ATOMIC_ACQUIRE) : 0;
    if (r->is_quota) {
        quota_policy(r, now_ms, out);
        uint64_t start, end;
        agw_limit_window_bounds(r->window, now_ms, &start, &end);
        uint64_t count = (state >> QUOTA_COUNT_BITS) == window_number(r->window, start) ? state & QUOTA_COUNT_MASK : 0;
        out->remaining = count >= r->quota ? 0 : r->quota - count;
        out->reset_ms = end - now_ms;
    } else {
        rate_policy(r, out);
        rate_answer(r, state, now_ms * 1000, out);
    }
    out->allowed = out->remaining > 0;
}

void agw_limit_peek_next(agw_limit_store_t *s, const agw_limit_rule_t *r, uint64_t h, uint64_t now_ms,
                         agw_limit_result_t *out)
{
    agw_limit_peek(s, r, h, now_ms, out);
    if (out->allowed || r->is_quota)
        return;
    /* a rate's peek says when it is full again; refused, it matters when one fits (rate_take's
     * refusal: the bucket's fill less one emission below its depth) */
    slot_t *sl = find_slot(s, h, now_ms, 0);
    uint64_t t = agw_limit_emission_us(r), tau = t * r->burst, now = now_ms * 1000;
    uint64_t tat = sl ? __atomic_load_n(&sl->state, __ATOMIC_ACQUIRE) : 0;
    if (tat < now)
        tat = now;
    out->reset_ms = tat + t > tau + now ? div_up(tat + t - tau - now, 1000) : 0;
    if (out->reset_ms == 0)
        out->reset_ms = 1;
}

int agw_limit_check(agw_limit_store_t *s, const agw_limit_ask_t *asks, size_t num, uint64_t now_ms,
                    agw_limit_verdict_t *v)
{
    v->allowed = 1;
    v->decisive = -1;
    size_t taken = 0;
    for (; taken < num; taken++)
        if (!agw_limit_take(s, asks[taken].rule, asks[taken].hash, now_ms, &v->results[taken])) {
            v->allowed = 0;
            break;
        }
    if (!v->allowed) {
        /* give back what the earlier rules took, and ask the later ones (uncounted) so that the
         * answer names every rule the request breaks */
        for (size_t i = 0; i < taken; i++)
            agw_limit_give_back(s, asks[i].rule, asks[i].hash, now_ms);
        for (size_t i = taken + 1; i < num; i++)
            agw_limit_peek_next(s, asks[i].rule, asks[i].hash, now_ms, &v->results[i]);
        for (size_t i = 0; i < num; i++) {
            const agw_limit_result_t *r = &v->results[i];
            if (i != taken && r->remaining > 0)
                continue;
            if (i != taken)
                v->results[i].allowed = 0;
            if (v->decisive < 0 || r->reset_ms > v->results[v->decisive].reset_ms)
                v->decisive = (int)i;
        }
        return 0;
    }
    for (size_t i = 0; i < num; i++) {
        const agw_limit_result_t *r = &v->results[i], *d = v->decisive >= 0 ? &v->results[v->decisive] : NULL;
        if (d == NULL || r->remaining < d->remaining || (r->remaining == d->remaining && r->reset_ms < d->reset_ms))
            v->decisive = (int)i;
    }
    return 1;
}

size_t agw_limit_ip_key(int family, const void *addr, const char **key)
{
    if (family == AF_INET) {
        *key = addr;
        return 4;
    }
    if (family != AF_INET6)
        return 0;
    const struct in6_addr *a6 = addr;
    if (IN6_IS_ADDR_V4MAPPED(a6)) {
        *key = (const char *)a6->s6_addr + 12;
        return 4;
    }
    *key = (const char *)a6->s6_addr;
    return 8;
}

size_t agw_limit_ip_key_of_text(const char *text, unsigned char buf[16], const char **key)
{
    if (inet_pton(AF_INET, text, buf) == 1)
        return agw_limit_ip_key(AF_INET, buf, key);
    if (inet_pton(AF_INET6, text, buf) == 1)
        return agw_limit_ip_key(AF_INET6, buf, key);
    return 0;
}
