-- agg.runtime: the request lifecycle and the call scheduler (DESIGN §2.1, §3).
--
-- One coroutine per request runs the endpoint's handler. agg.fetch_all starts calls through the
-- transport (`core`) and yields; completions come back through M.on_call and resume the waiting
-- coroutine. Continuations of agg.fetch_then run in child coroutines of their own. Every timer
-- and clock read goes through `core`, so the spec harness can give the same code a virtual clock
-- and stub upstreams.
--
-- The transport `core` provides:
--   core.now() -> ms                              monotonic clock, milliseconds
--   core.call(rid, index, method, path, headers, body, timeout_ms, decode, section, attempt, hedge)
--                                                 -> call id (the last three describe the span)
--   core.join(rid, id, section)                   (optional) rid's section waits on call id (single-flight)
--   core.trace_id(rid) -> hex | nil               (optional) the request's trace id (req.trace_id)
--        later delivers M.on_call(id, outcome, http_status, headers, body, data, ms, detail);
--        headers: "name\0value\0…", or true when they ride in data's raw ref (json.raw_extra)
--   core.cancel(id)                               no on_call follows
--   core.respond(rid, status, headers, body, is_json, default_type, server_timing) -> true | nil, err
--        headers: name -> value (nil or a table; names in any case)
--   core.log(level, message)
local json = require "agg.json"
local problem = require "agg.problem"
local callspec = require "agg.callspec"
local identity = require "agg.identity"

local M = {}

-- table.new(narray, nhash): a table with room for what it will hold, so it never grows
local new_tab = require "table.new"

local core                                             -- transport and clock
local upstreams = {}                                   -- name -> { index, timeout_ms }
local endpoints = {}                                   -- index -> endpoint (loader.lua)
local contexts = {}                                    -- rid -> request context
local calls = {}                                       -- call id -> in-flight call record
local ctx_of = setmetatable({}, { __mode = "k" })      -- coroutine -> request context
local finishers = setmetatable({}, { __mode = "k" })   -- coroutine -> function(ok, value)
local result_info = setmetatable({}, { __mode = "k" }) -- result -> { section, required, raw }
local then_info = setmetatable({}, { __mode = "k" })   -- fetch_then marker -> { dep, fn, opts }
local then_resolved = setmetatable({}, { __mode = "k" })

-- A result's `data` is materialized from the parsed upstream JSON on first read; a section the
-- script never reads is encoded straight from the parsed JSON.
-- Upstream response headers arrive as "name\0value\0…" and become a table on first read;
-- repeated names are joined with ", " (RFC 9110 §5.3).
local function parse_headers(s)
  local h = {}
  for name, value in s:gmatch("([^%z]*)%z([^%z]*)%z") do
    local cur = h[name]
    h[name] = cur and (cur .. ", " .. value) or value
  end
  return h
end

local result_mt = {
  __index = function(t, k)
    if k == "headers" then
      local info = result_info[t]
      local raw = info and info.raw_headers
      if raw then
        info.raw_headers = nil
        if type(raw) ~= "string" then raw = json.raw_extra(raw) or "" end -- kept in the body's ref
        local h = parse_headers(raw)
        rawset(t, "headers", h)
        return h
      end
    elseif k == "body" then
      -- the text of a JSON body, kept once in its raw ref until someone asks for it
      local info = result_info[t]
      local ref = info and info.body_ref
      if ref then
        local b = json.raw(ref)
        rawset(t, "body", b)
        return b
      end
    elseif k == "data" then
      local info = result_info[t]
      local ref = info and info.ref
      if ref then
        local d = json.materialize(ref)
        info.ref = nil
        rawset(t, "data", d)
        return d
      end
    end
    return nil
  end,
  __newindex = function(t, k, v)
    if k == "data" then
      local info = result_info[t]
      if info then info.ref = nil end
    end
    rawset(t, k, v)
  end,
}

--- Installs the transport and the endpoints (from agg.loader) and the upstream table.
-- Any requests and calls of a previous init are forgotten (the spec harness starts a fresh
-- gateway per spec this way).
function M.init(transport, ups, eps, token_exchange)
  core, upstreams, endpoints = transport, ups, eps
  contexts, calls = {}, {}
  identity.init(transport, token_exchange, {
    set_timer = function(ms, fn) return M.set_timer(ms, fn) end,
    clear_timer = function(id) return M.clear_timer(id) end,
    -- an internal call (the token endpoint): its answer goes to fn, not to a section
    register_call = function(id, fn) calls[id] = { on_answer = fn } end,
  })
  -- pages allocate many short-lived tables and keep little. The default pause (a cycle when the
  -- heap doubles) with a fast collector (stepmul 1000) keeps the heap at a few MB under load; a
  -- longer pause lets garbage allocated during a cycle count as live, and the heap runs away
  -- (measured: 285 MB after 60,000 pages at pause 400, 2 MB at pause 200 / stepmul 1000)
  collectgarbage("setpause", 200)
  collectgarbage("setstepmul", 1000)
end

function M.endpoints() return endpoints end

--- True when r is a call result made by the scheduler.
function M.is_result(r) return result_info[r] ~= nil end

--- The data of a result as the page encoder wants it: a Lua value, a json ref, or nil.
function M.section_data(r)
  local d = rawget(r, "data")
  if d ~= nil then return d end
  local info = result_info[r]
  local ref = info and info.ref
  if ref then return ref end
  if info and info.decode == false and r.ok then return r.body end
  return nil
end

function M.section_name(r)
  local info = result_info[r]
  return info and tostring(info.section) or "?"
end

function M.is_required(r)
  local info = result_info[r]
  return info ~= nil and info.required
end

local function log_error(ctx, what, err, co)
  if type(err) ~= "string" then
    err = ("an error value of type %s (use error(\"message\") to say what is wrong)"):format(type(err))
  end
  local where = ctx and ctx.ep and (ctx.ep.route .. " (" .. ctx.ep.file .. ")") or "?"
  core.log("error", ("script error in %s%s: %s"):format(where, what and (", " .. what) or "",
    co and debug.traceback(co, tostring(err)) or tostring(err)))
end

-- Resumes co; when it ends, hands its outcome to its finisher.
local finish_request

-- Handler coroutines are reused: each runs handler_body, which yields DONE with the handler's
-- return value and waits for the next request. A handler that raises kills its coroutine.
local DONE = {}
local waiting = setmetatable({}, { __mode = "k" })     -- coroutines suspended in agg.fetch_all
local pool, pool_n, POOL_MAX = {}, 0, 64

local function handler_body(fn, req)
  while true do
    local v = fn(req)
    -- a coroutine waiting here (in the pool, or dropped when the pool is full) must not keep the
    -- request it served: req_lazy's entry for it would never go (see finish_request)
    fn, req = nil, nil
    fn, req = coroutine.yield(DONE, v)
  end
end

local function resume(co, ...)
  local ok, v, w = coroutine.resume(co, ...)
  local ctx = ctx_of[co]
  if ok and v == DONE then
    ctx_of[co] = nil
    finish_request(ctx, true, w, co)
    if pool_n < POOL_MAX then
      pool_n = pool_n + 1
      pool[pool_n] = co
    end
    return
  end
  if coroutine.status(co) == "dead" then
    if ctx and ctx.co == co then return finish_request(ctx, ok, v, co) end
    local fin = finishers[co]
    finishers[co] = nil
    if fin then fin(ok, v, co) end
  elseif ctx and ctx.co == co and not waiting[co] then
    -- the handler yielded by itself: it would never be resumed
    return finish_request(ctx, false, "a handler must not call coroutine.yield (use agg.fetch_all)", co)
  end
end

-- A result's internal facts (section, required, raw) live in result_info. A call's normalized spec
-- already carries them (its section is set when the call starts), so it serves as the info as is.
local function new_result(section, spec)
  local r = setmetatable({}, result_mt)
  if spec and spec.section == section then
    result_info[r] = spec
  else
    result_info[r] = { section = section, required = spec and spec.required or false,
                       decode = not spec or spec.decode ~= false }
  end
  return r
end

-- Marks r failed with problem p, serving the call's fallback when it has one.
local function fail(ctx, r, p, spec)
  r.ok = false
  r.error = p
  if spec and spec.fallback ~= nil then
    local fb = spec.fallback
    if type(fb) == "function" then
      local ok, v = pcall(fb, p)
      if not ok then
        log_error(ctx, "fallback of " .. result_info[r].section, v)
        r.status = "unavailable"
        return r
      end
      fb = v
    end
    r.status = "fallback"
    r.data = fb
  else
    r.status = "unavailable"
  end
  return r
end

local function now_remaining(ctx)
  local now = core.now()
  return now, ctx.deadline - now
end

local settle
local readonly_user

-- What to do with a call's result: settle section `key` of group g, or, when `chain` is given,
-- run that fetch_then continuation with it.
local function deliver(g, key, chain, r)
  if chain then M.run_then(g, key, chain, { r }) else settle(g, key, r) end
end

---------------------------------------------------------------------------------------------------
-- Calls. A section's call is an exchange: one or more attempts (the first, retries, a hedge) that
-- end in one result. Each attempt passes the upstream's circuit breaker, and identical GET calls
-- in flight at the same moment share one transport call (single-flight). Per worker, per upstream:
-- the retry budget, the hedge budget and the latency sample for "p95" (issue "resilience").
---------------------------------------------------------------------------------------------------

local ustate = {}     -- upstream name -> { active, retries_active, tokens, lat, n, p95, stats }
local flights = {}    -- collapse key -> flight { id, waiters = { exchange = true }, n }
local timers = {}     -- timer id -> function

local function upstream_state(name)
  local u = ustate[name]
  if not u then
    u = { active = 0, retries_active = 0, tokens = 1, lat = {}, n = 0, p95 = nil, p95_n = 0,
          stats = { calls = 0, attempts = 0, retries = 0, retries_denied = 0, hedges = 0, hedges_won = 0,
                    collapsed = 0, breaker_denied = 0, breaker_opened = 0 } }
    ustate[name] = u
  end
  return u
end

--- Counters of upstream name in this worker (for specs and metrics).
function M.upstream_stats(name) return upstream_state(name).stats end

--- Hands each upstream's counters to core.upstream_counters(index, retries, retries_denied, hedges,
-- hedges_won, collapsed), when the transport has it (the C worker calls this once a second and
-- publishes them as metrics; nothing is counted twice: the values are totals).
function M.report_stats()
  local report = core and core.upstream_counters
  if not report then return end
  for name, u in pairs(ustate) do
    local up = upstreams[name]
    if up then
      local s = u.stats
      report(up.index, s.retries, s.retries_denied, s.hedges, s.hedges_won, s.collapsed)
    end
  end
end

local function set_timer(ms, fn)
  local id = core.timer(ms)
  timers[id] = fn
  return id
end

local function clear_timer(id)
  if id and timers[id] then
    timers[id] = nil
    core.cancel_timer(id)
  end
end
M.set_timer, M.clear_timer = set_timer, clear_timer -- (for agg.identity)

--- Transport: timer id is due.
function M.on_timer(id)
  local fn = timers[id]
  if fn then
    timers[id] = nil
    fn()
  end
end

-- Records a successful attempt's latency in a ring of the last 200 (cheap: the p95 is computed
-- only when a hedged call asks for it, see p95()).
local function sample_latency(u, ms)
  u.n = u.n + 1
  u.lat[(u.n - 1) % 200 + 1] = ms
end

-- The upstream's p95 latency over its last 200 answers, recomputed at most every 20 new samples;
-- nil before 20 samples (no hedging until there is something to go by).
local function p95(u)
  if u.n < 20 then return nil end
  if not u.p95 or u.n - u.p95_n >= 20 then
    local copy = {}
    for i = 1, math.min(u.n, 200) do copy[i] = u.lat[i] end
    table.sort(copy)
    u.p95 = copy[math.max(1, math.floor(#copy * 0.95))]
    u.p95_n = u.n
  end
  return u.p95
end
-- How an attempt counts for the breaker: the upstream's failures only.
local BREAKER_FAILURES = { refused = true, connect_timeout = true, reset = true, truncated = true,
                           bad_response = true, too_large = true, tls = true }

local function breaker_verdict(outcome, http_status, clamped, bad_json)
  if outcome == "ok" then
    if http_status >= 500 or bad_json then return "failure" end
    return "success"
  end
  if BREAKER_FAILURES[outcome] then return "failure" end
  if outcome == "timeout" and not clamped then return "failure" end
  return "ignore" -- the gateway's own deadline, cancellation, overload of our pool
end

local function breaker_of(spec)
  local b = core.breakers
  return b and b[upstreams[spec.upstream].index] or nil
end

local finish_exchange, attempt

-- Builds the section's result from an attempt's answer.
local function make_result(x, outcome, http_status, headers, body, data, ms, detail)
  local spec, key, ctx = x, x.key, x.ctx
  if type(headers) == "string" then
    spec.raw_headers = headers
    headers = nil
  elseif headers == true then
    spec.raw_headers = data -- the body's raw ref keeps them (core.call's answer, above)
    headers = nil
  end
  if outcome == "ok" and http_status >= 200 and http_status < 300 and type(data) ~= "string" then
    -- the common case, built in one constructor (no table growth)
    local r = setmetatable({ ok = true, status = "ok", ms = ms, body = body, http_status = http_status,
                             headers = headers }, result_mt)
    result_info[r] = spec
    spec.ref = data
    if body == nil then spec.body_ref = data end -- the transport sent the text only in the ref
    return r
  end
  local r = new_result(key, spec)
  r.ms = ms
  r.headers = headers
  r.body = body
  if http_status ~= 0 then r.http_status = http_status end
  if outcome == "ok" and http_status >= 200 and http_status < 300 then
    fail(ctx, r, problem.for_outcome("bad_json", key, spec.upstream, data), spec)
  elseif outcome == "ok" then
    fail(ctx, r, problem.for_http_status(http_status, key, spec.upstream), spec)
  else
    fail(ctx, r, problem.for_outcome(outcome, key, spec.upstream, detail), spec)
  end
  return r
end

-- The attempts of an exchange in flight: at most two at once, the first (or a retry, or its
-- place in a shared call) in x.a1 and a hedge in x.a2; no table per call.
local function active_any(x) return x.a1 or x.a2 end

local function active_del(x, id)
  if x.a1 and x.a1.id == id then x.a1 = false elseif x.a2 and x.a2.id == id then x.a2 = false end
end

local function active_get(x, id)
  if x.a1 and x.a1.id == id then return x.a1 end
  if x.a2 and x.a2.id == id then return x.a2 end
  return nil
end

-- Ends exchange x with result r: stops its other attempts and timers, then delivers r.
finish_exchange = function(x, r)
  if x.done then return end
  x.done = true
  local ctx = x.ctx
  clear_timer(x.retry_timer)
  clear_timer(x.hedge_timer)
  clear_timer(x.own_timer)
  M.abandon_attempts(x)
  local u = x.u
  u.active = u.active - 1
  if x.retrying then u.retries_active = u.retries_active - 1 x.retrying = false end
  -- x lives on as the info of its result (result_info, weak-keyed): links that lead back to the
  -- result (its group, the request, an earlier failed result) would keep both alive forever
  local g, chain = x.group, x.chain
  x.ctx, x.group, x.chain, x.last = false, false, false, false
  if ctx.done then return end
  local timings = ctx.timings
  timings[#timings + 1] = x.key
  timings[#timings + 1] = r.ms or 0
  deliver(g, x.key, chain, r)
end

-- Cancels every attempt of x still in flight (leaving shared flights it waits on).
-- Cancels one attempt of x: closes its call, or leaves the shared call it waits on (closing it
-- when x was the last one waiting). A half-open probe that is cancelled gives its slot back.
local function abandon_one(x, rec)
  local id = rec.id
  local f = rec.flight
  if f then
    f.waiters[x] = nil
    f.n = f.n - 1
    if f.n == 0 then
      flights[f.key] = nil
      calls[f.id] = nil
      core.cancel(f.id)
      if f.probe then local b = breaker_of(x) if b then b:report("ignore", true, core.now()) end end
    end
  else
    calls[id] = nil
    core.cancel(id)
    if rec.probe then local b = breaker_of(x) if b then b:report("ignore", true, core.now()) end end
  end
end

function M.abandon_attempts(x)
  local a1, a2 = x.a1, x.a2
  x.a1, x.a2 = false, false
  if a1 then abandon_one(x, a1) end
  if a2 then abandon_one(x, a2) end
end

-- Decides what follows a failed attempt: wait for another attempt in flight, retry, or fail.
local function after_failure(x, r, outcome, http_status)
  if active_any(x) then
    x.last = r -- a hedge is still out: its answer may yet win
    return
  end
  local spec, u = x, x.u
  local up = upstreams[spec.upstream]
  if outcome == "ok" and http_status == 401 and up.identity == "exchange" and x.identity and not x.reexchanged then
    -- the service refused the exchanged token (revoked, or its keys rotated): once, a fresh one
    x.reexchanged = true
    identity.forget(x.ctx, up)
    return identity.prepare(x.ctx, x, up, x.go)
  end
  local retry = spec.retry
  local retryable = retry and x.attempts < retry.attempts and
    (outcome == "refused" or outcome == "connect_timeout" or outcome == "tls" or
     (outcome == "reset" and (http_status or 0) == 0) or
     (outcome == "ok" and retry.on[http_status]))
  if retryable then
    -- the retry budget: retries may add at most budget_percent of the upstream's active calls
    local policy = upstreams[spec.upstream].retry or {}
    local allowed = math.max(policy.min_retries or 3, (policy.budget_percent or 20) / 100 * u.active)
    if not x.retrying and u.retries_active + 1 > allowed then
      u.stats.retries_denied = u.stats.retries_denied + 1
      return finish_exchange(x, r)
    end
    local base = retry.backoff_ms * 2 ^ (x.attempts - 1)
    local backoff = base / 2 + core.random() * base / 2 -- jittered: between half and all of base
    local _, remaining = now_remaining(x.ctx)
    if remaining - backoff >= math.min(spec.timeout_ms, 10) then
      if not x.retrying then
        x.retrying = true
        u.retries_active = u.retries_active + 1
      end
      u.stats.retries = u.stats.retries + 1
      x.last = r
      x.retry_timer = set_timer(backoff, function()
        x.retry_timer = nil
        if not x.done then attempt(x, false) end
      end)
      return
    end
  end
  finish_exchange(x, r)
end

-- An attempt of exchange x ended (rec: what was sent; the rest: the transport's answer).
local function attempt_done(x, rec, outcome, http_status, headers, body, data, ms, detail)
  active_del(x, rec.id)
  if x.done then return end
  local r = make_result(x, outcome, http_status, headers, body, data, ms, detail)
  if r.ok then
    if rec.hedge then x.u.stats.hedges_won = x.u.stats.hedges_won + 1 end
    sample_latency(x.u, ms)
    return finish_exchange(x, r)
  end
  after_failure(x, r, outcome, http_status)
end

-- Hands a transport answer to the breaker, then to the attempt (or every attempt sharing it).
local function answer(rec, outcome, http_status, headers, body, data, ms, detail)
  local spec = rec.x -- the exchange is its own normalized spec
  local b = breaker_of(spec)
  if b then
    local changed = b:report(breaker_verdict(outcome, http_status, rec.clamped, type(data) == "string"),
                             rec.probe, core.now())
    if changed then
      core.log("warn", ("circuit breaker of upstream %s is now %s"):format(spec.upstream, changed))
      if changed == "open" then
        local u = upstream_state(spec.upstream)
        u.stats.breaker_opened = u.stats.breaker_opened + 1
      end
    end
  end
  local f = rec.flight
  if f then
    flights[f.key] = nil
    for x in pairs(f.waiters) do
      attempt_done(x, { id = f.id }, outcome, http_status, headers, body, data, ms, detail)
    end
  else
    attempt_done(rec.x, rec, outcome, http_status, headers, body, data, ms, detail)
  end
end

-- Starts an attempt of exchange x (hedge: the second copy of a slow first attempt).
attempt = function(x, hedge)
  local ctx, spec, u = x.ctx, x, x.u
  local now, remaining = now_remaining(ctx)
  local t = spec.timeout_ms
  local clamped = false
  if t > remaining then t, clamped = remaining, true end
  if t <= 0 then
    if active_any(x) then return end
    local r = new_result(x.key, spec)
    r.ms = 0
    return finish_exchange(x, x.last or fail(ctx, r, problem.for_outcome("deadline", x.key, spec.upstream), spec))
  end
  -- identical calls in flight share one transport call (not for hedges: they exist to go elsewhere)
  local key = not hedge and spec.collapse
  local f = key and flights[key]
  if f then
    f.waiters[x] = true
    f.n = f.n + 1
    x.a1 = { id = f.id, flight = f }
    u.stats.collapsed = u.stats.collapsed + 1
    if core.join then core.join(ctx.rid, f.id, x.key) end -- a span that waits on the shared call
    if t < f.ends - now then
      -- this caller has less time than the shared call: it stops waiting at its own timeout
      x.own_timer = set_timer(t, function()
        x.own_timer = nil
        local rec = active_get(x, f.id)
        if rec and not x.done then
          active_del(x, f.id)
          f.waiters[x] = nil
          f.n = f.n - 1
          attempt_done(x, { id = f.id }, "timeout", 0, nil, nil, nil, t, "no answer within " .. math.floor(t) .. " ms")
        end
      end)
    end
    return
  end
  local b = breaker_of(spec)
  local probe = false
  if b then
    local decision, retry_after = b:allow(now)
    if decision == "deny" then
      u.stats.breaker_denied = u.stats.breaker_denied + 1
      if active_any(x) then return end
      local r = new_result(x.key, spec)
      r.ms = 0
      local p = problem.new("circuit-open", ("%s: upstream %s is failing; calls are paused"):format(x.key, spec.upstream),
                            503, ("the circuit breaker is open; retry in %d s"):format(math.ceil(retry_after / 1000)))
      r.retry_after = math.max(1, math.ceil(retry_after / 1000))
      return finish_exchange(x, fail(ctx, r, p, spec))
    end
    probe = decision == "probe"
  end
  x.attempts = x.attempts + 1
  u.stats.attempts = u.stats.attempts + 1
  if hedge then u.stats.hedges = u.stats.hedges + 1 end
  -- (section, attempt number, hedge: the attempt's span; the transport adds its traceparent)
  local id = core.call(ctx.rid, upstreams[spec.upstream].index, spec.method, spec.path, spec.headers, spec.body,
                       math.floor(t + 0.5), spec.decode, x.key, x.attempts, hedge)
  -- the record of what was sent: for a first attempt or a retry, the exchange itself (one table
  -- less per call); a hedge, which runs beside it, gets a table of its own
  local rec
  if hedge then
    rec = { id = id, x = x, probe = probe, clamped = clamped, hedge = true }
  else
    rec = x
    x.id, x.probe, x.clamped, x.flight = id, probe, clamped, nil
  end
  if key then
    f = { id = id, key = key, waiters = { [x] = true }, n = 1, ends = now + t, probe = probe }
    flights[key] = f
    rec.flight = f
  end
  calls[id] = rec
  if hedge then x.a2 = rec else x.a1 = rec end
end

-- Starts the call of section key of group g (see deliver). The result may be delivered before
-- this returns (deadline passed, breaker open).
local function launch(x)
  local u = x.u
  attempt(x, false)
  local after = x.hedge_after
  if after and not x.done then
    if after == "p95" then after = p95(u) end
    if after then
      x.hedge_timer = set_timer(after, function()
        x.hedge_timer = nil
        if x.done or u.tokens < 1 or not active_any(x) then return end
        u.tokens = u.tokens - 1
        attempt(x, true)
      end)
    end
  end
end

local function start_call(ctx, key, spec, g, chain)
  local u = upstream_state(spec.upstream)
  spec.section = key
  -- the normalized spec is the exchange (its fields are all there, see agg.callspec), and the
  -- exchange is the record of its own first attempt (see attempt): one table per call
  local x = spec
  x.ctx, x.key, x.group, x.chain, x.u, x.x = ctx, key, g, chain or false, u, x
  -- the request's exchanges, newest first, for abandon_exchanges (finished ones stay linked
  -- until the request ends: no table per request for them)
  x.next_x = ctx.exchanges
  ctx.exchanges = x
  u.active = u.active + 1
  u.stats.calls = u.stats.calls + 1
  -- hedges may add about max_percent of the calls: each call earns a fraction of a token
  local hedge_policy = upstreams[spec.upstream].hedge
  local pct = hedge_policy and not hedge_policy.off and hedge_policy.max_percent or 0
  u.tokens = math.min(10, u.tokens + pct / 100)
  local up = upstreams[spec.upstream]
  if up.identity and x.identity then
    -- the user's identity first (agg.identity): a forwarded or exchanged token, or a problem
    x.go = function(p)
      if x.done then return end
      if p == nil then
        if x.reexchanged and x.attempts > 0 then return attempt(x, false) end
        return launch(x)
      end
      local r = new_result(x.key, x)
      r.ms = 0
      finish_exchange(x, fail(ctx, r, p, x))
    end
    return identity.prepare(ctx, x, up, x.go)
  end
  launch(x)
end

--- Transport completion of call id (see the header comment for the arguments).
-- data is a json ref (parsed body), a string (why the body is not valid JSON), or nil.
function M.on_call(id, outcome, http_status, headers, body, data, ms, detail)
  local rec = calls[id]
  if rec == nil then return end
  calls[id] = nil
  if rec.on_answer then return rec.on_answer(outcome, http_status, headers, body, data, ms, detail) end
  answer(rec, outcome, http_status, headers, body, data, ms, detail)
end

-- Stops every exchange of a request that ended or was abandoned.
local function abandon_exchanges(ctx)
  local x = ctx.exchanges
  ctx.exchanges = false
  while x do
    local next_x = x.next_x
    x.next_x = false
    if not x.done then
      x.done = true
      clear_timer(x.retry_timer)
      clear_timer(x.hedge_timer)
      clear_timer(x.own_timer)
      M.abandon_attempts(x)
      x.u.active = x.u.active - 1
      if x.retrying then x.u.retries_active = x.u.retries_active - 1 end
      -- as in finish_exchange: an earlier failed result keeps x as its info (no way back to it)
      x.ctx, x.group, x.chain, x.last = false, false, false, false
    end
    x = next_x
  end
end

local is_then

-- A group is one fan-out: the calls of one fetch_all, or the specs a continuation returned.
-- It completes when every member has settled; then it resumes its coroutine or calls on_complete.
settle = function(g, key, r)
  if g.results[key] ~= nil then return end
  g.results[key] = r
  g.pending = g.pending - 1
  local thens = g.thens
  for i = 1, #thens do
    local t = thens[i]
    if not t.started then
      local ready = true
      for j = 1, #t.deps do
        if g.results[t.deps[j]] == nil then ready = false break end
      end
      if ready then
        t.started = true
        local args = {}
        for j = 1, #t.deps do args[j] = g.results[t.deps[j]] end
        M.run_then(g, t.key, t.info, args)
      end
    end
  end
  if g.pending == 0 then
    if g.waiting then
      g.waiting = false
      resume(g.co)
    elseif g.on_complete then
      local f = g.on_complete
      g.on_complete = nil
      f(g.results)
    end
  end
end

local function key_less(a, b)
  local ta, tb = type(a), type(b)
  if ta ~= tb then return ta < tb end
  return a < b
end

--- Sorts keys[1..n] (strings and numbers; numbers first) in place: the fixed order of sections
-- and calls (agg.page uses it too). Insertion sort for a handful of keys: table.sort with a Lua
-- comparator costs a C-to-Lua call per comparison that the JIT cannot compile.
function M.sort_keys(keys, n)
  if n > 32 then
    table.sort(keys, key_less)
    return
  end
  for i = 2, n do
    local k, j = keys[i], i - 1
    while j > 0 and key_less(k, keys[j]) do
      keys[j + 1] = keys[j]
      j = j - 1
    end
    keys[j + 1] = k
  end
end

-- Keys of t in a fixed order, so the same table always starts its calls in the same order.
-- room: array slots to make (the caller may keep more than the keys in it)
local function sorted_keys(t, room)
  local keys, n = new_tab(room or 4, 0), 0
  for k in pairs(t) do n = n + 1; keys[n] = k end
  M.sort_keys(keys, n)
  return keys
end

-- Combines the results of a nested fan-out into one section result.
local function combine(ctx, section, results, list, opts)
  local r = new_result(section, opts)
  local data = list and json.array() or {}
  local first_err
  local keys = sorted_keys(results)
  local ms = 0
  for _, k in ipairs(keys) do
    local sub = results[k]
    if sub.status == "skipped" then
      -- nothing to add
    elseif sub.ok or sub.status == "fallback" then
      local d = sub.data
      if d == nil then d = json.null end
      data[k] = d
    else
      data[k] = json.null
      first_err = first_err or sub.error
    end
    if (sub.ms or 0) > ms then ms = sub.ms end
  end
  r.ms = ms
  if first_err then
    return fail(ctx, r, first_err, opts)
  end
  r.ok, r.status, r.data = true, "ok", data
  return r
end

local NO_THENS = {}

local function start_group(ctx, tbl, level)
  local g = { ctx = ctx, results = new_tab(0, 4), pending = 0, thens = NO_THENS, waiting = false }
  -- calls to start, in key order (a chain's spec carries it in spec.chain):
  -- keys[1..n] the calls' keys, keys[nk + 1 .. nk + n] their normalized specs (one table)
  local keys = sorted_keys(tbl, 8)
  local nk, n = #keys, 0
  for i = 1, nk do
    local key = keys[i]
    local v = tbl[key]
    local info = is_then(v)
    if info then
      if type(info.dep) == "string" or (type(info.dep) == "table" and not callspec.is_spec(info.dep)) then
        local deps = type(info.dep) == "string" and { info.dep } or info.dep
        for _, d in ipairs(deps) do
          if tbl[d] == nil then
            error(("fetch_then for '%s' depends on '%s', which is not a call in this fetch_all"):format(tostring(key), tostring(d)), level)
          end
          if d == key then error(("fetch_then for '%s' depends on itself"):format(tostring(key)), level) end
        end
        if g.thens == NO_THENS then g.thens = {} end
        g.thens[#g.thens + 1] = { key = key, deps = deps, info = info, started = false }
      else
        -- a chain with a call spec of its own as its dependency
        n = n + 1
        local spec = callspec.normalize(info.dep, upstreams, level)
        spec.chain = info
        keys[n], keys[nk + n] = key, spec
      end
    else
      n = n + 1
      keys[n], keys[nk + n] = key, callspec.normalize(v, upstreams, level)
    end
    g.pending = g.pending + 1
  end
  -- a dependency cycle would never settle: refuse it up front
  for _, t in ipairs(g.thens) do
    local seen, stack = {}, { t.key }
    while #stack > 0 do
      local k = table.remove(stack)
      for _, o in ipairs(g.thens) do
        if o.key == k then
          for _, d in ipairs(o.deps) do
            if d == t.key then error(("fetch_then dependency cycle through '%s'"):format(tostring(t.key)), level) end
            if not seen[d] then seen[d] = true; stack[#stack + 1] = d end
          end
        end
      end
    end
  end
  for i = 1, n do
    local spec = keys[nk + i]
    start_call(ctx, keys[i], spec, g, spec.chain or nil)
  end
  return g
end

-- level: the error() level of the script line that called the agg function, counted from the
-- caller of current_ctx (2 = that caller's caller).
local function current_ctx(fname, level)
  level = (level or 2) + 1
  local co = coroutine.running()
  local ctx = co and ctx_of[co]
  if not ctx then
    error(fname .. " can only be called while a request is being handled (inside a handler)", level)
  end
  if not coroutine.isyieldable() then
    error(fname .. " cannot wait here: it was called from inside a C function that cannot yield " ..
          "(a table.sort comparator, a string.gsub callback, …); move the call out of it", level)
  end
  if ctx.done then error(fname .. ": the request has already ended", level) end
  return ctx, co
end

-- fetch_all for the script line `level` levels up from here, as error() counts (2 = the caller).
local function fetch_all_at(tbl, fname, level)
  local ctx, co = current_ctx(fname, level + 1)
  if type(tbl) ~= "table" then error(fname .. " expects a table of call specs", level + 1) end
  local g = start_group(ctx, tbl, level + 2)
  g.co = co
  while g.pending > 0 do
    g.waiting = true
    waiting[co] = true
    coroutine.yield()
    waiting[co] = nil
  end
  return g.results
end

--- agg.fetch_all (see agg/init.lua for the user documentation).
function M.fetch_all(tbl)
  return (fetch_all_at(tbl, "agg.fetch_all", 2))
end

--- agg.fetch (see agg/init.lua): one call on its own; errors point at the script's line. It has no
-- section key of its own, so its problems, span and Server-Timing entry are named after the
-- upstream ("reviews did not answer in time"), not after a placeholder.
function M.fetch(spec)
  if type(spec) ~= "table" then error("agg.fetch expects a call spec", 2) end
  local key = type(spec[1]) == "string" and spec[1] or "result"
  return fetch_all_at({ [key] = spec }, "agg.fetch", 2)[key]
end

-- Runs a continuation for section key of group g with the dependency results args.
function M.run_then(g, key, info, args)
  local ctx = g.ctx
  for i = 1, #args do
    local d = args[i]
    if not d.ok then
      local deps = type(info.dep) == "table" and not callspec.is_spec(info.dep) and info.dep or { info.dep }
      local depname = callspec.is_spec(info.dep) and info.dep[1] or tostring(deps[i])
      local r = new_result(key, info.opts)
      r.ms = 0
      settle(g, key, fail(ctx, r, problem.dependency_failed(tostring(key), depname, d.error), info.opts))
      return
    end
  end
  local co = coroutine.create(info.fn)
  ctx_of[co] = ctx
  finishers[co] = function(ok, v)
    if ctx.done then return end
    if not ok then
      log_error(ctx, "continuation of " .. tostring(key), v, co)
      settle(g, key, fail(ctx, new_result(key, info.opts), problem.script_error(tostring(key)), info.opts))
      return
    end
    M.settle_value(g, key, v, info.opts)
  end
  resume(co, unpack(args, 1, #args))
end

-- Settles section key of g with what a continuation returned: nil (section skipped), a call spec,
-- another chain, a table of specs (nested fan-out), or a plain computed value.
function M.settle_value(g, key, v, opts)
  local ctx = g.ctx
  opts = opts or {}
  if v == nil then
    local r = new_result(key, opts)
    r.ok, r.status, r.ms = true, "skipped", 0
    settle(g, key, r)
    return
  end
  local ok, err = pcall(function()
    if callspec.is_spec(v) then
      local spec = callspec.normalize(v, upstreams, 2)
      if opts.required then spec.required = true end
      if opts.fallback ~= nil and spec.fallback == nil then
        spec.fallback = opts.fallback
      end
      start_call(ctx, key, spec, g, nil)
      return
    end
    local info = is_then(v)
    if info then
      local sub = start_group(ctx, { [key] = v }, 2)
      sub.on_complete = function(res) settle(g, key, res[key]) end
      if sub.pending == 0 then sub.on_complete(sub.results) end
      return
    end
    if type(v) == "table" and getmetatable(v) == nil and next(v) ~= nil then
      local all = true
      for _, s in pairs(v) do
        if not (callspec.is_spec(s) or is_then(s)) then all = false break end
      end
      if all then
        local list = #v > 0
        local sub = start_group(ctx, v, 2)
        sub.on_complete = function(res) settle(g, key, combine(ctx, key, res, list, opts)) end
        if sub.pending == 0 then sub.on_complete(sub.results) end
        return
      end
    end
    local r = new_result(key, opts)
    r.ok, r.status, r.data, r.ms = true, "ok", v, 0
    settle(g, key, r)
  end)
  if not ok then
    log_error(ctx, "continuation of " .. tostring(key), err)
    settle(g, key, fail(ctx, new_result(key, opts), problem.script_error(tostring(key)), opts))
  end
end

-- fetch_then markers: a chain to run inside fetch_all, or, when its dependency is a call spec of
-- its own, on its own the moment a field of it is read.
local then_mt = {
  __index = function(m, k)
    local r = then_resolved[m]
    if r == nil then
      local info = then_info[m]
      if not callspec.is_spec(info.dep) then
        error("agg.fetch_then(" .. tostring(info.dep) .. ", …) names sibling calls: use it inside agg.fetch_all", 2)
      end
      r = fetch_all_at({ [info.dep[1]] = m }, "agg.fetch_then", 2)[info.dep[1]]
      then_resolved[m] = r
    end
    return r[k]
  end,
}

is_then = function(v)
  if type(v) == "table" then return then_info[v] end
  return nil
end

--- For agg.page: runs, together in one fan-out, every standalone fetch_then chain among the
-- values of results that nothing has read yet (a chain put into the results table directly,
-- agg.page { r = agg.fetch_then({ "product", "/p/1" }, fn) }), so each stands for its result.
-- level: error() level of the script line that called agg.page, counted from here.
function M.resolve_thens(results, level)
  local pending
  for k, v in pairs(results) do
    local info = is_then(v)
    if info and then_resolved[v] == nil then
      if not callspec.is_spec(info.dep) then
        error(("agg.page: section '%s' is an agg.fetch_then that names sibling calls; use it inside agg.fetch_all")
              :format(tostring(k)), level)
      end
      pending = pending or {}
      pending[k] = v
    end
  end
  if pending then
    local res = fetch_all_at(pending, "agg.page", level)
    for k, m in pairs(pending) do then_resolved[m] = res[k] end
  end
end

--- The result a standalone fetch_then chain stands for once it ran (see resolve_thens), or v.
function M.then_result(v)
  if is_then(v) then return then_resolved[v] end
  return v
end

--- agg.fetch_then (see agg/init.lua for the user documentation).
function M.fetch_then(dep, fn, opts)
  local td = type(dep)
  if td ~= "string" and td ~= "table" then
    error("agg.fetch_then: the dependency must be a sibling key, a list of keys or a call spec", 2)
  end
  if td == "table" and not callspec.is_spec(dep) then
    if #dep == 0 then error("agg.fetch_then: the list of dependencies is empty", 2) end
    for _, d in ipairs(dep) do
      if type(d) ~= "string" then error("agg.fetch_then: dependency keys must be strings", 2) end
    end
  end
  if type(fn) ~= "function" then error("agg.fetch_then: the second argument must be a function", 2) end
  if opts ~= nil and type(opts) ~= "table" then error("agg.fetch_then: options must be a table", 2) end
  local o = opts or {}
  for k in pairs(o) do
    if k ~= "required" and k ~= "fallback" then
      error("agg.fetch_then: unknown option '" .. tostring(k) .. "' (required, fallback)", 2)
    end
  end
  local m = setmetatable({}, then_mt)
  then_info[m] = { dep = dep, fn = fn,
                   opts = { required = o.required == true, fallback = o.fallback,
                            decode = true } }
  return m
end

local timing_names = setmetatable({}, { __index = function(t, k)
  local name = tostring(k):gsub("[^%w_%-]", "_")
  t[k] = name
  return name
end })

-- ";dur=<whole ms>" strings, made once: turning a number into a string is the costly part of
-- the header (the first 10 s of durations are kept; longer ones are rare and made each time)
local dur_whole = setmetatable({}, { __index = function(t, k)
  local s = ";dur=" .. k
  if k < 10000 then t[k] = s end
  return s
end })
local DUR_TENTH = { [0] = ".0", ".1", ".2", ".3", ".4", ".5", ".6", ".7", ".8", ".9" }

local function server_timing(ctx)
  local t = ctx.timings
  local parts = new_tab(#t / 2, 0)
  for i = 1, #t, 2 do
    local name = timing_names[t[i]]
    local tenths = math.floor(t[i + 1] * 10 + 0.5)
    parts[#parts + 1] = name .. dur_whole[math.floor(tenths / 10)] .. DUR_TENTH[tenths % 10]
  end
  return table.concat(parts, ", ")
end

-- headers: name -> value in any case (the transport lowercases names, drops invalid ones, and adds
-- default_type as content-type unless one is there).
local function send(ctx, status, headers, body, is_json, default_type)
  local timing = #ctx.timings > 0 and server_timing(ctx) or nil
  return core.respond(ctx.rid, status, headers, body, is_json, default_type, timing)
end

local PROBLEM_HEADERS = { ["cache-control"] = "no-store" }

local function send_problem(ctx, p)
  send(ctx, p.status, PROBLEM_HEADERS, p, true, "application/problem+json")
end

-- status, headers, json and (without json) body of a handler's response
local function response_fields(resp)
  if type(resp) ~= "table" then return nil end
  local json_v = resp.json
  return resp.status, resp.headers, json_v, json_v == nil and resp.body or nil
end

finish_request = function(ctx, ok, resp, co)
  if ctx.done then return end
  ctx.done = true
  ctx_of[ctx.co] = nil -- ctx leads back to its coroutine: a weak-keyed entry would never go
  -- and ctx must not lead to it any more either: req_lazy[req] = ctx, and a coroutine that is
  -- not pooled (more requests at once than POOL_MAX) still holds req while it waits; a value
  -- that reaches its own weak key keeps the entry for ever (Lua 5.1 has no ephemerons)
  ctx.co = false
  contexts[ctx.rid] = nil
  abandon_exchanges(ctx)
  if not ok then
    log_error(ctx, nil, resp, co)
    return send_problem(ctx, problem.script_error(nil))
  end
  -- the response's fields may run the script's metamethods, here on the runtime's own thread:
  -- an error (or the script time limit's stop) there must not leave the request unanswered
  local read, st, headers, rjson, body = pcall(response_fields, resp)
  if not read then
    log_error(ctx, nil, st)
    return send_problem(ctx, problem.script_error(nil))
  end
  if type(st) ~= "number" or st < 200 or st > 599 or st % 1 ~= 0 then
    log_error(ctx, nil, "the handler must return agg.page(results) or { status = <200..599>, json = … | body = … }")
    return send_problem(ctx, problem.script_error(nil))
  end
  if headers ~= nil and type(headers) ~= "table" then
    log_error(ctx, nil, "response headers must be a table")
    return send_problem(ctx, problem.script_error(nil))
  end
  if rjson ~= nil then
    local sent, err = send(ctx, st, headers, rjson, true, "application/json")
    if sent == nil and err then
      log_error(ctx, nil, "the response cannot be encoded as JSON: " .. tostring(err))
      return send_problem(ctx, problem.new("response-encoding", "the page could not be encoded as JSON", 500,
                                           "the error was logged by the gateway"))
    end
    return
  end
  if body ~= nil and type(body) ~= "string" then
    log_error(ctx, nil, "response body must be a string (use json = … for tables)")
    return send_problem(ctx, problem.script_error(nil))
  end
  send(ctx, st, headers, body or "", false, body and "text/plain; charset=utf-8" or nil)
end

local function parse_query(q)
  local t = {}
  if q == nil or q == "" then return t end
  for pair in q:gmatch("[^&]+") do
    local k, v = pair:match("^([^=]*)=?(.*)$")
    k = k:gsub("+", " "):gsub("%%(%x%x)", function(h) return string.char(tonumber(h, 16)) end)
    v = v:gsub("+", " "):gsub("%%(%x%x)", function(h) return string.char(tonumber(h, 16)) end)
    local cur = t[k]
    if cur == nil then t[k] = v
    elseif type(cur) == "table" then cur[#cur + 1] = v
    else t[k] = { cur, v } end
  end
  return t
end

-- req.query, req.headers, req.json, req.remaining_ms and req.trace_id are built on first read: most pages
-- never read most of them.
local req_lazy = setmetatable({}, { __mode = "k" })   -- req -> its ctx (which keeps query, req_headers)

-- req.user: the authenticated user (nil on an open endpoint), read-only to scripts; its claims
-- and scopes are made when first read (agg.identity)
local user_mt_newindex = function(_, k)
  error("req.user is read-only (tried to set '" .. tostring(k) .. "')", 2)
end
local function user_index(u)
  return function(_, k)
    if k == "claims" then return identity.claims(u) end
    if k == "scopes" then return identity.scopes(u) end
    if k == "claims_ref" then return nil end
    return u[k]
  end
end
readonly_user = function(u)
  return setmetatable({}, { __index = user_index(u), __newindex = user_mt_newindex, __metatable = "req.user" })
end

local function parse_headers_table(h)
  if type(h) == "string" then return parse_headers(h) end
  return h or {}
end

local req_mt = {
  __index = function(r, k)
    local lazy = req_lazy[r] -- the request's ctx
    local v
    if k == "json" then
      local body = rawget(r, "body")
      if body and body ~= "" then v = json.decode(body) end
    elseif k == "query" then
      v = parse_query(lazy and lazy.query)
    elseif k == "headers" then
      v = parse_headers_table(lazy and lazy.req_headers)
    elseif k == "user" then
      v = lazy and lazy.user and readonly_user(lazy.user) or nil
    elseif k == "trace_id" then
      v = lazy and core.trace_id and core.trace_id(lazy.rid)
    elseif k == "remaining_ms" then
      local ctx = lazy
      v = function()
        local left = ctx and (ctx.deadline - core.now()) or 0
        return left > 0 and left or 0
      end
    else
      return nil
    end
    rawset(r, k, v)
    return v
  end,
}

--- Starts request rid for endpoint index idx. Called by the transport.
-- params: table of route parameters; query: the raw query string or nil; headers: lowercased
-- name -> value, or the same as one string "name\0value\0…"; body: string or nil.
function M.start(rid, idx, method, path, query, params, headers, body, user, token)
  local ep = endpoints[idx]
  local now = core.now()
  -- exchanges: the first of its calls' exchanges, linked through x.next_x (see start_call)
  -- user, token: who the edge authenticated (gateway/edge/edge.h), for agg.identity
  local ctx = { rid = rid, ep = ep, started = now, deadline = now + ep.deadline_ms,
                exchanges = false, timings = new_tab(8, 0), done = false, co = false,
                query = query, req_headers = headers, user = user or false, token = token or false }
  contexts[rid] = ctx
  local req = setmetatable({ method = method, path = path, params = params, body = body, route = ep.route },
                          req_mt)
  req_lazy[req] = ctx
  local co
  if pool_n > 0 then
    co = pool[pool_n]
    pool[pool_n] = nil
    pool_n = pool_n - 1
  else
    co = coroutine.create(handler_body)
  end
  ctx_of[co] = ctx
  ctx.co = co
  resume(co, ep.handler, req)
end

--- The client of request rid went away: cancel its calls and forget it.
function M.abort(rid)
  local ctx = contexts[rid]
  if not ctx then return end
  ctx.done = true
  contexts[rid] = nil
  ctx_of[ctx.co] = nil -- its coroutine is never resumed: let it be collected
  ctx.co = false        -- (as in finish_request: the abandoned coroutine still holds req)
  abandon_exchanges(ctx)
end

--- Number of requests in progress and calls in flight (for tests and metrics).
function M.stats()
  local r, c = 0, 0
  for _ in pairs(contexts) do r = r + 1 end
  for _ in pairs(calls) do c = c + 1 end
  return r, c
end

return M
