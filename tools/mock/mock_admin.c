/*
 * mock_admin.c -- the admin HTTP API of aggway-mock (JSON in, JSON out).
 *
 *   GET  /hits                      route hit counts per service (+ "unmatched")
 *   GET  /requests                  the last requests each service received (method, path, headers)
 *   GET  /services/NAME/requests    the same for one service
 *   GET  /stats                     connections_open, connections_unused, connections_total, requests,
 *                                   in_flight
 *   POST /reset                     zero hits, requests and connections_total
 *   PUT  /services/NAME/routes      replace NAME's routes (body: JSON array of routes)
 *   PATCH /services/NAME/routes     change one route, the others kept (body: a JSON object whose
 *                                   "path" and optional "method", default GET, name the route;
 *                                   its other members replace those fields, null removes one)
 *   POST /services/NAME/refuse      close NAME's listener and connections (connection refused)
 *   POST /services/NAME/accept      listen again
 *   GET  /config                    the current config
 *
 * The admin port is served by the same connection code as the services but never takes a
 * route, so no latency or fault ever applies to it.
 */
#include "mock.h"

#include <stdio.h>
#include <string.h>

static void reply_error(mock_conn *c, const mock_request *req, int status, const char *msg)
{
    mock_response_json(c, req, status, json_pack("{s:s}", "error", msg));
}

static json_t *hits_json(const mock_server *srv)
{
    json_t *all = json_object();
    for (size_t i = 0; i < srv->nservices; i++) {
        const mock_service *svc = &srv->services[i];
        json_t *h = json_object();
        for (size_t j = 0; j < svc->nhits; j++)
            json_object_set_new(h, svc->hits[j].key, json_integer((json_int_t)svc->hits[j].n));
        json_object_set_new(h, "unmatched", json_integer((json_int_t)svc->unmatched));
        json_object_set_new(all, svc->name, h);
    }
    return all;
}

static json_t *stats_json(const mock_server *srv)
{
    json_t *all = json_object();
    for (size_t i = 0; i < srv->nservices; i++) {
        const mock_service *svc = &srv->services[i];
        json_object_set_new(all, svc->name,
                            json_pack("{s:I, s:I, s:I, s:I, s:I, s:b}", "connections_open",
                                      (json_int_t)svc->conns_open, "connections_unused",
                                      (json_int_t)svc->conns_unused, "connections_total",
                                      (json_int_t)svc->conns_total, "requests",
                                      (json_int_t)svc->requests, "in_flight",
                                      (json_int_t)svc->in_flight, "listening", svc->lfd >= 0));
    }
    return all;
}

static json_t *received_json(const mock_server *srv)
{
    json_t *all = json_object();
    for (size_t i = 0; i < srv->nservices; i++)
        json_object_set_new(all, srv->services[i].name, mock_service_received(&srv->services[i]));
    return all;
}

static mock_service *find_service(mock_server *srv, const char *name, size_t len)
{
    for (size_t i = 0; i < srv->nservices; i++)
        if (strlen(srv->services[i].name) == len && !memcmp(srv->services[i].name, name, len))
            return &srv->services[i];
    return NULL;
}

static void put_routes(mock_conn *c, const mock_request *req, mock_service *svc)
{
    json_error_t jerr;
    json_t *arr = json_loadb(req->body, req->body_len, JSON_REJECT_DUPLICATES, &jerr);
    char err[600];
    if (!arr) {
        snprintf(err, sizeof err, "body: invalid JSON at line %d column %d: %s", jerr.line,
                 jerr.column, jerr.text);
        reply_error(c, req, 400, err);
        return;
    }
    mock_route *routes;
    size_t n;
    int rc = mock_routes_parse(arr, &routes, &n, err, sizeof err);
    json_decref(arr);
    if (rc < 0) {
        reply_error(c, req, 400, err);
        return;
    }
    mock_service_set_routes(svc, routes, n);
    mock_response_json(c, req, 200, json_pack("{s:s, s:I}", "service", svc->name, "routes",
                                              (json_int_t)n));
}

/* PATCH /services/NAME/routes: the route whose path (and method, default GET) the body names
 * gets the body's other members (null removes the field); every other route, and its request
 * count for fault_every and slow_every, is kept. The result is parsed as a PUT would be, so a
 * mistake is a 400 naming the field and nothing changes. */
static void patch_route(mock_conn *c, const mock_request *req, mock_service *svc)
{
    json_error_t jerr;
    json_t *patch = json_loadb(req->body, req->body_len, JSON_REJECT_DUPLICATES, &jerr);
    char err[600];
    if (!patch || !json_is_object(patch) || !json_is_string(json_object_get(patch, "path"))) {
        if (patch)
            snprintf(err, sizeof err, "body: must be an object with \"path\" naming the route "
                                      "(and \"method\" when it is not GET)");
        else
            snprintf(err, sizeof err, "body: invalid JSON at line %d column %d: %s", jerr.line,
                     jerr.column, jerr.text);
        json_decref(patch);
        reply_error(c, req, 400, err);
        return;
    }
    const char *path = json_string_value(json_object_get(patch, "path"));
    json_t *jm = json_object_get(patch, "method");
    const char *method = json_is_string(jm) ? json_string_value(jm) : "GET";
    size_t at = svc->nroutes;
    for (size_t i = 0; i < svc->nroutes && at == svc->nroutes; i++) {
        json_t *rp = json_object_get(svc->routes[i].spec, "path");
        if (json_is_string(rp) && !strcmp(json_string_value(rp), path) &&
            !strcmp(svc->routes[i].method, method))
            at = i;
    }
    if (at == svc->nroutes) {
        snprintf(err, sizeof err, "no %s %s route in service %s (see GET /config)", method, path,
                 svc->name);
        json_decref(patch);
        reply_error(c, req, 404, err);
        return;
    }
    json_t *arr = json_array();
    for (size_t i = 0; i < svc->nroutes; i++)
        json_array_append_new(arr, json_deep_copy(svc->routes[i].spec));
    json_t *changed = json_array_get(arr, at);
    const char *k;
    json_t *v;
    json_object_foreach(patch, k, v) {
        if (json_is_null(v))
            json_object_del(changed, k);
        else
            json_object_set(changed, k, v);
    }
    json_decref(patch);
    mock_route *routes;
    size_t n;
    int rc = mock_routes_parse(arr, &routes, &n, err, sizeof err);
    if (rc < 0) {
        json_decref(arr);
        reply_error(c, req, 400, err);
        return;
    }
    for (size_t i = 0; i < n; i++)
        if (i != at)
            routes[i].seen = svc->routes[i].seen;
    json_t *result = json_incref(routes[at].spec);
    json_decref(arr);
    mock_service_set_routes(svc, routes, n);
    mock_response_json(c, req, 200, json_pack("{s:s, s:o}", "service", svc->name, "route", result));
}

/* Handles /services/NAME/ACTION. */
static void service_action(mock_conn *c, const mock_request *req, const char *rest, size_t len)
{
    mock_server *srv = mock_conn_service(c)->srv;
    const char *slash = memchr(rest, '/', len);
    mock_service *svc = slash ? find_service(srv, rest, (size_t)(slash - rest)) : NULL;
    if (!svc) {
        reply_error(c, req, 404, "no such service (see GET /config)");
        return;
    }
    const char *action = slash + 1;
    size_t alen = len - (size_t)(action - rest);
    bool is_post = !strcmp(req->method, "POST");
    if (alen == 8 && !memcmp(action, "requests", 8)) {
        if (strcmp(req->method, "GET") != 0) {
            reply_error(c, req, 405, "use GET");
            return;
        }
        mock_response_json(c, req, 200, mock_service_received(svc));
    } else if (alen == 6 && !memcmp(action, "routes", 6)) {
        if (!strcmp(req->method, "PATCH")) {
            patch_route(c, req, svc);
            return;
        }
        if (strcmp(req->method, "PUT") != 0) {
            reply_error(c, req, 405, "use PUT with a JSON array of routes, or PATCH with one route's "
                                     "path and the fields to change");
            return;
        }
        put_routes(c, req, svc);
    } else if (alen == 6 && !memcmp(action, "refuse", 6)) {
        if (!is_post) {
            reply_error(c, req, 405, "use POST");
            return;
        }
        mock_service_refuse(svc);
        mock_response_json(c, req, 200, json_pack("{s:s, s:b}", "service", svc->name,
                                                  "listening", 0));
    } else if (alen == 6 && !memcmp(action, "accept", 6)) {
        if (!is_post) {
            reply_error(c, req, 405, "use POST");
            return;
        }
        char err[300];
        if (svc->lfd < 0 && mock_service_listen(svc, err, sizeof err) < 0) {
            reply_error(c, req, 500, err);
            return;
        }
        mock_response_json(c, req, 200, json_pack("{s:s, s:b}", "service", svc->name,
                                                  "listening", 1));
    } else {
        reply_error(c, req, 404, "unknown action (routes, refuse, accept or requests)");
    }
}

void mock_admin_handle(mock_conn *c, const mock_request *req)
{
    mock_server *srv = mock_conn_service(c)->srv;
    size_t len = req->url_len;
    const char *q = memchr(req->url, '?', len);
    if (q)
        len = (size_t)(q - req->url);
    const char *path = req->url;
    bool get = !strcmp(req->method, "GET") || req->head;

#define IS(p) (len == sizeof(p) - 1 && !memcmp(path, p, len))
    if (IS("/hits") && get) {
        mock_response_json(c, req, 200, hits_json(srv));
    } else if (IS("/requests") && get) {
        mock_response_json(c, req, 200, received_json(srv));
    } else if (IS("/stats") && get) {
        mock_response_json(c, req, 200, stats_json(srv));
    } else if (IS("/config") && get) {
        mock_response_json(c, req, 200, mock_config_dump(srv));
    } else if (IS("/reset") && !strcmp(req->method, "POST")) {
        for (size_t i = 0; i < srv->nservices; i++)
            mock_service_reset(&srv->services[i]);
        mock_response_json(c, req, 200, json_pack("{s:b}", "reset", 1));
    } else if (IS("/hits") || IS("/stats") || IS("/config") || IS("/reset") || IS("/requests")) {
        reply_error(c, req, 405, IS("/reset") ? "use POST" : "use GET");
    } else if (len > 10 && !memcmp(path, "/services/", 10)) {
        service_action(c, req, path + 10, len - 10);
    } else {
        reply_error(c, req, 404,
                    "unknown admin endpoint (GET /hits, GET /stats, GET /requests, POST /reset, "
                    "GET /config, PUT|PATCH /services/NAME/routes, POST /services/NAME/refuse|accept, "
                    "GET /services/NAME/requests)");
    }
#undef IS
}
