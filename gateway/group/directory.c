/* directory.c: the live addresses of a generation's endpoint slots (see directory.h). */
#include "group/directory.h"

#include <stdlib.h>
#include <string.h>

#include "base/buf.h"
#include "base/log.h"
#include "base/mem.h"

agw_endpoint_dir_t *agw_endpoint_dir_new(const agw_upstream_conf_t *eps, size_t num_slots, const agw_ep_name_t *names,
                                         size_t num_names)
{
    agw_endpoint_dir_t *d = agw_calloc(1, sizeof(*d));
    pthread_mutex_init(&d->lock, NULL);
    d->num_slots = num_slots;
    d->addr = agw_calloc(num_slots ? num_slots : 1, sizeof(*d->addr));
    d->addrlen = agw_calloc(num_slots ? num_slots : 1, sizeof(*d->addrlen));
    for (size_t i = 0; i < num_slots; i++) {
        d->addr[i] = eps[i].addr;
        d->addrlen[i] = eps[i].addrlen;
    }
    d->names = names;
    d->num_names = num_names;
    d->next_ms = agw_calloc(num_names ? num_names : 1, sizeof(*d->next_ms));
    d->failing = agw_calloc(num_names ? num_names : 1, sizeof(*d->failing));
    d->failures = agw_calloc(num_names ? num_names : 1, sizeof(*d->failures));
    return d;
}

void agw_endpoint_dir_free(agw_endpoint_dir_t *d)
{
    if (d == NULL)
        return;
    pthread_mutex_destroy(&d->lock);
    free(d->addr);
    free(d->addrlen);
    free(d->next_ms);
    free(d->failing);
    free(d->failures);
    free(d);
}

uint64_t agw_endpoint_dir_version(agw_endpoint_dir_t *d)
{
    return __atomic_load_n(&d->version, __ATOMIC_ACQUIRE);
}

void agw_endpoint_dir_read(agw_endpoint_dir_t *d, size_t slot, struct sockaddr_storage *addr, socklen_t *len)
{
    pthread_mutex_lock(&d->lock);
    if (slot < d->num_slots) {
        *addr = d->addr[slot];
        *len = d->addrlen[slot];
    } else {
        *len = 0;
    }
    pthread_mutex_unlock(&d->lock);
}

static int same(const struct sockaddr_storage *a, socklen_t alen, const struct sockaddr_storage *b, socklen_t blen)
{
    return alen == blen && memcmp(a, b, alen) == 0;
}

/* Puts the addresses of name k into its slots: an address already in a slot keeps it, a gone one
 * frees it, a new one takes the first free slot. Returns 1 when anything changed; fills the
 * added/removed text for the log. Lock held. */
static int place(agw_endpoint_dir_t *d, size_t k, const struct sockaddr_storage *addr, const socklen_t *len, int n,
                 agw_buf_t *added, agw_buf_t *removed)
{
    size_t first = d->names[k].first;
    int changed = 0, kept[AGW_ADDRS_PER_NAME] = {0};
    char text[64];
    for (size_t s = first; s < first + AGW_ADDRS_PER_NAME; s++) {
        if (d->addrlen[s] == 0)
            continue;
        int found = -1;
        for (int j = 0; j < n; j++)
            if (same(&d->addr[s], d->addrlen[s], &addr[j], len[j]))
                found = j;
        if (found >= 0) {
            kept[found] = 1;
        } else {
            agw_endpoint_address(&d->addr[s], d->addrlen[s], text, sizeof(text));
            agw_buf_printf(removed, "%s%s", removed->len ? ", " : "", text);
            d->addrlen[s] = 0;
            changed = 1;
        }
    }
    for (int j = 0; j < n; j++) {
        if (kept[j])
            continue;
        for (size_t s = first; s < first + AGW_ADDRS_PER_NAME; s++) {
            if (d->addrlen[s] == 0) {
                d->addr[s] = addr[j];
                d->addrlen[s] = len[j];
                agw_endpoint_address(&addr[j], len[j], text, sizeof(text));
                agw_buf_printf(added, "%s%s", added->len ? ", " : "", text);
                changed = 1;
                break;
            }
        }
    }
    return changed;
}

void agw_endpoint_dir_refresh(agw_endpoint_dir_t *d, uint64_t now_ms)
{
    for (size_t k = 0; k < d->num_names; k++) {
        const agw_ep_name_t *nm = &d->names[k];
        if (nm->every_ms == 0 || (d->next_ms[k] != 0 && now_ms < d->next_ms[k]))
            continue;
        if (d->next_ms[k] == 0) { /* resolved when the folder loaded: the first turn is one interval later */
            d->next_ms[k] = now_ms + nm->every_ms;
            continue;
        }
        d->next_ms[k] = now_ms + nm->every_ms;
        struct sockaddr_storage addr[AGW_ADDRS_PER_NAME];
        socklen_t len[AGW_ADDRS_PER_NAME];
        char why[256];
        int n = agw_resolve_host(nm->host, nm->port, addr, len, AGW_ADDRS_PER_NAME, why, sizeof(why));
        if (n < 0) {
            __atomic_add_fetch(&d->failures[k], 1, __ATOMIC_RELAXED);
            if (!__atomic_load_n(&d->failing[k], __ATOMIC_RELAXED))
                agw_log(AGW_LOG_WARN, "%s: cannot resolve host '%s' (%s); keeping its last addresses until it resolves "
                        "again", nm->where, nm->host, why);
            __atomic_store_n(&d->failing[k], 1, __ATOMIC_RELAXED);
            continue;
        }
        if (__atomic_load_n(&d->failing[k], __ATOMIC_RELAXED)) {
            agw_log(AGW_LOG_INFO, "%s: host '%s' resolves again", nm->where, nm->host);
            __atomic_store_n(&d->failing[k], 0, __ATOMIC_RELAXED);
        }
        agw_buf_t added = AGW_BUF_INIT, removed = AGW_BUF_INIT;
        pthread_mutex_lock(&d->lock);
        int changed = place(d, k, addr, len, n, &added, &removed);
        if (changed)
            __atomic_add_fetch(&d->version, 1, __ATOMIC_RELEASE);
        pthread_mutex_unlock(&d->lock);
        if (changed)
            agw_log(AGW_LOG_INFO, "%s: host '%s' now resolves to %d address(es); added: %s; removed: %s", nm->where,
                    nm->host, n, added.len ? added.base : "none", removed.len ? removed.base : "none");
        agw_buf_free(&added);
        agw_buf_free(&removed);
    }
}
