/* request_log.h: what a worker keeps to record its requests (part of agw_worker, owned by
 * request_log.c): the access log's buffer and timer, the trace ids' generator and spare trace
 * records, the cache of header warnings lately logged.
 */
#ifndef AGW_WORKER_REQUEST_LOG_H
#define AGW_WORKER_REQUEST_LOG_H

#include <ev.h>
#include <stdint.h>

#include "base/buf.h"
#include "ops/trace.h"

typedef struct agw_worker_log {
    int access_fd;           /* access log, -1 when off */
    agw_buf_t alog;          /* access log lines not yet written */
    ev_timer alog_timer;     /* writes alog out shortly after its first line */
    long alog_sec;           /* the second alog_stamp was formatted for */
    char alog_stamp[96];     /* {"time":"2026-01-31T12:34:56. */
    uint64_t trace_rng;      /* xorshift state for trace and span ids (trace.h) */
    agw_trace_t *free_traces; /* trace records to reuse */
    int waterfall_on;        /* an admin listener shows the waterfall (restart-only): without
                                one, no request is recorded for it */
    struct {                 /* header warnings logged lately (core.c warn_header): a script that
                                repeats a mistake on every response logs it once per
                                AGW_WARN_REPEAT_S, with a count of the repeats */
        uint64_t hash;
        double logged;       /* ev_now() when last written; 0 = free */
        unsigned repeats;    /* suppressed since */
    } warned[16];
    unsigned warned_others;  /* distinct warnings left out while all 16 were recent */
} agw_worker_log_t;

/* Initializes l (zeroed memory): the access log to access_fd (-1: off), its timer calling
 * agw_worker_on_alog_timer with timer data (the worker). The caller seeds trace_rng. */
void agw_worker_log_init(agw_worker_log_t *l, int access_fd, int waterfall_on, void *data);

/* Worker w's loop has ended: writes out the access log lines still buffered (in w->log) and frees
 * the spare trace records. */
void agw_worker_log_close(struct agw_worker *w);

/* Frees the spare trace records of worker w (one per request that was in flight at once: after a
 * burst of 5,000 pages, 6 MB). Called when the worker goes idle (worker/gc.h); the next requests
 * allocate theirs again. */
void agw_worker_log_release_spares(struct agw_worker *w);

#endif
