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
--
-- The harness's parts: agg.testing_args (its options, errors at the spec's line),
-- agg.testing_clock (the virtual clock, the script time limit), agg.testing_transport (the fake
-- `core`: stubs, timers, cache tiers, responses), agg.testing_front (a request's arrival: route,
-- edge, limits, runtime.start). This module is the API specs use: testing.gateway and a gateway's
-- methods.
local loader = require "agg.loader"
local rt = require "agg.runtime"
local problem = require "agg.problem"
local limiter = require "agg.limiter"
local args = require "agg.testing_args"
local clock = require "agg.testing_clock"
local transport = require "agg.testing_transport"
local front = require "agg.testing_front"

local M = {}

-- Errors the scripts logged since the current test started, in every gateway of the spec:
-- `aggway test` prints them beside a failed assertion (agg.test_cli).
M.script_errors = {}
function M.clear_script_errors() M.script_errors = {} end

local Gateway = {}
Gateway.__index = Gateway

local raise, check_options = args.raise, args.check_options
local schedule, peek, step, timed = clock.schedule, clock.peek, clock.step, clock.timed
local SLOTS_PER_NAME, finish_response = transport.SLOTS_PER_NAME, front.finish_response

-- Makes this gateway's transport the runtime's (a spec may hold several gateways; the one used
-- last wins; M.current).
Gateway.install = transport.install
Gateway.stub = transport.stub
Gateway.start_call = transport.start_call
Gateway.send = front.send
Gateway.gate = front.gate
Gateway.address_gate = front.address_gate
Gateway.disconnect = front.disconnect

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
  check_options("testing.gateway", opts, args.GATEWAY_OPTIONS)
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

--- Runs something at virtual time ms (absolute), e.g. to send requests spread over time.
function Gateway:at(ms, fn)
  if type(ms) ~= "number" or ms ~= ms or ms < 0 then raise("gw:at: the time must be a number of virtual ms >= 0") end
  if type(fn) ~= "function" then raise("gw:at: the second argument must be a function") end
  schedule(self, ms, fn)
end

-- The virtual clock moves to the next whole second and runs the worker's once-a-second
-- runtime.report_stats(true) there (health probes start, overdue pages are answered).
local function next_second(gw)
  gw.clock = (math.floor(gw.clock / 1000) + 1) * 1000
  if M.current ~= gw then gw:install() end
  timed(gw, rt.report_stats, true)
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
-- endpoint whose auth is not "none" answers 401, and a missing scope 403, as the edge does; one
-- whose auth is "none" ignores it). Returns { status, headers (lowercased), body, json (decoded when
-- the body is JSON), elapsed_ms (virtual), script, route }. Errors when a call had no stub.
function Gateway:request(method, path, opts)
  self.unstubbed = nil
  local r = self:send(method, path, opts)
  local guard, idle_ticks = 0, 0
  while not r.status do
    guard = guard + 1
    if guard > 1000000 then
      error(("%s %s was never answered: the virtual clock ran 1,000,000 events"):format(method, path), 2)
    end
    if not step(self) then
      -- nothing in flight: as the worker does, the once-a-second tick answers a page left
      -- unanswered a second past its deadline (runtime.answer_overdue); an hour of ticks at most
      idle_ticks = idle_ticks + 1
      if idle_ticks > 3601 then
        error(("%s %s was never answered: the script waits with nothing in flight"):format(method, path), 2)
      end
      next_second(self)
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
-- A section's statuses (the page contract, docs/api.md).
local SECTION_STATUSES = { ok = true, fallback = true, stale = true, unavailable = true }

-- Fails the test that called the function calling this, at that line: a failure (as luassert's
-- are), not an error, when the spec runs under busted.
local function fail_at_caller(msg)
  local ok, busted = pcall(require, "busted")
  if ok and type(busted) == "table" and busted.fail then busted.fail(msg, 3) end
  error(msg, 3)
end

function M.expect_section(page, name, status, kind)
  if not SECTION_STATUSES[status] then
    fail_at_caller(("testing.expect_section: status must be \"ok\", \"fallback\", \"stale\" or \"unavailable\", got %s%s")
                   :format(type(status) == "string" and ("%q"):format(status) or tostring(status),
                           require("agg.config").suggest(status, SECTION_STATUSES)))
  end
  local where = ("%s (%s): section %s"):format(page.script or "?", page.request or "?", tostring(name))
  local doc = page.json
  local sec = type(doc) == "table" and (doc[name] or (type(doc.sections) == "table" and doc.sections[name])) or nil
  if sec == nil then
    fail_at_caller(("%s: expected status %q, but the page (HTTP %s) has no such section"):format(where, status, tostring(page.status)))
  end
  local function describe_error(e)
    if type(e) ~= "table" then return "" end
    return (" (%s: %s)"):format(tostring(e.type), tostring(e.title))
  end
  if sec.status ~= status then
    fail_at_caller(("%s: expected status %q, got %q%s"):format(where, status, tostring(sec.status), describe_error(sec.error)))
  end
  if kind ~= nil then
    local got = type(sec.error) == "table" and problem.kind(sec.error) or nil
    if got ~= kind then
      fail_at_caller(("%s: expected problem %q, got %q"):format(where, kind, tostring(got)))
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
      next_second(self)
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
