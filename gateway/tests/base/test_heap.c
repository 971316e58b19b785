/* test_heap: the Lua VMs on jemalloc keep LuaJIT's side of the sized-free contract, the heap's
 * figures add up, and freed memory goes back to the kernel when asked (base/heap.h). */
#include "base/buf.h"
#include "base/heap.h"
#include "script/pattern.h"
#include "script/script.h"
#include "tests/check.h"

#include <lauxlib.h>
#include <lualib.h>
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>
#if AGW_HEAP_JEMALLOC
#include <jemalloc/jemalloc.h>
#endif

#ifndef AGW_SOURCE_DIR
#error "AGW_SOURCE_DIR: the repository, for its scripts folder"
#endif

/* Lua code that makes LuaJIT allocate, resize and free blocks of every kind it has: tables whose
 * array and hash parts grow and shrink, strings short and long (the intern table resizing),
 * string buffers (concat, rep, format, gsub), closures and upvalues, coroutines whose stacks grow
 * deep and are collected, userdata, JIT-compiled loops (trace buffers), and full collections in
 * between. Every block is freed or resized through agw_heap_lua_alloc_checked, which aborts on a
 * size that is not the block's. */
static const char workload[] =
    "local keep = {}\n"
    "for round = 1, 3 do\n"
    "  local t = {}\n"
    "  for i = 1, 20000 do t[i] = i end\n"
    "  for i = 20000, 1, -1 do t[i] = nil end\n"
    "  local h = {}\n"
    "  for i = 1, 5000 do h['k' .. i .. ('x'):rep(i % 70)] = { i, tostring(i) } end\n"
    "  for k in pairs(h) do h[k] = nil end\n"
    "  local parts = {}\n"
    "  for i = 1, 2000 do parts[#parts + 1] = string.format('%d:%s;', i, ('y'):rep(i % 300)) end\n"
    "  local s = table.concat(parts)\n"
    "  s = s:gsub('y+', function(m) return #m end)\n"
    "  keep[#keep + 1] = s:sub(1, 100)\n"
    "  local function deep(n) if n == 0 then return coroutine.yield(1) end return deep(n - 1) + 1 end\n"
    "  local cos = {}\n"
    "  for i = 1, 200 do local co = coroutine.create(deep); coroutine.resume(co, i * 5); cos[i] = co end\n"
    "  for i = 1, 200, 2 do cos[i] = nil end\n"
    "  local fs = {}\n"
    "  for i = 1, 3000 do local v = i; fs[i] = function() v = v + 1; return v end end\n"
    "  for i = 1, 3000 do fs[i]() end\n"
    "  for i = 1, 1000 do newproxy(true) end\n"
    "  local x = 0\n"
    "  for i = 1, 200000 do x = x + (i % 7) end\n"
    "  keep[#keep + 1] = x\n"
    "  collectgarbage()\n"
    "end\n"
    "return #keep\n";

static void lua_blocks_are_freed_with_their_size(void)
{
    lua_State *L = agw_heap_new_lua_state();
    CHECK(L != NULL);
    luaL_openlibs(L);
    CHECK(luaL_loadstring(L, workload) == 0 && lua_pcall(L, 0, 1, 0) == 0);
    CHECK(lua_tointeger(L, -1) == 6);
    agw_heap_close_lua_state(L);
}

static int *over_count;
static void count_over(lua_State *L)
{
    (void)L;
    (*over_count)++;
}

/* The limit (agw_lua_heap_t): the allocator refuses nothing, but passing the limit asks for the
 * stop hook; agg.pattern's string.rep of a huge string past it is refused with "not enough
 * memory" and counted, one within it is not; nothing is refused outside agw_heap_lua_pcall or
 * without a limit. */
static void the_limit_asks_for_the_hook_and_refuses_a_huge_rep(void)
{
    lua_State *L = agw_heap_new_lua_state();
    CHECK(L != NULL);
    luaL_openlibs(L);
    lua_getglobal(L, "package");
    lua_getfield(L, -1, "preload");
    lua_pushcfunction(L, agw_pattern_open);
    lua_setfield(L, -2, "agg.pattern");
    lua_pop(L, 2);
    agw_lua_heap_t *h = agw_heap_lua_of(L);
    CHECK(h != NULL && h->L == L && h->limit == SIZE_MAX && h->refused == 0);
    agw_heap_lua_set_limit(h, (size_t)16 << 20);
    int overs = 0;
    h->on_over = count_over;
    over_count = &overs;
    static const char src[] =
        "local P = require 'agg.pattern'\n"
        "local ok, err = pcall(P.rep, 'x', 32 * 2^20)\n"
        "local fits = #P.rep('y', 4 * 2^20)\n"
        "local head, n = nil, 0\n"
        "for i = 1, 400000 do head = { head, i } n = n + 1 end -- ~25 MB of 40-byte blocks\n"
        "return ok, err, fits, collectgarbage('count') > 16 * 1024\n";
    CHECK(luaL_loadstring(L, src) == 0 && agw_heap_lua_pcall(L, 0, 4, 0) == 0);
    CHECK(!lua_toboolean(L, 1));
    CHECK(lua_tostring(L, 2) != NULL &&
          strstr(lua_tostring(L, 2), "not enough memory: string.rep of 32 MB would take the scripts' heap past "
                                     "script_memory_limit_mb") != NULL);
    CHECK(lua_tointeger(L, 3) == 4 << 20);
    CHECK(lua_toboolean(L, 4)); /* past the limit with small blocks: never refused */
    CHECK(h->refused == 1 && h->refused_largest >= (size_t)32 << 20);
    CHECK(overs >= 1 && h->over); /* the stop hook was asked for (the worker's decides) */
    CHECK(agw_heap_lua_used(h) >= (size_t)16 << 20);
    lua_settop(L, 0);
    /* not armed (a plain lua_pcall): nothing is refused */
    CHECK(luaL_loadstring(L, "return #require('agg.pattern').rep('x', 32 * 2^20)") == 0 && lua_pcall(L, 0, 1, 0) == 0);
    CHECK(lua_tointeger(L, -1) == 32 << 20 && h->refused == 1);
    lua_settop(L, 0);
    lua_gc(L, LUA_GCCOLLECT, 0);
    CHECK(agw_heap_lua_used(h) == (size_t)lua_gc(L, LUA_GCCOUNT, 0) * 1024 + (size_t)lua_gc(L, LUA_GCCOUNTB, 0));
    agw_heap_lua_set_limit(h, 0);
    CHECK(luaL_loadstring(L, "return #require('agg.pattern').rep('x', 32 * 2^20)") == 0 &&
          agw_heap_lua_pcall(L, 0, 1, 0) == 0);
    CHECK(lua_tointeger(L, -1) == 32 << 20 && h->refused == 1);
    agw_heap_close_lua_state(L);
    agw_heap_close_lua_state(NULL);
    lua_State *plain = luaL_newstate();
    CHECK(agw_heap_lua_of(plain) == NULL); /* a VM made elsewhere has no record */
    lua_close(plain);
    agw_heap_give_back(); /* (the figures below start from a heap without this test's pages) */
}

/* The check itself can fail: a block of 4,096 bytes named as 16 aborts (in a child process). */
static void a_wrong_size_is_caught(void)
{
    if (!AGW_HEAP_JEMALLOC)
        return; /* the sanitized build's realloc and free take no size */
    pid_t pid = fork();
    if (pid == 0) {
        int fd = open("/dev/null", O_WRONLY);
        dup2(fd, 2);
        void *p = agw_heap_lua_alloc_checked(NULL, NULL, 0, 4096);
        agw_heap_lua_alloc_checked(NULL, p, 16, 0);
        _exit(0);
    }
    int status = 0;
    CHECK(pid > 0 && waitpid(pid, &status, 0) == pid);
    CHECK(WIFSIGNALED(status) && WTERMSIG(status) == SIGABRT);
}

/* The gateway's own VM: the runtime, the repository's scripts folder and agg.json, on the checked
 * allocator too. */
static void the_gateways_vm_is_checked_too(void)
{
    lua_State *L = agw_vm_new(AGW_SOURCE_DIR "/scripts");
    CHECK(L != NULL);
    agw_buf_t errors = {0};
    CHECK(agw_vm_load_generation(L, AGW_SOURCE_DIR "/scripts", &errors) == 0);
    if (errors.len)
        fprintf(stderr, "%.*s", (int)errors.len, errors.base);
    agw_buf_free(&errors);
    static const char code[] =
        "local json = require 'agg.json'\n"
        "require 'agg.runtime'\n"
        "local n = 0\n"
        "for i = 1, 500 do\n"
        "  local doc = { id = i, name = ('p'):rep(i % 50), tags = { 'a', 'b', i }, nested = { deep = { i } } }\n"
        "  local s = json.encode(doc)\n"
        "  n = n + #s\n"
        "end\n"
        "collectgarbage()\n"
        "return n\n";
    CHECK(luaL_loadstring(L, code) == 0);
    if (lua_pcall(L, 0, 1, 0) != 0)
        fprintf(stderr, "%s\n", lua_tostring(L, -1));
    CHECK(lua_tointeger(L, -1) > 500 * 40);
    agw_heap_close_lua_state(L);
}

/* allocated counts what is in use, within the active pages, within the resident ones; after a
 * burst of small blocks is freed, agw_heap_give_back returns their pages (resident falls by most
 * of the burst). A sanitized build has no figures. */
static void figures_add_up_and_free_pages_go_back(void)
{
    agw_heap_stats_t a, b, c;
    if (!AGW_HEAP_JEMALLOC) {
        CHECK(agw_heap_stats(&a) == -1);
        return;
    }
    CHECK(agw_heap_stats(&a) == 0);
    CHECK(a.allocated > 0 && a.allocated <= a.active && a.active <= a.resident);
    CHECK(a.metadata > 0 && a.metadata < a.resident);
    enum { N = 200000, SIZE = 256 }; /* 51 MB in blocks of one small size class */
    void **blocks = malloc(N * sizeof(*blocks));
    for (size_t i = 0; i < N; i++) {
        blocks[i] = malloc(SIZE);
        memset(blocks[i], (int)i, SIZE);
    }
    CHECK(agw_heap_stats(&b) == 0);
    CHECK(b.allocated >= a.allocated + (size_t)N * SIZE);
    CHECK(b.resident >= a.resident + (size_t)N * SIZE / 2);
    for (size_t i = 0; i < N; i++)
        free(blocks[i]);
    free(blocks);
    agw_heap_give_back();
    CHECK(agw_heap_stats(&c) == 0);
    CHECK(c.allocated < b.allocated - (size_t)N * SIZE);
    CHECK(c.resident < b.resident - (size_t)N * SIZE / 2);
    fprintf(stderr, "resident: %zu KB before, %zu KB with the blocks, %zu KB after they were given back\n",
            a.resident / 1024, b.resident / 1024, c.resident / 1024);
}

/* The process runs with the thread cache heap.h asks for (unless MALLOC_CONF overrides it): the
 * options jemalloc reports are those of AGW_HEAP_MALLOC_CONF, so the string reached it. */
static void jemalloc_takes_the_gateways_options(void)
{
#if AGW_HEAP_JEMALLOC
    if (getenv("MALLOC_CONF") != NULL)
        return;
    ssize_t mul = 0;
    unsigned max = 0;
    size_t sz = sizeof(mul);
    CHECK(mallctl("opt.lg_tcache_nslots_mul", &mul, &sz, NULL, 0) == 0 && mul == 3);
    sz = sizeof(max);
    CHECK(mallctl("opt.tcache_nslots_small_max", &max, &sz, NULL, 0) == 0 && max == 2048);
    /* the slabs: four pages for the classes of a power of two from 32 bytes, two for 16 bytes, the
     * others' as jemalloc makes them */
    unsigned nbins = 0;
    sz = sizeof(nbins);
    CHECK(mallctl("arenas.nbins", &nbins, &sz, NULL, 0) == 0 && nbins > 0);
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    if (page != 4096) /* (the classes and jemalloc's own slabs below are those of 4 KB pages) */
        return;
    int seen = 0;
    for (unsigned i = 0; i < nbins; i++) {
        char name[64];
        size_t size = 0, slab = 0;
        sz = sizeof(size);
        snprintf(name, sizeof(name), "arenas.bin.%u.size", i);
        CHECK(mallctl(name, &size, &sz, NULL, 0) == 0);
        sz = sizeof(slab);
        snprintf(name, sizeof(name), "arenas.bin.%u.slab_size", i);
        CHECK(mallctl(name, &slab, &sz, NULL, 0) == 0);
        if (size >= 32 && size <= 4096 && (size & (size - 1)) == 0) {
            CHECK(slab == 4 * page);
            seen++;
        } else if (size == 16) {
            CHECK(slab == 2 * page);
        } else if (size == 8 || size == 8192) {
            CHECK(slab == (size == 8 ? page : 2 * page)); /* (untouched) */
        } else if (size == 48) {
            CHECK(slab == 3 * page); /* (untouched: jemalloc's three pages) */
        }
    }
    CHECK(seen == 8);
#endif
}

int main(void)
{
    agw_heap_check_lua_blocks();
    RUN(lua_blocks_are_freed_with_their_size);
    RUN(the_limit_asks_for_the_hook_and_refuses_a_huge_rep);
    RUN(a_wrong_size_is_caught);
    RUN(the_gateways_vm_is_checked_too);
    RUN(figures_add_up_and_free_pages_go_back);
    RUN(jemalloc_takes_the_gateways_options);
    return CHECK_DONE();
}
