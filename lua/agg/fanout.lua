-- agg.fanout: fan-out. agg.fetch_all starts the calls of a table of call specs as one group and
-- waits until each has settled; agg.fetch_then continuations run in child coroutines of their own
-- when their dependencies settled, and what they return (nothing, a call spec, another chain, a
-- table of specs: a nested fan-out, a computed value) settles their section.
local str_find = string.find
local json = require "agg.json"
local problem = require "agg.problem"
local callspec = require "agg.callspec"
local config = require "agg.config"
local where = require "agg.where"
local callable = require "agg.callable"
local result = require "agg.result"
local exchange = require "agg.exchange"

local M = {}

-- table.new(narray, nhash): a table with room for what it will hold, so it never grows
local new_tab = require "table.new"

local new_result, fail, log_error = result.new, result.fail, result.log_error
local start_call = exchange.start_call
local cache = require "agg.cache"

local upstreams = {}                                   -- name -> { index, timeout_ms }
-- A fetch_then marker's facts ({ dep, fn, opts }) and, once it ran on its own, the result it stands
-- for are fields of its own metatable (`info`, `resolved`), not values of weak-keyed tables: Lua
-- 5.1's collector marks such a value while it traverses the table, before it knows the key is dead,
-- so the continuation, what it captured and its result outlived their page by a cycle, and the
-- heap grew with the collector's pause (docs/performance.md "An eighth pass").
local getmt = debug.getmetatable
-- The job whose coroutine the runtime is running (agg.runtime's resume sets it and restores the
-- one before when the coroutine yields or ends): job, a request's context (its handler's
-- coroutine is ctx.co) or a continuation's record (run_then: co, ctx, group, key, info, fin); co,
-- its coroutine. False outside them. A job is known by what leads to it (the context, a group's
-- job field), never looked up by its coroutine.
local running = { job = false, co = false }
M.running = running
-- resume(job, ...), run_job(job, fn, a, n): agg.runtime's (M.bind_requests)
local resume, run_job

--- Binds the upstream table (agg.runtime.init).
function M.bind(ups) upstreams = ups end

--- Binds agg.runtime's resume(job, ...), which runs job's coroutine (see running) with ... until it
-- waits in a fetch_all and hands on its outcome when it ends, and run_job(job, fn, a, n), which
-- gives job a coroutine (job.co, one of the runtime's, reused) and runs fn(a) there, or
-- fn(unpack(a, 1, n)) when n is given.
function M.bind_requests(job_resume, job_run)
  resume, run_job = job_resume, job_run
end

--- The context of the request whose handler or continuation is running, or nil (the runtime's
-- own work between them, outside a request). Also in a coroutine the script made and resumed
-- from there: agg.page called in a coroutine.wrap is the request's page all the same (its
-- Cache-Control said public for a page that read the request's headers).
function M.running_ctx()
  local job = running.job
  return job and (job.ctx or job) or nil
end

-- the script function running on this coroutine (where.running_fn): the request's handler, or
-- the continuation (nil in a coroutine the script made, and on the runtime's own thread)
where.running_fn = function()
  local job = running.job
  if not job or running.co ~= coroutine.running() then return nil end
  if job.info then return job.info.fn end
  return job.ep and job.ep.handler
end

local settle, finish_then
local is_then
local run_later, drain_ready, drain_left, cancelled_result
local draining = false

-- What to do with a call's result: settle section `key` of group g, or, when `chain` is given,
-- run that fetch_then continuation with it, through the queue of ready continuations (below). A
-- chain's call can settle while it starts (a cache hit), inside the settle of the step before:
-- run there, a chain of such steps nested one resume and a dozen frames per step, and about 600
-- overflowed the stack (the section failed with "stack overflow").
local function deliver(g, key, chain, r)
  if not chain then return settle(g, key, r) end
  run_later(g, key, chain, false, r)
  if not draining or drain_left() then drain_ready() end
end
exchange.set_deliver(deliver)

local NO_THENS = {} -- a fan-out without continuations (shared, never written)
local NO_OPTS = {}  -- a chain without options (shared, never written)
local THEN_OPTIONS = { required = true, fallback = true } -- agg.fetch_then's
local memo, clear_memo = {}, callspec.clear_memo -- start_group's for callspec.normalize

-- True when group g descends from group anc (is anc, or a fan-out a continuation of anc started).
local function descends(g, anc)
  while g do
    if g == anc then return true end
    g = g[2]
  end
  return false
end

-- True when group g or a group it descends from fails fast (cancel_rest): what it would still run
-- (a queued continuation, a coroutine waiting in one of its fetch_alls) is for a section cancelled.
local function under_cancel(g)
  while g do
    if g.cancelling then return true end
    g = g[2]
  end
  return false
end

--- True when what the coroutine of job would do next is moot: its request ended, or it is a
-- continuation whose section was settled meanwhile (failing fast cancelled it) or whose group, or
-- a group that one descends from, fails fast. The runtime does not resume such a job.
function M.moot(job)
  local of = job.group -- (a continuation's: the group whose section it settles)
  if not of then return job.done end
  return job.ctx.done or of.results[job.key] ~= nil or under_cancel(of)
end

-- The result of section key of g, cancelled because g's section g.failed_key failed.
cancelled_result = function(g, key, opts)
  local r = new_result(key, opts)
  r.ms = 0
  fail(g.ctx, r, problem.cancelled_by(key, g.failed_key), opts)
  result.info_of(r).cancelled = true
  return r
end

-- Fail fast (the page is lost once a required section failed with no fallback): every section of
-- g not settled yet is settled as cancelled, its calls cancelled (agg.exchange.cancel: counted as
-- cancelled, never as the upstream's failure), and so are the fan-outs its continuations started.
-- A continuation waiting in the ready queue is settled as cancelled when its turn comes.
local function cancel_rest(g, failed_key)
  local ctx = g.ctx
  g.cancelling, g.failed_key = true, failed_key
  local failed = g.results[failed_key]
  for _, t in ipairs(g.thens) do
    if not t.started then
      t.started = true
      local on_failed = false
      for _, d in ipairs(t.deps) do if d == failed_key then on_failed = true end end
      if on_failed then -- it would never run anyway: its dependency failed
        local r = new_result(t.key, t.info.opts)
        r.ms = 0
        settle(g, t.key, fail(ctx, r, problem.dependency_failed(tostring(t.key), tostring(failed_key), failed.error),
                              t.info.opts))
      else
        settle(g, t.key, cancelled_result(g, t.key, t.info.opts))
      end
    end
  end
  exchange.cancel_where(ctx, function(x) return descends(x.group, g) end, function(x)
    if x.group == g then settle(g, x.key, cancelled_result(g, x.key, x)) end
  end)
  -- (a call still waiting for its tier-2 cache lookup is no exchange yet: its call started when
  -- Redis answered, and the continuation that made it ran on)
  cache.cancel_lookups(ctx, function(lg) return descends(lg, g) end)
  for key in pairs(g[1]) do
    if g.results[key] == nil then settle(g, key, cancelled_result(g, key, nil)) end
  end
end

-- Continuations whose dependencies have settled, run in the order they became ready: a queue of
-- (group, section key, the chain's info, its dependencies' results or false, and false or the one
-- result of a chain's own call; agg.fanout run_then), five slots an entry and no table made for
-- one, drained by the outermost settle, not a recursion. A
-- continuation that settles at once (it returns a value) makes the next one of a chain ready
-- inside its own settle: run there, a chain of a thousand held a thousand nested frames of the
-- settle's caller until its stack overflowed (about 1,400; the page failed with "stack overflow"
-- in the runtime's code).
local ready_q, ready_first, ready_n = {}, 1, 0
local drainer -- the coroutine whose drain_ready is running (false: the main thread)

run_later = function(g, key, info, args, r1)
  local i = ready_first + ready_n * 5
  ready_q[i], ready_q[i + 1], ready_q[i + 2], ready_q[i + 3], ready_q[i + 4] = g, key, info, args, r1
  ready_n = ready_n + 1
end

local function drain_loop()
  while ready_n > 0 do
    local i = ready_first
    local g, key, info, args, r1 = ready_q[i], ready_q[i + 1], ready_q[i + 2], ready_q[i + 3], ready_q[i + 4]
    ready_q[i], ready_q[i + 1], ready_q[i + 2], ready_q[i + 3], ready_q[i + 4] = nil, nil, nil, nil, nil
    ready_first, ready_n = i + 5, ready_n - 1
    if ready_n == 0 then ready_first = 1 end
    if g.results[key] ~= nil or g.ctx.done then
      -- settled meanwhile (failing fast cancelled it) or its request ended: nothing to run
    elseif under_cancel(g) then
      settle(g, key, cancelled_result(g, key, info.opts))
    else
      -- a mistake of the runtime's here fails this section, never the drain: what is left in
      -- the queue is other requests' too, and the caller of settle may be delivering another
      -- request's answer (single-flight's waiters)
      local ok, err = pcall(M.run_then, g, key, info, args, r1)
      if not ok then
        log_error(g.ctx, "continuation of " .. tostring(key), err)
        settle(g, key, fail(g.ctx, new_result(key, info.opts), problem.script_error(tostring(key)), info.opts))
      end
    end
  end
end

drain_ready = function()
  draining, drainer = true, coroutine.running() or false
  local ok, err = pcall(drain_loop)
  draining = false
  -- (settling a cancelled section raised: what is left runs at the next settle)
  if not ok then error(err, 0) end
end

-- True when the drain that is running was left half way: its coroutine is suspended or dead (a
-- trusted script yielded in a fallback; the sandbox refuses that to scripts). The queue is then
-- drained anew.
drain_left = function()
  return drainer and drainer ~= coroutine.running() and coroutine.status(drainer) ~= "normal"
end

-- A group is one fan-out: the calls of one fetch_all, or the specs a continuation returned.
-- It completes when every member has settled; then it resumes its coroutine or calls on_complete.
settle = function(g, key, r)
  if g.results[key] ~= nil then return end
  g.results[key] = r
  g.pending = g.pending - 1
  if g.pending > 0 and not g.cancelling and not r.ok and r.status == "unavailable" and result.is_required(r) then
    cancel_rest(g, key)
    return
  end
  -- the continuations that wait for this section (each settle looks at those only: looking at
  -- every continuation of the fan-out made a chain of n continuations cost n² steps)
  local thens = g.waiters and g.waiters[key] or NO_THENS
  for i = 1, #thens do
    local t = thens[i]
    if not t.started then
      local ready = true
      for j = 1, #t.deps do
        if g.results[t.deps[j]] == nil then ready = false break end
      end
      if ready then
        t.started = true
        local nd = #t.deps
        if nd == 1 then -- (one dependency: its result travels alone, no list is made)
          run_later(g, t.key, t.info, false, g.results[t.deps[1]])
        else
          local args = new_tab(nd, 0)
          for j = 1, nd do args[j] = g.results[t.deps[j]] end
          run_later(g, t.key, t.info, args, false)
        end
      end
    end
  end
  if ready_n > 0 and (not draining or drain_left()) then drain_ready() end
  if g.pending == 0 then
    if g.waiting then
      g.waiting = false
      local job = g.job
      if M.moot(job) then
        job.co = false -- (nothing left to do: its script does not go on)
      else
        resume(job)
      end
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
-- keys: the empty table to fill, or nil for a new one; max: how many keys t may have (nil: any)
-- Returns nil and the type of the first key that is neither a string nor a number, or nil and
-- false once t has more than max keys (counting stops there: a table of a million keys costs
-- max + 1 steps, not a million).
local function sorted_keys(t, keys, max)
  keys = keys or new_tab(4, 0)
  local n = 0
  for k in pairs(t) do
    local tk = type(k)
    if tk ~= "string" and tk ~= "number" then return nil, tk end
    n = n + 1; keys[n] = k
    if max and n > max then return nil, false end
  end
  M.sort_keys(keys, n)
  return keys
end

-- start_group's lists of keys and specs (and agg.page's of a page's keys), used again from one
-- fan-out to the next. Starting a call may start another fan-out before the first is done with
-- its list (a continuation that runs at once), and agg.page may wait for standalone chains, so
-- each takes a list of its own here and gives it back (give_list empties it).
local spare_lists, spare_n = {}, 0

local function take_list()
  if spare_n == 0 then return new_tab(8, 0) end
  local l = spare_lists[spare_n]
  spare_lists[spare_n] = nil
  spare_n = spare_n - 1
  return l
end

local function give_list(l, n)
  for i = 1, n do l[i] = nil end
  if spare_n < 8 then
    spare_n = spare_n + 1
    spare_lists[spare_n] = l
  end
end
--- A list to fill (from the spare ones) and the way to give it back with its length n (agg.page).
M.take_list, M.give_list = take_list, give_list

-- What a call result gives a section made of it: true and its data (json.null when it has none)
-- when it is ok or fell back, else false and its error.
local function data_of(sub)
  if sub.ok or sub.status == "fallback" then
    local d = sub.data
    if d == nil then d = json.null end
    return true, d
  end
  return false, sub.error
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
    if sub.status ~= "skipped" then
      local good, d = data_of(sub)
      if good then
        data[k] = d
      else
        data[k] = json.null
        first_err = first_err or d
      end
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

-- A dependency cycle among a fan-out's continuations would never settle: it is refused up front.
-- thens: the fan-out's continuations ({ key, deps }, in key order). Returns nil, or the first
-- cycle met as text ("'a' -> 'b' -> 'a'", at most 8 keys shown). A depth-first walk that keeps
-- its own stack: each continuation and each dependency is visited once (linear in the fan-out's
-- size, and no recursion, whatever the chain's length; a walk from every continuation was cubic
-- in a chain's length: 1,500 chained continuations held the worker for seconds).
local function find_cycle(thens)
  local by_key = {}
  for i = 1, #thens do by_key[thens[i].key] = thens[i] end
  local state = {}          -- then -> 1 on the walk's path, 2 done
  local path, at = {}, {}   -- the walk's path of continuations and, for each, its next dependency
  for i = 1, #thens do
    local root = thens[i]
    if not state[root] then
      local depth = 1
      path[1], at[1], state[root] = root, 1, 1
      while depth > 0 do
        local t = path[depth]
        local d = t.deps[at[depth]]
        if d == nil then
          state[t] = 2
          path[depth], at[depth] = nil, nil
          depth = depth - 1
        else
          at[depth] = at[depth] + 1
          local o = by_key[d]
          if o then
            if state[o] == 1 then -- back to a continuation on the path: the cycle is from it to here
              local from = depth
              while path[from] ~= o do from = from - 1 end
              local names = {}
              for j = from, depth do
                if #names == 8 then names[#names + 1] = "…" break end
                names[#names + 1] = ("'%s'"):format(tostring(path[j].key))
              end
              names[#names + 1] = ("'%s'"):format(tostring(o.key))
              return table.concat(names, " -> ")
            elseif not state[o] then
              depth = depth + 1
              path[depth], at[depth], state[o] = o, 1, 1
            end
          end
        end
      end
    end
  end
  return nil
end

-- parent: the group whose continuation started this one (fail fast cancels it with its parent),
-- or false. g[1] is the table of calls, g[2] the parent (in the array part: the hash part keeps
-- its size, which the page's path measures); job, the job (see running) whose coroutine a
-- fetch_all waits in, has its slot from the start (written on every fetch_all); g.cancelling is
-- set only while failing fast.
-- A fetch_all's calls are started by the runtime's resume, after the page's coroutine yielded,
-- not on the coroutine itself (defer: start_group leaves them here, and M.start_deferred starts
-- them): a call's start goes about 80 stack slots deep (start_call, launch, attempt, core.call),
-- and on the coroutine it grew every new coroutine's stack twice (47, 102, then 212 slots: two
-- reallocations and copies), which the collector then shrank again at its atomic step, where it
-- marks every suspended coroutine's whole stack (docs/performance.md "A fourteenth pass").
local START = {}                                      -- what fetch_all yields to have them started
local WAIT = {}                                       -- what it yields while its calls are answered
local d_g, d_keys, d_nk, d_n = nil, nil, 0, 0         -- the group, its keys and specs (start_group)

-- Starts the n calls of group g (keys[1..n], their specs keys[nk + 1 .. nk + n]) and gives the
-- list back.
local function start_calls(ctx, g, keys, nk, n)
  for i = 1, n do
    local spec = keys[nk + i]
    start_call(ctx, keys[i], spec, g, spec.chain or nil)
  end
  give_list(keys, nk + n)
end

local function start_group(ctx, tbl, level, parent, defer)
  local g = { tbl, parent or false, ctx = ctx, results = new_tab(0, 4), pending = 0, thens = NO_THENS,
              waiting = false, job = false }
  -- calls to start, in key order (a chain's spec carries it in spec.chain):
  -- keys[1..n] the calls' keys, keys[nk + 1 .. nk + n] their normalized specs (one table, a
  -- spare list given back once the calls started; when a mistake raises below, the collector
  -- takes it)
  -- every section of the request's fan-outs counts against the endpoint's max_sections
  -- (gateway.lua max_sections_per_request): one request must not make an unbounded number of
  -- upstream calls, nor hold the worker in the runtime's own code, where no script limit stops it
  local max = ctx.ep.max_sections
  local keys, bad = sorted_keys(tbl, take_list(), max - ctx.sections)
  if not keys then
    -- (at the script's line: where.raise places a continuation's nested fan-out in the
    -- continuation, whose frame is gone when its returned table is started)
    if bad == false then
      where.raise(("too many sections: this request's fan-outs would have more than %d in all " ..
                   "(max_sections_per_request in gateway.lua)"):format(max), level)
    end
    -- a section is named by its key in the page, the problems, the logs and Server-Timing, which
    -- the runtime formats on its own thread: a table key's __tostring (or __lt) would run there
    where.raise(("a section key must be a string or a number, got %s"):format(bad), level)
  end
  local nk, n = #keys, 0
  clear_memo(memo)
  for i = 1, nk do
    local key = keys[i]
    local v = tbl[key]
    local info = is_then(v)
    if info then
      if type(info.dep) == "string" or (type(info.dep) == "table" and not callspec.is_spec(info.dep)) then
        local deps = type(info.dep) == "string" and { info.dep } or info.dep
        -- each dependency is another key of this table: a longer list names one twice (and the
        -- runtime's work for it would grow with a list the script made once and used for every key)
        if #deps >= nk then
          error(("fetch_then for '%s' lists %d dependencies; this fetch_all has %d other calls")
                :format(tostring(key), #deps, nk - 1), level)
        end
        for _, d in ipairs(deps) do
          if tbl[d] == nil then
            where.raise(("fetch_then for '%s' depends on '%s', which is not a call in this fetch_all%s"):format(
              tostring(key), tostring(d), config.suggest(d, tbl)), level, where.quoted(d))
          end
          if d == key then where.raise(("fetch_then for '%s' depends on itself"):format(tostring(key)), level, where.quoted(d)) end
        end
        local t = { key = key, deps = deps, info = info, started = false }
        if g.thens == NO_THENS then g.thens = { t } else g.thens[#g.thens + 1] = t end
      else
        -- a chain with a call spec of its own as its dependency
        n = n + 1
        local spec = callspec.normalize(info.dep, upstreams, level, ctx, memo)
        spec.chain = info
        keys[n], keys[nk + n] = key, spec
      end
    else
      n = n + 1
      keys[n], keys[nk + n] = key, callspec.normalize(v, upstreams, level, ctx, memo)
    end
    g.pending = g.pending + 1
  end
  if g.thens ~= NO_THENS then
    -- (one continuation makes no cycle: it cannot depend on itself, checked above)
    local cycle = #g.thens > 1 and find_cycle(g.thens)
    if cycle then error("fetch_then dependency cycle: " .. cycle .. " (each waits for the next)", level) end
    -- section key -> the continuations that wait for it, in key order
    local waiters = new_tab(0, #g.thens)
    for _, t in ipairs(g.thens) do
      for _, d in ipairs(t.deps) do
        local w = waiters[d]
        if not w then waiters[d] = { t }
        elseif w[#w] ~= t then w[#w + 1] = t end -- a key listed twice in deps: once
      end
    end
    g.waiters = waiters
  end
  clear_memo(memo)
  ctx.sections = ctx.sections + nk
  if defer and nk > 0 then
    d_g, d_keys, d_nk, d_n = g, keys, nk, n
    return g
  end
  start_calls(ctx, g, keys, nk, n)
  return g
end

M.START, M.WAIT = START, WAIT

-- A continuation's coroutine ended (the runtime's resume: ok and v what it returned or raised, co
-- the coroutine): its section settles with what it returned, or fails.
finish_then = function(job, ok, v, co)
  job.co = false
  -- (moot: its request ended, or its section was cancelled while it ran; what it returned would
  -- start calls for nothing)
  if M.moot(job) then return end
  local ctx, g, key, info = job.ctx, job.group, job.key, job.info
  if not ok then
    log_error(ctx, "continuation of " .. tostring(key), v, co)
    settle(g, key, fail(ctx, new_result(key, info.opts), problem.script_error(tostring(key)), info.opts))
    return
  end
  M.settle_value(g, key, v, info.opts, info.fn)
end

--- Why the coroutine of job was given up when it yielded outside agg.fetch_all (the runtime
-- fails it with this).
function M.stray_yield(job)
  return (job.fin and "a continuation" or "a handler") .. " must not call coroutine.yield (use agg.fetch_all)"
end

--- The runtime's resume, when the coroutine of job yielded START from a fetch_all: starts the calls
-- start_group left for it (with pcall: a mistake fails the request as it did on the coroutine).
-- Returns "settled" when every call settled while starting (a fresh cache entry, an open breaker,
-- no time left): the caller resumes co at once, in a loop of its own, never from in here (a
-- script's loop of such fetches would nest one resume per fetch and overflow the stack). Returns
-- true when calls wait (settle resumes co at the last answer) or the request ended while they
-- started, and false and the error when the start raised or job is not the one the calls wait
-- for.
function M.start_deferred(job)
  local g, keys, nk, n = d_g, d_keys, d_nk, d_n
  if not g or g.job ~= job then
    return false, M.stray_yield(job)
  end
  d_g, d_keys = nil, nil
  local ctx = g.ctx
  local ok, err = pcall(start_calls, ctx, g, keys, nk, n)
  if not ok then return false, err end
  if g.pending > 0 then
    g.waiting = true
  elseif not ctx.done then
    return "settled"
  end
  return true
end

-- level: the error() level of the script line that called the agg function, counted from the
-- caller of current_ctx (2 = that caller's caller). Its mistakes go through where.raise, which
-- places them when that frame is gone (the script tail-called, `return agg.fetch_all(t)`).
local function current_ctx(fname, level)
  level = (level or 2) + 1
  -- (first: such a function may run on the runtime's main thread, where a fetch_all's calls start)
  if result.in_callback() then
    where.raise(fname .. " cannot wait here: a fallback, a response's metamethod or a merged call's " ..
          "function runs in the middle of the gateway's own work; make the call in the handler or a " ..
          "continuation (agg.fetch_then)", level)
  end
  local job = running.job
  if not job then
    where.raise(fname .. " can only be called while a request is being handled (inside a handler)", level)
  end
  if running.co ~= coroutine.running() then
    where.raise(fname .. " cannot wait in a coroutine the script made (coroutine.create, coroutine.wrap): " ..
          "call it in the handler or a continuation (agg.fetch_then)", level)
  end
  local ctx = job.ctx or job
  if not coroutine.isyieldable() then
    where.raise(fname .. " cannot wait here: it was called from inside a C function that cannot yield " ..
          "(a table.sort comparator, a string.gsub callback, …); move the call out of it", level)
  end
  if ctx.done then where.raise(fname .. ": the request has already ended", level) end
  return ctx, job
end

-- fetch_all for the script line `level` levels up from here, as error() counts (2 = the caller;
-- 1 when the caller's frame is gone, called in a tail call).
-- While the coroutine waits, its stack holds only what the wait needs (g): the collector's
-- atomic step marks every waiting coroutine's stack again, and each object a slot names is a
-- read of its header, cold by then (docs/performance.md "A sixteenth pass").
local function fetch_all_at(tbl, fname, level)
  local ctx, job = current_ctx(fname, level + 1)
  if type(tbl) ~= "table" then where.raise(fname .. " expects a table of call specs", level + 1) end
  -- (a continuation's fetch_all: its group's parent is the group the continuation settles)
  local g = start_group(ctx, tbl, level + 2, job.group, true)
  g.job = job
  tbl, ctx, job = nil, nil, nil
  if g.pending > 0 then
    coroutine.yield(START) -- (the calls start in the runtime's resume: M.start_deferred)
  end
  while g.pending > 0 do
    g.waiting = true
    coroutine.yield(WAIT)
  end
  return g.results
end

--- agg.fetch_all (see agg/init.lua for the user documentation).
function M.fetch_all(tbl)
  -- (a tail call: this frame, which would hold tbl while the coroutine waits, is gone; the script's
  -- line is then 1 level up from fetch_all_at, and fetch_all_at returns one value)
  return fetch_all_at(tbl, "agg.fetch_all", 1)
end

--- agg.fetch (see agg/init.lua): one call on its own; errors point at the script's line. It has no
-- section key of its own, so its problems, span and Server-Timing entry are named after the
-- upstream ("reviews did not answer in time"), not after a placeholder.
function M.fetch(spec)
  if type(spec) ~= "table" then where.raise("agg.fetch expects a call spec", 2) end
  local key = type(spec[1]) == "string" and spec[1] or "result"
  return fetch_all_at({ [key] = spec }, "agg.fetch", 2)[key]
end

-- Runs a continuation for section key of group g with its dependencies' results: args, their list
-- in order, or false and r1, the one result (one dependency, or a chain's own call).
function M.run_then(g, key, info, args, r1)
  local ctx = g.ctx
  local n = args and #args or 1
  for i = 1, n do
    local d = args and args[i] or r1
    if not d.ok then
      local deps = type(info.dep) == "table" and not callspec.is_spec(info.dep) and info.dep or { info.dep }
      local depname = callspec.is_spec(info.dep) and info.dep[1] or tostring(deps[i])
      local r = new_result(key, info.opts)
      r.ms = 0
      -- a chain whose required dependency failed fails the page as the dependency would: only
      -- when it was unavailable. Served stale or from its fallback, a required dependency does not
      -- fail the page, and neither does the chain that could not use it (the page was a 502,
      -- blamed on an optional section)
      if d.status == "unavailable" and result.is_required(d) then result.info_of(r).required = true end
      settle(g, key, fail(ctx, r, problem.dependency_failed(tostring(key), depname, d.error), info.opts))
      return
    end
  end
  -- the continuation's job (see running): what its coroutine's fetch_all and its end need, kept
  -- by what leads to it (the group a fetch_all of its waits on), gone with its page
  local job = { co = false, ctx = ctx, group = g, key = key, info = info, fin = finish_then }
  if args then run_job(job, info.fn, args, n) else run_job(job, info.fn, r1) end
end

-- Settles section key of g with what a continuation returned: nil (section skipped), a call spec,
-- another chain, a table of specs (nested fan-out), or a plain computed value. fn: the
-- continuation, whose lines place a mistake in what it returned (it has returned: no frame of the
-- script is on the stack while its spec is checked).
-- The on_complete of a fan-out a continuation returned: settles section key of g with its
-- section key (a chain), or with its sections combined (a table of specs). Functions of their
-- own: a function that makes a closure closes upvalues at each of its returns, a bytecode
-- (UCLO) LuaJIT 2.1 does not compile, and settle_checked runs at every step of a chain.
local function settles_with(g, key)
  return function(res) settle(g, key, res[key]) end
end
local function settles_combined(g, key, ctx, list, opts)
  return function(res) settle(g, key, combine(ctx, key, res, list, opts)) end
end

-- settle_value's checks and settling, under its pcall (a named function: no closure a step)
local function settle_checked(g, key, v, opts, fn, ctx, outer)
  if callspec.is_spec(v) then
    where.fallback = fn
    local spec = callspec.normalize(v, upstreams, 2, ctx)
    where.fallback = outer
    if opts.required then spec.required = true end
    if opts.fallback ~= nil and spec.fallback == nil then
      spec.fallback = opts.fallback
    end
    start_call(ctx, key, spec, g, nil)
    return
  end
  if result.is_result(v) then
    -- a result the continuation got (agg.fetch, an element of a fan-out's): its data is the
    -- section's, or its failure is (a result is no JSON data itself)
    local r = new_result(key, opts)
    r.ms = v.ms or 0
    local good, d = data_of(v)
    if good then
      r.ok, r.status, r.data = true, "ok", d
      settle(g, key, r)
    else
      settle(g, key, fail(ctx, r, d, opts))
    end
    return
  end
  local info = is_then(v)
  if info then
    where.fallback = fn
    local sub = start_group(ctx, { [key] = v }, 2, g)
    where.fallback = outer
    sub.on_complete = settles_with(g, key)
    if sub.pending == 0 then sub.on_complete(sub.results) end
    return
  end
  if type(v) == "table" then
    -- one pass: all specs or chains (a nested fan-out), all results (a fan-out's results), or a
    -- result held among other values (the first such key)
    local plain = getmetatable(v) == nil and next(v) ~= nil
    local all, results, held = plain, plain, nil
    for k, s in pairs(v) do
      if all and not (callspec.is_spec(s) or is_then(s)) then all = false end
      if not result.is_result(s) then
        results = false
      elseif held == nil then
        held = k
      end
    end
    if results then
      -- the results of an agg.fetch_all the continuation made: the section is made of them as a
      -- nested fan-out's (a result is no JSON data: encoded as it is, it had no data and a failed
      -- call's upstream body)
      settle(g, key, combine(ctx, key, v, #v > 0, opts))
      return
    end
    if all then
      local list = #v > 0
      where.fallback = fn
      local sub = start_group(ctx, v, 2, g)
      where.fallback = outer
      sub.on_complete = settles_combined(g, key, ctx, list, opts)
      if sub.pending == 0 then sub.on_complete(sub.results) end
      return
    end
    if held ~= nil then
      error(("the value returned holds a call result under '%s', which is no JSON data: return the result " ..
             "itself, the results of a fan-out, or its data (.data)"):format(tostring(held)), 0)
    end
  end
  local r = new_result(key, opts)
  r.ok, r.status, r.data, r.ms = true, "ok", v, 0
  settle(g, key, r)
end

function M.settle_value(g, key, v, opts, fn)
  local ctx = g.ctx
  opts = opts or NO_OPTS
  -- where.fallback is fn only while what fn returned is checked (normalize, start_group), never
  -- while calls start or other code of the request runs (settle may resume the handler)
  local outer = where.fallback
  if v == nil then
    local r = new_result(key, opts)
    r.ok, r.status, r.ms = true, "skipped", 0
    settle(g, key, r)
    return
  end
  local ok, err = pcall(settle_checked, g, key, v, opts, fn, ctx, outer)
  where.fallback = outer
  if not ok then
    -- a mistake raised without a place (error(msg, level) past the runtime's frames) is the
    -- continuation's: its first line
    if type(err) == "string" and fn and not str_find(err, "^[^\n]-:%d+: ") then err = (where.place_in(fn) or "") .. err end
    log_error(ctx, "continuation of " .. tostring(key), err)
    settle(g, key, fail(ctx, new_result(key, opts), problem.script_error(tostring(key)), opts))
  end
end

-- fetch_then markers: a chain to run inside fetch_all, or, when its dependency is a call spec of
-- its own, on its own the moment a field of it is read. Each marker's metatable is its own and holds
-- its facts (`info`) and, once it ran, its result (`resolved`); then_index, a local function no
-- script can reach, is what tells a marker's metatable from one a script made.
local function then_index(m, k)
  local mt = getmt(m)
  local r = mt.resolved
  if r == nil then
    local info = mt.info
    if not callspec.is_spec(info.dep) then
      error("agg.fetch_then(" .. tostring(info.dep) .. ", …) names sibling calls: use it inside agg.fetch_all", 2)
    end
    r = fetch_all_at({ [info.dep[1]] = m }, "agg.fetch_then", 2)[info.dep[1]]
    mt.resolved = r
  end
  return r[k]
end

-- The marker's metatable, or nil when v is no fetch_then marker.
local function then_mt(v)
  if type(v) ~= "table" then return nil end
  local mt = getmt(v)
  if mt and rawget(mt, "__index") == then_index then return mt end
  return nil
end

is_then = function(v)
  local mt = then_mt(v)
  return mt and mt.info or nil
end

--- For agg.page: runs, together in one fan-out, every standalone fetch_then chain among the
-- values of results that nothing has read yet (a chain put into the results table directly,
-- agg.page { r = agg.fetch_then({ "product", "/p/1" }, fn) }), so each stands for its result.
-- level: error() level of the script line that called agg.page, counted from here.
function M.resolve_thens(results, level)
  local pending
  for k, v in pairs(results) do
    local mt = then_mt(v)
    local info = mt and mt.resolved == nil and mt.info
    if info then
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
    for k, m in pairs(pending) do getmt(m).resolved = res[k] end
  end
end

--- The result a standalone fetch_then chain stands for once it ran (see resolve_thens), or v.
function M.then_result(v)
  local mt = then_mt(v)
  if mt then return mt.resolved end
  return v
end

--- agg.fetch_then (see agg/init.lua for the user documentation).
function M.fetch_then(dep, fn, opts)
  local td = type(dep)
  if td ~= "string" and td ~= "table" then
    where.raise("agg.fetch_then: the dependency must be a sibling key, a list of keys or a call spec, got " .. td, 2)
  end
  if td == "table" and not callspec.is_spec(dep) then
    if #dep == 0 then where.raise("agg.fetch_then: the list of dependencies is empty", 2) end
    for _, d in ipairs(dep) do
      if type(d) ~= "string" then where.raise("agg.fetch_then: dependency keys must be strings, got " .. type(d), 2) end
    end
  end
  if not callable.is(fn) then
    where.raise("agg.fetch_then: the second argument must be a function, got " .. callable.kind(fn), 2)
  end
  if opts ~= nil and type(opts) ~= "table" then
    where.raise("agg.fetch_then: options must be a table, got " .. type(opts), 2)
  end
  local o = opts or NO_OPTS
  where.check_options(o, THEN_OPTIONS, "agg.fetch_then", "(required, fallback)", 2)
  -- (getmetatable gives scripts a name, never the table.) The metatable is the chain's facts too
  -- (mt.info: dep, fn) and its section's options (mt.opts: required, fallback, decode): one table
  -- where there were three, for every fetch_then a page makes.
  local mt = { __index = then_index, __metatable = "agg.fetch_then", dep = dep, fn = fn,
               required = o.required == true, fallback = o.fallback, decode = true, info = false, opts = false }
  mt.info, mt.opts = mt, mt
  return setmetatable({}, mt)
end

return M
