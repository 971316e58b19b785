/* auth_config.c: the auth block of gateway.lua as C structures (see auth_config.h). */
#include "edge/auth_config.h"
#include "base/luamod.h"
#include "base/mem.h"

#include <lauxlib.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/file.h"

/* The strings of the list field name of the table at idx (a new array, *n of them). */
static char **str_list(lua_State *L, int idx, const char *name, size_t *n)
{
    lua_getfield(L, idx, name);
    *n = lua_istable(L, -1) ? lua_objlen(L, -1) : 0;
    char **v = agw_calloc(*n ? *n : 1, sizeof(char *));
    for (size_t i = 0; i < *n; i++) {
        lua_rawgeti(L, -1, (int)i + 1);
        v[i] = agw_strdup(lua_tostring(L, -1));
        lua_pop(L, 1);
    }
    lua_pop(L, 1);
    return v;
}

/* Reads the whole regular file at path (at most max bytes) into b. Returns 0 or -1 with why. */
static int slurp(const char *path, size_t max, agw_buf_t *b, const char **why)
{
    int fd = agw_file_open_regular(path, why);
    if (fd < 0)
        return -1;
    char chunk[8192];
    ssize_t r;
    while ((r = read(fd, chunk, sizeof(chunk))) > 0) {
        if (b->len + (size_t)r > max) {
            *why = "the file is too large";
            close(fd);
            return -1;
        }
        agw_buf_append(b, chunk, (size_t)r);
    }
    close(fd);
    if (r < 0) {
        *why = "read error";
        return -1;
    }
    return 0;
}

static int load_jwt(lua_State *L, int t, agw_auth_t *a, const char *file, agw_buf_t *errors)
{
    int rc = 0;
    a->jwt_on = 1;
    a->rules.issuer = agw_luamod_field_str(L, t, "issuer");
    a->rules.audiences = (const char *const *)str_list(L, t, "audiences", &a->rules.num_audiences);
    a->rules.required = (const char *const *)str_list(L, t, "required_claims", &a->rules.num_required);
    a->rules.leeway_s = agw_luamod_field_u64(L, t, "leeway_s", 60);
    a->rules.max_token_bytes = (size_t)agw_luamod_field_u64(L, t, "max_token_bytes", 8192);
    a->refresh_s = agw_luamod_field_u64(L, t, "jwks_refresh_s", 300);
    a->cooldown_s = agw_luamod_field_u64(L, t, "jwks_cooldown_s", 30);
    size_t n;
    char **algs = str_list(L, t, "algorithms", &n);
    for (size_t i = 0; i < n; i++) {
        a->algs |= agw_jwt_alg_bit(algs[i]);
        free(algs[i]);
    }
    free(algs);
    char why[512];
    char *path = agw_luamod_field_str(L, t, "jwks_file");
    if (path) {
        agw_buf_t b = {0};
        const char *ferr;
        agw_jwks_t *ks = NULL;
        if (slurp(path, 1024 * 1024, &b, &ferr) != 0)
            snprintf(why, sizeof(why), "cannot read it: %s", ferr);
        else
            ks = agw_jwks_parse(b.base ? b.base : "", b.len, a->algs, why, sizeof(why)); /* NULL: why says it */
        if (ks == NULL) {
            agw_buf_printf(errors, "%s:%d: auth.jwt.jwks_file: %s: %s\n", file,
                           agw_luamod_field_int(L, t, "jwks_file_line", 1),
                           path, why);
            rc = -1;
        }
        agw_auth_set_keys(a, ks);
        agw_buf_free(&b);
        free(path);
    }
    a->jwks_url = agw_luamod_field_str(L, t, "jwks_url");
    if (a->jwks_url && agw_fetch_url_parse(a->jwks_url, &a->url, why, sizeof(why)) != 0) {
        agw_buf_printf(errors, "%s:%d: auth.jwt.jwks_url: %s\n", file,
                       agw_luamod_field_int(L, t, "jwks_url_line", 1), why);
        rc = -1;
    }
    if ((path = agw_luamod_field_str(L, t, "secret_file")) != NULL) {
        agw_buf_t b = {0};
        const char *ferr;
        if (slurp(path, 4096, &b, &ferr) != 0) {
            snprintf(why, sizeof(why), "cannot read %s: %s", path, ferr);
        } else {
            while (b.len && (b.base[b.len - 1] == '\n' || b.base[b.len - 1] == '\r'))
                b.len--; /* a file written with echo */
            a->secret = agw_jwks_secret((const unsigned char *)(b.base ? b.base : ""), b.len, a->algs, why, sizeof(why));
        }
        if (a->secret == NULL) {
            agw_buf_printf(errors, "%s:%d: auth.jwt.secret_file: %s\n", file,
                           agw_luamod_field_int(L, t, "secret_file_line", 1),
                           why);
            rc = -1;
        }
        agw_buf_free(&b);
        free(path);
    }
    return rc;
}

int agw_auth_config_load(lua_State *L, int cfg, agw_auth_t *a, const char *file, agw_buf_t *errors)
{
    int rc = 0;
    lua_getfield(L, cfg, "auth");
    if (!lua_istable(L, -1)) {
        lua_pop(L, 1);
        return 0;
    }
    int at = lua_gettop(L);
    lua_getfield(L, at, "jwt");
    if (lua_istable(L, -1) && load_jwt(L, lua_gettop(L), a, file, errors) != 0)
        rc = -1;
    lua_pop(L, 1);
    lua_getfield(L, at, "api_keys");
    if (lua_istable(L, -1)) {
        int kt = lua_gettop(L);
        a->apikey_header = agw_luamod_field_str(L, kt, "header");
        char *path = agw_luamod_field_str(L, kt, "file");
        agw_buf_t b = {0};
        const char *ferr;
        char why[512];
        if (path && slurp(path, 16 * 1024 * 1024, &b, &ferr) != 0) {
            agw_buf_printf(errors, "%s:%d: auth.api_keys.file: cannot read %s: %s\n", file,
                           agw_luamod_field_int(L, kt, "file_line", 1), path, ferr);
            rc = -1;
        } else if (path && agw_apikeys_parse(b.base ? b.base : "", b.len, &a->apikeys, why, sizeof(why)) != 0) {
            agw_buf_printf(errors, "%s:%d: auth.api_keys.file: %s: %s\n", file,
                           agw_luamod_field_int(L, kt, "file_line", 1),
                           path, why);
            rc = -1;
        } else {
            a->apikeys_on = 1;
        }
        agw_buf_free(&b);
        free(path);
    }
    lua_pop(L, 2);
    return rc;
}

void agw_auth_policy_load(lua_State *L, int idx, agw_auth_policy_t *p)
{
    memset(p, 0, sizeof(*p));
    if (!lua_istable(L, idx))
        return;
    lua_getfield(L, idx, "kind");
    const char *kind = lua_tostring(L, -1);
    p->kind = kind && strcmp(kind, "jwt") == 0       ? AGW_AUTH_JWT
              : kind && strcmp(kind, "api_key") == 0 ? AGW_AUTH_API_KEY
                                                     : AGW_AUTH_NONE;
    lua_pop(L, 1);
    p->scopes = str_list(L, idx, "scopes", &p->num_scopes);
}
