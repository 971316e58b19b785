/*
 * mock_service.c -- the fake services: listening sockets, request dispatch and counters.
 *
 * A service is one port with a list of routes; the first route whose method and path match
 * answers. Hit counters are kept per route key ("GET /products/{id}") in a table owned by the
 * service rather than by the route, so they survive PUT /services/NAME/routes; requests that
 * match nothing are counted as "unmatched" and answered 404 with a JSON body.
 */
#include "mock.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

/* Index of key in svc's hit table, adding it with a zero count if needed. */
static size_t hit_slot(mock_service *svc, const char *key)
{
    for (size_t i = 0; i < svc->nhits; i++)
        if (strcmp(svc->hits[i].key, key) == 0)
            return i;
    svc->hits = agw_realloc(svc->hits, (svc->nhits + 1) * sizeof *svc->hits);
    svc->hits[svc->nhits].key = agw_strdup(key);
    svc->hits[svc->nhits].n = 0;
    return svc->nhits++;
}

void mock_service_set_routes(mock_service *svc, mock_route *routes, size_t n)
{
    mock_routes_free(svc->routes, svc->nroutes);
    svc->routes = routes;
    svc->nroutes = n;
    for (size_t i = 0; i < n; i++)
        routes[i].hit_slot = hit_slot(svc, routes[i].key);
}

void mock_service_reset(mock_service *svc)
{
    for (size_t i = 0; i < svc->nhits; i++)
        free(svc->hits[i].key);
    free(svc->hits);
    svc->hits = NULL;
    svc->nhits = 0;
    for (size_t i = 0; i < svc->nroutes; i++) {
        svc->routes[i].hit_slot = hit_slot(svc, svc->routes[i].key);
        svc->routes[i].seen = 0;
    }
    svc->unmatched = 0;
    svc->requests = 0;
    svc->conns_total = svc->conns_open;
}

static void on_accept(struct ev_loop *loop, ev_io *w, int revents)
{
    (void)loop;
    (void)revents;
    mock_service *svc = w->data;
    for (int i = 0; i < 64; i++) { /* a bounded batch keeps the loop fair */
        int fd = accept4(svc->lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR &&
                errno != ECONNABORTED)
                fprintf(stderr, "aggway-mock: %s: accept: %s\n", svc->name, strerror(errno));
            return;
        }
        mock_conn_accept(svc, fd);
    }
}

int mock_service_listen(mock_service *svc, char *err, size_t errlen)
{
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)svc->port)};
    if (inet_pton(AF_INET, svc->srv->host, &sa.sin_addr) != 1) {
        snprintf(err, errlen, "host: \"%s\" is not an IPv4 address", svc->srv->host);
        return -1;
    }
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    int one = 1;
    if (fd < 0 || setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) < 0 ||
        bind(fd, (struct sockaddr *)&sa, sizeof sa) < 0 || listen(fd, 4096) < 0) {
        snprintf(err, errlen, "%s: cannot listen on %s:%d: %s", svc->name, svc->srv->host,
                 svc->port, strerror(errno));
        if (fd >= 0)
            close(fd);
        return -1;
    }
    svc->lfd = fd;
    svc->refused = false;
    ev_io_init(&svc->accept_w, on_accept, fd, EV_READ);
    svc->accept_w.data = svc;
    ev_io_start(svc->srv->loop, &svc->accept_w);
    return 0;
}

void mock_service_refuse(mock_service *svc)
{
    if (svc->lfd >= 0) {
        ev_io_stop(svc->srv->loop, &svc->accept_w);
        close(svc->lfd);
        svc->lfd = -1;
    }
    svc->refused = true;
    while (svc->conns)
        mock_conn_close(svc->conns);
}

static bool method_matches(const mock_route *r, const char *method)
{
    return (r->method[0] == '*' && r->method[1] == '\0') || strcmp(r->method, method) == 0;
}

void mock_service_handle(mock_conn *c, const mock_request *req)
{
    mock_service *svc = mock_conn_service(c);
    svc->requests++;
    mock_params params;
    params.n = 0;
    params.query = NULL;
    params.query_len = 0;
    const char *path = req->url;
    size_t len = req->url_len;
    const char *q = memchr(path, '?', len);
    if (q) {
        params.query = q + 1;
        params.query_len = len - (size_t)(q + 1 - path);
        len = (size_t)(q - path);
    }
    const char *frag = memchr(path, '#', len);
    if (frag)
        len = (size_t)(frag - path);

    for (size_t i = 0; i < svc->nroutes; i++) {
        mock_route *r = &svc->routes[i];
        if (!method_matches(r, req->method) || !mock_pattern_match(&r->pattern, path, len, &params))
            continue;
        r->seen++;
        svc->hits[r->hit_slot].n++;
        mock_fault fault = (r->seen % r->fault_every == 0) ? r->fault : MOCK_FAULT_NONE;
        ev_tstamp delay = (r->slow_every && r->seen % r->slow_every == 0) ? r->slow_s
                                                                            : r->latency_s;
        mock_response_route(c, req, r, &params, fault, delay);
        return;
    }
    svc->unmatched++;
    json_t *body = json_pack("{s:s, s:s, s:s, s:s%}", "error", "no route matches",
                             "service", svc->name, "method", req->method, "path", path, len);
    mock_response_json(c, req, 404, body);
}

void mock_service_free(mock_service *svc)
{
    mock_service_refuse(svc);
    mock_routes_free(svc->routes, svc->nroutes);
    for (size_t i = 0; i < svc->nhits; i++)
        free(svc->hits[i].key);
    free(svc->hits);
    free(svc->name);
}
