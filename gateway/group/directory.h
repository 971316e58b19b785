/* directory.h: the address of every endpoint slot of a generation, kept up to date by re-resolving
 * the endpoints' host names (gateway.lua `resolve_every_s`; docs/operations.md "Upstream groups").
 *
 * An endpoint URL whose host is an IP address is one slot. An endpoint URL whose host is a name
 * gets AGW_ADDRS_PER_NAME slots (script/config.c lays them out in conf->eps and lists the name
 * in conf->names): every address of the name is an endpoint of its own, one per slot, and the
 * slots it does not fill are out of service (address length 0). The resolver thread
 * (front/resolver.h) re-resolves each name every resolve_every_s and publishes changes here; an
 * address that stays keeps its slot (so its pools and balancer state stay), a new one takes a
 * free slot, a gone one frees its slot. Each worker syncs its pools and its balancer with the
 * directory once a second (worker/core.c core.endpoint_slots). A resolution that fails keeps the
 * last good set (logged once when the failure starts and once when it ends).
 * Names resolve as upstream/resolve.h says (agw_resolve_host).
 */
#ifndef AGW_GROUP_DIRECTORY_H
#define AGW_GROUP_DIRECTORY_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

#include "upstream/conf.h"
#include "upstream/resolve.h"

/* The live addresses of one generation's slots. The resolver thread writes, workers and the admin
 * thread read; addresses under lock, counters with atomics. */
typedef struct agw_endpoint_dir {
    pthread_mutex_t lock;
    uint64_t version;                 /* atomic: +1 at every change of an address */
    size_t num_slots;                 /* conf->ep_first[conf->num_upstreams] */
    struct sockaddr_storage *addr;    /* [num_slots], under lock */
    socklen_t *addrlen;               /* [num_slots], under lock; 0: the slot is out of service */
    const agw_ep_name_t *names;       /* conf->names (the generation's) */
    size_t num_names;
    uint64_t *next_ms;                /* [num_names] resolver thread only: when to resolve next (monotonic ms) */
    int *failing;                     /* [num_names] atomic: 1 while its resolution fails */
    uint64_t *failures;               /* [num_names] atomic: resolutions that failed */
} agw_endpoint_dir_t;

/* A directory holding the addresses eps[0..num_slots) were loaded with (addrlen 0: out of
 * service) and the names to re-resolve (they must outlive it: the generation's conf). Never NULL
 * (base/mem.h). */
agw_endpoint_dir_t *agw_endpoint_dir_new(const agw_upstream_conf_t *eps, size_t num_slots, const agw_ep_name_t *names,
                                         size_t num_names);
void agw_endpoint_dir_free(agw_endpoint_dir_t *d);

/* The version (any thread): unchanged means no address changed. */
uint64_t agw_endpoint_dir_version(agw_endpoint_dir_t *d);

/* Copies slot's address into *addr, *len (0: out of service). Any thread. */
void agw_endpoint_dir_read(agw_endpoint_dir_t *d, size_t slot, struct sockaddr_storage *addr, socklen_t *len);

/* Resolver thread: resolves the names whose turn came by now_ms (monotonic ms; every one the first
 * time), publishes the addresses that changed and logs them (one line per name that changed, one
 * when a name's resolution starts failing, one when it resolves again). Blocks in getaddrinfo. */
void agw_endpoint_dir_refresh(agw_endpoint_dir_t *d, uint64_t now_ms);

#endif
