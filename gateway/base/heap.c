/* heap.c: jemalloc for C and the Lua VMs, given back when idle, its figures (heap.h). */
#include "base/heap.h"

#include <lauxlib.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#if AGW_HEAP_JEMALLOC
#include <jemalloc/jemalloc.h>
#elif defined(__GLIBC__)
#include <malloc.h>
#endif

/* The heap record of a VM lives as long as the VM, referenced from LuaJIT's own memory (its
 * allocator's ud), where the leak checker of an ASan build does not look: a VM kept until the
 * process exits (a fuzz harness's) would show its record as a leak. */
#if defined(__SANITIZE_ADDRESS__)
#define AGW_LSAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define AGW_LSAN 1
#endif
#endif
#ifdef AGW_LSAN
#include <sanitizer/lsan_interface.h>
#define NOT_A_LEAK(p) __lsan_ignore_object(p)
#else
#define NOT_A_LEAK(p) ((void)(p))
#endif

#define STR_(x) #x
#define STR(x) STR_(x)

#if AGW_HEAP_JEMALLOC

/* jemalloc reads its options from this string at its start; a MALLOC_CONF in the environment is
 * read after it and wins (heap.h). */
const char *malloc_conf = AGW_HEAP_MALLOC_CONF;

static void *raw_lua_alloc(agw_lua_heap_t *h, void *ptr, size_t osize, size_t nsize)
{
    (void)h;
    if (nsize == 0) {
        if (ptr != NULL)
            sdallocx(ptr, osize, 0);
        return NULL;
    }
    if (ptr == NULL)
        return malloc(nsize);
    return rallocx(ptr, nsize, 0);
}

void *agw_heap_lua_alloc_checked(void *ud, void *ptr, size_t osize, size_t nsize)
{
    if (ptr != NULL && osize != 0) {
        size_t held = sallocx(ptr, 0), told = nallocx(osize, 0);
        if (held != told) {
            fprintf(stderr, "aggway: a Lua block of %zu bytes (size class %zu) was named as %zu bytes "
                    "(size class %zu)\n", held, held, osize, told);
            abort();
        }
    }
    return agw_heap_lua_alloc(ud, ptr, osize, nsize);
}

static lua_Alloc lua_alloc_fn = agw_heap_lua_alloc;

void agw_heap_check_lua_blocks(void)
{
    lua_alloc_fn = agw_heap_lua_alloc_checked;
}

void agw_heap_give_back(void)
{
    /* the blocks this thread's cache holds go back to their slabs first, so that the purge can
     * return the pages they alone kept */
    mallctl("thread.tcache.flush", NULL, NULL, NULL, 0);
    mallctl("arena." STR(MALLCTL_ARENAS_ALL) ".purge", NULL, NULL, NULL, 0);
}

void agw_heap_thread_flush(void)
{
    mallctl("thread.tcache.flush", NULL, NULL, NULL, 0);
}

static size_t stat_bytes(const char *name)
{
    size_t v = 0, sz = sizeof(v);
    return mallctl(name, &v, &sz, NULL, 0) == 0 ? v : 0;
}

int agw_heap_stats(agw_heap_stats_t *st)
{
    uint64_t epoch = 1;
    size_t sz = sizeof(epoch);
    if (mallctl("epoch", &epoch, &sz, &epoch, sz) != 0)
        return -1;
    st->allocated = stat_bytes("stats.allocated");
    st->active = stat_bytes("stats.active");
    st->resident = stat_bytes("stats.resident");
    st->retained = stat_bytes("stats.retained");
    st->metadata = stat_bytes("stats.metadata");
    return 0;
}

#else /* a sanitized build: the sanitizer's malloc for C, LuaJIT's own allocator for the VMs */

/* LuaJIT's allocator (mmap'd segments), as luaL_newstate gives it: the sanitizer's leak check
 * cannot follow LuaJIT's tagged pointers, so a VM that lives until the process exits (a fuzz
 * harness's) would show its blocks as leaks if they came from malloc. Without a heap record (the
 * unit tests' direct calls), realloc and free. */
static void *raw_lua_alloc(agw_lua_heap_t *h, void *ptr, size_t osize, size_t nsize)
{
    if (h != NULL && h->inner != NULL)
        return h->inner(h->inner_ud, ptr, osize, nsize);
    if (nsize == 0) {
        free(ptr);
        return NULL;
    }
    return realloc(ptr, nsize);
}

void *agw_heap_lua_alloc_checked(void *ud, void *ptr, size_t osize, size_t nsize)
{
    return agw_heap_lua_alloc(ud, ptr, osize, nsize);
}

static lua_Alloc lua_alloc_fn = agw_heap_lua_alloc;

void agw_heap_check_lua_blocks(void)
{
}

void agw_heap_give_back(void)
{
#ifdef __GLIBC__
    malloc_trim(0);
#endif
}

void agw_heap_thread_flush(void)
{
}

int agw_heap_stats(agw_heap_stats_t *st)
{
    (void)st;
    return -1;
}

#endif

/* (both builds) */

/* LuaJIT's panic handler, as luaL_newstate sets it. */
static int lua_panic(lua_State *L)
{
    const char *s = lua_tostring(L, -1);
    fprintf(stderr, "PANIC: unprotected error in call to Lua API (%s)\n", s ? s : "error object is not a string");
    fflush(stderr);
    return 0;
}

void agw_heap_lua_set_limit(agw_lua_heap_t *h, size_t bytes)
{
    h->limit = bytes ? bytes : SIZE_MAX;
    h->trip = h->limit;
}

size_t agw_heap_lua_used(const agw_lua_heap_t *h)
{
    if (h->L == NULL)
        return 0; /* (inside lua_newstate) */
    return (size_t)lua_gc(h->L, LUA_GCCOUNT, 0) * 1024u + (size_t)lua_gc(h->L, LUA_GCCOUNTB, 0);
}

/* One allocation in AGW_LUA_CHECK_EVERY (every one while the heap is over the limit), and every
 * large one: does the heap pass its trip? (LuaJIT's own count; it adds this block once the call
 * returns.) Nothing is refused here: an error raised in the runtime's own code would leave a
 * request half way (agg.sandbox bounds what a script can ask in one call, agw_heap_lua_take). */
__attribute__((noinline)) static void *lua_alloc_slow(agw_lua_heap_t *h, void *ptr, size_t osize, size_t nsize)
{
    size_t used = agw_heap_lua_used(h) - osize + nsize;
    h->countdown = used > h->limit ? 1 : AGW_LUA_CHECK_EVERY;
    void *p = raw_lua_alloc(h, ptr, osize, nsize);
    if (p != NULL && used > h->trip && h->armed > 0 && h->on_over != NULL) {
        h->over = 1;
        h->on_over(h->L); /* (sets the hook unless it is set: lua_sethook may be called at any time) */
    }
    return p;
}

int agw_heap_lua_take(lua_State *L, agw_lua_heap_t *h, double bytes)
{
    if (h == NULL || h->limit == SIZE_MAX || h->armed <= 0 || bytes < (double)AGW_LUA_HUGE_BLOCK)
        return 1;
    if (bytes <= (double)h->limit - (double)agw_heap_lua_used(h))
        return 1;
    lua_gc(L, LUA_GCCOLLECT, 0); /* garbage does not count */
    if (bytes <= (double)h->limit - (double)agw_heap_lua_used(h))
        return 1;
    h->refused++;
    if (bytes > (double)h->refused_largest)
        h->refused_largest = bytes > (double)SIZE_MAX ? SIZE_MAX : (size_t)bytes;
    return 0;
}

size_t agw_heap_lua_room(agw_lua_heap_t *h)
{
    if (h == NULL || h->limit == SIZE_MAX || h->armed <= 0)
        return SIZE_MAX;
    size_t used = agw_heap_lua_used(h);
    return used < h->limit ? h->limit - used : 0;
}

void *agw_heap_lua_alloc(void *ud, void *ptr, size_t osize, size_t nsize)
{
    agw_lua_heap_t *h = ud;
    if (nsize == 0) {
        raw_lua_alloc(h, ptr, osize, 0);
        return NULL;
    }
    if (ptr == NULL)
        osize = 0; /* (a new block: LuaJIT passes 0; Lua 5.2's type tags are not LuaJIT's) */
    /* the common path as without a limit: a countdown and a comparison more */
    if (h != NULL && __builtin_expect(nsize >= AGW_LUA_LARGE_BLOCK || --h->countdown <= 0, 0))
        return lua_alloc_slow(h, ptr, osize, nsize);
    return raw_lua_alloc(h, ptr, osize, nsize);
}

/* Full collections of h's VM (from L, the thread running now) until the heap is under the limit
 * or one no longer shrinks it by AGW_LUA_TRIP_SLACK (at most 8: LuaJIT's string buffer halves at
 * each). Returns the heap after. */
static size_t collect_until_settled(lua_State *L, agw_lua_heap_t *h)
{
    size_t used = agw_heap_lua_used(h);
    for (int i = 0; i < 8; i++) {
        size_t before = used;
        lua_gc(L, LUA_GCCOLLECT, 0);
        used = agw_heap_lua_used(h);
        if (used <= h->limit || used + AGW_LUA_TRIP_SLACK > before)
            break;
    }
    return used;
}

void agw_heap_lua_settle(agw_lua_heap_t *h)
{
    if (h->recheck && h->armed <= 0 && h->L != NULL) {
        h->recheck = 0;
        h->collected_at = collect_until_settled(h->L, h);
    }
    h->rechecked = 0;
    if (agw_heap_lua_used(h) <= h->limit) {
        h->trip = h->limit;
        h->collected_at = 0; /* (a collection long ago says nothing of the heap now) */
    }
}

int agw_heap_lua_still_over(lua_State *L, agw_lua_heap_t *h)
{
    h->over = 0;
    size_t used = agw_heap_lua_used(h);
    int recheck = h->recheck && !h->rechecked; /* (once a second: settle collects too) */
    if (h->collected_at == 0 || used > h->collected_at + AGW_LUA_TRIP_SLACK || recheck) {
        if (recheck) {
            h->rechecked = 1;
            h->recheck = 0;
        }
        used = collect_until_settled(L, h);
        h->collected_at = used;
        if (recheck)
            h->rechecked_at = used;
    }
    if (used <= h->limit) {
        h->trip = h->limit;
        h->collected_at = 0;
        return 0;
    }
    size_t ceiling = h->limit + h->limit / 4;
    h->trip = used + AGW_LUA_TRIP_SLACK < ceiling ? used + AGW_LUA_TRIP_SLACK : ceiling;
    h->stopped++;
    h->recheck = 1;
    if (h->rechecked && used > h->rechecked_at + AGW_LUA_TRIP_SLACK)
        h->rechecked = 0; /* this script held more than the last look found live: its own may be garbage soon */
    return 1;
}

lua_State *agw_heap_new_lua_state(void)
{
    agw_lua_heap_t *h = calloc(1, sizeof(*h));
    if (h == NULL)
        return NULL;
    NOT_A_LEAK(h);
#if AGW_HEAP_JEMALLOC
    lua_State *L = lua_newstate(lua_alloc_fn, h);
#else
    lua_State *L = luaL_newstate(); /* then its own allocator behind ours (raw_lua_alloc) */
    if (L != NULL) {
        h->inner = lua_getallocf(L, &h->inner_ud);
        lua_setallocf(L, lua_alloc_fn, h);
    }
#endif
    if (L == NULL) {
        free(h);
        return NULL;
    }
    h->L = L;
    agw_heap_lua_set_limit(h, 0);
    lua_atpanic(L, lua_panic);
    return L;
}

agw_lua_heap_t *agw_heap_lua_of(lua_State *L)
{
    void *ud = NULL;
    lua_Alloc f = lua_getallocf(L, &ud);
    return f == agw_heap_lua_alloc || f == agw_heap_lua_alloc_checked ? ud : NULL;
}

int agw_heap_lua_pcall(lua_State *L, int nargs, int nresults, int errfunc)
{
    return agw_heap_lua_pcall_in(agw_heap_lua_of(L), L, nargs, nresults, errfunc);
}

void agw_heap_close_lua_state(lua_State *L)
{
    if (L == NULL)
        return;
    agw_lua_heap_t *h = agw_heap_lua_of(L);
    if (h != NULL && h->inner != NULL)
        lua_setallocf(L, h->inner, h->inner_ud); /* LuaJIT frees its own allocator's segments
                                                    only when it is the VM's allocator at close */
    lua_close(L);
    free(h);
}
