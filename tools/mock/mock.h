/*
 * mock.h -- aggway-mock, the scriptable mock upstream.
 *
 * One single-threaded libev process serves several fake services, each on its own port, plus
 * an admin port. Each service answers from a list of routes (path pattern -> canned answer,
 * latency, fault). The modules:
 *
 *   (buffers, allocation and reason phrases are the gateway's: gateway/base/buf.h, mem.h,
 *   http_status.h)
 *   mock_template.c  path patterns ("/products/{id}", "/static/" + "*") and body templates
 *   mock_config.c    reading and validating the JSON config and route specs
 *   mock_response.c  turning a matched route (and its fault) into bytes on the wire
 *   mock_conn.c      one HTTP/1.1 connection: parsing, pipelining, writing, fault behaviour
 *   mock_service.c   listening sockets, request dispatch, hit counters and stats
 *   mock_admin.c     the admin HTTP API (hits, stats, reset, routes, refuse/accept, config)
 *   mock_main.c      command line, signals, start-up
 *
 * Times are ev_tstamp seconds in memory (names end in _s); the config speaks milliseconds.
 */
#ifndef AGGWAY_MOCK_H
#define AGGWAY_MOCK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <ev.h>
#include <http_parser.h>
#include <jansson.h>

#include "base/buf.h"
#include "base/http_status.h"
#include "base/mem.h"

/* Requests (request line, headers and body) larger than this close the connection. */
#define MOCK_MAX_REQUEST_BYTES (1024 * 1024)
/* Most path captures one route may have. */
#define MOCK_MAX_PARAMS 16

/* ---- buffers and allocation: the gateway's own (gateway/base/buf.h, mem.h) ------------ */

/* ---- mock_template.c ------------------------------------------------------------------- */

/* Values a request offers to a template: path captures first, then query-string parameters. */
typedef struct mock_params {
    struct {
        const char *name, *val;  /* not NUL-terminated; point into the route and the URL */
        size_t name_len, val_len;
    } v[MOCK_MAX_PARAMS];
    size_t n;
    const char *query;  /* raw query string without '?', or NULL */
    size_t query_len;
} mock_params;

/* A compiled path pattern: literal or {param} segments, optionally ending in a "*" segment. */
typedef struct mock_pattern {
    struct {
        char *text;  /* literal text, or the parameter name when param */
        size_t len;
        bool param;
    } *segs;
    size_t n;
    bool rest;  /* pattern ended in a "*" segment: any remainder matches */
} mock_pattern;

/* One piece of a compiled body template. */
typedef enum {
    MOCK_SEG_LITERAL,    /* copy text as is */
    MOCK_SEG_RAW,        /* {name} in a text body: the value as is */
    MOCK_SEG_JSON_STR,   /* {name} inside a JSON string: the value JSON-escaped */
    MOCK_SEG_JSON_VALUE  /* a JSON string that is exactly "{name}": a number if the value is
                            an integer, else a quoted string */
} mock_seg_kind;

typedef struct mock_template {
    struct {
        mock_seg_kind kind;
        char *text;  /* literal bytes, or the parameter name */
        size_t len;
    } *segs;
    size_t n;
} mock_template;

/* Compiles a path such as "/products/{id}" or "/files/" + "*". Returns 0, or -1 with a
 * message. */
int mock_pattern_compile(mock_pattern *pt, const char *path, char *err, size_t errlen);
void mock_pattern_free(mock_pattern *pt);
/* Matches path (no query string) and appends captures to out. True on a match; out->n is
 * restored on a mismatch. */
bool mock_pattern_match(const mock_pattern *pt, const char *path, size_t len, mock_params *out);

/* Compiles a text body: each {name} becomes a MOCK_SEG_RAW. */
void mock_template_text(mock_template *t, const char *text, size_t len);
/* Compiles a JSON value into its compact serialization with {name} substitutions. */
void mock_template_json(mock_template *t, json_t *v);
void mock_template_free(mock_template *t);
/* Appends the rendered template to out. Names the request does not offer render as the literal
 * text "{name}". */
void mock_template_render(const mock_template *t, const mock_params *p, agw_buf_t *out);
/* The value of name (nlen bytes) in p: a path capture, else a query parameter (raw). True when
 * found; *val points into the request. */
bool mock_params_get(const mock_params *p, const char *name, size_t nlen, const char **val,
                     size_t *vlen);

/* ---- mock_config.c --------------------------------------------------------------------- */

typedef enum {
    MOCK_FAULT_NONE,
    MOCK_FAULT_HANG,          /* read the request, never answer */
    MOCK_FAULT_RESET,         /* headers and half the body, then RST */
    MOCK_FAULT_SHORT,         /* Content-Length N, N/2 bytes, then FIN */
    MOCK_FAULT_CHUNKED,       /* chunked body in several chunks plus an X-Checksum trailer */
    MOCK_FAULT_NON_JSON,      /* Content-Type: application/json, HTML body */
    MOCK_FAULT_INVALID_UTF8,  /* JSON body with \xff\xfe inside a string */
    MOCK_FAULT_HUGE,          /* valid JSON body of huge_bytes, streamed */
    MOCK_FAULT_DRIP,          /* one byte every drip_ms */
    MOCK_FAULT_CLOSE_IDLE,    /* normal keep-alive answer, then FIN idle_close_ms later */
    MOCK_FAULT_GARBAGE        /* bytes that are not HTTP, then FIN */
} mock_fault;

/* One route of a service: what to match and how to answer. Built by mock_route_parse. */
typedef struct mock_route {
    char *method;         /* "GET", "POST", ... or "*" for any */
    char *key;            /* "METHOD /path" as shown by GET /hits */
    mock_pattern pattern;
    int status;
    char *head;           /* status line, Content-Type (if any) and extra headers, CRLF each */
    char *head_json;      /* the same with Content-Type forced to application/json */
    mock_template body;
    mock_fault fault;
    unsigned fault_every; /* the fault hits every Nth request of this route (1 = all) */
    ev_tstamp latency_s;  /* delay before the answer starts */
    unsigned slow_every;  /* every Nth request waits slow_s instead of latency_s (0 = never) */
    ev_tstamp slow_s;
    uint64_t huge_bytes;  /* body size for MOCK_FAULT_HUGE */
    ev_tstamp drip_s;     /* interval between bytes for MOCK_FAULT_DRIP */
    ev_tstamp idle_close_s;
    uint64_t seen;        /* requests this route matched since it was installed */
    size_t hit_slot;      /* index into the service's hit table */
    json_t *spec;         /* the route as given, for GET /config (owned reference) */
    char *each;           /* query parameter whose comma-separated values each get a copy of the
                             body in a JSON array ({each} = the value), or NULL */
    json_t *each_missing; /* values of `each` left out of that array (borrowed from spec) */
} mock_route;

typedef struct mock_service mock_service;
typedef struct mock_conn mock_conn;

/* The whole process: services, admin port and event loop. */
typedef struct mock_server {
    struct ev_loop *loop;
    char *host;              /* address every port binds to, default 127.0.0.1 */
    mock_service *services;  /* array of nservices */
    size_t nservices;
    mock_service *admin;     /* the admin port, served by mock_admin.c */
    bool record_requests;    /* keep each service's last requests for GET /requests (config
                                "record_requests", default true; false for benchmarks) */
} mock_server;

/* Parses one route spec (a JSON object) into r. On error returns -1 and writes a message that
 * names the field ("latency_ms: must be an integer >= 0"). r needs mock_route_free either way. */
int mock_route_parse(json_t *spec, mock_route *r, char *err, size_t errlen);
void mock_route_free(mock_route *r);
/* Parses a JSON array of route specs. On error the message starts with "routes[i].". */
int mock_routes_parse(json_t *arr, mock_route **out, size_t *n, char *err, size_t errlen);
void mock_routes_free(mock_route *routes, size_t n);
/* Loads and validates a config file into srv (services and admin created, nothing listening).
 * Returns 0, or -1 with a message naming the file, service, route index and field. */
int mock_config_load(mock_server *srv, const char *path, char *err, size_t errlen);
/* The current config as JSON (new reference). */
json_t *mock_config_dump(const mock_server *srv);

/* ---- mock_service.c -------------------------------------------------------------------- */

struct mock_service {
    char *name;
    int port;
    bool refused;          /* listener closed (config "refuse": true or POST .../refuse) */
    bool is_admin;
    mock_server *srv;
    mock_route *routes;    /* current routes, first match wins */
    size_t nroutes;
    struct {               /* hit counters by route key; keys survive route replacement */
        char *key;
        uint64_t n;
    } *hits;
    size_t nhits;
    uint64_t unmatched;    /* requests no route matched (answered 404) */
    json_t **received;     /* the last MOCK_RECEIVED_MAX requests, a ring: { seq, method, path,
                              headers } each (GET /requests), oldest at received_total % MAX */
    uint64_t received_total; /* requests recorded since start or reset (seq of the next one - 1) */
    uint64_t conns_open, conns_total, requests, in_flight;
    uint64_t conns_unused; /* open connections that have not begun a request (a client's idle spare) */
    int lfd;               /* listening socket, -1 when not listening */
    ev_io accept_w;
    mock_conn *conns;      /* open connections (doubly linked through mock_conn) */
};

/* A parsed request as the connection hands it to a service or to the admin API. */
typedef struct mock_request {
    const char *method;  /* "GET", ... */
    const char *url;     /* request target as sent, not NUL-terminated */
    size_t url_len;
    const char *headers; /* header fields as "name\0value\n" each, names as sent (service ports) */
    size_t headers_len;
    const char *body;    /* only collected on the admin port */
    size_t body_len;
    bool keep_alive;     /* false: answer with Connection: close and close afterwards */
    bool http10;         /* HTTP/1.0 client: say Connection: keep-alive when keeping it */
    bool head;           /* HEAD: send headers only */
} mock_request;

/* Requests a service remembers for GET /requests: older ones are dropped (and counted). */
#define MOCK_RECEIVED_MAX 256

/* Records req (method, path with query, headers; names lowercased, repeats joined with ", " as
 * RFC 9110 §5.3 allows) in svc's ring of received requests. */
void mock_service_record(mock_service *svc, const mock_request *req);
/* The requests svc received, oldest first: { "total": n, "dropped": n, "requests": [ … ] }
 * (new reference). */
json_t *mock_service_received(const mock_service *svc);

/* Installs routes on svc (taking ownership), freeing the previous ones. */
void mock_service_set_routes(mock_service *svc, mock_route *routes, size_t n);
/* Zeroes hit counters (keeping only current routes), requests, connections_total and forgets
 * the received requests. */
void mock_service_reset(mock_service *svc);
/* Opens the listening socket. Returns 0, or -1 with a message. */
int mock_service_listen(mock_service *svc, char *err, size_t errlen);
/* Closes the listening socket and every open connection of svc: new connections are refused. */
void mock_service_refuse(mock_service *svc);
/* Answers one request on a service port (route match, hits, latency, fault). */
void mock_service_handle(mock_conn *c, const mock_request *req);
void mock_service_free(mock_service *svc);

/* ---- mock_conn.c ----------------------------------------------------------------------- */

/* How a reply must be delivered. */
typedef struct mock_reply {
    mock_fault fault;
    ev_tstamp delay_s;       /* wait before the first byte */
    uint64_t huge_bytes;     /* MOCK_FAULT_HUGE: body bytes generated after the head */
    ev_tstamp drip_s;        /* MOCK_FAULT_DRIP */
    ev_tstamp idle_close_s;  /* MOCK_FAULT_CLOSE_IDLE */
    bool close;              /* close the connection after this reply */
} mock_reply;

/* Accepts fd on svc and starts serving it. */
void mock_conn_accept(mock_service *svc, int fd);
void mock_conn_close(mock_conn *c);
mock_service *mock_conn_service(const mock_conn *c);
/* Starts a reply: returns the buffer to append its wire bytes to (in request order). Must be
 * followed by mock_conn_reply_end. cut > 0 sends only the first cut bytes (reset, short). */
agw_buf_t *mock_conn_reply_begin(mock_conn *c, const mock_reply *rp);
void mock_conn_reply_end(mock_conn *c, size_t cut);

/* ---- mock_response.c ------------------------------------------------------------------- */

/* Builds r's head strings (status line, content type, extra headers). 0 or -1 with message. */
int mock_response_prepare(mock_route *r, const char *content_type, json_t *headers, char *err,
                          size_t errlen);
/* Sends the answer of route r with fault (may be MOCK_FAULT_NONE) after delay_s. */
void mock_response_route(mock_conn *c, const mock_request *req, const mock_route *r,
                         const mock_params *p, mock_fault fault, ev_tstamp delay_s);
/* Sends a plain immediate answer (admin API, 404s). */
void mock_response_simple(mock_conn *c, const mock_request *req, int status,
                          const char *content_type, const char *body, size_t len);
/* Sends json (compact, application/json) and drops the reference; NULL (a failed json_pack)
 * sends a 500. */
void mock_response_json(mock_conn *c, const mock_request *req, int status, json_t *json);
/* Appends n bytes at offset off of a valid JSON document that is total bytes long. */
void mock_response_huge_fill(agw_buf_t *out, uint64_t total, uint64_t off, size_t n);

/* ---- mock_admin.c ---------------------------------------------------------------------- */

/* Answers one request on the admin port. */
void mock_admin_handle(mock_conn *c, const mock_request *req);

#endif
