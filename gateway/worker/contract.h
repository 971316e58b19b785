/* contract.h: the C side of the seam between the worker and the Lua half of the runtime. The
 * contract itself (every core.* function and runtime callback with its arguments, units and
 * ownership, and the fields of each table that crosses) is written once, in lua/agg/contract.lua;
 * this header names what C reads and writes so that gateway/tests/worker/test_contract.c can
 * compare the two: a field or function added or renamed on one side only fails that test.
 *
 * Field names are indexed by the enums below (agw_contract_answer[AGW_ANSWER_OUTCOME] is
 * "outcome"). The transport (core.c, respond.c) and the request path (request.c) use these arrays,
 * never a spelling of their own.
 */
#ifndef AGW_WORKER_CONTRACT_H
#define AGW_WORKER_CONTRACT_H

/* runtime.on_call's answer: the rest of an answer that is not a 2xx JSON body (written by core.c
 * into one table per VM, valid during the call) */
enum agw_answer_field { AGW_ANSWER_HEADERS, AGW_ANSWER_BODY, AGW_ANSWER_DETAIL, AGW_ANSWER_FIELDS };
extern const char *const agw_contract_answer[AGW_ANSWER_FIELDS];

/* core.respond's response (read by respond.c) */
enum agw_response_field {
    AGW_RESPONSE_STATUS, AGW_RESPONSE_HEADERS, AGW_RESPONSE_BODY, AGW_RESPONSE_JSON,
    AGW_RESPONSE_DEFAULT_TYPE, AGW_RESPONSE_SERVER_TIMING, AGW_RESPONSE_PAGE, AGW_RESPONSE_SECTIONS,
    AGW_RESPONSE_ROWS, AGW_RESPONSE_FIELDS
};
extern const char *const agw_contract_response[AGW_RESPONSE_FIELDS];

/* a page's section, the members of a row of the response's rows in this order (read by respond.c) */
enum agw_section_field { AGW_SECTION_STATUS, AGW_SECTION_DATA, AGW_SECTION_ERROR, AGW_SECTION_FIELDS };
extern const char *const agw_contract_section[AGW_SECTION_FIELDS];

/* core.upstream_counters' counters (read by core.c) */
enum agw_counters_field {
    AGW_COUNTERS_RETRIES, AGW_COUNTERS_RETRIES_DENIED, AGW_COUNTERS_HEDGES, AGW_COUNTERS_HEDGES_WON,
    AGW_COUNTERS_COLLAPSED, AGW_COUNTERS_FIELDS
};
extern const char *const agw_contract_counters[AGW_COUNTERS_FIELDS];

/* core.endpoint_state's state (read by core.c) */
enum agw_endpoint_state_field {
    AGW_EPSTATE_CALLS, AGW_EPSTATE_FAILURES, AGW_EPSTATE_EJECTIONS, AGW_EPSTATE_SESSIONS, AGW_EPSTATE_IN_FLIGHT,
    AGW_EPSTATE_EJECTED_UNTIL_MS, AGW_EPSTATE_LAST_EJECTED_MS, AGW_EPSTATE_ANSWERED, AGW_EPSTATE_LATENCY_MS,
    AGW_EPSTATE_HEALTH, AGW_EPSTATE_DOWN, AGW_EPSTATE_PROBES, AGW_EPSTATE_PROBE_FAILURES, AGW_EPSTATE_FIELDS
};
extern const char *const agw_contract_endpoint_state[AGW_EPSTATE_FIELDS];

/* The runtime functions the worker calls (agg.runtime), NULL-terminated. */
extern const char *const agw_contract_runtime[];

/* The field names above as Lua strings made once per VM: a table of them, key AGW_KEY_<TABLE> +
 * field index, so that C reads and writes a field with a string it already holds (a pointer
 * lookup) instead of hashing its name each time (lua_getfield). */
enum {
    AGW_KEY_ANSWER = 1,
    AGW_KEY_RESPONSE = AGW_KEY_ANSWER + AGW_ANSWER_FIELDS,
    AGW_KEY_COUNT = AGW_KEY_RESPONSE + AGW_RESPONSE_FIELDS - 1
};

struct lua_State;
/* Pushes a new table of the keys (index AGW_KEY_* + field -> name). */
void agw_contract_push_keys(struct lua_State *L);

#endif
