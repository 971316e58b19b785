-- agg.contract: the seam between the Lua half of the runtime (agg.runtime and its parts) and its
-- transport, written once. The transport is `core`: in `aggway serve` the C worker
-- (gateway/worker/core.c), in `aggway test` the spec harness's fake (agg.testing) with a virtual
-- clock and stubbed upstreams. Both are checked against this file: the C unit test
-- gateway/tests/worker/test_contract.c compares C's function and field names with it, and
-- spec/contract_spec.lua runs the fake through every kind of answer with M.check on each table
-- that crosses. A field added on one side only fails one of them.
--
-- Rules for every entry:
--   - times are milliseconds (numbers, fractions allowed) on the transport's monotonic clock:
--     core.now() in both directions, never os.time or os.clock (the spec harness's clock is
--     virtual; docs/ARCHITECTURE.md "Time");
--   - ids (rid, call id, timer id) are numbers the transport makes; an id of something that ended
--     is ignored, never an error (C: generation-checked slots, base/slots.h). The ids of things
--     alive at once differ in their low 24 bits (C: the slot's index; the spec harness counts
--     from 1): the runtime keeps requests and calls in flight at M.slot(id), the array part of a
--     table, and checks the whole id it finds there;
--   - hot arguments (what every call, answer or request needs) are positional; the cold rest
--     travel in one of the tables below, named fields only;
--   - a table the transport passes to the runtime (answer) is valid only during that
--     callback, as C's agw_call_result_t: the C transport reuses one per VM, so the runtime copies
--     the fields it keeps and never keeps the table;
--   - a table the runtime passes to the transport (attempt, response, counters) is read before
--     the function returns and never kept; strings in it stay the runtime's.
local str_gmatch = string.gmatch
local M = {}

--- core.*: what the transport gives the runtime (agg.runtime.init(core, upstreams, endpoints,
-- token_exchange)).
-- args: names in order; returns: what comes back. `breakers`, `loop` and `ev_now` are values, not
-- functions.
M.core = {
  now          = { args = {}, returns = "ms: the loop's clock (monotonic, milliseconds)" },
  call         = { args = { "rid", "upstream", "method", "path", "headers", "body", "timeout_ms",
                            "decode", "section", "attempt", "hedge", "endpoint" },
                   returns = "call id; runtime.on_call follows exactly once unless core.cancel(id) " ..
                             "comes first. upstream: the index in gateway.lua's order, 1-based; " ..
                             "method: GET, HEAD, POST, PUT, PATCH, DELETE or OPTIONS; path: path and " ..
                             "query from '/' (the upstream's base path goes first); headers: false " ..
                             "or { name, value, … } (names lowercase); body: false or a string; " ..
                             "timeout_ms: whole ms for the whole call; decode: a 2xx body is JSON, " ..
                             "hand it over validated as on_call's data; section, attempt, hedge: the " ..
                             "span; endpoint: the endpoint of an upstream group (tables.call_args)" },
  cancel       = { args = { "id" }, returns = "nothing; no on_call follows (the connection closes)" },
  join         = { args = { "rid", "id", "section" }, optional = true,
                   returns = "nothing; request rid's section waits on call id (single-flight): a " ..
                             "span of its own, linked to the call's" },
  timer        = { args = { "ms" }, returns = "timer id; runtime.on_timer(id) runs ms from now" },
  cancel_timer = { args = { "id" }, returns = "nothing; no on_timer follows" },
  random       = { args = {}, returns = "a number in [0, 1) (retry jitter; not for secrets)" },
  respond      = { args = { "rid", "response" },
                   returns = "true; false when the client is gone; nil, err when the body cannot " ..
                             "be encoded as JSON (nothing was sent)" },
  log          = { args = { "level", "message" }, returns = "nothing (level: error, warn, info)" },
  trace_id     = { args = { "rid" }, optional = true,
                   returns = "the request's trace id, 32 lowercase hex digits, or nil" },
  request_headers = { args = { "rid" }, optional = true,
                      returns = "the page request's header block (\"name\\0value\\0…\", names lowercased, " ..
                                "a repeated name joined), or nil once the request has ended; asked " ..
                                "for when a script, a forwarded header, a cache key or a group " ..
                                "needs them (agg.result.request_headers), not with every request" },
  request_tls  = { args = { "rid" }, optional = true,
                   returns = "true when the page request came over TLS (its connection's; a batch " ..
                             "entry's, its envelope's scheme), false when not, nothing once it has " ..
                             "ended; asked for when a response sets a session cookie (Secure)" },
  request_user = { args = { "rid" },
                   returns = "the user the edge authenticated the page request as ({ via = \"jwt\", sub, " ..
                             "claims_ref } or { via = \"api_key\", app, plan }) and the verified bearer " ..
                             "token (a JWT's, else nil), or nothing when the request had no user or has " ..
                             "ended; asked for when req.user, an identity or a per-user cache key needs " ..
                             "them (agg.result.request_user), not with every request" },
  upstream_counters = { args = { "upstream", "counters" }, optional = true,
                        returns = "nothing; the runtime's totals for upstream (an index), " ..
                                  "published as metrics" },
  endpoint_state = { args = { "upstream", "endpoint", "state" }, optional = true,
                     returns = "nothing; agg.group's view of an endpoint (1-based) of an upstream " ..
                               "group in this worker (tables.endpoint_state), for /upstreams and " ..
                               "the metrics (about once a second, from runtime.report_stats)" },
  endpoint_slots = { args = { "upstream", "seen" }, optional = true,
                     returns = "the endpoint directory's version, and unless it is seen, the list of " ..
                               "the upstream's endpoint slots { url, address | false } after this " ..
                               "worker's pools followed it (group/directory.h; agg.group, once a " ..
                               "second and when a group is made)" },
  -- the cache's transport (agg.cache); the C worker installs them when gateway.lua has a cache
  cache_entry  = { args = { "key", "decode" }, optional = true,
                   returns = "fresh, stale, error_until, status, payload, headers of the entry in " ..
                             "this worker's tier 1 (cache/lru.h, cache/entry.h); nothing on a miss, " ..
                             "false for a corrupt entry; payload a raw JSON ref with the header " ..
                             "block inside (headers = true) for a JSON 2xx body when decode, else " ..
                             "the body string (headers: the header block string)" },
  cache_set    = { args = { "key", "value", "until_ms" }, optional = true,
                   returns = "nothing; value kept in tier 1 until until_ms (core.now's clock)" },
  cache_store  = { args = { "key", "fresh", "stale", "error_until", "status", "headers", "body", "until_ms",
                            "redis_ttl_ms" }, optional = true,
                   returns = "the entry's size, or false when it is over agg.cache's MAX_ENTRY (not " ..
                             "stored); the entry of these fields (cache/entry.h, agg.cache's " ..
                             "encode) kept in tier 1 until until_ms and, with redis_ttl_ms, SET in " ..
                             "Redis; headers a header block or the raw ref that keeps the answer's " ..
                             "headers, body a string or a raw ref" },
  redis_get    = { args = { "key" }, optional = true,
                   returns = "a lookup id, runtime.on_redis(id, value, err) follows; nil without " ..
                             "Redis (only when gateway.lua configures redis with cache.redis)" },
  redis_set    = { args = { "key", "value", "ttl_ms" }, optional = true,
                   returns = "nothing; a failed SET only costs a later miss" },
  digest       = { args = { "s" }, optional = true,
                   returns = "SHA-256 of s in lowercase hex (a credential in a cache key)" },
  cache_counters = { args = { "stats" }, optional = true,
                     returns = "nothing; agg.cache.stats (totals), published as metrics" },
  cache_span   = { args = { "rid", "upstream", "section", "outcome", "http_status" }, optional = true,
                   returns = "nothing; a span of no duration for a section the cache served " ..
                             "(outcome hit, stale or refresh)" },
  breakers     = { value = "table: upstream index -> breaker handle (upstream/breaker.h), or nil" },
  -- (the spec harness's clock is virtual: it has neither of these)
  loop         = { optional = true,
                   value = "lightuserdata: where the worker keeps its libev loop (a struct ev_loop *, " ..
                           "NULL until the worker made it), or nil; with ev_now, the runtime reads " ..
                           "core.now as ev_now(loop) * 1000 through the FFI (agg.runtime.init)" },
  ev_now       = { optional = true,
                   value = "lightuserdata: libev's ev_now, double (*)(struct ev_loop *), or nil" },
}

--- runtime.*: what the transport calls (agg.runtime); each runs to its end without waiting.
M.runtime = {
  init         = { args = { "core", "upstreams", "endpoints", "token_exchange" } },
  start        = { args = { "rid", "endpoint", "method", "path", "params", "query", "body", "user",
                            "waited_ms" } },
  on_call      = { args = { "id", "outcome", "http_status", "data", "ms", "answer" } },
  on_timer     = { args = { "id" } },
  abort        = { args = { "rid" } },
  report_stats = { args = { "current" } },  -- current: true for the worker's current generation (once a second)
  compact      = { args = {} },             -- the worker went idle (between its full collections)
  on_redis     = { args = { "id", "value", "err" } },  -- core.redis_get's answer: value nil on a miss
  on_purge     = { args = { "prefix" } },  -- POST /cache/purge dropped the entries whose keys start with prefix
}

--- The tables that cross, field -> allowed Lua types ("|"-separated; "nil" = may be absent).
M.tables = {
  -- core.call's arguments (M.core.call.args), by name: not a table that crosses (every one is
  -- positional: a field the transport reads from a table costs it two C API calls more than an
  -- argument, and every call sends one span), but checked the same way by spec/contract_spec.lua
  call_args = {
    rid        = "number",          -- the request's; 0 for the runtime's own call (a health probe)
    upstream   = "number",
    method     = "string",
    path       = "string",
    headers    = "table|boolean|nil",  -- false/nil, or { name, value, … }
    body       = "string|boolean|nil", -- false/nil, or the body
    timeout_ms = "number",
    decode     = "boolean",
    section    = "string|number",   -- the section the call serves (the span's name)
    attempt    = "number",          -- 1 for the first, 2… for retries and a hedge
    hedge      = "boolean|nil",     -- true: the second copy of a slow first attempt
    -- the endpoint (1-based) agg.group chose, for an upstream of more than one endpoint; the
    -- transport reads it only for those (a one-endpoint upstream's is its first)
    endpoint   = "number|nil",
  },
  -- runtime.on_call(id, outcome, http_status, data, ms, answer):
  --   outcome      ok | refused | connect_timeout | timeout | reset | truncated | bad_response
  --                | too_large | overload | bad_request | tls
  --   http_status  0 when no status line arrived
  --   data         a 2xx body of a call that decodes, validated: a raw ref (agg.json) that also
  --                carries the headers and the body text (json.raw_extra, json.raw); a string:
  --                why the body is not JSON; nil otherwise
  --   ms           from core.call to the answer
  --   answer       nil when data is a raw ref; otherwise this table:
  answer = {
    headers = "string|nil",         -- "name\0value\0…" of a response that arrived; nil on failures
    body    = "string|nil",         -- the body of a response that arrived
    detail  = "string|nil",         -- what went wrong, for a failed call
  },
  -- runtime.start(rid, endpoint, method, path, params, query, body, user, waited_ms): every
  -- request's facts, positional. The request's headers are not among them: core.request_headers(rid)
  -- gives them when first asked
  start_args = {
    rid       = "number",
    endpoint  = "number",           -- the index of the loader's endpoint
    method    = "string",
    path      = "string",           -- without the query
    params    = "table",            -- the route parameters, name -> string
    query     = "string|nil",       -- the raw query string, without '?'
    body      = "string|nil",
    -- the edge's verdict (edge/edge.h): true when the edge authenticated the request
    -- (core.request_user(rid) gives the user and the bearer token when first asked), nil when the
    -- endpoint has no auth
    user      = "boolean|nil",
    -- ms the request waited before its script (a Redis rate limit's decision), 0 when none: the
    -- runtime starts its deadline that much earlier, so the wait counts in it
    waited_ms = "number|nil",
  },
  -- core.respond's response
  response = {
    status        = "number",       -- 200..599
    headers       = "table|nil",    -- name -> value (names in any case; script/resp_headers.h)
    body          = "any",          -- a string; with json, a Lua value to encode as JSON
    json          = "boolean",      -- encode body as JSON
    default_type  = "string|nil",   -- content-type unless headers has one
    server_timing = "string|nil",   -- the Server-Timing value
    page          = "string|nil",   -- agg.page's verdict: "complete" or "partial"; nil: not a page
    sections      = "table|nil",    -- a page's sections, name -> { status, … } (for metrics and
                                    -- the access log)
    rows          = "table|nil",    -- a 200 page whose body no script read (agg.page): its sections
                                    -- as rows { name, status, data, error, … } (the section's
                                    -- fields in tables.section's order; data and error may be nil),
                                    -- encoded (json is true) as { name: section, … } in place of
                                    -- body, and read in place of sections
  },
  -- a page's section (DESIGN §2.2), the members of each row of response.rows, in this order:
  -- status, data, error (a nil member is left out of the page)
  section = {
    status = "string",              -- ok | fallback | stale | unavailable
    data   = "any",                 -- the section's data (nil: unavailable)
    error  = "table|nil",           -- the problem that says why it is not ok
  },
  -- core.endpoint_state's state: agg.group's view of one endpoint (counts are totals since the VM
  -- started; times on core.now's clock, 0 for none)
  endpoint_state = {
    calls = "number", failures = "number", ejections = "number", sessions = "number",
    in_flight = "number",
    ejected_until_ms = "number",    -- when its ejection ends; 0 while it is usable
    last_ejected_ms = "number",     -- when it was last ejected; 0 for never
    answered = "number",            -- calls it answered (latency_ms is over these)
    latency_ms = "number",          -- the moving average of its answers' latency
    health = "number",              -- its active health checks: 0 unchecked, 1 passing, 2 failing
    down = "number",                -- 1 while its health checks keep it out of service, else 0
    probes = "number",              -- health probes sent
    probe_failures = "number",      -- health probes that failed
  },
  -- core.upstream_counters' counters: totals since the VM started
  counters = {
    retries = "number", retries_denied = "number", hedges = "number", hedges_won = "number",
    collapsed = "number",
  },
}

local function type_ok(allowed, v)
  if allowed == "any" then return true end
  local t = type(v)
  for a in str_gmatch(allowed, "[^|]+") do
    if a == t then return true end
  end
  return false
end

--- The array index (1 …) where the runtime keeps what the transport's id names (see the rules
-- above): its low 24 bits plus one. A table indexed so holds its entries in its array part, where a
-- new entry is a store (ids as hash keys were a new key each: a rehash every few pages).
function M.slot(id)
  return id % 16777216 + 1
end

--- Checks table t against M.tables[kind]: every field it carries is declared with its type, and
-- every declared field that may not be absent is there. With `only_declared` false, fields the
-- contract does not name are allowed (the exchange passed as an attempt carries the runtime's own).
-- Returns true, or false and what is wrong ("answer: field 'detial' is not in the contract").
function M.check(kind, t, only_declared)
  local decl = M.tables[kind]
  if not decl then return false, "no table '" .. tostring(kind) .. "' in the contract" end
  if type(t) ~= "table" then return false, kind .. ": a table expected, got " .. type(t) end
  if only_declared ~= false then
    for k in pairs(t) do
      if decl[k] == nil then
        return false, ("%s: field '%s' is not in the contract"):format(kind, tostring(k))
      end
    end
  end
  for k, allowed in pairs(decl) do
    if not type_ok(allowed, t[k]) then
      return false, ("%s: field '%s' is %s, the contract says %s"):format(kind, k, type(t[k]), allowed)
    end
  end
  return true
end

--- The declared field names of M.tables[kind], sorted (for the C unit test).
function M.fields(kind)
  local out = {}
  for k in pairs(M.tables[kind]) do out[#out + 1] = k end
  table.sort(out)
  return out
end

return M
