-- agg.limits: checks gateway.lua's `limits` block and an endpoint's `limits` and `priority`
-- (README "Rate limits and quotas"; the counting itself is C, gateway/limits/limit.h, before any
-- Lua runs).
--
--   limits = { store = "local", headers = true, local_keys = 65536, default = { "per-ip" },
--              rules = { { name = "per-ip", key = "ip", rate = 100, per_s = 1, burst = 50 },
--                        { name = "daily", key = { header = "x-client" }, quota = 100000, window = "day" } } }
local str_match = string.match
local callable = require "agg.callable"
local M = {}

local LIMITS_KEYS = { store = true, headers = true, rules = true, default = true, local_keys = true,
                      on_redis_error = true }
local RULE_KEYS = { name = true, key = true, rate = true, per_s = true, burst = true, quota = true, window = true,
                    store = true, on_redis_error = true, before_auth = true }
local STORES = { ["local"] = true, redis = true }
local ON_REDIS_ERROR = { ["local"] = true, allow = true, deny = true }
local WINDOWS = { hour = true, day = true, month = true }

M.PRIORITY_DEFAULT = 2

local function is_whole(v, lo, hi)
  return type(v) == "number" and v == v and v % 1 == 0 and v >= lo and v <= hi
end

--- Checks cfg.limits and cfg.max_in_flight. c: the checker's helpers { lines, err(line, where,
-- msg), find_line(lines, name, from), suggest(key, known), show(v) }. Returns the normalized
-- block for the C side: { headers, local_keys, rules = { {name, key, header, fn, rate, per_s, burst,
-- quota, window, store, on_redis_error, before_auth (an ip rule's: true unless false)} … }, default = { names }, by_name = { name = index } }
-- (key = "function": fn is the key function).
function M.check(cfg, c)
  local lines, err, find_line, suggest, show = c.lines, c.err, c.find_line, c.suggest, c.show
  local out = { headers = false, local_keys = 65536, rules = {}, default = {}, by_name = {} }
  local l = cfg.limits
  if l == nil or l == false then return out end
  local lline = find_line(lines, "limits")
  if type(l) ~= "table" then
    err(lline, "limits", "must be a table like { rules = { { name = \"per-ip\", key = \"ip\", rate = 10, per_s = 1, burst = 20 } } }, got " .. show(l))
    return out
  end
  for k in pairs(l) do
    if not LIMITS_KEYS[k] then
      err(find_line(lines, k, lline) or lline, "limits." .. tostring(k), "unknown option" ..
          suggest(tostring(k), LIMITS_KEYS) .. "; limits knows store, on_redis_error, headers, rules, default, local_keys")
    end
  end
  -- store = "local" | "redis" and on_redis_error = "local" | "allow" | "deny": on the block (the
  -- rules' default) or per rule; "redis" needs gateway.lua's redis = { url = … } block
  local function choice(v, where, line, known, dflt)
    if v == nil then return dflt end
    if type(v) == "string" and known[v] then
      if known == STORES and v == "redis" and cfg.redis == nil then
        err(line, where, "is \"redis\" but gateway.lua has no redis = { url = \"redis://127.0.0.1:6379/0\", timeout_ms = 5 } block")
      end
      return v
    end
    local names = {}
    for k in pairs(known) do names[#names + 1] = '"' .. k .. '"' end
    table.sort(names)
    err(line, where, "must be " .. table.concat(names, " or ") .. ", got " .. show(v) ..
        (type(v) == "string" and suggest(v, known) or ""))
    return dflt
  end
  local store = choice(l.store, "limits.store", find_line(lines, "store", lline) or lline, STORES, "local")
  local on_error = choice(l.on_redis_error, "limits.on_redis_error", find_line(lines, "on_redis_error", lline) or lline,
                          ON_REDIS_ERROR, "local")
  if l.headers ~= nil then
    if type(l.headers) ~= "boolean" then
      err(find_line(lines, "headers", lline) or lline, "limits.headers", "must be true or false, got " .. show(l.headers))
    else
      out.headers = l.headers
    end
  end
  if l.local_keys ~= nil then
    if not is_whole(l.local_keys, 64, 67108864) then
      err(find_line(lines, "local_keys", lline) or lline, "limits.local_keys",
          "must be a whole number of keys from 64 to 67108864, got " .. show(l.local_keys))
    else
      out.local_keys = l.local_keys
    end
  end
  local rules = l.rules
  local rline = find_line(lines, "rules", lline) or lline
  if rules == nil then rules = {} end
  if type(rules) ~= "table" then
    err(rline, "limits.rules", "must be a list of rules like { name = \"per-ip\", key = \"ip\", rate = 10, per_s = 1, burst = 20 }")
    rules = {}
  end
  local from = rline
  for i, r in ipairs(rules) do
    local where = "limits.rules[" .. i .. "]"
    local line = find_line(lines, "name", from) or from
    from = line + 1
    if type(r) ~= "table" then
      err(line, where, "must be a table like { name = \"per-ip\", key = \"ip\", rate = 10, per_s = 1, burst = 20 }")
    else
      local ok = true
      local function bad(k, msg)
        err(find_line(lines, k, line) or line, where .. "." .. k, msg)
        ok = false
      end
      for k in pairs(r) do
        if not RULE_KEYS[k] then
          bad(tostring(k), "unknown option" .. suggest(tostring(k), RULE_KEYS) ..
              "; a rule knows name, key, rate, per_s, burst (a rate) or quota, window (a quota), store, on_redis_error, before_auth")
        end
      end
      local e = {}
      if type(r.name) ~= "string" or not str_match(r.name, "^[%w_.%-]+$") or #r.name > 64 then
        bad("name", "must be a name of letters, digits, '_', '.' or '-' (up to 64), got " .. show(r.name))
      elseif out.by_name[r.name] then
        bad("name", "rule '" .. r.name .. "' is defined twice")
      else
        e.name = r.name
      end
      local key = r.key
      if key == "ip" or key == "route" or key == "api_key" or key == "user" then
        e.key = key
      elseif type(key) == "table" and type(key.header) == "string" and str_match(key.header, "^[%w!#$%%&'*+.^_`|~-]+$")
             and next(key, next(key)) == nil then
        e.key, e.header = "header", key.header:lower()
      elseif callable.is(key) then
        e.key, e.fn = "function", key
        -- tried once on a sample request: a function that returns neither a string nor nil is a
        -- mistake whatever the request (an error may depend on the request: not reported here)
        local tried, v = pcall(key, { method = "GET", path = "/", route = "GET /", headers = {}, ip = "127.0.0.1" })
        if tried and v ~= nil and type(v) ~= "string" then
          bad("key", "the key function returned a " .. type(v) .. " for a sample request (GET / from 127.0.0.1, " ..
              "no headers); it must return a string, or nil when the rule does not apply")
        end
      else
        bad("key", "must be \"ip\", \"route\", \"api_key\", \"user\", { header = \"x-name\" } or a function(req), got " .. show(key) ..
            (type(key) == "string" and suggest(key, { ip = true, route = true, api_key = true, user = true }) or ""))
      end
      -- an ip rule stands before auth too (worker/limits.c agw_worker_gate_before_edge) unless
      -- before_auth = false; no other key can: anyone could spend it with forged credentials
      local quota = r.quota ~= nil or r.window ~= nil
      if r.before_auth ~= nil and type(r.before_auth) ~= "boolean" then
        bad("before_auth", "must be true or false, got " .. show(r.before_auth))
      elseif r.before_auth == true and key ~= "ip" then
        bad("before_auth", "only a rule with key = \"ip\" stands before auth (a refused attempt spends its sender's " ..
            "count; any other key's count could be spent by anyone with forged credentials)")
      elseif r.before_auth == true and quota then
        bad("before_auth", "only a rate stands before auth, not a quota (a flood is cut by a rate; a quota " ..
            "counts what the edge accepted, and its counts would hold every address a flood came from for its window)")
      elseif key == "ip" and not quota then
        e.before_auth = r.before_auth ~= false
      end
      e.store = choice(r.store, where .. ".store", find_line(lines, "store", line) or line, STORES, store)
      e.on_redis_error = choice(r.on_redis_error, where .. ".on_redis_error",
                                find_line(lines, "on_redis_error", line) or line, ON_REDIS_ERROR, on_error)
      local is_rate = r.rate ~= nil or r.per_s ~= nil or r.burst ~= nil
      local is_quota = r.quota ~= nil or r.window ~= nil
      if is_rate == is_quota then
        bad("rate", "a rule is either a rate (rate, per_s, burst) or a quota (quota, window), " ..
            (is_rate and "not both" or "and this one has neither"))
      elseif is_rate then
        for _, k in ipairs { "rate", "per_s", "burst" } do
          local v = r[k]
          if k == "per_s" and v == nil then v = 1 end
          if k == "burst" and v == nil then v = r.rate end
          local hi = k == "per_s" and 31 * 86400 or 1e9
          if not is_whole(v, 1, hi) then
            bad(k, ("must be a whole number from 1 to %d, got %s"):format(hi, show(v)))
          else
            e[k] = v
          end
        end
        -- the time a full bucket takes to drain must fit the counter (µs in 64 bits): 10 years
        if e.rate and e.per_s and e.burst and e.burst * e.per_s / e.rate > 315360000 then
          bad("burst", ("burst × per_s / rate is %d s, over 10 years; use a quota for long windows")
              :format(e.burst * e.per_s / e.rate))
        end
      else
        if not is_whole(r.quota, 1, 1e12) then bad("quota", "must be a whole number of requests from 1, got " .. show(r.quota)) end
        if not WINDOWS[r.window] then
          bad("window", "must be \"hour\", \"day\" or \"month\" (UTC), got " .. show(r.window) ..
              (type(r.window) == "string" and suggest(r.window, WINDOWS) or ""))
        end
        e.quota, e.window = r.quota, r.window
      end
      if ok then
        out.rules[#out.rules + 1] = e
        out.by_name[e.name] = #out.rules
      elseif e.name then
        -- a rule reported above: lists that name it are not told it does not exist (check_names)
        out.broken = out.broken or {}
        out.broken[e.name] = true
      end
    end
  end
  if l.default ~= nil then
    local dline = find_line(lines, "default", lline) or lline
    local names = M.check_names(l.default, out, function(msg) err(dline, "limits.default", msg) end)
    if names then out.default = names end
  end
  return out
end

-- ---- function keys ----------------------------------------------------------------------------
-- A rule's key may be a function of the request (rules computed by scripts, swapped by a reload):
--   key = function(req) return req.headers["x-tenant"] end
-- req = { method, path (without the query), route (the endpoint's pattern), query (the raw query
-- string or nil), headers (lower-case name -> value), ip (the client's address as text), user
-- (nil, or { via = "jwt", sub } | { via = "api_key", app, plan }) }. It runs before the script,
-- in C's gate (worker/limits.c) and in the spec harness alike, under the script time limit.
-- It returns the key (a string): a string counts that key; nil means the rule does not apply to
-- this request. An error or any other value is a mistake: it is logged, counted
-- (aggway_limit_errors_total{cause="key"}) and the rule does not apply to that request (a broken
-- key function never refuses traffic).

--- The key of rule (a normalized rule with fn) for req: key | nil (the rule does not apply) |
-- nil, message (the function failed: the message names the rule and the error's file:line).
function M.key_of(rule, req)
  local ok, v = pcall(rule.fn, req)
  if not ok then
    return nil, ("limits: rule '%s': its key function failed: %s; the rule is not applied to this request")
                :format(rule.name, tostring(v))
  end
  if v == nil or type(v) == "string" then return v end
  return nil, ("limits: rule '%s': its key function returned a %s, not a string (or nil when the rule does not " ..
               "apply); the rule is not applied to this request"):format(rule.name, type(v))
end

local bound_rules
--- Binds this VM's generation's normalized limits block (the worker's VM: worker/vm.c).
function M.bind(lim) bound_rules = lim and lim.rules or {} end

--- For the worker (worker/limits.c; its Lua entries return nothing): out.key, out.err =
-- key_of(rule i of the bound block, req).
function M.key_into(out, i, req)
  out.key, out.err = nil, nil
  out.key, out.err = M.key_of(bound_rules[i], req)
end

--- Checks a list of rule names (an endpoint's `limits`, limits.default) against the checked
-- block lim. Returns the list, or nil after calling fail(message).
function M.check_names(v, lim, fail)
  if type(v) ~= "table" then
    fail("must be a list of rule names like { \"per-ip\" }, got " .. type(v))
    return nil
  end
  local seen, ok = {}, true
  for i, n in pairs(v) do
    if type(i) ~= "number" then fail("must be a list of rule names, not a table with key '" .. tostring(i) .. "'"); return nil end
    if not lim.by_name[n] and lim.broken and lim.broken[n] then
      -- (its own mistakes are reported where it is defined; the list's other names are checked)
      ok = false
    elseif not lim.by_name[n] then
      local known = {}
      for name in pairs(lim.by_name) do known[#known + 1] = name end
      table.sort(known)
      fail(("no rule named '%s' in gateway.lua's limits.rules%s (%s)"):format(tostring(n),
           type(n) == "string" and require("agg.config").suggest(n, lim.by_name) or "",
           #known > 0 and ("rules: " .. table.concat(known, ", ")) or "it defines none"))
      return nil
    end
    if seen[n] then fail("rule '" .. tostring(n) .. "' is listed twice"); return nil end
    seen[n] = true
  end
  return ok and v or nil
end

--- Checks cfg.max_in_flight (pages a worker has in flight before it sheds: DESIGN §9.1).
function M.check_max_in_flight(cfg, c)
  local v = cfg.max_in_flight
  if v == nil then return 4096 end
  if not is_whole(v, 1, 1e7) then
    c.err(c.find_line(c.lines, "max_in_flight"), "max_in_flight",
          "must be a whole number of pages from 1 to 10000000, got " .. c.show(v))
    return 4096
  end
  return v
end

return M
