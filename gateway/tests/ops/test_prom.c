/* test_prom.c: the Prometheus text writer (prom.c) and the rendering of summed per-worker counters
 * (metrics.c), checked line by line against the exposition format 0.0.4. */
#include "tests/check.h"
#include "script/config.h"
#include "ops/metrics.h"
#include "ops/prom.h"

#include <stdlib.h>
#include <string.h>

static int has_line(const agw_buf_t *b, const char *line)
{
    size_t n = strlen(line);
    const char *p = b->base;
    while (p && *p) {
        const char *eol = strchr(p, '\n');
        size_t len = eol ? (size_t)(eol - p) : strlen(p);
        if (len == n && memcmp(p, line, n) == 0)
            return 1;
        if (!eol)
            break;
        p = eol + 1;
    }
    fprintf(stderr, "missing line: %s\n", line);
    return 0;
}

static void test_family_and_escaping(void)
{
    agw_buf_t b = AGW_BUF_INIT;
    agw_prom_family(&b, "aggway_x_total", "counter", "Help with \\ backslash\nand newline \"quotes\" kept.");
    CHECK_STR(b.base, "# HELP aggway_x_total Help with \\\\ backslash\\nand newline \"quotes\" kept.\n"
                      "# TYPE aggway_x_total counter\n");
    agw_buf_reset(&b);
    agw_prom_label_t l[2] = {AGW_PROM_LABEL("route", "GET /a/{id} \"q\" \\ \n"), AGW_PROM_LABEL("code", "200")};
    agw_prom_sample_u64(&b, "aggway_x_total", l, 2, 18446744073709551615ull);
    CHECK_STR(b.base, "aggway_x_total{route=\"GET /a/{id} \\\"q\\\" \\\\ \\n\",code=\"200\"} 18446744073709551615\n");
    agw_buf_reset(&b);
    agw_prom_sample_u64(&b, "aggway_up", NULL, 0, 1);
    CHECK_STR(b.base, "aggway_up 1\n");
    agw_buf_reset(&b);
    agw_prom_label_t bin = {"section", "a\0b", 3};
    agw_prom_sample(&b, "aggway_y", &bin, 1, 0.1);
    CHECK(b.len == strlen("aggway_y{section=\"a") + 1 + strlen("b\"} 0.1\n"));
    agw_buf_free(&b);
}

static void test_values(void)
{
    agw_buf_t b = AGW_BUF_INIT;
    double vs[] = {0, 1, -3, 0.005, 2.5, 1.0 / 3.0, 1e300, 1.0 / 0.0, -1.0 / 0.0};
    const char *want[] = {"0", "1", "-3", "0.005", "2.5", "0.33333333333333331", "1e+300", "+Inf", "-Inf"};
    for (size_t i = 0; i < sizeof(vs) / sizeof(vs[0]); i++) {
        agw_buf_reset(&b);
        agw_prom_value(&b, vs[i]);
        CHECK_STR(b.base, want[i]);
    }
    agw_buf_reset(&b);
    agw_prom_value(&b, 0.0 / 0.0);
    CHECK_STR(b.base, "NaN");
    agw_buf_free(&b);
}

static void test_histogram(void)
{
    agw_buf_t b = AGW_BUF_INIT;
    const double bounds[] = {5, 10, 25};
    const uint64_t counts[] = {1, 0, 2, 3}; /* non-cumulative; the last is +Inf */
    agw_prom_label_t l = AGW_PROM_LABEL("upstream", "product");
    agw_prom_histogram(&b, "aggway_d_seconds", &l, 1, bounds, 3, 1000.0, counts, 1.25);
    CHECK_STR(b.base, "aggway_d_seconds_bucket{upstream=\"product\",le=\"0.005\"} 1\n"
                      "aggway_d_seconds_bucket{upstream=\"product\",le=\"0.01\"} 1\n"
                      "aggway_d_seconds_bucket{upstream=\"product\",le=\"0.025\"} 3\n"
                      "aggway_d_seconds_bucket{upstream=\"product\",le=\"+Inf\"} 6\n"
                      "aggway_d_seconds_sum{upstream=\"product\"} 1.25\n"
                      "aggway_d_seconds_count{upstream=\"product\"} 6\n");
    agw_buf_free(&b);
}

/* Two workers' counters are summed; partial pages merge by (route, section). */
static void test_render_sums_workers(void)
{
    agw_config_t conf;
    memset(&conf, 0, sizeof(conf));
    agw_endpoint_info_t eps[1] = {{.route = "GET /p/{id}", .method = "GET", .file = "scripts/p.lua"}};
    conf.endpoints = eps;
    conf.num_endpoints = 1;
    agw_upstream_conf_t ups[1];
    memset(ups, 0, sizeof(ups));
    ups[0].name = "product";
    agw_breaker_t *br[1] = {agw_breaker_new(5, 30000, 1)};
    conf.upstreams = ups;
    conf.breakers = br;
    conf.num_upstreams = 1;
    agw_metric_labels_t *labels = agw_metric_labels_new(8, 8);
    uint32_t route_slot[3], upstream_slot[1];
    agw_buf_t errors = AGW_BUF_INIT;
    CHECK(agw_metric_labels_map(labels, &conf, route_slot, upstream_slot, &errors) == 0);
    CHECK(route_slot[0] == 0 && route_slot[1] == 1 && upstream_slot[0] == 0);
    agw_metrics_t *w[2] = {agw_metrics_new(labels), agw_metrics_new(labels)};
    agw_metrics_request(w[0], 1, 200, 12.0, 300);
    agw_metrics_request(w[1], 1, 200, 40.0, 5000);
    agw_metrics_request(w[1], 1, 502, 3.0, 100);
    agw_metrics_request(w[0], 0, 404, 0, 95);
    agw_metrics_partial(w[0], 1, "reviews", 7);
    agw_metrics_partial(w[1], 1, "reviews", 7);
    agw_metrics_partial(w[1], 1, "inventory", 9);
    agw_metrics_call(w[0], 0, AGW_OUT_OK, 3.0);
    agw_metrics_call(w[1], 0, AGW_OUT_TIMEOUT, 150.0);
    agw_metrics_call(w[1], 0, AGW_OUT_CANCELLED, 10.0);
    for (int i = 0; i < 5; i++)
        agw_breaker_report(br[0], AGW_BREAKER_FAILURE, 0, 1000);
    agw_buf_t b = AGW_BUF_INIT;
    agw_metrics_process_t proc = {.ready = 1, .start_time = 1700000000.5, .generation = 3, .reloads = 2,
                                  .reload_failures = 1, .last_reload_ok = 1, .generations_live = 2};
    agw_metrics_render(&b, labels, &conf, w, 2, &proc);
    CHECK(has_line(&b, "aggway_ready 1"));
    CHECK(has_line(&b, "aggway_generation 3"));
    CHECK(has_line(&b, "aggway_generations_live 2"));
    CHECK(has_line(&b, "aggway_reloads_total 2"));
    CHECK(has_line(&b, "aggway_reload_failures_total 1"));
    CHECK(has_line(&b, "aggway_reload_last_success 1"));
    CHECK(has_line(&b, "aggway_workers 2"));
    CHECK(has_line(&b, "aggway_requests_total{route=\"GET /p/{id}\",code=\"200\"} 2"));
    CHECK(has_line(&b, "aggway_requests_total{route=\"GET /p/{id}\",code=\"502\"} 1"));
    CHECK(has_line(&b, "aggway_requests_total{route=\"unmatched\",code=\"404\"} 1"));
    CHECK(has_line(&b, "aggway_request_duration_seconds_bucket{route=\"GET /p/{id}\",le=\"0.005\"} 1"));
    CHECK(has_line(&b, "aggway_request_duration_seconds_bucket{route=\"GET /p/{id}\",le=\"0.025\"} 2"));
    CHECK(has_line(&b, "aggway_request_duration_seconds_count{route=\"GET /p/{id}\"} 3"));
    CHECK(has_line(&b, "aggway_response_size_bytes_sum{route=\"GET /p/{id}\"} 5400"));
    CHECK(has_line(&b, "aggway_partial_pages_total{route=\"GET /p/{id}\",section=\"reviews\"} 2"));
    CHECK(has_line(&b, "aggway_partial_pages_total{route=\"GET /p/{id}\",section=\"inventory\"} 1"));
    CHECK(has_line(&b, "aggway_upstream_calls_total{upstream=\"product\",outcome=\"ok\"} 1"));
    CHECK(has_line(&b, "aggway_upstream_calls_total{upstream=\"product\",outcome=\"timeout\"} 1"));
    CHECK(has_line(&b, "aggway_upstream_calls_total{upstream=\"product\",outcome=\"cancelled\"} 1"));
    CHECK(has_line(&b, "aggway_upstream_call_duration_seconds_count{upstream=\"product\"} 2"));
    CHECK(has_line(&b, "aggway_upstream_call_duration_seconds_sum{upstream=\"product\"} 0.153"));
    CHECK(has_line(&b, "aggway_upstream_breaker_state{upstream=\"product\"} 2")); /* opened at 1000 ms: long ago */
    CHECK(has_line(&b, "aggway_upstream_breaker_transitions_total{upstream=\"product\",to=\"open\"} 1"));
    /* every sample line belongs to a family announced with # TYPE before it */
    const char *p = b.base;
    char family[128] = "";
    while (*p) {
        const char *eol = strchr(p, '\n');
        CHECK(eol != NULL);
        if (!eol)
            break;
        if (strncmp(p, "# TYPE ", 7) == 0) {
            size_t n = (size_t)(strchr(p + 7, ' ') - (p + 7));
            memcpy(family, p + 7, n);
            family[n] = '\0';
        } else if (p[0] != '#') {
            CHECK(strncmp(p, family, strlen(family)) == 0);
        }
        p = eol + 1;
    }
    agw_buf_free(&b);
    agw_metrics_free(w[0]);
    agw_metrics_free(w[1]);
    agw_metric_labels_free(labels);
    agw_breaker_unref(br[0]);
}

/* A reload keeps a route's or an upstream's slot when its name survives; new names get new slots,
 * and a generation that would overflow the registry is refused without taking any. */
static void test_label_slots_survive_reloads(void)
{
    agw_config_t a, b;
    memset(&a, 0, sizeof(a));
    memset(&b, 0, sizeof(b));
    a.dir = b.dir = "scripts";
    agw_endpoint_info_t ea[2] = {{.route = "GET /a", .method = "GET", .file = "a.lua"}, {.route = "GET /b", .method = "GET", .file = "b.lua"}};
    agw_endpoint_info_t eb[2] = {{.route = "GET /c", .method = "GET", .file = "c.lua"}, {.route = "GET /a", .method = "GET", .file = "a.lua"}};
    agw_upstream_conf_t ua[1], ub[2];
    memset(ua, 0, sizeof(ua));
    memset(ub, 0, sizeof(ub));
    ua[0].name = "product";
    ub[0].name = "reviews";
    ub[1].name = "product";
    a.endpoints = ea, a.num_endpoints = 2, a.upstreams = ua, a.num_upstreams = 1;
    b.endpoints = eb, b.num_endpoints = 2, b.upstreams = ub, b.num_upstreams = 2;
    agw_metric_labels_t *l = agw_metric_labels_new(3, 2);
    uint32_t rs[4], us[2];
    agw_buf_t errors = AGW_BUF_INIT;
    CHECK(agw_metric_labels_map(l, &a, rs, us, &errors) == 0);
    CHECK(rs[1] == 1 && rs[2] == 2 && rs[3] == 0 && us[0] == 0); /* rs[3]: no batch endpoint */
    CHECK(agw_metric_labels_map(l, &b, rs, us, &errors) == 0);
    CHECK(rs[0] == 0 && rs[1] == 3 && rs[2] == 1); /* GET /a keeps slot 1 */
    CHECK(us[0] == 1 && us[1] == 0);               /* product keeps slot 0 */
    CHECK(l->num_routes == 4 && l->num_upstreams == 2);
    CHECK_STR(l->routes[3], "GET /c");
    /* full: a fourth route pattern does not fit, and nothing is taken */
    eb[0].route = "GET /d";
    CHECK(agw_metric_labels_map(l, &b, rs, us, &errors) == -1);
    CHECK(l->num_routes == 4);
    CHECK(errors.base && strstr(errors.base, "more than 3 distinct routes") != NULL);
    agw_buf_free(&errors);
    agw_metric_labels_free(l);
    /* the batch endpoint's envelope has a route slot of its own, after the endpoints' */
    l = agw_metric_labels_new(3, 2);
    a.batch_route = "POST /batch";
    CHECK(agw_metric_labels_map(l, &a, rs, us, &errors) == 0);
    CHECK(rs[1] == 1 && rs[2] == 2 && rs[3] == 3);
    CHECK_STR(l->routes[3], "POST /batch");
    agw_buf_free(&errors);
    agw_metric_labels_free(l);
}

/* Past AGW_M_PARTIAL_MAX distinct sections, the rest count under their route's "_other" (a
 * counter of the route's own: a full table left every other route's sections uncounted). */
static void test_partial_overflow(void)
{
    agw_config_t conf;
    memset(&conf, 0, sizeof(conf));
    agw_endpoint_info_t eps[1] = {{.route = "GET /p", .method = "GET", .file = "p.lua"}};
    conf.endpoints = eps;
    conf.num_endpoints = 1;
    agw_metric_labels_t *labels = agw_metric_labels_new(4, 4);
    agw_metrics_t *m = agw_metrics_new(labels);
    char name[32];
    for (int i = 0; i < AGW_M_PARTIAL_MAX + 10; i++) {
        int n = snprintf(name, sizeof(name), "s%d", i);
        agw_metrics_partial(m, 1, name, (size_t)n);
    }
    agw_metrics_partial(m, 2, "s0", 2); /* another route, after the table is full */
    CHECK(m->num_partials == AGW_M_PARTIAL_MAX);
    CHECK_STR(m->partials[AGW_M_PARTIAL_MAX - 1].section, "s255");
    CHECK(m->partials[AGW_M_PARTIAL_MAX - 1].count == 1);
    CHECK(m->routes[1].partial_other == 10 && m->routes[2].partial_other == 1);
    agw_metrics_free(m);
    agw_metric_labels_free(labels);
}

int main(void)
{
    RUN(test_family_and_escaping);
    RUN(test_values);
    RUN(test_histogram);
    RUN(test_render_sums_workers);
    RUN(test_partial_overflow);
    RUN(test_label_slots_survive_reloads);
    return CHECK_DONE();
}
