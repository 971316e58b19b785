/* inbuf.h: a plain client connection's input buffer in a 2 KB block instead of 5 KB.
 *
 * h2o 2.2.5 reads a connection into its h2o_buffer_t (sock->input), whose block holds the buffer's
 * header and its bytes. Its libuv read callback (alloc_inbuf_tcp, lib/common/socket/uv-binding.c.h)
 * asks for 4,096 free bytes at every read, so an empty buffer gets a block of the header (36 bytes)
 * and 4,096 bytes: 4,132 bytes, which jemalloc serves from its 5,120-byte class. h2o frees the
 * buffer when it is emptied (h2o_buffer_consume), so an idle connection holds none; an HTTP/1.1
 * connection holds it while a request is read and served (the request's header fields point into
 * it until its page is sent), an HTTP/2 connection while a frame is incomplete. A page's request
 * is a few hundred bytes; the 5 KB block was about a fifth of the memory a page in flight held
 * (docs/performance.md, "A seventeenth pass").
 *
 * On a thread that called agw_inbuf_thread_init (a worker), h2o's read callback of a plain
 * connection is replaced, when libh2o starts reading (libuv's uv_read_start, interposed by
 * read_pause.c), by one that asks h2o for AGW_INBUF_CAPACITY free bytes: an empty buffer then gets
 * a block of AGW_INBUF_BLOCK bytes (jemalloc's 2,048-byte class), from the same per-thread recycling
 * list as before (the prototype's capacity is set to the same figure). What the callback does is
 * h2o's own with that one figure: h2o_buffer_reserve on the socket's input, whose rules grow the
 * buffer (doubling) when more than the free bytes are needed, as a request bigger than 4 KB grew
 * before. A read is then given the buffer's free bytes: up to about 2 KB when the buffer is empty,
 * so a client that sends more than that at once (an upload, many HTTP/2 frames) takes two reads
 * where one did.
 *
 * h2o's callback is a static function of libh2o, so it is known by its address, learnt from the
 * first read that starts on a connection accept.c declared (agw_inbuf_expect) and whose h2o socket
 * has no TLS (h2o 2.2.5's do_read_start gives such a socket alloc_inbuf_tcp), and only when that
 * address is in the library that defines h2o_socket_read_start. Any other callback, a TLS
 * connection's, and every call on a thread that did not call agw_inbuf_thread_init are left as they
 * are. A TLS connection's two buffers (the encrypted input, and the decrypted one h2o reserves
 * 4,096 bytes in) keep h2o's size, but no longer come from the recycling list, whose capacity is
 * now the small block's: each is malloc's and free's, as a buffer that grew always was. The file
 * refuses to compile against another h2o than 2.2 (small_alloc is 2.2's alloc_inbuf_tcp with
 * another figure, and reads its socket's layout). */
#ifndef AGW_FRONT_INBUF_H
#define AGW_FRONT_INBUF_H

#include <h2o.h>
#include <stddef.h>
#include <uv.h>

/* The block a plain connection's empty input buffer takes, in bytes: header and bytes together, one
 * of jemalloc's size classes. */
#define AGW_INBUF_BLOCK 2048

/* The bytes of that block the buffer can hold: AGW_INBUF_BLOCK less h2o_buffer_t's header. */
#define AGW_INBUF_CAPACITY (AGW_INBUF_BLOCK - offsetof(h2o_buffer_t, _buf))

/* Sets this thread's h2o socket buffer prototype (h2o_socket_buffer_prototype, one per thread) to
 * AGW_INBUF_CAPACITY and lets this thread's plain connections read into such a buffer (above). Call
 * once on a worker's thread before it accepts a connection; buffers allocated before keep their
 * size. */
void agw_inbuf_thread_init(void);

/* Declares that the next read started on stream on this thread is h2o's on a connection it has
 * just made from it (accept.c, around h2o_accept); NULL ends the declaration. Until the thread has
 * learnt h2o's callback, that read teaches it (above). */
void agw_inbuf_expect(const uv_stream_t *stream);

/* The read callback uv_read_start should give libuv for stream instead of cb: the small buffer's
 * when cb is h2o's plain connection callback on a thread that called agw_inbuf_thread_init, else
 * cb. Called by read_pause.c's uv_read_start for every start. */
uv_alloc_cb agw_inbuf_alloc_cb(const uv_stream_t *stream, uv_alloc_cb cb);

/* 1 when this thread has learnt h2o's plain connection callback (its reads use the small buffer),
 * 0 otherwise. For tests and the start-up check. */
int agw_inbuf_learnt(void);

#endif
