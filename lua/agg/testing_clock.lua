-- agg.testing_clock: the spec harness's virtual clock: its events (a deterministic heap by time
-- and order of scheduling), the step that runs the earliest one, and the script time limit every
-- entry into the runtime is run under (timed), as serve applies it. A gateway of agg.testing
-- holds the state: gw.clock (virtual ms), gw.events, gw.seq.
local loader = require "agg.loader"
local sys = require "agg.sys"

local M = {}

-- The event queue: a binary heap ordered by (time, order of scheduling), so runs are deterministic.
local function before(a, b) return a.at < b.at or (a.at == b.at and a.seq < b.seq) end

-- Runs fn at virtual time at (ms). Returns the event; setting its dead field cancels it.
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

-- The script time limit, as serve applies it (worker/watchdog.h): one entry into the runtime (a
-- request arriving, an answer, a timer) that runs longer than the folder's script_time_limit_ms is
-- stopped at the line it was at, and the request gets the 500 problem (or the continuation's
-- section fails) that serve gives. Serve counts real time; here the runner's CPU time counts
-- (sys.cpu_s), so a busy machine that deschedules the runner does not stop a short entry, and a
-- fixture can set a low limit. The stop is raised at every instruction of the
-- scripts' own code (anything but lua/agg), in a coroutine or (a fallback) on the thread that
-- entered, so a pcall in the script cannot go on; never in the runtime's own code.
local HOOK_EVERY = 10000 -- VM instructions between clock readings
-- Calls fn(...) under the script time limit of gw's scripts folder; raises what it raised.
local function timed(gw, fn, ...)
  local limit_ms = gw.gen.config.script_time_limit_ms
  local deadline = sys.cpu_s() + limit_ms / 1000
  local base = coroutine.running()
  local hit = false
  local hook
  hook = function()
    if not hit then
      if sys.cpu_s() <= deadline then return end
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
        deadline = sys.cpu_s() + limit_ms / 1000
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

M.schedule, M.peek, M.timed, M.step = schedule, peek, timed, step

return M
