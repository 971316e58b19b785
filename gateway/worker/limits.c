/* limits.c: limits and priority shedding before any Lua runs (DESIGN §9: route match → auth →
 * limits → the script; worker_internal.h, "limits.c"). Local rules are counted in the process's
 * store (limits/limit.h) at once; Redis rules (store = "redis") in one script call
 * (limits/limit_redis.h) through the worker's Redis client while the request is parked
 * (worker_internal.h, "park.c"). */
#include "worker/worker_internal.h"

#include <hiredis/hiredis.h>
#include <inttypes.h>
#include <arpa/inet.h>
#include <netinet/in.h>

#include "base/log.h"
#include "base/mem.h"
#include "limits/gate.h"
#include "limits/limit_redis.h"
#include "limits/limit_seen.h"

/* Rules one request is checked against, at most (more in one endpoint's list are not checked). */
#define LIMITS_MAX AGW_LIMIT_REDIS_MAX

/* One request's check: its rules, their answers, and what the request needs to go on. */
typedef struct gate_check {
    size_t n;
    agw_limit_ask_t asks[LIMITS_MAX];
    agw_limit_result_t results[LIMITS_MAX];
    uint64_t now_ms;
} gate_check_t;

struct redis_ask;

/* A request parked while Redis counts its Redis rules. */
typedef struct gate_wait {
    agw_park_t park;            /* first (park.c) */
    struct redis_ask *ask;      /* the command in flight, NULL once answered or given up */
    gate_check_t c;
    int redis_ok;               /* Redis's verdict is in c.results (its rules') */
    char why[128];              /* else: why not, for the outage log */
    int endpoint;
    double parked_at;           /* ev_now() when it parked */
    int deadline_first;         /* the endpoint's deadline ends the wait before redis.timeout_ms */
    agw_route_param_t params[AGW_ROUTE_MAX_PARAMS];
    size_t num_params;
    agw_auth_result_t user;     /* the edge's verdict (its claims reference is the wait's) */
    agw_gate_start_fn start;
} gate_wait_t;

/* A command in flight: on the heap, freed by its callback (redis.h: called exactly once), so
 * that a request that ended first (client gone, deadline) leaves nothing dangling. */
typedef struct redis_ask {
    gate_wait_t *wait;          /* NULL once the request stopped waiting for it */
    agw_worker_t *w;
    wgen_t *g;                  /* held until the reply: asks[].rule are its config's (a request that
                                   stopped waiting, then a reload, would leave them freed) */
    int eval;                   /* this command is EVAL (the retry after NOSCRIPT) */
    int charge;                 /* a refused authentication's count (agw_worker_gate_charge): no
                                   request waits for it, it is retried after NOSCRIPT as well, and
                                   it counts in w->lim.charges until freed */
    size_t n;                   /* Redis rules in the command */
    agw_limit_ask_t asks[LIMITS_MAX];
    size_t key_off[LIMITS_MAX], key_len[LIMITS_MAX]; /* each rule's key bytes in keys */
    agw_buf_t keys;
    uint64_t now_ms;
    uint64_t check;             /* what the reply must give back (agw_limit_redis_command) */
} redis_ask_t;

/* ---- keys ----------------------------------------------------------------------------------- */

/* "<kind>:<name>" in req's pool: a user rule's key (limit_key). */
static void kind_key(h2o_req_t *req, const char *kind, const char *name, size_t nlen, const char **key, size_t *len)
{
    size_t klen = strlen(kind);
    char *k = h2o_mem_alloc_pool(&req->pool, klen + 1 + nlen);
    memcpy(k, kind, klen);
    k[klen] = ':';
    memcpy(k + klen + 1, name, nlen);
    *key = k;
    *len = klen + 1 + nlen;
}

/* The bytes rule r counts req by: the client's address (agw_limit_ip_key: IPv4, or IPv6's /64), the route
 * pattern, the header's value, the API key's app, or the user: "jwt:<sub>" or "api_key:<app>" (what the
 * edge accepted, named by its kind: a token whose subject is an app's name is not that app; an attack
 * review). Absent: empty. */
static void limit_key(const agw_limit_rule_t *r, h2o_req_t *req, const char *route, const agw_auth_result_t *user,
                      const char **key, size_t *len, struct sockaddr_storage *ss)
{
    *key = "";
    *len = 0;
    if (r->key == AGW_LIMIT_KEY_USER) {
        json_t *sub = user->claims ? json_object_get(user->claims, "sub") : NULL;
        if (json_is_string(sub))
            kind_key(req, "jwt", json_string_value(sub), json_string_length(sub), key, len);
        else if (user->key)
            kind_key(req, "api_key", user->key->app, strlen(user->key->app), key, len);
    } else if (r->key == AGW_LIMIT_KEY_API_KEY) {
        if (user->key) {
            *key = user->key->app;
            *len = strlen(user->key->app);
        }
    } else if (r->key == AGW_LIMIT_KEY_ROUTE) {
        *key = route;
        *len = strlen(route);
    } else if (r->key == AGW_LIMIT_KEY_HEADER) {
        ssize_t i = h2o_find_header_by_str(&req->headers, r->header, strlen(r->header), -1);
        if (i >= 0) {
            *key = req->headers.entries[i].value.base;
            *len = req->headers.entries[i].value.len;
        }
    } else if (req->conn->callbacks->get_peername && req->conn->callbacks->get_peername(req->conn, (void *)ss) > 0) {
        if (ss->ss_family == AF_INET)
            *len = agw_limit_ip_key(AF_INET, &((struct sockaddr_in *)ss)->sin_addr, key);
        else if (ss->ss_family == AF_INET6)
            *len = agw_limit_ip_key(AF_INET6, &((struct sockaddr_in6 *)ss)->sin6_addr, key);
    }
}

/* Pushes the table a key function gets (agg.limits, "function keys"): method, path, route, query,
 * headers (lower-case names; a repeated header's first value, as a rule keyed by a header counts
 * it), ip, user. */
static void push_key_req(lua_State *L, h2o_req_t *req, const char *route, const agw_auth_result_t *user)
{
    size_t path_len = req->query_at != SIZE_MAX ? req->query_at : req->path.len;
    lua_createtable(L, 0, 7);
    lua_pushlstring(L, req->method.base, req->method.len);
    lua_setfield(L, -2, "method");
    lua_pushlstring(L, req->path.base, path_len);
    lua_setfield(L, -2, "path");
    lua_pushstring(L, route);
    lua_setfield(L, -2, "route");
    if (req->query_at != SIZE_MAX) {
        lua_pushlstring(L, req->path.base + req->query_at + 1, req->path.len - req->query_at - 1);
        lua_setfield(L, -2, "query");
    }
    lua_createtable(L, 0, (int)req->headers.size);
    for (size_t i = 0; i < req->headers.size; i++) {
        const h2o_header_t *h = &req->headers.entries[i];
        lua_pushlstring(L, h->name->base, h->name->len);
        lua_pushvalue(L, -1);
        lua_rawget(L, -3);
        if (!lua_isnil(L, -1)) { /* a repeat: the first one counts */
            lua_pop(L, 2);
            continue;
        }
        lua_pop(L, 1);
        lua_pushlstring(L, h->value.base, h->value.len);
        lua_rawset(L, -3);
    }
    lua_setfield(L, -2, "headers");
    struct sockaddr_storage ss;
    char ip[INET6_ADDRSTRLEN] = "";
    if (req->conn->callbacks->get_peername && req->conn->callbacks->get_peername(req->conn, (void *)&ss) > 0) {
        if (ss.ss_family == AF_INET)
            inet_ntop(AF_INET, &((struct sockaddr_in *)&ss)->sin_addr, ip, sizeof(ip));
        else if (ss.ss_family == AF_INET6)
            inet_ntop(AF_INET6, &((struct sockaddr_in6 *)&ss)->sin6_addr, ip, sizeof(ip));
    }
    lua_pushstring(L, ip);
    lua_setfield(L, -2, "ip");
    json_t *sub = user->claims ? json_object_get(user->claims, "sub") : NULL;
    if (user->claims || user->key) {
        lua_createtable(L, 0, 3);
        lua_pushstring(L, user->key ? "api_key" : "jwt");
        lua_setfield(L, -2, "via");
        if (json_is_string(sub)) {
            lua_pushlstring(L, json_string_value(sub), json_string_length(sub));
            lua_setfield(L, -2, "sub");
        }
        if (user->key) {
            lua_pushstring(L, user->key->app);
            lua_setfield(L, -2, "app");
            lua_pushstring(L, user->key->plan);
            lua_setfield(L, -2, "plan");
        }
        lua_setfield(L, -2, "user");
    }
}

/* The key of rule r (index in limits.rules) from its key function, run in g's VM under the script
 * time limit: 1 with *key and *len (the string stays on the Lua stack: the caller restores the stack's
 * top once it copied or hashed it), 0 when the function returned nil (the rule does not apply), -1
 * when it failed (logged at most once per 10 s per message, counted; the rule does not apply).
 * *reqt: the stack index of the request's table, pushed on first use (0 before). */
static int function_key(agw_worker_t *w, wgen_t *g, const agw_limit_rule_t *r, uint32_t index, h2o_req_t *req,
                        const char *route, const agw_auth_result_t *user, int *reqt, const char **key, size_t *len)
{
    lua_State *L = g->L;
    if (g->ref_limit_key == LUA_NOREF || !lua_checkstack(L, 8))
        return -1;
    if (*reqt == 0) {
        push_key_req(L, req, route, user);
        *reqt = lua_gettop(L);
    }
    lua_rawgeti(L, LUA_REGISTRYINDEX, g->ref_limit_key);
    lua_rawgeti(L, LUA_REGISTRYINDEX, g->ref_limit_out);
    lua_pushinteger(L, (lua_Integer)index + 1);
    lua_pushvalue(L, *reqt);
    if (agw_worker_call_runtime(g, 3) != 0) { /* logged there */
        agw_limit_count_error(w->limits, (agw_limit_rule_t *)r, 0);
        return -1;
    }
    lua_rawgeti(L, LUA_REGISTRYINDEX, g->ref_limit_out);
    lua_getfield(L, -1, "err");
    if (lua_isstring(L, -1)) {
        agw_worker_warn(w, lua_tostring(L, -1));
        agw_limit_count_error(w->limits, (agw_limit_rule_t *)r, 0);
        lua_pop(L, 2);
        return -1;
    }
    lua_pop(L, 1);
    lua_getfield(L, -1, "key");
    lua_remove(L, -2);
    if (lua_type(L, -1) != LUA_TSTRING) {
        lua_pop(L, 1);
        return 0;
    }
    *key = lua_tolstring(L, -1, len);
    return 1;
}

/* ---- the answer ----------------------------------------------------------------------------- */

/* Adds one header whose value is in b (copied into the request's memory). */
static void add_field(h2o_req_t *req, const h2o_token_t *token, const char *name, const agw_buf_t *b)
{
    h2o_iovec_t v = h2o_strdup(&req->pool, b->base, b->len);
    if (token)
        h2o_add_header(&req->pool, &req->res.headers, token, NULL, v.base, v.len);
    else
        h2o_add_header_by_str(&req->pool, &req->res.headers, name, strlen(name), 0, NULL, v.base, v.len);
}

/* Counts the decision of c in the metrics, notes it for the access log and the waterfall (store:
 * AGW_TRACE_LIMIT_*; waited_s: the time parked), puts the RateLimit fields on the response
 * (refused, or limits.headers) and answers a refused request: 429 quota-exceeded, or 503 when only
 * rules whose Redis could not answer and whose on_redis_error is "deny" refused (deny: marks
 * those). Returns 1 when it answered. c->n > 0. */
static int conclude(agw_worker_t *w, wgen_t *g, h2o_req_t *req, int endpoint, gate_check_t *c, const int *deny,
                    uint8_t store, double waited_s)
{
    agw_limit_verdict_t v = {.results = c->results};
    int allowed = agw_limit_decide(&v, c->n);
    agw_trace_limit_t *note = &w->lim.note; /* for the access log and the waterfall */
    snprintf(note->rule, sizeof(note->rule), "%s", c->asks[v.decisive].rule->name);
    note->remaining = c->results[v.decisive].remaining;
    note->allowed = (uint8_t)allowed;
    note->store = store;
    note->wait_us = waited_s > 0 ? (uint32_t)(waited_s * 1e6) : 0;
    w->lim.has_note = 1;
    for (size_t i = 0; i < c->n; i++) /* the rules are the generation's: the counter index is set once */
        if (allowed || !c->results[i].allowed)
            agw_limit_count(w->limits, (agw_limit_rule_t *)c->asks[i].rule, allowed);
    if (allowed && !g->conf->limits.headers)
        return 0;
    agw_buf_t *b = &w->scratch.out;
    agw_buf_reset(b);
    agw_gate_policy_field(b, c->asks, c->results, c->n);
    add_field(req, NULL, "ratelimit-policy", b);
    agw_buf_reset(b);
    agw_gate_ratelimit_field(b, c->asks, &v);
    add_field(req, NULL, "ratelimit", b);
    if (allowed)
        return 0;
    int only_denied = 1;
    for (size_t i = 0; i < c->n; i++)
        if (!c->results[i].allowed && !(deny && deny[i]))
            only_denied = 0;
    agw_buf_reset(b);
    agw_buf_printf(b, "%" PRIu64, agw_gate_retry_after_s(&v));
    add_field(req, H2O_TOKEN_RETRY_AFTER, NULL, b);
    agw_buf_reset(b);
    if (only_denied) {
        AGW_M_ADD(w->m->routes[g->gen->route_slot[endpoint]].shed, 1);
        agw_gate_problem_redis_deny(b, c->asks[v.decisive].rule->name, agw_gate_retry_after_s(&v));
        agw_worker_send_problem_body(w, req, NULL, endpoint, 503, b->base, b->len);
        return 1;
    }
    AGW_M_ADD(w->m->routes[g->gen->route_slot[endpoint]].limited, 1);
    agw_gate_problem_429(b, c->asks, &v, c->n);
    agw_worker_send_problem_body(w, req, NULL, endpoint, 429, b->base, b->len);
    return 1;
}

/* ---- Redis ---------------------------------------------------------------------------------- */

/* Redis answered a check (ok) or failed one (why; fallback: the check was decided by its rules'
 * on_redis_error): an outage is logged when it starts and when it ends for the process, whichever
 * worker sees it first and last (limit_seen.h), with what it cost, never per request. */
static void note_redis(agw_worker_t *w, int ok, const char *why, int fallback)
{
    agw_limit_seen_t *seen = agw_limit_store_seen(w->limits);
    if (ok) {
        agw_limit_outage_t o;
        if (agw_limit_seen_answered(seen, (unsigned)w->id, &o)) {
            double now_ms = ev_now(w->loop) * 1000.0;
            agw_log(AGW_LOG_INFO, "limits: Redis answers checks again after %.1f s; %" PRIu64
                    " checks were decided by their rules' on_redis_error meanwhile",
                    now_ms > (double)o.since_ms ? (now_ms - (double)o.since_ms) / 1000.0 : 0.0, o.fallbacks);
        }
        return;
    }
    if (agw_limit_seen_failed(seen, (unsigned)w->id, (uint64_t)(ev_now(w->loop) * 1000.0), fallback))
        agw_log(AGW_LOG_WARN, "limits: Redis did not answer a check (%s); Redis rules follow their on_redis_error "
                "until it answers again", why);
}

/* Keeps what Redis answered for each rule of a for the admin page (limit_seen.h). */
static void keep_answers(agw_worker_t *w, const redis_ask_t *a, const agw_limit_result_t *results)
{
    agw_limit_seen_t *seen = agw_limit_store_seen(w->limits);
    for (size_t i = 0; i < a->n; i++) {
        agw_limit_seen_answer_t ans = {results[i].allowed, results[i].remaining, a->now_ms + results[i].reset_ms,
                                       a->now_ms};
        agw_limit_seen_note(seen, a->asks[i].hash, &ans);
    }
}

/* Decides c's Redis rules that Redis did not answer by their on_redis_error: "local" counts them in
 * the process's store, "allow" accepts uncounted, "deny" refuses (deny[i] = 1). */
static void fall_back(agw_worker_t *w, gate_check_t *c, const char *why, int *deny)
{
    note_redis(w, 0, why, 1);
    for (size_t i = 0; i < c->n; i++) {
        const agw_limit_rule_t *r = c->asks[i].rule;
        if (!r->redis)
            continue;
        agw_limit_count_error(w->limits, (agw_limit_rule_t *)r, 1);
        agw_limit_result_t *out = &c->results[i];
        if (r->on_redis_error == AGW_LIMIT_FALLBACK_LOCAL) {
            agw_limit_take(w->limits, r, c->asks[i].hash, c->now_ms, out);
            continue;
        }
        agw_limit_policy(r, c->now_ms, out);
        if (r->on_redis_error == AGW_LIMIT_FALLBACK_ALLOW) {
            out->allowed = 1;
            out->remaining = out->limit;
            out->reset_ms = 0;
        } else {
            out->allowed = 0;
            out->remaining = 0;
            out->reset_ms = 1000;
            deny[i] = 1;
        }
    }
}

/* Gives back what the process's store took for c (its local rules, and Redis rules counted
 * locally by fall_back) when the request is refused: only accepted requests are counted. */
static void give_back_local(agw_worker_t *w, const gate_check_t *c, int redis_failed)
{
    for (size_t i = 0; i < c->n; i++) {
        const agw_limit_rule_t *r = c->asks[i].rule;
        if (c->results[i].allowed &&
            (!r->redis || (redis_failed && r->on_redis_error == AGW_LIMIT_FALLBACK_LOCAL)))
            agw_limit_give_back(w->limits, r, c->asks[i].hash, c->now_ms);
    }
}

static void on_redis_reply(void *data, const struct redisReply *reply, const char *err);

/* Sends a's command (EVALSHA, or EVAL after NOSCRIPT). Returns 0, or -1 (no connection ready: no
 * callback will come). */
static int send_ask(agw_worker_t *w, redis_ask_t *a)
{
    const char *keys[LIMITS_MAX];
    agw_limit_redis_cmd_t cmd;
    for (size_t i = 0; i < a->n; i++)
        keys[i] = a->keys.base + a->key_off[i];
    if (w->cache.redis == NULL)
        return -1;
    agw_buf_t b = {0}; /* hiredis formats the command before agw_redis_command returns */
    agw_limit_redis_command(&cmd, &b, a->eval, a->asks, keys, a->key_len, a->n, a->now_ms, a->check);
    int rc = agw_redis_command(w->cache.redis, on_redis_reply, a, cmd.argc, cmd.argv, cmd.lens);
    agw_buf_free(&b);
    return rc;
}

/* Adds one Redis rule and its key (len bytes, copied) to the command a, made first when a is NULL
 * (it holds g until its reply: free_ask). Returns the command. */
static redis_ask_t *ask_add(agw_worker_t *w, wgen_t *g, redis_ask_t *a, const agw_limit_ask_t *ask, const char *key,
                            size_t len, uint64_t now_ms)
{
    if (a == NULL) {
        a = agw_calloc(1, sizeof(*a));
        a->w = w;
        a->g = g;
        agw_worker_gen_hold(g);
        a->now_ms = now_ms;
        a->check = ++w->cache.redis_next_id; /* (the worker's ids of its Redis commands) */
    }
    a->asks[a->n] = *ask;
    a->key_off[a->n] = a->keys.len;
    a->key_len[a->n] = len;
    agw_buf_append(&a->keys, len ? key : "", len);
    a->n++;
    return a;
}

static void free_ask(redis_ask_t *a)
{
    wgen_t *g = a->g;
    if (a->charge)
        a->w->lim.charges--;
    agw_buf_free(&a->keys);
    free(a);
    agw_worker_gen_release(g); /* (outside Lua: the last reference frees the generation now) */
}

static void on_redis_reply(void *data, const struct redisReply *reply, const char *err)
{
    redis_ask_t *a = data;
    gate_wait_t *wt = a->wait;
    agw_worker_t *w = a->w;
    if (err && agw_limit_redis_noscript(err) && !a->eval && (wt || a->charge)) {
        a->eval = 1; /* a restarted or flushed Redis: send the script itself once */
        if (send_ask(w, a) == 0)
            return;
    }
    agw_limit_result_t results[LIMITS_MAX];
    agw_limit_verdict_t v = {.results = results};
    const char *why = err;
    int rc = why == NULL ? agw_limit_redis_verdict(reply, a->asks, a->n, a->now_ms, a->check, &v) : 0;
    if (rc == -2)
        why = "an answer that is not the limits script's";
    else if (rc == -1)
        why = "a verdict its rules do not allow";
    if (rc == -2 && w->cache.redis) /* another command's reply: the connection's replies cannot be
                                       trusted to answer their commands (a reply sent twice shifts every
                                       later one) until it is dropped */
        agw_redis_drop(w->cache.redis, "Redis answered a limits check with another command's reply");
    if (why == NULL) {
        note_redis(w, 1, NULL, 0);
        keep_answers(w, a, results);
    }
    if (wt == NULL) { /* the request stopped waiting (client gone, deadline): only the outage log */
        if (why)
            note_redis(w, 0, why, 0);
        free_ask(a);
        return;
    }
    wt->ask = NULL;
    if (why) {
        snprintf(wt->why, sizeof(wt->why), "%s", why);
    } else {
        wt->redis_ok = 1;
        for (size_t i = 0, j = 0; i < wt->c.n; i++)
            if (wt->c.asks[i].rule->redis)
                wt->c.results[i] = results[j++];
    }
    free_ask(a);
    agw_park_wake(&wt->park);
}

/* The decision of a parked request is in (or its deadline came): answer it or start its script. */
static void on_wait_resume(agw_park_t *pk, int timed_out)
{
    gate_wait_t *wt = (gate_wait_t *)pk;
    agw_worker_t *w = pk->w;
    if (wt->ask) { /* the deadline came before Redis answered: the answer will find nobody */
        wt->ask->wait = NULL;
        wt->ask = NULL;
    }
    int deny[LIMITS_MAX] = {0};
    if (!wt->redis_ok)
        fall_back(w, &wt->c,
                  !timed_out || wt->why[0] ? wt->why
                  : wt->deadline_first     ? "no answer within the endpoint's deadline (deadline_ms)"
                                           : "no answer within redis.timeout_ms",
                  deny);
    agw_limit_verdict_t v = {.results = wt->c.results};
    if (!agw_limit_decide(&v, wt->c.n))
        give_back_local(w, &wt->c, !wt->redis_ok);
    h2o_req_t *req = pk->req;
    wgen_t *g = pk->g;
    double waited = ev_now(w->loop) - wt->parked_at;
    if (conclude(w, g, req, wt->endpoint, &wt->c, deny, wt->redis_ok ? AGW_TRACE_LIMIT_REDIS : AGW_TRACE_LIMIT_FALLBACK,
                 waited)) {
        json_decref(wt->user.claims);
        return;
    }
    agw_auth_result_t user = wt->user; /* the script's start may free the wait's memory */
    agw_route_param_t params[AGW_ROUTE_MAX_PARAMS];
    size_t np = wt->num_params;
    memcpy(params, wt->params, np * sizeof(params[0]));
    wt->start(w, g, req, wt->endpoint, params, np, &user);
}

/* The client left while the request waited. */
static void on_wait_cancel(agw_park_t *pk)
{
    gate_wait_t *wt = (gate_wait_t *)pk;
    if (wt->ask)
        wt->ask->wait = NULL; /* Redis may count it: the request was accepted when it was asked */
    wt->ask = NULL;
    /* what the process's store took for the local rules stays counted: the request was accepted
     * by them (as a request whose client leaves during its script) */
    json_decref(wt->user.claims);
    wt->user.claims = NULL;
}

static const agw_park_ops_t wait_ops = {NULL, on_wait_resume, on_wait_cancel};

/* ---- before the edge ------------------------------------------------------------------------ */

/* A request's asks of the rules keyed by its address: each one's rule and hash, and its key (the
 * bytes are in ss). */
typedef struct address_asks {
    size_t n;
    agw_limit_ask_t asks[LIMITS_MAX];
    uint64_t local[LIMITS_MAX];     /* the hash each counts under in the process's store */
    const char *keys[LIMITS_MAX];
    size_t lens[LIMITS_MAX];
    struct sockaddr_storage ss;
} address_asks_t;

/* The endpoint's rules keyed by the client's address that stand before auth (key = "ip",
 * before_auth), when it has an auth policy, into *out (at most LIMITS_MAX). Returns out->n. Only
 * the address: it is the one key a client cannot choose (a TCP peer), so a refused attempt spends
 * the count of its sender's address (and of whoever shares it: a NAT, a balancer without the
 * client's address; `before_auth = false` for those). A route's count or a header's would let
 * anyone spend them with forged credentials (the route's capacity, the quota of another client's
 * X-Client value), which before the edge they could not. */
static size_t address_asks(const wgen_t *g, h2o_req_t *req, int endpoint, address_asks_t *out)
{
    out->n = 0;
    if (g->conf->auth_policies[endpoint - 1].kind == AGW_AUTH_NONE)
        return 0;
    const agw_endpoint_info_t *ep = &g->conf->endpoints[endpoint - 1];
    size_t num = ep->num_limits < LIMITS_MAX ? ep->num_limits : LIMITS_MAX, n = 0;
    for (size_t j = 0; j < num; j++) {
        const agw_limit_rule_t *r = &g->conf->limits.rules[ep->limits[j]];
        if (!r->before_auth || r->is_quota) /* (agg.limits: a quota never stands before auth) */
            continue;
        limit_key(r, req, ep->route, NULL, &out->keys[n], &out->lens[n], &out->ss);
        out->asks[n].rule = r;
        out->asks[n].hash = agw_limit_hash(r, out->keys[n], out->lens[n]);
        /* where the process's store counts it: a local rule's own count; a Redis rule's shadow,
         * a slot of its own (not the one its on_redis_error = "local" counts accepted requests in
         * during an outage, nor a local rule's of the same name after a reload) */
        out->local[n] = r->redis ? out->asks[n].hash ^ AGW_LIMIT_SHADOW_SALT : out->asks[n].hash;
        n++;
    }
    return out->n = n;
}

int agw_worker_gate_before_edge(agw_worker_t *w, wgen_t *g, h2o_req_t *req, int endpoint)
{
    address_asks_t aa;
    if (address_asks(g, req, endpoint, &aa) == 0)
        return AGW_GATE_PASS;
    gate_check_t c;
    c.n = aa.n;
    c.now_ms = (uint64_t)(ev_now(w->loop) * 1000.0);
    int refused = 0, shadow = 0;
    for (size_t j = 0; j < aa.n; j++) {
        /* a Redis rule's own count is Redis's: here its shadow in the process's store, which
         * holds only the refusals this process charged it (agw_worker_gate_charge), so a flood
         * is cut after the rule's burst whatever Redis's replies' timing, and with Redis down */
        c.asks[j] = aa.asks[j];
        agw_limit_peek_next(w->limits, aa.asks[j].rule, aa.local[j], c.now_ms, &c.results[j]);
        refused |= !c.results[j].allowed;
        shadow |= aa.asks[j].rule->redis && !c.results[j].allowed;
    }
    if (!refused)
        return AGW_GATE_PASS;
    w->lim.has_note = 0;
    conclude(w, g, req, endpoint, &c, NULL, shadow ? AGW_TRACE_LIMIT_SHADOW : AGW_TRACE_LIMIT_LOCAL, 0);
    return AGW_GATE_ANSWERED;
}

void agw_worker_gate_charge(agw_worker_t *w, wgen_t *g, h2o_req_t *req, int endpoint)
{
    address_asks_t aa;
    address_asks(g, req, endpoint, &aa);
    uint64_t now_ms = (uint64_t)(ev_now(w->loop) * 1000.0);
    for (size_t j = 0; j < aa.n; j++) {
        /* the process's store: a local rule's count, a Redis rule's shadow (before_edge); a
         * refusal takes nothing (the count is already spent) */
        agw_limit_result_t res;
        agw_limit_take(w->limits, aa.asks[j].rule, aa.local[j], now_ms, &res);
        if (!aa.asks[j].rule->redis || w->lim.charges >= AGW_LIMIT_CHARGES_MAX)
            continue;
        /* one command a rule: the script counts a command's rules all or none, and a charge is
         * each rule's own (one spent by the address's other requests must not hide it from the
         * others). No request waits for the reply (on_redis_reply frees the ask); a flood's
         * commands in flight are bounded (beyond AGW_LIMIT_CHARGES_MAX, Redis does not hear of
         * the refusal: the shadow counts it) */
        redis_ask_t *a = ask_add(w, g, NULL, &aa.asks[j], aa.keys[j], aa.lens[j], now_ms);
        a->charge = 1;
        w->lim.charges++;
        if (send_ask(w, a) != 0)
            free_ask(a);
    }
}

/* ---- the gate ------------------------------------------------------------------------------- */

int agw_worker_gate(agw_worker_t *w, wgen_t *g, h2o_req_t *req, int endpoint, const agw_route_param_t *params,
                    size_t num_params, agw_auth_result_t *user, agw_gate_start_fn start)
{
    const agw_endpoint_info_t *ep = &g->conf->endpoints[endpoint - 1];
    const agw_limits_conf_t *lc = &g->conf->limits;
    w->lim.has_note = 0;
    if (agw_gate_shed(lc->max_in_flight, ep->priority, __atomic_load_n(&w->inflight, __ATOMIC_RELAXED))) {
        AGW_M_ADD(w->m->routes[g->gen->route_slot[endpoint]].shed, 1);
        h2o_add_header(&req->pool, &req->res.headers, H2O_TOKEN_RETRY_AFTER, NULL, H2O_STRLIT("1"));
        agw_buf_t *b = &w->scratch.out;
        agw_buf_reset(b);
        agw_buf_printf(b, "{\"type\":\"" AGW_PROBLEM_REDUCED_CAPACITY "\",\"title\":\"The gateway is overloaded\","
                          "\"status\":503,\"detail\":\"requests of priority %d are shed while a worker has more than "
                          "%lu pages in flight; retry in 1 s\"}",
                       ep->priority, (unsigned long)lc->max_in_flight * (unsigned long)(5 - ep->priority) / 2);
        agw_worker_send_problem_body(w, req, NULL, endpoint, 503, b->base, b->len);
        return AGW_GATE_ANSWERED;
    }
    size_t num = ep->num_limits < LIMITS_MAX ? ep->num_limits : LIMITS_MAX, n = 0;
    if (num == 0)
        return AGW_GATE_PASS;
    gate_check_t c;
    c.now_ms = (uint64_t)(ev_now(w->loop) * 1000.0);
    redis_ask_t *a = NULL;
    agw_limit_ask_t local[LIMITS_MAX];
    agw_limit_result_t local_results[LIMITS_MAX];
    size_t nl = 0;
    struct sockaddr_storage ss;
    int top = lua_gettop(g->L), reqt = 0; /* function keys: the request's table, their keys */
    for (size_t j = 0; j < num; j++) {
        const agw_limit_rule_t *r = &lc->rules[ep->limits[j]];
        const char *key;
        size_t len;
        if (r->key == AGW_LIMIT_KEY_FUNCTION) {
            if (function_key(w, g, r, ep->limits[j], req, ep->route, user, &reqt, &key, &len) != 1)
                continue; /* the rule does not apply to this request */
        } else {
            limit_key(r, req, ep->route, user, &key, &len, &ss);
        }
        size_t i = n++;
        c.asks[i].rule = r;
        c.asks[i].hash = agw_limit_hash(r, key, len);
        if (!r->redis) {
            local[nl++] = c.asks[i];
            continue;
        }
        a = ask_add(w, g, a, &c.asks[i], key, len, c.now_ms);
    }
    lua_settop(g->L, top);
    c.n = n;
    if (n == 0)
        return AGW_GATE_PASS;
    /* the local rules first: a request they refuse never costs a Redis command */
    agw_limit_verdict_t lv = {.results = local_results};
    int local_ok = nl == 0 || agw_limit_check(w->limits, local, nl, c.now_ms, &lv);
    for (size_t i = 0, j = 0; i < n; i++)
        if (!c.asks[i].rule->redis)
            c.results[i] = local_results[j++];
    if (!local_ok || a == NULL) {
        if (a)
            free_ask(a);
        size_t k = 0; /* a refused request's answer names the rules that were asked: the local ones */
        for (size_t i = 0; i < n; i++)
            if (!c.asks[i].rule->redis) {
                c.asks[k] = c.asks[i];
                c.results[k++] = c.results[i];
            }
        c.n = k;
        return conclude(w, g, req, endpoint, &c, NULL, AGW_TRACE_LIMIT_LOCAL, 0) ? AGW_GATE_ANSWERED : AGW_GATE_PASS;
    }
    if (send_ask(w, a) != 0) { /* no connection ready: decided at once by on_redis_error */
        free_ask(a);
        int deny[LIMITS_MAX] = {0};
        fall_back(w, &c, w->cache.redis ? "not connected" : "no Redis client", deny);
        agw_limit_verdict_t v = {.results = c.results};
        if (!agw_limit_decide(&v, n))
            give_back_local(w, &c, 1);
        return conclude(w, g, req, endpoint, &c, deny, AGW_TRACE_LIMIT_FALLBACK, 0) ? AGW_GATE_ANSWERED
                                                                                    : AGW_GATE_PASS;
    }
    /* the wait ends with the command's timeout or the endpoint's deadline, whichever comes first:
     * the wait counts in the deadline (on_wait_resume hands the script waited_s), so a page
     * parked past it could only fail its sections */
    double timeout_s = (double)agw_redis_conf(w->cache.redis)->timeout_ms / 1000.0 + 0.002;
    double deadline_s = endpoint >= 1 && (size_t)endpoint <= g->conf->num_endpoints
                            ? g->conf->endpoints[endpoint - 1].deadline_ms / 1000.0
                            : timeout_s;
    gate_wait_t *wt = agw_park_new(w, g, req, sizeof(*wt), deadline_s < timeout_s ? deadline_s : timeout_s, 0,
                                   &wait_ops);
    wt->deadline_first = deadline_s < timeout_s;
    wt->ask = a;
    a->wait = wt;
    wt->c = c;
    wt->endpoint = endpoint;
    wt->parked_at = ev_now(w->loop);
    wt->num_params = num_params < AGW_ROUTE_MAX_PARAMS ? num_params : AGW_ROUTE_MAX_PARAMS;
    memcpy(wt->params, params, wt->num_params * sizeof(*params));
    wt->user = *user; /* the claims reference is the wait's now */
    wt->start = start;
    return AGW_GATE_PARKED;
}
