/* listen_tls.h: the TLS half of the listeners (gateway.lua `listen = { { port, tls = { cert, key } } }`).
 *
 * Each load of the scripts folder (start-up, `aggway check`, every SIGHUP reload) reads a TLS
 * listener's certificate chain and private key again and builds a new server SSL_CTX from them
 * (config.h keeps it in the listener's settings, so it belongs to the generation). Workers take
 * their own reference to the SSL_CTX of the generation they serve and give it to h2o for new
 * connections; every connection keeps a reference to the SSL_CTX it was accepted with until it
 * closes (worker/accept.c), so an SSL_CTX is freed only when no listener, generation or connection uses
 * it. SSL_CTX reference counts are atomic in OpenSSL: no lock is taken on the connection path.
 */
#ifndef AGW_LISTEN_TLS_H
#define AGW_LISTEN_TLS_H

#include <openssl/ssl.h>
#include <stddef.h>

/* Which file a failed agw_listen_tls_new could not use. */
typedef enum agw_listen_tls_file {
    AGW_LISTEN_TLS_CERT, /* the certificate chain: unreadable, not PEM, no certificate in it */
    AGW_LISTEN_TLS_KEY,  /* the private key: unreadable, not PEM, encrypted, or not the certificate's */
} agw_listen_tls_file_t;

/* The TLS 1.2 cipher suites a listener accepts: Mozilla's "intermediate" server profile (v5.7)
 * without its DHE suites (no DH parameters are configured, so OpenSSL would not offer them
 * anyway): ECDHE key exchange, AEAD encryption only (AES-GCM, ChaCha20-Poly1305). No CBC suite,
 * so no LUCKY13-style padding oracle; TLS 1.3 keeps OpenSSL's defaults, all AEAD. */
#define AGW_LISTEN_TLS12_CIPHERS                                                                                      \
    "ECDHE-ECDSA-AES128-GCM-SHA256:ECDHE-RSA-AES128-GCM-SHA256:ECDHE-ECDSA-AES256-GCM-SHA384:"                        \
    "ECDHE-RSA-AES256-GCM-SHA384:ECDHE-ECDSA-CHACHA20-POLY1305:ECDHE-RSA-CHACHA20-POLY1305"

/* Builds the server SSL_CTX of a TLS listener: TLS 1.2 at least, no compression, the server's
 * cipher preference among AGW_LISTEN_TLS12_CIPHERS (TLS 1.2) and OpenSSL's TLS 1.3 suites, ALPN h2 then http/1.1 (h2o's list), the PEM certificate chain of cert_file
 * (the leaf first) and the PEM private key of key_file, which must be the certificate's. The
 * files are read now (paths as given: relative ones to the current directory). A key protected
 * by a passphrase is refused (nothing is asked on the terminal). Returns the SSL_CTX with one
 * reference for the caller (SSL_CTX_free), or NULL with *bad saying which file failed and why
 * (cap bytes, NUL-terminated) naming that file and OpenSSL's reason, e.g. "cannot load the
 * certificate chain tls/cert.pem: no start line" or "the private key tls/key.pem does not match
 * the certificate tls/cert.pem". Leaves the thread's OpenSSL error queue empty. Any thread. */
SSL_CTX *agw_listen_tls_new(const char *cert_file, const char *key_file, agw_listen_tls_file_t *bad, char *why,
                            size_t cap);

/* Describes the leaf certificate of ctx for the log into out (cap bytes, NUL-terminated):
 * "subject CN=api.example, expires Jan  2 10:00:00 2027 GMT". */
void agw_listen_tls_describe(SSL_CTX *ctx, char *out, size_t cap);

/* What is wrong now with the validity period of ctx's leaf certificate: "" when it is valid (or
 * there is none), else "; it has EXPIRED: …" or "; it is NOT VALID YET: …" (a static string, to
 * follow the description). A listener serves it all the same; serve, a reload and check say so. */
const char *agw_listen_tls_validity(SSL_CTX *ctx);

#endif
