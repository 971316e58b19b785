/* h2_head.h: an HTTP/2 response head's Server-Timing sent without indexing (RFC 7541 §6.2.2).
 *
 * h2o 2.2.5's HPACK encoder (lib/http2/hpack.c, encode_header) adds every header field whose value
 * it has not sent before to the connection's dynamic table, unless the name is one of its tokens
 * marked not to compress. A page's Server-Timing differs on every response (each section's
 * duration), and its name is no token: each response added it, evicting an older entry (two
 * frees, two allocations, its value Huffman-coded), and the table filled with Server-Timing values
 * no later response matched, which every other field of every response was compared against
 * (32 entries at most): about 2,000 instructions a page over h2c (docs/performance.md, "A
 * twenty-third pass").
 *
 * h2_head.c defines h2o_hpack_flatten_response in the executable. libh2o calls it through its PLT
 * (lib/http2 writes every response's HEADERS frame with it), so the dynamic linker binds that call
 * here, as read_pause.h's for libuv's functions. When the response has Server-Timing fields and
 * the head, with them, fits one frame whatever h2o's encoder makes of it (an upper bound of its
 * output, counted as h2o reserves room for it), the fields are taken out of the response's
 * headers for h2o's call (libh2o's own function, dlsym RTLD_NEXT), put back after it, and
 * appended to the HEADERS frame h2o wrote as literal fields without indexing, name and value
 * as they are (no Huffman code): the frame's length is the only byte of h2o's that changes, and
 * the dynamic table is left as h2o keeps it. (Should h2o's frames not be one, against the bound,
 * the literals go in a CONTINUATION frame of their own after them.) Any other response is h2o's
 * alone (its Server-Timing then indexed as before). Fields are sent in any order (RFC 9110 §5.3:
 * only fields of one name keep theirs, and these stay in theirs). test_h2_head holds the bytes,
 * and the integration tests read every HTTP/2 response with curl, nghttp and h2load. */
#ifndef AGW_FRONT_H2_HEAD_H
#define AGW_FRONT_H2_HEAD_H

#include <h2o.h>
#include <stddef.h>
#include <stdint.h>

/* 1 when libh2o's calls of h2o_hpack_flatten_response come here and libh2o's own was found, 0 when
 * they go to libh2o's (the executable does not export it: every head is then h2o's alone), -1 when
 * they come here and libh2o's own was not found (every HTTP/2 response would fail: the server
 * refuses to start). main calls it once at start, which also makes the linker take this file from
 * the core library. */
int agw_h2_head_active(void);

/* The bytes of a literal header field without indexing, new name (RFC 7541 §6.2.2, strings
 * without Huffman code, lengths as §5.1 integers with a 7-bit prefix), for name and value, written
 * at out when out is not NULL. Returns their count either way. */
size_t agw_h2_head_literal(unsigned char *out, const char *name, size_t name_len, const char *value,
                           size_t value_len);

/* Appends fields[0..n) (lit: their literals' bytes, agw_h2_head_literal) to the header block h2o
 * wrote into *buf from offset start for stream_id: into its HEADERS frame, whose length grows,
 * when it is one frame with room for them under max_frame_size; else as a CONTINUATION frame of
 * their own after its last frame, which then no longer ends the block (lit must be at most
 * max_frame_size). Returns 0 (in the frame), 1 (in a CONTINUATION frame) or -1 (no memory for them:
 * the block is h2o's as it was). */
int agw_h2_head_append(h2o_buffer_t **buf, size_t start, uint32_t stream_id, size_t max_frame_size,
                       const h2o_header_t *fields, size_t n, size_t lit);

#endif
