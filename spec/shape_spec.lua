-- agg.pick / omit / rename / map / limit / shape: the page sends only what the client shows; each
-- helper leaves its argument alone and refuses what it cannot shape at the script's line.
local agg = require "agg"
local json = require "agg.json"

local P = { id = 7, name = "Concert", description = "long", price = 10, tags = { "a", "b", "c" } }

local function fails(fn)
  local ok, err = pcall(fn)
  assert.is_false(ok)
  return tostring(err)
end

describe("agg shaping helpers", function()
  it("pick keeps only the listed keys the value has", function()
    assert.same({ id = 7, name = "Concert" }, agg.pick(P, { "id", "name", "missing" }))
    assert.equal("long", P.description)
    assert.is_nil(agg.pick(nil, { "id" }))
    assert.equal(agg.null, agg.pick(agg.null, { "id" }))
  end)

  it("omit drops the listed keys", function()
    assert.same({ id = 7, name = "Concert", price = 10, tags = P.tags }, agg.omit(P, { "description" }))
  end)

  it("rename renames keys and keeps the others", function()
    assert.same({ eventId = 7, title = "Concert" }, agg.pick(agg.rename(P, { id = "eventId", name = "title" }), { "eventId", "title" }))
    assert.is_nil(agg.rename(P, { id = "eventId" }).id)
    assert.matches("'a' and 'b' are both renamed to 'x'", fails(function() agg.rename(P, { a = "x", b = "x" }) end), 1, true)
  end)

  it("map makes a JSON array and leaves out nil results", function()
    local out = agg.map({ 1, 2, 3, 4 }, function(v, i) if v % 2 == 0 then return v * 10 + i end end)
    assert.same({ 22, 44 }, out)
    assert.equal("[22,44]", json.encode(out))
    assert.equal("[]", json.encode(agg.map(nil, function() end)))
  end)

  it("limit keeps the first n items, as a JSON array even when empty", function()
    assert.same({ "a", "b" }, agg.limit(P.tags, 2))
    assert.same({ "a", "b", "c" }, agg.limit(P.tags, 10))
    assert.equal("[]", json.encode(agg.limit(P.tags, 0)))
    assert.matches("agg.limit: the length must be a whole number >= 0, got -1", fails(function() agg.limit(P.tags, -1) end), 1, true)
  end)

  it("refuses what it cannot shape, naming the helper and the script's line", function()
    assert.matches("shape_spec.lua:%d+: agg.pick: the value must be a table, got string", fails(function() agg.pick("x", { "a" }) end))
    assert.matches("agg.omit: key 1 of the list must be a string, got number", fails(function() agg.omit(P, { 1 }) end), 1, true)
    assert.matches("agg.map: the second argument must be a function", fails(function() agg.map({}, "f") end), 1, true)
    -- parsed JSON is data, not a function, though type() says "function" (a raw ref is a C closure)
    local ref = json.parse("[1]")
    assert.matches("agg.map: the second argument must be a function(item, index), got an agg.json raw ref (JSON data)",
                   fails(function() agg.map({ 1 }, ref) end), 1, true)
    assert.matches("agg.shape: the second argument must be a function(data), got an agg.json raw ref (JSON data)",
                   fails(function() agg.shape({ ok = true, data = {} }, ref) end), 1, true)
    assert.matches("agg.fetch_then: the second argument must be a function, got an agg.json raw ref (JSON data)",
                   fails(function() agg.fetch_then("product", ref) end), 1, true)
  end)

  it("shape reshapes a section with data and leaves an unavailable one as it is", function()
    local ok = { ok = true, status = "ok", data = P }
    assert.same({ id = 7 }, agg.shape(ok, function(d) return agg.pick(d, { "id" }) end).data)
    local down = { ok = false, status = "unavailable", error = { title = "x" } }
    local called = false
    assert.equal(down, agg.shape(down, function() called = true end))
    assert.is_false(called)
    assert.is_nil(down.data)
  end)
end)
