/* vm.c: a worker's generations (hot reload, generation.h): the scripts folder loaded
 * into a VM of the worker's own, made current with the upstream pools it shares with the
 * previous generation, and freed after its last request, call and timer.
 */
#include "worker/worker_internal.h"

#include "base/heap.h"
#include "base/log.h"
#include "base/mem.h"

#include "worker/contract.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "script/script.h"

/* ---- generations ---------------------------------------------------------------------------- */

static void pool_release(wpool_t *p)
{
    if (p == NULL || --p->refs > 0)
        return;
    agw_pool_destroy(p->pool);
    agw_upstream_conf_clear(&p->conf);
    free(p);
}

/* A new pool of this worker for the settings u (copied). */
static wpool_t *pool_new(agw_worker_t *w, const agw_upstream_conf_t *u)
{
    wpool_t *p = agw_calloc(1, sizeof(*p));
    agw_upstream_conf_copy(&p->conf, u);
    p->pool = agw_pool_create(w->loop, &p->conf);
    agw_pool_set_batch(p->pool, &w->batch);
    agw_pool_set_limits(p->pool, w->limits);
    p->refs = 1;
    return p;
}

void agw_worker_set_endpoint_addr(wgen_t *g, size_t slot, const struct sockaddr_storage *addr, socklen_t len)
{
    agw_worker_t *w = g->w;
    wpool_t *old = g->pools[slot];
    g->pools[slot] = NULL;
    if (len > 0) {
        agw_upstream_conf_t u = g->conf->eps[slot]; /* shallow: pool_new copies it */
        u.addr = *addr;
        u.addrlen = len;
        g->pools[slot] = pool_new(w, &u);
    }
    if (old && --old->refs == 0) {
        old->next_draining = w->gens.old_pools;
        w->gens.old_pools = old;
    }
}

void agw_worker_reap_pools(agw_worker_t *w)
{
    for (wpool_t **pp = &w->gens.old_pools; *pp;) {
        wpool_t *p = *pp;
        agw_pool_stats_t st;
        agw_pool_stats(p->pool, &st);
        if (st.pending == 0 && st.open == st.idle) { /* no call left: idle connections only */
            *pp = p->next_draining;
            p->refs = 1;
            pool_release(p);
        } else {
            pp = &p->next_draining;
        }
    }
}

void agw_worker_gen_discard(wgen_t *g)
{
    if (g->L) {
        agw_worker_gen_heap_report(g); /* what its limit refused and stopped since the last tick */
        agw_heap_close_lua_state(g->L);
    }
    agw_generation_unref(g->gen);
    free(g->reported);
    free(g);
}

void agw_worker_gen_free(wgen_t *g)
{
    if (g->ref_report_stats != LUA_NOREF) {
        lua_rawgeti(g->L, LUA_REGISTRYINDEX, g->ref_report_stats);
        if (lua_pcall(g->L, 0, 0, 0) != 0)
            lua_pop(g->L, 1);
    }
    for (size_t i = 0; i < g->conf->ep_first[g->conf->num_upstreams]; i++)
        pool_release(g->pools[i]);
    free(g->pools);
    agw_worker_gen_discard(g);
}

void agw_worker_free_dead_gens(agw_worker_t *w)
{
    while (!h2o_linklist_is_empty(&w->gens.dead)) {
        wgen_t *g = H2O_STRUCT_FROM_MEMBER(wgen_t, link, w->gens.dead.next);
        h2o_linklist_unlink(&g->link);
        agw_worker_gen_free(g);
    }
}

/* The listeners accept with conf's TLS contexts from now on: the worker takes a reference to each
 * and drops the one it held. A connection already accepted holds the context it was accepted
 * with (accept.c, conn_t), so the old one lives on until the last of those closes. */
static void adopt_listener_tls(agw_worker_t *w, const agw_config_t *conf)
{
    for (size_t i = 0; i < w->num_listeners && i < conf->num_listen; i++) {
        h2o_accept_ctx_t *ac = &w->listeners[i].accept_ctx;
        SSL_CTX *ctx = conf->listen[i].ssl_ctx;
        if (ctx == ac->ssl_ctx)
            continue;
        if (ctx)
            SSL_CTX_up_ref(ctx);
        SSL_CTX_free(ac->ssl_ctx);
        ac->ssl_ctx = ctx;
    }
}

void agw_worker_gen_activate(agw_worker_t *w, wgen_t *g)
{
    const agw_config_t *conf = g->conf;
    wgen_t *old = w->gens.cur;
    agw_worker_cache_configure(w, conf);
    /* one pool per endpoint: an endpoint that did not change keeps its pool (and its keep-alive
     * connections) across a reload, whatever happened to the other endpoints of its upstream */
    size_t n = conf->ep_first[conf->num_upstreams], nold = old ? old->conf->ep_first[old->conf->num_upstreams] : 0;
    g->pools = agw_calloc(n ? n : 1, sizeof(*g->pools));
    for (size_t i = 0; i < n; i++) {
        if (conf->eps[i].addrlen == 0) /* a slot of a host name that it does not fill (group/directory.h) */
            continue;
        for (size_t j = 0; j < nold; j++) {
            wpool_t *p = old->pools[j];
            if (p && agw_upstream_conf_same(&p->conf, &conf->eps[i])) {
                p->refs++;
                g->pools[i] = p;
                break;
            }
        }
        if (g->pools[i] == NULL)
            g->pools[i] = pool_new(w, &conf->eps[i]);
    }
    g->refs = 1; /* current */
    h2o_linklist_insert(w->gens.live.next, &g->link); /* first */
    w->gens.cur = g;
    adopt_listener_tls(w, conf);
    agw_worker_accept_resume(w); /* clients.max_connections may have been raised */
    __atomic_store_n(&w->gens.serving, g->gen->number, __ATOMIC_RELEASE);
    if (old)
        agw_worker_gen_release(old);
}

void agw_worker_gens_init(agw_worker_gens_t *gs)
{
    h2o_linklist_init_anchor(&gs->live);
    h2o_linklist_init_anchor(&gs->dead);
    pthread_mutex_init(&gs->next_lock, NULL);
}

wgen_t *agw_worker_gens_offer(agw_worker_gens_t *gs, wgen_t *g)
{
    pthread_mutex_lock(&gs->next_lock);
    wgen_t *replaced = gs->next;
    gs->next = g;
    pthread_mutex_unlock(&gs->next_lock);
    return replaced;
}

wgen_t *agw_worker_gens_take(agw_worker_gens_t *gs)
{
    return agw_worker_gens_offer(gs, NULL);
}

void agw_worker_on_reload(struct ev_loop *loop, ev_async *a, int revents)
{
    (void)loop, (void)revents;
    agw_worker_t *w = a->data;
    wgen_t *g = agw_worker_gens_take(&w->gens);
    if (g)
        agw_worker_gen_activate(w, g);
}

/* ---- loading a generation into a VM --------------------------------------------------------- */

/* 1 when the generation table a VM loaded (at idx) lists exactly conf's endpoints and upstreams,
 * in the same order: the router's endpoint indexes and the pools' upstream indexes then name the
 * same handlers and upstreams in the VM (the folder could change between two loads). */
static int same_generation(lua_State *L, int idx, const agw_config_t *conf)
{
    int top = lua_gettop(L);
    lua_getfield(L, idx, "endpoints");
    int same = lua_istable(L, -1) && lua_objlen(L, -1) == conf->num_endpoints;
    for (size_t i = 0; same && i < conf->num_endpoints; i++) {
        lua_rawgeti(L, top + 1, (int)i + 1);
        lua_getfield(L, -1, "route");
        lua_getfield(L, -2, "file");
        const char *route = lua_tostring(L, -2), *file = lua_tostring(L, -1);
        same = route && file && strcmp(route, conf->endpoints[i].route) == 0 &&
               strcmp(file, conf->endpoints[i].file) == 0;
        lua_pop(L, 3);
    }
    lua_getfield(L, idx, "upstreams"); /* name -> { index = i } */
    size_t n = 0;
    if (same && lua_istable(L, -1)) {
        lua_pushnil(L);
        while (lua_next(L, -2) != 0) {
            n++;
            lua_pop(L, 1);
        }
    }
    same = same && n == conf->num_upstreams;
    for (size_t i = 0; same && i < conf->num_upstreams; i++) {
        lua_getfield(L, -1, conf->upstreams[i].name);
        lua_getfield(L, -1, "index");
        same = lua_tointeger(L, -1) == (lua_Integer)i + 1;
        lua_pop(L, 2);
    }
    lua_settop(L, top);
    return same;
}

/* Loads the runtime and the scripts folder into a new VM for g (any thread: the VM is not used
 * by the worker until it is installed). */
static int init_vm(wgen_t *g, agw_buf_t *errors)
{
    const agw_config_t *conf = g->conf;
    lua_State *L = g->L = agw_vm_new(conf->dir);
    if (L == NULL) {
        agw_buf_puts(errors, "out of memory creating a Lua state\n");
        return -1;
    }
    g->heap = agw_heap_lua_of(L);
    agw_heap_lua_set_limit(g->heap, (size_t)conf->script_memory_limit_mb << 20);
    if (agw_vm_load_generation(L, conf->dir, errors) != 0)
        return -1;
    /* from now on a script that grows the heap past the limit is stopped by the watchdog's hook
     * (not during the load: it runs on the main thread under the loader's own hook, which the
     * watchdog's would replace) */
    g->heap->on_over = agw_watchdog_on_heap_over;
    int gen = lua_gettop(L);
    if (!same_generation(L, gen, conf)) {
        agw_buf_printf(errors, "%s/gateway.lua:1: the scripts folder changed while it was being loaded; load it "
                       "again (SIGHUP, or start the gateway again)\n", conf->dir);
        return -1;
    }
    lua_getglobal(L, "require");
    lua_pushliteral(L, "agg.runtime");
    if (lua_pcall(L, 1, 1, 0) != 0) {
        agw_buf_printf(errors, "cannot load agg.runtime: %s\n", lua_tostring(L, -1));
        return -1;
    }
    int rt = lua_gettop(L);
    lua_getfield(L, rt, "init");
    agw_contract_push_keys(L); /* upvalue 2 of every core.* function, and g->ref_keys */
    lua_pushvalue(L, -1);
    g->ref_keys = luaL_ref(L, LUA_REGISTRYINDEX);
    int keys = lua_gettop(L);
    if (agw_resp_known_init(&g->own_headers, L, agw_worker_own_headers) != 0) /* (a wrong list: no lane) */
        agw_log(AGW_LOG_WARN, "worker: the runtime's own header names break resp_headers.h's rules; "
                "core.respond reads every header by the rules");
    lua_createtable(L, 0, 16);
    for (const luaL_Reg *f = agw_worker_core_fns; f->name; f++) {
        lua_pushlightuserdata(L, g);
        lua_pushvalue(L, keys);
        for (int k = 1; k <= AGW_KEY_COUNT; k++)
            lua_rawgeti(L, keys, k);
        lua_pushcclosure(L, f->func, 2 + AGW_KEY_COUNT);
        lua_setfield(L, -2, f->name);
    }
    for (const luaL_Reg *f = agw_worker_cache_fns; f->name; f++) {
        if (!agw_worker_cache_fn_wanted(conf, f->name))
            continue;
        lua_pushlightuserdata(L, g);
        lua_pushcclosure(L, f->func, 1);
        lua_setfield(L, -2, f->name);
    }
    lua_createtable(L, (int)conf->num_upstreams, 0); /* core.breakers: shared by every worker */
    for (size_t i = 0; i < conf->num_upstreams; i++) {
        agw_breaker_push(L, conf->breakers[i]);
        lua_rawseti(L, -2, (int)i + 1);
    }
    lua_setfield(L, -2, "breakers");
    /* core.loop: where the worker keeps its loop (made after its first generation's VM: NULL
     * until then), and core.ev_now, libev's function as a pointer (the FFI would find it by name
     * only if the process exported it: not with a static libev). The runtime calls it through the
     * FFI for core.now (l_now's value without a call into C from compiled Lua: agg.runtime.init) */
    lua_pushlightuserdata(L, &g->w->loop);
    lua_setfield(L, -2, "loop");
    double (*now_fn)(struct ev_loop *) = ev_now;
    void *now_ptr;
    memcpy(&now_ptr, &now_fn, sizeof(now_ptr)); /* (a function pointer as data: POSIX dlsym's way) */
    lua_pushlightuserdata(L, now_ptr);
    lua_setfield(L, -2, "ev_now");
    lua_remove(L, keys); /* init, core */
    lua_getfield(L, gen, "upstreams");
    lua_getfield(L, gen, "endpoints");
    lua_getfield(L, gen, "token_exchange");
    if (lua_pcall(L, 4, 0, 0) != 0) {
        agw_buf_printf(errors, "runtime init failed: %s\n", lua_tostring(L, -1));
        return -1;
    }
    int fn_keys = 0;
    for (size_t i = 0; i < conf->limits.num_rules; i++)
        fn_keys |= conf->limits.rules[i].key == AGW_LIMIT_KEY_FUNCTION;
    if (fn_keys) { /* agg.limits.key_into with this generation's rules (worker/limits.c) */
        lua_getglobal(L, "require");
        lua_pushliteral(L, "agg.limits");
        if (lua_pcall(L, 1, 1, 0) != 0) {
            agw_buf_printf(errors, "cannot load agg.limits: %s\n", lua_tostring(L, -1));
            return -1;
        }
        lua_getfield(L, -1, "bind");
        lua_getfield(L, gen, "config");
        lua_getfield(L, -1, "limits");
        lua_remove(L, -2);
        if (lua_pcall(L, 1, 0, 0) != 0) {
            agw_buf_printf(errors, "agg.limits.bind failed: %s\n", lua_tostring(L, -1));
            return -1;
        }
        lua_getfield(L, -1, "key_into");
        g->ref_limit_key = luaL_ref(L, LUA_REGISTRYINDEX);
        lua_createtable(L, 0, 2);
        g->ref_limit_out = luaL_ref(L, LUA_REGISTRYINDEX);
        lua_pop(L, 1);
    }
    lua_getfield(L, rt, "start");
    g->ref_start = luaL_ref(L, LUA_REGISTRYINDEX);
    lua_getfield(L, rt, "on_call");
    g->ref_on_call = luaL_ref(L, LUA_REGISTRYINDEX);
    lua_getfield(L, rt, "abort");
    g->ref_abort = luaL_ref(L, LUA_REGISTRYINDEX);
    lua_getfield(L, rt, "on_timer");
    g->ref_on_timer = luaL_ref(L, LUA_REGISTRYINDEX);
    lua_getfield(L, rt, "on_redis");
    g->ref_on_redis = lua_isfunction(L, -1) ? luaL_ref(L, LUA_REGISTRYINDEX) : (lua_pop(L, 1), LUA_NOREF);
    lua_getfield(L, rt, "on_purge");
    g->ref_on_purge = lua_isfunction(L, -1) ? luaL_ref(L, LUA_REGISTRYINDEX) : (lua_pop(L, 1), LUA_NOREF);
    lua_getfield(L, rt, "report_stats");
    g->ref_report_stats = lua_isfunction(L, -1) ? luaL_ref(L, LUA_REGISTRYINDEX) : (lua_pop(L, 1), LUA_NOREF);
    lua_getfield(L, rt, "compact");
    g->ref_compact = lua_isfunction(L, -1) ? luaL_ref(L, LUA_REGISTRYINDEX) : (lua_pop(L, 1), LUA_NOREF);
    /* runtime.on_call's answer: one table, reused (contract.lua) */
    lua_createtable(L, 0, AGW_ANSWER_FIELDS);
    g->ref_answer = luaL_ref(L, LUA_REGISTRYINDEX);
    lua_settop(L, 0);
    return 0;
}

/* ---- hot reload: prepare, discard, install -------------------------------------------------- */

agw_worker_gen_t *agw_worker_prepare(agw_worker_t *w, agw_generation_t *gen, agw_buf_t *errors)
{
    wgen_t *g = agw_calloc(1, sizeof(*g));
    g->w = w;
    g->gen = agw_generation_ref(gen);
    g->conf = &gen->conf;
    g->ref_report_stats = g->ref_compact = LUA_NOREF;
    g->ref_on_redis = g->ref_on_purge = LUA_NOREF;
    g->ref_limit_key = g->ref_limit_out = LUA_NOREF;
    g->reported = agw_calloc(gen->conf.num_upstreams ? gen->conf.num_upstreams * AGW_COUNTERS_FIELDS : 1,
                         sizeof(*g->reported));
    if (init_vm(g, errors) != 0) {
        agw_worker_gen_discard(g);
        return NULL;
    }
    return g;
}

void agw_worker_discard(agw_worker_gen_t *g)
{
    if (g)
        agw_worker_gen_discard(g);
}

void agw_worker_install(agw_worker_t *w, agw_worker_gen_t *g)
{
    wgen_t *replaced = agw_worker_gens_offer(&w->gens, g); /* not taken yet: g supersedes it */
    if (replaced)
        agw_worker_gen_discard(replaced);
    ev_async_send(w->loop, &w->gens.reload_async);
}
