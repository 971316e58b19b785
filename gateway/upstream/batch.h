/* batch.h: write coalescing and batched system calls (io_uring) for the upstream client's pools
 * (pool.h) on one loop. */
#ifndef AGW_UPSTREAM_BATCH_H
#define AGW_UPSTREAM_BATCH_H

#include "upstream/pool.h"

#include <stddef.h>

/* Write coalescing: one wake-up of an upstream per loop iteration, not one per request.
 *
 * A pool given a batch (agw_pool_set_batch) does not write a request on a kept-alive connection
 * when its call starts: it queues the connection on the batch, and the loop's owner writes every
 * queued request with agw_batch_flush() before the loop waits for events (from a libev prepare
 * watcher, after everything else that iteration has done). The requests a loop iteration makes
 * (three calls of each of the pages it handled) then reach an upstream close together: the
 * upstream process, woken by the first, finds the others already there, where one write per call
 * woke it (and made the gateway pay for waking it) again and again. Redis writes its replies
 * the same way, before it sleeps. A request waits at most until the end of the iteration that
 * made it; a call on a new connection writes when its connect completes, as without a batch.
 *
 * A queued connection keeps the rules of a kept-alive one. Bytes or EOF that arrived on it before
 * the flush are no answer to its request: the flush looks at every connection queued from an idle
 * list with one poll(2) before writing (where a call without a batch peeks at its connection, a
 * system call each), and again at those still queued after a write of the same flush ran a
 * callback (which may take long). One found readable is closed and its call takes another
 * connection (nothing was sent), as for an idle connection found stale; so is one on which the
 * loop saw an event, when the owner lets it poll before flushing. If the upstream closes it after
 * that, the write or the read finds out, and an idempotent call is retried once on a new
 * connection. One batch may serve every pool on a loop; pools and batch must be used from that
 * loop's thread only. agw_pool_destroy removes the pool's connections from it. */
typedef struct agw_batch {
    struct agw_conn *head, *tail;       /* queued connections, oldest first (zero: empty) */
    struct agw_uring *ring;         /* agw_batch_ring_init: the iteration's socket I/O batched */
    struct agw_conn *rhead, *rtail;     /* plain connections whose answer waits to be read (ring) */
    struct agw_conn *lhead, *ltail;     /* reads done by the ring, waiting to be parsed */
    char *slots;                    /* the ring's read buffers (AGW_BATCH_READS of 16 KiB) */
    unsigned delivered;             /* callbacks its pools' calls got (agw_call_deliver): a flush
                                     * that ran one looks at the connections still queued again */
    unsigned queued;                /* connections on the list (head … tail) */
    unsigned early_base, early_step; /* agw_batch_send_early writes once queued reaches base + step
                                     * (step 0: AGW_BATCH_EARLY_FIRST); set by each early write (base:
                                     * what it left queued; step doubled), set back by agw_batch_flush */
    unsigned flushing;              /* agw_batch_flush is running (an early send then waits for it) */
} agw_batch_t;

/* Reads one ring submission carries at most; more wait for the next one in the same flush. */
#define AGW_BATCH_READS 32

/* Batched system calls (io_uring through uring.h; checked to work on Linux 6.1, Debian 12's
 * kernel, and later).
 *
 * With a ring, agw_batch_flush also takes the upstream socket I/O of the iteration off the
 * one-system-call-per-operation path: an answer the loop saw arrive on a plain connection is not
 * read by a read(2) of its own but queued on the batch, and the flush reads every queued answer
 * with one io_uring_enter (AGW_BATCH_READS per submission) and parses them in the order the loop
 * ran the connections' watchers; then it writes the queued requests of plain (http://)
 * connections with one more (64 per submission). Each operation is a send/recv with MSG_DONTWAIT,
 * so it completes inside the submission with the result the system call would give (bytes,
 * EAGAIN, EOF, an error): the rules above are unchanged, and anything but a whole write or a read
 * goes on through the plain path. TLS connections, connects and writes the socket buffer cannot
 * take at once use the plain path as without a ring. On a paravirtualized machine a system call
 * costs about 1 µs, and under load a flush carries the answers and requests of several pages.
 *
 * With a ring the owner MUST call agw_batch_flush before every poll of the loop: a queued read is
 * only done there, and until it is, the connection's level-triggered watcher keeps the loop awake.
 *
 * agw_batch_ring_init returns 0, or -1 with why in err (io_uring unavailable: kernel too old,
 * disabled by sysctl kernel.io_uring_disabled or a seccomp profile; see agw_uring_open) and the
 * batch works without one. agw_batch_ring_free releases it (nothing may be queued). */
int agw_batch_ring_init(agw_batch_t *batch, char *err, size_t errcap);
void agw_batch_ring_free(agw_batch_t *batch);

/* Queues this pool's requests on kept-alive connections on batch (not owned; it must outlive the
 * pool); NULL (the default) writes each when its call starts. Set it before the first call: it
 * must not change while one of the pool's requests is queued. */
void agw_pool_set_batch(agw_pool_t *pool, agw_batch_t *batch);

/* Early writes: the requests of a busy iteration do not all wait for its end.
 *
 * A burst of pages that arrive together (a client's connections sending at the same instant, an
 * HTTP/2 connection's streams in one read) runs every page's script before the iteration ends, and
 * their calls waited for that end: the upstreams, idle on the other cores meanwhile, got the first
 * page's requests only once the last page's script had run, and every page of the burst ended
 * late by the whole burst's scripts. agw_batch_send_early, called by the loop's owner after each
 * script it started (a point where no callback of the batch's pools is running), writes what is
 * queued once AGW_BATCH_EARLY_FIRST connections are, then again each time twice as many more are
 * than its last early write left (6, 12, 24, …: a few more system calls for a long iteration, not
 * one a page), until agw_batch_flush ends the iteration and starts the count again. Only
 * connections still queued count (a call cancelled meanwhile gave its connection back). It looks
 * at the connections from an idle list (poll(2), up to 64 a call) and sends with the ring (one
 * io_uring_enter per 64), as agw_batch_flush does: no callback runs and nothing is read. What it
 * could not write (TLS connections, which OpenSSL writes in the flush; a write the ring could not
 * do) stays queued, marked to be looked at again by the flush, which comes after the rest of the
 * iteration's scripts. Without a ring it writes nothing (a plain write may run a callback), nor
 * while agw_batch_flush runs (defensive: the flush writes whatever is queued before it returns).
 * Returns the requests written.
 *
 * Measured (docs/performance.md "A twenty-sixth pass"): at half load over HTTP/1.1, where h2load's
 * connections send in groups, p99 3.66-4.12 ms against 4.32-4.51 (four alternated rounds each,
 * steal 0-30 ms), and 0.3 more system calls a page at saturation. */
#define AGW_BATCH_EARLY_FIRST 6
size_t agw_batch_send_early(agw_batch_t *batch);

/* Reads and parses the answers queued on batch (with a ring: see above), then writes every request
 * queued on it, oldest first, and returns how many of both. Parsing an answer delivers its call's
 * callback from inside, as does a write that finds the upstream's answer already in (it answered
 * and closed without reading); failures are delivered from the loop as usual. */
size_t agw_batch_flush(agw_batch_t *batch);

#endif
