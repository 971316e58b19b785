-- agg.where: puts a call spec's mistake at the line where the spec was written (issue 20).
--
-- error(msg, level) can only name the line of the script that called agg.fetch_all: LuaJIT keeps
-- no line for a table constructor, and a spec is often built in a helper far from that call
--   local function calls(id) return { r = { "reviews", "/r/" .. id, requird = true } } end  -- 24
--   …
--   return agg.page(agg.fetch_all(calls(id)))                                                -- 79
-- So the error searches the calling script's source for the text of the mistake (the option's
-- `name =`, the upstream's "name", the fetch_then's "key") and names the match nearest to the
-- call: inside the calling function first, then anywhere in the file (before the call wins a
-- tie). Found on another line, the message is "file:24: … (called at line 79)"; not found
-- (the name was computed), it is the plain "file:79: …". What it cannot tell apart: two specs
-- in one file with the same mistake — it names the one nearest to the call.
local str_find, str_gmatch, str_gsub, str_match = string.find, string.gmatch, string.gsub, string.match
local M = {}

-- file path (as in debug.getinfo's source, without '@') -> its lines, set by agg.loader for each
-- script it loads; a file that is not there is read on first use.
M.sources = {}
M.texts = {} -- path -> the text its lines were made from

local function lines_of(path)
  local lines = M.sources[path]
  if lines then return lines end
  local f = io.open(path, "rb")
  if not f then return nil end
  local src = f:read("*a")
  f:close()
  M.remember(path, src)
  return M.sources[path]
end

--- Keeps src (the text of the script at path) for the errors of its call specs.
function M.remember(path, src)
  if M.texts[path] == src then return end
  M.texts[path] = src
  local lines = {}
  for l in str_gmatch((src .. "\n"), "([^\n]*)\n") do lines[#lines + 1] = l end
  M.sources[path] = lines
end

--- Patterns for the text of a mistake: an option (`name =`, also `spec.name =`), a quoted name.
--- A key as messages name it: a string as it is, a number in decimal, anything else by its type
-- ("<table>"): tostring of a table runs its __tostring, the script's code, in the middle of the
-- runtime's work (where it could wait for a call).
function M.key_name(k)
  local t = type(k)
  if t == "string" then return k end
  if t == "number" then return tostring(k) end
  return "<" .. t .. ">"
end

function M.option(name)
  return "[%s{,.;]" .. str_gsub(M.key_name(name), "%p", "%%%0") .. "%s*="
end
function M.quoted(name)
  return "[\"']" .. str_gsub(M.key_name(name), "%p", "%%%0") .. "[\"']"
end

-- "@/…/lua/" of the runtime's own files: a frame there is never the script's place
local RUNTIME_PREFIX = str_match(debug.getinfo(1, "S").source, "^(@.*/)agg/[^/]*$")

--- The function that places a mistake when no frame of a script is at the error's level: a
-- fetch_then continuation's returned spec is checked after the continuation returned, from the
-- runtime (agg.fanout.settle_value sets this around the check, and clears it). nil otherwise.
M.fallback = nil

--- A function that returns the script function the runtime is running (a handler, or a fetch_then
-- continuation), or nil outside one (agg.fanout sets it). raise asks it when the frame at the
-- error's level is not a script's and no fallback is set: a script that tail-called the agg
-- function (`return agg.fetch_all(t)`) has no frame left, so the mistake is placed in that
-- function's lines, where the needle occurs nearest to its end.
M.running_fn = nil

--- "file:LINE: " for a mistake of fn (a function of a script) whose text matches needle (nil: its
-- first line): the match inside fn nearest to its end, where a continuation returns its spec.
-- When needle does not occur in fn, tail (another pattern, or nil) is looked for the same way.
-- Returns nil when fn is not a script's function.
function M.place_in(fn, needle, tail)
  local info = type(fn) == "function" and debug.getinfo(fn, "S")
  if not (info and info.source:byte(1) == 64 and info.linedefined > 0) then return nil end
  if RUNTIME_PREFIX and info.source:sub(1, #RUNTIME_PREFIX) == RUNTIME_PREFIX then return nil end
  local lines = (needle or tail) and lines_of(info.source:sub(2))
  local function last_of(pattern)
    if not (lines and pattern) then return nil end
    for i = math.min(info.lastlinedefined, #lines), info.linedefined, -1 do
      if str_find((" " .. lines[i]), pattern) then return i end
    end
  end
  return ("%s:%d: "):format(info.short_src, last_of(needle) or last_of(tail) or info.linedefined)
end

--- Raises msg at the line of the calling script where `needle` (a pattern, see M.option and
-- M.quoted) occurs nearest to the call; level is the error() level of that script's frame, seen
-- from the caller of raise. Without a needle, or when nothing matches, raises at the call's line.
-- When that frame is not a script's (a continuation's spec, checked after it returned; a script
-- that tail-called the agg function), the place is found in the lines of M.fallback, or of the
-- script function running (M.running_fn); there, when needle does not occur, the place is the last
-- use of tail (a pattern: the agg function's name; default the name msg starts with, "agg.page: …"
-- → "page", else "fetch", as in agg.fetch_all).
function M.raise(msg, level, needle, tail)
  level = level + 1
  local info = debug.getinfo(level, "Sl")
  local scripts = info and info.currentline and info.currentline > 0 and info.source:byte(1) == 64 and
                  not (RUNTIME_PREFIX and info.source:sub(1, #RUNTIME_PREFIX) == RUNTIME_PREFIX)
  if not scripts then
    local fn = M.fallback or (M.running_fn and M.running_fn())
    local place = fn and M.place_in(fn, needle, tail or str_match(msg, "^agg%.([%w_]+)") or "fetch")
    if place then error(place .. msg, 0) end
  end
  if not needle then info = nil end
  if scripts and info then
    local lines = lines_of(info.source:sub(2))
    if lines then
      local at, first, last = info.currentline, info.linedefined, info.lastlinedefined
      local best, bestd
      for i, l in ipairs(lines) do
        if str_find((" " .. l), needle) then
          -- inside the calling function first, then nearest, then before the call
          local d = math.abs(i - at) * 2 + (i > at and 1 or 0)
          if not (i >= first and i <= last) then d = d + 1e9 end
          if not bestd or d < bestd then best, bestd = i, d end
        end
      end
      if best and best ~= at then
        error(("%s:%d: %s (called at line %d)"):format(info.short_src, best, msg, at), 0)
      end
    end
  end
  error(msg, level)
end

return M
