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
-- tie). Found on another line, the message is "file:24: … (called at line 79)"; found in none of
-- the file's lines but on one line of the folder's modules the scripts required (a helper of lib/),
-- "lib/util.lua:4: … (called at file:79)"; not found (the name was computed), it is the plain
-- "file:79: …". What it cannot tell apart: two specs
-- in one file with the same mistake — it names the one nearest to the call.
local str_find, str_gmatch, str_gsub, str_match = string.find, string.gmatch, string.gsub, string.match
local M = {}

-- file path (as in debug.getinfo's source, without '@') -> its lines, set by agg.loader for each
-- script it loads; a file that is not there is read on first use.
M.sources = {}
M.texts = {} -- path -> the text its lines were made from

-- the most of a file read to place a mistake (a script's own source is remembered when it loads)
local SOURCE_MAX = 8 * 1024 * 1024

local function lines_of(path)
  local lines = M.sources[path]
  if lines then return lines end
  local f = io.open(path, "rb")
  if not f then return nil end
  local src = f:read(SOURCE_MAX) or "" -- (a chunk named after a device or a huge file: no more)
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

--- Paths of the scripts folder's modules a script required (lib/util.lua), in the order first
-- required; agg.sandbox adds each. A mistake the calling script's source does not show is looked
-- for in them (a spec built by a helper of lib/).
M.modules = {}
local module_seen = {}
local module_name = {} -- path -> the name a script required it by ("lib.calls")

--- Notes that the module at path was loaded (agg.sandbox's require), by name.
function M.module_loaded(path, name)
  if not module_seen[path] then
    module_seen[path] = true
    M.modules[#M.modules + 1] = path
  end
  if name then module_name[path] = name end
end

-- The endpoints' handlers, each with the functions it closes over (agg.loader notes them): a
-- handler's group is the file and lines of the handler and of each function among its upvalues (a
-- decorator's wrapper closes over the handler it wraps; a handler, over the script's helpers it
-- calls). A mistake's text found in another handler's group, and not in the calling handler's, is
-- that handler's own, never what a helper built for this one. (Weak keys: a generation's handlers
-- go with it.)
local groups = setmetatable({}, { __mode = "k" })

--- Notes that fn is an endpoint's handler (agg.loader).
function M.handler_loaded(fn)
  if type(fn) ~= "function" or groups[fn] then return end
  local g = {}
  local function add(f)
    local info = debug.getinfo(f, "S")
    if info and info.what == "Lua" then
      g[#g + 1], g[#g + 2], g[#g + 3] = info.short_src, info.linedefined, info.lastlinedefined
    end
  end
  add(fn)
  for k = 1, 255 do
    local name, v = debug.getupvalue(fn, k)
    if name == nil then break end
    if type(v) == "function" then add(v) end
  end
  groups[fn] = g
end

-- Whether group g has a range of file holding lines from..to.
local function group_holds(g, file, from, to)
  for k = 1, #g, 3 do
    if g[k] == file and g[k + 1] <= from and g[k + 2] >= to then return true end
  end
  return false
end

-- Whether line i of file lies in another handler's group: one that does not hold the calling
-- function (lines first..last), at a line no group that holds it has.
local function in_other_handler(file, i, first, last)
  local mine = {}
  for _, g in pairs(groups) do
    if group_holds(g, file, first, last) then mine[#mine + 1] = g end
  end
  for _, g in ipairs(mine) do
    if group_holds(g, file, i, i) then return false end
  end
  for _, g in pairs(groups) do
    if group_holds(g, file, i, i) then return true end
  end
  return false
end

-- The folder of the module at path ("/srv/agw/scripts" for /srv/agw/scripts/lib/x.lua required as
-- "lib.x"), or nil when its name is not known.
local function module_folder(path)
  local name = module_name[path]
  if not name then return nil end
  local base = "/" .. str_gsub(name, "%.", "/")
  for _, rel in ipairs { base .. ".lua", base .. "/init.lua" } do
    if path:sub(-#rel) == rel then return path:sub(1, #path - #rel) end
  end
  return nil
end

local function module_place(needle, required_by, script)
  local found
  for _, path in ipairs(M.modules) do
    -- (required_by: only the modules those lines require, by the name they were required by;
    -- script: only the modules of its folder, where a process has loaded several, as the spec
    -- harness does)
    if required_by and not (module_name[path] and required_by(module_name[path])) then goto next_module end
    if script then
      -- (a module whose folder is not known is not counted: a mistake is never placed in another
      -- folder's file)
      local folder = module_folder(path)
      if not folder or script:sub(1, #folder + 1) ~= folder .. "/" then goto next_module end
    end
    local lines = lines_of(path)
    for i, l in ipairs(lines or {}) do
      if str_find((" " .. l), needle) then
        if found then return nil end
        found = ("%s:%d"):format(path, i)
      end
    end
    ::next_module::
  end
  return found
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

--- ", got <what v is>" for a message about a wrong value: a number's value, a string quoted (its
-- first 40 bytes), else its type ("got boolean", "got table"). aggway check tells a script's
-- literal from what a made-up answer gives by it (agg.dryrun).
function M.got(v)
  local t = type(v)
  if t == "number" then return ", got " .. tostring(v) end
  if t == "string" then return (", got %q"):format(#v > 40 and v:sub(1, 40) .. "…" or v) end
  return ", got " .. t
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

--- A function that returns the script function the runtime is running on the current coroutine
-- (a handler, or a fetch_then continuation; nil elsewhere, in a coroutine the script made too:
-- agg.fanout sets it). raise asks it when no frame of a script is left on the stack: the script
-- tail-called the agg function (`return agg.page(res)`), so its frame is gone.
M.running_fn = nil

-- a source (debug.getinfo's) of a script's file: "@path", not one of the runtime's own
local function script_source(src)
  return src:byte(1) == 64 and not (RUNTIME_PREFIX and src:sub(1, #RUNTIME_PREFIX) == RUNTIME_PREFIX)
end

-- a frame (debug.getinfo's) of a script's code, at a line
local function is_script(info)
  return info and info.currentline and info.currentline > 0 and script_source(info.source)
end

-- debug.getinfo(fn, "S") when fn is a function of a script's file, else nil
local function script_fn(fn)
  local info = type(fn) == "function" and debug.getinfo(fn, "S")
  return info and info.linedefined > 0 and script_source(info.source) and info or nil
end

--- "file:LINE: " for a mistake of fn (a function of a script) whose text matches needle (nil: its
-- first line): the match inside fn nearest to its end, where a continuation returns its spec.
-- Returns nil when fn is not a script's function.
function M.place_in(fn, needle)
  local info = script_fn(fn)
  if not info then return nil end
  local line = info.linedefined
  local lines = needle and lines_of(info.source:sub(2))
  if lines then
    for i = math.min(info.lastlinedefined, #lines), info.linedefined, -1 do
      if str_find((" " .. lines[i]), needle) then line = i break end
    end
  end
  return ("%s:%d: "):format(info.short_src, line)
end

-- The text of fn's own lines first..last (line number -> text): the functions defined inside fn
-- left out (their lines, and a line's text from where one starts), so that their `return g(…)`
-- is not taken for one of fn's tail calls (`agg.shape(r, function(v) return agg.pick(v, k) end)`
-- beside `return agg.page(res)`). The nested functions are fn's prototype's own (jit.util).
local function own_text(fn, lines, first, last)
  local own = {}
  for i = first, last do own[i] = lines[i] end
  local ok, jutil = pcall(require, "jit.util")
  if not ok then return own end
  for k = -1, -10000, -1 do
    local c = jutil.funck(fn, k)
    if c == nil then break end
    if type(c) == "proto" then
      local ci = jutil.funcinfo(c)
      local a, b = ci.linedefined, ci.lastlinedefined
      if a and own[a] then
        local s = str_find(own[a], "%f[%w_]function%f[^%w_]")
        if s then own[a] = own[a]:sub(1, s - 1) end
        for i = a + 1, math.min(b or a, last) do own[i] = "" end
      end
    end
  end
  return own
end

-- "file:LINE: " and a note for a mistake in a call that script function fn made as a tail call
-- (its frame is gone, so its line is not known): the one line of fn where needle occurs, else, when
-- fn has one tail call, the line where `return` comes before a match of name (a pattern: the agg
-- function's name); otherwise fn's first line and a note that says so. nil when fn is not a script's.
local function tail_place(fn, needle, name)
  local info = script_fn(fn)
  if not info then return nil end
  local lines = lines_of(info.source:sub(2))
  local first = info.linedefined
  local own = lines and own_text(fn, lines, first, math.min(info.lastlinedefined, #lines))
  -- how many lines of fn pass test, and the first that does; its first line counts only when no
  -- other does (that line also holds the code around the function's start,
  -- `y = agg.fetch_then("x", function()`)
  local function count(test)
    if not own then return 0 end
    local n, at = 0, nil
    for i = first + 1, math.min(info.lastlinedefined, #lines) do
      if own[i] ~= "" and test(" " .. own[i]) then n, at = n + 1, at or i end
    end
    if n == 0 and test(" " .. (lines[first] or "")) then return 1, first end
    return n, at
  end
  local function the_one(test)
    local n, at = count(test)
    return n == 1 and at or nil
  end
  -- the name's line only when fn makes one tail call (`return f(…)`): with more, the call that went
  -- wrong may be another (through a helper, an alias) than the one that names the agg function
  local line = needle and the_one(function(l) return str_find(l, needle) end)
  if not line and count(function(l) return str_find(l, "%f[%w_]return%s+[%w_.:%[%]\"']+%s*[%({\"']") end) == 1 then
    line = the_one(function(l)
      local s = str_find(l, name)
      return s and str_find(l:sub(1, s - 1), "%f[%w_]return%f[^%w_]")
    end)
  end
  if line then return ("%s:%d: "):format(info.short_src, line), "" end
  return ("%s:%d: "):format(info.short_src, first),
         " (in a call made as a tail call, `return f(…)`, by the function that starts at this line)"
end

--- For an agg function's options table opts: raises "FNAME: unknown option 'k' (did you mean
-- …?) LISTED" for a key known (a set) lacks, at the script's line where the key was written (see
-- raise; level as raise's, seen from the caller). agg.page's and agg.fetch_then's.
function M.check_options(opts, known, fname, listed, level)
  for k in pairs(opts) do
    if not known[k] then
      local kn = M.key_name(k)
      M.raise(("%s: unknown option '%s'%s %s"):format(fname, kn, require("agg.config").suggest(kn, known), listed),
              level + 1, M.option(k))
    end
  end
end

--- Raises msg at the line of the calling script where `needle` (a pattern, see M.option and
-- M.quoted) occurs nearest to the call; level is the error() level of that script's frame, seen
-- from the caller of raise. Without a needle, or when nothing matches, raises at the call's line.
-- When that frame is not a script's:
-- - a continuation's spec, checked after it returned: the place is found in M.fallback's lines;
-- - a C function that called the script's code back (string.gsub, pcall) or a frame of the runtime,
--   on the coroutine of the handler or continuation running: the first script frame further up, at
--   its line;
-- - none (the script tail-called the agg function, `return agg.page(x)`): in the lines of the
--   script function running (M.running_fn), see tail_place, the agg function being the one msg
--   starts with ("agg.page: …" → page), else fetch (as in fetch_all and call spec messages).
function M.raise(msg, level, needle)
  level = level + 1
  local info = debug.getinfo(level, "Sl")
  local scripts = is_script(info)
  if not scripts then
    if M.fallback then
      local place = M.place_in(M.fallback, needle)
      if place then error(place .. msg, 0) end
    else
      -- (only on the coroutine of the handler or continuation running: on the runtime's own thread,
      -- where a fallback or a response's metamethod runs, the frames further up are the runtime's
      -- and, in the spec harness, the spec's)
      local fn = M.running_fn and M.running_fn()
      for up = level + 1, fn and level + 100 or 0 do
        local outer = debug.getinfo(up, "Sl")
        if not outer then break end
        if is_script(outer) then error(("%s:%d: %s"):format(outer.short_src, outer.currentline, msg), 0) end
      end
      local called = str_match(msg, "^agg%.([%w_]+)")
      local place, note = tail_place(fn, needle, called and ("%f[%w_]" .. called .. "%f[^%w_]") or "fetch")
      if place then error(place .. msg .. note, 0) end
    end
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
      -- not in the calling function: a helper of lib/ that built the spec, when one line of the
      -- modules shows it, before another function of the script that writes the same (a fresh
      -- user's trial: another handler's own `requird` took a helper's mistake)
      local place
      local script = info.source:sub(2)
      if not best then
        place = module_place(needle, nil, script)
      elseif bestd >= 1e9 and in_other_handler(info.short_src, best, first, last) then
        -- (the text is another handler's: a helper of the script, outside every handler, keeps it)
        place = module_place(needle, function(name)
          local q = str_gsub(name, "%p", "%%%0")
          for _, l in ipairs(lines) do
            if str_find(l, "[\"']" .. q .. "[\"']") then return true end
          end
          return false
        end, script)
      end
      if place then
        error(("%s: %s (called at %s:%d)"):format(place, msg, info.short_src, at), 0)
      end
      if best and best ~= at then
        error(("%s:%d: %s (called at line %d)"):format(info.short_src, best, msg, at), 0)
      end
    end
  end
  error(msg, level)
end

return M
