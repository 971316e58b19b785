/* upstream/phr.h: picohttpparser, as libh2o 2.2 compiles it in and exports it.
 *
 * libh2o (Debian's libh2o0.13, h2o 2.2.5) links picohttpparser (deps/picohttpparser of h2o 2.2.5)
 * and exports its functions from libh2o.so, but installs no header for them; these are its
 * declarations, unchanged in names, arguments and struct layout, so that the upstream client
 * (upstream/http1.c) uses the library's parser rather than a copy of it. The declarations hold
 * for h2o 2.2 only: a later picohttpparser grew struct phr_chunked_decoder (which the caller
 * allocates), so building against another h2o stops here instead of corrupting memory at run
 * time. Semantics (h2o 2.2.5's copy): phr_parse_headers accepts bare LF line ends, keeps a
 * value's trailing spaces, rejects control characters but HTAB in values and non-token bytes in
 * names (a space before the colon included), and returns an obs-fold line as a header with a
 * NULL name; phr_decode_chunked ignores chunk extensions up to the LF and, with consume_trailer
 * 0, stops right after the last chunk's line, before any trailer field.
 */
#ifndef AGW_UPSTREAM_PHR_H
#define AGW_UPSTREAM_PHR_H

#include <h2o/version.h>
#include <stddef.h>
#include <sys/types.h>

#if H2O_VERSION_MAJOR != 2 || H2O_VERSION_MINOR != 2
#error "upstream/phr.h declares the picohttpparser of h2o 2.2: check its ABI against this libh2o"
#endif

/* A header field: name and value point into the parsed buffer; name is NULL for a continuation
 * line (obs-fold) of the field before. */
struct phr_header {
    const char *name;
    size_t name_len;
    const char *value;
    size_t value_len;
};

/* Parses header fields up to and including the empty line that ends them from buf (len bytes).
 * *num_headers: in, the room in headers; out, the fields parsed. last_len: how many of these
 * bytes an earlier call already saw incomplete (0 the first time), so that only the new ones are
 * scanned for the end. Returns the bytes of the header section, -2 when it is incomplete, -1 when
 * it is malformed or has more fields than headers has room for. */
int phr_parse_headers(const char *buf, size_t len, struct phr_header *headers, size_t *num_headers, size_t last_len);

/* State of a chunked body's decoding: zero-filled before the first call. */
struct phr_chunked_decoder {
    size_t bytes_left_in_chunk; /* data bytes still to come in the current chunk */
    char consume_trailer;       /* 1: also skip the trailer section; 0: stop before it */
    char _hex_count;
    char _state;
};

/* Decodes chunked bytes in place: buf (*bufsz bytes) is rewritten to hold the data of the chunks
 * it has, and *bufsz set to their length. Returns -2 when more bytes are needed, -1 on a
 * malformed chunk (a size that is not hex or over 16 hex digits, no LF after the data), or, once
 * the last chunk (size 0) is read, the number of bytes after it left undecoded at the tail of buf
 * (moved to buf + *bufsz). */
ssize_t phr_decode_chunked(struct phr_chunked_decoder *decoder, char *buf, size_t *bufsz);

/* 1 when the decoder is inside a chunk's data (bytes_left_in_chunk of it still to come). */
int phr_decode_chunked_is_in_data(struct phr_chunked_decoder *decoder);

#endif
