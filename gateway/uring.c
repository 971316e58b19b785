/* uring.c: batched socket sends and receives on io_uring (see uring.h). */
#include "uring.h"

#include <errno.h>
#include <liburing.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

struct agw_uring {
    struct io_uring ring;
    unsigned entries;  /* operations per submission */
    unsigned prepared; /* prepared since the last run */
};

/* Whether a MSG_DONTWAIT recv on an empty socket completes inside its submission (-EAGAIN), as
 * agw_uring_run needs. A kernel that parks it until data comes fails the check; the parked
 * operation is then completed (a byte is written) and reaped before the ring is closed. */
static int completes_inline(struct io_uring *ring, char *err, size_t errcap)
{
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sv) != 0) {
        snprintf(err, errcap, "cannot check io_uring (socketpair: %s)", strerror(errno));
        return 0;
    }
    char b;
    struct io_uring_sqe *sqe = io_uring_get_sqe(ring);
    io_uring_prep_recv(sqe, sv[0], &b, 1, MSG_DONTWAIT);
    int ok = 0, e = io_uring_submit(ring);
    struct io_uring_cqe *cqe;
    if (e == 1 && io_uring_peek_cqe(ring, &cqe) == 0) {
        ok = cqe->res == -EAGAIN;
        if (!ok)
            snprintf(err, errcap, "io_uring check: an empty socket's recv gave %d, not -EAGAIN", cqe->res);
        io_uring_cqe_seen(ring, cqe);
    } else if (e == 1) {
        /* parked: complete it so that nothing in the kernel refers to b any more */
        (void)!write(sv[1], "x", 1);
        if (io_uring_wait_cqe(ring, &cqe) == 0)
            io_uring_cqe_seen(ring, cqe);
        snprintf(err, errcap, "this kernel's io_uring waits on non-blocking socket operations");
    } else {
        snprintf(err, errcap, "io_uring check: submit gave %d", e);
    }
    close(sv[0]);
    close(sv[1]);
    return ok;
}

agw_uring_t *agw_uring_open(unsigned entries, char *err, size_t errcap)
{
    agw_uring_t *r = calloc(1, sizeof(*r));
    if (r == NULL) {
        snprintf(err, errcap, "io_uring: out of memory");
        return NULL;
    }
    int e = io_uring_queue_init(entries, &r->ring, 0);
    if (e < 0) {
        snprintf(err, errcap, "io_uring is not available (%s)", strerror(-e));
        free(r);
        return NULL;
    }
    if (!completes_inline(&r->ring, err, errcap)) {
        io_uring_queue_exit(&r->ring);
        free(r);
        return NULL;
    }
    r->entries = entries;
    return r;
}

void agw_uring_close(agw_uring_t *r)
{
    if (r == NULL)
        return;
    io_uring_queue_exit(&r->ring);
    free(r);
}

static struct io_uring_sqe *next_sqe(agw_uring_t *r)
{
    if (r->prepared == r->entries)
        return NULL;
    struct io_uring_sqe *sqe = io_uring_get_sqe(&r->ring);
    if (sqe == NULL) /* (cannot happen: every run drains the queue) */
        return NULL;
    r->prepared++;
    return sqe;
}

int agw_uring_send(agw_uring_t *r, int fd, const void *buf, size_t len, void *data)
{
    struct io_uring_sqe *sqe = next_sqe(r);
    if (sqe == NULL)
        return -1;
    io_uring_prep_send(sqe, fd, buf, len, MSG_NOSIGNAL | MSG_DONTWAIT);
    io_uring_sqe_set_data(sqe, data);
    return 0;
}

int agw_uring_recv(agw_uring_t *r, int fd, void *buf, size_t len, void *data)
{
    struct io_uring_sqe *sqe = next_sqe(r);
    if (sqe == NULL)
        return -1;
    io_uring_prep_recv(sqe, fd, buf, len, MSG_DONTWAIT);
    io_uring_sqe_set_data(sqe, data);
    return 0;
}

unsigned agw_uring_run(agw_uring_t *r, void (*done)(void *ctx, void *data, int res), void *ctx)
{
    unsigned k = r->prepared, got = 0;
    r->prepared = 0;
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
