/* admin.c: the admin listener (see admin.h). */
#include "front/admin.h"

#include "base/header.h"
#include "base/heap.h"
#include "base/mem.h"

#include <h2o/linklist.h>
#include <h2o/memory.h>

#include <errno.h>
#include <ev.h>
#include <arpa/inet.h>
#include <netdb.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include "json/json.h"
#include "base/log.h"
#include "front/server.h"
#include "ops/waterfall.h"
#include "limits/limit.h"
#include "limits/limit_seen.h"

#define ADMIN_MAX_CONNS 64
#define ADMIN_MAX_REQUEST 8192
#define ADMIN_TIMEOUT_S 10.0
/* The admin loop is made anew when it goes idle after a connection whose descriptor was at least
 * this: libev keeps arrays indexed by descriptor (16 bytes each, grown by doubling) at the highest
 * one it watched until its loop ends, and a scrape during a burst of 20,000 connections gets a
 * descriptor near 20,000 (634,848 bytes kept for good). Below it, at most about 32 KB is kept. */
#define ADMIN_LOOP_KEEP_FDS 1024

typedef struct aconn aconn_t;

struct agw_admin {
    agw_reload_state_t *gens;  /* the generation serving and the reload record */
    const agw_metric_labels_t *labels;
    agw_metrics_t *const *metrics;
    size_t num_workers;
    int ready;                 /* read and written with atomics */
    double start_time;
    int fd;
    pthread_t thread;
    struct ev_loop *loop;      /* replaced by the admin thread only (remake_loop) */
    int stopping;              /* set by agw_admin_stop before it signals stop_fd (atomics) */
    int max_fd;                /* the highest descriptor accepted since the loop was made */
    unsigned loops_made;       /* how many times it was made anew (atomics; agw_admin_loops_made) */
    unsigned loops_failed;     /* how many times no new loop could be made (atomics; agw_admin_loops_failed) */
    int failing;               /* the last remake failed: its warning is logged, the next one's is not */
    unsigned idle_spells;      /* how many times the last connection closed (atomics; agw_admin_idle_spells) */
    ev_io accept_io;
    ev_timer accept_pause;     /* accept_io stopped for want of descriptors: restarts it */
    int stop_fd;               /* an eventfd of the admin's whole life, written by agw_admin_stop: unlike an
                                * ev_async (its loop's), a signal sent while the loop is made anew stays */
    ev_io stop_io;             /* stop_fd readable: ev_break */
    h2o_linklist_t conns;      /* open connections (aconn_t.link), newest first */
    unsigned num_conns;
    unsigned evicted;          /* connections closed unanswered to make room (atomics; agw_admin_evicted) */
    char *allowed_hosts;       /* admin.allowed_hosts: lowercase names, one space between; NULL: none */
    struct purge_job *purge;   /* the cache purge whose Redis part runs now (admin thread); NULL: none */
};

struct aconn {
    agw_admin_t *a;
    h2o_linklist_t link;       /* on a->conns */
    int fd;
    ev_io io;
    ev_timer timer;
    char in[ADMIN_MAX_REQUEST];
    size_t inlen;
    agw_buf_t out;
    size_t outoff;
    int waiting;               /* its answer waits for the purge's thread (never evicted, no timeout) */
};

/* A cache purge's Redis part (POST /cache/purge), on a thread of its own: SCAN and UNLINK may take
 * up to AGW_CACHE_PURGE_BUDGET_S, and the listener answers the probes meanwhile (an attack review:
 * a purge held /readyz and /healthz for 30 s, long enough for an orchestrator to restart the
 * process). One at a time; the connection that asked waits for its answer. */
typedef struct purge_job {
    agw_admin_t *a;
    aconn_t *c;                /* the connection it answers */
    agw_generation_t *gen;     /* held: its redis settings */
    char prefix[1024];
    size_t n;
    agw_buf_t body;            /* the answer's body up to the Redis part */
    pthread_t thread;
    int fd;                    /* eventfd the thread writes when it is done */
    ev_io io;                  /* fd readable: the answer goes out (admin loop) */
    int cancel;                /* set by agw_admin_stop (atomics): the purge stops at its next read */
    int rc;                    /* the thread's: agw_cache_redis_purge's result, count and message */
    uint64_t deleted;
    char err[256];
} purge_job_t;

/* Whether the loop is to be made anew now: idle, after a connection on a high descriptor. */
static int remake_due(const agw_admin_t *a)
{
    return a->num_conns == 0 && a->max_fd >= ADMIN_LOOP_KEEP_FDS;
}

static void conn_close(aconn_t *c)
{
    agw_admin_t *a = c->a;
    ev_io_stop(a->loop, &c->io);
    ev_timer_stop(a->loop, &c->timer);
    close(c->fd);
    h2o_linklist_unlink(&c->link);
    a->num_conns--;
    agw_buf_free(&c->out);
    free(c);
    if (a->num_conns == 0) {
        /* the thread sleeps until the next request: what its cache of freed blocks holds (a
         * /metrics text's) goes back to the slabs the background threads purge */
        agw_heap_thread_flush();
        __atomic_add_fetch(&a->idle_spells, 1, __ATOMIC_RELEASE);
        if (remake_due(a))
            ev_break(a->loop, EVBREAK_ALL);
    }
}

/* How many fields named name (lowercase) the header block h has (len bytes: field lines, each
 * ending in LF or CRLF), in any case; the first one's value, without the whitespace around it, goes
 * to *value and *vlen (when there is one and value is not NULL). */
static int count_field(const char *h, size_t len, const char *name, const char **value, size_t *vlen)
{
    size_t nl = strlen(name);
    int n = 0;
    for (const char *p = h, *e = h + len; p < e;) {
        const char *lf = memchr(p, '\n', (size_t)(e - p));
        size_t ll = lf ? (size_t)(lf - p) : (size_t)(e - p);
        if (ll > nl && p[nl] == ':' && strncasecmp(p, name, nl) == 0 && n++ == 0 && value) {
            *value = p + nl + 1;
            *vlen = ll - nl - 1 - (p[ll - 1] == '\r'); /* (a CRLF line's CR is not the value's) */
            agw_header_trim_ows(value, vlen);
        }
        p += ll + 1;
    }
    return n;
}

/* Whether Host value v (n bytes) names this listener: host [":" port], the host an IPv4 address, an
 * IPv6 address in brackets, localhost, or one of admin.allowed_hosts (in any case); the port is not
 * compared. A name that resolves to the listener's address is not enough: DNS rebinding makes an
 * attacker's name resolve to 127.0.0.1, and a page of that name could then read the admin's answers
 * from the operator's browser (RFC 9110 §7.4: a request for a host the server does not serve). */
static int host_admitted(const agw_admin_t *a, const char *v, size_t n)
{
    size_t hl = n;
    char buf[256];
    /* only what a host and port are made of (RFC 9110 §7.2): a NUL, whitespace or anything else
     * would make the comparisons below read a part of the value as the whole */
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)v[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '.' ||
              c == ':' || c == '[' || c == ']' || c == '_'))
            return 0;
    }
    if (n > 0 && v[0] == '[') {
        const char *rb = memchr(v, ']', n);
        if (rb == NULL)
            return 0;
        hl = (size_t)(rb - v) + 1;
    } else {
        const char *colon = memchr(v, ':', n);
        if (colon)
            hl = (size_t)(colon - v);
    }
    if (hl < n) { /* ":" port, 1 to 5 digits */
        if (v[hl] != ':' || n - hl - 1 == 0 || n - hl - 1 > 5)
            return 0;
        for (size_t i = hl + 1; i < n; i++)
            if (v[i] < '0' || v[i] > '9')
                return 0;
    }
    if (hl == 0 || hl >= sizeof(buf))
        return 0;
    unsigned char addr[16];
    if (v[0] == '[') {
        memcpy(buf, v + 1, hl - 2);
        buf[hl - 2] = '\0';
        return inet_pton(AF_INET6, buf, addr) == 1;
    }
    if (hl > 1 && v[hl - 1] == '.') /* a fully qualified name's root dot ("localhost.") */
        hl--;
    memcpy(buf, v, hl);
    buf[hl] = '\0';
    if (inet_pton(AF_INET, buf, addr) == 1 || strcasecmp(buf, "localhost") == 0)
        return 1;
    for (const char *p = a->allowed_hosts; p && *p;) {
        const char *sp = strchr(p, ' ');
        size_t l = sp ? (size_t)(sp - p) : strlen(p);
        size_t cl = l > 1 && p[l - 1] == '.' ? l - 1 : l; /* (a name listed with its root dot) */
        if (cl == hl && strncasecmp(p, buf, hl) == 0)
            return 1;
        p += l + (sp != NULL);
    }
    return 0;
}

static void respond(agw_buf_t *out, int status, const char *reason, const char *type, const char *body, size_t len,
                    int head, const char *extra_headers)
{
    agw_buf_printf(out,
                   "HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\nCache-Control: no-store\r\n"
                   "Connection: close\r\n%s\r\n",
                   status, reason, type, len, extra_headers ? extra_headers : "");
    if (!head)
        agw_buf_append(out, body, len);
}

static void routes_json(const agw_generation_t *gen, agw_buf_t *b)
{
    static const agw_config_t none;
    const agw_config_t *conf = gen ? &gen->conf : &none;
    agw_buf_putc(b, '[');
    for (size_t i = 0; i < conf->num_endpoints; i++) {
        const agw_endpoint_info_t *e = &conf->endpoints[i];
        if (i)
            agw_buf_putc(b, ',');
        agw_buf_puts(b, "\n  {\"route\":");
        const char *vals[3] = {e->route, e->method, e->file};
        const char *names[3] = {"route", "method", "script"};
        for (int k = 0; k < 3; k++) {
            if (k)
                agw_buf_printf(b, ",\"%s\":", names[k]);
            const char *v = vals[k] ? vals[k] : "";
            agw_json_encode_string_or(b, v, strlen(v), "null");
        }
        agw_buf_printf(b, ",\"generation\":%llu}", (unsigned long long)gen->number);
    }
    if (conf->batch_route) { /* the batch endpoint (gateway.lua batch): served, though no script's */
        if (conf->num_endpoints)
            agw_buf_putc(b, ',');
        agw_buf_puts(b, "\n  {\"route\":");
        agw_json_encode_string_or(b, conf->batch_route, strlen(conf->batch_route), "null");
        agw_buf_printf(b, ",\"method\":\"POST\",\"script\":null,\"batch\":true,\"generation\":%llu}",
                       (unsigned long long)gen->number);
    }
    agw_buf_puts(b, conf->num_endpoints || conf->batch_route ? "\n]\n" : "]\n");
}

/* The wall clock in ms since the Unix epoch (the workers' ev_now is the same clock). */
static uint64_t now_ms(void)
{
    struct timeval tv;
    gettimeofday(&tv, NULL);
    return (uint64_t)tv.tv_sec * 1000 + (uint64_t)tv.tv_usec / 1000;
}

/* Finds name=value in a query string; returns the value (*len set) or NULL. */
static const char *query_param(const char *q, size_t qlen, const char *name, size_t *len)
{
    size_t nl = strlen(name);
    const char *p = q, *end = q + qlen;
    while (p < end) {
        const char *amp = memchr(p, '&', (size_t)(end - p));
        const char *pend = amp ? amp : end;
        if ((size_t)(pend - p) > nl && memcmp(p, name, nl) == 0 && p[nl] == '=') {
            *len = (size_t)(pend - p - nl - 1);
            return p + nl + 1;
        }
        p = amp ? amp + 1 : end;
    }
    return NULL;
}

/* s (n bytes) as a JSON string, or null when it is not valid UTF-8. */
static void json_str(agw_buf_t *b, const char *s, size_t n)
{
    size_t mark = b->len;
    if (agw_json_encode_string(b, s, n) != 0) {
        b->len = mark;
        agw_buf_puts(b, "null");
    }
}

/* POST /cache/purge?prefix=agw:… : the prefix (percent-decoded) goes to every worker's inbox
 * (tier 1, applied within a second) and is deleted from Redis when the generation serving has a
 * redis block with cache.redis on (cache/purge.h). */
/* The query parameter name of q, percent-decoded ('+' is a space) into out (cap bytes, NUL
 * terminated; a value longer than cap - 1 is cut, a bad escape ends it). Returns its length (0 when
 * absent). */
static size_t query_param_decoded(const char *q, size_t qlen, const char *name, char *out, size_t cap)
{
    size_t vl = 0;
    const char *v = q ? query_param(q, qlen, name, &vl) : NULL;
    size_t n = 0;
    for (size_t i = 0; v && i < vl && n < cap - 1; i++) {
        if (v[i] == '%' && i + 2 < vl) {
            char hex[3] = {v[i + 1], v[i + 2], 0};
            char *end;
            long c = strtol(hex, &end, 16);
            if (end != hex + 2)
                break;
            out[n++] = (char)c;
            i += 2;
        } else {
            out[n++] = v[i] == '+' ? ' ' : v[i];
        }
    }
    out[n] = '\0';
    return n;
}

/* The answer of a purge whose Redis part ended (rc, deleted, err) into out, body its start. */
static void purge_answer(agw_buf_t *body, int rc, uint64_t deleted, const char *err, agw_buf_t *out)
{
    int status = 200;
    if (rc == 0) {
        agw_buf_printf(body, ",\"redis_deleted\":%llu", (unsigned long long)deleted);
    } else {
        status = 502;
        agw_buf_puts(body, ",\"redis_error\":");
        json_str(body, err, strlen(err));
        agw_log(AGW_LOG_WARN, "POST /cache/purge: %s", err);
    }
    agw_buf_puts(body, "}\n");
    respond(out, status, status == 200 ? "OK" : "Bad Gateway", "application/json", body->base, body->len, 0, NULL);
}

static void purge_job_free(purge_job_t *j)
{
    agw_generation_unref(j->gen);
    agw_buf_free(&j->body);
    close(j->fd);
    free(j);
}

/* Purges the Redis of gen of the entries prefix (n bytes) names (agw_cache_redis_purge): "agw:",
 * every cache entry, is the keys "agw:{…", so that the limits' counts ("agw:rl:…") stay. */
static int redis_purge(const agw_generation_t *gen, const char *prefix, size_t n, const int *cancel,
                       uint64_t *deleted, char *err, size_t errlen)
{
    int every = n == 4;
    return agw_cache_redis_purge(&gen->conf.redis, every ? "agw:{" : prefix, every ? 5 : n, cancel, deleted, err,
                                 errlen);
}

static void *purge_main(void *arg)
{
    purge_job_t *j = arg;
    j->rc = redis_purge(j->gen, j->prefix, j->n, &j->cancel, &j->deleted, j->err, sizeof(j->err));
    uint64_t one = 1;
    while (write(j->fd, &one, sizeof(one)) < 0 && errno == EINTR)
        ;
    return NULL;
}

/* The purge's thread is done: its connection gets the answer. */
static void on_purge_done(struct ev_loop *loop, ev_io *io, int revents)
{
    (void)revents;
    purge_job_t *j = io->data;
    agw_admin_t *a = j->a;
    uint64_t v;
    if (read(j->fd, &v, sizeof(v)) < 0 && (errno == EAGAIN || errno == EINTR))
        return;
    ev_io_stop(loop, io);
    pthread_join(j->thread, NULL);
    aconn_t *c = j->c;
    purge_answer(&j->body, j->rc, j->deleted, j->err, &c->out);
    a->purge = NULL;
    purge_job_free(j);
    c->waiting = 0;
    ev_io_set(&c->io, c->fd, EV_WRITE);
    ev_io_start(loop, &c->io);
    ev_timer_set(&c->timer, ADMIN_TIMEOUT_S, 0.);
    ev_timer_start(loop, &c->timer);
}

/* Stops the purge in progress, if any, and waits for its thread (agw_admin_stop: at most a read's
 * timeout). Its connection is closed with the others, unanswered. */
static void purge_stop(agw_admin_t *a)
{
    purge_job_t *j = a->purge;
    if (j == NULL)
        return;
    __atomic_store_n(&j->cancel, 1, __ATOMIC_RELEASE);
    pthread_join(j->thread, NULL);
    ev_io_stop(a->loop, &j->io);
    a->purge = NULL;
    purge_job_free(j);
}

/* POST /cache/purge?prefix=…: every worker's tier 1 at once, Redis's on a thread of its own when c
 * can wait for it (returns 1: c is answered later), else here (c NULL: agw_admin_respond's callers). */
static int cache_purge(agw_admin_t *a, aconn_t *c, const char *q, size_t qlen, agw_buf_t *out)
{
    char prefix[1024];
    size_t n = query_param_decoded(q, qlen, "prefix", prefix, sizeof(prefix));
    /* cache keys are "agw:{upstream}:…" (lua/agg/cache.lua); other keys of the gateway's in Redis
     * (the rate limits' and quotas' counts, "agw:rl:…") are no cache entries: "agw:" alone means
     * every cache entry, and a longer prefix must be a cache key's */
    int every = n == 4;
    if (n < 4 || memcmp(prefix, "agw:", 4) != 0 || (!every && prefix[4] != '{') || memchr(prefix, '\0', n)) {
        static const char body[] = "prefix must be agw: (every cache entry) or a cache key prefix starting with agw:{ "
                                   "(e.g. prefix=agw:%7Bproduct%7D)\n";
        respond(out, 400, "Bad Request", "text/plain; charset=utf-8", body, sizeof(body) - 1, 0, NULL);
        return 0;
    }
    agw_generation_t *gen = agw_reload_state_current(a->gens);
    if (gen == NULL) {
        /* (no generation serves yet: neither the workers nor Redis would be purged) */
        static const char body[] = "the gateway is starting: nothing was purged; try again when /readyz says ready\n";
        respond(out, 503, "Service Unavailable", "text/plain; charset=utf-8", body, sizeof(body) - 1, 0,
                "Retry-After: 1\r\n");
        return 0;
    }
    int redis = gen->conf.cache_redis;
    if (redis && a->purge) {
        /* (before the workers are asked: a purge refused here purges nothing) */
        static const char body[] = "a cache purge is running: try again when it has ended\n";
        respond(out, 409, "Conflict", "text/plain; charset=utf-8", body, sizeof(body) - 1, 0, "Retry-After: 5\r\n");
        agw_generation_unref(gen);
        return 0;
    }
    for (size_t i = 0; i < a->num_workers; i++)
        agw_cache_inbox_post(&a->metrics[i]->purge, prefix, n);
    agw_buf_t body = AGW_BUF_INIT;
    agw_buf_puts(&body, "{\"prefix\":");
    json_str(&body, prefix, n);
    agw_buf_printf(&body, ",\"workers\":%zu", a->num_workers);
    if (!redis) {
        agw_generation_unref(gen);
        agw_buf_puts(&body, "}\n");
        respond(out, 200, "OK", "application/json", body.base, body.len, 0, NULL);
        agw_buf_free(&body);
        return 0;
    }
    if (c != NULL) {
        purge_job_t *j = agw_calloc(1, sizeof(*j));
        j->a = a, j->c = c, j->gen = gen, j->body = body, j->n = n;
        memcpy(j->prefix, prefix, n + 1);
        j->fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
        if (j->fd >= 0 && pthread_create(&j->thread, NULL, purge_main, j) == 0) {
            ev_io_init(&j->io, on_purge_done, j->fd, EV_READ);
            j->io.data = j;
            ev_io_start(a->loop, &j->io);
            a->purge = j;
            return 1;
        }
        /* no descriptor or thread to spare: the purge runs here, as it did before it had one */
        if (j->fd >= 0)
            close(j->fd);
        free(j);
    }
    uint64_t deleted = 0;
    char err[256];
    int rc = redis_purge(gen, prefix, n, NULL, &deleted, err, sizeof(err));
    agw_generation_unref(gen);
    purge_answer(&body, rc, deleted, err, out);
    agw_buf_free(&body);
    return 0;
}

/* The body of /limits for a Redis rule after its "rule" and "key": what this process knows of the key
 * (limits/limit_seen.h), never a count of its own presented as the cluster's: the last answer Redis
 * gave it for the key (null when none is kept), Redis's state for the limits checks, and only during
 * an outage, for on_redis_error = "local", the process's own count, named as such. */
static void redis_rule_page(agw_admin_t *a, const agw_limit_rule_t *r, uint64_t h, uint64_t now_ms, agw_buf_t *body)
{
    agw_limit_store_t *store = a->metrics[0]->limits;
    agw_limit_seen_t *seen = agw_limit_store_seen(store);
    static const char *const fallbacks[] = {"local", "allow", "deny"};
    agw_limit_result_t pol;
    agw_limit_policy(r, now_ms, &pol);
    agw_buf_printf(body, ",\"kind\":\"%s\",\"store\":\"redis\",\"limit\":%llu,\"window_s\":%llu,"
                         "\"on_redis_error\":\"%s\",\"last_answer\":",
                   r->is_quota ? "quota" : "rate", (unsigned long long)pol.limit, (unsigned long long)pol.window_s,
                   fallbacks[r->on_redis_error]);
    agw_limit_seen_answer_t ans;
    if (agw_limit_seen_get(seen, h, &ans)) {
        agw_buf_printf(body, "{\"allowed\":%s,\"remaining\":%llu,\"reset_at_ms\":%llu,\"at_ms\":%llu,\"age_ms\":%llu}",
                       ans.allowed ? "true" : "false", (unsigned long long)ans.remaining,
                       (unsigned long long)ans.reset_at_ms, (unsigned long long)ans.at_ms,
                       (unsigned long long)(now_ms > ans.at_ms ? now_ms - ans.at_ms : 0));
    } else {
        agw_buf_puts(body, "null");
    }
    agw_limit_outage_t o;
    agw_limit_seen_outage(seen, &o);
    uint64_t connected = 0;
    for (size_t i = 0; i < a->num_workers; i++)
        connected += __atomic_load_n(&a->metrics[i]->redis.up, __ATOMIC_RELAXED);
    agw_buf_printf(body, ",\"redis\":{\"answering\":%s,\"workers_connected\":%llu,\"workers\":%zu,"
                         "\"workers_failing\":%u,\"outage_since_ms\":",
                   o.down ? "false" : "true", (unsigned long long)connected, a->num_workers, o.failing);
    if (o.down)
        agw_buf_printf(body, "%llu", (unsigned long long)o.since_ms);
    else
        agw_buf_puts(body, "null");
    agw_buf_printf(body, ",\"outage_fallbacks\":%llu,\"fallbacks_total\":%llu,\"outages\":%llu}",
                   (unsigned long long)o.fallbacks, (unsigned long long)o.fallbacks_total,
                   (unsigned long long)o.outages);
    if (o.down && r->on_redis_error == AGW_LIMIT_FALLBACK_LOCAL) {
        agw_limit_result_t res;
        agw_limit_peek(store, r, h, now_ms, &res);
        agw_buf_printf(body, ",\"process_fallback_count\":{\"remaining\":%llu,\"reset_ms\":%llu}",
                       (unsigned long long)res.remaining, (unsigned long long)res.reset_ms);
    }
    if (r->before_auth && !r->is_quota) { /* the refusals this process charged it, which refuse an
                                            address before the edge (worker_internal.h) */
        agw_limit_result_t res;
        agw_limit_peek_next(store, r, h ^ AGW_LIMIT_SHADOW_SALT, now_ms, &res);
        agw_buf_printf(body, ",\"shadow\":{\"remaining\":%llu,\"reset_ms\":%llu}", (unsigned long long)res.remaining,
                       (unsigned long long)res.reset_ms);
    }
    agw_buf_puts(body, "}\n");
}

/* /readyz's Redis condition: when the generation serving uses Redis (a limits rule with store =
 * "redis", or the cache's tier 2), every worker's client must have had its connection ready
 * (redis/redis.h: connected, AUTH and SELECT done) at least once since start-up; a check made
 * before that never reaches Redis and is decided by on_redis_error. A later outage leaves /readyz
 * as it is: every gateway shares the Redis, so taking them all out of rotation would turn an
 * outage the rules' on_redis_error handles into a total one (/limits and the metrics show it).
 * Returns 1 and writes the reason into why (NULL: none wanted) when not ready. */
static int redis_not_ready(agw_admin_t *a, agw_buf_t *why)
{
    agw_generation_t *gen = agw_reload_state_current(a->gens);
    const agw_config_t *conf = gen ? &gen->conf : NULL;
    int limits = conf && conf->redis.host && conf->limits.num_redis > 0;
    int cache = conf && conf->redis.host && conf->cache_redis;
    size_t connected = 0;
    for (size_t i = 0; a->metrics && i < a->num_workers; i++)
        connected += AGW_M_GET(a->metrics[i]->redis.connects) > 0;
    int not_ready = (limits || cache) && connected < a->num_workers;
    if (not_ready && why)
        agw_buf_printf(why, "not ready: the Redis connection (%s port %d) is ready in %zu of %zu workers; %s%s%s wait "
                            "for it\n",
                       conf->redis.host, conf->redis.port, connected, a->num_workers,
                       limits ? "limits rules with store = \"redis\"" : "", limits && cache ? " and " : "",
                       cache ? "the cache's tier 2" : "");
    agw_generation_unref(gen);
    return not_ready;
}

/* GET /limits?rule=NAME&key=VALUE: what the rule of the generation serving says of that key now
 * (a local rule: limits/limit.h, agw_limit_peek; a Redis rule: redis_rule_page; nothing is counted).
 * key: the client's address for "ip" rules, the route pattern for "route" rules, the header's value
 * for header rules. 400 names the rules. */
static void limits_page(agw_admin_t *a, const char *q, size_t qlen, int head, agw_buf_t *out)
{
    char name[128], key[1024];
    query_param_decoded(q, qlen, "rule", name, sizeof(name));
    size_t klen = query_param_decoded(q, qlen, "key", key, sizeof(key));
    agw_generation_t *gen = agw_reload_state_current(a->gens);
    const agw_limits_conf_t *lc = gen ? &gen->conf.limits : NULL;
    agw_limit_rule_t *r = NULL;
    for (size_t i = 0; lc && i < lc->num_rules; i++)
        if (strcmp(lc->rules[i].name, name) == 0)
            r = &lc->rules[i];
    agw_buf_t body = AGW_BUF_INIT;
    const char *bad = NULL;
    unsigned char addr[16];
    const char *kb = key;
    size_t kl = klen;
    if (r == NULL) {
        bad = "rule must name a rule of gateway.lua's limits.rules";
    } else if (r->key == AGW_LIMIT_KEY_IP && (kl = agw_limit_ip_key_of_text(key, addr, &kb)) == 0) {
        bad = "key must be an IPv4 or IPv6 address for a rule keyed by ip"; /* (the worker's bytes of it) */
    }
    if (bad || a->metrics == NULL || a->num_workers == 0 || a->metrics[0]->limits == NULL) {
        agw_buf_printf(&body, "%s; rules:", bad ? bad : "limits are not counted in this process");
        for (size_t i = 0; lc && i < lc->num_rules; i++)
            agw_buf_printf(&body, " %s", lc->rules[i].name);
        agw_buf_puts(&body, "\n");
        respond(out, 400, "Bad Request", "text/plain; charset=utf-8", body.base, body.len, head, NULL);
    } else {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        uint64_t now_ms = (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
        agw_limit_store_t *store = a->metrics[0]->limits;
        uint64_t h = agw_limit_hash(r, kb, kl);
        agw_limit_result_t res;
        agw_buf_puts(&body, "{\"rule\":");
        json_str(&body, r->name, strlen(r->name));
        agw_buf_puts(&body, ",\"key\":");
        json_str(&body, key, klen);
        if (!r->redis) {
            agw_limit_peek(store, r, h, now_ms, &res);
            agw_buf_printf(&body, ",\"kind\":\"%s\",\"store\":\"local\",\"limit\":%llu,\"window_s\":%llu,"
                                  "\"remaining\":%llu,\"reset_ms\":%llu,\"reset_at\":%llu}\n",
                           r->is_quota ? "quota" : "rate", (unsigned long long)res.limit,
                           (unsigned long long)res.window_s, (unsigned long long)res.remaining,
                           (unsigned long long)res.reset_ms, (unsigned long long)((now_ms + res.reset_ms + 999) / 1000));
        } else {
            redis_rule_page(a, r, h, now_ms, &body);
        }
        respond(out, 200, "OK", "application/json", body.base, body.len, head, NULL);
    }
    agw_generation_unref(gen);
    agw_buf_free(&body);
}

/* GET /waterfall[.json][?trace=<32 hex>&limit=N] (waterfall.h). */
static void waterfall(agw_admin_t *a, int json, const char *q, size_t qlen, int head, agw_buf_t *out)
{
    size_t limit = AGW_WF_DEFAULT_LIMIT, vl = 0;
    size_t max = a->num_workers * AGW_WF_RING;
    const char *v = q ? query_param(q, qlen, "limit", &vl) : NULL;
    if (v) {
        /* a whole number of requests, at least 1; more than are kept is as many as are kept */
        size_t n = 0;
        int ok = vl > 0;
        for (size_t i = 0; ok && i < vl; i++) {
            ok = v[i] >= '0' && v[i] <= '9';
            if (n <= max) /* beyond what is kept, the value no longer matters (and cannot overflow) */
                n = n * 10 + (size_t)(v[i] - '0');
        }
        if (!ok || n == 0) {
            static const char body[] = "limit must be a whole number of requests, 1 or more\n";
            respond(out, 400, "Bad Request", "text/plain; charset=utf-8", body, sizeof(body) - 1, head, NULL);
            return;
        }
        limit = n;
    }
    if (limit > max)
        limit = max;
    char trace[33];
    const char *trace_id = NULL;
    v = q ? query_param(q, qlen, "trace", &vl) : NULL;
    if (v) {
        int ok = vl == 32;
        for (size_t i = 0; ok && i < 32; i++)
            ok = (v[i] >= '0' && v[i] <= '9') || (v[i] >= 'a' && v[i] <= 'f');
        if (!ok) {
            static const char body[] = "trace must be a trace id: 32 lowercase hex digits\n";
            respond(out, 400, "Bad Request", "text/plain; charset=utf-8", body, sizeof(body) - 1, head, NULL);
            return;
        }
        memcpy(trace, v, 32);
        trace[32] = '\0';
        trace_id = trace;
    }
    agw_waterfall_t **rings = agw_calloc(a->num_workers ? a->num_workers : 1, sizeof(*rings));
    agw_wf_entry_t *entries = agw_malloc((limit ? limit : 1) * sizeof(*entries));
    for (size_t i = 0; i < a->num_workers; i++)
        rings[i] = a->metrics[i]->waterfall;
    size_t n = agw_waterfall_snapshot(rings, a->num_workers, trace_id, entries, limit);
    agw_buf_t body = AGW_BUF_INIT;
    if (json) {
        agw_waterfall_json(&body, a->labels, entries, n);
        respond(out, 200, "OK", "application/json", body.base, body.len, head, NULL);
    } else {
        agw_waterfall_html(&body, a->labels, entries, n);
        respond(out, 200, "OK", "text/html; charset=utf-8", body.base, body.len, head, NULL);
    }
    agw_buf_free(&body);
    free(entries);
    free(rings);
}

const agw_admin_endpoint_t agw_admin_endpoints[] = {
    {"GET", "/healthz", "200 ok while the process runs"},
    {"GET", "/readyz", "200 once every worker serves (and, when Redis is used, has connected to it), 503 "
                       "while starting, waiting for Redis or draining"},
    {"GET", "/metrics", "Prometheus metrics"},
    {"GET", "/routes", "JSON: the routes being served and their scripts"},
    {"GET", "/reload", "JSON: the generation serving and the last reload's errors"},
    {"GET", "/upstreams", "JSON: each upstream's endpoints, their state and counts"},
    {"GET", "/limits", "JSON: what a rate limit or quota rule says of a key (?rule=NAME&key=VALUE)"},
    {"GET", "/waterfall", "HTML: the last requests' calls on a time axis (?trace=ID&limit=N)"},
    {"GET", "/waterfall.json", "the same as JSON"},
    {"POST", "/cache/purge", "drop cache entries whose key starts with ?prefix=agw:..."},
    {NULL, NULL, NULL},
};

/* 404 for a path the admin listener does not serve: the body lists the ones it does. */
static void not_found(int head, agw_buf_t *out)
{
    agw_buf_t body = AGW_BUF_INIT;
    agw_buf_puts(&body, "not found: the admin endpoints are");
    for (const agw_admin_endpoint_t *e = agw_admin_endpoints; e->path; e++)
        agw_buf_printf(&body, "%s %s %s", e == agw_admin_endpoints ? "" : ",", e->method, e->path);
    agw_buf_puts(&body, "\n");
    respond(out, 404, "Not Found", "text/plain; charset=utf-8", body.base, body.len, head, NULL);
    agw_buf_free(&body);
}

static int respond_to(agw_admin_t *a, aconn_t *c, const char *method, size_t mlen, const char *target, size_t tlen,
                      agw_buf_t *out);

void agw_admin_respond(agw_admin_t *a, const char *method, size_t mlen, const char *target, size_t tlen,
                       agw_buf_t *out)
{
    respond_to(a, NULL, method, mlen, target, tlen, out);
}

/* agw_admin_respond for connection c (NULL: none): returns 1 when c's answer waits for a purge's
 * thread (cache_purge), 0 when out holds it. */
static int respond_to(agw_admin_t *a, aconn_t *c, const char *method, size_t mlen, const char *target, size_t tlen,
                      agw_buf_t *out)
{
    int head = mlen == 4 && memcmp(method, "HEAD", 4) == 0;
    const char *q = memchr(target, '?', tlen);
    size_t plen = q ? (size_t)(q - target) : tlen;
#define PATH_IS(s) (plen == sizeof(s) - 1 && memcmp(target, s, plen) == 0)
    const agw_admin_endpoint_t *ep = agw_admin_endpoints;
    while (ep->path && !(plen == strlen(ep->path) && memcmp(target, ep->path, plen) == 0))
        ep++;
    if (!ep->path) {
        not_found(head, out);
        return 0;
    }
    if (strcmp(ep->method, "POST") == 0) {
        if (!(mlen == 4 && memcmp(method, "POST", 4) == 0)) {
            static const char body[] = "method not allowed\n";
            respond(out, 405, "Method Not Allowed", "text/plain; charset=utf-8", body, sizeof(body) - 1, 0,
                    "Allow: POST\r\n");
            return 0;
        }
        return cache_purge(a, c, q ? q + 1 : NULL, q ? tlen - plen - 1 : 0, out);
    }
    if (!(head || (mlen == 3 && memcmp(method, "GET", 3) == 0))) {
        static const char body[] = "method not allowed\n";
        respond(out, 405, "Method Not Allowed", "text/plain; charset=utf-8", body, sizeof(body) - 1, 0,
                "Allow: GET, HEAD\r\n");
        return 0;
    }
    if (PATH_IS("/healthz")) {
        respond(out, 200, "OK", "text/plain; charset=utf-8", "ok\n", 3, head, NULL);
    } else if (PATH_IS("/readyz")) {
        agw_buf_t why = AGW_BUF_INIT;
        if (!__atomic_load_n(&a->ready, __ATOMIC_ACQUIRE))
            respond(out, 503, "Service Unavailable", "text/plain; charset=utf-8", "not ready\n", 10, head, NULL);
        else if (redis_not_ready(a, &why))
            respond(out, 503, "Service Unavailable", "text/plain; charset=utf-8", why.base, why.len, head, NULL);
        else
            respond(out, 200, "OK", "text/plain; charset=utf-8", "ready\n", 6, head, NULL);
        agw_buf_free(&why);
    } else if (PATH_IS("/metrics")) {
        agw_buf_t body = AGW_BUF_INIT;
        agw_metrics_process_t proc = {0};
        proc.ready = __atomic_load_n(&a->ready, __ATOMIC_ACQUIRE) && !redis_not_ready(a, NULL); /* as /readyz */
        proc.start_time = a->start_time;
        proc.admin_evicted = __atomic_load_n(&a->evicted, __ATOMIC_ACQUIRE);
        agw_reload_state_metrics(a->gens, &proc);
        agw_generation_t *gen = agw_reload_state_current(a->gens); /* held while its breakers are read */
        agw_metrics_render(&body, a->labels, gen ? &gen->conf : NULL, a->metrics, a->num_workers, &proc);
        if (gen)
            agw_endpoint_board_metrics(gen->board, &gen->conf, gen->dir, now_ms(), &body);
        agw_generation_unref(gen);
        respond(out, 200, "OK", "text/plain; version=0.0.4; charset=utf-8", body.base ? body.base : "", body.len, head,
                NULL);
        agw_buf_free(&body);
    } else if (PATH_IS("/reload")) {
        agw_buf_t body = AGW_BUF_INIT;
        agw_reload_state_json(a->gens, &body);
        respond(out, 200, "OK", "application/json", body.base, body.len, head, NULL);
        agw_buf_free(&body);
    } else if (PATH_IS("/limits")) {
        limits_page(a, q ? q + 1 : NULL, q ? tlen - plen - 1 : 0, head, out);
    } else if (PATH_IS("/upstreams")) {
        agw_buf_t body = AGW_BUF_INIT;
        agw_generation_t *gen = agw_reload_state_current(a->gens);
        agw_endpoint_board_src_t src = {a->metrics, a->num_workers, gen ? gen->upstream_slot : NULL, gen ? gen->dir : NULL};
        agw_endpoint_board_json(gen ? gen->board : NULL, gen ? &gen->conf : NULL, &src, now_ms(), &body);
        agw_generation_unref(gen);
        respond(out, 200, "OK", "application/json", body.base, body.len, head, NULL);
        agw_buf_free(&body);
    } else if (PATH_IS("/waterfall") || PATH_IS("/waterfall.json")) {
        waterfall(a, PATH_IS("/waterfall.json"), q ? q + 1 : NULL, q ? tlen - plen - 1 : 0, head, out);
    } else if (PATH_IS("/routes")) {
        agw_buf_t body = AGW_BUF_INIT;
        agw_generation_t *gen = agw_reload_state_current(a->gens);
        routes_json(gen, &body);
        agw_generation_unref(gen);
        respond(out, 200, "OK", "application/json", body.base, body.len, head, NULL);
        agw_buf_free(&body);
    } else { /* listed in agw_admin_endpoints but not dispatched here: a bug, said plainly */
        static const char body[] = "admin endpoint listed but not served\n";
        respond(out, 500, "Internal Server Error", "text/plain; charset=utf-8", body, sizeof(body) - 1, head, NULL);
    }
#undef PATH_IS
    return 0;
}

static void on_conn_timeout(struct ev_loop *loop, ev_timer *t, int revents)
{
    (void)loop, (void)revents;
    conn_close(t->data);
}

/* Where the head in[0..len) ends: at the LF that ends its last field line (or its request line),
 * the one an empty line follows, CRLF or bare LF (RFC 9112 §2.2 allows either, in any mix: a head
 * must never run into the bytes after it). NULL when no empty line has come yet. */
static char *head_end(char *in, size_t len)
{
    for (char *p = in; (p = memchr(p, '\n', len - (size_t)(p - in))) != NULL; p++) {
        size_t left = len - (size_t)(p - in);
        if (left >= 2 && p[1] == '\n')
            return p;
        if (left >= 3 && p[1] == '\r' && p[2] == '\n')
            return p;
    }
    return NULL;
}

/* Whether a field line of the header block h (len bytes) is malformed in a way RFC 9112 says a
 * server must answer 400: whitespace between the name and the colon (§5.1), a line folded onto the
 * one before (obs-fold, §5.2), or no colon at all. (A Host spelt "Host :" would otherwise be no
 * Host.) */
static int fields_malformed(const char *h, size_t len)
{
    for (const char *p = h, *e = h + len; p < e;) {
        const char *lf = memchr(p, '\n', (size_t)(e - p));
        const char *le = lf ? lf : e;
        if (le > p && le[-1] == '\r')
            le--;
        if (le > p) {
            const char *colon = memchr(p, ':', (size_t)(le - p));
            if (*p == ' ' || *p == '\t' || colon == NULL || colon == p || colon[-1] == ' ' || colon[-1] == '\t')
                return 1;
        }
        p = lf ? lf + 1 : e;
    }
    return 0;
}

static const char host_missing[] = "an HTTP/1.1 request needs one Host field\n";

/* Why a request whose version's last digit is at minor and whose header block is h (len bytes) is
 * refused for its Host, or NULL: none on HTTP/1.1, or more than one (RFC 9112 §3.2: 400,
 * host_missing), or one that does not name this listener (host_admitted: 421). */
static const char *host_refused(const agw_admin_t *a, const char *minor, const char *h, size_t len)
{
    const char *v = NULL;
    size_t vlen = 0;
    int n = count_field(h, len, "host", &v, &vlen);
    if (n > 1 || (n == 0 && *minor != '0'))
        return host_missing;
    if (n == 1 && !host_admitted(a, v, vlen))
        return "the admin listener answers a Host that is an IP address, localhost or one of "
               "admin.allowed_hosts\n";
    return NULL;
}

static void on_conn_io(struct ev_loop *loop, ev_io *io, int revents)
{
    (void)revents;
    aconn_t *c = io->data;
    const char *host_why;
    if (c->out.len == 0) {
        ssize_t n = recv(c->fd, c->in + c->inlen, sizeof(c->in) - c->inlen, 0);
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
            return;
        if (n <= 0) {
            conn_close(c);
            return;
        }
        c->inlen += (size_t)n;
        char *end = head_end(c->in, c->inlen);
        if (end == NULL) {
            if (c->inlen == sizeof(c->in)) {
                static const char body[] = "request headers too large\n";
                respond(&c->out, 431, "Request Header Fields Too Large", "text/plain; charset=utf-8", body,
                        sizeof(body) - 1, 0, NULL);
            } else {
                return;
            }
        } else {
            /* request line: METHOD SP target SP HTTP/1.x */
            char *eol = memchr(c->in, '\n', c->inlen);
            size_t llen = (size_t)(eol - c->in);
            if (llen && c->in[llen - 1] == '\r')
                llen--;
            char *sp1 = memchr(c->in, ' ', llen);
            char *sp2 = sp1 ? memchr(sp1 + 1, ' ', llen - (size_t)(sp1 + 1 - c->in)) : NULL;
            /* the field lines: from after the request line to the head's end (none: 0 bytes) */
            const char *fields = eol + 1;
            size_t flen = end > eol + 1 ? (size_t)(end - fields) : 0;
            if (sp1 == NULL || sp2 == NULL || sp1 == c->in || sp2 == sp1 + 1 || sp1[1] != '/' ||
                (size_t)(c->in + llen - (sp2 + 1)) != 8 || memcmp(sp2 + 1, "HTTP/1.", 7) != 0 ||
                (sp2[8] != '0' && sp2[8] != '1')) {
                static const char body[] = "bad request\n";
                respond(&c->out, 400, "Bad Request", "text/plain; charset=utf-8", body, sizeof(body) - 1, 0, NULL);
            } else if (fields_malformed(fields, flen)) {
                static const char body[] = "bad request: a header field line is malformed\n";
                respond(&c->out, 400, "Bad Request", "text/plain; charset=utf-8", body, sizeof(body) - 1, 0, NULL);
            } else if ((host_why = host_refused(c->a, sp2 + 8, fields, flen)) != NULL) {
                respond(&c->out, host_why == host_missing ? 400 : 421,
                        host_why == host_missing ? "Bad Request" : "Misdirected Request", "text/plain; charset=utf-8",
                        host_why, strlen(host_why), 0, NULL);
            } else if (sp1 - c->in == 4 && memcmp(c->in, "POST", 4) == 0 &&
                       count_field(fields, flen, "origin", NULL, NULL) > 0) {
                /* a browser's: a page the operator visits must not purge the cache (a cross-site
                 * POST a browser sends without asking, text/plain; an attack review). Current
                 * browsers mark a POST with Origin, the operators' tools (curl) do not */
                static const char body[] = "the admin's POST endpoints take no request from a web page (Origin)\n";
                respond(&c->out, 403, "Forbidden", "text/plain; charset=utf-8", body, sizeof(body) - 1, 0, NULL);
            } else {
                if (respond_to(c->a, c, c->in, (size_t)(sp1 - c->in), sp1 + 1, (size_t)(sp2 - sp1 - 1), &c->out)) {
                    /* the purge's thread answers it (on_purge_done): no read, no timeout meanwhile */
                    c->waiting = 1;
                    ev_io_stop(loop, &c->io);
                    ev_timer_stop(loop, &c->timer);
                    return;
                }
            }
        }
        ev_io_stop(loop, &c->io);
        ev_io_set(&c->io, c->fd, EV_WRITE);
        ev_io_start(loop, &c->io);
    }
    while (c->outoff < c->out.len) {
        ssize_t n = send(c->fd, c->out.base + c->outoff, c->out.len - c->outoff, MSG_NOSIGNAL);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            return;
        if (n <= 0)
            break;
        c->outoff += (size_t)n;
    }
    conn_close(c);
}

/* How long the listener rests when accept finds no descriptor (or memory) free, s. */
#define ADMIN_ACCEPT_PAUSE_S 0.1

static void on_accept_resume(struct ev_loop *loop, ev_timer *t, int revents)
{
    (void)t, (void)revents;
    agw_admin_t *a = t->data;
    ev_io_start(loop, &a->accept_io);
}

/* Makes room for a new connection when ADMIN_MAX_CONNS are open: closes the oldest one still
 * waiting for its request (a probe's request comes within milliseconds, so the connections that
 * wait are the slow and the idle), so that clients holding connections open cannot keep /readyz and
 * /healthz from the orchestrator's probes. Returns 0 when every connection is sending its answer. */
static int evict_oldest_reader(agw_admin_t *a)
{
    for (h2o_linklist_t *n = a->conns.prev; n != &a->conns; n = n->prev) {
        aconn_t *c = H2O_STRUCT_FROM_MEMBER(aconn_t, link, n);
        if (c->out.len == 0 && !c->waiting) {
            conn_close(c);
            __atomic_add_fetch(&a->evicted, 1, __ATOMIC_RELEASE);
            return 1;
        }
    }
    return 0;
}

static void on_accept(struct ev_loop *loop, ev_io *io, int revents)
{
    (void)revents;
    agw_admin_t *a = io->data;
    for (int i = 0; i < 16; i++) {
        int fd = accept4(a->fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            /* out of descriptors or memory: the connection stays in the backlog and the socket
             * stays readable, so a level-triggered watcher would spin; rest, then try again */
            if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
                ev_io_stop(loop, &a->accept_io);
                ev_timer_set(&a->accept_pause, ADMIN_ACCEPT_PAUSE_S, 0.);
                ev_timer_start(loop, &a->accept_pause);
            }
            return;
        }
        if (a->num_conns >= ADMIN_MAX_CONNS && !evict_oldest_reader(a)) {
            close(fd);
            continue;
        }
        aconn_t *c = agw_calloc(1, sizeof(*c));
        c->a = a;
        c->fd = fd;
        if (fd > a->max_fd)
            a->max_fd = fd;
        h2o_linklist_insert(a->conns.next, &c->link); /* first */
        a->num_conns++;
        ev_io_init(&c->io, on_conn_io, fd, EV_READ);
        c->io.data = c;
        ev_io_start(loop, &c->io);
        ev_timer_init(&c->timer, on_conn_timeout, ADMIN_TIMEOUT_S, 0.);
        c->timer.data = c;
        ev_timer_start(loop, &c->timer);
    }
}

static void on_stop(struct ev_loop *loop, ev_io *w, int revents)
{
    (void)w, (void)revents;
    ev_break(loop, EVBREAK_ALL);
}

/* Makes the admin loop anew (the admin thread, outside ev_run, no connection open): the listener,
 * its rest (with the time it has left) and the stop watcher move to a new loop, and the old one,
 * with the per-descriptor arrays a burst's high descriptors grew, is destroyed (its blocks go to
 * the heap, whose background threads give their pages back). The new loop has the old one's
 * backend and nothing else: with epoll it needs one descriptor, and when none is free (the burst
 * goes on) ev_loop_new returns NULL, the old loop stays and the next idle spell tries again. */
static void remake_loop(agw_admin_t *a)
{
    /* (EVFLAG_NOENV: LIBEV_FLAGS in the environment would otherwise choose the backend again, and
     * poll needs no descriptor, so "none free" would go unseen) */
    struct ev_loop *old = a->loop, *nl = ev_loop_new(ev_backend(old) | EVFLAG_NOENV);
    if (nl == NULL) {
        /* one warning a streak: each idle spell of a long burst tries again */
        if (!a->failing)
            agw_log(AGW_LOG_WARN, "admin listener: no descriptor free to make its loop anew after a burst; "
                                  "the old loop serves on and the next idle spell tries again");
        a->failing = 1;
        __atomic_add_fetch(&a->loops_failed, 1, __ATOMIC_RELEASE);
        return;
    }
    if (a->failing)
        agw_log(AGW_LOG_INFO, "admin listener: its loop is made anew");
    a->failing = 0;
    int accepting = ev_is_active(&a->accept_io), resting = ev_is_active(&a->accept_pause);
    ev_tstamp rest = resting ? ev_timer_remaining(old, &a->accept_pause) : 0.;
    ev_io_stop(old, &a->accept_io);
    ev_timer_stop(old, &a->accept_pause);
    ev_io_stop(old, &a->stop_io);
    ev_loop_destroy(old);
    a->loop = nl;
    if (accepting)
        ev_io_start(nl, &a->accept_io);
    if (resting) {
        ev_timer_set(&a->accept_pause, rest > 0. ? rest : 0., 0.);
        ev_timer_start(nl, &a->accept_pause);
    }
    ev_io_start(nl, &a->stop_io);
    a->max_fd = 0;
    __atomic_add_fetch(&a->loops_made, 1, __ATOMIC_RELEASE);
    agw_heap_thread_flush();
}

static void *admin_main(void *arg)
{
    agw_admin_t *a = arg;
    /* ev_run returns at a stop or when the last connection closed with a remake due. The other
     * events of that loop pass are handled first: a connection accepted among them keeps the
     * loop (its watchers are on it) until the next idle spell */
    while (!__atomic_load_n(&a->stopping, __ATOMIC_ACQUIRE)) {
        ev_run(a->loop, 0);
        if (__atomic_load_n(&a->stopping, __ATOMIC_ACQUIRE))
            break;
        if (remake_due(a))
            remake_loop(a);
    }
    return NULL;
}

unsigned agw_admin_loops_made(const agw_admin_t *a)
{
    return __atomic_load_n(&a->loops_made, __ATOMIC_ACQUIRE);
}

unsigned agw_admin_loops_failed(const agw_admin_t *a)
{
    return __atomic_load_n(&a->loops_failed, __ATOMIC_ACQUIRE);
}

unsigned agw_admin_evicted(const agw_admin_t *a)
{
    return __atomic_load_n(&a->evicted, __ATOMIC_ACQUIRE);
}

unsigned agw_admin_idle_spells(const agw_admin_t *a)
{
    return __atomic_load_n(&a->idle_spells, __ATOMIC_ACQUIRE);
}

agw_admin_t *agw_admin_start(const agw_config_t *conf, agw_reload_state_t *gens, const agw_metric_labels_t *labels,
                             agw_metrics_t *const *metrics, size_t num_workers)
{
    int fd = agw_listen_socket("admin", conf->admin_host, conf->admin_port, 0, 128);
    if (fd < 0)
        return NULL;
    agw_admin_t *a = agw_calloc(1, sizeof(*a));
    h2o_linklist_init_anchor(&a->conns);
    a->gens = gens;
    a->labels = labels;
    a->metrics = metrics;
    a->num_workers = num_workers;
    a->fd = fd;
    a->allowed_hosts = conf->admin_allowed_hosts ? agw_strdup(conf->admin_allowed_hosts) : NULL;
    struct timeval tv;
    gettimeofday(&tv, NULL);
    a->start_time = (double)tv.tv_sec + (double)tv.tv_usec / 1e6;
    a->loop = ev_loop_new(EVFLAG_AUTO);
    a->stop_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (a->loop == NULL || a->stop_fd < 0) {
        agw_log(AGW_LOG_ERROR, "cannot start the admin listener: %s", strerror(errno));
        if (a->loop)
            ev_loop_destroy(a->loop);
        if (a->stop_fd >= 0)
            close(a->stop_fd);
        close(fd);
        free(a->allowed_hosts);
        free(a);
        return NULL;
    }
    ev_io_init(&a->accept_io, on_accept, fd, EV_READ);
    a->accept_io.data = a;
    ev_io_start(a->loop, &a->accept_io);
    ev_timer_init(&a->accept_pause, on_accept_resume, ADMIN_ACCEPT_PAUSE_S, 0.);
    a->accept_pause.data = a;
    ev_io_init(&a->stop_io, on_stop, a->stop_fd, EV_READ);
    ev_io_start(a->loop, &a->stop_io);
    if (pthread_create(&a->thread, NULL, admin_main, a) != 0) {
        agw_log(AGW_LOG_ERROR, "cannot start the admin thread");
        ev_loop_destroy(a->loop);
        close(a->stop_fd);
        close(fd);
        free(a->allowed_hosts);
        free(a);
        return NULL;
    }
    agw_log(AGW_LOG_INFO, "admin listener on %s:%d (`aggway help` lists its endpoints)", conf->admin_host,
            conf->admin_port);
    return a;
}

void agw_admin_set_ready(agw_admin_t *a, int ready)
{
    if (a)
        __atomic_store_n(&a->ready, ready, __ATOMIC_RELEASE);
}

void agw_admin_stop(agw_admin_t *a)
{
    if (a == NULL)
        return;
    __atomic_store_n(&a->stopping, 1, __ATOMIC_RELEASE);
    /* readable until the thread has ended: whichever loop it is in then, or makes next, sees it */
    uint64_t one = 1;
    while (write(a->stop_fd, &one, sizeof(one)) < 0 && errno == EINTR)
        ;
    pthread_join(a->thread, NULL);
    purge_stop(a);
    while (!h2o_linklist_is_empty(&a->conns))
        conn_close(H2O_STRUCT_FROM_MEMBER(aconn_t, link, a->conns.next));
    ev_io_stop(a->loop, &a->accept_io);
    ev_timer_stop(a->loop, &a->accept_pause);
    ev_io_stop(a->loop, &a->stop_io);
    ev_loop_destroy(a->loop);
    close(a->stop_fd);
    close(a->fd);
    free(a->allowed_hosts);
    free(a);
}
