/* uring.h: batched socket sends and receives through io_uring (liburing), for an event loop that
 * wants the socket I/O of one iteration in one system call instead of one per operation.
 *
 * Every operation is a send or a recv with MSG_DONTWAIT: the kernel completes it inside the
 * submission, with the result its own system call would have given (bytes, 0 at EOF, -EAGAIN when
 * nothing can be done now, -errno), so agw_uring_run never waits for the network. agw_uring_open
 * checks on a socket pair that this kernel does so (Linux 6.1, Debian 12's kernel, does; 5.1-5.5
 * have no socket operations, a sandbox may filter them, and a kernel that parked such an operation
 * until the socket is ready would make agw_uring_run wait) and refuses a ring otherwise.
 * The caller keeps the buffers alive until agw_uring_run returns. One ring per thread; nothing
 * here is thread-safe.
 *
 * Used by the upstream client (upstream/batch.h, "Batched system calls"): on a paravirtualized machine a
 * system call costs about 1 µs (tools/bench/syscost.c), and a worker under load makes tens of
 * upstream sends and reads per loop iteration. */
#ifndef AGW_URING_H
#define AGW_URING_H

#include <stddef.h>

typedef struct agw_uring agw_uring_t;

/* Opens a ring with room for `entries` operations per submission. Returns NULL with the reason in
 * err (io_uring absent: kernel older than 5.6, sysctl kernel.io_uring_disabled, a seccomp profile
 * such as Docker's default; or the ring cannot send and receive on sockets as described above). */
agw_uring_t *agw_uring_open(unsigned entries, char *err, size_t errcap);

/* Closes the ring; nothing may be prepared and not yet run. NULL is ignored. */
void agw_uring_close(agw_uring_t *r);

/* Prepares a send(fd, buf, len, MSG_NOSIGNAL | MSG_DONTWAIT) / a recv(fd, buf, len, MSG_DONTWAIT)
 * whose result agw_uring_run hands to its callback with data. Returns 0, or -1 when `entries`
 * operations are already prepared (run them first). */
int agw_uring_send(agw_uring_t *r, int fd, const void *buf, size_t len, void *data);
int agw_uring_recv(agw_uring_t *r, int fd, void *buf, size_t len, void *data);

/* Submits every prepared operation in one io_uring_enter and calls done(ctx, data, res) for each,
 * in completion order, once all are complete; returns how many. done must not prepare or run
 * operations on r. Interrupted or refused-for-now submissions (EINTR, EAGAIN, EBUSY) are retried;
 * any other failure of io_uring_enter means the ring itself is unusable, while the kernel may still
 * hold buffers the caller owns: the process aborts with a message rather than reuse them. */
unsigned agw_uring_run(agw_uring_t *r, void (*done)(void *ctx, void *data, int res), void *ctx);

#endif
