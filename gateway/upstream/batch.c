/* batch.c: write coalescing and the io_uring batch of the upstream client (see batch.h). */
#include "upstream/upstream_internal.h"

#include "base/mem.h"

#include "upstream/uring.h"

#include <errno.h>
#include <limits.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>

/* ---- batched system calls (io_uring, uring.h) ------------------------------------------ */

#define RING_ENTRIES 64        /* operations per submission: the sends of one at most */
#define SLOT_SIZE AGW_UPSTREAM_READ_BUF
_Static_assert(AGW_BATCH_READS <= RING_ENTRIES, "a submission of reads fits on the ring");

int agw_batch_ring_init(agw_batch_t *batch, char *err, size_t errcap)
{
    agw_uring_t *ring = agw_uring_open(RING_ENTRIES, err, errcap);
    if (ring == NULL)
        return -1;
    char *slots = agw_malloc((size_t)AGW_BATCH_READS * SLOT_SIZE);
    batch->ring = ring;
    batch->slots = slots;
    return 0;
}

void agw_batch_ring_free(agw_batch_t *batch)
{
    agw_uring_close(batch->ring);
    batch->ring = NULL;
    free(batch->slots);
    batch->slots = NULL;
}

/* A ring write of c's request returned res (bytes or -errno). As conn_send: all sent, wait for the
 * answer; a full socket buffer, wait to write the rest; anything else (an error, EINTR) goes back
 * on the batch, and the plain path (agw_batch_flush) writes again and acts on what it gets,
 * callbacks and all. Runs no callback. */
static void ring_sent(void *ctx, void *data, int res)
{
    agw_batch_t *b = ctx;
    agw_conn_t *c = data;
    agw_call_t *call = c->call;
    size_t left = call->req_len - call->sent;
    if (res > 0)
        call->sent += (size_t)res;
    if (res >= 0 && (size_t)res == left) {
        c->state = AGW_CONN_READING;
        agw_conn_watch(c, EV_READ);
    } else if (res >= 0 || res == -EAGAIN || res == -EWOULDBLOCK) {
        c->state = AGW_CONN_SENDING;
        agw_conn_watch(c, EV_READ | EV_WRITE);
    } else {
        agw_batch_push(b, c);
    }
}

/* A ring read of c returned res: kept on the landed list, parsed once every result is in. */
static void ring_read(void *ctx, void *data, int res)
{
    agw_conn_t *c = data;
    c->rres = res;
    agw_batch_rq_push(ctx, c, AGW_RQ_LANDED);
}

/* Reads every answer queued by on_conn_io, AGW_BATCH_READS per submission, then parses them in
 * the order they were queued (the order libev ran the connections' watchers). A callback run by
 * one may close connections still on the landed list (conn_close takes them off); a read that
 * filled its slot, or was interrupted, goes on with plain reads. */
static size_t flush_reads(agw_batch_t *b)
{
    size_t n = 0;
    agw_conn_t *c;
    while (b->rhead) {
        for (unsigned k = 0; k < AGW_BATCH_READS && (c = b->rhead) != NULL; k++) {
            agw_batch_rq_remove(b, c);
            c->rslot = k;
            agw_uring_recv(b->ring, c->fd, b->slots + (size_t)k * SLOT_SIZE, SLOT_SIZE, c); /* fits: see above */
        }
        agw_uring_run(b->ring, ring_read, b);
        while ((c = b->lhead) != NULL) {
            agw_pool_t *pool = c->pool;
            agw_batch_rq_remove(b, c);
            if (agw_conn_took(c, b->slots + (size_t)c->rslot * SLOT_SIZE, c->rres, SLOT_SIZE) == 2)
                agw_conn_read(c);
            agw_pool_after_callback(pool);
            n++;
        }
    }
    return n;
}

/* Writes the queued requests of plain connections, RING_ENTRIES per submission. Only the entries
 * queued when it starts: one that failed is put back behind them for the plain path. TLS
 * connections stay on the batch (OpenSSL writes them). No callback runs here. */
static size_t flush_sends(agw_batch_t *b)
{
    size_t n = 0;
    agw_conn_t *c = b->head, *last = b->tail, *next;
    int end = c == NULL;
    while (!end) {
        unsigned k = 0;
        for (; !end && k < RING_ENTRIES; c = next) {
            next = c->batch_next;
            end = c == last;
            if (c->ssl == NULL) {
                agw_call_t *call = c->call;
                /* fits: k < RING_ENTRIES, the ring's size, and every run empties it */
                agw_uring_send(b->ring, c->fd, call->req + call->sent, call->req_len - call->sent, c);
                agw_batch_remove(b, c);
                k++;
            }
        }
        agw_uring_run(b->ring, ring_sent, b);
        n += k;
    }
    return n;
}

/* ---- the reused connections' check ------------------------------------------------------ */

#define CHECK_MAX 64 /* connections one poll(2) looks at */

/* Looks at the queued connections that came from an idle list (unpeeked) before any of them is
 * written: bytes or EOF that arrived after the loop last polled (an upstream that closed a
 * kept-alive connection, or sent a response no one asked for) are no answer to the request queued
 * on it. agw_call_assign used to peek at each connection it reused, one system call per call (about
 * 1 µs on a paravirtualized machine, three a bench page); one poll(2) now looks at up to CHECK_MAX
 * at once, just before they are written. A connection it finds readable is handled as an event the
 * loop saw on it (agw_conn_batched_event: closed, and its call takes another connection, which is
 * queued and looked at in the next round; each round closes one at least, so the rounds end). Runs
 * no callback. */
static void check_unpeeked(agw_batch_t *b)
{
    struct pollfd pfd[CHECK_MAX];
    agw_conn_t *pc[CHECK_MAX];
    for (;;) {
        unsigned n = 0;
        for (agw_conn_t *c = b->head; c != NULL && n < CHECK_MAX; c = c->batch_next) {
            if (c->unpeeked) {
                pfd[n] = (struct pollfd){.fd = c->fd, .events = POLLIN};
                pc[n++] = c;
            }
        }
        if (n == 0)
            return;
        int r = poll(pfd, n, 0);
        for (unsigned k = 0; k < n; k++) {
            pc[k]->unpeeked = 0;
            /* a failed poll (EINTR or ENOMEM; with a zero timeout, not seen in practice): none is
             * taken on trust, and a fresh connection is always safe */
            if (r < 0 || pfd[k].revents != 0)
                agw_conn_batched_event(pc[k]); /* closes pc[k] at most: the others stay valid */
        }
    }
}

size_t agw_batch_send_early(agw_batch_t *batch)
{
    unsigned step = batch->early_step ? batch->early_step : AGW_BATCH_EARLY_FIRST;
    if (batch->ring == NULL || batch->flushing || batch->queued < batch->early_base + step)
        return 0;
    size_t n = 0;
    agw_conn_t *c = batch->head;
    while (c != NULL && c->ssl != NULL)
        c = c->batch_next;
    if (c != NULL) { /* (TLS connections only: OpenSSL writes them in the flush) */
        check_unpeeked(batch);
        n = flush_sends(batch);
        /* what stays (TLS connections, a write the ring could not do) is written by
         * agw_batch_flush, after the rest of the iteration's scripts: this look will not hold */
        for (c = batch->head; c != NULL; c = c->batch_next)
            c->unpeeked = 1;
    }
    batch->early_base = batch->queued; /* the next early write: twice as many more than this one */
    batch->early_step = step < UINT_MAX / 4 ? 2 * step : step;
    return n;
}

size_t agw_batch_flush(agw_batch_t *batch)
{
    size_t n = 0;
    agw_conn_t *c;
    batch->flushing++;
    if (batch->ring) {
        n += flush_reads(batch); /* answers first: their scripts may make more requests */
        check_unpeeked(batch);
        n += flush_sends(batch);
    }
    /* one at a time from the head: a write may deliver a callback (an upstream that answered and
     * closed before reading), which may queue or close other connections and destroy this pool;
     * afterwards the pool is freed or serves its queue, as after any callback (on_conn_io). What a
     * callback queued from an idle list is looked at first, and so, after a callback (a script
     * that may have run for long), is every connection still queued: the look that came before it
     * no longer holds. */
    while ((c = batch->head) != NULL) {
        if (c->unpeeked) {
            check_unpeeked(batch);
            continue;
        }
        agw_pool_t *pool = c->pool;
        unsigned delivered = batch->delivered;
        agw_batch_remove(batch, c);
        agw_conn_send(c);
        agw_pool_after_callback(pool);
        if (batch->delivered != delivered)
            for (agw_conn_t *q = batch->head; q != NULL; q = q->batch_next)
                q->unpeeked = 1;
        n++;
    }
    batch->flushing--;
    batch->early_base = batch->early_step = 0; /* everything queued is written: the next iteration starts again */
    return n;
}
