/* clock.h: small clock helpers shared by the threads that wait (watchdog, exporter, shutdown) and
 * the worker's timing of scripts. */
#ifndef AGW_CLOCK_H
#define AGW_CLOCK_H

#include <stdint.h>
#include <time.h>

/* Milliseconds on CLOCK_MONOTONIC_COARSE (one clock tick of resolution, a few ms: enough for a
 * limit of 10 ms or more, and cheap enough to read at every entry into Lua). */
static inline uint64_t agw_coarse_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

/* The time ms milliseconds from now on clock, as the absolute timespec that
 * pthread_cond_timedwait (on a condition of that clock) and pthread_timedjoin_np
 * (CLOCK_REALTIME) take. */
static inline struct timespec agw_clock_after_ms(clockid_t clock, uint64_t ms)
{
    struct timespec ts;
    clock_gettime(clock, &ts);
    uint64_t ns = (uint64_t)ts.tv_nsec + ms * 1000000u;
    ts.tv_sec += (time_t)(ns / 1000000000u);
    ts.tv_nsec = (long)(ns % 1000000000u);
    return ts;
}

#endif
