/* redis.c: the Redis client (redis.h): hiredis's asynchronous API on libev, with a timeout per
 * command (one libev timer for all, base/timeouts.h), readiness after AUTH/SELECT, and
 * reconnection with backoff. */
#include "redis/redis.h"
#include "base/mem.h"
#include "base/timeouts.h"

#include <arpa/inet.h>
#include <errno.h>
#include <ev.h>
#include <hiredis/adapters/libev.h>
#include <hiredis/async.h>
#include <hiredis/hiredis.h>
#include <h2o/linklist.h>
#include <h2o/memory.h>
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "base/counter.h"

#define BACKOFF_FIRST_MS 50
#define BACKOFF_MAX_MS 5000
/* A connection ready this long (s) was a healthy one: losing it starts the backoff again from
 * BACKOFF_FIRST_MS. One lost sooner keeps doubling it, so that a server whose answers drop every
 * connection at once (a reply the client refuses, right after the handshake) is not reconnected to
 * 20 times a second, with two log lines each (an attack review). */
#define HEALTHY_S 1.0

typedef enum state { DOWN, CONNECTING, HANDSHAKE, READY } state_t;

/* A command in flight. hiredis holds it as the reply callback's privdata until it calls back (with
 * the reply, or NULL when the connection goes), so it is freed there; the caller's callback may
 * have run before that (timeout), which `answered` records. */
typedef struct cmd {
    agw_redis_t *r;
    agw_redis_cb cb;
    void *data;
    agw_timeout_t timer;            /* on the client's timeouts (started for a caller's command only) */
    ev_tstamp started;
    int answered;                   /* the caller's callback ran */
    int internal;                   /* AUTH/SELECT of the handshake: no caller, not counted */
    h2o_linklist_t link;            /* on r->cmds while linked */
} cmd_t;

struct agw_redis {
    struct ev_loop *loop;
    agw_redis_conf_t conf;
    agw_redis_stats_t *stats;
    agw_redis_stats_t own_stats;    /* when the caller gave none */
    redisAsyncContext *ac;          /* the current connection, NULL while DOWN */
    state_t state;
    int handshake_left;             /* AUTH/SELECT replies still awaited */
    ev_timer retry;                 /* DOWN: the next connection attempt */
    ev_timer connect_timer;         /* CONNECTING/HANDSHAKE: the attempt's limit */
    agw_timeouts_t timeouts;        /* the commands' timeouts: one libev timer, of the lowest
                                       priority, for every command in flight (base/timeouts.h) */
    uint64_t backoff_ms;            /* the next wait before reconnecting */
    ev_tstamp ready_at;             /* when the current connection became ready (loop time, s) */
    uint64_t rng;                   /* xorshift state (jitter) */
    int was_up;                     /* a connection was ready since the last "lost" line */
    int logged_down;                /* an outage is under way and its start is logged */
    ev_tstamp down_since;           /* when the outage began (loop time, s) */
    uint64_t down_failed;           /* callers' commands failed since the outage began */
    h2o_linklist_t cmds;            /* commands whose caller has not been answered yet, newest first
                                       (cmd_t.link) */
    char addr[300];                 /* "host:port/db" for messages */
    char why[160];                  /* why the client last dropped a connection itself */
    const char *refused;            /* why the current connection's reader refused a reply (a reply no
                                       command waited for, an array too long), or NULL */
    agw_redis_reply_count_t count;  /* what the reply being read claims so far */
};

static void connect_now(agw_redis_t *r);

/* ---- configuration -------------------------------------------------------------------------- */

/* %XX decoding of the URL's user info (RFC 3986 §2.1); -1 on a bad escape. */
static char *pct_decode(const char *s, size_t n)
{
    char *d = agw_strndup(s, n);
    size_t j = 0;
    for (size_t i = 0; i < n; i++) {
        if (s[i] == '%') {
            unsigned v;
            if (i + 2 >= n) {
                free(d);
                return NULL;
            }
            char hex[3] = {s[i + 1], s[i + 2], 0};
            char *end;
            v = (unsigned)strtoul(hex, &end, 16);
            if (end != hex + 2) {
                free(d);
                return NULL;
            }
            d[j++] = (char)v;
            i += 2;
        } else {
            d[j++] = s[i];
        }
    }
    d[j] = '\0';
    return d;
}

int agw_redis_parse_url(const char *url, uint64_t timeout_ms, agw_redis_conf_t *out, char *err, size_t errlen)
{
    agw_redis_conf_t c = {.port = 6379, .timeout_ms = timeout_ms};
    const char *p = url;
    if (strncmp(p, "redis://", 8) != 0) {
        snprintf(err, errlen, "must start with redis:// (rediss:// and unix sockets are not supported)");
        return -1;
    }
    p += 8;
    const char *end = p + strcspn(p, "/?#");
    const char *at = memchr(p, '@', (size_t)(end - p));
    if (at) {
        const char *colon = memchr(p, ':', (size_t)(at - p));
        if (!colon) {
            snprintf(err, errlen, "the user info before @ must be [user]:password");
            return -1;
        }
        c.user = colon > p ? pct_decode(p, (size_t)(colon - p)) : NULL;
        c.password = pct_decode(colon + 1, (size_t)(at - colon - 1));
        if ((colon > p && !c.user) || !c.password) {
            agw_redis_conf_clear(&c);
            snprintf(err, errlen, "a bad %%-escape in the user info");
            return -1;
        }
        p = at + 1;
    }
    const char *host_end;
    const char *port_at = NULL;
    if (*p == '[') {
        const char *rb = memchr(p, ']', (size_t)(end - p));
        if (!rb) {
            agw_redis_conf_clear(&c);
            snprintf(err, errlen, "an IPv6 address needs its closing ]");
            return -1;
        }
        c.host = agw_strndup(p + 1, (size_t)(rb - p - 1));
        host_end = rb + 1;
        if (host_end < end && *host_end == ':')
            port_at = host_end + 1;
        else if (host_end != end) {
            agw_redis_conf_clear(&c);
            snprintf(err, errlen, "unexpected text after the IPv6 address");
            return -1;
        }
    } else {
        const char *colon = memchr(p, ':', (size_t)(end - p));
        host_end = colon ? colon : end;
        c.host = agw_strndup(p, (size_t)(host_end - p));
        if (colon)
            port_at = colon + 1;
    }
    if (c.host[0] == '\0') {
        agw_redis_conf_clear(&c);
        snprintf(err, errlen, "the host is missing");
        return -1;
    }
    if (port_at) {
        char *pe;
        long port = strtol(port_at, &pe, 10);
        if (pe != end || port_at == end || port < 1 || port > 65535) {
            agw_redis_conf_clear(&c);
            snprintf(err, errlen, "the port must be a number from 1 to 65535");
            return -1;
        }
        c.port = (int)port;
    }
    if (*end == '/' && end[1] != '\0') {
        char *de;
        long db = strtol(end + 1, &de, 10);
        if (*de != '\0' || db < 0 || db > 1000000 || end[1] == '-' || end[1] == '+') {
            agw_redis_conf_clear(&c);
            snprintf(err, errlen, "the database after / must be a number (0, 1, …)");
            return -1;
        }
        c.db = (int)db;
    } else if (*end == '?' || *end == '#') {
        agw_redis_conf_clear(&c);
        snprintf(err, errlen, "query and fragment parts are not supported");
        return -1;
    }
    /* hiredis resolves names with a blocking getaddrinfo: resolve here, at load time, instead */
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM}, *ai;
    int rc = getaddrinfo(c.host, NULL, &hints, &ai);
    if (rc != 0) {
        snprintf(err, errlen, "cannot resolve %s: %s", c.host, gai_strerror(rc));
        agw_redis_conf_clear(&c);
        return -1;
    }
    char num[INET6_ADDRSTRLEN];
    const void *a = ai->ai_family == AF_INET6 ? (const void *)&((struct sockaddr_in6 *)ai->ai_addr)->sin6_addr
                                              : (const void *)&((struct sockaddr_in *)ai->ai_addr)->sin_addr;
    inet_ntop(ai->ai_family, a, num, sizeof(num));
    freeaddrinfo(ai);
    free(c.host);
    c.host = agw_strdup(num);
    c.connect_timeout_ms = timeout_ms * 20 > 100 ? timeout_ms * 20 : 100;
    *out = c;
    return 0;
}

void agw_redis_conf_clear(agw_redis_conf_t *c)
{
    free(c->host);
    free(c->user);
    free(c->password);
    memset(c, 0, sizeof(*c));
}

static int str_same(const char *a, const char *b)
{
    return (!a && !b) || (a && b && strcmp(a, b) == 0);
}

int agw_redis_conf_same(const agw_redis_conf_t *a, const agw_redis_conf_t *b)
{
    return str_same(a->host, b->host) && a->port == b->port && a->db == b->db && str_same(a->user, b->user) &&
           str_same(a->password, b->password) && a->timeout_ms == b->timeout_ms &&
           a->connect_timeout_ms == b->connect_timeout_ms;
}

static void conf_copy(agw_redis_conf_t *d, const agw_redis_conf_t *s)
{
    *d = *s;
    d->host = agw_strdup_opt(s->host);
    d->user = agw_strdup_opt(s->user);
    d->password = agw_strdup_opt(s->password);
}

/* ---- commands ------------------------------------------------------------------------------- */

static void unlink_cmd(agw_redis_t *r, cmd_t *c)
{
    (void)r;
    if (h2o_linklist_is_linked(&c->link))
        h2o_linklist_unlink(&c->link);
}

/* Answers c's caller once: stops its timer, counts, calls back. */
static void answer(cmd_t *c, const redisReply *reply, const char *err)
{
    if (c->answered)
        return;
    c->answered = 1;
    agw_redis_t *r = c->r;
    agw_timeout_stop(&r->timeouts, &c->timer);
    unlink_cmd(r, c);
    if (c->internal)
        return;
    if (err) {
        AGW_M_ADD(r->stats->errors, 1);
        if (r->logged_down)
            r->down_failed++;
    } else {
        static const uint64_t bounds[] = AGW_REDIS_LATENCY_BOUNDS;
        uint64_t us = (uint64_t)((ev_now(r->loop) - c->started) * 1e6);
        size_t b = 0;
        while (b < sizeof(bounds) / sizeof(bounds[0]) && us > bounds[b])
            b++;
        AGW_M_ADD(r->stats->replies, 1);
        AGW_M_ADD(r->stats->latency_us_sum, us);
        AGW_M_ADD(r->stats->latency[b], 1);
    }
    c->cb(c->data, reply, err);
}

static void lost(agw_redis_t *r, const char *why);
static void outage_begin(agw_redis_t *r, const char *what, const char *why);
static void outage_end(agw_redis_t *r);

/* ---- a reply no command waits for ------------------------------------------------------------
 * hiredis's asynchronous API aborts the process (an assert in redisProcessCallbacks) when a reply
 * other than an error arrives while no command waits for one: a server that lies (two replies to a
 * command) or a proxy in between could stop the gateway. So each connection's reader makes reply
 * objects with hiredis's own functions, wrapped (guard_reader): the top object of a reply (a task
 * with no parent) made while the context has no reply callback queued is refused. The reader then
 * fails (hiredis names it "Out of memory"; conn_error below gives the real reason), and hiredis
 * drops the connection as it does for any protocol error: its commands fail, the client connects
 * again with backoff. */
#define UNASKED_WHY "Redis sent a reply that no command waited for"

/* A reply whose arrays claim more than AGW_REDIS_MAX_ELEMENTS (redis.h) elements in all is
 * refused the same way: hiredis 0.14 has no limit of its own, and its reader allocates the claimed
 * number of pointers at once and frees them one by one; "*2147483647\r\n" alone took a worker
 * 16 GB and a minute and a half, and arrays nested in one reply add up (1,024 arrays of 1,024,
 * 7 KB sent, would take 8 MB). */
#define TOO_LONG_WHY "Redis sent an array reply longer than any command of the gateway's takes"

/* A line longer than AGW_REDIS_MAX_LINE_BYTES (redis.h) is refused as it comes (an attack review:
 * a line that never ended, a byte a ms, kept a worker's core busy). */
#define LONG_LINE_WHY "Redis sent a line longer than any reply has"

int agw_redis_line_too_long(const char *buf, size_t pos, size_t len)
{
    /* (the line and its CRLF within MAX + 2 bytes: a line of MAX bytes passes) */
    return len - pos > AGW_REDIS_MAX_LINE_BYTES + 1 &&
           memmem(buf + pos, AGW_REDIS_MAX_LINE_BYTES + 2, "\r\n", 2) == NULL;
}

/* A reply of more than AGW_REDIS_MAX_REPLY_BYTES (redis.h) is refused as its bytes come: its strings
 * in all (guarded_string) and what the reader holds unparsed (guarded_read). hiredis 0.14 keeps
 * reading a bulk string it has not got whole, whatever it claims. */
#define TOO_BIG_WHY "Redis sent a reply larger than any command of the gateway's takes"

static const redisReplyObjectFunctions *hiredis_fns; /* hiredis's defaults, the same for every
                                                         reader (atomic: clients start in threads) */

/* True when the reply task t is the top of a reply that no command waits for. */
static int unasked(const redisReadTask *t)
{
    const redisAsyncContext *ac = t->privdata;
    if (t->parent != NULL || ac->replies.head != NULL)
        return 0;
    agw_redis_t *r = ac->data;
    if (r)
        r->refused = UNASKED_WHY;
    return 1;
}

static const redisReplyObjectFunctions *fns(void)
{
    return __atomic_load_n(&hiredis_fns, __ATOMIC_ACQUIRE);
}

int agw_redis_count_array(const redisReadTask *t, int n, agw_redis_reply_count_t *c, long long max)
{
    if (t->parent == NULL)
        *c = (agw_redis_reply_count_t){0}; /* the top of a new reply */
    c->elements += n;
    return c->elements > max;
}

int agw_redis_count_string(const redisReadTask *t, size_t n, agw_redis_reply_count_t *c, size_t max)
{
    c->bytes = t->parent == NULL ? n : c->bytes + n;
    return c->bytes > max;
}

/* A reply's strings count against AGW_REDIS_MAX_REPLY_BYTES in all, as its arrays' elements do
 * against AGW_REDIS_MAX_ELEMENTS (agw_redis_count_string, agw_redis_count_array). */
static void *guarded_string(const redisReadTask *t, char *s, size_t n)
{
    const redisAsyncContext *ac = t->privdata;
    agw_redis_t *r = ac->data;
    if (r && agw_redis_count_string(t, n, &r->count, AGW_REDIS_MAX_REPLY_BYTES)) {
        r->refused = TOO_BIG_WHY;
        return NULL;
    }
    return unasked(t) ? NULL : fns()->createString(t, s, n);
}

static void *guarded_array(const redisReadTask *t, int n)
{
    const redisAsyncContext *ac = t->privdata;
    agw_redis_t *r = ac->data;
    agw_redis_reply_count_t alone = {0}; /* (a connection dropped by the client itself: each array
                                            counted alone) */
    if (agw_redis_count_array(t, n, r ? &r->count : &alone, AGW_REDIS_MAX_ELEMENTS)) {
        if (r)
            r->refused = TOO_LONG_WHY;
        return NULL;
    }
    return unasked(t) ? NULL : fns()->createArray(t, n);
}

static void *guarded_integer(const redisReadTask *t, long long v)
{
    return unasked(t) ? NULL : fns()->createInteger(t, v);
}

static void *guarded_nil(const redisReadTask *t)
{
    return unasked(t) ? NULL : fns()->createNil(t);
}

static void guarded_free(void *obj)
{
    fns()->freeObject(obj);
}

/* (not const: hiredis's reader holds a plain pointer; nothing writes it) */
static redisReplyObjectFunctions guarded_fns = {guarded_string, guarded_array, guarded_integer, guarded_nil,
                                                 guarded_free};

/* Gives ac's reader the guarded functions (hiredis's own behind the check above). */
static void guard_reader(redisAsyncContext *ac)
{
    redisReader *rd = ac->c.reader;
    if (rd->fn != &guarded_fns) {
        __atomic_store_n(&hiredis_fns, rd->fn, __ATOMIC_RELEASE);
        rd->fn = &guarded_fns;
    }
    rd->privdata = ac; /* (hiredis's redisReaderSetPrivdata casts the pointer to int) */
}

/* The read watcher of a connection (hiredis's libev adapter's, whose callback this replaces): reads
 * as the adapter does, then drops the connection when what its reader holds unparsed is a reply no
 * command waits for (hiredis keeps an unfinished one for as long as it stays unfinished), more than
 * a reply may take, or a line longer than any reply has. Every whole reply has been parsed and
 * answered by then, so the unparsed bytes belong to the reply still coming. hiredis frees a
 * context it disconnected itself during the read; r->ac then no longer names it. */
static void guarded_read(struct ev_loop *loop, ev_io *w, int revents)
{
    (void)loop;
    (void)revents;
    redisLibevEvents *e = w->data;
    redisAsyncContext *ac = e->context;
    agw_redis_t *r = ac->data;
    redisAsyncHandleRead(ac);
    if (r && r->ac == ac) {
        const redisReader *rd = ac->c.reader;
        size_t unparsed = rd->len - rd->pos;
        const char *why = NULL;
        if (unparsed > 0 && ac->replies.head == NULL)
            why = UNASKED_WHY; /* the start of a reply no command waits for, or more of one */
        else if (unparsed > AGW_REDIS_MAX_REPLY_BYTES)
            why = TOO_BIG_WHY;
        else if (agw_redis_line_too_long(rd->buf, rd->pos, rd->len))
            why = LONG_LINE_WHY;
        if (why) {
            r->refused = why;
            lost(r, why);
        }
    }
}

/* Why connection ac of r failed: its error, or the reply its reader refused. */
static const char *conn_error(const agw_redis_t *r, const redisAsyncContext *ac)
{
    if (r->refused)
        return r->refused;
    return ac->err && ac->errstr[0] ? ac->errstr : r->why;
}

/* hiredis's reply callback: the reply, or NULL when the connection is going. Last use of c. */
static void on_reply(redisAsyncContext *ac, void *reply, void *privdata)
{
    cmd_t *c = privdata;
    agw_redis_t *r = c->r;
    redisReply *rep = reply;
    if (!c->answered) {
        if (!rep) {
            char msg[200];
            snprintf(msg, sizeof(msg), "connection lost: %s", conn_error(r, ac));
            /* hiredis fails the pending commands before it calls on_disconnect: the outage starts
             * here, so that they count as its failures */
            if (!c->internal)
                outage_begin(r, "connection lost", conn_error(r, ac));
            answer(c, NULL, msg);
        } else if (rep->type == REDIS_REPLY_ERROR ||
                   (c->internal && !agw_redis_reply_is_ok(rep))) {
            /* (AUTH and SELECT succeed with +OK alone: any other answer is a server that lies or is
             * not Redis, and the connection never becomes ready) */
            if (c->internal) {
                char msg[200];
                if (rep->type == REDIS_REPLY_ERROR)
                    snprintf(msg, sizeof(msg), "AUTH/SELECT refused: %.*s", (int)(rep->len < 160 ? rep->len : 160),
                             rep->str ? rep->str : "");
                else
                    snprintf(msg, sizeof(msg), "AUTH/SELECT answered with something other than OK (a reply of type %d)",
                             rep->type);
                answer(c, NULL, msg);
                if (r->ac == ac)
                    lost(r, msg);
            } else {
                char msg[256];
                snprintf(msg, sizeof(msg), "%.*s", (int)(rep->len < 200 ? rep->len : 200), rep->str ? rep->str : "");
                answer(c, NULL, msg);
            }
        } else {
            int internal = c->internal;
            answer(c, rep, NULL);
            if (internal && r->ac == ac && --r->handshake_left == 0) {
                ev_timer_stop(r->loop, &r->connect_timer);
                r->state = READY;
                r->ready_at = ev_now(r->loop);
                AGW_M_ADD(r->stats->connects, 1);
                AGW_M_SET(r->stats->up, 1);
                outage_end(r);
                r->was_up = 1;
            }
        }
    }
    free(c);
}

static void on_cmd_timeout(agw_timeout_t *t)
{
    cmd_t *c = H2O_STRUCT_FROM_MEMBER(cmd_t, timer, t);
    agw_redis_t *r = c->r;
    if (!c->internal) {
        AGW_M_ADD(r->stats->timeouts, 1);
    }
    char msg[64];
    snprintf(msg, sizeof(msg), "timeout (no answer within %llu ms)", (unsigned long long)r->conf.timeout_ms);
    if (!c->internal)
        outage_begin(r, "connection dropped", "a command timed out"); /* this command is the outage's first failure */
    answer(c, NULL, msg);
    /* the late reply must never answer another command: drop the connection (c is freed by
     * on_reply when hiredis lets go of it) */
    lost(r, "a command timed out");
}

/* Queues a command on the current connection. Returns the command, or NULL when hiredis refused. */
static cmd_t *send_cmd(agw_redis_t *r, agw_redis_cb cb, void *data, int internal, int argc, const char **argv,
                       const size_t *argvlen)
{
    cmd_t *c = agw_calloc(1, sizeof(*c));
    c->r = r;
    c->cb = cb;
    c->data = data;
    c->internal = internal;
    if (redisAsyncCommandArgv(r->ac, on_reply, c, argc, argv, argvlen) != REDIS_OK) {
        free(c);
        return NULL;
    }
    /* the loop's time may be as old as the script that ran before this: time the command from now */
    ev_now_update(r->loop);
    c->started = ev_now(r->loop);
    agw_timeout_init(&c->timer, on_cmd_timeout);
    if (!internal)
        agw_timeout_start(&r->timeouts, &c->timer, (double)r->conf.timeout_ms / 1000.0);
    h2o_linklist_insert(r->cmds.next, &c->link); /* first */
    return c;
}

int agw_redis_command(agw_redis_t *r, agw_redis_cb cb, void *data, int argc, const char **argv,
                      const size_t *argvlen)
{
    AGW_M_ADD(r->stats->commands, 1);
    if (r->state != READY || !send_cmd(r, cb, data, 0, argc, argv, argvlen)) {
        AGW_M_ADD(r->stats->errors, 1);
        if (r->logged_down)
            r->down_failed++;
        return -1;
    }
    return 0;
}

static void noop_cb(void *data, const struct redisReply *reply, const char *err)
{
    (void)data;
    (void)reply;
    (void)err;
}

/* ---- connection ----------------------------------------------------------------------------- */

static uint64_t next_rand(agw_redis_t *r)
{
    r->rng ^= r->rng << 13;
    r->rng ^= r->rng >> 7;
    r->rng ^= r->rng << 17;
    return r->rng;
}

static void schedule_retry(agw_redis_t *r)
{
    uint64_t wait = r->backoff_ms;
    wait = wait * 3 / 4 + next_rand(r) % (wait / 4 + 1); /* 75 % .. 100 % */
    r->backoff_ms = r->backoff_ms * 2 > BACKOFF_MAX_MS ? BACKOFF_MAX_MS : r->backoff_ms * 2;
    ev_timer_stop(r->loop, &r->retry);
    ev_timer_set(&r->retry, (double)wait / 1000.0, 0.);
    ev_timer_start(r->loop, &r->retry);
}

/* An outage begins: logged once, with its cause; outage_end logs its end. One start line and one end
 * line per outage (never a line per failed command or per interval), so a long outage does not
 * flood the log and its length and cost are read from the end line. */
static void outage_begin(agw_redis_t *r, const char *what, const char *why)
{
    if (r->logged_down)
        return;
    agw_log(AGW_LOG_WARN, "redis %s: %s (%s); callers get errors until it is back, retrying with backoff", r->addr,
            what, why);
    r->logged_down = 1;
    r->down_since = ev_now(r->loop);
    r->down_failed = 0;
}

/* The outage begun by outage_begin ended: a connection is ready again. */
static void outage_end(agw_redis_t *r)
{
    if (!r->logged_down)
        return;
    ev_now_update(r->loop);
    agw_log(AGW_LOG_INFO, "redis %s: connected again after %.1f s down; %llu of its commands failed meanwhile", r->addr,
            ev_now(r->loop) - r->down_since, (unsigned long long)r->down_failed);
    r->logged_down = 0;
}

/* The connection is gone or unusable: forget it (hiredis fails its commands), log the change once,
 * and connect again after the backoff. */
static void lost(agw_redis_t *r, const char *why)
{
    redisAsyncContext *ac = r->ac;
    snprintf(r->why, sizeof(r->why), "%s", why);
    if (r->state == READY && ev_now(r->loop) - r->ready_at >= HEALTHY_S)
        r->backoff_ms = BACKOFF_FIRST_MS;
    if (r->state == READY) {
        AGW_M_ADD(r->stats->disconnects, 1);
        AGW_M_SET(r->stats->up, 0);
    }
    outage_begin(r, r->was_up ? "connection lost" : "cannot connect", why);
    r->ac = NULL;
    r->state = DOWN;
    ev_timer_stop(r->loop, &r->connect_timer);
    if (ac) {
        ac->data = NULL;
        redisAsyncFree(ac); /* runs on_reply(NULL) for every command on it (later when inside a callback) */
    }
    schedule_retry(r);
}

static void on_connect(const redisAsyncContext *ac, int status)
{
    agw_redis_t *r = ac->data;
    if (!r || r->ac != ac)
        return;
    if (status != REDIS_OK) {
        char why[200];
        snprintf(why, sizeof(why), "%s", ac->errstr[0] ? ac->errstr : "connect failed");
        /* hiredis frees ac after this callback */
        r->ac = NULL;
        ((redisAsyncContext *)ac)->data = NULL;
        if (r->state == READY) {
            AGW_M_ADD(r->stats->disconnects, 1);
            AGW_M_SET(r->stats->up, 0);
        }
        r->state = DOWN;
        ev_timer_stop(r->loop, &r->connect_timer);
        outage_begin(r, "cannot connect", why);
        schedule_retry(r);
        return;
    }
    r->state = HANDSHAKE;
    r->handshake_left = 0;
    char dbs[16];
    snprintf(dbs, sizeof(dbs), "%d", r->conf.db);
    if (r->conf.password) {
        const char *argv[3] = {"AUTH", r->conf.user ? r->conf.user : r->conf.password, r->conf.password};
        if (!send_cmd(r, noop_cb, NULL, 1, r->conf.user ? 3 : 2, argv, NULL))
            return lost(r, "AUTH could not be sent");
        r->handshake_left++;
    }
    /* SELECT even for db 0: the first answer proves the server speaks RESP before callers use it */
    const char *argv[2] = {"SELECT", dbs};
    if (!send_cmd(r, noop_cb, NULL, 1, 2, argv, NULL))
        return lost(r, "SELECT could not be sent");
    r->handshake_left++;
}

static void on_disconnect(const redisAsyncContext *ac, int status)
{
    agw_redis_t *r = ac->data;
    if (!r || r->ac != ac)
        return; /* a connection we dropped ourselves */
    char why[200];
    snprintf(why, sizeof(why), "%s",
             r->refused ? r->refused : status == REDIS_OK ? "closed" : (ac->errstr[0] ? ac->errstr : "error"));
    r->ac = NULL; /* hiredis frees it after this callback */
    ((redisAsyncContext *)ac)->data = NULL;
    lost(r, why);
}

static void on_connect_timeout(struct ev_loop *loop, ev_timer *t, int revents)
{
    (void)loop;
    (void)revents;
    agw_redis_t *r = t->data;
    if (r->state == CONNECTING || r->state == HANDSHAKE)
        lost(r, "no connection within the connect timeout");
}

static void on_retry(struct ev_loop *loop, ev_timer *t, int revents)
{
    (void)loop;
    (void)revents;
    connect_now(t->data);
}

static void connect_now(agw_redis_t *r)
{
    redisAsyncContext *ac = redisAsyncConnect(r->conf.host, r->conf.port);
    if (!ac)
        abort();
    if (ac->err) {
        char why[200];
        snprintf(why, sizeof(why), "%s", ac->errstr);
        redisAsyncFree(ac);
        r->ac = NULL;
        r->state = DOWN;
        outage_begin(r, "cannot connect", why);
        schedule_retry(r);
        return;
    }
    ac->data = r;
    r->ac = ac;
    r->refused = NULL;
    guard_reader(ac);
    r->state = CONNECTING;
    redisLibevAttach(r->loop, ac);
    ev_set_cb(&((redisLibevEvents *)ac->ev.data)->rev, guarded_read);
    redisAsyncSetConnectCallback(ac, on_connect);
    redisAsyncSetDisconnectCallback(ac, on_disconnect);
    ev_timer_set(&r->connect_timer, (double)r->conf.connect_timeout_ms / 1000.0, 0.);
    ev_timer_start(r->loop, &r->connect_timer);
}

int agw_redis_reply_is_ok(const redisReply *reply)
{
    return reply != NULL && reply->type == REDIS_REPLY_STATUS && reply->len == 2 && memcmp(reply->str, "OK", 2) == 0;
}

void agw_redis_drop(agw_redis_t *r, const char *why)
{
    if (r->ac == NULL)
        return;
    r->refused = why;
    lost(r, why); /* (inside a callback hiredis frees the context once the callback returns) */
}

void agw_redis_set_owner(agw_redis_t *r, const char *owner)
{
    size_t n = strlen(r->addr);
    snprintf(r->addr + n, sizeof(r->addr) - n, " (%.40s)", owner);
}

agw_redis_t *agw_redis_new(struct ev_loop *loop, const agw_redis_conf_t *conf, agw_redis_stats_t *stats)
{
    agw_redis_t *r = agw_calloc(1, sizeof(*r));
    h2o_linklist_init_anchor(&r->cmds);
    r->loop = loop;
    conf_copy(&r->conf, conf);
    r->stats = stats ? stats : &r->own_stats;
    r->backoff_ms = BACKOFF_FIRST_MS;
    r->rng = (uint64_t)(uintptr_t)r ^ (uint64_t)(ev_now(loop) * 1e6) ^ 0x9e3779b97f4a7c15ull;
    if (!r->rng)
        r->rng = 1;
    snprintf(r->addr, sizeof(r->addr), strchr(conf->host, ':') ? "[%s]:%d/%d" : "%s:%d/%d", conf->host, conf->port,
             conf->db);
    ev_timer_init(&r->retry, on_retry, 0., 0.);
    r->retry.data = r;
    ev_timer_init(&r->connect_timer, on_connect_timeout, 0., 0.);
    r->connect_timer.data = r;
    agw_timeouts_init(&r->timeouts, loop);
    /* a reply and the timeout due in the same loop iteration: the reply (default priority) wins */
    agw_timeouts_set_priority(&r->timeouts, EV_MINPRI);
    connect_now(r);
    return r;
}

void agw_redis_free(agw_redis_t *r)
{
    if (!r)
        return;
    ev_timer_stop(r->loop, &r->retry);
    ev_timer_stop(r->loop, &r->connect_timer);
    /* answer the callers first, so that they see "client closed" rather than a connection error */
    while (!h2o_linklist_is_empty(&r->cmds))
        answer(H2O_STRUCT_FROM_MEMBER(cmd_t, link, r->cmds.next), NULL, "client closed");
    if (r->ac) {
        redisAsyncContext *ac = r->ac;
        r->ac = NULL;
        ac->data = NULL;
        redisAsyncFree(ac);
    }
    if (r->state == READY)
        AGW_M_SET(r->stats->up, 0);
    agw_timeouts_free(&r->timeouts); /* (inside a command's timeout: that run ends) */
    agw_redis_conf_clear(&r->conf);
    free(r);
}

int agw_redis_ready(const agw_redis_t *r)
{
    return r->state == READY;
}

const agw_redis_conf_t *agw_redis_conf(const agw_redis_t *r)
{
    return &r->conf;
}
