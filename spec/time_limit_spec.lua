-- The script time limit (worker/watchdog.h) in the spec harness: a script that computes without
-- waiting for a call is stopped after script_time_limit_ms of real time, as serve stops it.
-- Fixture scripts: spec/fixtures/timelimit (limit 100 ms).
local testing = require "agg.testing"

local DIR = "spec/fixtures/timelimit"

-- How many lines of the gateway's log hold every one of the given texts.
local function logged(gw, ...)
  local n = 0
  for _, l in ipairs(gw:logs()) do
    local all = true
    for i = 1, select("#", ...) do
      if not l:find((select(i, ...)), 1, true) then all = false break end
    end
    if all then n = n + 1 end
  end
  return n
end

local function stopped_at(gw, where)
  return logged(gw, "stopped: the script ran for more than 100 ms", where) > 0
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

  it("stops a string pattern that backtracks inside one C call, at the script's line", function()
    local page = gw:get("/spin-pattern")
    assert.equal(500, page.status)
    assert.is_true(stopped_at(gw, "spin.lua:51:"))
  end)

  it("cannot be turned off by the script with debug.sethook", function()
    local page = gw:get("/sethook")
    assert.equal(500, page.status)
    assert.is_true(logged(gw, "debug.sethook is not available to scripts") > 0)
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
    assert.equal(1, logged(gw, "stopped:"))
  end)
end)
