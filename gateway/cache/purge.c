/* purge.c: purging by key prefix (purge.h). */
#include "cache/purge.h"
#include "base/mem.h"

#include <hiredis/hiredis.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>

void agw_cache_inbox_init(agw_cache_inbox_t *in)
{
    memset(in, 0, sizeof(*in));
    pthread_mutex_init(&in->lock, NULL);
}

void agw_cache_inbox_free(agw_cache_inbox_t *in)
{
    for (size_t i = 0; i < in->n; i++)
        free(in->prefixes[i]);
    free(in->prefixes);
    free(in->lens);
    pthread_mutex_destroy(&in->lock);
}

void agw_cache_inbox_post(agw_cache_inbox_t *in, const char *prefix, size_t len)
{
    char *copy = agw_malloc(len + 1);
    memcpy(copy, prefix, len);
    copy[len] = '\0';
    pthread_mutex_lock(&in->lock);
    if (in->n == in->cap) {
        size_t cap = in->cap ? in->cap * 2 : 4;
        in->prefixes = agw_realloc(in->prefixes, cap * sizeof(*in->prefixes));
        in->lens = agw_realloc(in->lens, cap * sizeof(*in->lens));
        in->cap = cap;
    }
    in->prefixes[in->n] = copy;
    in->lens[in->n] = len;
    in->n++;
    pthread_mutex_unlock(&in->lock);
}

size_t agw_cache_inbox_take(agw_cache_inbox_t *in, void (*apply)(void *arg, const char *prefix, size_t len), void *arg)
{
    pthread_mutex_lock(&in->lock);
    char **p = in->prefixes;
    size_t *l = in->lens, n = in->n;
    in->prefixes = NULL;
    in->lens = NULL;
    in->n = in->cap = 0;
    pthread_mutex_unlock(&in->lock);
    for (size_t i = 0; i < n; i++) {
        apply(arg, p[i], l[i]);
        free(p[i]);
    }
    free(p);
    free(l);
    return n;
}

/* The prefix with glob characters escaped, then '*' (SCAN MATCH). */
static char *match_pattern(const char *prefix, size_t len, size_t *out_len)
{
    char *m = agw_malloc(2 * len + 2);
    size_t j = 0;
    for (size_t i = 0; i < len; i++) {
        if (strchr("*?[]\\^", prefix[i]) && prefix[i] != '\0')
            m[j++] = '\\';
        m[j++] = prefix[i];
    }
    m[j++] = '*';
    m[j] = '\0';
    *out_len = j;
    return m;
}

/* ---- the reader's guard: a reply whose arrays claim more elements in all than a purge's
 * commands take (SCAN gives about COUNT keys) fails, as does one whose strings are more bytes in all than
 * it takes (agw_redis_count_array, agw_redis_count_string, redis/redis.h). The connection's reader makes objects
 * with a copy of hiredis's functions whose createArray and createString count first. */

/* A connection's reader's state (its privdata). */
typedef struct guard {
    void *(*create_array)(const redisReadTask *t, int n); /* hiredis's own */
    void *(*create_string)(const redisReadTask *t, char *s, size_t n); /* hiredis's own */
    agw_redis_reply_count_t count; /* what the reply being read claims so far */
    int too_long;       /* a reply was refused for them (the reason, for the message) */
    int too_large;      /* a reply was refused for its bytes (reply_within) */
    int line_too_long;  /* a reply was refused for a line longer than any reply has (reply_within) */
} guard_t;

static void *guard_array(const redisReadTask *t, int n)
{
    guard_t *g = t->privdata;
    if (agw_redis_count_array(t, n, &g->count, AGW_CACHE_PURGE_MAX_ELEMENTS)) {
        g->too_long = 1;
        return NULL; /* the reader fails: the command gets no reply */
    }
    return g->create_array(t, n);
}

/* A reply's strings count against AGW_CACHE_PURGE_MAX_BYTES in all: each string of an array leaves
 * the reader's buffer once made, so the bound on its unparsed bytes (reply_within) alone let SCAN's
 * keys of 8 MB each add up to gigabytes (an attack review). */
static void *guard_string(const redisReadTask *t, char *s, size_t n)
{
    guard_t *g = t->privdata;
    if (agw_redis_count_string(t, n, &g->count, AGW_CACHE_PURGE_MAX_BYTES)) {
        g->too_large = 1;
        return NULL;
    }
    return g->create_string(t, s, n);
}

/* A purge's connection: hiredis's context, its reader's functions and guard, the purge's
 * deadline. */
typedef struct purge_conn {
    redisContext *c;
    redisReplyObjectFunctions fns; /* (the reader holds a pointer to them: they live as long) */
    guard_t guard;
    double until; /* monotonic s */
    int late;     /* a reply was still coming at the deadline */
    const int *cancel; /* set (atomics) by the purge's owner to stop it: looked at with the deadline */
} purge_conn_t;

/* Why a command failed on p: the deadline, the reader's refusal, else hiredis's own text. */
static const char *why(const purge_conn_t *p)
{
    if (p->late)
        return "the purge's time ran out while Redis answered";
    if (p->guard.too_large)
        return "the reply is larger than a purge takes";
    if (p->guard.line_too_long)
        return "the reply has a line longer than any reply has";
    return p->guard.too_long ? "the reply is an array of more elements than a purge takes" : p->c->errstr;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* Whether p is past its deadline or cancelled. */
static int over(const purge_conn_t *p)
{
    return now_s() > p->until || (p->cancel && __atomic_load_n(p->cancel, __ATOMIC_ACQUIRE));
}

/* The reply to the command appended to p's context, read one socket read at a time until the
 * purge's deadline (hiredis's blocking redisCommand reads until the reply is whole: a server that
 * drips a reply a byte at a time, each within the socket's timeout, held it for good). NULL when
 * the command failed (why says so). */
static redisReply *reply_within(purge_conn_t *p)
{
    int done = 0;
    for (;;) { /* a write at a time too: a server that reads slowly held it as long */
        if (redisBufferWrite(p->c, &done) == REDIS_ERR)
            return NULL;
        if (done)
            break;
        if (over(p)) {
            p->late = 1;
            return NULL;
        }
    }
    void *reply = NULL;
    if (redisGetReplyFromReader(p->c, &reply) == REDIS_ERR)
        return NULL;
    while (reply == NULL) { /* a read at a time, and the deadline looked at after each one that left it short */
        if (redisBufferRead(p->c) == REDIS_ERR)
            return NULL;
        /* the bytes of a reply not yet whole (a bulk string is kept whole before it is made: one
         * claiming 400 MB took as much) */
        if (p->c->reader->len - p->c->reader->pos > AGW_CACHE_PURGE_MAX_BYTES) {
            p->guard.too_large = 1;
            return NULL;
        }
        if (agw_redis_line_too_long(p->c->reader->buf, p->c->reader->pos, p->c->reader->len)) {
            p->guard.line_too_long = 1; /* (hiredis looks for its end from its start at every read) */
            return NULL;
        }
        if (redisGetReplyFromReader(p->c, &reply) == REDIS_ERR)
            return NULL;
        if (reply == NULL && over(p)) {
            p->late = 1;
            return NULL;
        }
    }
    return reply;
}

/* What a command that did not succeed got, for its message: an error reply's text, another reply,
 * or why there was none. */
static const char *answered(const redisReply *r, const purge_conn_t *p)
{
    if (!r)
        return why(p);
    return r->type == REDIS_REPLY_ERROR && r->str ? r->str : "a reply other than OK";
}

/* The command fmt … on p (hiredis's format), its reply read within the deadline. */
static redisReply *command(purge_conn_t *p, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int rc = redisvAppendCommand(p->c, fmt, ap);
    va_end(ap);
    return rc == REDIS_OK ? reply_within(p) : NULL;
}

int agw_cache_redis_purge(const agw_redis_conf_t *conf, const char *prefix, size_t len, const int *cancel,
                          uint64_t *deleted, char *err, size_t errlen)
{
    return agw_cache_redis_purge_within(conf, prefix, len, AGW_CACHE_PURGE_BUDGET_S, cancel, deleted, err, errlen);
}

int agw_cache_redis_purge_within(const agw_redis_conf_t *conf, const char *prefix, size_t len, double budget_s,
                                 const int *cancel, uint64_t *deleted, char *err, size_t errlen)
{
    double until = now_s() + budget_s;
    uint64_t ms = conf->timeout_ms > 1000 ? conf->timeout_ms : 1000;
    struct timeval tv = {(time_t)(ms / 1000), (suseconds_t)(ms % 1000) * 1000};
    redisContext *c = redisConnectWithTimeout(conf->host, conf->port, tv);
    *deleted = 0;
    if (!c || c->err) {
        snprintf(err, errlen, "cannot connect to redis %s:%d: %s", conf->host, conf->port, c ? c->errstr : "no memory");
        redisFree(c);
        return -1;
    }
    redisSetTimeout(c, tv);
    purge_conn_t p = {.c = c, .fns = *c->reader->fn, .until = until, .cancel = cancel};
    p.guard.create_array = p.fns.createArray;
    p.fns.createArray = guard_array;
    p.guard.create_string = p.fns.createString;
    p.fns.createString = guard_string;
    c->reader->fn = &p.fns;
    c->reader->privdata = &p.guard;
    int rc = 0;
    redisReply *r;
    if (conf->password) {
        r = conf->user ? command(&p, "AUTH %s %s", conf->user, conf->password)
                       : command(&p, "AUTH %s", conf->password);
        if (!agw_redis_reply_is_ok(r)) { /* (any other answer: a server that lies or is not Redis) */
            snprintf(err, errlen, "redis AUTH failed: %s", answered(r, &p));
            freeReplyObject(r);
            redisFree(c);
            return -1;
        }
        freeReplyObject(r);
    }
    r = command(&p, "SELECT %d", conf->db);
    if (!agw_redis_reply_is_ok(r)) { /* (any other answer: a server that lies or is not Redis) */
        snprintf(err, errlen, "redis SELECT failed: %s", answered(r, &p));
        freeReplyObject(r);
        redisFree(c);
        return -1;
    }
    freeReplyObject(r);
    size_t mlen;
    char *match = match_pattern(prefix, len, &mlen);
    char cursor[32] = "0";
    do {
        r = command(&p, "SCAN %s MATCH %b COUNT 1000", cursor, match, mlen);
        if (!r || r->type != REDIS_REPLY_ARRAY || r->elements != 2 || r->element[0]->type != REDIS_REPLY_STRING ||
            r->element[1]->type != REDIS_REPLY_ARRAY) {
            snprintf(err, errlen, "redis SCAN failed: %s",
                     !r ? why(&p) : r->type == REDIS_REPLY_ERROR ? r->str : "unexpected reply");
            freeReplyObject(r);
            rc = -1;
            break;
        }
        snprintf(cursor, sizeof(cursor), "%.*s", (int)r->element[0]->len, r->element[0]->str);
        redisReply *keys = r->element[1];
        if (keys->elements > 0) {
            const char **argv = agw_malloc((keys->elements + 1) * sizeof(*argv));
            size_t *lens = agw_malloc((keys->elements + 1) * sizeof(*lens));
            argv[0] = "UNLINK";
            lens[0] = 6;
            size_t n = 1;
            for (size_t i = 0; i < keys->elements; i++) {
                /* only the keys the prefix names: a server or a proxy that answers SCAN with other
                 * keys (the rate limits' counts, another application's) gets none of them deleted */
                if (keys->element[i]->type != REDIS_REPLY_STRING || keys->element[i]->len < len ||
                    memcmp(keys->element[i]->str, prefix, len) != 0)
                    continue;
                argv[n] = keys->element[i]->str;
                lens[n++] = keys->element[i]->len;
            }
            redisReply *u = n > 1 && redisAppendCommandArgv(c, (int)n, argv, lens) == REDIS_OK ? reply_within(&p) : NULL;
            if (n > 1 && (!u || u->type != REDIS_REPLY_INTEGER)) {
                snprintf(err, errlen, "redis UNLINK failed: %s",
                         !u ? why(&p) : u->type == REDIS_REPLY_ERROR ? u->str : "unexpected reply");
                rc = -1;
            } else if (u) {
                *deleted += (uint64_t)u->integer;
            }
            freeReplyObject(u);
            free(argv);
            free(lens);
        }
        freeReplyObject(r);
        if (rc == 0 && strcmp(cursor, "0") != 0 && cancel && __atomic_load_n(cancel, __ATOMIC_ACQUIRE)) {
            snprintf(err, errlen, "the purge was stopped with %llu keys deleted (the gateway stopped)",
                     (unsigned long long)*deleted);
            rc = -1;
        } else if (rc == 0 && strcmp(cursor, "0") != 0 && now_s() > until) {
            snprintf(err, errlen, "the purge stopped after %.0f s with %llu keys deleted: SCAN had not ended (a "
                     "keyspace too large for one purge, or a server whose SCAN never ends); purge again",
                     budget_s, (unsigned long long)*deleted);
            rc = -1;
        }
    } while (rc == 0 && strcmp(cursor, "0") != 0);
    free(match);
    redisFree(c);
    return rc;
}
