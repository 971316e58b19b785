/* server.c: the serving process (see server.h). */
#include "front/server.h"
#include "front/h2_head.h"
#include "front/h2c_upgrade.h"
#include "front/head_format.h"
#include "front/inline_write.h"
#include "front/mem_pool.h"
#include "front/read_pause.h"
#include "front/resolver.h"

#include "base/mem.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <netdb.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "front/admin.h"
#include "deploy/nofile.h"
#include "deploy/sd_notify.h"
#include "worker/generation.h"
#include "script/listen_tls.h"
#include "ops/otlp.h"
#include "base/log.h"
#include "ops/metrics.h"
#include "worker/watchdog.h"
#include "worker/worker.h"

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

/* The Server header of the gateway's responses (RFC 9110 §10.2.4). */
#define SERVER_NAME "aggway"

/* Adds the gateway's Server header to a response that has none: a script's own `server`
 * (resp_headers.h) replaces the gateway's. h2o 2.2.5 writes globalconf.server_name on every
 * response beside whatever Server header the response carries, with no switch per response, so
 * that name is left empty (as h2o's own "send-server-name: preserve" does) and this filter, run
 * as each response starts, adds the gateway's. It covers the answers h2o makes itself (a request
 * body too large, broken chunked framing) as well as the gateway's. */
static void on_setup_server_header(h2o_filter_t *self, h2o_req_t *req, h2o_ostream_t **slot)
{
    (void)self;
    if (h2o_find_header(&req->res.headers, H2O_TOKEN_SERVER, -1) == -1)
        h2o_add_header(&req->pool, &req->res.headers, H2O_TOKEN_SERVER, "Server", H2O_STRLIT(SERVER_NAME));
    h2o_setup_next_ostream(req, slot);
}

/* SO_REUSEPORT would let this process share a port that another gateway already serves: bind it
 * once without that option first, so a port in use is an error at start-up (unless the listener
 * asks for sharing with reuse_port = true). */
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

/* Logs the certificate each TLS listener of conf serves to new connections (start-up, reload). */
static void log_certificates(const char *what, const agw_config_t *conf)
{
    for (size_t i = 0; i < conf->num_listen; i++) {
        const agw_listen_conf_t *l = &conf->listen[i];
        if (l->ssl_ctx == NULL)
            continue;
        char desc[512];
        agw_listen_tls_describe(l->ssl_ctx, desc, sizeof(desc));
        /* served all the same (an operator may have nothing better at hand), but said loudly */
        const char *state = agw_listen_tls_validity(l->ssl_ctx);
        agw_log(*state ? AGW_LOG_WARN : AGW_LOG_INFO, "%s: new TLS connections on %s:%d get the certificate %s (%s)%s",
                what, l->host, l->port, l->cert_file, desc, state);
    }
}

/* Opens path for appending as the access log, or returns -1 with *why (strerror's text, or what
 * the path is). Non-blocking: a FIFO without a reader fails at once with ENXIO, where open would
 * wait with the signals blocked; a FIFO or a socket is refused, as a write to it could hold a
 * worker. The descriptor is blocking again when it is returned. */
static int open_log_file(const char *path, const char **why)
{
    int fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC | O_NONBLOCK, 0644);
    if (fd < 0) {
        *why = errno == ENXIO ? "it is a FIFO no one reads" : strerror(errno);
        return -1;
    }
    struct stat st;
    if (fstat(fd, &st) == 0 && (S_ISFIFO(st.st_mode) || S_ISSOCK(st.st_mode))) {
        close(fd);
        *why = "it is a FIFO or a socket";
        return -1;
    }
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
    return fd;
}

/* Opens the access log for appending: the file, or stderr; -1 (logged) when it cannot be opened. */
static int open_access_log(const char *path)
{
    if (strcmp(path, "stderr") == 0)
        return dup(2);
    const char *why;
    int fd = open_log_file(path, &why);
    if (fd < 0)
        agw_log(AGW_LOG_ERROR, "gateway.lua: access_log: cannot open %s for appending: %s", path, why);
    return fd;
}

/* SIGUSR1 (log rotation): the access log file is opened again and put in place of the old one
 * with dup2(), which swaps the file under the same descriptor at once: workers keep writing to
 * their descriptor and never see a closed one. */
static void reopen_access_log(const char *access_log, int fd)
{
    if (fd < 0 || access_log == NULL || strcmp(access_log, "stderr") == 0)
        return;
    const char *why;
    int nfd = open_log_file(access_log, &why);
    if (nfd < 0) { /* keep writing to the old file */
        agw_log(AGW_LOG_ERROR, "SIGUSR1: cannot reopen the access log %s: %s; its lines keep going to the file "
                "opened before (moved or not), until a SIGUSR1 can open it", access_log, why);
        return;
    }
    if (dup3(nfd, fd, O_CLOEXEC) < 0)
        agw_log(AGW_LOG_ERROR, "access_log: cannot reopen %s: %s", access_log, strerror(errno));
    else
        agw_log(AGW_LOG_INFO, "SIGUSR1: reopened the access log %s", access_log);
    close(nfd);
}

static int total_inflight(agw_worker_t *const *workers, unsigned n)
{
    int total = 0;
    for (unsigned wi = 0; wi < n; wi++)
        total += agw_worker_inflight(workers[wi]);
    return total;
}

/* How many upstream connections the pools may hold at once (workers × Σ max_connections), for
 * the open-file limit; 0 when an upstream has no limit. */
static uint64_t upstream_fds(const agw_config_t *conf)
{
    uint64_t per_worker = 0;
    for (size_t i = 0; i < conf->num_upstreams; i++) {
        if (conf->upstreams[i].max_connections == 0)
            return 0;
        per_worker += conf->upstreams[i].max_connections;
    }
    return per_worker * conf->workers;
}

/* What the main thread keeps while serving. */
typedef struct server {
    const char *dir;               /* the scripts folder */
    unsigned workers;              /* worker threads (a restart-only setting) */
    char *access_log;              /* its path, "stderr" or NULL (a restart-only setting) */
    int access_fd;
    agw_worker_t **w;
    agw_metric_labels_t *labels;
    agw_reload_state_t gens;       /* the generation serving and the reload record */
    agw_config_t tracing;          /* the exporter's copy of the tracing block (otlp_* only) */
} server_t;


/* Copies the tracing block (otlp_*) of from into to, an otherwise empty configuration that
 * agw_config_free frees. */
static void tracing_settings(const agw_config_t *from, agw_config_t *to)
{
    memset(to, 0, sizeof(*to));
    to->otlp_url = agw_strdup_opt(from->otlp_url);
    to->otlp_host_header = agw_strdup_opt(from->otlp_host_header);
    to->otlp_path = agw_strdup_opt(from->otlp_path);
    to->otlp_service_name = agw_strdup_opt(from->otlp_service_name);
    to->otlp_addr = from->otlp_addr;
    to->otlp_addrlen = from->otlp_addrlen;
    to->otlp_timeout_ms = from->otlp_timeout_ms;
}

/* After the drain, how long a worker may take to stop before the process exits without it, ms */
#define AGW_WORKER_STOP_WAIT_MS 5000

/* How long the drain waits, once nothing is in flight and no connection is busy, before it stops
 * (ms): the workers count their busy connections every 10 ms, so a request that has just begun
 * arriving, or has just started, is seen rather than cut. */
#define AGW_DRAIN_SETTLE_MS 100

/* The workers' busy client connections (agw_worker_busy), summed. */
static unsigned total_busy(agw_worker_t *const *workers, unsigned n)
{
    unsigned total = 0;
    for (unsigned wi = 0; wi < n; wi++)
        total += agw_worker_busy(workers[wi]);
    return total;
}

/* The requests every worker has started (agw_worker_requests_started), summed. */
static uint64_t total_started(agw_worker_t *const *workers, unsigned n)
{
    uint64_t total = 0;
    for (unsigned wi = 0; wi < n; wi++)
        total += agw_worker_requests_started(workers[wi]);
    return total;
}

/* Whether every worker has closed its listeners (agw_worker_drained). */
static int all_drained(agw_worker_t *const *workers, unsigned n)
{
    for (unsigned wi = 0; wi < n; wi++)
        if (!agw_worker_drained(workers[wi]))
            return 0;
    return 1;
}

static uint64_t ms_since(const struct timespec *start)
{
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (uint64_t)(now.tv_sec - start->tv_sec) * 1000 + (uint64_t)((now.tv_nsec - start->tv_nsec) / 1000000);
}

/* Graceful shutdown: every worker stops accepting (the drain waits until each has closed its
 * listeners, at most AGW_WORKER_STOP_WAIT_MS), then requests in flight and busy connections (a
 * request still arriving, an answer still being written, a connection accepted before the
 * listeners closed that has not sent its request yet: agw_worker_busy) have up to
 * shutdown_grace_ms (the serving generation's) to finish; the process stops once nothing has been
 * in flight, no connection busy and no request started for AGW_DRAIN_SETTLE_MS. Connections idle
 * between requests are not waited for. A second SIGTERM/SIGINT ends the wait at once; SIGUSR1
 * still reopens the access log; SIGHUP is ignored (logged). */
static void drain(server_t *srv, const sigset_t *set)
{
    agw_generation_t *gen = agw_reload_state_current(&srv->gens);
    uint64_t grace_ms = gen->conf.shutdown_grace_ms;
    agw_generation_unref(gen);
    for (unsigned wi = 0; wi < srv->workers; wi++)
        agw_worker_drain(srv->w[wi]);
    struct timespec start;
    clock_gettime(CLOCK_MONOTONIC, &start);
    int accepting = 1, n = 0;
    unsigned busy = 0;
    uint64_t started = 0, idle_since = 0; /* idle_since: ms (since start) when nothing was last in flight */
    for (;;) {
        uint64_t elapsed = ms_since(&start);
        if (accepting && (all_drained(srv->w, srv->workers) || elapsed >= AGW_WORKER_STOP_WAIT_MS ||
                          elapsed >= grace_ms)) {
            accepting = 0;
            n = total_inflight(srv->w, srv->workers);
            agw_log(AGW_LOG_INFO, "stopping: no new connections; %d request%s in flight, up to %llu ms to finish", n,
                    n == 1 ? "" : "s", (unsigned long long)grace_ms);
            started = total_started(srv->w, srv->workers);
            idle_since = elapsed;
        }
        if (!accepting) {
            uint64_t now_started = total_started(srv->w, srv->workers);
            busy = total_busy(srv->w, srv->workers);
            if ((n = total_inflight(srv->w, srv->workers)) != 0 || busy != 0 || now_started != started) {
                started = now_started;
                idle_since = elapsed;
            } else if (elapsed - idle_since >= AGW_DRAIN_SETTLE_MS || elapsed >= grace_ms) {
                agw_log(AGW_LOG_INFO, "stopping: every request finished");
                return;
            }
        }
        if (!accepting && elapsed >= grace_ms) { /* a hard limit, whatever still comes */
            agw_log(AGW_LOG_WARN, "stopping: grace period of %llu ms over, cutting %d request%s in flight and %u "
                    "connection%s still receiving or sending", (unsigned long long)grace_ms, n, n == 1 ? "" : "s",
                    busy, busy == 1 ? "" : "s");
            return;
        }
        uint64_t left = grace_ms > elapsed ? grace_ms - elapsed : 0;
        uint64_t step = left < 10 ? left : 10;
        if (step == 0)
            step = 1;
        struct timespec ts = {.tv_sec = 0, .tv_nsec = (long)step * 1000000};
        int sig = sigtimedwait(set, NULL, &ts);
        if (sig == SIGUSR1) {
            reopen_access_log(srv->access_log, srv->access_fd);
        } else if (sig == SIGTERM || sig == SIGINT) {
            n = total_inflight(srv->w, srv->workers);
            agw_log(AGW_LOG_WARN, "signal %d again: stopping now, cutting %d request%s in flight", sig,
                    n, n == 1 ? "" : "s");
            return;
        } else if (sig == SIGHUP) {
            agw_log(AGW_LOG_WARN, "SIGHUP while stopping: not reloaded (the gateway is draining; the running "
                                  "generation finishes the requests in flight)");
        }
    }
}

/* Logs each line of errors as its own error line, after what. */
static void log_lines(const char *what, const char *errors)
{
    const char *p = errors ? errors : "";
    while (*p) {
        const char *eol = strchr(p, '\n');
        int len = (int)(eol ? eol - p : (long)strlen(p));
        if (len > 0)
            agw_log(AGW_LOG_ERROR, "%s: %.*s", what, len, p);
        p += len + (eol ? 1 : 0);
    }
}

/* Waits until every worker gives new requests to generation number (each switches on its own
 * loop, within a loop pass), so that once the admin listener says a generation serves, every new
 * request gets it. A worker busy for more than 10 s (a script stuck in a loop) is not waited for. */
static void wait_switched(server_t *srv, uint64_t number)
{
    for (int ms = 0; ms < 10000; ms++) {
        unsigned behind = 0;
        for (unsigned wi = 0; wi < srv->workers; wi++)
            behind += agw_worker_generation(srv->w[wi]) < number;
        if (behind == 0)
            return;
        struct timespec ts = {.tv_sec = 0, .tv_nsec = 1000000};
        nanosleep(&ts, NULL);
    }
    agw_log(AGW_LOG_WARN, "reload: a worker has not switched to generation %llu after 10 s (busy?); it will when its "
            "loop runs again", (unsigned long long)number);
}

/* SIGHUP: loads the scripts folder as the next generation, checks it (the C configuration on this
 * thread, then one VM per worker), and only when everything loaded hands each worker its VM. On any
 * failure the serving generation goes on untouched, and the reasons are logged, counted and kept
 * for the admin /reload page. */
static void reload(server_t *srv)
{
    /* Loading a folder takes CPU the workers would rather have: this thread only loads, drains and
     * waits for signals, so it runs at a lower priority from its first reload on (the workers were
     * started before and keep theirs). */
    static int niced;
    if (!niced) {
        niced = 1;
        if (setpriority(PRIO_PROCESS, (id_t)gettid(), 10) != 0)
            agw_log(AGW_LOG_WARN, "reload: cannot lower the main thread's priority: %s", strerror(errno));
    }
    agw_generation_t *cur = agw_reload_state_current(&srv->gens);
    agw_log(AGW_LOG_INFO, "SIGHUP: reloading %s (generation %llu serving)", srv->dir, (unsigned long long)cur->number);
    struct timespec mono;
    clock_gettime(CLOCK_MONOTONIC, &mono);
    agw_sd_notifyf("RELOADING=1\nMONOTONIC_USEC=%llu\nSTATUS=reloading %s", (unsigned long long)mono.tv_sec * 1000000ULL +
                   (unsigned long long)mono.tv_nsec / 1000, srv->dir);
    agw_buf_t errors = AGW_BUF_INIT;
    agw_generation_t *next = agw_generation_load(srv->dir, cur->number + 1, cur, srv->labels, &errors);
    agw_worker_gen_t **prepared = agw_calloc(srv->workers, sizeof(*prepared));
    int ok = next != NULL;
    for (unsigned wi = 0; ok && wi < srv->workers; wi++)
        ok = (prepared[wi] = agw_worker_prepare(srv->w[wi], next, &errors)) != NULL;
    if (!ok) {
        for (unsigned wi = 0; wi < srv->workers; wi++)
            agw_worker_discard(prepared[wi]);
        char what[96];
        snprintf(what, sizeof(what), "reload failed, generation %llu keeps serving", (unsigned long long)cur->number);
        if (errors.len == 0)
            agw_buf_printf(&errors, "%s/gateway.lua:1: the scripts folder did not load\n", srv->dir);
        log_lines(what, errors.base);
        agw_reload_state_failed(&srv->gens, errors.base);
        agw_sd_notifyf("READY=1\nSTATUS=%s (see the journal or the admin /reload page)", what);
    } else {
        for (unsigned wi = 0; wi < srv->workers; wi++)
            agw_worker_install(srv->w[wi], prepared[wi]);
        wait_switched(srv, next->number);
        agw_reload_state_serving(&srv->gens, next, 1);
        agw_log(AGW_LOG_INFO, "reload: generation %llu serves new requests: %zu route%s, %zu upstream%s "
                "(requests in flight finish on the generation they started on)", (unsigned long long)next->number,
                next->conf.router.num_routes, next->conf.router.num_routes == 1 ? "" : "s", next->conf.num_upstreams,
                next->conf.num_upstreams == 1 ? "" : "s");
        log_certificates("reload", &next->conf);
        agw_sd_notifyf("READY=1\nSTATUS=serving %s: generation %llu, %zu routes, %zu upstreams", srv->dir,
                       (unsigned long long)next->number, next->conf.router.num_routes, next->conf.num_upstreams);
    }
    free(prepared);
    agw_buf_free(&errors);
    agw_generation_unref(next);
    agw_generation_unref(cur);
}

/* The open-files limit: the soft limit goes up to the hard one (client connections and upstream
 * sockets are descriptors; clients.max_connections "auto" is derived from it), and the start-up
 * log says what it is. */
static void raise_nofile(void)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0)
        return;
    if (rl.rlim_cur < rl.rlim_max) {
        rlim_t want = rl.rlim_max;
        rl.rlim_cur = want;
        if (setrlimit(RLIMIT_NOFILE, &rl) != 0)
            getrlimit(RLIMIT_NOFILE, &rl);
    }
    agw_log(AGW_LOG_INFO, "open-files limit %llu: up to %u client connections (clients.max_connections \"auto\")",
            (unsigned long long)rl.rlim_cur, agw_config_auto_max_connections());
}

int agw_server_run(const char *dir)
{
    signal(SIGPIPE, SIG_IGN);
    raise_nofile();
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGHUP);
    sigaddset(&set, SIGUSR1);
    /* workers inherit the mask; only this thread takes the signals */
    pthread_sigmask(SIG_BLOCK, &set, NULL);

    server_t srv = {.dir = dir, .access_fd = -1};
    agw_reload_state_init(&srv.gens);
    srv.labels = agw_metric_labels_new(AGW_M_ROUTE_SLOTS, AGW_M_UPSTREAM_SLOTS);
    agw_buf_t errors = AGW_BUF_INIT;
    agw_generation_t *gen = agw_generation_load(dir, 1, NULL, srv.labels, &errors);
    if (gen == NULL) {
        fprintf(stderr, "%s", errors.base ? errors.base : "");
        agw_log(AGW_LOG_ERROR, "%s is not valid; not starting", dir);
        agw_buf_free(&errors);
        return 1;
    }
    agw_buf_free(&errors);
    if (!agw_read_pause_active() || !agw_inline_write_active()) /* (a build whose executable does not
                                                                   export them: read_pause.h, inline_write.h) */
        agw_log(AGW_LOG_WARN, "libuv's uv_read_stop, uv_read_start, uv_write and uv_close are not interposed "
                              "(libuv %s; checked against 1.44): every HTTP/1 request costs up to two epoll_ctl "
                              "calls more", uv_version_string());
    int mem_pool = agw_mem_pool_active(); /* (mem_pool.h) */
    if (mem_pool < 0) {
        agw_log(AGW_LOG_ERROR, "libh2o's h2o_mem_alloc_pool and h2o_mem_clear_pool are not both interposed for "
                               "every caller, libh2o's own included: pools would be cleared by another allocator "
                               "than theirs; not starting");
        return 1;
    }
    if (mem_pool == 0)
        agw_log(AGW_LOG_WARN, "libh2o's h2o_mem_alloc_pool and h2o_mem_clear_pool are not interposed: every "
                              "request's memory pool starts with h2o's 4 KB chunk, not 2 KB (front/mem_pool.h)");
    int h2_head = agw_h2_head_active(); /* (h2_head.h) */
    if (h2_head < 0) {
        agw_log(AGW_LOG_ERROR, "libh2o's h2o_hpack_flatten_response was not found (libh2o %s): this build cannot "
                               "answer over HTTP/2; not starting", H2O_VERSION);
        return 1;
    }
    if (h2_head == 0)
        agw_log(AGW_LOG_WARN, "libh2o's h2o_hpack_flatten_response is not interposed: every HTTP/2 response's "
                              "Server-Timing goes into the connection's HPACK table");
    if (!agw_h2c_upgrade_declined()) /* (h2c_upgrade.h) */
        agw_log(AGW_LOG_WARN, "libh2o's h2o_http2_handle_upgrade is not interposed: a request with Upgrade: h2c "
                              "is upgraded to HTTP/2 and then refused (400), not served as HTTP/1.1");
    if (!agw_head_format_active()) /* (head_format.h) */
        agw_log(AGW_LOG_WARN, "glibc's __sprintf_chk is not interposed: every HTTP/1.1 response head is written by "
                              "vsprintf (about 1,700 instructions more a response)");
    /* libh2o prints some events to stderr itself, a client's path among them: through the log */
    if (agw_log_capture_stdio_stderr() != 0)
        agw_log(AGW_LOG_WARN, "cannot send the libraries' stderr through the log: their lines go unescaped");
    const agw_config_t *conf = &gen->conf; /* start-up settings: the same in every later generation */
    srv.workers = conf->workers;
    srv.access_log = agw_strdup_opt(conf->access_log);

    static h2o_globalconf_t globalconf;
    h2o_config_init(&globalconf);
    globalconf.server_name = h2o_iovec_init(H2O_STRLIT("")); /* on_setup_server_header adds it */
    globalconf.max_request_entity_size = conf->max_request_body_bytes;
    h2o_hostconf_t *host = h2o_config_register_host(&globalconf, h2o_iovec_init(H2O_STRLIT("default")), 65535);
    h2o_pathconf_t *path = h2o_config_register_path(host, "/", 0);
    h2o_handler_t *handler = h2o_create_handler(path, sizeof(*handler));
    handler->on_req = agw_worker_on_req;
    h2o_create_filter(path, sizeof(h2o_filter_t))->on_setup_ostream = on_setup_server_header;
    h2o_create_filter(&host->fallback_path, sizeof(h2o_filter_t))->on_setup_ostream = on_setup_server_header;

    for (size_t i = 0; i < conf->num_listen; i++)
        if (!conf->listen[i].reuse_port && !port_is_free(&conf->listen[i]))
            return 1;
    agw_nofile_raise(upstream_fds(conf));
    if (srv.access_log && (srv.access_fd = open_access_log(srv.access_log)) < 0)
        return 1;
    agw_metrics_t **metrics = agw_calloc(conf->workers, sizeof(*metrics));
    for (unsigned wi = 0; wi < conf->workers; wi++)
        metrics[wi] = agw_metrics_new(srv.labels);
    /* rate limit and quota counts: one table for the process, sized once (limits.local_keys) */
    agw_limit_store_t *limits = agw_limit_store_new(conf->limits.local_keys);
    /* open client connections: one count against clients.max_connections for every worker */
    agw_client_slots_t *slots = agw_client_slots_new(conf->workers);
    for (unsigned wi = 0; wi < conf->workers; wi++)
        metrics[wi]->limits = limits;
    /* spans leave through the exporter thread; without a collector nothing is queued. The exporter
     * keeps its own copy of the tracing settings (a restart-only block): generation 1 does not
     * live as long as the process. */
    agw_otlp_t *exporter = NULL;
    tracing_settings(conf, &srv.tracing);
    if (srv.tracing.otlp_url && (exporter = agw_otlp_start(&srv.tracing, srv.labels, conf->workers)) == NULL)
        return 1;
    for (unsigned wi = 0; exporter && wi < conf->workers; wi++) {
        metrics[wi]->trace_queue = agw_otlp_queue(exporter, wi);
        metrics[wi]->exporter = exporter;
    }
    if (agw_worker_ring_wanted(&errors) < 0) {
        size_t n = errors.len; /* (one line: without its newline, which the log would escape) */
        while (n > 0 && errors.base[n - 1] == '\n')
            n--;
        agw_log(AGW_LOG_ERROR, "cannot start: %.*s", (int)n, errors.base);
        agw_buf_free(&errors);
        return 1;
    }
    /* the admin listener answers (not ready) while the workers load their scripts */
    agw_admin_t *admin = NULL;
    if (conf->admin_port && (admin = agw_admin_start(conf, &srv.gens, srv.labels, metrics, conf->workers)) == NULL)
        return 1;
    srv.w = agw_calloc(conf->workers, sizeof(*srv.w));
    agw_listener_fd_t *fds = agw_calloc(conf->num_listen ? conf->num_listen : 1, sizeof(*fds));
    for (unsigned wi = 0; wi < conf->workers; wi++) {
        for (size_t i = 0; i < conf->num_listen; i++) {
            if ((fds[i].fd = open_listener(&conf->listen[i])) < 0)
                return 1;
        }
        srv.w[wi] = agw_worker_start((int)wi, gen, &globalconf, fds, conf->num_listen, metrics[wi], srv.access_fd,
                                     limits, slots, &errors);
        if (srv.w[wi] == NULL) {
            agw_log(AGW_LOG_ERROR, "worker %u did not start:\n%s", wi, errors.base ? errors.base : "");
            agw_buf_free(&errors);
            agw_admin_stop(admin);
            return 1;
        }
        agw_buf_free(&errors);
    }
    for (size_t i = 0; i < conf->num_listen; i++)
        agw_log(AGW_LOG_INFO, "listening on %s:%d (%s)", conf->listen[i].host, conf->listen[i].port,
                conf->listen[i].ssl_ctx ? "HTTP/1.1 and HTTP/2 over TLS" : "HTTP/1.1 and h2c");
    log_certificates("start-up", conf);
    agw_log(AGW_LOG_INFO, "aggway serving %s with %u worker%s, %zu route%s, %zu upstream%s (generation 1)", conf->dir,
            conf->workers, conf->workers == 1 ? "" : "s", conf->router.num_routes,
            conf->router.num_routes == 1 ? "" : "s", conf->num_upstreams, conf->num_upstreams == 1 ? "" : "s");
    /* the script time limit (watchdog.h) */
    agw_watchdog_target_t **targets = agw_calloc(conf->workers, sizeof(*targets));
    for (unsigned wi = 0; wi < conf->workers; wi++)
        targets[wi] = agw_worker_watchdog_target(srv.w[wi]);
    agw_watchdog_t *watchdog = agw_watchdog_start(targets, conf->workers);
    if (watchdog == NULL)
        agw_log(AGW_LOG_WARN, "cannot start the watchdog thread: scripts run without a time limit");
    size_t num_routes = conf->router.num_routes, num_upstreams = conf->num_upstreams;
    agw_reload_state_serving(&srv.gens, gen, 0);
    agw_generation_unref(gen); /* the workers and the record hold it now */
    agw_resolver_t *resolver = agw_resolver_start(&srv.gens); /* endpoint host names (group/directory.h) */
    conf = NULL;
    agw_admin_set_ready(admin, 1);
    agw_sd_notifyf("READY=1\nSTATUS=serving %s: generation 1, %zu routes, %zu upstreams", srv.dir, num_routes,
                   num_upstreams);
    int deferred = 0; /* a SIGHUP waits for old generations to finish (AGW_GENERATIONS_MAX) */
    for (;;) {
        if (deferred && agw_generation_live() < AGW_GENERATIONS_MAX) {
            deferred = 0;
            reload(&srv);
            continue;
        }
        int sig = 0;
        if (deferred) {
            struct timespec ts = {.tv_sec = 0, .tv_nsec = 50 * 1000000};
            if ((sig = sigtimedwait(&set, NULL, &ts)) < 0)
                continue;
        } else if (sigwait(&set, &sig) != 0) {
            continue;
        }
        if (sig == SIGHUP) {
            if (agw_generation_live() >= AGW_GENERATIONS_MAX) {
                if (!deferred)
                    agw_log(AGW_LOG_WARN, "SIGHUP: %llu generations are still finishing requests (at most %d at "
                            "once); the reload waits until one is done",
                            (unsigned long long)agw_generation_live(), AGW_GENERATIONS_MAX);
                deferred = 1;
                continue;
            }
            reload(&srv);
            continue;
        }
        if (sig == SIGUSR1) {
            reopen_access_log(srv.access_log, srv.access_fd);
            continue;
        }
        agw_log(AGW_LOG_INFO, "signal %d: stopping gracefully", sig);
        break;
    }
    agw_admin_set_ready(admin, 0);
    agw_sd_notify("STOPPING=1\nSTATUS=stopping: draining requests in flight");
    drain(&srv, &set);
    /* the watchdog goes on stopping runaway scripts while the workers stop */
    for (unsigned wi = 0; wi < srv.workers; wi++) {
        if (agw_worker_stop(srv.w[wi], AGW_WORKER_STOP_WAIT_MS) != 0) {
            agw_log(AGW_LOG_ERROR, "stopping: worker %u did not stop within %d ms (a script stuck where the "
                    "script time limit cannot reach it: a long C call, a compiled loop, a finalizer); exiting "
                    "without it", wi, AGW_WORKER_STOP_WAIT_MS);
            _exit(1);
        }
    }
    agw_watchdog_stop(watchdog);
    agw_resolver_stop(resolver);
    agw_admin_stop(admin); /* after the workers: nothing writes the metrics any more */
    agw_otlp_stop(exporter); /* last: sends what the workers queued */
    for (unsigned wi = 0; wi < srv.workers; wi++)
        agw_metrics_free(metrics[wi]);
    free(metrics);
    agw_limit_store_free(limits);
    agw_client_slots_free(slots);
    if (srv.access_fd >= 0)
        close(srv.access_fd);
    free(targets);
    free(srv.w);
    free(fds);
    free(srv.access_log);
    agw_reload_state_destroy(&srv.gens);
    agw_metric_labels_free(srv.labels); /* nothing reads the metrics or the traces any more */
    agw_config_free(&srv.tracing);
    /* the workers' VMs are not freed (the process ends), so neither are the generations they hold */
    return 0;
}
