-- agg.callspec: turns the call spec a script writes ({ "reviews", "/reviews", timeout_ms = 100 })
-- into the normalized form the scheduler sends, checking every option (DESIGN §2.1).
-- Mistakes are programming errors: they raise error() at the script's line, the line where the
-- spec's faulty part was written when the source shows it (agg.where).
local str_find = string.find
local json = require "agg.json"
local config = require "agg.config"
local where = require "agg.where"
local result = require "agg.result"
local merge = require "agg.merge"
local cache = require "agg.cache"

local M = {}

local OPTIONS = {
  timeout_ms = "number", required = "boolean", method = "string", query = "table",
  headers = "table", body = "string", decode = "boolean", fallback = true, json = true,
  retry = true, hedge = true, collapse = "boolean", cache = true, identity = "boolean", hash_key = "string",
  batch = "table",
}
-- Options of the design that this version does not implement yet: refused by name, never ignored.
local NOT_YET = { forward_auth = true }
M.OPTIONS, M.NOT_YET = OPTIONS, NOT_YET   -- (agg.lint checks the specs it sees in the source)
M.FORWARD_AUTH_TEXT = "option 'forward_auth' is not supported; the user's token goes to an upstream " ..
  "whose gateway.lua entry says identity = \"forward\" or \"exchange\""
local IDEMPOTENT = { GET = true, HEAD = true, PUT = true, DELETE = true, OPTIONS = true }
-- request headers that carry a user's credentials: a call with one is never shared (single-flight)
local CREDENTIALS = cache.CREDENTIALS
local METHODS = { GET = true, HEAD = true, POST = true, PUT = true, PATCH = true, DELETE = true, OPTIONS = true }
local RETRY_OPTIONS = { attempts = true, on = true, backoff_ms = true, safe = true } -- a call's retry block

--- True when v looks like a call spec: a table whose [1] is an upstream name and [2] a path
-- ("/…"). The leading slash is what tells { "product", "/p/1" } from a list of sibling keys
-- { "product", "inventory" } in agg.fetch_then.
function M.is_spec(v)
  -- the metatable first: reading [1] of a fetch_then chain would run it
  return type(v) == "table" and getmetatable(v) == nil and type(v[1]) == "string" and type(v[2]) == "string"
    and v[2]:byte(1) == 47
end

local escape = require("agg.url").escape
local CALL_INDEX, NEWINDEX, METATABLE = result.CALL_INDEX, result.NEWINDEX, result.METATABLE

--- Encodes a query table ({ sku = "A 1", tag = { "x", "y" } }) as "sku=A%201&tag=x&tag=y", keys
-- sorted so the same table always gives the same URL.
function M.encode_query(q, level)
  local keys = {}
  for k in pairs(q) do
    if type(k) ~= "string" then where.raise("call option 'query': keys must be strings", level, where.option("query")) end
    keys[#keys + 1] = k
  end
  table.sort(keys)
  local out = {}
  for _, k in ipairs(keys) do
    local v = q[k]
    local list = type(v) == "table" and v or { v }
    for _, item in ipairs(list) do
      local t = type(item)
      if t ~= "string" and t ~= "number" and t ~= "boolean" then
        where.raise("call option 'query': value of '" .. k .. "' must be a string, number, boolean or list of them", level, where.option("query"))
      end
      out[#out + 1] = escape(k) .. "=" .. escape(item)
    end
  end
  return table.concat(out, "&")
end

-- A call carries at most this many request headers of the script's (core.call's limit: the
-- transport adds traceparent and tracestate). Refused here, at the script's line, before the call
-- takes anything: a call the transport refused had taken a half-open breaker's probe slot for good.
local MAX_HEADERS = 64
-- A call's path with its query, and its request headers' names and values, at most (bytes): far
-- past what upstreams accept (8 KB is common), and each call copies them into its request and its
-- single-flight key: a 4 MB query shared by a thousand calls took 8 GB and 30 s of the runtime.
local MAX_PATH_BYTES, MAX_HEADER_BYTES = 32768, 65536
local function too_many_headers(name, level) -- level: as normalize's, seen from here
  where.raise(("call to '%s': at most %d request headers"):format(name, MAX_HEADERS), level, where.option("headers"))
end

--- A fan-out's memo for normalize (agg.fanout keeps one and empties it before and after each
-- fan-out it starts): the json and query tables its calls gave and what they encoded to, so a
-- page that gives every call the same table (a shared filter, a body) pays for it once, not once
-- a call (1,000 calls sharing a 30,000-number json body held the worker 7.5 s in the runtime's
-- code). Valid while one fan-out is started: no script code runs then to change the tables (a
-- spec and its option tables have no metatables; tables are compared with rawequal).
function M.clear_memo(memo)
  memo.json, memo.json_text, memo.query, memo.query_text = nil, nil, nil, nil
end

--- Normalizes spec for the upstreams table (name -> { index, timeout_ms }). level is the error()
-- level that points at the script line. Returns { upstream, method, path, headers (flat list
-- name, value, …) or false, body or false, timeout_ms, decode, required, fallback, retry,
-- hedge_after, collapse, … } plus the scheduler's per-call fields, all false until it starts
-- the call.
-- ctx (optional): the page request's context; the upstream's forward_headers (gateway.lua) are
-- copied from its headers (agg.result.request_headers: asked for only then) into the call, unless
-- the spec sets that header itself.
function M.normalize(spec, upstreams, level, ctx, memo)
  level = level + 1
  if type(spec) ~= "table" then
    error("a call spec must be a table like { \"upstream\", \"/path\" }, got " .. type(spec), level)
  end
  if getmetatable(spec) ~= nil then
    -- (its metamethods would run the script's code while the runtime reads it: see the options)
    error("a call spec must be a plain table like { \"upstream\", \"/path\" } (no metatable)", level)
  end
  local name, path = spec[1], spec[2]
  if type(name) ~= "string" then
    error("a call spec starts with the upstream name, like { \"product\", \"/products/1\" }", level)
  end
  local up = upstreams[name]
  if not up or up.internal then
    local names = {}
    for n, u in pairs(upstreams) do if not u.internal then names[#names + 1] = n end end
    table.sort(names)
    local declared = {}
    for _, n in ipairs(names) do declared[n] = true end
    where.raise(("unknown upstream '%s'%s (gateway.lua declares: %s)"):format(name, config.suggest(name, declared),
      table.concat(names, ", ")), level, where.quoted(name))
  end
  if type(path) ~= "string" or path:byte(1) ~= 47 then
    where.raise(("call to '%s': the path must be a string starting with '/'%s"):format(name, where.got(path)), level,
                where.quoted(name))
  end
  for k, v in pairs(spec) do
    if k ~= 1 and k ~= 2 then
      local want = OPTIONS[k]
      if want == nil then
        if k == "forward_auth" then
          where.raise(("call to '%s': " .. M.FORWARD_AUTH_TEXT):format(name), level, where.option(k))
        elseif NOT_YET[k] then
          where.raise(("call to '%s': option '%s' is not supported by this version of aggway"):format(name, k), level, where.option(k))
        end
        local kn = where.key_name(k)
        where.raise(("call to '%s': unknown option '%s'%s"):format(name, kn, config.suggest(kn, OPTIONS)), level, where.option(k))
      end
      if want ~= true and type(v) ~= want then
        where.raise(("call to '%s': option '%s' must be a %s, got %s"):format(name, k, want, type(v)), level, where.option(k))
      end
      -- an option table's metamethods would run the script's code in the middle of starting the
      -- fan-out (where it could wait, or start fan-outs the section count has not seen yet); json
      -- and a fallback value are data, encoded with raw access
      if type(v) == "table" and k ~= "json" and k ~= "fallback" and getmetatable(v) ~= nil then
        where.raise(("call to '%s': option '%s' must be a plain table (no metatable)"):format(name, k), level, where.option(k))
      end
    end
  end
  -- The scheduler keeps its per-call state in this table too: it is the call's exchange
  -- (agg.exchange: ctx … own_timer), the record of its first attempt (an attempt's x is its
  -- exchange: this table has none, it is its own) and the info of its result (section …
  -- raw_headers). Every field a plain or cached call writes is present from the start, so its
  -- table never grows, and one table per call serves all three. The constructor's keys are 27: a
  -- table of 33 keys has a hash part of 64 slots (1.5 KB to allocate, copy, mark and sweep for
  -- every call; 32 keys take half), and a 33rd key written later makes the table again at 64
  -- slots (about 2,400 instructions: the cache's key did so on every cached call, an upstream
  -- group's endpoint on every call of a group). The fields only some calls write are left out
  -- and added when they are, in the five slots left: retry, hedge_after and collapse (below), a
  -- chain's step (fetch_then), a hedge's attempt (a2), a group's endpoint (agg.exchange), a
  -- fallback, a merged call's batch, the cache's stale entry, refresh and user flags and personal
  -- (agg.cache), retrying, last and the timers (retries, hedges, shared calls). A retried call
  -- (retry, retrying, last, retry_timer) fits, and so does a retried call to a group (endpoint).
  local n = {
    upstream = name, path = path, method = spec.method or "GET",
    timeout_ms = spec.timeout_ms or up.timeout_ms, decode = spec.decode ~= false,
    required = spec.required == true,
    headers = false, body = false,
    ref = false, body_ref = false, raw_headers = false,
    -- (retry, hedge_after and collapse are set below when the call has them, a chain's step and a
    -- hedge's attempt by agg.fanout and agg.exchange: nil reads as false. See above for the slots.)
    -- the exchange (see agg.exchange start_call)
    ctx = false, key = false, group = false, u = false,
    a1 = false, attempt = 0, flight = false, id = false, clamped = false,
    done = false, next_x = false,
    cache = false, cache_key = false, -- the call's cache policy and its entry's key (agg.cache)
    -- the metatable of its results (agg.result.of_call): no metatable of their own
    __index = CALL_INDEX, __newindex = NEWINDEX, __metatable = METATABLE,
  }
  -- (written only when set, as are a half-open breaker's probe flag, agg.exchange, and the rest
  -- listed above)
  if spec.identity == false then n.anonymous = true end -- this call goes without the user's identity
  if spec.fallback ~= nil then n.fallback = spec.fallback end
  if spec.hash_key then -- (agg.group)
    if up.balance ~= "hash" then
      error(("call to '%s': option 'hash_key' is for upstreams with balance = \"hash\" in gateway.lua"):format(name), level)
    end
    n.hash_key = spec.hash_key
  end
  if not METHODS[n.method] then
    -- (methods are case-sensitive, RFC 9110 §9.1: "post" is another method, which no upstream takes)
    local upper = type(n.method) == "string" and METHODS[n.method:upper()] and (" (did you mean '" .. n.method:upper() .. "'?)")
    where.raise(("call to '%s': method '%s' is not one of GET HEAD POST PUT PATCH DELETE OPTIONS%s%s"):format(name,
                tostring(n.method), upper or "", where.got(n.method)), level, where.option("method"))
  end
  if n.timeout_ms <= 0 or n.timeout_ms ~= n.timeout_ms then
    where.raise(("call to '%s': timeout_ms must be a positive number of milliseconds%s"):format(name, where.got(n.timeout_ms)),
                level, where.option("timeout_ms"))
  end
  if spec.query then
    local q
    if memo and rawequal(spec.query, memo.query) then
      q = memo.query_text
    else
      q = M.encode_query(spec.query, level)
      if memo and type(spec.query) == "table" then memo.query, memo.query_text = spec.query, q end
    end
    if q ~= "" then n.path = path .. (str_find(path, "?", 1, true) and "&" or "?") .. q end
  end
  local headers
  if spec.headers then
    headers = {}
    for k, v in pairs(spec.headers) do
      if type(k) ~= "string" or (type(v) ~= "string" and type(v) ~= "number") then
        where.raise(("call to '%s': headers must map names to string values%s"):format(name,
                    type(k) ~= "string" and (", got a name that is a " .. type(k)) or (where.got(v) .. " for " .. k)),
                    level, where.option("headers"))
      end
      headers[#headers + 1] = k:lower()
      headers[#headers + 1] = tostring(v)
      if #headers > 2 * MAX_HEADERS then too_many_headers(name, level + 1) end -- (counting stops here)
    end
  end
  local fwd = up.forward_headers
  if fwd and ctx then
    local req_headers = result.request_headers(ctx)
    local h = type(req_headers) == "string" and result.parse_headers(req_headers) or req_headers or {}
    for _, hname in ipairs(fwd) do
      local v = h[hname]
      if v ~= nil then
        local set = false
        if headers then
          for i = 1, #headers, 2 do if headers[i] == hname then set = true end end
        end
        if not set then
          headers = headers or {}
          headers[#headers + 1] = hname
          headers[#headers + 1] = tostring(v)
          -- what its answer holds may come from the request's header: a plain response made of
          -- it is private, as one whose script read the header (agg.runtime finish_request; a
          -- page says Vary instead, agg.page)
          ctx.forwarded = true
        end
      end
    end
  end
  if spec.json ~= nil then
    if spec.body then where.raise(("call to '%s': give either json or body, not both"):format(name), level, where.option("body")) end
    local s, err
    if memo and type(spec.json) == "table" and rawequal(spec.json, memo.json) then
      s = memo.json_text
    else
      s, err = json.encode(spec.json)
      if not s then where.raise(("call to '%s': option 'json' cannot be encoded: %s"):format(name, err), level, where.option("json")) end
      if memo and type(spec.json) == "table" then memo.json, memo.json_text = spec.json, s end
    end
    n.body = s
    headers = headers or {}
    local has_ct = false
    for i = 1, #headers, 2 do if headers[i] == "content-type" then has_ct = true end end
    if not has_ct then
      headers[#headers + 1] = "content-type"
      headers[#headers + 1] = "application/json"
    end
  else
    n.body = spec.body or false
  end
  if headers and #headers > 2 * MAX_HEADERS then too_many_headers(name, level + 1) end -- (forwarded, content-type)
  if #n.path > MAX_PATH_BYTES then
    where.raise(("call to '%s': the path with its query is %d bytes, more than %d"):format(name, #n.path, MAX_PATH_BYTES),
                level, where.quoted(name))
  end
  if headers then
    local bytes = 0
    for i = 1, #headers do bytes = bytes + #headers[i] end
    if bytes > MAX_HEADER_BYTES then
      where.raise(("call to '%s': request headers of %d bytes, more than %d"):format(name, bytes, MAX_HEADER_BYTES),
                  level, where.option("headers"))
    end
  end
  n.headers = headers or false
  -- retries: the upstream's policy, narrowed by the call; only idempotent methods unless the call
  -- says it is safe (retry = { attempts = n, safe = true })
  local r = spec.retry
  if r ~= nil and r ~= false and type(r) ~= "table" then
    where.raise(("call to '%s': option 'retry' must be false or a table like { attempts = 2 }%s"):format(name, where.got(r)),
                level, where.option("retry"))
  end
  local policy = up.retry or {}
  local attempts = policy.off and 1 or (policy.attempts or 1)
  if type(r) == "table" then
    for k in pairs(r) do
      if k ~= "attempts" and k ~= "on" and k ~= "backoff_ms" and k ~= "safe" then
        local kn = where.key_name(k)
        where.raise(("call to '%s': retry option '%s' is unknown%s (attempts, on, backoff_ms, safe)"):format(name, kn,
                    config.suggest(kn, RETRY_OPTIONS)), level, where.option(k))
      end
    end
    if r.attempts ~= nil and (type(r.attempts) ~= "number" or r.attempts < 1 or r.attempts % 1 ~= 0) then
      where.raise(("call to '%s': retry.attempts must be a whole number >= 1%s"):format(name, where.got(r.attempts)), level,
                  where.option("attempts"))
    end
    attempts = r.attempts or (attempts > 1 and attempts or 2)
  elseif r == false then
    attempts = 1
  end
  if not IDEMPOTENT[n.method] and not (type(r) == "table" and r.safe) then attempts = 1 end
  if attempts > 1 then
    local on = {}
    for _, st in ipairs(type(r) == "table" and r.on or policy.on or { 502, 503, 504 }) do on[st] = true end
    n.retry = { attempts = attempts, on = on,
                backoff_ms = type(r) == "table" and r.backoff_ms or policy.backoff_ms or 25 }
  end
  -- hedging: opt-in per call, idempotent methods only
  local h = spec.hedge
  if h ~= nil and type(h) ~= "boolean" and type(h) ~= "table" then
    where.raise(("call to '%s': option 'hedge' must be true, false or { after_ms = n }%s"):format(name, where.got(h)), level,
                where.option("hedge"))
  end
  if h and IDEMPOTENT[n.method] then
    local after = type(h) == "table" and h.after_ms or (up.hedge and up.hedge.after) or "p95"
    if after ~= "p95" and (type(after) ~= "number" or after <= 0) then
      where.raise(("call to '%s': hedge.after_ms must be a positive number of milliseconds%s"):format(name, where.got(after)),
                  level, where.option("after_ms"))
    end
    n.hedge_after = after
  end
  -- caching: the upstream's default policy, field by field overridden by the call's; GET/HEAD only
  if spec.cache ~= nil and spec.cache ~= false and type(spec.cache) ~= "table" then
    error(("call to '%s': option 'cache' must be false or a table like { ttl_s = 60 }"):format(name), level)
  end
  local cp = cache.merge(up.cache, spec.cache, level, name, up.forward_headers, up.base_path)
  if cp and n.method ~= "GET" and n.method ~= "HEAD" then
    if type(spec.cache) == "table" then
      error(("call to '%s': option 'cache' is for GET and HEAD calls only"):format(name), level)
    end
    cp = false
  end
  n.cache = cp
  -- single-flight: on for GET/HEAD calls that carry no user credentials, unless turned off. A call
  -- that will carry the user's identity (the upstream's `identity`) is never shared either:
  -- agg.identity authorizes it or fails it, so it gets no key (nor the slot one takes)
  -- A call with a body (a GET's search query) is never shared either: the key names no body, and
  -- two users' queries got one answer (an attack review)
  if spec.collapse ~= false and (n.method == "GET" or n.method == "HEAD") and not n.body and
     not (up.identity and not n.anonymous) then
    local shared = true
    if headers then
      for i = 1, #headers, 2 do if CREDENTIALS[headers[i]] then shared = false end end
    end
    if shared then
      local key = name .. "\0" .. n.method .. "\0" .. n.path
      if headers then
        local hs = {}
        for i = 1, #headers, 2 do hs[#hs + 1] = headers[i] .. ":" .. headers[i + 1] end
        table.sort(hs)
        key = key .. "\0" .. table.concat(hs, "\0")
      end
      n.collapse = key
    end
  end
  -- a merged call (agg.merge): tried once, shared by key instead of by path
  if spec.batch then
    if spec.retry or spec.hedge then
      error(("call to '%s': a merged call (batch) is tried once: remove retry and hedge"):format(name), level)
    end
    if n.body then error(("call to '%s': a merged call (batch) has no body"):format(name), level) end
    if spec.cache then
      error(("call to '%s': a merged call (batch) is not cached: remove cache (cache the page's items another way)"):format(name), level)
    end
    n.batch = merge.normalize(spec.batch, name, n.method, n.path, headers, level)
    -- the upstream's cache policy would key every item by the merged route's one path
    n.retry, n.hedge_after, n.collapse, n.cache = nil, nil, nil, false
  end
  return n
end

return M
