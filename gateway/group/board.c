/* board.c: the endpoints' state for the admin thread (see board.h). */
#include "group/board.h"
#include "base/mem.h"

#include <stdlib.h>
#include <string.h>

#include "json/json.h"
#include "ops/prom.h"

agw_endpoint_board_t *agw_endpoint_board_new(size_t workers, size_t endpoints)
{
    agw_endpoint_board_t *b = agw_calloc(1, sizeof(*b));
    b->rows = agw_calloc(workers * endpoints > 0 ? workers * endpoints : 1, sizeof(*b->rows));
    b->num_workers = workers;
    b->num_endpoints = endpoints;
    return b;
}

void agw_endpoint_board_free(agw_endpoint_board_t *b)
{
    if (b == NULL)
        return;
    free(b->rows);
    free(b);
}

void agw_endpoint_board_publish(agw_endpoint_board_t *b, size_t worker, size_t ep, const agw_endpoint_row_t *row)
{
    if (b == NULL || worker >= b->num_workers || ep >= b->num_endpoints)
        return;
    agw_endpoint_row_t *r = &b->rows[worker * b->num_endpoints + ep];
    __atomic_store_n(&r->calls, row->calls, __ATOMIC_RELAXED);
    __atomic_store_n(&r->failures, row->failures, __ATOMIC_RELAXED);
    __atomic_store_n(&r->ejections, row->ejections, __ATOMIC_RELAXED);
    __atomic_store_n(&r->sessions, row->sessions, __ATOMIC_RELAXED);
    __atomic_store_n(&r->in_flight, row->in_flight, __ATOMIC_RELAXED);
    __atomic_store_n(&r->ejected_until_ms, row->ejected_until_ms, __ATOMIC_RELAXED);
    __atomic_store_n(&r->last_ejected_ms, row->last_ejected_ms, __ATOMIC_RELAXED);
    __atomic_store_n(&r->answered, row->answered, __ATOMIC_RELAXED);
    __atomic_store_n(&r->latency_ms, row->latency_ms, __ATOMIC_RELAXED);
    __atomic_store_n(&r->health, row->health, __ATOMIC_RELAXED);
    __atomic_store_n(&r->down, row->down, __ATOMIC_RELAXED);
    __atomic_store_n(&r->probes, row->probes, __ATOMIC_RELAXED);
    __atomic_store_n(&r->probe_failures, row->probe_failures, __ATOMIC_RELAXED);
}

/* Endpoint ep summed over the workers; *ejected: workers that have it ejected at now_ms; until and
 * last: the latest of the workers' ejection end and last ejection (ms, 0 for none); down: workers
 * whose health checks keep it out of service; health: failing when any worker's checks fail it,
 * else passing when any passes it, else unchecked. */
static void sum(const agw_endpoint_board_t *b, size_t ep, uint64_t now_ms, agw_endpoint_row_t *out, unsigned *ejected)
{
    *out = (agw_endpoint_row_t){0};
    *ejected = 0;
    if (b == NULL)
        return;
    for (size_t w = 0; w < b->num_workers; w++) {
        const agw_endpoint_row_t *r = &b->rows[w * b->num_endpoints + ep];
        out->calls += __atomic_load_n(&r->calls, __ATOMIC_RELAXED);
        out->failures += __atomic_load_n(&r->failures, __ATOMIC_RELAXED);
        out->ejections += __atomic_load_n(&r->ejections, __ATOMIC_RELAXED);
        out->sessions += __atomic_load_n(&r->sessions, __ATOMIC_RELAXED);
        out->in_flight += __atomic_load_n(&r->in_flight, __ATOMIC_RELAXED);
        out->answered += __atomic_load_n(&r->answered, __ATOMIC_RELAXED);
        out->latency_ms += __atomic_load_n(&r->latency_ms, __ATOMIC_RELAXED);
        out->down += __atomic_load_n(&r->down, __ATOMIC_RELAXED);
        out->probes += __atomic_load_n(&r->probes, __ATOMIC_RELAXED);
        out->probe_failures += __atomic_load_n(&r->probe_failures, __ATOMIC_RELAXED);
        uint64_t health = __atomic_load_n(&r->health, __ATOMIC_RELAXED);
        if (health == AGW_HEALTH_FAILING || (health == AGW_HEALTH_PASSING && out->health == AGW_HEALTH_UNCHECKED))
            out->health = health;
        uint64_t until = __atomic_load_n(&r->ejected_until_ms, __ATOMIC_RELAXED);
        uint64_t last = __atomic_load_n(&r->last_ejected_ms, __ATOMIC_RELAXED);
        if (until > now_ms) {
            (*ejected)++;
            if (until > out->ejected_until_ms)
                out->ejected_until_ms = until;
        }
        if (last > out->last_ejected_ms)
            out->last_ejected_ms = last;
    }
}

/* A JSON string of s (null if it is not valid UTF-8). */
static void str(agw_buf_t *out, const char *s)
{
    size_t mark = out->len;
    if (agw_json_encode_string(out, s, strlen(s)) != 0) {
        out->len = mark;
        agw_buf_puts(out, "null");
    }
}

static void seconds_or_null(agw_buf_t *out, uint64_t ms)
{
    if (ms == 0)
        agw_buf_append(out, "null", 4);
    else
        agw_buf_printf(out, "%llu.%03u", (unsigned long long)(ms / 1000), (unsigned)(ms % 1000));
}

/* A one-endpoint upstream has no balancer: its endpoint's calls, failures, calls in flight and mean
 * latency are the upstream's own call counters (ops/metrics.h, since the process started), summed
 * over the workers (the latency over the calls its histogram counted). */
static void from_upstream_metrics(const agw_endpoint_board_src_t *src, size_t u, agw_endpoint_row_t *s)
{
    if (src == NULL || src->metrics == NULL || src->upstream_slot == NULL)
        return;
    static const int failed[] = {AGW_OUT_5XX, AGW_OUT_TIMEOUT, AGW_OUT_REFUSED, AGW_OUT_RESET, AGW_OUT_BAD_RESPONSE,
                                 AGW_OUT_TLS};
    uint32_t slot = src->upstream_slot[u];
    uint64_t started = 0, ended = 0, timed = 0, sum_us = 0;
    for (size_t w = 0; w < src->num_workers; w++) {
        const agw_upstream_metrics_t *m = &src->metrics[w]->upstreams[slot];
        started += __atomic_load_n(&m->started, __ATOMIC_RELAXED);
        ended += __atomic_load_n(&m->ended, __ATOMIC_RELAXED);
        sum_us += __atomic_load_n(&m->latency_sum_us, __ATOMIC_RELAXED);
        for (size_t k = 0; k <= AGW_M_CALL_BOUNDS; k++)
            timed += __atomic_load_n(&m->latency[k], __ATOMIC_RELAXED);
        for (size_t k = 0; k < sizeof(failed) / sizeof(failed[0]); k++)
            s->failures += __atomic_load_n(&m->outcomes[failed[k]], __ATOMIC_RELAXED);
    }
    s->calls = started;
    s->in_flight = started > ended ? started - ended : 0;
    s->answered = timed;
    s->latency_ms = sum_us / 1000;
}

/* Slot e's address now (dir, else as loaded) into text; returns its length (0: out of service). */
static socklen_t address_of(const agw_config_t *conf, agw_endpoint_dir_t *dir, size_t e, char *text, size_t len)
{
    struct sockaddr_storage addr = conf->eps[e].addr;
    socklen_t alen = conf->eps[e].addrlen;
    if (dir)
        agw_endpoint_dir_read(dir, e, &addr, &alen);
    agw_endpoint_address(&addr, alen, text, len);
    return alen;
}

/* 1 when slot e shares its URL with another slot (the addresses of one host name). */
static int shares_url(const agw_config_t *conf, size_t u, size_t e)
{
    for (size_t o = conf->ep_first[u]; o < conf->ep_first[u + 1]; o++)
        if (o != e && strcmp(conf->eps[o].url, conf->eps[e].url) == 0)
            return 1;
    return 0;
}

static const char *const health_names[] = {[AGW_HEALTH_UNCHECKED] = "null", [AGW_HEALTH_PASSING] = "\"passing\"",
                                           [AGW_HEALTH_FAILING] = "\"failing\""};

void agw_endpoint_board_json(const agw_endpoint_board_t *b, const agw_config_t *conf, const agw_endpoint_board_src_t *src,
                             uint64_t now_ms, agw_buf_t *out)
{
    agw_buf_append(out, "{\"upstreams\":[", 14);
    for (size_t u = 0; conf && u < conf->num_upstreams; u++) {
        size_t first = conf->ep_first[u], last = conf->ep_first[u + 1];
        agw_buf_append(out, u ? ",{\"name\":" : "{\"name\":", u ? 9 : 8);
        str(out, conf->upstreams[u].name);
        agw_buf_printf(out, ",\"group\":%s,\"endpoints\":[", last - first > 1 ? "true" : "false");
        int listed = 0;
        for (size_t e = first; e < last; e++) {
            agw_endpoint_row_t s;
            unsigned ejected;
            sum(b, e, now_ms, &s, &ejected);
            if (last - first == 1)
                from_upstream_metrics(src, u, &s);
            char addr[64];
            if (address_of(conf, src ? src->dir : NULL, e, addr, sizeof(addr)) == 0 && s.in_flight == 0)
                continue;
            agw_buf_printf(out, "%s{\"endpoint\":%zu,\"url\":", listed++ ? "," : "", e - first + 1);
            str(out, conf->eps[e].url);
            agw_buf_append(out, ",\"address\":", 11);
            str(out, addr);
            agw_buf_printf(out, ",\"state\":\"%s\",\"ejected_workers\":%u,\"unhealthy_workers\":%llu,\"ejected_until\":",
                           s.down ? "unhealthy" : ejected ? "ejected" : "healthy", ejected, (unsigned long long)s.down);
            seconds_or_null(out, s.ejected_until_ms);
            agw_buf_append(out, ",\"last_ejection\":", 17);
            seconds_or_null(out, s.last_ejected_ms);
            agw_buf_printf(out, ",\"health\":%s,\"probes\":%llu,\"probe_failures\":%llu",
                           health_names[s.health <= AGW_HEALTH_FAILING ? s.health : 0], (unsigned long long)s.probes,
                           (unsigned long long)s.probe_failures);
            agw_buf_printf(out, ",\"in_flight\":%llu,\"calls\":%llu,\"failures\":%llu,\"ejections\":%llu,\"sessions\":%llu",
                           (unsigned long long)s.in_flight, (unsigned long long)s.calls, (unsigned long long)s.failures,
                           (unsigned long long)s.ejections, (unsigned long long)s.sessions);
            if (s.answered)
                agw_buf_printf(out, ",\"mean_ms\":%.1f}", (double)s.latency_ms / (double)s.answered);
            else
                agw_buf_puts(out, ",\"mean_ms\":null}");
        }
        agw_buf_append(out, "]}", 2);
    }
    agw_buf_append(out, "]}\n", 3);
}

void agw_endpoint_board_metrics(const agw_endpoint_board_t *b, const agw_config_t *conf, agw_endpoint_dir_t *dir,
                                uint64_t now_ms, agw_buf_t *out)
{
    /* groups: every family; a health-checked one-endpoint upstream: the health families only */
    static const struct {
        const char *name, *type, *help;
        int health;
    } fam[] = {
        {"aggway_endpoint_calls_total", "counter", "Attempts sent to an endpoint of an upstream group (since the last reload).", 0},
        {"aggway_endpoint_failures_total", "counter", "Attempts on an endpoint that failed as the breaker counts failures.", 0},
        {"aggway_endpoint_ejections_total", "counter", "Outlier ejections of an endpoint.", 0},
        {"aggway_endpoint_sessions_total", "counter", "Sessions pinned to an endpoint (new, or moved to it).", 0},
        {"aggway_endpoint_answered_total", "counter", "Attempts on an endpoint that ended (answered or failed; not cancelled).", 0},
        {"aggway_endpoint_latency_seconds_total", "counter", "Durations of the attempts counted in aggway_endpoint_answered_total, added up.", 0},
        {"aggway_endpoint_in_flight", "gauge", "Attempts in flight on an endpoint.", 0},
        {"aggway_endpoint_ejected", "gauge", "Workers that have the endpoint ejected now.", 0},
        {"aggway_endpoint_health_probes_total", "counter", "Active health probes of an endpoint that ended (since the last reload).", 1},
        {"aggway_endpoint_health_probe_failures_total", "counter", "Active health probes of an endpoint that failed.", 1},
        {"aggway_endpoint_unhealthy", "gauge", "Workers whose health checks keep the endpoint out of service now.", 1},
        {"aggway_endpoint_health_failing", "gauge", "1 when some worker's health checks fail the endpoint, 0 when they pass it.", 1},
    };
    if (b == NULL || conf == NULL)
        return;
    for (size_t f = 0; f < sizeof(fam) / sizeof(fam[0]); f++) {
        int any = 0;
        for (size_t u = 0; u < conf->num_upstreams; u++) {
            size_t first = conf->ep_first[u], last = conf->ep_first[u + 1];
            if (fam[f].health ? !conf->upstreams[u].health_checked : last - first < 2)
                continue;
            if (!any)
                agw_prom_family(out, fam[f].name, fam[f].type, fam[f].help);
            any = 1;
            for (size_t e = first; e < last; e++) {
                agw_endpoint_row_t s;
                unsigned ejected;
                sum(b, e, now_ms, &s, &ejected);
                char addr[64], label[1024];
                if (address_of(conf, dir, e, addr, sizeof(addr)) == 0 && s.in_flight == 0)
                    continue;
                if (shares_url(conf, u, e))
                    snprintf(label, sizeof(label), "%s@%s", conf->eps[e].url, addr);
                else
                    snprintf(label, sizeof(label), "%s", conf->eps[e].url);
                double v[] = {(double)s.calls, (double)s.failures, (double)s.ejections, (double)s.sessions,
                              (double)s.answered, (double)s.latency_ms / 1000.0, (double)s.in_flight, ejected,
                              (double)s.probes, (double)s.probe_failures, (double)s.down,
                              s.health == AGW_HEALTH_FAILING ? 1.0 : 0.0};
                agw_prom_label_t l[2] = {AGW_PROM_LABEL("upstream", conf->upstreams[u].name),
                                         AGW_PROM_LABEL("endpoint", label)};
                agw_prom_sample(out, fam[f].name, l, 2, v[f]);
            }
        }
    }
    if (dir == NULL || dir->num_names == 0)
        return;
    agw_prom_family(out, "aggway_resolve_failures_total", "counter",
                    "Re-resolutions of an endpoint host name that failed (its last addresses were kept).");
    for (int pass = 0; pass < 2; pass++) {
        if (pass == 1)
            agw_prom_family(out, "aggway_resolve_failing", "gauge",
                            "1 while the last re-resolution of an endpoint host name failed.");
        for (size_t k = 0; k < dir->num_names; k++) {
            const agw_ep_name_t *nm = &dir->names[k];
            size_t u = 0;
            while (u + 1 < conf->num_upstreams && conf->ep_first[u + 1] <= nm->first)
                u++;
            agw_prom_label_t l[2] = {AGW_PROM_LABEL("upstream", conf->upstreams[u].name), AGW_PROM_LABEL("host", nm->host)};
            double v = pass == 0 ? (double)__atomic_load_n(&dir->failures[k], __ATOMIC_RELAXED)
                                 : (double)__atomic_load_n(&dir->failing[k], __ATOMIC_RELAXED);
            agw_prom_sample(out, pass == 0 ? "aggway_resolve_failures_total" : "aggway_resolve_failing", l, 2, v);
        }
    }
}
