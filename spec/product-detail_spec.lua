-- The demo dependent chain (scripts/product-detail.lua): Reviews need Product's SKU.
-- Seed scenario: DESIGN §1 row 2 (Product 45 ms, Reviews 85 ms: page ≈ 130 ms, Inventory beside).
local testing = require "agg.testing"

describe("GET /product-detail/{id}", function()
  local gw
  before_each(function()
    gw = testing.gateway()
    gw:stub("product", "/products/7", { json = { id = 7, sku = "SNK-7" }, latency_ms = 45 })
    gw:stub("reviews", "/reviews", { json = { rating = 4.1 }, latency_ms = 85 })
    gw:stub("inventory", "/stock/7", { json = { inStock = 3 }, latency_ms = 30 })
  end)

  it("starts reviews the moment product answers, with its SKU: 130 ms", function()
    local page = gw:get("/product-detail/7")
    assert.equal(200, page.status)
    assert.equal(130, page.elapsed_ms)
    local reviews = gw:calls("reviews")[1]
    assert.equal(45, reviews.started_ms)
    assert.same({ sku = "SNK-7" }, reviews.query)
    assert.equal(4.1, page.json.reviews.data.rating)
  end)

  it("runs inventory beside the chain", function()
    gw:get("/product-detail/7")
    local inv, prod = gw:calls("inventory")[1], gw:calls("product")[1]
    assert.equal(0, inv.started_ms)
    assert.is_true(testing.overlap(inv, prod))
  end)

  it("serves the reviews fallback when reviews fail", function()
    gw:stub("reviews", "/reviews", { status = 503 })
    local page = gw:get("/product-detail/7")
    assert.equal(200, page.status)
    assert.equal("fallback", page.json.reviews.status)
    assert.equal('{"items":[]}', require("agg.json").encode(page.json.reviews.data))
    assert.equal(503, page.json.reviews.error.status ~= nil and 503 or nil)
  end)

  for _, fault in ipairs { "hang", "refuse", "reset", "non_json" } do
    it("degrades inventory when it fails (" .. fault .. ")", function()
      gw:stub("inventory", "/stock/7", { fault = fault })
      local page = gw:get("/product-detail/7")
      assert.equal(200, page.status)
      testing.expect_section(page, "inventory", "unavailable")
      testing.expect_section(page, "reviews", "ok")
    end)
  end

  it("names the script, section and values when an expectation fails", function()
    gw:stub("reviews", "/reviews", { fault = "hang" })
    local page = gw:get("/product-detail/7")
    local ok, err = pcall(testing.expect_section, page, "reviews", "ok")
    assert.is_false(ok)
    assert.matches('scripts/product-detail.lua (GET /product-detail/7): section reviews: expected status "ok", got "fallback" (urn:aggway:problem:upstream-timeout: the upstream did not answer in time)', tostring(err), 1, true)
    -- a failure of the test, as luassert's are (busted: "Failure", not "Error")
    assert.equal("failure", debug.getmetatable(err).__type)
    -- a status no section has is the spec's own mistake, named with the nearest one
    ok, err = pcall(testing.expect_section, page, "reviews", "fallbak")
    assert.is_false(ok)
    assert.matches('testing.expect_section: status must be "ok", "fallback", "stale" or "unavailable", got "fallbak" ' ..
                   "(did you mean 'fallback'?)", tostring(err), 1, true)
  end)

  it("does not call reviews when product fails, and fails the page", function()
    gw:stub("product", "/products/7", { fault = "refuse" })
    local page = gw:get("/product-detail/7")
    assert.equal(502, page.status)
    assert.equal(0, #gw:calls("reviews"))
    assert.equal("unavailable", page.json.sections.product.status)
  end)
end)
