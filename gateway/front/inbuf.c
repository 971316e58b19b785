/* inbuf.c: a plain client connection's input buffer in a 2 KB block (inbuf.h). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* dladdr */
#endif
#include "front/inbuf.h"

#include <dlfcn.h>
#include <h2o/version.h>

#if H2O_VERSION_MAJOR != 2 || H2O_VERSION_MINOR != 2
#error "front/inbuf.c replaces h2o 2.2's alloc_inbuf_tcp: check it against this libh2o's"
#endif

/* This thread's state: on once agw_inbuf_thread_init ran; h2o's plain connection callback once
 * learnt; the stream accept.c declared, while it is being handed to h2o. */
static __thread struct {
    int on;
    uv_alloc_cb h2o_tcp;
    const uv_stream_t *expected;
} inbuf;

/* h2o's alloc_inbuf_tcp with AGW_INBUF_CAPACITY for its 4,096: the socket's input reserved, its free
 * bytes given to libuv. h2o's libuv socket (the handle's data) begins with its h2o_socket_t. */
static void small_alloc(uv_handle_t *handle, size_t suggested, uv_buf_t *buf)
{
    (void)suggested;
    h2o_socket_t *sock = handle->data;
    h2o_iovec_t v = h2o_buffer_reserve(&sock->input, AGW_INBUF_CAPACITY);
    buf->base = v.base;
    buf->len = v.len;
}

/* 1 when fn is in the same loaded object as h2o_socket_read_start (libh2o). */
static int in_libh2o(void *fn)
{
    Dl_info a, b;
    return dladdr(fn, &a) != 0 && dladdr((void *)h2o_socket_read_start, &b) != 0 && a.dli_fbase == b.dli_fbase;
}

void agw_inbuf_thread_init(void)
{
    h2o_socket_buffer_prototype._initial_buf.capacity = AGW_INBUF_CAPACITY;
    inbuf.on = 1;
}

void agw_inbuf_expect(const uv_stream_t *stream)
{
    inbuf.expected = stream;
}

uv_alloc_cb agw_inbuf_alloc_cb(const uv_stream_t *stream, uv_alloc_cb cb)
{
    if (!inbuf.on || cb == NULL)
        return cb;
    if (inbuf.h2o_tcp == NULL) {
        const h2o_socket_t *sock = stream->data;
        if (stream != inbuf.expected || stream->type != UV_TCP || sock == NULL || sock->ssl != NULL ||
            !in_libh2o((void *)cb))
            return cb;
        inbuf.h2o_tcp = cb;
    }
    return cb == inbuf.h2o_tcp ? small_alloc : cb;
}

int agw_inbuf_learnt(void)
{
    return inbuf.h2o_tcp != NULL;
}
