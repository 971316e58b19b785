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
  for l in (src .. "\n"):gmatch("([^\n]*)\n") do lines[#lines + 1] = l end
  M.sources[path] = lines
end

--- Patterns for the text of a mistake: an option (`name =`, also `spec.name =`), a quoted name.
function M.option(name)
  return "[%s{,.;]" .. tostring(name):gsub("%p", "%%%0") .. "%s*="
end
function M.quoted(name)
  return "[\"']" .. tostring(name):gsub("%p", "%%%0") .. "[\"']"
end

--- Raises msg at the line of the calling script where `needle` (a pattern, see M.option and
-- M.quoted) occurs nearest to the call; level is the error() level of that script's frame, seen
-- from the caller of raise. Without a needle, or when nothing matches, raises at the call's line.
function M.raise(msg, level, needle)
  level = level + 1
  local info = needle and debug.getinfo(level, "Sl")
  if info and info.currentline and info.currentline > 0 and info.source:byte(1) == 64 then
    local lines = lines_of(info.source:sub(2))
    if lines then
      local at, first, last = info.currentline, info.linedefined, info.lastlinedefined
      local best, bestd
      for i, l in ipairs(lines) do
        if (" " .. l):find(needle) then
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
