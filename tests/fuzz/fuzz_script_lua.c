/* fuzz_script_lua.c: loading an endpoint script (agw_config_load: lua/agg/loader.lua compiles it,
 * runs its top level in the sandbox under the load budget, checks its route, options and call
 * specs, and lints its source), as `aggway check`, start-up and every reload do.
 *
 * Input: the text of page.lua, in a scripts folder whose gateway.lua is fixed (the demo's three
 * upstreams; nothing listens). A load must end (the load budget stops endless code) with either a
 * configuration, or errors of which every line says where: "<folder>/page.lua:LINE: ..." with
 * LINE within the file (a line that continues the one before starts with a tab: Lua's own
 * "error loading module" text). A "loading failed" (a Lua error in the runtime itself), a message
 * about gateway.lua (which is valid) or one without a place is a failure. A script that loads is
 * then run once against generated stubs, as `aggway check` does after the load (lua/agg/dryrun.lua:
 * its findings are "page.lua:LINE: ..." too; the dry run itself must not fail). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <lauxlib.h>

#include "base/heap.h"
#include "script/config.h"
#include "script/script.h"

static char dir[64], file[96];

static const char gateway_lua[] =
    "return {\n"
    "  listen = { { port = 18080 } },\n"
    "  upstreams = {\n"
    "    product = { url = \"http://127.0.0.1:1\", timeout_ms = 150 },\n"
    "    reviews = { url = \"http://127.0.0.1:2\", timeout_ms = 100,\n"
    "                cache = { ttl_s = 30, swr_s = 10 } },\n"
    "    inventory = { url = \"http://127.0.0.1:3/base\", timeout_ms = 100 },\n"
    "  },\n"
    "}\n";

static void fail(const char *what, const char *detail)
{
    fprintf(stderr, "fuzz_script_lua: %s\n%s\n", what, detail);
    abort();
}

/* Checks that every line of text (NUL-terminated, each line ending in '\n') names a line of
 * page.lua from 1 to lines, or continues the line before (a tab first). */
static void check_places(char *text, size_t lines, const char *what)
{
    char prefix[128];
    int pl = snprintf(prefix, sizeof(prefix), "%s:", file);
    for (char *line = text, *nl; *line; line = nl + 1) {
        nl = strchr(line, '\n');
        if (nl == NULL)
            fail("an error line without its newline", line);
        *nl = '\0';
        if (line[0] == '\t')
            continue;
        char *end = NULL;
        unsigned long n = strncmp(line, prefix, (size_t)pl) == 0 ? strtoul(line + pl, &end, 10) : 0;
        if (n < 1 || n > lines || end == NULL || strncmp(end, ": ", 2) != 0)
            fail(what, line);
    }
}

/* aggway check's dry run (gateway/main.c): each finding must have its place in page.lua. */
static void dry_run(size_t lines)
{
    lua_State *L = agw_vm_new(dir);
    if (L == NULL)
        abort();
    lua_pushstring(L, dir);
    lua_setglobal(L, "AGGWAY_SCRIPTS");
    if (luaL_dostring(L, "return require 'agg.dryrun'.run(AGGWAY_SCRIPTS)") != 0)
        fail("the dry run failed", lua_tostring(L, -1) ? lua_tostring(L, -1) : "(no message)");
    agw_buf_t found = AGW_BUF_INIT;
    size_t n = lua_istable(L, -1) ? lua_objlen(L, -1) : 0;
    for (size_t i = 1; i <= n; i++) {
        lua_rawgeti(L, -1, (int)i);
        const char *msg = lua_tostring(L, -1);
        if (msg == NULL)
            fail("a dry-run finding that is not a string", "");
        agw_buf_puts(&found, msg);
        agw_buf_putc(&found, '\n');
        lua_pop(L, 1);
    }
    agw_heap_close_lua_state(L);
    agw_buf_putc(&found, '\0');
    check_places(found.base, lines, "a dry-run finding without its place in page.lua");
    agw_buf_free(&found);
}

static void write_file(const char *path, const uint8_t *data, size_t size)
{
    FILE *f = fopen(path, "wb");
    if (f == NULL || fwrite(data, 1, size, f) != size || fclose(f) != 0)
        abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (dir[0] == '\0') {
        snprintf(dir, sizeof(dir), "/tmp/agw-fuzz-script-XXXXXX");
        if (mkdtemp(dir) == NULL)
            abort();
        char gw[96];
        snprintf(gw, sizeof(gw), "%s/gateway.lua", dir);
        write_file(gw, (const uint8_t *)gateway_lua, sizeof(gateway_lua) - 1);
        snprintf(file, sizeof(file), "%s/page.lua", dir);
    }
    write_file(file, data, size);
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
        agw_config_free(&conf);
        dry_run(lines);
    } else {
        if (errors.len <= 1)
            fail("a refused script without errors", "");
        check_places(errors.base, lines, "an error without its place in page.lua");
    }
    agw_buf_free(&errors);
    return 0;
}
