/* breaker.h: a circuit breaker per upstream, shared by every worker (DESIGN §3; issue
 * "resilience"; Nygard, "Release It!").
 *
 *   closed    calls pass; `failures` consecutive upstream failures open it
 *   open      calls fail at once for open_ms; then the next call finds it half-open
 *   half-open at most `probes` calls pass at a time (the others fail at once); a probe that
 *             succeeds closes it, one that fails opens it again for open_ms
 *
 * Only failures of the upstream count (refused, timeouts at the call's own timeout, resets,
 * invalid answers, 5xx); calls the gateway gave up on (deadline of the page, hedge lost, client
 * gone) are reported as AGW_BREAKER_IGNORE. Time is passed in by the caller (ms), so the spec
 * harness drives a breaker with its virtual clock. Thread-safe (one mutex per breaker; a breaker
 * is touched twice per call, never on a hot loop).
 *
 * The quiet word: `quiet` is 1 while the breaker is off (failures == 0) or closed with no failure
 * counted, 0 otherwise, written with an atomic store under the lock whenever state or consecutive
 * change. While it is 1, allow answers ALLOW and a report that is not a failure and not a probe's
 * changes nothing, so a caller that reads the word first may skip both calls. The runtime reads it
 * through LuaJIT's FFI (agg.breaker's quiet_word: the address of the word), so a call to a healthy
 * upstream crosses from Lua into C for neither (about 4,000 instructions a bench page of three
 * calls, docs/performance.md "An eleventh pass"). The word says no more than the lock-free loads
 * allow and report make themselves: a worker may read 1 while another, under the lock, is counting
 * a failure, as it may read the closed state there.
 */
#ifndef AGW_BREAKER_H
#define AGW_BREAKER_H

#include <lua.h>
#include <pthread.h>
#include <stdint.h>

typedef enum { AGW_BREAKER_CLOSED, AGW_BREAKER_OPEN, AGW_BREAKER_HALF_OPEN } agw_breaker_state_t;
typedef enum { AGW_BREAKER_DENY, AGW_BREAKER_ALLOW, AGW_BREAKER_PROBE } agw_breaker_decision_t;
typedef enum { AGW_BREAKER_SUCCESS, AGW_BREAKER_FAILURE, AGW_BREAKER_IGNORE } agw_breaker_result_t;

typedef struct agw_breaker {
    pthread_mutex_t lock;
    unsigned failures;           /* consecutive failures that open it (0: the breaker is off) */
    uint64_t open_ms;            /* how long it stays open, ms */
    unsigned probes;             /* calls let through at once when half-open */
    agw_breaker_state_t state;
    unsigned consecutive;        /* consecutive failures while closed */
    unsigned probes_out;         /* probes in flight while half-open */
    int quiet;                   /* 1: off, or closed with no failure counted (atomic; see above) */
    uint64_t opened_at_ms;       /* when it last opened */
    uint64_t opened, closed;     /* transitions, for metrics */
    uint64_t denied;             /* calls failed at once */
    int refs;                    /* owners (generations that use it; atomic), see agw_breaker_new */
} agw_breaker_t;

/* Sets up a closed breaker. failures == 0 makes a breaker that always allows. */
void agw_breaker_init(agw_breaker_t *b, unsigned failures, uint64_t open_ms, unsigned probes);

/* Releases what agw_breaker_init set up (not b itself). */
void agw_breaker_destroy(agw_breaker_t *b);

/* A closed breaker on the heap with one reference (thread-safe counting: a breaker outlives a
 * reload when its upstream did not change, so two generations may hold it). Aborts on allocation
 * failure. */
agw_breaker_t *agw_breaker_new(unsigned failures, uint64_t open_ms, unsigned probes);
/* Takes one more reference to b; returns b. */
agw_breaker_t *agw_breaker_ref(agw_breaker_t *b);
/* Drops a reference; the last one destroys and frees b. NULL is ignored. */
void agw_breaker_unref(agw_breaker_t *b);

/* Decides whether a call may go to the upstream at now_ms. On DENY, *retry_after_ms (if not NULL)
 * is the time until the breaker half-opens (for Retry-After). A PROBE must be reported with
 * probe = 1. */
agw_breaker_decision_t agw_breaker_allow(agw_breaker_t *b, uint64_t now_ms, uint64_t *retry_after_ms);

/* Reports how an allowed call ended. Returns the new state when this report changed it, else -1
 * (the caller logs transitions). */
int agw_breaker_report(agw_breaker_t *b, agw_breaker_result_t r, int probe, uint64_t now_ms);

/* Name of a state: "closed", "open", "half-open". */
const char *agw_breaker_state_name(agw_breaker_state_t s);

/* Pushes a Lua handle for b (not owned: b must outlive the Lua state) with methods
 *   h:allow(now_ms) -> "allow" | "probe" | "deny", retry_after_ms
 *   h:report("success" | "failure" | "ignore", probe, now_ms) -> new state name | nil
 *   h:state() -> state name, consecutive failures */
void agw_breaker_push(lua_State *L, agw_breaker_t *b);

/* Opens the "agg.breaker" module: new(failures, open_ms, probes) -> a handle that owns its breaker
 * (the spec harness makes its breakers this way), with the methods above; quiet_word(handle) -> a
 * light userdata, the address of the breaker's quiet word (an int, see above), valid while the
 * handle lives (the caller keeps the handle). */
int agw_breaker_open(lua_State *L);

#endif
