-- agg.sandbox: the environment endpoint scripts and the lib/ modules they require run in
-- (docs/api.md "The sandbox: what a script can and cannot do").
--
-- It is built from an allow-list, never from _G minus a few names: the base functions that touch
-- nothing outside the script, read-only views of string, table, math, coroutine, bit, the clock
-- part of os, debug.traceback, jit.off/flush for the script's own functions, and
-- the agg API. require reaches those, the runtime's agg and agg.json, and the modules of the
-- scripts folder (each script gets its own instances, so a module's tables are never shared
-- between two scripts). load and loadstring take
-- source text only and give the chunk the caller's environment; getfenv and setfenv reach only
-- the script's own environments. Not there: io, ffi, package, os.execute/exit/remove/rename/
-- getenv/tmpname, debug beyond traceback, string.dump, loadfile/dofile, print, and what would
-- change the worker's shared state for every script (math.randomseed, the JIT's switch for the
-- whole worker: jit.off()/jit.flush() without a function), or escape the script time limit
-- (jit.on, newproxy(true)'s finalizers); a name that is
-- refused says so when it is used ("io.popen is not available to scripts …").
--
-- An operator who trusts the folder opts out with scripts = { trusted = true } in gateway.lua
-- (agg.loader logs it at every load): scripts then see the whole of _G, as Lua code does.
local str_find, str_gsub, str_match = string.find, string.gsub, string.match
local readonly = require "agg.readonly"
local agg = require "agg"

local M = {}

local raw_getfenv, raw_setfenv, raw_rawset, raw_load, raw_loadstring, raw_loadfile =
  getfenv, setfenv, rawset, load, loadstring, loadfile
local raw_xpcall, raw_collectgarbage = xpcall, collectgarbage

--- The text of the script time limit's stop, after "file:line: " (worker/watchdog.c raises it in
-- serve, agg.testing in `aggway test`): "stopped: the script ran for more than N ms …".
M.STOP_TEXT = "stopped: the script ran for more than "
--- The text of the memory limit's stop (worker/watchdog.h, base/heap.h).
M.MEMORY_STOP_TEXT = "stopped: the scripts of this worker hold "

--- Makes chunk and every function defined in it run in LuaJIT's interpreter: compiled code does
-- not run hooks, and the script time limit (worker/watchdog.h) stops a runaway script with one.
-- Returns chunk.
function M.interpreted(chunk)
  if jit then jit.off(chunk, true) end
  return chunk
end

-- A function that raises "NAME is not available to scripts: why" at the caller's line.
local function refused(name, why)
  return function()
    error(name .. " is not available to scripts: " .. why, 2)
  end
end

-- A read-only view of the allowed fields of lib, with the refused ones raising when called.
local function lib_view(name, lib, allowed, why_refused)
  local t = {}
  for _, k in ipairs(allowed) do t[k] = lib[k] end
  for k, why in pairs(why_refused) do t[k] = refused(name .. "." .. k, why) end
  return readonly.view(t, name), t
end

local function all_but(lib, except)
  local names = {}
  for k in pairs(lib) do if not except[k] then names[#names + 1] = k end end
  return names
end

local NO_BYTECODE = "it turns functions into bytecode, which the sandbox does not load"
local SANDBOX = "the scripts' sandbox keeps them away from the machine (see docs/api.md, 'The sandbox: what a script can and cannot do')"

-- string without dump. Strings' methods ("x"):dump() come from the string metatable, so it reads
-- through the same table, and its metatable is protected: getmetatable("") gives "string", never a
-- table a script could change the string library of every script through.
--
-- find, match, gmatch and gsub are agg.pattern's (script/pattern.h): LuaJIT's semantics, but a
-- match that backtracks for long lets the hooks run (the script time limit, the load budget, the
-- spec harness's clock), so a pathological pattern is stopped like an endless loop. The strings'
-- methods are the same for every caller, so the runtime's own code (lua/agg) calls LuaJIT's
-- functions through locals (str_find …), never the methods: tools/check-runtime-patterns.
--
-- string.rep, string.format and table.concat are agg.pattern's too (and gsub checks its result as
-- it grows): each makes a large string in one C call, where no hook runs, so what it would make is
-- checked against script_memory_limit_mb first (base/heap.h agw_heap_lua_take); past it the
-- script gets "not enough memory" at its line.
local string_lib = {}
local pattern = require "agg.pattern"
for k, v in pairs(string) do string_lib[k] = v end
for k, v in pairs(pattern) do if k ~= "table_concat" then string_lib[k] = v end end
local string_view, string_methods = lib_view("string", string_lib, all_but(string_lib, { dump = true }), { dump = NO_BYTECODE })
do
  local mt = debug.getmetatable("") -- (debug's: once protected, getmetatable("") is "string")
  mt.__index = string_methods
  mt.__metatable = "string"
end

local os_refused = {}
for _, k in ipairs { "execute", "remove", "rename", "getenv", "tmpname", "setlocale" } do os_refused[k] = SANDBOX end
os_refused.exit = "it would stop the gateway (raise an error instead)"

local debug_refused = {}
for k in pairs(debug) do if k ~= "traceback" then debug_refused[k] = SANDBOX end end
-- debug.sethook would take the hook the script time limit stops scripts with
debug_refused.sethook = "the gateway's script time limit uses the hook"

-- The runtime's files ("@<lua dir>/agg/…"): their functions are every script's.
local RUNTIME_PREFIX = str_match(debug.getinfo(1, "S").source, "^(@.*/)agg/[^/]*$")
local RUNTIME_DIR = RUNTIME_PREFIX and RUNTIME_PREFIX:sub(2)
local RUNTIME_DIR_PATTERN = RUNTIME_DIR and str_gsub(RUNTIME_DIR, "%p", "%%%0")

-- Whether f is a Lua function of a script (not C, not the runtime's).
local function scripts_own(f)
  if type(f) ~= "function" then return false end
  local src = debug.getinfo(f, "S").source
  return src ~= "=[C]" and not (RUNTIME_PREFIX and src:sub(1, #RUNTIME_PREFIX) == RUNTIME_PREFIX)
end

local JIT_SHARED = "the JIT is the worker's, shared by every script: give a function of the script, " ..
                   "as in jit.%s(f, true)"

-- jit.on/off/flush for one of the script's own functions (and the functions defined in it); the
-- worker's switch (no argument), a trace number or another's function would change every script
-- of the worker. jit.on/jit.off are read when called (the loader wraps them while a top level runs).
local function jit_switch(name)
  return function(f, ...)
    if not scripts_own(f) then error("jit." .. name .. "(" .. (f == nil and "" or type(f)) ..
                                     ") is not available to scripts: " .. JIT_SHARED:format(name), 2) end
    return jit[name](f, ...)
  end
end
-- jit.on is not a script's at all: compiled code runs no hook, so a loop the script compiled
-- could not be stopped by the script time limit (M.interpreted keeps scripts in the interpreter)
local jit_lib = jit and {
  on = refused("jit.on", "compiled code runs no hook, so the script time limit could not stop a loop " ..
                         "in it (scripts run in LuaJIT's interpreter)"),
  off = jit_switch("off"), flush = jit_switch("flush"),
  status = jit.status, version = jit.version, version_num = jit.version_num, os = jit.os, arch = jit.arch,
}

-- math.random's generator is the worker's too: seeded once here, per VM, and not by scripts
-- (a script's seed would set the sequence every other script of the worker draws from)
do
  local f = io.open("/dev/urandom", "rb")
  local b = f and f:read(4)
  if f then f:close() end
  math.randomseed(b and #b == 4 and ((b:byte(1) * 256 + b:byte(2)) * 256 + b:byte(3)) * 256 + b:byte(4) or os.time())
end
local math_refused = { randomseed = "math.random's generator is the worker's, shared by every script " ..
                                    "(the gateway seeds it at start)" }

-- coroutine for scripts: resume takes only a coroutine a script created. The runtime runs every
-- handler and continuation in coroutines of its own (pooled from request to request), and a
-- script reaches them through coroutine.running(); resuming one would hand the script the
-- runtime's protocol, and through it the next request of any script (its req, its headers).
local script_coroutines = setmetatable({}, { __mode = "k" })
local raw_cocreate, raw_coresume = coroutine.create, coroutine.resume
local coroutine_lib = {}
for k, f in pairs(coroutine) do coroutine_lib[k] = f end
coroutine_lib.create = function(f)
  local co = raw_cocreate(f)
  script_coroutines[co] = true
  return co
end
local raw_cowrap, raw_running = coroutine.wrap, coroutine.running
coroutine_lib.wrap = function(f)
  if type(f) ~= "function" then error("bad argument #1 to 'wrap' (function expected, got " .. type(f) .. ")", 2) end
  return raw_cowrap(function(...)
    script_coroutines[raw_running()] = true -- (its coroutine is the script's, as create's are)
    return f(...)
  end)
end
-- yield only in a coroutine the script created: the handler's, a continuation's (and a fallback's,
-- which runs in the coroutine that settled its section, or in none: the runtime's main thread,
-- where the calls of a fetch_all start) are the gateway's, and wait only through agg.fetch_all; a
-- yield there left the request unanswered, or suspended the runtime half way through its own work
local raw_yield = coroutine.yield
coroutine_lib.yield = function(...)
  local co = raw_running()
  if not co or not script_coroutines[co] then
    error("coroutine.yield: this code runs in the gateway's coroutine (a handler, a continuation or a " ..
          "fallback), which waits only in agg.fetch_all, agg.fetch and agg.fetch_then; yield in a " ..
          "coroutine the script created (coroutine.create, coroutine.wrap)", 2)
  end
  return raw_yield(...)
end
coroutine_lib.resume = function(co, ...)
  if not script_coroutines[co] then
    if type(co) ~= "thread" then error("coroutine.resume: expects a coroutine, got " .. type(co), 2) end
    error("coroutine.resume: that coroutine is the gateway's, not one the script created " ..
          "(coroutine.create, coroutine.wrap)", 2)
  end
  return raw_coresume(co, ...)
end

-- table's writers for scripts: table.insert, remove, sort (and LuaJIT's move) write raw, past a
-- shared read-only view's __newindex, as rawset would; on a view they raise as script_rawset does
local table_lib = {}
for k, f in pairs(table) do table_lib[k] = f end
table_lib.concat = pattern.table_concat -- (above: checked against the memory limit first)
local function no_views(name, f)
  return function(t, ...)
    if readonly.is_view(t) then
      error(name .. ": " .. tostring(getmetatable(t)) .. " is shared by every script and read-only", 2)
    end
    return f(t, ...)
  end
end
for _, k in ipairs { "insert", "remove", "sort" } do table_lib[k] = no_views("table." .. k, table[k]) end
if table.move then -- (table.move(a1, f, e, t [, a2]) writes into a2, or a1 when a2 is absent)
  local raw_move = table.move
  table_lib.move = function(a1, f, e, t, a2)
    if readonly.is_view(a2 == nil and a1 or a2) then
      error("table.move: " .. tostring(getmetatable(a2 == nil and a1 or a2)) .. " is shared by every script and read-only", 2)
    end
    return raw_move(a1, f, e, t, a2)
  end
end
local ok_clear, raw_clear = pcall(require, "table.clear")
local script_clear = ok_clear and no_views("table.clear", raw_clear) or nil
table_lib.clear = script_clear -- (require "table.clear" also sets table.clear: never the raw one)

-- debug.traceback of a coroutine the script did not create would show another request's stack
-- (the runtime's pooled coroutines serve every script's requests in turn)
local raw_traceback = debug.traceback
local debug_lib = { traceback = function(a, ...)
  if type(a) == "thread" and not script_coroutines[a] and a ~= coroutine.running() then
    error("debug.traceback: that coroutine is the gateway's, not one the script created", 2)
  end
  local tb
  if type(a) == "thread" and a ~= coroutine.running() then
    tb = raw_traceback(a, ...)
  elseif type(a) == "thread" then -- (its own coroutine: level 1 is the script's caller, as below)
    local msg, level = ...
    level = (type(level) == "number" and level or 1) + 1
    tb = msg == nil and raw_traceback(a, "", level):sub(2) or raw_traceback(a, msg, level)
  else -- (traceback([msg [, level]]): level 1 is the script's caller of this function, not it)
    local level = ...
    level = (type(level) == "number" and level or 1) + 1
    if a == nil then -- (no message: LuaJIT takes an explicit nil for a message not to format)
      tb = raw_traceback("", level):sub(2)
    else
      tb = raw_traceback(a, level)
    end
  end
  -- the runtime's files by their names in the runtime ("agg/runtime.lua"), not by where the
  -- gateway is installed
  if type(tb) == "string" and RUNTIME_DIR then tb = str_gsub(tb, RUNTIME_DIR_PATTERN, "") end
  return tb
end }

-- newproxy(true) gives a userdata whose metatable a script fills: its __gc would run inside the
-- collector, where LuaJIT runs no hook, so a finalizer that looped could not be stopped by the
-- script time limit and would hold its worker for good
local raw_newproxy = newproxy
local function script_newproxy(arg)
  if arg ~= nil and arg ~= false then
    error("newproxy(" .. type(arg) .. ") is not available to scripts: a finalizer (__gc) runs where the " ..
          "script time limit cannot stop it; newproxy() and newproxy(false) are", 2)
  end
  return raw_newproxy(false)
end

-- Modules require gives a script (besides those of its scripts folder): the same objects for
-- every script, all read-only.
local MODULES = {
  string = string_view,
  table = lib_view("table", table_lib, all_but(table_lib, {}), {}),
  math = lib_view("math", math, all_but(math, math_refused), math_refused),
  coroutine = lib_view("coroutine", coroutine_lib, all_but(coroutine_lib, {}), {}),
  os = lib_view("os", os, { "time", "clock", "date", "difftime" }, os_refused),
  debug = lib_view("debug", debug_lib, { "traceback" }, debug_refused),
  bit = bit and lib_view("bit", bit, all_but(bit, {}), {}),
  jit = jit_lib and lib_view("jit", jit_lib, all_but(jit_lib, {}), {}),
  agg = agg,
  ["agg.json"] = agg.json,
  ["table.new"] = (pcall(require, "table.new")) and require "table.new" or nil,
  ["table.clear"] = script_clear,
}
local REFUSED_MODULES = {
  io = SANDBOX, ffi = SANDBOX, package = SANDBOX,
  ["jit.util"] = SANDBOX, ["jit.profile"] = SANDBOX, ["string.buffer"] = NO_BYTECODE,
  -- (a spec left in the scripts folder, where every .lua file loads as an endpoint: "module
  -- 'agg.testing' not found" said nothing of that; a fresh user's trial)
  ["agg.testing"] = "it is the spec harness: keep *_spec.lua files out of the scripts folder (in spec/ beside it), " ..
                    "where every .lua file is loaded as an endpoint",
}

-- Globals that are refused: reading one raises at once (a nil would fail later, less clearly).

local REFUSED_GLOBALS = {
  io = SANDBOX, package = SANDBOX, ffi = SANDBOX, loadfile = SANDBOX, dofile = SANDBOX,
  module = "a script returns its module table", print = "use error() or the page to say something",
}

local BASE = { "assert", "error", "ipairs", "next", "pairs", "pcall", "select", "tonumber", "tostring", "type",
               "unpack", "rawequal", "rawget", "getmetatable", "setmetatable", "newproxy", "gcinfo", "_VERSION" }

-- xpcall for scripts: the stops of the script time limit and the memory limit (worker/watchdog.h)
-- do not run the script's message handler. LuaJIT runs the handler of an error a hook raises with
-- hooks off, so a handler that looped (or ran long, or allocated) could not be stopped and would
-- hold its worker for good.
local function script_xpcall(f, handler, ...)
  return raw_xpcall(f, function(e)
    if type(e) == "string" and (str_find(e, M.STOP_TEXT, 1, true) or str_find(e, M.MEMORY_STOP_TEXT, 1, true)) then
      return e
    end
    return handler(e)
  end, ...)
end

-- rawset would write into a shared read-only view (the view's own slot shadows the library's)
local function script_rawset(t, k, v)
  if readonly.is_view(t) then
    error("rawset: " .. tostring(getmetatable(t)) .. " is shared by every script and read-only", 2)
  end
  return raw_rawset(t, k, v)
end

-- collectgarbage: the collector is the worker's, shared by every script. "count", "collect" and
-- "step" only look or do work now; "stop", "setpause", "setstepmul" … would change it for all.
local GC_OPTIONS = { count = true, collect = true, step = true }
local function script_collectgarbage(opt, ...)
  if opt == nil or GC_OPTIONS[opt] then return raw_collectgarbage(opt, ...) end
  error(("collectgarbage('%s') is not available to scripts: the garbage collector is shared by every " ..
         "script of the worker (count, collect and step are)"):format(tostring(opt)), 2)
end

local BYTECODE = "binary chunks are not loaded: scripts load source text only"

-- The chunk name a script's load/loadstring gives LuaJIT: never a file's ("@path"), so a script
-- cannot name its chunk after a runtime file. What is the runtime's own code is decided by that
-- name (the script time limit, the load budget and the dry run's clock never stop the runtime's
-- code), and a chunk called "@<lua dir>/agg/x.lua" would run a loop none of them stops. A name is
-- kept as text ("=name"); none gives LuaJIT's own ([string "…"]).
local function script_chunkname(name)
  if name == nil then return nil end
  name = str_gsub(tostring(name), "^[@=]+", "")
  return "=" .. name
end

local function is_bytecode(s)
  return type(s) == "string" and s:byte(1) == 27
end

-- s with each byte of the class class (a pattern) written as Lua writes it, "\010": for messages
-- that quote what a script holds.
local function escaped(s, class)
  return (str_gsub(s, class, function(c) return ("\\%03d"):format(c:byte()) end))
end

--- Compiles a file of the scripts folder (gateway.lua, an endpoint script, a lib/ module) from its
-- source text only: loadfile(file, "t"), or loadstring(src, "@" .. file, "t") when the caller has
-- read src already. A binary chunk is refused whoever loads it, trusted folders included: LuaJIT
-- does not verify bytecode, so a crafted chunk reads and writes any memory of the worker, past
-- every sandbox. Returns the function, or nil and a message with the file's place ("FILE:1:
-- binary chunks are not loaded: …" or Lua's own "FILE:LINE: …" of a syntax error).
function M.load_source(file, src)
  local f, err
  if src then f, err = raw_loadstring(src, "@" .. file, "t") else f, err = raw_loadfile(file, "t") end
  if f then return f end
  -- (LuaJIT's whole message for a binary chunk in mode "t"; a syntax error always has a place)
  if err == "attempt to load chunk with wrong mode" then return nil, file .. ":1: " .. BYTECODE end
  -- LuaJIT quotes the token it stopped near as written: a string continued over a line (`\` then
  -- a newline) put a raw line break in the message, and the rest read as another message without
  -- its place (fuzz_script_lua). Control characters are shown escaped, as Lua writes them
  return nil, escaped(err, "%c")
end

-- getfenv's and setfenv's f as raw_getfenv takes it from their own frame: a function as it is, a
-- level of the script (a whole number >= 1 with a function there) one deeper. Anything else
-- raises at the script's line, never inside the runtime (whose file a message would show).
local raw_getinfo = debug.getinfo
local function fenv_target(f, who)
  if type(f) == "function" then return f end
  -- levels counted from here: 1 this function, 2 getfenv/setfenv, 3 the script's level 1
  if type(f) == "number" and f >= 1 and f <= 1000000 and f % 1 == 0 and raw_getinfo(f + 2, "f") then
    return f + 1
  end
  if type(f) == "number" and f >= 1 and f <= 1000000 and f % 1 == 0 then
    error(("%s: there is no function at level %d of the stack"):format(who, f), 3)
  end
  error(("%s: expects a function or a level of the stack (a whole number >= 0), got %s"):format(
    who, type(f) == "number" and ("level " .. tostring(f)) or type(f)), 3)
end

-- What the sandbox shares with the modules a script requires: the script's module instances and
-- the folder they come from.
--   box = { loaded = { name -> value }, path = "dir/?.lua;dir/?/init.lua" }
local new_env

local LOADING = {} -- marks a module whose top level is running (a require loop)

-- " (did you mean 'lib.util'?)" for a module name close to name: the folder's lib/ modules
-- (lib/util.lua is "lib.util", lib/a/b.lua "lib.a.b") and the ones scripts may require; "" when
-- none is close (agg.config.suggest). Read only when a require fails.
local function module_suggestion(box, name)
  local known = {}
  for k in pairs(MODULES) do known[k] = true end
  local dir = box.path and str_match(box.path, "^(.-)/%?%.lua")
  if dir then
    local ok, files = pcall(require("agg.sys").listdir, dir .. "/lib")
    for _, f in ipairs(ok and files or {}) do
      known["lib." .. str_gsub(str_gsub(f, "%.lua$", ""), "/", ".")] = true
    end
  end
  if known["lib." .. name] then return " (did you mean 'lib." .. name .. "'?)" end -- (lib/util.lua as "util")
  return require("agg.config").suggest(name, known)
end

local function script_require(box, name)
  if type(name) ~= "string" then error("require: the module name must be a string", 3) end
  local m = box.loaded[name]
  if m == LOADING then
    error(("require: module '%s' requires itself (through a loop of requires)"):format(name), 3)
  end
  if m ~= nil then return m end
  m = MODULES[name]
  if m ~= nil then return m end
  if REFUSED_MODULES[name] then
    error(("module '%s' is not available to scripts: %s"):format(name, REFUSED_MODULES[name]), 3)
  end
  -- a module of the folder is named by dotted words ("lib.x"): no '/', no "..", nothing that
  -- reaches past the folder; and gateway.lua is the operator's (upstream URLs, keys, secrets)
  if not str_find(name, "^[%w_%-]+$") and not str_find(name, "^[%w_%-]+[%w_%-%.]*[%w_%-]$") or str_find(name, "..", 1, true) then
    error(("require: '%s' is not a module name (dotted words, like \"lib.x\" for lib/x.lua)"):format(
      escaped(name, "[%c\128-\255]")), 3)
  end
  if name:lower() == "gateway" then -- (any case: a case-insensitive file system finds gateway.lua)
    error("module 'gateway' is not available to scripts: gateway.lua is the operator's configuration", 3)
  end
  local file = box.path and package.searchpath(name, box.path)
  if not file then
    error(("module '%s' not found%s: scripts require agg, agg.json, string, table, math, coroutine, os, bit, " ..
           "jit, debug, and the modules of the scripts folder (require \"lib.x\" for lib/x.lua)"):format(
           name, module_suggestion(box, name)), 3)
  end
  local chunk, err = M.load_source(file)
  if not chunk then
    error(("error loading module '%s' from file '%s':\n\t%s"):format(name, file, err), 3)
  end
  raw_setfenv(M.interpreted(chunk), new_env(box))
  box.loaded[name] = LOADING
  local ok, v = pcall(chunk, name)
  if not ok then
    box.loaded[name] = nil
    error(v, 0)
  end
  if v == nil then
    -- Lua gives true, and a script that reads the module then failed on every request with
    -- "attempt to index upvalue 'util' (a boolean value)", naming neither the module nor the cure
    -- (a fresh user's trial). A module required for what it does (it changes another module's
    -- table) still loads: what it gives is a table whose every read raises the cure, which aggway
    -- check's dry run reports (agg.dryrun)
    local msg = ("module '%s' (%s) returned nothing: end it with `return M`, the table of what it gives the scripts")
      :format(name, file)
    v = setmetatable({}, { __index = function() error(msg, 2) end, __newindex = function() error(msg, 2) end,
                           __metatable = false })
  end
  box.loaded[name] = v
  require("agg.where").module_loaded(file, name) -- (its helpers' spec mistakes are placed in it)
  return v
end

-- A sandboxed environment: the allow-list, plus the functions that must know whose it is.
new_env = function(box)
  local env = {}
  local mine = setmetatable({ [env] = true }, { __mode = "k" }) -- the environments it may reach
  for _, k in ipairs(BASE) do env[k] = _G[k] end
  for _, k in ipairs { "string", "table", "math", "coroutine", "os", "debug", "bit", "jit" } do env[k] = MODULES[k] end
  env._G = env
  env.xpcall = script_xpcall
  env.rawset = script_rawset
  env.collectgarbage = script_collectgarbage
  env.newproxy = script_newproxy
  env.require = function(name)
    local m = script_require(box, name) -- (not a tail call: its errors point at the caller's line)
    return m
  end

  -- chunks made from source run interpreted, in this script's environment (or the one given)
  local function adopt(f, e)
    if e ~= nil then
      if type(e) ~= "table" then error("load: the environment must be a table", 3) end
      mine[e] = true
    end
    return raw_setfenv(M.interpreted(f), e or env)
  end
  env.loadstring = function(s, chunkname)
    if is_bytecode(s) then return nil, BYTECODE end
    local f, err = raw_loadstring(s, script_chunkname(chunkname), "t")
    if not f then return nil, err end
    f = adopt(f)
    return f
  end
  env.load = function(chunk, chunkname, mode, e)
    if is_bytecode(chunk) then return nil, BYTECODE end
    -- (mode "t" whatever the script asked: a reader's bytes too)
    local f, err = raw_load(chunk, script_chunkname(chunkname), "t")
    if not f then return nil, err end
    f = adopt(f, e)
    return f
  end

  -- getfenv(level | f): the environment, if it is one of this script's; the runtime's globals or
  -- another script's are never handed out
  env.getfenv = function(f)
    if f == nil then f = 1 end
    if f == 0 then return env end
    f = fenv_target(f, "getfenv")
    local e = raw_getfenv(f)
    if not mine[e] then
      error("getfenv: that function's environment is not this script's (a script reaches only its own)", 2)
    end
    return e
  end
  env.setfenv = function(f, e)
    if type(e) ~= "table" then error("setfenv: the environment must be a table", 2) end
    if f == 0 then error("setfenv(0, …) is not available to scripts: it would change the worker's globals", 2) end
    local level = type(f) == "number"
    f = fenv_target(f, "setfenv")
    local cur = raw_getfenv(f)
    if not mine[cur] then
      error("setfenv: only functions of this script can be given another environment", 2)
    end
    mine[e] = true
    if level then
      raw_setfenv(f, e)
      return nil
    end
    return raw_setfenv(f, e)
  end

  return setmetatable(env, {
    __index = function(_, k)
      local why = REFUSED_GLOBALS[k]
      if why then error(tostring(k) .. " is not available to scripts: " .. why, 2) end
      -- (`agg` is nil here, as a script's `local agg = agg or require "agg"` expects: a script that
      -- indexes it without the require is told the cure by agg.result.error_text)
      return nil
    end,
  })
end

--- A sandboxed environment for one endpoint file. scripts_path ("dir/?.lua;dir/?/init.lua") is
-- where its require finds the folder's modules; each file gets its own instances of them.
function M.env(scripts_path)
  return new_env({ loaded = {}, path = scripts_path })
end

--- An environment for a trusted folder (scripts = { trusted = true }): its globals are its own,
-- everything else is _G's. Chunks it makes from source still run interpreted (the time limit).
function M.trusted_env()
  local env = {}
  env._G = env
  env.xpcall = script_xpcall
  env.loadstring = function(...)
    local f, err = raw_loadstring(...)
    if f then M.interpreted(f) end
    return f, err
  end
  env.load = function(...)
    local f, err = raw_load(...)
    if f then M.interpreted(f) end
    return f, err
  end
  env.loadfile = function(...)
    local f, err = raw_loadfile(...)
    if f then M.interpreted(f) end
    return f, err
  end
  env.dofile = function(file)
    local f, err = env.loadfile(file)
    if not f then error(err, 2) end
    return f()
  end
  return setmetatable(env, { __index = _G })
end

return M
