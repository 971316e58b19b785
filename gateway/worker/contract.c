/* contract.c: the names of the Lua↔C seam as C spells them (contract.h; lua/agg/contract.lua). */
#include "worker/contract.h"

#include <lua.h>
#include <stddef.h>

const char *const agw_contract_answer[AGW_ANSWER_FIELDS] = {
    [AGW_ANSWER_HEADERS] = "headers", [AGW_ANSWER_BODY] = "body", [AGW_ANSWER_DETAIL] = "detail",
};

const char *const agw_contract_response[AGW_RESPONSE_FIELDS] = {
    [AGW_RESPONSE_STATUS] = "status",
    [AGW_RESPONSE_HEADERS] = "headers",
    [AGW_RESPONSE_BODY] = "body",
    [AGW_RESPONSE_JSON] = "json",
    [AGW_RESPONSE_DEFAULT_TYPE] = "default_type",
    [AGW_RESPONSE_SERVER_TIMING] = "server_timing",
    [AGW_RESPONSE_PAGE] = "page",
    [AGW_RESPONSE_SECTIONS] = "sections",
    [AGW_RESPONSE_ROWS] = "rows",
};

const char *const agw_contract_section[AGW_SECTION_FIELDS] = {
    [AGW_SECTION_STATUS] = "status", [AGW_SECTION_DATA] = "data", [AGW_SECTION_ERROR] = "error",
};

const char *const agw_contract_counters[AGW_COUNTERS_FIELDS] = {
    [AGW_COUNTERS_RETRIES] = "retries",       [AGW_COUNTERS_RETRIES_DENIED] = "retries_denied",
    [AGW_COUNTERS_HEDGES] = "hedges",         [AGW_COUNTERS_HEDGES_WON] = "hedges_won",
    [AGW_COUNTERS_COLLAPSED] = "collapsed",
};

const char *const agw_contract_endpoint_state[AGW_EPSTATE_FIELDS] = {
    [AGW_EPSTATE_CALLS] = "calls",
    [AGW_EPSTATE_FAILURES] = "failures",
    [AGW_EPSTATE_EJECTIONS] = "ejections",
    [AGW_EPSTATE_SESSIONS] = "sessions",
    [AGW_EPSTATE_IN_FLIGHT] = "in_flight",
    [AGW_EPSTATE_EJECTED_UNTIL_MS] = "ejected_until_ms",
    [AGW_EPSTATE_LAST_EJECTED_MS] = "last_ejected_ms",
    [AGW_EPSTATE_ANSWERED] = "answered",
    [AGW_EPSTATE_LATENCY_MS] = "latency_ms",
    [AGW_EPSTATE_HEALTH] = "health",
    [AGW_EPSTATE_DOWN] = "down",
    [AGW_EPSTATE_PROBES] = "probes",
    [AGW_EPSTATE_PROBE_FAILURES] = "probe_failures",
};

const char *const agw_contract_runtime[] = {"init", "start", "on_call", "on_timer", "abort", "report_stats", "on_redis", "compact",
                                              "on_purge", NULL};

void agw_contract_push_keys(lua_State *L)
{
    static const struct {
        int base;
        const char *const *names;
        int n;
    } tables[] = {
        {AGW_KEY_ANSWER, agw_contract_answer, AGW_ANSWER_FIELDS},
        {AGW_KEY_RESPONSE, agw_contract_response, AGW_RESPONSE_FIELDS},
    };
    lua_createtable(L, AGW_KEY_COUNT, 0);
    for (size_t t = 0; t < sizeof(tables) / sizeof(tables[0]); t++)
        for (int i = 0; i < tables[t].n; i++) {
            lua_pushstring(L, tables[t].names[i]);
            lua_rawseti(L, -2, tables[t].base + i);
        }
}
