/* limit.h: rate limits and quotas, counted in a store shared by every worker of the process
 * (issue "Rate limits, quotas and priority groups"; DESIGN §9, §9.1).
 *
 * A rule has a name, a key (what it counts per: the client's address, the route, a header's value)
 * and either
 *   - a rate: `rate` requests per `per_s` seconds, at most `burst` at once, counted with GCRA (the
 *     generic cell rate algorithm, ITU-T I.371; the same arithmetic as a token bucket of `burst`
 *     tokens refilled at rate/per_s): one state word per key, the theoretical arrival time (TAT);
 *   - a quota: `quota` requests per fixed UTC window (an hour, a day, a calendar month), reset at
 *     the window's end: one state word per key, the window's number and its count.
 *
 * The store (agw_limit_store_t) is a fixed table of slots, each one key hash and one state word;
 * a check is a compare-and-swap loop on the state word: no lock. Error bound of the local store:
 *   - rates and quotas are exact for a key as long as its slot is its own (every take is one CAS);
 *   - keys are told apart by a 64-bit hash salted per process (so that clients cannot choose keys
 *     that crowd one part of the table): two keys that share a hash share their counts (about one
 *     chance in 2^64 per pair);
 *   - a slot whose count has expired may be taken over by another key; a worker that read the old
 *     key's slot just before can charge that one request to the new key, or a request of the new key
 *     counted in that instant can be lost: at most one request per worker per takeover, either way;
 *   - when every slot a key may probe holds a live key (AGW_LIMIT_PROBE of them), the request is
 *     let through uncounted and counted in `full` (the table is too small: limits.local_keys).
 *   - a check of several rules takes each in turn and gives back what it took when a later rule
 *     refuses (agw_limit_check): a concurrent request may see the taken unit for that moment, so
 *     it may be refused when it would just have fit (never let through when it should not be).
 */
#ifndef AGW_LIMIT_H
#define AGW_LIMIT_H

#include <stddef.h>
#include <stdint.h>

/* What a rule counts per. */
typedef enum agw_limit_key {
    AGW_LIMIT_KEY_IP,      /* the client's address (without the port) */
    AGW_LIMIT_KEY_ROUTE,   /* the endpoint's route pattern ("GET /product-page/{id}") */
    AGW_LIMIT_KEY_HEADER,  /* a request header's value (absent: the empty value, one shared count) */
    AGW_LIMIT_KEY_API_KEY, /* the app of the API key the edge accepted (edge/apikeys.h: every key of
                              one app shares its count); no API key: the empty value */
    AGW_LIMIT_KEY_USER,    /* the authenticated user: the token's `sub` claim, or the API key's app;
                              not authenticated: the empty value */
    AGW_LIMIT_KEY_FUNCTION,/* what a Lua function of the request returns (the generation's VM keeps
                              it: worker/limits.c calls it, agg.limits.key_of) */
} agw_limit_key_t;

/* The bytes a rule keyed by "ip" counts a client's address by, pointed into addr (family AF_INET:
 * a struct in_addr; AF_INET6: a struct in6_addr). Returns their length: IPv4, its 4 bytes; IPv6,
 * its /64 prefix, 8 bytes (one subscriber's network: a client given a /64, as most are, could use
 * a fresh address for every request and so start a fresh count for each, and fill the table of
 * counts with keys of its own); an IPv4-mapped IPv6 address (a dual-stack listener's IPv4
 * client), the IPv4 address's 4 bytes, so each IPv4 client keeps its own count. 0 for another
 * family. */
size_t agw_limit_ip_key(int family, const void *addr, const char **key);

/* The same bytes for an address in text (an IPv4 or IPv6 literal, NUL-terminated: the admin
 * page's key=), pointed into buf. Returns their length, 0 when text is not an address. */
size_t agw_limit_ip_key_of_text(const char *text, unsigned char buf[16], const char **key);

/* Fixed UTC windows of a quota. */
typedef enum agw_limit_window {
    AGW_LIMIT_HOUR,
    AGW_LIMIT_DAY,
    AGW_LIMIT_MONTH,       /* calendar month (28 to 31 days) */
} agw_limit_window_t;

/* What a Redis rule does when Redis cannot answer (down, slower than redis.timeout_ms, or an
 * answer that is not the script's): gateway.lua `on_redis_error`. */
typedef enum agw_limit_on_error {
    AGW_LIMIT_FALLBACK_LOCAL, /* "local" (the default): the process's store counts the rule meanwhile
                                 (each instance then allows the whole limit on its own) */
    AGW_LIMIT_FALLBACK_ALLOW, /* "allow": the rule accepts, uncounted */
    AGW_LIMIT_FALLBACK_DENY,  /* "deny": the rule refuses (503, Retry-After 1) */
} agw_limit_on_error_t;

typedef struct agw_limit_rule {
    char *name;                 /* as in gateway.lua ("per-key"); also the policy name in headers */
    agw_limit_key_t key;
    char *header;               /* AGW_LIMIT_KEY_HEADER: the header's name, lower case; else NULL */
    int is_quota;               /* 0: rate (rate, per_s, burst); 1: quota (quota, window) */
    uint64_t rate;              /* rate: requests per per_s seconds (> 0) */
    uint64_t per_s;             /* rate: seconds (> 0) */
    uint64_t burst;             /* rate: the most requests accepted at once (> 0) */
    uint64_t quota;             /* quota: requests per window (> 0) */
    agw_limit_window_t window;  /* quota: its window */
    int redis;                  /* store = "redis": counted in Redis (limit_redis.h), else locally */
    agw_limit_on_error_t on_redis_error; /* a Redis rule's answer when Redis cannot give one */
    int before_auth;            /* a rate keyed "ip" (gateway.lua `before_auth`, default true): on an endpoint
                                   with auth, the edge's refusals count against it and a spent count
                                   refuses before the edge (worker_internal.h,
                                   agw_worker_gate_before_edge) */
    uint64_t seed;              /* hash seed told apart per rule (name, kind, numbers): a rule that
                                   changes on reload starts its counts afresh */
    int counter;                /* private: 1 + the store's counter of this rule's name, 0 until
                                   first used (agw_limit_count; atomic) */
} agw_limit_rule_t;

/* The `limits` block of a generation (gateway.lua) and max_in_flight. */
typedef struct agw_limits_conf {
    agw_limit_rule_t *rules;    /* index i is rule i of limits.rules */
    size_t num_rules;
    int headers;                /* limits.headers: RateLimit fields on accepted responses too */
    size_t num_redis;           /* rules with store = "redis" */
    size_t local_keys;          /* limits.local_keys: slots of the process's store (read at start-up) */
    unsigned max_in_flight;     /* pages a worker has in flight before it sheds priority 3 (DESIGN §9.1) */
} agw_limits_conf_t;

/* Frees the rules' strings and the array (not c itself) and zeroes it. */
void agw_limits_conf_clear(agw_limits_conf_t *c);

/* One rule's answer for one key at one time. */
typedef struct agw_limit_result {
    int allowed;                /* 1: within the rule (and counted, unless given back) */
    uint64_t limit;             /* the policy's quota: burst for a rate, quota for a quota */
    uint64_t window_s;          /* the policy's window, s: ceil(burst * per_s / rate) for a rate
                                   (the time an empty bucket takes to fill), the window's length for
                                   a quota (the current month's for a month) */
    uint64_t remaining;         /* requests accepted from now on before this rule refuses */
    uint64_t reset_ms;          /* allowed: ms until the count is back at full (rate) or the window
                                   ends (quota); refused: ms until a request can be accepted again */
} agw_limit_result_t;

/* The store: fixed at creation. */
typedef struct agw_limit_store agw_limit_store_t;

/* Slots a key may probe from its home slot before the table counts as full for it. */
#define AGW_LIMIT_PROBE 32

/* A store of slots slots (rounded up to a power of two, at least 64): 16 bytes each. Never NULL
 * (out of memory aborts, as everywhere in the gateway). Free with agw_limit_store_free. */
agw_limit_store_t *agw_limit_store_new(size_t slots);

void agw_limit_store_free(agw_limit_store_t *s);

struct agw_limit_seen;

/* What the process knows of its Redis rules (limits/limit_seen.h): made and freed with s, the same
 * for every worker and the admin page. */
struct agw_limit_seen *agw_limit_store_seen(agw_limit_store_t *s);

/* Slots of s (the rounded size). */
size_t agw_limit_store_slots(const agw_limit_store_t *s);

/* Checks where the table was too full to count (see the error bound above): a running total. */
uint64_t agw_limit_store_full(const agw_limit_store_t *s);

/* What a Redis rule's hash is told apart by where the process's store keeps its shadow: the
 * refusals of the edge this process charged it (worker/limits.c; the admin page's /limits). */
#define AGW_LIMIT_SHADOW_SALT UINT64_C(0x9e3779b97f4a7c15)

/* The 64-bit hash of (rule, key bytes) a store counts under. key may be NULL when len is 0. */
uint64_t agw_limit_hash(const agw_limit_rule_t *r, const char *key, size_t len);

/* Sets r->seed from its name, kind and numbers (call once the rule is filled in). */
void agw_limit_rule_seal(agw_limit_rule_t *r);

/* Takes one request for hash h under rule r at now_ms (milliseconds since the Unix epoch, UTC:
 * quotas' windows are UTC hours, days and months). Fills *out; returns out->allowed. A refused
 * request is not counted. Thread-safe, no lock. */
int agw_limit_take(agw_limit_store_t *s, const agw_limit_rule_t *r, uint64_t h, uint64_t now_ms,
                   agw_limit_result_t *out);

/* Gives back one request taken at now_ms by agw_limit_take for (r, h) (another rule refused the
 * request: only accepted requests are counted). Thread-safe. */
void agw_limit_give_back(agw_limit_store_t *s, const agw_limit_rule_t *r, uint64_t h, uint64_t now_ms);

/* What agw_limit_take would answer now, without counting (the admin page). */
void agw_limit_peek(agw_limit_store_t *s, const agw_limit_rule_t *r, uint64_t h, uint64_t now_ms,
                    agw_limit_result_t *out);

/* As agw_limit_peek, but a refused rate's reset_ms is the time until one request fits, as
 * agw_limit_take's refusal says it (Retry-After: never earlier than the next acceptance, RFC 9110
 * §10.2.3), not the time until the bucket is full again. Nothing is counted. */
void agw_limit_peek_next(agw_limit_store_t *s, const agw_limit_rule_t *r, uint64_t h, uint64_t now_ms,
                         agw_limit_result_t *out);

/* The start of the window holding now_ms and the next one's, ms since the epoch (UTC). */
void agw_limit_window_bounds(agw_limit_window_t w, uint64_t now_ms, uint64_t *start_ms, uint64_t *end_ms);

/* Decisions per rule name, for the metrics (the store keeps them across reloads). */
typedef struct agw_limit_counts {
    char name[72];              /* the rule's name */
    uint64_t allowed;           /* requests the rule accepted that went through (atomic) */
    uint64_t limited;           /* requests the rule refused (atomic) */
    uint64_t redis_errors;      /* checks of a Redis rule that Redis did not answer (down, timeout,
                                   garbage): decided by its on_redis_error instead (atomic) */
    uint64_t key_errors;        /* requests whose key function failed (atomic) */
} agw_limit_counts_t;

/* Rule names a store counts at most; more rules are checked but not counted in the metrics. */
#define AGW_LIMIT_COUNTERS_MAX 256

/* Counts one decision of rule r in s: allowed (1) or limited (0). Thread-safe; the first count of a
 * name takes a lock once per rule of a generation, the others are one atomic add. */
void agw_limit_count(agw_limit_store_t *s, agw_limit_rule_t *r, int allowed);

/* Counts one Redis error (redis: 1) or key-function error (0) of rule r in s. Thread-safe. */
void agw_limit_count_error(agw_limit_store_t *s, agw_limit_rule_t *r, int redis);

/* The counters of s: *out points at n of them (entries are only added; read with atomics). */
size_t agw_limit_counters(const agw_limit_store_t *s, const agw_limit_counts_t **out);

/* One rule of a check and the key it counts (the caller extracted it from the request). */
typedef struct agw_limit_ask {
    const agw_limit_rule_t *rule;
    uint64_t hash;              /* agw_limit_hash(rule, key) */
} agw_limit_ask_t;

/* The outcome of a check of several rules. */
typedef struct agw_limit_verdict {
    int allowed;                /* every rule accepted (each counted one request) */
    int decisive;               /* index in asks of the most restrictive rule: refused, the refusing
                                   rule with the longest wait; accepted, the one with the fewest
                                   requests remaining (then the shortest reset); -1 with no rules */
    agw_limit_result_t *results; /* the caller's array of num results, one per ask */
} agw_limit_verdict_t;

/* Checks a request against every rule in asks (num of them) at now_ms: takes one from each; when
 * one refuses, gives back what the others took (only accepted requests are counted), so that a
 * refused request costs nothing. v->results must hold num entries. Returns v->allowed. */
int agw_limit_check(agw_limit_store_t *s, const agw_limit_ask_t *asks, size_t num, uint64_t now_ms,
                    agw_limit_verdict_t *v);

/* Fills out->limit and out->window_s, rule r's policy at now_ms (a month's window is the current
 * month's length). */
void agw_limit_policy(const agw_limit_rule_t *r, uint64_t now_ms, agw_limit_result_t *out);

/* Sets v->allowed and v->decisive from the num results of v: refused when any result is, the
 * decisive rule being the refusing one with the longest reset_ms; accepted, the one with the fewest
 * remaining (then the shortest reset_ms); -1 with no rules. Returns v->allowed. */
int agw_limit_decide(agw_limit_verdict_t *v, size_t num);

/* A rate's emission interval, µs: the time one request takes out of the bucket (GCRA's T),
 * per_s * 1e6 / rate rounded up, so that the count never goes over the rate. Truncated, it went
 * over by up to 1 µs a request: 700,000 a second were counted as 1,000,000 (an attack review). The
 * local store and the Redis script count with the same interval (limit.c, limit_redis.c). */
static inline uint64_t agw_limit_emission_us(const agw_limit_rule_t *r)
{
    return (r->per_s * 1000000 + r->rate - 1) / r->rate;
}

/* Seconds to say in Retry-After / the t parameter for a wait of ms: rounded up, so that a client
 * that waits that long is never early (at least 1 for a refusal). */
static inline uint64_t agw_limit_seconds_up(uint64_t ms)
{
    return (ms + 999) / 1000;
}

#endif
