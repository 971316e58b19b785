/* upstream/tls.h: the TLS half of the upstream client (internal to upstream.c).
 *
 * OpenSSL does the handshake, the record layer, chain verification and the name check; this
 * module only sets it up (one SSL_CTX per upstream, one SSL per connection) and turns OpenSSL's
 * return codes into what the client's loop needs: "wait for readable", "wait for writable",
 * "closed", "failed because …". Nothing here blocks: the sockets are non-blocking and every
 * SSL_* call returns at once.
 */
#ifndef AGW_UPSTREAM_TLS_H
#define AGW_UPSTREAM_TLS_H

#include "upstream/upstream.h"

#include <openssl/ssl.h>
#include <stddef.h>

/* What an SSL_connect / SSL_read / SSL_write that did not succeed means for the connection. */
typedef enum agw_tls_status {
    AGW_TLS_WANT_READ,   /* call again when the socket is readable */
    AGW_TLS_WANT_WRITE,  /* call again when the socket is writable */
    AGW_TLS_CLOSED,      /* the upstream sent close_notify: a clean end of the stream */
    AGW_TLS_EOF,         /* the TCP connection ended without close_notify */
    AGW_TLS_RESET,       /* the socket failed (ECONNRESET, EPIPE, …) */
    AGW_TLS_FAILED,      /* a TLS protocol or certificate failure */
} agw_tls_status_t;

/* A new client SSL for fd over tls->ctx: SNI and the name or IP to verify set from
 * tls->server_name, session offered for resumption when not NULL. New sessions the upstream
 * issues on it are stored into *session_slot (the previous one freed): the pool's cache of one.
 * Returns NULL when OpenSSL cannot allocate. The caller frees it with SSL_free (no shutdown). */
SSL *agw_tls_conn_new(const agw_upstream_tls_t *tls, int fd, SSL_SESSION *session,
                      SSL_SESSION **session_slot);

/* Classifies ret, the result <= 0 of an SSL call on ssl; call right after it, on the same thread
 * (OpenSSL's error queue is per thread). Callers clear the queue (ERR_clear_error) before the SSL
 * call. */
agw_tls_status_t agw_tls_status(SSL *ssl, int ret);

/* Describes the failure just classified into out (cap bytes): OpenSSL's reason, and for a
 * certificate the verification error ("certificate verify failed: self-signed certificate in
 * certificate chain"). Clears the thread's error queue. */
void agw_tls_describe(SSL *ssl, agw_tls_status_t st, char *out, size_t cap);

#endif
