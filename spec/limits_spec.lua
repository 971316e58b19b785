-- Rate limits, quotas and priority shedding (issue 18) on the virtual clock: the same C limiter
-- and answers as serve (gateway/limits), before any script runs. Fixture: spec/fixtures/limits.
local testing = require "agg.testing"

local DIR = "spec/fixtures/limits"
local QUOTA_TYPE = "https://iana.org/assignments/http-problem-types#quota-exceeded"

describe("an answer with RateLimit fields", function()
  it("is private: they are this client's counts, which a shared cache would give every client", function()
    local gw = testing.gateway { dir = DIR }
    gw:stub("slow", "/s", { json = { ok = true } })
    local page = gw:get("/shared/1")
    assert.equal('"per-ip";r=4;t=1', page.headers["ratelimit"])
    assert.matches("^private, max%-age=%d+$", page.headers["cache-control"]) -- the user's own cache only
    local open = gw:get("/shared-open/1") -- the same entry, no rule: no fields
    assert.is_nil(open.headers["ratelimit"])
    assert.matches("^max%-age=%d+$", open.headers["cache-control"])
    assert.equal("private", gw:get("/rate").headers["cache-control"]) -- a plain response, none of its own
  end)
end)

describe("a rate with a burst", function()
  it("accepts the burst at once, then one every 100 ms, with RateLimit fields on every answer", function()
    local gw = testing.gateway { dir = DIR }
    for left = 4, 0, -1 do
      local page = gw:get("/rate")
      assert.equal(200, page.status)
      assert.equal('"per-ip";q=5;w=1', page.headers["ratelimit-policy"])
      assert.equal(('"per-ip";r=%d;t=1'):format(left), page.headers["ratelimit"])
    end
    local refused = gw:get("/rate")
    assert.equal(429, refused.status)
    assert.equal(QUOTA_TYPE, refused.json.type)
    assert.same({ "per-ip" }, refused.json["violated-policies"])
    assert.equal("1", refused.headers["retry-after"])   -- 100 ms, rounded up: never early
    gw:advance(99)
    assert.equal(429, gw:get("/rate").status)
    gw:advance(1)
    assert.equal(200, gw:get("/rate").status)
    -- over five virtual seconds once the burst is spent: exactly ten a second
    local ok = 0
    for _ = 1, 500 do
      gw:advance(10)
      if gw:get("/rate").status == 200 then ok = ok + 1 end
    end
    assert.equal(50, ok)
  end)

  it("counts each client address apart", function()
    local gw = testing.gateway { dir = DIR }
    for _ = 1, 5 do gw:get("/rate", { ip = "10.0.0.1" }) end
    assert.equal(429, gw:get("/rate", { ip = "10.0.0.1" }).status)
    assert.equal(200, gw:get("/rate", { ip = "10.0.0.2" }).status)
  end)
end)

describe("a daily quota", function()
  it("resets at 00:00 UTC and says when", function()
    -- 2026-03-10T23:59:00Z
    local gw = testing.gateway { dir = DIR, utc_ms = 1773187140000 }
    for left = 2, 0, -1 do
      local page = gw:get("/quota", { headers = { ["X-Client"] = "alice" } })
      assert.equal(200, page.status)
      assert.equal(('"daily";r=%d;t=60'):format(left), page.headers["ratelimit"])
    end
    local refused = gw:get("/quota", { headers = { ["X-Client"] = "alice" } })
    assert.equal(429, refused.status)
    assert.equal("60", refused.headers["retry-after"])
    assert.equal('"daily";q=3;w=86400', refused.headers["ratelimit-policy"])
    assert.equal(200, gw:get("/quota", { headers = { ["X-Client"] = "bob" } }).status)
    gw:advance(59999)
    assert.equal(429, gw:get("/quota", { headers = { ["X-Client"] = "alice" } }).status)
    gw:advance(1) -- 00:00:00Z: a new day
    local page = gw:get("/quota", { headers = { ["X-Client"] = "alice" } })
    assert.equal(200, page.status)
    assert.equal('"daily";r=2;t=86400', page.headers["ratelimit"])
  end)

  it("does not count refused requests", function()
    local gw = testing.gateway { dir = DIR }
    for _ = 1, 3 do gw:get("/quota") end
    for _ = 1, 10 do assert.equal(429, gw:get("/quota").status) end
    gw:advance(24 * 3600 * 1000)
    for _ = 1, 3 do assert.equal(200, gw:get("/quota").status) end
  end)
end)

describe("keys from the edge", function()
  it("count an API key's app and a token's subject, each apart", function()
    local gw = testing.gateway { dir = DIR }
    local shop, blog = { app = "shop", plan = "gold" }, { app = "blog" }
    assert.equal(200, gw:get("/by-app", { user = shop }).status)
    assert.equal(200, gw:get("/by-app", { user = shop }).status)
    local refused = gw:get("/by-app", { user = shop })
    assert.equal(429, refused.status)
    assert.same({ "per-app" }, refused.json["violated-policies"])
    assert.equal(200, gw:get("/by-app", { user = blog }).status)
    assert.equal(200, gw:get("/by-user", { user = { sub = "alice" } }).status)
    assert.equal(429, gw:get("/by-user", { user = { sub = "alice" } }).status)
    assert.equal(200, gw:get("/by-user", { user = { sub = "bob" } }).status)
    gw:advance(10000)
    assert.equal(200, gw:get("/by-user", { user = { sub = "alice" } }).status)
  end)

  it("keys a per-client cache entry of an API-key endpoint by the key's app (an attack review)", function()
    -- (the entry was keyed by the request's cookie: two apps sending the same cookie shared it)
    local gw = testing.gateway { dir = DIR }
    gw:stub("appdata", "/mine", function(call) return { json = { app = call.headers["x-app"] } } end)
    local shop, blog = { app = "shop" }, { app = "blog" }
    local cookie = { cookie = "consent=yes" }
    assert.equal("shop", gw:get("/app-data", { user = shop, headers = cookie }).json.mine.data.app)
    assert.equal("blog", gw:get("/app-data", { user = blog, headers = cookie }).json.mine.data.app)
    assert.equal("shop", gw:get("/app-data", { user = shop, headers = cookie }).json.mine.data.app)
    assert.equal(2, #gw:calls("appdata")) -- the third page: shop's own entry
    -- an app's users, told apart by their cookies (a second review: keyed by the app alone, one
    -- app's users shared every entry)
    gw:stub("appdata", "/mine", function(call) return { json = { app = call.headers["x-app"], n = #gw:calls() } } end)
    local alice = gw:get("/app-data", { user = shop, headers = { cookie = "sid=alice" } }).json.mine.data.n
    local bob = gw:get("/app-data", { user = shop, headers = { cookie = "sid=bob" } }).json.mine.data.n
    assert.are_not.equal(alice, bob)
    assert.equal(alice, gw:get("/app-data", { user = shop, headers = { cookie = "sid=alice" } }).json.mine.data.n)
    assert.equal(4, #gw:calls("appdata"))
    -- a call with credentials of its own is keyed by the user's too (a third review: a forwarded
    -- cookie two apps' users share, or a service key every user's call carries, keyed alone)
    gw:stub("appdata", "/mine", function(call) return { json = { app = call.headers["x-app"] } } end)
    assert.equal("shop", gw:get("/app-data-own", { user = shop, headers = cookie }).json.mine.data.app)
    assert.equal("blog", gw:get("/app-data-own", { user = blog, headers = cookie }).json.mine.data.app)
    assert.equal("alice", gw:get("/user-data", { user = { sub = "alice" } }).json.mine.data.app)
    assert.equal("bob", gw:get("/user-data", { user = { sub = "bob" } }).json.mine.data.app)
    assert.equal("alice", gw:get("/user-data", { user = { sub = "alice" } }).json.mine.data.app)
    assert.equal(8, #gw:calls("appdata")) -- the last: alice's own entry
    -- a verified token alone names its user: a cookie beside it that changes every page (an
    -- analytics one) does not make every page a miss (a fourth review)
    for i = 1, 3 do
      assert.equal("carol", gw:get("/user-data", { user = { sub = "carol" }, headers = { cookie = "_ga=" .. i } })
                              .json.mine.data.app)
    end
    assert.equal(9, #gw:calls("appdata"))
  end)
end)

describe("an address's rule on an endpoint with auth", function()
  it("counts the edge's refusals, then refuses the address before the edge", function()
    local gw = testing.gateway { dir = DIR }
    local shop = { app = "shop", plan = "gold" }
    for _ = 1, 5 do assert.equal(401, gw:get("/guarded").status) end -- guessed keys: per-ip's burst of 5
    local refused = gw:get("/guarded", { user = shop })               -- the address's good key too
    assert.equal(429, refused.status)
    assert.same({ "per-ip" }, refused.json["violated-policies"])
    assert.is_nil(refused.headers["www-authenticate"])
    assert.equal(429, gw:get("/guarded").status)                      -- not 401: the edge never saw it
    assert.equal(200, gw:get("/guarded", { user = shop, ip = "10.0.0.9" }).status) -- another address
    gw:advance(100)                                                   -- one more at 10 a second
    assert.equal(200, gw:get("/guarded", { user = shop }).status)
    -- per-app (the app's count) saw only the two accepted requests: its quota of 2 is spent now
    assert.equal(429, gw:get("/guarded", { user = shop, ip = "10.0.0.10" }).status)
  end)

  it("in Redis: refused by the process's own count of the refusals it charged, then Redis's wait", function()
    local redis = testing.redis()
    local gw = testing.gateway { dir = DIR, redis = redis }
    local shop = { app = "shop" }
    -- a burst of 2: two refusals counted (in Redis and in the process's shadow of the rule)
    for _ = 1, 2 do assert.equal(401, gw:get("/guarded-cluster").status) end
    local refused = gw:get("/guarded-cluster", { user = shop })
    assert.equal(429, refused.status)
    assert.same({ "per-ip-cluster" }, refused.json["violated-policies"])
    assert.equal("60", refused.headers["retry-after"]) -- one a minute: the next one fits in 60 s
    gw:advance(30000)                                   -- not yet
    assert.equal(429, gw:get("/guarded-cluster", { user = shop }).status)
    gw:advance(30000)
    assert.equal(200, gw:get("/guarded-cluster", { user = shop }).status)
    -- another gateway on the same Redis: its count holds the two refusals and the request above
    local other = testing.gateway { dir = DIR, redis = redis, utc_ms = gw.utc_ms + gw.clock } -- (the same time)
    assert.equal(429, other:get("/guarded-cluster", { user = shop }).status)
  end)
end)

describe("a monthly quota", function()
  it("runs to the first of the next month, 00:00 UTC (February of a leap year: 29 days)", function()
    local gw = testing.gateway { dir = DIR, utc_ms = 1709164800000 } -- 2024-02-29T00:00:00Z
    local page = gw:get("/month")
    assert.equal('"monthly";q=4;w=2505600', page.headers["ratelimit-policy"]) -- 29 days
    assert.equal('"monthly";r=3;t=86400', page.headers["ratelimit"])
  end)
end)

describe("a function key", function()
  it("counts what the function returns, and nil leaves the rule out", function()
    local gw = testing.gateway { dir = DIR }
    local acme = { headers = { ["X-Tenant"] = "acme" } }
    assert.equal(200, gw:get("/tenant/a", acme).status)
    assert.equal(200, gw:get("/tenant/b", acme).status)
    local refused = gw:get("/tenant/c", acme)
    assert.equal(429, refused.status)
    assert.same({ "per-tenant" }, refused.json["violated-policies"])
    assert.equal(200, gw:get("/tenant/a", { headers = { ["X-Tenant"] = "umbrella" } }).status)
    for _ = 1, 5 do assert.equal(200, gw:get("/tenant/public", acme).status) end -- nil: not applied
    assert.is_nil(gw:get("/tenant/public", acme).headers["ratelimit"])
  end)

  it("that errors or returns a non-string is logged and not applied; the other rules still count", function()
    local gw = testing.gateway { dir = DIR }
    for _ = 1, 3 do assert.equal(200, gw:get("/broken").status) end
    -- broken-key (burst 1) would have refused the second: it was left out; daily (3) still counts
    assert.equal(429, gw:get("/broken").status)
    assert.equal(429, gw:get("/broken?number").status) -- daily's count is spent; the number is logged
    local logs = table.concat(gw:logs(), "\n")
    assert.matches("limits: rule 'broken%-key': its key function failed: [^\n]*gateway%.lua:%d+: no tenant here", logs)
    assert.matches("limits: rule 'broken%-key': its key function returned a number, not a string", logs)
  end)
end)

describe("rules counted in Redis", function()
  local function statuses(gw, path, n)
    local out = {}
    for i = 1, n do out[i] = gw:get(path).status end
    return out
  end

  it("share one count between gateways that use the same Redis", function()
    local redis = testing.redis()
    local a = testing.gateway { dir = DIR, redis = redis }
    local b = testing.gateway { dir = DIR, redis = redis }
    assert.equal(200, a:get("/cluster/local").status)
    assert.equal(200, b:get("/cluster/local").status)
    assert.equal(429, a:get("/cluster/local").status)
    local refused = b:get("/cluster/local")
    assert.equal(429, refused.status)
    assert.equal('"cluster-local";r=0;t=60', refused.headers["ratelimit"])
  end)

  it("follow on_redis_error while Redis is down, and count in Redis again when it is back", function()
    local redis = testing.redis()
    redis.down = true
    local gw = testing.gateway { dir = DIR, redis = redis }
    assert.same({ 200, 200, 429 }, statuses(gw, "/cluster/local", 3))  -- counted in the process
    assert.same({ 200, 200, 200, 200 }, statuses(gw, "/cluster/allow", 4))
    local denied = gw:get("/cluster/deny")
    assert.equal(503, denied.status)
    assert.equal("https://iana.org/assignments/http-problem-types#temporary-reduced-capacity", denied.json.type)
    assert.equal("1", denied.headers["retry-after"])
    local logs = table.concat(gw:logs(), "\n")
    local _, outages = logs:gsub("Redis did not answer a check", "")
    assert.equal(1, outages)                                             -- once, not per request
    redis.down = false
    assert.same({ 200, 200, 429 }, statuses(gw, "/cluster/local", 3))  -- Redis's own count
    assert.matches("Redis answers checks again", table.concat(gw:logs(), "\n"))
  end)

  it("a hung Redis is a Redis error too", function()
    local gw = testing.gateway { dir = DIR, redis = (function() local r = testing.redis(); r.hang = true; return r end)() }
    assert.equal(503, gw:get("/cluster/deny").status)
    assert.matches("timeout", table.concat(gw:logs(), "\n"))
  end)
end)

describe("priority groups", function()
  it("shed priority 3 beyond max_in_flight, priority 1 only beyond twice that", function()
    local gw = testing.gateway { dir = DIR }
    gw:stub("slow", "/s", { json = { ok = true }, latency_ms = 100 })
    local sent = {}
    -- max_in_flight = 2: priority 1 is shed with more than 4 pages in flight, priority 3 with more than 2
    for i = 1, 6 do sent[i] = gw:send("GET", "/core") end
    local bulk = gw:send("GET", "/bulk")
    gw:run()
    for i = 1, 5 do assert.equal(200, sent[i].status) end
    assert.equal(503, sent[6].status)                          -- it found 5 in flight
    assert.equal(503, bulk.status)
    assert.equal("1", bulk.headers["retry-after"])
    assert.equal("https://iana.org/assignments/http-problem-types#temporary-reduced-capacity", bulk.json.type)
    -- with the worker quiet again, bulk goes through
    assert.equal(200, gw:get("/bulk").status)
  end)
end)
