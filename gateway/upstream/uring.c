/* uring.c: batched socket sends and receives on io_uring (see uring.h). */
#include "upstream/uring.h"

#include "base/mem.h"

#include <errno.h>
#include <liburing.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

struct agw_uring {
    struct io_uring ring; /* its submission queue holds `entries`: io_uring_get_sqe says when full */
};

/* Runs the one operation prepared on the (empty) ring. Returns 0 with its result in *res when it
 * completed inside the submission, 1 when it did not (parked until the socket is ready), or a
 * negative errno when the submission failed. */
static int run_one(struct io_uring *ring, int *res)
{
    struct io_uring_cqe *cqe;
    int e = io_uring_submit(ring);
    if (e < 0)
        return e;
    if (io_uring_peek_cqe(ring, &cqe) != 0)
        return 1;
    *res = cqe->res;
    io_uring_cqe_seen(ring, cqe);
    return 0;
}

/* Whether the ring does what agw_uring_run needs, checked on a socket pair: a MSG_DONTWAIT send of
 * a byte gives 1, a recv gives it back, a recv on the now empty socket gives -EAGAIN, each inside
 * its submission. io_uring_setup alone does not say so: Linux 5.1-5.5 have no IORING_OP_SEND/RECV
 * (-EINVAL), a sandbox may filter operations (-EACCES), and a kernel may park a MSG_DONTWAIT
 * operation until the socket is ready. An operation left parked ends when the pair is closed and
 * is reaped before the ring goes. Returns 1, or 0 with the reason in err. */
static int works_on_sockets(struct io_uring *ring, char *err, size_t errcap)
{
    int sv[2], res = 0, e;
    char out = 'a', in = 0;
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sv) != 0) {
        snprintf(err, errcap, "cannot check io_uring (socketpair: %s)", strerror(errno));
        return 0;
    }
    const char *step = "send";
    io_uring_prep_send(io_uring_get_sqe(ring), sv[0], &out, 1, MSG_NOSIGNAL | MSG_DONTWAIT);
    int ok = (e = run_one(ring, &res)) == 0 && res == 1;
    if (ok) {
        step = "recv";
        io_uring_prep_recv(io_uring_get_sqe(ring), sv[1], &in, 1, MSG_DONTWAIT);
        ok = (e = run_one(ring, &res)) == 0 && res == 1 && in == 'a';
    }
    if (ok) {
        step = "recv on an empty socket";
        io_uring_prep_recv(io_uring_get_sqe(ring), sv[1], &in, 1, MSG_DONTWAIT);
        ok = (e = run_one(ring, &res)) == 0 && (res == -EAGAIN || res == -EWOULDBLOCK);
    }
    close(sv[0]);
    close(sv[1]);
    if (ok)
        return 1;
    if (e == 1) { /* parked: the close above ends it */
        struct io_uring_cqe *cqe;
        if (io_uring_wait_cqe(ring, &cqe) == 0)
            io_uring_cqe_seen(ring, cqe);
        snprintf(err, errcap, "io_uring parks non-blocking socket operations (%s)", step);
    } else if (e < 0) {
        snprintf(err, errcap, "io_uring cannot submit (%s: %s)", step, strerror(-e));
    } else {
        snprintf(err, errcap, "io_uring cannot send and receive on sockets (%s: %s)", step,
                 res < 0 ? strerror(-res) : "unexpected result");
    }
    return 0;
}

agw_uring_t *agw_uring_open(unsigned entries, char *err, size_t errcap)
{
    agw_uring_t *r = agw_calloc(1, sizeof(*r));
    int e = io_uring_queue_init(entries, &r->ring, 0);
    if (e < 0) {
        snprintf(err, errcap, "io_uring is not available (%s)", strerror(-e));
        free(r);
        return NULL;
    }
    if (!works_on_sockets(&r->ring, err, errcap)) {
        agw_uring_close(r);
        return NULL;
    }
    return r;
}

void agw_uring_close(agw_uring_t *r)
{
    if (r == NULL)
        return;
    io_uring_queue_exit(&r->ring);
    free(r);
}

int agw_uring_send(agw_uring_t *r, int fd, const void *buf, size_t len, void *data)
{
    struct io_uring_sqe *sqe = io_uring_get_sqe(&r->ring); /* NULL: `entries` prepared */
    if (sqe == NULL)
        return -1;
    io_uring_prep_send(sqe, fd, buf, len, MSG_NOSIGNAL | MSG_DONTWAIT);
    io_uring_sqe_set_data(sqe, data);
    return 0;
}

int agw_uring_recv(agw_uring_t *r, int fd, void *buf, size_t len, void *data)
{
    struct io_uring_sqe *sqe = io_uring_get_sqe(&r->ring); /* NULL: `entries` prepared */
    if (sqe == NULL)
        return -1;
    io_uring_prep_recv(sqe, fd, buf, len, MSG_DONTWAIT);
    io_uring_sqe_set_data(sqe, data);
    return 0;
}

unsigned agw_uring_run(agw_uring_t *r, void (*done)(void *ctx, void *data, int res), void *ctx)
{
    unsigned k = io_uring_sq_ready(&r->ring), got = 0;
    while (got < k) {
        int e = io_uring_submit_and_wait(&r->ring, 1);
        if (e < 0 && e != -EINTR && e != -EAGAIN && e != -EBUSY) {
            fprintf(stderr, "aggway: io_uring_enter failed: %s\n", strerror(-e));
            abort();
        }
        struct io_uring_cqe *cqe;
        unsigned head, n = 0;
        io_uring_for_each_cqe(&r->ring, head, cqe)
        {
            done(ctx, io_uring_cqe_get_data(cqe), cqe->res);
            n++;
        }
        io_uring_cq_advance(&r->ring, n);
        got += n;
    }
    return k;
}
