/* config.c: a scripts folder's generation as C structures (see config.h). */
#include "script/config.h"
#include "upstream/resolve.h"

#include "base/luamod.h"
#include "base/heap.h"
#include "base/mem.h"

#include <lauxlib.h>
#include <openssl/ssl.h>
#include <netdb.h>
#include <sys/resource.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "edge/auth_config.h"
#include "script/listen_tls.h"
#include "base/log.h"
#include "script/script.h"
#include "upstream/tls.h"

/* Resolves host:port into *addr (its first address as upstream/resolve.h orders them). Returns 0,
 * or -1 with "file:line: where: cannot resolve…" in errors. */
static int resolve(struct sockaddr_storage *addr, socklen_t *addrlen, const char *where, const char *host, int port,
                   const char *file, int line, agw_buf_t *errors)
{
    char why[256];
    if (agw_resolve_host(host, port, addr, addrlen, 1, why, sizeof(why)) < 0) {
        agw_buf_printf(errors, "%s:%d: %s: cannot resolve host '%s': %s\n", file, line, where, host, why);
        return -1;
    }
    return 0;
}

/* Reads the checked tls table of an https:// upstream (on the stack at t, or absent for http://)
 * into u->tls and builds its SSL_CTX. Returns 0 or -1 with "file:line: upstreams.NAME.tls: why". */
static int load_upstream_tls(lua_State *L, int t, agw_upstream_conf_t *u, const char *file, agw_buf_t *errors)
{
    lua_getfield(L, t, "tls");
    if (!lua_istable(L, -1)) {
        lua_pop(L, 1);
        return 0;
    }
    int tt = lua_gettop(L);
    agw_upstream_tls_t *tls = agw_calloc(1, sizeof(*tls));
    tls->ca_file = agw_luamod_field_str(L, tt, "ca_file");
    tls->server_name = agw_luamod_field_str(L, tt, "server_name");
    lua_getfield(L, tt, "verify");
    tls->verify = lua_toboolean(L, -1);
    lua_pop(L, 1);
    int line = agw_luamod_field_int(L, tt, "line", agw_luamod_field_int(L, t, "line", 1));
    lua_pop(L, 1);
    u->tls = tls;
    char why[256];
    if (agw_upstream_tls_init(tls, why, sizeof(why)) != 0) {
        agw_buf_printf(errors, "%s:%d: upstreams.%s.tls: %s\n", file, line, u->name, why);
        return -1;
    }
    if (!tls->verify)
        agw_log(AGW_LOG_WARN, "%s:%d: upstreams.%s.tls.verify is false: the certificate of %s is not checked, "
                "anyone on the path can pose as it", file, line, u->name, u->url);
    return 0;
}

/* The slots endpoint e (0-based) of upstream table t (on L's stack) takes: 1 for an address,
 * AGW_ADDRS_PER_NAME for a host name (group/directory.h). */
static size_t endpoint_slots(lua_State *L, int t, size_t e)
{
    lua_getfield(L, t, "endpoint_list"); /* nil for an upstream the gateway adds itself (edge) */
    if (lua_istable(L, -1))
        lua_rawgeti(L, -1, (int)e + 1);
    else
        lua_pushnil(L);
    char *host = lua_istable(L, -1) ? agw_luamod_field_str(L, lua_gettop(L), "host")
                                    : agw_luamod_field_str(L, t, "host");
    lua_pop(L, 2);
    size_t n = host && !agw_host_is_address(host) ? AGW_ADDRS_PER_NAME : 1;
    free(host);
    return n;
}

/* The endpoints of every upstream (conf->eps, conf->ep_first, conf->names), once conf->upstreams
 * is loaded: each a copy of its upstream's description with the endpoint's URL, Host header, base
 * path and address. An endpoint URL with an address is one slot; one with a host name is
 * AGW_ADDRS_PER_NAME slots, one per address it resolves to now (the rest out of service: address
 * length 0), re-resolved every resolve_every_s (group/directory.h). ups: index of gateway.lua's
 * checked upstreams list on L's stack. Returns 0, or -1 with "file:line:
 * upstreams.NAME.endpoints[i]: cannot resolve…" in errors. */
static int load_endpoints(lua_State *L, int ups, agw_config_t *conf, const char *file, agw_buf_t *errors)
{
    size_t total = 0, names = 0;
    for (size_t i = 0; i < conf->num_upstreams; i++) {
        lua_rawgeti(L, ups, (int)i + 1);
        int t = lua_gettop(L);
        lua_getfield(L, t, "endpoint_list");
        size_t ne = lua_istable(L, -1) ? lua_objlen(L, -1) : 0;
        lua_pop(L, 1);
        for (size_t e = 0; e < (ne ? ne : 1); e++) {
            size_t n = endpoint_slots(L, t, e);
            total += n;
            names += n > 1;
        }
        lua_pop(L, 1);
    }
    conf->eps = agw_calloc(total ? total : 1, sizeof(*conf->eps));
    conf->ep_first = agw_calloc(conf->num_upstreams + 1, sizeof(*conf->ep_first));
    conf->names = agw_calloc(names ? names : 1, sizeof(*conf->names));
    int rc = 0;
    size_t k = 0;
    for (size_t i = 0; i < conf->num_upstreams; i++) {
        const agw_upstream_conf_t *u = &conf->upstreams[i];
        conf->ep_first[i] = k;
        lua_rawgeti(L, ups, (int)i + 1);
        int t = lua_gettop(L);
        int line = agw_luamod_field_int(L, t, "line", 1);
        uint64_t every_ms = agw_luamod_to_u64(agw_luamod_field_num(L, t, "resolve_every_s", 30) * 1000);
        lua_getfield(L, t, "endpoint_list");
        int list = lua_gettop(L);
        size_t ne = lua_istable(L, list) ? lua_objlen(L, list) : 0;
        for (size_t e = 0; e < (ne ? ne : 1); e++) {
            size_t nslots = endpoint_slots(L, t, e);
            if (k - conf->ep_first[i] + nslots > 255) {
                agw_buf_printf(errors, "%s:%d: upstreams.%s: more than 255 endpoints (a URL with a host name counts as %d, "
                               "one per address it may resolve to); list fewer URLs\n", file, line, u->name,
                               AGW_ADDRS_PER_NAME);
                rc = -1;
                break;
            }
            int et = t;
            if (ne) {
                lua_rawgeti(L, list, (int)e + 1);
                et = lua_gettop(L);
            }
            char *host = agw_luamod_field_str(L, et, "host");
            int port = agw_luamod_field_int(L, et, "port", 80);
            char where[256];
            if (ne > 1)
                snprintf(where, sizeof(where), "upstreams.%s.endpoints[%zu]", u->name, e + 1);
            else
                snprintf(where, sizeof(where), "upstreams.%s.url", u->name);
            for (size_t j = 0; j < nslots; j++) {
                agw_upstream_conf_t *ep = &conf->eps[k + j];
                agw_upstream_conf_copy(ep, u);
                free(ep->url), free(ep->host_header), free(ep->base_path);
                ep->url = agw_luamod_field_str(L, et, "url");
                ep->host_header = agw_luamod_field_str(L, et, "host_header");
                ep->base_path = agw_luamod_field_str(L, et, "base_path");
                ep->addrlen = 0;
            }
            if (host == NULL) {
                rc = -1;
            } else if (nslots == 1) {
                if (resolve(&conf->eps[k].addr, &conf->eps[k].addrlen, where, host, port, file, line, errors) != 0)
                    rc = -1;
            } else {
                struct sockaddr_storage addr[AGW_ADDRS_PER_NAME];
                socklen_t len[AGW_ADDRS_PER_NAME];
                char why[256];
                int n = agw_resolve_host(host, port, addr, len, AGW_ADDRS_PER_NAME, why, sizeof(why));
                if (n < 0) {
                    agw_buf_printf(errors, "%s:%d: %s: cannot resolve host '%s': %s\n", file, line, where, host, why);
                    rc = -1;
                }
                for (int j = 0; j < n; j++) {
                    conf->eps[k + (size_t)j].addr = addr[j];
                    conf->eps[k + (size_t)j].addrlen = len[j];
                }
                agw_ep_name_t *nm = &conf->names[conf->num_names++];
                nm->host = agw_strdup(host);
                nm->port = port;
                nm->where = agw_strdup(where);
                nm->first = k;
                nm->every_ms = every_ms;
            }
            free(host);
            if (ne)
                lua_pop(L, 1);
            k += nslots;
        }
        lua_pop(L, 2);
    }
    conf->ep_first[conf->num_upstreams] = k;
    return rc;
}

static int load_upstreams(lua_State *L, int cfg, agw_config_t *conf, agw_buf_t *errors)
{
    char file[4096];
    snprintf(file, sizeof(file), "%s/gateway.lua", conf->dir);
    lua_getfield(L, cfg, "upstreams");
    int ups = lua_gettop(L);
    size_t n = lua_objlen(L, ups);
    conf->upstreams = agw_calloc(n ? n : 1, sizeof(*conf->upstreams));
    conf->breakers = agw_calloc(n ? n : 1, sizeof(*conf->breakers));
    conf->num_upstreams = n;
    int rc = 0;
    for (size_t i = 0; i < n; i++) {
        lua_rawgeti(L, ups, (int)i + 1);
        int t = lua_gettop(L);
        agw_upstream_conf_t *u = &conf->upstreams[i];
        u->name = agw_luamod_field_str(L, t, "name");
        u->url = agw_luamod_field_str(L, t, "url");
        u->host_header = agw_luamod_field_str(L, t, "host_header");
        u->base_path = agw_luamod_field_str(L, t, "base_path");
        u->timeout_ms = agw_luamod_field_u64(L, t, "timeout_ms", 1000);
        u->connect_timeout_ms = agw_luamod_field_u64(L, t, "connect_timeout_ms", 100);
        u->idle_timeout_ms = agw_luamod_field_u64(L, t, "idle_timeout_ms", 60000);
        u->max_connections = (unsigned)agw_luamod_field_u64(L, t, "max_connections", 64);
        u->max_pending = (unsigned)agw_luamod_field_u64(L, t, "max_pending", 256);
        u->max_body_bytes = (size_t)agw_luamod_field_u64(L, t, "max_body_bytes", 8 * 1024 * 1024);
        u->max_rps = agw_luamod_field_u64(L, t, "max_rps", 0);
        lua_getfield(L, t, "health");
        u->health_checked = lua_istable(L, -1);
        lua_pop(L, 1);
        /* the breaker block is always a table after checking: { failures, open_s, half_open_probes, off } */
        lua_getfield(L, t, "breaker");
        int bt = lua_gettop(L);
        lua_getfield(L, bt, "off");
        int off = lua_toboolean(L, -1);
        lua_pop(L, 1);
        conf->breakers[i] = agw_breaker_new(off ? 0 : (unsigned)agw_luamod_field_u64(L, bt, "failures", 5),
                         agw_luamod_to_u64(agw_luamod_field_num(L, bt, "open_s", 30) * 1000),
                         (unsigned)agw_luamod_field_u64(L, bt, "half_open_probes", 1));
        lua_settop(L, t);
        char *host = agw_luamod_field_str(L, t, "host");
        int port = agw_luamod_field_int(L, t, "port", 80);
        int line = agw_luamod_field_int(L, t, "line", 1);
        char where[256];
        snprintf(where, sizeof(where), "upstreams.%s.url", u->name);
        if (host == NULL || resolve(&u->addr, &u->addrlen, where, host, port, file, line, errors) != 0)
            rc = -1;
        if (load_upstream_tls(L, t, u, file, errors) != 0)
            rc = -1;
        free(host);
        lua_pop(L, 1);
    }
    if (rc == 0 && load_endpoints(L, ups, conf, file, errors) != 0)
        rc = -1;
    lua_pop(L, 1);
    return rc;
}

static void load_endpoint_limits(lua_State *L, int e, int cfg, agw_endpoint_info_t *ep);

static int load_routes(lua_State *L, int gen, int cfg, agw_config_t *conf, agw_buf_t *errors)
{
    lua_getfield(L, gen, "endpoints");
    int eps = lua_gettop(L);
    size_t n = lua_objlen(L, eps);
    int rc = 0;
    conf->endpoints = agw_calloc(n ? n : 1, sizeof(*conf->endpoints));
    conf->auth_policies = agw_calloc(n ? n : 1, sizeof(*conf->auth_policies));
    conf->num_endpoints = n;
    for (size_t i = 0; i < n; i++) {
        lua_rawgeti(L, eps, (int)i + 1);
        int e = lua_gettop(L);
        conf->endpoints[i].route = agw_luamod_field_str(L, e, "route");
        conf->endpoints[i].method = agw_luamod_field_str(L, e, "method");
        conf->endpoints[i].file = agw_luamod_field_str(L, e, "file");
        conf->endpoints[i].deadline_ms = agw_luamod_field_num(L, e, "deadline_ms", 1000); /* (loader.lua fills it) */
        load_endpoint_limits(L, e, cfg, &conf->endpoints[i]);
        lua_getfield(L, e, "auth");
        agw_auth_policy_load(L, lua_gettop(L), &conf->auth_policies[i]);
        lua_pop(L, 1);
        char err[512];
        if (agw_router_add_lua(&conf->router, L, e, (int)i + 1, err, sizeof(err)) != 0) {
            agw_buf_printf(errors, "%s: %s\n", conf->endpoints[i].file, err);
            rc = -1;
        }
        lua_pop(L, 1);
    }
    lua_pop(L, 1);
    return rc;
}

/* limits = { headers, local_keys, rules } as agg.limits checked it, and max_in_flight. */
static void load_limits(lua_State *L, int cfg, agw_config_t *conf)
{
    agw_limits_conf_t *lc = &conf->limits;
    lc->max_in_flight = (unsigned)agw_luamod_field_u64(L, cfg, "max_in_flight", 4096);
    lua_getfield(L, cfg, "limits");
    int t = lua_gettop(L);
    lua_getfield(L, t, "headers");
    lc->headers = lua_toboolean(L, -1);
    lua_pop(L, 1);
    lc->local_keys = (size_t)agw_luamod_field_u64(L, t, "local_keys", 65536);
    lua_getfield(L, t, "rules");
    int rs = lua_gettop(L);
    size_t n = lua_istable(L, rs) ? lua_objlen(L, rs) : 0;
    lc->rules = calloc(n ? n : 1, sizeof(*lc->rules));
    lc->num_rules = n;
    for (size_t i = 0; i < n; i++) {
        lua_rawgeti(L, rs, (int)i + 1);
        int r = lua_gettop(L);
        agw_limit_rule_t *rule = &lc->rules[i];
        rule->name = agw_luamod_field_str(L, r, "name");
        char *key = agw_luamod_field_str(L, r, "key");
        rule->key = strcmp(key, "ip") == 0 ? AGW_LIMIT_KEY_IP
                    : strcmp(key, "route") == 0   ? AGW_LIMIT_KEY_ROUTE
                    : strcmp(key, "api_key") == 0 ? AGW_LIMIT_KEY_API_KEY
                    : strcmp(key, "user") == 0    ? AGW_LIMIT_KEY_USER
                    : strcmp(key, "function") == 0 ? AGW_LIMIT_KEY_FUNCTION
                                                  : AGW_LIMIT_KEY_HEADER;
        free(key);
        char *store = agw_luamod_field_str(L, r, "store");
        rule->redis = store && strcmp(store, "redis") == 0;
        free(store);
        lc->num_redis += (size_t)rule->redis;
        char *on_err = agw_luamod_field_str(L, r, "on_redis_error");
        rule->on_redis_error = on_err && strcmp(on_err, "allow") == 0  ? AGW_LIMIT_FALLBACK_ALLOW
                               : on_err && strcmp(on_err, "deny") == 0 ? AGW_LIMIT_FALLBACK_DENY
                                                                       : AGW_LIMIT_FALLBACK_LOCAL;
        free(on_err);
        lua_getfield(L, r, "before_auth"); /* (agg.limits: true or false for an ip rule, else nil) */
        rule->before_auth = rule->key == AGW_LIMIT_KEY_IP && lua_toboolean(L, -1);
        lua_pop(L, 1);
        rule->header = agw_luamod_field_str(L, r, "header");
        char *window = agw_luamod_field_str(L, r, "window");
        if (window) {
            rule->is_quota = 1;
            rule->quota = agw_luamod_field_u64(L, r, "quota", 1);
            rule->window = strcmp(window, "hour") == 0 ? AGW_LIMIT_HOUR : strcmp(window, "day") == 0 ? AGW_LIMIT_DAY
                                                                                                      : AGW_LIMIT_MONTH;
            free(window);
        } else {
            rule->rate = agw_luamod_field_u64(L, r, "rate", 1);
            rule->per_s = agw_luamod_field_u64(L, r, "per_s", 1);
            rule->burst = agw_luamod_field_u64(L, r, "burst", rule->rate);
        }
        agw_limit_rule_seal(rule);
        lua_pop(L, 1);
    }
    lua_settop(L, t - 1);
}

/* An endpoint's rule indexes (0-based, from limits.by_name) and priority. */
static void load_endpoint_limits(lua_State *L, int e, int cfg, agw_endpoint_info_t *ep)
{
    ep->priority = agw_luamod_field_int(L, e, "priority", 2);
    lua_getfield(L, e, "limits");
    int names = lua_gettop(L);
    lua_getfield(L, cfg, "limits");
    lua_getfield(L, -1, "by_name");
    int by_name = lua_gettop(L);
    size_t n = lua_istable(L, names) ? lua_objlen(L, names) : 0;
    ep->limits = calloc(n ? n : 1, sizeof(*ep->limits));
    for (size_t i = 0; i < n; i++) {
        lua_rawgeti(L, names, (int)i + 1);
        lua_rawget(L, by_name);
        if (lua_isnumber(L, -1))
            ep->limits[ep->num_limits++] = (uint32_t)lua_tointeger(L, -1) - 1;
        lua_pop(L, 1);
    }
    lua_settop(L, names - 1);
}

static int load_listen(lua_State *L, int cfg, agw_config_t *conf)
{
    lua_getfield(L, cfg, "listen");
    int t = lua_gettop(L);
    size_t n = lua_objlen(L, t);
    conf->listen = agw_calloc(n ? n : 1, sizeof(*conf->listen));
    conf->num_listen = n;
    for (size_t i = 0; i < n; i++) {
        lua_rawgeti(L, t, (int)i + 1);
        int e = lua_gettop(L);
        conf->listen[i].host = agw_luamod_field_str(L, e, "host");
        conf->listen[i].port = agw_luamod_field_int(L, e, "port", 8080);
        conf->listen[i].reuse_port = agw_luamod_field_int(L, e, "reuse_port", 0);
        conf->listen[i].cert_file = agw_luamod_field_str(L, e, "cert");
        conf->listen[i].key_file = agw_luamod_field_str(L, e, "key");
        conf->listen[i].cert_line = agw_luamod_field_int(L, e, "cert_line", 1);
        conf->listen[i].key_line = agw_luamod_field_int(L, e, "key_line", 1);
        lua_pop(L, 1);
    }
    lua_pop(L, 1);
    return 0;
}

/* admin = { host, port, allowed_hosts } (absent: no admin listener) and access_log = "path" | "stderr"
 * (absent: off). */
static void load_admin(lua_State *L, int cfg, agw_config_t *conf)
{
    lua_getfield(L, cfg, "admin");
    if (lua_istable(L, -1)) {
        int t = lua_gettop(L);
        conf->admin_host = agw_luamod_field_str(L, t, "host");
        conf->admin_port = agw_luamod_field_int(L, t, "port", 9090);
        conf->admin_allowed_hosts = agw_luamod_field_str(L, t, "allowed_hosts");
        if (conf->admin_host == NULL)
            conf->admin_host = agw_strdup("127.0.0.1");
    }
    lua_pop(L, 1);
    char *log = agw_luamod_field_str(L, cfg, "access_log");
    if (log && strcmp(log, "stderr") != 0 && log[0] != '/') {
        size_t len = strlen(conf->dir) + strlen(log) + 2;
        char *full = agw_malloc(len);
        snprintf(full, len, "%s/%s", conf->dir, log);
        free(log);
        log = full;
    }
    conf->access_log = log;
    conf->access_log_line = log ? (int)agw_luamod_field_int(L, cfg, "access_log_line", 1) : 0;
}

/* redis = { url, timeout_ms, line } and cache = { memory_bytes, redis } as agg.config normalized
 * them: the URL parsed and its host resolved here (redis/redis.h). */
static int load_redis_cache(lua_State *L, int cfg, agw_config_t *conf, const char *dir, agw_buf_t *errors)
{
    int rc = 0;
    lua_getfield(L, cfg, "redis");
    if (lua_istable(L, -1)) {
        int t = lua_gettop(L);
        char *url = agw_luamod_field_str(L, t, "url");
        char err[256];
        if (url && agw_redis_parse_url(url, agw_luamod_field_u64(L, t, "timeout_ms", 5), &conf->redis, err,
                                       sizeof(err)) != 0) {
            agw_buf_printf(errors, "%s/gateway.lua:%d: redis.url: %s\n", dir, agw_luamod_field_int(L, t, "line", 1),
                           err);
            rc = -1;
        }
        free(url);
    }
    lua_pop(L, 1);
    lua_getfield(L, cfg, "cache");
    conf->cache_memory_bytes = (size_t)agw_luamod_field_u64(L, lua_gettop(L), "memory_bytes", 64.0 * 1024 * 1024);
    lua_getfield(L, -1, "redis");
    conf->cache_redis = lua_toboolean(L, -1) && conf->redis.host != NULL;
    lua_pop(L, 2);
    return rc;
}

/* tracing = { otlp_http, service_name, timeout_ms } as agg.config normalized it (absent: no export). */
static int load_tracing(lua_State *L, int cfg, agw_config_t *conf, agw_buf_t *errors)
{
    int rc = 0;
    lua_getfield(L, cfg, "tracing");
    if (lua_istable(L, -1)) {
        int t = lua_gettop(L);
        conf->otlp_url = agw_luamod_field_str(L, t, "otlp_http");
        conf->otlp_host_header = agw_luamod_field_str(L, t, "host_header");
        conf->otlp_path = agw_luamod_field_str(L, t, "path");
        conf->otlp_service_name = agw_luamod_field_str(L, t, "service_name");
        conf->otlp_timeout_ms = agw_luamod_field_u64(L, t, "timeout_ms", 2000);
        char *host = agw_luamod_field_str(L, t, "host");
        char file[4096];
        snprintf(file, sizeof(file), "%s/gateway.lua", conf->dir);
        if (conf->otlp_url && host &&
            resolve(&conf->otlp_addr, &conf->otlp_addrlen, "tracing.otlp_http", host,
                    agw_luamod_field_int(L, t, "port", 80),
                    file, agw_luamod_field_int(L, t, "line", 1), errors) != 0)
            rc = -1;
        free(host);
    }
    lua_pop(L, 1);
    return rc;
}

/* Resolves a TLS file path relative to the scripts folder. */
static void resolve_tls_paths(agw_config_t *conf)
{
    for (size_t i = 0; i < conf->num_listen; i++) {
        char **files[2] = {&conf->listen[i].cert_file, &conf->listen[i].key_file};
        for (int k = 0; k < 2; k++) {
            char *p = *files[k];
            if (p == NULL || p[0] == '/')
                continue;
            size_t len = strlen(conf->dir) + strlen(p) + 2;
            char *full = agw_malloc(len);
            snprintf(full, len, "%s/%s", conf->dir, p);
            free(p);
            *files[k] = full;
        }
    }
}

/* Builds the SSL_CTX of every TLS listener from its files (resolved paths). Returns 0, or -1 with
 * "file:line: listen[N].tls.cert|key: why" for each listener whose files do not load. */
static int load_listen_tls(agw_config_t *conf, agw_buf_t *errors)
{
    int rc = 0;
    for (size_t i = 0; i < conf->num_listen; i++) {
        agw_listen_conf_t *l = &conf->listen[i];
        if (l->cert_file == NULL)
            continue;
        agw_listen_tls_file_t bad;
        char why[1024];
        if ((l->ssl_ctx = agw_listen_tls_new(l->cert_file, l->key_file, &bad, why, sizeof(why))) == NULL) {
            int key = bad == AGW_LISTEN_TLS_KEY;
            agw_buf_printf(errors, "%s/gateway.lua:%d: listen[%zu].tls.%s: %s\n", conf->dir,
                           key ? l->key_line : l->cert_line, i + 1, key ? "key" : "cert", why);
            rc = -1;
        }
    }
    return rc;
}

unsigned agw_config_auto_max_connections(void)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY || rl.rlim_cur > 2000000)
        return 1000000;
    long n = ((long)rl.rlim_cur - 64) / 2;
    return n < 16 ? 16 : (unsigned)n;
}

/* clients = { … } as config.lua normalized it (every field present). */
static void load_clients(lua_State *L, int cfg, agw_config_t *conf)
{
    agw_clients_conf_t *c = &conf->clients;
    lua_getfield(L, cfg, "clients");
    int t = lua_istable(L, -1) ? lua_gettop(L) : 0;
    c->max_connections = t ? (unsigned)agw_luamod_field_u64(L, t, "max_connections", 0) : 0;
    if (c->max_connections == 0)
        c->max_connections = agw_config_auto_max_connections();
    c->max_headers = t ? (unsigned)agw_luamod_field_u64(L, t, "max_headers", 100) : 100;
    c->max_header_bytes = t ? (size_t)agw_luamod_field_u64(L, t, "max_header_bytes", 65536) : 65536;
    c->max_uri_bytes = t ? (size_t)agw_luamod_field_u64(L, t, "max_uri_bytes", 8192) : 8192;
    c->max_cancelled_streams = t ? (unsigned)agw_luamod_field_u64(L, t, "max_cancelled_streams", 100) : 100;
    c->cancel_window_ms = agw_luamod_to_u64((t ? agw_luamod_field_num(L, t, "cancel_window_s", 10) : 10) * 1000);
    c->send_timeout_s = t ? (unsigned)agw_luamod_field_u64(L, t, "send_timeout_s", 60) : 60;
    c->max_unsent_bytes = t ? (size_t)agw_luamod_field_u64(L, t, "max_unsent_bytes", 16777216) : 16777216;
    lua_pop(L, 1);
}

int agw_config_load(const char *dir, agw_config_t *conf, agw_buf_t *errors)
{
    memset(conf, 0, sizeof(*conf));
    agw_auth_init(&conf->auth);
    conf->dir = agw_strdup(dir);
    lua_State *L = agw_vm_new(dir);
    if (L == NULL) {
        agw_buf_puts(errors, "out of memory creating a Lua state\n");
        agw_config_free(conf);
        return -1;
    }
    if (agw_vm_load_generation(L, dir, errors) != 0) {
        agw_heap_close_lua_state(L);
        agw_config_free(conf); /* the folder's name: a reload that fails must leave nothing behind */
        return -1;
    }
    int gen = lua_gettop(L);
    lua_getfield(L, gen, "config");
    int cfg = lua_gettop(L);
    long workers = (long)agw_luamod_field_u64(L, cfg, "workers", 0);
    if (workers <= 0) {
        long cores = sysconf(_SC_NPROCESSORS_ONLN);
        workers = cores > 0 ? cores : 1;
    }
    conf->workers = (unsigned)workers;
    conf->deadline_ms = agw_luamod_field_u64(L, cfg, "deadline_ms", 1000);
    conf->max_request_body_bytes = (size_t)agw_luamod_field_u64(L, cfg, "max_request_body_bytes", 1024 * 1024);
    conf->max_request_json_values = (size_t)agw_luamod_field_u64(L, cfg, "max_request_json_values", 10000);
    lua_getfield(L, cfg, "batch"); /* agg.config checked it: { path, max_requests, deadline_ms | false } */
    if (lua_istable(L, -1)) {
        int bt = lua_gettop(L);
        conf->batch_path = agw_luamod_field_str(L, bt, "path");
        if (conf->batch_path) {
            size_t n = strlen(conf->batch_path) + 6;
            conf->batch_route = agw_malloc(n);
            snprintf(conf->batch_route, n, "POST %s", conf->batch_path);
        }
        conf->batch_max_requests = (size_t)agw_luamod_field_u64(L, bt, "max_requests", 20);
        lua_getfield(L, bt, "deadline_ms");
        conf->batch_deadline_ms = lua_isnumber(L, -1) ? agw_luamod_to_u64(lua_tonumber(L, -1)) : conf->deadline_ms;
        lua_pop(L, 1);
    }
    lua_pop(L, 1);
    conf->shutdown_grace_ms = agw_luamod_field_u64(L, cfg, "shutdown_grace_ms", 10000);
    conf->script_time_limit_ms = agw_luamod_field_u64(L, cfg, "script_time_limit_ms", 1000);
    conf->script_memory_limit_mb = agw_luamod_field_u64(L, cfg, "script_memory_limit_mb", AGW_SCRIPT_MEMORY_LIMIT_MB);
    load_clients(L, cfg, conf);
    /* the operator's opt-out of the sandbox (lua/agg/sandbox.lua) is said at every load: start,
     * check and each reload */
    lua_getfield(L, cfg, "scripts");
    lua_getfield(L, -1, "trusted");
    if (lua_toboolean(L, -1))
        agw_log(AGW_LOG_WARN, "%s/gateway.lua: scripts = { trusted = true }: the scripts of %s run without the "
                "sandbox (io, ffi, os.execute and every other library are open to them)", dir, dir);
    lua_pop(L, 2);
    int rc = load_listen(L, cfg, conf);
    load_admin(L, cfg, conf);
    if (load_upstreams(L, cfg, conf, errors) != 0)
        rc = -1;
    load_limits(L, cfg, conf);
    if (load_routes(L, gen, cfg, conf, errors) != 0)
        rc = -1;
    if (load_tracing(L, cfg, conf, errors) != 0)
        rc = -1;
    if (load_redis_cache(L, cfg, conf, dir, errors) != 0)
        rc = -1;
    char gwfile[4096];
    snprintf(gwfile, sizeof(gwfile), "%s/gateway.lua", dir);
    if (agw_auth_config_load(L, cfg, &conf->auth, gwfile, errors) != 0)
        rc = -1;
    resolve_tls_paths(conf);
    if (load_listen_tls(conf, errors) != 0)
        rc = -1;
    agw_heap_close_lua_state(L);
    if (rc != 0)
        agw_config_free(conf);
    return rc;
}

void agw_config_free(agw_config_t *conf)
{
    agw_redis_conf_clear(&conf->redis);
    for (size_t i = 0; i < conf->num_listen; i++) {
        free(conf->listen[i].host);
        free(conf->listen[i].cert_file);
        free(conf->listen[i].key_file);
        SSL_CTX_free(conf->listen[i].ssl_ctx);
    }
    free(conf->listen);
    for (size_t i = 0; conf->upstreams && i < conf->num_upstreams; i++)
        agw_upstream_conf_clear(&conf->upstreams[i]);
    free(conf->upstreams);
    for (size_t i = 0; conf->eps && conf->ep_first && i < conf->ep_first[conf->num_upstreams]; i++)
        agw_upstream_conf_clear(&conf->eps[i]);
    free(conf->eps);
    free(conf->ep_first);
    for (size_t i = 0; conf->names && i < conf->num_names; i++)
        free(conf->names[i].host), free(conf->names[i].where);
    free(conf->names);
    for (size_t i = 0; conf->breakers && i < conf->num_upstreams; i++)
        agw_breaker_unref(conf->breakers[i]);
    free(conf->breakers);
    agw_router_free(&conf->router);
    for (size_t i = 0; conf->auth_policies && i < conf->num_endpoints; i++)
        agw_auth_policy_clear(&conf->auth_policies[i]);
    free(conf->auth_policies);
    agw_auth_free(&conf->auth);
    for (size_t i = 0; conf->endpoints && i < conf->num_endpoints; i++) {
        free(conf->endpoints[i].route);
        free(conf->endpoints[i].method);
        free(conf->endpoints[i].file);
        free(conf->endpoints[i].limits);
    }
    free(conf->endpoints);
    free(conf->admin_host);
    free(conf->admin_allowed_hosts);
    free(conf->access_log);
    free(conf->batch_path);
    free(conf->batch_route);
    free(conf->otlp_url);
    free(conf->otlp_host_header);
    free(conf->otlp_path);
    free(conf->otlp_service_name);
    agw_limits_conf_clear(&conf->limits);
    free(conf->dir);
    memset(conf, 0, sizeof(*conf));
}

static int same_str(const char *a, const char *b)
{
    return (a == NULL && b == NULL) || (a && b && strcmp(a, b) == 0);
}

static int same_tls(const agw_upstream_tls_t *a, const agw_upstream_tls_t *b)
{
    return (a == NULL && b == NULL) || (a && b && same_str(a->ca_file, b->ca_file) &&
                                        same_str(a->server_name, b->server_name) && a->verify == b->verify);
}

int agw_upstream_conf_same(const agw_upstream_conf_t *a, const agw_upstream_conf_t *b)
{
    return same_tls(a->tls, b->tls) && same_str(a->name, b->name) && same_str(a->url, b->url) &&
           same_str(a->host_header, b->host_header) &&
           same_str(a->base_path, b->base_path) && a->addrlen == b->addrlen &&
           memcmp(&a->addr, &b->addr, a->addrlen) == 0 && a->connect_timeout_ms == b->connect_timeout_ms &&
           a->idle_timeout_ms == b->idle_timeout_ms && a->max_connections == b->max_connections &&
           a->max_pending == b->max_pending && a->max_body_bytes == b->max_body_bytes &&
           a->max_rps == b->max_rps;
}


void agw_upstream_conf_copy(agw_upstream_conf_t *out, const agw_upstream_conf_t *u)
{
    *out = *u;
    out->name = agw_strdup_opt(u->name);
    out->url = agw_strdup_opt(u->url);
    out->host_header = agw_strdup_opt(u->host_header);
    out->base_path = agw_strdup_opt(u->base_path);
    if (u->tls) { /* the pool may outlive u's generation: its own settings, a reference to the SSL_CTX */
        out->tls = agw_malloc(sizeof(*out->tls));
        *out->tls = *u->tls;
        out->tls->ca_file = agw_strdup_opt(u->tls->ca_file);
        out->tls->server_name = agw_strdup_opt(u->tls->server_name);
        if (out->tls->ctx)
            SSL_CTX_up_ref(out->tls->ctx);
    }
}

void agw_upstream_conf_clear(agw_upstream_conf_t *u)
{
    free(u->name);
    free(u->url);
    free(u->host_header);
    free(u->base_path);
    if (u->tls) {
        agw_upstream_tls_free(u->tls);
        free((char *)u->tls->ca_file);
        free((char *)u->tls->server_name);
        free(u->tls);
    }
    memset(u, 0, sizeof(*u));
}
