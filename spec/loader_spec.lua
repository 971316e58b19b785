-- agg.loader: a script whose top level runs too long is stopped (not waited for), whatever it
-- does to escape, and a script's own jit.on()/jit.off() is kept. Fixtures: spec/fixtures/loading.
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
    assert.matches(where .. lines .. ": the script's top level ran longer than 0%.05 s", text)
    assert.equal(1, #errors, text)
  end

  it("stops an endless loop and names the line it was running", function()
    fails_at("plain", "[345]")
  end)

  it("stops a loop that catches the error with pcall and goes on", function()
    fails_at("catching", "[345]")
  end)

  it("stops a loop inside a coroutine", function()
    fails_at("coroutine", "3") -- (coroutine.wrap puts the line of f() in front)
  end)

  it("stops a loop after the script turned the JIT on", function()
    fails_at("jiton", "4")
    assert.is_true((jit.status()))
  end)

  it("lets a top level with real work load, and leaves the JIT as it was", function()
    loader.LOAD_BUDGET_S = saved -- (the default: a slow machine must not fail this one)
    assert.is_true((jit.status()))
    local gen, errors = loader.load(DIR .. "quick")
    assert.is_table(gen, errors and table.concat(errors, "\n"))
    assert.is_true((jit.status()))
  end)

  it("keeps a script's own jit.off()", function()
    loader.LOAD_BUDGET_S = saved
    local gen = loader.load(DIR .. "jitoff")
    assert.is_table(gen)
    assert.is_false((jit.status()))
  end)
end)
