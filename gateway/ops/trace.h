/* trace.h: W3C Trace Context (traceparent, tracestate) and the spans of one request.
 *
 * Every request has a trace: the incoming traceparent's trace-id when the header is valid, a new
 * random one otherwise. The gateway's own span (kind SERVER) is a child of the incoming parent-id;
 * every upstream attempt gets a span of its own (kind CLIENT) whose id is sent to the upstream in
 * the attempt's traceparent, so each call is a child of the gateway's span (DESIGN §2.4, seed 000
 * "trace the fan-out"). A request's spans live in one agw_trace_t, written by its worker only; once
 * the request ends the record is handed whole to the exporter (otlp.h) and summarised into the
 * waterfall ring (waterfall.h).
 *
 * Rules from W3C Trace Context Level 1 (https://www.w3.org/TR/trace-context/), cited by section.
 */
#ifndef AGW_TRACE_H
#define AGW_TRACE_H

#include <stddef.h>
#include <stdint.h>

#define AGW_TRACEPARENT_LEN 55       /* "00-" 32 hex "-" 16 hex "-" 2 hex (§3.2) */
#define AGW_TRACESTATE_MAX_MEMBERS 32 /* §3.3.1.1 */
#define AGW_TRACESTATE_MAX_LEN 8192  /* longer tracestate values are dropped, not propagated */
#define AGW_TRACE_FLAG_SAMPLED 0x01  /* §3.2.2.5.1 */

#define AGW_TRACE_MAX_SPANS 48       /* upstream spans kept per request; more are counted, not kept */
#define AGW_TRACE_INLINE_SPANS 4     /* spans held in the record itself; a request making more attempts
                                        moves them to an array on the heap, grown up to the maximum */
#define AGW_SPAN_SECTION_MAX 40      /* section names are cut to this many bytes (NUL included) */
#define AGW_TRACE_TARGET_MAX 128     /* request method + path kept for the span name and the waterfall */
#define AGW_SPAN_DETAIL_MAX 128      /* a failed attempt's cause is cut to this many bytes (NUL included) */

/* A parsed traceparent header (§3.2). */
typedef struct agw_traceparent {
    uint8_t trace_id[16];            /* never all zero */
    uint8_t parent_id[8];            /* never all zero */
    uint8_t flags;                   /* trace-flags as received */
} agw_traceparent_t;

/* Span flags (what kind of attempt the span is). */
enum {
    AGW_SPAN_RETRY = 1,              /* a retry: not the exchange's first attempt */
    AGW_SPAN_HEDGE = 2,              /* a hedge: the second copy of a slow attempt */
    AGW_SPAN_SF_LEADER = 4,          /* a single-flight call other identical calls may share */
    AGW_SPAN_SF_JOINED = 8,          /* no call of its own: waited on another request's call */
    AGW_SPAN_OPEN = 16,              /* not ended yet */
    AGW_SPAN_CACHE_HIT = 32,         /* no call: the section was a fresh cache entry (lua/agg/cache.lua) */
    AGW_SPAN_CACHE_STALE = 64,       /* no call: a stale cache entry was served (within swr_s, or
                                        because the call failed within stale_if_error_s) */
};

/* Outcome of a span beyond the transport's (agw_call_outcome_t values come first). */
#define AGW_SPAN_CANCELLED 100       /* the gateway stopped waiting (deadline, hedge won, client gone) */

/* One upstream attempt (or a shared single-flight wait) of a request. */
typedef struct agw_span {
    uint8_t span_id[8];
    uint8_t link_trace_id[16];       /* SF_JOINED: the trace and span of the call waited on */
    uint8_t link_span_id[8];
    uint64_t start_us, end_us;       /* wall clock, microseconds since the Unix epoch */
    uint16_t upstream;               /* upstream label slot (metrics.h): its name outlives reloads */
    uint16_t http_status;            /* 0 when no answer */
    uint8_t outcome;                 /* agw_call_outcome_t, or AGW_SPAN_CANCELLED */
    uint8_t flags;                   /* AGW_SPAN_* */
    uint8_t attempt;                 /* 1 for the first attempt of an exchange, 2 for the next, … */
    uint8_t endpoint;                /* the endpoint of an upstream group it went to (1-based, as
                                        gateway.lua lists them; the admin /upstreams page names it);
                                        0 for an upstream with one endpoint */
    char section[AGW_SPAN_SECTION_MAX]; /* the page section the call serves (NUL-terminated) */
    char *detail;                    /* why the attempt failed, as the upstream client said it (its URL,
                                        address, errno text, TLS reason; cut to AGW_SPAN_DETAIL_MAX - 1
                                        bytes); NULL when it did not fail. Owned by the record: made when
                                        the span ends with one, freed when the record is begun again,
                                        disposed of or freed (a span's room stays small for the pages in
                                        flight, docs/performance.md "A seventeenth pass"). Internal: the
                                        span, the waterfall and the log, never a client */
} agw_span_t;

/* The limits decision of a request (worker/limits.c), shown in the waterfall and the access log. */
typedef struct agw_trace_limit {
    char rule[AGW_SPAN_SECTION_MAX]; /* the decisive rule's name (cut); "" when no rule was checked */
    uint64_t remaining;              /* requests that rule accepts from now on (0 when refused) */
    uint32_t wait_us;                /* time the request waited for Redis (0: it did not) */
    uint8_t allowed;                 /* 1: accepted; 0: refused (429, or 503 by on_redis_error) */
    uint8_t store;                   /* AGW_TRACE_LIMIT_LOCAL, _REDIS, _FALLBACK or _SHADOW */
} agw_trace_limit_t;

#define AGW_TRACE_LIMIT_LOCAL 0      /* only rules of the process's store */
#define AGW_TRACE_LIMIT_REDIS 1      /* Redis answered for the Redis rules */
#define AGW_TRACE_LIMIT_FALLBACK 2   /* Redis did not: the rules' on_redis_error decided */
#define AGW_TRACE_LIMIT_SHADOW 3     /* before the edge, a Redis rule's shadow in the process's store:
                                        the refusals this process charged it (worker_internal.h,
                                        agw_worker_gate_before_edge) */

/* "local", "redis" or "fallback" for an agw_trace_limit_t store. */
const char *agw_trace_limit_store_name(uint8_t store);

/* The trace of one request: the gateway's span and its children. A record comes from agw_trace_new
 * (or agw_trace_init for one on the stack) and goes with agw_trace_free (agw_trace_dispose): its
 * spans are held inline up to AGW_TRACE_INLINE_SPANS (a page's three calls cost 1.2 KB of record,
 * not the 11 KB that room for AGW_TRACE_MAX_SPANS inline took: one record per page in flight,
 * docs/performance.md), then in a heap array the record owns. */
typedef struct agw_trace {
    struct agw_trace *next;          /* free list of the worker that owns it */
    uint8_t trace_id[16];
    uint8_t span_id[8];              /* the gateway's span */
    uint8_t parent_id[8];            /* the incoming parent-id; all zero for a trace started here */
    uint8_t flags;                   /* trace-flags propagated (only the sampled bit, §3.2.2.5) */
    uint8_t has_parent;
    int status;                      /* HTTP status of the response (499: the client left) */
    int endpoint;                    /* route label slot (metrics.h), 0 when no route matched */
    int worker;                      /* worker id */
    uint64_t start_us, end_us;       /* wall clock, µs since the Unix epoch */
    char target[AGW_TRACE_TARGET_MAX]; /* "GET /product-page/42" (cut, NUL-terminated) */
    char traceparent[AGW_TRACEPARENT_LEN]; /* "00-<trace_id>-<span_id>-<flags>" of the gateway's span:
                                           a call's header is this with its own span id */
    agw_trace_limit_t limit;         /* the limits decision (agw_trace_begin clears it) */
    size_t num_spans;
    uint32_t spans_dropped;          /* spans beyond AGW_TRACE_MAX_SPANS */
    uint32_t spans_cap;              /* room in spans */
    agw_span_t *spans;               /* inline_spans, or a heap array of spans_cap (kept when the record
                                        is reused) */
    agw_span_t inline_spans[AGW_TRACE_INLINE_SPANS];
} agw_trace_t;

/* A new record, ready for agw_trace_begin, its spans inline (never NULL: base/mem.h). */
agw_trace_t *agw_trace_new(void);

/* Readies a record not from agw_trace_new (one on the stack) for agw_trace_begin. */
void agw_trace_init(agw_trace_t *tr);

/* Frees what a record owns besides itself (its heap span array; the record is then as after
 * agw_trace_init). For a record of agw_trace_init. */
void agw_trace_dispose(agw_trace_t *tr);

/* Frees a record of agw_trace_new and its span array (NULL: nothing). Any thread. */
void agw_trace_free(agw_trace_t *tr);

/* Parses a traceparent value (s, len bytes, no surrounding whitespace expected: OWS is trimmed).
 * Version 00 must be exactly 55 characters; a higher version is parsed by its first 55 characters,
 * which must be followed by '-' or the end (§4.3 "versioning of traceparent"); version ff, ids that
 * are all zero, uppercase or non-hex digits, and wrong lengths or separators are invalid (§3.2.2).
 * Returns 0 and fills *out, or -1 when the value is invalid (the caller starts a new trace). */
int agw_traceparent_parse(const char *s, size_t len, agw_traceparent_t *out);

/* Writes the version 00 traceparent "00-<trace_id>-<span_id>-<flags>" into out (exactly
 * AGW_TRACEPARENT_LEN bytes, no NUL) (§3.2: a vendor sends the version it knows). */
void agw_traceparent_format(char *out, const uint8_t trace_id[16], const uint8_t span_id[8], uint8_t flags);

/* Checks a tracestate value (§3.3): at most 32 list-members separated by ',' with optional spaces
 * and tabs around them, empty members allowed; each key a simple-key or tenant@system key of the
 * §3.3.1.3.1 grammar, each value 1-256 printable characters without ',' or '=' and not ending in a
 * space; no key twice; at most AGW_TRACESTATE_MAX_LEN bytes. Returns 1 when valid, 0 when not (the
 * caller drops the header rather than propagate a broken one). */
int agw_tracestate_valid(const char *s, size_t len);

/* Writes n bytes of id as 2n lowercase hex digits into out (no NUL). */
void agw_trace_hex(char *out, const uint8_t *id, size_t n);

/* Fills id with n random bytes from the xorshift state *rng (advanced), never all zero (§3.2.2.3:
 * an all-zero trace-id or parent-id is invalid). Not for secrets: ids must be unique, not secret. */
void agw_trace_random_id(uint64_t *rng, uint8_t *id, size_t n);

/* Starts trace tr (from agw_trace_new or agw_trace_init, new or reused) for a request: with the parsed incoming parent (NULL
 * when there is none or it was invalid: a new trace-id, sampled), a new span id, the start time
 * now_us, and target (method and path, cut to fit). */
void agw_trace_begin(agw_trace_t *tr, uint64_t *rng, const agw_traceparent_t *parent, uint64_t now_us,
                     const char *method, size_t mlen, const char *path, size_t plen);

/* Writes the traceparent for span i of tr (the gateway's span when i < 0) into out (exactly
 * AGW_TRACEPARENT_LEN bytes, no NUL): version 00, tr's trace-id and flags (§3.2). */
void agw_trace_traceparent(const agw_trace_t *tr, int i, char *out);

/* Adds an open span for an attempt to upstream up serving section (cut to fit) with flags and the
 * attempt number; its id is random. Returns the span's index, or -1 when the trace already holds
 * AGW_TRACE_MAX_SPANS spans (counted in spans_dropped). The spans may move (past the inline ones):
 * a pointer to a span is good until the next agw_trace_add_span; its index stays. */
int agw_trace_add_span(agw_trace_t *tr, uint64_t *rng, unsigned up, const char *section, size_t slen, unsigned flags,
                       unsigned attempt, uint64_t now_us);

/* Ends span i of tr at now_us with the transport outcome, HTTP status and detail (the failure's
 * cause, NULL when none; copied, cut to fit) (ignored when the span already ended or i is out of
 * range). */
void agw_trace_end_span(agw_trace_t *tr, int i, unsigned outcome, int http_status, const char *detail,
                        uint64_t now_us);

/* Ends the request's trace at now_us with status: spans still open end now as cancelled (the
 * gateway stops waiting for them when the response goes). */
void agw_trace_finish(agw_trace_t *tr, int status, uint64_t now_us);

/* Name of a span outcome ("ok", "timeout", …, "cancelled"). */
const char *agw_span_outcome_name(unsigned outcome);

#endif
