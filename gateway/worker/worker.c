/* worker.c: a worker thread's life: its loops (libuv for h2o embedded in libev), the response
 * queue each loop iteration sends, the once-a-second tick, start, drain and stop.
 *
 * Request path: a client connection is accepted (accept.c), h2o calls agw_worker_on_req
 * (request.c: route match, edge, limits, runtime.start in Lua). The handler's coroutine calls
 * core.call() for each upstream call; completions call runtime.on_call(); the handler's return
 * value arrives in core.respond() (core.c), which encodes the page and queues it here
 * (agw_worker_queue_response); on_prepare sends the iteration's responses together. A request
 * whose client goes away first is noticed by the dispose callback of its memory pool or by its
 * client watch (client_watch.c), which cancel its calls through runtime.abort() (lua_entry.c).
 *
 * Generations (hot reload, generation.h): the worker runs each generation of the scripts folder
 * in a VM of its own (wgen_t, vm.c). New requests go to the current one; a request, an upstream
 * call and a runtime timer keep a reference to the generation they started on and finish there.
 * A generation that is no longer current is freed (its VM closed, the pools only it used closed)
 * when its last reference goes.
 *
 * The rest of the worker: accept.c, request.c, client_watch.c, lua_entry.c, vm.c, core.c (the Lua
 * transport, "agg.core", and upstream calls), cache.c, limits.c, park.c, request_log.c (problems,
 * tracing, metrics, the access log); worker_internal.h holds what they share.
 */
#include "worker/worker_internal.h"

#include "base/mem.h"
#include "front/inbuf.h"
#include "front/inline_write.h"

#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "base/heap.h"
#include "base/log.h"

/* ---- loops: libuv (h2o) embedded in libev -------------------------------------------------- */

static void run_uv(agw_worker_t *w)
{
    uv_run(&w->uvloop, UV_RUN_NOWAIT);
    agw_inline_write_finish(); /* the callbacks of the writes that went out at once (inline_write.h) */
}

static void on_uv_io(struct ev_loop *loop, ev_io *io, int revents)
{
    (void)loop, (void)revents;
    run_uv(io->data);
}

static void on_uv_timer(struct ev_loop *loop, ev_timer *t, int revents)
{
    (void)loop, (void)revents;
    run_uv(t->data);
}

/* Before libev waits: run what libuv has due now, read the upstream answers that came (with a
 * ring), write the upstream requests and send the responses this iteration made (agw_batch_flush,
 * agw_worker_flush_responses: all at once, see upstream/batch.h), then arm a timer for libuv's next
 * deadline. The flush comes after every run of libuv, whose requests may start calls; an answer
 * it reads runs its page's script, which may start more calls or respond, so it repeats until
 * nothing is queued. upstream/batch.h requires a flush before every poll when there is a ring: this
 * watcher is it. A response's write that went out at once has its callback called here too
 * (front/inline_write.h), before libev may wait. Last, each VM's collector pause is set by the
 * requests in flight (gc.h agw_gc_pace). */
static void on_prepare(struct ev_loop *loop, ev_prepare *p, int revents)
{
    (void)revents;
    agw_worker_t *w = p->data;
    int timeout, rounds = 0;
    for (;;) {
        size_t n;
        do { /* upstream requests first: their upstreams start on them while responses go out */
            n = agw_batch_flush(&w->batch);
            n += agw_worker_flush_responses(w);
            n += agw_guard_h2_flush(&w->guard); /* GOAWAYs to clients that cancel too much */
        } while (n > 0);
        /* libuv's clock moves only in uv_run: on a worker whose libuv has nothing to do, a
         * timeout measured from its last run was armed anew each time libev woke (the stats
         * timer: every second), always as far away, and never fired (h2o's request, handshake
         * and idle timeouts of a quiet worker's connections: a silent client held its slot) */
        uv_update_time(&w->uvloop);
        int written = agw_inline_write_pending() > 0; /* responses' writes to finish (inline_write.h) */
        timeout = written ? 0 : uv_backend_timeout(&w->uvloop);
        if (timeout != 0 || rounds++ == 4)
            break;
        if (written) /* their callbacks, without a run of libuv (a poll) for them */
            agw_inline_write_finish();
        else
            run_uv(w);
    }
    for (h2o_linklist_t *l = w->gens.live.next; l != &w->gens.live; l = l->next) {
        wgen_t *g = H2O_STRUCT_FROM_MEMBER(wgen_t, link, l);
        agw_gc_pace(g->L, &g->gc_pace, w->tables.reqs.used); /* the collector's pause in a burst (gc.h) */
    }
    ev_timer_stop(loop, &w->uv_timer);
    if (timeout >= 0) {
        ev_timer_set(&w->uv_timer, timeout / 1000.0, 0.);
        ev_timer_start(loop, &w->uv_timer);
    }
}

static void on_stop(struct ev_loop *loop, ev_async *a, int revents)
{
    (void)a, (void)revents;
    ev_break(loop, EVBREAK_ALL);
}

/* While draining, every 10 ms: the connections that must not be cut yet (agw_worker_busy_conns),
 * for the main thread's drain. */
static void on_drain_tick(struct ev_loop *loop, ev_timer *t, int revents)
{
    (void)loop, (void)revents;
    agw_worker_t *w = t->data;
    if (w->own_goaway) /* a connection that turned HTTP/2 since (a TLS handshake, an upgrade) */
        agw_guard_h2_shutdown(&w->guard);
    __atomic_store_n(&w->busy_conns, agw_worker_busy_conns(w), __ATOMIC_RELEASE);
}

/* Graceful shutdown: stop accepting (the listening sockets close, so new connections are refused
 * once every worker closed its own) and ask h2o to wind the open connections down (HTTP/2 GOAWAY;
 * HTTP/1 responses from now on close their connection: agw_worker_closing); requests in flight
 * go on, and the drain waits for the connections that are busy (agw_worker_busy_conns). */
static void on_drain(struct ev_loop *loop, ev_async *a, int revents)
{
    (void)revents;
    agw_worker_t *w = a->data;
    if (w->draining)
        return;
    w->draining = 1;
    w->drain_started = ev_now(loop);
    for (size_t i = 0; i < w->num_listeners; i++)
        agw_worker_listener_close(&w->listeners[i]);
    /* HTTP/2: GOAWAY, the connections stay until their streams are done (guard.h); h2o's own
     * shutdown would close a connection whose request body is still arriving */
    w->ctx.shutdown_requested = 1;
    w->own_goaway = agw_guard_h2_shutdown(&w->guard) == 0;
    if (!w->own_goaway)
        h2o_context_request_shutdown(&w->ctx);
    __atomic_store_n(&w->busy_conns, agw_worker_busy_conns(w), __ATOMIC_RELEASE);
    w->drain_timer.data = w;
    ev_timer_init(&w->drain_timer, on_drain_tick, 0.01, 0.01);
    ev_timer_start(loop, &w->drain_timer);
    __atomic_store_n(&w->drained, 1, __ATOMIC_RELEASE); /* the sockets are closed: no new connection */
}

/* ---- the response queue: sent by on_prepare -------------------------------------------------- */

void agw_worker_queue_response(reqref_t *rr, const char *body, size_t len)
{
    agw_worker_t *w = rr->w;
    rr->out = h2o_strdup(&rr->req->pool, body, len);
    h2o_linklist_insert(&w->out_queue, &rr->out_link); /* before the anchor: last */
}

size_t agw_worker_flush_responses(agw_worker_t *w)
{
    static h2o_generator_t generator = {NULL, NULL}; /* the whole body goes in one h2o_send */
    size_t n = 0;
    reqref_t *rr;
    while (!h2o_linklist_is_empty(&w->out_queue)) {
        rr = H2O_STRUCT_FROM_MEMBER(reqref_t, out_link, w->out_queue.next);
        h2o_linklist_unlink(&rr->out_link);
        h2o_req_t *req = rr->req;
        agw_worker_closing(w, req);
        h2o_start_response(req, &generator);
        if (h2o_memis(req->input.method.base, req->input.method.len, H2O_STRLIT("HEAD")))
            h2o_send(req, NULL, 0, 1);
        else
            h2o_send(req, &rr->out, 1, 1);
        n++;
    }
    return n;
}

/* ---- thread --------------------------------------------------------------------------------- */

/* A purge the admin listener posted (cache/purge.h): the entries of tier 1 whose keys start with
 * prefix, then the keys each live generation's VM remembers as missing (runtime.on_purge: its Bloom
 * filters, which answer a 404 before tier 1 is looked at, are emptied when any of their keys could
 * start with prefix; without it a purged 404 was answered for up to negative_ttl_s). */
static void purge_cache(void *arg, const char *prefix, size_t len)
{
    agw_worker_t *w = arg;
    if (w->cache.lru)
        agw_lru_purge_prefix(w->cache.lru, prefix, len);
    for (h2o_linklist_t *l = w->gens.live.next; l != &w->gens.live;) {
        wgen_t *g = H2O_STRUCT_FROM_MEMBER(wgen_t, link, l);
        h2o_linklist_t *next = l->next;
        if (g->ref_on_purge != LUA_NOREF) {
            agw_worker_gen_hold(g); /* an entry into Lua: as in on_stats_timer */
            lua_rawgeti(g->L, LUA_REGISTRYINDEX, g->ref_on_purge);
            lua_pushlstring(g->L, prefix, len);
            agw_worker_call_runtime(g, 1);
            next = l->next; /* the list may have changed meanwhile; g is still on it (held) */
            agw_worker_gen_release(g);
        }
        l = next;
    }
}

/* agw_gc_idle's hook: agg.runtime.compact in g's VM (an entry like any other: timed, limited). */
static void compact_vm(void *arg)
{
    wgen_t *g = arg;
    lua_rawgeti(g->L, LUA_REGISTRYINDEX, g->ref_compact);
    agw_worker_call_runtime(g, 0);
}

void agw_worker_gen_heap_report(wgen_t *g)
{
    agw_worker_t *w = g->w;
    agw_lua_heap_t *h = g->heap;
    if (h == NULL)
        return;
    agw_heap_lua_settle(h);
    if (h->refused != g->heap_refused_seen) {
        agw_log(AGW_LOG_WARN, "worker %d: %llu call(s) of string.rep, table.concat, string.format or string.gsub "
                "refused (the largest %.1f MB): the scripts' heap would have passed script_memory_limit_mb (%llu MB; it holds %.1f MB); "
                "the script that asked got \"not enough memory\"", w->id,
                (unsigned long long)(h->refused - g->heap_refused_seen), (double)h->refused_largest / 1048576.0,
                (unsigned long long)g->conf->script_memory_limit_mb, (double)agw_heap_lua_used(h) / 1048576.0);
        AGW_M_ADD(w->m->lua_gc.memory_refused, h->refused - g->heap_refused_seen);
        g->heap_refused_seen = h->refused;
        h->refused_largest = 0;
    }
    if (h->stopped != g->heap_stopped_seen) {
        agw_log(AGW_LOG_WARN, "worker %d: %llu script(s) stopped: the scripts' heap, collected, was still "
                "over script_memory_limit_mb (%llu MB; it holds %.1f MB)", w->id,
                (unsigned long long)(h->stopped - g->heap_stopped_seen),
                (unsigned long long)g->conf->script_memory_limit_mb, (double)agw_heap_lua_used(h) / 1048576.0);
        AGW_M_ADD(w->m->lua_gc.memory_stopped, h->stopped - g->heap_stopped_seen);
        g->heap_stopped_seen = h->stopped;
    }
}

/* Once a second: when no request started for AGW_GC_IDLE_S ticks and none is in flight, full
 * collections of every VM and the C heap's free memory back to the kernel, once per idle spell,
 * then the C heap's trim again every AGW_GC_TRIM_S s while it stays idle (gc.h); and the VMs'
 * heap size for the metrics, with the large blocks their limit refused (logged, counted). */
static void worker_idle_tick(agw_worker_t *w)
{
    uint64_t started = AGW_M_GET(w->m->requests_started);
    size_t heap = 0;
    if (started != w->idle_started || started != AGW_M_GET(w->m->requests_ended)) {
        w->idle_started = started;
        w->idle_ticks = 0;
    } else if (++w->idle_ticks == AGW_GC_IDLE_S) {
        for (h2o_linklist_t *l = w->gens.live.next; l != &w->gens.live;) {
            wgen_t *g = H2O_STRUCT_FROM_MEMBER(wgen_t, link, l);
            agw_worker_gen_hold(g); /* the compaction is an entry into Lua: as in on_stats_timer */
            agw_gc_idle(g->L, &w->m->lua_gc, g->ref_compact != LUA_NOREF ? compact_vm : NULL, g);
            l = l->next;
            agw_worker_gen_release(g);
        }
        agw_worker_log_release_spares(w); /* the records of the requests and calls of the burst */
        agw_worker_calls_release_spares(w);
        agw_slots_compact(&w->tables.reqs); /* the id tables the burst grew, when empty */
        agw_slots_compact(&w->tables.calls);
        agw_slots_compact(&w->tables.timers); /* (a burst's hedges, retries, cache lookups' waits) */
        agw_gc_trim();
    } else if (w->idle_ticks % AGW_GC_TRIM_S == 0) {
        agw_gc_trim(); /* what idle upstream connections closing since then freed */
    }
    agw_gc_timer_calibrate(&w->gc_timer);
    for (h2o_linklist_t *l = w->gens.live.next; l != &w->gens.live; l = l->next) {
        wgen_t *g = H2O_STRUCT_FROM_MEMBER(wgen_t, link, l);
        heap += (size_t)lua_gc(g->L, LUA_GCCOUNT, 0) * 1024u;
        agw_worker_gen_heap_report(g);
    }
    AGW_M_SET(w->m->lua_gc.heap_bytes, heap);
}

/* Once a second: the cache purges the admin listener posted; the runtime's retry/hedge/single-flight
 * totals of every live generation and the current generation's pool gauges. */
static void on_stats_timer(struct ev_loop *loop, ev_timer *t, int revents)
{
    (void)loop, (void)revents;
    agw_worker_t *w = t->data;
    agw_cache_inbox_take(&w->m->purge, purge_cache, w); /* POST /cache/purge (cache/purge.h) */
    agw_worker_reap_pools(w); /* pools of endpoint addresses that went away (group/directory.h) */
    if (w->pool_gauges_of != w->gens.cur) {
        /* a reload: an upstream it removed has no pool in the current generation, and its gauges
         * read 0 from now on, not the last values of the pool it had (its counters stay) */
        for (size_t s = 0; s < w->m->num_upstreams; s++) {
            AGW_M_SET(w->m->upstreams[s].pool_open, 0);
            AGW_M_SET(w->m->upstreams[s].pool_idle, 0);
            AGW_M_SET(w->m->upstreams[s].pool_pending, 0);
        }
        w->pool_gauges_of = w->gens.cur;
    }
    for (size_t i = 0; i < w->gens.cur->conf->num_upstreams; i++)
        agw_worker_publish_pool(w->gens.cur, i);
    for (h2o_linklist_t *l = w->gens.live.next; l != &w->gens.live;) {
        wgen_t *g = H2O_STRUCT_FROM_MEMBER(wgen_t, link, l);
        h2o_linklist_t *next = l->next;
        if (g->ref_report_stats != LUA_NOREF) {
            agw_worker_gen_hold(g);
            lua_rawgeti(g->L, LUA_REGISTRYINDEX, g->ref_report_stats);
            lua_pushboolean(g->L, g == w->gens.cur); /* current: only it health checks (agg.health) */
            agw_worker_call_runtime(g, 1);
            next = l->next; /* the list may have changed meanwhile; g is still on it (held) */
            agw_worker_gen_release(g);
        }
        l = next;
    }
    agw_worker_send_sweep(w); /* clients that take none of their answer (clients.send_timeout_s) */
    worker_idle_tick(w);
}

static void *worker_main(void *arg)
{
    agw_worker_t *w = arg;
    agw_watchdog_attach(&w->script);
    /* A plain client connection's input buffer in a 2 KB block, not h2o's 5 KB (front/inbuf.h) */
    agw_inbuf_thread_init();
    agw_inline_write_enable();
    ev_run(w->loop, 0);
    agw_inline_write_disable();
    agw_guard_dispose(&w->guard);
    agw_worker_cache_close(w);
    agw_auth_cache_free(&w->auth_cache);
    agw_worker_log_close(w);
    agw_worker_calls_release_spares(w);
    return NULL;
}

int agw_worker_ring_wanted(agw_buf_t *errors)
{
    const char *v = getenv("AGGWAY_IO_URING");
    if (v == NULL || strcmp(v, "on") == 0)
        return 1;
    if (strcmp(v, "off") == 0)
        return 0;
    agw_buf_printf(errors, "AGGWAY_IO_URING=%s: must be on or off (unset: on)\n", v);
    return -1;
}

agw_worker_t *agw_worker_start(int id, agw_generation_t *gen, h2o_globalconf_t *globalconf,
                               const agw_listener_fd_t *fds, size_t num_fds, agw_metrics_t *metrics, int access_fd,
                               agw_limit_store_t *limits, agw_client_slots_t *slots, agw_buf_t *errors)
{
    agw_worker_t *w = agw_calloc(1, sizeof(*w));
    agw_gc_timer_init(&w->gc_timer); /* before any entry into Lua */
    w->id = id;
    w->script.id = id;
    w->m = metrics;
    w->limits = limits;
    w->slots = slots;
    agw_worker_log_init(&w->log, access_fd, gen->conf.admin_port != 0, w);
    w->rng = 0x9E3779B97F4A7C15ull ^ ((uint64_t)time(NULL) << 8) ^ (uint64_t)(id + 1);
    /* trace ids must not repeat across gateways started in the same second */
    if (getrandom(&w->log.trace_rng, sizeof(w->log.trace_rng), GRND_NONBLOCK) != (ssize_t)sizeof(w->log.trace_rng))
        w->log.trace_rng = w->rng ^ ((uint64_t)getpid() << 32) ^ (uint64_t)(uintptr_t)w;
    if (w->log.trace_rng == 0)
        w->log.trace_rng = w->rng;
    /* the ids of the worker's Redis commands start anywhere below 2^52 (exact as Lua numbers, with
     * room to count): the limits script gives a command's back, and a proxy that mixed up the replies
     * of two gateways' connections must not find the other's ids in step with its own (an attack
     * review: both counted 1, 2, 3 …) */
    w->cache.redis_next_id = w->log.trace_rng & ((1ull << 52) - 1); /* (random: getrandom's, above) */
    wgen_t *first = agw_worker_prepare(w, gen, errors);
    if (first == NULL) {
        free(w);
        return NULL;
    }
    agw_worker_gens_init(&w->gens);
    w->loop = ev_loop_new(EVFLAG_AUTO);
    agw_timeouts_init(&w->timeouts, w->loop);
    uv_loop_init(&w->uvloop);
    ev_io_init(&w->uv_io, on_uv_io, uv_backend_fd(&w->uvloop), EV_READ);
    w->uv_io.data = w;
    ev_io_start(w->loop, &w->uv_io);
    ev_init(&w->uv_timer, on_uv_timer);
    w->uv_timer.data = w;
    h2o_linklist_init_anchor(&w->out_queue);
    h2o_linklist_init_anchor(&w->conns);
    h2o_linklist_init_anchor(&w->watch_queue);
    /* the upstream I/O of each loop iteration in batched system calls (io_uring, upstream/batch.h);
     * AGGWAY_IO_URING=off makes one system call per operation */
    if (agw_worker_ring_wanted(errors) == 1) {
        char why[128];
        if (agw_batch_ring_init(&w->batch, why, sizeof(why)) != 0)
            agw_log(AGW_LOG_WARN, "upstream I/O: one system call per operation: %s (worker %d)", why, id);
    } else if (id == 0) {
        agw_log(AGW_LOG_INFO, "upstream I/O: one system call per operation (AGGWAY_IO_URING=off)");
    }
    if (id == 0 && w->batch.ring)
        agw_log(AGW_LOG_INFO, "upstream I/O: batched per loop iteration (io_uring)");
    ev_prepare_init(&w->uv_prepare, on_prepare);
    w->uv_prepare.data = w;
    ev_prepare_start(w->loop, &w->uv_prepare);
    ev_async_init(&w->stop_async, on_stop);
    ev_async_start(w->loop, &w->stop_async);
    ev_async_init(&w->drain_async, on_drain);
    w->drain_async.data = w;
    ev_async_start(w->loop, &w->drain_async);
    ev_async_init(&w->gens.reload_async, agw_worker_on_reload);
    w->gens.reload_async.data = w;
    ev_async_start(w->loop, &w->gens.reload_async);
    ev_async_init(&w->slot_async, agw_worker_on_slot_free);
    w->slot_async.data = w;
    ev_async_start(w->loop, &w->slot_async);
    agw_client_slots_register(slots, (unsigned)id, w->loop, &w->slot_async);
    ev_timer_init(&w->stats_timer, on_stats_timer, 1., 1.);
    w->stats_timer.data = w;
    ev_timer_start(w->loop, &w->stats_timer);
    ev_init(&w->watch_timer, agw_worker_on_watch_timer);
    w->watch_timer.data = w;
    ev_init(&w->refused_timer, agw_worker_on_refused_recheck);
    w->refused_timer.data = w;

    h2o_context_init(&w->ctx, &w->uvloop, globalconf);
    agw_guard_init(&w->guard, &w->ctx);

    w->listeners = agw_calloc(num_fds ? num_fds : 1, sizeof(*w->listeners));
    w->num_listeners = num_fds;
    for (size_t i = 0; i < num_fds; i++) {
        listener_t *l = &w->listeners[i];
        l->worker = w;
        l->accept_ctx.ctx = &w->ctx;
        l->accept_ctx.hosts = globalconf->hosts;
        l->accept_ctx.ssl_ctx = NULL; /* the generation's (agw_worker_gen_activate) */
        l->fd = fds[i].fd;
        agw_worker_listener_start(l);
    }
    agw_worker_gen_activate(w, first); /* also gives the TLS listeners their SSL_CTX */
    if (pthread_create(&w->thread, NULL, worker_main, w) != 0) {
        agw_buf_puts(errors, "cannot start a worker thread\n");
        return NULL;
    }
    w->script.thread = w->thread; /* before the watchdog starts (server.c) */
    return w;
}

uint64_t agw_worker_generation(const agw_worker_t *w)
{
    return __atomic_load_n(&w->gens.serving, __ATOMIC_ACQUIRE);
}

void agw_worker_drain(agw_worker_t *w)
{
    /* The listening sockets stop taking connections at once, from the caller's thread: a worker
     * stuck in a long C call (a trusted script's) would close them only when its loop ran again,
     * and meanwhile the kernel went on completing handshakes into their backlogs, for connections
     * that waited out the stuck-worker limit and were reset at exit. shutdown(2) of a listening
     * socket resets the connections in its backlog and takes it out of its SO_REUSEPORT group
     * (Linux: the socket is closed but for its descriptor); on_drain closes the descriptor, which
     * is the worker's until then (nothing else can be given its number meanwhile). */
    __atomic_store_n(&w->listeners_shut, 1, __ATOMIC_RELEASE);
    for (size_t i = 0; i < w->num_listeners; i++)
        if (w->listeners[i].fd >= 0)
            shutdown(w->listeners[i].fd, SHUT_RD);
    ev_async_send(w->loop, &w->drain_async);
}

agw_watchdog_target_t *agw_worker_watchdog_target(agw_worker_t *w)
{
    return &w->script;
}

int agw_worker_inflight(const agw_worker_t *w)
{
    return __atomic_load_n(&w->inflight, __ATOMIC_RELAXED);
}

int agw_worker_drained(const agw_worker_t *w)
{
    return __atomic_load_n(&w->drained, __ATOMIC_ACQUIRE);
}

unsigned agw_worker_busy(const agw_worker_t *w)
{
    return __atomic_load_n(&w->drained, __ATOMIC_ACQUIRE) ? __atomic_load_n(&w->busy_conns, __ATOMIC_ACQUIRE) : 0;
}

uint64_t agw_worker_requests_started(const agw_worker_t *w)
{
    return AGW_M_GET(w->m->requests_started);
}

int agw_worker_stop(agw_worker_t *w, uint64_t wait_ms)
{
    ev_async_send(w->loop, &w->stop_async);
    struct timespec until = agw_clock_after_ms(CLOCK_REALTIME, wait_ms); /* pthread_timedjoin_np's clock */
    if (pthread_timedjoin_np(w->thread, NULL, &until) != 0)
        return -1; /* still running: leave everything it may touch alone */
    for (size_t i = 0; i < w->num_listeners; i++) { /* connections still open keep their own */
        SSL_CTX_free(w->listeners[i].accept_ctx.ssl_ctx);
        w->listeners[i].accept_ctx.ssl_ctx = NULL;
    }
    wgen_t *pending = agw_worker_gens_take(&w->gens);
    if (pending)
        agw_worker_gen_discard(pending);
    return 0;
}
