/* contract.c: the names of the Lua↔C seam as C spells them (contract.h; lua/agg/contract.lua). */
#include "worker/contract.h"

#include <stddef.h>

const char *const agw_contract_attempt[AGW_ATTEMPT_FIELDS] = {
    [AGW_ATTEMPT_METHOD] = "method",   [AGW_ATTEMPT_PATH] = "path",       [AGW_ATTEMPT_HEADERS] = "headers",
    [AGW_ATTEMPT_BODY] = "body",       [AGW_ATTEMPT_DECODE] = "decode",   [AGW_ATTEMPT_SECTION] = "section",
    [AGW_ATTEMPT_NUMBER] = "attempt",  [AGW_ATTEMPT_HEDGE] = "hedge",
};

const char *const agw_contract_answer[AGW_ANSWER_FIELDS] = {
    [AGW_ANSWER_OUTCOME] = "outcome", [AGW_ANSWER_HTTP_STATUS] = "http_status", [AGW_ANSWER_HEADERS] = "headers",
    [AGW_ANSWER_BODY] = "body",       [AGW_ANSWER_DATA] = "data",               [AGW_ANSWER_MS] = "ms",
    [AGW_ANSWER_DETAIL] = "detail",
};

const char *const agw_contract_arrival[AGW_ARRIVAL_FIELDS] = {
    [AGW_ARRIVAL_METHOD] = "method", [AGW_ARRIVAL_PATH] = "path",       [AGW_ARRIVAL_QUERY] = "query",
    [AGW_ARRIVAL_PARAMS] = "params", [AGW_ARRIVAL_HEADERS] = "headers", [AGW_ARRIVAL_BODY] = "body",
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
};

const char *const agw_contract_counters[AGW_COUNTERS_FIELDS] = {
    [AGW_COUNTERS_RETRIES] = "retries",       [AGW_COUNTERS_RETRIES_DENIED] = "retries_denied",
    [AGW_COUNTERS_HEDGES] = "hedges",         [AGW_COUNTERS_HEDGES_WON] = "hedges_won",
    [AGW_COUNTERS_COLLAPSED] = "collapsed",
};

const char *const agw_contract_runtime[] = {"init", "start", "on_call", "on_timer", "abort", "report_stats", NULL};
