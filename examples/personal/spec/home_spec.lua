-- The personalised home page (examples/personal/scripts/home.lua).
--   aggway test -c examples/personal/scripts examples/personal/spec
local testing = require "agg.testing"

local ALICE = { sub = "alice", aud = { "aggway", "foryou" } }
local FEATURED = { items = {} }
for i = 1, 10 do FEATURED.items[i] = { id = i, name = "Item " .. i, price = i * 100, stock = 5 } end

describe("the personalised home page", function()
  local gw
  before_each(function()
    gw = testing.gateway()
    gw:stub("catalog", "/featured", { json = FEATURED, latency_ms = 20 })
    gw:stub("foryou", "/recommendations?limit=6", { json = { { id = 42, name = "Just for Alice" } }, latency_ms = 60 })
  end)

  it("is for signed-in customers only: no token, no calls", function()
    assert.equal(401, gw:get("/home").status)
    assert.equal(0, #gw:calls())
  end)

  it("sends the caller's token to the personal service and to no other", function()
    local page = gw:get("/home", { user = ALICE, headers = { ["accept-language"] = "th-TH" } })
    assert.equal(200, page.status)
    assert.equal("Just for Alice", page.json.foryou.data[1].name)
    assert.equal("Hello, alice", page.json.greeting.data)
    assert.equal(8, #page.json.featured.data)
    assert.is_nil(page.json.featured.data[1].stock)
    local foryou, catalog = gw:calls("foryou")[1], gw:calls("catalog")[1]
    assert.equal("Bearer spec-token-alice", foryou.headers.authorization)
    assert.equal("th-TH", foryou.headers["accept-language"])
    assert.is_nil(catalog.headers.authorization)
    assert.is_nil(catalog.headers["accept-language"])
  end)

  it("never shares one customer's personal call with another's", function()
    local a = gw:send("GET", "/home", { user = ALICE })
    local b = gw:send("GET", "/home", { user = { sub = "bob", aud = { "aggway", "foryou" } } })
    gw:run()
    assert.equal(200, a.status)
    assert.equal(200, b.status)
    assert.equal(2, #gw:calls("foryou"))
    assert.equal("Bearer spec-token-bob", gw:calls("foryou")[2].headers.authorization)
  end)

  it("keeps the page when the personal service is down: an empty for-you list", function()
    gw:stub("foryou", "/recommendations?limit=6", { fault = "reset" })
    local page = gw:get("/home", { user = ALICE })
    assert.equal(200, page.status)
    assert.equal("fallback", page.json.foryou.status)
    assert.same({}, page.json.foryou.data)
  end)
end)
