/* client_watch.c: noticing an HTTP/1 client that leaves while its page is still being made.
 * h2o does not read an HTTP/1 connection while its request is handled, so the worker watches the
 * client's socket itself, from CLIENT_WATCH_DELAY after the request started; a client gone is
 * answered 499 and its request abandoned (runtime.abort cancels its calls). HTTP/2 needs none of
 * this: h2o reads all the time and disposes of a reset stream's request (request.c).
 */
#include "worker/worker_internal.h"

#include <errno.h>
#include <sys/socket.h>

int agw_worker_client_gone(int fd)
{
    char c;
    ssize_t n = recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
        return -1;
    return n > 0 ? 0 : 1;
}

void agw_worker_finish_gone(h2o_req_t *req, int fd)
{
    /* 499 is the log's and the metrics' status only, never a status line on the wire: a client
     * that only half-closed (shutdown(SHUT_WR) after its request; an EOF cannot be told from a
     * close) would read it otherwise. Shutting the sending side first makes h2o's write fail at
     * once, and the client reads the connection's end with nothing before it; the failed write
     * tears the connection down. */
    shutdown(fd, SHUT_WR);
    /* and no request of the connection comes after it: h2o would start the pipelined ones it has
     * read already, each making its calls for a client that is gone */
    req->http1_is_persistent = 0;
    req->res.status = 499;
    req->res.reason = "Client Closed Request";
    req->res.content_length = 0;
    h2o_send_inline(req, "", 0);
}

/* h2o does not read an HTTP/1 connection while its request is being handled, so a client that
 * closes it is noticed here (agw_worker_client_gone): the request is abandoned and finished. */
static void on_client_readable(struct ev_loop *loop, ev_io *io, int revents)
{
    (void)loop, (void)revents;
    reqref_t *rr = io->data;
    int gone = agw_worker_client_gone(io->fd);
    if (gone < 0)
        return;
    agw_worker_stop_client_watch(rr);
    if (!gone || rr->rid == 0)
        return;
    agw_worker_t *w = rr->w;
    uint64_t rid = rr->rid;
    agw_slots_del(&w->tables.reqs, rid);
    rr->rid = 0;
    agw_worker_record_request(w, rr, 499, 0, NULL, 0, NULL, 0);
    agw_worker_abandon_request(rr->g, rid);
    agw_worker_finish_gone(rr->req, io->fd);
}

/* How long a request runs before its client's socket is watched (s). Most pages are answered
 * sooner: watching each of them at once would cost two epoll_ctl calls per request (register the
 * socket with libev's epoll, then drop it when the next request arrives on it), a tenth of a page's
 * system calls. A client that leaves earlier is noticed when the watch starts (its socket is then
 * readable at once), so its calls are cancelled at most this much later. */
#define CLIENT_WATCH_DELAY 0.025

/* Starts the watches of the queued requests that have run CLIENT_WATCH_DELAY, then waits for
 * the next one. */
void agw_worker_on_watch_timer(struct ev_loop *loop, ev_timer *t, int revents)
{
    (void)revents;
    agw_worker_t *w = t->data;
    ev_tstamp now = ev_now(loop);
    reqref_t *rr = NULL;
    while (!h2o_linklist_is_empty(&w->watch_queue)) {
        rr = H2O_STRUCT_FROM_MEMBER(reqref_t, watch_link, w->watch_queue.next);
        if (rr->started + CLIENT_WATCH_DELAY > now + 0.0005)
            break;
        int fd = rr->watch_fd;
        agw_worker_watch_unqueue(rr);
        ev_io_init(&rr->client_watch, on_client_readable, fd, EV_READ);
        rr->client_watch.data = rr;
        ev_io_start(loop, &rr->client_watch);
        rr->watching = 1;
        rr = NULL;
    }
    if (rr) {
        t->repeat = rr->started + CLIENT_WATCH_DELAY - now;
        if (t->repeat < 0.001)
            t->repeat = 0.001;
        ev_timer_again(loop, t);
    } else {
        ev_timer_stop(loop, t);
    }
}

/* HTTP/1: queues the request so that its client's socket is watched once the request has run
 * CLIENT_WATCH_DELAY (see on_client_readable). */
void agw_worker_watch_client(reqref_t *rr, h2o_req_t *req)
{
    rr->watching = 0;
    rr->watch_fd = -1;
    rr->watch_link = (h2o_linklist_t){NULL, NULL};
    if (req->version >= 0x200 || req->conn->callbacks->get_socket == NULL)
        return; /* HTTP/2 reads all the time: a reset stream or a closed connection disposes the request */
    h2o_socket_t *sock = req->conn->callbacks->get_socket(req->conn);
    int fd = sock ? h2o_socket_get_fd(sock) : -1;
    if (fd < 0)
        return;
    agw_worker_t *w = rr->w;
    rr->watch_fd = fd;
    h2o_linklist_insert(&w->watch_queue, &rr->watch_link); /* at the end: oldest first */
    if (!ev_is_active(&w->watch_timer)) {
        w->watch_timer.repeat = CLIENT_WATCH_DELAY;
        ev_timer_again(w->loop, &w->watch_timer);
    }
}
