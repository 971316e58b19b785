-- The script time limit (gateway/watchdog.h) in the spec harness: a script that computes without
-- waiting for a call is stopped after script_time_limit_ms of real time, as serve stops it.
-- Fixture scripts: spec/fixtures/timelimit (limit 50 ms).
local testing = require "agg.testing"

local DIR = "spec/fixtures/timelimit"

local function stopped_at(gw, where)
  for _, l in ipairs(gw:logs()) do
    if l:find("stopped: the script ran for more than 50 ms", 1, true) and l:find(where, 1, true) then return true end
  end
  return false
end

describe("the script time limit", function()
  local gw
  before_each(function()
    gw = testing.gateway { dir = DIR }
    gw:stub("a", "/x", { json = { n = 1 }, latency_ms = 10 })
  end)

  it("stops an endless loop in a handler with a 500 problem and logs file:line", function()
    local page = gw:get("/spin")
    assert.equal(500, page.status)
    assert.equal("application/problem+json", page.headers["content-type"])
    assert.is_nil(page.body:find("script_time_limit_ms", 1, true)) -- the client is not told the internals
    assert.is_true(stopped_at(gw, "spin.lua:5:"))
  end)

  it("cannot be caught by a pcall in the script", function()
    assert.equal(500, gw:get("/spin-pcall").status)
    assert.is_true(stopped_at(gw, "spin.lua:9:"))
  end)

  it("stops a loop that runs after a call's answer", function()
    local page = gw:get("/spin-after-call")
    assert.equal(500, page.status)
    assert.equal(10, page.elapsed_ms) -- virtual time: the loop took real time only
    assert.is_true(stopped_at(gw, "spin.lua:15:"))
  end)

  it("fails only the section of a continuation that loops", function()
    local page = gw:get("/spin-then")
    assert.equal(200, page.status)
    testing.expect_section(page, "a", "ok")
    testing.expect_section(page, "b", "unavailable")
    assert.is_true(stopped_at(gw, "spin.lua:20:"))
  end)

  it("cannot be turned off by the script with debug.sethook", function()
    local page = gw:get("/sethook")
    assert.equal(500, page.status)
    local found = false
    for _, l in ipairs(gw:logs()) do
      if l:find("debug.sethook is not available to scripts", 1, true) then found = true end
    end
    assert.is_true(found)
  end)

  it("stops a loop in the response's metamethod, read by the runtime after a call", function()
    local page = gw:get("/spin-response")
    assert.equal(500, page.status)
    assert.equal("application/problem+json", page.headers["content-type"])
    assert.is_true(stopped_at(gw, "spin.lua:29:"))
  end)

  it("cannot be caught by a pcall in a fallback (the runtime's own thread)", function()
    gw:stub("a", "/bad", { status = 500 })
    local page = gw:get("/fallback-pcall")
    assert.equal(200, page.status)
    testing.expect_section(page, "b", "ok")
    testing.expect_section(page, "a", "unavailable")
    assert.is_true(stopped_at(gw, "spin.lua:36:"))
  end)

  it("leaves work shorter than the limit alone, before and after a stop", function()
    assert.equal(200, gw:get("/quick").status)
    assert.equal(500, gw:get("/spin").status)
    assert.equal(200, gw:get("/quick").status)
    local stops = 0
    for _, l in ipairs(gw:logs()) do if l:find("stopped:", 1, true) then stops = stops + 1 end end
    assert.equal(1, stops)
  end)
end)
