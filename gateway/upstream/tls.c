/* upstream/tls.c: TLS set-up and OpenSSL result codes for the upstream client (see
 * tls.h). */
#include "upstream/tls.h"

#include <arpa/inet.h>
#include <errno.h>
#include <openssl/err.h>
#include <openssl/x509v3.h>
#include <stdio.h>
#include <string.h>

/* The client session cache of one per pool: every SSL carries the address of its pool's slot as
 * app data, and the newest resumable session the upstream issues replaces the slot's content. A
 * TLS 1.3 upstream sends its tickets after the handshake; they are read with the response. */
static int on_new_session(SSL *ssl, SSL_SESSION *sess)
{
    SSL_SESSION **slot = SSL_get_app_data(ssl);
    if (slot == NULL || !SSL_SESSION_is_resumable(sess))
        return 0;
    if (*slot)
        SSL_SESSION_free(*slot);
    *slot = sess;
    return 1; /* the slot keeps this reference */
}

static int is_ip_address(const char *s)
{
    unsigned char buf[sizeof(struct in6_addr)];
    return inet_pton(AF_INET, s, buf) == 1 || inet_pton(AF_INET6, s, buf) == 1;
}

/* OpenSSL's reason for the oldest error in the queue, or NULL when it is empty. */
static const char *queued_reason(void)
{
    unsigned long e = ERR_peek_error();
    if (e == 0)
        return NULL;
    const char *r = ERR_reason_error_string(e);
    return r ? r : "unknown OpenSSL error";
}

int agw_upstream_tls_init(agw_upstream_tls_t *tls, char *err, size_t cap)
{
    ERR_clear_error();
    SSL_CTX *ctx = SSL_CTX_new(TLS_client_method());
    if (ctx == NULL) {
        snprintf(err, cap, "cannot create a TLS context: %s", queued_reason());
        ERR_clear_error();
        return -1;
    }
    static const unsigned char alpn[] = "\x08http/1.1";
    SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
    SSL_CTX_set_alpn_protos(ctx, alpn, sizeof(alpn) - 1);
    SSL_CTX_set_session_cache_mode(ctx, SSL_SESS_CACHE_CLIENT | SSL_SESS_CACHE_NO_INTERNAL_STORE);
    SSL_CTX_sess_set_new_cb(ctx, on_new_session);
    tls->name_is_ip = tls->server_name && is_ip_address(tls->server_name);
    if (tls->verify) {
        int ok = tls->ca_file ? SSL_CTX_load_verify_locations(ctx, tls->ca_file, NULL)
                              : SSL_CTX_set_default_verify_paths(ctx);
        if (ok != 1) {
            if (tls->ca_file)
                snprintf(err, cap, "cannot load CA file %s: %s", tls->ca_file,
                         queued_reason() ? queued_reason() : "no certificate found");
            else
                snprintf(err, cap, "cannot load the system trust store: %s",
                         queued_reason() ? queued_reason() : "unknown error");
            ERR_clear_error();
            SSL_CTX_free(ctx);
            return -1;
        }
        /* the name check (RFC 6125) is OpenSSL's, inherited by every SSL made from this ctx */
        X509_VERIFY_PARAM *param = SSL_CTX_get0_param(ctx);
        X509_VERIFY_PARAM_set_hostflags(param, X509_CHECK_FLAG_NO_PARTIAL_WILDCARDS);
        if (tls->server_name == NULL ||
            (tls->name_is_ip ? X509_VERIFY_PARAM_set1_ip_asc(param, tls->server_name)
                             : X509_VERIFY_PARAM_set1_host(param, tls->server_name, 0)) != 1) {
            snprintf(err, cap, "cannot verify the server name '%s'",
                     tls->server_name ? tls->server_name : "(none)");
            ERR_clear_error();
            SSL_CTX_free(ctx);
            return -1;
        }
        SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, NULL);
    } else {
        SSL_CTX_set_verify(ctx, SSL_VERIFY_NONE, NULL);
    }
    tls->ctx = ctx;
    return 0;
}

void agw_upstream_tls_free(agw_upstream_tls_t *tls)
{
    if (tls && tls->ctx) {
        SSL_CTX_free(tls->ctx);
        tls->ctx = NULL;
    }
}

SSL *agw_tls_conn_new(const agw_upstream_tls_t *tls, int fd, SSL_SESSION *session,
                      SSL_SESSION **session_slot)
{
    SSL *ssl = SSL_new(tls->ctx);
    if (ssl == NULL)
        return NULL;
    if (SSL_set_fd(ssl, fd) != 1 ||
        (!tls->name_is_ip && tls->server_name &&
         SSL_set_tlsext_host_name(ssl, tls->server_name) != 1) ||
        (session && SSL_set_session(ssl, session) != 1)) {
        SSL_free(ssl);
        ERR_clear_error();
        return NULL;
    }
    SSL_set_app_data(ssl, session_slot);
    SSL_set_connect_state(ssl);
    return ssl;
}

agw_tls_status_t agw_tls_status(SSL *ssl, int ret)
{
    int saved = errno;
    switch (SSL_get_error(ssl, ret)) {
    case SSL_ERROR_WANT_READ:
        return AGW_TLS_WANT_READ;
    case SSL_ERROR_WANT_WRITE:
        return AGW_TLS_WANT_WRITE;
    case SSL_ERROR_ZERO_RETURN:
        return AGW_TLS_CLOSED;
    case SSL_ERROR_SYSCALL:
        /* OpenSSL 1.1 reports an EOF without close_notify this way, with no errno */
        if (ERR_peek_error() == 0 && (ret == 0 || saved == 0))
            return AGW_TLS_EOF;
        return ERR_peek_error() == 0 ? AGW_TLS_RESET : AGW_TLS_FAILED;
    case SSL_ERROR_SSL:
#ifdef SSL_R_UNEXPECTED_EOF_WHILE_READING
        if (ERR_GET_REASON(ERR_peek_error()) == SSL_R_UNEXPECTED_EOF_WHILE_READING)
            return AGW_TLS_EOF;
#endif
        return AGW_TLS_FAILED;
    default:
        return AGW_TLS_FAILED;
    }
}

void agw_tls_describe(SSL *ssl, agw_tls_status_t st, char *out, size_t cap)
{
    int saved = errno;
    long vr = SSL_get_verify_result(ssl);
    const char *reason = queued_reason();
    switch (st) {
    case AGW_TLS_EOF:
        snprintf(out, cap, "connection closed by the upstream without a TLS close_notify");
        break;
    case AGW_TLS_CLOSED:
        snprintf(out, cap, "TLS connection closed by the upstream (close_notify)");
        break;
    case AGW_TLS_RESET:
        snprintf(out, cap, "%s", saved == ECONNRESET ? "connection reset by the upstream" : strerror(saved));
        break;
    default:
        if (vr != X509_V_OK) {
            snprintf(out, cap, "certificate verify failed: %s", X509_verify_cert_error_string(vr));
        } else {
            int r = reason ? ERR_GET_REASON(ERR_peek_error()) : 0;
            int plain = r == SSL_R_WRONG_VERSION_NUMBER || r == SSL_R_PACKET_LENGTH_TOO_LONG ||
                        r == SSL_R_HTTP_REQUEST || r == SSL_R_RECORD_LENGTH_MISMATCH;
            snprintf(out, cap, "%s%s", reason ? reason : "TLS protocol error",
                     plain ? " (the upstream does not seem to speak TLS: check the url's scheme)" : "");
        }
        break;
    }
    ERR_clear_error();
}
