-- agg.testing: spec harness for page scripts (`aggway test`). A gateway made here loads a scripts
-- folder exactly as `aggway serve` does and runs the same runtime (scheduler, deadlines, fetch_then
-- graph, page contract, JSON encoder), but its transport is a set of stubbed upstream answers and
-- its clock is virtual: a 200 ms deadline or a 30 s wait takes no real time, and every run gives the
-- same answer.
--
--   local testing = require "agg.testing"
--   local gw = testing.gateway()                 -- the folder given to `aggway test -c` (default scripts)
--   gw:stub("product", "/products/42", { json = { id = 42, sku = "SNK-42" }, latency_ms = 40 })
--   gw:stub("reviews", "/reviews/{id}", { fault = "hang" })
--   local page = gw:get("/product-page/42")
--   assert.equal(200, page.status)
--   assert.equal(100, page.elapsed_ms)           -- virtual milliseconds
--   assert.equal("unavailable", page.json.reviews.status)
--
-- Stub answers: { status = 200, headers = { … }, json = value | body = "bytes", latency_ms = 0,
--   fault = nil | "hang" | "refuse" | "tls" | "reset" | "short" | "non_json" | "invalid_utf8" | "huge" }.
-- A list of answers is served in order, the last one repeating.
local cache = require "agg.cache"
local json = require "agg.json"
local loader = require "agg.loader"
local router = require "agg.router"
local rt = require "agg.runtime"
local url = require "agg.url"
local problem = require "agg.problem"
local resp_headers = require "agg.resp_headers"
local sys = require "agg.sys"
local config = require "agg.config"
local limiter = require "agg.limiter"
local limits = require "agg.limits"

local M = {}

-- Errors the scripts logged since the current test started, in every gateway of the spec:
-- `aggway test` prints them beside a failed assertion (agg.test_cli).
M.script_errors = {}
function M.clear_script_errors() M.script_errors = {} end

local Gateway = {}
Gateway.__index = Gateway

local function split_path(path)
  local p, q = path:match("^([^?]*)%??(.*)$")
  return p, q
end

local decode_query = url.parse_query

-- Matches a path against a stub pattern: literal segments, {name} segments, a trailing "*".
local function match_pattern(pattern, path)
  if pattern == path then return true end
  local pp, pq = split_path(pattern)
  local rp = split_path(path)
  if pq ~= "" then return false end -- a pattern with a query matches only exactly
  local a, b = {}, {}
  for s in pp:gmatch("[^/]+") do a[#a + 1] = s end
  for s in rp:gmatch("[^/]+") do b[#b + 1] = s end
  for i = 1, #a do
    if a[i] == "*" and i == #a then return true end
    if b[i] == nil then return false end
    if not a[i]:match("^{.*}$") and a[i] ~= b[i] then return false end
  end
  return #a == #b
end

-- What the harness accepts, checked like the mock's config (tools/mock): an unknown option, a
-- value of the wrong type or an unknown fault is an error naming it, never silently ignored
-- (a stub's `latncy_ms = 500` would otherwise answer at 0 ms).
local GATEWAY_OPTIONS = { dir = "string", clock = "number", redis = "table", utc_ms = "number" }
local REQUEST_OPTIONS = { headers = "table", body = "string", json = true, user = "table", ip = "string" }
local ANSWER_OPTIONS = { status = "number", headers = "table", json = true, body = "string", latency_ms = "number",
                         fault = "string" }
local FAULTS = { hang = true, drip = true, refuse = true, tls = true, reset = true, short = true, non_json = true,
                 invalid_utf8 = true, huge = true }

local function sorted_names(set)
  local out = {}
  for k in pairs(set) do out[#out + 1] = k end
  table.sort(out)
  return table.concat(out, ", ")
end

-- Raises msg at the line of the spec that called the harness (the first frame outside this file).
local function raise(msg)
  local l = 2
  while true do
    local info = debug.getinfo(l, "Sl")
    if not info then break end
    if not info.source:find("agg/testing%.lua$") and info.currentline > 0 then
      error(("%s:%d: %s"):format(info.short_src, info.currentline, msg), 0)
    end
    l = l + 1
  end
  error(msg, 0)
end

-- Errors (at the spec's line) when opts has a key known does not list, or a value of the
-- wrong type. where names the function, like "gw:stub".
local function check_options(where, opts, known)
  if type(opts) ~= "table" then raise(("%s: options must be a table, got %s"):format(where, type(opts))) end
  for k, v in pairs(opts) do
    local want = known[k]
    if want == nil then
      raise(("%s: unknown option '%s'%s (%s)"):format(where, tostring(k), config.suggest(k, known), sorted_names(known)))
    end
    if want ~= true and type(v) ~= want then
      raise(("%s: option '%s' must be a %s, got %s"):format(where, k, want, type(v)))
    end
  end
end

-- Checks one stub answer.
local function check_answer(where, ans)
  check_options(where, ans, ANSWER_OPTIONS)
  if ans.fault ~= nil and not FAULTS[ans.fault] then
    raise(("%s: unknown fault '%s'%s (%s)"):format(where, ans.fault, config.suggest(ans.fault, FAULTS), sorted_names(FAULTS)))
  end
  if ans.latency_ms ~= nil and (ans.latency_ms < 0 or ans.latency_ms ~= ans.latency_ms) then
    raise(("%s: latency_ms must be a number of milliseconds >= 0"):format(where))
  end
  if ans.status ~= nil and (ans.status < 100 or ans.status > 599 or ans.status % 1 ~= 0) then
    raise(("%s: status must be an HTTP status code (100-599), got %s"):format(where, tostring(ans.status)))
  end
  if ans.json ~= nil and ans.body ~= nil then
    raise(("%s: give either json or body, not both"):format(where))
  end
end

--- An in-memory tier 2 for the cache (a Redis on the virtual clock) to give testing.gateway as
-- opts.redis; gateways given the same one share it. Fields a spec may set: down (every command
-- refused), hang (every lookup times out), corrupt (every value is garbage), latency_ms;
-- gets counts lookups.
function M.redis()
  return { data = {}, gets = 0 }
end

--- Creates a gateway for the scripts folder opts.dir (default: the folder of `aggway test -c`,
-- else "scripts"). Errors when the folder does not load, with every "file:line: message".
function M.gateway(opts)
  opts = opts or {}
  check_options("testing.gateway", opts, GATEWAY_OPTIONS)
  local dir = opts.dir or AGGWAY_SCRIPTS or "scripts"
  local gen, errs = loader.load(dir)
  if not gen then error("scripts folder " .. dir .. " does not load:\n  " .. table.concat(errs, "\n  "), 2) end
  -- limits count on the UTC calendar: virtual time 0 is opts.utc_ms (ms since the Unix epoch;
  -- default 2026-01-01T00:00:00Z), so that a spec can put a quota's window boundary where it wants
  local gw = setmetatable({ dir = dir, gen = gen, clock = opts.clock or 0, redis = opts.redis or false,
                            utc_ms = opts.utc_ms or 1767225600000, limiter = limiter.new(4096),
                            seq = 0, events = {}, stubs = {}, open = 0,
                            call_log = {}, published = { counters = {}, endpoints = {} }, by_id = {}, log_lines = {}, responses = {}, next_rid = 1,
                            next_call = 1, names = {} }, Gateway)
  gw.seed = 42
  gw.breakers = {}
  local breaker = require "agg.breaker"
  for i, u in ipairs(gen.config.upstreams) do
    gw.names[i] = u
    local b = u.breaker
    gw.breakers[i] = breaker.new(b.off and 0 or b.failures, b.open_s * 1000, b.half_open_probes)
  end
  gw:install()
  return gw
end

-- The event queue: a binary heap ordered by (time, order of scheduling), so runs are deterministic.
local function before(a, b) return a.at < b.at or (a.at == b.at and a.seq < b.seq) end

local function schedule(gw, at, fn)
  gw.seq = gw.seq + 1
  local ev = { at = at, seq = gw.seq, fn = fn }
  local h = gw.events
  local i = #h + 1
  h[i] = ev
  while i > 1 do
    local p = math.floor(i / 2)
    if not before(h[i], h[p]) then break end
    h[i], h[p] = h[p], h[i]
    i = p
  end
  return ev
end

local function pop(h)
  local top = h[1]
  local last = h[#h]
  h[#h] = nil
  if #h > 0 then
    h[1] = last
    local i, n = 1, #h
    while true do
      local l, r, m = 2 * i, 2 * i + 1, i
      if l <= n and before(h[l], h[m]) then m = l end
      if r <= n and before(h[r], h[m]) then m = r end
      if m == i then break end
      h[i], h[m] = h[m], h[i]
      i = m
    end
  end
  return top
end

-- The next live event (dead ones, cancelled, are dropped), without removing it.
local function peek(gw)
  local h = gw.events
  while h[1] and h[1].dead do pop(h) end
  return h[1]
end

local SLOTS_PER_NAME = 8 -- AGW_ADDRS_PER_NAME (gateway/upstream/conf.h)

-- Makes this gateway's transport the runtime's (a spec may hold several gateways; the one used last wins).
function Gateway:install()
  local gw = self
  local core = {}
  function core.now() return gw.clock end
  -- timers of the runtime (retry backoff, hedges, collapsed callers) run on the virtual clock
  function core.timer(ms)
    gw.next_timer = (gw.next_timer or 0) + 1
    local id = gw.next_timer
    gw.timer_events = gw.timer_events or {}
    gw.timer_events[id] = schedule(gw, gw.clock + ms, function()
      gw.timer_events[id] = nil
      rt.on_timer(id)
    end)
    return id
  end
  function core.cancel_timer(id)
    local ev = gw.timer_events and gw.timer_events[id]
    if ev then ev.dead = true gw.timer_events[id] = nil end
  end
  -- jitter from a fixed seed: the same spec gives the same run
  function core.random()
    gw.seed = (gw.seed * 1103515245 + 12345) % 2147483648
    return gw.seed / 2147483648
  end
  -- one breaker per upstream, the production C breaker, on the virtual clock
  core.breakers = gw.breakers
  function core.log(level, msg)
    gw.log_lines[#gw.log_lines + 1] = level .. ": " .. msg
    if level == "error" then M.script_errors[#M.script_errors + 1] = msg end
  end
  -- the transport's side of agg.contract, as the C worker keeps it: a group's endpoint (1-based;
  -- nil: the first). section, attempt and hedge name the C worker's span; the fake keeps none.
  function core.call(rid, index, method, path, headers, body, timeout_ms, decode, section, attempt, hedge, endpoint)
    return gw:start_call(rid, index, method, path, headers, body, timeout_ms, decode, endpoint or 1)
  end
  -- endpoint host names (gateway/group/directory.h): the addresses gw:addresses gave an upstream
  function core.endpoint_slots(index, seen)
    local d = gw.dirs and gw.dirs[index]
    if not d then return nil end
    if seen == d.version then return d.version end
    local out = {}
    for i = 1, SLOTS_PER_NAME do out[i] = { url = d.url, address = d.slots[i] or false } end
    return d.version, out
  end
  -- req.trace_id in specs: a fixed id per request (32 hex digits), like the gateway's W3C ids
  function core.trace_id(rid) return ("%032x"):format(rid) end
  function core.cancel(id)
    local c = gw.by_id[id]
    if c and not c.ended_ms then
      c.cancelled, c.ended_ms, c.outcome = true, gw.clock, "cancelled"
      if c.event then c.event.dead = true end
    end
  end
  function core.respond(rid, response)
    local o = response
    local status, headers, body, is_json, default_type, timing =
      o.status, o.headers, o.body, o.json, o.default_type, o.server_timing
    local r = gw.responses[rid]
    if not r or r.status then return false end
    if is_json then
      -- a page's rows: the transport's own encoder (json/json.h agw_json_encode_rows)
      local s, err
      if o.rows then s, err = json.encode_rows(o.rows, rt.SECTION_MEMBERS) else s, err = json.encode(body) end
      if not s then return nil, err end
      body = s
    end
    -- the C transport's own reader (script/resp_headers.h): lowercased names, one spelling per
    -- name (the one that sorts first bytewise wins; a list value is several fields), invalid,
    -- framing and date headers dropped; its warnings go to gw:logs() as the gateway's go to its log
    local h, warnings = resp_headers.apply(headers)
    for _, msg in ipairs(warnings) do gw.log_lines[#gw.log_lines + 1] = "warn: " .. msg end
    local no_body = status == 204 or status == 304
    if no_body then body = "" end
    if default_type and not h["content-type"] and not no_body then h["content-type"] = default_type end
    if timing then h["server-timing"] = timing end
    for k, v in pairs(r.limit_fields or {}) do h[k] = v end -- limits.headers = true (as worker.c)
    r.status, r.headers, r.body, r.elapsed_ms = status, h, body, gw.clock - r.started_ms
    gw.open = gw.open - 1
    return true
  end
  -- the cache's two tiers on the virtual clock (agg.cache): tier 1 is this gateway's, tier 2 (an
  -- in-memory Redis) is opts.redis, a table several gateways of a spec may share
  -- (testing.redis()), when gateway.lua has a redis block and cache.redis is not false
  gw.tier1 = gw.tier1 or {}
  function core.cache_entry(key, decode)
    local e = gw.tier1[key]
    if e and e.until_ms > gw.clock then return cache.entry_fields(e.value, decode) end
    gw.tier1[key] = nil
    return nil
  end
  function core.cache_set(key, value, until_ms) gw.tier1[key] = { value = value, until_ms = until_ms } end
  local cfg = self.gen.config
  if gw.redis and cfg.redis and cfg.cache.redis then
    local store = gw.redis
    function core.redis_get(key)
      if store.down then return nil end
      store.next_id = (store.next_id or 0) + 1
      local id = store.next_id
      store.gets = (store.gets or 0) + 1
      local e = store.data[key]
      local v = e and e.until_ms > gw.clock and e.value or nil
      schedule(gw, gw.clock + (store.latency_ms or 0), function()
        if store.hang then return rt.on_redis(id, nil, "timeout") end
        rt.on_redis(id, store.corrupt and "garbage" or v, nil)
      end)
      return id
    end
    function core.redis_set(key, value, ttl_ms)
      if store.down then return end
      store.data[key] = { value = value, until_ms = gw.clock + ttl_ms }
    end
  end
  -- what runtime.report_stats publishes (the C worker: metrics and /upstreams): the last values,
  -- copied, since the runtime reuses its tables (gw:report_stats())
  function core.upstream_counters(index, counters)
    local c = {}
    for k, v in pairs(counters) do c[k] = v end
    gw.published.counters[index] = c
  end
  function core.endpoint_state(index, endpoint, state)
    local s = {}
    for k, v in pairs(state) do s[k] = v end
    gw.published.endpoints[index] = gw.published.endpoints[index] or {}
    gw.published.endpoints[index][endpoint] = s
  end
  rt.init(core, self.gen.upstreams, self.gen.endpoints, self.gen.token_exchange)
  M.current = self
end


-- The script time limit, as serve applies it (worker/watchdog.h): one entry into the runtime (a
-- request arriving, an answer, a timer) that runs longer than the folder's script_time_limit_ms of
-- real time is stopped at the line it was at, and the request gets the 500 problem (or the
-- continuation's section fails) that serve gives. The stop is raised at every instruction of the
-- scripts' own code (anything but lua/agg), in a coroutine or (a fallback) on the thread that
-- entered, so a pcall in the script cannot go on; never in the runtime's own code.
local HOOK_EVERY = 10000 -- VM instructions between clock readings
local function timed(gw, fn, ...)
  local limit_ms = gw.gen.config.script_time_limit_ms
  local deadline = sys.monotonic_s() + limit_ms / 1000
  local base = coroutine.running()
  local hit = false
  local hook
  hook = function()
    if not hit then
      if sys.monotonic_s() <= deadline then return end
      hit = true
      debug.sethook(hook, "", 1) -- from now on at every instruction
    end
    local info = debug.getinfo(2, "Sl")
    if not info or loader.runtime_source(info.source) then
      -- the runtime's own code (an error there would leave it half way through its bookkeeping):
      -- in a coroutine, wait for the script's next instruction; on the
      -- thread that entered (the script's coroutine is gone, or a fallback's pcall has the error),
      -- read the clock again a limit later
      if coroutine.running() == base then
        hit = false
        deadline = sys.monotonic_s() + limit_ms / 1000
        debug.sethook(hook, "", HOOK_EVERY)
      end
      return
    end
    local where = info and info.currentline > 0 and (info.short_src .. ":" .. info.currentline .. ": ") or ""
    error(("%s%s%d ms without waiting for a call (script_time_limit_ms in gateway.lua)"):format(
          where, loader.STOP_TEXT, limit_ms), 0)
  end
  debug.sethook(hook, "", HOOK_EVERY)
  local ok, err = pcall(fn, ...)
  debug.sethook()
  if not ok then error(err, 0) end
end

-- Runs the earliest event; returns false when there is none.
local function step(gw)
  if not peek(gw) then return false end
  local ev = pop(gw.events)
  if ev.at > gw.clock then gw.clock = ev.at end
  timed(gw, ev.fn)
  return true
end
--- Stubs upstream calls: stub(upstream, [method,] path_pattern, answer | { answer, answer, … } |
-- function(call) return answer end). The pattern is an exact path (with its query to match the
-- query too), or has {name} segments or a trailing "*". Later stubs win over earlier ones. A
-- function answers from what was sent: call.path, call.route_path, call.query (decoded, e.g. the
-- ids of a merged call: call.query.ids == "1,2,3"), call.headers, call.body.
function Gateway:stub(upstream, a, b, c)
  local method, pattern, answers = "*", a, b
  if c ~= nil then method, pattern, answers = a, b, c end
  if type(upstream) ~= "string" or type(pattern) ~= "string" or (type(answers) ~= "table" and type(answers) ~= "function") then
    error("stub(upstream, [method,] path, answer): upstream and path are strings, answer a table or a function", 2)
  end
  -- "product" stubs every endpoint of the upstream, "product#2" its second endpoint only
  local name, ep = upstream:match("^(.-)#(%d+)$")
  name, ep = name or upstream, tonumber(ep)
  local known, found = {}, nil
  for _, u in ipairs(self.names) do
    known[u.name] = true
    if u.name == name then found = u end
  end
  if not found then
    error(("gw:stub: gateway.lua has no upstream '%s'%s (%s)"):format(name, config.suggest(name, known),
      sorted_names(known)), 2)
  end
  local neps = ep and self:slot_count(found)
  if ep and (ep < 1 or ep > neps) then
    error(("gw:stub: upstream '%s' has %d endpoint(s), not #%d"):format(name, neps, ep), 2)
  end
  local list = (type(answers) == "table" and type(answers[1]) == "table") and answers or { answers }
  for i, ans in ipairs(list) do
    -- (a function's answers are checked when it gives them)
    if type(ans) == "table" then check_answer(#list > 1 and ("gw:stub answer " .. i) or "gw:stub", ans) end
  end
  table.insert(self.stubs, 1, { upstream = name, endpoint = ep, method = method, pattern = pattern, answers = list,
                                served = 0 })
  return self
end

function Gateway:start_call(rid, index, method, path, headers, body, timeout_ms, decode, endpoint)
  local up = self.names[index]
  local id = self.next_call
  self.next_call = id + 1
  local h = {}
  for i = 1, #(headers or {}), 2 do h[headers[i]] = headers[i + 1] end
  local p, q = split_path(path)
  local c = { id = id, upstream = up.name, method = method, path = path, route_path = p, query = decode_query(q),
              headers = h, body = body or nil, started_ms = self.clock, timeout_ms = timeout_ms, endpoint = endpoint }
  self.by_id[id] = c
  local function finish(at, outcome, status, rheaders, rbody, data, detail)
    c.event = schedule(self, at, function()
      c.ended_ms, c.outcome, c.http_status = self.clock, outcome, status
      -- as the C transport: a validated JSON body alone (its ref carries headers and text), else
      -- the rest of the answer in a table
      local more = nil
      if rheaders ~= true then more = { headers = rheaders, body = rbody, detail = detail } end
      rt.on_call(id, outcome, status or 0, data, self.clock - c.started_ms, more)
    end)
  end
  -- what the upstream client would refuse to send (a '#' or a raw byte in the path, a control
  -- character in a header value) fails as in serve, and is not a call the upstream saw
  local invalid = sys.call_invalid(method, path, headers)
  if invalid then
    finish(self.clock, "bad_request", nil, nil, nil, nil, up.name .. ": bad request, nothing sent: " .. invalid)
    return id
  end
  self.call_log[#self.call_log + 1] = c
  local stub
  for _, s in ipairs(self.stubs) do
    if s.upstream == up.name and (not s.endpoint or s.endpoint == endpoint) and (s.method == "*" or s.method == method)
       and match_pattern(s.pattern, path) then
      stub = s
      break
    end
  end
  if not stub then
    c.unstubbed = true
    self.unstubbed = self.unstubbed or ("no stub for " .. method .. " " .. path .. " on upstream '" .. up.name ..
                                        "': add gw:stub(\"" .. up.name .. "\", \"" .. p .. "\", { json = … })")
    finish(self.clock, "refused", nil, nil, nil, nil, "no stub")
    return id
  end
  stub.served = stub.served + 1
  local ans = stub.answers[math.min(stub.served, #stub.answers)]
  if type(ans) == "function" then
    ans = ans(c)
    if type(ans) ~= "table" then error("stub function for " .. up.name .. " " .. path .. " must return an answer table") end
    check_answer("gw:stub function for " .. up.name .. " " .. path, ans)
  end
  local latency = ans.latency_ms or 0
  local fault = ans.fault
  local deadline = self.clock + timeout_ms
  if fault == "refuse" then return (finish(self.clock, "refused", nil, nil, nil, nil, "connection refused") or id) end
  if fault == "hang" or fault == "drip" or latency > timeout_ms then
    finish(deadline, "timeout", nil, nil, nil, nil, "no answer within " .. timeout_ms .. " ms")
    return id
  end
  local at = self.clock + latency
  if fault == "reset" then finish(at, "reset", nil, nil, nil, nil, "connection reset") return id end
  if fault == "tls" then
    finish(at, "tls", nil, nil, nil, nil, "TLS handshake with upstream " .. up.name ..
           " failed: certificate verify failed: certificate has expired (stub)")
    return id
  end
  if fault == "short" then finish(at, "truncated", nil, nil, nil, nil, "body shorter than Content-Length") return id end
  if fault == "huge" then finish(at, "too_large", nil, nil, nil, nil, "body over max_body_bytes") return id end
  local status = ans.status or 200
  local rheaders = {}
  for k, v in pairs(ans.headers or {}) do rheaders[k:lower()] = v end
  local rbody
  if fault == "non_json" then
    rbody = "<html><body>Internal error</body></html>"
  elseif fault == "invalid_utf8" then
    rbody = '{"name":"\255\254"}'
  elseif ans.json ~= nil then
    local err
    rbody, err = json.encode(ans.json)
    if not rbody then error("stub answer for " .. up.name .. " " .. path .. ": json cannot be encoded: " .. err) end
  else
    rbody = ans.body or ""
  end
  if #rbody > up.max_body_bytes then
    finish(at, "too_large", nil, nil, nil, nil, "body over max_body_bytes") return id
  end
  if rheaders["content-type"] == nil and (ans.json ~= nil or fault) then rheaders["content-type"] = "application/json" end
  local hstr = {}
  for k, v in pairs(rheaders) do hstr[#hstr + 1] = k .. "\0" .. v .. "\0" end
  table.sort(hstr)
  hstr = table.concat(hstr)
  -- as the C transport does: a valid JSON body travels only as its raw ref, which carries the
  -- headers too (json.raw_extra)
  local data
  if decode and status >= 200 and status < 300 and #rbody > 0 then
    local ref, err = json.parse(rbody, hstr)
    data = ref or err
    if ref then rbody, hstr = nil, true end
  end
  finish(at, "ok", status, hstr, rbody, data, nil)
  return id
end

-- Routes as serve does: the gateway's own router (gateway/router.h), built once per endpoint list.
local routers = setmetatable({}, { __mode = "k" })

local function match_route_uncached(eps, method, path)
  local r = routers[eps]
  if not r then r = router.new(eps) routers[eps] = r end
  local what, a, b = r:match(method, path)
  if what == "found" then return a, b end
  return nil, what, a
end

-- Route matches of a gateway, remembered by method and path (specs send the same paths often).
local route_cache = setmetatable({}, { __mode = "k" })

local function match_route(eps, method, path)
  local c = route_cache[eps]
  if not c then c = {} route_cache[eps] = c end
  local key = method .. " " .. path
  local hit = c[key]
  if not hit then
    hit = { match_route_uncached(eps, method, path) }
    c[key] = hit
  end
  if not hit[1] then return nil, hit[2], hit[3] end
  -- each request gets its own params table: a script may change it
  local params = {}
  for k, v in pairs(hit[2]) do params[k] = v end
  return hit[1], params
end

--- Sends a request and runs the virtual clock until the page is answered. opts: { headers = {},
-- body = "…" | json = value, user = { sub, scopes, claims, aud } | { app, plan } }: the request
-- comes from that user, as if the edge had verified its token or API key (without user, an
-- endpoint whose auth is not "none" answers 401, and a missing scope 403, as the edge does). Returns { status, headers (lowercased), body, json (decoded when
-- the body is JSON), elapsed_ms (virtual) }. Errors when a call had no stub.
-- A response's `json` is its body decoded, on first read.
local response_mt = { __index = function(r, k)
  if k == "json" and r.status then
    local ct = r.headers and r.headers["content-type"] or ""
    local v = nil
    if ct:find("json", 1, true) and r.body ~= "" then v = json.decode(r.body) end
    rawset(r, "json", v)
    return v
  end
end }

local function finish_response(r) return r end

-- A spec's user ({ sub, scopes, claims, aud } for a token, { app, plan } for an API key) as the
-- edge hands it to the runtime (gateway/edge/edge.h): the user table and the token a call with
-- identity would carry ("spec-token-<sub>", stable per user; nothing is signed: the edge's C
-- checks are the C and integration tests' business).
local function spec_user(u, cfg)
  if type(u) ~= "table" then error("opts.user must be a table like { sub = \"alice\", scopes = { … } }", 3) end
  if u.app ~= nil then
    return { via = "api_key", app = u.app, plan = u.plan or "" }, nil
  end
  local claims = {}
  for k, v in pairs(u.claims or {}) do claims[k] = v end
  claims.sub = claims.sub or u.sub
  local auds = cfg.auth and cfg.auth.jwt and cfg.auth.jwt.audiences or {}
  claims.aud = claims.aud or u.aud or (#auds == 1 and auds[1]) or auds
  claims.scope = claims.scope or (u.scopes and table.concat(u.scopes, " "))
  local scopes = {}
  for i, sc in ipairs(u.scopes or {}) do scopes[i] = sc end
  return { via = "jwt", sub = claims.sub, scopes = scopes, claims = claims },
         "spec-token-" .. tostring(claims.sub or "anonymous")
end

-- The edge's refusal of a request to an endpoint with policy (gateway/edge/auth.h), or nil.
local function spec_refusal(policy, user)
  local want = policy.kind
  if want == "none" then return nil end
  if user == nil or user.via ~= want then
    return 401, problem.new("unauthorized", want == "jwt" and "a bearer token is required" or "an API key is required", 401),
           want == "jwt" and 'Bearer realm="aggway"' or 'APIKey realm="aggway"'
  end
  for _, sc in ipairs(policy.scopes or {}) do
    local has = false
    for _, s in ipairs(user.scopes or {}) do if s == sc then has = true end end
    if not has then
      return 403, problem.new("insufficient-scope", "the access token lacks a scope this resource requires", 403),
             'Bearer realm="aggway", error="insufficient_scope", scope="' .. table.concat(policy.scopes, " ") .. '"'
    end
  end
  return nil
end
--- Sends a request without waiting: returns its response record, filled in (status, headers,
-- body, json, elapsed_ms) once the virtual clock has run far enough (gw:run()). For several
-- requests in flight at once.
function Gateway:send(method, path, opts)
  opts = opts or {}
  check_options("gw:" .. method:lower(), opts, REQUEST_OPTIONS)
  if M.current ~= self then self:install() end
  local rid = self.next_rid
  self.next_rid = rid + 1
  local r = setmetatable({ started_ms = self.clock, rid = rid }, response_mt)
  self.responses[rid] = r
  self.pending_responses = self.pending_responses or {}
  self.pending_responses[#self.pending_responses + 1] = r
  local p, q = split_path(path)
  local idx, params, allow = match_route(self.gen.endpoints, method, p)
  r.request = method .. " " .. path
  if idx then r.script, r.route = self.gen.endpoints[idx].file, self.gen.endpoints[idx].route end
  if not idx then -- as worker/worker.c answers
    local pr
    if params == "method_not_allowed" then
      pr = problem.new("method-not-allowed", "this route does not accept this method", 405)
    elseif params == "bad_param" then
      pr = problem.new("bad-route-parameter", "a path segment holds characters a route parameter may not", 400)
    else
      pr = problem.new("route-not-found", "no route matches this path", 404)
    end
    r.status, r.body, r.elapsed_ms = pr.status, json.encode(pr), 0
    r.headers = { ["content-type"] = "application/problem+json", allow = allow }
    return finish_response(r)
  end
  local user, token
  if opts.user ~= nil then user, token = spec_user(opts.user, self.gen.config) end
  local st, pr, challenge = spec_refusal(self.gen.endpoints[idx].auth or { kind = "none" }, user)
  if st then
    r.status, r.body, r.elapsed_ms = st, json.encode(pr), 0
    r.headers = { ["content-type"] = "application/problem+json", ["www-authenticate"] = challenge }
    return finish_response(r)
  end
  local headers = {}
  for k, v in pairs(opts.headers or {}) do headers[k:lower()] = v end
  if self:gate(r, self.gen.endpoints[idx], headers, opts, user) then return finish_response(r) end
  local body = opts.body
  if opts.json ~= nil then
    body = assert(json.encode(opts.json))
    headers["content-type"] = headers["content-type"] or "application/json"
  end
  self.open = self.open + 1
  timed(self, rt.start, rid, idx, method, p, params,
        { query = q ~= "" and q or nil, headers = headers, body = body, user = user, token = token })
  return r
end

-- Priority shedding and limits, as worker/worker.c does them before any Lua (limits/gate.h, the
-- same C): answers r and returns true when the request is shed (503) or refused (429); else
-- counts it and leaves the RateLimit fields (limits.headers) for its response. The client's
-- address is opts.ip (default "127.0.0.1"); in-flight pages are this gateway's requests not yet
-- answered.
function Gateway:gate(r, ep, headers, opts, user)
  local cfg = self.gen.config
  local function answer(status, fields, body)
    r.status, r.body, r.elapsed_ms = status, body, 0
    r.headers = { ["content-type"] = "application/problem+json", ["cache-control"] = "no-store" }
    for k, v in pairs(fields) do r.headers[k] = v end
    return true
  end
  if limiter.shed(cfg.max_in_flight, ep.priority, self.open) then
    local bound = math.floor(cfg.max_in_flight * (5 - ep.priority) / 2)
    return answer(503, { ["retry-after"] = "1" }, json.encode {
      type = "https://iana.org/assignments/http-problem-types#temporary-reduced-capacity",
      title = "The gateway is overloaded", status = 503,
      detail = ("requests of priority %d are shed while a worker has more than %d pages in flight; retry in 1 s")
               :format(ep.priority, bound) })
  end
  if not ep.limits or #ep.limits == 0 then return false end
  local lim, asks, freq = cfg.limits, {}, nil
  for _, name in ipairs(ep.limits) do
    local rule = lim.rules[lim.by_name[name]]
    local key = ""
    if rule.key == "ip" then key = opts.ip or "127.0.0.1"
    elseif rule.key == "route" then key = ep.route
    elseif rule.key == "api_key" then key = user and user.app or ""
    elseif rule.key == "user" then key = user and (user.sub or user.app) or ""
    elseif rule.key == "function" then -- as worker/limits.c: the same req fields, the same errors
      if not freq then
        local u = user and (user.via == "api_key" and { via = "api_key", app = user.app, plan = user.plan }
                            or { via = "jwt", sub = user.sub }) or nil
        local method, path, query = r.request:match("^(%S+) ([^?]*)%??(.*)$")
        freq = { method = method, path = path, route = ep.route, query = query ~= "" and query or nil,
                 headers = headers, ip = opts.ip or "127.0.0.1", user = u }
      end
      local err
      key, err = limits.key_of(rule, freq)
      if err then self.log_lines[#self.log_lines + 1] = "warn: " .. err end
    else key = headers[rule.header] or "" end
    if key then
      local ask = { rule = rule, key = key }
      -- store = "redis": counted in the spec's Redis (testing.gateway's redis option, which several
      -- gateways may share); while it is down, hangs or lies, the rule's on_redis_error decides
      local store = self.redis
      if rule.store == "redis" and store then
        if store.down or store.hang or store.corrupt then
          local why = store.down and "not connected" or store.hang and "timeout" or "an answer that is not the limits script's"
          if not self.redis_outage then
            self.redis_outage = true
            self.log_lines[#self.log_lines + 1] = "warn: limits: Redis did not answer a check (" .. why ..
              "); Redis rules follow their on_redis_error until it answers again"
          end
          if rule.on_redis_error ~= "local" then ask.outcome = rule.on_redis_error end
        else
          if self.redis_outage then
            self.redis_outage = false
            self.log_lines[#self.log_lines + 1] = "info: limits: Redis answers checks again"
          end
          store.limits = store.limits or limiter.new(4096)
          ask.redis = true
        end
      end
      asks[#asks + 1] = ask
    end
  end
  if #asks == 0 then return false end
  local remote = self.redis and self.redis.limits or nil
  local ok, fields, body, status = self.limiter:check(asks, self.utc_ms + self.clock, lim.headers, remote)
  if not ok then return answer(status, fields, body) end
  r.limit_fields = fields
  return false
end

--- The client of a request sent with gw:send goes away (as a closed connection does in serve).
function Gateway:disconnect(r)
  if not r.status then
    r.status, r.disconnected = 499, true
    r.headers, r.body = {}, ""
    self.open = self.open - 1
    timed(self, rt.abort, r.rid)
  end
end

--- Runs something at virtual time ms (absolute), e.g. to send requests spread over time.
function Gateway:at(ms, fn)
  if type(ms) ~= "number" or ms ~= ms or ms < 0 then raise("gw:at: the time must be a number of virtual ms >= 0") end
  if type(fn) ~= "function" then raise("gw:at: the second argument must be a function") end
  schedule(self, ms, fn)
end

--- Runs the virtual clock until every request sent is answered and nothing else is due. Errors
-- when a request can never be answered, or when a call had no stub.
function Gateway:run()
  local guard = 0
  while true do
    local stepped = step(self)
    if not stepped and self.open > 0 then
      error("a request was never answered: the script waits with nothing in flight", 2)
    end
    if not stepped then break end
    guard = guard + 1
    if guard > 10000000 then error("the virtual clock ran 10,000,000 events without settling", 2) end
  end
  for _, r in ipairs(self.pending_responses or {}) do finish_response(r) end
  self.pending_responses = {}
  if self.unstubbed then
    local msg = self.unstubbed
    self.unstubbed = nil
    error(msg, 2)
  end
end

--- Sends a request and runs the virtual clock until the page is answered. opts: { headers = {},
-- body = "…" | json = value, user = { sub, scopes, claims, aud } | { app, plan } }: the request
-- comes from that user, as if the edge had verified its token or API key (without user, an
-- endpoint whose auth is not "none" answers 401, and a missing scope 403, as the edge does). Returns { status, headers (lowercased), body, json (decoded when
-- the body is JSON), elapsed_ms (virtual), script, route }. Errors when a call had no stub.
function Gateway:request(method, path, opts)
  self.unstubbed = nil
  local r = self:send(method, path, opts)
  local guard = 0
  while not r.status do
    guard = guard + 1
    if guard > 1000000 or not step(self) then
      error(("%s %s was never answered: the script waits with nothing in flight"):format(method, path), 2)
    end
  end
  self.pending_responses = {}
  if self.unstubbed then error(self.unstubbed, 2) end
  return finish_response(r)
end

function Gateway:get(path, opts) return self:request("GET", path, opts) end

--- Asserts that section name of page has status (and, when given, a problem of kind). Its failure
-- message names the script, the request, the section and the expected vs actual value:
--   scripts/product-page.lua (GET /product-page/42): section reviews: expected status "ok", got
--   "unavailable" (urn:aggway:problem:upstream-timeout: reviews did not answer in time)
-- Works on a 200 page and on a failed page's `sections` summary. Returns the section.
function M.expect_section(page, name, status, kind)
  local where = ("%s (%s): section %s"):format(page.script or "?", page.request or "?", tostring(name))
  local doc = page.json
  local sec = type(doc) == "table" and (doc[name] or (type(doc.sections) == "table" and doc.sections[name])) or nil
  if sec == nil then
    error(("%s: expected status %q, but the page (HTTP %s) has no such section"):format(where, status, tostring(page.status)), 2)
  end
  local function describe_error(e)
    if type(e) ~= "table" then return "" end
    return (" (%s: %s)"):format(tostring(e.type), tostring(e.title))
  end
  if sec.status ~= status then
    error(("%s: expected status %q, got %q%s"):format(where, status, tostring(sec.status), describe_error(sec.error)), 2)
  end
  if kind ~= nil then
    local got = type(sec.error) == "table" and problem.kind(sec.error) or nil
    if got ~= kind then
      error(("%s: expected problem %q, got %q"):format(where, kind, tostring(got)), 2)
    end
  end
  return sec
end

--- Calls made so far, in start order: { upstream, method, path, query, headers, body, started_ms,
-- ended_ms, outcome, http_status, cancelled }. With an upstream name, only that upstream's calls.
function Gateway:calls(upstream)
  local out = {}
  for _, c in ipairs(self.call_log) do
    if upstream == nil or c.upstream == upstream then out[#out + 1] = c end
  end
  return out
end

--- The endpoints of upstream name as this gateway's balancer sees them (agg.group.endpoints): a
-- list of { url, state = "healthy" | "ejected", in_flight, calls, failures, ejections, ejected_ms,
-- until_ms }; nil for an upstream with one endpoint.
function Gateway:endpoints(name) return require("agg.group").endpoints(name) end

--- Runs runtime.report_stats, as the worker does once a second, and returns what it published:
-- { counters = { [upstream index] = core.upstream_counters' counters },
--   endpoints = { [upstream index] = { [endpoint] = core.endpoint_state's state } } }
-- (the last values; indexes in gateway.lua's order).
function Gateway:report_stats()
  if M.current ~= self then self:install() end
  self.published = { counters = {}, endpoints = {} }
  rt.report_stats()
  return self.published
end

-- The endpoint slots of upstream entry u: 8 once gw:addresses gave it addresses, else its URLs.
function Gateway:slot_count(u)
  for i, v in ipairs(self.names) do
    if v == u and self.dirs and self.dirs[i] then return SLOTS_PER_NAME end
  end
  return #(u.endpoints or {})
end

--- Gives upstream name (one URL, whose host stands for a name) the addresses of list
-- ({ "10.0.0.1:9001", … }) in its 8 endpoint slots, placed as gateway/group/directory.h places
-- them: an address that stays keeps its slot (and its balancer state), a gone one frees its slot,
-- a new one takes the first free slot. The balancer follows at the next whole virtual second that
-- gw:advance passes, as a worker follows on its tick; at once when the upstream has had no call.
function Gateway:addresses(name, list)
  local index
  for i, u in ipairs(self.names) do if u.name == name then index = i end end
  if not index then raise("gw:addresses: gateway.lua has no upstream '" .. tostring(name) .. "'") end
  if type(list) ~= "table" or #list == 0 or #list > SLOTS_PER_NAME then
    raise("gw:addresses: give a list of 1 to 8 addresses like { \"10.0.0.1:9001\" }")
  end
  self.dirs = self.dirs or {}
  local d = self.dirs[index]
  if not d then
    d = { url = self.names[index].url, version = 0, slots = {} }
    self.dirs[index] = d
  end
  local want, have = {}, {}
  for _, a in ipairs(list) do want[a] = true end
  for i = 1, SLOTS_PER_NAME do
    if d.slots[i] and not want[d.slots[i]] then d.slots[i] = nil end
    if d.slots[i] then have[d.slots[i]] = true end
  end
  for _, a in ipairs(list) do
    for i = 1, SLOTS_PER_NAME do
      if have[a] then break end
      if not d.slots[i] then d.slots[i], have[a] = a, true end
    end
  end
  d.version = d.version + 1
end

--- Forgets the calls recorded so far (stubs stay).
function Gateway:clear_calls() self.call_log = {} end

--- Virtual time, ms.
function Gateway:now() return self.clock end

--- Moves the virtual clock forward by ms, running whatever falls due, and, as the worker's
-- once-a-second timer does, runtime.report_stats(true) at every whole virtual second it passes
-- (active health probes start there, agg.health).
function Gateway:advance(ms)
  if type(ms) ~= "number" or ms ~= ms or ms < 0 then raise("gw:advance: the time must be a number of virtual ms >= 0") end
  local target = self.clock + ms
  while true do
    local ev = peek(self)
    local tick = (math.floor(self.clock / 1000) + 1) * 1000
    if tick <= target and (not ev or tick < ev.at) then
      self.clock = tick
      if M.current ~= self then self:install() end
      timed(self, rt.report_stats, true)
    elseif ev and ev.at <= target then
      step(self)
    else
      break
    end
  end
  self.clock = target
end

--- Lines the runtime logged ("error: script error in …").
function Gateway:logs() return self.log_lines end

--- True when two recorded calls ran at the same time.
function M.overlap(a, b)
  return a.started_ms < (b.ended_ms or math.huge) and b.started_ms < (a.ended_ms or math.huge)
end

return M
