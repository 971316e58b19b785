/* worker_internal.h: what the files of a worker share (not installed; included by the files of
 * gateway/worker/ only): the worker's private types and the
 * functions one of these files calls in another. Small helpers on the per-request and per-call
 * path that more than one file calls are static inline here, so that they stay inlinable.
 */
#ifndef AGW_WORKER_INTERNAL_H
#define AGW_WORKER_INTERNAL_H

#include "worker/worker.h"

#include <ctype.h>
#include <ev.h>
#include <lauxlib.h>
#include <string.h>

#include "base/buf.h"
#include "base/heap.h"
#include "base/timeouts.h"
#include "guard/guard.h"
#include "cache/lru.h"
#include "edge/auth.h"
#include "edge/edge.h"
#include "worker/gc.h"
#include "worker/generation.h"
#include "worker/gens.h"
#include "worker/request_log.h"
#include "worker/scratch.h"
#include "worker/tables.h"
#include "worker/watchdog.h"
#include "worker/wcache.h"
#include "worker/wlimits.h"
#include "ops/metrics.h"
#include "redis/redis.h"
#include "script/resp_headers.h"
#include "base/slots.h"
#include "ops/trace.h"
#include "upstream/batch.h"
#include "limits/limit.h"
#include "worker/client_slots.h"

/* A listening socket as the worker's libuv loop accepts on it. */
typedef struct listener {
    int fd;                        /* the listening socket (the worker's own; -1 once closed by a drain) */
    ev_io io;                      /* readable: connections wait in the socket's backlog */
    ev_timer rest;                 /* accept found no descriptor or memory free: io stays stopped until
                                      this fires (accept.c) */
    h2o_accept_ctx_t accept_ctx;   /* ssl_ctx: the TLS context of the current generation's listener
                                      (a reference of this worker's, swapped on the worker's loop
                                      when a generation becomes current), NULL for cleartext */
    agw_worker_t *worker;
} listener_t;

/* An upstream pool of this worker, shared by the generations whose upstream did not change. */
typedef struct wpool {
    agw_pool_t *pool;
    agw_upstream_conf_t conf;   /* the pool's own copy: it may outlive the generation that made it */
    int refs;                   /* generations of this worker that use it */
    struct wpool *next_draining; /* on the worker's draining list (its address left the directory) */
} wpool_t;

/* A generation as this worker runs it. Worker thread only, once installed. */
typedef struct agw_worker_gen {
    agw_worker_t *w;
    agw_generation_t *gen;      /* the shared part: config, routes, metric slots (one reference) */
    const agw_config_t *conf;   /* &gen->conf */
    lua_State *L;
    int ref_start, ref_on_call, ref_abort, ref_on_timer; /* runtime functions in the registry */
    int ref_report_stats;       /* runtime.report_stats, or LUA_NOREF */
    int ref_compact;            /* runtime.compact (the idle hook, gc.h), or LUA_NOREF */
    agw_gc_pace_t gc_pace;      /* the collector's pause in a burst (gc.h agw_gc_pace) */
    agw_lua_heap_t *heap;       /* L's heap record (base/heap.h): its limit is armed around each
                                   entry into the runtime (agw_worker_call_runtime) */
    uint64_t heap_refused_seen; /* the VM's refused huge blocks and stopped scripts already */
    uint64_t heap_stopped_seen; /* counted and logged (base/heap.h agw_lua_heap_t, the tick) */
    int ref_on_redis;           /* runtime.on_redis (agg.cache's Redis answers), or LUA_NOREF */
    int ref_on_purge;           /* runtime.on_purge (POST /cache/purge: agg.cache's keys known
                                   missing), or LUA_NOREF */
    int ref_limit_key;          /* agg.limits.key_into (rules with a key function), or LUA_NOREF */
    int ref_limit_out;          /* the table key_into fills, reused */
    uint64_t cache_reported[AGW_M_CACHE_OUTCOMES]; /* agg.cache.stats as last published (metrics) */
    int ref_answer;             /* the table runtime.on_call gets, reused (lua/agg/contract.lua) */
    int ref_keys;               /* the contract's field names (contract.h agw_contract_push_keys) */
    agw_resp_known_t own_headers; /* agw_worker_own_headers as L's strings (core.respond's lane for
                                     a page's own headers, script/resp_headers.h) */
    wpool_t **pools;            /* one per endpoint, same index as conf->eps (upstream i's from
                                   conf->ep_first[i]); NULL until installed */
    uint64_t *reported;         /* per upstream: the runtime's AGW_COUNTERS_FIELDS totals as last
                                   published (metrics) */
    int refs;                   /* requests, calls, timers, deferred aborts, +1 while current */
    h2o_linklist_t link;        /* on the worker's live generations, or its dead ones (gens.h) */
} wgen_t;

/* The part of a request that lives in its h2o pool; rid is 0 once a response was sent. */
typedef struct reqref {
    agw_worker_t *w;
    wgen_t *g;          /* the generation it runs on (holds a reference) */
    uint64_t rid;
    h2o_req_t *req;
    ev_io client_watch; /* HTTP/1: notices the client closing while the page is being built */
    int watching;       /* client_watch is started */
    int watch_fd;       /* HTTP/1: the client's socket, -1 when there is nothing to watch */
    h2o_linklist_t watch_link; /* on the worker's watch_queue while queued for a watch */
    int endpoint;       /* 1-based endpoint index (metrics, access log) */
    double started;     /* ev_now() when the request arrived */
    char *logline;      /* access log on: "METHOD\0path" copied at arrival (the request may be gone
                           by the time a client that left is logged) */
    agw_trace_t *trace; /* the request's spans (trace.h), until the request is recorded */
    const char *tracestate; /* the incoming tracestate to pass on (valid, in the request's memory), or NULL */
    size_t tracestate_len;
    h2o_iovec_t out;    /* the response body (in the request's memory) while the response is queued */
    h2o_linklist_t out_link; /* on the worker's out queue (agw_worker_queue_response) while linked */
    agw_edge_user_t user; /* the edge's verdict, until the request's memory goes (core.request_user) */
    size_t unsent;      /* HTTP/2: its answer's bytes counted in its connection's unsent (guard.h) */
} reqref_t;

/* The problem of an answer agw_worker_unsent_take refused (503), and its body. */
#define AGW_UNSENT_KIND "connection-overloaded"
#define AGW_UNSENT_TITLE "the connection holds more answers than its client has taken"
#define AGW_UNSENT_DETAIL "clients.max_unsent_bytes"
#define AGW_UNSENT_PROBLEM                                                                                          \
    "{\"type\":\"urn:aggway:problem:" AGW_UNSENT_KIND "\",\"title\":\"" AGW_UNSENT_TITLE "\",\"status\":503,"   \
    "\"detail\":\"" AGW_UNSENT_DETAIL "\"}"

/* HTTP/2: whether an answer of len bytes to req fits what its connection may hold of answers its
 * client has not taken (clients.max_unsent_bytes of generation g; one answer always fits: a
 * connection holding none takes any). When it fits it is counted in the connection's unsent and
 * in *counted (len), which the caller gives back with agw_worker_unsent_done when req ends; else
 * nothing is counted and the caller answers 503. HTTP/1 (one answer at a time) always fits. */
int agw_worker_unsent_take(agw_worker_t *w, const wgen_t *g, h2o_req_t *req, size_t len, size_t *counted);

/* Gives back what agw_worker_unsent_take counted for req (*counted, then 0): req has ended. */
void agw_worker_unsent_done(agw_worker_t *w, h2o_req_t *req, size_t *counted);

/* A runtime timer (retry backoff, hedge, a collapsed caller's own timeout), on the worker's set
 * of them (agw_worker.timeouts). */
typedef struct wtimer {
    agw_timeout_t t;
    wgen_t *g;          /* holds a reference */
    uint64_t id;
} wtimer_t;

/* The block a wtimer_t is allocated in (core.c): 64 bytes, jemalloc's 64-byte size class, not the
 * 48-byte class its size would take. Measured with tools/bench/memory HEDGE_MS=10000 (15,000 such
 * timers at the burst's peak, each stopped by its answer): the RSS a minute after the burst was
 * 1.33 x idle twice with 64-byte blocks, against 1.46-1.54 in three runs with 48-byte ones, whose
 * class kept about 1.5 MB of resident pages more with fewer bytes allocated
 * (docs/performance.md, "A twenty-eighth pass"). */
#define AGW_WTIMER_BLOCK 64
_Static_assert(sizeof(wtimer_t) <= AGW_WTIMER_BLOCK, "a runtime timer outgrew its block");

/* One upstream call in flight. */
typedef struct wcall {
    wgen_t *g;          /* the generation that made the call (holds a reference) */
    uint64_t id;
    agw_call_t *call;
    int decode;
    unsigned up;        /* upstream index, 0-based */
    uint64_t rid;       /* the request that made the call (its span is there while it lasts) */
    int span;           /* the call's span in that request's trace, -1 when none */
    struct sf_joiner *joiners; /* requests waiting on this call through single-flight (core.join) */
    struct wcall *next_free;
} wcall_t;

/* A request that shares another request's call (single-flight) and has a span waiting on it. */
typedef struct sf_joiner {
    uint64_t rid;
    int span;
    struct sf_joiner *next;
} sf_joiner_t;

/* A worker: its thread and loops, the generations it runs, its requests, calls and timers. The
 * fields here are the loop and its queues, the front (listeners, connections) and the stores
 * shared with other threads (worker.c); each other concern is a part with a header of its own,
 * saying which file owns it: gens (gens.h, vm.c), tables (tables.h), script (watchdog.h), scratch
 * (scratch.h), cache (wcache.h, cache.c), log (request_log.h, request_log.c). */
struct agw_worker {
    int id;
    pthread_t thread;
    /* the loop and its queues (worker.c) */
    struct ev_loop *loop;
    agw_timeouts_t timeouts;               /* the runtime's timers (core.timer: wtimer_t, core.c) on one
                                              ev_timer: a burst's thousands (single-flight callers'
                                              own timeouts, hedges, retries) leave no libev heap
                                              behind (base/timeouts.h). The loop and the set are never
                                              freed: neither is the worker */
    uv_loop_t uvloop;
    ev_io uv_io;
    ev_timer uv_timer;
    ev_prepare uv_prepare;
    agw_batch_t batch;                     /* upstream requests of this iteration and, with its ring,
                                              the answers to read (upstream/batch.h): flushed by on_prepare
                                              before the loop waits */
    h2o_linklist_t out_queue;              /* responses of this iteration, oldest first, sent by
                                              on_prepare (agw_worker_queue_response) */
    ev_async stop_async;
    ev_async drain_async;                  /* agw_worker_drain(): close the listeners */
    int drained;                           /* the listeners are closed (atomic: agw_worker_drained) */
    int listeners_shut;                    /* agw_worker_drain shut the listening sockets down
                                              (atomic: set by the main thread): accept's EINVAL
                                              from then on is the drain's, not an error */
    int draining;                          /* set by on_drain, read on this thread only */
    int inflight;                          /* requests handed to the runtime and not yet disposed
                                              (atomic: the main thread reads it while draining) */
    double drain_started;                  /* ev_now() when on_drain ran */
    int own_goaway;                        /* the drain's GOAWAYs are the guard's (agw_guard_h2_shutdown),
                                              not h2o's */
    ev_timer drain_timer;                  /* while draining: busy_conns counted every 10 ms */
    unsigned busy_conns;                   /* agw_worker_busy_conns at the last count (atomic:
                                              agw_worker_busy, read by the main thread) */
    uint64_t rng;                          /* xorshift state for core.random() */
    ev_timer stats_timer;                  /* once a second: runtime counters and pool gauges into m */
    const void *pool_gauges_of;            /* the generation whose upstreams' pool gauges the tick last
                                              published (another: every slot's are zeroed first) */
    uint64_t idle_started;                 /* requests_started at the last tick (gc.h's idle collection) */
    int idle_ticks;                        /* ticks since a request last started, while none is in flight */
    agw_gc_timer_t gc_timer;               /* times the entries into Lua (gc.h) */
    /* the front: listeners and client connections (worker.c, accept.c, client_watch.c) */
    h2o_context_t ctx;
    listener_t *listeners;
    size_t num_listeners;
    h2o_linklist_t watch_queue;            /* HTTP/1 requests not yet watched for the client leaving,
                                              in arrival order (reqref_t.watch_link; client_watch.c) */
    ev_timer watch_timer;                  /* due when the oldest of them is CLIENT_WATCH_DELAY old */
    agw_guard_t guard;                     /* client connections and their HTTP/2 cancel windows */
    h2o_linklist_t conns;                  /* the open ones (accept.c's conn_t.link) */
    int accept_waiting;                    /* the listeners are paused: the gateway is at
                                              clients.max_connections (accept.c) */
    ev_async slot_async;                   /* sent by any worker when a client slot comes free while
                                              this one waits (client_slots.h) */
    ev_timer refused_timer;                /* a sweep found writes h2o waits on that libuv refused:
                                              looked at again shortly (accept.c) */
    double accept_warned;                  /* ev_now() of the last accept-failure warning */
    double send_warned;                    /* ev_now() of the last send-timeout warning */
    agw_auth_cache_t auth_cache;           /* verified tokens of this worker (edge/auth.h) */
    /* stores shared with other threads */
    agw_client_slots_t *slots;             /* the gateway's open client connections against
                                              clients.max_connections (client_slots.h) */
    agw_limit_store_t *limits;             /* the process's counts of rate limits and quotas (shared by
                                              every worker, limits/limit.h) */
    agw_metrics_t *m;                      /* this worker's counters (metrics.h); the admin thread reads them */
    /* the parts */
    agw_worker_gens_t gens;                /* the generations it runs (gens.h) */
    agw_worker_tables_t tables;            /* requests, calls and timers in flight by id (tables.h) */
    agw_watchdog_target_t script;          /* its entries into Lua, as the script time limit sees
                                              them (watchdog.h): depth > 0 while C code runs inside Lua */
    agw_worker_scratch_t scratch;          /* buffers reused by every response (scratch.h) */
    agw_worker_cache_t cache;              /* the response cache's tiers (wcache.h) */
    agw_worker_log_t log;                  /* access log, traces, header warnings (request_log.h) */
    agw_worker_limits_t lim;               /* limits' Redis outage and the decision being logged
                                              (wlimits.h, limits.c) */
};

/* Header fields and encoded bytes of one HTTP/2 request header block (HEADERS and its
 * CONTINUATIONs) past which the connection gets GOAWAY before h2o decodes the block (guard.h,
 * agw_guard_h2_watch): four times clients.max_headers and twice clients.max_header_bytes (plus
 * room for the pseudo-header fields and the literals' length prefixes), so that a block somewhat
 * over the caps is still decoded and answered 431, and a bomb never is. */
#define AGW_WORKER_MAX_FIELDS(cc) ((cc)->max_headers * 4 + 16)
#define AGW_WORKER_MAX_BLOCK_BYTES(cc) ((cc)->max_header_bytes * 2 + (size_t)(cc)->max_headers * 8 + 16384)

/* Queues the response of rr's request, whose status and headers are set, with body (copied into
 * the request's memory; len bytes): on_prepare sends it with the others of this loop iteration,
 * after the iteration's upstream requests went out (agw_worker_flush_responses). Sending them
 * together means one wake-up of a client that waits on several, as for upstreams (upstream/batch.h:
 * write coalescing). A request that h2o disposes first (its client left) is dropped from the
 * queue. HEAD responses go without the body. */
void agw_worker_queue_response(reqref_t *rr, const char *body, size_t len);

/* Sends the queued responses, oldest first. Returns how many. */
size_t agw_worker_flush_responses(agw_worker_t *w);

/* At most this many sections of a page are counted (partial pages) and logged. */
#define ALOG_MAX_SECTIONS 64

/* A section of a page, for the access log and the partial-page metrics: name and status point
 * into the page (Lua strings that live as long as the page table). */
typedef struct section_ref {
    const char *name;
    size_t len;
    const char *status;
} section_ref_t;

/* ---- lua_entry.c: entering the runtime ----------------------------------------------------- */

/* Calls the runtime function of generation g already pushed with nargs arguments after it.
 * Returns 0, or -1 when the runtime raised (a gateway bug, logged; script errors never get here).
 * Once no Lua code runs any more, the aborts deferred meanwhile run and the generations released
 * meanwhile are freed. */
int agw_worker_call_runtime(wgen_t *g, int nargs);

/* Forgets request rid of generation g on the runtime side (runtime.abort): its calls are
 * cancelled, now, or once the outermost entry returns when this runs inside Lua (g is held
 * until then). */
void agw_worker_abandon_request(wgen_t *g, uint64_t rid);

/* ---- accept.c: client connections ---------------------------------------------------------- */

/* Starts accepting client connections on l, whose fd, worker and accept_ctx are set (l->fd is a
 * non-blocking listening socket, which the worker owns from then on). Worker's loop, or before the
 * worker's thread runs. */
void agw_worker_listener_start(listener_t *l);

/* Once a second: closes the client connections that have had an answer to send, and whose client
 * acknowledged none of it, for clients.send_timeout_s sweeps in a row (nginx's send_timeout). h2o
 * 2.2.5 has no such timeout: its request timeout stops once a request's head is read, and the
 * HTTP/2 idle timeout while a stream is open, so a client that never reads (an HTTP/2 window left
 * at 0, a socket never read) held its connection and its slot of clients.max_connections for
 * good. Also closes an HTTP/2 connection that has had no stream for 10 s, or a request still
 * arriving after 10 s (h2o's idle timeout restarts on every frame, a PING too, and it has no
 * timeout for a request's body). Closing is shutdown(2) on the socket: h2o sees the failed write
 * or the end of input and closes the connection its own way. Worker's loop. */
void agw_worker_send_sweep(agw_worker_t *w);

/* The listeners, paused while the gateway was at clients.max_connections, accept again when it is
 * under the cap (a connection closed on any worker, a reload raised the cap); while it is still at
 * the cap they stay paused. Worker's loop. */
void agw_worker_accept_resume(agw_worker_t *w);

/* The refused_timer callback: the connections a sweep found waiting on a refused write are looked
 * at again (accept.c, finish_refused_write). Worker's loop. */
void agw_worker_on_refused_recheck(struct ev_loop *loop, ev_timer *t, int revents);

/* The slot_async callback: a client slot came free in the gateway while w waited for one
 * (client_slots.h). Worker's loop. */
void agw_worker_on_slot_free(struct ev_loop *loop, ev_async *a, int revents);

/* Stops accepting on l for good and closes its socket (a drain: new connections are refused once
 * every worker has closed its own). Worker's loop. */
void agw_worker_listener_close(listener_t *l);

/* ---- vm.c: generations -------------------------------------------------------------- */

/* Takes a reference to g (see wgen_t.refs); agw_worker_gen_release drops it. */
static inline void agw_worker_gen_hold(wgen_t *g)
{
    g->refs++;
}

/* Frees an installed generation nobody uses any more (already off the live list): its last
 * runtime counters are published, its VM closed, the pools it alone used closed. */
void agw_worker_gen_free(wgen_t *g);

/* Drops a reference; the last one frees g, or queues it to be freed once the Lua code running
 * now (of any generation) has returned. */
static inline void agw_worker_gen_release(wgen_t *g)
{
    if (--g->refs > 0)
        return;
    agw_worker_t *w = g->w;
    h2o_linklist_unlink(&g->link);
    if (w->script.depth == 0) {
        agw_worker_gen_free(g);
        return;
    }
    h2o_linklist_insert(w->gens.dead.next, &g->link); /* first */
}

/* Logs and counts what g's memory limit refused and stopped since it was last reported (base/heap.h):
 * once a second, and when g's VM closes. */
void agw_worker_gen_heap_report(wgen_t *g);

/* Frees a generation that was never installed (a reload that failed in another worker, or one
 * replaced before this worker took it): nothing but its VM and its reference exist. */
void agw_worker_gen_discard(wgen_t *g);

/* Frees the generations agw_worker_gen_release queued while Lua code was running (none runs now). */
void agw_worker_free_dead_gens(agw_worker_t *w);

/* Gives slot (an index of conf->eps) of the current generation g the address addr (len 0: the
 * slot goes out of service): a new pool for it, made from the slot's settings; the old pool, when
 * no other generation uses it, drains: its calls in flight finish, then agw_worker_reap_pools
 * closes it. Worker thread. */
void agw_worker_set_endpoint_addr(wgen_t *g, size_t slot, const struct sockaddr_storage *addr, socklen_t len);

/* Closes the draining pools whose calls have all ended (the once-a-second tick). */
void agw_worker_reap_pools(agw_worker_t *w);

/* Makes g (prepared by agw_worker_prepare) the generation new requests go to: its pools are the
 * current generation's for upstreams that did not change (keep-alive connections survive), new
 * ones for the others; the TLS listeners accept new connections with g's SSL_CTXs (the worker
 * drops its reference to the previous ones; connections accepted before keep theirs). The
 * previous generation is freed once its requests are done. Worker thread (or before it starts). */
void agw_worker_gen_activate(agw_worker_t *w, wgen_t *g);

/* agw_worker_install(): the main thread left a prepared generation in w->gens.next (w->gens.reload_async,
 * a->data is w). */
void agw_worker_on_reload(struct ev_loop *loop, ev_async *a, int revents);

/* ---- client_watch.c: an HTTP/1 client that leaves (inline: core.respond stops the watch of
 * every request it answers) ------------------------------------------------------------------ */

/* Whether the client of HTTP/1 socket fd has gone, from a look at what it sent (MSG_PEEK): 1 on
 * EOF or an error (gone), 0 when bytes wait (a pipelined request: it is there), -1 when nothing
 * can be told yet (no bytes, no EOF). */
int agw_worker_client_gone(int fd);

/* Finishes HTTP/1 request req, whose client (socket fd) has gone: no status line reaches the
 * socket (its sending side is shut first), the connection closes, and no request pipelined
 * behind req is started. The caller has recorded req (status 499) and abandoned its work. */
void agw_worker_finish_gone(h2o_req_t *req, int fd);

/* HTTP/1: queues rr's request so that its client's socket is watched once the request has run
 * CLIENT_WATCH_DELAY; a client that closes it meanwhile gets 499 and its request is abandoned.
 * Nothing for HTTP/2 (h2o disposes of a reset stream's request). Sets rr's watch fields. */
void agw_worker_watch_client(reqref_t *rr, h2o_req_t *req);

/* w->watch_timer (t->data is w): starts the watches of the queued requests that have run
 * CLIENT_WATCH_DELAY, then waits for the next one. */
void agw_worker_on_watch_timer(struct ev_loop *loop, ev_timer *t, int revents);

/* Takes rr off the worker's queue of requests waiting for their client watch. */
static inline void agw_worker_watch_unqueue(reqref_t *rr)
{
    h2o_linklist_unlink(&rr->watch_link);
    rr->watch_fd = -1;
}

/* Ends rr's client watch, started or still queued; nothing when there is none. */
static inline void agw_worker_stop_client_watch(reqref_t *rr)
{
    if (rr->watching) {
        ev_io_stop(rr->w->loop, &rr->client_watch);
        rr->watching = 0;
    } else if (rr->watch_fd >= 0) {
        agw_worker_watch_unqueue(rr);
    }
}

/* ---- core.c: the "agg.core" transport ------------------------------------------------ */

/* The core.* functions, each pushed as a closure over its generation (upvalue 1) by init_vm. */
extern const luaL_Reg agw_worker_core_fns[];

/* Frees the spare call records of w (w->tables.free_calls: one per call that was in flight at
 * once). When the worker goes idle (worker/gc.h) and when its loop has ended. */
void agw_worker_calls_release_spares(agw_worker_t *w);

/* Inside a core.* function: the generation whose VM runs it (its upvalue 1). */
static inline wgen_t *agw_worker_upg(lua_State *L)
{
    return lua_touserdata(L, lua_upvalueindex(1));
}

/* Inside a core.* function of agw_worker_core_fns: pushes field key (AGW_KEY_*, contract.h) of
 * the table at absolute index t. The contract's keys table is upvalue 2, and each key is an
 * upvalue of its own after it (upvalue 2 + AGW_KEY_*), the cheapest value to push. */
static inline void agw_worker_get_key(lua_State *L, int t, int key)
{
    lua_pushvalue(L, lua_upvalueindex(2 + key));
    lua_rawget(L, t);
}

/* ---- respond.c: core.respond ---------------------------------------------------------------- */

/* core.respond(rid, response) (respond.c; lua/agg/contract.lua). */
int agw_worker_respond(lua_State *L);

/* The header block (base/header.h) of the client request req into b (emptied first): what
 * core.request_headers hands the runtime when a script, a forwarded header, a cache key or a
 * group first needs the page request's headers (request.c). */
void agw_worker_request_headers(agw_buf_t *b, const h2o_req_t *req);

/* Logs a warning (a script's mistake met while serving) at most once per 10 s per distinct
 * message per worker, with the count of repeats left out meanwhile (respond.c). */
void agw_worker_warn(agw_worker_t *w, const char *msg);

/* ---- cache.c: the cache's transport --------------------------------------------------------- */

/* core.cache_get, cache_set, redis_get, redis_set, digest, cache_counters (closures as above). */
extern const luaL_Reg agw_worker_cache_fns[];

/* 1 when the core function name of agw_worker_cache_fns belongs in a VM of conf (redis_* only
 * when conf has redis with cache.redis on). */
int agw_worker_cache_fn_wanted(const agw_config_t *conf, const char *name);

/* Makes w's tiers what conf says (when a generation becomes current): tier 1 sized
 * cache.memory_bytes / workers (made once, resized after), the Redis client made, kept (same
 * settings) or replaced. Worker thread, or before it starts. */
void agw_worker_cache_configure(agw_worker_t *w, const agw_config_t *conf);

/* Frees w's Redis client and tier 1 (the worker's loop has stopped; no Lua runs for answers). */
void agw_worker_cache_close(agw_worker_t *w);

/* The header names the runtime writes into its own responses (agg.page: x-aggregation-completed,
 * cache-control, vary, and a problem's content-type and retry-after), sorted bytewise,
 * NULL-terminated: a VM holds them as g->own_headers (respond.c). */
extern const char *const agw_worker_own_headers[];

/* The pool gauges of generation g's upstream up (0-based): the sums over its endpoints' pools.
 * Published by the worker's once-a-second stats tick only: a gauge a scrape reads is at most a
 * second old, and a call does not pay for it (two calls of agw_pool_stats per endpoint a call
 * made, about 400 instructions a bench page; docs/performance.md, "A nineteenth pass"). */
void agw_worker_publish_pool(wgen_t *g, size_t up);

/* ---- park.c: a request parked on an asynchronous decision ---------------------------------- */

/* A request held before its script starts while something it needs is decided elsewhere: the
 * edge's JWKS refetch (edge.h, AGW_EDGE_WAIT), a limits check in Redis (worker/limits.c). The
 * park lives in the request's memory (h2o_mem_alloc_shared: the caller's state follows it in the
 * same block), holds its generation and counts in w->inflight (a drain waits for it). Exactly one
 * of these ends it:
 *  - the decision: agw_park_wake() (on the loop's thread); ops->resume(pk, 0) runs from the loop
 *    on its next pass, never inside the caller of agw_park_wake;
 *  - ops->poll (when set), called every poll_s, returns 1: ops->resume(pk, 0) (for a decision
 *    made on another thread, which cannot wake the loop);
 *  - the deadline, timeout_s after parking: ops->resume(pk, 1);
 *  - the client leaves (h2o disposes of the request): ops->cancel(pk) when set, never resume.
 * resume runs with the generation still held; it answers the request or starts its script, and
 * must not touch pk after that (an answer may free the request's memory at once). */
typedef struct agw_park agw_park_t;

typedef struct agw_park_ops {
    int (*poll)(agw_park_t *pk);                /* NULL, or 1 when the decision is in */
    void (*resume)(agw_park_t *pk, int timed_out);
    void (*cancel)(agw_park_t *pk);             /* NULL, or releases what the caller's state holds */
} agw_park_ops_t;

struct agw_park {
    ev_timer timer;                             /* private: poll, wake-up and deadline */
    agw_worker_t *w;                            /* ro */
    wgen_t *g;                                  /* ro: held while parked */
    h2o_req_t *req;                             /* ro */
    const agw_park_ops_t *ops;                  /* ro */
    double until;                               /* private: ev_now() of the deadline */
    double poll_s;                              /* private: 0 without ops->poll */
    int state;                                  /* private: 0 ended, 1 waiting, 2 woken */
};

/* Parks req on generation g for at most timeout_s. size: bytes of the caller's struct, whose first
 * member is the agw_park_t (zeroed beyond it). Returns the park (the caller's struct). */
void *agw_park_new(agw_worker_t *w, wgen_t *g, h2o_req_t *req, size_t size, double timeout_s, double poll_s,
                   const agw_park_ops_t *ops);

/* The decision is in: resume pk on the loop's next pass. Nothing when pk has ended already. */
void agw_park_wake(agw_park_t *pk);

/* 1 while pk waits (neither resumed nor cancelled). */
static inline int agw_park_waiting(const agw_park_t *pk)
{
    return pk->state != 0;
}

/* ---- limits.c: limits and priority shedding before any Lua (limits/limit.h, limits/gate.h) ---- */

/* What agw_worker_gate did with a request. */
#define AGW_GATE_PASS 0     /* accepted: the caller starts the script */
#define AGW_GATE_ANSWERED 1 /* answered here (429, 503) */
#define AGW_GATE_PARKED 2   /* waiting for Redis: the gate starts the script itself (start) or answers */

/* The script's start of a request the gate let through after a wait: params (n of them) point
 * into the request's memory; user is the edge's verdict (its claims reference is the callee's). */
typedef void (*agw_gate_start_fn)(agw_worker_t *w, wgen_t *g, h2o_req_t *req, int endpoint,
                                  const agw_route_param_t *params, size_t n, agw_auth_result_t *user);

/* Sheds req (503) when the worker is over its bound for the endpoint's priority group; checks it
 * against every rule of the endpoint: local rules in the process's store at once, Redis rules
 * (store = "redis") in one script call while the request is parked (at most the Redis timeout;
 * on an error, each rule's on_redis_error decides). Counts it when every rule accepts, puts the
 * RateLimit fields on the response (refused, or limits.headers) and notes the decision for the
 * access log. On AGW_GATE_PARKED the gate owns user's claims reference and calls start (or
 * answers) when Redis has answered; otherwise the caller keeps it. */
int agw_worker_gate(agw_worker_t *w, wgen_t *g, h2o_req_t *req, int endpoint, const agw_route_param_t *params,
                    size_t num_params, agw_auth_result_t *user, agw_gate_start_fn start);

/* Before the edge authenticates req (endpoint has an auth policy): its rates that stand before
 * auth (key = "ip", before_auth; limits.c address_asks says why only those) refuse it when their
 * count in the process's store is spent, so that a flood of forged tokens or guessed API keys
 * costs no signature check or key lookup once its address is over its rate. Nothing is counted
 * (limits/limit.h, agw_limit_peek_next); a Redis rule's count there is its shadow, a slot of its
 * own holding the refusals this process charged it. The answer is the gate's 429 (RateLimit
 * fields, Retry-After until the next request fits, problem details: draft-ietf-httpapi-ratelimit-
 * headers, RFC 9457), noted with store "shadow" when a shadow refused. Returns AGW_GATE_PASS, or
 * AGW_GATE_ANSWERED when it answered. An endpoint without auth: AGW_GATE_PASS at once
 * (agw_worker_gate counts everything). */
int agw_worker_gate_before_edge(agw_worker_t *w, wgen_t *g, h2o_req_t *req, int endpoint);

/* The edge refused req (400, 401, 403: the client's own failure, not an unavailable key set):
 * counts it against the same rates as agw_worker_gate_before_edge, so that refused attempts spend
 * an address's rate as accepted requests do: each in the process's store (a Redis rule's shadow),
 * a Redis rule in Redis too by one command of its own no request waits for (at most
 * AGW_LIMIT_CHARGES_MAX in flight a worker). */
void agw_worker_gate_charge(agw_worker_t *w, wgen_t *g, h2o_req_t *req, int endpoint);

/* ---- accept.c: a graceful shutdown's view of the client connections -------------------------- */

/* How long a drain waits for the first request of a connection accepted before the listeners
 * closed and that has sent nothing yet (a TLS handshake or a request on its way over a slow
 * network), ms; the grace (shutdown_grace_ms) bounds it too. */
#define AGW_DRAIN_FIRST_REQUEST_MS 1000

/* Request req begins on its client connection: notes that the connection has served one. */
void agw_worker_conn_request(agw_worker_t *w, h2o_req_t *req);

/* A response to req is about to start: while the worker drains, it closes its HTTP/1 connection
 * (Connection: close), also for a request that began before the drain. */
static inline void agw_worker_closing(agw_worker_t *w, h2o_req_t *req)
{
    if (w->draining)
        req->http1_is_persistent = 0;
}

/* While draining: how many of w's client connections must not be cut yet. A connection is busy
 * while h2o holds bytes it has read and not finished with (an HTTP/1 request from its first byte
 * until it is answered, an HTTP/2 frame not whole yet) and, for HTTP/2, while it has open streams
 * (a request being received, handled or answered). One that has served a request is busy while
 * h2o writes to it (a response going out); one that has not, for AGW_DRAIN_FIRST_REQUEST_MS after
 * the drain began (its first request may be on its way; a write on it then is the TLS handshake's,
 * which a client that left can hold for good: it does not count). Bytes libuv has seen arrive and not
 * yet handed to h2o count as one more. An HTTP/1 connection idle between requests is not busy:
 * the process may end with it open (its client sees the connection close, the keep-alive race
 * every HTTP/1 client handles by retrying on a new one). On w's thread. */
unsigned agw_worker_busy_conns(agw_worker_t *w);

/* ---- request_log.c: problems, tracing, metrics and the access log ---------------------------- */

/* Now in microseconds since the epoch (span times). */
static inline uint64_t agw_worker_now_us(agw_worker_t *w)
{
    return (uint64_t)(ev_now(w->loop) * 1e6); /* libev's loop time is the wall clock */
}

/* Starts rr's trace from the request's traceparent and tracestate headers (W3C Trace Context
 * §3.2, §3.3): a valid traceparent (exactly one) continues its trace and its tracestate (every
 * tracestate header, joined with ',') goes on if valid; anything else starts a new trace. Sets
 * rr->trace (a record from w->log.free_traces or malloc; left as it is when none can be had) and
 * rr->tracestate (in req's memory, or NULL). */
void agw_worker_trace_begin(agw_worker_t *w, reqref_t *rr, h2o_req_t *req, size_t path_len);

/* The endpoint agw_worker_record_c_response counts the batch endpoint's envelope under: its own
 * route ("POST <path>", config.h batch_route) in the current generation. */
#define AGW_ENDPOINT_ENVELOPE (-1)

/* Counts and logs a response made in C without the runtime (no route, bad framing, the batch
 * endpoint's envelope); endpoint 0: no route, AGW_ENDPOINT_ENVELOPE: the envelope; ms: how long
 * the request took (0 for one answered as it arrived). */
void agw_worker_record_c_response(agw_worker_t *w, h2o_req_t *req, int endpoint, int status, double ms,
                                  size_t bytes);

/* Sends an RFC 9457 problem built in C (routing errors, runtime failures) as the response to req,
 * encoded in w->scratch.out. Counts and logs the problem as the response of rr, or (rr NULL) of a request
 * that never reached the runtime, for endpoint (0: no route matched). */
void agw_worker_send_problem(agw_worker_t *w, h2o_req_t *req, reqref_t *rr, int endpoint, int status,
                             const char *kind, const char *title, const char *detail);

/* Sends body (len bytes of application/problem+json, copied) with status as the response to req,
 * counted and logged as agw_worker_send_problem says. */
void agw_worker_send_problem_body(agw_worker_t *w, h2o_req_t *req, reqref_t *rr, int endpoint, int status,
                                  const char *body, size_t len);

/* Request rr ends with status (a response, or 499 when the client left first). It is counted,
 * logged (bytes: the body's length; secs: the page's nsecs sections, or NULL when the response is
 * not a page; timing: its Server-Timing value, tlen bytes, or NULL) and its trace recorded;
 * rr->logline is freed. */
void agw_worker_record_request(agw_worker_t *w, reqref_t *rr, int status, size_t bytes, const section_ref_t *secs,
                               size_t nsecs, const char *timing, size_t tlen);

/* The sections of a page table at idx (section name -> { status = … }), sorted by name: at most
 * max of them into out, their number returned. The names and statuses are the table's strings,
 * valid while the table is referenced. */
size_t agw_worker_page_sections(lua_State *L, int idx, section_ref_t *out, size_t max);

/* The same for a page's rows at idx (core.respond's response.rows: { name, status, data, error,
 * … }, contract.h's section order), read up to the first nil name; a row whose name or status is
 * not a string is left out. */
size_t agw_worker_row_sections(lua_State *L, int idx, section_ref_t *out, size_t max);

/* Writes the access log lines buffered in w->log.alog to w->log.access_fd (dropped if the write fails). */
void agw_worker_alog_flush(agw_worker_t *w);

/* w->log.alog_timer: flushes the access log shortly after its first buffered line (t->data is w). */
void agw_worker_on_alog_timer(struct ev_loop *loop, ev_timer *t, int revents);

#endif
