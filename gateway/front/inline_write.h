/* inline_write.h: a write h2o gives libuv that the socket takes at once is finished without
 * libuv's pending queue, and a write libuv refuses at once is answered.
 *
 * h2o 2.2.5 writes every response with libuv's uv_write. libuv 1.44 writes at once when it can,
 * then finishes the request from its pending queue at the next uv_run: the stream's watcher gets
 * an EPOLL_CTL_MOD there (uv__drain stops a POLLOUT it never started, which queues the watcher for
 * the kernel with its events unchanged): a system call a response. And when libuv refuses a write
 * at once (UV_EPIPE on a stream whose read failed), its uv_write returns the error and never calls
 * back; h2o's binding ignores the return, so the socket waited on the write for good (a TLS
 * close_notify after the client's reset: worker/accept.c's sweep then finished it, about a second
 * later).
 *
 * inline_write.c defines uv_write in the executable (libh2o calls libuv's through its PLT, as for
 * read_pause.h). On a thread that enabled it (agw_inline_write_enable: a worker), a write to a TCP
 * stream first tries libuv's uv_try_write:
 *   - all of it written: the request's callback (status 0) waits in this thread's list, and
 *     agw_inline_write_finish calls it; the worker calls that after each uv_run and before its
 *     loop waits (agw_inline_write_pending), so the callback comes where libuv's would have;
 *   - part of it: the rest goes to libuv's uv_write, which finishes it as before;
 *   - none (UV_EAGAIN, a write already queued) or an error: libuv's uv_write, as before; when that
 *     refuses at once, the callback is called from the list with the refusal's status and uv_write
 *     returns 0 (libuv's contract: a write's failure comes through its callback).
 * Everything else (another thread, another kind of stream, no callback) is libuv's uv_write.
 * A callback is called at most once; the writes' order on a stream is kept (h2o has one write in
 * flight a socket; a try is made only when libuv has nothing queued on it). */
#ifndef AGW_FRONT_INLINE_WRITE_H
#define AGW_FRONT_INLINE_WRITE_H

#include <stddef.h>
#include <uv.h>

/* From now on, this thread's writes are tried at once (see above). The thread must then call
 * agw_inline_write_finish after each uv_run and whenever agw_inline_write_pending says so. */
void agw_inline_write_enable(void);

/* This thread's writes are libuv's again; callbacks still listed are dropped (the thread's loop has
 * ended: h2o disposes of its sockets without them) and the list's memory is freed. */
void agw_inline_write_disable(void);

/* Calls the callbacks of this thread's writes that finished at once (or were refused at once),
 * in the order the writes were made: those listed when it was called; writes the callbacks make
 * wait for the next call (as libuv's pending queue does). Returns how many it called. */
size_t agw_inline_write_finish(void);

/* How many callbacks wait for agw_inline_write_finish on this thread. */
size_t agw_inline_write_pending(void);

/* 1 when libh2o's uv_write comes here (see read_pause.h's agw_read_pause_active), 0 otherwise. */
int agw_inline_write_active(void);

/* libuv's own uv_write (for tests). */
int agw_inline_write_libuv(uv_write_t *req, uv_stream_t *handle, const uv_buf_t bufs[], unsigned nbufs,
                           uv_write_cb cb);

#endif
