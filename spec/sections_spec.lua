-- max_sections_per_request (gateway.lua), and fan-outs and chains of many sections: one request
-- makes a bounded number of upstream calls, and the runtime's own work for a fan-out is linear in
-- its size (the runtime's code is never stopped by the script time limit, so it must not hold the
-- worker for long). Fixture scripts: spec/fixtures/sections (max_sections_per_request = 5000).
local testing = require "agg.testing"

local DIR = "spec/fixtures/sections"

local function logged(gw, text)
  for _, l in ipairs(gw:logs()) do
    if l:find(text, 1, true) then return l end
  end
  return nil
end

describe("max_sections_per_request", function()
  local gw
  before_each(function()
    gw = testing.gateway { dir = DIR }
    gw:stub("a", "/x", { json = { n = 1 }, latency_ms = 10 })
    gw:stub("a", "/n/{i}", { json = { n = 1 }, latency_ms = 10 }) -- a call of its own for each section
  end)

  it("lets a fan-out of exactly the limit through", function()
    local page = gw:get("/wide/5000")
    assert.equal(200, page.status)
    assert.equal(5000, page.json.ok)
    assert.equal(5000, #gw:calls("a"))
  end)

  it("lets a script make its fetches one after the other when each settles while it starts", function()
    -- a fetch_all's calls start in the runtime's resume; one that settled there resumed the page
    -- from inside itself, so 4,000 such fetches in a row overflowed the runtime's stack
    gw:stub("a", "/slow", { json = { n = 1 }, latency_ms = 2000 })
    local page = gw:get("/settled-loop/4999")
    assert.equal(200, page.status)
    assert.same({ first = false, failed = 4999 }, page.json)
    assert.equal(1, #gw:calls("a"))
  end)

  it("lets a chain of fetch_then steps run when each step's call settles while it starts", function()
    -- a cache hit delivered the step's result inside the start of its call, which ran the next
    -- continuation there: about 600 steps overflowed the stack
    gw:stub("cached", "/x", { json = { v = 7 }, latency_ms = 10 })
    local page = gw:get("/cached-chain/3000")
    assert.equal(200, page.status)
    assert.same({ done = true, v = 7 }, page.json.c.data)
    assert.equal(1, #gw:calls("cached"))
  end)

  it("refuses a fan-out past the limit before any call, with the script's line", function()
    local page = gw:get("/wide/5001")
    assert.equal(500, page.status)
    assert.equal(0, #gw:calls("a"))
    local l = logged(gw, "too many sections")
    assert.truthy(l)
    assert.truthy(l:find("fan.lua:11:", 1, true))
    assert.truthy(l:find("more than 5000 in all (max_sections_per_request in gateway.lua)", 1, true))
    -- the client is not told the internals
    assert.is_nil(page.body:find("max_sections", 1, true))
  end)

  it("refuses a table of 100,000 keys, counting no further than the limit", function()
    local page = gw:get("/wide/100000")
    assert.equal(500, page.status)
    assert.equal(0, #gw:calls("a"))
    assert.truthy(logged(gw, "too many sections"))
  end)

  it("counts every fan-out of the request", function()
    local ok = gw:get("/rounds/5/1000")
    assert.equal(200, ok.status)
    assert.equal(5, ok.json.rounds)
    local page = gw:get("/rounds/6/1000") -- the sixth round would be past 5000
    assert.equal(500, page.status)
    assert.equal(5000 + 5000, #gw:calls("a")) -- of the sixth round, none
    assert.truthy(logged(gw, "fan.lua:32: too many sections"))
  end)

  it("fails only the section of a continuation whose fan-out is past the limit", function()
    local ok = gw:get("/nested/4998") -- first, many and 4,998 nested sections: 5,000
    assert.equal(200, ok.status)
    testing.expect_section(ok, "many", "ok")
    local page = gw:get("/nested/4999")
    assert.equal(200, page.status)
    testing.expect_section(page, "first", "ok")
    testing.expect_section(page, "many", "unavailable")
    assert.truthy(logged(gw, "continuation of many"))
    -- at the continuation's line, never the runtime's (a fresh user's trial: fanout.lua's was named)
    local l = logged(gw, "too many sections")
    assert.truthy(l and l:find("fan.lua:42: too many sections", 1, true), l)
    assert.is_nil(l:find("agg/fanout.lua", 1, true))
  end)
end)

describe("Server-Timing of a page of many sections", function()
  local gw
  before_each(function()
    gw = testing.gateway { dir = DIR }
    gw:stub("a", "/n/{i}", { json = { n = 1 }, latency_ms = 10 })
  end)

  local function entries(page)
    local t = {}
    for e in page.headers["server-timing"]:gmatch("[^,]+") do t[#t + 1] = e:match("^%s*(.-)%s*$") end
    return t
  end

  it("names every section up to 32", function()
    local page = gw:get("/page/32")
    assert.equal(200, page.status)
    assert.equal(32, #entries(page))
    assert.is_nil(page.headers["server-timing"]:find("_more", 1, true))
  end)

  it("names the 32 slowest past that, and how many it leaves out", function()
    gw:stub("a", "/n/7", { json = { n = 1 }, latency_ms = 30 })
    gw:stub("a", "/n/150", { json = { n = 1 }, latency_ms = 20 })
    local page = gw:get("/page/200")
    assert.equal(200, page.status)
    assert.equal("ok", page.json.s200.status)
    local e = entries(page)
    assert.equal(33, #e)
    assert.equal('_more;desc="168 sections"', e[33])
    -- the slowest two finish last; the 30 others are the first of the ties to finish
    assert.equal("s150;dur=20.0", e[31])
    assert.equal("s7;dur=30.0", e[32])
    assert.truthy(#page.headers["server-timing"] < 1536)
  end)

  it("names a section by the first 32 bytes of its key", function()
    local page = gw:get("/long-key/100000")
    assert.equal(200, page.status)
    assert.equal(("k"):rep(32) .. ";dur=10.0", page.headers["server-timing"])
  end)
end)

describe("a chain of continuations", function()
  local gw
  before_each(function()
    gw = testing.gateway { dir = DIR }
    gw:stub("a", "/x", { json = { n = 1 }, latency_ms = 10 })
  end)

  it("of 4,000 settles, each continuation after the one before", function()
    -- run as a recursion, about 1,400 continuations that settle at once overflowed the stack
    local page = gw:get("/chain/4000")
    assert.equal(200, page.status)
    assert.equal("ok", page.json.status)
    assert.equal(4000, page.json.last)
    assert.equal(10, page.elapsed_ms)
  end)

  it("that closes on itself is refused, with the cycle's keys", function()
    local page = gw:get("/cycle3")
    assert.equal(500, page.status)
    assert.truthy(logged(gw, "fetch_then dependency cycle: 'w' -> 'x' -> 'y' -> 'z' -> 'x' (each waits for the next)")
                  or logged(gw, "fetch_then dependency cycle: 'x' -> 'y' -> 'z' -> 'x' (each waits for the next)"))
  end)

  it("of 4,000 that closes on itself is refused, naming at most 8 of its keys", function()
    local page = gw:get("/long-cycle/4000")
    assert.equal(500, page.status)
    local l = logged(gw, "fetch_then dependency cycle: 's1' -> 's2' -> ")
    assert.truthy(l)
    assert.truthy(l:find("'s8' -> … -> 's1' (each waits for the next)", 1, true))
  end)

  it("leaves a continuation unrun when a required one ready with it fails first", function()
    local page = gw:get("/cancel-queued")
    assert.equal(502, page.status)
    assert.equal(0, gw:get("/ran").json.ran)
  end)
end)

describe("script code the runtime runs in the middle of its work", function()
  local gw
  before_each(function()
    gw = testing.gateway { dir = DIR }
    gw:stub("a", "/x", { json = { n = 1 }, latency_ms = 10 })
    gw:stub("a", "/slow", { json = { n = 1 }, latency_ms = 300 })
    gw:stub("a", "/post/{i}", { json = { ok = true }, latency_ms = 10 })
  end)

  local function chain_still_works()
    local page = gw:get("/chain")
    assert.equal(200, page.status)
    assert.equal(2, page.json.c.data)
  end

  it("a fallback that yields is refused, and later continuations still run", function()
    -- the yield suspended the runtime's queue of ready continuations: every later page with a
    -- continuation on the worker went unanswered
    local page = gw:get("/fallback-yields")
    assert.equal(504, page.status) -- (answered: the page's deadline had passed)
    assert.truthy(logged(gw, "hostile.lua:25: coroutine.yield: this code runs in the gateway's coroutine"))
    chain_still_works()
  end)

  it("a fallback cannot wait for a call", function()
    local page = gw:get("/fallback-waits")
    assert.equal(504, page.status)
    assert.truthy(logged(gw, "agg.fetch cannot wait here: a fallback"))
    chain_still_works()
  end)

  it("a fallback that raises something else than a string fails its section, when the answer comes or at the start", function()
    -- error(p) of the problem table: logging it raised in the runtime (a traceback of the fallback
    -- function, not of a coroutine). On an answer the exchange was never finished, so the page
    -- was left unanswered for good; at the start the whole page was a 500
    gw:stub("a", "/down", { status = 503, json = {}, latency_ms = 1 })
    gw:stub("a", "/slow", { json = {}, latency_ms = 150 })
    local page = gw:get("/fallback-raises/now")
    assert.equal(200, page.status)
    testing.expect_section(page, "x", "unavailable")
    testing.expect_section(page, "y", "ok")
    assert.truthy(logged(gw, "fallback of x: an error value of type table"))
    page = gw:get("/fallback-raises/late")
    assert.equal(504, page.status)
    testing.expect_section(page, "x", "unavailable")
    chain_still_works()
  end)

  it("a continuation that yields fails its section instead of leaving the page unanswered", function()
    local page = gw:get("/then-yields")
    assert.equal(200, page.status)
    testing.expect_section(page, "c", "unavailable")
    chain_still_works()
  end)

  it("a dependency list longer than the fan-out is refused at the script's line", function()
    local page = gw:get("/long-deps")
    assert.equal(500, page.status)
    assert.truthy(logged(gw, "hostile.lua:45: fetch_then for 'c' lists 8001 dependencies; this fetch_all has 1 other calls"))
    chain_still_works()
  end)

  it("more than 64 request headers are refused before the call takes anything", function()
    local page = gw:get("/headers-65")
    assert.equal(500, page.status)
    assert.equal(0, #gw:calls("a"))
    assert.truthy(logged(gw, "call to 'a': at most 64 request headers"))
  end)

  it("a cache policy varies on at most 32 request headers", function()
    assert.equal(500, gw:get("/vary-33").status)
    assert.truthy(logged(gw, "call to 'a': cache.vary must name at most 32 request headers, got 33"))
  end)

  it("a call spec or an option table with a metatable is refused before any of its code runs", function()
    assert.equal(500, gw:get("/spec-metatable").status)
    assert.truthy(logged(gw, "a call spec must be a plain table"))
    assert.equal(500, gw:get("/option-metatable").status)
    assert.truthy(logged(gw, "call to 'a': option 'retry' must be a plain table (no metatable)"))
    assert.equal(500, gw:get("/option-key-tostring").status)
    assert.truthy(logged(gw, "call to 'a': unknown option '<table>'"))
    assert.equal(0, #gw:calls("a"))
  end)

  it("calls whose json bodies __eq calls equal each send their own", function()
    assert.equal(200, gw:get("/eq").status)
    local calls = gw:calls("a")
    table.sort(calls, function(x, y) return x.path < y.path end)
    assert.equal('{"u":"alice"}', calls[1].body)
    assert.equal('{"u":"bob"}', calls[2].body)
  end)

  it("a call's path and headers have bounded sizes", function()
    assert.equal(200, gw:get("/long-query/30000").status)
    assert.equal(500, gw:get("/long-query/40000").status)
    assert.truthy(logged(gw, "call to 'a': the path with its query is 40005 bytes, more than 32768"))
    assert.equal(200, gw:get("/big-headers/60000").status)
    assert.equal(500, gw:get("/big-headers/70000").status)
    assert.truthy(logged(gw, "call to 'a': request headers of 70005 bytes, more than 65536"))
  end)

  it("a fallback of parsed JSON (json.parse's raw ref) is served as data, not called", function()
    gw:stub("a", "/down", { status = 503, json = { error = "down" } })
    local page = gw:get("/parsed-fallback")
    assert.equal(200, page.status)
    assert.equal("fallback", page.json.s.status)
    assert.same({ cached = true, n = { 1, 2 } }, page.json.s.data)
    assert.truthy(page.body:find('"data":{"cached":true,"n":[1,2]}', 1, true))
  end)

  it("a page past its deadline with a call in flight is left to the call (a held worker's late tick)", function()
    local r = gw:send("GET", "/slow-fallback")
    gw.clock = 5000 -- the worker was held: the tick comes before the answers that arrived meanwhile
    gw:report_stats()
    assert.is_nil(r.status)
    gw:run()
    assert.equal(200, r.status)
    assert.is_nil(logged(gw, "still unanswered"))
  end)

  it("a page of more values than max_sections_per_request is refused at the script's line", function()
    assert.equal(200, gw:get("/plain-page/5000").status)
    assert.equal(500, gw:get("/plain-page/5001").status)
    assert.truthy(logged(gw, "agg.page: a page has at most 5000 sections (max_sections_per_request in gateway.lua)"))
  end)

  it("a response of shared references past 4,194,304 tables is not encoded", function()
    local page = gw:get("/dag/26") -- 2^27 - 1 tables, 268 MB: seconds inside one C call
    assert.equal(500, page.status)
    assert.truthy(logged(gw, "more than 4194304 tables"))
  end)

  it("a call result encoded as a plain value is refused, never sent as its raw fields", function()
    gw:stub("a", "/secret-error", { status = 500, body = "stack trace: db.internal:5432 password=hunter2" })
    for _, which in ipairs { "ok", "failed" } do
      local page = gw:get("/result-as-json/" .. which)
      assert.equal(500, page.status)
      assert.equal("urn:aggway:problem:response-encoding", page.json.type)
      assert.is_nil(page.body:find("hunter2", 1, true))
    end
    assert.truthy(logged(gw, "a call result, which is not JSON data (agg.page makes it a section; r.data is its data) at $.c"))
  end)

  it("a continuation's fan-out results make its section as a nested fan-out's", function()
    gw:stub("a", "/secret-error", { status = 500, body = "stack trace: db.internal:5432 password=hunter2" })
    local ok = gw:get("/then-results/ok")
    assert.equal(200, ok.status)
    assert.same({ b = { n = 1 } }, ok.json.c.data)
    local failed = gw:get("/then-results/failed")
    assert.equal(200, failed.status)
    assert.equal("unavailable", failed.json.c.status)
    assert.equal("urn:aggway:problem:upstream-error", failed.json.c.error.type)
    assert.is_nil(failed.body:find("hunter2", 1, true))
  end)

  it("a continuation's own result makes its section; a table holding one fails that section only", function()
    gw:stub("a", "/secret-error", { status = 500, body = "stack trace: db.internal:5432 password=hunter2" })
    local ok = gw:get("/then-one/ok")
    assert.equal(200, ok.status)
    assert.same({ n = 1 }, ok.json.c.data)
    local failed = gw:get("/then-one/failed")
    assert.equal(200, failed.status)
    assert.equal("urn:aggway:problem:upstream-error", failed.json.c.error.type)
    assert.is_nil(failed.body:find("hunter2", 1, true))
    local mixed = gw:get("/then-one/mixed")
    assert.equal(200, mixed.status) -- the page, with its other section
    assert.equal("ok", mixed.json.a.status)
    assert.equal("urn:aggway:problem:script-error", mixed.json.c.error.type)
    assert.truthy(logged(gw, "the value returned holds a call result under 'r'"))
  end)

  it("a long error message is quoted in the log up to 4096 bytes, with its size and the traceback", function()
    local page = gw:get("/long-error/20000000")
    assert.equal(200, page.status)
    assert.equal("unavailable", page.json.c.status)
    local l = logged(gw, "continuation of c")
    assert.truthy(l)
    assert.truthy(l:find(string.rep("e", 4096) .. "…(20000000 bytes in all) | stack traceback:", 1, true))
    assert.truthy(#l < 8192, #l)
  end)

  it("an error value that is not a string is named by its type, its __tostring never run", function()
    local page = gw:get("/error-tostring")
    assert.equal(200, page.status)
    assert.equal(1, #gw:calls("a"))
    assert.truthy(logged(gw, "an error value of type table"))
  end)

  it("calls sharing one json body and query send it, and a fan-out after a change sends the new one", function()
    local page = gw:get("/shared/300")
    assert.equal(200, page.status)
    local calls = gw:calls("a")
    assert.equal(301, #calls)
    for i = 1, 300 do
      assert.equal('{"ids":[1,2,3]}', calls[i].body)
      assert.same({ q = "a b" }, calls[i].query)
    end
    assert.equal('{"ids":[1,2,3,4]}', calls[301].body)
  end)
end)

describe("a page left unanswered", function()
  it("is not left by a continuation that yields by itself: its section fails at once", function()
    -- (a trusted folder's; the sandbox refuses the yield to scripts at their line). It waited for
    -- the overdue guard, a second past the deadline, and was answered 500.
    local gw = testing.gateway { dir = "spec/fixtures/overdue" }
    gw:stub("a", "/x", { json = { n = 1 }, latency_ms = 10 })
    local page = gw:get("/then-yields")
    assert.equal(200, page.status)
    assert.equal("ok", page.json.x.status)
    assert.equal("unavailable", page.json.c.status)
    assert.equal("urn:aggway:problem:script-error", page.json.c.error.type)
    assert.truthy(page.elapsed_ms < 1000, page.elapsed_ms)
    assert.truthy(logged(gw, "continuation of c: spec/fixtures/overdue/yields.lua:9: a continuation must not call coroutine.yield"))
    -- and one that yields what a fetch_all yields to have its calls started, with none
    page = gw:get("/then-starts")
    assert.equal(200, page.status)
    assert.equal("urn:aggway:problem:script-error", page.json.c.error.type)
    assert.truthy(logged(gw, "continuation of c: spec/fixtures/overdue/yields.lua:16: a continuation must not call coroutine.yield"))
  end)

  it("is answered 500 a second past its deadline, and its calls abandoned", function()
    -- a trusted folder's continuation that waits as a fetch_all would, with nothing to answer it:
    -- nothing resumes it, and the page stayed in flight until its client left
    local gw = testing.gateway { dir = "spec/fixtures/overdue" }
    gw:stub("a", "/x", { json = { n = 1 }, latency_ms = 10 })
    local page = gw:get("/then-waits")
    assert.equal(500, page.status)
    assert.equal("urn:aggway:problem:script-error", page.json.type)
    assert.truthy(page.elapsed_ms > 1200 and page.elapsed_ms <= 2200, page.elapsed_ms)
    assert.truthy(logged(gw, "still unanswered"))
  end)

  it("is answered 500 ten seconds past its deadline even when a call of it seems in flight", function()
    -- a mistake of the runtime's that raised while it delivered an answer left the call's
    -- exchange open for good: the page waited for it until its client left
    local exchange = require "agg.exchange"
    local in_flight = exchange.in_flight
    exchange.in_flight = function() return true end
    local ok, err = pcall(function()
      local gw = testing.gateway { dir = "spec/fixtures/overdue" }
      gw:stub("a", "/x", { json = { n = 1 }, latency_ms = 10 })
      local page = gw:get("/then-waits")
      assert.equal(500, page.status)
      assert.truthy(page.elapsed_ms > 10200 and page.elapsed_ms <= 11200, page.elapsed_ms)
      assert.truthy(logged(gw, "still unanswered"))
    end)
    exchange.in_flight = in_flight
    assert(ok, err)
  end)
end)

describe("max_request_json_values", function()
  local gw
  before_each(function()
    gw = testing.gateway { dir = DIR }
  end)

  local function list(n, item)
    local t = {}
    for i = 1, n do t[i] = item end
    return "[" .. table.concat(t, ",") .. "]"
  end

  it("decodes a body within the cap", function()
    local page = gw:request("POST", "/count", { body = list(999, "1") })
    assert.same({ decoded = true, n = 999, raw = 1999 }, page.json)
  end)

  it("leaves req.json nil for a body of more values: its tables would be many times its bytes", function()
    local page = gw:request("POST", "/count", { body = list(1000, "1") })
    assert.same({ decoded = false, n = 0, raw = 2001 }, page.json)
    -- member names count too, and an empty object one
    page = gw:request("POST", "/count", { body = list(400, "{\"a\":{}}") })
    assert.is_false(page.json.decoded)
    -- what a string holds is not counted
    page = gw:request("POST", "/count", { body = "[\"" .. string.rep(",:[{", 2000) .. "\"]" })
    assert.same({ decoded = true, n = 1, raw = 8004 }, page.json)
    page = gw:request("POST", "/count", { body = "[\"\\\"" .. string.rep(",", 2000) .. "\"]" })
    assert.is_true(page.json.decoded)
  end)
end)
