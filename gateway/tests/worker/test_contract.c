/* test_contract.c: the C transport keeps the Lua↔C contract as lua/agg/contract.lua writes it:
 * the core.* functions the worker installs, the runtime functions it calls and the fields of every
 * table that crosses (worker/contract.h) are the ones the contract declares, no more, no fewer.
 * spec/contract_spec.lua holds the spec harness's transport to the same file. */
#include <lauxlib.h>
#include <lualib.h>
#include <stdlib.h>

#include "script/script.h"
#include "tests/check.h"
#include "worker/contract.h"
#include "worker/worker_internal.h"

static lua_State *L;

/* Pushes require("agg.contract")[key] (a table). */
static void push_decl(const char *key)
{
    lua_getglobal(L, "require");
    lua_pushliteral(L, "agg.contract");
    if (lua_pcall(L, 1, 1, 0) != 0) {
        fprintf(stderr, "cannot load agg.contract: %s\n", lua_tostring(L, -1));
        exit(1);
    }
    lua_getfield(L, -1, key);
    lua_remove(L, -2);
}

/* Checks that the table on top of the stack has exactly the keys names[0..n) (a NULL entry ends
 * the list early), then pops it. what names the list in failure messages. */
static void check_same_keys(const char *what, const char *const *names, size_t n)
{
    int t = lua_gettop(L);
    CHECK(lua_istable(L, t));
    size_t found = 0;
    for (size_t i = 0; i < n && names[i]; i++) {
        lua_getfield(L, t, names[i]);
        if (lua_isnil(L, -1)) {
            fprintf(stderr, "%s: C has '%s', lua/agg/contract.lua does not\n", what, names[i]);
            check_failures++;
        }
        lua_pop(L, 1);
        found++;
    }
    size_t declared = 0;
    lua_pushnil(L);
    while (lua_next(L, t) != 0) {
        lua_pop(L, 1);
        declared++;
        int known = 0;
        for (size_t i = 0; i < n && names[i]; i++)
            known |= strcmp(names[i], lua_tostring(L, -1)) == 0;
        if (!known) {
            fprintf(stderr, "%s: lua/agg/contract.lua declares '%s', C does not have it\n", what,
                    lua_tostring(L, -1));
            check_failures++;
        }
    }
    CHECK(declared == found);
    lua_pop(L, 1);
}

static void core_functions_are_the_declared_ones(void)
{
    const char *names[64];
    size_t n = 0;
    for (const luaL_Reg *f = agw_worker_core_fns; f->name && n < 63; f++)
        names[n++] = f->name;
    for (const luaL_Reg *f = agw_worker_cache_fns; f->name && n < 62; f++)
        names[n++] = f->name; /* installed when gateway.lua has a cache (vm.c) */
    names[n++] = "breakers"; /* a table of breaker handles, set beside the functions (vm.c) */
    names[n++] = "loop";     /* the worker's loop and libev's ev_now, for core.now through the */
    names[n++] = "ev_now";   /* FFI (vm.c) */
    push_decl("core");
    check_same_keys("core", names, n);
}

static void runtime_callbacks_are_the_declared_ones(void)
{
    size_t n = 0;
    while (agw_contract_runtime[n])
        n++;
    push_decl("runtime");
    check_same_keys("runtime", agw_contract_runtime, n);
}

static void table(const char *kind, const char *const *names, size_t n)
{
    push_decl("tables");
    lua_getfield(L, -1, kind);
    lua_remove(L, -2);
    check_same_keys(kind, names, n);
}

static void every_table_has_the_declared_fields(void)
{
    table("answer", agw_contract_answer, AGW_ANSWER_FIELDS);
    table("response", agw_contract_response, AGW_RESPONSE_FIELDS);
    table("section", agw_contract_section, AGW_SECTION_FIELDS);
    table("counters", agw_contract_counters, AGW_COUNTERS_FIELDS);
    table("endpoint_state", agw_contract_endpoint_state, AGW_EPSTATE_FIELDS);
}

/* The check itself can fail: a name C does not have is reported. */
static void a_difference_is_reported(void)
{
    const char *names[] = {"headers", "body", "detial"};
    int before = check_failures;
    push_decl("tables");
    lua_getfield(L, -1, "answer");
    lua_remove(L, -2);
    check_same_keys("answer (a deliberate typo)", names, sizeof(names) / sizeof(names[0]));
    int reported = check_failures > before;
    check_failures = before;
    CHECK(reported);
}

int main(void)
{
    L = luaL_newstate();
    luaL_openlibs(L);
    lua_getglobal(L, "package");
    lua_pushfstring(L, "%s/?.lua", agw_lua_dir());
    lua_setfield(L, -2, "path");
    lua_pop(L, 1);
    RUN(core_functions_are_the_declared_ones);
    RUN(runtime_callbacks_are_the_declared_ones);
    RUN(every_table_has_the_declared_fields);
    RUN(a_difference_is_reported);
    lua_close(L);
    return CHECK_DONE();
}
