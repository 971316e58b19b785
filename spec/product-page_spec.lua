-- The demo product page (scripts/product-page.lua) against stubbed Product, Reviews and Inventory,
-- on the virtual clock. Seed scenarios: DESIGN §1 rows 1, 3 and 4.
local testing = require "agg.testing"

local PRODUCT = { id = 42, name = "Sneaker", price = 89, sku = "SNK-42", description = "long text" }
local REVIEWS = { productId = 42, rating = 4.6, count = 128, top = { { user = "a", stars = 5 } } }
local STOCK = { productId = 42, inStock = 12, warehouse = "BKK-1" }

local function healthy(gw)
  gw:stub("product", "/products/42", { json = PRODUCT, latency_ms = 40 })
  gw:stub("reviews", "/reviews/42", { json = REVIEWS, latency_ms = 80 })
  gw:stub("inventory", "/stock/42", { json = STOCK, latency_ms = 30 })
end

describe("GET /product-page/{id}", function()
  local gw
  before_each(function()
    gw = testing.gateway()
    healthy(gw)
  end)

  it("fans out in parallel: the page takes the slowest call (80 ms), not the sum (150 ms)", function()
    local page = gw:get("/product-page/42")
    assert.equal(200, page.status)
    assert.equal(80, page.elapsed_ms)
    assert.equal("true", page.headers["x-aggregation-completed"])
    assert.equal("no-store", page.headers["cache-control"]) -- its sections are fetched uncached
    local p, r, i = gw:calls("product")[1], gw:calls("reviews")[1], gw:calls("inventory")[1]
    assert.equal(0, p.started_ms); assert.equal(0, r.started_ms); assert.equal(0, i.started_ms)
    assert.is_true(testing.overlap(p, r) and testing.overlap(r, i))
  end)

  it("drops the product description and keeps every other field in upstream order", function()
    local page = gw:get("/product-page/42")
    assert.is_nil(page.json.product.data.description)
    assert.equal("SNK-42", page.json.product.data.sku)
    assert.matches('"product":{"status":"ok","data":{"id":42,"name":"Sneaker","price":89,"sku":"SNK-42"}}', page.body, 1, true)
    assert.matches('"rating":4.6', page.body, 1, true)
  end)

  it("names every call in Server-Timing", function()
    local page = gw:get("/product-page/42")
    assert.equal("inventory;dur=30.0, product;dur=40.0, reviews;dur=80.0", page.headers["server-timing"])
  end)

  it("gives byte-identical pages for the same answers", function()
    local a = gw:get("/product-page/42").body
    local b = gw:get("/product-page/42").body
    assert.equal(a, b)
  end)

  describe("when reviews fail, the page is still 200 with reviews unavailable", function()
    local cases = {
      { "hangs", { fault = "hang" }, "upstream-timeout", 100 },
      { "is slower than its 100 ms cap", { json = REVIEWS, latency_ms = 500 }, "upstream-timeout", 100 },
      { "refuses connections", { fault = "refuse" }, "upstream-unreachable", 40 },
      { "fails its TLS handshake", { fault = "tls", latency_ms = 10 }, "upstream-tls", 40 },
      { "answers 503", { status = 503, json = { title = "down" }, latency_ms = 10 }, "upstream-error", 40 },
      { "answers 500", { status = 500, body = "oops", latency_ms = 10 }, "upstream-error", 40 },
      { "sends invalid JSON", { fault = "non_json", latency_ms = 10 }, "upstream-bad-json", 40 },
      { "sends invalid UTF-8", { fault = "invalid_utf8", latency_ms = 10 }, "upstream-bad-json", 40 },
      { "resets the connection", { fault = "reset", latency_ms = 10 }, "upstream-bad-response", 40 },
      { "sends a short body", { fault = "short", latency_ms = 10 }, "upstream-bad-response", 40 },
    }
    for _, c in ipairs(cases) do
      it(c[1], function()
        gw:stub("reviews", "/reviews/42", c[2])
        local page = gw:get("/product-page/42")
        assert.equal(200, page.status)
        assert.equal(c[4], page.elapsed_ms)
        assert.equal("unavailable", page.json.reviews.status)
        assert.equal("urn:aggway:problem:" .. c[3], page.json.reviews.error.type)
        assert.equal("false", page.headers["x-aggregation-completed"])
        assert.equal("no-store", page.headers["cache-control"])
        assert.equal("ok", page.json.product.status)
        assert.equal("ok", page.json.inventory.status)
      end)
    end
  end)

  it("seed: deadline 200 ms, reviews hanging: 200 at 100 ms, not after the deadline", function()
    gw:stub("reviews", "/reviews/42", { fault = "hang" })
    local page = gw:get("/product-page/42")
    assert.equal(200, page.status)
    assert.equal(100, page.elapsed_ms)
    assert.equal(504, page.json.reviews.error.status)
    assert.equal(100, gw:calls("reviews")[1].ended_ms)
  end)

  it("when inventory fails the page degrades the same way", function()
    gw:stub("inventory", "/stock/42", { fault = "refuse" })
    local page = gw:get("/product-page/42")
    assert.equal(200, page.status)
    assert.equal("unavailable", page.json.inventory.status)
  end)

  describe("product is required", function()
    it("refusing connections fails the page with 502 problem+json", function()
      gw:stub("product", "/products/42", { fault = "refuse" })
      local page = gw:get("/product-page/42")
      assert.equal(502, page.status)
      assert.equal("application/problem+json", page.headers["content-type"])
      assert.equal("urn:aggway:problem:required-section-failed", page.json.type)
      assert.equal("unavailable", page.json.sections.product.status)
      -- fail fast: the page is answered when product refuses, and the other calls are cancelled
      assert.equal(0, page.elapsed_ms)
      assert.equal("unavailable", page.json.sections.reviews.status)
      assert.equal("urn:aggway:problem:call-cancelled", page.json.sections.reviews.error.type)
      for _, c in ipairs(gw:calls("reviews")) do assert.is_true(c.cancelled) end
      assert.is_nil(page.json.product)
    end)

    it("timing out fails the page with 504 after its 150 ms cap", function()
      gw:stub("product", "/products/42", { fault = "hang" })
      local page = gw:get("/product-page/42")
      assert.equal(504, page.status)
      assert.equal(150, page.elapsed_ms)
    end)

    it("answering 404 passes 404 through", function()
      gw:stub("product", "/products/42", { status = 404, json = { error = "no such product" } })
      assert.equal(404, gw:get("/product-page/42").status)
    end)

    it("answering 410 passes 410 through", function()
      gw:stub("product", "/products/42", { status = 410 })
      assert.equal(410, gw:get("/product-page/42").status)
    end)

    it("answering 500 gives 502", function()
      gw:stub("product", "/products/42", { status = 500 })
      assert.equal(502, gw:get("/product-page/42").status)
    end)

    it("sending invalid JSON gives 502", function()
      gw:stub("product", "/products/42", { fault = "non_json" })
      assert.equal(502, gw:get("/product-page/42").status)
    end)
  end)

  it("answers 405 to a POST and 404 to an unknown path", function()
    assert.equal(405, gw:request("POST", "/product-page/42").status)
    assert.equal(404, gw:get("/product-pages/42").status)
  end)
end)
