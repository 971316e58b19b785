-- agg.merge: merged calls. A call with the option `batch = { key = id, … }` asks for one item of
-- an upstream route that answers many items at once (`/products?ids=1,2,3`). Calls of one worker
-- that name the same merged route (the same upstream, method, path, headers and batch options),
-- from one page or from concurrent pages, are collected for `window_ms` (or until `max` distinct
-- keys) and go out as one upstream call; the answer is split by key and each caller gets its own
-- item as its result (README "Batching").
--
-- Per caller: its deadline holds (a caller whose timeout comes first stops waiting, the others
-- keep the merged call); an item missing from the answer is an upstream-not-found problem (404)
-- for that caller only; a failed merged call fails each of its callers with its problem. A key
-- already in a merged call in flight joins it (the single-flight of merged calls). The merged
-- call passes the upstream's breaker once and counts once; it is tried once (no retry, no hedge).
--
-- agg.exchange owns the callers' exchanges: it calls M.join from an attempt, M.leave when an
-- exchange stops waiting, M.answer with the transport's answer of a merged call; M.bind gives
-- this module the exchange's hooks (done: an attempt's answer; deny: breaker said no; route,
-- pick, follow: an upstream group's endpoint for a caller, for the batch, and a caller's session).
local str_find, str_gsub, str_format = string.find, string.gsub, string.format
local json = require "agg.json"
local problem = require "agg.problem"
local result = require "agg.result"
local where = require "agg.where"
local callable = require "agg.callable"

local M = {}

local core, upstreams, hooks
local pending = {}    -- group -> batch being collected
local inflight = {}   -- group -> { key -> batch in flight that carries it }
local stats = {}      -- upstream name -> { merged_calls, merged_items, merged_joined }

function M.bind(transport, ups, h)
  core, upstreams, hooks = transport, ups, h
  pending, inflight, stats = {}, {}, {}
end

--- Counters of merged calls of upstream name in this worker: calls sent, callers served by them
-- (items), callers that joined a merged call already in flight.
function M.stats(name)
  local s = stats[name]
  if not s then
    s = { merged_calls = 0, merged_items = 0, merged_joined = 0 }
    stats[name] = s
  end
  return s
end

---------------------------------------------------------------------------------------------------
-- The option (agg.callspec)

local OPTIONS = { key = true, max = "number", window_ms = "number", param = "string", sep = "string",
                  request = "function", split = "function", match = "string", items = "string" }

local function escape(s)
  return (str_gsub(tostring(s), "[^%w%-%._~]", function(c) return string.format("%%%02X", c:byte()) end))
end

--- The text of an item's key k: what the merged request carries and what an answer's items are
-- matched by. A whole number is written whole: tostring keeps 14 significant digits, so the ids
-- 100000000000001 and 100000000000002 were both "1e+14" (one caller was given the other's item,
-- and the upstream was asked for "1e+14"). Any other number as tostring writes it when that reads
-- back as the same number, else with the 17 digits that do; a string (or an int64 the JSON parser
-- made of a larger id) as tostring writes it.
local function key_text(k)
  if type(k) == "number" and k == k then
    if k % 1 == 0 and k >= -2^63 and k < 2^63 then return str_format("%d", k) end
    local t = tostring(k)
    if tonumber(t) == k then return t end
    return str_format("%.17g", k)
  end
  return tostring(k)
end

-- where a function was written: calls merge only when their functions come from the same place
local function place(f)
  if not f then return "" end
  local info = debug.getinfo(f, "S")
  return info.source .. ":" .. info.linedefined
end

--- Checks and normalizes the batch option b of a call to upstream name (path: the call's path,
-- headers: its flat header list or nil). level points error() at the script line. Returns
-- { key, max, window_ms, param, sep, request, split, match, items, group }.
function M.normalize(b, name, method, path, headers, level)
  level = level + 1
  local function bad(msg) error(("call to '%s': batch: %s"):format(name, msg), level + 1) end
  for k, v in pairs(b) do
    local want = OPTIONS[k]
    if want == nil then
      local names = {}
      for o in pairs(OPTIONS) do names[#names + 1] = o end
      table.sort(names)
      bad(("unknown option '%s'%s (%s)"):format(where.key_name(k), require("agg.config").suggest(k, OPTIONS),
                                                table.concat(names, ", ")))
    end
    if want ~= true and (type(v) ~= want or want == "function" and not callable.is(v)) then
      bad(("option '%s' must be a %s, got %s"):format(k, want, callable.kind(v)))
    end
  end
  local key = b.key
  if type(key) ~= "string" and type(key) ~= "number" then
    bad("'key' (this call's item, like key = id) must be a string or a number, got " .. type(key))
  end
  local max = b.max or 50
  if max < 1 or max % 1 ~= 0 then bad("'max' must be a whole number >= 1") end
  local window = b.window_ms or 2
  if window < 0 or window ~= window then bad("'window_ms' must be a number of milliseconds >= 0") end
  local forms = (b.param and 1 or 0) + (b.request and 1 or 0) + (str_find(path, "{keys}", 1, true) and 1 or 0)
  if forms ~= 1 then
    bad("say how the merged request is built: exactly one of param = \"ids\" (…?ids=1,2,3), a path "
        .. "with {keys} (\"/products/{keys}\") or request = function(keys) return path end")
  end
  if b.split and (b.match or b.items) then bad("give either split or match/items, not both") end
  local sep = b.sep or ","
  local hs = ""
  if headers then
    local t = {}
    for i = 1, #headers, 2 do t[#t + 1] = headers[i] .. ":" .. headers[i + 1] end
    table.sort(t)
    hs = table.concat(t, "\0")
  end
  return {
    key = key_text(key), max = max, window_ms = window, param = b.param or false, sep = sep,
    request = b.request or false, split = b.split or false, match = b.match or "id", items = b.items or false,
    group = table.concat({ name, method, path, hs, b.param or "", sep, place(b.request), place(b.split),
                           b.match or "id", b.items or "", tostring(max), tostring(window) }, "\1"),
  }
end

---------------------------------------------------------------------------------------------------
-- Collecting and sending

local flush

-- The exchange a call record belongs to: its x, or the record itself when it is the exchange's
-- first attempt (agg.exchange: the exchange is the record of its own first attempt).
local function exchange_of(rec) return rec.x or rec end

-- A caller's timer: its own timeout came before the merged call's answer.
local function own_timeout(x, rec, t)
  return function()
    x.own_timer = nil
    if x.done or x.a1 ~= rec then return end
    M.leave(x, rec)
    hooks.done(x, rec, "timeout", 0, nil, nil, nil, t, "no answer within " .. math.floor(t) .. " ms (merged call)")
  end
end

local function add_waiter(p, x, rec, t, clamped, now)
  local k = x.batch.key
  local list = p.waiters[k]
  if not list then
    list = {}
    p.waiters[k] = list
    p.n = p.n + 1
    p.keys[p.n] = k
  end
  list[#list + 1] = rec
  p.nwait = p.nwait + 1
  rec.ends, rec.t = now + t, t
  if now + t > p.ends then p.ends, p.clamped = now + t, clamped end
  if t > p.sent_t then p.sent_t = t end -- the longest timeout of its callers (M.join: who may join it)
  x.a1 = rec
  -- a caller that may run out before the batch leaves waits with a timer of its own; the others
  -- get one when the batch is sent, if the merged call's timeout is longer than theirs (flush)
  if t <= x.batch.window_ms + 1 then x.own_timer = hooks.set_timer(t, own_timeout(x, rec, t)) end
end

-- request headers that carry a user's credentials (agg.cache's): calls merge only with the same ones
local CREDENTIALS = require("agg.cache").CREDENTIALS

-- The batch group of x: its option's, narrowed by the credentials the call carries now (the
-- user's identity is added after the option was read, agg.identity): one user's token never
-- goes out with another user's items; and on an upstream group, by what chooses its endpoint
-- (hooks.route: the endpoint its page's session pins, or its hash key): a merged call goes to one
-- endpoint, which must be the one each of its callers' own call would have gone to (a caller
-- pinned elsewhere was given another endpoint's items and kept no session; with balance = "hash"
-- on sharded endpoints, another shard's items).
-- Returns the group and the route (hooks.route's: "" for none).
local function group_of(x)
  local g, h = x.batch.group, x.headers
  if h then
    for i = 1, #h, 2 do
      if CREDENTIALS[h[i]] then g = g .. "\2" .. h[i] .. ":" .. h[i + 1] end
    end
  end
  local r = hooks.route(x)
  if r ~= "" then g = g .. "\3" .. r end
  return g, r
end

-- Merged call p's keys are no longer in flight: each that is still p's leaves its group's table,
-- and a table left empty goes (a group is made per credential and per hash key or session a
-- client sends: kept, they grew the VM by a table and a string for every one ever seen).
local function unlist(p, k)
  local fl = inflight[p.group]
  if not fl then return end
  if k then
    if fl[k] == p then fl[k] = nil end
  else
    for _, key in ipairs(p.keys) do if fl[key] == p then fl[key] = nil end end
  end
  if next(fl) == nil then inflight[p.group] = nil end
end

--- How many batch groups have a merged call in flight or a batch open (for specs and checks:
-- none once every call is answered).
function M.open_groups()
  local n = 0
  for _ in pairs(inflight) do n = n + 1 end
  for _ in pairs(pending) do n = n + 1 end
  return n
end

--- Exchange x asks for its item (t: its timeout in ms, clamped: t was cut by the deadline).
function M.join(x, t, clamped, now)
  local b = x.batch
  local g, route = group_of(x)
  local k = b.key
  local sent = inflight[g] and inflight[g][k]
  -- a merged call in flight that was sent with a shorter timeout than this caller's: joining it
  -- would fail this caller at the other callers' timeout (a caller with 100 ms sent the batch; a
  -- page with 8 s joined it and timed out at 100 ms), so this caller's key goes into a batch of its
  -- own. (With a timeout as long, joining costs the caller at most the time the call has been out.)
  if sent and sent.sent_t < t then sent = nil end
  if sent then
    -- the key is already asked for: wait for that merged call's answer
    local rec = { id = sent.id, merged = sent, x = x }
    local list = sent.waiters[k]
    list[#list + 1] = rec
    sent.nwait = sent.nwait + 1
    x.a1 = rec
    hooks.follow(sent, x) -- (its page's session, as for a call of its own to that endpoint)
    -- the merged call ends by its own timeout: a caller with less time needs a timer of its own
    if now + t < sent.ends then x.own_timer = hooks.set_timer(t, own_timeout(x, rec, t)) end
    local s = M.stats(x.upstream)
    s.merged_joined = s.merged_joined + 1
    if core.join then core.join(x.ctx.rid, sent.id, x.key) end
    return
  end
  local p = pending[g]
  if not p then
    p = { group = g, upstream = x.upstream, method = x.method, path = x.path, headers = x.headers, opts = b,
          keys = {}, n = 0, waiters = {}, nwait = 0, ends = 0, clamped = false, timer = false,
          id = false, sent = false, done = false, probe = false, x = false, sent_t = 0 }
    p.x, p.merged = p, p -- what agg.exchange reads of a call record: its upstream, and that it is merged
    -- (and its upstream's state: an endpoint group's balancer; endpoint: the group's endpoint the
    -- merged call went to, which agg.exchange releases and reports its answer for, as a call's)
    p.u, p.endpoint, p.route = x.u, false, route
    pending[g] = p
    p.timer = hooks.set_timer(b.window_ms, function() p.timer = false flush(p) end)
  end
  add_waiter(p, x, { id = p, merged = p, x = x }, t, clamped, now)
  if p.n >= b.max then flush(p) end
end

-- Each waiter of batch p, once, and p forgotten (its waiters' answers may start new calls).
local function take_waiters(p)
  p.done = true
  local recs = {}
  for _, k in ipairs(p.keys) do
    local list = p.waiters[k]
    if list then for _, rec in ipairs(list) do recs[#recs + 1] = rec end end
  end
  p.waiters, p.nwait = {}, 0
  return recs
end

-- the merged request's path for keys (nil, err when the script's request function failed)
local function merged_path(p, keys)
  local o = p.opts
  if o.request then
    local ok, path = result.callback_pcall(o.request, keys)
    if not ok then return nil, path end
    if type(path) ~= "string" or path:byte(1) ~= 47 then
      return nil, "batch.request must return a path starting with '/', got " .. type(path)
    end
    return path
  end
  local esc = {}
  for i = 1, #keys do esc[i] = escape(keys[i]) end
  local list = table.concat(esc, o.sep)
  if o.param then
    return p.path .. (str_find(p.path, "?", 1, true) and "&" or "?") .. escape(o.param) .. "=" .. list
  end
  return (str_gsub(p.path, "{keys}", function() return list end))
end

flush = function(p)
  if p.sent or p.done then return end
  p.sent = true
  if pending[p.group] == p then pending[p.group] = nil end
  if p.timer then hooks.clear_timer(p.timer) p.timer = false end
  local keys = {}
  for _, k in ipairs(p.keys) do if p.waiters[k] then keys[#keys + 1] = k end end
  if #keys == 0 then p.done = true return end
  local now = core.now()
  local t = p.ends - now
  if t <= 0 then return end -- every waiter's own timer is due now: they answer themselves
  local decision, retry_after = hooks.allow(p, now)
  if decision == "deny" then
    for _, rec in ipairs(take_waiters(p)) do
      local x = exchange_of(rec)
      if not x.done and x.a1 == rec then hooks.deny(x, rec, retry_after) end
    end
    return
  end
  local path, err = merged_path(p, keys)
  local first = nil
  for _, k in ipairs(keys) do first = first or p.waiters[k][1] end
  if not path then
    local recs = take_waiters(p)
    hooks.script_error(exchange_of(first), "batch.request of upstream " .. p.upstream, err, recs)
    return
  end
  p.probe = decision == "probe"
  p.keys = keys
  local x1 = exchange_of(first)
  p.endpoint = hooks.pick(p, x1) or false -- an upstream with several endpoints: which one (balancer)
  -- core.call's span and endpoint (agg.contract): the merged call's span is named after the first
  -- caller's section; one attempt, never hedged, on the endpoint the balancer chose
  local id = core.call(x1.ctx.rid, upstreams[p.upstream].index, p.method, path, p.headers, false,
                       math.floor(t + 0.5), true, x1.key, 1, false, p.endpoint or nil)
  p.id = id
  hooks.register(id, p)
  -- callers that come while it is out join it (the single-flight of merged calls), unless it went
  -- elsewhere than its route says: a session's endpoint out of service at the flush, the balancer
  -- chose another; a caller pinned to it, usable again meanwhile, must not be given that one's items
  local fl
  if hooks.went_on_route(p) then
    fl = inflight[p.group]
    if not fl then fl = {} inflight[p.group] = fl end
  end
  p.ends = now + math.floor(t + 0.5)
  for _, k in ipairs(keys) do
    if fl then fl[k] = p end
    for _, rec in ipairs(p.waiters[k]) do
      rec.id = id
      local x = exchange_of(rec)
      if rec ~= first then
        hooks.follow(p, x) -- (the balancer picked for the first caller: the others' sessions)
        if core.join then core.join(x.ctx.rid, id, x.key) end
      end
      if not x.own_timer and rec.ends < p.ends then
        x.own_timer = hooks.set_timer(rec.ends - now, own_timeout(x, rec, rec.t))
      end
    end
  end
  local s = M.stats(p.upstream)
  s.merged_calls = s.merged_calls + 1
end

--- Exchange x stops waiting (its timeout, its request ended): it leaves its batch; a batch no one
-- waits for any more is not sent, or its call is cancelled.
function M.leave(x, rec)
  local p = rec.merged
  if p.done then return end
  local k = x.batch.key
  local list = p.waiters[k]
  if not list then return end
  for i = 1, #list do
    if list[i] == rec then table.remove(list, i) break end
  end
  if #list == 0 then
    p.waiters[k] = nil
    if p.sent then unlist(p, k) end
  end
  p.nwait = p.nwait - 1
  if p.nwait > 0 then return end
  p.done = true
  if not p.sent then
    if pending[p.group] == p then pending[p.group] = nil end
    if p.timer then hooks.clear_timer(p.timer) p.timer = false end
  else
    unlist(p)
    hooks.cancel(p)
  end
end

---------------------------------------------------------------------------------------------------
-- The answer

-- key -> item of a merged answer d (a Lua value), by the call's split function or its match/items
local function split(p, d)
  local o = p.opts
  local by = {}
  if o.split then
    local t = o.split(d, p.keys)
    if type(t) ~= "table" then error("batch.split must return a table key -> item, got " .. type(t)) end
    for k, v in pairs(t) do by[key_text(k)] = v end
    return by
  end
  local list = d
  if o.items then
    list = type(d) == "table" and d[o.items]
    if type(list) ~= "table" then
      error(("the merged answer has no list '%s'"):format(o.items))
    end
  end
  if type(list) ~= "table" then error("the merged answer is not a list or an object of items") end
  if json.is_array(list) or list[1] ~= nil then
    local m = o.match
    for _, item in ipairs(list) do
      local k = type(item) == "table" and item[m]
      if k ~= nil and k ~= json.null then by[key_text(k)] = item end
    end
  else
    for k, v in pairs(list) do by[key_text(k)] = v end
  end
  return by
end

--- The transport's answer of merged call p (the breaker has counted it).
function M.answer(p, outcome, http_status, headers, body, data, ms, detail)
  unlist(p)
  local recs = take_waiters(p)
  local s = M.stats(p.upstream)
  s.merged_items = s.merged_items + #recs
  local ok2xx = outcome == "ok" and http_status >= 200 and http_status < 300 and data ~= nil and type(data) ~= "string"
  local by, err
  if ok2xx then
    local ok, v = result.callback_pcall(function() return split(p, json.materialize(data)) end)
    if ok then by = v else err = v end
  end
  if not by then
    if ok2xx then
      -- the answer does not split: every caller fails as for an answer that is not what was asked
      err = result.error_text(err)
      core.log("warn", ("merged call to upstream %s: %s"):format(p.upstream, err))
      outcome, data = "ok", err
    end
    for _, rec in ipairs(recs) do
      local x = exchange_of(rec)
      if not x.done and x.a1 == rec then
        hooks.done(x, rec, outcome, http_status, headers, body, data, ms, detail)
      end
    end
    return
  end
  local refs = {} -- key -> the parsed copy that callers after the first share
  local texts = {} -- key -> the item's JSON text, made before the first caller can change it
  local count = {}
  for _, rec in ipairs(recs) do
    local k = exchange_of(rec).batch.key
    count[k] = (count[k] or 0) + 1
  end
  for _, rec in ipairs(recs) do
    local x = exchange_of(rec)
    if not x.done and x.a1 == rec then
      local k = x.batch.key
      local item = by[k]
      if item == nil or item == json.null then
        hooks.missing(x, rec, ms)
      else
        -- the first caller of a key gets the item as materialized (no one else holds it); each
        -- later one its own copy, parsed from the item's JSON text (made once per key)
        local ref = refs[k]
        if ref == nil then
          ref = item
          if count[k] > 1 then
            local text, e = json.encode(item)
            refs[k] = text and json.parse(text) or ("the item cannot be encoded: " .. tostring(e))
          end
        end
        hooks.done(x, rec, "ok", http_status, nil, nil, ref, ms, nil)
      end
    end
  end
end

return M
