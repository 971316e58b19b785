/*
 * mock_config.c -- reading and validating the aggway-mock config and route specs.
 *
 * The file format is documented in README.md. Validation is strict (unknown fields are errors)
 * because a typo such as "latncy_ms" would otherwise silently produce a fast upstream and a
 * confusing test. Every message names the place: "demo.json: services.product.routes[0].
 * latency_ms: must be an integer between 0 and 3600000".
 */
#include "mock.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

static const struct {
    const char *name;
    mock_fault fault;
} faults[] = {
    {"none", MOCK_FAULT_NONE},         {"hang", MOCK_FAULT_HANG},
    {"reset", MOCK_FAULT_RESET},       {"short", MOCK_FAULT_SHORT},
    {"chunked", MOCK_FAULT_CHUNKED},   {"non_json", MOCK_FAULT_NON_JSON},
    {"invalid_utf8", MOCK_FAULT_INVALID_UTF8}, {"huge", MOCK_FAULT_HUGE},
    {"drip", MOCK_FAULT_DRIP},         {"close_idle", MOCK_FAULT_CLOSE_IDLE},
    {"garbage", MOCK_FAULT_GARBAGE},
};

static const char *const route_fields[] = {
    "method",     "path",       "status",     "headers",       "json",      "body",
    "content_type", "latency_ms", "fault",    "fault_every",   "slow_every", "slow_ms",
    "huge_bytes", "drip_ms",    "idle_close_ms", "each", "each_missing", NULL,
};

/* Fails on the first key of obj that is not in allowed. */
static int check_fields(json_t *obj, const char *const *allowed, char *err, size_t errlen)
{
    const char *key;
    json_t *val;
    json_object_foreach(obj, key, val) {
        size_t i = 0;
        while (allowed[i] && strcmp(allowed[i], key) != 0)
            i++;
        if (!allowed[i]) {
            snprintf(err, errlen, "%s: unknown field", key);
            return -1;
        }
    }
    return 0;
}

/* Reads optional integer field name of obj within [min, max] into *out (def when absent). */
static int get_int(json_t *obj, const char *name, long long min, long long max, long long def,
                   long long *out, char *err, size_t errlen)
{
    json_t *v = json_object_get(obj, name);
    if (!v) {
        *out = def;
        return 0;
    }
    if (!json_is_integer(v) || json_integer_value(v) < min || json_integer_value(v) > max) {
        snprintf(err, errlen, "%s: must be an integer between %lld and %lld", name, min, max);
        return -1;
    }
    *out = json_integer_value(v);
    return 0;
}

/* Reads optional string field name of obj into *out (def when absent; borrowed pointer). */
static int get_str(json_t *obj, const char *name, const char *def, const char **out, char *err,
                   size_t errlen)
{
    json_t *v = json_object_get(obj, name);
    if (!v) {
        *out = def;
        return 0;
    }
    if (!json_is_string(v)) {
        snprintf(err, errlen, "%s: must be a string", name);
        return -1;
    }
    *out = json_string_value(v);
    return 0;
}

int mock_route_parse(json_t *spec, mock_route *r, char *err, size_t errlen)
{
    memset(r, 0, sizeof *r);
    if (!json_is_object(spec)) {
        snprintf(err, errlen, "must be an object");
        return -1;
    }
    r->spec = json_incref(spec);
    if (check_fields(spec, route_fields, err, errlen) < 0)
        return -1;

    const char *method, *path, *fault, *ctype;
    if (get_str(spec, "method", "GET", &method, err, errlen) < 0 ||
        get_str(spec, "path", NULL, &path, err, errlen) < 0 ||
        get_str(spec, "fault", "none", &fault, err, errlen) < 0 ||
        get_str(spec, "content_type", NULL, &ctype, err, errlen) < 0)
        return -1;
    if (!path) {
        snprintf(err, errlen, "path: required (e.g. \"/products/{id}\")");
        return -1;
    }
    if (!*method || strspn(method, "ABCDEFGHIJKLMNOPQRSTUVWXYZ*") != strlen(method)) {
        snprintf(err, errlen, "method: must be an upper-case HTTP method or \"*\"");
        return -1;
    }
    r->method = agw_strdup(method);
    char perr[200];
    if (mock_pattern_compile(&r->pattern, path, perr, sizeof perr) < 0) {
        snprintf(err, errlen, "path: %s", perr);
        return -1;
    }
    size_t klen = strlen(method) + strlen(path) + 2;
    r->key = agw_malloc(klen);
    snprintf(r->key, klen, "%s %s", method, path);

    size_t i = 0;
    while (i < sizeof faults / sizeof faults[0] && strcmp(faults[i].name, fault) != 0)
        i++;
    if (i == sizeof faults / sizeof faults[0]) {
        snprintf(err, errlen,
                 "fault: unknown fault \"%s\" (expected hang, reset, short, chunked, non_json, "
                 "invalid_utf8, huge, drip, close_idle or garbage)",
                 fault);
        return -1;
    }
    r->fault = faults[i].fault;

    long long status, latency, every, slow_every, slow, huge, drip, idle;
    if (get_int(spec, "status", 100, 999, 200, &status, err, errlen) < 0 ||
        get_int(spec, "latency_ms", 0, 3600000, 0, &latency, err, errlen) < 0 ||
        get_int(spec, "fault_every", 1, 1000000000, 1, &every, err, errlen) < 0 ||
        get_int(spec, "slow_every", 0, 1000000000, 0, &slow_every, err, errlen) < 0 ||
        get_int(spec, "slow_ms", 0, 3600000, 0, &slow, err, errlen) < 0 ||
        get_int(spec, "huge_bytes", 16, 1LL << 40, 16LL << 20, &huge, err, errlen) < 0 ||
        get_int(spec, "drip_ms", 1, 3600000, 50, &drip, err, errlen) < 0 ||
        get_int(spec, "idle_close_ms", 0, 3600000, 20, &idle, err, errlen) < 0)
        return -1;
    r->status = (int)status;
    r->latency_s = (ev_tstamp)latency / 1000.0;
    r->fault_every = (unsigned)every;
    r->slow_every = (unsigned)slow_every;
    r->slow_s = (ev_tstamp)slow / 1000.0;
    r->huge_bytes = (uint64_t)huge;
    r->drip_s = (ev_tstamp)drip / 1000.0;
    r->idle_close_s = (ev_tstamp)idle / 1000.0;

    json_t *jbody = json_object_get(spec, "json");
    json_t *tbody = json_object_get(spec, "body");
    if (jbody && tbody) {
        snprintf(err, errlen, "json, body: give one of them, not both");
        return -1;
    }
    if (tbody && !json_is_string(tbody)) {
        snprintf(err, errlen, "body: must be a string (use \"json\" for a JSON value)");
        return -1;
    }
    if (jbody) {
        mock_template_json(&r->body, jbody);
        if (!ctype)
            ctype = "application/json";
    } else if (tbody) {
        mock_template_text(&r->body, json_string_value(tbody), json_string_length(tbody));
        if (!ctype)
            ctype = "text/plain";
    }
    const char *each;
    if (get_str(spec, "each", NULL, &each, err, errlen) < 0)
        return -1;
    if (each) {
        if (!jbody || !*each) {
            snprintf(err, errlen, "each: a query parameter name, with a json body to repeat per value");
            return -1;
        }
        r->each = agw_strdup(each);
    }
    json_t *missing = json_object_get(spec, "each_missing");
    if (missing) {
        size_t k;
        json_t *m;
        bool ok = each && json_is_array(missing);
        json_array_foreach(missing, k, m) ok = ok && json_is_string(m);
        if (!ok) {
            snprintf(err, errlen, "each_missing: a list of strings, with each");
            return -1;
        }
        r->each_missing = missing;
    }
    json_t *headers = json_object_get(spec, "headers");
    if (headers && !json_is_object(headers)) {
        snprintf(err, errlen, "headers: must be an object of header name to string value");
        return -1;
    }
    return mock_response_prepare(r, ctype, headers, err, errlen);
}

void mock_route_free(mock_route *r)
{
    free(r->method);
    free(r->key);
    mock_pattern_free(&r->pattern);
    free(r->head);
    free(r->head_json);
    mock_template_free(&r->body);
    free(r->each);
    json_decref(r->spec);
    memset(r, 0, sizeof *r);
}

int mock_routes_parse(json_t *arr, mock_route **out, size_t *n, char *err, size_t errlen)
{
    *out = NULL;
    *n = 0;
    if (!json_is_array(arr)) {
        snprintf(err, errlen, "routes: must be an array of route objects");
        return -1;
    }
    size_t count = json_array_size(arr);
    mock_route *routes = agw_malloc((count ? count : 1) * sizeof *routes);
    for (size_t i = 0; i < count; i++) {
        char rerr[400];
        if (mock_route_parse(json_array_get(arr, i), &routes[i], rerr, sizeof rerr) < 0) {
            snprintf(err, errlen, "routes[%zu].%s", i, rerr);
            mock_routes_free(routes, i + 1);
            return -1;
        }
    }
    *out = routes;
    *n = count;
    return 0;
}

void mock_routes_free(mock_route *routes, size_t n)
{
    for (size_t i = 0; i < n; i++)
        mock_route_free(&routes[i]);
    free(routes);
}

static mock_service *add_service(mock_server *srv, const char *name, int port)
{
    mock_service *svc = agw_malloc(sizeof *svc);
    memset(svc, 0, sizeof *svc);
    svc->name = agw_strdup(name);
    svc->port = port;
    svc->srv = srv;
    svc->lfd = -1;
    return svc;
}

static bool port_taken(const mock_server *srv, int port)
{
    if (srv->admin && srv->admin->port == port)
        return true;
    for (size_t i = 0; i < srv->nservices; i++)
        if (srv->services[i].port == port)
            return true;
    return false;
}

static const char *const top_fields[] = {"admin", "host", "services", NULL};
static const char *const service_fields[] = {"port", "routes", "refuse", NULL};

/* Validates and installs one service; messages are prefixed by the caller. */
static int load_service(mock_server *srv, const char *name, json_t *spec, char *err,
                        size_t errlen)
{
    if (!json_is_object(spec)) {
        snprintf(err, errlen, "must be an object with port and routes");
        return -1;
    }
    if (check_fields(spec, service_fields, err, errlen) < 0)
        return -1;
    long long port;
    if (!json_object_get(spec, "port")) {
        snprintf(err, errlen, "port: required");
        return -1;
    }
    if (get_int(spec, "port", 1, 65535, 0, &port, err, errlen) < 0)
        return -1;
    if (port_taken(srv, (int)port)) {
        snprintf(err, errlen, "port: %lld is already used by another service or the admin port",
                 port);
        return -1;
    }
    json_t *refuse = json_object_get(spec, "refuse");
    if (refuse && !json_is_boolean(refuse)) {
        snprintf(err, errlen, "refuse: must be true or false");
        return -1;
    }
    json_t *jroutes = json_object_get(spec, "routes");
    mock_route *routes = NULL;
    size_t n = 0;
    if (jroutes && mock_routes_parse(jroutes, &routes, &n, err, errlen) < 0)
        return -1;
    mock_service *svc = add_service(srv, name, (int)port);
    svc->refused = json_is_true(refuse);
    mock_service_set_routes(svc, routes, n);
    srv->services = agw_realloc(srv->services, (srv->nservices + 1) * sizeof *srv->services);
    srv->services[srv->nservices++] = *svc; /* the array owns the service from here */
    free(svc);
    return 0;
}

int mock_config_load(mock_server *srv, const char *path, char *err, size_t errlen)
{
    json_error_t jerr;
    json_t *root = json_load_file(path, JSON_REJECT_DUPLICATES, &jerr);
    if (!root) {
        if (jerr.line > 0)
            snprintf(err, errlen, "%s:%d:%d: %s", path, jerr.line, jerr.column, jerr.text);
        else
            snprintf(err, errlen, "%s", jerr.text);
        return -1;
    }
    char e[600];
    int rc = -1;
    long long admin;
    const char *host;
    json_t *services = json_object_get(root, "services");
    if (!json_is_object(root)) {
        snprintf(e, sizeof e, "the top level must be an object with admin and services");
        goto out;
    }
    if (check_fields(root, top_fields, e, sizeof e) < 0 ||
        get_str(root, "host", "127.0.0.1", &host, e, sizeof e) < 0)
        goto out;
    if (!json_object_get(root, "admin")) {
        snprintf(e, sizeof e, "admin: required (the admin port, e.g. 9100)");
        goto out;
    }
    if (get_int(root, "admin", 1, 65535, 0, &admin, e, sizeof e) < 0)
        goto out;
    if (!json_is_object(services)) {
        snprintf(e, sizeof e, "services: required, an object of service name to service");
        goto out;
    }
    srv->host = agw_strdup(host);
    srv->admin = add_service(srv, "admin", (int)admin);
    srv->admin->is_admin = true;
    const char *name;
    json_t *spec;
    json_object_foreach(services, name, spec) {
        char se[500];
        if (strcmp(name, "unmatched") == 0 || !*name || strchr(name, '/')) {
            snprintf(e, sizeof e, "services.%s: invalid service name", name);
            goto out;
        }
        if (load_service(srv, name, spec, se, sizeof se) < 0) {
            snprintf(e, sizeof e, "services.%s.%s", name, se);
            goto out;
        }
    }
    rc = 0;
out:
    if (rc < 0)
        snprintf(err, errlen, "%s: %s", path, e);
    json_decref(root);
    return rc;
}

json_t *mock_config_dump(const mock_server *srv)
{
    json_t *services = json_object();
    for (size_t i = 0; i < srv->nservices; i++) {
        const mock_service *svc = &srv->services[i];
        json_t *routes = json_array();
        for (size_t j = 0; j < svc->nroutes; j++)
            json_array_append(routes, svc->routes[j].spec);
        json_object_set_new(services, svc->name,
                            json_pack("{s:i, s:b, s:o}", "port", svc->port, "refuse",
                                      svc->refused, "routes", routes));
    }
    return json_pack("{s:s, s:i, s:o}", "host", srv->host, "admin", srv->admin->port,
                     "services", services);
}
