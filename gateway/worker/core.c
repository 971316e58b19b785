/* core.c: the "agg.core" transport the runtime (lua/agg/runtime.lua) calls: upstream calls and
 * their answers, timers, single-flight joins, logging and the runtime's counters (responses,
 * core.respond: respond.c). Each
 * core.* function is a closure over the generation whose VM it serves. The contract (arguments,
 * units, ownership, the fields of the tables that cross) is lua/agg/contract.lua; field names come
 * from contract.h.
 */
#include "worker/worker_internal.h"

#include "base/luamod.h"
#include "base/mem.h"

#include "worker/contract.h"

#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "json/json.h"
#include "base/log.h"

/* ---- an upstream call's record, span and metrics --------------------------------------------- */

/* A call record for a new call: from the worker's free list, or new. */
static wcall_t *call_take(agw_worker_t *w)
{
    wcall_t *c = w->tables.free_calls;
    if (c == NULL)
        return agw_malloc(sizeof(*c));
    w->tables.free_calls = c->next_free;
    return c;
}

/* The call is over (answered, cancelled or never started): its id goes, its record goes back on
 * the worker's free list. */
static void call_release(agw_worker_t *w, wcall_t *c)
{
    agw_slots_del(&w->tables.calls, c->id);
    c->next_free = w->tables.free_calls;
    w->tables.free_calls = c;
}

void agw_worker_calls_release_spares(agw_worker_t *w)
{
    while (w->tables.free_calls) {
        wcall_t *c = w->tables.free_calls;
        w->tables.free_calls = c->next_free;
        free(c);
    }
}

/* Ends the span of call c and of every request that shared it (on_call_done, core.cancel). */
static void trace_call_ended(agw_worker_t *w, wcall_t *c, unsigned outcome, int http_status, const char *detail)
{
    uint64_t t = agw_worker_now_us(w);
    reqref_t *rr = c->span >= 0 ? agw_slots_get(&w->tables.reqs, c->rid) : NULL;
    if (rr && rr->trace)
        agw_trace_end_span(rr->trace, c->span, outcome, http_status, detail, t);
    while (c->joiners) {
        sf_joiner_t *j = c->joiners;
        c->joiners = j->next;
        reqref_t *jr = agw_slots_get(&w->tables.reqs, j->rid);
        if (jr && jr->trace)
            agw_trace_end_span(jr->trace, j->span, outcome, http_status, detail, t);
        free(j);
    }
}

void agw_worker_publish_pool(wgen_t *g, size_t up)
{
    agw_pool_stats_t st = {0}, one;
    const size_t *first = g->conf->ep_first;
    for (size_t e = first[up]; e < first[up + 1]; e++) {
        if (g->pools[e] == NULL) /* a slot out of service (group/directory.h) */
            continue;
        agw_pool_stats(g->pools[e]->pool, &one);
        st.open += one.open, st.idle += one.idle, st.pending += one.pending;
    }
    agw_upstream_metrics_t *u = &g->w->m->upstreams[g->gen->upstream_slot[up]];
    AGW_M_SET(u->pool_open, st.open);
    AGW_M_SET(u->pool_idle, st.idle);
    AGW_M_SET(u->pool_pending, st.pending);
}

static agw_metric_outcome_t metric_outcome(const agw_call_result_t *res, int bad_json)
{
    switch (res->outcome) {
    case AGW_CALL_OK:
        if (res->http_status >= 500)
            return AGW_OUT_5XX;
        if (res->http_status >= 400)
            return AGW_OUT_4XX;
        return bad_json ? AGW_OUT_BAD_RESPONSE : AGW_OUT_OK;
    case AGW_CALL_REFUSED: return AGW_OUT_REFUSED;
    case AGW_CALL_CONNECT_TIMEOUT:
    case AGW_CALL_TIMEOUT: return AGW_OUT_TIMEOUT;
    case AGW_CALL_RESET: return AGW_OUT_RESET;
    case AGW_CALL_OVERLOAD: return AGW_OUT_OVERLOAD;
    case AGW_CALL_BAD_REQUEST: return AGW_OUT_INVALID_REQUEST;
    case AGW_CALL_TLS: return AGW_OUT_TLS;
    case AGW_CALL_LOCAL: return AGW_OUT_LOCAL;
    default: return AGW_OUT_BAD_RESPONSE; /* truncated, bad_response, too_large */
    }
}

/* ---- the "agg.core" transport for the runtime ----------------------------------------------- */

/* The worker of this core.* function (its generation: agw_worker_upg). */
static agw_worker_t *upw(lua_State *L)
{
    return agw_worker_upg(L)->w;
}

/* Sets field key (AGW_KEY_*) of the table at absolute index t to the value on top (popped). */
static inline void set_key(lua_State *L, int t, int keys, int key)
{
    lua_rawgeti(L, keys, key);
    lua_insert(L, -2);
    lua_rawset(L, t);
}

/* core.now() -> the loop's clock, ms. The runtime reads the same value through the FFI when it
 * has core.ev_now and core.loop (vm.c, agg.runtime.init): this one serves until the worker's loop
 * exists, and any other caller. */
static int l_now(lua_State *L)
{
    agw_worker_t *w = upw(L);
    lua_pushnumber(L, ev_now(w->loop) * 1000.0);
    return 1;
}

/* The header block of a response ("name\0value\0…") in w->scratch.hdrs. */
static agw_buf_t *header_block(agw_worker_t *w, const agw_header_t *h, size_t n)
{
    agw_header_block(&w->scratch.hdrs, h, n);
    return &w->scratch.hdrs;
}

static void push_headers(agw_worker_t *w, lua_State *L, const agw_header_t *h, size_t n)
{
    agw_buf_t *b = header_block(w, h, n);
    lua_pushlstring(L, b->base ? b->base : "", b->len);
}

static void on_call_done(agw_call_t *call, const agw_call_result_t *res, void *data)
{
    (void)call;
    wcall_t *c = data;
    wgen_t *g = c->g; /* the call's reference is dropped once the runtime has seen the answer */
    agw_worker_t *w = g->w;
    lua_State *L = g->L;
    uint64_t id = c->id;
    int decode = c->decode;
    unsigned up = c->up;
    int probe = c->rid == 0; /* a health probe (agg.health): the runtime's own call, not counted */
    trace_call_ended(w, c, res->outcome, res->http_status, res->detail);
    call_release(w, c);

    /* runtime.on_call(id, outcome, http_status, data, ms, answer) (lua/agg/contract.lua): a 2xx JSON
     * body only validated here (DESIGN §2.3 limits) travels as data, a raw ref that becomes Lua
     * tables when a script reads it, goes into the page as text when none does, and carries the
     * headers and the body text (json.raw_extra): answer is then nil. Any other answer has its
     * headers, body and detail in answer, one table per VM. */
    int json_body = res->outcome == AGW_CALL_OK && decode && res->http_status >= 200 && res->http_status < 300 &&
                    res->body_len > 0;
    char err[256];
    int compact = 0;
    if (json_body && agw_json_validate(res->body, res->body_len, AGW_JSON_MAX_DEPTH, &compact, err, sizeof(err)) != 0)
        json_body = -1; /* not JSON: the failed call carries the body and the reason */
    if (!probe)
        agw_metrics_call(w->m, g->gen->upstream_slot[up], metric_outcome(res, json_body == -1), res->elapsed_ms);
    lua_rawgeti(L, LUA_REGISTRYINDEX, g->ref_on_call);
    lua_pushnumber(L, (lua_Number)id);
    lua_pushstring(L, agw_call_outcome_name(res->outcome));
    lua_pushinteger(L, res->http_status);
    if (json_body == 1) { /* the headers kept as they came: json.raw_extra makes the block (base/header.h) */
        agw_buf_t *hb = &w->scratch.hdrs;
        agw_buf_reset(hb);
        agw_header_pairs(hb, res->headers, res->num_headers);
        agw_json_push_raw_ref(L, res->body, res->body_len, compact, hb->base, hb->len);
    } else if (json_body == -1)
        lua_pushstring(L, err);
    else
        lua_pushnil(L);
    lua_pushnumber(L, res->elapsed_ms);
    if (json_body == 1) {
        lua_pushnil(L);
    } else {
        lua_rawgeti(L, LUA_REGISTRYINDEX, g->ref_keys);
        lua_rawgeti(L, LUA_REGISTRYINDEX, g->ref_answer);
        int keys = lua_gettop(L) - 1, a = keys + 1;
        if (res->outcome == AGW_CALL_OK) {
            push_headers(w, L, res->headers, res->num_headers);
            set_key(L, a, keys, AGW_KEY_ANSWER + AGW_ANSWER_HEADERS);
            lua_pushlstring(L, res->body ? res->body : "", res->body_len);
            set_key(L, a, keys, AGW_KEY_ANSWER + AGW_ANSWER_BODY);
        } else {
            lua_pushnil(L);
            set_key(L, a, keys, AGW_KEY_ANSWER + AGW_ANSWER_HEADERS);
            lua_pushnil(L);
            set_key(L, a, keys, AGW_KEY_ANSWER + AGW_ANSWER_BODY);
        }
        if (res->detail)
            lua_pushstring(L, res->detail);
        else
            lua_pushnil(L);
        set_key(L, a, keys, AGW_KEY_ANSWER + AGW_ANSWER_DETAIL);
        lua_remove(L, keys);
    }
    agw_worker_call_runtime(g, 6);
    agw_worker_gen_release(g);
}

/* The traceparent of an upstream attempt (trace.h): a new span of the request's trace, child of
 * the gateway's span, sent in its own traceparent with the request's tracestate. The headers go
 * after the script's (hdrs has room for two more than n); a script's own traceparent or
 * tracestate is replaced: the gateway owns them. Returns the new header count, and in *own how
 * many of them, last, are the gateway's (1 or 2: agw_call_req_t's num_own; 0 for the runtime's own
 * call, rid 0, which sends neither). The header is added
 * here, at send time, so single-flight keys (made in Lua from the call spec) never see it. */
static size_t trace_call_headers(agw_worker_t *w, lua_State *L, wcall_t *c, agw_header_t *hdrs, size_t n,
                                 char *tp, size_t *own)
{
    /* core.call's section (9), attempt (10) and hedge (11) name the span */
    size_t k = 0;
    for (size_t i = 0; i < n; i++) { /* drop the script's traceparent and tracestate */
        if ((hdrs[i].name_len == 11 && strncasecmp(hdrs[i].name, "traceparent", 11) == 0) ||
            (hdrs[i].name_len == 10 && strncasecmp(hdrs[i].name, "tracestate", 10) == 0))
            continue;
        hdrs[k++] = hdrs[i];
    }
    size_t kept = k;
    if (c->rid == 0) { /* the runtime's own call (a health probe): in no trace, so none is sent (a
                          sampled traceparent made every probe a trace of its own upstream) */
        *own = 0;
        return k;
    }
    reqref_t *rr = agw_slots_get(&w->tables.reqs, c->rid);
    agw_trace_t *tr = rr ? rr->trace : NULL;
    if (tr) {
        size_t slen = 0;
        const char *section = lua_tolstring(L, 9, &slen); /* copied by agw_trace_add_span */
        unsigned attempt = (unsigned)lua_tointeger(L, 10);
        unsigned flags = lua_toboolean(L, 11) ? AGW_SPAN_HEDGE : attempt > 1 ? AGW_SPAN_RETRY : 0;
        unsigned slot = c->g->gen->upstream_slot[c->up];
        c->span = agw_trace_add_span(tr, &w->log.trace_rng, slot, section, section ? slen : 0, flags, attempt ? attempt : 1,
                                     agw_worker_now_us(w));
    }
    uint8_t span_id[8], trace_id[16];
    if (c->span >= 0) {
        agw_trace_traceparent(tr, c->span, tp);
    } else { /* no record (too many spans, or none): still a traceparent, in the trace if known */
        agw_trace_random_id(&w->log.trace_rng, span_id, 8);
        if (tr)
            memcpy(trace_id, tr->trace_id, 16);
        else
            agw_trace_random_id(&w->log.trace_rng, trace_id, 16);
        agw_traceparent_format(tp, trace_id, span_id, tr ? tr->flags : AGW_TRACE_FLAG_SAMPLED);
    }
    hdrs[k].name = "traceparent", hdrs[k].name_len = 11;
    hdrs[k].value = tp, hdrs[k].value_len = AGW_TRACEPARENT_LEN;
    k++;
    if (rr && rr->tracestate) {
        hdrs[k].name = "tracestate", hdrs[k].name_len = 10;
        hdrs[k].value = rr->tracestate, hdrs[k].value_len = rr->tracestate_len;
        k++;
    }
    *own = k - kept;
    return k;
}

/* core.call(rid, upstream, method, path, headers, body, timeout_ms, decode, section, attempt, hedge,
 * endpoint) -> id (lua/agg/contract.lua): rid 0 is the runtime's own call (a health probe,
 * agg.health: no span, not in the upstream's call metrics); upstream is the index (1-based);
 * headers { name, value, … } or false/nil; body a string or false/nil; timeout_ms the whole call's;
 * decode: hand a 2xx body over as validated JSON; section, attempt and hedge describe the attempt's
 * span; endpoint is the upstream's endpoint to call (1-based, agg.group chose it), read only for an
 * upstream of more than one endpoint (the others' is always the first). Every argument is
 * positional: a field read from a table costs two API calls more than an argument (a push of the
 * key and the lookup), three times a call. */
static int l_call(lua_State *L)
{
    wgen_t *g = agw_worker_upg(L);
    agw_worker_t *w = g->w;
    int index = (int)luaL_checkinteger(L, 2);
    if (index < 1 || (size_t)index > g->conf->num_upstreams)
        return luaL_error(L, "core.call: no upstream #%d", index);
    size_t first = g->conf->ep_first[index - 1], ep = first;
    if (g->conf->ep_first[index] - first > 1) { /* a group: the endpoint agg.group chose */
        lua_Integer e = lua_isnoneornil(L, 12) ? 1 : lua_tointeger(L, 12);
        if (e < 1 || (size_t)e > g->conf->ep_first[index] - first)
            return luaL_error(L, "core.call: upstream #%d has no endpoint #%d", index, (int)e);
        ep += (size_t)e - 1;
    }
    agw_call_req_t req = {0};
    req.method = luaL_checkstring(L, 3);
    req.path = luaL_checklstring(L, 4, &req.path_len);
    agw_header_t hdrs[64 + 2];
    char traceparent[AGW_TRACEPARENT_LEN];
    if (lua_istable(L, 5)) {
        size_t n = lua_objlen(L, 5) / 2;
        if (n > 64)
            return luaL_error(L, "core.call: more than 64 request headers");
        for (size_t i = 0; i < n; i++) {
            lua_rawgeti(L, 5, (int)(2 * i + 1));
            hdrs[i].name = lua_tolstring(L, -1, &hdrs[i].name_len);
            lua_rawgeti(L, 5, (int)(2 * i + 2));
            hdrs[i].value = lua_tolstring(L, -1, &hdrs[i].value_len);
            lua_pop(L, 2); /* the strings stay referenced by the table */
            if (hdrs[i].name == NULL || hdrs[i].value == NULL)
                return luaL_error(L, "core.call: header names and values must be strings");
        }
        req.num_headers = n;
    }
    req.headers = hdrs;
    if (lua_isstring(L, 6))
        req.body = lua_tolstring(L, 6, &req.body_len);
    lua_Number t = luaL_checknumber(L, 7);
    req.timeout_ms = agw_luamod_to_u64(t); /* a script's timeout: 1e30 must not be undefined behaviour */
    wcall_t *c = call_take(w);
    c->g = g;
    c->decode = lua_toboolean(L, 8);
    c->up = (unsigned)(index - 1);
    c->rid = agw_luamod_to_u64(lua_tonumber(L, 1));
    c->span = -1;
    c->joiners = NULL;
    req.num_headers = trace_call_headers(w, L, c, hdrs, req.num_headers, traceparent, &req.num_own);
    if (c->span >= 0 && g->conf->ep_first[index] - first > 1) { /* a group's endpoint on the span */
        reqref_t *rr = agw_slots_get(&w->tables.reqs, c->rid);
        rr->trace->spans[c->span].endpoint = (uint8_t)(ep - first + 1);
    }
    c->id = agw_slots_put(&w->tables.calls, c);
    c->call = g->pools[ep] ? agw_call_start(g->pools[ep]->pool, &req, on_call_done, c) : NULL;
    if (c->call == NULL) {
        /* the pool is being destroyed (agw_call_start's only refusal): the span recorded above
         * ends here, cancelled (nothing was sent) */
        trace_call_ended(w, c, AGW_SPAN_CANCELLED, 0, NULL);
        call_release(w, c);
        return luaL_error(L, "core.call: the pool of upstream #%d is closing or its endpoint #%d is out of service",
                          index, (int)(ep - first + 1));
    }
    agw_worker_gen_hold(g);
    if (c->rid != 0) /* rid 0: a health probe (agg.health), not one of the upstream's calls */
        AGW_M_ADD(w->m->upstreams[g->gen->upstream_slot[index - 1]].started, 1);
    lua_pushnumber(L, (lua_Number)c->id);
    return 1;
}

static void on_timer_due(agw_timeout_t *t)
{
    wtimer_t *tm = H2O_STRUCT_FROM_MEMBER(wtimer_t, t, t);
    wgen_t *g = tm->g;
    uint64_t id = tm->id;
    agw_slots_del(&g->w->tables.timers, id);
    free(tm);
    lua_rawgeti(g->L, LUA_REGISTRYINDEX, g->ref_on_timer);
    lua_pushnumber(g->L, (lua_Number)id);
    agw_worker_call_runtime(g, 1);
    agw_worker_gen_release(g);
}

/* core.timer(ms) -> id: runtime.on_timer(id) runs ms from now (the loop's time, as an ev_timer's:
 * base/timeouts.h), never in the turn that started it. */
static int l_timer(lua_State *L)
{
    wgen_t *g = agw_worker_upg(L);
    agw_worker_t *w = g->w;
    lua_Number ms = luaL_checknumber(L, 1);
    wtimer_t *tm = agw_malloc(AGW_WTIMER_BLOCK); /* (see there) */
    tm->g = g;
    agw_worker_gen_hold(g);
    tm->id = agw_slots_put(&w->tables.timers, tm);
    agw_timeout_init(&tm->t, on_timer_due);
    agw_timeout_start(&w->timeouts, &tm->t, ms > 0 ? ms / 1000.0 : 0.);
    lua_pushnumber(L, (lua_Number)tm->id);
    return 1;
}

/* core.cancel_timer(id) */
static int l_cancel_timer(lua_State *L)
{
    agw_worker_t *w = upw(L);
    uint64_t id = (uint64_t)luaL_checknumber(L, 1);
    wtimer_t *tm = agw_slots_get(&w->tables.timers, id);
    if (tm) {
        agw_timeout_stop(&w->timeouts, &tm->t);
        agw_slots_del(&w->tables.timers, id);
        wgen_t *g = tm->g;
        free(tm);
        agw_worker_gen_release(g); /* inside Lua: never the last reference of the generation running */
    }
    return 0;
}

/* core.random() -> a number in [0, 1) (retry jitter; not for secrets). */
static int l_random(lua_State *L)
{
    agw_worker_t *w = upw(L);
    uint64_t x = w->rng;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    w->rng = x;
    lua_pushnumber(L, (lua_Number)(x >> 11) / 9007199254740992.0);
    return 1;
}

/* core.cancel(id) */
static int l_cancel(lua_State *L)
{
    agw_worker_t *w = upw(L);
    uint64_t id = (uint64_t)luaL_checknumber(L, 1);
    wcall_t *c = agw_slots_get(&w->tables.calls, id);
    if (c) {
        wgen_t *g = c->g;
        trace_call_ended(w, c, AGW_SPAN_CANCELLED, 0, NULL);
        agw_call_cancel(c->call);
        if (c->rid != 0)
            agw_metrics_call(w->m, g->gen->upstream_slot[c->up], AGW_OUT_CANCELLED, 0);
        call_release(w, c);
        agw_worker_gen_release(g);
    }
    return 0;
}

/* core.join(rid, id, section): request rid waits on call id of another exchange (single-flight)
 * for its section: a span of its own, marked shared and linked to the call's span, ends when the
 * call does. Nothing else changes for the call. */
static int l_join(lua_State *L)
{
    agw_worker_t *w = upw(L);
    reqref_t *rr = agw_slots_get(&w->tables.reqs, (uint64_t)luaL_checknumber(L, 1));
    wcall_t *c = agw_slots_get(&w->tables.calls, (uint64_t)luaL_checknumber(L, 2));
    if (rr == NULL || rr->trace == NULL || c == NULL)
        return 0;
    size_t slen = 0;
    const char *section = lua_tolstring(L, 3, &slen);
    int i = agw_trace_add_span(rr->trace, &w->log.trace_rng, c->g->gen->upstream_slot[c->up], section,
                               section ? slen : 0, AGW_SPAN_SF_JOINED, 1, agw_worker_now_us(w));
    if (i < 0)
        return 0;
    reqref_t *leader = c->span >= 0 ? agw_slots_get(&w->tables.reqs, c->rid) : NULL;
    if (leader && leader->trace) {
        agw_span_t *ls = &leader->trace->spans[c->span];
        ls->flags |= AGW_SPAN_SF_LEADER;
        memcpy(rr->trace->spans[i].link_trace_id, leader->trace->trace_id, 16);
        memcpy(rr->trace->spans[i].link_span_id, ls->span_id, 8);
    }
    sf_joiner_t *j = agw_malloc(sizeof(*j));
    j->rid = rr->rid;
    j->span = i;
    j->next = c->joiners;
    c->joiners = j;
    return 0;
}

/* core.trace_id(rid) -> the request's trace id as 32 lowercase hex digits, or nil (req.trace_id) */
static int l_trace_id(lua_State *L)
{
    agw_worker_t *w = upw(L);
    reqref_t *rr = agw_slots_get(&w->tables.reqs, (uint64_t)luaL_checknumber(L, 1));
    if (rr == NULL || rr->trace == NULL)
        return 0;
    char hex[32];
    agw_trace_hex(hex, rr->trace->trace_id, 16);
    lua_pushlstring(L, hex, 32);
    return 1;
}

/* core.request_headers(rid) -> the page request's header block ("name\0value\0…"), or nothing
 * once the request has ended (lua/agg/contract.lua; built when first asked, not for every
 * request). */
static int l_request_headers(lua_State *L)
{
    agw_worker_t *w = upw(L);
    reqref_t *rr = agw_slots_get(&w->tables.reqs, (uint64_t)luaL_checknumber(L, 1));
    if (rr == NULL || rr->req == NULL)
        return 0;
    agw_worker_request_headers(&w->scratch.hdrs, rr->req);
    lua_pushlstring(L, w->scratch.hdrs.base ? w->scratch.hdrs.base : "", w->scratch.hdrs.len);
    return 1;
}

/* core.request_tls(rid) -> true when the page request came over TLS, false when not, nothing once
 * it has ended (lua/agg/contract.lua; asked for when a response sets a session cookie, which is
 * then Secure). The connection's socket says, not req->scheme: an HTTP/2 client writes :scheme
 * itself. A batch entry has no socket of its own: its envelope's scheme (multi.c copies it). */
static int l_request_tls(lua_State *L)
{
    agw_worker_t *w = upw(L);
    reqref_t *rr = agw_slots_get(&w->tables.reqs, (uint64_t)luaL_checknumber(L, 1));
    if (rr == NULL || rr->req == NULL)
        return 0;
    h2o_conn_t *conn = rr->req->conn;
    h2o_socket_t *sock = conn->callbacks->get_socket ? conn->callbacks->get_socket(conn) : NULL;
    lua_pushboolean(L, sock ? sock->ssl != NULL : rr->req->input.scheme == &H2O_URL_SCHEME_HTTPS);
    return 1;
}

/* core.request_user(rid) -> the user the edge authenticated the page request as and its bearer token
 * (edge.h agw_edge_user_push: a table and a string or nil), or nothing when the request had no user
 * or has ended (lua/agg/contract.lua; asked for when first needed, not with every request). */
static int l_request_user(lua_State *L)
{
    agw_worker_t *w = upw(L);
    reqref_t *rr = agw_slots_get(&w->tables.reqs, (uint64_t)luaL_checknumber(L, 1));
    if (rr == NULL || rr->req == NULL)
        return 0;
    return agw_edge_user_push(L, &rr->user);
}

/* core.endpoint_state(index, endpoint, state): agg.group's view of endpoint (1-based) of upstream
 * index in this worker (state: contract.h's endpoint_state fields; a missing or negative one is
 * 0), published on the generation's board (group/board.h) for the admin page and the metrics
 * (runtime.report_stats, about once a second: cold, so the fields are read by name). */
static int l_endpoint_state(lua_State *L)
{
    wgen_t *g = agw_worker_upg(L);
    lua_Integer index = luaL_checkinteger(L, 1), ep = luaL_checkinteger(L, 2);
    const agw_config_t *conf = g->conf;
    luaL_checktype(L, 3, LUA_TTABLE);
    if (index < 1 || (size_t)index > conf->num_upstreams || ep < 1 ||
        (size_t)ep > conf->ep_first[index] - conf->ep_first[index - 1])
        return 0;
    uint64_t v[AGW_EPSTATE_FIELDS];
    for (int k = 0; k < AGW_EPSTATE_FIELDS; k++) {
        lua_getfield(L, 3, agw_contract_endpoint_state[k]);
        lua_Number n = lua_tonumber(L, -1);
        lua_pop(L, 1);
        v[k] = n > 0 ? (uint64_t)n : 0;
    }
    agw_endpoint_row_t row = {.calls = v[AGW_EPSTATE_CALLS], .failures = v[AGW_EPSTATE_FAILURES],
                              .ejections = v[AGW_EPSTATE_EJECTIONS], .sessions = v[AGW_EPSTATE_SESSIONS],
                              .in_flight = v[AGW_EPSTATE_IN_FLIGHT],
                              .ejected_until_ms = v[AGW_EPSTATE_EJECTED_UNTIL_MS],
                              .last_ejected_ms = v[AGW_EPSTATE_LAST_EJECTED_MS],
                              .answered = v[AGW_EPSTATE_ANSWERED], .latency_ms = v[AGW_EPSTATE_LATENCY_MS],
                              .health = v[AGW_EPSTATE_HEALTH], .down = v[AGW_EPSTATE_DOWN],
                              .probes = v[AGW_EPSTATE_PROBES], .probe_failures = v[AGW_EPSTATE_PROBE_FAILURES]};
    agw_endpoint_board_publish(g->gen->board, (size_t)g->w->id, conf->ep_first[index - 1] + (size_t)ep - 1, &row);
    return 0;
}

/* core.endpoint_slots(index, seen) -> version[, slots]: the endpoint slots of upstream index as
 * the directory has them now (group/directory.h). When the directory's version is seen, only the
 * version; else, on the current generation, this worker's pools of the upstream follow it first (a
 * changed address gets a new pool, the old one drains: agw_worker_set_endpoint_addr), and slots is
 * a list, one per slot, of { url = the configured URL, address = "10.0.0.1:9001" or false when
 * out of service } (on a generation no longer current: the addresses of the pools it has). Called
 * by agg.group on the current generation's once-a-second tick (and when a group is made). */
static int l_endpoint_slots(lua_State *L)
{
    wgen_t *g = agw_worker_upg(L);
    lua_Integer index = luaL_checkinteger(L, 1);
    lua_Number seen = luaL_optnumber(L, 2, -1);
    const agw_config_t *conf = g->conf;
    if (index < 1 || (size_t)index > conf->num_upstreams)
        return 0;
    agw_endpoint_dir_t *d = g->gen->dir;
    uint64_t v = agw_endpoint_dir_version(d);
    lua_pushnumber(L, (lua_Number)v);
    if (seen >= 0 && (uint64_t)seen == v)
        return 1;
    size_t first = conf->ep_first[index - 1], last = conf->ep_first[index];
    lua_createtable(L, (int)(last - first), 0);
    for (size_t e = first; e < last; e++) {
        struct sockaddr_storage addr;
        socklen_t len;
        agw_endpoint_dir_read(d, e, &addr, &len);
        const wpool_t *p = g->pools ? g->pools[e] : NULL;
        int differs = p ? (p->conf.addrlen != len || memcmp(&p->conf.addr, &addr, len) != 0) : len > 0;
        if (differs && g->pools && g == g->w->gens.cur) {
            agw_worker_set_endpoint_addr(g, e, &addr, len);
        } else if (g->pools) { /* a generation that is no longer current keeps the pools it has */
            len = p ? p->conf.addrlen : 0;
            if (p)
                addr = p->conf.addr;
        }
        lua_createtable(L, 0, 2);
        lua_pushstring(L, conf->eps[e].url);
        lua_setfield(L, -2, "url");
        if (len > 0) {
            char text[64];
            agw_endpoint_address(&addr, len, text, sizeof(text));
            lua_pushstring(L, text);
        } else {
            lua_pushboolean(L, 0);
        }
        lua_setfield(L, -2, "address");
        lua_rawseti(L, -2, (int)(e - first + 1));
    }
    return 2;
}

/* core.log(level, message) */
static int l_log(lua_State *L)
{
    agw_worker_t *w = upw(L);
    const char *level = luaL_checkstring(L, 1);
    size_t len;
    const char *msg = luaL_checklstring(L, 2, &len);
    char prefix[32];
    snprintf(prefix, sizeof(prefix), "worker %d: ", w->id);
    /* the text may carry a client's, a script's or an upstream's bytes: log.h escapes them all */
    agw_log_text(strcmp(level, "error") == 0 ? AGW_LOG_ERROR : strcmp(level, "warn") == 0 ? AGW_LOG_WARN : AGW_LOG_INFO,
                 prefix, msg, len);
    return 0;
}

/* core.upstream_counters(upstream, counters): the runtime's totals for upstream (an index) in
 * counters' retries, retries_denied, hedges, hedges_won and collapsed (lua/agg/contract.lua),
 * published as metrics (runtime.report_stats). Each VM's totals start at 0, so what is added is
 * the growth since this VM last reported: the counters go on rising across reloads. */
static int l_upstream_counters(lua_State *L)
{
    wgen_t *g = agw_worker_upg(L);
    lua_Integer index = luaL_checkinteger(L, 1);
    if (index < 1 || (size_t)index > g->conf->num_upstreams || !lua_istable(L, 2))
        return 0;
    agw_upstream_metrics_t *u = &g->w->m->upstreams[g->gen->upstream_slot[index - 1]];
    uint64_t *fields[AGW_COUNTERS_FIELDS] = {
        [AGW_COUNTERS_RETRIES] = &u->retries, [AGW_COUNTERS_RETRIES_DENIED] = &u->retries_denied,
        [AGW_COUNTERS_HEDGES] = &u->hedges, [AGW_COUNTERS_HEDGES_WON] = &u->hedges_won,
        [AGW_COUNTERS_COLLAPSED] = &u->collapsed,
    };
    uint64_t *last = &g->reported[(size_t)(index - 1) * AGW_COUNTERS_FIELDS];
    for (int k = 0; k < AGW_COUNTERS_FIELDS; k++) {
        lua_getfield(L, 2, agw_contract_counters[k]);
        lua_Number n = lua_tonumber(L, -1);
        lua_pop(L, 1);
        uint64_t v = n > 0 ? (uint64_t)n : 0;
        if (v > last[k]) {
            AGW_M_ADD(*fields[k], v - last[k]);
            last[k] = v;
        }
    }
    return 0;
}

const luaL_Reg agw_worker_core_fns[] = {
    {"now", l_now},       {"call", l_call},   {"cancel", l_cancel},           {"respond", agw_worker_respond},
    {"log", l_log},       {"timer", l_timer}, {"cancel_timer", l_cancel_timer}, {"random", l_random},
    {"upstream_counters", l_upstream_counters}, {"endpoint_state", l_endpoint_state}, {"join", l_join},
    {"trace_id", l_trace_id}, {"endpoint_slots", l_endpoint_slots}, {"request_headers", l_request_headers},
    {"request_tls", l_request_tls}, {"request_user", l_request_user},
    {NULL, NULL},
};
