/* purge.c: purging by key prefix (purge.h). */
#include "cache/purge.h"
#include "base/mem.h"

#include <hiredis/hiredis.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>

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

int agw_cache_redis_purge(const agw_redis_conf_t *conf, const char *prefix, size_t len, uint64_t *deleted, char *err,
                          size_t errlen)
{
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
    int rc = 0;
    redisReply *r;
    if (conf->password) {
        r = conf->user ? redisCommand(c, "AUTH %s %s", conf->user, conf->password)
                       : redisCommand(c, "AUTH %s", conf->password);
        if (!r || r->type == REDIS_REPLY_ERROR) {
            snprintf(err, errlen, "redis AUTH failed: %s", r ? r->str : c->errstr);
            freeReplyObject(r);
            redisFree(c);
            return -1;
        }
        freeReplyObject(r);
    }
    r = redisCommand(c, "SELECT %d", conf->db);
    if (!r || r->type == REDIS_REPLY_ERROR) {
        snprintf(err, errlen, "redis SELECT failed: %s", r ? r->str : c->errstr);
        freeReplyObject(r);
        redisFree(c);
        return -1;
    }
    freeReplyObject(r);
    size_t mlen;
    char *match = match_pattern(prefix, len, &mlen);
    char cursor[32] = "0";
    do {
        r = redisCommand(c, "SCAN %s MATCH %b COUNT 1000", cursor, match, mlen);
        if (!r || r->type != REDIS_REPLY_ARRAY || r->elements != 2 || r->element[0]->type != REDIS_REPLY_STRING ||
            r->element[1]->type != REDIS_REPLY_ARRAY) {
            snprintf(err, errlen, "redis SCAN failed: %s", !r ? c->errstr : r->type == REDIS_REPLY_ERROR ? r->str : "unexpected reply");
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
                if (keys->element[i]->type != REDIS_REPLY_STRING)
                    continue;
                argv[n] = keys->element[i]->str;
                lens[n++] = keys->element[i]->len;
            }
            redisReply *u = n > 1 ? redisCommandArgv(c, (int)n, argv, lens) : NULL;
            if (n > 1 && (!u || u->type != REDIS_REPLY_INTEGER)) {
                snprintf(err, errlen, "redis UNLINK failed: %s", !u ? c->errstr : u->type == REDIS_REPLY_ERROR ? u->str : "unexpected reply");
                rc = -1;
            } else if (u) {
                *deleted += (uint64_t)u->integer;
            }
            freeReplyObject(u);
            free(argv);
            free(lens);
        }
        freeReplyObject(r);
    } while (rc == 0 && strcmp(cursor, "0") != 0);
    free(match);
    redisFree(c);
    return rc;
}
