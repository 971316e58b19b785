-- agg.group: an upstream's endpoints as one worker sees them (DESIGN §9, §9.1; docs/operations.md "Upstream
-- groups"). It chooses the endpoint of each attempt (power of two choices on calls in flight, round
-- robin, or consistent hashing with bounded load), ejects an endpoint that fails (outlier
-- ejection) for a time that grows with repeats, and tells the circuit breaker whether a failure is
-- the group's or one endpoint's. State is per worker and per generation, on the runtime's clock
-- (core.now), so the spec harness runs it on its virtual clock.
--
-- An upstream with one endpoint never comes here for its calls (agg.exchange checks `endpoints`):
-- they cost nothing more than before groups existed. It has a group only when it is health
-- checked (agg.health), for the probes' state on /upstreams; one endpoint is never taken out.
local str_byte, str_find, str_gmatch, str_match, str_sub = string.byte, string.find, string.gmatch, string.match, string.sub
local request_headers = require("agg.result").request_headers

local M = {}

local core
local groups = {}   -- upstream name -> group (made on first use)
local policies = {} -- upstream name -> the loader's upstream entry (endpoints, balance, outlier, …)

--- Binds the transport and the upstream table (agg.runtime.init); state of a previous binding is
-- forgotten.
function M.bind(transport, ups)
  core, policies, groups = transport, ups, {}
end

--- FNV-1a over s, finished with MurmurHash3's fmix32 so that similar strings ("url#1", "url#2")
-- spread over the ring. Returns an unsigned 32-bit number (agg.sys hash32, in C: a key may be a
-- client's 64 KB header). Endpoint ids in session tokens are its values: it never changes.
local hash32 = require("agg.sys").hash32
local last_s, last_h -- the last string hashed and its hash: a page's calls give the same key

function M.hash(s)
  if s == last_s then return last_h end -- (strings are interned: one comparison)
  local h = hash32(s)
  last_s, last_h = s, h
  return h
end

local VNODES = 160      -- points per endpoint on the hash ring
local HASH_LOAD = 1.25  -- bounded load: at most 1.25 x the mean calls in flight per endpoint

-- The ring of a hash-balanced group: points sorted, each owned by an endpoint in service. An
-- endpoint's points depend on its key only (its URL; for the addresses of a host name, URL and
-- address), so adding a fourth endpoint moves about a quarter of the keys.
local function build_ring(g)
  local pts = {}
  for i, e in ipairs(g.eps) do
    if not e.gone then
      for v = 1, VNODES do pts[#pts + 1] = { M.hash(e.key .. "#" .. v), i } end
    end
  end
  table.sort(pts, function(a, b) return a[1] < b[1] or (a[1] == b[1] and a[2] < b[2]) end)
  local at, owner = {}, {}
  for k, p in ipairs(pts) do at[k], owner[k] = p[1], p[2] end
  g.ring_at, g.ring_owner = at, owner
end

-- A new endpoint's state (slot i of g: url, address or false when out of service). Its key names
-- it for the ring and for session tokens: the URL, or URL@address for the addresses of one URL.
-- since_ms: when the slot took this address (core.now(), M.sync), false for the group's first slots
-- (a clock may read 0: the spec harness's starts there).
local function new_endpoint(url, address, shared, since_ms)
  -- down: out of service by its health checks (agg.health); health: their verdict, nil unchecked;
  -- gone: a slot of a host name that holds no address now (group/directory.h)
  return { url = url, address = address, key = shared and address and (url .. "@" .. address) or url,
           since_ms = since_ms or false,
           gone = address == false, inflight = 0, consec = 0, failing = false, until_ms = 0, ejections = 0,
           ejected_ms = false, restored_ms = 0, win_start = 0, win_total = 0, win_fail = 0,
           calls = 0, failures = 0, sessions = 0, answered = 0, latency_ms = 0,
           down = false, health = nil, probes = 0, probe_failures = 0 }
end

-- What depends on the set of endpoints in service: their count, the ring, the session ids.
local function index_endpoints(g)
  local live = 0
  for _, e in ipairs(g.eps) do if not e.gone then live = live + 1 end end
  g.live = live
  if g.balance == "hash" then build_ring(g) end
  if g.session then
    g.session.by_id = {}
    for i, e in ipairs(g.eps) do
      e.id = ("%08x"):format(M.hash(e.key))
      if not e.gone then g.session.by_id[e.id] = i end
    end
  end
end

-- The endpoint slots of upstream up: the transport's (core.endpoint_slots: the addresses of host
-- names, group/directory.h) or, without it (the spec harness), one per configured URL. Returns the
-- list of { url, address } and the directory's version (nil without it).
local function slots_of(up)
  if core and core.endpoint_slots then
    local v, slots = core.endpoint_slots(up.index, -1)
    if slots then return slots, v end
  end
  local slots = {}
  for i, url in ipairs(up.endpoints or {}) do slots[i] = { url = url, address = url } end
  return slots, nil
end

local function shared_urls(slots)
  local count, shared = {}, {}
  for _, sl in ipairs(slots) do count[sl.url] = (count[sl.url] or 0) + 1 end
  for url, n in pairs(count) do shared[url] = n > 1 end
  return shared
end

local function group_of(name)
  local g = groups[name]
  if g then return g end
  local up = policies[name]
  local o = up.outlier or {}
  local slots, version = slots_of(up)
  g = { name = name, index = up.index, n = #slots, eps = {}, rr = 0, inflight = 0, nfailing = 0,
        balance = up.balance or "p2c", hash_key = up.hash_key, version = version,
        failures = o.off and 0 or (o.failures or 5), eject_ms = (o.eject_s or 10) * 1000,
        max_eject_ms = (o.max_eject_s or 300) * 1000, max_percent = o.max_percent or 50,
        failure_percent = o.off and 0 or (o.failure_percent or 0), min_requests = o.min_requests or 10,
        interval_ms = (o.interval_s or 10) * 1000, cand = {} }
  local shared = shared_urls(slots)
  for i, sl in ipairs(slots) do g.eps[i] = new_endpoint(sl.url, sl.address, shared[sl.url]) end
  local sess = up.session
  if sess and not sess.off then
    g.session = { cookie = sess.type ~= "header", name = sess.type == "header" and sess.name:lower() or sess.name,
                  secure = sess.secure == true, absolute_ms = (sess.absolute_timeout_s or 0) * 1000, idle_ms = (sess.idle_timeout_s or 0) * 1000,
                  by_id = {} }
  end
  index_endpoints(g)
  groups[name] = g
  return g
end
M.group_of = group_of

local function usable(e, now) return e.until_ms <= now and not e.down and not e.gone end

-- True when one more endpoint of g may be out of service (ejected, or down by its health checks):
-- at most max_percent of the group (at least one may always be), and never every endpoint.
local function may_take_out(g, now)
  local out = 0
  for _, o in ipairs(g.eps) do if not o.gone and not usable(o, now) then out = out + 1 end end
  local allowed = math.max(1, math.floor(g.live * g.max_percent / 100))
  return out < allowed and out + 1 < g.live
end

--- The group of upstream name when its calls are balanced (more than one endpoint slot: several
-- URLs, or a URL with a host name, whose addresses are endpoints of their own), else false.
function M.balanced(name)
  local up = policies[name]
  if not up or not up.endpoints then return false end
  if #up.endpoints > 1 or groups[name] then return group_of(name).n > 1 and group_of(name) end
  local slots = slots_of(up)
  return #slots > 1 and group_of(name) or false
end

--- The worker's once-a-second tick on its current generation: each group's endpoint slots follow
-- the directory (core.endpoint_slots; the transport moved its pools first). An endpoint whose
-- address stays keeps its state; a slot whose address changed starts afresh (its calls in flight
-- still count as in flight for the balancer until they end, and their answers, about the old
-- address, count for no endpoint: M.report); a slot that lost its address is gone (no calls, not
-- counted for the ejection limits).
function M.sync()
  if not (core and core.endpoint_slots) then return end
  for _, g in pairs(groups) do
    local v, slots = core.endpoint_slots(g.index, g.version or -1)
    g.version = v
    if slots then
      local shared, changed = shared_urls(slots), false
      for i, sl in ipairs(slots) do
        local e = g.eps[i]
        if e.address ~= sl.address then
          local ne = new_endpoint(sl.url, sl.address, shared[sl.url], core.now())
          ne.inflight = e.inflight
          if e.failing then g.nfailing = g.nfailing - 1 end
          g.eps[i], changed = ne, true -- (the resolver thread logged the change, once for the process)
        end
      end
      if changed then index_endpoints(g) end
    end
  end
end

-- The value of cookie `name` in the Cookie header c ("n1=v1; n2=v2", RFC 6265 §5.4): the first
-- pair of that name, its value up to the next ';'; nil when there is none. Linear in #c and makes
-- no string but the value: a client's 64 KB Cookie of 6,000 pairs, scanned pair by pair (two new
-- strings each) for every call of a page, cost 0.76 ms a call, 0.76 s for a page of 1,000 calls.
-- The last answer is kept (a page's calls ask the same question; strings are interned, so the
-- comparison is one).
local last_c, last_name, last_v
local function cookie_value(c, name)
  if c == last_c and name == last_name then return last_v end
  local v
  local needle, init = name .. "=", 1
  while true do
    local s, e = str_find(c, needle, init, true)
    if not s then break end
    local i = s - 1 -- a pair's name starts the header or follows "; " (spaces before it skipped)
    while i > 0 and (str_byte(c, i) == 32 or str_byte(c, i) == 9) do i = i - 1 end
    if i == 0 or str_byte(c, i) == 59 then
      local stop = str_find(c, ";", e + 1, true)
      v = str_sub(c, e + 1, (stop or #c + 1) - 1)
      break
    end
    init = s + 1
  end
  last_c, last_name, last_v = c, name, v
  return v
end

-- The page request's header name (lowercase), or with cookie set, the value of its cookie name;
-- nil when it has none. ctx.req_headers becomes a table on first use (as req.headers makes it).
local function from_request(ctx, name, cookie)
  local h = ctx and request_headers(ctx)
  if type(h) == "string" then -- "name\0value\0…", names lowercase (the transport's form)
    local t = {}
    for k, v in str_gmatch(h, "([^%z]*)%z([^%z]*)%z") do t[k] = t[k] and (t[k] .. ", " .. v) or v end
    ctx.req_headers, h = t, t
  end
  if type(h) ~= "table" then return nil end
  if not cookie then return h[name] end
  local c = h.cookie
  if not c then return nil end
  return cookie_value(c, name)
end

-- The key a hash-balanced call hashes: the call's own hash_key, or the page request's header or
-- cookie that the upstream's hash_key names ("header:NAME", "cookie:NAME"); nil when there is none.
local function hash_key_of(g, x)
  if x.hash_key then return x.hash_key end
  local hk = g.hash_key
  if not hk then return nil end
  local kind, name = str_match(hk, "^(%a+):(.+)$")
  if kind == "header" then return from_request(x.ctx, name:lower(), false) end
  return from_request(x.ctx, name, true)
end

-- Consistent hashing with bounded load: the first endpoint clockwise from the key's point that is
-- not ejected, not `avoid`, and has fewer calls in flight than HASH_LOAD x the mean (plus one).
local function ring_pick(g, key, avoid, now)
  local at, owner = g.ring_at, g.ring_owner
  local h, lo, hi = M.hash(key), 1, #at
  while lo < hi do
    local mid = math.floor((lo + hi) / 2)
    if at[mid] < h then lo = mid + 1 else hi = mid end
  end
  if at[lo] < h then lo = 1 end
  local bound = math.ceil(HASH_LOAD * (g.inflight + 1) / g.live)
  local first
  for k = 0, #at - 1 do
    local i = owner[(lo - 1 + k) % #at + 1]
    local e = g.eps[i]
    if i ~= avoid and usable(e, now) then
      first = first or i
      if e.inflight < bound then return i end
    end
  end
  return first
end

-- How far in the future (ms) a session token's times may be: the clock skew between the
-- gateways that share a session (a token made by one whose clock is ahead) and the second the
-- token's times are rounded to. The same as a JWT's default leeway_s (auth.jwt, RFC 7519 §4.1.4):
-- the gateway already trusts its hosts' clocks that far. A later time is no gateway's: it would
-- keep the session from ever reaching absolute_timeout_s or idle_timeout_s.
local SESSION_SKEW_MS = 60000

-- Session persistence (Gateway API sessionPersistence): a session token is
-- "<endpoint id>.<created s>.<last used s>", the endpoint id a hash of its URL (the same in every
-- worker, every gateway of the configuration and across reloads, so unkeyed: a client can find
-- the URL by an offline search, and pin any endpoint it saw an id of; docs/operations.md says so
-- to operators). Returns the endpoint the request's session pins, or nil when it has
-- none, it expired (absolute_timeout_s since created, idle_timeout_s since last used), a time of
-- it is later than now (more than SESSION_SKEW_MS: forged, so no session), or its endpoint is
-- ejected or `avoid`; and the session's creation time (s) when it is still valid.
local function session_endpoint(g, s, ctx, avoid, now)
  local tok = from_request(ctx, s.name, s.cookie)
  if not tok then return nil end
  local id, created, seen = str_match(tok, "^(%x+)%.(%d+)%.(%d+)$")
  local i = id and s.by_id[id]
  if not i then return nil end
  created, seen = tonumber(created), tonumber(seen)
  if created * 1000 > now + SESSION_SKEW_MS or seen * 1000 > now + SESSION_SKEW_MS or
     (s.absolute_ms > 0 and now - created * 1000 >= s.absolute_ms) or
     (s.idle_ms > 0 and now - seen * 1000 >= s.idle_ms) then
    return nil
  end
  if i == avoid or not usable(g.eps[i], now) then return nil, created end
  return i, created
end

-- The page response sets the session of group g to endpoint i (a new session, one that moved, or,
-- with idle_timeout_s, one whose last use is refreshed): ctx.sessions[name] = { cookie, header
-- name, token, max age s, secure }; agg.runtime adds it to the response.
local function set_session(g, s, ctx, i, created, now, counted)
  if not counted then g.eps[i].sessions = g.eps[i].sessions + 1 end
  local sessions = ctx.sessions
  if not sessions then sessions = {} ctx.sessions = sessions end
  local now_s = math.floor(now / 1000)
  local max_age
  if s.absolute_ms > 0 then max_age = math.max(0, math.floor((created * 1000 + s.absolute_ms - now) / 1000)) end
  if s.idle_ms > 0 then max_age = math.min(max_age or math.huge, math.floor(s.idle_ms / 1000)) end
  sessions[g.name] = { cookie = s.cookie, name = s.name, token = g.eps[i].id .. "." .. created .. "." .. now_s,
                       max_age = max_age, secure = s.secure }
end

-- The page of ctx has its call go to endpoint i of g; cur, created: what session_endpoint said of
-- its session. The session the page sets, as a plain call's: none when it already pins i (its last
-- use refreshed with idle_timeout_s), else one on i (a session that moved keeps its creation time).
local function keep_session(g, s, ctx, i, cur, created, now)
  if i == cur then
    if s.idle_ms > 0 then set_session(g, s, ctx, i, created, now, true) end
  else
    set_session(g, s, ctx, i, created or math.floor(now / 1000), now)
  end
end

--- The endpoint (1-based) for an attempt of exchange x on group g; avoid: the endpoint of the
-- attempt it replaces (a retry, a hedge), taken only when nothing else is usable. Ejected
-- endpoints are taken only when every endpoint is ejected (never happens: see eject). With a
-- session, the request's session endpoint while it is usable; else the choice below, and the
-- page sets the session to it.
function M.pick(g, x, avoid)
  local now = core.now()
  local s = g.session
  if s and x.ctx then
    local cur, created = session_endpoint(g, s, x.ctx, avoid, now)
    local i = cur or M.choose(g, x, avoid, now)
    keep_session(g, s, x.ctx, i, cur, created, now)
    return i
  end
  return M.choose(g, x, avoid, now)
end

--- Exchange x rides on a call that went to endpoint i of g for another exchange (a merged call,
-- agg.merge): its page sets its session as M.pick would have for a call of its own to i.
function M.follow(g, x, i)
  local s = g.session
  if not (s and x.ctx) then return end
  local now = core.now()
  local cur, created = session_endpoint(g, s, x.ctx, nil, now)
  keep_session(g, s, x.ctx, i, cur, created, now)
end

--- What decides the endpoint of exchange x's calls on g besides the balancer's own state, as a
-- string: "s" and the id of the endpoint its page's session pins while that one is usable, else
-- with balance = "hash" "h" and the hash of its key (the ring's point: keys of one hash go to one
-- endpoint), else "" (the balancer alone chooses; a new session goes where it chooses). Calls
-- merge only with calls of the same route (agg.merge): one upstream call goes to one endpoint.
function M.route(g, x)
  local s = g.session
  if s and x.ctx then
    local i = session_endpoint(g, s, x.ctx, nil, core.now())
    if i then return "s" .. g.eps[i].id end
  end
  if g.balance == "hash" then
    local key = hash_key_of(g, x)
    if key then return ("h%08x"):format(M.hash(key)) end
  end
  return ""
end

--- The balancer's choice for an attempt of exchange x on group g (M.pick without sessions).
function M.choose(g, x, avoid, now)
  local eps, n = g.eps, g.n
  local chosen
  if g.balance == "hash" then
    local key = hash_key_of(g, x)
    if key then chosen = ring_pick(g, key, avoid, now) end
  end
  if not chosen and g.balance == "round_robin" then
    for _ = 1, n do
      g.rr = g.rr % n + 1
      if g.rr ~= avoid and usable(eps[g.rr], now) then chosen = g.rr break end
    end
  elseif not chosen then
    -- power of two choices: two distinct usable endpoints at random, the one with fewer in flight
    local cand, m = g.cand, 0
    for i = 1, n do
      if i ~= avoid and usable(eps[i], now) then m = m + 1 cand[m] = i end
    end
    if m == 1 then
      chosen = cand[1]
    elseif m > 1 then
      local a = math.floor(core.random() * m) + 1
      local b = math.floor(core.random() * (m - 1)) + 1
      if b >= a then b = b + 1 end
      a, b = cand[a], cand[b]
      chosen = eps[b].inflight < eps[a].inflight and b or a
    end
  end
  if not chosen then
    -- nothing usable but `avoid`: go back to it; else the endpoint whose ejection ends first
    if avoid and usable(eps[avoid], now) then return avoid end
    for i = 1, n do
      local e = eps[i]
      if not e.gone and (not chosen or e.until_ms < eps[chosen].until_ms) then chosen = i end
    end
  end
  return chosen
end

--- An attempt went to endpoint i of g (it is in flight until M.release).
function M.hold(g, i)
  local e = g.eps[i]
  e.inflight = e.inflight + 1
  e.calls = e.calls + 1
  g.inflight = g.inflight + 1
end

--- The attempt on endpoint i of g ended (answered or cancelled).
function M.release(g, i)
  local e = g.eps[i]
  e.inflight = e.inflight - 1
  g.inflight = g.inflight - 1
end

--- Ejects endpoint e of g for its backoff (eject_s x its ejections, at most max_eject_s), unless
-- that would eject more than max_percent of the group (at least one may always be) or every
-- endpoint. Returns true when it was ejected.
local function eject(g, e, now, why)
  if not usable(e, now) or not may_take_out(g, now) then return false end
  e.ejections = e.ejections + 1
  local ms = math.min(g.eject_ms * e.ejections, math.max(g.eject_ms, g.max_eject_ms))
  e.until_ms, e.ejected_ms, e.consec = now + ms, now, 0
  e.restored_ms = now + ms
  if core.log then
    core.log("warn", ("upstream %s: endpoint %s ejected for %d s (%s)"):format(g.name, e.url,
             math.floor(ms / 1000 + 0.5), why))
  end
  return true
end

-- Endpoint e of g passes its health checks again after it failed them: it no longer counts as
-- failing for the group's breaker (M.report) until a call fails on it again. Else an endpoint that
-- failed, came back and got no call since (sessions pinned elsewhere, a balance that passed it by)
-- made another endpoint's failures the whole group's, and one sick endpoint paused the upstream
-- while the other passed its checks. Only a recovery the checks saw clears it: not checks that
-- passed all along, nor an ejection they ended early (an endpoint whose checks pass while its
-- calls fail counts by its calls; else a dead group whose health path answers never opened its
-- breaker, each ejection's end clearing one endpoint in turn).
local function mended(g, e)
  if e.failing then
    e.failing = false
    g.nfailing = g.nfailing - 1
  end
end

--- Endpoint i of g passed (healthy true) or failed its health checks as many times in a row as
-- the upstream's health block asks (agg.health). Failing takes it out of service, within the
-- limits of ejection (max_percent, never every endpoint: else it stays in, and is taken out at a
-- later failed probe once there is room); passing puts it back. why: what the last failed probe
-- saw (for the log).
function M.set_health(g, i, healthy, why)
  local e, now = g.eps[i], core.now()
  if healthy and e.health == "failing" then mended(g, e) end
  e.health = healthy and "passing" or "failing"
  if not healthy then
    if not e.down and (not usable(e, now) or may_take_out(g, now)) then
      e.down = true
      if core.log then
        core.log("warn", ("upstream %s: endpoint %s failed its health checks (%s); out of service"):format(
          g.name, e.url, why or "failed"))
      end
    end
  elseif e.down then
    e.down = false
    if core.log then
      core.log("info", ("upstream %s: endpoint %s passes its health checks; back in service"):format(g.name, e.url))
    end
  end
end

--- Ends the outlier ejection of endpoint i of g now (its health checks passed since it began, as
-- Envoy's successful_active_health_check_uneject_host); its ejection count stays, so the next
-- ejection is as long as it would have been.
function M.end_ejection(g, i)
  local e, now = g.eps[i], core.now()
  if e.until_ms <= now then return end
  e.until_ms, e.restored_ms = now, now
  if core.log then
    core.log("info", ("upstream %s: endpoint %s passes its health checks; its ejection ends early"):format(g.name, e.url))
  end
end

--- How an attempt on endpoint i of g ended, as the breaker sees it ("success", "failure",
-- "ignore"), after ms; returns what the upstream's breaker should count: a failure only when every
-- endpoint of the group is failing (its last answer was a failure), so one sick endpoint is
-- ejected, not the whole upstream paused.
function M.report(g, i, verdict, ms)
  local e = g.eps[i]
  local now = core.now()
  -- (an attempt that began before the slot took its address (M.sync) went to the old address: its
  -- answer says nothing of this one, whose state starts afresh. The attempt's start is now - ms,
  -- both on the loop's clock, with 0.01 ms for their rounding. One that began in the loop turn of
  -- the change, before or after it, is taken for the old address's: the few answers of the new one
  -- left out so cost nothing, the old one's counted could eject the new one.)
  local since = e.since_ms
  if ms and since and now - ms <= since + 0.01 then return "ignore" end
  e.answered = e.answered + 1
  e.latency_ms = e.latency_ms + (ms or 0)
  -- (a slot whose address went away while the attempt ran: its answer is about no endpoint of the
  -- group now, and would count it failing for good, as nothing calls or probes a gone slot)
  if verdict == "ignore" or e.gone then return "ignore" end
  if g.failure_percent > 0 then
    if now - e.win_start >= g.interval_ms then
      if e.win_total >= g.min_requests and e.win_fail * 100 >= g.failure_percent * e.win_total then
        eject(g, e, now, ("%d of %d calls failed in %d s"):format(e.win_fail, e.win_total, g.interval_ms / 1000))
      end
      e.win_start, e.win_total, e.win_fail = now, 0, 0
    end
    e.win_total = e.win_total + 1
  end
  if verdict == "failure" then
    e.failures = e.failures + 1
    e.consec = e.consec + 1
    if g.failure_percent > 0 then e.win_fail = e.win_fail + 1 end
    if not e.failing then e.failing = true g.nfailing = g.nfailing + 1 end
    if g.failures > 0 and e.consec >= g.failures then
      eject(g, e, now, e.consec .. " consecutive failures")
    end
    return g.nfailing >= g.live and "failure" or "ignore"
  end
  e.consec = 0
  if e.failing then e.failing = false g.nfailing = g.nfailing - 1 end
  -- healthy for a whole backoff since it came back: the next ejection starts short again
  if e.ejections > 0 and now - e.restored_ms >= g.eject_ms then
    e.ejections = e.ejections - 1
    e.restored_ms = now
  end
  return "success"
end

local HEALTH_CODE = { passing = 1, failing = 2 }

--- Hands every group's endpoints to core.endpoint_state(index, endpoint, state) when the transport
-- has it (state: agg.contract's tables.endpoint_state, one table reused for all, read before the
-- call returns; group/board.h: the admin page /upstreams and the endpoint metrics;
-- agg.exchange.report_stats). health: 0 unchecked, 1 passing, 2 failing; down: 1 while its health
-- checks keep it out of service.
function M.report_stats()
  local publish = core and core.endpoint_state
  if not publish then return end
  local now = core.now()
  local st = {}
  for name, g in pairs(groups) do
    local index = policies[name].index
    for i, e in ipairs(g.eps) do
      st.calls, st.failures, st.ejections, st.sessions = e.calls, e.failures, e.ejections, e.sessions
      st.in_flight, st.answered, st.latency_ms = e.inflight, e.answered, e.latency_ms
      st.ejected_until_ms = e.until_ms > now and e.until_ms or 0
      st.last_ejected_ms = e.ejected_ms or 0
      st.health, st.down = HEALTH_CODE[e.health] or 0, e.down and 1 or 0
      st.probes, st.probe_failures = e.probes, e.probe_failures
      publish(index, i, st)
    end
  end
end

--- The state of every endpoint of upstream name, for specs and the admin page: a list of
-- { url, address, state = "healthy" | "ejected" | "unhealthy" (out of service by its health
-- checks) | "gone" (a slot of a host name without an address now),
-- health = "passing" | "failing" | nil (unchecked), in_flight, calls, failures, ejections,
-- ejected_ms, until_ms, probes, probe_failures }, one per endpoint slot. Nil for an upstream with
-- one endpoint that is not health checked.
function M.endpoints(name)
  local up = policies[name]
  if not up or not up.endpoints then return nil end
  local g = groups[name] or M.balanced(name) or (up.health and group_of(name))
  if not g then return nil end
  local now = core.now()
  local out = {}
  for i, e in ipairs(g.eps) do
    out[i] = { url = e.url, address = e.address,
               state = e.gone and "gone" or e.down and "unhealthy" or usable(e, now) and "healthy" or "ejected",
               health = e.health, in_flight = e.inflight, calls = e.calls, failures = e.failures,
               ejections = e.ejections, ejected_ms = e.ejected_ms or nil,
               until_ms = e.until_ms > now and e.until_ms or nil, probes = e.probes, probe_failures = e.probe_failures }
  end
  return out
end

return M
