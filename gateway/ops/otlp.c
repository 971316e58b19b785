/* otlp.c: the OTLP/HTTP JSON span exporter (see otlp.h). */
#include "ops/otlp.h"

#include "base/mem.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "base/clock.h"
#include "script/config.h"
#include "json/json.h"
#include "base/log.h"
#include "ops/metrics.h"
#include "ops/prom.h"
#include "upstream/pool.h"

#define QMASK (AGW_OTLP_QUEUE - 1)
_Static_assert((AGW_OTLP_QUEUE & QMASK) == 0, "the ring size must be a power of two");

/* One worker's ring: the worker writes head and the slots, the exporter thread writes tail. */
struct agw_otlp_queue {
    uint64_t head;                       /* next slot the worker fills (release after the slot) */
    char pad1[56];
    uint64_t tail;                       /* next slot the exporter takes (release after taking) */
    char pad2[56];
    uint64_t dropped_spans;              /* spans refused because the ring was full (worker only) */
    agw_trace_t *slots[AGW_OTLP_QUEUE];
};

struct agw_otlp {
    const agw_config_t *conf;
    const agw_metric_labels_t *names; /* route and upstream names of the traces' label slots */
    size_t num_queues;
    agw_otlp_queue_t *queues;
    pthread_t thread;
    pthread_mutex_t lock;                /* guards stopping, for the condition variable only */
    pthread_cond_t cond;
    int stopping;
    int wake[2];                         /* agw_otlp_stop writes here: an export in progress gives up */
    int abortable;                       /* 0 for the last export at stop (exporter thread only) */
    int aborted;                         /* the stop gave the export in progress up (exporter thread) */
    int last_failed;                     /* the last export_batch did not deliver (exporter thread) */
    int64_t warn_window_ms;              /* failed exports' warnings: at most 5 in each second */
    unsigned warned, unwarned;
    uint64_t exported_spans;             /* written by the exporter thread, read by /metrics */
    uint64_t failed_spans;
    uint64_t exports_ok, exports_failed;
    agw_buf_t body;                      /* the exporter thread's scratch */
    agw_buf_t request;
};

/* ---- the worker side ---------------------------------------------------------------------- */

size_t agw_otlp_trace_spans(const agw_trace_t *tr)
{
    return tr->num_spans + 1;
}

agw_otlp_queue_t *agw_otlp_queue(agw_otlp_t *e, size_t i)
{
    return &e->queues[i];
}

int agw_otlp_submit(agw_otlp_queue_t *q, agw_trace_t *tr)
{
    uint64_t head = q->head; /* only this thread writes it */
    uint64_t tail = __atomic_load_n(&q->tail, __ATOMIC_ACQUIRE);
    if (head - tail >= AGW_OTLP_QUEUE) {
        __atomic_store_n(&q->dropped_spans, q->dropped_spans + agw_otlp_trace_spans(tr) + tr->spans_dropped,
                         __ATOMIC_RELAXED);
        return -1;
    }
    q->slots[head & QMASK] = tr;
    __atomic_store_n(&q->head, head + 1, __ATOMIC_RELEASE);
    return 0;
}

/* ---- encoding ----------------------------------------------------------------------------- */

static void put_hex(agw_buf_t *b, const uint8_t *id, size_t n)
{
    agw_buf_reserve(b, 2 * n + 2);
    b->base[b->len++] = '"';
    agw_trace_hex(b->base + b->len, id, n);
    b->len += 2 * n;
    b->base[b->len++] = '"';
    b->base[b->len] = '\0';
}

static void put_str(agw_buf_t *b, const char *s)
{
    agw_json_encode_string_or(b, s, strlen(s), "\"\"");
}

static void attr_str(agw_buf_t *b, int *first, const char *key, const char *value)
{
    agw_buf_puts(b, *first ? "{\"key\":\"" : ",{\"key\":\"");
    *first = 0;
    agw_buf_puts(b, key);
    agw_buf_puts(b, "\",\"value\":{\"stringValue\":");
    put_str(b, value);
    agw_buf_puts(b, "}}");
}

static void attr_int(agw_buf_t *b, int *first, const char *key, long long value)
{
    agw_buf_printf(b, "%s{\"key\":\"%s\",\"value\":{\"intValue\":\"%lld\"}}", *first ? "" : ",", key, value);
    *first = 0;
}

static void attr_bool(agw_buf_t *b, int *first, const char *key, int value)
{
    agw_buf_printf(b, "%s{\"key\":\"%s\",\"value\":{\"boolValue\":%s}}", *first ? "" : ",", key,
                   value ? "true" : "false");
    *first = 0;
}

static void put_times(agw_buf_t *b, uint64_t start_us, uint64_t end_us)
{
    agw_buf_printf(b, ",\"startTimeUnixNano\":\"%llu000\",\"endTimeUnixNano\":\"%llu000\"",
                   (unsigned long long)start_us, (unsigned long long)end_us);
}

static void encode_server_span(agw_buf_t *b, const agw_metric_labels_t *names, const agw_trace_t *tr)
{
    agw_buf_puts(b, "{\"traceId\":");
    put_hex(b, tr->trace_id, 16);
    agw_buf_puts(b, ",\"spanId\":");
    put_hex(b, tr->span_id, 8);
    if (tr->has_parent) {
        agw_buf_puts(b, ",\"parentSpanId\":");
        put_hex(b, tr->parent_id, 8);
    }
    uint32_t nr = __atomic_load_n(&names->num_routes, __ATOMIC_ACQUIRE);
    const char *route = tr->endpoint > 0 && (uint32_t)tr->endpoint < nr ? names->routes[tr->endpoint] : NULL;
    agw_buf_puts(b, ",\"name\":");
    put_str(b, route ? route : tr->target);
    agw_buf_puts(b, ",\"kind\":2");
    put_times(b, tr->start_us, tr->end_us);
    agw_buf_puts(b, ",\"attributes\":[");
    int first = 1;
    const char *sp = strchr(tr->target, ' ');
    char method[AGW_TRACE_TARGET_MAX];
    size_t ml = sp ? (size_t)(sp - tr->target) : 0;
    memcpy(method, tr->target, ml);
    method[ml] = '\0';
    attr_str(b, &first, "http.request.method", method);
    attr_str(b, &first, "url.path", sp ? sp + 1 : tr->target);
    if (route)
        attr_str(b, &first, "http.route", route);
    attr_int(b, &first, "http.response.status_code", tr->status);
    attr_int(b, &first, "aggway.worker", tr->worker);
    if (tr->spans_dropped)
        attr_int(b, &first, "aggway.spans_dropped", tr->spans_dropped);
    agw_buf_puts(b, "]");
    if (tr->status >= 500)
        agw_buf_printf(b, ",\"status\":{\"code\":2,\"message\":\"HTTP %d\"}}", tr->status);
    else
        agw_buf_puts(b, ",\"status\":{\"code\":0}}");
}

static void encode_client_span(agw_buf_t *b, const agw_metric_labels_t *names, const agw_trace_t *tr,
                               const agw_span_t *s)
{
    const char *up =
        s->upstream < __atomic_load_n(&names->num_upstreams, __ATOMIC_ACQUIRE) ? names->upstreams[s->upstream] : "?";
    agw_buf_puts(b, ",{\"traceId\":");
    put_hex(b, tr->trace_id, 16);
    agw_buf_puts(b, ",\"spanId\":");
    put_hex(b, s->span_id, 8);
    agw_buf_puts(b, ",\"parentSpanId\":");
    put_hex(b, tr->span_id, 8);
    agw_buf_puts(b, ",\"name\":");
    char name[AGW_SPAN_SECTION_MAX + 128];
    snprintf(name, sizeof(name), "%s %s", s->section, up);
    put_str(b, name);
    agw_buf_puts(b, ",\"kind\":3");
    put_times(b, s->start_us, s->end_us);
    agw_buf_puts(b, ",\"attributes\":[");
    int first = 1;
    attr_str(b, &first, "aggway.section", s->section);
    attr_str(b, &first, "aggway.upstream", up);
    attr_str(b, &first, "aggway.outcome", agw_span_outcome_name(s->outcome));
    if (s->http_status)
        attr_int(b, &first, "http.response.status_code", s->http_status);
    attr_int(b, &first, "aggway.attempt", s->attempt);
    if (s->endpoint)
        attr_int(b, &first, "aggway.endpoint", s->endpoint);
    attr_bool(b, &first, "aggway.retry", s->flags & AGW_SPAN_RETRY);
    attr_bool(b, &first, "aggway.hedge", s->flags & AGW_SPAN_HEDGE);
    if (s->flags & (AGW_SPAN_CACHE_HIT | AGW_SPAN_CACHE_STALE))
        attr_str(b, &first, "aggway.cache", s->flags & AGW_SPAN_CACHE_HIT ? "hit" : "stale");
    if (s->flags & AGW_SPAN_SF_JOINED)
        attr_str(b, &first, "aggway.single_flight", "joined");
    else if (s->flags & AGW_SPAN_SF_LEADER)
        attr_str(b, &first, "aggway.single_flight", "leader");
    agw_buf_puts(b, "]");
    if (s->flags & AGW_SPAN_SF_JOINED) { /* the call it waited on, in the trace that made it */
        agw_buf_puts(b, ",\"links\":[{\"traceId\":");
        put_hex(b, s->link_trace_id, 16);
        agw_buf_puts(b, ",\"spanId\":");
        put_hex(b, s->link_span_id, 8);
        agw_buf_puts(b, "}]");
    }
    int error = s->outcome != AGW_SPAN_CANCELLED && (s->outcome != AGW_CALL_OK || s->http_status >= 400);
    if (error) {
        agw_buf_puts(b, ",\"status\":{\"code\":2,\"message\":");
        char msg[AGW_SPAN_DETAIL_MAX];
        if (s->detail)
            snprintf(msg, sizeof(msg), "%s", s->detail);
        else if (s->outcome == AGW_CALL_OK)
            snprintf(msg, sizeof(msg), "HTTP %u", s->http_status);
        else
            snprintf(msg, sizeof(msg), "%s", agw_span_outcome_name(s->outcome));
        put_str(b, msg);
        agw_buf_puts(b, "}}");
    } else {
        agw_buf_puts(b, s->outcome == AGW_SPAN_CANCELLED ? ",\"status\":{\"code\":0}}" : ",\"status\":{\"code\":1}}");
    }
}

void agw_otlp_encode(agw_buf_t *b, const agw_config_t *conf, const agw_metric_labels_t *names,
                     agw_trace_t *const *traces, size_t n)
{
    agw_buf_puts(b, "{\"resourceSpans\":[{\"resource\":{\"attributes\":[");
    int first = 1;
    attr_str(b, &first, "service.name", conf->otlp_service_name ? conf->otlp_service_name : "aggway");
    agw_buf_puts(b, "]},\"scopeSpans\":[{\"scope\":{\"name\":\"aggway\"},\"spans\":[");
    for (size_t i = 0; i < n; i++) {
        if (i)
            agw_buf_putc(b, ',');
        encode_server_span(b, names, traces[i]);
        for (size_t k = 0; k < traces[i]->num_spans; k++)
            encode_client_span(b, names, traces[i], &traces[i]->spans[k]);
    }
    agw_buf_puts(b, "]}]}]}");
}

/* ---- the blocking client ------------------------------------------------------------------ */

static int64_t mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Waits for events on fd until deadline (monotonic ms), or until agw_otlp_stop when the export is
 * abortable. Returns 1 when ready, 0 on timeout, stop or error. */
static int wait_fd(agw_otlp_t *e, int fd, short events, int64_t deadline)
{
    for (;;) {
        int64_t left = deadline - mono_ms();
        if (left <= 0)
            return 0;
        struct pollfd p[2] = {{.fd = fd, .events = events}, {.fd = e->wake[0], .events = POLLIN}};
        int rc = poll(p, e->abortable ? 2 : 1, (int)left);
        if (rc > 0 && e->abortable && (p[1].revents & POLLIN)) {
            e->aborted = 1; /* (the byte stays: the stop's, read by no one; the last export does not poll it) */
            return 0;
        }
        if (rc > 0)
            return (p[0].revents & (events | POLLERR | POLLHUP)) != 0;
        if (rc < 0 && errno != EINTR)
            return 0;
    }
}

/* POSTs e->request (a whole HTTP/1.1 request) to the collector. Returns the HTTP status, or 0
 * (with *why set) when the collector could not be reached or did not answer within the timeout. */
static int post(agw_otlp_t *e, const char **why)
{
    const agw_config_t *conf = e->conf;
    int64_t deadline = mono_ms() + (int64_t)conf->otlp_timeout_ms;
    int fd = socket(conf->otlp_addr.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        *why = "cannot create a socket";
        return 0;
    }
    int status = 0;
    *why = "timed out";
    if (connect(fd, (const struct sockaddr *)&conf->otlp_addr, conf->otlp_addrlen) != 0) {
        if (errno != EINPROGRESS) {
            *why = "connection refused";
            goto out;
        }
        if (!wait_fd(e, fd, POLLOUT, deadline))
            goto out;
        int err = 0;
        socklen_t el = sizeof(err);
        if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &el) != 0 || err != 0) {
            *why = "connection refused";
            goto out;
        }
    }
    size_t off = 0;
    while (off < e->request.len) {
        ssize_t n = send(fd, e->request.base + off, e->request.len - off, MSG_NOSIGNAL);
        if (n > 0) {
            off += (size_t)n;
        } else if (n < 0 && (errno == EAGAIN || errno == EINTR)) {
            if (!wait_fd(e, fd, POLLOUT, deadline))
                goto out;
        } else {
            *why = "connection closed while sending";
            goto out;
        }
    }
    char resp[256];
    size_t got = 0;
    for (;;) { /* the status line is all that is needed */
        char *eol = memchr(resp, '\n', got);
        if (eol) {
            if (got >= 12 && memcmp(resp, "HTTP/1.", 7) == 0 && resp[8] == ' ' && resp[9] >= '1' && resp[9] <= '5' &&
                resp[10] >= '0' && resp[10] <= '9' && resp[11] >= '0' && resp[11] <= '9')
                status = (resp[9] - '0') * 100 + (resp[10] - '0') * 10 + (resp[11] - '0');
            else
                *why = "the answer is not HTTP";
            break;
        }
        if (got == sizeof(resp)) {
            *why = "the answer is not HTTP";
            break;
        }
        ssize_t n = recv(fd, resp + got, sizeof(resp) - got, 0);
        if (n > 0) {
            got += (size_t)n;
        } else if (n < 0 && (errno == EAGAIN || errno == EINTR)) {
            if (!wait_fd(e, fd, POLLIN, deadline))
                break;
        } else {
            *why = "connection closed before an answer";
            break;
        }
    }
out:
    if (e->aborted)
        *why = "given up at stop (it may have arrived)";
    close(fd);
    return status;
}

/* Sends traces[0..n) (nspans spans) in one POST and frees them. */
static void export_batch(agw_otlp_t *e, agw_trace_t **traces, size_t n, size_t nspans)
{
    const agw_config_t *conf = e->conf;
    agw_buf_reset(&e->body);
    agw_otlp_encode(&e->body, conf, e->names, traces, n);
    agw_buf_reset(&e->request);
    agw_buf_printf(&e->request,
                   "POST %s HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nContent-Length: %zu\r\n"
                   "User-Agent: aggway\r\nConnection: close\r\n\r\n",
                   conf->otlp_path, conf->otlp_host_header, e->body.len);
    agw_buf_append(&e->request, e->body.base, e->body.len);
    const char *why = NULL;
    int status = post(e, &why);
    e->last_failed = !(status >= 200 && status < 300);
    if (!e->last_failed) {
        __atomic_store_n(&e->exported_spans, e->exported_spans + nspans, __ATOMIC_RELAXED);
        __atomic_store_n(&e->exports_ok, e->exports_ok + 1, __ATOMIC_RELAXED);
    } else {
        __atomic_store_n(&e->failed_spans, e->failed_spans + nspans, __ATOMIC_RELAXED);
        __atomic_store_n(&e->exports_failed, e->exports_failed + 1, __ATOMIC_RELAXED);
        /* one line per failed export, at most 5 in a second (a collector that answers 500 at once
         * fails every batch of a flush: 50 lines a second), the next line saying how many were not */
        int64_t now = mono_ms();
        if (now - e->warn_window_ms >= 1000)
            e->warn_window_ms = now, e->warned = 0;
        if (e->warned >= 5) {
            e->unwarned++;
        } else {
            e->warned++;
            char more[64] = "";
            if (e->unwarned)
                snprintf(more, sizeof(more), " (and %u failed exports not logged before)", e->unwarned);
            e->unwarned = 0;
            if (status)
                agw_log(AGW_LOG_WARN, "trace export to %s: the collector answered %d; %zu spans dropped%s",
                        conf->otlp_url, status, nspans, more);
            else
                agw_log(AGW_LOG_WARN, "trace export to %s: %s; %zu spans dropped%s", conf->otlp_url, why, nspans,
                        more);
        }
    }
    for (size_t i = 0; i < n; i++)
        agw_trace_free(traces[i]);
}

/* Takes everything queued and exports it in batches. An export the stop gave up ends the flush:
 * what is still queued goes in the last one (exporter_main). The last one ends at its first
 * export the collector did not take: the rest is dropped at stop, so that a collector that hangs
 * holds the stop one timeout, not one a batch. */
static void flush(agw_otlp_t *e)
{
    agw_trace_t *batch[AGW_OTLP_BATCH_SPANS];
    size_t n = 0, nspans = 0;
    for (size_t qi = 0; qi < e->num_queues; qi++) {
        agw_otlp_queue_t *q = &e->queues[qi];
        uint64_t head = __atomic_load_n(&q->head, __ATOMIC_ACQUIRE);
        uint64_t tail = q->tail;
        while (tail < head) {
            agw_trace_t *tr = q->slots[tail & QMASK];
            size_t s = agw_otlp_trace_spans(tr);
            if (n && nspans + s > AGW_OTLP_BATCH_SPANS) {
                __atomic_store_n(&q->tail, tail, __ATOMIC_RELEASE); /* the worker may refill meanwhile */
                export_batch(e, batch, n, nspans);
                n = nspans = 0;
                if (e->aborted || (!e->abortable && e->last_failed))
                    return;
            }
            batch[n++] = tr;
            nspans += s;
            tail++;
        }
        __atomic_store_n(&q->tail, tail, __ATOMIC_RELEASE);
    }
    if (n)
        export_batch(e, batch, n, nspans);
}

static void *exporter_main(void *arg)
{
    agw_otlp_t *e = arg;
    pthread_mutex_lock(&e->lock);
    while (!e->stopping) {
        struct timespec ts = agw_clock_after_ms(CLOCK_MONOTONIC, AGW_OTLP_FLUSH_MS);
        pthread_cond_timedwait(&e->cond, &e->lock, &ts);
        int stopping = e->stopping;
        pthread_mutex_unlock(&e->lock);
        if (stopping)
            e->abortable = 0, e->aborted = 0; /* the last export may take its whole timeout */
        flush(e);
        pthread_mutex_lock(&e->lock);
        if (stopping)
            break;
    }
    pthread_mutex_unlock(&e->lock);
    return NULL;
}

agw_otlp_t *agw_otlp_start(const agw_config_t *conf, const agw_metric_labels_t *names, size_t num_workers)
{
    agw_otlp_t *e = agw_calloc(1, sizeof(*e));
    e->conf = conf;
    e->names = names;
    e->num_queues = num_workers;
    if (posix_memalign((void **)&e->queues, 64, (num_workers ? num_workers : 1) * sizeof(*e->queues)) != 0)
        agw_oom((num_workers ? num_workers : 1) * sizeof(*e->queues));
    memset(e->queues, 0, (num_workers ? num_workers : 1) * sizeof(*e->queues));
    if (pipe2(e->wake, O_NONBLOCK | O_CLOEXEC) != 0)
        abort();
    e->abortable = 1;
    pthread_mutex_init(&e->lock, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&e->cond, &ca);
    pthread_condattr_destroy(&ca);
    if (pthread_create(&e->thread, NULL, exporter_main, e) != 0) {
        agw_log(AGW_LOG_ERROR, "cannot start the trace exporter thread");
        pthread_cond_destroy(&e->cond);
        pthread_mutex_destroy(&e->lock);
        close(e->wake[0]);
        close(e->wake[1]);
        free(e->queues);
        free(e);
        return NULL;
    }
    agw_log(AGW_LOG_INFO, "exporting spans to %s (OTLP/HTTP JSON)", conf->otlp_url);
    return e;
}

void agw_otlp_stop(agw_otlp_t *e)
{
    if (e == NULL)
        return;
    pthread_mutex_lock(&e->lock);
    e->stopping = 1;
    pthread_cond_signal(&e->cond);
    pthread_mutex_unlock(&e->lock);
    ssize_t wr = write(e->wake[1], "x", 1); /* an export stuck on a slow collector gives up now */
    (void)wr;
    pthread_join(e->thread, NULL);
    close(e->wake[0]);
    close(e->wake[1]);
    size_t left = 0;
    for (size_t qi = 0; qi < e->num_queues; qi++) {
        agw_otlp_queue_t *q = &e->queues[qi];
        for (uint64_t t = q->tail; t < q->head; t++) {
            left += agw_otlp_trace_spans(q->slots[t & QMASK]);
            agw_trace_free(q->slots[t & QMASK]);
        }
    }
    if (left)
        agw_log(AGW_LOG_WARN, "trace export to %s: %zu spans still queued at stop dropped (the collector did not take "
                "the last export)", e->conf->otlp_url, left);
    pthread_cond_destroy(&e->cond);
    pthread_mutex_destroy(&e->lock);
    agw_buf_free(&e->body);
    agw_buf_free(&e->request);
    free(e->queues);
    free(e);
}

void agw_otlp_render_metrics(agw_buf_t *b, const agw_otlp_t *e)
{
    uint64_t queue_full = 0;
    for (size_t qi = 0; e && qi < e->num_queues; qi++)
        queue_full += __atomic_load_n(&e->queues[qi].dropped_spans, __ATOMIC_RELAXED);
    uint64_t exported = e ? __atomic_load_n(&e->exported_spans, __ATOMIC_RELAXED) : 0;
    uint64_t failed = e ? __atomic_load_n(&e->failed_spans, __ATOMIC_RELAXED) : 0;
    uint64_t ok = e ? __atomic_load_n(&e->exports_ok, __ATOMIC_RELAXED) : 0;
    uint64_t bad = e ? __atomic_load_n(&e->exports_failed, __ATOMIC_RELAXED) : 0;
    agw_prom_family(b, "aggway_trace_spans_exported_total", "counter",
                    "Spans the OTLP collector accepted (2xx).");
    agw_prom_sample_u64(b, "aggway_trace_spans_exported_total", NULL, 0, exported);
    agw_prom_family(b, "aggway_trace_spans_dropped_total", "counter",
                    "Spans not exported: the exporter's queue was full, or the collector refused, failed or did not answer in time.");
    agw_prom_label_t l = {"reason", "queue_full", 10};
    agw_prom_sample_u64(b, "aggway_trace_spans_dropped_total", &l, 1, queue_full);
    l.value = "export_failed", l.value_len = 13;
    agw_prom_sample_u64(b, "aggway_trace_spans_dropped_total", &l, 1, failed);
    agw_prom_family(b, "aggway_trace_exports_total", "counter", "POSTs to the OTLP collector by result.");
    l.name = "result", l.value = "ok", l.value_len = 2;
    agw_prom_sample_u64(b, "aggway_trace_exports_total", &l, 1, ok);
    l.value = "error", l.value_len = 5;
    agw_prom_sample_u64(b, "aggway_trace_exports_total", &l, 1, bad);
}
