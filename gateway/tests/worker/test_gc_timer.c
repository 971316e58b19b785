/* Unit tests for the timing of the worker's entries into Lua (worker/gc.h, agw_gc_timer_t): the
 * counter's rate measured against CLOCK_MONOTONIC gives an entry's length in µs, and
 * agw_metrics_lua_entry puts it in its bucket. No loop or VM runs: the entries are busy waits.
 * And the collector's pause in a burst (agw_gc_pace), on a VM of its own. */
#include <lauxlib.h>
#include <string.h>
#include <time.h>

#include "tests/check.h"
#include "worker/gc.h"

static uint64_t mono_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

static void spin_us(uint64_t us)
{
    uint64_t t0 = mono_us();
    while (mono_us() - t0 < us) {
    }
}

/* An entry of 3 ms reads as 3 ms (within what a busy machine's preemption adds), one of none as
 * next to none. */
static void entries_are_timed_in_us(void)
{
    agw_gc_timer_t t;
    memset(&t, 0, sizeof(t));
    agw_gc_timer_init(&t);
    CHECK(t.cycles_per_us > 0);
    spin_us(20000);
    agw_gc_timer_calibrate(&t); /* over 21 ms now */
    uint64_t before = mono_us();
    agw_gc_entry_begin(&t);
    spin_us(3000);
    uint64_t us = agw_gc_entry_us(&t), after = mono_us();
    /* the rate is measured, not exact (10 %): at least the 3 ms waited, at most the wall clock's
     * reading around it (which a preemption may lengthen, never shorten) */
    CHECK(us >= 2700);
    CHECK(us * 10 <= (after - before) * 11 + 1000);
    agw_gc_entry_begin(&t);
    CHECK(agw_gc_entry_us(&t) < 1000);
}

/* Each entry lands in its bucket (µs: 100 250 500 1000 2000 5000 10000 50000, then the rest); the
 * longest is kept once over 100 µs; the sum is every entry's. */
static void entries_land_in_their_buckets(void)
{
    agw_lua_gc_stats_t st;
    memset(&st, 0, sizeof(st));
    uint64_t us[] = {5, 100, 101, 999, 1000, 1001, 60000, 3000};
    for (size_t i = 0; i < sizeof(us) / sizeof(us[0]); i++)
        agw_metrics_lua_entry(&st, us[i]);
    CHECK(st.entries[0] == 2); /* 5, 100 */
    CHECK(st.entries[1] == 1); /* 101 */
    CHECK(st.entries[3] == 2); /* 999, 1000 */
    CHECK(st.entries[4] == 1); /* 1001 */
    CHECK(st.entries[5] == 1); /* 3000 */
    CHECK(st.entries[AGW_M_ENTRY_BOUNDS] == 1); /* 60000 */
    CHECK(st.entry_us_max == 60000);
    CHECK(st.entry_us_sum == 5 + 100 + 101 + 999 + 1000 + 1001 + 60000 + 3000);
    agw_lua_gc_stats_t fast;
    memset(&fast, 0, sizeof(fast));
    agw_metrics_lua_entry(&fast, 40);
    CHECK(fast.entry_us_max == 0 && fast.entries[0] == 1);
}

/* The pause a VM has now (LUA_GCSETPAUSE answers the previous one; it is set back). */
static int pause_of(lua_State *L)
{
    int p = lua_gc(L, LUA_GCSETPAUSE, 100);
    lua_gc(L, LUA_GCSETPAUSE, p);
    return p;
}

/* The step multiplier a VM has now (the same way). */
static int stepmul_of(lua_State *L)
{
    int m = lua_gc(L, LUA_GCSETSTEPMUL, 100);
    lua_gc(L, LUA_GCSETSTEPMUL, m);
    return m;
}

/* AGW_GC_PAUSE_BIG and AGW_GC_STEPMUL_BIG past AGW_GC_BURST requests in flight, the VM's own pause
 * and step multiplier again under AGW_GC_CALM (not in between: no flapping around one count); a
 * VM's own, whatever they are, are what come back. */
static void the_pause_follows_a_burst(void)
{
    lua_State *L = luaL_newstate();
    agw_gc_pace_t pace;
    memset(&pace, 0, sizeof(pace));
    lua_gc(L, LUA_GCSETPAUSE, 170); /* the VM's own (agg.runtime sets 300) */
    lua_gc(L, LUA_GCSETSTEPMUL, 900); /* (agg.runtime sets 1000) */
    agw_gc_pace(L, &pace, 0);
    CHECK(!pace.burst && pause_of(L) == 170);
    agw_gc_pace(L, &pace, AGW_GC_BURST);
    CHECK(!pace.burst && pause_of(L) == 170);
    agw_gc_pace(L, &pace, AGW_GC_BURST + 1);
    CHECK(pace.burst && pause_of(L) == AGW_GC_PAUSE_BIG && stepmul_of(L) == AGW_GC_STEPMUL_BIG);
    agw_gc_pace(L, &pace, AGW_GC_BURST + 5000);
    CHECK(pace.burst && pause_of(L) == AGW_GC_PAUSE_BIG);
    agw_gc_pace(L, &pace, (AGW_GC_BURST + AGW_GC_CALM) / 2); /* between: it stays */
    CHECK(pace.burst && pause_of(L) == AGW_GC_PAUSE_BIG);
    agw_gc_pace(L, &pace, AGW_GC_CALM);
    CHECK(pace.burst && pause_of(L) == AGW_GC_PAUSE_BIG);
    agw_gc_pace(L, &pace, AGW_GC_CALM - 1);
    CHECK(!pace.burst && pause_of(L) == 170 && stepmul_of(L) == 900);
    /* a second burst, and the collector still collects under the burst's pause */
    agw_gc_pace(L, &pace, AGW_GC_BURST * 2);
    CHECK(pace.burst && pause_of(L) == AGW_GC_PAUSE_BIG);
    for (int i = 0; i < 100000; i++)
        lua_newtable(L), lua_pop(L, 1);
    CHECK(lua_gc(L, LUA_GCCOUNT, 0) < 4096);
    agw_gc_pace(L, &pace, 0);
    CHECK(!pace.burst && pause_of(L) == 170 && stepmul_of(L) == 900);
    lua_close(L);
}

int main(void)
{
    RUN(entries_are_timed_in_us);
    RUN(entries_land_in_their_buckets);
    RUN(the_pause_follows_a_burst);
    return CHECK_DONE();
}
