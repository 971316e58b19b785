-- agg.runtime: the request lifecycle and the call scheduler (DESIGN §2.1, §3).
--
-- One coroutine per request runs the endpoint's handler. agg.fetch_all starts calls through the
-- transport (`core`) and yields; completions come back through M.on_call and resume the waiting
-- coroutine. Continuations of agg.fetch_then run in child coroutines of their own. Every timer
-- and clock read goes through `core`, so the spec harness can give the same code a virtual clock
-- and stub upstreams.
--
-- The transport `core` and the callbacks it makes (M.start, M.on_call, M.on_timer, M.abort,
-- M.report_stats) are written down once, with units and ownership, in agg.contract.
--
-- The runtime's Lua half is four files: this one (a request's life: its coroutine, its context,
-- its response), agg.fanout (fetch_all, fetch_then), agg.exchange (a section's call: breaker,
-- retry, hedge, single-flight) and agg.result (what a call gives a script).
local str_gsub, str_find, str_match = string.gsub, string.find, string.match
local problem = require "agg.problem"
local result = require "agg.result"
local cache = require "agg.cache"
local exchange = require "agg.exchange"
local fanout = require "agg.fanout"
local identity = require "agg.identity"
local json = require "agg.json"
local url = require "agg.url"

local M = {}

-- table.new(narray, nhash): a table with room for what it will hold, so it never grows
local new_tab = require "table.new"

local log_error, parse_headers, at_script_frame = result.log_error, result.parse_headers, result.at_script_frame
local abandon_exchanges = exchange.abandon_exchanges

local core                                             -- transport and clock
local endpoints = {}                                   -- index -> endpoint (loader.lua)
local contexts = {}     -- contract.slot(rid) -> the context of request rid (ctx.rid == rid)
local slot = require("agg.contract").slot
-- The job the runtime is running, which agg.fanout reads (fetch_all's request) and resume sets:
-- running.job, a request's context (its handler's coroutine is ctx.co) or a continuation's record
-- (agg.fanout run_then: co, ctx, fin), and running.co, its coroutine. No table maps a coroutine to
-- its request: weak-keyed ones (one entry per page in flight) were walked twice more at every
-- atomic step of the collector, which is not incremental (docs/performance.md "A sixteenth pass").
local running = fanout.running

-- core.now read through the FFI, when the transport gives libev's ev_now and where its event
-- loop is (core.ev_now, core.loop, agg.contract): the C worker's core.now is ev_now(loop) * 1000
-- (gateway/worker/core.c), and this is the same value from the same call, made from compiled
-- code. A call of a C function ends the trace that makes it (LuaJIT stitches the next one on
-- after it), and a page asks the clock four times. The function comes as a pointer, not by name
-- (ffi.C finds only what the process exports: a libev linked statically is not), and the loop is
-- read at each call (the worker makes it after its first generation's runtime started); until it
-- exists, the transport's own core.now answers.
local ffi = require "ffi"
local function ffi_clock(ev_now_fn, loop_at, c_now)
  local ev_now = ffi.cast("double (*)(void *)", ev_now_fn)
  local at = ffi.cast("void **", loop_at)
  return function()
    local loop = at[0]
    if loop == nil then return c_now() end
    return ev_now(loop) * 1000
  end
end

--- Installs the transport and the endpoints (from agg.loader) and the upstream table.
-- Any requests and calls of a previous init are forgotten (the spec harness starts a fresh
-- gateway per spec this way).
function M.init(transport, ups, eps, token_exchange)
  if transport.ev_now and transport.loop then
    transport.now = ffi_clock(transport.ev_now, transport.loop, transport.now)
  end
  core, endpoints = transport, eps
  contexts = {}
  running.job, running.co = false, false
  result.bind(transport)
  exchange.bind(transport, ups, token_exchange)
  fanout.bind(ups)
  -- pages allocate many short-lived tables and keep little. A cycle starts when the heap reaches
  -- three times what the last one left live (pause 300), with a fast collector (stepmul 1000): the
  -- marking a cycle costs is spread over twice the allocation that pause 200's was, about 6,000
  -- instructions a bench page less, and the heap under the demo's pages is 3-7 MB (3-4 at 200).
  -- A pause over 200 holds only because what a page leaves dies in the first cycle after it (its
  -- context, its results, its chains' markers and continuations: no weak table's value keeps them;
  -- docs/performance.md "A fifth pass" and "An eighth pass"). In a burst the worker shortens the
  -- pause (gateway/worker/gc.h).
  collectgarbage("setpause", 300)
  collectgarbage("setstepmul", 1000)
end

function M.endpoints() return endpoints end

-- what agg, agg.page and the transport call (the fan-out's and the exchange's parts)
M.fetch_all, M.fetch, M.fetch_then = fanout.fetch_all, fanout.fetch, fanout.fetch_then
M.resolve_thens, M.then_result, M.sort_keys = fanout.resolve_thens, fanout.then_result, fanout.sort_keys
M.take_list, M.give_list = fanout.take_list, fanout.give_list
M.is_result, M.section_data, M.section_name, M.is_required =
  result.is_result, result.section_data, result.section_name, result.is_required
M.on_call, M.on_timer, M.on_redis = exchange.on_call, exchange.on_timer, exchange.on_redis
M.on_purge = cache.on_purge
M.upstream_stats = exchange.upstream_stats
M.merge_stats = require("agg.merge").stats

--- True when the page of the request whose handler is running must not be kept for other clients by
-- a shared cache (agg.page's Cache-Control: private): the edge authenticated the request, or its
-- script read req.headers, req.body, req.json or req.trace_id, so what the page holds may come from
-- them, which a shared cache does not key the page by (RFC 9111 §4.1 keys by URL and the page's
-- Vary only). Header fields a section's calls forward through the upstream's forward_headers or
-- vary are keyed and named in the page's Vary without the script reading them. False outside a
-- handler.
function M.request_private()
  local ctx = fanout.running_ctx()
  return ctx and (ctx.user or ctx.private_read) and true or false
end

--- The running request's max_sections_per_request (gateway.lua; 1000 outside a request).
function M.max_sections()
  local ctx = fanout.running_ctx()
  return ctx and ctx.ep.max_sections or 1000
end

-- Resumes co; when it ends, hands its outcome to its finisher.
local finish_request

-- The coroutines of handlers and fetch_then continuations are reused: each runs job_body, which
-- yields DONE with the function's return value and waits for the next job (a continuation made a
-- coroutine of its own at every step of a chain: about 2,400 instructions with its stack and its
-- collection, docs/performance.md "An eighteenth pass"). A function that raises kills its
-- coroutine.
local DONE = {}
local pool, pool_n, POOL_MAX = {}, 0, 64

-- What a job's function returned travels beside the yield, not through it: a coroutine waiting in
-- the pool keeps the values of its frame, and the last response (the page, its sections' data)
-- stayed alive until the coroutine served another request.
local returned
-- fn(a) (a handler's request, a continuation's one dependency), or fn(unpack(a, 1, n)) when n is
-- given (a continuation's dependencies, a list). fn is called as the value anonymous(fn) returns,
-- so that a traceback names it by where it was written ("in function <scripts/page.lua:12>"),
-- not by this frame's local ("in function 'fn'").
local function anonymous(f) return f end
local function job_body(fn, a, n)
  while true do
    if n then returned = anonymous(fn)(unpack(a, 1, n)) else returned = anonymous(fn)(a) end
    -- a coroutine waiting here (in the pool, or dropped when the pool is full) must not keep the
    -- request it served (and its context, the req's metatable's) alive
    fn, a, n = nil, nil, nil
    fn, a, n = coroutine.yield(DONE)
  end
end

-- A coroutine for a job: one from the pool, or a new one.
local function take_co()
  if pool_n == 0 then return coroutine.create(job_body) end
  local co = pool[pool_n]
  pool[pool_n] = nil
  pool_n = pool_n - 1
  return co
end

-- The coroutine of job (a request's context or a continuation's record, see running) is done
-- with: it ended (ok and v what it returned or raised), its calls could not start, or it yielded
-- outside agg.fetch_all. A request's finishes it (unless it was retired meanwhile: ctx.co is then
-- another value), a continuation's record has its finisher run.
local function coroutine_over(job, co, ok, v)
  local fin = job.fin
  if fin then return fin(job, ok, v, co) end
  if job.co == co then return finish_request(job, ok, v, co) end
end

local START, WAIT, start_deferred, moot = fanout.START, fanout.WAIT, fanout.start_deferred, fanout.moot
-- Resumes the coroutine of job (see running) with ...; when it ends, hands its outcome on. A
-- retired request's job (ctx.co false) is not resumed: its script has nothing left to do.
local function resume(job, ...)
  local co = job.co
  if not co then return end
  local pjob, pco = running.job, running.co
  running.job, running.co = job, co
  local ok, v = coroutine.resume(co, ...)
  while v == START and ok do
    -- a fetch_all's calls start here, off the coroutine's stack (agg.fanout start_deferred); when
    -- they all settled while starting, co goes on at once, from this loop
    running.job, running.co = pjob, pco
    local started, err = start_deferred(job)
    if started ~= "settled" then
      if not started then coroutine_over(job, co, false, err) end
      return
    end
    if moot(job) then -- (its calls settled while they started, and so did its section)
      job.co = false
      return
    end
    running.job, running.co = job, co
    ok, v = coroutine.resume(co)
  end
  running.job, running.co = pjob, pco
  if ok and v == DONE then
    local w = returned
    returned = nil
    if job.fin then job.fin(job, true, w, co) else finish_request(job, true, w, co) end
    if pool_n < POOL_MAX then
      pool_n = pool_n + 1
      pool[pool_n] = co
    end
    return
  end
  if coroutine.status(co) == "dead" then
    coroutine_over(job, co, ok, v)
  elseif v ~= WAIT then
    -- it yielded by itself: it would never be resumed
    coroutine_over(job, co, false, fanout.stray_yield(job))
  end
end

-- Runs fn in a coroutine for job (a fetch_then continuation's record, agg.fanout run_then): fn(a),
-- or fn(unpack(a, 1, n)) when n is given.
local function run_job(job, fn, a, n)
  local co = take_co()
  job.co = co
  resume(job, fn, a, n)
end

fanout.bind_requests(resume, run_job)

-- (at most TIMING_NAMES_KEPT kept: section keys a script makes from ids would grow it for good;
-- a name is the key's first TIMING_NAME_BYTES bytes, and a longer key is never kept: a section
-- key of a megabyte made a header of a megabyte, and 512 of them were kept for good)
local TIMING_NAMES_KEPT, TIMING_NAME_BYTES = 512, 32
local timing_names_kept = 0
local timing_names = setmetatable({}, { __index = function(t, k)
  local key = tostring(k)
  local name = str_gsub(#key > TIMING_NAME_BYTES and key:sub(1, TIMING_NAME_BYTES) or key, "[^%w_%-]", "_")
  if timing_names_kept < TIMING_NAMES_KEPT and #key <= TIMING_NAME_BYTES then
    timing_names_kept = timing_names_kept + 1
    t[k] = name
  end
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

-- ';desc="hit"' and the other cache outcomes (agg.cache), made once
local DESC = setmetatable({}, { __index = function(t, k)
  local s = ';desc="' .. k .. '"'
  t[k] = s
  return s
end })

-- the entries of one header, joined: one table for every response (server_timing runs to its
-- end without calling out, so it is never entered twice at once)
local parts = {}

-- At most this many sections in one Server-Timing header: a page of a thousand sections made a
-- header of 20 KB, more than the response header buffers of the proxies in front of a gateway
-- (nginx's proxy_buffer_size is 4 or 8 KB: "upstream sent too big header", a 502). With names of
-- at most TIMING_NAME_BYTES, the header stays under 1.5 KB.
local TIMING_MAX = 32
local durations = {} -- the slowest durations of a page with more sections (one table, reused)

-- Of a page's n/2 timings, the least duration shown so that at most TIMING_MAX are: the
-- TIMING_MAX-th longest.
local function longer(a, b) return a > b end
local function timing_threshold(ctx, n)
  local m = 0
  for i = 2, n, 2 do m = m + 1; durations[m] = ctx[i] end
  table.sort(durations, longer)
  local t = durations[TIMING_MAX]
  for i = 1, m do durations[i] = nil end
  return t
end

-- ctx[1..n]: the timings (section key, ms, section key, ms, …; see agg.exchange finish_exchange)
-- Past TIMING_MAX sections, the slowest TIMING_MAX are shown, in the order they finished (ties
-- at the threshold: the first to finish), and `_more;desc="N sections"` says how many are not.
local function server_timing(ctx, n)
  local desc = ctx.cache_desc -- cache outcomes (agg.cache), or nil
  desc = desc and desc[cache.BY_ENTRY] -- by entry (agg.exchange add_timing), or nil
  local np = 0
  -- threshold: the least duration shown (nil: every one); ties: how many entries equal to it fit
  local threshold, ties
  if n > 2 * TIMING_MAX then
    threshold, ties = timing_threshold(ctx, n), TIMING_MAX
    for i = 2, n, 2 do if ctx[i] > threshold then ties = ties - 1 end end
  end
  for i = 1, n, 2 do
    local ms = ctx[i + 1]
    local shown = not threshold or ms > threshold
    if not shown and ms == threshold and ties > 0 then shown, ties = true, ties - 1 end
    if shown then
      -- the entry's pieces go into parts as they are (strings made once), joined by one concat:
      -- no string per entry
      local tenths = math.floor(ms * 10 + 0.5)
      if np > 0 then np = np + 1; parts[np] = ", " end
      parts[np + 1], parts[np + 2], parts[np + 3] =
        timing_names[ctx[i]], dur_whole[math.floor(tenths / 10)], DUR_TENTH[tenths % 10]
      np = np + 3
      local d = desc and desc[i]
      if d then np = np + 1; parts[np] = DESC[d] end
    end
  end
  if threshold then
    parts[np + 1], parts[np + 2] = ", ", ('_more;desc="%d sections"'):format(n / 2 - TIMING_MAX)
    np = np + 2
  end
  local v = table.concat(parts, "", 1, np)
  for i = 1, np do parts[i] = nil end
  return v
end

-- agg.page's responses carry one of these metatables: its verdict, which the transport needs
-- (agg.contract's response.page), is known here and never read back from a header. Shared by
-- every page of the VM, so guarded: getmetatable gives scripts a name, never the table (a script
-- that set __newindex on it rewrote another endpoint's failed pages; an attack review)
M.PAGE_COMPLETE = { page = "complete", __metatable = "agg.page" }
M.PAGE_PARTIAL = { page = "partial", __metatable = "agg.page" }

-- A page's section (DESIGN §2.2): its members in this order (agg.contract's tables.section)
M.SECTION_MEMBERS = { "status", "data", "error" }
local SECTION_MT = json.ordered(M.SECTION_MEMBERS, "agg.page section")

-- A 200 page before anyone reads its body (agg.page): { status, headers } whose metatable is the
-- page's rows { name, status, data, error, … } (sorted by name; agg.contract's response.rows) with
-- page = its verdict. The transport encodes the rows straight into the page: a section whose data
-- no script read is the upstream's validated bytes, and no table of the body is made. Reading
-- response.json makes the body's tables from the rows, those agg.page would otherwise have made
-- ({ name = setmetatable({ status, data, error }, SECTION_MT) }); from then on, as after
-- response.json = v, the body is a Lua value like any handler's (pairs(response) shows json only
-- then). The metatable is protected (getmetatable gives "agg.page").
local page_json
local function page_rows(resp)
  local mt = debug.getmetatable(resp)
  return mt and rawget(mt, "__index") == page_json and mt or nil
end
page_json = function(resp, k)
  local rows = k == "json" and page_rows(resp)
  if not rows or rows.replaced then return nil end
  local body, i = new_tab(0, 4), 1
  while rows[i] ~= nil do
    body[rows[i]] = setmetatable({ status = rows[i + 1], data = rows[i + 2], error = rows[i + 3] }, SECTION_MT)
    i = i + 4
  end
  rows.replaced = true
  rawset(resp, "json", body)
  return body
end
local function page_set(resp, k, v)
  local rows = k == "json" and page_rows(resp)
  if rows then rows.replaced = true end
  rawset(resp, k, v)
end

--- agg.page's 200 response: resp ({ status, headers }) with rows (see above) as its metatable,
-- verdict "complete" or "partial".
function M.page_response(resp, rows, verdict)
  rows.__index, rows.__newindex, rows.__metatable, rows.page = page_json, page_set, "agg.page", verdict
  return setmetatable(resp, rows)
end

-- agg.page's verdict of a response (nil: not a page), and its rows while its body is unread.
local function page_of(resp)
  local mt = debug.getmetatable(resp)
  if mt == M.PAGE_COMPLETE or mt == M.PAGE_PARTIAL then return mt.page end
  if mt and rawget(mt, "__index") == page_json then return mt.page, not mt.replaced and mt or nil end
  return nil
end

-- core.respond's response (agg.contract): one table, filled for each response; what could keep
-- a page alive (headers, body, sections) is dropped once the transport has read it
local out = { status = 0, headers = false, body = false, json = false, default_type = false,
              server_timing = false, page = false, sections = false, rows = false }

-- Directives that let a shared cache store a response or speak only to one: dropped beside
-- `private` (RFC 9111 §5.2.2.7 private, §5.2.2.9 public, §5.2.2.10 s-maxage, §5.2.2.8
-- proxy-revalidate). A qualified private="field" lets a shared cache store the response less the
-- fields it names, so it is dropped too and a bare private put in its place.
local NOT_PRIVATE = { private = true, public = true, ["s-maxage"] = true, ["proxy-revalidate"] = true }

-- A Cache-Control value (a string, a number or a list, as a script may give one) that keeps a
-- shared cache from storing the response (RFC 9111 §5.2.2.7): `private`, then v's other directives
-- but those of NOT_PRIVATE (`private, max-age=56`: the user's own cache may keep it as long as
-- before; `public, max-age=600` gives `private, max-age=600`). A value with a control character,
-- which the transport would drop with the header, and anything else (nil) become `private`.
local function made_private(v)
  local t, parts = type(v), {}
  if t == "table" then
    for _, e in ipairs(v) do parts[#parts + 1] = tostring(e) end
  elseif t == "string" or t == "number" then
    parts[1] = tostring(v)
  end
  local ds = {}
  for _, p in ipairs(parts) do
    if str_find(p, "[%z\1-\8\10-\31\127]") then return "private" end
    cache.cc_directives(p, ds)
  end
  local keep = { "private" }
  for _, d in ipairs(ds) do
    if not NOT_PRIVATE[str_match(d, "^[^=%s]*"):lower()] then keep[#keep + 1] = d end
  end
  return table.concat(keep, ", ")
end

-- The response headers of a request with what the gateway adds for this client alone. headers:
-- name -> value in any case (the transport lowercases names, drops invalid ones, and adds
-- default_type as content-type unless one is there); the result is a copy (the script's table may
-- be shared) with the session cookies and headers of upstream
-- groups (agg.group) that this page sets, and its Cache-Control made private (made_private, every
-- spelling of it): a shared cache (a CDN) would otherwise keep the response and hand this
-- client's session, or its RateLimit fields (limits.headers, added by the transport: ep.rate_fields),
-- to every client that asks for the URL. This holds whoever wrote the Cache-Control: the script
-- cannot see the fields the gateway adds. A session cookie is Secure (RFC 6265 §4.1.2.5: the
-- client sends it back over TLS only) when the request came over TLS (core.request_tls, asked
-- only for a response that sets one) or its group's session says secure = true (a gateway behind
-- a proxy that ends TLS).
local function with_client_fields(ctx, headers, sessions)
  local h = {}
  local cc = false -- a spelling of cache-control was there
  if headers then
    for k, v in pairs(headers) do
      if type(k) == "string" and #k == 13 and k:lower() == "cache-control" then
        v, cc = made_private(v), true
      end
      h[k] = v
    end
  end
  if not cc then h["cache-control"] = "private" end
  local tls -- nil until a cookie asks
  for _, s in pairs(sessions or {}) do
    if s.cookie then
      if tls == nil then tls = core.request_tls and core.request_tls(ctx.rid) == true or false end
      local c = s.name .. "=" .. s.token .. "; Path=/; HttpOnly; SameSite=Lax" ..
                ((s.secure or tls) and "; Secure" or "") .. (s.max_age and ("; Max-Age=" .. s.max_age) or "")
      local key = "set-cookie" -- the script's own spelling, if it sets cookies too
      for k in pairs(h) do if type(k) == "string" and k:lower() == key then key = k end end
      local cur = h[key]
      if cur == nil then h[key] = c
      elseif type(cur) == "table" then cur = { unpack(cur) } cur[#cur + 1] = c h[key] = cur
      else h[key] = { cur, c } end
    else
      h[s.name] = s.token
    end
  end
  return h
end

-- A plain response's headers (a handler's own table, { status = …, json = … }) for a request that
-- is private (M.request_private: the edge authenticated it, or its script read req.headers,
-- req.body, req.json or req.trace_id; or one of its calls forwarded a request header, an
-- upstream's forward_headers, whose value the answer may hold): Cache-Control: private when the script gave none, in any
-- spelling, as agg.page does for a page (the script's own wins). Without it a shared cache in
-- front could keep the answer by heuristic freshness (RFC 9111 §4.2.2) and serve it to callers
-- without the request's API key: its X-API-Key is no Authorization, which §3.5 would have kept it
-- from (an attack review). headers: the script's table (not changed: it may be shared) or nil.
local function private_unless_said(headers)
  if headers then
    for k in pairs(headers) do
      if type(k) == "string" and #k == 13 and k:lower() == "cache-control" then return headers end
    end
  end
  local h = { ["cache-control"] = "private" }
  if headers then for k, v in pairs(headers) do h[k] = v end end
  return h
end

-- page: "complete", "partial" or nil; sections: a page's sections; rows: a page's rows, in place
-- of body and sections.
local function send(ctx, status, headers, body, is_json, default_type, page, sections, rows)
  if ctx.sessions or (ctx.ep and ctx.ep.rate_fields) then headers = with_client_fields(ctx, headers, ctx.sessions) end
  local o = out
  o.status, o.headers, o.body, o.json, o.default_type = status, headers, body, is_json, default_type
  local nt = #ctx
  o.server_timing = nt > 0 and server_timing(ctx, nt) or nil
  o.page, o.sections, o.rows = page, sections, rows
  local sent, err = core.respond(ctx.rid, o)
  o.headers, o.body, o.sections, o.rows = nil, nil, nil, nil
  return sent, err
end

local PROBLEM_HEADERS = { ["cache-control"] = "no-store" }

local function send_problem(ctx, p)
  send(ctx, p.status, PROBLEM_HEADERS, p, true, "application/problem+json")
end

-- status, headers, json and (without json) body of a handler's response, then its page verdict and
-- rows (a page whose body no one read: json is nil then)
local function response_fields(resp)
  if type(resp) ~= "table" then return nil end
  local page, rows = page_of(resp)
  if rows then return resp.status, resp.headers, nil, nil, page, rows end
  local json_v = resp.json
  return resp.status, resp.headers, json_v, json_v == nil and resp.body or nil, page
end

-- Retires request ctx, answered or aborted: done, out of the contexts in flight, its exchanges
-- abandoned, and no longer tied to its coroutine either way: ctx.co goes (a coroutine that is not
-- pooled, or is never resumed, still holds req, whose metatable holds ctx; and resume does not run
-- a retired request's coroutine again).
local function retire(ctx)
  ctx.done = true
  ctx.co = false
  local s = slot(ctx.rid)
  if contexts[s] == ctx then contexts[s] = nil end
  abandon_exchanges(ctx)
end

local RESPONSE_SHAPE = "the handler must return agg.page(results) or { status = <200..599>, json = … | body = … }"
local RESPONSE_KEYS = { status = true, headers = true, json = true, body = true }

-- The message for a handler's response without a usable status (st, as read): what it returned.
-- (A log line, placed at the handler's first line: the return it came from is gone.)
local function wrong_response(resp, st)
  local got
  if type(resp) ~= "table" then
    got = type(resp) == "nil" and "nothing" or ("a %s"):format(type(resp))
  elseif st == nil then
    -- (raw reads: the script's table. A result among its values is agg.fetch_all's, whatever the
    -- upstreams answered: aggway check's dry run reports this one, agg.dryrun)
    local res = false
    for _, v in next, resp do
      if type(v) == "table" and result.is_result(v) then res = true break end
    end
    got = res and "the results of agg.fetch_all without agg.page: return agg.page(results)" or
          "a table without status (the results of agg.fetch_all? pass them to agg.page)"
  else
    got = ("status %s (%s)"):format(type(st) == "string" and ("%q"):format(st:sub(1, 40)) or tostring(st), type(st))
  end
  return RESPONSE_SHAPE .. ", it returned " .. got
end

-- The message for a plain response (a table that is not agg.page's) holding a key a response does
-- not have (`jsn = data`, which would otherwise go out as an empty 200), else nil. Raw keys only:
-- a field a metatable gives is read as it always was.
local function unknown_response_key(resp)
  for k in next, resp do
    if not RESPONSE_KEYS[k] then
      return ("the handler's response has an unknown key '%s'%s: %s"):format(
        require("agg.where").key_name(k), require("agg.config").suggest(k, RESPONSE_KEYS), RESPONSE_SHAPE)
    end
  end
  return nil
end

finish_request = function(ctx, ok, resp, co)
  if ctx.done then return end
  retire(ctx)
  if not ok then
    log_error(ctx, nil, resp, co)
    return send_problem(ctx, problem.script_error(nil))
  end
  -- the response's fields may run the script's metamethods, here on the runtime's own thread:
  -- an error (or the script time limit's stop) there must not leave the request unanswered
  local k = result.enter_callback()
  -- (the response's metamethods are this request's script: agg.page called there sees it, its
  -- privacy and its max_sections, as the handler's would)
  local pjob, pco = running.job, running.co
  running.job, running.co = ctx, false
  local read, st, headers, rjson, body, page, rows = xpcall(response_fields, at_script_frame, resp)
  running.job, running.co = pjob, pco
  result.leave_callback(k)
  if not read then
    log_error(ctx, nil, st)
    return send_problem(ctx, problem.script_error(nil))
  end
  if type(st) ~= "number" or st < 200 or st > 599 or st % 1 ~= 0 then
    log_error(ctx, nil, wrong_response(resp, st), ctx.ep and ctx.ep.handler)
    return send_problem(ctx, problem.script_error(nil))
  end
  if not page and not rows then
    local bad = unknown_response_key(resp)
    if bad then
      log_error(ctx, nil, bad, ctx.ep and ctx.ep.handler)
      return send_problem(ctx, problem.script_error(nil))
    end
  end
  if headers ~= nil and type(headers) ~= "table" then
    log_error(ctx, nil, "response headers must be a table")
    return send_problem(ctx, problem.script_error(nil))
  end
  if not page and not rows and (ctx.user or ctx.private_read or ctx.forwarded) then
    headers = private_unless_said(headers)
  end
  if rjson ~= nil or rows then
    local sections = not rows and page and type(rjson) == "table" and
                     (st == 200 and rjson or rawget(rjson, "sections")) or nil
    local sent, err = send(ctx, st, headers, rjson, true, "application/json", page, sections, rows)
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

local parse_query = url.parse_query

-- req.query, req.headers, req.json, req.remaining_ms and req.trace_id are built on first read: most pages
-- never read most of them.
-- A request's context is its req's metatable (so the context lives exactly as long as the req a
-- script may keep; its __index and __metatable are the only keys of its that say so).
local getmt = debug.getmetatable

local function parse_headers_table(h)
  if type(h) == "string" then return parse_headers(h) end
  return h or {}
end

-- req.user: the authenticated user (nil on an open endpoint), read-only to scripts; its claims
-- and scopes are made when first read (agg.identity)
local function user_newindex(_, k)
  error("req.user is read-only (tried to set '" .. tostring(k) .. "')", 2)
end
local function readonly_user(u)
  return setmetatable({}, {
    __index = function(_, k)
      if k == "claims" then return identity.claims(u) end
      if k == "scopes" then return identity.scopes(u) end
      if k == "claims_ref" then return nil end
      return u[k]
    end,
    __newindex = user_newindex,
    __metatable = "req.user",
  })
end

-- req.remaining_ms of the request whose context is ctx: the milliseconds left before its deadline,
-- 0 once past it. (Made here, not in req_index: a function that makes a closure is not compiled
-- where it returns, docs/performance.md "An eighteenth pass".)
local function remaining_ms_of(ctx)
  return function()
    local left = ctx and (ctx.deadline - core.now()) or 0
    return left > 0 and left or 0
  end
end

local req_index = function(r, k)
    local lazy = getmt(r) -- the request's ctx
    local v
    if k == "json" or k == "body" or k == "headers" or k == "trace_id" then
      -- what the page may then hold is this request's, not its URL's: agg.page makes it private
      -- (M.request_private)
      if lazy then lazy.private_read = true end
    end
    if k == "json" then
      -- nil for a body that is not JSON, or holds more values than max_request_json_values (each
      -- a Lua slot, table or string: the Lua memory a client's body can make is bounded)
      local body = lazy and lazy.body
      if body and body ~= "" then v = json.decode(body, lazy.ep and lazy.ep.max_json_values or 10000) end
    elseif k == "body" then
      v = lazy and lazy.body or nil
    elseif k == "query" then
      v = parse_query(lazy and lazy.query)
    elseif k == "headers" then
      v = parse_headers_table(lazy and result.request_headers(lazy))
    elseif k == "user" then
      local u = lazy and result.request_user(lazy)
      v = u and readonly_user(u) or nil
    elseif k == "trace_id" then
      v = lazy and core.trace_id and core.trace_id(lazy.rid)
    elseif k == "remaining_ms" then
      v = remaining_ms_of(lazy)
    else
      return nil
    end
    rawset(r, k, v)
    return v
end

-- A request still unanswered this long after its deadline, with no call and no Redis lookup in
-- flight, is answered by answer_overdue. Every wait of a page is bounded by its deadline (a call's
-- timeout is at most the time left), so only a coroutine suspended outside agg.fetch_all (a
-- trusted folder's continuation that yields: the sandbox refuses it to scripts) or a mistake of
-- the runtime's leaves one unanswered; without this it stayed in flight until its client left
-- (and counted against max_in_flight meanwhile).
local OVERDUE_MS = 1000
-- Past this, a page is answered whatever its calls and lookups say. Each of their own bounds ends
-- by the deadline, so one still "in flight" this long after it is a mistake of the runtime's (code
-- that raised while it delivered an answer left that call's exchange open for good) or a worker
-- held for as long.
local OVERDUE_ANYWAY_MS = 10000
local overdue = {}

--- Answers every request of this generation that is more than OVERDUE_MS past its deadline with
-- nothing in flight, or more than OVERDUE_ANYWAY_MS past it whatever is, with a 500 problem,
-- logged as a script error, and abandons its calls. Called once a second (the
-- worker's runtime.report_stats). Returns how many it answered (for specs).
function M.answer_overdue()
  local now, n = core.now(), 0
  for _, ctx in pairs(contexts) do
    -- (a page with a call or a Redis lookup in flight is not stuck: its timeout settles it. After the worker
    -- was held, this tick can come before the answers that arrived meanwhile are read)
    if not ctx.done and now > ctx.deadline + OVERDUE_MS and
       (now > ctx.deadline + OVERDUE_ANYWAY_MS or (not exchange.in_flight(ctx) and not cache.waiting_for(ctx))) then
      n = n + 1; overdue[n] = ctx
    end
  end
  for i = 1, n do
    local ctx = overdue[i]
    overdue[i] = nil
    finish_request(ctx, false, ("still unanswered %d ms after its deadline (%d ms): answered 500 and its calls " ..
                                "abandoned (a coroutine of the page suspended outside agg.fetch_all, or a " ..
                                "mistake of the gateway's)"):format(math.floor(now - ctx.deadline), ctx.ep.deadline_ms), nil)
  end
  return n
end

--- The worker's once-a-second call (agg.contract report_stats): overdue requests answered, then
-- the upstreams' and groups' figures published (agg.exchange.report_stats).
function M.report_stats(current)
  M.answer_overdue()
  return exchange.report_stats(current)
end

--- Starts request rid for endpoint index idx. Called by the transport (agg.contract,
-- tables.start_args): params, the route parameters; query (the raw query string or nil), body
-- (string or nil), user (true when the edge authenticated the request: the transport gives the
-- user and its bearer token on first use, core.request_user, agg.result.request_user; else nil)
-- and waited_ms. The headers come from the transport on first use (core.request_headers,
-- agg.result.request_headers).
function M.start(rid, idx, method, path, params, query, body, user, waited_ms)
  local ep = endpoints[idx]
  -- a request that waited before its script (a Redis rate limit's decision) started that much
  -- earlier: the wait counts in its deadline
  local now = core.now() - (waited_ms or 0)
  -- exchanges: the first of its calls' exchanges, linked through x.next_x (see start_call)
  -- sections: how many sections its fan-outs have had (agg.fanout: at most ep.max_sections)
  -- user, token: who the edge authenticated (gateway/edge/edge.h), for req.user and agg.identity:
  -- user true and token false until agg.result.request_user asks for them
  -- ctx[1..]: the Server-Timing entries (section key, ms, …; agg.exchange finish_exchange), in
  -- the array part the constructor makes room for (three calls): no table of their own
  -- ctx is also the req's metatable (__index, __metatable: getmetatable(req) gives scripts a name)
  local ctx = { nil, nil, nil, nil, nil, nil, rid = rid, ep = ep, started = now, deadline = now + ep.deadline_ms,
                exchanges = false, done = false, co = false, sections = 0,
                query = query, req_headers = false, user = user or false, token = false,
                body = body or false,
                __index = req_index, __metatable = "agg.request" }
  contexts[slot(rid)] = ctx
  local req = setmetatable({ method = method, path = path, params = params, route = ep.route }, ctx)
  ctx.co = take_co()
  resume(ctx, ep.handler, req)
end

--- The client of request rid went away: cancel its calls and forget it.
function M.abort(rid)
  local s = slot(rid)
  local ctx = contexts[s]
  if not ctx or ctx.rid ~= rid then return end
  retire(ctx) -- (its coroutine is never resumed: it goes with the context)
end

-- t made again: a new table with t's metatable (a weak table stays weak) and t's entries, when t
-- holds at most 64 (an idle worker's tables hold none, or the few a script or a cache keeps
-- alive); t itself when it holds more (something is in flight: nothing is gained).
local made_again = 0 -- tables fresh made again in this compaction
local function fresh(t)
  local n = 0
  for _ in pairs(t) do
    n = n + 1
    if n > 64 then return t end
  end
  local c = setmetatable({}, getmetatable(t))
  for k, v in pairs(t) do c[k] = v end
  made_again = made_again + 1
  return c
end

--- The worker's idle hook (gateway/worker/gc.h: once per idle spell, between its two full
-- collections). Every table of the runtime that holds one entry per request or call in flight
-- is made again, sized for what it holds now. Lua does not shrink a table it does not insert
-- into: after a burst of N requests at once, their tables kept hash parts of about N (and 3N for
-- calls) slots, 24 bytes each, for as long as the worker stayed idle (measured: 2.2 MB after
-- 5,000 pages in flight, tools/bench/memory). A table that holds more than 64 entries is kept.
-- Returns how many tables it made again (4 at idle; for specs).
function M.compact()
  made_again = 0
  contexts = fresh(contexts)
  exchange.compact(fresh)
  return made_again
end

--- Number of requests in progress and calls in flight (for tests and metrics).
function M.stats()
  local r, c = 0, 0
  for _ in pairs(contexts) do r = r + 1 end
  c = exchange.calls_in_flight()
  return r, c
end

return M
