/* server.c: the serving process (see server.h). */
#include "server.h"

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <openssl/err.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "admin.h"
#include "otlp.h"
#include "log.h"
#include "metrics.h"
#include "worker.h"

int agw_listen_socket(const char *what, const char *host, int port, int reuse, int backlog)
{
    struct addrinfo hints = {0}, *res = NULL;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE | AI_NUMERICHOST;
    char portstr[16];
    snprintf(portstr, sizeof(portstr), "%d", port);
    int rc = getaddrinfo(host, portstr, &hints, &res);
    if (rc != 0) {
        agw_log(AGW_LOG_ERROR, "%s %s:%d: not an IP address: %s", what, host, port, gai_strerror(rc));
        return -1;
    }
    int fd = socket(res->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    int on = 1;
    if (fd < 0 || setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof(on)) != 0 ||
        (reuse && setsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &on, sizeof(on)) != 0) ||
        bind(fd, res->ai_addr, res->ai_addrlen) != 0 || listen(fd, backlog) != 0) {
        agw_log(AGW_LOG_ERROR, "%s %s:%d: %s (is another process using the port?)", what, host, port, strerror(errno));
        if (fd >= 0)
            close(fd);
        freeaddrinfo(res);
        return -1;
    }
    freeaddrinfo(res);
    return fd;
}

/* SO_REUSEPORT would let this process share a port that another gateway already serves: bind it
 * once without that option first, so a port in use is an error at start-up. */
static int port_is_free(const agw_listen_conf_t *l)
{
    int fd = agw_listen_socket("listen", l->host, l->port, 0, 1024);
    if (fd < 0)
        return 0;
    close(fd);
    return 1;
}

static int open_listener(const agw_listen_conf_t *l)
{
    return agw_listen_socket("listen", l->host, l->port, 1, 1024);
}

/* OpenSSL's reason for the last failure, or a readable default when it gives none. */
static const char *tls_error(void)
{
    unsigned long e = ERR_get_error();
    const char *r = e ? ERR_reason_error_string(e) : NULL;
    return r ? r : "the file is missing, unreadable or not PEM";
}

static SSL_CTX *make_ssl_ctx(const agw_listen_conf_t *l)
{
    SSL_CTX *ctx = SSL_CTX_new(TLS_server_method());
    if (ctx == NULL)
        return NULL;
    SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
    SSL_CTX_set_options(ctx, SSL_OP_NO_COMPRESSION | SSL_OP_CIPHER_SERVER_PREFERENCE);
    if (SSL_CTX_use_certificate_chain_file(ctx, l->cert_file) != 1) {
        agw_log(AGW_LOG_ERROR, "listen port %d: cannot load TLS certificate %s: %s", l->port, l->cert_file,
                tls_error());
        SSL_CTX_free(ctx);
        return NULL;
    }
    if (SSL_CTX_use_PrivateKey_file(ctx, l->key_file, SSL_FILETYPE_PEM) != 1 || SSL_CTX_check_private_key(ctx) != 1) {
        agw_log(AGW_LOG_ERROR, "listen port %d: cannot load TLS key %s (or it does not match the certificate): %s",
                l->port, l->key_file, tls_error());
        SSL_CTX_free(ctx);
        return NULL;
    }
    h2o_ssl_register_alpn_protocols(ctx, h2o_http2_alpn_protocols);
    return ctx;
}

/* Opens the access log for appending: the file, or stderr; -1 (logged) when it cannot be opened. */
static int open_access_log(const char *path)
{
    if (strcmp(path, "stderr") == 0)
        return dup(2);
    int fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0)
        agw_log(AGW_LOG_ERROR, "gateway.lua: access_log: cannot open %s for appending: %s", path, strerror(errno));
    return fd;
}

/* SIGUSR1 (log rotation): the access log file is opened again and put in place of the old one
 * with dup2(), which swaps the file under the same descriptor at once: workers keep writing to
 * their descriptor and never see a closed one. */
static void reopen_access_log(const agw_config_t *conf, int fd)
{
    if (fd < 0 || strcmp(conf->access_log, "stderr") == 0)
        return;
    int nfd = open_access_log(conf->access_log);
    if (nfd < 0)
        return; /* logged; keep writing to the old file */
    if (dup3(nfd, fd, O_CLOEXEC) < 0)
        agw_log(AGW_LOG_ERROR, "access_log: cannot reopen %s: %s", conf->access_log, strerror(errno));
    else
        agw_log(AGW_LOG_INFO, "SIGUSR1: reopened the access log %s", conf->access_log);
    close(nfd);
}

static int total_inflight(agw_worker_t *const *workers, unsigned n)
{
    int total = 0;
    for (unsigned wi = 0; wi < n; wi++)
        total += agw_worker_inflight(workers[wi]);
    return total;
}

/* Graceful shutdown: every worker stops accepting, then requests in flight have up to
 * conf->shutdown_grace_ms to finish. A second SIGTERM/SIGINT ends the wait at once; SIGUSR1 still
 * reopens the access log. */
static void drain(const agw_config_t *conf, agw_worker_t *const *workers, const sigset_t *set, int access_fd)
{
    for (unsigned wi = 0; wi < conf->workers; wi++)
        agw_worker_drain(workers[wi]);
    struct timespec start, now;
    clock_gettime(CLOCK_MONOTONIC, &start);
    int n = total_inflight(workers, conf->workers);
    agw_log(AGW_LOG_INFO, "stopping: no new connections; %d request%s in flight, up to %llu ms to finish", n,
            n == 1 ? "" : "s", (unsigned long long)conf->shutdown_grace_ms);
    for (;;) {
        if ((n = total_inflight(workers, conf->workers)) == 0) {
            agw_log(AGW_LOG_INFO, "stopping: every request finished");
            return;
        }
        clock_gettime(CLOCK_MONOTONIC, &now);
        uint64_t elapsed = (uint64_t)(now.tv_sec - start.tv_sec) * 1000 +
                           (uint64_t)((now.tv_nsec - start.tv_nsec) / 1000000);
        if (elapsed >= conf->shutdown_grace_ms) {
            agw_log(AGW_LOG_WARN, "stopping: grace period of %llu ms over, cutting %d request%s in flight",
                    (unsigned long long)conf->shutdown_grace_ms, n, n == 1 ? "" : "s");
            return;
        }
        uint64_t left = conf->shutdown_grace_ms - elapsed;
        uint64_t step = left < 10 ? left : 10;
        struct timespec ts = {.tv_sec = 0, .tv_nsec = (long)step * 1000000};
        int sig = sigtimedwait(set, NULL, &ts);
        if (sig == SIGUSR1) {
            reopen_access_log(conf, access_fd);
        } else if (sig == SIGTERM || sig == SIGINT) {
            agw_log(AGW_LOG_WARN, "signal %d again: stopping now, cutting %d request%s in flight", sig,
                    n, n == 1 ? "" : "s");
            return;
        } else if (sig == SIGHUP) {
            agw_log(AGW_LOG_WARN, "SIGHUP while stopping: ignored");
        }
    }
}

int agw_server_run(agw_config_t *conf)
{
    signal(SIGPIPE, SIG_IGN);
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGHUP);
    sigaddset(&set, SIGUSR1);
    /* workers inherit the mask; only this thread takes the signals */
    pthread_sigmask(SIG_BLOCK, &set, NULL);

    static h2o_globalconf_t globalconf;
    h2o_config_init(&globalconf);
    globalconf.server_name = h2o_iovec_init(H2O_STRLIT("aggway"));
    globalconf.max_request_entity_size = conf->max_request_body_bytes;
    h2o_hostconf_t *host = h2o_config_register_host(&globalconf, h2o_iovec_init(H2O_STRLIT("default")), 65535);
    h2o_pathconf_t *path = h2o_config_register_path(host, "/", 0);
    h2o_handler_t *handler = h2o_create_handler(path, sizeof(*handler));
    handler->on_req = agw_worker_on_req;

    for (size_t i = 0; i < conf->num_listen; i++)
        if (!port_is_free(&conf->listen[i]))
            return 1;
    SSL_CTX **ssl = calloc(conf->num_listen ? conf->num_listen : 1, sizeof(*ssl));
    for (size_t i = 0; i < conf->num_listen; i++) {
        if (conf->listen[i].cert_file && (ssl[i] = make_ssl_ctx(&conf->listen[i])) == NULL)
            return 1;
    }
    int access_fd = -1;
    if (conf->access_log && (access_fd = open_access_log(conf->access_log)) < 0)
        return 1;
    agw_metrics_t **metrics = calloc(conf->workers, sizeof(*metrics));
    for (unsigned wi = 0; wi < conf->workers; wi++)
        metrics[wi] = agw_metrics_new(conf);
    /* spans leave through the exporter thread; without a collector nothing is queued */
    agw_otlp_t *exporter = NULL;
    if (conf->otlp_url && (exporter = agw_otlp_start(conf, conf->workers)) == NULL)
        return 1;
    for (unsigned wi = 0; exporter && wi < conf->workers; wi++) {
        metrics[wi]->trace_queue = agw_otlp_queue(exporter, wi);
        metrics[wi]->exporter = exporter;
    }
    /* the admin listener answers (not ready) while the workers load their scripts */
    agw_admin_t *admin = NULL;
    if (conf->admin_port && (admin = agw_admin_start(conf, metrics, conf->workers)) == NULL)
        return 1;
    agw_worker_t **workers = calloc(conf->workers, sizeof(*workers));
    agw_listener_fd_t *fds = calloc(conf->num_listen ? conf->num_listen : 1, sizeof(*fds));
    for (unsigned wi = 0; wi < conf->workers; wi++) {
        for (size_t i = 0; i < conf->num_listen; i++) {
            if ((fds[i].fd = open_listener(&conf->listen[i])) < 0)
                return 1;
            fds[i].ssl_ctx = ssl[i];
        }
        agw_buf_t errors = AGW_BUF_INIT;
        workers[wi] = agw_worker_start((int)wi, conf, &globalconf, fds, conf->num_listen, metrics[wi], access_fd,
                                       &errors);
        if (workers[wi] == NULL) {
            agw_log(AGW_LOG_ERROR, "worker %u did not start:\n%s", wi, errors.base ? errors.base : "");
            agw_buf_free(&errors);
            agw_admin_stop(admin);
            return 1;
        }
        agw_buf_free(&errors);
    }
    for (size_t i = 0; i < conf->num_listen; i++)
        agw_log(AGW_LOG_INFO, "listening on %s:%d (%s)", conf->listen[i].host, conf->listen[i].port,
                ssl[i] ? "HTTP/1.1 and HTTP/2 over TLS" : "HTTP/1.1 and h2c");
    agw_log(AGW_LOG_INFO, "aggway serving %s with %u worker%s, %zu route%s, %zu upstream%s", conf->dir, conf->workers,
            conf->workers == 1 ? "" : "s", conf->router.num_routes, conf->router.num_routes == 1 ? "" : "s",
            conf->num_upstreams, conf->num_upstreams == 1 ? "" : "s");
    agw_admin_set_ready(admin, 1);
    for (;;) {
        int sig = 0;
        if (sigwait(&set, &sig) != 0)
            continue;
        if (sig == SIGHUP) {
            agw_log(AGW_LOG_WARN, "SIGHUP: reloading is not available in this version; restart to load changes");
            continue;
        }
        if (sig == SIGUSR1) {
            reopen_access_log(conf, access_fd);
            continue;
        }
        agw_log(AGW_LOG_INFO, "signal %d: stopping gracefully", sig);
        break;
    }
    agw_admin_set_ready(admin, 0);
    drain(conf, workers, &set, access_fd);
    for (unsigned wi = 0; wi < conf->workers; wi++)
        agw_worker_stop(workers[wi]);
    agw_admin_stop(admin); /* after the workers: nothing writes the metrics any more */
    agw_otlp_stop(exporter); /* last: sends what the workers queued */
    for (unsigned wi = 0; wi < conf->workers; wi++)
        agw_metrics_free(metrics[wi]);
    free(metrics);
    if (access_fd >= 0)
        close(access_fd);
    free(workers);
    free(fds);
    free(ssl);
    return 0;
}
