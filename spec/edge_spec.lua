-- The edge in specs (issue "edge"): requests as a user, the endpoint's auth, and the identity each
-- upstream gets (forwarded token, RFC 8693 exchange cached on the virtual clock). Fixture:
-- spec/fixtures/edge.
local testing = require "agg.testing"

local DIR = "spec/fixtures/edge"
local ALICE = { sub = "alice", scopes = { "orders:read" }, aud = { "aggway", "orders" } }

describe("a protected endpoint in a spec", function()
  local gw
  before_each(function()
    gw = testing.gateway { dir = DIR }
    gw:stub("orders", "/orders/*", { json = { id = 1 } })
    gw:stub("inventory", "/stock/*", { json = { inStock = 3 } })
    gw:stub("catalog", "/items/*", { json = { name = "Sneaker" } })
    gw:stub("@token_exchange", "POST", "/token", { json = { access_token = "xt-1", token_type = "Bearer",
                                                             expires_in = 120 } })
  end)

  it("answers 401 without a user and 403 without the scope, as the edge does", function()
    local r = gw:get("/orders/1")
    assert.equal(401, r.status)
    assert.equal('Bearer realm="aggway"', r.headers["www-authenticate"])
    r = gw:get("/orders/1", { user = { sub = "bob", scopes = { "profile" } } })
    assert.equal(403, r.status)
    assert.equal(0, #gw:calls())
    assert.equal(200, gw:get("/health").status)
    -- an endpoint without auth authenticates no one, whatever the request carries
    assert.is_false(gw:get("/open-who", { user = ALICE }).json.user)
  end)

  -- (the edge's verdict reaches the runtime when first needed: core.request_user)
  it("gives a script its request's user while it runs, and none to a req kept past its page", function()
    local BOB = { sub = "bob", scopes = { "orders:read" } }
    assert.same({ sub = "alice", via = "jwt" }, gw:get("/kept-user/read", { user = ALICE }).json)
    -- a kept req keeps the user its script read while it ran (alice), never the new request's
    assert.same({ sub = "alice", via = "jwt" }, gw:get("/kept-user/later", { user = BOB }).json)
    -- a req kept unread: its request has ended, it has no user to give
    assert.same({ sub = false, via = false }, gw:get("/kept-user/unread", { user = BOB }).json)
    assert.same({ sub = false, via = false }, gw:get("/kept-user/later", { user = ALICE }).json)
  end)

  it("asks for the user only when something reads it, and once per request", function()
    local rt = require "agg.runtime"
    local init, asked = rt.init, 0
    rt.init = function(core, ...) -- count the runtime's asks (core.request_user)
      local real = core.request_user
      core.request_user = function(rid) asked = asked + 1; return real(rid) end
      return init(core, ...)
    end
    local ok, err = pcall(function()
      local g = testing.gateway { dir = DIR }
      g:stub("orders", "/orders/*", { json = { id = 1 } })
      g:stub("inventory", "/stock/*", { json = { inStock = 3 } })
      g:stub("catalog", "/items/*", { json = { name = "Sneaker" } })
      g:stub("@token_exchange", "POST", "/token", { json = { access_token = "xt-1", token_type = "Bearer",
                                                            expires_in = 120 } })
      assert.equal(200, g:get("/kept-user/unread", { user = ALICE }).status) -- reads nothing
      assert.equal(0, asked)
      -- req.user read, then a forwarded and an exchanged identity: one ask
      assert.equal("alice", g:get("/orders/1", { user = ALICE }).json.who.data)
      assert.equal(1, asked)
    end)
    rt.init = init
    assert(ok, err)
  end)

  it("gives the script req.user and each upstream the identity gateway.lua says", function()
    local page = gw:get("/orders/1", { user = ALICE })
    assert.equal(200, page.status)
    assert.equal("alice", page.json.who.data)
    local order, stock, info = gw:calls("orders")[1], gw:calls("inventory")[1], gw:calls("catalog")[1]
    assert.equal("Bearer spec-token-alice", order.headers.authorization)
    assert.equal("Bearer xt-1", stock.headers.authorization)
    assert.is_nil(info.headers.authorization)
    local x = gw:calls("@token_exchange")[1]
    assert.matches("grant_type=urn%%3Aietf%%3Aparams%%3Aoauth%%3Agrant%-type%%3Atoken%-exchange", x.body)
    assert.matches("subject_token=spec%-token%-alice", x.body)
    assert.matches("audience=inventory", x.body)
    assert.equal("Basic YWdnd2F5OnNwZWMtY2xpZW50LXNlY3JldA==", x.headers.authorization)
  end)

  it("shows the token endpoint's call in the Server-Timing of a page that waited for it, and only there", function()
    local first = gw:get("/orders/1", { user = ALICE })
    local st = first.headers["server-timing"]
    assert.matches("token%-exchange;dur=[%d.]+", st)
    local _, n = st:gsub("token%-exchange;", "")
    assert.equal(1, n)
    -- the token kept from the first page: no call, no entry
    local second = gw:get("/orders/2", { user = ALICE })
    assert.equal(1, #gw:calls("@token_exchange"))
    assert.is_nil(second.headers["server-timing"]:find("token-exchange", 1, true))
  end)

  it("forwards no token whose aud does not name the upstream", function()
    local page = gw:get("/orders/1", { user = { sub = "carol", scopes = { "orders:read" } } })
    testing.expect_section(page, "order", "unavailable", "identity-unavailable")
    assert.equal(0, #gw:calls("orders"))
  end)

  it("reuses an exchanged token until shortly before it expires, per user", function()
    gw:get("/orders/1", { user = ALICE })
    gw:get("/orders/2", { user = ALICE })
    assert.equal(1, #gw:calls("@token_exchange"))
    gw:get("/orders/3", { user = { sub = "dave", scopes = { "orders:read" } } })
    assert.equal(2, #gw:calls("@token_exchange"))  -- dave never gets alice's token
    gw:advance(89000)                               -- expires_in 120 s, renewed 30 s early
    gw:get("/orders/4", { user = ALICE })
    assert.equal(2, #gw:calls("@token_exchange"))
    gw:advance(2000)
    gw:get("/orders/5", { user = ALICE })
    assert.equal(3, #gw:calls("@token_exchange"))
  end)

  it("fails the section when the token endpoint is down, and a required one fails the page with 503", function()
    gw:stub("@token_exchange", "POST", "/token", { status = 503, json = { error = "temporarily_unavailable" } })
    local page = gw:get("/orders/1", { user = ALICE })
    testing.expect_section(page, "stock", "unavailable", "identity-unavailable")
    local r = gw:get("/stock/1", { user = ALICE })
    assert.equal(503, r.status)
    assert.equal(0, #gw:calls("inventory"))
  end)

  it("never serves one user's cached section to another when the upstream gets the user's identity", function()
    local ERIN = { sub = "erin", scopes = { "orders:read" }, aud = { "aggway", "orders" } }
    assert.equal(200, gw:get("/cached-orders/1", { user = ALICE }).status)
    assert.equal(200, gw:get("/cached-orders/1", { user = ERIN }).status)
    local calls = gw:calls("orders")
    assert.equal(2, #calls)                          -- erin's page did not get alice's entry
    assert.equal("Bearer spec-token-alice", calls[1].headers.authorization)
    assert.equal("Bearer spec-token-erin", calls[2].headers.authorization)
    gw:get("/cached-orders/1", { user = ALICE })
    gw:get("/cached-orders/1", { user = ERIN })
    assert.equal(2, #gw:calls("orders"))             -- each user's own entry is a hit
  end)

  it("gives a section that gets the user's identity no stale-while-revalidate (its refresh has no user)", function()
    local function desc(page)
      return (page.headers["server-timing"] or ""):match("order;dur=[%d.]+;desc=\"(%a+)\"")
    end
    assert.equal("miss", desc(gw:get("/swr-orders/1", { user = ALICE })))
    assert.equal("hit", desc(gw:get("/swr-orders/1", { user = ALICE })))
    gw:advance(20000) -- past ttl_s, within swr_s
    local page = gw:get("/swr-orders/1", { user = ALICE })
    assert.equal(200, page.status)
    assert.equal("miss", desc(page)) -- (was "refresh": the stale copy, and a refresh that failed)
    assert.equal(2, #gw:calls("orders"))
    assert.equal("hit", desc(gw:get("/swr-orders/1", { user = ALICE })))
  end)

  it("marks a page private when a section carries the user's identity or the request was authenticated", function()
    assert.equal("private", gw:get("/orders/1", { user = ALICE }).headers["cache-control"])
    -- one shared cache entry only, but the edge let the request in: a shared cache must not keep
    -- it and serve it to a caller without a token
    gw:get("/items/1", { user = ALICE })
    local page = gw:get("/items/1", { user = ALICE })
    assert.matches("^private, max%-age=%d+$", page.headers["cache-control"])
    local age = tonumber(page.headers["cache-control"]:match("%d+$"))
    assert.is_true(age >= 50 and age <= 60)                             -- 60 s less the jitter (up to 10 %)
  end)

  it("never answers a refused token exchange with the user's stale copy (RFC 5861 §4; an attack review)", function()
    gw:stub("@token_exchange", "POST", "/token", { json = { access_token = "xt-1", token_type = "Bearer",
                                                             expires_in = 2 } })
    local first = gw:get("/cached-stock/1", { user = ALICE })
    testing.expect_section(first, "stock", "ok")
    gw:advance(3000) -- the entry and the exchanged token are both past their time
    -- the authorization server refuses the user's token now
    gw:stub("@token_exchange", "POST", "/token", { status = 400, json = { error = "invalid_grant" } })
    testing.expect_section(gw:get("/cached-stock/1", { user = ALICE }), "stock", "unavailable", "identity-unavailable")
    -- the token endpoint down (503, refused) is an outage, not a refusal: the stale copy answers
    -- (a second review: the first version refused it for every failed exchange)
    gw:stub("@token_exchange", "POST", "/token", { status = 503, json = { error = "temporarily_unavailable" } })
    testing.expect_section(gw:get("/cached-stock/1", { user = ALICE }), "stock", "stale", "identity-unavailable")
    gw:stub("@token_exchange", "POST", "/token", { fault = "refuse" })
    testing.expect_section(gw:get("/cached-stock/1", { user = ALICE }), "stock", "stale", "identity-unavailable")
    -- the service refusing the exchanged token (401), then the token endpoint down for the fresh
    -- one: the failure follows a refusal, no stale copy (a third review)
    local n = 0
    gw:stub("@token_exchange", "POST", "/token", function()
      n = n + 1
      if n == 1 then return { json = { access_token = "xt-3", token_type = "Bearer", expires_in = 120 } } end
      return { status = 503, json = { error = "temporarily_unavailable" } }
    end)
    gw:stub("inventory", "/stock/*", { status = 401, json = { error = "revoked" } })
    gw:advance(200000)
    testing.expect_section(gw:get("/cached-stock/1", { user = ALICE }), "stock", "unavailable", "identity-unavailable")
    -- an upstream that fails (503) with the user's identity still gets the stale copy
    gw:stub("@token_exchange", "POST", "/token", { json = { access_token = "xt-2", token_type = "Bearer",
                                                             expires_in = 120 } })
    gw:stub("inventory", "/stock/*", { status = 503, json = { error = "down" } })
    testing.expect_section(gw:get("/cached-stock/1", { user = ALICE }), "stock", "stale", "upstream-error")
  end)

  it("never answers a call one of whose attempts the service refused with the stale copy (a fourth review)", function()
    -- (the 401 came while a hedge was out; the hedge's 503 ended the call, and the stale copy
    -- answered it)
    gw:stub("@token_exchange", "POST", "/token", { json = { access_token = "xt-1", token_type = "Bearer",
                                                             expires_in = 600 } })
    testing.expect_section(gw:get("/hedged-stock/1", { user = ALICE }), "stock", "ok")
    gw:advance(3000)
    local n = 0
    gw:stub("inventory", "/stock/*", function()
      n = n + 1
      if n == 1 then return { status = 401, json = { error = "revoked" }, latency_ms = 20 } end
      return { status = 503, json = { error = "down" }, latency_ms = 50 }
    end)
    testing.expect_section(gw:get("/hedged-stock/1", { user = ALICE }), "stock", "unavailable")
    assert.equal(2, n) -- the attempt and its hedge
  end)

  it("gives a shared exchange its own timeout, not the deadline of the request that started it", function()
    gw:stub("@token_exchange", "POST", "/token", { json = { access_token = "xt-9", token_type = "Bearer",
                                                             expires_in = 120 }, latency_ms = 200 })
    local hurry = gw:send("GET", "/stock-hurry/1", { user = ALICE })
    gw:advance(10)
    local page = gw:send("GET", "/stock/1", { user = ALICE }) -- the same user: waits for that exchange
    gw:run()
    testing.expect_section(hurry, "stock", "unavailable")
    assert.equal(100, hurry.elapsed_ms)
    assert.equal(200, page.status)
    assert.equal("ok", page.json.stock.status)
    assert.equal(1, #gw:calls("@token_exchange"))
    assert.equal("Bearer xt-9", gw:calls("inventory")[1].headers.authorization)
  end)

  it("waits for the exchange within the request's deadline", function()
    gw:stub("@token_exchange", "POST", "/token", { fault = "hang" })
    local page = gw:get("/orders/1", { user = ALICE })
    testing.expect_section(page, "stock", "unavailable", "identity-unavailable")
    assert.equal(300, page.elapsed_ms)               -- token_exchange.timeout_ms
  end)
end)
