/* waterfall.c: recent requests per worker and their waterfall page (see waterfall.h). */
#include "ops/waterfall.h"

#include "base/mem.h"

#include <stdlib.h>
#include <string.h>

#include "ops/metrics.h"
#include "json/json.h"

agw_waterfall_t *agw_waterfall_new(void)
{
    agw_waterfall_t *wf = agw_calloc(1, sizeof(*wf));
    pthread_mutex_init(&wf->lock, NULL);
    return wf;
}

void agw_waterfall_free(agw_waterfall_t *wf)
{
    if (wf == NULL)
        return;
    pthread_mutex_destroy(&wf->lock);
    free(wf);
}

static uint32_t rel_us(uint64_t t, uint64_t base)
{
    uint64_t d = t > base ? t - base : 0;
    return d > UINT32_MAX ? UINT32_MAX : (uint32_t)d;
}

void agw_waterfall_record(agw_waterfall_t *wf, const agw_trace_t *tr)
{
    if (pthread_mutex_trylock(&wf->lock) != 0) {
        __atomic_add_fetch(&wf->skipped, 1, __ATOMIC_RELAXED);
        return;
    }
    uint64_t seq = ++wf->next_seq;
    agw_wf_entry_t *e = &wf->ring[seq % AGW_WF_RING];
    e->seq = seq;
    e->start_us = tr->start_us;
    e->duration_us = rel_us(tr->end_us, tr->start_us);
    e->status = tr->status;
    e->endpoint = tr->endpoint;
    e->worker = tr->worker;
    agw_trace_hex(e->trace_id, tr->trace_id, 16);
    e->trace_id[32] = '\0';
    memcpy(e->target, tr->target, sizeof(e->target));
    e->limit = tr->limit;
    size_t n = tr->num_spans < AGW_WF_CALLS ? tr->num_spans : AGW_WF_CALLS;
    e->num_calls = (uint8_t)n;
    size_t dropped = tr->num_spans - n + tr->spans_dropped;
    e->calls_dropped = (uint16_t)(dropped > UINT16_MAX ? UINT16_MAX : dropped);
    for (size_t i = 0; i < n; i++) {
        const agw_span_t *s = &tr->spans[i];
        agw_wf_call_t *c = &e->calls[i];
        memcpy(c->section, s->section, sizeof(c->section));
        const char *d = s->detail ? s->detail : "";
        size_t dl = strnlen(d, sizeof(c->detail) - 1); /* (no printf per call) */
        memcpy(c->detail, d, dl);
        c->detail[dl] = '\0';
        c->upstream = s->upstream;
        c->http_status = s->http_status;
        c->outcome = s->outcome;
        c->flags = s->flags;
        c->attempt = s->attempt;
        c->endpoint = s->endpoint;
        c->start_us = rel_us(s->start_us, tr->start_us);
        c->end_us = rel_us(s->end_us, tr->start_us);
    }
    pthread_mutex_unlock(&wf->lock);
}

static int newer_first(const void *a, const void *b)
{
    const agw_wf_entry_t *x = a, *y = b;
    if (x->start_us != y->start_us)
        return x->start_us > y->start_us ? -1 : 1;
    return x->worker - y->worker;
}

size_t agw_waterfall_snapshot(agw_waterfall_t *const *rings, size_t n, const char *trace_id, agw_wf_entry_t *out,
                              size_t max)
{
    size_t total = n * AGW_WF_RING;
    agw_wf_entry_t *all = agw_malloc((total ? total : 1) * sizeof(*all));
    size_t got = 0;
    for (size_t i = 0; i < n; i++) {
        pthread_mutex_lock(&rings[i]->lock);
        for (size_t k = 0; k < AGW_WF_RING; k++) {
            const agw_wf_entry_t *e = &rings[i]->ring[k];
            if (e->seq == 0 || (trace_id && strcmp(e->trace_id, trace_id) != 0))
                continue;
            all[got++] = *e;
        }
        pthread_mutex_unlock(&rings[i]->lock);
    }
    qsort(all, got, sizeof(*all), newer_first);
    if (got > max)
        got = max;
    memcpy(out, all, got * sizeof(*out));
    free(all);
    return got;
}

static void put_json_str(agw_buf_t *b, const char *s)
{
    agw_json_encode_string_or(b, s, strlen(s), "null");
}

static const char *upstream_name(const agw_metric_labels_t *names, unsigned up)
{
    return up < __atomic_load_n(&names->num_upstreams, __ATOMIC_ACQUIRE) ? names->upstreams[up] : "?";
}

static const char *route_of(const agw_metric_labels_t *names, int route)
{
    return route > 0 && (uint32_t)route < __atomic_load_n(&names->num_routes, __ATOMIC_ACQUIRE) ? names->routes[route]
                                                                                               : NULL;
}

static const char *single_flight(unsigned flags)
{
    return flags & AGW_SPAN_SF_JOINED ? "joined" : flags & AGW_SPAN_SF_LEADER ? "leader" : NULL;
}

/* "hit" or "stale" for a section served from the cache, else NULL. */
static const char *cache_outcome(unsigned flags)
{
    return flags & AGW_SPAN_CACHE_HIT ? "hit" : flags & AGW_SPAN_CACHE_STALE ? "stale" : NULL;
}

void agw_waterfall_json(agw_buf_t *b, const agw_metric_labels_t *names, const agw_wf_entry_t *entries, size_t n)
{
    agw_buf_puts(b, "{\"requests\":[");
    for (size_t i = 0; i < n; i++) {
        const agw_wf_entry_t *e = &entries[i];
        agw_buf_puts(b, i ? ",\n{\"trace_id\":\"" : "\n{\"trace_id\":\"");
        agw_buf_puts(b, e->trace_id);
        agw_buf_puts(b, "\",\"request\":");
        put_json_str(b, e->target);
        agw_buf_puts(b, ",\"route\":");
        const char *route = route_of(names, e->endpoint);
        if (route)
            put_json_str(b, route);
        else
            agw_buf_puts(b, "null");
        agw_buf_printf(b, ",\"status\":%d,\"worker\":%d,\"start_unix_ms\":%llu.%03u,\"duration_ms\":%u.%03u", e->status,
                       e->worker, (unsigned long long)(e->start_us / 1000), (unsigned)(e->start_us % 1000),
                       e->duration_us / 1000, e->duration_us % 1000);
        if (e->limit.rule[0]) {
            agw_buf_puts(b, ",\"limit\":{\"rule\":");
            put_json_str(b, e->limit.rule);
            agw_buf_printf(b, ",\"remaining\":%llu,\"store\":\"%s\",\"wait_ms\":%u.%03u}",
                           (unsigned long long)e->limit.remaining, agw_trace_limit_store_name(e->limit.store),
                           e->limit.wait_us / 1000, e->limit.wait_us % 1000);
        }
        agw_buf_printf(b, ",\"calls_dropped\":%u,\"calls\":[", e->calls_dropped);
        for (size_t k = 0; k < e->num_calls; k++) {
            const agw_wf_call_t *c = &e->calls[k];
            agw_buf_puts(b, k ? ",{\"section\":" : "{\"section\":");
            put_json_str(b, c->section);
            agw_buf_puts(b, ",\"upstream\":");
            put_json_str(b, upstream_name(names, c->upstream));
            agw_buf_printf(b, ",\"outcome\":\"%s\",\"http_status\":", agw_span_outcome_name(c->outcome));
            if (c->http_status)
                agw_buf_printf(b, "%u", c->http_status);
            else
                agw_buf_puts(b, "null");
            uint32_t dur = c->end_us > c->start_us ? c->end_us - c->start_us : 0;
            agw_buf_printf(b, ",\"start_ms\":%u.%03u,\"duration_ms\":%u.%03u,\"attempt\":%u,\"retry\":%s,\"hedge\":%s",
                           c->start_us / 1000, c->start_us % 1000, dur / 1000, dur % 1000, c->attempt,
                           c->flags & AGW_SPAN_RETRY ? "true" : "false", c->flags & AGW_SPAN_HEDGE ? "true" : "false");
            if (c->endpoint)
                agw_buf_printf(b, ",\"endpoint\":%u", c->endpoint);
            const char *sf = single_flight(c->flags);
            agw_buf_printf(b, ",\"single_flight\":%s%s%s", sf ? "\"" : "", sf ? sf : "null", sf ? "\"" : "");
            const char *co = cache_outcome(c->flags);
            agw_buf_printf(b, ",\"cache\":%s%s%s", co ? "\"" : "", co ? co : "null", co ? "\"" : "");
            if (c->detail[0]) { /* the admin listener's: internal detail is for operators */
                agw_buf_puts(b, ",\"detail\":");
                put_json_str(b, c->detail);
            }
            agw_buf_puts(b, "}");
        }
        agw_buf_puts(b, "]}");
    }
    agw_buf_puts(b, n ? "\n]}\n" : "]}\n");
}

/* ---- HTML ------------------------------------------------------------------------------------ */

static void put_html(agw_buf_t *b, const char *s)
{
    for (; *s; s++) {
        switch (*s) {
        case '&': agw_buf_puts(b, "&amp;"); break;
        case '<': agw_buf_puts(b, "&lt;"); break;
        case '>': agw_buf_puts(b, "&gt;"); break;
        case '"': agw_buf_puts(b, "&quot;"); break;
        case '\'': agw_buf_puts(b, "&#39;"); break;
        default:
            if ((unsigned char)*s < 0x20)
                agw_buf_putc(b, ' ');
            else
                agw_buf_putc(b, *s);
        }
    }
}

/* Layout of one request's SVG, in CSS pixels. */
#define WF_WIDTH 1140     /* whole drawing */
#define WF_LABEL 250      /* left column: section and upstream */
#define WF_CHART 700      /* the time axis; the rest on the right holds each bar's status and ms */
#define WF_ROW 22
#define WF_BAR 14
#define WF_TOP 18         /* the axis labels above the first row */

/* Bar fill per kind (the screenshot test finds bars by these exact colours). */
#define WF_COLOR_REQUEST "#7f7f7f" /* the gateway's own span */
#define WF_COLOR_OK "#1f77b4"      /* a call answered 1xx-3xx */
#define WF_COLOR_ERROR "#d62728"   /* 4xx/5xx or a transport failure */
#define WF_COLOR_CANCEL "#c7c7c7"  /* the gateway stopped waiting */
#define WF_COLOR_SHARED "#9467bd"  /* waited on another request's single-flight call */
#define WF_COLOR_CACHED "#17becf"  /* served from the cache, no call */

static const char *bar_color(const agw_wf_call_t *c)
{
    if (c->flags & (AGW_SPAN_CACHE_HIT | AGW_SPAN_CACHE_STALE))
        return WF_COLOR_CACHED;
    if (c->flags & AGW_SPAN_SF_JOINED)
        return c->outcome == 0 && c->http_status < 400 ? WF_COLOR_SHARED : WF_COLOR_ERROR;
    if (c->outcome == AGW_SPAN_CANCELLED)
        return WF_COLOR_CANCEL;
    return c->outcome == 0 && c->http_status < 400 ? WF_COLOR_OK : WF_COLOR_ERROR;
}

static double px(uint32_t us, uint32_t total_us)
{
    return WF_LABEL + (double)us * WF_CHART / (double)total_us;
}

static void render_request(agw_buf_t *b, const agw_metric_labels_t *names, const agw_wf_entry_t *e)
{
    uint32_t total = e->duration_us;
    for (size_t k = 0; k < e->num_calls; k++)
        if (e->calls[k].end_us > total)
            total = e->calls[k].end_us;
    if (total == 0)
        total = 1;
    agw_buf_puts(b, "<section class=\"req\"><h2>");
    put_html(b, e->target);
    agw_buf_printf(b, " <span class=\"st s%d\">%d</span> <span class=\"ms\">%u.%01u ms</span></h2>\n<p class=\"meta\">",
                   e->status / 100, e->status, e->duration_us / 1000, e->duration_us % 1000 / 100);
    const char *route = route_of(names, e->endpoint);
    if (route) {
        agw_buf_puts(b, "route ");
        put_html(b, route);
        agw_buf_puts(b, " &middot; ");
    }
    agw_buf_printf(b, "trace <code>%s</code> &middot; worker %d", e->trace_id, e->worker);
    if (e->limit.rule[0]) {
        agw_buf_puts(b, " &middot; limit ");
        put_html(b, e->limit.rule);
        agw_buf_printf(b, ": %llu left (%s", (unsigned long long)e->limit.remaining, agw_trace_limit_store_name(e->limit.store));
        if (e->limit.wait_us)
            agw_buf_printf(b, ", waited %u.%01u ms", e->limit.wait_us / 1000, e->limit.wait_us % 1000 / 100);
        agw_buf_puts(b, ")");
    }
    if (e->calls_dropped)
        agw_buf_printf(b, " &middot; %u more calls not shown", e->calls_dropped);
    agw_buf_puts(b, "</p>\n");
    size_t rows = (size_t)e->num_calls + 1;
    unsigned height = (unsigned)(WF_TOP + rows * WF_ROW + 4);
    agw_buf_printf(b, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%u\" viewBox=\"0 0 %d %u\" "
                      "shape-rendering=\"crispEdges\" data-trace=\"%s\">\n",
                   WF_WIDTH, height, WF_WIDTH, height, e->trace_id);
    /* the time axis: five ticks over the request's duration */
    for (int t = 0; t <= 4; t++) {
        uint32_t us = (uint32_t)((uint64_t)total * (unsigned)t / 4);
        double x = px(us, total);
        agw_buf_printf(b, "<line x1=\"%.1f\" y1=\"%d\" x2=\"%.1f\" y2=\"%u\" class=\"tick\"/>", x, WF_TOP - 4, x,
                       height);
        agw_buf_printf(b, "<text x=\"%.1f\" y=\"%d\" class=\"axis\" text-anchor=\"%s\">%u ms</text>\n", x, WF_TOP - 6,
                       t == 0 ? "start" : t == 4 ? "end" : "middle", us / 1000);
    }
    /* row 0: the gateway's span */
    int y = WF_TOP + (WF_ROW - WF_BAR) / 2;
    agw_buf_puts(b, "<text x=\"4\" y=\"");
    agw_buf_printf(b, "%d\" class=\"label\">gateway", y + WF_BAR - 3);
    agw_buf_puts(b, "</text>");
    agw_buf_printf(b, "<rect x=\"%.1f\" y=\"%d\" width=\"%.1f\" height=\"%d\" fill=\"%s\" class=\"bar request\"/>",
                   px(0, total), y, px(e->duration_us, total) - px(0, total) + 1, WF_BAR, WF_COLOR_REQUEST);
    agw_buf_printf(b, "<text x=\"%.1f\" y=\"%d\" class=\"note\">%d &middot; %u.%01u ms</text>\n",
                   px(e->duration_us, total) + 6, y + WF_BAR - 3, e->status, e->duration_us / 1000,
                   e->duration_us % 1000 / 100);
    for (size_t k = 0; k < e->num_calls; k++) {
        const agw_wf_call_t *c = &e->calls[k];
        y = (int)(WF_TOP + (k + 1) * WF_ROW + (WF_ROW - WF_BAR) / 2);
        uint32_t dur = c->end_us > c->start_us ? c->end_us - c->start_us : 0;
        double x0 = px(c->start_us, total), x1 = px(c->end_us, total);
        agw_buf_printf(b, "<text x=\"4\" y=\"%d\" class=\"label\">", y + WF_BAR - 3);
        put_html(b, c->section);
        agw_buf_puts(b, " &#8594; ");
        put_html(b, upstream_name(names, c->upstream));
        agw_buf_puts(b, "</text>");
        agw_buf_printf(b,
                       "<rect x=\"%.1f\" y=\"%d\" width=\"%.1f\" height=\"%d\" fill=\"%s\" class=\"bar call\">"
                       "<title>",
                       x0, y, x1 - x0 < 1 ? 1 : x1 - x0, WF_BAR, bar_color(c));
        put_html(b, c->section);
        agw_buf_printf(b, ": %u.%03u ms to %u.%03u ms</title></rect>", c->start_us / 1000, c->start_us % 1000,
                       c->end_us / 1000, c->end_us % 1000);
        agw_buf_printf(b, "<text x=\"%.1f\" y=\"%d\" class=\"note\">", x1 + 6, y + WF_BAR - 3);
        if (c->http_status)
            agw_buf_printf(b, "%u", c->http_status);
        else
            agw_buf_puts(b, agw_span_outcome_name(c->outcome));
        agw_buf_printf(b, " &middot; %u.%01u ms", dur / 1000, dur % 1000 / 100);
        if (c->endpoint)
            agw_buf_printf(b, " &middot; endpoint #%u", c->endpoint);
        if (c->flags & AGW_SPAN_RETRY)
            agw_buf_printf(b, " &middot; retry (attempt %u)", c->attempt);
        if (c->flags & AGW_SPAN_HEDGE)
            agw_buf_puts(b, " &middot; hedge");
        if (c->flags & AGW_SPAN_SF_LEADER)
            agw_buf_puts(b, " &middot; single-flight");
        if (c->flags & AGW_SPAN_SF_JOINED)
            agw_buf_puts(b, " &middot; shared call");
        if (c->flags & AGW_SPAN_CACHE_HIT)
            agw_buf_puts(b, " &middot; cache hit");
        if (c->flags & AGW_SPAN_CACHE_STALE)
            agw_buf_puts(b, " &middot; stale cache copy");
        if (c->outcome == AGW_SPAN_CANCELLED)
            agw_buf_puts(b, " &middot; cancelled");
        if (c->detail[0]) {
            agw_buf_puts(b, " &middot; ");
            put_html(b, c->detail);
        }
        agw_buf_puts(b, "</text>\n");
    }
    agw_buf_puts(b, "</svg></section>\n");
}

void agw_waterfall_html(agw_buf_t *b, const agw_metric_labels_t *names, const agw_wf_entry_t *entries, size_t n)
{
    agw_buf_puts(b,
                 "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>aggway waterfall</title>\n"
                 "<style>body{font:13px/1.4 system-ui,sans-serif;margin:12px 16px;color:#222;background:#fff}"
                 "h1{font-size:18px;margin:0 0 4px}h2{font-size:14px;margin:14px 0 0;font-weight:600}"
                 ".meta{margin:0 0 4px;color:#555}.st{padding:0 4px;border-radius:3px;background:#eee}"
                 ".s5,.s4{background:#fdd}.ms{color:#555}svg{display:block}"
                 ".tick{stroke:#e4e4e4;stroke-width:1}.axis{font-size:10px;fill:#777}.label{font-size:12px;fill:#222}"
                 ".note{font-size:11px;fill:#444}.legend span{display:inline-block;width:10px;height:10px;"
                 "margin:0 4px 0 12px;vertical-align:middle}</style></head><body>\n"
                 "<h1>aggway: recent requests</h1>\n<p class=\"legend\">Each bar is an upstream call on the request's "
                 "time axis: parallel calls overlap, a dependent chain steps down like a staircase."
                 "<span style=\"background:" WF_COLOR_REQUEST "\"></span>gateway"
                 "<span style=\"background:" WF_COLOR_OK "\"></span>answered"
                 "<span style=\"background:" WF_COLOR_ERROR "\"></span>failed"
                 "<span style=\"background:" WF_COLOR_CANCEL "\"></span>cancelled"
                 "<span style=\"background:" WF_COLOR_SHARED "\"></span>shared (single-flight)</p>\n");
    if (n == 0)
        agw_buf_puts(b, "<p>No request has finished yet.</p>\n");
    for (size_t i = 0; i < n; i++)
        render_request(b, names, &entries[i]);
    agw_buf_puts(b, "</body></html>\n");
}
