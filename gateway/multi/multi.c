/* multi.c: the batch endpoint (multi.h). */
#include "multi/multi.h"

#include "base/buf.h"
#include "base/header.h"
#include "base/http_status.h"
#include "json/json.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

typedef agw_multi_t multi_t;

/* One entry: a request of its own on a connection that stands for the batch's client. */
typedef struct entry {
    h2o_conn_t conn;      /* first: the callbacks find the entry from it */
    h2o_req_t req;
    h2o_ostream_t ostr;   /* the end of the entry's output: collects it into body */
    multi_t *m;
    agw_buf_t body;       /* the entry's response body */
    agw_buf_t headers;    /* its selected response headers, as a JSON object */
    int status;
    int is_json;          /* its content-type says JSON (read when it was answered) */
    int answered;         /* its response has ended (or the deadline answered for it) */
    int disposed;         /* h2o_dispose_request ran */
} entry_t;

struct multi {
    h2o_req_t *req;       /* the batch's request; NULL once it is gone */
    multi_t **slot;       /* in req's memory: lets req's disposal find the batch */
    agw_multi_conf_t conf;
    entry_t **entries;
    size_t n, pending;    /* entries, and those not answered yet */
    ev_timer deadline;
    ev_timer reap;        /* disposes answered entries outside h2o's send path */
    int replied;
};

static const h2o_conn_callbacks_t entry_callbacks;

/* ---- the entry's connection: the batch client's addresses ---------------------------------- */

static socklen_t get_sockname(h2o_conn_t *c, struct sockaddr *sa)
{
    entry_t *e = (entry_t *)c;
    h2o_conn_t *p = e->m->req ? e->m->req->conn : NULL;
    return p && p->callbacks->get_sockname ? p->callbacks->get_sockname(p, sa) : 0;
}

static socklen_t get_peername(h2o_conn_t *c, struct sockaddr *sa)
{
    entry_t *e = (entry_t *)c;
    h2o_conn_t *p = e->m->req ? e->m->req->conn : NULL;
    return p && p->callbacks->get_peername ? p->callbacks->get_peername(p, sa) : 0;
}

static const h2o_conn_callbacks_t entry_callbacks = {
    .get_sockname = get_sockname,
    .get_peername = get_peername,
};

int agw_multi_is_entry(const h2o_req_t *req)
{
    return req->conn->callbacks == &entry_callbacks;
}

/* ---- the answer ------------------------------------------------------------------------------ */

static void free_multi(multi_t *m)
{
    for (size_t i = 0; i < m->n; i++) {
        agw_buf_free(&m->entries[i]->body);
        agw_buf_free(&m->entries[i]->headers);
        free(m->entries[i]);
    }
    free(m->entries);
    free(m);
}

/* Frees m once it has answered and every entry is disposed. */
static void maybe_free(multi_t *m)
{
    if (!m->replied)
        return;
    for (size_t i = 0; i < m->n; i++)
        if (!m->entries[i]->disposed)
            return;
    if (m->slot)
        *m->slot = NULL;
    ev_timer_stop(m->conf.loop, &m->deadline);
    ev_timer_stop(m->conf.loop, &m->reap);
    free_multi(m);
}

static int is_json_type(const char *ct, size_t len)
{
    for (size_t i = 0; i + 4 <= len; i++)
        if (strncasecmp(ct + i, "json", 4) == 0)
            return 1;
    return 0;
}

static void send_envelope(multi_t *m, int status, const char *type, const char *body, size_t len)
{
    h2o_req_t *req = m->req;
    req->res.status = status;
    req->res.reason = agw_http_reason(status);
    h2o_add_header(&req->pool, &req->res.headers, H2O_TOKEN_CONTENT_TYPE, NULL, type, strlen(type));
    h2o_add_header(&req->pool, &req->res.headers, H2O_TOKEN_CACHE_CONTROL, NULL, H2O_STRLIT("no-store"));
    req->res.content_length = len;
    if (m->conf.record)
        m->conf.record(m->conf.record_data, req, status, len);
    h2o_send_inline(req, body, len);
}

static void reply(multi_t *m)
{
    if (m->replied)
        return;
    m->replied = 1;
    ev_timer_stop(m->conf.loop, &m->deadline);
    if (m->req == NULL)
        return;
    agw_buf_t b = AGW_BUF_INIT;
    agw_buf_puts(&b, "{\"responses\":[");
    for (size_t i = 0; i < m->n; i++) {
        entry_t *e = m->entries[i];
        agw_buf_printf(&b, "%s{\"status\":%d,\"headers\":", i ? "," : "", e->status);
        if (e->headers.len)
            agw_buf_append(&b, e->headers.base, e->headers.len);
        else
            agw_buf_puts(&b, "{}");
        if (e->body.len) {
            int compact;
            char err[64];
            agw_buf_puts(&b, ",\"body\":");
            if (e->is_json && agw_json_validate(e->body.base, e->body.len, AGW_JSON_MAX_DEPTH, &compact, err, sizeof(err)) == 0) {
                agw_buf_append(&b, e->body.base, e->body.len);
            } else if (agw_json_encode_string(&b, e->body.base, e->body.len) != 0) {
                agw_buf_puts(&b, "null");
            }
        }
        agw_buf_putc(&b, '}');
    }
    agw_buf_puts(&b, "]}");
    const char *refused = m->conf.admit ? m->conf.admit(m->conf.record_data, m->req, b.len) : NULL;
    if (refused) {
        send_envelope(m, 503, "application/problem+json", refused, strlen(refused));
    } else {
        send_envelope(m, 200, "application/json", b.base, b.len);
    }
    agw_buf_free(&b);
}

/* ---- an entry's life ------------------------------------------------------------------------- */

/* response headers an entry's answer keeps */
static const char *const KEPT[] = {"content-type", "cache-control", "retry-after", "location", "etag",
                                   "www-authenticate", "x-aggregation-completed", "ratelimit", "ratelimit-policy",
                                   NULL};

static void capture_headers(entry_t *e)
{
    agw_buf_t *b = &e->headers;
    agw_buf_putc(b, '{');
    int first = 1;
    const h2o_headers_t *hs = &e->req.res.headers;
    for (size_t i = 0; i < hs->size; i++) {
        const h2o_header_t *h = &hs->entries[i];
        int keep = 0;
        for (size_t k = 0; KEPT[k]; k++)
            if (h2o_lcstris(h->name->base, h->name->len, KEPT[k], strlen(KEPT[k])))
                keep = 1;
        if (!keep)
            continue;
        if (!first)
            agw_buf_putc(b, ',');
        first = 0;
        agw_json_encode_string(b, h->name->base, h->name->len);
        agw_buf_putc(b, ':');
        agw_json_encode_string(b, h->value.base, h->value.len);
    }
    agw_buf_putc(b, '}');
}

static void entry_answered(entry_t *e, int status)
{
    if (e->answered)
        return;
    e->answered = 1;
    e->status = status;
    multi_t *m = e->m;
    m->pending--;
    if (!ev_is_active(&m->reap))
        ev_timer_start(m->conf.loop, &m->reap);
}

static void on_entry_send(h2o_ostream_t *self, h2o_req_t *req, h2o_iovec_t *bufs, size_t bufcnt,
                          h2o_send_state_t state)
{
    entry_t *e = H2O_STRUCT_FROM_MEMBER(entry_t, ostr, self);
    for (size_t i = 0; i < bufcnt; i++)
        agw_buf_append(&e->body, bufs[i].base, bufs[i].len);
    if (state == H2O_SEND_STATE_IN_PROGRESS) {
        h2o_proceed_response(req);
        return;
    }
    if (e->answered)
        return;
    capture_headers(e);
    ssize_t ct = h2o_find_header(&req->res.headers, H2O_TOKEN_CONTENT_TYPE, -1);
    if (ct >= 0)
        e->is_json = is_json_type(req->res.headers.entries[ct].value.base, req->res.headers.entries[ct].value.len);
    entry_answered(e, state == H2O_SEND_STATE_FINAL ? req->res.status : 502);
}

static void dispose_entry(entry_t *e)
{
    if (e->disposed)
        return;
    e->disposed = 1;
    h2o_dispose_request(&e->req);
}

/* answered entries are disposed here, outside the send that answered them */
static void on_reap(struct ev_loop *loop, ev_timer *t, int revents)
{
    (void)loop, (void)revents;
    multi_t *m = t->data;
    for (size_t i = 0; i < m->n; i++)
        if (m->entries[i]->answered)
            dispose_entry(m->entries[i]);
    if (m->pending == 0)
        reply(m);
    maybe_free(m);
}

static void on_deadline(struct ev_loop *loop, ev_timer *t, int revents)
{
    (void)loop, (void)revents;
    multi_t *m = t->data;
    for (size_t i = 0; i < m->n; i++) {
        entry_t *e = m->entries[i];
        if (e->answered)
            continue;
        e->body.len = 0;
        agw_buf_puts(&e->body, "{\"type\":\"urn:aggway:problem:deadline-exceeded\",\"title\":\"the batch's deadline "
                               "passed before this request was answered\",\"status\":504}");
        agw_buf_puts(&e->headers, "{\"content-type\":\"application/problem+json\"}");
        e->is_json = 1;
        entry_answered(e, 504);
        dispose_entry(e); /* cancels what it started */
    }
    reply(m);
    maybe_free(m);
}

/* Cancels every entry of m, which will never answer (its request is gone or going). */
static void cancel_all(multi_t *m)
{
    m->replied = 1; /* nobody to answer */
    ev_timer_stop(m->conf.loop, &m->deadline);
    for (size_t i = 0; i < m->n; i++)
        dispose_entry(m->entries[i]);
    maybe_free(m);
}

static void on_parent_dispose(void *p)
{
    multi_t **slot = p;
    multi_t *m = *slot;
    if (m == NULL)
        return;
    if (!m->replied && m->conf.abandoned)
        m->conf.abandoned(m->conf.record_data, m->req, m->pending);
    m->req = NULL;
    m->slot = NULL;
    cancel_all(m);
}

void agw_multi_abandon(multi_t *m)
{
    if (m->slot) /* req's disposal finds nothing to do */
        *m->slot = NULL;
    m->slot = NULL;
    m->req = NULL;
    cancel_all(m);
}

/* ---- the envelope ---------------------------------------------------------------------------- */

static int bad_envelope(multi_t *m, const char *detail)
{
    agw_buf_t b = AGW_BUF_INIT;
    agw_buf_puts(&b, "{\"type\":\"urn:aggway:problem:bad-batch\",\"title\":\"the batch request is malformed\","
                     "\"status\":400,\"detail\":");
    agw_json_encode_string(&b, detail, strlen(detail));
    agw_buf_putc(&b, '}');
    m->replied = 1;
    send_envelope(m, 400, "application/problem+json", b.base, b.len);
    agw_buf_free(&b);
    return -1;
}

/* Checks entry i of the envelope; the reason (naming the entry) in err. */
static int check_entry(json_t *r, size_t i, char *err, size_t errlen)
{
    if (!json_is_object(r)) {
        snprintf(err, errlen, "requests[%zu]: must be an object like {\"method\": \"GET\", \"path\": \"/x\"}", i);
        return -1;
    }
    const char *key;
    json_t *v;
    json_object_foreach(r, key, v) {
        if (strcmp(key, "method") && strcmp(key, "path") && strcmp(key, "headers") && strcmp(key, "body")) {
            snprintf(err, errlen, "requests[%zu].%.40s: unknown member (method, path, headers, body)", i, key);
            return -1;
        }
    }
    json_t *method = json_object_get(r, "method");
    if (method) {
        const char *s = json_string_value(method);
        if (!s || !*s || strspn(s, "ABCDEFGHIJKLMNOPQRSTUVWXYZ") != strlen(s) || strlen(s) > 16) {
            snprintf(err, errlen, "requests[%zu].method: must be an HTTP method like \"GET\"", i);
            return -1;
        }
    }
    const char *path = json_string_value(json_object_get(r, "path"));
    if (!path || path[0] != '/' || strlen(path) > 8192 || strpbrk(path, " \t\r\n#") != NULL) {
        snprintf(err, errlen, "requests[%zu].path: must be a path of this gateway starting with '/'", i);
        return -1;
    }
    json_t *headers = json_object_get(r, "headers");
    if (headers) {
        if (!json_is_object(headers)) {
            snprintf(err, errlen, "requests[%zu].headers: must be an object of name to string value", i);
            return -1;
        }
        json_object_foreach(headers, key, v) {
            const char *s = json_string_value(v);
            size_t kl = strlen(key);
            /* (a value as h2o asks of one on the wire: an entry's headers are read by the script
             * and the edge as the client's) */
            int bad = !s || !agw_header_is_token(key, kl) || agw_header_has_control(s, json_string_length(v)) ||
                      !strcasecmp(key, "content-length") || !strcasecmp(key, "transfer-encoding") ||
                      !strcasecmp(key, "host") || !strcasecmp(key, "connection");
            if (bad) {
                snprintf(err, errlen,
                         "requests[%zu].headers.%.40s: must be a valid header (a token, and a string value "
                         "without control characters) and not host, connection, content-length or "
                         "transfer-encoding",
                         i, key);
                return -1;
            }
        }
    }
    return 0;
}

static entry_t *start_entry(multi_t *m, json_t *r)
{
    h2o_req_t *parent = m->req;
    entry_t *e = calloc(1, sizeof(*e));
    if (e == NULL)
        abort();
    e->m = m;
    e->conn.ctx = parent->conn->ctx;
    e->conn.hosts = parent->conn->hosts;
    e->conn.connected_at = parent->conn->connected_at;
    e->conn.id = parent->conn->id;
    e->conn.callbacks = &entry_callbacks;
    h2o_req_t *req = &e->req;
    h2o_init_request(req, &e->conn, NULL);
    const char *method = json_string_value(json_object_get(r, "method"));
    if (method == NULL)
        method = "GET";
    const char *path = json_string_value(json_object_get(r, "path"));
    req->input.scheme = parent->input.scheme;
    req->input.authority = h2o_strdup(&req->pool, parent->input.authority.base, parent->input.authority.len);
    req->input.method = h2o_strdup(&req->pool, method, strlen(method));
    req->input.path = h2o_strdup(&req->pool, path, strlen(path));
    const char *q = strchr(req->input.path.base, '?');
    req->input.query_at = q ? (size_t)(q - req->input.path.base) : SIZE_MAX;
    req->version = 0x101;
    int has_type = 0;
    const char *key;
    json_t *v;
    json_object_foreach(json_object_get(r, "headers"), key, v) {
        size_t kl = strlen(key);
        char *lower = h2o_mem_alloc_pool(&req->pool, kl + 1);
        for (size_t i = 0; i <= kl; i++)
            lower[i] = (char)((key[i] >= 'A' && key[i] <= 'Z') ? key[i] + 32 : key[i]);
        const char *s = json_string_value(v);
        h2o_iovec_t val = h2o_strdup(&req->pool, s, json_string_length(v));
        h2o_add_header_by_str(&req->pool, &req->headers, lower, kl, 1, NULL, val.base, val.len);
        if (!strcmp(lower, "content-type"))
            has_type = 1;
    }
    json_t *body = json_object_get(r, "body");
    if (body && !json_is_null(body)) {
        if (json_is_string(body)) {
            req->entity = h2o_strdup(&req->pool, json_string_value(body), json_string_length(body));
        } else {
            /* (dump flags only: JSON_ALLOW_NUL is a parsing flag, and as a dump flag its bit is
             * JSON_INDENT(16), which made 8 KB of nested arrays a body of 128 MB) */
            char *s = json_dumps(body, JSON_COMPACT | JSON_ENCODE_ANY);
            req->entity = h2o_strdup(&req->pool, s ? s : "null", s ? strlen(s) : 4);
            free(s);
            if (!has_type)
                h2o_add_header(&req->pool, &req->headers, H2O_TOKEN_CONTENT_TYPE, NULL, H2O_STRLIT("application/json"));
        }
    }
    e->ostr.do_send = on_entry_send;
    req->_ostr_top = &e->ostr;
    return e;
}

multi_t *agw_multi_start(h2o_req_t *req, const agw_multi_conf_t *conf)
{
    multi_t *m = calloc(1, sizeof(*m));
    if (m == NULL)
        abort();
    m->req = req;
    m->conf = *conf;
    ev_timer_init(&m->deadline, on_deadline, (double)conf->deadline_ms / 1000.0, 0);
    m->deadline.data = m;
    ev_timer_init(&m->reap, on_reap, 0, 0);
    m->reap.data = m;
    m->slot = h2o_mem_alloc_shared(&req->pool, sizeof(*m->slot), on_parent_dispose);
    *m->slot = m;

    if (conf->max_values && req->entity.base &&
        agw_json_count_nodes(req->entity.base, req->entity.len, conf->max_values) > conf->max_values) {
        char why[160];
        snprintf(why, sizeof(why), "the envelope holds more than %zu values and member names (max_request_json_values "
                 "and 16 a request)", conf->max_values);
        bad_envelope(m, why);
        maybe_free(m);
        return NULL;
    }
    json_error_t jerr;
    json_t *doc = req->entity.base ? json_loadb(req->entity.base, req->entity.len, JSON_REJECT_DUPLICATES, &jerr) : NULL;
    json_t *list = json_is_object(doc) ? json_object_get(doc, "requests") : NULL;
    char err[256];
    int rc = 0;
    if (doc == NULL) {
        snprintf(err, sizeof(err), "the body must be JSON like {\"requests\": [{\"method\": \"GET\", \"path\": \"/x\"}]}%s%s",
                 req->entity.base ? ": " : "", req->entity.base ? jerr.text : "");
        rc = -1;
    } else if (!json_is_array(list) || json_array_size(list) == 0) {
        snprintf(err, sizeof(err), "requests: must be a non-empty list of requests");
        rc = -1;
    } else if (json_array_size(list) > conf->max_requests) {
        snprintf(err, sizeof(err), "requests: %zu requests, more than max_requests (%zu)", json_array_size(list),
                 conf->max_requests);
        rc = -1;
    } else if (json_object_size(doc) != 1) {
        snprintf(err, sizeof(err), "the envelope has members other than \"requests\"");
        rc = -1;
    }
    for (size_t i = 0; rc == 0 && i < json_array_size(list); i++)
        rc = check_entry(json_array_get(list, i), i, err, sizeof(err));
    if (rc != 0) {
        json_decref(doc);
        bad_envelope(m, err);
        maybe_free(m);
        return NULL;
    }
    m->n = json_array_size(list);
    m->entries = calloc(m->n, sizeof(*m->entries));
    if (m->entries == NULL)
        abort();
    for (size_t i = 0; i < m->n; i++)
        m->entries[i] = start_entry(m, json_array_get(list, i));
    json_decref(doc);
    m->pending = m->n;
    ev_timer_start(conf->loop, &m->deadline);
    /* every entry is set up before any runs: one answered at once must find the others there */
    for (size_t i = 0; i < m->n && m->req; i++)
        h2o_process_request(&m->entries[i]->req);
    /* the entries' answers come from the loop (on_reap), never from within this call: the batch
     * has not answered yet */
    return m;
}
