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
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <limits.h>
#include <stdint.h>
#include <time.h>
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
    if (memchr(rest, '@', hplen) != NULL) {
        /* (user info: never shown, the message goes to the log and the admin's reload page) */
        snprintf(why, whylen, "'%.*s…@%s': user info (user:password@) is not supported in URLs; the password is "
                 "not shown", (int)(rest - url), url, (const char *)memchr(rest, '@', hplen) + 1);
        return -1;
    }
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

static int64_t mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Waits until fd has events (POLLIN, POLLOUT) or the deadline (mono_ms) passes. Returns 1 when it
 * has them, 0 at the deadline, -1 on an error of poll. */
static int wait_fd(int fd, short events, int64_t deadline)
{
    for (;;) {
        int64_t left = deadline - mono_ms();
        if (left <= 0)
            return 0;
        struct pollfd p = {.fd = fd, .events = events};
        int rc = poll(&p, 1, left > INT_MAX ? INT_MAX : (int)left);
        if (rc > 0)
            return 1;
        if (rc < 0 && errno != EINTR)
            return -1;
    }
}

int (*agw_fetch_resolver)(const char *host, const char *port, const struct addrinfo *hints,
                          struct addrinfo **res) = getaddrinfo;

/* Lookups still running that their fetch gave up on (each until the resolver's own timeouts end
 * it): at AGW_FETCH_MAX_LOOKUPS a fetch fails at once. */
static int lookups_abandoned;

int agw_fetch_abandoned_lookups(void)
{
    return __atomic_load_n(&lookups_abandoned, __ATOMIC_RELAXED);
}

/* One host name's lookup, shared by the fetch that waits for it and the thread that runs it: the
 * last of the two to let go frees it (refs). */
typedef struct lookup {
    pthread_mutex_t mu;
    pthread_cond_t cv;     /* signalled when done */
    int refs;              /* 2: the fetch and the thread */
    int done, rc;          /* rc: the resolver's */
    int abandoned;         /* the fetch gave up on it (counted in lookups_abandoned) */
    struct addrinfo *res;  /* its answer, until the fetch takes it */
    char *host;
    char port[16];
} lookup_t;

static void lookup_drop(lookup_t *l)
{
    pthread_mutex_lock(&l->mu);
    int last = --l->refs == 0;
    pthread_mutex_unlock(&l->mu);
    if (!last)
        return;
    if (l->res != NULL)
        freeaddrinfo(l->res);
    free(l->host);
    pthread_cond_destroy(&l->cv);
    pthread_mutex_destroy(&l->mu);
    free(l);
}

static void *lookup_run(void *arg)
{
    lookup_t *l = arg;
    struct addrinfo hints = {0}, *res = NULL;
    hints.ai_socktype = SOCK_STREAM;
    int rc = agw_fetch_resolver(l->host, l->port, &hints, &res);
    pthread_mutex_lock(&l->mu);
    l->rc = rc;
    l->res = rc == 0 ? res : NULL;
    l->done = 1;
    pthread_cond_signal(&l->cv);
    int abandoned = l->abandoned;
    pthread_mutex_unlock(&l->mu);
    lookup_drop(l);
    if (abandoned) /* (once its memory is freed: a count of 0 means nothing of it is left) */
        __atomic_sub_fetch(&lookups_abandoned, 1, __ATOMIC_RELAXED);
    return NULL;
}

/* Resolves u's host by the deadline (mono_ms): getaddrinfo on a thread of its own, waited for
 * until the deadline, so that a resolver that does not answer (5 s a try by default,
 * resolv.conf(5)) cannot hold the fetch past it; a lookup given up on finishes on its thread and
 * frees itself. Returns 0 with *out (freeaddrinfo), or -1 with why. */
static int resolve(const agw_fetch_url_t *u, int64_t deadline, struct addrinfo **out, char *why, size_t whylen)
{
    if (__atomic_load_n(&lookups_abandoned, __ATOMIC_RELAXED) >= AGW_FETCH_MAX_LOOKUPS) {
        snprintf(why, whylen, "cannot resolve %s: %d earlier lookups still wait for the resolver", u->host,
                 AGW_FETCH_MAX_LOOKUPS);
        return -1;
    }
    lookup_t *l = agw_calloc(1, sizeof(*l));
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&l->cv, &ca);
    pthread_condattr_destroy(&ca);
    pthread_mutex_init(&l->mu, NULL);
    l->refs = 2;
    l->host = agw_strdup(u->host);
    snprintf(l->port, sizeof(l->port), "%d", u->port);
    pthread_attr_t ta;
    pthread_t t;
    pthread_attr_init(&ta);
    pthread_attr_setdetachstate(&ta, PTHREAD_CREATE_DETACHED);
    int err = pthread_create(&t, &ta, lookup_run, l);
    pthread_attr_destroy(&ta);
    if (err != 0) {
        l->refs = 1;
        lookup_drop(l);
        snprintf(why, whylen, "cannot resolve %s: no thread for the lookup: %s", u->host, strerror(err));
        return -1;
    }
    struct timespec at = {.tv_sec = (time_t)(deadline / 1000), .tv_nsec = (long)(deadline % 1000) * 1000000};
    pthread_mutex_lock(&l->mu);
    while (!l->done && pthread_cond_timedwait(&l->cv, &l->mu, &at) != ETIMEDOUT) {
    }
    int done = l->done, rc = l->rc;
    *out = l->res;
    l->res = NULL;
    if (!done) {
        l->abandoned = 1;
        __atomic_add_fetch(&lookups_abandoned, 1, __ATOMIC_RELAXED);
    }
    pthread_mutex_unlock(&l->mu);
    lookup_drop(l);
    if (!done) {
        snprintf(why, whylen, "cannot resolve %s: the resolver did not answer in time", u->host);
        return -1;
    }
    if (rc != 0) {
        snprintf(why, whylen, "cannot resolve %s: %s", u->host, gai_strerror(rc));
        return -1;
    }
    return 0;
}

/* Connects to host:port by the deadline. The socket stays non-blocking: every read and write waits
 * with wait_fd, against the one deadline of the whole fetch. */
static int dial(const agw_fetch_url_t *u, int64_t deadline, char *why, size_t whylen)
{
    struct addrinfo *res = NULL;
    int rc;
    if (resolve(u, deadline, &res, why, whylen) != 0)
        return -1;
    int fd = socket(res->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) {
        snprintf(why, whylen, "socket: %s", strerror(errno));
        freeaddrinfo(res);
        return -1;
    }
    rc = connect(fd, res->ai_addr, res->ai_addrlen);
    freeaddrinfo(res);
    if (rc != 0 && errno == EINPROGRESS) {
        int err = 0;
        socklen_t elen = sizeof(err);
        rc = wait_fd(fd, POLLOUT, deadline);
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
    return fd;
}

/* What an I/O step needs: the socket, its TLS session (NULL: cleartext), the deadline. */
typedef struct io {
    int fd;
    SSL *ssl;
    int64_t deadline;
} io_t;

enum { IO_FAILED = -1, IO_TIMED_OUT = -2 };

/* Waits until io's socket has events or the deadline passes. Returns 1 (try again), IO_TIMED_OUT
 * or IO_FAILED. */
static int io_wait(const io_t *io, short events)
{
    int w = wait_fd(io->fd, events, io->deadline);
    return w > 0 ? 1 : w == 0 ? IO_TIMED_OUT : IO_FAILED;
}

/* Waits for what a TLS call that returned r asks for (SSL_get_error: WANT_READ or WANT_WRITE).
 * Returns 1 to call it again, IO_TIMED_OUT, or IO_FAILED (any other error). */
static int tls_wait(const io_t *io, int r)
{
    int e = SSL_get_error(io->ssl, r);
    short ev = e == SSL_ERROR_WANT_READ ? POLLIN : e == SSL_ERROR_WANT_WRITE ? POLLOUT : 0;
    return ev == 0 ? IO_FAILED : io_wait(io, ev);
}

/* What a socket call that failed with errno asks for: 1 to call it again (interrupted, or the
 * socket has events by now), IO_TIMED_OUT, or IO_FAILED. */
static int sock_wait(const io_t *io, short events)
{
    if (errno == EINTR)
        return 1;
    if (errno != EAGAIN && errno != EWOULDBLOCK)
        return IO_FAILED;
    return io_wait(io, events);
}

/* Writes all of buf by the deadline. Returns 0, IO_TIMED_OUT or IO_FAILED. */
static int io_write(const io_t *io, const char *buf, size_t len)
{
    while (len > 0) {
        ssize_t w;
        if (io->ssl) {
            w = SSL_write(io->ssl, buf, (int)len);
            if (w <= 0) {
                int rc = tls_wait(io, (int)w);
                if (rc != 1)
                    return rc;
                continue;
            }
        } else {
            w = send(io->fd, buf, len, MSG_NOSIGNAL);
            if (w < 0) {
                int rc = sock_wait(io, POLLOUT);
                if (rc != 1)
                    return rc;
                continue;
            }
        }
        buf += w;
        len -= (size_t)w;
    }
    return 0;
}

/* Reads what has come, by the deadline. Returns the bytes read (> 0), 0 at the end of the stream,
 * IO_TIMED_OUT or IO_FAILED. */
static ssize_t io_read(const io_t *io, char *buf, size_t cap)
{
    for (;;) {
        if (io->ssl) {
            int r = SSL_read(io->ssl, buf, (int)cap);
            if (r > 0)
                return r;
            int e = SSL_get_error(io->ssl, r);
            if (e == SSL_ERROR_ZERO_RETURN)
                return 0;
            int rc = tls_wait(io, r);
            if (rc != 1)
                return r == 0 && rc == IO_FAILED ? 0 : rc; /* (a close without close_notify: the end) */
            continue;
        }
        ssize_t r = recv(io->fd, buf, cap, 0);
        if (r >= 0)
            return r;
        int rc = sock_wait(io, POLLIN);
        if (rc != 1)
            return rc;
    }
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
    if (timeout_ms > INT64_MAX / 4)
        timeout_ms = INT64_MAX / 4;
    /* one deadline for the whole fetch: a server that sends a byte now and then kept a fetch with
     * a timeout per read going for as long as it liked, and the keys' only fetcher with it */
    io_t io = {.fd = -1, .ssl = NULL, .deadline = mono_ms() + (int64_t)timeout_ms};
    int fd = dial(u, io.deadline, why, whylen);
    if (fd < 0)
        return -1;
    io.fd = fd;
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
        io.ssl = ssl;
        int hs;
        while ((hs = SSL_connect(ssl)) != 1) {
            int w = tls_wait(&io, hs);
            if (w == 1)
                continue;
            long v = SSL_get_verify_result(ssl);
            snprintf(why, whylen, "TLS with %s:%d failed: %s", u->host, u->port,
                     w == IO_TIMED_OUT ? "timed out" : v != X509_V_OK ? X509_verify_cert_error_string(v) : "handshake");
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
    int wr = io_write(&io, req, (size_t)n);
    if (wr != 0) {
        snprintf(why, whylen, "cannot send the request to %s:%d%s", u->host, u->port,
                 wr == IO_TIMED_OUT ? ": timed out" : "");
        goto out;
    }
    /* the upstream client's HTTP/1.1 response reader (upstream/http1.h): the same framing rules */
    agw_h1_response_start(&resp, 0, max_bytes);
    char buf[16384];
    while (!resp.done) {
        ssize_t r = io_read(&io, buf, sizeof(buf));
        if (r == IO_TIMED_OUT) {
            snprintf(why, whylen, "reading from %s:%d: timed out (no whole answer within %llu ms)", u->host, u->port,
                     (unsigned long long)timeout_ms);
            goto out;
        }
        if (r < 0) {
            snprintf(why, whylen, "reading from %s:%d: failed", u->host, u->port);
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
        SSL_shutdown(ssl); /* (non-blocking: a close_notify if the socket takes it now, no wait) */
        SSL_free(ssl);
    }
    SSL_CTX_free(ctx);
    close(fd);
    return rc;
}
