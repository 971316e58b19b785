-- agg.sandbox: what an endpoint script (or a lib/ module) can reach. One case per way out that a
-- script could take to the machine, to the runtime or to another script. Each runs source text in
-- a sandboxed environment exactly as agg.loader runs a script file.
local sandbox = require "agg.sandbox"
local loader = require "agg.loader"
local testing = require "agg.testing"

local DIR = "spec/fixtures/sandbox/"

-- Runs src as a script's chunk in env (a fresh sandbox unless given); returns pcall's results.
local function run(src, env)
  local chunk = assert(loadstring(src, "=script"))
  setfenv(sandbox.interpreted(chunk), env or sandbox.env(DIR .. "two/?.lua"))
  return pcall(chunk)
end

local function refused(src, message)
  local ok, err = run(src)
  assert.is_false(ok, src .. " was allowed")
  assert.matches(message, tostring(err), 1, true)
end

describe("the sandbox keeps a script away from the machine:", function()
  it("io.popen", function()
    refused([[return io.popen("id"):read("*a")]], "io is not available to scripts")
  end)

  it("require 'io' and require 'ffi'", function()
    refused([[return require "agg.testing"]], "module 'agg.testing' is not available to scripts: it is the spec harness: " ..
            "keep *_spec.lua files out of the scripts folder")
    refused([[return require "io"]], "module 'io' is not available to scripts")
    refused([[return require "ffi"]], "module 'ffi' is not available to scripts")
  end)

  it("require('os').execute and the other os functions that reach the system", function()
    refused([[return require("os").execute("id")]], "os.execute is not available to scripts")
    for _, f in ipairs { "getenv('HOME')", "remove('/tmp/x')", "rename('/tmp/x', '/tmp/y')", "tmpname()" } do
      refused("return os." .. f, "os." .. f:match("^%a+") .. " is not available to scripts")
    end
    refused([[os.exit(3)]], "os.exit is not available to scripts: it would stop the gateway")
  end)

  it("package.loadlib and package.cpath", function()
    refused([[return package.loadlib("libc.so.6", "system")]], "package is not available to scripts")
    refused([[return require("package").cpath]], "module 'package' is not available to scripts")
  end)

  it("loadfile and dofile (they read any file)", function()
    refused([[return loadfile("/etc/passwd")]], "loadfile is not available to scripts")
    refused([[return dofile("/etc/passwd")]], "dofile is not available to scripts")
  end)

  it("the runtime's own modules (agg.sys reads files, agg.runtime holds every request)", function()
    for _, m in ipairs { "agg.sys", "agg.runtime", "agg.loader", "agg.sandbox", "jit.util" } do
      refused(("return require %q"):format(m), "'" .. m .. "'")
    end
  end)

  it("the C modules whose objects own C memory (a limits store, a breaker), and their metatables", function()
    for _, m in ipairs { "agg.limiter", "agg.breaker", "agg.router", "agg.resp_headers" } do
      refused(("return require %q"):format(m), "module '" .. m .. "' not found")
    end
    refused([[return require "agg.testing"]], "module 'agg.testing' is not available to scripts") -- (below)
    -- what a script does get (agg, its json values) leads to no store or breaker either: the
    -- runtime that holds the breakers (core.breakers) and the harness that holds a store are
    -- refused above. And were one reached (a trusted folder, a spec), its metatable is guarded:
    -- no __gc to call by hand before using the object, no methods to swap
    local store = require("agg.limiter").new(64)
    assert.equal("agg.limiter.store", getmetatable(store))
    assert.has_error(function() setmetatable(store, {}) end)
    local ok = store:check({}, 0, false)
    assert.is_true(ok)
    -- the json refs a script does get (json.parse) are C closures: no metatable to reach or set,
    -- no environment to set, no upvalue a script can change (debug is refused), nothing to call
    local ok2, mt, fenv, set, called = run([[
      local r = require("agg.json").parse("[1]")
      return getmetatable(r), pcall(setfenv, r, {}), pcall(setmetatable, r, {}), pcall(r)]])
    assert.is_true(ok2)
    assert.is_nil(mt)
    assert.is_false(fenv)
    assert.is_false(set)
    assert.is_false(called)
    local b = require("agg.breaker").new(3, 1000, 1)
    assert.equal("agw.breaker", getmetatable(b))
    assert.has_error(function() setmetatable(b, {}) end)
  end)
end)

describe("the string and table functions checked against the memory limit", function()
  -- string.format and table.concat are the sandbox's (agg.pattern: what one call makes is checked
  -- first, format's arguments read as its format reads them): their results, their errors and the
  -- calls of an argument's __tostring are LuaJIT's (a review's cases; only a tail call's error
  -- names 'format' where LuaJIT says '?')
  local CASES = {
    [[return string.format("%5.1s|", "abc")]],
    [[return string.format("%-10s|", "abc")]],
    [[return string.format("%x", -1)]],
    [[return string.format("%x", -1.5)]],
    [[return string.format("%X", -2^40)]],
    [[return string.format("%a", 1.5)]],
    [[return string.format("%i", 42)]],
    [[return string.format("%u", -3)]],
    [[return string.format("abc%%")]],
    [[return string.format("abc%")]],
    [[return string.format("abc%", 1)]],
    [[return string.format("%99d", 1)]],
    [[return string.format("%100d", 1)]],
    [[return string.format("%.3q", "abc")]],
    [[return string.format("%q", "a\0b\r\n\1\"\\")]],
    [[return string.format("%s", setmetatable({}, {__tostring=function() error("boom") end}))]],
    [[return string.format("%s", setmetatable({}, {__tostring=function() error({}) end}))]],
    [[return string.format("%s", setmetatable({}, {__tostring=function() error("boom", 0) end}))]],
    [[return string.format("%s", setmetatable({}, {__tostring=function() return 42 end}))]],
    [[return string.format("%s", setmetatable({}, {__tostring=function() return {} end}))]],
    [[return string.format("%s", setmetatable({}, {__tostring=function() return nil end}))]],
    [[local n=0; local s=string.format("%s", setmetatable({}, {__tostring=function() n=n+1 return 42 end})); return s, n]],
    [[local n=0; local inner=setmetatable({}, {__tostring=function() return "INNER" end}); local s=string.format("%s", setmetatable({}, {__tostring=function() n=n+1 return inner end})); return s, n]],
    [[local n=0; local s=string.format("%s", setmetatable({}, {__tostring=function() n=n+1 return "x" end})); return s, n]],
    [[return coroutine.wrap(function() return string.format("%s", setmetatable({}, {__tostring=function() coroutine.yield(1) return "y" end})) end)()]],
    [[return string.format("%d", 1, 2, 3)]],
    [[return string.format("%s %s", nil, true)]],
    [[return string.format("%s")]],
    [[return string.format("%d", "x")]],
    [[return string.format("%d")]],
    [[return string.format("%%s", setmetatable({}, {__tostring=function() error("called") end}))]],
    [[return string.format("%-%s", 1, setmetatable({}, {__tostring=function() error("called") end}))]],
    [[return string.format("%5%s", 1, setmetatable({}, {__tostring=function() error("called") end}))]],
    [[return string.format("%05-d", 1)]],
    [[return string.format("%5-s", "x")]],
    [[return string.format("%123s", setmetatable({}, {__tostring=function() error("called") end}))]],
    [[return string.format("%d %100s", 1, setmetatable({}, {__tostring=function() error("called") end}))]],
    [[return string.format("%y %s", 1, setmetatable({}, {__tostring=function() error("called") end}))]],
    [[return string.format("%.999999999999999999999999s", "x")]],
    [[return string.format("%c%c", 65, 66)]],
    [[return string.format("%5.2f|%e|%g", 3.14159, 1e10, 0.1)]],
    [[return string.format("%s", 1/0)]],
    [[return string.format("%d", 1/0)]],
    [[return string.format("%d", 2^63)]],
    [[return string.format("%5.3s", 12345.678)]],
    [[return string.format(12, 3)]],
    [[return string.format()]],
    [[return string.format("%s\0%s", "a", "b")]],
    [[return ("%s"):format(setmetatable({}, {__tostring=function() return "m" end}))]],
    [[return table.concat({1,2,"a"}, ",")]],
    [[return table.concat({1,{},3}, ",")]],
    [[return table.concat({1,2,3}, ",", 2, 5)]],
    [[return table.concat({}, {})]],
    [[return table.concat("x")]],
    [[return table.concat({1,2}, nil, 1.5)]],
    [[return table.concat({1,2}, ",", "1", "2")]],
    [[return table.concat({1,2}, ",", "a")]],
    [[return table.concat({1,2,3}, ",", 3, 1)]],
    [[return table.concat({[1]=1,[2]=true}, ",")]],
    [[return table.concat(setmetatable({}, {__index=function(t,k) return "x" end}), ",", 1, 3)]],
    [[return table.concat({1,2}, ",", -2^40, 1)]],
    [[return table.concat({1,2}, 5)]],
    [[local function f() return table.concat({{}}) end return f()]],
    [[local t = setmetatable({}, {__tostring=function(s) return string.format("%s", s) end}) return string.format("%s", t)]],
  }
  it("give LuaJIT's results and errors", function()
    local function shown(...)
      local t = {}
      for k = 1, 3 do t[k] = (tostring((select(k, ...))):gsub("0x%x+", "0x")) end
      return table.concat(t, " | ")
    end
    for _, src in ipairs(CASES) do
      if src:sub(1, 7) == "return " then src = "local a, b = " .. src:sub(8) .. "; return a, b" end
      local raw = assert(loadstring(src, "=script"))
      assert.equal(shown(pcall(raw)), shown(run(src)), src)
    end
  end)
end)

describe("a script that reads agg without requiring it", function()
  -- (a fresh user's trial: "attempt to index global 'agg' (a nil value)" named no cure)
  it("is told to require it, and `agg or require \"agg\"` still works", function()
    local ok, err = run([[return agg.page({})]])
    assert.is_false(ok)
    assert.equal("script:1: attempt to index global 'agg' (a nil value): " ..
                 'agg is not a global: begin the script with local agg = require "agg"',
                 require("agg.result").error_text(err))
    local v
    ok, v = run([[local agg = agg or require "agg"; return type(agg.page)]])
    assert.is_true(ok, v)
    assert.equal("function", v)
    ok, v = run([[agg = require "agg"; return type(agg.page)]]) -- its own global
    assert.is_true(ok, v)
    assert.equal("function", v)
  end)
end)

describe("the sandbox loads no bytecode:", function()
  local bytecode = string.dump(function() return "ran" end) -- (the spec may; a script may not)

  it("load, loadstring and a load reader refuse a binary chunk", function()
    local env = sandbox.env()
    local f, err = env.load(bytecode)
    assert.is_nil(f)
    assert.matches("binary chunks are not loaded", err, 1, true)
    f, err = env.loadstring(bytecode)
    assert.is_nil(f)
    assert.matches("binary chunks are not loaded", err, 1, true)
    local sent = false
    f, err = env.load(function() if not sent then sent = true return bytecode end end)
    assert.is_nil(f)
    assert.matches("wrong mode", err, 1, true)
  end)

  it("string.dump, as a library function or a string method", function()
    refused([[return string.dump(function() end)]], "string.dump is not available to scripts")
    refused([[return ("x").dump(function() end)]], "string.dump is not available to scripts")
  end)

  it("a chunk loaded from source runs in the script's environment, not the runtime's", function()
    local env = sandbox.env()
    local f = env.loadstring("return io")
    assert.equal(env, getfenv(f))
    local ok, err = pcall(f)
    assert.is_false(ok)
    assert.matches("io is not available to scripts", err, 1, true)
  end)
end)

describe("the sandbox keeps a script away from the runtime:", function()
  it("getfenv(0), getfenv of a runtime function, getfenv(level) of the runtime's caller", function()
    local ok, env = run([[return getfenv(0)]])
    assert.is_true(ok)
    assert.is_nil(rawget(env, "io")) -- its own, not _G
    refused([[return getfenv(require("agg").page)]], "not this script's")
    refused([[return getfenv(string.format)]], "not this script's")
    -- the function that called the script's (here: pcall, then the spec) is not the script's
    refused([[return getfenv(3)]], "not this script's")
  end)

  it("getfenv/setfenv of a value that is neither a function nor a level raise at the script's line", function()
    -- found by tests/fuzz/fuzz_script_lua.c: getfenv "GET /…" raised inside agg/sandbox.lua
    -- (not tail calls: a tail call's caller has no frame left for the error to name; the loader
    -- puts such an error at line 1 of the file, loader_spec)
    local ok, err = run([[local e = getfenv(1000)]])
    assert.matches("^script:1: getfenv: there is no function at level 1000 of the stack", tostring(err))
    for _, src in ipairs { [[local e = getfenv "GET /x"]], [[local e = getfenv(-1)]],
                           [[local e = getfenv(1.5)]], [[local e = getfenv(0/0)]], [[local e = getfenv(1e300)]],
                           [[local e = getfenv({})]], [[setfenv("x", {})]], [[setfenv(-500, {})]],
                           [[setfenv(1/0, {})]] } do
      local ok, err = run(src)
      assert.is_false(ok, src)
      assert.matches("^script:1: [gs]etfenv: expects a function or a level of the stack", tostring(err))
    end
  end)

  it("setfenv on a runtime function or level 0", function()
    refused([[setfenv(require("agg").page, {})]], "only functions of this script")
    refused([[setfenv(0, {})]], "setfenv(0, …) is not available")
    local ok, v = run([[local function f() return x end setfenv(f, { x = 5 }) return f() + #getfenv(1)._VERSION]])
    assert.is_true(ok, v)
  end)

  it("debug.getregistry, getupvalue, getinfo's functions, sethook", function()
    refused([[return debug.getregistry()]], "debug.getregistry is not available to scripts")
    refused([[return debug.getupvalue(require("agg").page, 1)]], "debug.getupvalue is not available")
    refused([[return debug.getmetatable("")]], "debug.getmetatable is not available")
    refused([[debug.sethook()]], "debug.sethook is not available to scripts: the gateway's script time limit")
    local ok, tb = run([[return debug.traceback("here")]])
    assert.is_true(ok)
    assert.matches("^here\nstack traceback", tb)
  end)

  it("collectgarbage('stop') and the collector's tuning (the worker's, shared)", function()
    refused([[collectgarbage("stop")]], "collectgarbage('stop') is not available to scripts")
    refused([[collectgarbage("setpause", 1000)]], "collectgarbage('setpause') is not available")
    local ok, kb = run([[return collectgarbage("count")]])
    assert.is_true(ok)
    assert.is_number(kb)
  end)

  it("print (stdout is the gateway's)", function()
    refused([[print("x")]], "print is not available to scripts")
  end)

  it("the string metatable: getmetatable('') is a name, and strings still have their methods", function()
    local ok, mt = run([[return getmetatable("")]])
    assert.is_true(ok)
    assert.equal("string", mt)
    refused([[getmetatable("").__index.format = nil]], "attempt to index")
    local ok2, s = run([[return ("%d-%s"):format(7, ("ab"):upper())]])
    assert.is_true(ok2)
    assert.equal("7-AB", s)
  end)
end)

describe("the sandbox keeps a script from the worker's shared state:", function()
  it("math.randomseed (one generator for every script of the worker); math.random works", function()
    refused([[math.randomseed(42)]], "math.randomseed is not available to scripts: math.random's generator is the worker's")
    refused([[require("math").randomseed(42)]], "math.randomseed is not available to scripts")
    local ok, v = run([[local x = math.random(1, 6) return x]])
    assert.is_true(ok, v)
    assert.is_true(v >= 1 and v <= 6)
  end)

  it("jit.off(), jit.on() and jit.flush() without a function: the worker's JIT, for every script", function()
    local on = jit.status()
    refused([[jit.off()]], "jit.off() is not available to scripts: the JIT is the worker's")
    refused([[require("jit").on()]], "jit.on is not available to scripts")
    refused([[jit.flush()]], "jit.flush() is not available to scripts")
    refused([[jit.flush(1)]], "jit.flush(number) is not available to scripts")
    assert.equal(on, (jit.status()))
  end)

  it("jit.off/flush of a function of the runtime's or C (every script's), but of its own", function()
    refused([[jit.off(require("agg").page, true)]], "jit.off(function) is not available to scripts")
    local ok, v = run([[local function f(n) return n + 1 end
                        jit.off(f, true) jit.flush(f) return f(1)]])
    assert.is_true(ok, v)
    assert.equal(2, v)
  end)

  it("jit.on of anything: a compiled loop runs no hook, and the time limit could not stop it", function()
    refused([[jit.on(string.format)]], "jit.on is not available to scripts: compiled code runs no hook")
    refused([[local function spin() while true do end end jit.on(spin, true)]], "jit.on is not available to scripts")
  end)
end)

describe("the runtime's coroutines and finalizers are not a script's", function()
  it("coroutine.resume takes only a coroutine the script created", function()
    -- the runtime runs handlers in pooled coroutines a script reaches with coroutine.running()
    local runtime_co = coroutine.create(function() coroutine.yield("the runtime's protocol") end)
    local env = sandbox.env(DIR .. "two/?.lua")
    env.RUNTIME_CO = runtime_co
    local ok, err = run([[local ok, v = coroutine.resume(RUNTIME_CO) return v]], env)
    assert.is_false(ok)
    assert.matches("coroutine.resume: that coroutine is the gateway's, not one the script created", err, 1, true)
    assert.equal("suspended", coroutine.status(runtime_co)) -- never ran
    refused([[local ok = coroutine.resume("x")]], "coroutine.resume: expects a coroutine, got string")
    local ok2, v = run([[local co = coroutine.create(function(a) local b = coroutine.yield(a + 1) return b * 2 end)
                         local _, x = coroutine.resume(co, 1) local _, y = coroutine.resume(co, 10)
                         local w = coroutine.wrap(function() coroutine.yield(5) end)
                         return x + y + w()]])
    assert.is_true(ok2, v)
    assert.equal(27, v)
    -- a coroutine.wrap's coroutine is the script's too: resumable, its traceback readable
    local ok3, v3 = run([[local co
                          local w = coroutine.wrap(function() co = coroutine.running() coroutine.yield(1) return 2 end)
                          w()
                          local tb = debug.traceback(co, "wrapped")
                          local ok, x = coroutine.resume(co)
                          return tostring(ok) .. x .. tb:sub(1, 7)]])
    assert.is_true(ok3, v3)
    assert.equal("true2wrapped", v3)
    refused([[local w = coroutine.wrap(42)]], "bad argument #1 to 'wrap' (function expected, got number)")
  end)

  it("newproxy(true): a __gc finalizer runs where no hook can stop it", function()
    refused([[local p = newproxy(true)]], "newproxy(boolean) is not available to scripts: a finalizer (__gc)")
    local ok, v = run([[local p = newproxy() local q = newproxy(false) return type(p) .. type(q)]])
    assert.is_true(ok, v)
    assert.equal("userdatauserdata", v)
  end)

  it("agg.array refuses a table with a metatable of its own (a shared read-only view)", function()
    for _, src in ipairs { [[local a = require("agg").array(table)]], [[local agg = require "agg" local a = agg.array(agg)]],
                           [[local a = require("agg").array(setmetatable({}, {}))]] } do
      refused(src, "the table has a metatable of its own")
    end
    local ok, err = run([[table.concat = nil]])
    assert.is_false(ok, "table stayed read-only")
    local ok2, v = run([[local agg = require "agg" local a = agg.array({ 1 }) return agg.array(a) == a]])
    assert.is_true(ok2, v)
    assert.is_true(v)
  end)

  it("table's writers refuse a shared view, as rawset does", function()
    for _, src in ipairs { [[table.insert(require("agg"), "planted")]], [[table.insert(string, 1, "x")]],
                           [[table.remove(table)]], [[table.sort(math)]], [[require("table.clear")(os)]] } do
      refused(src, "is shared by every script and read-only")
    end
    if table.move then refused([[table.move({ 1 }, 1, 1, 1, coroutine)]], "is shared by every script and read-only") end
    assert.is_nil(rawget(require("agg"), 1))
    local ok, v = run([[local t = { 3, 1, 2 } table.insert(t, 4) table.sort(t) table.remove(t, 1)
                        return table.concat(t, ",")]])
    assert.is_true(ok, v)
    assert.equal("2,3,4", v)
  end)

  it("load and loadstring never give a chunk a file's name (the runtime's files are never stopped)", function()
    local ok, v = run([[local f = loadstring("local tb = debug.traceback() return tb", "@/usr/share/lua/agg/runtime.lua")
                        local tb = f() return tb]])
    assert.is_true(ok, v)
    assert.matches("\n%s*/usr/share/lua/agg/runtime%.lua:1:", v) -- the name, shown as text ("=…")
    local f = sandbox.env().loadstring("return 1", "@/x/agg/runtime.lua")
    assert.equal("=/x/agg/runtime.lua", debug.getinfo(f, "S").source)
    f = sandbox.env().load("return 1", "==@x")
    assert.equal("=x", debug.getinfo(f, "S").source)
  end)

  it("debug.traceback shows the script's own stack, never another coroutine's", function()
    local other = coroutine.create(function() coroutine.yield() end)
    coroutine.resume(other)
    local env = sandbox.env(DIR .. "two/?.lua")
    env.OTHER = other
    local ok, err = run([[local tb = debug.traceback(OTHER)]], env)
    assert.is_false(ok)
    assert.matches("debug.traceback: that coroutine is the gateway's", err, 1, true)
    local ok2, v = run([[local co = coroutine.create(function() coroutine.yield() end) coroutine.resume(co)
                         return debug.traceback(co, "mine") .. "|" .. debug.traceback("here")]])
    assert.is_true(ok2, v)
    assert.matches("^mine", v)
    assert.matches("|here\nstack traceback:\n%s*script:2:", v) -- level 1 is the script, not the sandbox
    assert.not_matches("agg/sandbox%.lua", v)
  end)

  it("require takes module names, not paths, and never gateway.lua", function()
    refused([[local m = require "lib/../gateway"]], "is not a module name")
    refused([[local m = require "../x"]], "is not a module name")
    refused([[local m = require "lib..x"]], "is not a module name")
    refused([[local m = require "/etc/passwd"]], "is not a module name")
    refused([[local m = require "gateway"]], "module 'gateway' is not available to scripts")
    refused([[local m = require "GateWay"]], "module 'gateway' is not available to scripts")
  end)
end)

describe("one script cannot change what another sees", function()
  it("by assignment, rawset, the string metatable, agg.json, array metatables, setfenv or a lib module", function()
    local gw = testing.gateway { dir = DIR .. "two" }
    local tried = gw:get("/break").json
    for what, msg in pairs {
      assign = "table is shared by every script and read-only",
      rawset = "rawset: table is shared by every script and read-only",
      global_rawset = "rawset: table is shared by every script and read-only",
      string_mt = "attempt to index",
      agg_json = "agg.json is shared by every script and read-only",
      agg_json_rawset = "rawset: agg.json is shared by every script and read-only",
      array_mt = "attempt to index",
      setfenv_agg = "only functions of this script",
    } do
      assert.matches(msg, tried[what], 1, true)
    end
    assert.equal("changed", tried.lib) -- its own instance of the module
    local seen = gw:get("/victim").json
    assert.same({ concat = "a,b", format = "7", encode = "[1]", lib = "original" }, seen)
  end)
end)

describe("a trusted folder (scripts = { trusted = true } in gateway.lua)", function()
  it("runs its scripts without the sandbox", function()
    local gw = testing.gateway { dir = DIR .. "trusted" }
    assert.same({ io = "table", ffi = "table", getenv = "string" }, gw:get("/open").json)
  end)

  it("is checked like every option of gateway.lua", function()
    local config = require "agg.config"
    local src = "return {\n  upstreams = {},\n  scripts = { trustd = true },\n}\n"
    local c, errs = config.check({ upstreams = {}, scripts = { trustd = true } }, src, "gateway.lua")
    assert.is_nil(c)
    assert.matches("gateway.lua:3: scripts.trustd: unknown option (did you mean 'trusted'?)", errs[1], 1, true)
    src = "return {\n  scripts = { trusted = \"yes\" },\n}\n"
    c, errs = config.check({ scripts = { trusted = "yes" } }, src, "gateway.lua")
    assert.is_nil(c)
    assert.matches("gateway.lua:2: scripts.trusted: must be true or false, got string \"yes\"", errs[1], 1, true)
    c = config.check({}, "return {}", "gateway.lua")
    assert.is_false(c.scripts.trusted)
  end)
end)
