-- agg.exchange: a section's call. A call is an exchange: one or more attempts (the first,
-- retries, a hedge) that end in one result. Each attempt passes the upstream's circuit breaker,
-- and identical GET calls in flight at the same moment share one transport call (single-flight).
-- Per worker, per upstream: the retry budget, the hedge budget and the latency sample for "p95"
-- (docs/operations.md "Resilience"). The result goes to whoever started the call (agg.fanout, through the
-- deliver function it registers).
local problem = require "agg.problem"
local result = require "agg.result"
local merge = require "agg.merge"
local cache = require "agg.cache"
local json = require "agg.json"
local identity = require "agg.identity"
local group = require "agg.group"
local health = require "agg.health"
local slot = require("agg.contract").slot
local ffi = require "ffi"
local quiet_word = require("agg.breaker").quiet_word

local M = {}

local new_result, fail, result_of_call = result.new, result.fail, result.of_call
local log_call_failure = result.log_call_failure

local core                                             -- transport and clock
local upstreams = {}                                   -- name -> { index, timeout_ms }
local calls = {}          -- contract.slot(id) -> the in-flight record of call id (record.id == id)
local deliver                                          -- function(g, key, chain, r): agg.fanout's
local ustate = {}     -- upstream name -> { active, retries_active, tokens, lat, n, p95, stats, budget, group }
-- core.breakers (kept here so the breakers outlive the words read below), and upstream index -> its
-- breaker's quiet word (upstream/breaker.h: 1 while off or closed with no failure counted), read
-- through the FFI: a call to a healthy upstream crosses into C for neither allow nor report
local breakers, quiet = nil, {}
local QUIET_T = ffi.typeof("const volatile int *")

local merge_hooks -- agg.merge's way back into the exchange (below)

-- Keeps rec (whose id is id) as the record of call id in flight.
local function put_call(id, rec)
  calls[slot(id)] = rec
end

-- The record of call id in flight, forgotten; nil when there is none (the call ended, or was
-- forgotten before).
local function take_call(id)
  local s = slot(id)
  local rec = calls[s]
  if rec == nil or rec.id ~= id then return nil end
  calls[s] = nil
  return rec
end

--- Binds the transport and the upstream table (agg.runtime.init); calls of a previous binding are
-- forgotten.
function M.bind(transport, ups, token_exchange)
  core, upstreams = transport, ups
  calls, ustate = {}, {}
  breakers, quiet = transport.breakers, {}
  for i, b in pairs(breakers or quiet) do quiet[i] = ffi.cast(QUIET_T, quiet_word(b)) end
  group.bind(transport, ups)
  -- a health probe is an internal call: its answer goes to the prober, not to a section
  health.bind(transport, ups, { register_call = function(id, fn) put_call(id, { id = id, on_answer = fn }) end })
  cache.init(transport)
  identity.init(transport, token_exchange, {
    set_timer = function(ms, fn) return M.set_timer(ms, fn) end,
    clear_timer = function(id) return M.clear_timer(id) end,
    -- an internal call (the token endpoint): its answer goes to fn, not to a section
    register_call = function(id, fn) put_call(id, { id = id, on_answer = fn }) end,
    -- the Server-Timing entry of the token endpoint's call on a page that waited for it
    add_timing = function(ctx, name, ms) return M.add_timing(ctx, name, ms) end,
  })
  merge.bind(transport, ups, merge_hooks)
end

--- Sets where results go: deliver(g, key, chain, r) (agg.fanout).
function M.set_deliver(f) deliver = f end

--- Number of calls in flight.
function M.calls_in_flight()
  local c = 0
  for _ in pairs(calls) do c = c + 1 end
  return c
end

local function now_remaining(ctx)
  local now = core.now()
  return now, ctx.deadline - now
end

---------------------------------------------------------------------------------------------------

local flights = {}    -- collapse key -> flight { id, waiters = { exchange = true }, n }
local timers = {}     -- timer id -> function

-- A count over a sliding window of len ms, approximated by the current and the previous interval
-- (the previous one weighted by how much of it is still inside the window).
local function window(len) return { len = len, start = 0, cur = 0, prev = 0 } end

local function window_count(w, now)
  local d = now - w.start
  if d >= w.len then
    if d >= 2 * w.len then w.prev, w.start = 0, now else w.prev, w.start = w.cur, w.start + w.len end
    w.cur = 0
    d = now - w.start
  end
  return w.cur + w.prev * (1 - d / w.len)
end

-- The retry budget of the Gateway API (XBackendTrafficPolicy retryConstraint): retries may be
-- at most budget.percent of the upstream's requests over budget.interval_s, every retry of a
-- request counting; min_retry_rate.count retries per min_retry_rate.interval_s are allowed
-- whatever the share.
local function new_budget(policy)
  local b, m = policy and policy.budget or {}, policy and policy.min_retry_rate or {}
  return { percent = b.percent or 20, requests = window((b.interval_s or 10) * 1000),
           retries = window((b.interval_s or 10) * 1000), min_count = m.count or 10,
           min_retries = window((m.interval_s or 1) * 1000) }
end

local function budget_allows(b, now)
  return window_count(b.retries, now) + 1 <= b.percent / 100 * window_count(b.requests, now) or
         window_count(b.min_retries, now) + 1 <= b.min_count
end

local function upstream_state(name)
  local u = ustate[name]
  if not u then
    local up = upstreams[name]
    u = { active = 0, retries_active = 0, tokens = 1, lat = {}, n = 0, p95 = nil, p95_n = 0,
          budget = new_budget(up and up.retry),
          group = up and group.balanced(name) or false,
          stats = { calls = 0, attempts = 0, retries = 0, retries_denied = 0, hedges = 0, hedges_won = 0,
                    collapsed = 0, breaker_denied = 0, breaker_opened = 0 } }
    ustate[name] = u
  end
  return u
end

--- Counters of upstream name in this worker (for specs and metrics).
function M.upstream_stats(name) return upstream_state(name).stats end

--- agg.runtime.compact's part: the in-flight calls, timers and single-flight flights tables made
-- again (fresh(t): t, or a new table like it with its entries, sized for them).
function M.compact(fresh)
  calls, timers, flights = fresh(calls), fresh(timers), fresh(flights)
end

--- Hands each upstream's counters to core.upstream_counters(index, counters), when the transport
-- has it (the C worker calls this once a second and publishes them as metrics; nothing is counted
-- twice: the values are totals). counters: the upstream's stats table, whose retries,
-- retries_denied, hedges, hedges_won and collapsed agg.contract names. current: true when this
-- VM's generation is the one new requests go to; only then do groups follow the re-resolved
-- addresses (agg.group.sync) and are endpoints health checked (agg.health), so a retired
-- generation stops probing.
function M.report_stats(current)
  if current then
    group.sync()
    health.tick()
  end
  group.report_stats()
  if core and core.cache_counters then core.cache_counters(cache.stats) end
  local report = core and core.upstream_counters
  if not report then return end
  for name, u in pairs(ustate) do
    local up = upstreams[name]
    if up then
      report(up.index, u.stats)
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

-- statuses: the upstream's failure_statuses (status -> true), or false for every 5xx. An answer
-- with another status is the upstream answering: a success for the breaker and the endpoint.
local function breaker_verdict(outcome, http_status, clamped, bad_json, statuses)
  if outcome == "ok" then
    if bad_json then return "failure" end
    if statuses then return statuses[http_status] and "failure" or "success" end
    if http_status >= 500 then return "failure" end
    return "success"
  end
  if BREAKER_FAILURES[outcome] then return "failure" end
  if outcome == "timeout" and not clamped then return "failure" end
  return "ignore" -- the gateway's own deadline, cancellation, overload of our pool
end

local function breaker_of(spec)
  return breakers and breakers[upstreams[spec.upstream].index] or nil
end

-- True when spec's upstream's breaker is quiet (its word, read without a call into C) or there is
-- none: allow would answer "allow", and a report neither of a failure nor of a probe would change
-- nothing, so neither is made.
local function breaker_quiet(spec)
  local q = quiet[upstreams[spec.upstream].index]
  return q == nil or q[0] ~= 0
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
                             headers = headers }, result_of_call(spec))
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
    log_call_failure(ctx, key, spec.upstream, "the body is not valid JSON: " .. tostring(data))
    fail(ctx, r, problem.for_outcome("bad_json", key, spec.upstream), spec)
  elseif outcome == "ok" then
    fail(ctx, r, problem.for_http_status(http_status, key, spec.upstream), spec)
  else
    -- what the transport said (address, errno text, TLS reason) is for the log only (agg.problem)
    if outcome ~= "cancelled" then
      local said = detail or outcome
      -- (a call the page's deadline cut: the limit that passed was the deadline's, not its
      -- timeout_ms; a fresh user's trial read "no response within 59 ms" for a 150 ms call)
      if outcome == "timeout" and x.clamped then said = said .. " (the page's deadline cut the call's timeout)" end
      log_call_failure(ctx, key, spec.upstream, said)
    end
    fail(ctx, r, problem.for_outcome(outcome, key, spec.upstream), spec)
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

-- What an ended exchange x no longer needs goes: its request, its group, its chain's step and an
-- earlier failed result (x lives on as the info of its result, its metatable's, for as long as a
-- script keeps the result). chain and last are cleared only when set: a plain call's table has no
-- slot for them (see agg.callspec).
local function let_go(x)
  x.ctx, x.group = false, false
  if x.chain then x.chain = false end
  if x.last then x.last = false end
end

-- Appends section key's Server-Timing entry (ms) to ctx's list (agg.runtime start) with the cache
-- outcome agg.cache noted for the key's call, if any, kept by entry: a chain's later call under the
-- same key, uncached, showed the earlier call's desc="hit" (a fresh user's trial).
local BY_ENTRY = cache.BY_ENTRY
local function add_timing(ctx, key, ms)
  local nt = #ctx
  ctx[nt + 1] = key
  ctx[nt + 2] = ms
  local d = ctx.cache_desc
  local what = d and d[key]
  if what then
    d[key] = nil
    local by = d[BY_ENTRY]
    if not by then by = {} d[BY_ENTRY] = by end
    by[nt + 1] = what
  end
end

M.add_timing = add_timing -- (for agg.identity)

-- Ends exchange x with result r: stops its other attempts and timers, then delivers r.
finish_exchange = function(x, r)
  if x.done then return end
  x.done = true
  if x.cache_key then r = cache.on_result(x, r) end -- stored, or the stale copy when it failed
  local ctx = x.ctx
  clear_timer(x.retry_timer)
  clear_timer(x.hedge_timer)
  clear_timer(x.own_timer)
  M.abandon_attempts(x)
  local u = x.u
  u.active = u.active - 1
  if x.retrying then u.retries_active = u.retries_active - 1 x.retrying = false end
  local g, chain = x.group, x.chain
  let_go(x)
  if ctx.done then return end
  add_timing(ctx, x.key, r.ms or 0)
  deliver(g, x.key, chain, r)
end

-- Cancels every attempt of x still in flight (leaving shared flights it waits on).
-- Cancels one attempt of x: closes its call, or leaves the shared call it waits on (closing it
-- when x was the last one waiting). A half-open probe that is cancelled gives its slot back.
local function abandon_one(x, rec)
  local id = rec.id
  local f = rec.flight
  if rec.merged then
    merge.leave(x, rec)
  elseif f then
    f.waiters[x] = nil
    f.n = f.n - 1
    if f.n == 0 then
      flights[f.key] = nil
      take_call(f.id)
      core.cancel(f.id)
      if f.probe then local b = breaker_of(x) if b then b:report("ignore", true, core.now()) end end
      if f.ep and x.u.group then group.release(x.u.group, f.ep) end
    end
    return
  else
    take_call(id)
    core.cancel(id)
    if rec.probe then local b = breaker_of(x) if b then b:report("ignore", true, core.now()) end end
  end
  if rec.endpoint and x.u.group then group.release(x.u.group, rec.endpoint) end
end

function M.abandon_attempts(x)
  local a1, a2 = x.a1, x.a2
  x.a1 = false
  if a2 then x.a2 = false end
  if a1 then abandon_one(x, a1) end
  if a2 then abandon_one(x, a2) end
end

-- The timers' closures are made in functions of their own: a function that makes a closure
-- cannot be compiled by LuaJIT (each of its returns closes upvalues, bytecode UCLO, which the JIT
-- does not compile), and attempt, launch and start_upstream run for every call (measured:
-- tools/bench/callgrind, docs/performance.md).

-- Exchange x tries again after backoff ms.
local function arm_retry(x, backoff)
  x.retry_timer = set_timer(backoff, function()
    x.retry_timer = nil
    if not x.done then attempt(x, false) end
  end)
end

-- Exchange x (upstream state u) sends a hedge after after ms, if it has no answer by then.
local function arm_hedge(x, u, after)
  x.hedge_timer = set_timer(after, function()
    x.hedge_timer = nil
    if x.done or u.tokens < 1 or not active_any(x) then return end
    u.tokens = u.tokens - 1
    attempt(x, true)
  end)
end

-- Decides what follows a failed attempt: wait for another attempt in flight, retry, or fail.
local function after_failure(x, r, outcome, http_status)
  -- the service refused the user's credential (a 401 or 403 to a call carrying the user's
  -- identity): no stale copy answers this call, whatever its other attempts end with (agg.cache;
  -- written only then: the call's table has no slot for it)
  if x.personal and outcome == "ok" and (http_status == 401 or http_status == 403) then x.credential_refused = true end
  if active_any(x) then
    x.last = r -- a hedge is still out: its answer may yet win
    return
  end
  local spec, u = x, x.u
  local up = upstreams[spec.upstream]
  if outcome == "ok" and http_status == 401 and up.identity == "exchange" and not x.anonymous and not x.reexchanged then
    -- the service refused the exchanged token (revoked, or its keys rotated): once, a fresh one
    x.reexchanged = true
    identity.forget(x.ctx, up)
    return identity.prepare(x.ctx, x, up, x.go)
  end
  local retry = spec.retry
  local retryable = retry and x.attempt < retry.attempts and
    (outcome == "refused" or outcome == "connect_timeout" or outcome == "tls" or
     (outcome == "reset" and (http_status or 0) == 0) or
     (outcome == "ok" and retry.on[http_status]))
  if retryable then
    local now = core.now()
    local b = u.budget
    if not budget_allows(b, now) then
      -- beyond the budget the retry is not sent and the call fails with 503 (Gateway API
      -- retryConstraint: "MUST return a 503")
      u.stats.retries_denied = u.stats.retries_denied + 1
      local d = new_result(x.key, spec)
      d.ms, d.headers, d.body, d.http_status = r.ms, r.headers, r.body, r.http_status
      return finish_exchange(x, fail(x.ctx, d, problem.retry_budget_exhausted(x.key, spec.upstream, r.error), spec))
    end
    b.retries.cur = b.retries.cur + 1
    b.min_retries.cur = b.min_retries.cur + 1
    local base = retry.backoff_ms * 2 ^ (x.attempt - 1)
    local backoff = base / 2 + core.random() * base / 2 -- jittered: between half and all of base
    local _, remaining = now_remaining(x.ctx)
    if remaining - backoff >= math.min(spec.timeout_ms, 10) then
      if not x.retrying then
        x.retrying = true
        u.retries_active = u.retries_active + 1
      end
      u.stats.retries = u.stats.retries + 1
      x.last = r
      arm_retry(x, backoff)
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
local function on_answer(rec, outcome, http_status, headers, body, data, ms, detail)
  local spec = rec.x or rec -- the exchange is its own normalized spec, and its first attempt
  local up = upstreams[spec.upstream]
  local verdict = breaker_verdict(outcome, http_status, rec.clamped, type(data) == "string",
                                  up and up.failure_statuses)
  local grp = spec.u.group
  if grp then
    local ep = rec.flight and rec.flight.ep or rec.endpoint
    if ep then
      group.release(grp, ep)
      verdict = group.report(grp, ep, verdict, ms) -- one endpoint failing is not the upstream failing
    end
  end
  local b = (verdict == "failure" or rec.probe or not breaker_quiet(spec)) and breaker_of(spec)
  if b then
    local changed = b:report(verdict, rec.probe, core.now())
    if changed then
      core.log("warn", ("circuit breaker of upstream %s is now %s"):format(spec.upstream, changed))
      if changed == "open" then
        local u = upstream_state(spec.upstream)
        u.stats.breaker_opened = u.stats.breaker_opened + 1
      end
    end
  end
  local f = rec.flight
  if rec.merged then
    merge.answer(rec, outcome, http_status, headers, body, data, ms, detail)
  elseif f then
    flights[f.key] = nil
    for x in pairs(f.waiters) do
      attempt_done(x, { id = f.id }, outcome, http_status, headers, body, data, ms, detail)
    end
  else
    attempt_done(spec, rec, outcome, http_status, headers, body, data, ms, detail)
  end
end

-- Exchange x, waiting on shared call f, stops waiting at its own timeout t (ms).
local function arm_own_timeout(x, f, t)
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
  if spec.batch then
    -- a merged call: the item waits in its batch (agg.merge), which passes the breaker once
    x.attempt = x.attempt + 1
    u.stats.attempts = u.stats.attempts + 1
    return merge.join(x, t, clamped, now)
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
    -- this caller has less time than the shared call: it stops waiting at its own timeout
    if t < f.ends - now then arm_own_timeout(x, f, t) end
    return
  end
  local b = not breaker_quiet(spec) and breaker_of(spec)
  local probe = false
  if b then
    local decision, retry_after = b:allow(now)
    if decision == "deny" then
      u.stats.breaker_denied = u.stats.breaker_denied + 1
      if active_any(x) then return end
      local r = new_result(x.key, spec)
      r.ms = 0
      local p = problem.new("circuit-open", problem.CIRCUIT_OPEN_TITLE, 503,
                            ("section %s, upstream %s: the circuit breaker is open; retry in %d s"):format(
                              tostring(x.key), spec.upstream, math.ceil(retry_after / 1000)))
      r.retry_after = math.max(1, math.ceil(retry_after / 1000))
      return finish_exchange(x, fail(ctx, r, p, spec))
    end
    probe = decision == "probe"
  end
  x.attempt = x.attempt + 1
  if x.attempt == 1 then -- a request, for the retry budget (its window rolled only when due)
    local rq = u.budget.requests
    if now - rq.start >= rq.len then window_count(rq, now) end
    rq.cur = rq.cur + 1
  end
  u.stats.attempts = u.stats.attempts + 1
  if hedge then u.stats.hedges = u.stats.hedges + 1 end
  -- the endpoint: a retry or a hedge goes to another one than the attempt it follows
  local grp, ep = u.group, nil
  if grp then
    ep = group.pick(grp, x, x.endpoint)
    group.hold(grp, ep)
  end
  -- the record of the attempt in flight: for a first attempt or a retry, the exchange itself (one
  -- table less per call); a hedge, which runs beside it, gets a table of its own
  local rec
  if hedge then
    rec = { id = false, x = x, probe = probe, clamped = clamped, hedge = true, flight = false, endpoint = ep }
  else
    rec = x
    if grp then x.endpoint = ep end
  end
  -- the span's section, attempt number and hedge flag, and a group's endpoint (agg.contract)
  local id = core.call(ctx.rid, upstreams[spec.upstream].index, spec.method, spec.path, spec.headers, spec.body,
                       math.floor(t + 0.5), spec.decode, x.key, x.attempt, hedge, ep)
  if hedge then
    rec.id = id
  else
    x.id, x.clamped, x.flight = id, clamped, false
    if probe or x.probe then x.probe = probe end -- (no slot for it until a call is a probe)
  end
  if key then
    f = { id = id, key = key, waiters = { [x] = true }, n = 1, ends = now + t, probe = probe, ep = ep }
    flights[key] = f
    rec.flight = f
  end
  put_call(id, rec)
  if hedge then x.a2 = rec else x.a1 = rec end
end

-- The exchange's part of merged calls (agg.merge): answers, breaker, timers, the calls table.
local function circuit_open(x, retry_after)
  local r = new_result(x.key, x)
  r.ms = 0
  local p = problem.new("circuit-open", problem.CIRCUIT_OPEN_TITLE, 503,
                        ("section %s, upstream %s: the circuit breaker is open; retry in %d s"):format(
                          tostring(x.key), x.upstream, math.ceil(retry_after / 1000)))
  r.retry_after = math.max(1, math.ceil(retry_after / 1000))
  return finish_exchange(x, fail(x.ctx, r, p, x))
end

merge_hooks = {
  done = function(x, rec, ...) return attempt_done(x, rec, ...) end,
  missing = function(x, rec, ms)
    active_del(x, rec.id)
    local r = new_result(x.key, x)
    r.ms = ms
    r.http_status = 404
    local p = problem.new("upstream-not-found", "the upstream's merged answer has no such item", 404,
                          ("section %s, upstream %s: item %s is not in the merged answer"):format(
                            tostring(x.key), x.upstream, x.batch.key))
    return finish_exchange(x, fail(x.ctx, r, p, x))
  end,
  deny = function(x, rec, retry_after)
    active_del(x, rec.id)
    local u = x.u
    u.stats.breaker_denied = u.stats.breaker_denied + 1
    return circuit_open(x, retry_after)
  end,
  script_error = function(x, what, err, recs)
    result.log_error(x.ctx, what, err)
    for _, rec in ipairs(recs) do
      local y = rec.x or rec
      if not y.done and y.a1 == rec then
        active_del(y, rec.id)
        local r = new_result(y.key, y)
        r.ms = 0
        finish_exchange(y, fail(y.ctx, r, problem.script_error(y.key), y))
      end
    end
  end,
  allow = function(p, now)
    local b = not breaker_quiet(p) and breaker_of(p)
    if not b then return "allow" end
    return b:allow(now)
  end,
  -- (what chooses x's endpoint: callers of one batch share it, agg.group.route)
  route = function(x)
    local grp = x.u.group
    return grp and group.route(grp, x) or ""
  end,
  pick = function(p, x)
    local grp = p.u.group
    if not grp then return nil end
    local ep = group.pick(grp, x, nil)
    group.hold(grp, ep)
    return ep
  end,
  -- whether merged call p went where its callers' route (above) sends them: a session's route
  -- ("s" .. id) names an endpoint the balancer passes over while it is out of service
  went_on_route = function(p)
    local route = p.route or ""
    if route:sub(1, 1) ~= "s" then return true end
    local grp = p.u.group
    local ep = grp and p.endpoint and grp.eps[p.endpoint]
    return ep ~= nil and "s" .. ep.id == route
  end,
  -- caller x of merged call p, which went to the endpoint picked for its first caller
  follow = function(p, x)
    if p.endpoint and p.u.group then group.follow(p.u.group, x, p.endpoint) end
  end,
  cancel = function(p)
    take_call(p.id)
    core.cancel(p.id)
    if p.endpoint and p.u.group then group.release(p.u.group, p.endpoint) end
    if p.probe then local b = breaker_of(p) if b then b:report("ignore", true, core.now()) end end
  end,
  register = function(id, p) put_call(id, p) end, -- (p.id is id)
  set_timer = function(ms, fn) return set_timer(ms, fn) end,
  clear_timer = function(id) return clear_timer(id) end,
}

-- Sends exchange x's first attempt and arms its hedge.
local function launch(x)
  local u = x.u
  attempt(x, false)
  local after = x.hedge_after
  if after and not x.done then
    if after == "p95" then after = p95(u) end
    if after then arm_hedge(x, u, after) end
  end
end

-- What exchange x of request ctx does once agg.identity has its token (p nil: send) or a problem.
local function identity_go(ctx, x)
  return function(p)
    if x.done then return end
    if p == nil then
      if x.reexchanged and x.attempt > 0 then return attempt(x, false) end
      return launch(x)
    end
    local r = new_result(x.key, x)
    r.ms = 0
    finish_exchange(x, fail(ctx, r, p, x))
  end
end

-- Starts the call of section key of group g (see deliver), past the cache. The result may be
-- delivered before this returns (deadline passed, breaker open).
local function start_upstream(ctx, key, spec, g, chain)
  local u = upstream_state(spec.upstream)
  -- the normalized spec is the exchange (its fields are all there, see agg.callspec), and the
  -- exchange is the record of its own first attempt (see attempt): one table per call
  local x = spec
  x.ctx, x.key, x.group, x.u = ctx, key, g, u
  if chain then x.chain = chain end
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
  if up.identity and not x.anonymous then
    -- the user's identity first (agg.identity): a forwarded or exchanged token, or a problem
    x.go = identity_go(ctx, x)
    return identity.prepare(ctx, x, up, x.go)
  end
  launch(x)
end

-- A copy of a normalized spec whose exchange has not started (a background refresh, the info of
-- a stale result).
local function copy_spec(s)
  local c = {}
  for k, v in pairs(s) do c[k] = v end
  c.ctx, c.key, c.group, c.u, c.next_x = false, false, false, false, false
  c.a1, c.attempt, c.flight, c.id, c.probe, c.clamped, c.done = false, 0, false, false, nil, false, false
  c.ref, c.body_ref, c.raw_headers = false, false, false
  c.chain, c.a2 = nil, nil
  c.retrying, c.last, c.retry_timer, c.hedge_timer, c.own_timer, c.endpoint = nil, nil, nil, nil, nil, nil
  return c
end

--- Starts the call of section key of group g (see deliver): through the cache when the call has a
-- cache policy (agg.cache), else (or on a miss) upstream. The result may be delivered before this
-- returns (a cache hit, deadline passed, breaker open).
function M.start_call(ctx, key, spec, g, chain)
  -- a call that will carry the user's identity (the upstream's `identity`, added after a cache
  -- lookup) answers for that user only: agg.cache keys it by user, agg.page marks the page private
  -- (written only when true: a plain call's table has no slot for it, see agg.callspec)
  if upstreams[spec.upstream].identity and not spec.anonymous then spec.personal = true end
  if spec.cache then
    if cache.lookup(ctx, key, spec, g, chain) then return end
  end
  return start_upstream(ctx, key, spec, g, chain)
end

cache.bind({
  parse = json.parse,
  request_headers = result.request_headers,
  request_user = result.request_user,
  make_result = make_result,
  start = start_upstream,
  copy_spec = copy_spec,
  upstream_index = function(name) return upstreams[name].index end,
  set_timer = function(ms, fn) return set_timer(ms, fn) end,
  clear_timer = function(id) return clear_timer(id) end,
  -- a section served from the cache: its Server-Timing entry, then the section
  deliver_now = function(ctx, key, g, chain, r)
    add_timing(ctx, key, r.ms or 0)
    deliver(g, key, chain, r)
  end,
})

--- Transport: the Redis lookup id answered (agg.cache).
M.on_redis = cache.on_redis

--- Transport completion of call id (agg.contract): data is a json ref (the validated body, which
-- carries the headers and the body text; answer is then nil), a string (why the body is not
-- valid JSON), or nil; answer (valid during this call only) has the headers, body and detail of
-- any other answer.
function M.on_call(id, outcome, http_status, data, ms, answer)
  local rec = take_call(id)
  if rec == nil then return end
  local headers, body, detail = true, nil, nil
  if answer ~= nil then headers, body, detail = answer.headers, answer.body, answer.detail end
  if rec.on_answer then return rec.on_answer(outcome, http_status, headers, body, data, ms, detail) end
  on_answer(rec, outcome, http_status, headers, body, data, ms, detail)
end

-- Stops exchange x (not done): its timers and attempts; it delivers nothing.
local function stop_exchange(x)
  x.done = true
  clear_timer(x.retry_timer)
  clear_timer(x.hedge_timer)
  clear_timer(x.own_timer)
  M.abandon_attempts(x)
  x.u.active = x.u.active - 1
  if x.retrying then x.u.retries_active = x.u.retries_active - 1 end
end

-- Stops every exchange of a request that ended or was abandoned.
--- True while a call of request ctx is in flight (an exchange not done: an attempt, a retry's
-- backoff, a hedge, a cache or identity lookup): its own timeout, never past the deadline,
-- will settle it.
function M.in_flight(ctx)
  local x = ctx.exchanges
  while x do
    if not x.done then return true end
    x = x.next_x
  end
  return false
end

function M.abandon_exchanges(ctx)
  local x = ctx.exchanges
  ctx.exchanges = false
  while x do
    local next_x = x.next_x
    x.next_x = false
    if not x.done then
      stop_exchange(x)
      let_go(x) -- (as in finish_exchange: an earlier failed result keeps x as its info)
    end
    x = next_x
  end
end

--- Cancels the exchanges of request ctx still in flight for which pred(x) is true (fail fast,
-- agg.fanout): their calls are cancelled (counted as cancelled, never as the upstream's failure),
-- then after(x) runs for each, with x.group and x.key still set. They stay linked to ctx.
function M.cancel_where(ctx, pred, after)
  local x = ctx.exchanges
  local stopped = {}
  while x do
    if not x.done and pred(x) then
      stop_exchange(x)
      stopped[#stopped + 1] = x
    end
    x = x.next_x
  end
  for _, s in ipairs(stopped) do
    after(s)
    let_go(s)
  end
end

return M
