/* Unit tests for generations (generation.c): what a reload may change, what it takes over from the
 * generation serving (breakers), the TLS listeners' files read again by each load, the reload
 * record, and that every generation is freed. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tests/check.h"
#include "worker/generation.h"
#include "script/listen_tls.h"

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

/* A throwaway self-signed P-256 certificate NAME.crt with its key NAME.key, subject CN=NAME. */
static void make_cert(const char *name)
{
    char cmd[512];
    snprintf(cmd, sizeof(cmd),
             "cd '%s' && openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 2 "
             "-subj /CN=%s -keyout %s.key -out %s.crt 2>/dev/null",
             dir, name, name, name);
    if (system(cmd) != 0) {
        fprintf(stderr, "test setup failed: %s\n", cmd);
        exit(2);
    }
}

/* Copies the file from to to, in the test folder. */
static void copy_file(const char *from, const char *to)
{
    char cmd[512];
    snprintf(cmd, sizeof(cmd), "cd '%s' && cp %s %s", dir, from, to);
    if (system(cmd) != 0)
        exit(2);
}

/* gateway.lua with a cleartext listener and a TLS one on cert and key (the cert on line 5, the
 * key on line 6), or (cert NULL) a cleartext one in its place. */
static void write_tls_gateway(const char *cert, const char *key)
{
    char text[1024];
    if (cert)
        snprintf(text, sizeof(text),
                 "return {\n"
                 "  listen = {\n"
                 "    { port = 18080 },\n"
                 "    { port = 18443, tls = {\n"
                 "        cert = \"%s\",\n"
                 "        key = \"%s\" } },\n"
                 "  },\n"
                 "  upstreams = { product = { url = \"http://127.0.0.1:9001\" } },\n"
                 "}\n",
                 cert, key);
    else
        snprintf(text, sizeof(text), "return {\n  listen = { { port = 18080 }, { port = 18443 } },\n"
                                     "  upstreams = { product = { url = \"http://127.0.0.1:9001\" } },\n}\n");
    write_file("gateway.lua", text);
}

/* 1 when the certificate ctx serves has the subject CN=cn. */
static int serves(SSL_CTX *ctx, const char *cn)
{
    char desc[512], want[64];
    agw_listen_tls_describe(ctx, desc, sizeof(desc));
    snprintf(want, sizeof(want), "subject CN=%s,", cn);
    return strstr(desc, want) != NULL;
}

/* Every load reads a TLS listener's files again (same paths with new contents, or new paths) into
 * a new SSL_CTX of its own; files that do not load fail it with the line of the key or the cert;
 * turning TLS on or off needs a restart. */
static void test_each_generation_reads_the_tls_files_again(void)
{
    agw_metric_labels_t *labels = agw_metric_labels_new(16, 16);
    agw_buf_t errors = AGW_BUF_INIT;
    make_cert("cert-a");
    make_cert("cert-b");
    make_cert("cert-c");
    copy_file("cert-a.crt", "live.crt");
    copy_file("cert-a.key", "live.key");
    write_tls_gateway("live.crt", "live.key");
    write_file("p.lua", PAGE);
    agw_generation_t *g1 = load(1, NULL, labels, &errors);
    CHECK(g1 != NULL);
    if (g1 == NULL) {
        fprintf(stderr, "%s", errors.base);
        return;
    }
    CHECK(g1->conf.listen[0].ssl_ctx == NULL);
    CHECK(serves(g1->conf.listen[1].ssl_ctx, "cert-a"));
    /* the same paths, new contents */
    copy_file("cert-b.crt", "live.crt");
    copy_file("cert-b.key", "live.key");
    agw_generation_t *g2 = load(2, g1, labels, &errors);
    CHECK(g2 != NULL);
    CHECK(g2 && g2->conf.listen[1].ssl_ctx != g1->conf.listen[1].ssl_ctx);
    CHECK(g2 && serves(g2->conf.listen[1].ssl_ctx, "cert-b"));
    CHECK(serves(g1->conf.listen[1].ssl_ctx, "cert-a")); /* the serving generation keeps its own */
    /* new paths */
    write_tls_gateway("cert-c.crt", "cert-c.key");
    agw_generation_t *g3 = g2 ? load(3, g2, labels, &errors) : NULL;
    CHECK(g3 && serves(g3->conf.listen[1].ssl_ctx, "cert-c"));
    /* a key that is not the certificate's, a certificate that is not PEM */
    write_tls_gateway("cert-c.crt", "cert-a.key");
    CHECK(load(4, g3, labels, &errors) == NULL);
    CHECK(errors.base && strstr(errors.base, "/gateway.lua:6: listen[2].tls.key: the private key ") != NULL);
    CHECK(errors.base && strstr(errors.base, "/cert-a.key does not match the certificate ") != NULL);
    write_file("broken.crt", "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n");
    write_tls_gateway("broken.crt", "cert-c.key");
    CHECK(load(4, g3, labels, &errors) == NULL);
    CHECK(errors.base && strstr(errors.base, "/gateway.lua:5: listen[2].tls.cert: cannot load the certificate "
                                             "chain ") != NULL);
    /* `aggway check` loads the same way: the same message */
    agw_config_t conf;
    agw_buf_reset(&errors);
    CHECK(agw_config_load(dir, &conf, &errors) != 0);
    CHECK(errors.base && strstr(errors.base, "/gateway.lua:5: listen[2].tls.cert: ") != NULL);
    /* TLS off on a listener is a listener change */
    write_tls_gateway(NULL, NULL);
    CHECK(load(4, g3, labels, &errors) == NULL);
    CHECK(errors.base && strstr(errors.base, "listen: the listeners (ports, hosts, reuse_port, or TLS turned on or off) changed")
          != NULL);
    CHECK(agw_generation_live() == 3);
    agw_generation_unref(g1);
    agw_generation_unref(g2);
    agw_generation_unref(g3);
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
    RUN(test_each_generation_reads_the_tls_files_again);
    RUN(test_reload_record);
    char cmd[128];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
    if (system(cmd) != 0)
        return 2;
    return CHECK_DONE();
}
