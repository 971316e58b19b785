-- agg.loader: a script whose top level runs too long is stopped (not waited for), whatever it
-- does to escape, and a trusted script's own jit.on()/jit.off() is kept (a sandboxed script may
-- not switch the worker's JIT: sandbox_spec). Fixtures: spec/fixtures/loading.
local loader = require "agg.loader"

local DIR = "spec/fixtures/loading/"

describe("the load budget", function()
  local saved
  before_each(function()
    saved = loader.LOAD_BUDGET_S
    loader.LOAD_BUDGET_S = 0.05 -- (the endless fixtures each run this long)
  end)
  after_each(function()
    loader.LOAD_BUDGET_S = saved
    jit.on()
  end)

  -- lines: a pattern for the lines of the loop (the error names the one it was running)
  local function fails_at(dir, lines)
    local gen, errors = loader.load(DIR .. dir)
    assert.is_nil(gen)
    local text = table.concat(errors, "\n")
    local where = (DIR .. dir .. "/endless.lua:"):gsub("%p", "%%%0")
    assert.matches(where .. lines .. ": loading the scripts took longer than 0%.05 s", text)
    assert.equal(1, #errors, text)
  end

  it("stops an endless loop and names the line it was running", function()
    fails_at("plain", "[345]")
  end)

  it("stops a loop that catches the error with pcall and goes on", function()
    fails_at("catching", "[345]")
  end)

  it("stops a string pattern that backtracks inside one C call, at the script's line", function()
    fails_at("pattern", "3")
  end)

  it("stops a loop inside a coroutine", function()
    fails_at("coroutine", "3") -- (coroutine.wrap puts the line of f() in front)
  end)

  it("stops a loop after a trusted script turned the JIT on", function()
    fails_at("jiton", "4")
    assert.is_true((jit.status()))
  end)

  it("names the module a script required when the loop is there", function()
    local saved_path = package.path
    package.path = DIR .. "libloop/?.lua;" .. package.path
    local gen, errors = loader.load(DIR .. "libloop")
    package.path = saved_path
    package.loaded["lib.slow"] = nil
    assert.is_nil(gen)
    assert.matches("libloop/lib/slow%.lua:3: loading the scripts took longer than", table.concat(errors, "\n"))
  end)

  it("is one budget for the whole folder, not one per file", function()
    -- Each fixture's top level runs until 150 ms have passed on agg.sys's clock, which the loader
    -- reads too. Here that clock is a stepped one (1 µs a reading), so the result does not depend
    -- on the machine: on the wall clock, a worker descheduled for the last 50 ms of b.lua's loop
    -- let b.lua end on its own and c.lua was stopped instead.
    local sys = require "agg.sys"
    local real_clock, now = sys.monotonic_s, 0
    sys.monotonic_s = function() now = now + 1e-6 return now end
    finally(function() sys.monotonic_s = real_clock end)
    loader.LOAD_BUDGET_S = 0.25 -- a.lua takes 150 ms of it; one budget per file would let b.lua end
    local gen, errors = loader.load(DIR .. "many")
    sys.monotonic_s = real_clock
    assert.is_nil(gen)
    local text = table.concat(errors, "\n")
    assert.is_nil(text:find("many/a.lua", 1, true), text)
    assert.matches("many/b%.lua:%d+: loading the scripts took longer than 0%.25 s", text)
    for _, e in ipairs(errors) do
      assert.matches("many/[bc]%.lua:%d+: loading the scripts took longer than 0%.25 s", e)
    end
  end)

  it("lets a top level with real work load, and leaves the JIT as it was", function()
    loader.LOAD_BUDGET_S = saved -- (the default: a slow machine must not fail this one)
    assert.is_true((jit.status()))
    local gen, errors = loader.load(DIR .. "quick")
    assert.is_table(gen, errors and table.concat(errors, "\n"))
    assert.is_true((jit.status()))
  end)

  it("keeps a trusted script's own jit.off()", function()
    loader.LOAD_BUDGET_S = saved
    local gen = loader.load(DIR .. "jitoff")
    assert.is_table(gen)
    assert.is_false((jit.status()))
  end)
end)

describe("a script's os", function()
  it("has no exit: a script cannot stop the gateway (at load or in a handler)", function()
    local gen, errors = loader.load(DIR .. "exit")
    assert.is_nil(gen)
    assert.matches((DIR .. "exit/endless.lua:3: os.exit is not available to scripts"):gsub("%p", "%%%0"),
                   table.concat(errors, "\n"))
  end)
end)

describe("modules of the scripts folder", function()
  it("run sandboxed and interpreted, as the scripts that require them do", function()
    local gen, errors = loader.load(DIR .. "libsandbox")
    assert.is_table(gen, errors and table.concat(errors, "\n"))
    local probe = gen.endpoints[1].handler().json -- (a.lua answers with the module)
    assert.is_true(probe.sethook_refused)
    assert.is_true(probe.string_readonly)
    assert.is_nil(rawget(_G, "leaked_global"))
    assert.is_nil(package.loaded["lib.probe"]) -- the script's own instance, not the runtime's
  end)
end)

describe("route patterns", function()
  it("take RFC 3986 path characters as literal text", function()
    local r = assert(loader.parse_route("GET /a-b.c_d~e!$&'()*+,;=:@/{id}/x"))
    assert.same({ "a-b.c_d~e!$&'()*+,;=:@", { param = "id" }, "x" }, r.segments)
  end)

  -- found by tests/fuzz/fuzz_router.c: "GET /a\1\0" was a route with a literal no request path holds
  it("refuse any other byte in a literal segment, naming it on one line", function()
    for _, route in ipairs { "GET /a\1", "GET /a\0b", "GET /caf\195\169", "GET /a%20b", "GET /a{b", "GET /a?b",
                             "GET /a#b", "GET /a\127", "GET /a\"b", "GET /a<b>", "GET /a|b", "GET /a^b", "GET /a`b" } do
      local r, err = loader.parse_route(route)
      assert.is_nil(r, route)
      assert.matches("must be literal path characters", err)
      assert.is_nil(err:find("[%z\1-\31\127-\255]"), err)
    end
    local _, err = loader.parse_route("GET /a\1")
    assert.equal("route 'GET /a\\001': segment 'a\\001' must be literal path characters "
      .. "(letters, digits and -._~!$&'()*+,;=:@) or a {name} parameter", err)
  end)
end)

describe("errors of a folder that does not load", function()
  it("reports a typo in gateway.lua once, not as an auth error of every endpoint behind auth", function()
    local gen, errors = loader.load(DIR .. "gwtypo")
    assert.is_nil(gen)
    local text = table.concat(errors, "\n")
    assert.matches("gwtypo/gateway%.lua:4: deadlin_ms: unknown option %(did you mean 'deadline_ms'%?%)", text)
    assert.not_matches("asks for a JWT", text)
    assert.equal(1, #errors, text)
  end)

  it("puts an endpoint's auth error on the line of its auth key, not on a comment that mentions auth", function()
    local gen, errors = loader.load(DIR .. "authline")
    assert.is_nil(gen)
    local text = table.concat(errors, "\n")
    assert.matches("authline/account%.lua:4: endpoint: auth: this endpoint asks for a JWT but gateway%.lua has no auth%.jwt block", text)
    assert.equal(1, #errors, text)
  end)

  it("reports only the syntax error of a script that does not compile, not what the lint misread", function()
    local gen, errors = loader.load(DIR .. "brace")
    assert.is_nil(gen)
    local text = table.concat(errors, "\n")
    assert.matches("brace/page%.lua:11: '}' expected %(to close '{' at line 6%) near 'return'", text)
    assert.equal(1, #errors, text)
  end)
end)

describe("what a handler reads of its request (aggway check)", function()
  it("names a route parameter it lacks, a misspelt field and a route parameter written :name", function()
    local found = require("agg.dryrun").run(DIR .. "paramreads")
    local text = table.concat(found, "\n")
    local d = (DIR .. "paramreads/"):gsub("%p", "%%%0")
    assert.matches(d .. "colon%.lua:1: GET /dashboard/:user reads req%.params%.user, but its route has no parameter " ..
                   "'user' %(its segment ':user' is the literal text; a parameter is written {user}%)", text)
    assert.matches(d .. "page%.lua:7: GET /dashboard/{usr} reads req%.params%.user, but its route has no parameter " ..
                   "'user' %(did you mean 'usr'%?%)", text)
    assert.matches(d .. "page%.lua:12: GET /x/{id} reads r%.params%.idd, but its route has no parameter 'idd' " ..
                   "%(did you mean 'id'%?%)", text)
    assert.matches(d .. "page%.lua:12: GET /x/{id} reads r%.param, which a request does not have %(did you mean " ..
                   "'params'%?%)", text)
    assert.matches(d .. "page%.lua:14: GET /y reads req%.params%.id, but its route has no parameter 'id' %(it has no " ..
                   "parameters%)", text)
    -- (r.mine is written; the shared handler's names are its routes'; /left and /shadow are left alone)
    assert.equal(5, #found, text)
  end)

  it("leaves every script of the repository alone", function()
    assert.same({}, require("agg.dryrun").run("scripts"))
  end)
end)

describe("a module of lib/ that returns nothing", function()
  it("loads (a module required for what it does), and check's dry run names the cure once it is read", function()
    local gen, errors = loader.load(DIR .. "libnoreturn")
    assert.is_table(gen, errors and table.concat(errors, "\n"))
    local found = require("agg.dryrun").run(DIR .. "libnoreturn")
    assert.equal(1, #found, table.concat(found, "\n"))
    assert.matches("libnoreturn/page%.lua:2: module 'lib%.util' %([^)]*libnoreturn/lib/util%.lua%) returned nothing: " ..
                   "end it with `return M`", found[1])
  end)
end)

describe("a require of a module the folder lacks", function()
  it("names the nearest module of lib/", function()
    local gen, errors = loader.load(DIR .. "libtypo")
    assert.is_nil(gen)
    local text = table.concat(errors, "\n")
    assert.matches("libtypo/page%.lua:2: module 'lib%.utils' not found %(did you mean 'lib%.util'%?%): scripts require", text)
    -- lib/util.lua required without its folder
    assert.matches("libtypo/page2%.lua:1: module 'util' not found %(did you mean 'lib%.util'%?%)", text)
    -- and a module put beside the endpoints
    assert.matches("libtypo/helpers%.lua:1: the returned table has no route and no endpoints: every %.lua file of " ..
                   "the folder outside lib/ is an endpoint script; a module goes in lib/", text)
  end)
end)

describe("a syntax error whose token spans a line break", function()
  it("is one message, its control characters escaped (fuzz_script_lua)", function()
    local gen, errors = loader.load(DIR .. "nlstring")
    assert.is_nil(gen)
    assert.equal(1, #errors, table.concat(errors, "\n"))
    assert.matches("nlstring/page.lua:3: unfinished string near '\"GET /x\\010}'", errors[1], 1, true)
    assert.not_matches("\n", errors[1])
  end)
end)

describe("binary chunks", function()
  -- LuaJIT does not verify bytecode: a crafted chunk reads and writes any memory of the worker,
  -- past the sandbox, so every file of the folder is compiled from source text only
  local function refused(dir, file)
    local gen, errors = loader.load(DIR .. dir)
    assert.is_nil(gen)
    local text = table.concat(errors, "\n")
    local where = (DIR .. dir .. "/" .. file .. ":1: "):gsub("%p", "%%%0")
    assert.matches(where .. "binary chunks are not loaded: scripts load source text only", text)
    return text
  end

  it("are refused as an endpoint script, at its file's first line", function()
    refused("bytecode", "page.lua")
  end)

  it("are refused as a module of lib/, naming the script that required it", function()
    local text = refused("bytecodelib", "lib/evil.lua")
    assert.matches("error loading module 'lib.evil'", text, 1, true)
  end)

  it("are refused as gateway.lua", function()
    refused("bytecodegw", "gateway.lua")
  end)
end)

describe("an endpoint's handler", function()
  it("that is parsed JSON (json.parse's raw ref, a C closure) is refused at load, not at every request", function()
    local gen, errors = loader.load(DIR .. "refhandler")
    assert.is_nil(gen)
    assert.matches("refhandler/page%.lua:3: .*handler must be a function%(req%), got an agg%.json raw ref %(JSON data%)",
                   table.concat(errors, "\n"))
  end)
end)

describe("an error of a script's top level", function()
  it("is put at the script's line, never at a place in the runtime, whatever level raised it", function()
    local gen, errors = loader.load(DIR .. "unplaced")
    assert.is_nil(gen)
    local text = table.concat(errors, "\n")
    assert.matches("unplaced/level%.lua:2: boom\n", text .. "\n")
    assert.matches("unplaced/zero%.lua:3: plain\n", text .. "\n")
    -- a tail call leaves no frame of the script: line 1, the file
    assert.matches("unplaced/tail%.lua:1: bad argument #1 to '[%w?]+' %(string expected, got no value%)", text)
    assert.not_matches("agg/loader%.lua", text)
    assert.equal(3, #errors, text)
  end)
end)

describe("what a script returns", function()
  it("is read raw: a metatable, a userdata or a key's __tostring is refused, never run", function()
    local gen, errors = loader.load(DIR .. "metaloop")
    assert.is_nil(gen)
    local text = table.concat(errors, "\n")
    for _, f in ipairs { "loop", "auth", "key" } do
      assert.matches("metaloop/" .. f .. "%.lua:1: an endpoint script must return plain tables of route, handler and " ..
                     "options: a table with a metatable is not plain data", text)
    end
    assert.matches("metaloop/proxy%.lua:1: .*a userdata is not plain data", text)
    assert.equal(4, #errors, text)
  end)
end)

describe("a handler's error", function()
  it("is logged at the script's line, whatever level raised it", function()
    local testing = require "agg.testing"
    local gw = testing.gateway { dir = DIR .. "errplace" }
    gw:stub("up", "/x", { status = 503 })
    for _, case in ipairs { { "/two", 4, "raised at level 2" }, { "/three", 5, "raised at level 3" },
                            { "/zero", 8, "raised at level 0" }, { "/fallback", 6, "fallback raised", 200 },
                            { "/response", 10, "response raised" },
                            { "/tablekey", 20, "a section key must be a string or a number, got table" } } do
      testing.clear_script_errors()
      assert.equal(case[4] or 500, gw:get(case[1]).status)
      local text = table.concat(testing.script_errors, "\n")
      assert.matches(("errplace/[mp][oa][rg]e?%%.lua:%d: %s"):format(case[2], case[3]:gsub("%p", "%%%0")), text)
      assert.not_matches("agg/runtime%.lua:%d+: raised", text)
    end
  end)
end)

describe("a continuation's lines", function()
  it("place only what the continuation returned, never a later mistake of the request", function()
    local testing = require "agg.testing"
    local gw = testing.gateway { dir = DIR .. "errplace" }
    gw:stub("up", "/x", { json = {} })
    local r = gw:get("/nilthen")
    assert.equal(200, r.status)
    local err = r.json.err
    assert.matches("call to 'up': unknown option 'timout_ms'", err, 1, true)
    assert.not_matches("more%.lua:14:", err) -- (the continuation's line)
  end)
end)

describe("a file with many mistakes", function()
  -- the errors of a fixture folder that does not load, and their text
  local function refused(name)
    local gen, errors = loader.load(DIR .. name)
    assert.is_nil(gen)
    return errors, table.concat(errors, "\n")
  end

  it("names ten unknown keys of an endpoint and counts the rest", function()
    local errors, text = refused("manykeys")
    assert.equal(11, #errors, text)
    assert.matches("manykeys/page%.lua:%d+: endpoint: 15 more unknown keys", text)
  end)

  it("puts a missing handler on the line of the key misspelt for it, and names that key", function()
    local errors, text = refused("misspelthandler")
    assert.equal(2, #errors, text)
    assert.matches("misspelthandler/page%.lua:5: endpoint: unknown key 'hander' %(did you mean 'handler'%?%) %(route,", text)
    assert.matches("misspelthandler/page%.lua:5: endpoint: handler is missing %(is 'hander' meant to be it%?%)", text)
  end)

  it("puts each endpoint's missing handler on its own lines in a file of several", function()
    local errors, text = refused("severalhandlers")
    assert.matches("page%.lua:13: endpoint 2: handler is missing: give it handler", text)
    assert.matches("page%.lua:18: endpoint 3: unknown key 'hander' %(did you mean 'handler'%?%)", text)
    assert.matches("page%.lua:18: endpoint 3: handler is missing %(is 'hander' meant to be it%?%)", text)
    -- the key that holds a function, of three like handler, on its line in endpoint 4
    assert.matches("page%.lua:22: endpoint 4: handler is missing %(is 'handle' meant to be it%?%)", text)
    assert.matches("page%.lua:23: endpoint 4: unknown key 'handler_'", text)
    -- a control character of a key is shown escaped: the message stays one line
    assert.matches("endpoint 4: unknown key 'hand\\x0aler'", text, 1, true)
    for _, e in ipairs(errors) do assert.is_nil(e:find("\n", 1, true), e) end
    assert.equal(7, #errors, text)
  end)

  -- (a fresh user's trial: "route must be a string" at the first endpoint's route line)
  it("says a route is missing on its endpoint's handler line, naming the endpoint", function()
    local errors, text = refused("noroute")
    assert.matches("noroute/page%.lua:6: endpoint 2: route is missing: give it route = \"GET /product%-page/{id}\"", text)
    assert.matches("noroute/page%.lua:8: endpoint 3: route is missing", text)
    assert.matches("noroute/page%.lua:7: endpoint 3: unknown key 'rout' %(did you mean 'route'%?%)", text)
    assert.equal(3, #errors, text)
  end)

  it("names both lines of a route given twice in one file", function()
    local errors, text = refused("tworoutes")
    assert.equal(1, #errors, text)
    assert.matches("tworoutes/page%.lua:5: route 'GET /a/{id}' conflicts with 'GET /a/{id}' at [^ ]*tworoutes/page%.lua:4$",
                   text)
  end)

  it("names each endpoint's own line for its route and key mistakes in a file of several", function()
    local errors, text = refused("routelines")
    local d = "routelines/page%.lua:"
    assert.matches(d .. "6: route 'GET /cp/{id:%[a%-z%]%+}' conflicts with 'GET /cp/{id:%[0%-9%]%+}' at [^ ]*" .. d .. "5\n", text .. "\n")
    assert.matches(d .. "7: route 'GET /c d' must look like", text)
    assert.matches(d .. "8: route 'GET /cq/{x}/{x}': parameter {x} appears twice", text)
    assert.matches(d .. "9: route 'FETCH /cz': unknown method FETCH", text)
    assert.matches(d .. "10: endpoint 6: deadline_ms must be", text)
    assert.matches(d .. "11: endpoint 7: priority must be", text)
    assert.matches(d .. "12: endpoint 8: handler must be a function", text)
    assert.equal(7, #errors, text)
  end)

  it("puts a missing handler with no key like it on the endpoint's route line", function()
    local errors, text = refused("nohandler")
    assert.equal(1, #errors, text)
    assert.matches("nohandler/page%.lua:4: endpoint: handler is missing: give it handler = function%(req%) … end", text)
  end)
end)

describe("aggway check's dry run", function()
  it("stops at its time budget and says which endpoints it did not run", function()
    local dryrun = require "agg.dryrun"
    local saved = dryrun.BUDGET_S
    dryrun.BUDGET_S = -1
    local found = dryrun.run(DIR .. "errplace")
    dryrun.BUDGET_S = saved
    assert.equal(1, #found, table.concat(found, "\n"))
    assert.matches("^" .. (DIR .. "errplace/"):gsub("%p", "%%%0") .. "[%w]+%.lua:%d+: the dry run stopped after %-1 s, before GET /%w+: 7 endpoints were not run", found[1])
  end)

  it("places a mistake of a spec a lib/ helper built at the helper's line, and names the call's", function()
    local found = require("agg.dryrun").run(DIR .. "libhelper")
    local text = table.concat(found, "\n")
    local d = (DIR .. "libhelper/"):gsub("%p", "%%%0")
    assert.matches(d .. "lib/calls%.lua:5: call to 'up': unknown option 'requird' %(did you mean 'required'%?%)[^\n]* " ..
                   "%(called at [^\n]*page%.lua:5%) %(found by a dry run of GET /misspelt/{id}%)", text)
    assert.matches(d .. "lib/calls%.lua:8: unknown upstream 'nosuch'[^\n]* %(called at [^\n]*page%.lua:8%)", text)
    -- another handler of the script writes the same misspelt option: the helper's mistake stays the
    -- helper's, and the handler's is its own
    assert.matches(d .. "page%.lua:13: call to 'up': unknown option 'requird'[^\n]*%(found by a dry run of GET /own/{id}%)",
                   text)
    assert.equal(3, #found, text)
  end)

  it("never places a mistake in another folder's module, an init.lua one included", function()
    -- (a review: a module required as "lib.h" from lib/h/init.lua was counted for every folder)
    local a = require("agg.dryrun").run(DIR .. "whereA")
    assert.matches("whereA/lib/h/init%.lua:4: call to 'up': unknown option 'requird'", table.concat(a, "\n"))
    local b = require("agg.dryrun").run(DIR .. "whereB")
    local text = table.concat(b, "\n")
    assert.equal(1, #b, text)
    assert.matches("whereB/page%.lua:%d+: call to 'up': unknown option 'requird'", text)
    assert.is_nil(text:find("whereA", 1, true), text)
  end)

  it("takes a function defined inside a handler for that handler's own", function()
    -- (a review: the handler holding the calling function counted as another handler)
    local found = require("agg.dryrun").run(DIR .. "whereN")
    local text = table.concat(found, "\n")
    assert.matches("whereN/lib/calls%.lua:4: [^\n]*GET /other/{id}%)", text)
    assert.matches("whereN/page%.lua:11: call to 'up': unknown option 'requird'[^\n]*GET /nested/{id}%)", text)
    assert.equal(2, #found, text)
  end)

  it("tells a handler's own helpers and wrapped handlers apart from a lib/ helper's text", function()
    -- whereL: the script's helper (closed over by /local) and a lib/ helper write the same mistake,
    -- each named at its own line; whereW: each handler wrapped by a decorator (a review)
    local l = table.concat(require("agg.dryrun").run(DIR .. "whereL"), "\n")
    assert.matches("whereL/lib/calls%.lua:5: [^\n]*GET /misspelt/{id}%)", l)
    assert.matches("whereL/page%.lua:5: [^\n]*GET /local/{id}%)", l)
    local w = table.concat(require("agg.dryrun").run(DIR .. "whereW"), "\n")
    assert.matches("whereW/lib/calls%.lua:5: [^\n]*GET /misspelt/{id}%)", w)
    assert.matches("whereW/page%.lua:12: [^\n]*GET /own/{id}%)", w)
  end)

  it("places a lib/ helper's mistake there when the folder's own path has a lib/ in it (/var/lib/…)", function()
    -- (a review: the module's name was read from the path's first "/lib/")
    local tmp = os.tmpname()
    os.remove(tmp)
    local root = tmp .. "/var/lib/agw/libhelper"
    assert(os.execute(("mkdir -p '%s/lib'"):format(root)))
    for _, f in ipairs { "gateway.lua", "page.lua", "lib/calls.lua" } do
      local src = assert(io.open(DIR .. "libhelper/" .. f)):read("*a")
      local out = assert(io.open(root .. "/" .. f, "w"))
      out:write(src)
      out:close()
    end
    local found = require("agg.dryrun").run(root)
    os.execute(("rm -rf '%s'"):format(tmp))
    local text = table.concat(found, "\n")
    assert.matches("/var/lib/agw/libhelper/lib/calls%.lua:5: call to 'up': unknown option 'requird'[^\n]*GET /misspelt/{id}%)", text)
    assert.equal(3, #found, text)
  end)

  it("reports a cache block on a call whose method is not GET or HEAD", function()
    local found = require("agg.dryrun").run(DIR .. "postcache")
    assert.equal(1, #found, table.concat(found, "\n"))
    assert.matches("postcache/page%.lua:6: call to 'up': option 'cache' is for GET and HEAD calls only %(found by a " ..
                   "dry run of POST /orders%)", found[1])
  end)

  it("reports a merged call given retry, hedge or cache (every request of its endpoint fails)", function()
    local found = require("agg.dryrun").run(DIR .. "batchopts")
    local text = table.concat(found, "\n")
    assert.equal(3, #found, text)
    assert.matches("batchopts/page%.lua:%d+: call to 'up': a merged call %(batch%) is tried once: remove retry and " ..
                   "hedge %(found by a dry run of GET /retried%)", text)
    assert.matches("a merged call %(batch%) is tried once[^\n]*GET /hedged%)", text)
    assert.matches("a merged call %(batch%) is not cached[^\n]*GET /cached%)", text)
  end)

  it("reports a handler the script time limit stops on answers of {}, at the line it spun on", function()
    -- (spin.lua's handlers never end, whatever the answers; /quick ends in a millisecond)
    local found = require("agg.dryrun").run("spec/fixtures/timelimit")
    local text = table.concat(found, "\n")
    for _, route in ipairs { "GET /spin", "GET /spin-pcall", "GET /spin-after-call", "GET /spin-then",
                             "GET /spin-response", "GET /spin-pattern" } do
      assert.matches("timelimit/spin%.lua:%d+: stopped: the script ran for more than 100 ms without waiting for a " ..
                     "call %(script_time_limit_ms in gateway%.lua%), every upstream answering {} %(found by a dry " ..
                     "run of " .. route:gsub("%p", "%%%0") .. "%)", text)
    end
    assert.matches("spin%.lua:15: stopped", text) -- the loop's line
    assert.not_matches("GET /quick", text)
  end)
end)
