-- agg.lint: `aggway check` sees the call specs written in a script's source and refuses the
-- mistakes it can see there, at the line of the spec, with a "did you mean".
local lint = require "agg.lint"

local UPS = { product = true, reviews = true, inventory = true }

local function check(src) return table.concat(lint.check(src, "page.lua", UPS), "\n") end

describe("agg.lint", function()
  it("finds a misspelt call option inside a handler and suggests the right one", function()
    local out = check([[
local agg = require "agg"
return { route = "GET /p/{id}", handler = function(req)
  return agg.page(agg.fetch_all {
    product = { "product", "/products/" .. req.params.id,
                requird = true },
  })
end }]])
    assert.equal("page.lua:5: call to 'product': unknown option 'requird' (did you mean 'required'?)", out)
  end)

  it("refuses a literal of the wrong type for an option", function()
    local out = check([[return { { "reviews", "/r", timeout_ms = "100", headers = "x", required = 1 } }]])
    assert.matches("page.lua:1: call to 'reviews': option 'timeout_ms' must be a number, got string", out, 1, true)
    assert.matches("option 'headers' must be a table, got string", out, 1, true)
    assert.matches("option 'required' must be a boolean, got number", out, 1, true)
  end)

  it("leaves values it cannot know without running the script alone", function()
    assert.equal("", check([[local t = 5
return { { "reviews", "/r/" .. id, timeout_ms = t * 2, required = flag, query = q(), fallback = "x" } }]]))
  end)

  it("names an unknown upstream with a did-you-mean", function()
    assert.matches("page.lua:2: call to unknown upstream 'reviws' (did you mean 'reviews'?) (gateway.lua declares: inventory, product, reviews)",
      check("local x = 1\nreturn { { 'reviws', '/r' } }"), 1, true)
  end)

  it("finds fetch_then keys that are not in the table, as a string or a list", function()
    local out = check([[
local calls = {
  product = { "product", "/p/1" },
  reviews = agg.fetch_then("prodct", function(p) return { "reviews", "/r" } end),
  stock = agg.fetch_then({ "product", "reviw" }, function(p, r) return nil end),
  same = fetch_then("same", function() end),
}]])
    assert.matches("page.lua:3: fetch_then for 'reviews' depends on 'prodct', which is not a key of this table (did you mean 'product'?)", out, 1, true)
    assert.matches("page.lua:4: fetch_then for 'stock' depends on 'reviw'", out, 1, true)
    assert.matches("page.lua:5: fetch_then for 'same' depends on itself", out, 1, true)
  end)

  it("accepts a fetch_then whose dependency is a call spec of its own", function()
    assert.equal("", check([[local r = { x = agg.fetch_then({ "product", "/p/1" }, function(p) return nil end) }]]))
  end)

  it("is not fooled by strings, comments and long brackets that look like call specs", function()
    assert.equal("", check([==[
-- { "nope", "/x", requird = true }
local s = [[ { "nope", "/x", requird = true } ]]
local t = '{ "nope", "/x" }'
--[[ { "nope", "/x" } ]]
return { { "product", "/p", required = true, timeout_ms = 10 } }]==]))
  end)

  it("counts lines through multi-line strings and comments", function()
    assert.matches("^page.lua:6:", check([==[
--[[ one
two ]]
local s = [[
three]]
return {
  { "product", "/p", timout_ms = 10 } }]==]))
  end)

  it("passes the repository's own scripts", function()
    for _, f in ipairs { "scripts/product-page.lua", "scripts/product-detail.lua" } do
      local fh = assert(io.open(f))
      local src = fh:read("*a")
      fh:close()
      assert.same({}, lint.check(src, f, UPS))
    end
  end)
end)
