/* resolver.h: the resolver thread. Once a second it takes the generation serving new requests and
 * re-resolves the endpoint host names whose resolve_every_s has passed (group/directory.h
 * agw_endpoint_dir_refresh), so getaddrinfo never runs on a worker's loop; workers pick the
 * changes up on their own once-a-second tick (worker/core.c core.endpoint_slots). One thread for
 * the process; a generation that is no longer serving is not re-resolved (it only finishes its
 * requests). */
#ifndef AGW_FRONT_RESOLVER_H
#define AGW_FRONT_RESOLVER_H

#include "worker/generation.h"

typedef struct agw_resolver agw_resolver_t;

/* Starts the thread; gens must stay valid until agw_resolver_stop. Returns NULL (logged) when the
 * thread cannot start: host names are then resolved at load only. */
agw_resolver_t *agw_resolver_start(agw_reload_state_t *gens);

/* Stops the thread and waits for it (at most one resolution in progress). NULL is ignored. */
void agw_resolver_stop(agw_resolver_t *r);

#endif
