-- agg.testing_transport: the spec harness's transport: the `core` table agg.runtime runs on
-- (lua/agg/contract.lua), kept as the C worker keeps it but on the virtual clock
-- (agg.testing_clock): upstream calls answered by stubs (latency, faults, the C transport's JSON
-- refs), runtime timers, the cache's two tiers, endpoint slots, responses. Its functions are
-- methods of agg.testing's gateways (gw:install, gw:stub, gw:start_call).
local str_gmatch, str_match, str_gsub = string.gmatch, string.match, string.gsub
local cache = require "agg.cache"
local json = require "agg.json"
local rt = require "agg.runtime"
local url = require "agg.url"
local resp_headers = require "agg.resp_headers"
local sys = require "agg.sys"
local config = require "agg.config"
local args = require "agg.testing_args"
local clock = require "agg.testing_clock"

local T = {}

-- agg.testing, required when first needed: it requires this module
local function harness() return require "agg.testing" end

local schedule, sorted_names, check_answer = clock.schedule, args.sorted_names, args.check_answer

-- "/path?query" -> "/path", "query" ("" when there is none)
local function split_path(path)
  local p, q = str_match(path, "^([^?]*)%??(.*)$")
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
  for s in str_gmatch(pp, "[^/]+") do a[#a + 1] = s end
  for s in str_gmatch(rp, "[^/]+") do b[#b + 1] = s end
  for i = 1, #a do
    if a[i] == "*" and i == #a then return true end
    if b[i] == nil then return false end
    if not str_match(a[i], "^{.*}$") and a[i] ~= b[i] then return false end
  end
  return #a == #b
end

local SLOTS_PER_NAME = 8 -- AGW_ADDRS_PER_NAME (gateway/upstream/conf.h)
T.SLOTS_PER_NAME, T.split_path = SLOTS_PER_NAME, split_path

-- Makes this gateway's transport the runtime's (a spec may hold several gateways; the one used last wins).
function T.install(gw)
  local self = gw
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
    if level == "error" then local errs = harness().script_errors errs[#errs + 1] = msg end
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
  -- the request's header block (agg.contract), as the C worker makes it: names lowercased (the
  -- front's already are), sorted; nil once the request was answered or its client went away
  function core.request_headers(rid)
    local r = gw.responses[rid]
    if not r or r.status or not r.req_headers then return nil end
    local names = {}
    for k in pairs(r.req_headers) do names[#names + 1] = k end
    table.sort(names)
    local out = {}
    for i, k in ipairs(names) do out[i] = k .. "\0" .. tostring(r.req_headers[k]) .. "\0" end
    return table.concat(out)
  end
  -- whether the spec's request came over TLS (its option tls), as the C worker tells it: nothing
  -- once the request was answered or its client went away
  function core.request_tls(rid)
    local r = gw.responses[rid]
    if not r or r.status then return nil end
    return r.req_tls == true
  end
  -- the user the spec's request came as, and its token (agg.contract), as the C worker hands them
  -- over: nothing without a user, or once the request was answered or its client went away
  function core.request_user(rid)
    local r = gw.responses[rid]
    if not r or r.status or not r.req_user then return nil end
    return r.req_user, r.req_token
  end
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
    -- the gateway's entries are a field of their own, after the script's (worker/respond.c):
    -- beside a script's server-timing, the list of both
    if timing then
      local own = h["server-timing"]
      if own == nil then
        h["server-timing"] = timing
      else
        local l = type(own) == "table" and { unpack(own) } or { own }
        l[#l + 1] = timing
        h["server-timing"] = l
      end
    end
    for k, v in pairs(r.limit_fields or {}) do h[k] = v end -- limits.headers = true (as worker/limits.c)
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
  -- (the C worker makes the entry without a Lua string of it; the same bytes)
  function core.cache_store(key, fresh, stale, err_until, status, headers, body, until_ms, redis_ttl_ms)
    if type(headers) ~= "string" then headers = headers and json.raw_extra(headers) or "" end
    if type(body) ~= "string" then body = body and json.raw(body) or "" end
    local v = cache.encode(fresh, stale, err_until, status, headers, body)
    if #v > cache.MAX_ENTRY then return false end
    core.cache_set(key, v, until_ms)
    if redis_ttl_ms and core.redis_set then core.redis_set(key, v, redis_ttl_ms) end
    return #v
  end
  local cfg = self.gen.config
  if gw.redis and cfg.redis and cfg.cache.redis then
    local store = gw.redis
    -- the largest entry tier 2 takes or gives (gateway/worker/cache.c redis_entry_max): what moves
    -- within the client's timeout_ms at 50 KB a ms, at most MAX_ENTRY
    local entry_max = math.min(cfg.redis.timeout_ms * 50000, cache.MAX_ENTRY)
    function core.redis_get(key)
      if store.down then return nil end
      store.next_id = (store.next_id or 0) + 1
      local id = store.next_id
      store.gets = (store.gets or 0) + 1
      local e = store.data[key]
      local v = e and e.until_ms > gw.clock and e.value or nil
      if v and #v > entry_max then v = v:sub(1, entry_max) end -- (GETRANGE 0 max-1: which no entry parses)
      schedule(gw, gw.clock + (store.latency_ms or 0), function()
        if store.hang then return rt.on_redis(id, nil, "timeout") end
        rt.on_redis(id, store.corrupt and "garbage" or v, nil)
      end)
      return id
    end
    function core.redis_set(key, value, ttl_ms)
      if store.down or #value > entry_max then return end
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
  harness().current = self
end

--- Stubs upstream calls: stub(upstream, [method,] path_pattern, answer | { answer, answer, … } |
-- function(call) return answer end). The pattern is an exact path (with its query to match the
-- query too), or has {name} segments or a trailing "*". Later stubs win over earlier ones. A
-- function answers from what was sent: call.path, call.route_path, call.query (decoded, e.g. the
-- ids of a merged call: call.query.ids == "1,2,3"), call.headers, call.body.
function T:stub(upstream, a, b, c)
  local method, pattern, answers = "*", a, b
  if c ~= nil then method, pattern, answers = a, b, c end
  if type(upstream) ~= "string" or type(pattern) ~= "string" or (type(answers) ~= "table" and type(answers) ~= "function") then
    error("stub(upstream, [method,] path, answer): upstream and path are strings, answer a table or a function", 2)
  end
  -- a call's path starts with '/': a pattern without one never matched, and the spec then failed on
  -- "no stub for …" far from the stub's line (a fresh user's trial)
  if pattern:sub(1, 1) ~= "/" and pattern ~= "*" then
    error(("gw:stub: the path %q must start with '/' (\"/%s\"), or be \"*\" for every path"):format(pattern,
      pattern), 2)
  end
  -- "product" stubs every endpoint of the upstream, "product#2" its second endpoint only
  local name, ep = str_match(upstream, "^(.-)#(%d+)$")
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

function T:start_call(rid, index, method, path, headers, body, timeout_ms, decode, endpoint)
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
    -- (its mistakes are the spec's: named at the function's place, not at the harness's line)
    local info = debug.getinfo(ans, "S")
    local place = ("%s:%d: "):format(info.short_src, info.linedefined)
    local fname = ("gw:stub function for %s %s"):format(up.name, path)
    ans = ans(c)
    if type(ans) ~= "table" then
      error(("%s%s must return an answer table like { json = … }, got %s"):format(place, fname, type(ans)), 0)
    end
    local ok, err = pcall(check_answer, fname, ans)
    -- (check_answer places its message at the first frame outside the harness: the runtime's here)
    if not ok then error(place .. (str_gsub(tostring(err), "^[^\n]-:%d+: ", "", 1)), 0) end
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

return T
