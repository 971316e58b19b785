/* listen_tls.c: server TLS contexts of the listeners (see listen_tls.h). */
#include "script/listen_tls.h"

#include <h2o.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "base/file.h"

/* OpenSSL's reason for the oldest error in the queue, or dflt when it is empty. */
static const char *queued_reason(const char *dflt)
{
    unsigned long e = ERR_peek_error();
    const char *r = e ? ERR_reason_error_string(e) : NULL;
    return r ? r : dflt;
}

/* The password callback of a key read from a file: a server has no one to ask, so an encrypted
 * key is refused (OpenSSL's default would prompt on the terminal); *asked records the attempt. */
static int no_passphrase(char *buf, int size, int rwflag, void *asked)
{
    (void)buf, (void)size, (void)rwflag;
    *(int *)asked = 1;
    return 0;
}

/* 1 when path is a regular file that can be opened for reading; else 0 with why "cannot read the
 * WHAT PATH: reason" (agw_file_open_regular: a FIFO, a device or a directory is refused at once). */
static int readable(const char *what, const char *path, char *why, size_t cap)
{
    const char *reason = NULL;
    int fd = agw_file_open_regular(path, &reason);
    if (fd < 0) {
        snprintf(why, cap, "cannot read the %s %s: %s", what, path, reason);
        return 0;
    }
    close(fd);
    return 1;
}

/* The private key of key_file, or NULL with why. */
static EVP_PKEY *read_key(const char *key_file, char *why, size_t cap)
{
    if (!readable("private key", key_file, why, cap))
        return NULL;
    BIO *bio = BIO_new_file(key_file, "r");
    int asked = 0;
    EVP_PKEY *pkey = bio ? PEM_read_bio_PrivateKey(bio, NULL, no_passphrase, &asked) : NULL;
    BIO_free(bio);
    if (pkey == NULL && asked)
        snprintf(why, cap, "the private key %s is protected by a passphrase, which the gateway cannot ask for; "
                 "store it without one (openssl pkey -in KEY -out KEY)", key_file);
    else if (pkey == NULL)
        snprintf(why, cap, "cannot load the private key %s: not a PEM private key OpenSSL can read (%s)", key_file,
                 queued_reason("none found"));
    return pkey;
}

SSL_CTX *agw_listen_tls_new(const char *cert_file, const char *key_file, agw_listen_tls_file_t *bad, char *why,
                            size_t cap)
{
    ERR_clear_error();
    SSL_CTX *ctx = SSL_CTX_new(TLS_server_method());
    EVP_PKEY *pkey = NULL;
    *bad = AGW_LISTEN_TLS_CERT;
    if (ctx == NULL) {
        snprintf(why, cap, "cannot create a TLS context: %s", queued_reason("out of memory"));
        goto fail;
    }
    SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
    SSL_CTX_set_options(ctx, SSL_OP_NO_COMPRESSION | SSL_OP_CIPHER_SERVER_PREFERENCE);
    /* TLS 1.2: AEAD suites with forward secrecy only (no CBC: LUCKY13 and its kin); TLS 1.3's
     * suites are all AEAD and keep OpenSSL's defaults */
    if (SSL_CTX_set_cipher_list(ctx, AGW_LISTEN_TLS12_CIPHERS) != 1) {
        snprintf(why, cap, "cannot set the TLS 1.2 cipher suites: %s", queued_reason("none available"));
        goto fail;
    }
    if (!readable("certificate chain", cert_file, why, cap))
        goto fail;
    if (SSL_CTX_use_certificate_chain_file(ctx, cert_file) != 1) {
        snprintf(why, cap, "cannot load the certificate chain %s: %s", cert_file,
                 queued_reason("no PEM certificate in it"));
        goto fail;
    }
    *bad = AGW_LISTEN_TLS_KEY;
    if ((pkey = read_key(key_file, why, cap)) == NULL)
        goto fail;
    if (X509_check_private_key(SSL_CTX_get0_certificate(ctx), pkey) != 1) {
        snprintf(why, cap, "the private key %s does not match the certificate %s", key_file, cert_file);
        goto fail;
    }
    if (SSL_CTX_use_PrivateKey(ctx, pkey) != 1) {
        snprintf(why, cap, "cannot use the private key %s: %s", key_file, queued_reason("unknown OpenSSL error"));
        goto fail;
    }
    EVP_PKEY_free(pkey);
    h2o_ssl_register_alpn_protocols(ctx, h2o_http2_alpn_protocols);
    return ctx;
fail:
    EVP_PKEY_free(pkey);
    SSL_CTX_free(ctx);
    ERR_clear_error();
    return NULL;
}

void agw_listen_tls_describe(SSL_CTX *ctx, char *out, size_t cap)
{
    X509 *x = ctx ? SSL_CTX_get0_certificate(ctx) : NULL;
    BIO *b = x ? BIO_new(BIO_s_mem()) : NULL;
    if (b == NULL) {
        snprintf(out, cap, "no certificate");
        return;
    }
    BIO_puts(b, "subject ");
    X509_NAME_print_ex(b, X509_get_subject_name(x), 0, XN_FLAG_RFC2253);
    BIO_puts(b, ", expires ");
    ASN1_TIME_print(b, X509_get0_notAfter(x));
    char *text;
    long len = BIO_get_mem_data(b, &text);
    snprintf(out, cap, "%.*s", (int)len, text);
    BIO_free(b);
}

const char *agw_listen_tls_validity(SSL_CTX *ctx)
{
    X509 *x = SSL_CTX_get0_certificate(ctx);
    return x == NULL                                              ? ""
           : X509_cmp_current_time(X509_get0_notAfter(x)) < 0   ? "; it has EXPIRED: clients that check certificates refuse it"
           : X509_cmp_current_time(X509_get0_notBefore(x)) > 0  ? "; it is NOT VALID YET: clients that check certificates "
                                                                  "refuse it"
                                                                : "";
}
