/* respond.c: core.respond, the transport's end of a response (lua/agg/contract.lua "respond" and
 * its response table): the status, the script's headers by the rules of script/resp_headers.h,
 * content-type and Server-Timing, the body (a string, or a Lua value encoded as JSON: json/json.h),
 * the partial-page metric, the access log line, and the response queued to h2o.
 *
 * A page (agg.page, DESIGN §2.2) comes in one of two shapes:
 *   body      the page's Lua table, name -> { status, data, error }, encoded by agw_json_encode
 *             (a page whose body a script read or replaced after agg.page, every failed page);
 *   rows      a 200 page whose body no script read: { name, status, data, error, … }, sorted by
 *             name, the members in contract.h's section order (agw_contract_section). It is
 *             encoded by agw_json_encode_rows to the same bytes the body's tables would give,
 *             without those tables: a section whose data no script read is a raw ref (the
 *             upstream's validated bytes, copied as they are) read with one table read.
 * The sections of either (for the partial-page metric and the access log) are read only when
 * the page is partial or the access log is on.
 */
#include "worker/worker_internal.h"

#include "worker/contract.h"
#include "base/http_status.h"

#include <string.h>

#include "json/json.h"
#include "base/log.h"

/* Adds a response header, its name and value copied into the request's pool (one block: the Lua
 * strings they come from may be gone before h2o writes them). */
static void add_header(h2o_req_t *req, const char *name, size_t nlen, const char *value, size_t vlen)
{
    char *n = h2o_mem_alloc_pool(&req->pool, nlen + vlen + 2);
    memcpy(n, name, nlen);
    n[nlen] = '\0';
    char *v = n + nlen + 1;
    memcpy(v, value, vlen);
    v[vlen] = '\0';
    h2o_add_header_by_str(&req->pool, &req->res.headers, n, nlen, 1, NULL, v, vlen);
}

#define AGW_WARN_REPEAT_S 10.0

int agw_worker_unsent_take(agw_worker_t *w, const wgen_t *g, h2o_req_t *req, size_t len, size_t *counted)
{
    agw_guard_conn_t *gc = req->version >= 0x200 ? agw_guard_conn_of(&w->guard, req) : NULL;
    if (gc == NULL)
        return 1;
    /* a client that opens no flow-control window (or reads nothing) while it asks for more made the
     * answers of its streams pile up in memory until send_timeout_s: 100 streams of 1 MB pages
     * held 100 MB a connection, 20 times that in batches */
    if (gc->unsent > 0 && gc->unsent + len > g->conf->clients.max_unsent_bytes)
        return 0;
    gc->unsent += len;
    *counted += len;
    return 1;
}

void agw_worker_unsent_done(agw_worker_t *w, h2o_req_t *req, size_t *counted)
{
    if (*counted == 0)
        return;
    agw_guard_conn_t *gc = agw_guard_conn_of(&w->guard, req); /* NULL once its connection is gone */
    if (gc)
        gc->unsent -= *counted < gc->unsent ? *counted : gc->unsent;
    *counted = 0;
}

/* Logs a warning of agw_resp_headers_read about a script's response header (data: the worker).
 * The same message is written at most once per AGW_WARN_REPEAT_S per worker; the next one after
 * that says how many were left out, so a script that sets a bad header on every response cannot
 * flood the log. The 16 most recent distinct messages are remembered (FNV-1a hash); a new message
 * while all 16 were logged less than AGW_WARN_REPEAT_S ago is left out and counted (many bad
 * headers per response, or a name that changes with every request, would otherwise evict each
 * other and all be written every time), so a worker writes at most 16 lines per interval. */
static void warn_header(void *data, const char *msg)
{
    agw_worker_t *w = data;
    uint64_t h = 1469598103934665603ull;
    for (const unsigned char *p = (const unsigned char *)msg; *p; p++)
        h = (h ^ *p) * 1099511628211ull;
    double now = ev_now(w->loop);
    size_t n = sizeof(w->log.warned) / sizeof(w->log.warned[0]), oldest = 0;
    for (size_t i = 0; i < n; i++) {
        if (w->log.warned[i].logged != 0 && w->log.warned[i].hash == h) {
            if (now - w->log.warned[i].logged < AGW_WARN_REPEAT_S) {
                w->log.warned[i].repeats++;
                return;
            }
            unsigned r = w->log.warned[i].repeats;
            w->log.warned[i].logged = now, w->log.warned[i].repeats = 0;
            if (r)
                agw_log(AGW_LOG_WARN, "worker %d: %s (%u more times since it was last logged)", w->id, msg, r);
            else
                agw_log(AGW_LOG_WARN, "worker %d: %s", w->id, msg);
            return;
        }
        if (w->log.warned[i].logged < w->log.warned[oldest].logged)
            oldest = i;
    }
    if (w->log.warned[oldest].logged != 0 && now - w->log.warned[oldest].logged < AGW_WARN_REPEAT_S) {
        w->log.warned_others++;
        return;
    }
    w->log.warned[oldest].hash = h, w->log.warned[oldest].logged = now, w->log.warned[oldest].repeats = 0;
    unsigned others = w->log.warned_others;
    w->log.warned_others = 0;
    if (others)
        agw_log(AGW_LOG_WARN, "worker %d: %s (%u other response header warnings were left out before it: at most "
                "%zu distinct ones are written per %.0f s)", w->id, msg, others, n, AGW_WARN_REPEAT_S);
    else
        agw_log(AGW_LOG_WARN, "worker %d: %s", w->id, msg);
}

void agw_worker_warn(agw_worker_t *w, const char *msg)
{
    warn_header(w, msg);
}

const char *const agw_worker_own_headers[] = {"cache-control", "content-type", "retry-after", "vary",
                                              "x-aggregation-completed", NULL};

/* core.respond(rid, response) -> true | false (client gone) | nil, err (body cannot be encoded;
 * nothing was sent). response (lua/agg/contract.lua): status; headers, a table name -> value
 * (names in any case; resp_headers.h says which are sent) or nil; body, a Lua value to encode as
 * JSON when json is true, else a string; default_type, the content-type unless headers has one;
 * server_timing; page, agg.page's verdict ("complete", "partial" or nil: not a page) and sections,
 * the page's sections (name -> { status, … }) for the partial-page metric and the access log;
 * rows, a page's body as rows (see the top), encoded in place of body and read in place of
 * sections. */
int agw_worker_respond(lua_State *L)
{
    agw_worker_t *w = agw_worker_upg(L)->w;
    uint64_t rid = (uint64_t)luaL_checknumber(L, 1);
    luaL_checktype(L, 2, LUA_TTABLE);
    lua_settop(L, 2);
    enum { STATUS = 3, HEADERS, BODY, JSON, DEFAULT_TYPE, SERVER_TIMING, PAGE, SECTIONS, ROWS };
    for (int i = 0; i < AGW_RESPONSE_FIELDS; i++) /* STATUS.. in the order of contract.h */
        agw_worker_get_key(L, 2, AGW_KEY_RESPONSE + i);
    _Static_assert(AGW_RESPONSE_STATUS == 0 && AGW_RESPONSE_ROWS == ROWS - STATUS, "field order");
    int status = (int)luaL_checkinteger(L, STATUS);
    int is_json = lua_toboolean(L, JSON);
    int rows = lua_istable(L, ROWS);
    reqref_t *rr = agw_slots_get(&w->tables.reqs, rid);
    if (rr == NULL) {
        lua_pushboolean(L, 0);
        return 1;
    }
    h2o_req_t *req = rr->req;
    agw_buf_t *b = &w->scratch.out;
    const char *body;
    size_t body_len;
    if (is_json) {
        char err[512];
        agw_buf_reset(b);
        int rc = rows ? agw_json_encode_rows(L, ROWS, agw_contract_section, AGW_SECTION_FIELDS, b, err, sizeof(err))
                      : agw_json_encode(L, BODY, b, err, sizeof(err));
        if (rc != 0) {
            lua_pushnil(L);
            lua_pushstring(L, err);
            return 2;
        }
        body = b->base;
        body_len = b->len;
    } else {
        body = lua_tolstring(L, BODY, &body_len);
        if (body == NULL)
            body = "", body_len = 0;
    }
    agw_slots_del(&w->tables.reqs, rid);
    rr->rid = 0;
    agw_worker_stop_client_watch(rr);
    int no_body = status == 204 || status == 304; /* no body, and no Content-Length to promise one
                                                      (RFC 9110 §8.6): nothing to type either */
    /* (an answer with no body holds nothing: 204, 304, and any answer to HEAD, RFC 9110 §9.3.2) */
    int holds = !no_body && !h2o_memis(req->method.base, req->method.len, H2O_STRLIT("HEAD"));
    if (!agw_worker_unsent_take(w, rr->g, req, holds ? body_len : 0, &rr->unsent)) {
        agw_worker_send_problem(w, req, rr, rr->endpoint, 503, AGW_UNSENT_KIND, AGW_UNSENT_TITLE, AGW_UNSENT_DETAIL);
        lua_pushboolean(L, 1);
        return 1;
    }
    req->res.status = status;
    req->res.reason = agw_http_reason(status);
    /* the script's headers by the rules of resp_headers.h (the spec harness applies the same) */
    agw_resp_headers_t *set = &w->scratch.resp_headers;
    set->n = 0;
    if (lua_istable(L, HEADERS))
        agw_resp_headers_read(set, L, HEADERS, &agw_worker_upg(L)->own_headers, warn_header, w);
    for (size_t i = 0; i < set->n; i++)
        add_header(req, set->h[i].name, set->h[i].name_len, set->h[i].value, set->h[i].value_len);
    int has_type = agw_resp_headers_find(set, "content-type", 12) != NULL;
    size_t tl;
    const char *type = lua_tolstring(L, DEFAULT_TYPE, &tl);
    if (!has_type && type && !no_body)
        add_header(req, "content-type", 12, type, tl);
    size_t sl;
    const char *timing = lua_tolstring(L, SERVER_TIMING, &sl);
    if (timing)
        add_header(req, "server-timing", 13, timing, sl);
    if (no_body)
        body_len = 0;
    else
        req->res.content_length = body_len;
    /* a page's sections: for partial pages (metrics) and the access log */
    section_ref_t secs[ALOG_MAX_SECTIONS];
    size_t nsecs = 0;
    const char *page = lua_tostring(L, PAGE);
    int partial = page != NULL && strcmp(page, "partial") == 0;
    if (page != NULL && (partial || rr->logline)) {
        if (rows)
            nsecs = agw_worker_row_sections(L, ROWS, secs, ALOG_MAX_SECTIONS);
        else if (lua_istable(L, SECTIONS))
            nsecs = agw_worker_page_sections(L, SECTIONS, secs, ALOG_MAX_SECTIONS);
        if (status == 200 && partial) {
            for (size_t i = 0; i < nsecs; i++)
                if (strcmp(secs[i].status, "ok") != 0)
                    agw_metrics_partial(w->m, (int)rr->g->gen->route_slot[rr->endpoint], secs[i].name,
                                        secs[i].len);
        }
        /* the names and statuses stay referenced by the response until core.respond returns */
        agw_worker_record_request(w, rr, status, body_len, secs, nsecs, timing, timing ? sl : 0);
    } else {
        agw_worker_record_request(w, rr, status, body_len, NULL, 0, timing, timing ? sl : 0);
    }
    agw_worker_queue_response(rr, body, body_len);
    lua_pushboolean(L, 1);
    return 1;
}
