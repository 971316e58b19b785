-- Route parameters: only RFC 3986 path characters reach a script (route/route_param.h),
-- and a route may narrow a parameter with a pattern. The spec harness routes with the gateway's
-- own router, so these are serve's answers.
local testing = require "agg.testing"
local loader = require "agg.loader"

local DIR = "spec/fixtures/routing/"

describe("a route parameter", function()
  local gw
  before_each(function()
    gw = testing.gateway { dir = DIR .. "good" }
    gw:stub("inventory", "/stock/7/public", { json = { inStock = 3 } })
  end)

  it("reaches the script still percent-encoded, and builds the upstream path as written", function()
    local page = gw:get("/pub/7")
    assert.equal(200, page.status)
    assert.equal("/stock/7/public", gw:calls("inventory")[1].path)
  end)

  for _, case in ipairs {
    { "/pub/7#", "a '#' (the upstream would get /stock/7)" },
    { "/pub/7\255", "a raw byte that is not a URI character" },
    { "/pub/7%FF", "an escape that decodes to invalid UTF-8" },
    { "/pub/7%2Fx", "an escape that decodes to '/'" },
    { "/pub/7%0Ax", "an escape that decodes to LF" },
    { "/pub/7%", "a '%' that is not %XX" },
    { "/pub/%2e%2e", "an escaped '..' (an upstream resolves /stock/%2e%2e/public to /public)" },
    { "/pub/.%2E", "a half-escaped '..'" },
    { "/pub/%2e", "an escaped '.'" },
    { "/pub/..;", "'..;' (a servlet container strips the ';' and resolves the dots)" },
    { "/pub/%37", "an escaped digit (an upstream reads /stock/%37/public as /stock/7/public)" },
    { "/pub/%61dmin", "an escaped letter (a second spelling of /pub/admin)" },
    { "/pub/v1%2d2", "an escaped '-' in lower-case hex" },
    { "/pub/7;x", "a ';' (a path parameter, which servlet containers strip)" },
    { "/pub/7%3Bx", "an escaped ';'" },
  } do
    it("with " .. case[2] .. " is a 400 problem, and no call is made", function()
      local page = gw:get(case[1])
      assert.equal(400, page.status)
      assert.equal("application/problem+json", page.headers["content-type"])
      assert.equal("urn:aggway:problem:bad-route-parameter", page.json.type)
      assert.equal(0, #gw:calls("inventory"))
    end)
  end

  it("may be narrowed by a pattern: a segment it does not match is a 404", function()
    assert.same({ id = "42" }, gw:get("/product-page/42").json)
    assert.same({ featured = true }, gw:get("/product-page/featured").json)
    for _, p in ipairs { "/product-page/4x2", "/product-page/1234567890", "/product-page/4%20" } do
      local page = gw:get(p)
      assert.equal(404, page.status, p)
      assert.equal("urn:aggway:problem:route-not-found", page.json.type)
    end
    -- an escaped digit is refused before any pattern: "%34" is "4" to an upstream
    assert.equal(400, gw:get("/product-page/%34").status)
  end)

  it("can be escaped again with agg.escape, which never leaves '/', '?' or '#'", function()
    assert.same({ escaped = "Zo%C3%AB%2F%3F%23x" }, gw:get("/escape/Zo%C3%AB").json)
  end)
end)

describe("a call the upstream client will not send", function()
  -- a list, not a map: the specs run in the same order every time (tools/spec-determinism)
  for _, case in ipairs {
    { "hash", "path contains '#', which would start a fragment" },
    { "raw", "path contains a byte that is not ASCII" },
    { "vt", "header value contains a control character (only HTAB is allowed)" },
    { "del", "header value contains a control character (only HTAB is allowed)" },
    { "dots", "path contains a dot segment" },
    { "rawdots?v=%252e%252E", "path contains a dot segment" },
    { "dots?v=..;x", "path contains a dot segment" },
    { "dots?v=../admin", "path contains a dot segment" }, -- agg.escape gives ..%2Fadmin, read as ../admin
    { "rawdots?v=..%5Cadmin", "path contains '\\', which is no URI character" },
  } do
    local which, why = case[1], case[2]
    it("(" .. which .. ") fails its section with invalid-call, and nothing is sent", function()
      local gw = testing.gateway { dir = DIR .. "good" }
      gw:stub("inventory", "/stock/7", { json = { inStock = 3 } })
      local page = gw:get("/bad-call/" .. which)
      assert.equal(502, page.status)
      assert.equal("urn:aggway:problem:invalid-call", page.json.sections.stock.error.type)
      assert.equal(0, #gw:calls("inventory"))
      assert.matches("bad request, nothing sent: " .. why, table.concat(gw:logs(), "\n"), 1, true)
    end)
  end
end)

describe("a route pattern", function()
  it("that does not compile is a load error with file:line, as aggway check reports it", function()
    local gen, errors = loader.load(DIR .. "badpattern")
    assert.is_nil(gen)
    assert.matches(DIR .. "badpattern/page.lua:2: route 'GET /product-page/{id:[0-9+}': parameter {id}: " ..
                   "pattern '[0-9+': a '[' is not closed with ']'", table.concat(errors, "\n"), 1, true)
  end)
end)
