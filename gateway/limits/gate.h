/* gate.h: what the worker does with limits before any Lua runs (DESIGN §9: route match → auth →
 * limits and priority shedding → the script): shedding by priority group, the answer's fields
 * (RateLimit-Policy, RateLimit, Retry-After) and the 429 problem's body. Pure functions of their
 * arguments: no sockets, no h2o, so that the unit test checks every byte.
 *
 * Fields per draft-ietf-httpapi-ratelimit-headers-12: RateLimit-Policy lists every policy the
 * request was checked against, `"name";q=QUOTA;w=WINDOW_S` (a rate's quota is its burst and its
 * window the time an empty bucket takes to fill, ceil(burst * per_s / rate)); RateLimit reports
 * the most restrictive one (the decisive rule of agw_limit_check), `"name";r=REMAINING;t=RESET_S`.
 * Seconds are rounded up, so that a client that waits t or Retry-After is never early.
 * Problem types: the draft's `quota-exceeded` (429, with `violated-policies`, the names of the
 * rules that refused) and `temporary-reduced-capacity` (503, a shed request). */
#ifndef AGW_GATE_H
#define AGW_GATE_H

#include "base/buf.h"
#include "limits/limit.h"

#define AGW_PROBLEM_QUOTA_EXCEEDED "https://iana.org/assignments/http-problem-types#quota-exceeded"
#define AGW_PROBLEM_REDUCED_CAPACITY "https://iana.org/assignments/http-problem-types#temporary-reduced-capacity"

/* Whether a worker with inflight pages in flight sheds a request of priority group (1 to 3),
 * max_in_flight being gateway.lua's bound: group 3 is shed beyond max_in_flight, group 2 beyond
 * 1.5 × max_in_flight, group 1 beyond 2 × max_in_flight, so that group 1 keeps its share longest. */
static inline int agw_gate_shed(unsigned max_in_flight, int priority, int inflight)
{
    unsigned long bound = (unsigned long)max_in_flight * (unsigned long)(5 - priority) / 2;
    return inflight >= 0 && (unsigned long)inflight > bound;
}

/* Appends the RateLimit-Policy field's value for the num rules of asks with their results. */
void agw_gate_policy_field(agw_buf_t *b, const agw_limit_ask_t *asks, const agw_limit_result_t *results, size_t num);

/* Appends the RateLimit field's value for the decisive rule of v (v->decisive >= 0). */
void agw_gate_ratelimit_field(agw_buf_t *b, const agw_limit_ask_t *asks, const agw_limit_verdict_t *v);

/* Seconds for Retry-After of a refused verdict: the decisive rule's wait, rounded up, at least 1. */
uint64_t agw_gate_retry_after_s(const agw_limit_verdict_t *v);

/* Appends the 429 problem (RFC 9457, application/problem+json) of a refused verdict: type
 * quota-exceeded, status 429, a detail naming the decisive rule and its wait, and
 * violated-policies, every rule that refused. */
void agw_gate_problem_429(agw_buf_t *b, const agw_limit_ask_t *asks, const agw_limit_verdict_t *v, size_t num);

/* Appends the 503 problem of a request refused by a Redis rule whose Redis could not answer and
 * whose on_redis_error is "deny": type temporary-reduced-capacity, a detail naming rule and the
 * wait (retry_s, the Retry-After). */
void agw_gate_problem_redis_deny(agw_buf_t *b, const char *rule, uint64_t retry_s);

/* Opens the "agg.limiter" module for the spec harness (lua/agg/testing_front.lua), which runs the same
 * counting and answers on its virtual clock:
 *   limiter.new([slots]) -> a store (freed with it)
 *   store:check(asks, now_ms, headers[, remote[, mode]]) -> allowed, fields, body, status
 *     asks: a list of { rule = <a rule as agg.limits checked it>, key = "bytes", redis = true |
 *     nil, outcome = "allow" | "deny" | nil }: as worker/limits.c, the asks without redis or
 *     outcome are counted in store first (refused: the answer names only them); then the redis
 *     asks, all or none, in remote (another store: Redis shared by several gateways; nil: store);
 *     an outcome is a Redis rule's on_redis_error while Redis is down (allow: accepted uncounted;
 *     deny: refused, 503 when only such rules refuse). A refusal gives back what store took.
 *     now_ms: ms since the Unix epoch (UTC); headers: limits.headers.
 *     fields: { ["ratelimit-policy"], ["ratelimit"], ["retry-after"] } (the ones the worker sends;
 *     empty when accepted without headers); body: the problem when refused, else nil; status: 200,
 *     429 or 503.
 *     mode: "check" (the default, above); "peek": the same answer, nothing counted, a refused
 *     rate's wait until one request fits (agw_limit_peek_next: the check before the edge,
 *     worker/limits.c agw_worker_gate_before_edge); "charge": each ask taken on its own (a refused
 *     one counts nothing), returning only the list of each ask's allowed (an edge's refusal
 *     counted, agw_worker_gate_charge).
 *   limiter.shed(max_in_flight, priority, inflight) -> boolean (agw_gate_shed)
 * Errors (a malformed ask) are raised. */
struct lua_State;
int agw_limiter_open(struct lua_State *L);

#endif
