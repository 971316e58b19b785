/* generation.c: generations of the scripts folder and the reload record (see generation.h). */
#include "worker/generation.h"

#include "base/mem.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>

#include "json/json.h"

static uint64_t live_generations;

static int same_str(const char *a, const char *b)
{
    return (a == NULL && b == NULL) || (a && b && strcmp(a, b) == 0);
}

/* Line of gateway.lua where `key =` first appears (1 when it does not: the setting was removed). */
static int key_line(const char *dir, const char *key)
{
    char path[4096];
    snprintf(path, sizeof(path), "%s/gateway.lua", dir);
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return 1;
    char line[4096];
    size_t klen = strlen(key);
    int n = 0, found = 0;
    while (!found && fgets(line, sizeof(line), f)) {
        n++;
        for (const char *p = strstr(line, key); p && !found; p = strstr(p + 1, key)) {
            const char *q = p + klen;
            while (*q == ' ' || *q == '\t')
                q++;
            int starts = p == line || !(p[-1] == '_' || (p[-1] >= 'a' && p[-1] <= 'z'));
            found = starts && *q == '=' && q[1] != '=';
        }
    }
    fclose(f);
    return found ? n : 1;
}

/* The listening sockets are made once: the same ports and hosts in the same order, each with TLS
 * on or off as before. A TLS listener's cert and key (paths and contents) are the generation's own
 * and may change: workers take the new SSL_CTX when they switch. */
static int same_listeners(const agw_config_t *a, const agw_config_t *b)
{
    if (a->num_listen != b->num_listen)
        return 0;
    for (size_t i = 0; i < a->num_listen; i++) {
        const agw_listen_conf_t *x = &a->listen[i], *y = &b->listen[i];
        if (x->port != y->port || !same_str(x->host, y->host) || (x->cert_file == NULL) != (y->cert_file == NULL) ||
            x->reuse_port != y->reuse_port)
            return 0;
    }
    return 1;
}

/* Settings made into sockets, threads (the trace exporter's too) and h2o's shared configuration
 * at start-up: a reload that changes one fails (applying the rest would serve a generation that is
 * not what the folder says). */
static int check_restart_only(const agw_config_t *prev, const agw_config_t *next, agw_buf_t *errors)
{
    static const char hint[] = "this needs a restart (a reload cannot apply it); the running generation keeps "
                               "serving";
    int rc = 0;
#define CHANGED(key, what)                                                                                       \
    do {                                                                                                         \
        agw_buf_printf(errors, "%s/gateway.lua:%d: %s: %s changed; %s\n", next->dir, key_line(next->dir, key), key, \
                       what, hint);                                                                              \
        rc = -1;                                                                                                 \
    } while (0)
    if (!same_listeners(prev, next))
        CHANGED("listen", "the listeners (ports, hosts, reuse_port, or TLS turned on or off)");
    if (prev->workers != next->workers)
        CHANGED("workers", "the number of worker threads");
    if (prev->admin_port != next->admin_port || !same_str(prev->admin_host, next->admin_host) ||
        !same_str(prev->admin_allowed_hosts, next->admin_allowed_hosts))
        CHANGED("admin", "the admin listener");
    if (!same_str(prev->access_log, next->access_log))
        CHANGED("access_log", "the access log file");
    if (prev->max_request_body_bytes != next->max_request_body_bytes)
        CHANGED("max_request_body_bytes", "the request body limit");
    if (!same_str(prev->otlp_url, next->otlp_url) || !same_str(prev->otlp_service_name, next->otlp_service_name) ||
        prev->otlp_timeout_ms != next->otlp_timeout_ms)
        CHANGED("tracing", "the trace exporter (otlp_http, service_name, timeout_ms)");
    if (prev->limits.local_keys != next->limits.local_keys)
        CHANGED("limits", "limits.local_keys (the size of the process's table of counts)");
#undef CHANGED
    return rc;
}

/* Breakers of upstreams that did not change carry their state (open, counts) into next. */
static void adopt_breakers(const agw_config_t *prev, agw_config_t *next)
{
    for (size_t i = 0; i < next->num_upstreams; i++) {
        const agw_upstream_conf_t *u = &next->upstreams[i];
        for (size_t j = 0; j < prev->num_upstreams; j++) {
            const agw_upstream_conf_t *p = &prev->upstreams[j];
            agw_breaker_t *a = prev->breakers[j], *b = next->breakers[i];
            if (strcmp(u->name, p->name) != 0)
                continue;
            if (same_str(u->url, p->url) && a->failures == b->failures && a->open_ms == b->open_ms &&
                a->probes == b->probes) {
                next->breakers[i] = agw_breaker_ref(a);
                agw_breaker_unref(b);
            }
            break;
        }
    }
}

agw_generation_t *agw_generation_load(const char *dir, uint64_t number, const agw_generation_t *prev,
                                      agw_metric_labels_t *labels, agw_buf_t *errors)
{
    agw_generation_t *g = agw_calloc(1, sizeof(*g));
    if (agw_config_load(dir, &g->conf, errors) != 0) {
        free(g);
        return NULL;
    }
    agw_auth_start(&g->conf.auth); /* a jwks_url's first fetch, off the request path */
    g->number = number;
    g->refs = 1;
    g->route_slot = agw_calloc(g->conf.num_endpoints + 2, sizeof(*g->route_slot));
    g->upstream_slot = agw_calloc(g->conf.num_upstreams ? g->conf.num_upstreams : 1, sizeof(*g->upstream_slot));
    g->board = agw_endpoint_board_new(g->conf.workers, g->conf.ep_first[g->conf.num_upstreams]);
    g->dir = agw_endpoint_dir_new(g->conf.eps, g->conf.ep_first[g->conf.num_upstreams], g->conf.names, g->conf.num_names);
    __atomic_add_fetch(&live_generations, 1, __ATOMIC_RELAXED);
    if ((prev && check_restart_only(&prev->conf, &g->conf, errors) != 0) ||
        agw_metric_labels_map(labels, &g->conf, g->route_slot, g->upstream_slot, errors) != 0) {
        agw_generation_unref(g);
        return NULL;
    }
    if (prev)
        adopt_breakers(&prev->conf, &g->conf);
    return g;
}

agw_generation_t *agw_generation_ref(agw_generation_t *g)
{
    __atomic_add_fetch(&g->refs, 1, __ATOMIC_RELAXED);
    return g;
}

void agw_generation_unref(agw_generation_t *g)
{
    if (g == NULL || __atomic_sub_fetch(&g->refs, 1, __ATOMIC_ACQ_REL) != 0)
        return;
    agw_config_free(&g->conf);
    agw_endpoint_board_free(g->board);
    agw_endpoint_dir_free(g->dir);
    free(g->route_slot);
    free(g->upstream_slot);
    free(g);
    __atomic_sub_fetch(&live_generations, 1, __ATOMIC_RELAXED);
}

uint64_t agw_generation_live(void)
{
    return __atomic_load_n(&live_generations, __ATOMIC_RELAXED);
}

/* ---- the reload record ------------------------------------------------------------------------ */

static double wall_now(void)
{
    struct timeval tv;
    gettimeofday(&tv, NULL);
    return (double)tv.tv_sec + (double)tv.tv_usec / 1e6;
}

void agw_reload_state_init(agw_reload_state_t *st)
{
    memset(st, 0, sizeof(*st));
    pthread_mutex_init(&st->lock, NULL);
    st->last_ok = 1;
}

void agw_reload_state_destroy(agw_reload_state_t *st)
{
    agw_generation_unref(st->current);
    free(st->last_errors);
    pthread_mutex_destroy(&st->lock);
    memset(st, 0, sizeof(*st));
}

agw_generation_t *agw_reload_state_current(agw_reload_state_t *st)
{
    pthread_mutex_lock(&st->lock);
    agw_generation_t *g = st->current ? agw_generation_ref(st->current) : NULL;
    pthread_mutex_unlock(&st->lock);
    return g;
}

void agw_reload_state_serving(agw_reload_state_t *st, agw_generation_t *gen, int reloaded)
{
    agw_generation_ref(gen);
    pthread_mutex_lock(&st->lock);
    agw_generation_t *old = st->current;
    st->current = gen;
    if (reloaded) {
        st->reloads++;
        st->last_ok = 1;
        st->last_time = wall_now();
        free(st->last_errors);
        st->last_errors = NULL;
    }
    pthread_mutex_unlock(&st->lock);
    agw_generation_unref(old);
}

void agw_reload_state_failed(agw_reload_state_t *st, const char *errors)
{
    char *copy = agw_strdup(errors ? errors : "");
    pthread_mutex_lock(&st->lock);
    st->failures++;
    st->last_ok = 0;
    st->last_time = wall_now();
    free(st->last_errors);
    st->last_errors = copy;
    pthread_mutex_unlock(&st->lock);
}

void agw_reload_state_metrics(agw_reload_state_t *st, agw_metrics_process_t *p)
{
    pthread_mutex_lock(&st->lock);
    p->generation = st->current ? st->current->number : 0;
    p->reloads = st->reloads;
    p->reload_failures = st->failures;
    p->last_reload_ok = st->last_ok;
    p->last_reload_time = st->last_time;
    pthread_mutex_unlock(&st->lock);
    p->generations_live = agw_generation_live();
}

void agw_reload_state_json(agw_reload_state_t *st, agw_buf_t *b)
{
    pthread_mutex_lock(&st->lock);
    agw_buf_printf(b,
                   "{\"generation\":%llu,\"generations_live\":%llu,\"reloads\":%llu,\"failures\":%llu,"
                   "\"last_reload\":",
                   (unsigned long long)(st->current ? st->current->number : 0),
                   (unsigned long long)agw_generation_live(), (unsigned long long)st->reloads,
                   (unsigned long long)st->failures);
    if (st->last_time == 0) {
        agw_buf_puts(b, "null}\n");
        pthread_mutex_unlock(&st->lock);
        return;
    }
    agw_buf_printf(b, "{\"ok\":%s,\"time\":%.3f,\"errors\":[", st->last_ok ? "true" : "false", st->last_time);
    const char *p = st->last_errors;
    int first = 1;
    while (p && *p) {
        const char *eol = strchr(p, '\n');
        size_t len = eol ? (size_t)(eol - p) : strlen(p);
        if (len) {
            if (!first)
                agw_buf_putc(b, ',');
            agw_buf_puts(b, "\n  ");
            /* not UTF-8 (a file name): say so rather than fail */
            agw_json_encode_string_or(b, p, len, "\"(message not valid UTF-8)\"");
            first = 0;
        }
        p = eol ? eol + 1 : p + len;
    }
    agw_buf_puts(b, first ? "]}}\n" : "\n]}}\n");
    pthread_mutex_unlock(&st->lock);
}
