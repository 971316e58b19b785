/* test_trace.c: W3C Trace Context parsing and formatting (trace.c), span records, the OTLP/JSON
 * encoding (otlp.c) and the waterfall ring and pages (waterfall.c). Every invalid traceparent form of
 * W3C Trace Context Level 1 §3.2 gets a case; so do the §4.3 higher-version rule and the §3.3
 * tracestate limits. */
#include "tests/check.h"
#include "script/config.h"
#include "ops/metrics.h"
#include "ops/otlp.h"
#include "ops/trace.h"
#include "ops/waterfall.h"
#include "upstream/pool.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#define TID "4bf92f3577b34da6a3ce929d0e0e4736"
#define PID "00f067aa0ba902b7"

static int parses(const char *s)
{
    agw_traceparent_t tp;
    return agw_traceparent_parse(s, strlen(s), &tp) == 0;
}

static void test_valid_traceparent(void)
{
    agw_traceparent_t tp;
    const char *s = "00-" TID "-" PID "-01";
    CHECK(agw_traceparent_parse(s, strlen(s), &tp) == 0);
    CHECK(tp.trace_id[0] == 0x4b && tp.trace_id[15] == 0x36);
    CHECK(tp.parent_id[0] == 0x00 && tp.parent_id[7] == 0xb7);
    CHECK(tp.flags == 1);
    CHECK(parses("00-" TID "-" PID "-00"));
    CHECK(parses("00-" TID "-" PID "-ff")); /* unknown flag bits are accepted (and not propagated) */
    CHECK(parses(" 00-" TID "-" PID "-01\t")); /* OWS around the value */
}

static void test_invalid_traceparent(void)
{
    static const char *const bad[] = {
        "ff-" TID "-" PID "-01",                                   /* version ff (§3.2.2.1) */
        "00-00000000000000000000000000000000-" PID "-01",          /* all-zero trace-id (§3.2.2.3) */
        "00-" TID "-0000000000000000-01",                          /* all-zero parent-id (§3.2.2.4) */
        "00-4BF92F3577B34DA6A3CE929D0E0E4736-" PID "-01",          /* uppercase hex */
        "00-" TID "-00F067AA0BA902B7-01",                          /* uppercase parent-id */
        "0A-" TID "-" PID "-01",                                   /* uppercase version */
        "00-" TID "-" PID "-0A",                                   /* uppercase flags */
        "00-4bf92f3577b34da6a3ce929d0e0e473g-" PID "-01",          /* non-hex */
        "00-" TID "-00f067aa0ba902bz-01",                          /* non-hex parent-id */
        "0x-" TID "-" PID "-01",                                   /* non-hex version */
        "00-" TID "-" PID "-0x",                                   /* non-hex flags */
        "00-4bf92f3577b34da6a3ce929d0e0e473-" PID "-01",           /* trace-id too short */
        "00-4bf92f3577b34da6a3ce929d0e0e47361-" PID "-01",         /* trace-id too long */
        "00-" TID "-00f067aa0ba902b-01",                           /* parent-id too short */
        "00-" TID "-00f067aa0ba902b77-01",                         /* parent-id too long */
        "00-" TID "-" PID "-1",                                    /* flags too short */
        "00-" TID "-" PID "-011",                                  /* version 00 is exactly 55 long */
        "00-" TID "-" PID "-01-",                                  /* nothing may follow for 00 */
        "00-" TID "-" PID "-01-extra",
        "00_" TID "-" PID "-01",                                   /* wrong separators */
        "00-" TID "_" PID "-01",
        "00-" TID "-" PID "_01",
        "000-" TID "-" PID "-01",
        "cc-" TID "-" PID "-01x",                                  /* higher version: '-' must follow */
        "cc-" TID "-" PID,                                         /* shorter than 55 */
        "",
        "00",
        "-",
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        if (parses(bad[i])) {
            fprintf(stderr, "accepted invalid traceparent \"%s\"\n", bad[i]);
            check_failures++;
        }
    }
    /* embedded NUL and non-ASCII bytes */
    char nul[56] = "00-" TID "-" PID "-01";
    nul[10] = '\0';
    agw_traceparent_t tp;
    CHECK(agw_traceparent_parse(nul, 55, &tp) != 0);
    nul[10] = (char)0xc3;
    CHECK(agw_traceparent_parse(nul, 55, &tp) != 0);
}

static void test_higher_version(void)
{
    agw_traceparent_t tp;
    const char *s = "cc-" TID "-" PID "-01-what-the-future-will-be-like";
    CHECK(agw_traceparent_parse(s, strlen(s), &tp) == 0);
    CHECK(tp.flags == 1 && tp.trace_id[0] == 0x4b);
    CHECK(parses("01-" TID "-" PID "-01"));  /* exactly 55 */
    CHECK(parses("fe-" TID "-" PID "-00-")); /* '-' then nothing */
    /* what the gateway sends on is version 00 with only the sampled flag */
    agw_trace_t tr;
    agw_trace_init(&tr);
    uint64_t rng = 42;
    agw_traceparent_t ff;
    const char *f = "00-" TID "-" PID "-ff";
    CHECK(agw_traceparent_parse(f, strlen(f), &ff) == 0);
    agw_trace_begin(&tr, &rng, &ff, 1000, "GET", 3, "/x", 2);
    CHECK(tr.flags == AGW_TRACE_FLAG_SAMPLED);
    char out[AGW_TRACEPARENT_LEN + 1];
    agw_traceparent_format(out, tr.trace_id, tr.span_id, tr.flags);
    out[AGW_TRACEPARENT_LEN] = '\0';
    CHECK(strncmp(out, "00-" TID "-", 36) == 0);
    CHECK(strcmp(out + 52, "-01") == 0);
    CHECK(parses(out));
    char call[AGW_TRACEPARENT_LEN + 1] = {0};
    int i = agw_trace_add_span(&tr, &rng, 0, "s", 1, 0, 1, 1000);
    agw_trace_traceparent(&tr, i, call);
    CHECK(strncmp(call, out, 36) == 0 && strcmp(call + 52, "-01") == 0);
    char hex[17] = {0};
    agw_trace_hex(hex, tr.spans[i].span_id, 8);
    CHECK(memcmp(call + 36, hex, 16) == 0);
    agw_trace_traceparent(&tr, -1, call); /* the gateway's own */
    CHECK(strcmp(call, out) == 0);
}

static void test_format_roundtrip_and_random_ids(void)
{
    uint64_t rng = 1;
    uint8_t t[16], s[8];
    for (int i = 0; i < 1000; i++) {
        agw_trace_random_id(&rng, t, 16);
        agw_trace_random_id(&rng, s, 8);
        char out[AGW_TRACEPARENT_LEN];
        agw_traceparent_format(out, t, s, 0);
        agw_traceparent_t tp;
        CHECK(agw_traceparent_parse(out, sizeof(out), &tp) == 0);
        CHECK(memcmp(tp.trace_id, t, 16) == 0 && memcmp(tp.parent_id, s, 8) == 0 && tp.flags == 0);
    }
    /* a trace started here: random ids, sampled, no parent */
    agw_trace_t tr;
    agw_trace_init(&tr);
    agw_trace_begin(&tr, &rng, NULL, 5, "GET", 3, "/p", 2);
    CHECK(!tr.has_parent && tr.flags == AGW_TRACE_FLAG_SAMPLED);
    CHECK_STR(tr.target, "GET /p");
}

static int ts_valid(const char *s)
{
    return agw_tracestate_valid(s, strlen(s));
}

static void test_tracestate(void)
{
    CHECK(ts_valid("congo=t61rcWkgMzE"));
    CHECK(ts_valid("rojo=00f067aa0ba902b7,congo=t61rcWkgMzE"));
    CHECK(ts_valid("a=1 , b=2\t,c=3"));           /* OWS around members */
    CHECK(ts_valid("a=1,,b=2"));                  /* empty members are allowed */
    CHECK(ts_valid(""));
    CHECK(ts_valid("t0@sys=1"));                  /* multi-tenant key */
    CHECK(ts_valid("0tenant@a-b_c*/d=x"));        /* a tenant-id may start with a digit */
    CHECK(ts_valid("k=hello world"));             /* inner space */
    CHECK(ts_valid("k=trailing "));               /* a space after a member is OWS, not the value's */
    CHECK(!ts_valid("k= "));                      /* and a value is never only that */
    CHECK(!ts_valid("K=1"));                      /* uppercase key */
    CHECK(!ts_valid("1k=1"));                     /* a simple key starts with a letter */
    CHECK(!ts_valid("k"));                        /* no '=' */
    CHECK(!ts_valid("k="));                       /* empty value */
    CHECK(!ts_valid("k=a=b"));                    /* '=' in a value */
    CHECK(!ts_valid("k=a,k=b"));                  /* a key twice */
    CHECK(!ts_valid("t@=1"));                     /* empty system-id */
    CHECK(!ts_valid("@s=1"));                     /* empty tenant-id */
    CHECK(!ts_valid("t@1s=1"));                   /* system-id starts with a letter */
    CHECK(!ts_valid("t@abcdefghijklmno=1"));      /* system-id over 14 */
    CHECK(!ts_valid("k=\x7f"));
    CHECK(!ts_valid("k=\xc3\xa9"));
    char buf[AGW_TRACESTATE_MAX_LEN + 64];
    size_t n = 0;
    for (int i = 0; i < 32; i++)
        n += (size_t)snprintf(buf + n, sizeof(buf) - n, "%sk%d=v", i ? "," : "", i);
    CHECK(agw_tracestate_valid(buf, n));          /* 32 members */
    n += (size_t)snprintf(buf + n, sizeof(buf) - n, ",k32=v");
    CHECK(!agw_tracestate_valid(buf, n));         /* 33 */
    /* key of 256 characters is fine, 257 is not; value of 256 fine, 257 not */
    memset(buf, 'a', 300);
    buf[256] = '=', buf[257] = 'v';
    CHECK(agw_tracestate_valid(buf, 258));
    memset(buf, 'a', 300);
    buf[257] = '=', buf[258] = 'v';
    CHECK(!agw_tracestate_valid(buf, 259));
    memset(buf, 'b', 300);
    buf[0] = 'k', buf[1] = '=';
    CHECK(agw_tracestate_valid(buf, 2 + 256));
    CHECK(!agw_tracestate_valid(buf, 2 + 257));
    memset(buf, 'a', sizeof(buf));
    CHECK(!agw_tracestate_valid(buf, AGW_TRACESTATE_MAX_LEN + 1)); /* oversized */
}

static void test_spans(void)
{
    agw_trace_t *tr = agw_trace_new();
    uint64_t rng = 7;
    agw_trace_begin(tr, &rng, NULL, 1000000, "GET", 3, "/p/1", 4);
    int a = agw_trace_add_span(tr, &rng, 0, "product", 7, 0, 1, 1000000);
    int b = agw_trace_add_span(tr, &rng, 1, "reviews", 7, AGW_SPAN_RETRY, 2, 1000100);
    CHECK(a == 0 && b == 1);
    CHECK(memcmp(tr->spans[0].span_id, tr->spans[1].span_id, 8) != 0);
    agw_trace_end_span(tr, a, 0, 200, NULL, 1040000);
    agw_trace_end_span(tr, a, 3, 0, NULL, 1090000); /* a second end is ignored */
    agw_trace_end_span(tr, 99, 0, 200, NULL, 1); /* out of range: ignored */
    agw_trace_finish(tr, 200, 1080000);
    CHECK(tr->spans[0].end_us == 1040000 && tr->spans[0].http_status == 200 && tr->spans[0].outcome == 0);
    CHECK(tr->spans[1].outcome == AGW_SPAN_CANCELLED && tr->spans[1].end_us == 1080000);
    CHECK(!(tr->spans[1].flags & AGW_SPAN_OPEN));
    CHECK_STR(agw_span_outcome_name(AGW_SPAN_CANCELLED), "cancelled");
    /* long sections are cut; spans beyond the limit are counted */
    char longname[200];
    memset(longname, 's', sizeof(longname));
    int c = agw_trace_add_span(tr, &rng, 0, longname, sizeof(longname), 0, 1, 1);
    CHECK(c == 2 && strlen(tr->spans[2].section) == AGW_SPAN_SECTION_MAX - 1);
    CHECK(tr->spans == tr->inline_spans); /* a page's few calls stay in the record */
    uint8_t first_id[8];
    memcpy(first_id, tr->spans[0].span_id, 8);
    while (agw_trace_add_span(tr, &rng, 0, "x", 1, 0, 1, 1) >= 0)
        ;
    /* past the inline ones the spans moved to the heap, every one kept, up to the maximum */
    CHECK(tr->spans != tr->inline_spans && tr->spans_cap == AGW_TRACE_MAX_SPANS);
    CHECK(tr->num_spans == AGW_TRACE_MAX_SPANS && tr->spans_dropped == 1);
    CHECK(memcmp(tr->spans[0].span_id, first_id, 8) == 0 && tr->spans[0].http_status == 200);
    CHECK(strlen(tr->spans[2].section) == AGW_SPAN_SECTION_MAX - 1 && strcmp(tr->spans[47].section, "x") == 0);
    /* a reused record keeps its array and starts empty */
    agw_trace_begin(tr, &rng, NULL, 2000000, "GET", 3, "/p/2", 4);
    CHECK(tr->num_spans == 0 && tr->spans_dropped == 0);
    CHECK(agw_trace_add_span(tr, &rng, 0, "a", 1, 0, 1, 2000000) == 0 && strcmp(tr->spans[0].section, "a") == 0);
    /* a failure's detail is the record's own copy, cut to AGW_SPAN_DETAIL_MAX - 1 bytes; an empty
     * one or none is NULL; beginning the record again frees them (the ASan build finds a leak) */
    char longer[3 * AGW_SPAN_DETAIL_MAX];
    memset(longer, 'd', sizeof(longer) - 1);
    longer[sizeof(longer) - 1] = '\0';
    CHECK(agw_trace_add_span(tr, &rng, 0, "b", 1, 0, 1, 2000000) == 1);
    CHECK(agw_trace_add_span(tr, &rng, 0, "c", 1, 0, 1, 2000000) == 2);
    agw_trace_end_span(tr, 0, AGW_CALL_OK, 200, "", 2000010);
    agw_trace_end_span(tr, 1, AGW_CALL_OK, 502, NULL, 2000010);
    agw_trace_end_span(tr, 2, AGW_CALL_OK, 0, longer, 2000010);
    agw_trace_end_span(tr, 2, AGW_CALL_OK, 0, "ended twice: kept the first", 2000020);
    CHECK(tr->spans[0].detail == NULL && tr->spans[1].detail == NULL);
    CHECK(tr->spans[2].detail && strlen(tr->spans[2].detail) == AGW_SPAN_DETAIL_MAX - 1 &&
          tr->spans[2].detail[0] == 'd');
    agw_trace_begin(tr, &rng, NULL, 3000000, "GET", 3, "/p/3", 4);
    CHECK(tr->num_spans == 0);
    CHECK(agw_trace_add_span(tr, &rng, 0, "a", 1, 0, 1, 3000000) == 0 && tr->spans[0].detail == NULL);
    agw_trace_end_span(tr, 0, AGW_CALL_OK, 0, "refused", 3000010);
    CHECK_STR(tr->spans[0].detail, "refused");
    agw_trace_free(tr); /* and its details */
    agw_trace_free(NULL);
    /* a record on the stack: its heap array goes with agw_trace_dispose */
    agw_trace_t st;
    agw_trace_init(&st);
    agw_trace_begin(&st, &rng, NULL, 1, "GET", 3, "/", 1);
    for (int i = 0; i < AGW_TRACE_INLINE_SPANS + 1; i++)
        CHECK(agw_trace_add_span(&st, &rng, 0, "y", 1, 0, 1, 1) == i);
    CHECK(st.spans != st.inline_spans && st.spans_cap == 2 * AGW_TRACE_INLINE_SPANS);
    agw_trace_dispose(&st);
    CHECK(st.spans == st.inline_spans && st.num_spans == 0);
}

/* A config with two upstreams and one route, enough for names in the encodings. */
static void fake_conf(agw_config_t *conf, agw_upstream_conf_t *ups, agw_endpoint_info_t *eps)
{
    memset(conf, 0, sizeof(*conf));
    memset(ups, 0, 2 * sizeof(*ups));
    ups[0].name = "product";
    ups[1].name = "reviews";
    eps[0].route = "GET /p/{id}";
    eps[0].method = "GET";
    eps[0].file = "p.lua";
    conf->upstreams = ups;
    conf->num_upstreams = 2;
    conf->endpoints = eps;
    conf->num_endpoints = 1;
    conf->otlp_service_name = "svc \"q\"";
}

/* The label registry for fake_conf's names (traces hold label slots): route slot 1 is its route,
 * upstream slots 0 and 1 its upstreams. Made once, kept for the whole run. */
static const agw_metric_labels_t *fake_names(const agw_config_t *conf)
{
    static agw_metric_labels_t *names;
    if (names == NULL) {
        uint32_t rs[3], us[2];
        agw_buf_t errors = AGW_BUF_INIT;
        names = agw_metric_labels_new(4, 4);
        CHECK(agw_metric_labels_map(names, conf, rs, us, &errors) == 0 && rs[1] == 1 && us[0] == 0 && us[1] == 1);
        agw_buf_free(&errors);
    }
    return names;
}

static agw_trace_t *sample_trace(uint64_t *rng)
{
    agw_trace_t *tr = agw_trace_new();
    agw_traceparent_t tp;
    const char *s = "00-" TID "-" PID "-01";
    agw_traceparent_parse(s, strlen(s), &tp);
    agw_trace_begin(tr, rng, &tp, 1700000000000000ull, "GET", 3, "/p/\"1\"", 6);
    tr->endpoint = 1;
    int a = agw_trace_add_span(tr, rng, 0, "product", 7, 0, 1, 1700000000000000ull);
    int b = agw_trace_add_span(tr, rng, 1, "reviews", 7, AGW_SPAN_HEDGE, 2, 1700000000010000ull);
    int c = agw_trace_add_span(tr, rng, 1, "shared", 6, AGW_SPAN_SF_JOINED, 1, 1700000000010000ull);
    memset(tr->spans[c].link_trace_id, 0xab, 16);
    memset(tr->spans[c].link_span_id, 0xcd, 8);
    agw_trace_end_span(tr, a, 0, 200, NULL, 1700000000040000ull);
    agw_trace_end_span(tr, b, 3, 0, NULL, 1700000000050000ull);
    agw_trace_end_span(tr, c, 0, 503, NULL, 1700000000050000ull);
    agw_trace_finish(tr, 200, 1700000000081500ull);
    return tr;
}

static json_t *attr(json_t *span, const char *key)
{
    size_t i;
    json_t *a;
    json_array_foreach(json_object_get(span, "attributes"), i, a)
    {
        if (strcmp(json_string_value(json_object_get(a, "key")), key) == 0)
            return json_object_get(a, "value");
    }
    return NULL;
}

static void test_otlp_encoding(void)
{
    agw_config_t conf;
    agw_upstream_conf_t ups[2];
    agw_endpoint_info_t eps[1];
    fake_conf(&conf, ups, eps);
    uint64_t rng = 9;
    agw_trace_t *tr = sample_trace(&rng);
    agw_buf_t b = AGW_BUF_INIT;
    agw_otlp_encode(&b, &conf, fake_names(&conf), &tr, 1);
    json_error_t err;
    json_t *doc = json_loadb(b.base, b.len, 0, &err);
    CHECK(doc != NULL);
    if (doc == NULL) {
        fprintf(stderr, "not JSON: %s\n%s\n", err.text, b.base);
        return;
    }
    json_t *rs = json_array_get(json_object_get(doc, "resourceSpans"), 0);
    json_t *res = json_object_get(json_object_get(rs, "resource"), "attributes");
    CHECK_STR(json_string_value(json_object_get(json_object_get(json_array_get(res, 0), "value"), "stringValue")),
              "svc \"q\"");
    json_t *ss = json_array_get(json_object_get(rs, "scopeSpans"), 0);
    json_t *spans = json_object_get(ss, "spans");
    CHECK(json_array_size(spans) == 4);
    json_t *gw = json_array_get(spans, 0);
    CHECK_STR(json_string_value(json_object_get(gw, "traceId")), TID);
    CHECK_STR(json_string_value(json_object_get(gw, "parentSpanId")), PID);
    CHECK_STR(json_string_value(json_object_get(gw, "name")), "GET /p/{id}");
    CHECK(json_integer_value(json_object_get(gw, "kind")) == 2);
    CHECK_STR(json_string_value(json_object_get(gw, "startTimeUnixNano")), "1700000000000000000");
    CHECK_STR(json_string_value(json_object_get(gw, "endTimeUnixNano")), "1700000000081500000");
    CHECK_STR(json_string_value(json_object_get(attr(gw, "url.path"), "stringValue")), "/p/\"1\"");
    CHECK_STR(json_string_value(json_object_get(attr(gw, "http.response.status_code"), "intValue")), "200");
    const char *gw_id = json_string_value(json_object_get(gw, "spanId"));
    for (size_t i = 1; i < 4; i++) {
        json_t *c = json_array_get(spans, i);
        CHECK(json_integer_value(json_object_get(c, "kind")) == 3);
        CHECK_STR(json_string_value(json_object_get(c, "parentSpanId")), gw_id);
        CHECK_STR(json_string_value(json_object_get(c, "traceId")), TID);
    }
    json_t *p = json_array_get(spans, 1), *h = json_array_get(spans, 2), *sh = json_array_get(spans, 3);
    CHECK_STR(json_string_value(json_object_get(p, "name")), "product product");
    CHECK_STR(json_string_value(json_object_get(attr(p, "aggway.section"), "stringValue")), "product");
    CHECK(json_integer_value(json_object_get(json_object_get(p, "status"), "code")) == 1);
    CHECK(json_is_true(json_object_get(attr(h, "aggway.hedge"), "boolValue")));
    CHECK_STR(json_string_value(json_object_get(attr(h, "aggway.outcome"), "stringValue")), "timeout");
    CHECK(json_integer_value(json_object_get(json_object_get(h, "status"), "code")) == 2);
    CHECK_STR(json_string_value(json_object_get(attr(sh, "aggway.single_flight"), "stringValue")), "joined");
    json_t *link = json_array_get(json_object_get(sh, "links"), 0);
    CHECK_STR(json_string_value(json_object_get(link, "spanId")), "cdcdcdcdcdcdcdcd");
    CHECK(json_integer_value(json_object_get(json_object_get(sh, "status"), "code")) == 2); /* a 503 */
    CHECK(agw_otlp_trace_spans(tr) == 4);
    json_decref(doc);
    agw_buf_free(&b);
    agw_trace_free(tr);
}

static void test_waterfall(void)
{
    agw_config_t conf;
    agw_upstream_conf_t ups[2];
    agw_endpoint_info_t eps[1];
    fake_conf(&conf, ups, eps);
    uint64_t rng = 11;
    agw_waterfall_t *wf[2] = {agw_waterfall_new(), agw_waterfall_new()};
    agw_trace_t *tr = sample_trace(&rng);
    for (int i = 0; i < AGW_WF_RING + 5; i++) { /* the ring keeps the last AGW_WF_RING */
        tr->start_us += 1000;
        tr->end_us += 1000;
        for (size_t k = 0; k < tr->num_spans; k++)
            tr->spans[k].start_us += 1000, tr->spans[k].end_us += 1000;
        agw_waterfall_record(wf[i % 2], tr);
    }
    agw_wf_entry_t out[2 * AGW_WF_RING];
    size_t n = agw_waterfall_snapshot(wf, 2, NULL, out, 2 * AGW_WF_RING);
    CHECK(n == AGW_WF_RING + 5);
    for (size_t i = 1; i < n; i++)
        CHECK(out[i - 1].start_us >= out[i].start_us); /* newest first */
    CHECK(agw_waterfall_snapshot(wf, 2, NULL, out, 3) == 3);
    CHECK(agw_waterfall_snapshot(wf, 2, TID, out, 100) == AGW_WF_RING + 5);
    CHECK(agw_waterfall_snapshot(wf, 2, "0123456789abcdef0123456789abcdef", out, 100) == 0);
    n = agw_waterfall_snapshot(wf, 2, NULL, out, 1);
    CHECK(out[0].num_calls == 3 && out[0].calls[0].start_us == 0 && out[0].calls[0].end_us == 40000);
    CHECK(out[0].calls[1].start_us == 10000 && out[0].duration_us == 81500);
    /* a reader holding the lock makes the worker skip, not wait */
    pthread_mutex_lock(&wf[0]->lock);
    agw_waterfall_record(wf[0], tr);
    pthread_mutex_unlock(&wf[0]->lock);
    CHECK(wf[0]->skipped == 1);

    agw_buf_t b = AGW_BUF_INIT;
    agw_waterfall_json(&b, fake_names(&conf), out, n);
    json_error_t err;
    json_t *doc = json_loadb(b.base, b.len, 0, &err);
    CHECK(doc != NULL);
    json_t *r0 = json_array_get(json_object_get(doc, "requests"), 0);
    CHECK_STR(json_string_value(json_object_get(r0, "route")), "GET /p/{id}");
    CHECK_STR(json_string_value(json_object_get(r0, "request")), "GET /p/\"1\"");
    CHECK(json_real_value(json_object_get(r0, "duration_ms")) == 81.5);
    json_t *c1 = json_array_get(json_object_get(r0, "calls"), 1);
    CHECK_STR(json_string_value(json_object_get(c1, "upstream")), "reviews");
    CHECK(json_is_true(json_object_get(c1, "hedge")));
    CHECK(json_is_null(json_object_get(c1, "http_status")));
    json_decref(doc);
    agw_buf_reset(&b);
    agw_waterfall_html(&b, fake_names(&conf), out, n);
    CHECK(strstr(b.base, "<!DOCTYPE html>") != NULL);
    CHECK(strstr(b.base, "GET /p/&quot;1&quot;") != NULL); /* escaped */
    CHECK(strstr(b.base, "class=\"bar call\"") != NULL);
    CHECK(strstr(b.base, "http://") == NULL || strstr(b.base, "http://www.w3.org/2000/svg") != NULL);
    CHECK(strstr(b.base, "<script") == NULL && strstr(b.base, "src=") == NULL); /* self-contained */
    agw_buf_free(&b);
    agw_trace_free(tr);
    agw_waterfall_free(wf[0]);
    agw_waterfall_free(wf[1]);
}

int main(void)
{
    RUN(test_valid_traceparent);
    RUN(test_invalid_traceparent);
    RUN(test_higher_version);
    RUN(test_format_roundtrip_and_random_ids);
    RUN(test_tracestate);
    RUN(test_spans);
    RUN(test_otlp_encoding);
    RUN(test_waterfall);
    return CHECK_DONE();
}
