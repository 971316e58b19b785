/* read_pause.c: a client connection's reading paused without a system call (read_pause.h). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* RTLD_NEXT */
#endif
#include "front/read_pause.h"
#include "front/inbuf.h"
#include "front/interpose.h"

#include <dlfcn.h>
#include <stddef.h>

typedef int (*stop_fn)(uv_stream_t *);
typedef int (*start_fn)(uv_stream_t *, uv_alloc_cb, uv_read_cb);

/* libuv's own functions: found before main runs (a constructor; no thread exists yet), never
 * changed after. NULL when not found: every call then fails as libuv would refuse a bad handle. */
static stop_fn libuv_stop;
static start_fn libuv_start;

/* 1 when stops may pause: libuv's stop was found and libuv is the version this was checked against. */
static int pausing;

__attribute__((constructor)) static void find_libuv(void)
{
    /* (the POSIX way to store dlsym's object pointer in a function pointer) */
    *(void **)&libuv_stop = dlsym(RTLD_NEXT, "uv_read_stop");
    *(void **)&libuv_start = dlsym(RTLD_NEXT, "uv_read_start");
    pausing = libuv_stop != NULL && libuv_start != NULL && agw_libuv_checked();
}

/* A paused stream's alloc callback: no buffer, so libuv reads nothing and calls the read callback
 * with UV_ENOBUFS (libuv's rule for a buffer of length 0). */
static void paused_alloc(uv_handle_t *handle, size_t suggested, uv_buf_t *buf)
{
    (void)handle, (void)suggested;
    buf->base = NULL;
    buf->len = 0;
}

/* A paused stream's callbacks let go: it is a stream libuv stopped, or is about to stop (libuv's
 * stop clears them too, but only when its reading flag is still set). */
static void unpause(uv_stream_t *stream)
{
    stream->read_cb = NULL;
    stream->alloc_cb = NULL;
}

/* A paused stream's read callback: UV_ENOBUFS (bytes came: they stay in the kernel) or UV_EOF
 * (libuv saw the peer hang up and stopped the stream itself). Either way the stream stops for real
 * (a no-op when libuv stopped it) and the owner's next start is libuv's, which reads them. */
static void paused_read(uv_stream_t *stream, ssize_t nread, const uv_buf_t *buf)
{
    (void)nread, (void)buf;
    if (libuv_stop)
        libuv_stop(stream);
    unpause(stream);
}

int agw_read_pause_is_paused(const uv_stream_t *stream)
{
    return stream->alloc_cb == paused_alloc;
}

int agw_read_pause_active(void)
{
    return pausing && agw_interposed("uv_read_stop", (void *)uv_read_stop) &&
           agw_interposed("uv_read_start", (void *)uv_read_start);
}

int agw_read_pause_libuv_stop(uv_stream_t *stream)
{
    return libuv_stop ? libuv_stop(stream) : UV_ENOSYS;
}

int agw_read_pause_libuv_start(uv_stream_t *stream, uv_alloc_cb alloc_cb, uv_read_cb read_cb)
{
    return libuv_start ? libuv_start(stream, alloc_cb, read_cb) : UV_ENOSYS;
}

/* libuv's uv_read_stop, but a pause for a TCP connection that reads and is not closing (see
 * read_pause.h). Returns 0, or what libuv's returns. */
int uv_read_stop(uv_stream_t *stream)
{
    int closing = uv_is_closing((uv_handle_t *)stream);
    if (stream->alloc_cb == paused_alloc) {
        if (!closing)
            return 0; /* paused already */
        unpause(stream);
    } else if (pausing && stream->type == UV_TCP && stream->alloc_cb != NULL && !closing &&
               uv_is_active((uv_handle_t *)stream)) {
        stream->alloc_cb = paused_alloc;
        stream->read_cb = paused_read;
        return 0;
    }
    return agw_read_pause_libuv_stop(stream);
}

/* libuv's uv_read_start, but a paused stream that libuv still reads takes the callbacks back
 * without a system call, and h2o's read callback of a plain connection is inbuf.h's. Returns 0, or
 * what libuv's returns. */
int uv_read_start(uv_stream_t *stream, uv_alloc_cb alloc_cb, uv_read_cb read_cb)
{
    alloc_cb = agw_inbuf_alloc_cb(stream, alloc_cb); /* a plain connection's small input buffer (inbuf.h) */
    if (stream->alloc_cb == paused_alloc) {
        if (alloc_cb == NULL || read_cb == NULL)
            return UV_EINVAL; /* (as libuv's; the pause stays: it still swallows what comes) */
        if (uv_is_active((uv_handle_t *)stream) &&
            !uv_is_closing((uv_handle_t *)stream)) {
            stream->alloc_cb = alloc_cb;
            stream->read_cb = read_cb;
            return 0;
        }
        /* libuv stopped it meanwhile (a read error after the pause began inside the read
         * callback): libuv's start decides, on a stream that is not paused */
        unpause(stream);
    }
    return agw_read_pause_libuv_start(stream, alloc_cb, read_cb);
}
