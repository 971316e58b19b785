/* auth_config.h: the edge's part of a generation's C configuration, read from the checked Lua
 * config (lua/agg/edge_config.lua normalized it; config.c calls these). */
#ifndef AGW_EDGE_AUTH_CONFIG_H
#define AGW_EDGE_AUTH_CONFIG_H

#include <lua.h>

#include "base/buf.h"
#include "edge/auth.h"

/* Fills a (initialized by the caller with agw_auth_init) from the normalized `auth` block at
 * index cfg's "auth" field (absent: nothing configured). Reads and parses jwks_file, secret_file
 * and the API key file. Returns 0, or -1 with "file:line: auth.…: why" lines appended to errors
 * (file: gateway.lua's path, for lines the Lua side recorded). */
int agw_auth_config_load(lua_State *L, int cfg, agw_auth_t *a, const char *file, agw_buf_t *errors);

/* Fills p from an endpoint's normalized policy (a table { kind, scopes } at idx). */
void agw_auth_policy_load(lua_State *L, int idx, agw_auth_policy_t *p);

#endif
