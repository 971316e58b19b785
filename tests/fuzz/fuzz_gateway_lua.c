/* fuzz_gateway_lua.c: loading gateway.lua (agw_config_load: lua/agg/loader.lua and
 * lua/agg/config.lua, then the C half of gateway/script/config.c), as `aggway check`, start-up
 * and every reload do.
 *
 * Input: the text of gateway.lua, in a scripts folder of its own with no endpoint scripts. A load
 * must end (the loader's time budget stops endless code) with either a configuration whose values
 * are in the ranges the C side relies on, or errors of which every line says where
 * ("<folder>/gateway.lua:LINE: ...", LINE within the file): a "loading failed" (a Lua error in the
 * runtime itself) or a message without a place is a failure. Host names resolve only as numeric
 * addresses or "localhost" (getaddrinfo below), so no input makes a DNS query. */
#include <dlfcn.h>
#include <netdb.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "script/config.h"

/* No DNS from a fuzz input: numeric hosts as given, "localhost" as 127.0.0.1, anything else fails
 * as an unknown name would. */
int getaddrinfo(const char *node, const char *service, const struct addrinfo *hints, struct addrinfo **res)
{
    static int (*real)(const char *, const char *, const struct addrinfo *, struct addrinfo **);
    if (real == NULL)
        real = (int (*)(const char *, const char *, const struct addrinfo *, struct addrinfo **))dlsym(RTLD_NEXT, "getaddrinfo");
    struct addrinfo h = hints ? *hints : (struct addrinfo){0};
    h.ai_flags |= AI_NUMERICHOST | AI_NUMERICSERV;
    if (node && strcmp(node, "localhost") == 0)
        node = "127.0.0.1";
    int rc = real(node, service, &h, res);
    return rc == EAI_NONAME ? EAI_NONAME : rc;
}

static char dir[64], file[96];

static void fail(const char *what, const char *detail)
{
    fprintf(stderr, "fuzz_gateway_lua: %s\n%s\n", what, detail);
    abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (dir[0] == '\0') {
        snprintf(dir, sizeof(dir), "/tmp/agw-fuzz-gw-XXXXXX");
        if (mkdtemp(dir) == NULL)
            abort();
        snprintf(file, sizeof(file), "%s/gateway.lua", dir);
    }
    FILE *f = fopen(file, "wb");
    if (f == NULL || fwrite(data, 1, size, f) != size || fclose(f) != 0)
        abort();
    /* lines as Lua counts them (its messages' numbers): LF, CR, CR LF and LF CR each end one */
    size_t lines = 1;
    for (size_t i = 0; i < size; i++)
        if (data[i] == '\n' || data[i] == '\r') {
            lines++;
            if (i + 1 < size && (data[i + 1] == '\n' || data[i + 1] == '\r') && data[i + 1] != data[i])
                i++;
        }

    agw_config_t conf;
    agw_buf_t errors = AGW_BUF_INIT;
    int rc = agw_config_load(dir, &conf, &errors);
    agw_buf_putc(&errors, '\0');
    if (rc == 0) {
        if (errors.len > 1)
            fail("a loaded configuration with errors", errors.base);
        /* the bounds agg.config documents (lua/agg/config.lua): a number past them is refused
         * with its line, never handed to C to convert (a double outside an integer type's range
         * converted with a cast is undefined behaviour) */
        if (conf.workers < 1 || conf.workers > 256 || conf.deadline_ms < 1 || conf.deadline_ms > 3600000 ||
            conf.max_request_body_bytes < 1 || conf.max_request_body_bytes > 1073741824 || conf.num_listen < 1 ||
            conf.shutdown_grace_ms > 3600000 || conf.script_time_limit_ms > 600000)
            fail("a configuration out of range", "workers, deadline_ms, max_request_body_bytes, the grace, "
                                                  "the script time limit or listen");
        for (size_t i = 0; i < conf.num_listen; i++)
            if (conf.listen[i].port < 0 || conf.listen[i].port > 65535 || conf.listen[i].host == NULL)
                fail("a listener out of range", conf.listen[i].host ? conf.listen[i].host : "(no host)");
        for (size_t i = 0; i < conf.num_upstreams; i++) {
            const agw_upstream_conf_t *u = &conf.upstreams[i];
            if (u->name == NULL || u->url == NULL || u->host_header == NULL || u->max_connections < 1 ||
                u->timeout_ms > INT32_MAX || u->connect_timeout_ms > INT32_MAX || u->idle_timeout_ms > INT32_MAX ||
                u->max_body_bytes > INT32_MAX || u->max_pending > INT32_MAX)
                fail("an upstream out of range", u->name ? u->name : "(no name)");
        }
        agw_config_free(&conf);
    } else {
        if (errors.len <= 1)
            fail("a refused configuration without errors", "");
        char prefix[128];
        int pl = snprintf(prefix, sizeof(prefix), "%s:", file);
        for (char *line = errors.base, *nl; *line; line = nl + 1) {
            nl = strchr(line, '\n');
            if (nl == NULL)
                fail("an error line without its newline", line);
            *nl = '\0';
            char *end = NULL;
            unsigned long n = strncmp(line, prefix, (size_t)pl) == 0 ? strtoul(line + pl, &end, 10) : 0;
            if (n < 1 || n > lines || end == NULL || strncmp(end, ": ", 2) != 0)
                fail("an error without its place in gateway.lua", line);
        }
    }
    agw_buf_free(&errors);
    return 0;
}
