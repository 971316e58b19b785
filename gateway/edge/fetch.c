/* fetch.c: a blocking HTTP/1.1 GET (see fetch.h). */
#include "fetch.h"
#include "base/mem.h"
#include "upstream/http1.h"

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

int agw_fetch_url_parse(const char *url, agw_fetch_url_t *out, char *why, size_t whylen)
{
    memset(out, 0, sizeof(*out));
    const char *rest;
    if (strncmp(url, "http://", 7) == 0) {
        rest = url + 7;
    } else if (strncmp(url, "https://", 8) == 0) {
        rest = url + 8;
        out->tls = 1;
    } else {
        snprintf(why, whylen, "'%s' must start with http:// or https://", url);
        return -1;
    }
    const char *slash = strchr(rest, '/');
    size_t hplen = slash ? (size_t)(slash - rest) : strlen(rest);
    const char *colon = memchr(rest, ':', hplen);
    size_t hlen = colon ? (size_t)(colon - rest) : hplen;
    if (hlen == 0) {
        snprintf(why, whylen, "'%s' has no host", url);
        return -1;
    }
    out->port = out->tls ? 443 : 80;
    if (colon) {
        char *end;
        long p = strtol(colon + 1, &end, 10);
        if (end != rest + hplen || p < 1 || p > 65535) {
            snprintf(why, whylen, "'%s': bad port", url);
            return -1;
        }
        out->port = (int)p;
    }
    out->host = agw_malloc(hlen + 1);
    memcpy(out->host, rest, hlen);
    out->host[hlen] = '\0';
    out->path = agw_strdup(slash ? slash : "/");
    return 0;
}

void agw_fetch_url_free(agw_fetch_url_t *u)
{
    free(u->host);
    free(u->path);
    memset(u, 0, sizeof(*u));
}

/* Connects to host:port within timeout_ms; the socket is blocking with read/write timeouts. */
static int dial(const agw_fetch_url_t *u, uint64_t timeout_ms, char *why, size_t whylen)
{
    struct addrinfo hints = {0}, *res = NULL;
    hints.ai_socktype = SOCK_STREAM;
    char port[16];
    snprintf(port, sizeof(port), "%d", u->port);
    int rc = getaddrinfo(u->host, port, &hints, &res);
    if (rc != 0) {
        snprintf(why, whylen, "cannot resolve %s: %s", u->host, gai_strerror(rc));
        return -1;
    }
    int fd = socket(res->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) {
        snprintf(why, whylen, "socket: %s", strerror(errno));
        freeaddrinfo(res);
        return -1;
    }
    rc = connect(fd, res->ai_addr, res->ai_addrlen);
    freeaddrinfo(res);
    if (rc != 0 && errno == EINPROGRESS) {
        struct pollfd p = {.fd = fd, .events = POLLOUT};
        int err = 0;
        socklen_t elen = sizeof(err);
        rc = poll(&p, 1, (int)timeout_ms);
        if (rc == 0)
            errno = ETIMEDOUT;
        else if (rc > 0 && getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &elen) == 0)
            errno = err;
        rc = (rc > 0 && err == 0) ? 0 : -1;
    }
    if (rc != 0) {
        snprintf(why, whylen, "cannot connect to %s:%d: %s", u->host, u->port, strerror(errno));
        close(fd);
        return -1;
    }
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
    struct timeval tv = {.tv_sec = (time_t)(timeout_ms / 1000), .tv_usec = (suseconds_t)(timeout_ms % 1000) * 1000};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
    return fd;
}

/* The max-age of a Cache-Control value (the last one it names), 0 when it names none. */
static uint64_t max_age_of(const char *value, size_t len)
{
    char v[256];
    snprintf(v, sizeof(v), "%.*s", (int)(len < 255 ? len : 255), value);
    for (char *c = v; *c; c++)
        *c = (char)(*c >= 'A' && *c <= 'Z' ? *c + 32 : *c);
    char *m = strstr(v, "max-age=");
    return m ? strtoull(m + 8, NULL, 10) : 0;
}

int agw_fetch_get(const agw_fetch_url_t *u, uint64_t timeout_ms, size_t max_bytes, agw_buf_t *body,
                  uint64_t *max_age_s, char *why, size_t whylen)
{
    *max_age_s = 0;
    int fd = dial(u, timeout_ms, why, whylen);
    if (fd < 0)
        return -1;
    SSL_CTX *ctx = NULL;
    SSL *ssl = NULL;
    agw_h1_response_t resp = {0}; /* (freed at out: whatever path got there) */
    int rc = -1;
    if (u->tls) {
        ctx = SSL_CTX_new(TLS_client_method());
        if (ctx == NULL || SSL_CTX_set_default_verify_paths(ctx) != 1 || (ssl = SSL_new(ctx)) == NULL) {
            snprintf(why, whylen, "cannot set up TLS");
            goto out;
        }
        SSL_set_verify(ssl, SSL_VERIFY_PEER, NULL);
        SSL_set_tlsext_host_name(ssl, u->host);
        SSL_set1_host(ssl, u->host);
        SSL_set_fd(ssl, fd);
        if (SSL_connect(ssl) != 1) {
            long v = SSL_get_verify_result(ssl);
            snprintf(why, whylen, "TLS with %s:%d failed: %s", u->host, u->port,
                     v != X509_V_OK ? X509_verify_cert_error_string(v) : "handshake");
            goto out;
        }
    }
    char req[2048];
    int n = snprintf(req, sizeof(req), "GET %s HTTP/1.1\r\nHost: %s:%d\r\nAccept: application/json\r\n"
                     "User-Agent: aggway\r\nConnection: close\r\n\r\n", u->path, u->host, u->port);
    if (n <= 0 || (size_t)n >= sizeof(req)) {
        snprintf(why, whylen, "the URL is too long");
        goto out;
    }
    ssize_t w = ssl ? SSL_write(ssl, req, n) : send(fd, req, (size_t)n, MSG_NOSIGNAL);
    if (w != n) {
        snprintf(why, whylen, "cannot send the request to %s:%d", u->host, u->port);
        goto out;
    }
    /* the upstream client's HTTP/1.1 response reader (upstream/http1.h): the same framing rules */
    agw_h1_response_start(&resp, 0, max_bytes);
    char buf[16384];
    while (!resp.done) {
        ssize_t r = ssl ? SSL_read(ssl, buf, sizeof(buf)) : recv(fd, buf, sizeof(buf), 0);
        if (r < 0) {
            snprintf(why, whylen, "reading from %s:%d: %s", u->host, u->port,
                     errno == EAGAIN || errno == EWOULDBLOCK ? "timed out" : "failed");
            goto out;
        }
        if (r > 0)
            agw_h1_response_feed(&resp, buf, (size_t)r);
        else
            agw_h1_response_eof(&resp);
        agw_call_outcome_t failed = agw_h1_response_failed(&resp);
        if (failed == AGW_CALL_TOO_LARGE) {
            snprintf(why, whylen, "the answer is larger than %zu bytes", max_bytes);
            goto out;
        }
        if (failed != AGW_CALL_OK) {
            char cause[160];
            agw_h1_response_describe(&resp, cause, sizeof(cause));
            snprintf(why, whylen, "malformed answer: %s", cause);
            goto out;
        }
        if (r == 0 && !resp.done) {
            snprintf(why, whylen, "the connection closed before the answer was complete");
            goto out;
        }
    }
    if (resp.status != 200) {
        snprintf(why, whylen, "status %u", resp.status);
        goto out;
    }
    for (size_t i = 0; i < resp.nheaders; i++) {
        const agw_h1_hdr_t *h = &resp.hdrs[i];
        if (h->name_len == 13 && strncasecmp(resp.hstore.base + h->name_off, "cache-control", 13) == 0)
            *max_age_s = max_age_of(resp.hstore.base + h->value_off, h->value_len);
    }
    agw_buf_append(body, resp.body.base, resp.body.len);
    rc = 0;
out:
    agw_h1_response_free(&resp);
    if (ssl) {
        SSL_shutdown(ssl);
        SSL_free(ssl);
    }
    SSL_CTX_free(ctx);
    close(fd);
    return rc;
}
