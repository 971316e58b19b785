/* gc.c: a worker VM's Lua garbage collector, stepped between requests and timed (gc.h). */
#include "worker/gc.h"

#include <time.h>
#ifdef __GLIBC__
#include <malloc.h>
#endif

static const uint64_t gc_bounds_us[AGW_M_GC_BOUNDS] = {10, 25, 50, 100, 250, 500, 1000, 2500, 10000};

static uint64_t clock_ns(clockid_t clk)
{
    struct timespec ts;
    clock_gettime(clk, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* CLOCK_MONOTONIC: read without a system call (vDSO), cheap enough around every step. On a busy
 * machine a step's wall time also holds time the thread was not running at all. */
static uint64_t now_ns(void)
{
    return clock_ns(CLOCK_MONOTONIC);
}

static size_t heap_bytes(lua_State *L)
{
    return (size_t)lua_gc(L, LUA_GCCOUNT, 0) * 1024u + (size_t)lua_gc(L, LUA_GCCOUNTB, 0);
}

void agw_gc_take(lua_State *L, agw_gc_t *gc)
{
    lua_gc(L, LUA_GCSTOP, 0);
    gc->live = gc->last = heap_bytes(L);
    gc->in_cycle = 0;
}

static void count_pause(agw_lua_gc_stats_t *st, uint64_t us)
{
    size_t b = 0;
    while (b < AGW_M_GC_BOUNDS && us > gc_bounds_us[b])
        b++;
    AGW_M_ADD(st->pause[b], 1);
    AGW_M_ADD(st->pause_us_sum, us);
    if (us > AGW_M_GET(st->pause_us_max))
        AGW_M_SET(st->pause_us_max, us);
}

void agw_gc_pace(lua_State *L, agw_gc_t *gc, agw_lua_gc_stats_t *st)
{
    size_t h = heap_bytes(L);
    size_t floor = gc->live > AGW_GC_MIN_HEAP / 2 ? gc->live : AGW_GC_MIN_HEAP / 2;
    if (!gc->in_cycle) {
        if (h < 2 * floor) { /* setpause 200: a cycle when the heap has doubled */
            gc->last = h;
            lua_gc(L, LUA_GCSTOP, 0); /* a script's collectgarbage("collect") re-armed it */
            return;
        }
        gc->in_cycle = 1;
    }
    /* as LuaJIT paces itself: one step (GCSTEPSIZE, 1 KB, of allocation paid for) per KB
     * allocated since the last pacing, at least one while a cycle runs; the same work LuaJIT would
     * have spread over the allocations, so the collector keeps up with any burst */
    size_t want = (h > gc->last ? (h - gc->last) >> 10 : 0) + 1, n = 0;
    uint64_t c0 = now_ns(), c = c0, step_max = 0;
    lua_gc(L, LUA_GCRESTART, 0);
    for (;;) {
        int done = lua_gc(L, LUA_GCSTEP, 0);
        uint64_t c1 = now_ns();
        if (c1 - c > step_max)
            step_max = c1 - c;
        c = c1;
        n++;
        if (done) {
            gc->in_cycle = 0;
            gc->live = heap_bytes(L);
            AGW_M_ADD(st->cycles, 1);
            break;
        }
        if (n >= want)
            break;
    }
    lua_gc(L, LUA_GCSTOP, 0);
    gc->last = heap_bytes(L);
    AGW_M_ADD(st->steps, n);
    if (step_max / 1000 > AGW_M_GET(st->step_us_max))
        AGW_M_SET(st->step_us_max, step_max / 1000);
    count_pause(st, (c - c0) / 1000);
}

void agw_gc_idle(lua_State *L, agw_gc_t *gc, agw_lua_gc_stats_t *st)
{
    uint64_t c0 = now_ns();
    /* twice: what a finalizer (a userdata's or cdata's __gc) could reach is kept by the cycle that
     * finalizes it, and freed by the next (measured: 33 MB after one collection following 5,000
     * pages in flight, 2.8 MB after the second) */
    lua_gc(L, LUA_GCCOLLECT, 0);
    lua_gc(L, LUA_GCCOLLECT, 0);
    lua_gc(L, LUA_GCSTOP, 0);
    uint64_t us = (now_ns() - c0) / 1000;
    gc->in_cycle = 0;
    gc->live = gc->last = heap_bytes(L);
    AGW_M_ADD(st->idle_collections, 1);
    if (us > AGW_M_GET(st->idle_us_max))
        AGW_M_SET(st->idle_us_max, us);
}

void agw_gc_trim(void)
{
#ifdef __GLIBC__
    malloc_trim(0);
#endif
}
