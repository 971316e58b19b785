/* khash.h: the part of klib's khash.h that h2o's <h2o/http2_internal.h> needs to be included.
 *
 * Debian's libh2o-dev ships include/h2o/http2_internal.h, which declares h2o's HTTP/2 connection
 * (struct st_h2o_http2_conn_t), but not the khash.h it includes. The guard (guard.c) uses a few
 * fields of that connection, so it includes the real declaration rather than a copy of its
 * layout: the compiler then places every field as the installed libh2o does, and a libh2o whose
 * header changes a field the guard uses fails the build instead of misreading memory.
 *
 * Of khash the header needs the map's type (the connection holds a pointer to the stream map,
 * khash_t(h2o_http2_stream_t) *), whose layout is declared below; the one inline function that
 * looks a stream up (h2o_http2_conn_get_stream) is never called by the gateway, and its lookup
 * macros below only evaluate to something of the right type.
 *
 * This folder is on the include path of guard.c only (CMakeLists.txt).
 */
#ifndef AGW_GUARD_KHASH_SHIM_H
#define AGW_GUARD_KHASH_SHIM_H

typedef unsigned int khiter_t;

#include <stdint.h>

#define khash_t(name) kh_##name##_t
/* The map as klib's khash.h 0.2.8 (the one h2o 2.2.5 bundles, deps/klib) lays it out: the guard
 * walks a connection's streams once a second to find a request that is arriving too slowly
 * (guard.c, oldest_receiving_ms), and checks each entry it reads (its key is its stream's id). */
#define KHASH_MAP_INIT_INT64(name, khval_t)                                                                     \
    typedef struct kh_##name##_s {                                                                              \
        uint32_t n_buckets, size, n_occupied, upper_bound;                                                      \
        uint32_t *flags;                                                                                        \
        uint64_t *keys;                                                                                         \
        khval_t *vals;                                                                                          \
    } kh_##name##_t;
/* Whether bucket i of map h holds an entry (klib: two flag bits a bucket, neither empty nor
 * deleted). */
#define agw_kh_occupied(h, i) (((((h)->flags[(i) >> 4] >> (((i)&0xfU) << 1)) & 3)) == 0)

/* only in h2o_http2_conn_get_stream, an inline definition the gateway never calls (C99 6.7.4:
 * no code is emitted for it); each evaluates to something of the right type */
#define kh_get(name, h, k) ((void)(h), (void)(k), (khiter_t)0)
#define kh_end(h) ((void)(h), (khiter_t)0)
#define kh_val(h, x) ((void)(h), (void)(x), (h2o_http2_stream_t *)0)

#endif
