/* rules.h: limit rules for the limits' unit tests (test_limit.c, test_limit_redis.c), keyed by
 * client address and sealed as the configuration's loader seals them (limits/limit.h). */
#ifndef AGW_TESTS_LIMITS_RULES_H
#define AGW_TESTS_LIMITS_RULES_H

#include "limits/limit.h"

/* A rate rule: rate requests per per_s seconds, burst at once. */
static inline agw_limit_rule_t rate_rule(const char *name, uint64_t rate, uint64_t per_s, uint64_t burst)
{
    agw_limit_rule_t r = {.name = (char *)name, .key = AGW_LIMIT_KEY_IP, .rate = rate, .per_s = per_s, .burst = burst};
    agw_limit_rule_seal(&r);
    return r;
}

/* A quota rule: quota requests per fixed UTC window w. */
static inline agw_limit_rule_t quota_rule(const char *name, uint64_t quota, agw_limit_window_t w)
{
    agw_limit_rule_t r = {.name = (char *)name, .key = AGW_LIMIT_KEY_IP, .is_quota = 1, .quota = quota, .window = w};
    agw_limit_rule_seal(&r);
    return r;
}

#endif
