/* read_pause.h: a client connection's reading paused and resumed without two system calls a
 * request.
 *
 * h2o 2.2.5's HTTP/1 stops reading a connection while it serves a request and starts again when
 * the response is sent (h2o_socket_read_stop and _start, which call libuv's uv_read_stop and
 * uv_read_start). libuv 1.44 takes the socket's watcher out at the stop without telling the kernel
 * (uv__io_stop) and, at the start, puts it back with an EPOLL_CTL_ADD that fails with EEXIST and
 * then an EPOLL_CTL_MOD: two system calls a request, about 2.5 µs on this machine
 * (docs/performance.md, "A twenty-second pass").
 *
 * read_pause.c defines uv_read_stop and uv_read_start in the executable. They are libuv's exported
 * functions, which libh2o calls through its PLT, so the dynamic linker binds those calls here; each
 * passes to libuv's own (dlsym RTLD_NEXT) but in one case. A stop of a TCP connection that is
 * reading (uv_is_active: for a stream that does not listen, libuv sets and clears it with its
 * reading flag) and is not closing becomes a pause: the stream stays registered and reading in
 * libuv, and its two callbacks are swapped for the pause's own. A start of a paused stream puts the
 * caller's callbacks back, with no system call. What comes while a stream is paused is never given
 * to its owner:
 *   - bytes: the pause's alloc callback gives libuv a buffer of no bytes, which libuv answers with
 *     the read callback and UV_ENOBUFS, reading nothing (libuv's documented rule for uv_alloc_cb);
 *     the pause's read callback then stops the stream for real, and the bytes wait in the kernel
 *     for the next start, as they do after a real stop;
 *   - the peer's hangup that libuv reports as UV_EOF without a read (uv__stream_io, after a read
 *     that emptied the socket): libuv has stopped the stream itself; the pause lets the callbacks
 *     go, and the next start reads the end of the stream again.
 * A paused stream is stopped for real when it is closed (libuv's close calls uv_read_stop).
 * Nothing but the callbacks' two public fields of uv_stream_t is written.
 *
 * Every start first asks inbuf.h which alloc callback to give (h2o's plain connection's is replaced
 * by one that reads into a smaller block), whatever the libuv release: that is libuv's documented
 * API.
 *
 * Streams that are not TCP connections (pipes, listeners) and every other call pass through
 * unchanged, as does every stop and start when libuv is not the release this was checked against
 * (AGW_LIBUV_CHECKED), but for that callback. The unit test holds the rule against a real socket
 * and counts epoll_ctl. */
#ifndef AGW_FRONT_READ_PAUSE_H
#define AGW_FRONT_READ_PAUSE_H

#include <uv.h>

/* The libuv release whose code paths these rules were checked against, as (major << 8) | minor of
 * uv_version(): 1.44 (Debian 12). They rely on its behaviour beyond the documented API (a stream
 * that does not listen is active exactly while it reads; a read callback gets UV_ENOBUFS before
 * any read when its buffer is empty; a close calls uv_read_stop on a closing handle), so with
 * another release every call is libuv's own (and the log says so at start). */
#define AGW_LIBUV_CHECKED ((1 << 8) | 44)

/* 1 when the libuv this process runs with is that release (uv_version's major and minor). */
static inline int agw_libuv_checked(void)
{
    return (uv_version() >> 8) == AGW_LIBUV_CHECKED;
}

/* 1 when libh2o's calls of uv_read_stop and uv_read_start come here (the executable exports the two
 * functions and libuv's own were found), 0 when they go to libuv directly (every stop and start is
 * then libuv's, as without this file). main calls it once at start and says which in the log; it
 * also makes the linker take this file from the core library. Thread-safe (nothing is set). */
int agw_read_pause_active(void);

/* 1 when stream is paused by a stop (its reading resumes at the next uv_read_start without a
 * system call), 0 otherwise. For tests and assertions. */
int agw_read_pause_is_paused(const uv_stream_t *stream);

/* libuv's own uv_read_stop and uv_read_start, found when the process starts (dlsym RTLD_NEXT).
 * For tests that compare with libuv's behaviour; the process's callers go through the interposed
 * ones above. */
int agw_read_pause_libuv_stop(uv_stream_t *stream);
int agw_read_pause_libuv_start(uv_stream_t *stream, uv_alloc_cb alloc_cb, uv_read_cb read_cb);

#endif
