/* generation.h: generations of the scripts folder, for hot reload (DESIGN §3 "Hot reload").
 *
 * A generation is one load of the scripts folder: gateway.lua and every endpoint script, checked
 * as a unit. The part every worker shares lives here: the C configuration (routes, upstreams,
 * breakers), the generation's number and its metric label slots. Each worker runs a generation in
 * a LuaJIT VM of its own (worker.h); those hold a reference to the shared part, so it is freed
 * when the last worker has freed its VM of that generation.
 *
 * Start-up loads generation 1. SIGHUP loads the next one from the same folder on the main thread
 * (agw_generation_load with the serving generation as prev), then every worker builds and checks
 * its VM; only when all of that succeeded do the workers switch, each on its own loop. Requests
 * already running finish on the generation they started on.
 *
 * What a reload cannot change (listen ports and hosts, TLS turned on or off on a listener,
 * workers, admin, access_log, max_request_body_bytes, tracing: the sockets, threads and h2o's
 * shared configuration are made once at start-up) makes the reload fail with a message that names
 * the setting; restart to change it. A TLS listener's certificate and key are read again by every
 * load (their paths may change too): each generation has its own SSL_CTX per TLS listener
 * (config.h), which workers use for the connections they accept once they switch to it.
 * Upstream breakers survive a reload when the upstream's URL and breaker settings did not change.
 */
#ifndef AGW_GENERATION_H
#define AGW_GENERATION_H

#include <pthread.h>
#include <stdint.h>

#include "base/buf.h"
#include "group/board.h"
#include "group/directory.h"
#include "script/config.h"
#include "ops/metrics.h"

/* Generations alive at once at most (the one serving included): a SIGHUP that comes while this
 * many are still finishing requests waits until one is freed, so a reload storm over long
 * requests cannot pile up VMs without bound. */
#define AGW_GENERATIONS_MAX 16

typedef struct agw_generation {
    uint64_t number;           /* 1 at start-up, +1 for each successful reload */
    agw_config_t conf;         /* routes, upstreams and breakers of this generation (owned) */
    uint32_t *route_slot;      /* endpoint e (1-based) -> metric route slot; [0] = 0 ("unmatched"),
                                  [num_endpoints + 1] the batch envelope's (agw_metric_labels_map) */
    uint32_t *upstream_slot;   /* upstream index (0-based) -> metric upstream slot */
    int refs;                  /* owners (atomic): the serving record, each worker's VM of it */
    agw_endpoint_board_t *board; /* the endpoints as each worker's balancer sees them (group/board.h) */
    agw_endpoint_dir_t *dir;   /* the endpoint slots' live addresses (group/directory.h) */
} agw_generation_t;

/* Loads dir as generation number (one reference, for the caller). prev: the generation serving,
 * or NULL at start-up; when given, settings only a restart can change must be equal to prev's,
 * and the breakers of upstreams whose URL and breaker settings did not change are taken over from
 * prev. labels: the metric label registry (slots for new route patterns and upstream names are
 * added). Returns NULL with "file:line: message" lines appended to errors when anything fails;
 * nothing is changed then but label slots nobody counts in. Main thread only. */
agw_generation_t *agw_generation_load(const char *dir, uint64_t number, const agw_generation_t *prev,
                                      agw_metric_labels_t *labels, agw_buf_t *errors);

/* Takes one more reference (thread-safe); returns g. */
agw_generation_t *agw_generation_ref(agw_generation_t *g);

/* Drops a reference (thread-safe); the last one frees the generation. NULL is ignored. */
void agw_generation_unref(agw_generation_t *g);

/* Generations loaded and not yet freed, in the whole process (thread-safe). */
uint64_t agw_generation_live(void);

/* The serving process's record of generations and reloads: what the admin thread shows. */
typedef struct agw_reload_state {
    pthread_mutex_t lock;
    agw_generation_t *current; /* the generation serving new requests (a reference), NULL before the first */
    uint64_t reloads;          /* successful reloads */
    uint64_t failures;         /* failed reloads */
    int last_ok;               /* 0 when the last reload failed */
    double last_time;          /* when the last reload was tried, seconds since the Unix epoch; 0: never */
    char *last_errors;         /* the messages of the last failed reload (NUL-terminated lines), or NULL */
} agw_reload_state_t;

/* An empty record: no generation serving yet, no reload tried. */
void agw_reload_state_init(agw_reload_state_t *st);

/* Drops the current generation's reference and frees the record's memory. */
void agw_reload_state_destroy(agw_reload_state_t *st);

/* The generation serving now, with a reference for the caller (agw_generation_unref), or NULL. */
agw_generation_t *agw_reload_state_current(agw_reload_state_t *st);

/* gen serves new requests from now on (the record takes its own reference). reloaded: 1 when
 * this is a reload (counted), 0 for the first generation. */
void agw_reload_state_serving(agw_reload_state_t *st, agw_generation_t *gen, int reloaded);

/* A reload failed for the reasons in errors (one message a line); counted and kept for /reload. */
void agw_reload_state_failed(agw_reload_state_t *st, const char *errors);

/* Fills the reload fields of p (generation, reloads, reload_failures, last_reload_ok,
 * last_reload_time, generations_live). */
void agw_reload_state_metrics(agw_reload_state_t *st, agw_metrics_process_t *p);

/* The admin /reload document: {"generation":N,"generations_live":N,"reloads":N,"failures":N,
 * "last_reload":null | {"ok":bool,"time":seconds,"errors":["file:line: message",…]}}. */
void agw_reload_state_json(agw_reload_state_t *st, agw_buf_t *b);

#endif
