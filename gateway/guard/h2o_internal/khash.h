/* khash.h: the part of klib's khash.h that h2o's <h2o/http2_internal.h> needs to be included.
 *
 * Debian's libh2o-dev ships include/h2o/http2_internal.h, which declares h2o's HTTP/2 connection
 * (struct st_h2o_http2_conn_t), but not the khash.h it includes. The guard (guard.c) uses a few
 * fields of that connection, so it includes the real declaration rather than a copy of its
 * layout: the compiler then places every field as the installed libh2o does, and a libh2o whose
 * header changes a field the guard uses fails the build instead of misreading memory.
 *
 * Of khash the header needs only names: the connection holds a pointer to the stream map
 * (khash_t(h2o_http2_stream_t) *), so the map's own layout never matters, and the one inline
 * function that walks the map (h2o_http2_conn_get_stream) is never called by the gateway. The
 * walking macros below therefore refuse to compile if it ever is.
 *
 * This folder is on the include path of guard.c only (CMakeLists.txt).
 */
#ifndef AGW_GUARD_KHASH_SHIM_H
#define AGW_GUARD_KHASH_SHIM_H

typedef unsigned int khiter_t;

#define khash_t(name) kh_##name##_t
#define KHASH_MAP_INIT_INT64(name, khval_t) typedef struct kh_##name##_s kh_##name##_t;

/* only in h2o_http2_conn_get_stream, an inline definition the gateway never calls (C99 6.7.4:
 * no code is emitted for it); each evaluates to something of the right type */
#define kh_get(name, h, k) ((void)(h), (void)(k), (khiter_t)0)
#define kh_end(h) ((void)(h), (khiter_t)0)
#define kh_val(h, x) ((void)(h), (void)(x), (h2o_http2_stream_t *)0)

#endif
