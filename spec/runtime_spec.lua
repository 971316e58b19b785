-- The runtime itself (lua/agg): fetch_then in every form, deadlines, the page contract's edge
-- cases, JSON fidelity, and scripts that misbehave. Fixture scripts: spec/fixtures/runtime.
local testing = require "agg.testing"
local json = require "agg.json"

local DIR = "spec/fixtures/runtime"

describe("agg.fetch_then", function()
  local gw
  before_each(function()
    gw = testing.gateway { dir = DIR }
    gw:stub("a", "/x", { json = { n = 2 }, latency_ms = 10 })
    gw:stub("b", "/y", { json = { n = 3 }, latency_ms = 30 })
    gw:stub("c", "/sum", { json = { n = 5 }, latency_ms = 5 })
    gw:stub("c", "/n/{n}", { json = { n = 7 }, latency_ms = 5 })
  end)

  it("waits for a list of dependencies and gets their results in order", function()
    local page = gw:get("/then/list")
    assert.equal(200, page.status)
    assert.same({ n = "5" }, gw:calls("c")[1].query)
    assert.equal(30, gw:calls("c")[1].started_ms)
    assert.equal(35, page.elapsed_ms)
  end)

  it("takes a call spec of its own as its dependency", function()
    local page = gw:get("/then/spec")
    assert.equal(7, page.json.chained.data.n)
    assert.equal(30, page.elapsed_ms)
  end)

  it("runs on its own outside fetch_all when a field is read", function()
    local page = gw:get("/then/standalone")
    assert.equal(200, page.status)
    assert.equal(7, page.json.n)
    assert.equal(15, page.elapsed_ms)
  end)

  it("runs standalone chains put straight into agg.page, together", function()
    local page = gw:get("/then/in-page")
    assert.equal(200, page.status)
    assert.same({ status = "ok", data = { n = 7 } }, page.json.r)
    assert.same({ status = "ok", data = 30 }, page.json.s)
    assert.equal(30, page.elapsed_ms) -- a (10) then c (5) beside b (30): not one after the other
    assert.equal(1, #gw:calls("a"))
    assert.equal(1, #gw:calls("c"))
  end)

  it("gives agg.page a standalone chain's result when the script read it first", function()
    local page = gw:get("/then/in-page-read")
    assert.equal(200, page.status)
    assert.same({ status = "ok", data = { n = 7 } }, page.json.r)
    assert.equal(1, #gw:calls("a"))
  end)

  it("fans out from inside the continuation", function()
    local page = gw:get("/then/fanout")
    assert.equal("ok", page.json.more.status)
    assert.same({ first = { n = 3 }, second = { n = 7 } }, page.json.more.data)
    assert.equal(40, page.elapsed_ms)
  end)

  it("turns a plain value into a computed section and nil into no section", function()
    local page = gw:get("/then/value")
    assert.equal(4, page.json.double.data.n)
    assert.is_nil(page.json.nothing)
    assert.equal("true", page.headers["x-aggregation-completed"])
  end)

  it("follows a continuation that returns another chain", function()
    local page = gw:get("/then/chain")
    assert.equal(200, page.status)
    assert.equal(7, page.json.chained.data.n)
    assert.equal("/n/5", gw:calls("c")[1].path)
    assert.equal(45, page.elapsed_ms) -- x 10, then y 30, then c 5
  end)

  it("lets a continuation call fetch_all itself", function()
    local page = gw:get("/then/nested")
    assert.same({ p = 3, q = 7 }, page.json.inner.data)
  end)

  it("is not run when its dependency failed, and says why", function()
    gw:stub("a", "/x", { fault = "refuse" })
    local page = gw:get("/then/value")
    assert.equal(502, page.status) -- no section has data
    local double = page.json.sections.double
    assert.equal("unavailable", double.status)
    assert.equal("urn:aggway:problem:dependency-failed", double.error.type)
    assert.equal("a section this one depends on failed", double.error.title)
    -- the detail names the dependency, then says what happened to it (its title: no address)
    assert.equal("section double was not called: x failed: the upstream could not be reached", double.error.detail)
    assert.equal(0, #gw:calls("c"))
  end)

  -- (a fresh user's trial: the page was a 502, "required section" blamed on the optional chain)
  it("does not fail the page when its required dependency was served from its fallback", function()
    gw:stub("a", "/x", { fault = "refuse" })
    local page = gw:get("/then/on-fallback")
    assert.equal(200, page.status)
    testing.expect_section(page, "x", "fallback")
    testing.expect_section(page, "double", "unavailable", "dependency-failed")
    testing.expect_section(page, "own", "unavailable", "dependency-failed")
    gw:stub("a", "/x", { json = { n = 2 } })
    local fine = gw:get("/then/on-fallback")
    assert.equal(4, fine.json.double.data.n)
    assert.equal(2, fine.json.own.data.n)
  end)

  it("makes only its section unavailable when the continuation raises, and logs file:line", function()
    local page = gw:get("/then/error")
    assert.equal(200, page.status)
    assert.equal("urn:aggway:problem:script-error", page.json.broken.error.type)
    assert.equal("ok", page.json.x.status)
    assert.matches("chains.lua:%d+:", table.concat(gw:logs(), "\n"))
  end)

  it("fails the page when a required chained section fails", function()
    gw:stub("b", "/y", { status = 500 })
    assert.equal(502, gw:get("/then/required").status)
  end)

  it("refuses a dependency cycle with a clear error", function()
    local page = gw:get("/err/cycle")
    assert.equal(500, page.status)
    assert.matches("dependency cycle", table.concat(gw:logs(), "\n"), 1, true)
  end)
end)

-- Sends n requests path .. i whose clients leave at ms. In a function of its own: a local of the
-- caller's frame that still held the last request's page (a loop's variable stays in its
-- register after the loop) kept that request alive until the next one, and a count of the
-- requests still alive saw 1 now and then (1 run in 100-300 of this file).
local function leave_early(gw, path, n, ms)
  for i = 1, n do
    local p = gw:send("GET", path .. i)
    gw:at(ms, function() gw:disconnect(p) end)
  end
end

-- How many of the requests a fixture remembered (weakly) are still alive after two full
-- collections. The collections run here, outside any request: run inside one (a handler), they
-- would also mark the stale slots of the stacks that request runs on (its pooled coroutine's frame
-- slots not written yet, the entering thread's), which may hold an earlier request until written
-- again: bounded, not a leak (docs/performance.md "An eighth pass"), and where the slots fall
-- depends on which traces the JIT made.
local function alive_after_collect(gw)
  collectgarbage("collect")
  collectgarbage("collect")
  return gw:get("/held-alive").json.alive
end

describe("memory", function()
  -- More requests at once than the runtime keeps handler coroutines for (64): the ones it does
  -- not keep still hold their req while they wait to be collected, and req's lazy fields lead
  -- back to its context; neither may keep the other alive once the request has ended.
  it("frees every request once it has ended, however many ran at once", function()
    local gw = testing.gateway { dir = DIR }
    gw:stub("a", "/x", { json = { n = 1 }, latency_ms = 10 })
    local pages = {}
    for i = 1, 300 do pages[i] = gw:send("GET", "/held/" .. i) end
    gw:run()
    for i = 1, 300 do assert.equal(200, pages[i].status) end
    pages = nil
    assert.equal(0, alive_after_collect(gw))
  end)

  -- runtime.compact, the worker's idle hook (gateway/worker/gc.h): the tables a burst grew to one
  -- slot per request or call in flight are made again, sized for what they hold, and lose nothing a
  -- request still in flight needs.
  it("gives back the tables a burst grew once the worker is idle", function()
    local runtime = require "agg.runtime"
    local gw = testing.gateway { dir = DIR }
    gw:stub("a", "/x", { json = { n = 1 }, latency_ms = 10 })
    local function heap_kb()
      collectgarbage("collect"); collectgarbage("collect")
      return collectgarbage("count")
    end
    runtime.compact() -- from what earlier specs left
    local before = heap_kb()
    local pages = {}
    for i = 1, 3000 do pages[i] = gw:send("GET", "/held/" .. i) end
    gw:run()
    for i = 1, 3000 do assert.equal(200, pages[i].status) end
    pages = nil
    local grown = heap_kb()
    assert.equal(4, runtime.compact()) -- every table of requests and calls in flight
    local after = heap_kb()
    -- 3,000 requests at once: the tables of requests and calls in flight (their slots' arrays of
    -- 4,096 and more, 8 bytes each; measured: 64 KB given back, the same in every run; without
    -- runtime.compact, none. A request's context and a result's facts are their metatables' now,
    -- and no table maps a coroutine to its request: 447 KB before the first, 257 KB before the
    -- second, of weak tables that compact made again)
    assert.is_true(grown - after > 50, ("before %.0f KB, grown %.0f KB, after compact %.0f KB"):format(before, grown, after))
    -- and the runtime goes on serving, a request in flight across a compaction included
    local held = gw:send("GET", "/held/1")
    gw:at(5, function() runtime.compact(); collectgarbage("collect") end)
    gw:run()
    assert.equal(200, held.status)
    assert.equal(200, gw:get("/held/2").status)
    assert.equal(0, alive_after_collect(gw))
    -- a page that reads its section's data after a compaction gets that data (the results' facts
    -- table is one of those made again)
    runtime.compact()
    gw:stub("a", "/x", { json = { n = 1, secret = "x" } })
    assert.same({ status = "ok", data = { n = 1 } }, gw:get("/renamed").json.event)
  end)

  -- The runtime keeps requests and calls in flight at their id's slot (agg.contract: the low 24
  -- bits, unique among those alive at once) and checks the whole id there: an id of the same
  -- slot and another generation (a call or request that ended, its slot since reused) reaches
  -- nothing.
  it("ignores an id whose slot another request or call in flight holds", function()
    local runtime = require "agg.runtime"
    local gw = testing.gateway { dir = DIR }
    gw:stub("a", "/x", { json = { n = 1 }, latency_ms = 10 })
    local page = gw:send("GET", "/held/1")
    local seen
    gw:at(5, function()
      local calls = gw:calls("a")
      local id = calls[#calls].id
      seen = id
      runtime.on_call(id + 16777216, "ok", 200, nil, 1, nil)       -- not that call
      runtime.on_call(id + 3 * 16777216, "timeout", 0, nil, 1, nil)
      runtime.abort(page.rid + 16777216)                         -- not that request
    end)
    gw:run()
    assert.is_number(seen)
    assert.equal(200, page.status)
    assert.same({ status = "ok", data = { n = 1 } }, page.json.a)
    local _, in_flight = runtime.stats()
    assert.equal(0, in_flight)
  end)

  -- A fetch_then continuation waiting in a fetch_all of its own when its request ends early (the
  -- client leaves; the page fails fast) is never resumed: nothing may keep it, or its request,
  -- alive (its finisher once named it, and a weak-keyed table keeps its values)
  it("frees continuations that were waiting when their request ended", function()
    local gw = testing.gateway { dir = DIR }
    gw:stub("a", "/x", { json = { n = 1 }, latency_ms = 10 })
    gw:stub("a", "/x?inner", { json = { n = 2 }, latency_ms = 200 })
    local page = gw:get("/held-chain/0")
    assert.equal(200, page.status)
    assert.same({ n = 2 }, page.json.chained.data)
    leave_early(gw, "/held-chain/", 100, 50) -- the inner call is out
    gw:run()
    assert.equal(0, alive_after_collect(gw))
    -- and when a required section fails while the continuation waits (the page fails fast)
    gw:stub("a", "/must", { status = 500, latency_ms = 50 })
    assert.equal(502, gw:get("/held-chain/fail").status)
    assert.equal(0, alive_after_collect(gw))
  end)

  it("frees requests whose client left while their calls were out", function()
    local gw = testing.gateway { dir = DIR }
    gw:stub("a", "/x", { json = { n = 1 }, latency_ms = 100 })
    leave_early(gw, "/held/", 100, 10)
    gw:run()
    assert.equal(0, alive_after_collect(gw))
  end)
end)

describe("deadlines", function()
  it("shrinks each call's timeout to the time left, and skips calls after the deadline", function()
    local gw = testing.gateway { dir = DIR }
    gw:stub("a", "/x", { json = { n = 1 }, latency_ms = 100 })
    gw:stub("b", "/y", { json = { n = 2 }, latency_ms = 50 })
    local page = gw:get("/deadline")
    assert.equal(20, gw:calls("b")[1].timeout_ms)
    assert.equal(120, page.elapsed_ms)
    assert.equal("unavailable", page.json.second.status)
    assert.equal(504, page.json.second.error.status)
    -- agg.fetch has no section key: its problem and Server-Timing entry name the upstream
    assert.equal("section b, upstream b", page.json.second.error.detail)
    assert.matches("^a;dur=100", page.headers["server-timing"])
    -- the log says the deadline cut it, not the call's own timeout_ms
    assert.matches("(the page's deadline cut the call's timeout)", table.concat(gw:logs(), "\n"), 1, true)
  end)

  it("gives req.remaining_ms() from the endpoint's deadline", function()
    local gw = testing.gateway { dir = DIR }
    local page = gw:request("POST", "/echo/Zo%C3%AB?x=1&x=2&y=a+b", { json = { k = json.null } })
    assert.equal(201, page.status)
    assert.equal("Zoë", page.json.name)
    assert.equal("Zo%C3%AB", page.json.raw) -- route parameters arrive as the client sent them
    assert.equal("Zoë", page.headers["x-name"])
    assert.same({ x = { "1", "2" }, y = "a b" }, page.json.q)
    assert.equal(50, page.json.left)
    assert.matches("^%x+$", page.json.trace) -- req.trace_id: 32 hex digits
    assert.equal(32, #page.json.trace)
  end)
end)

describe("the page contract", function()
  it("answers 502 when no section has data, 504 when every call timed out", function()
    local gw = testing.gateway { dir = DIR }
    gw:stub("a", "/x", { fault = "refuse" })
    gw:stub("b", "/y", { fault = "hang" })
    local page = gw:get("/all-fail")
    assert.equal(502, page.status)
    assert.equal("urn:aggway:problem:no-section-available", page.json.type)
    gw:stub("a", "/x", { fault = "hang" })
    assert.equal(504, gw:get("/all-fail").status)
  end)

  it("names a failed required section by the key the page puts it under", function()
    local gw = testing.gateway { dir = DIR }
    gw:stub("a", "/x", { fault = "refuse" })
    local page = gw:get("/renamed")
    assert.equal(502, page.status)
    assert.equal("a required section is unavailable", page.json.title)
    assert.equal("section event: the upstream could not be reached", page.json.detail)
    assert.equal("unavailable", page.json.sections.event.status)
    gw:stub("a", "/x", { json = { n = 1, secret = "x" } })
    page = gw:get("/renamed")
    assert.equal(200, page.status)
    assert.same({ status = "ok", data = { n = 1 } }, page.json.event)
  end)
end)

describe("agg.page's response", function()
  local function gateway(b_fault)
    local gw = testing.gateway { dir = DIR }
    gw:stub("a", "/x", { body = ' { "z" : 1 , "a" : [ 1.0 ] } ', headers = { ["content-type"] = "application/json" } })
    if b_fault then gw:stub("b", "/y", { fault = b_fault }) else gw:stub("b", "/y", { json = { n = 3 } }) end
    gw:stub("c", "/n/1", { json = { n = 7 } })
    return gw
  end

  it("gives the same bytes whether the script read the page's body or not", function()
    for _, fault in ipairs({ false, "refuse" }) do
      local gw = gateway(fault)
      local unread, read = gw:get("/pages/unread"), gw:get("/pages/read")
      assert.equal(200, unread.status)
      assert.equal(unread.body, read.body)
      assert.equal(unread.headers["x-aggregation-completed"], read.headers["x-aggregation-completed"])
      assert.equal(fault and "false" or "true", unread.headers["x-aggregation-completed"])
      local b = fault and '"b":{"status":"unavailable","error":' or '"b":{"status":"ok","data":{"n":3}}'
      assert.is_truthy(unread.body:find('{"a":{"status":"ok","data":{"z":1,"a":[1.0]}},' .. b, 1, true))
      assert.is_truthy(unread.body:find(',"plain":{"status":"ok","data":{"computed":true}}}', 1, true))
    end
  end)

  it("is encoded from the script's tables once it edits or replaces the body", function()
    local gw = gateway()
    local page = gw:get("/pages/edited")
    assert.equal('{"a":{"status":"ok","data":{"replaced":1}},"c":{"status":"ok","data":{"n":7}},' ..
                 '"extra":{"data":[],"status":"ok"}}', page.body) -- (a plain table: keys sorted)
    assert.equal("true", page.headers["x-aggregation-completed"])
    assert.equal('{"only":true}', gw:get("/pages/replaced").body)
    page = gw:get("/pages/dropped")
    assert.equal("plain", page.body)
    assert.equal("text/plain; charset=utf-8", page.headers["content-type"])
  end)

  it("shows json once read, and its metatable is protected", function()
    local page = gateway():get("/pages/shape")
    assert.same({ mt = "agg.page", protected = true, before = "headers,status", after = "headers,json,status",
                  json = "table", same = true, a = "ok" }, page.json)
    -- a failed page's metatable (the VM's one for every such page) is guarded too
    local failing = gateway()
    failing:stub("a", "/x", { fault = "refuse" })
    assert.same({ status = 502, mt = "agg.page", protected = true, reached = false },
                failing:get("/pages/failed-shape").json)
  end)
end)

describe("JSON fidelity through a page", function()
  local BODY = '{"z":1,"a":[],"o":{},"n":null,"big":9007199254740993,"r":4.6,"s":"a\\u0000b","f":1.0,"neg":-0.0}'

  it("passes an untouched upstream body through with every rule kept", function()
    local gw = testing.gateway { dir = DIR }
    gw:stub("a", "/x", { body = BODY })
    gw:stub("c", "/raw", { body = "plain text" })
    local page = gw:get("/fidelity")
    assert.matches('"x":{"status":"ok","data":' .. BODY:gsub("%p", "%%%0") .. "}", page.body)
    assert.matches('"raw":{"status":"ok","data":"plain text"}', page.body, 1, true)
  end)

  it("keeps upstream key order when a script adds and removes keys", function()
    local gw = testing.gateway { dir = DIR }
    gw:stub("a", "/x", { body = '{"c":1,"b":2,"a":[],"n":null}' })
    local page = gw:get("/touch")
    assert.matches('"data":{"c":1,"a":[],"n":null,"added":true}', page.body, 1, true)
  end)

  it("writes an object with a name twice as the script saw it once read, as sent when untouched", function()
    -- (RFC 8259 §4 leaves duplicate names to the reader: the client must not read another value
    -- than the one the script decided on)
    local gw = testing.gateway { dir = DIR }
    local DUP = '{"a":1,"b":{"c":1,"c":2},"a":2}'
    gw:stub("a", "/x", { body = DUP })
    gw:stub("c", "/raw", { body = "plain text" })
    local page = gw:get("/read")
    assert.equal("2", page.headers["x-seen"])
    assert.equal('{"x":{"status":"ok","data":{"a":2,"b":{"c":2}}}}', page.body)
    assert.matches('"x":{"status":"ok","data":' .. DUP:gsub("%p", "%%%0") .. "}", gw:get("/fidelity").body)
  end)

  it("fails a call whose body is over max_body_bytes, is not JSON, or is nested too deep", function()
    local gw = testing.gateway { dir = DIR }
    gw:stub("a", "/x", { body = string.rep("[", 300) .. string.rep("]", 300) })
    gw:stub("c", "/raw", { body = string.rep("x", 2000) })
    local page = gw:get("/fidelity")
    assert.equal("urn:aggway:problem:upstream-bad-json", page.json.sections.x.error.type)
    assert.equal("urn:aggway:problem:upstream-too-large", page.json.sections.raw.error.type)
  end)

  it("encodes NaN as null and int64 boxes with every digit", function()
    local gw = testing.gateway { dir = DIR }
    assert.equal('{"big":9007199254740993,"v":null}', gw:get("/err/nan").body)
  end)

  it("refuses a sparse table with a 500 naming the path", function()
    local gw = testing.gateway { dir = DIR }
    local page = gw:get("/err/sparse")
    assert.equal(500, page.status)
    assert.matches("$.list", table.concat(gw:logs(), "\n"), 1, true)
  end)

  it("keeps [] and {} apart in agg.json", function()
    assert.equal('{"a":[],"o":{}}', json.encode(json.decode('{"a":[],"o":{}}')))
  end)
end)

describe("script errors", function()
  local gw
  before_each(function() gw = testing.gateway { dir = DIR } end)

  it("answer 500 without leaking the error, and log it with file:line", function()
    local page = gw:get("/err/raise")
    assert.equal(500, page.status)
    assert.equal("application/problem+json", page.headers["content-type"])
    assert.is_nil(page.body:find("secret", 1, true))
    assert.matches("errors.lua:%d+: boom", table.concat(gw:logs(), "\n"))
  end)

  it("name an unknown upstream", function()
    assert.equal(500, gw:get("/err/unknown-upstream").status)
    assert.matches("unknown upstream 'nope'", table.concat(gw:logs(), "\n"), 1, true)
  end)

  it("name an unknown call option and a not-yet-supported one", function()
    gw:get("/err/unknown-option")
    gw:get("/err/not-yet")
    local logs = table.concat(gw:logs(), "\n")
    assert.matches("unknown option 'retries'", logs, 1, true)
    assert.matches("option 'forward_auth' is not supported", logs, 1, true)
  end)

  it("suggest the method in capitals and the retry option meant", function()
    gw:get("/err/method-case")
    gw:get("/err/retry-option")
    local logs = table.concat(gw:logs(), "\n")
    assert.matches("call to 'a': method 'post' is not one of GET HEAD POST PUT PATCH DELETE OPTIONS (did you mean " ..
                   "'POST'?)", logs, 1, true)
    assert.matches("call to 'a': retry option 'attempt' is unknown (did you mean 'attempts'?) (attempts, on, " ..
                   "backoff_ms, safe)", logs, 1, true)
  end)

  it("name the line where a faulty call spec was written, not only the fetch_all's line", function()
    local typo, call
    local n = 0
    for l in io.lines(DIR .. "/errors.lua") do
      n = n + 1
      if l:find("HELPER-TYPO", 1, true) then typo = n end
      if l:find("HELPER-CALL", 1, true) then call = n end
    end
    assert.equal(500, gw:get("/err/helper-spec").status)
    assert.matches(("errors.lua:%d: call to 'a': unknown option 'requird' (did you mean 'required'?) (called at line %d)"):format(typo, call),
      table.concat(gw:logs(), "\n"), 1, true)
  end)

  it("name a fetch_then key missing from the table with a did-you-mean", function()
    assert.equal(500, gw:get("/err/then-typo").status)
    assert.matches("fetch_then for 'b' depends on 'aa', which is not a call in this fetch_all (did you mean 'a'?)",
      table.concat(gw:logs(), "\n"), 1, true)
  end)

  it("give a clean error when an agg call is made where LuaJIT cannot yield", function()
    local page = gw:get("/err/sort")
    assert.equal(500, page.status)
    assert.matches("errors.lua:40: agg.fetch_all cannot wait here", table.concat(gw:logs(), "\n"), 1, true)
    assert.equal(0, #gw:calls())
  end)

  it("refuse a fetch_all in a coroutine the script made, at its line", function()
    assert.equal(500, gw:get("/err/in-wrap").status)
    assert.matches("errors.lua:47: agg.fetch_all cannot wait in a coroutine the script made", table.concat(gw:logs(), "\n"), 1, true)
    assert.equal(0, #gw:calls())
  end)

  it("point a fetch_all of something else than a table at the script's line", function()
    assert.equal(500, gw:get("/err/not-a-table").status)
    assert.matches("errors.lua:45: agg.fetch_all expects a table of call specs", table.concat(gw:logs(), "\n"), 1, true)
  end)

  it("place a mistake in a fetch_all the script tail-called at the call's line in its function", function()
    -- (`return agg.fetch_all(t)`: the script's frame is gone when fetch_all looks for its line)
    assert.equal(500, gw:get("/err/tail").status)
    assert.matches("errors.lua:51: agg.fetch_all expects a table of call specs", table.concat(gw:logs(), "\n"), 1, true)
    assert.equal(500, gw:get("/err/tail-option").status)
    assert.matches("errors.lua:55: call to 'a': unknown option 'requird'", table.concat(gw:logs(), "\n"), 1, true)
    gw:stub("a", "/x", { json = { id = 1 } })
    local page = gw:get("/err/tail-then")
    assert.equal(200, page.status)
    assert.equal("unavailable", page.json.y.status)
    assert.matches("errors.lua:60: agg.fetch_all expects a table of call specs", table.concat(gw:logs(), "\n"), 1, true)
    -- `return agg.page(x)`, the usual last line of a handler, is a tail call too
    assert.equal(500, gw:get("/err/page-tail").status)
    assert.matches("errors.lua:66: agg.page expects the results table", table.concat(gw:logs(), "\n"), 1, true)
    assert.equal(500, gw:get("/err/fetch-tail").status)
    assert.matches("errors.lua:70: agg.fetch expects a call spec", table.concat(gw:logs(), "\n"), 1, true)
    page = gw:get("/err/then-tail")
    assert.equal("unavailable", page.json.y.status)
    assert.matches("errors.lua:74: agg.fetch_then: unknown option 'requird' (did you mean 'required'?)", table.concat(gw:logs(), "\n"), 1, true)
  end)

  it("place a mistake whose frame is gone or a C function's without guessing a wrong line", function()
    local at = {}
    local n = 0
    for l in io.lines(DIR .. "/errors.lua") do
      n = n + 1
      local tag = l:match("%-%- (TAIL%-[A-Z]+)")
      if tag then at[tag] = n end
    end
    local function logs() return table.concat(gw:logs(), "\n") end
    gw:stub("a", "/x", { json = { id = 1 } })
    assert.equal(500, gw:get("/err/tail-gsub").status)
    assert.matches(("errors.lua:%d: agg.fetch_all cannot wait here"):format(at["TAIL-GSUB"]), logs(), 1, true)
    assert.equal(500, gw:get("/err/tail-wrap").status)
    assert.matches(("errors.lua:%d: agg.fetch_all cannot wait in a coroutine the script made"):format(at["TAIL-WRAP"]),
      logs(), 1, true)
    assert.not_matches("errors.lua:%d+: [^ ]*errors.lua:%d+:", logs())
    assert.equal(500, gw:get("/err/tail-helper").status)
    assert.matches(("errors.lua:%d: agg.fetch_all expects a table of call specs (in a call made as a tail call"):format(
      at["TAIL-HELPER"]), logs(), 1, true)
    assert.not_matches(("errors.lua:%d: agg.fetch_all expects"):format(at["TAIL-OK"]), logs(), 1, true)
    assert.equal(500, gw:get("/err/tail-two").status)
    assert.matches(("errors.lua:%d: agg.fetch_all expects a table of call specs (in a call made as a tail call"):format(
      at["TAIL-TWO"]), logs(), 1, true)
    assert.not_matches(("errors.lua:%d: agg.fetch_all expects"):format(at["TAIL-RIGHT"]), logs(), 1, true)
    gw:stub("a", "/fail", { status = 500, json = {} })
    gw:get("/err/fallback-wait")
    assert.matches(("errors.lua:%d: agg.fetch_all cannot wait here"):format(at["TAIL-FALLBACK"]), logs(), 1, true)
    assert.not_matches("runtime_spec.lua:%d+: agg.fetch_all", logs())
    assert.equal(500, gw:get("/err/tail-alias").status)
    assert.matches(("errors.lua:%d: agg.fetch_all expects a table of call specs (in a call made as a tail call"):format(
      at["TAIL-ALIAS"]), logs(), 1, true)
    -- agg.page's options are checked (a misspelt one would drop its headers unseen), and the tail
    -- calls of functions defined inside the handler are not the handler's own
    assert.equal(500, gw:get("/err/page-option").status)
    assert.matches(("errors.lua:%d: agg.page: unknown option 'headrs' (did you mean 'headers'?)"):format(
      at["TAIL-PAGEOPT"]), logs(), 1, true)
    assert.equal(500, gw:get("/err/page-headers").status)
    assert.matches(("errors.lua:%d: agg.page: option 'headers' must be a table of name = value, got string"):format(
      at["TAIL-PAGEHDR"]), logs(), 1, true)
    assert.equal(500, gw:get("/err/page-nested").status)
    assert.matches(("errors.lua:%d: agg.page expects the results table of agg.fetch_all, got string"):format(
      at["TAIL-NESTED"]), logs(), 1, true)
    assert.not_matches("got string (in a call made as a tail call", logs(), 1, true)
  end)

  it("answer 500 when a handler yields by itself instead of hanging", function()
    local page = gw:get("/err/yield")
    assert.equal(500, page.status)
    -- (the sandbox refuses the yield at the script's line; a trusted folder's handler that yields
    -- is answered 500 too: "a handler must not call coroutine.yield")
    assert.matches("errors.lua:44: coroutine.yield: this code runs in the gateway's coroutine",
                   table.concat(gw:logs(), "\n"), 1, true)
  end)

  it("leave the worker serving: the next request after an error is answered", function()
    assert.equal(500, gw:get("/err/raise").status)
    gw:stub("a", "/x", { json = { n = 1 } })
    gw:stub("b", "/y", { json = { n = 2 } })
    assert.equal(200, gw:get("/all-fail").status)
  end)

  it("reject a handler that returns something that is not a response", function()
    assert.equal(500, gw:get("/err/bad-return").status)
  end)

  -- the line of errors.lua that holds mark
  local function line_of(mark)
    local n = 0
    for l in io.lines(DIR .. "/errors.lua") do
      n = n + 1
      if l:find(mark, 1, true) then return n end
    end
  end

  it("say what a handler returned instead of a response, at the handler's line", function()
    -- (found by a new page author: one message for every mistake, without a line)
    gw:stub("a", "/products/1", { json = { id = 1 } })
    assert.equal(500, gw:get("/err/results-return").status)
    assert.equal(500, gw:get("/err/string-status").status)
    assert.equal(500, gw:get("/err/nil-return").status)
    assert.equal(500, gw:get("/err/no-status").status)
    local logs = table.concat(gw:logs(), "\n")
    -- (aggway check's dry run reports the first: no upstream's answer makes it)
    assert.matches("errors.lua:" .. line_of("RESULTS-RETURN") .. ": the handler must return agg.page(results) or " ..
                   "{ status = <200..599>, json = … | body = … }, it returned the results of agg.fetch_all " ..
                   "without agg.page: return agg.page(results)", logs, 1, true)
    assert.matches("it returned a table without status (the results of agg.fetch_all? pass them to agg.page)",
                   logs, 1, true)
    assert.matches('it returned status "200" (string)', logs, 1, true)
    assert.matches("it returned nothing", logs, 1, true)
  end)

  it("refuse a plain response with a key a response does not have (it went out as an empty 200)", function()
    local page = gw:get("/err/misspelt-json")
    assert.equal(500, page.status)
    assert.matches("errors.lua:" .. line_of("MISSPELT-JSON") ..
                   ": the handler's response has an unknown key 'jsn' (did you mean 'json'?)",
                   table.concat(gw:logs(), "\n"), 1, true)
    -- a field its metatable gives is read as before
    local ok = gw:get("/err/metatable-json")
    assert.equal(200, ok.status)
    assert.equal(2, ok.json.id)
  end)
end)

describe("response headers", function()
  local gw
  before_each(function() gw = testing.gateway { dir = DIR } end)

  -- (the request's own headers reach the script when it first reads them: core.request_headers)
  it("gives a script its request's headers while it runs, and none to a req kept past its page", function()
    gw:stub("a", "/x", { json = { n = 1 } })
    local page = gw:get("/headers/request", { headers = { ["Accept-Language"] = "fr", ["X-Other"] = "1" } })
    assert.equal(200, page.status)
    assert.equal("fr", page.json.lang)
    -- a kept req keeps what its script read while it ran
    assert.equal("fr", gw:get("/headers/kept", { headers = { ["Accept-Language"] = "de" } }).json.lang)
    -- a req kept unread: its request has ended, it has no headers to give (never another's)
    assert.equal(200, gw:get("/headers/keep-unread", { headers = { ["Accept-Language"] = "it" } }).status)
    local later = gw:get("/headers/kept", { headers = { ["Accept-Language"] = "de" } })
    assert.equal(200, later.status)
    assert.equal(json.null, later.json.lang)
  end)

  it("gives a script its request's header values without the spaces and tabs around them, as the gateway does", function()
    gw:stub("a", "/x", { json = { n = 1 } })
    local page = gw:get("/headers/request", { headers = { ["Accept-Language"] = " \t fr-CH, fr \t " } })
    assert.equal("fr-CH, fr", page.json.lang)
  end)

  it("send a script's server-timing as a field of its own before the gateway's (a list in the harness)", function()
    gw:stub("a", "/x", { json = { n = 1 }, latency_ms = 5 })
    local page = gw:get("/headers/own-timing")
    assert.equal(200, page.status)
    local st = page.headers["server-timing"]
    assert.equal("table", type(st))
    assert.equal(2, #st)
    assert.equal("render;dur=1", st[1])
    assert.matches("^x;dur=5", st[2])
  end)

  -- the names a page of /headers/page* carries
  local PAGE_NAMES = { "cache-control", "content-type", "server", "server-timing", "x-aggregation-completed" }
  -- the names a response carries, sorted
  local function names(page)
    local out = {}
    for k in pairs(page.headers) do out[#out + 1] = k end
    table.sort(out)
    return out
  end

  it("keep one field per name: of several spellings, the one that sorts first bytewise wins", function()
    -- CONTENT-TYPE < Content-Type < content-type, whatever order the script's table gives
    local page = gw:get("/headers/spellings")
    assert.equal(200, page.status)
    assert.same({ "content-type" }, names(page))
    assert.equal("text/html", page.headers["content-type"])
    local logs = table.concat(gw:logs(), "\n")
    assert.matches("dropped response header 'Content-Type': the script also set 'CONTENT-TYPE'", logs, 1, true)
    assert.matches("dropped response header 'content-type': the script also set 'CONTENT-TYPE'", logs, 1, true)
  end)

  it("send a list value as one field per element, in order, and drop elements of other types", function()
    local page = gw:get("/headers/cookies")
    assert.equal(200, page.status)
    assert.same({ "a=1; Path=/", "b=2; Path=/", "3" }, page.headers["set-cookie"])
    assert.equal("one", page.headers["x-one"]) -- a list of one is one field
    assert.is_nil(page.headers["x-empty"])
    local logs = table.concat(gw:logs(), "\n")
    assert.matches("dropped value 3 of response header 'Set-Cookie': it is a boolean", logs, 1, true)
    assert.matches("dropped response header 'x-empty': its value is an empty list", logs, 1, true)
  end)

  it("are lowercased tokens, and the framing and hop-by-hop ones are the gateway's", function()
    local rh = require "agg.resp_headers"
    local owned = { "Content-Length", "TRANSFER-ENCODING", "connection", "Keep-Alive", "upgrade", "Proxy-Connection",
                    "TE", "Trailer" }
    local set = { ["X-A!#$%&'*+-.^_`|~09Z"] = "kept", ["x y"] = "1", ["x\0"] = "2", ["x\195\169"] = "3", [""] = "4",
                  ["x:"] = "5", ["x@"] = "6", ["te-x"] = "7", ["Trailers"] = "8" }
    for _, name in ipairs(owned) do set[name] = "0" end
    local h, warnings = rh.apply(set)
    assert.same({ ["x-a!#$%&'*+-.^_`|~09z"] = "kept", ["te-x"] = "7", trailers = "8" }, h)
    local logs = table.concat(warnings, "\n")
    for _, name in ipairs(owned) do
      assert.matches("dropped response header '" .. name:lower() .. "' set by a script: the gateway frames responses",
                     logs, 1, true)
    end
    assert.equal(#owned + 6, #warnings)
  end)

  it("give a 204 no content-type of the gateway's", function()
    local page = gw:get("/headers/no-content")
    assert.equal(204, page.status)
    assert.is_nil(page.headers["content-type"])
    assert.equal("", page.body)
  end)

  it("drop a script's date (the gateway sends its own) and keep its server", function()
    local page = gw:get("/headers/date-server")
    assert.same({ "content-type", "server" }, names(page))
    assert.equal("catalog/1.0", page.headers.server)
    local logs = table.concat(gw:logs(), "\n")
    assert.matches("dropped response header 'date' set by a script", logs, 1, true)
    assert.matches("dropped response header 'server': the script also set 'Server'", logs, 1, true)
  end)

  it("of other types are dropped with a warning, the same by agg.page, and metamethods are not called", function()
    gw:stub("a", "/x", { json = { n = 1 } })
    for _, path in ipairs { "/headers/odd", "/headers/page-odd" } do
      local page = gw:get(path)
      assert.equal(200, page.status)
      assert.equal("1", page.headers["x-ok"])
      assert.equal("5", page.headers["x-num"])
      for _, absent in ipairs { "x-bool", "x-tab", "x-fn", "1", "true" } do
        assert.is_nil(page.headers[absent], path .. ": " .. absent)
      end
    end
    local logs = table.concat(gw:logs(), "\n")
    for _, msg in ipairs { "dropped response header 'x-tab': its value is an empty list",
                           "dropped response header 'x-bool': its value is a boolean",
                           "dropped a response header whose name is a number" } do
      local _, n = logs:gsub(msg:gsub("%p", "%%%0"), "")
      assert.equal(2, n, msg)
    end
  end)

  it("of agg.page follow the same rules, and the page contract's own headers win", function()
    gw:stub("a", "/x", { json = { n = 1 } })
    local page = gw:get("/headers/page")
    assert.equal(200, page.status)
    assert.same(PAGE_NAMES, names(page))
    assert.equal("application/vnd.page+json", page.headers["content-type"])
    assert.equal("max-age=60", page.headers["cache-control"])
    assert.equal("catalog/1.0", page.headers.server)
    assert.equal("true", page.headers["x-aggregation-completed"])
    local logs = table.concat(gw:logs(), "\n")
    assert.matches("dropped response header 'content-type': the script also set 'Content-Type'", logs, 1, true)
    assert.matches("dropped response header 'cache-control': the script also set 'Cache-Control'", logs, 1, true)
    assert.matches("dropped response header 'date' set by a script", logs, 1, true)

    gw:stub("a", "/x", { status = 404, json = { error = "no" } })
    page = gw:get("/headers/page-failed")
    assert.equal(404, page.status)
    assert.same(PAGE_NAMES, names(page))
    assert.equal("application/problem+json", page.headers["content-type"])
    assert.equal("no-store", page.headers["cache-control"])
    assert.equal("false", page.headers["x-aggregation-completed"])
  end)
end)

describe("a call's table", function()
  local callspec = require "agg.callspec"
  local ups = { catalog = { index = 1, timeout_ms = 100 } }
  local function keys(t)
    local n = 0
    for _ in pairs(t) do n = n + 1 end
    return n
  end

  -- 33 keys would make LuaJIT give it a hash part of 64 slots: 1.5 KB to allocate, copy, mark and
  -- sweep for every call (docs/performance.md "Where a page's instructions go")
  it("holds at most 32 keys for a plain call, the fields only some calls write left out", function()
    local n = callspec.normalize({ "catalog", "/p/1" }, ups, 1)
    assert.is_true(keys(n) <= 32, "keys: " .. keys(n))
    assert.is_nil(rawget(n, "fallback"))
    assert.equal(false, rawget(n, "cache_key")) -- a cached call's key has its slot (agg.cache)
    assert.is_nil(rawget(n, "x"))                -- the exchange is its own first attempt
    local f = callspec.normalize({ "catalog", "/p/1", fallback = { none = true } }, ups, 1)
    assert.same({ none = true }, f.fallback)
    assert.equal(keys(n) + 1, keys(f))
  end)

  -- the same table after its call ran: the exchange and the result's info write into it, and a
  -- field one of them adds to every call would be the 33rd (a page's instructions grow by about
  -- 20 % then: tools/bench/callgrind)
  local result = require "agg.result"
  -- every call table in seen holds at most 32 keys (what names them in a failure)
  local function assert_fit(seen, what)
    for _, x in ipairs(seen) do
      assert.is_true(keys(x) <= 32, ("keys of %s to %s: %d"):format(what, x.upstream, keys(x)))
    end
  end

  -- the call tables run makes, of upstream "a" or of the upstreams named in the set `of`
  local function calls_made(run, of)
    local out = {}
    of = of or { a = true }
    result.on_new = function(x) if of[x.upstream] then out[#out + 1] = x end end
    local ok, err = pcall(run)
    result.on_new = nil
    assert(ok, err)
    return out
  end

  -- A page's call tables and results die with it, in the first collector cycle after it ended.
  -- (They were the values of weak-keyed tables, req -> context and result -> facts, which Lua 5.1
  -- marks while their keys are being found dead: each page's garbage lived one cycle more, and
  -- the collector's estimate of what is live grew with it, so that a pause over 200 ran away.)
  -- a fetch_then marker's facts and result are its metatable's, and a continuation's entries in the
  -- runtime's weak-keyed tables go when it ends: a weak-keyed table's values are marked while it is
  -- traversed, so a continuation, what it captured and the request's context outlived the page by
  -- a cycle, and the heap grew with the collector's pause (docs/performance.md "An eighth pass")
  it("dies with its page of chains: one full collection frees what their continuations held", function()
    local gw = testing.gateway { dir = DIR }
    gw:stub("a", "/x", { json = { n = 2 } })
    local contexts = setmetatable({}, { __mode = "v" }) -- the request's context, seen by its calls
    result.on_new = function(x) if x.ctx then contexts[1] = x.ctx end end
    local ok, page = pcall(gw.get, gw, "/held-then/7")
    result.on_new = nil
    assert(ok, page)
    assert.equal(200, page.status)
    assert.same({ n = 2, id = { "7" } }, page.json.chained.data)
    assert.same({ n = 2, id = "7" }, page.json.own.data)
    assert.is_table(contexts[1])
    page = nil
    collectgarbage("collect")
    assert.is_nil(contexts[1], "the request's context outlived one full collection")
    assert.equal(0, gw:get("/held-alive").json.alive)
  end)

  it("dies with its page: one full collection frees the page's calls and results", function()
    local gw = testing.gateway { dir = DIR }
    gw:stub("a", "/x", { json = { n = 2, b = 1 } })
    gw:stub("b", "/y", { json = { n = 3 } })
    gw:stub("c", "/raw", { body = "plain" })
    local kept = setmetatable({}, { __mode = "v" })
    result.on_new = function(x) kept[#kept + 1] = x end
    local ok, err = pcall(function()
      assert.equal(200, gw:get("/fidelity").status)
      assert.equal(200, gw:get("/touch").status)
    end)
    result.on_new = nil
    assert(ok, err)
    local made = #kept
    assert.is_true(made >= 2, "calls seen: " .. made)
    collectgarbage("collect")
    local left = 0
    for _ in pairs(kept) do left = left + 1 end
    assert.equal(0, left, ("%d of %d call tables outlived one full collection"):format(left, made))
  end)

  it("still holds at most 32 keys once its call ran, answered, read or failed", function()
    local gw = testing.gateway { dir = DIR }
    gw:stub("a", "/x", { json = { n = 2, b = 1 } })
    gw:stub("c", "/raw", { body = "plain" })
    gw:stub("b", "/y", { json = { n = 3 } })
    local seen = calls_made(function()
      assert.equal(200, gw:get("/fidelity").status)  -- answered, the data never read
      assert.equal(200, gw:get("/touch").status)     -- answered, the data read and changed
    end)
    gw:stub("a", "/x", { status = 503, json = { error = "down" } })
    for _, x in ipairs(calls_made(function() gw:get("/all-fail") end)) do seen[#seen + 1] = x end
    assert.equal(3, #seen)
    for _, x in ipairs(seen) do
      assert.is_true(x.done, "the call ended")
      assert.is_true(keys(x) <= 32, ("keys of a call to /x after it ran: %d"):format(keys(x)))
    end
  end)

  -- a merged call (batch) carries its batch and has no retry, hedge or single-flight key: none of
  -- them may be written as false (three keys more made its table again at 64 slots)
  it("holds at most 32 keys for a merged call's item", function()
    local gw = testing.gateway { dir = "spec/fixtures/merge" }
    gw:stub("catalog", "/products", function(call)
      local items = {}
      for id in call.query.ids:gmatch("[^,]+") do items[#items + 1] = { id = tonumber(id), name = "p" .. id } end
      return { json = items }
    end)
    local seen = calls_made(function() assert.equal(200, gw:get("/cart/1/3").status) end, { catalog = true })
    assert.equal(3, #seen)
    assert_fit(seen, "a merged call's item")
    for _, x in ipairs(seen) do assert.is_truthy(rawget(x, "batch")) end
  end)

  -- a call that carries the user's identity (forwarded or exchanged, cached per user or not)
  -- writes its identity's continuation and personal flags; it has no single-flight key (it is
  -- never shared), so they fit the slots the constructor leaves
  it("holds at most 32 keys for a call that carries the user's identity, cached or not", function()
    local gw = testing.gateway { dir = "spec/fixtures/edge" }
    gw:stub("orders", "/orders/*", { json = { id = 1 } })
    gw:stub("inventory", "/stock/*", { json = { inStock = 3 } })
    gw:stub("catalog", "/items/*", { json = { name = "Sneaker" } })
    gw:stub("@token_exchange", "POST", "/token", { json = { access_token = "xt-1", token_type = "Bearer",
                                                             expires_in = 120 } })
    local alice = { sub = "alice", scopes = { "orders:read" }, aud = { "aggway", "orders" } }
    local seen = calls_made(function()
      assert.equal(200, gw:get("/orders/1", { user = alice }).status)
      for _, path in ipairs { "/cached-orders/1", "/swr-orders/1" } do
        assert.equal(200, gw:get(path, { user = alice }).status)   -- a miss
        gw:advance(20000)                                          -- past its ttl_s
        assert.equal(200, gw:get(path, { user = alice }).status)
      end
    end, { orders = true, inventory = true })
    assert.is_true(#seen >= 3, "calls seen: " .. #seen)
    assert_fit(seen, "a call with the user's identity")
    for _, x in ipairs(seen) do assert.is_nil(rawget(x, "collapse")) end
  end)

  -- a call to an upstream group writes its endpoint, and one with a retry policy has its retry:
  -- both in the slots the constructor leaves (a 33rd key made every group call's table again at
  -- 64 slots: about 7,000 instructions a page of three, tools/bench/callgrind GROUP=2). A call
  -- that is retried adds its retry's fields (the next spec).
  it("holds at most 32 keys for a call to an upstream group, with a retry policy or not", function()
    local gw = testing.gateway { dir = "spec/fixtures/groups" }
    gw:stub("rr", "/p/*", { json = { id = 1 } })
    gw:stub("product", "/p/*", { json = { id = 2 } })
    local seen = calls_made(function()
      assert.equal(200, gw:get("/rr/1").status)
      for i = 1, 3 do assert.equal(200, gw:get("/product/" .. i).status) end
    end, { rr = true, product = true })
    assert.equal(4, #seen)
    assert_fit(seen, "a group's call")
    for _, x in ipairs(seen) do
      assert.is_truthy(rawget(x, "endpoint"), "the group's endpoint is written into the call's table")
      assert.equal(x.upstream == "product", rawget(x, "retry") ~= nil)
    end
  end)

  -- a retried call writes retrying, last and retry_timer besides its retry, and one to a group
  -- its endpoint too: all in the slots the constructor leaves (the 33rd key made a retried call's
  -- table again at 64 slots, about 2,400 instructions for each retried call)
  it("holds at most 32 keys for a retried call, to an upstream group or not", function()
    local gw = testing.gateway { dir = "spec/fixtures/groups" }
    local n = 0
    local function first_fails() -- every other call answers 503 (retried: retry.on's default)
      n = n + 1
      if n % 2 == 1 then return { status = 503, json = { e = n } } end
      return { json = { id = n } }
    end
    gw:stub("product", "/p/*", first_fails)
    gw:stub("budget", "/p/*", first_fails)
    local seen = calls_made(function()
      for _, path in ipairs { "/product/1", "/budget/2" } do
        local page = gw:get(path)
        assert.equal(200, page.status)
        assert.equal("ok", page.json.p.status, path)
      end
    end, { product = true, budget = true })
    local calls, known = {}, {} -- (a result is made for each attempt's answer: the same call's table)
    for _, x in ipairs(seen) do
      if not known[x] then known[x] = true calls[#calls + 1] = x end
    end
    assert.equal(2, #calls)
    assert.equal(4, n, "each call was retried once")
    assert_fit(calls, "a retried call")
    for _, x in ipairs(calls) do
      assert.equal(2, x.attempt)
      assert.equal(x.upstream == "product", rawget(x, "endpoint") ~= nil)
    end
  end)

end)
