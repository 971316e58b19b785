-- agg.testing checks what a spec gives it as tools/mock checks its config: a misspelt stub option,
-- a fault that does not exist or a request option it does not know is an error naming it, at the
-- spec's line, never an answer that silently differs from what was meant.
local testing = require "agg.testing"

local function fails(fn)
  local ok, err = pcall(fn)
  assert.is_false(ok, "expected an error")
  return tostring(err)
end

describe("the spec harness", function()
  local gw
  before_each(function() gw = testing.gateway() end)

  it("refuses a misspelt stub option and suggests the right one", function()
    local err = fails(function() gw:stub("product", "/products/1", { json = {}, latncy_ms = 500 }) end)
    assert.matches("harness_spec.lua:%d+: gw:stub: unknown option 'latncy_ms' %(did you mean 'latency_ms'%?%)", err)
  end)

  it("refuses a fault that does not exist, and lists the ones that do", function()
    local err = fails(function() gw:stub("product", "/products/1", { fault = "timeout" }) end)
    assert.matches("gw:stub: unknown fault 'timeout'", err, 1, true)
    assert.matches("hang, huge, invalid_utf8", err, 1, true)
  end)

  it("names the answer of a list that is wrong", function()
    local err = fails(function() gw:stub("product", "/products/1", { { json = {} }, { status = "500" } }) end)
    assert.matches("gw:stub answer 2: option 'status' must be a number, got string", err, 1, true)
  end)

  it("refuses an out-of-range status or a negative latency", function()
    assert.matches("status must be an HTTP status code", fails(function() gw:stub("product", "/p", { status = 42 }) end), 1, true)
    assert.matches("latency_ms must be a number of milliseconds >= 0",
      fails(function() gw:stub("product", "/p", { latency_ms = -1 }) end), 1, true)
  end)

  it("names a stub function's wrong answer at the function's line, not the harness's", function()
    -- (a new page author got testing_transport.lua's line for a function that returned nothing)
    gw:stub("reviews", "/reviews/*", { json = {} })
    gw:stub("inventory", "/stock/*", { json = {} })
    local nothing = function() end
    local line = debug.getinfo(nothing, "S").linedefined
    gw:stub("product", "/products/*", nothing)
    -- (the function runs as the call starts, inside the page's script: a script error of the page)
    assert.equal(500, gw:get("/product-page/42").status)
    assert.matches("harness_spec.lua:" .. line .. ": gw:stub function for product /products/42 must return an answer " ..
                   "table like { json = … }, got nil", table.concat(gw:logs(), "\n"), 1, true)
    local misspelt = function() return { jsn = {} } end
    line = debug.getinfo(misspelt, "S").linedefined
    gw:stub("product", "/products/*", misspelt)
    assert.equal(500, gw:get("/product-page/42").status)
    assert.matches("harness_spec.lua:" .. line .. ": gw:stub function for product /products/42: unknown option 'jsn' " ..
                   "(did you mean 'json'?)", table.concat(gw:logs(), "\n"), 1, true)
  end)

  it("names an unknown upstream with a did-you-mean", function()
    assert.matches("gw:stub: gateway.lua has no upstream 'prodcut' (did you mean 'product'?)",
      fails(function() gw:stub("prodcut", "/p", { json = {} }) end), 1, true)
  end)

  it("refuses a stub path without its leading '/'", function()
    assert.matches('gw:stub: the path "products/42" must start with \'/\' ("/products/42")',
      fails(function() gw:stub("product", "products/42", { json = {} }) end), 1, true)
    for _, up in ipairs { "product", "reviews", "inventory" } do gw:stub(up, "*", { json = { any = true } }) end
    assert.equal(200, gw:get("/product-page/42").status) -- ("*": every path)
  end)

  it("refuses an unknown request option at the spec's line", function()
    local err = fails(function() gw:get("/product-page/1", { header = { a = "b" } }) end)
    assert.matches("harness_spec.lua:%d+: gw:get: unknown option 'header' %(did you mean 'headers'%?%)", err)
  end)

  it("refuses an unknown gateway option", function()
    assert.matches("testing.gateway: unknown option 'dri' (did you mean 'dir'?)",
      fails(function() testing.gateway { dri = "scripts" } end), 1, true)
  end)

  it("refuses a clock move that is not a number of ms", function()
    assert.matches("harness_spec.lua:%d+: gw:advance: the time must be a number of virtual ms >= 0", fails(function() gw:advance("10") end))
    assert.matches("gw:at: the second argument must be a function", fails(function() gw:at(5, "x") end), 1, true)
  end)

  it("keeps the script errors of the current test for the failure message", function()
    testing.clear_script_errors()
    gw:stub("product", "/products/1", { json = {} })
    gw:stub("reviews", "/reviews/1", { json = {} })
    gw:stub("inventory", "/stock/1", { json = {} })
    local ok = gw:get("/product-page/1")
    assert.equal(200, ok.status)
    assert.same({}, testing.script_errors)
  end)
end)
