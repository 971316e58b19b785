/* lua_entry.c: entering the Lua runtime from the worker's loop. Every entry is timed by the
 * script time limit (watchdog.h); a long one brings the loop's clock up to date. What must not
 * run while Lua code is running (runtime.abort of a request whose client left, freeing a released
 * generation) is deferred to the moment the outermost entry returns.
 */
#include "worker/worker_internal.h"

#include "base/mem.h"
#include "base/log.h"

static void process_pending_aborts(agw_worker_t *w);

#define AGW_LONG_ENTRY_MS 10 /* an entry into Lua this long updates the loop's clock, ms */

int agw_worker_call_runtime(wgen_t *g, int nargs)
{
    agw_worker_t *w = g->w;
    lua_State *L = g->L;
    int rc = 0;
    if (w->script.depth == 0)
        agw_gc_entry_begin(&w->gc_timer);
    agw_watchdog_enter(&w->script, L, g->conf->script_time_limit_ms); /* an outermost one is timed */
    /* (script_memory_limit_mb acts only inside the protected call) */
    if (agw_heap_lua_pcall_in(g->heap, L, nargs, 0, 0) != 0) {
        agw_log(AGW_LOG_ERROR, "worker %d: runtime error: %s", w->id, lua_tostring(L, -1));
        lua_pop(L, 1);
        rc = -1;
    }
    /* a long entry (a slow script, one the watchdog stopped) leaves the loop's clock behind:
     * requests read after it in this iteration would start their deadlines and call timeouts
     * that long ago, and time out at once */
    if (agw_watchdog_leave(&w->script) >= AGW_LONG_ENTRY_MS)
        ev_now_update(w->loop);
    if (w->script.depth == 0) /* the worker's pauses in Lua (gc.h) */
        agw_metrics_lua_entry(&w->m->lua_gc, agw_gc_entry_us(&w->gc_timer));
    if (w->script.depth == 0 && w->tables.num_pending_aborts)
        process_pending_aborts(w);
    if (w->script.depth == 0 && !h2o_linklist_is_empty(&w->gens.dead))
        agw_worker_free_dead_gens(w);
    return rc;
}

static void abort_request(wgen_t *g, uint64_t rid)
{
    lua_rawgeti(g->L, LUA_REGISTRYINDEX, g->ref_abort);
    lua_pushnumber(g->L, (lua_Number)rid);
    agw_worker_call_runtime(g, 1);
}

static void process_pending_aborts(agw_worker_t *w)
{
    while (w->tables.num_pending_aborts) {
        agw_pending_abort_t pa = w->tables.pending_aborts[--w->tables.num_pending_aborts];
        abort_request(pa.g, pa.rid);
        agw_worker_gen_release(pa.g);
    }
}

void agw_worker_abandon_request(wgen_t *g, uint64_t rid)
{
    agw_worker_t *w = g->w;
    if (w->script.depth) {
        if (w->tables.num_pending_aborts == w->tables.cap_pending_aborts) {
            w->tables.cap_pending_aborts = w->tables.cap_pending_aborts ? w->tables.cap_pending_aborts * 2 : 16;
            w->tables.pending_aborts = agw_realloc(w->tables.pending_aborts, w->tables.cap_pending_aborts * sizeof(*w->tables.pending_aborts));
        }
        w->tables.pending_aborts[w->tables.num_pending_aborts].rid = rid;
        w->tables.pending_aborts[w->tables.num_pending_aborts++].g = g;
        agw_worker_gen_hold(g);
        return;
    }
    abort_request(g, rid);
}
