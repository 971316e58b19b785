/* tls.h: the TLS half of the upstream client.
 *
 * Two parts. The settings of an https:// upstream and the SSL_CTX built from them at load time
 * (agw_upstream_tls_t, agw_upstream_tls_init/free: used by script/config.c). The connection
 * helpers (agw_tls_conn_new, agw_tls_status, agw_tls_describe), which only conn.c calls.
 *
 * OpenSSL does the handshake, the record layer, chain verification and the name check; this
 * module only sets it up (one SSL_CTX per upstream, one SSL per connection) and turns OpenSSL's
 * return codes into what the client's loop needs: "wait for readable", "wait for writable",
 * "closed", "failed because …". Nothing here blocks: the sockets are non-blocking and every
 * SSL_* call returns at once.
 */
#ifndef AGW_UPSTREAM_TLS_H
#define AGW_UPSTREAM_TLS_H

#include <openssl/ssl.h>
#include <stddef.h>

/* TLS settings of an https:// upstream (gateway.lua `tls = { … }`), and the SSL_CTX built from them
 * by agw_upstream_tls_init() before any worker starts; the SSL_CTX is then only read (SSL_new) by
 * the workers, which OpenSSL allows from several threads. */
typedef struct agw_upstream_tls {
    const char *ca_file;            /* PEM bundle of trusted CAs; NULL: the system trust store */
    const char *server_name;        /* sent as SNI (unless it is an IP address, RFC 6066 §3) and
                                       checked against the certificate's names (RFC 6125) or IP
                                       addresses; the URL host by default */
    int verify;                     /* 1: verify the chain and the name (default); 0: accept any
                                       certificate (the loader logs a warning) */
    struct ssl_ctx_st *ctx;         /* built by agw_upstream_tls_init, freed by
                                       agw_upstream_tls_free */
    int name_is_ip;                 /* set by agw_upstream_tls_init: server_name is an IP
                                       address (no SNI; the certificate's IP SANs are checked) */
} agw_upstream_tls_t;

/* Builds tls->ctx: TLS 1.2 at least, ALPN "http/1.1", the CAs of tls->ca_file (or the system trust
 * store), SSL_VERIFY_PEER unless tls->verify is 0, and a client session cache of one session per
 * pool (agw_pool_t keeps the last session it was given and offers it on its next connection, so
 * reconnects resume instead of running a full handshake). Returns 0, or -1 with a message naming
 * the cause ("cannot load CA file x.pem: no certificate found") in err (cap bytes). Call before
 * the workers start. */
int agw_upstream_tls_init(agw_upstream_tls_t *tls, char *err, size_t cap);

/* Frees tls->ctx (connections still open keep their own reference to it). The strings belong to
 * the caller. */
void agw_upstream_tls_free(agw_upstream_tls_t *tls);


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
