/* Unit tests for generations (generation.c): what a reload may change, what it takes over from the
 * generation serving (breakers), the reload record, and that every generation is freed. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "generation.h"

static char dir[64];

static void write_file(const char *name, const char *text)
{
    char path[256];
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    FILE *f = fopen(path, "w");
    if (f == NULL)
        abort();
    fputs(text, f);
    fclose(f);
}

/* gateway.lua with one listener (port), workers, and product's URL port and breaker failures. */
static void write_gateway(int port, int workers, int product_port, int failures)
{
    char text[1024];
    snprintf(text, sizeof(text),
             "return {\n"
             "  listen = { { port = %d } },\n"
             "  workers = %d,\n"
             "  upstreams = {\n"
             "    product = { url = \"http://127.0.0.1:%d\", breaker = { failures = %d } },\n"
             "    reviews = { url = \"http://127.0.0.1:9002\" },\n"
             "  },\n"
             "}\n",
             port, workers, product_port, failures);
    write_file("gateway.lua", text);
}

static const char PAGE[] = "local agg = require \"agg\"\n"
                           "return { route = \"GET /p/{id}\", handler = function(req)\n"
                           "  return agg.page(agg.fetch_all { p = { \"product\", \"/p\" } })\n"
                           "end }\n";

static agw_generation_t *load(uint64_t number, const agw_generation_t *prev, agw_metric_labels_t *labels,
                              agw_buf_t *errors)
{
    agw_buf_reset(errors);
    return agw_generation_load(dir, number, prev, labels, errors);
}

/* Breakers of unchanged upstreams carry over; a changed URL or breaker block gets a new one. */
static void test_breakers_survive_unchanged_upstreams(void)
{
    agw_metric_labels_t *labels = agw_metric_labels_new(16, 16);
    agw_buf_t errors = AGW_BUF_INIT;
    write_gateway(18080, 2, 9001, 5);
    write_file("p.lua", PAGE);
    agw_generation_t *g1 = load(1, NULL, labels, &errors);
    CHECK(g1 != NULL);
    if (g1 == NULL) {
        fprintf(stderr, "%s", errors.base);
        return;
    }
    CHECK(agw_generation_live() == 1);
    agw_generation_t *g2 = load(2, g1, labels, &errors);
    CHECK(g2 != NULL && g2->number == 2);
    CHECK(g2 && g2->conf.breakers[0] == g1->conf.breakers[0]); /* product */
    CHECK(g2 && g2->conf.breakers[1] == g1->conf.breakers[1]); /* reviews */
    CHECK(g2 && g2->route_slot[1] == g1->route_slot[1]);
    write_gateway(18080, 2, 9011, 5);                           /* product moved */
    agw_generation_t *g3 = load(3, g2, labels, &errors);
    CHECK(g3 && g3->conf.breakers[0] != g2->conf.breakers[0]);
    CHECK(g3 && g3->conf.breakers[1] == g2->conf.breakers[1]);
    write_gateway(18080, 2, 9011, 3);                           /* product's breaker changed */
    agw_generation_t *g4 = load(4, g3, labels, &errors);
    CHECK(g4 && g4->conf.breakers[0] != g3->conf.breakers[0]);
    CHECK(agw_generation_live() == 4);
    agw_generation_unref(g1);
    agw_generation_unref(g2);
    agw_generation_unref(g3);
    agw_generation_unref(g4);
    CHECK(agw_generation_live() == 0);
    agw_buf_free(&errors);
    agw_metric_labels_free(labels);
}

/* Listeners and workers need a restart: the reload fails naming the setting and its line. */
static void test_restart_only_settings_fail_the_reload(void)
{
    agw_metric_labels_t *labels = agw_metric_labels_new(16, 16);
    agw_buf_t errors = AGW_BUF_INIT;
    write_gateway(18080, 2, 9001, 5);
    write_file("p.lua", PAGE);
    agw_generation_t *g1 = load(1, NULL, labels, &errors);
    CHECK(g1 != NULL);
    write_gateway(18081, 3, 9001, 5);
    agw_generation_t *g2 = load(2, g1, labels, &errors);
    CHECK(g2 == NULL);
    CHECK(errors.base && strstr(errors.base, "/gateway.lua:2: listen: the listeners") != NULL);
    CHECK(errors.base && strstr(errors.base, "/gateway.lua:3: workers: the number of worker threads changed") != NULL);
    CHECK(errors.base && strstr(errors.base, "needs a restart") != NULL);
    CHECK(agw_generation_live() == 1); /* the failed load freed what it loaded */
    /* a script error is a failed load too, with the script's file and line */
    write_gateway(18080, 2, 9001, 5);
    write_file("p.lua", "return {\n  route = \"GET /p\",\n  handler = function(req) return { status = 200 } en\n}\n");
    CHECK(load(2, g1, labels, &errors) == NULL);
    CHECK(errors.base && strstr(errors.base, "/p.lua:3:") != NULL);
    agw_generation_unref(g1);
    CHECK(agw_generation_live() == 0);
    agw_buf_free(&errors);
    agw_metric_labels_free(labels);
}

/* The reload record: counts, the last result and its messages as JSON. */
static void test_reload_record(void)
{
    agw_metric_labels_t *labels = agw_metric_labels_new(16, 16);
    agw_buf_t errors = AGW_BUF_INIT;
    write_gateway(18080, 2, 9001, 5);
    write_file("p.lua", PAGE);
    agw_generation_t *g1 = load(1, NULL, labels, &errors);
    agw_reload_state_t st;
    agw_reload_state_init(&st);
    agw_buf_t b = AGW_BUF_INIT;
    agw_reload_state_json(&st, &b);
    CHECK_STR(b.base, "{\"generation\":0,\"generations_live\":1,\"reloads\":0,\"failures\":0,\"last_reload\":null}\n");
    agw_reload_state_serving(&st, g1, 0);
    agw_reload_state_failed(&st, "scripts/p.lua:3: '=' expected\nscripts/q.lua:1: boom\n");
    agw_buf_reset(&b);
    agw_reload_state_json(&st, &b);
    CHECK(b.base && strstr(b.base, "\"generation\":1,") != NULL);
    CHECK(b.base && strstr(b.base, "\"failures\":1,") != NULL);
    CHECK(b.base && strstr(b.base, "\"ok\":false") != NULL);
    CHECK(b.base && strstr(b.base, "[\n  \"scripts/p.lua:3: '=' expected\",\n  \"scripts/q.lua:1: boom\"\n]") != NULL);
    agw_metrics_process_t p = {0};
    agw_reload_state_metrics(&st, &p);
    CHECK(p.generation == 1 && p.reloads == 0 && p.reload_failures == 1 && p.last_reload_ok == 0);
    agw_generation_unref(g1); /* the record keeps its own reference */
    CHECK(agw_generation_live() == 1);
    agw_reload_state_destroy(&st);
    CHECK(agw_generation_live() == 0);
    agw_buf_free(&b);
    agw_buf_free(&errors);
    agw_metric_labels_free(labels);
}

int main(void)
{
    snprintf(dir, sizeof(dir), "/tmp/aggway-gen-XXXXXX");
    if (mkdtemp(dir) == NULL)
        return 2;
    RUN(test_breakers_survive_unchanged_upstreams);
    RUN(test_restart_only_settings_fail_the_reload);
    RUN(test_reload_record);
    char cmd[128];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
    if (system(cmd) != 0)
        return 2;
    return CHECK_DONE();
}
