/* gate.c: the fields and problems of limits and shedding (see gate.h). Rule names are letters,
 * digits, '_', '.' and '-' (agg.limits checks them), so they go into an sf-string and a JSON string
 * as they are. */
#include "limits/gate.h"

#include <inttypes.h>

void agw_gate_policy_field(agw_buf_t *b, const agw_limit_ask_t *asks, const agw_limit_result_t *results, size_t num)
{
    for (size_t i = 0; i < num; i++)
        agw_buf_printf(b, "%s\"%s\";q=%" PRIu64 ";w=%" PRIu64, i ? ", " : "", asks[i].rule->name, results[i].limit,
                       results[i].window_s);
}

void agw_gate_ratelimit_field(agw_buf_t *b, const agw_limit_ask_t *asks, const agw_limit_verdict_t *v)
{
    const agw_limit_result_t *r = &v->results[v->decisive];
    agw_buf_printf(b, "\"%s\";r=%" PRIu64 ";t=%" PRIu64, asks[v->decisive].rule->name, r->remaining,
                   agw_limit_seconds_up(r->reset_ms));
}

uint64_t agw_gate_retry_after_s(const agw_limit_verdict_t *v)
{
    uint64_t s = v->decisive >= 0 ? agw_limit_seconds_up(v->results[v->decisive].reset_ms) : 1;
    return s ? s : 1;
}

void agw_gate_problem_429(agw_buf_t *b, const agw_limit_ask_t *asks, const agw_limit_verdict_t *v, size_t num)
{
    const agw_limit_rule_t *d = asks[v->decisive].rule;
    agw_buf_printf(b, "{\"type\":\"" AGW_PROBLEM_QUOTA_EXCEEDED "\",\"title\":\"Too many requests\",\"status\":429,"
                      "\"detail\":\"rule '%s' allows %s; retry in %" PRIu64 " s\",\"violated-policies\":[",
                   d->name, d->is_quota ? "no more requests in this window" : "no more requests yet",
                   agw_gate_retry_after_s(v));
    int first = 1;
    for (size_t i = 0; i < num; i++)
        if (!v->results[i].allowed) {
            agw_buf_printf(b, "%s\"%s\"", first ? "" : ",", asks[i].rule->name);
            first = 0;
        }
    agw_buf_puts(b, "]}");
}

void agw_gate_problem_redis_deny(agw_buf_t *b, const char *rule, uint64_t retry_s)
{
    agw_buf_printf(b, "{\"type\":\"" AGW_PROBLEM_REDUCED_CAPACITY "\",\"title\":\"The gateway cannot check its "
                      "limits\",\"status\":503,\"detail\":\"rule '%s' is counted in Redis, which did not answer, "
                      "and refuses requests meanwhile (on_redis_error = \\\"deny\\\"); retry in %" PRIu64 " s\"}",
                   rule, retry_s);
}
