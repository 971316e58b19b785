/* waterfall.h: the last requests of each worker, drawn as a waterfall on the admin listener.
 *
 * Each worker owns one ring of its last AGW_WF_RING finished requests: the request (target,
 * status, start, duration, trace id) and each upstream attempt as an offset and a duration from
 * the request's start, with its section, upstream, status and retry/hedge/single-flight markers
 * (seed 000: parallel calls overlap on the time axis, accidental sequencing shows as a staircase).
 *
 * Cross-thread rule: the worker records with pthread_mutex_trylock and skips the request (counted
 * in `skipped`) when the admin thread holds the lock, so a worker never waits; the admin thread
 * locks each ring only long enough to copy it out (agw_waterfall_snapshot).
 *
 *   GET /waterfall        self-contained HTML (inline SVG and CSS, no script, no external asset)
 *   GET /waterfall.json   the same data as JSON
 *   ?trace=<32 hex>       only the request of that trace id;  ?limit=N  at most N requests (20)
 */
#ifndef AGW_WATERFALL_H
#define AGW_WATERFALL_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "base/buf.h"
#include "ops/trace.h"

struct agw_metric_labels;

#define AGW_WF_RING 32          /* requests kept per worker */
#define AGW_WF_CALLS 24         /* attempts kept per request; more are counted in calls_dropped */
#define AGW_WF_DEFAULT_LIMIT 20 /* requests shown when ?limit is not given */

/* One upstream attempt, relative to its request's start. */
typedef struct agw_wf_call {
    char section[AGW_SPAN_SECTION_MAX];
    uint16_t upstream;          /* upstream label slot (metrics.h) */
    uint16_t http_status;       /* 0: no answer */
    uint8_t outcome;            /* as agw_span_t.outcome */
    uint8_t flags;              /* AGW_SPAN_* */
    uint8_t attempt;
    uint8_t endpoint;       /* of an upstream group, 1-based; 0 for an upstream with one endpoint */
    uint32_t start_us, end_us;  /* µs after the request started */
    char detail[AGW_SPAN_DETAIL_MAX]; /* as agw_span_t.detail: why it failed, "" when it did not */
} agw_wf_call_t;

/* One finished request. */
typedef struct agw_wf_entry {
    uint64_t seq;               /* 0: the slot is empty */
    uint64_t start_us;          /* wall clock, µs since the Unix epoch */
    uint32_t duration_us;
    int status;
    int endpoint;               /* route label slot (metrics.h), 0 when no route matched */
    int worker;
    char trace_id[33];          /* lowercase hex, NUL-terminated */
    char target[AGW_TRACE_TARGET_MAX];
    agw_trace_limit_t limit;    /* the limits decision ("" rule: none) */
    uint8_t num_calls;
    uint16_t calls_dropped;
    agw_wf_call_t calls[AGW_WF_CALLS];
} agw_wf_entry_t;

typedef struct agw_waterfall {
    pthread_mutex_t lock;
    uint64_t next_seq;          /* under lock */
    uint64_t skipped;           /* requests not recorded because the admin thread was reading */
    agw_wf_entry_t ring[AGW_WF_RING];
} agw_waterfall_t;

/* A new, empty ring (aborts on allocation failure); free with agw_waterfall_free. */
agw_waterfall_t *agw_waterfall_new(void);

/* Frees a ring made by agw_waterfall_new (NULL is ignored); no thread may use it any more. */
void agw_waterfall_free(agw_waterfall_t *wf);

/* Records the finished trace tr in the worker's ring wf (worker thread; never waits: skipped when
 * the admin thread is reading). */
void agw_waterfall_record(agw_waterfall_t *wf, const agw_trace_t *tr);

/* Copies the newest requests of every ring in rings[0..n) into out (at most max, newest first),
 * only the one of trace_id when it is not NULL. Returns how many were copied. Admin thread. */
size_t agw_waterfall_snapshot(agw_waterfall_t *const *rings, size_t n, const char *trace_id, agw_wf_entry_t *out,
                              size_t max);

/* Renders entries[0..n) as JSON ({"requests":[…]}) into b; route and upstream names come from the
 * metric label registry (entries hold label slots, which keep their names across reloads). */
void agw_waterfall_json(agw_buf_t *b, const struct agw_metric_labels *names, const agw_wf_entry_t *entries,
                        size_t n);

/* Renders entries[0..n) as a self-contained HTML page with one inline SVG waterfall per request. */
void agw_waterfall_html(agw_buf_t *b, const struct agw_metric_labels *names, const agw_wf_entry_t *entries,
                        size_t n);

#endif
