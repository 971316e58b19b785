-- agg: the API page scripts use (DESIGN §2.1). `local agg = require "agg"`.
--
-- agg.fetch_all(calls) -> results
--   Starts every call of the table at once and waits (the request's coroutine, never the thread)
--   until all have settled. Returns a table with the same keys, one result each.
--     local res = agg.fetch_all {
--       product   = { "product", "/products/" .. id, timeout_ms = 150, required = true },
--       inventory = { "inventory", "/stock/" .. id },
--     }
--   Errors: a call spec with an unknown upstream or option raises an error at the script line;
--   calling it outside a handler, or where LuaJIT cannot yield (inside a table.sort comparator or a
--   string.gsub callback) raises a clear error instead of hanging.
--
-- agg.fetch_then(dep, fn [, opts]) -> chain
--   A dependent call. dep is the key of a sibling call in the same fetch_all, a list of keys, or a
--   call spec of its own. fn(result, …) runs in its own coroutine as soon as dep is ready and
--   returns the next call spec, a table of specs (nested fan-out: the section's data is a table with
--   each call's data), another agg.fetch_then chain, a plain value (a computed section), or nil (the
--   section is left out of the page). If a dependency failed, fn is not run and the section is
--   `unavailable` with a `dependency-failed` problem carrying the cause. opts: { required = bool,
--   fallback = value | function(problem) } apply to the section whatever fn returns.
--     reviews = agg.fetch_then("product", function(product)
--       return { "reviews", "/reviews?sku=" .. product.data.sku, fallback = { items = agg.array() } }
--     end),
--   Outside fetch_all (dep must then be a call spec), the chain runs the moment a field of it is read:
--     local r = agg.fetch_then({ "product", "/products/42" }, function(p) return { "reviews", "/reviews/" .. p.data.sku } end)
--     if r.ok then … end
--
-- agg.fetch(spec) -> result        one call on its own: agg.fetch_all({ [upstream] = spec })[upstream]
--                                  (its problems and Server-Timing entry name the upstream)
--
-- agg.page(results [, opts]) -> response     the page contract (see agg/page.lua, DESIGN §2.2)
--
-- Call spec: { "upstream", "/path", method = "GET", query = { k = v }, headers = { k = v },
--              json = value | body = "bytes", timeout_ms = n, required = bool,
--              fallback = value | function(problem), decode = bool (false keeps the raw body) }
-- Result:    { ok, status ("ok" | "fallback" | "unavailable"), data, body, http_status, headers,
--              error (RFC 9457 problem), ms }
--
-- JSON values: agg.null (JSON null), agg.array([t]) (a table that encodes as an array even when
-- empty), agg.int64("9007199254740993") (an integer beyond 2^53), agg.json.encode / decode.
local json = require "agg.json"
local rt = require "agg.runtime"
local url = require "agg.url"
local page = require "agg.page"
local problem = require "agg.problem"
local readonly = require "agg.readonly"

local agg = {
  null = json.null,
  array = json.array,
  int64 = json.int64,
  json = readonly.view(json, "agg.json"),
  problem = problem.new,
  fetch_all = rt.fetch_all,
  fetch_then = rt.fetch_then,
  fetch = rt.fetch,
  page = page.page,
}

--- agg.escape(s) -> s percent-encoded for a URL path segment or query value (RFC 3986: every
-- byte but A-Z a-z 0-9 - . _ ~). req.params values arrive still encoded as the client sent them,
-- so "/items/" .. req.params.id is safe as it is; escape values that come from anywhere else.
agg.escape = url.escape

--- agg.unescape(s) -> s with %XX sequences decoded (to use a route parameter's value itself, e.g.
-- to compare it or show it; escape it again before it goes into a path).
agg.unescape = url.unescape

-- Every script of a worker shares this module: it is read-only, so one script cannot break the
-- others (agg.fetch_all = nil raises at that script's line instead).
return readonly.view(agg, "agg")
