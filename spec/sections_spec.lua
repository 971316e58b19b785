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
    assert.truthy(logged(gw, "fan.lua:28: too many sections"))
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

  it("names every section up to 64", function()
    local page = gw:get("/page/64")
    assert.equal(200, page.status)
    assert.equal(64, #entries(page))
    assert.is_nil(page.headers["server-timing"]:find("_more", 1, true))
  end)

  it("names the 64 slowest past that, and how many it leaves out", function()
    gw:stub("a", "/n/7", { json = { n = 1 }, latency_ms = 30 })
    gw:stub("a", "/n/150", { json = { n = 1 }, latency_ms = 20 })
    local page = gw:get("/page/200")
    assert.equal(200, page.status)
    assert.equal("ok", page.json.s200.status)
    local e = entries(page)
    assert.equal(65, #e)
    assert.equal('_more;desc="136 sections"', e[65])
    -- the slowest two finish last; the 62 others are the first of the ties to finish
    assert.equal("s150;dur=20.0", e[63])
    assert.equal("s7;dur=30.0", e[64])
    assert.truthy(#page.headers["server-timing"] < 2048)
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
