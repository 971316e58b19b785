/* limit_seen.h: what the process knows of its Redis rules (issue 18, `store = "redis"`), for the
 * admin page `/limits` and the outage log: the count of a Redis rule is Redis's, so the process
 * keeps only what Redis last told it and whether Redis answers.
 *
 *   - the last answer per key: a fixed table of AGW_LIMIT_SEEN_SLOTS slots, direct-mapped by the
 *     key's hash (agw_limit_hash): the newest answer of a key replaces the older one, and a key
 *     whose slot another key took since is not found (the table keeps at most that many keys, the
 *     most recently answered of each slot). Each answer is Redis's verdict at that moment (what
 *     was left then, when it resets), not a count kept here: other gateways may have counted since.
 *   - the outage: Redis is down for the process while at least one worker's last check was not
 *     answered (down, slower than redis.timeout_ms, an answer that is not the script's). The
 *     outage starts with the first worker that fails and ends when the last failing worker is
 *     answered again, so that its start and its end are logged once per process, not per worker.
 *
 * Every function is thread-safe and lock-free (atomics; a slot is written under a sequence count
 * that readers check, and a writer that finds the slot being written skips its note).
 */
#ifndef AGW_LIMIT_SEEN_H
#define AGW_LIMIT_SEEN_H

#include <stdint.h>

#include "limits/limit.h"

/* Keys whose last answer is kept at most. */
#define AGW_LIMIT_SEEN_SLOTS 1024

/* Workers told apart by the outage state (gateway.lua allows 256; worker i counts as i % this). */
#define AGW_LIMIT_SEEN_WORKERS 256

typedef struct agw_limit_seen agw_limit_seen_t;

/* A zeroed state: no answer seen, no outage. Never NULL (out of memory aborts). */
agw_limit_seen_t *agw_limit_seen_new(void);

void agw_limit_seen_free(agw_limit_seen_t *s);

/* What Redis last answered for one key. */
typedef struct agw_limit_seen_answer {
    int allowed;                /* the request it answered was accepted */
    uint64_t remaining;         /* requests the rule accepted from then on */
    uint64_t reset_at_ms;       /* then + reset_ms (limit.h), ms since the epoch */
    uint64_t at_ms;             /* when the check was made (the time sent to Redis), ms since the epoch */
} agw_limit_seen_answer_t;

/* Keeps Redis's answer *a for the key of hash h (agw_limit_hash). */
void agw_limit_seen_note(agw_limit_seen_t *s, uint64_t h, const agw_limit_seen_answer_t *a);

/* The last answer kept for hash h: 1 with *out, 0 when none is kept (never answered, or its slot
 * was taken by another key since). */
int agw_limit_seen_get(const agw_limit_seen_t *s, uint64_t h, agw_limit_seen_answer_t *out);

/* The process's Redis outage as the limits checks see it. */
typedef struct agw_limit_outage {
    int down;                   /* a worker's last check was not answered */
    unsigned failing;           /* workers whose last check was not answered */
    uint64_t since_ms;          /* down: when the outage began, ms since the epoch */
    uint64_t fallbacks;         /* checks decided by on_redis_error during this outage (down), or
                                   during the one that just ended (agw_limit_seen_answered) */
    uint64_t fallbacks_total;   /* since the process started */
    uint64_t outages;           /* outages begun since the process started */
} agw_limit_outage_t;

/* Worker `worker`'s check at now_ms was not answered; fallback: it was decided by its rules'
 * on_redis_error (0: the request had stopped waiting, nothing was decided). Returns 1 when this
 * begins the process's outage (the caller logs it: once per outage and process), else 0. */
int agw_limit_seen_failed(agw_limit_seen_t *s, unsigned worker, uint64_t now_ms, int fallback);

/* Worker `worker`'s check was answered. Returns 1 when this ends the process's outage (the last
 * failing worker answered), with the outage in *ended (the caller logs it), else 0. */
int agw_limit_seen_answered(agw_limit_seen_t *s, unsigned worker, agw_limit_outage_t *ended);

/* The outage state now (the admin page). */
void agw_limit_seen_outage(const agw_limit_seen_t *s, agw_limit_outage_t *out);

#endif
