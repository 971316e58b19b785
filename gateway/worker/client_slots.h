/* client_slots.h: the gateway's open client connections against clients.max_connections, one
 * count for the process shared by every worker (docs/operations.md, "Hostile clients").
 *
 * Each worker has listening sockets of its own (SO_REUSEPORT: the kernel hashes each new
 * connection to one of them), so a cap split into per-worker shares left a client waiting in a
 * full worker's backlog while another worker had room. With one count, a worker accepts while the
 * gateway is under the cap; at the cap every worker's listeners pause, and the first connection to
 * close anywhere wakes the paused workers, which accept the clients waiting in their backlogs.
 *
 * Taking and giving a slot is one atomic add: no lock. Waking is an ev_async per waiting worker,
 * sent only while a worker waits (the gateway is at its cap). The count may pass the cap by none:
 * a worker takes its slot before accept(2) and gives it back when accept finds no connection.
 * During a reload that changes max_connections, workers compare the one count with their own
 * generation's cap until every worker has the new one. */
#ifndef AGW_CLIENT_SLOTS_H
#define AGW_CLIENT_SLOTS_H

#include <ev.h>

typedef struct agw_client_slots agw_client_slots_t;

/* A count for num_workers workers (at least 1), none open, none waiting. Aborts when out of
 * memory. Outlives every worker that uses it (the process's lifetime). */
agw_client_slots_t *agw_client_slots_new(unsigned num_workers);

/* Frees s (no worker uses it any more). NULL is ignored. */
void agw_client_slots_free(agw_client_slots_t *s);

/* Worker number id (0 ≤ id < num_workers) is woken through wake, an ev_async started on loop,
 * when a slot comes free while it waits. Before the worker's thread runs. */
void agw_client_slots_register(agw_client_slots_t *s, unsigned id, struct ev_loop *loop, ev_async *wake);

/* Takes a slot when fewer than max are open (thread-safe). Returns 1 (taken: give it back with
 * agw_client_slots_give when the connection closes, or when accept finds none), else 0. */
int agw_client_slots_take(agw_client_slots_t *s, unsigned max);

/* Gives a slot back (thread-safe) and wakes the workers waiting for one. */
void agw_client_slots_give(agw_client_slots_t *s);

/* Worker id waits for a slot: its wake is sent when one comes free. Returns 1 when fewer than max
 * are open by now (a slot came free before the wait was seen: the caller goes on accepting and
 * need not wait), else 0. Worker id's thread. */
int agw_client_slots_wait(agw_client_slots_t *s, unsigned id, unsigned max);

/* Worker id no longer waits (its wake came, or it goes on accepting). Worker id's thread. */
void agw_client_slots_unwait(agw_client_slots_t *s, unsigned id);

/* Client connections open in the gateway (thread-safe; a gauge, already old when read). */
unsigned agw_client_slots_open(const agw_client_slots_t *s);

#endif
