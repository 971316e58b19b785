/* inline_write.c: writes finished at once without libuv's pending queue (inline_write.h). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* RTLD_NEXT */
#endif
#include "front/inline_write.h"

#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>

#include "base/mem.h"
#include "front/interpose.h"
#include "front/read_pause.h" /* agw_libuv_checked */

typedef int (*write_fn)(uv_write_t *, uv_stream_t *, const uv_buf_t[], unsigned, uv_write_cb);
typedef void (*close_fn)(uv_handle_t *, uv_close_cb);

/* libuv's own uv_write and uv_close: found before main runs (no thread exists yet), never changed
 * after. */
static write_fn libuv_write;
static close_fn libuv_close;

__attribute__((constructor)) static void find_libuv(void)
{
    *(void **)&libuv_write = dlsym(RTLD_NEXT, "uv_write");
    *(void **)&libuv_close = dlsym(RTLD_NEXT, "uv_close");
}

typedef struct {
    uv_write_t *req; /* NULL: its callback was called by uv_close (a tombstone) */
    int status;
} done_t;

/* This thread's list: on (enabled), and the writes whose callbacks wait, in order: items[head]
 * to items[n - 1]. */
static __thread struct {
    int on;
    done_t *items;
    size_t head, n, cap;
} list;

void agw_inline_write_enable(void)
{
    list.on = agw_inline_write_active(); /* (libuv's own writes otherwise) */
}

void agw_inline_write_disable(void)
{
    free(list.items);
    list.items = NULL;
    list.on = 0;
    list.head = list.n = list.cap = 0;
}

size_t agw_inline_write_pending(void)
{
    return list.n - list.head;
}

int agw_inline_write_active(void)
{
    return libuv_write != NULL && libuv_close != NULL && agw_libuv_checked() &&
           agw_interposed("uv_write", (void *)uv_write) && agw_interposed("uv_close", (void *)uv_close);
}

int agw_inline_write_libuv(uv_write_t *req, uv_stream_t *handle, const uv_buf_t bufs[], unsigned nbufs,
                           uv_write_cb cb)
{
    return libuv_write ? libuv_write(req, handle, bufs, nbufs, cb) : UV_ENOSYS;
}

static void add(uv_write_t *req, uv_stream_t *handle, uv_write_cb cb, int status)
{
    if (list.n == list.cap) {
        if (list.head > 0) { /* the finished ones' room first */
            memmove(list.items, list.items + list.head, (list.n - list.head) * sizeof(*list.items));
            list.n -= list.head;
            list.head = 0;
        } else {
            list.cap = list.cap ? 2 * list.cap : 64;
            list.items = agw_realloc(list.items, list.cap * sizeof(*list.items));
        }
    }
    req->handle = handle; /* (the public fields libuv sets; h2o reads none) */
    req->cb = cb;
    list.items[list.n++] = (done_t){req, status};
}

size_t agw_inline_write_finish(void)
{
    size_t todo = list.n - list.head, called = 0;
    /* each is taken off before its callback runs: a callback may write (added behind the todo ones,
     * for the next call; add may move the list to its start, keeping the order, so they are
     * counted, not indexed) or close a handle (uv_close calls the callbacks of its listed writes
     * and leaves tombstones) */
    while (todo > 0 && list.head < list.n) {
        todo--;
        done_t d = list.items[list.head++];
        if (d.req == NULL)
            continue;
        called++;
        d.req->cb(d.req, d.status);
    }
    if (list.head == list.n)
        list.head = list.n = 0;
    return called;
}

/* libuv's uv_write, but a write the socket takes at once finishes from this thread's list (see
 * inline_write.h). Returns 0, or what libuv's returns when it is not this thread's to finish. */
int uv_write(uv_write_t *req, uv_stream_t *handle, const uv_buf_t bufs[], unsigned nbufs, uv_write_cb cb)
{
    if (!list.on || handle->type != UV_TCP || cb == NULL || nbufs == 0)
        return agw_inline_write_libuv(req, handle, bufs, nbufs, cb);
    size_t total = 0;
    for (unsigned i = 0; i < nbufs; i++)
        total += bufs[i].len;
    int sent = uv_try_write(handle, bufs, nbufs);
    if (sent >= 0 && (size_t)sent == total) {
        add(req, handle, cb, 0);
        return 0;
    }
    int rc;
    if (sent > 0) { /* the rest to libuv (which copies the array) */
        unsigned i = 0;
        size_t skip = (size_t)sent;
        while (skip >= bufs[i].len) /* (sent < total: some buffer is not all sent) */
            skip -= bufs[i++].len;
        uv_buf_t small[16], *rest = nbufs - i <= 16 ? small : agw_malloc((nbufs - i) * sizeof(*rest));
        memcpy(rest, bufs + i, (nbufs - i) * sizeof(*rest));
        rest[0].base += skip;
        rest[0].len -= skip;
        rc = agw_inline_write_libuv(req, handle, rest, nbufs - i, cb);
        if (rest != small)
            free(rest);
    } else {
        rc = agw_inline_write_libuv(req, handle, bufs, nbufs, cb);
    }
    if (rc < 0 && rc != UV_ENOSYS && !uv_is_closing((uv_handle_t *)handle)) {
        /* refused at once: the callback says so (not on a closing handle, whose close callback may
         * free the request before the list is read: libuv's refusal is returned, as before) */
        add(req, handle, cb, rc);
        return 0;
    }
    return rc;
}

/* libuv's uv_close, but first the listed callbacks of handle's writes are called with
 * UV_ECANCELED, as libuv calls those of the writes it holds before the handle's close callback
 * (which may free the requests: h2o's frees its socket, the request inside it). h2o's own callback
 * does nothing then (its dispose cleared the socket's write callback before closing). */
void uv_close(uv_handle_t *handle, uv_close_cb close_cb)
{
    /* taken off the list first, called after: a callback may add to the list (and move it) */
    uv_write_t *small[8], **reqs = small;
    size_t k = 0;
    for (size_t i = handle->type == UV_TCP ? list.head : list.n; i < list.n; i++) { /* (only streams
                                                                                     write) */
        done_t *d = &list.items[i];
        if (d->req == NULL || (uv_handle_t *)d->req->handle != handle)
            continue;
        if (k == 8 && reqs == small) {
            reqs = agw_malloc((list.n - i + 8) * sizeof(*reqs));
            memcpy(reqs, small, sizeof(small));
        }
        reqs[k++] = d->req;
        d->req = NULL;
    }
    for (size_t i = 0; i < k; i++)
        reqs[i]->cb(reqs[i], UV_ECANCELED);
    if (reqs != small)
        free(reqs);
    if (libuv_close)
        libuv_close(handle, close_cb);
}
