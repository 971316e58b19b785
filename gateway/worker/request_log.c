/* request_log.c: what a request leaves behind: problem details built in C, its trace (trace.h),
 * its metrics and its line in the JSON access log.
 */
#include "worker/worker_internal.h"
#include "worker/contract.h"

#include "base/http_status.h"

#include "base/mem.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "json/json.h"
#include "ops/otlp.h"
#include "ops/waterfall.h"

/* ---- tracing (trace.h): the request's span, one per upstream attempt ------------------------ */

void agw_worker_trace_begin(agw_worker_t *w, reqref_t *rr, h2o_req_t *req, size_t path_len)
{
    const h2o_iovec_t *tp = NULL, *ts = NULL;
    int num_tp = 0, num_ts = 0;
    for (size_t i = 0; i < req->headers.size; i++) {
        const h2o_header_t *h = &req->headers.entries[i];
        if (h->name->len == 11 && h2o_lcstris(h->name->base, 11, H2O_STRLIT("traceparent")))
            tp = &h->value, num_tp++;
        else if (h->name->len == 10 && h2o_lcstris(h->name->base, 10, H2O_STRLIT("tracestate")))
            ts = ts ? ts : &h->value, num_ts++;
    }
    rr->tracestate = NULL;
    rr->tracestate_len = 0;
    agw_trace_t *tr = w->log.free_traces;
    if (tr)
        w->log.free_traces = tr->next;
    else
        tr = agw_trace_new();
    agw_traceparent_t parent;
    int continued = num_tp == 1 && agw_traceparent_parse(tp->base, tp->len, &parent) == 0;
    agw_trace_begin(tr, &w->log.trace_rng, continued ? &parent : NULL, agw_worker_now_us(w), req->method.base,
                    req->method.len, req->path.base, path_len);
    tr->endpoint = (int)rr->g->gen->route_slot[rr->endpoint]; /* names that outlive the generation */
    tr->worker = w->id;
    rr->trace = tr;
    if (!continued || num_ts == 0) /* §3.3: tracestate goes with the traceparent it came with */
        return;
    const char *v = ts->base;
    size_t vlen = ts->len;
    if (num_ts > 1) { /* RFC 9110 §5.3: several field lines are one comma-separated list */
        size_t total = 0;
        for (size_t i = 0; i < req->headers.size; i++)
            if (req->headers.entries[i].name->len == 10 &&
                h2o_lcstris(req->headers.entries[i].name->base, 10, H2O_STRLIT("tracestate")))
                total += req->headers.entries[i].value.len + 1;
        if (total > AGW_TRACESTATE_MAX_LEN + 1)
            return;
        char *joined = h2o_mem_alloc_pool(&req->pool, total);
        vlen = 0;
        for (size_t i = 0; i < req->headers.size; i++) {
            const h2o_header_t *h = &req->headers.entries[i];
            if (h->name->len == 10 && h2o_lcstris(h->name->base, 10, H2O_STRLIT("tracestate"))) {
                if (vlen)
                    joined[vlen++] = ',';
                memcpy(joined + vlen, h->value.base, h->value.len);
                vlen += h->value.len;
            }
        }
        v = joined;
    }
    while (vlen && (v[0] == ' ' || v[0] == '\t')) /* OWS around a field value is not part of it */
        v++, vlen--;
    while (vlen && (v[vlen - 1] == ' ' || v[vlen - 1] == '\t'))
        vlen--;
    if (agw_tracestate_valid(v, vlen)) {
        rr->tracestate = v;
        rr->tracestate_len = vlen;
    }
}

/* Request rr ended with status: its trace goes into the waterfall ring (when an admin listener
 * can show it) and, when a collector is configured and the trace is sampled, to the exporter;
 * otherwise it is kept for reuse. Unsampled traces (an incoming traceparent with the sampled flag
 * off) are not exported. */
static void trace_request_ended(agw_worker_t *w, reqref_t *rr, int status)
{
    agw_trace_t *tr = rr->trace;
    rr->trace = NULL;
    agw_trace_finish(tr, status, agw_worker_now_us(w));
    if (w->log.waterfall_on)
        agw_waterfall_record(w->m->waterfall, tr);
    if (w->m->trace_queue && (tr->flags & AGW_TRACE_FLAG_SAMPLED) && agw_otlp_submit(w->m->trace_queue, tr) == 0)
        return;
    tr->next = w->log.free_traces;
    w->log.free_traces = tr;
}

/* ---- metrics and the access log ------------------------------------------------------------ */

#define ALOG_FLUSH_BYTES (64 * 1024)

void agw_worker_alog_flush(agw_worker_t *w)
{
    size_t off = 0;
    while (off < w->log.alog.len) {
        ssize_t n = write(w->log.access_fd, w->log.alog.base + off, w->log.alog.len - off);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            break; /* the disk is full or the pipe closed: drop these lines rather than wait */
        off += (size_t)n;
    }
    agw_buf_reset(&w->log.alog);
    ev_timer_stop(w->loop, &w->log.alog_timer);
}

void agw_worker_log_init(agw_worker_log_t *l, int access_fd, int waterfall_on, void *data)
{
    l->waterfall_on = waterfall_on;
    l->access_fd = access_fd;
    l->alog_sec = -1;
    ev_timer_init(&l->alog_timer, agw_worker_on_alog_timer, 0.1, 0.);
    l->alog_timer.data = data;
}

void agw_worker_log_close(agw_worker_t *w)
{
    if (w->log.access_fd >= 0)
        agw_worker_alog_flush(w);
    agw_worker_log_release_spares(w);
}

void agw_worker_log_release_spares(agw_worker_t *w)
{
    while (w->log.free_traces) {
        agw_trace_t *tr = w->log.free_traces;
        w->log.free_traces = tr->next;
        agw_trace_free(tr);
    }
}

void agw_worker_on_alog_timer(struct ev_loop *loop, ev_timer *t, int revents)
{
    (void)loop, (void)revents;
    agw_worker_alog_flush(t->data);
}

/* Replaces each DEL byte appended to b since mark (inside a JSON string the encoder wrote: it
 * never writes DEL but for a DEL of the text) by \u007f. JSON allows a raw DEL; a log line has
 * every control character escaped (log.h). */
static void escape_del(agw_buf_t *b, size_t mark)
{
    size_t dels = 0;
    for (size_t i = mark; i < b->len; i++)
        dels += b->base[i] == 0x7f;
    if (dels == 0)
        return;
    size_t old_len = b->len;
    agw_buf_reserve(b, dels * 5 + 1);
    size_t o = old_len + dels * 5; /* from the end, so each byte moves once */
    b->len = o;
    b->base[o] = '\0';
    for (size_t i = old_len; i-- > mark;) {
        if (b->base[i] == 0x7f) {
            o -= 6;
            memcpy(b->base + o, "\\u007f", 6);
        } else {
            b->base[--o] = b->base[i];
        }
    }
}

/* Appends s as a JSON string: plain printable ASCII is copied as is; anything else goes through the
 * JSON encoder, and bytes that are not UTF-8 are written as \u00XX. No control character (DEL
 * included) is written raw. */
static void alog_str(agw_buf_t *b, const char *s, size_t len)
{
    size_t i = 0;
    while (i < len) {
        unsigned char c = (unsigned char)s[i];
        if (c < 0x20 || c >= 0x7f || c == '"' || c == '\\')
            break;
        i++;
    }
    if (i == len) {
        agw_buf_reserve(b, len + 2);
        b->base[b->len++] = '"';
        memcpy(b->base + b->len, s, len);
        b->len += len;
        b->base[b->len++] = '"';
        b->base[b->len] = '\0';
        return;
    }
    size_t mark = b->len;
    if (agw_json_encode_string(b, s, len) == 0) {
        escape_del(b, mark);
        return;
    }
    b->len = mark;
    agw_buf_putc(b, '"');
    for (i = 0; i < len; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"' || c == '\\') {
            agw_buf_putc(b, '\\');
            agw_buf_putc(b, (char)c);
        } else if (c < 0x20 || c >= 0x7f) {
            agw_buf_printf(b, "\\u%04x", c);
        } else {
            agw_buf_putc(b, (char)c);
        }
    }
    agw_buf_putc(b, '"');
}

static void alog_lit(agw_buf_t *b, const char *s, size_t len)
{
    agw_buf_append(b, s, len);
}
/* s must be a string literal (sizeof): not an expression that chooses between two */
#define ALOG_LIT(b, s) alog_lit((b), (s), sizeof(s) - 1)

/* Appends an unsigned integer in decimal (no printf on the per-request path). */
static void alog_uint(agw_buf_t *b, uint64_t v)
{
    char tmp[24];
    size_t n = sizeof(tmp);
    do {
        tmp[--n] = (char)('0' + v % 10);
        v /= 10;
    } while (v);
    alog_lit(b, tmp + n, sizeof(tmp) - n);
}

/* Appends ms >= 0 with one decimal ("81.8"). */
static void alog_ms(agw_buf_t *b, double ms)
{
    uint64_t tenths = ms > 0 ? (uint64_t)(ms * 10.0 + 0.5) : 0;
    alog_uint(b, tenths / 10);
    char frac[2] = {'.', (char)('0' + tenths % 10)};
    alog_lit(b, frac, 2);
}

/* One entry of a Server-Timing value ("a;dur=1.5, b;dur=2.0;desc=\"hit\""): its name, the digits
 * of its duration (dur NULL when it has no ";dur=") and its description without the quotes (the
 * cache outcome, lua/agg/cache.lua; desc NULL when it has none). */
typedef struct {
    const char *name, *dur, *desc;
    size_t nlen, dlen, desclen;
} timing_entry_t;

/* Reads the entry at *p (before end) into e and moves *p past it and the ", " after it.
 * Returns 0 when there is no entry left. */
static int timing_next(const char **p, const char *end, timing_entry_t *e)
{
    const char *s = *p;
    const char *semi = s < end ? memchr(s, ';', (size_t)(end - s)) : NULL;
    if (semi == NULL)
        return 0;
    const char *next = memchr(semi, ',', (size_t)(end - semi));
    const char *vend = next ? next : end;
    e->name = s;
    e->nlen = (size_t)(semi - s);
    e->dur = e->desc = NULL;
    e->dlen = e->desclen = 0;
    for (const char *q = semi; q && q < vend;) { /* ";param=value" … up to vend */
        const char *pend = memchr(q + 1, ';', (size_t)(vend - q - 1));
        if (!pend)
            pend = vend;
        if (pend - q > 5 && memcmp(q, ";dur=", 5) == 0) {
            e->dur = q + 5;
            e->dlen = (size_t)(pend - e->dur);
        } else if (pend - q > 8 && memcmp(q, ";desc=\"", 7) == 0 && pend[-1] == '"') {
            e->desc = q + 7;
            e->desclen = (size_t)(pend - 1 - e->desc);
        }
        q = pend;
    }
    s = next ? next + 1 : end;
    while (s < end && *s == ' ')
        s++;
    *p = s;
    return 1;
}

/* Finds section name's entry in a Server-Timing value, whose names are the section names with
 * characters other than [A-Za-z0-9_-] replaced by '_', and whose durations are JSON numbers
 * already. Returns the digits of the last entry for name (*len set), or NULL; *desc (desclen) is
 * that entry's description (a cache outcome: letters only), or NULL. */
static const char *timing_ms(const char *t, size_t tlen, const char *name, size_t nlen, size_t *len,
                             const char **desc, size_t *desclen)
{
    const char *found = NULL, *p = t;
    *desc = NULL;
    timing_entry_t e;
    while (timing_next(&p, t + tlen, &e)) {
        int same = e.nlen == nlen;
        for (size_t i = 0; same && i < nlen; i++) {
            unsigned char c = (unsigned char)name[i];
            char want = (isalnum(c) || c == '_' || c == '-') && c < 0x80 ? (char)c : '_';
            same = e.name[i] == want;
        }
        if (same && e.dur) {
            found = e.dur;
            *len = e.dlen;
            *desc = e.desc;
            *desclen = e.desclen;
        }
    }
    return found;
}

static int section_less(const section_ref_t *x, const section_ref_t *y)
{
    size_t n = x->len < y->len ? x->len : y->len;
    int c = memcmp(x->name, y->name, n);
    return c ? c < 0 : x->len < y->len;
}

size_t agw_worker_page_sections(lua_State *L, int idx, section_ref_t *out, size_t max)
{
    size_t n = 0;
    lua_pushnil(L);
    while (lua_next(L, idx) != 0) {
        if (n < max && lua_type(L, -2) == LUA_TSTRING && lua_istable(L, -1)) {
            lua_pushliteral(L, "status");
            lua_rawget(L, -2);
            if (lua_type(L, -1) == LUA_TSTRING) {
                section_ref_t s;
                s.name = lua_tolstring(L, -3, &s.len);
                s.status = lua_tostring(L, -1); /* interned, and held by the section table */
                size_t j = n++;                 /* insertion sort: a page has a handful of sections */
                while (j > 0 && section_less(&s, &out[j - 1])) {
                    out[j] = out[j - 1];
                    j--;
                }
                out[j] = s;
            }
            lua_pop(L, 1);
        }
        lua_pop(L, 1);
    }
    return n;
}

size_t agw_worker_row_sections(lua_State *L, int idx, section_ref_t *out, size_t max)
{
    const int width = 1 + AGW_SECTION_FIELDS;
    size_t n = 0;
    for (int i = 0; n < max; i++) {
        lua_rawgeti(L, idx, i * width + 1);
        if (lua_isnil(L, -1)) {
            lua_pop(L, 1);
            break;
        }
        lua_rawgeti(L, idx, i * width + 2 + AGW_SECTION_STATUS);
        if (lua_type(L, -2) == LUA_TSTRING && lua_type(L, -1) == LUA_TSTRING) {
            section_ref_t s;
            s.name = lua_tolstring(L, -2, &s.len);
            s.status = lua_tostring(L, -1); /* interned, and held by the rows */
            size_t j = n++;                 /* rows come sorted: the insertion sort only checks */
            while (j > 0 && section_less(&s, &out[j - 1])) {
                out[j] = out[j - 1];
                j--;
            }
            out[j] = s;
        }
        lua_pop(L, 2);
    }
    return n;
}

/* One JSON line per request: time, method, path, route, status, duration_ms, bytes, sections
 * (name, status, ms), trace_id (16 bytes, or NULL: null). secs: the page's sections (NULL when the response is not a page:
 * the sections are then the Server-Timing entries, without a status). */
/* At most this many bytes of a request's path (with its query) and method go into its access-log
 * line: a client sends a long path once into HTTP/2's header table and then names it in 4 bytes a
 * request, and each line grew by the whole path (about 300 bytes of log for a byte sent: an attack
 * review filled 80 MB from 260 KB). */
#define ALOG_PATH_MAX 1024
#define ALOG_METHOD_MAX 32

/* s (len bytes) as a JSON string of at most max bytes of it: a longer one is cut (at a UTF-8
 * character's start, so that what is kept is written as it was) and ends with "…+N" (N: the
 * bytes left out). */
static void alog_str_cut(agw_buf_t *b, const char *s, size_t len, size_t max)
{
    if (len <= max) {
        alog_str(b, s, len);
        return;
    }
    size_t cut = max;
    while (cut > 0 && ((unsigned char)s[cut] & 0xC0) == 0x80)
        cut--;
    alog_str(b, s, cut);
    b->len--; /* (the closing quote) */
    char tail[40];
    int n = snprintf(tail, sizeof(tail), "\u2026+%zu\"", len - cut);
    alog_lit(b, tail, (size_t)n);
}

static void alog_write(agw_worker_t *w, const char *method, size_t mlen, const char *path, size_t plen,
                       const char *route, int status, double ms, size_t bytes, const section_ref_t *secs, size_t nsecs,
                       const char *timing, size_t tlen, const uint8_t *trace_id, const agw_trace_limit_t *limit)
{
    agw_buf_t *b = &w->log.alog;
    double now = ev_now(w->loop); /* libev's loop time is the wall clock */
    time_t sec = (time_t)now;
    if (sec != w->log.alog_sec) {
        struct tm tm;
        gmtime_r(&sec, &tm);
        snprintf(w->log.alog_stamp, sizeof(w->log.alog_stamp), "{\"time\":\"%04d-%02d-%02dT%02d:%02d:%02d.", tm.tm_year + 1900,
                 tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec);
        w->log.alog_sec = sec;
    }
    int was_empty = b->len == 0;
    agw_buf_puts(b, w->log.alog_stamp);
    int msec = (int)((now - (double)sec) * 1000.0);
    if (msec < 0 || msec > 999)
        msec = msec < 0 ? 0 : 999;
    char frac[3] = {(char)('0' + msec / 100), (char)('0' + msec / 10 % 10), (char)('0' + msec % 10)};
    alog_lit(b, frac, 3);
    ALOG_LIT(b, "Z\",\"method\":");
    alog_str_cut(b, method, mlen, ALOG_METHOD_MAX);
    ALOG_LIT(b, ",\"path\":");
    alog_str_cut(b, path, plen, ALOG_PATH_MAX);
    ALOG_LIT(b, ",\"route\":");
    if (route) {
        alog_str(b, route, strlen(route));
    } else {
        ALOG_LIT(b, "null");
    }
    ALOG_LIT(b, ",\"status\":");
    alog_uint(b, status > 0 ? (uint64_t)status : 0);
    ALOG_LIT(b, ",\"duration_ms\":");
    alog_ms(b, ms);
    ALOG_LIT(b, ",\"bytes\":");
    alog_uint(b, bytes);
    ALOG_LIT(b, ",\"sections\":[");
    if (secs) {
        for (size_t i = 0; i < nsecs; i++) {
            if (i)
                agw_buf_putc(b, ',');
            ALOG_LIT(b, "{\"name\":");
            alog_str(b, secs[i].name, secs[i].len);
            ALOG_LIT(b, ",\"status\":");
            alog_str(b, secs[i].status, strlen(secs[i].status));
            size_t dl = 0, cl = 0;
            const char *c = NULL;
            const char *d = timing ? timing_ms(timing, tlen, secs[i].name, secs[i].len, &dl, &c, &cl) : NULL;
            ALOG_LIT(b, ",\"ms\":");
            if (d)
                alog_lit(b, d, dl);
            else
                ALOG_LIT(b, "null");
            if (c) { /* the section's cache outcome (hit, miss, stale, refresh) */
                ALOG_LIT(b, ",\"cache\":");
                alog_str(b, c, cl);
            }
            agw_buf_putc(b, '}');
        }
    } else if (timing) {
        /* "name;dur=1.5, …": the names are already safe ([A-Za-z0-9_-]) */
        const char *p = timing;
        timing_entry_t e;
        for (int first = 1; timing_next(&p, timing + tlen, &e); first = 0) {
            if (!first)
                agw_buf_putc(b, ',');
            ALOG_LIT(b, "{\"name\":");
            alog_str(b, e.name, e.nlen);
            ALOG_LIT(b, ",\"status\":null,\"ms\":");
            if (e.dur)
                alog_lit(b, e.dur, e.dlen);
            else
                ALOG_LIT(b, "null");
            agw_buf_putc(b, '}');
        }
    }
    agw_buf_putc(b, ']');
    if (limit && limit->rule[0]) { /* the limits decision (worker/limits.c) */
        ALOG_LIT(b, ",\"limit\":{\"rule\":");
        alog_str(b, limit->rule, strlen(limit->rule));
        ALOG_LIT(b, ",\"outcome\":");
        if (limit->allowed)
            ALOG_LIT(b, "\"allowed\"");
        else
            ALOG_LIT(b, "\"limited\"");
        ALOG_LIT(b, ",\"remaining\":");
        alog_uint(b, limit->remaining);
        ALOG_LIT(b, ",\"store\":\"");
        const char *st = agw_trace_limit_store_name(limit->store);
        alog_lit(b, st, strlen(st));
        ALOG_LIT(b, "\",\"wait_ms\":");
        alog_ms(b, limit->wait_us / 1000.0);
        agw_buf_putc(b, '}');
    }
    if (trace_id) {
        char tid[32];
        agw_trace_hex(tid, trace_id, 16);
        ALOG_LIT(b, ",\"trace_id\":\"");
        alog_lit(b, tid, 32);
        ALOG_LIT(b, "\"}\n");
    } else {
        ALOG_LIT(b, ",\"trace_id\":null}\n");
    }
    if (b->len >= ALOG_FLUSH_BYTES)
        agw_worker_alog_flush(w);
    else if (was_empty)
        ev_timer_start(w->loop, &w->log.alog_timer);
}

/* Route pattern of endpoint (1-based) in generation g, NULL for 0 (no route matched). */
static const char *route_of(const wgen_t *g, int endpoint)
{
    if (endpoint > 0 && (size_t)endpoint <= g->conf->num_endpoints)
        return g->conf->endpoints[endpoint - 1].route;
    return endpoint == AGW_ENDPOINT_ENVELOPE ? g->conf->batch_route : NULL;
}

/* A response produced in C before the request reached the runtime (no route, bad framing) is
 * counted and logged; it was routed by the current generation. */
void agw_worker_record_c_response(agw_worker_t *w, h2o_req_t *req, int endpoint, int status, double ms,
                                  size_t bytes)
{
    const wgen_t *g = w->gens.cur;
    const agw_trace_limit_t *limit = w->lim.has_note ? &w->lim.note : NULL; /* a 429 or 503 of the limits */
    w->lim.has_note = 0;
    if (limit && ms == 0)
        ms = limit->wait_us / 1000.0;
    uint32_t slot = endpoint == AGW_ENDPOINT_ENVELOPE ? g->gen->route_slot[g->conf->num_endpoints + 1]
                                                      : g->gen->route_slot[endpoint];
    agw_metrics_request(w->m, (int)slot, status, ms, bytes);
    if (w->log.access_fd >= 0) {
        /* no span was made: the client's trace, when it sent one, ties the refusal to it */
        agw_traceparent_t tp;
        ssize_t i = h2o_find_header_by_str(&req->headers, H2O_STRLIT("traceparent"), -1);
        int has_tp = i >= 0 && h2o_find_header_by_str(&req->headers, H2O_STRLIT("traceparent"), i) < 0 && /* one */
                     agw_traceparent_parse(req->headers.entries[i].value.base, req->headers.entries[i].value.len, &tp) == 0;
        alog_write(w, req->method.base, req->method.len, req->path.base, req->path.len, route_of(g, endpoint), status,
                   ms, bytes, NULL, 0, NULL, 0, has_tp ? tp.trace_id : NULL, limit);
    }
}

void agw_worker_record_request(agw_worker_t *w, reqref_t *rr, int status, size_t bytes, const section_ref_t *secs,
                               size_t nsecs, const char *timing, size_t tlen)
{
    double ms = (ev_now(w->loop) - rr->started) * 1000.0;
    AGW_M_ADD(w->m->requests_ended, 1);
    agw_metrics_request(w->m, (int)rr->g->gen->route_slot[rr->endpoint], status, ms, bytes);
    if (rr->logline) {
        size_t mlen = strlen(rr->logline);
        const char *path = rr->logline + mlen + 1;
        alog_write(w, rr->logline, mlen, path, strlen(path), route_of(rr->g, rr->endpoint), status, ms, bytes, secs,
                   nsecs, timing, tlen, rr->trace ? rr->trace->trace_id : NULL, rr->trace ? &rr->trace->limit : NULL);
        free(rr->logline);
        rr->logline = NULL;
    }
    if (rr->trace)
        trace_request_ended(w, rr, status);
}

/* ---- problems (RFC 9457) built in C --------------------------------------------------------- */

void agw_worker_send_problem(agw_worker_t *w, h2o_req_t *req, reqref_t *rr, int endpoint, int status,
                             const char *kind, const char *title, const char *detail)
{
    agw_buf_t *b = &w->scratch.out;
    agw_buf_reset(b);
    agw_buf_printf(b, "{\"type\":\"urn:aggway:problem:%s\",\"title\":", kind);
    agw_json_encode_string(b, title, strlen(title));
    agw_buf_printf(b, ",\"status\":%d", status);
    if (detail) {
        agw_buf_puts(b, ",\"detail\":");
        agw_json_encode_string(b, detail, strlen(detail));
    }
    agw_buf_putc(b, '}');
    agw_worker_send_problem_body(w, req, rr, endpoint, status, b->base, b->len);
}

void agw_worker_send_problem_body(agw_worker_t *w, h2o_req_t *req, reqref_t *rr, int endpoint, int status,
                                  const char *body, size_t len)
{
    req->res.status = status;
    req->res.reason = agw_http_reason(status);
    h2o_add_header(&req->pool, &req->res.headers, H2O_TOKEN_CONTENT_TYPE, NULL, H2O_STRLIT("application/problem+json"));
    h2o_add_header(&req->pool, &req->res.headers, H2O_TOKEN_CACHE_CONTROL, NULL, H2O_STRLIT("no-store"));
    req->res.content_length = len;
    if (rr)
        agw_worker_record_request(w, rr, status, len, NULL, 0, NULL, 0);
    else
        agw_worker_record_c_response(w, req, endpoint, status, 0, len);
    agw_worker_closing(w, req);
    h2o_send_inline(req, body, len);
}
