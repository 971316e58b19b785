-- Upstream groups (DESIGN §9, §9.1; docs/operations.md "Upstream groups"): several endpoints per upstream,
-- load balancing, outlier ejection, the group's circuit breaker, the Gateway API retry budget,
-- and required sections failing fast. Fixture: spec/fixtures/groups. Everything runs on the
-- harness's virtual clock; "product#2" stubs the second endpoint of product only.
local testing = require "agg.testing"
local rt = require "agg.runtime"

local DIR = "spec/fixtures/groups"

local function by_endpoint(calls)
  local n = {}
  for _, c in ipairs(calls) do n[c.endpoint] = (n[c.endpoint] or 0) + 1 end
  return n
end

describe("outlier ejection", function()
  local gw
  before_each(function()
    gw = testing.gateway { dir = DIR }
    gw:stub("product", "/p/*", { json = { id = 1 }, latency_ms = 5 })
    gw:stub("product#2", "/p/*", { fault = "refuse" })
  end)

  it("one refusing endpoint: every page is ok, and it gets no calls while ejected", function()
    for i = 1, 40 do assert.equal(200, gw:get("/product/" .. i).status) end
    local refused = by_endpoint(gw:calls("product"))[2]
    assert.equal(3, refused) -- outlier.failures = 3, then ejected for 10 s
    assert.equal("ejected", gw:endpoints("product")[2].state)
    -- every refused attempt was retried on another endpoint
    local calls = gw:calls("product")
    for k, c in ipairs(calls) do
      if c.endpoint == 2 then assert.are_not.equal(2, calls[k + 1].endpoint) end
    end
    -- tried again once the ejection is over: it still refuses, so it goes out again, for longer
    gw:advance(10000)
    gw:clear_calls()
    for i = 1, 40 do assert.equal(200, gw:get("/product/" .. i).status) end
    assert.equal(3, by_endpoint(gw:calls("product"))[2])
    local ep = gw:endpoints("product")[2]
    assert.equal(2, ep.ejections)
    assert.equal(20000, ep.until_ms - ep.ejected_ms) -- the second ejection lasts 2 x eject_s
  end)

  it("counts only the upstream's failure_statuses: 500s a client provokes eject no endpoint, 503s do", function()
    -- (an attack review: a client pinned to one endpoint by its session asked for a path that
    -- answers 500 and ejected that endpoint for every client)
    gw:stub("stern", "/p/*", { json = { id = 1 }, latency_ms = 5 })
    gw:stub("stern#2", "/p/*", { status = 500, json = { error = "boom" } })
    for i = 1, 20 do gw:get("/stern/" .. i) end
    assert.equal(10, by_endpoint(gw:calls("stern"))[2])
    assert.equal("healthy", gw:endpoints("stern")[2].state)
    gw:stub("stern#2", "/p/*", { status = 503, json = { error = "down" } })
    gw:clear_calls()
    for i = 1, 20 do gw:get("/stern/" .. i) end
    assert.equal(2, by_endpoint(gw:calls("stern"))[2]) -- outlier.failures = 2, then ejected
    assert.equal("ejected", gw:endpoints("stern")[2].state)
  end)

  it("an endpoint back in health gets calls again after its ejection", function()
    for i = 1, 20 do gw:get("/product/" .. i) end
    gw:stub("product#2", "/p/*", { json = { id = 2 }, latency_ms = 5 })
    local back = gw:endpoints("product")[2].until_ms
    gw:advance(back - gw:now() - 100)
    gw:clear_calls()
    for i = 1, 10 do gw:get("/product/" .. i) end -- 50 ms of pages, all before it comes back
    assert.is_nil(by_endpoint(gw:calls("product"))[2])
    gw:advance(back - gw:now())
    gw:clear_calls()
    for i = 1, 30 do gw:get("/product/" .. i) end
    assert.is_true((by_endpoint(gw:calls("product"))[2] or 0) >= 5)
    assert.equal("healthy", gw:endpoints("product")[2].state)
  end)

  it("never ejects more than max_percent of the group, nor all of it", function()
    gw:stub("product", "/p/*", { fault = "refuse" })
    for i = 1, 30 do gw:get("/product/" .. i) end
    local ejected = 0
    for _, e in ipairs(gw:endpoints("product")) do if e.state == "ejected" then ejected = ejected + 1 end end
    assert.equal(1, ejected) -- 50 % of 3 endpoints rounds down to 1
  end)
end)

describe("the circuit breaker of a group", function()
  it("stays closed while one endpoint fails and another answers, and opens when all fail", function()
    local gw = testing.gateway { dir = DIR }
    gw:stub("sick", "/p/*", { json = { id = 1 }, latency_ms = 5 })
    gw:stub("sick#1", "/p/*", { status = 503, latency_ms = 5 })
    for i = 1, 30 do
      local page = gw:get("/sick/" .. i)
      assert.are_not.equal("urn:aggway:problem:circuit-open", (page.json.p or page.json.sections.p).error and
                           (page.json.p or page.json.sections.p).error.type)
    end
    gw:stub("sick#2", "/p/*", { status = 503, latency_ms = 5 })
    local opened = false
    for i = 1, 10 do
      local page = gw:get("/sick/" .. i)
      local sec = page.json.sections and page.json.sections.p or page.json.p
      if sec.error and sec.error.type == "urn:aggway:problem:circuit-open" then opened = true end
    end
    assert.is_true(opened)
  end)
end)

describe("the circuit breaker of a health-checked group", function()
  -- mended: two endpoints, breaker.failures = 4, health every_s = 2, healthy_after = 2,
  -- unhealthy_after = 3, sessions in the X-Mended header
  local function circuit_open(page)
    local sec = page.json.sections and page.json.sections.p or page.json.p
    return sec.error ~= nil and sec.error.type == "urn:aggway:problem:circuit-open"
  end

  it("does not count an endpoint that came back through its checks as failing, though no call reached it since", function()
    local gw = testing.gateway { dir = DIR }
    gw:stub("mended", "/healthz", { status = 200, body = "ok" })
    gw:stub("mended", "/p/*", { json = { id = 1 }, latency_ms = 5 })
    gw:stub("mended#2", "/p/*", { status = 503, latency_ms = 5 })
    gw:advance(6000) -- both pass their checks
    for i = 1, 20 do assert.is_false(circuit_open(gw:get("/mended/" .. i))) end
    assert.is_true(gw:endpoints("mended")[2].failures > 0) -- its calls failed: it counts as failing
    gw:stub("mended#2", "/healthz", { status = 503, body = "down" })
    gw:advance(8000)
    assert.equal("unhealthy", gw:endpoints("mended")[2].state)
    gw:clear_calls()
    local first = gw:get("/mended/100") -- a session, on endpoint 1 (2 is out of service)
    local tok = first.headers["x-mended"]
    assert.is_truthy(tok)
    assert.equal(1, gw:calls("mended")[1].endpoint)
    gw:stub("mended#2", "/healthz", { status = 200, body = "ok" })
    gw:stub("mended#2", "/p/*", { json = { id = 2 }, latency_ms = 5 })
    gw:advance(6000) -- back in service through its checks; no call reaches it below
    assert.equal("healthy", gw:endpoints("mended")[2].state)
    gw:stub("mended#1", "/p/*", { status = 503, latency_ms = 5 })
    gw:clear_calls()
    for i = 1, 10 do
      -- endpoint 1 fails every call; the group does not: its breaker stays closed
      assert.is_false(circuit_open(gw:get("/mended/" .. i, { headers = { ["x-mended"] = tok } })), "page " .. i)
    end
    for _, c in ipairs(gw:calls("mended")) do assert.equal(1, c.endpoint) end
    assert.equal(10, #gw:calls("mended"))
    local fresh = gw:get("/mended/200") -- a page without the session
    assert.is_false(circuit_open(fresh))
    assert.equal(200, fresh.status)
  end)
end)

describe("the circuit breaker of a dead group whose health path answers", function()
  it("opens: checks that pass all along, or that end an ejection, do not clear a failing endpoint", function()
    -- dead: two endpoints, outlier.failures = 1, breaker.failures = 3, health every_s = 1,
    -- healthy_after = 1 (found by an attack review: its breaker never opened)
    local gw = testing.gateway { dir = DIR }
    gw:stub("dead", "/healthz", { status = 200, body = "ok" })
    gw:stub("dead", "/p/*", { status = 503, latency_ms = 5 })
    gw:advance(2500)
    local refused = 0
    for i = 1, 40 do
      local page = gw:get("/dead/" .. i)
      local sec = page.json.sections and page.json.sections.p or page.json.p
      if sec.error and sec.error.type == "urn:aggway:problem:circuit-open" then refused = refused + 1 end
      gw:advance(2500) -- slow traffic: each ejection is ended early by a passing check in between
    end
    assert.is_true(refused >= 20, refused .. " of 40 pages refused by the breaker")
  end)
end)

-- A gateway whose upstream "named" (a host name: outlier failures = 2, eject_s = 60) resolves to
-- three addresses, one page served and the clock at 1 s: the gateway and the group.
local function named_group(at_ms)
  local gw = testing.gateway { dir = DIR }
  gw:addresses("named", { "10.0.0.1:9101", "10.0.0.2:9101", "10.0.0.3:9101" })
  gw:stub("named", "/p/*", { json = { id = 1 } })
  gw:get("/named/0")
  gw:advance(at_ms or 1000)
  return gw, require("agg.group").group_of("named")
end

-- Two attempts on slot 3 of named's group g at this very time, the slot's address changed (the
-- worker's tick), then both fail 300 ms later: each counts for no endpoint.
local function old_address_fails_twice(gw, g)
  local group = require "agg.group"
  group.hold(g, 3)
  group.hold(g, 3)
  gw:addresses("named", { "10.0.0.1:9101", "10.0.0.2:9101", "10.0.0.4:9101" })
  rt.report_stats(true)
  gw:advance(300)
  for _ = 1, 2 do
    group.release(g, 3)
    assert.equal("ignore", group.report(g, 3, "failure", 300))
  end
end

describe("an answer from an endpoint slot whose address went away meanwhile", function()
  it("does not count for the group's breaker (found by an attack review)", function()
    local group = require "agg.group"
    local gw, g = named_group()
    group.hold(g, 3) -- an attempt on slot 3 (as agg.exchange makes it)
    gw:addresses("named", { "10.0.0.1:9101", "10.0.0.2:9101" })
    rt.report_stats(true) -- the worker's tick: slot 3 is gone
    group.release(g, 3)
    assert.equal("ignore", group.report(g, 3, "failure", 100))
    -- one failure of slot 1 is not the whole group's: slot 2 answers
    assert.equal("ignore", group.report(g, 1, "failure", 100))
    assert.equal(1, g.nfailing)
  end)
end)

describe("an answer from an endpoint slot's old address", function()
  it("does not count for the address the slot has now (found by an attack review)", function()
    local group = require "agg.group"
    local gw, g = named_group()
    group.hold(g, 3) -- two attempts on slot 3's address (as agg.exchange makes them)
    group.hold(g, 3)
    gw:advance(100)
    gw:addresses("named", { "10.0.0.1:9101", "10.0.0.2:9101", "10.0.0.4:9101" })
    rt.report_stats(true) -- the worker's tick: slot 3 has a new address
    assert.equal("10.0.0.4:9101", g.eps[3].address)
    assert.equal(2, g.eps[3].inflight) -- (still in flight for the balancer)
    gw:advance(200)
    for _ = 1, 2 do -- the old address fails both, 300 ms after they began
      group.release(g, 3)
      assert.equal("ignore", group.report(g, 3, "failure", 300))
    end
    local e = g.eps[3]
    assert.equal(0, e.inflight)
    assert.is_false(e.failing)
    assert.equal(0, e.consec)
    assert.equal(0, e.answered)
    local states = {}
    for i, ep in ipairs(gw:endpoints("named")) do if i <= 3 then states[i] = ep.state end end
    assert.same({ "healthy", "healthy", "healthy" }, states) -- (slots 4 to 8 hold no address)
    -- an attempt that began after the change counts for the new address
    group.hold(g, 3)
    gw:advance(50)
    group.release(g, 3)
    group.report(g, 3, "failure", 50)
    assert.is_true(e.failing)
    assert.equal(1, e.consec)
  end)

  it("does so at any time on the clock, 0 too (a third review: the harness's clock starts at 0)", function()
    local gw, g = named_group(0) -- (the clock stays at 0)
    old_address_fails_twice(gw, g)
    assert.equal("healthy", gw:endpoints("named")[3].state)
  end)

  it("takes an attempt begun in the loop turn of the change for the old address's (a second review)", function()
    local gw, g = named_group()
    old_address_fails_twice(gw, g)
    assert.is_false(g.eps[3].failing)
    assert.equal("healthy", gw:endpoints("named")[3].state)
  end)
end)

describe("the hash of the ring and of endpoint ids", function()
  it("gives the values it always gave: session tokens carry them", function()
    local hash = require("agg.group").hash
    assert.equal(2872998923, hash(""))
    assert.equal(444641715, hash("a"))
    assert.equal(3040024988, hash("http://127.0.0.1:21#1"))
    assert.equal(2398786460, hash("http://127.0.0.1:23#160"))
    assert.equal(2083131798, hash("user-42"))
    assert.equal(4213289907, hash(("\255\0x"):rep(7)))
    assert.equal(1218682425, hash(("u"):rep(65000))) -- a client's header as the key
  end)
end)

describe("balancing", function()
  local gw
  before_each(function() gw = testing.gateway { dir = DIR } end)

  it("power of two choices sends a slow endpoint clearly fewer calls", function()
    gw:stub("product", "/p/*", { json = { id = 1 }, latency_ms = 5 })
    gw:stub("product#3", "/p/*", { json = { id = 3 }, latency_ms = 150 })
    for i = 1, 300 do gw:at(i * 2, function() gw:send("GET", "/product/" .. i) end) end
    gw:run()
    local n = by_endpoint(gw:calls("product"))
    assert.equal(300, n[1] + n[2] + n[3])
    assert.is_true(n[3] < 30, "slow endpoint got " .. n[3] .. " of 300")
    assert.is_true(n[1] > 100 and n[2] > 100)
  end)

  it("round robin takes the endpoints in turn", function()
    gw:stub("rr", "/p/*", { json = { id = 1 } })
    for i = 1, 9 do gw:get("/rr/" .. i) end
    local seq = {}
    for _, c in ipairs(gw:calls("rr")) do seq[#seq + 1] = c.endpoint end
    assert.same({ 1, 2, 3, 1, 2, 3, 1, 2, 3 }, seq)
  end)

  it("consistent hashing sends a key to the same endpoint every time", function()
    gw:stub("cart", "/p/*", { json = { id = 1 } })
    gw:stub("cart4", "/p/*", { json = { id = 1 } })
    local where, seen = {}, {}
    for round = 1, 3 do
      for u = 1, 200 do
        gw:clear_calls()
        gw:get("/cart/" .. u, { headers = { ["x-user"] = "user-" .. u } })
        local ep = gw:calls("cart")[1].endpoint
        if round == 1 then where[u] = ep else assert.equal(where[u], ep) end
        seen[ep] = true
      end
    end
    assert.is_true(seen[1] and seen[2] and seen[3])
    -- a fourth endpoint takes about a quarter of the keys, and only keys move to it
    local moved = 0
    for u = 1, 200 do
      gw:clear_calls()
      gw:get("/cart4/" .. u, { headers = { ["x-user"] = "user-" .. u } })
      local ep = gw:calls("cart4")[1].endpoint
      if ep ~= where[u] then
        moved = moved + 1
        assert.equal(4, ep)
      end
    end
    assert.is_true(moved >= 30 and moved <= 80, moved .. " of 200 keys moved")
  end)

  it("consistent hashing on the call's hash_key; a hot key spills over (bounded load)", function()
    gw:stub("cart", "/p/*", { json = { id = 1 }, latency_ms = 100 })
    for i = 1, 30 do gw:send("GET", "/cart-keyed/7") end
    gw:run()
    local n = by_endpoint(gw:calls("cart"))
    local most = math.max(n[1] or 0, n[2] or 0, n[3] or 0)
    assert.is_true(most < 30 and most <= 13, "the hot key's endpoint took " .. most .. " of 30")
  end)
end)

describe("the retry budget (Gateway API retryConstraint)", function()
  it("retries stay within the budget per interval; the rest fail with 503 retry-budget-exhausted", function()
    local gw = testing.gateway { dir = DIR }
    gw:stub("budget", "/p/*", { status = 503, latency_ms = 5 })
    local pages = {}
    for i = 1, 40 do gw:at(i * 20, function() pages[#pages + 1] = gw:send("GET", "/budget/" .. i) end) end
    gw:run()
    local calls = #gw:calls("budget")
    local retries = calls - 40
    -- over 0.8 s: 20 % of 40 requests = 8, or min_retry_rate 2 per second
    assert.is_true(retries <= 8, retries .. " retries")
    assert.is_true(retries >= 2)
    local exhausted = 0
    for _, p in ipairs(pages) do
      local e = p.json.sections.p.error
      if e.type == "urn:aggway:problem:retry-budget-exhausted" then
        exhausted = exhausted + 1
        assert.equal(503, e.status)
      end
    end
    assert.is_true(exhausted >= 30)
    assert.equal(exhausted, rt.upstream_stats("budget").retries_denied)
  end)
end)

describe("a required section fails fast", function()
  local gw
  before_each(function()
    gw = testing.gateway { dir = DIR }
    gw:stub("product", "/p/*", { fault = "refuse" })
    gw:stub("reviews", "/r/*", { json = { n = 1 }, latency_ms = 80 })
    gw:stub("reviews", "/related/*", { json = { n = 1 }, latency_ms = 80 })
    gw:stub("reviews", "/d/*", { json = { n = 1 }, latency_ms = 80 })
  end)

  it("the page is answered when the required call fails; the other calls are cancelled", function()
    local page = gw:get("/page/1")
    assert.equal(502, page.status)
    assert.equal(0, page.elapsed_ms)
    assert.equal("urn:aggway:problem:required-section-failed", page.json.type)
    assert.equal("urn:aggway:problem:call-cancelled", page.json.sections.reviews.error.type)
    local reviews = gw:calls("reviews")
    assert.equal(1, #reviews)
    assert.is_true(reviews[1].cancelled)
  end)

  it("a continuation of the failed section never runs", function()
    local page = gw:get("/chain/1")
    assert.equal(502, page.status)
    assert.equal(0, page.elapsed_ms)
    assert.equal("urn:aggway:problem:dependency-failed", page.json.sections.related.error.type)
    assert.equal(1, #gw:calls("reviews")) -- /r/1 only, cancelled
  end)

  it("a fetch_then chain whose dependency is required fails the page at once", function()
    local page = gw:get("/chain-dep/1")
    assert.equal(502, page.status)
    assert.equal(0, page.elapsed_ms)
    assert.equal("urn:aggway:problem:call-cancelled", page.json.sections.reviews.error.type)
    assert.is_true(gw:calls("reviews")[1].cancelled)
  end)
end)

describe("session persistence", function()
  local gw
  before_each(function()
    gw = testing.gateway { dir = DIR }
    gw:stub("sticky", "/p/*", { json = { id = 1 }, latency_ms = 5 })
    gw:stub("pinned", "/p/*", { json = { id = 1 }, latency_ms = 5 })
  end)

  local function cookie_of(page)
    local sc = page.headers["set-cookie"]
    return sc and sc:match("^agw%-sticky=([^;]+)"), sc
  end

  it("a page without a session gets one; calls with it go to the same endpoint", function()
    local page = gw:get("/sticky/1")
    local tok, sc = cookie_of(page)
    assert.is_truthy(tok, "no session cookie")
    assert.is_truthy(sc:find("HttpOnly", 1, true) and sc:find("Max-Age=3600", 1, true), sc)
    local first = gw:calls("sticky")[1].endpoint
    gw:clear_calls()
    for i = 1, 30 do
      local p = gw:get("/sticky/" .. i, { headers = { cookie = "other=1; agw-sticky=" .. tok } })
      assert.is_nil(p.headers["set-cookie"]) -- the session stays where it is: nothing to set
    end
    assert.same({ [first] = 30 }, by_endpoint(gw:calls("sticky")))
  end)

  it("a session cookie is Secure when the request came over TLS, or with secure = true whatever it came over", function()
    -- (found by an attack review: the cookie had no Secure over TLS, so a client's browser sent
    -- it on a plain http:// request to the same host too)
    local function attrs(page)
      local sc = page.headers["set-cookie"]
      assert.is_truthy(sc, "no session cookie")
      local t = {}
      for a in sc:gmatch(";%s*([^;=]+)") do t[#t + 1] = a end
      return table.concat(t, " ")
    end
    assert.equal("Path HttpOnly SameSite Secure Max-Age", attrs(gw:get("/sticky/1", { tls = true })))
    assert.equal("Path HttpOnly SameSite Max-Age", attrs(gw:get("/sticky/1")))
    gw:stub("sealed", "/p/*", { json = { id = 1 } })
    assert.equal("Path HttpOnly SameSite Secure", attrs(gw:get("/sealed/1")))
    assert.equal("Path HttpOnly SameSite Secure", attrs(gw:get("/sealed/1", { tls = true })))
  end)

  it("finds the session cookie however the Cookie header writes it, and only a pair of that name", function()
    local tok = cookie_of(gw:get("/sticky/1"))
    local first = gw:calls("sticky")[1].endpoint
    gw:clear_calls()
    local pairs6000 = {}
    for i = 1, 6000 do pairs6000[i] = ("c%04d=v%03d"):format(i, i % 1000) end
    local many = table.concat(pairs6000, "; ") -- 72 KB (clients.max_header_bytes lets 64 KB through)
    for _, c in ipairs {
      "agw-sticky=" .. tok, "  agw-sticky=" .. tok, "a=1;agw-sticky=" .. tok .. ";b=2",
      "xagw-sticky=zz.1.1; agw-sticky=" .. tok, "a=agw-sticky=zz.1.1; agw-sticky=" .. tok,
      "a=b agw-sticky=zz.1.1; agw-sticky=" .. tok, "agw-sticky=" .. tok .. "; agw-sticky=zz.1.1",
      many .. "; agw-sticky=" .. tok,
    } do
      local p = gw:get("/sticky/2", { headers = { cookie = c } })
      assert.equal(200, p.status)
      assert.is_nil(p.headers["set-cookie"], c:sub(1, 80)) -- the session was found: nothing to set
    end
    assert.same({ [first] = 8 }, by_endpoint(gw:calls("sticky")))
    for _, c in ipairs { "agw-stickyx=" .. tok, "x=" .. tok, "agw-sticky" .. tok, many } do
      assert.is_truthy(cookie_of(gw:get("/sticky/3", { headers = { cookie = c } })), c:sub(1, 80))
    end
  end)

  it("moves when its endpoint is ejected, and the page sets the new cookie", function()
    local tok = cookie_of(gw:get("/sticky/1"))
    local first = gw:calls("sticky")[1].endpoint
    gw:stub("sticky#" .. first, "/p/*", { fault = "refuse" })
    gw:clear_calls()
    local page = gw:get("/sticky/2", { headers = { cookie = "agw-sticky=" .. tok } })
    assert.equal(200, page.status) -- the failed call was retried elsewhere
    local moved = cookie_of(page)
    assert.is_truthy(moved, "the page that moved sets the new cookie")
    assert.are_not.equal(tok, moved)
    local calls = gw:calls("sticky")
    assert.equal(first, calls[1].endpoint)
    local second = calls[2].endpoint
    assert.are_not.equal(first, second)
    assert.equal("ejected", gw:endpoints("sticky")[first].state)
    gw:clear_calls()
    for i = 1, 10 do gw:get("/sticky/" .. i, { headers = { cookie = "agw-sticky=" .. moved } }) end
    assert.same({ [second] = 10 }, by_endpoint(gw:calls("sticky")))
  end)

  it("an expired or forged session starts a new one", function()
    local tok = cookie_of(gw:get("/sticky/1"))
    gw:advance(3600 * 1000)
    assert.is_truthy(cookie_of(gw:get("/sticky/2", { headers = { cookie = "agw-sticky=" .. tok } })))
    for _, forged in ipairs({ "zz.1.1", "00000000.1.1", "", "a.b.c", ("9"):rep(400) }) do
      local page = gw:get("/sticky/3", { headers = { cookie = "agw-sticky=" .. forged } })
      assert.equal(200, page.status)
      assert.is_truthy(cookie_of(page))
    end
  end)

  it("a session whose times are later than now is no session: a new one is made, never trusted", function()
    local id = cookie_of(gw:get("/sticky/1")):match("^(%x+)%.")
    local now_s = math.floor(gw:now() / 1000)
    -- made now or in the past but never expiring (absolute_timeout_s is 3600), or used in the future
    for _, forged in ipairs { id .. ".9999999999.9999999999", id .. "." .. (now_s + 61) .. "." .. (now_s + 61),
                              id .. "." .. now_s .. "." .. (now_s + 61), id .. "." .. ("9"):rep(40) .. "." .. now_s } do
      local page = gw:get("/sticky/2", { headers = { cookie = "agw-sticky=" .. forged } })
      assert.equal(200, page.status)
      local new = cookie_of(page)
      assert.is_truthy(new, forged)
      assert.equal(tostring(now_s), new:match("^%x+%.(%d+)%."), forged) -- created now
    end
    -- up to 60 s ahead: a gateway whose clock is ahead of this one's made it
    local ahead = id .. "." .. (now_s + 60) .. "." .. (now_s + 60)
    assert.is_nil(cookie_of(gw:get("/sticky/3", { headers = { cookie = "agw-sticky=" .. ahead } })))
  end)

  it("a page that sets a session is private, though its sections are fresh shared entries", function()
    -- a shared cache (a CDN) would keep it and hand this client's session to every client (RFC 9111
    -- §5.2.2.7): the user's own cache may keep it as long
    gw:stub("kept", "/p/*", { json = { id = 1 } })
    gw:stub("keptx", "/p/*", { json = { id = 1 } })
    local first = gw:get("/kept/1")
    assert.matches("^agw%-kept=", first.headers["set-cookie"])
    assert.matches("^private, max%-age=%d+$", first.headers["cache-control"]) -- (60 s less the jitter)
    local again = gw:get("/kept/1") -- the section's entry: no call, so no session to set
    assert.is_nil(again.headers["set-cookie"])
    assert.matches("^max%-age=%d+$", again.headers["cache-control"])
    -- the script's own Cache-Control too: it cannot see the session the gateway adds
    local own = gw:get("/kept-own/2")
    assert.matches("^agw%-kept=", own.headers["set-cookie"])
    assert.equal("private, max-age=30", own.headers["cache-control"])
    -- (a review: a qualified private="…" lets a shared cache keep the rest, public and s-maxage
    -- invite it, and a value the transport drops left no Cache-Control at all)
    for cc, want in pairs {
      ['private="x-foo", max-age=600'] = "private, max-age=600",
      ["public, max-age=600"] = "private, max-age=600",
      ["s-maxage=600, must-revalidate"] = "private, must-revalidate",
      ["PUBLIC,s-maxage=1 ,no-cache=\"a, b\""] = 'private, no-cache="a, b"',
      ["no-store"] = "private, no-store",
      ["private"] = "private",
    } do
      local page = gw:get("/kept-cc/" .. #cc, { headers = { ["x-cc"] = cc } })
      assert.matches("^agw%-kept=", page.headers["set-cookie"], 1, cc)
      assert.equal(want, page.headers["cache-control"], cc)
    end
    local listed = gw:get("/kept-cc/100", { headers = { ["x-cc"] = "public", ["x-cc2"] = "max-age=5" } })
    assert.equal("private, max-age=5", listed.headers["cache-control"])
    -- a header session likewise
    local header = gw:get("/keptx/1")
    assert.is_truthy(header.headers["x-kept"])
    assert.matches("^private, max%-age=%d+$", header.headers["cache-control"])
    assert.matches("^max%-age=%d+$", gw:get("/keptx/1").headers["cache-control"])
  end)

  it("a header session: the response carries it, refreshed while idle_timeout_s allows", function()
    local page = gw:get("/pinned/1")
    local tok = page.headers["x-session"]
    assert.is_truthy(tok)
    local first = gw:calls("pinned")[1].endpoint
    gw:advance(30000)
    gw:clear_calls()
    local again = gw:get("/pinned/2", { headers = { ["x-session"] = tok } })
    assert.equal(first, gw:calls("pinned")[1].endpoint)
    assert.are_not.equal(tok, again.headers["x-session"]) -- last use refreshed
    gw:advance(60000)
    gw:clear_calls()
    local late = gw:get("/pinned/3", { headers = { ["x-session"] = again.headers["x-session"] } })
    -- idle for 60 s: a new session (created now), wherever the balancer puts it
    assert.equal(tostring(math.floor(gw:now() / 1000)), late.headers["x-session"]:match("^%x+%.(%d+)%."))
    assert.equal(tostring(0), tok:match("^%x+%.(%d+)%."))
  end)
end)

describe("active health checks", function()
  -- checked: every_s = 2, timeout_ms = 300, healthy_after = 2, unhealthy_after = 3, max_percent 50
  local gw
  before_each(function()
    gw = testing.gateway { dir = DIR }
    gw:stub("checked", "/p/*", { json = { id = 1 } })
    gw:stub("checked", "/healthz", { status = 200, body = "ok" })
    gw:stub("lone", "/p/*", { json = { id = 1 } })
    gw:stub("lone", "/ready", { status = 204 })
  end)

  local function page_calls(name)
    local n = {}
    for _, c in ipairs(gw:calls(name)) do
      if c.path:match("^/p/") then n[c.endpoint] = (n[c.endpoint] or 0) + 1 end
    end
    return n
  end

  it("an endpoint failing its health path is taken out after unhealthy_after probes and back after healthy_after", function()
    gw:advance(6000) -- the first probe comes within the first every_s, at random
    for i = 1, 3 do assert.equal("passing", gw:endpoints("checked")[i].health) end
    gw:stub("checked#2", "/healthz", { status = 503, body = "draining" })
    gw:advance(4000) -- two failed probes: still in service
    assert.equal("healthy", gw:endpoints("checked")[2].state)
    gw:advance(2000) -- the third
    local ep = gw:endpoints("checked")[2]
    assert.equal("unhealthy", ep.state)
    assert.equal("failing", ep.health)
    assert.is_true(ep.probe_failures >= 3)
    gw:clear_calls()
    for i = 1, 30 do assert.equal(200, gw:get("/checked/" .. i).status) end
    assert.is_nil(page_calls("checked")[2])
    gw:stub("checked#2", "/healthz", { status = 200, body = "ok" })
    gw:advance(2000)
    assert.equal("unhealthy", gw:endpoints("checked")[2].state) -- one pass is not enough
    gw:advance(2000)
    assert.equal("healthy", gw:endpoints("checked")[2].state)
    assert.equal("passing", gw:endpoints("checked")[2].health)
    gw:clear_calls()
    for i = 1, 30 do assert.equal(200, gw:get("/checked/" .. i).status) end
    assert.is_true((page_calls("checked")[2] or 0) >= 5)
    local logs = table.concat(gw:logs(), "\n")
    assert.matches("endpoint http://127.0.0.1:82 failed its health checks %(status 503%); out of service", logs)
    assert.matches("endpoint http://127.0.0.1:82 passes its health checks; back in service", logs)
  end)

  it("probes that hang or reset fail within timeout_ms; the ejection limit holds, never all", function()
    gw:stub("checked#1", "/healthz", { fault = "hang" })
    gw:stub("checked#2", "/healthz", { fault = "reset" })
    gw:advance(10000)
    local eps = gw:endpoints("checked")
    assert.equal("failing", eps[1].health)
    assert.equal("failing", eps[2].health)
    local out = 0
    for i = 1, 3 do if eps[i].state ~= "healthy" then out = out + 1 end end
    assert.equal(1, out) -- max_percent = 50 of 3: one at a time
    for _, c in ipairs(gw:calls("checked")) do
      if c.path == "/healthz" and c.ended_ms then assert.is_true(c.ended_ms - c.started_ms <= 300) end
    end
    for i = 1, 10 do assert.equal(200, gw:get("/checked/" .. i).status) end
  end)

  it("passing health checks end an outlier ejection early", function()
    gw:advance(6000)
    gw:stub("checked#3", "/p/*", { fault = "refuse" })
    for i = 1, 30 do gw:get("/checked/" .. i) end
    local ep = gw:endpoints("checked")[3]
    assert.equal("ejected", ep.state)
    assert.equal(60000, ep.until_ms - ep.ejected_ms)
    gw:stub("checked#3", "/p/*", { json = { id = 3 } })
    gw:advance(6000) -- two passing probes after the ejection, well before its 60 s
    assert.equal("healthy", gw:endpoints("checked")[3].state)
  end)

  it("a one-endpoint upstream is probed, judged by expect_status, and never taken out", function()
    gw:advance(3000) -- lone: every_s = 1, healthy_after = 2 (the default)
    assert.equal("passing", gw:endpoints("lone")[1].health)
    gw:stub("lone", "/ready", { status = 200, body = "ok" }) -- expect_status = { 204 }, unhealthy_after = 1
    gw:advance(1000)
    local ep = gw:endpoints("lone")[1]
    assert.equal("failing", ep.health)
    assert.equal("healthy", ep.state)
    assert.equal(200, gw:get("/lone/1").status)
  end)

  it("probes are not sections: pages without calls see none, and the probe carries no page's headers", function()
    gw:advance(3000)
    local probes = 0
    for _, c in ipairs(gw:calls("checked")) do
      if c.path == "/healthz" then
        probes = probes + 1
        assert.equal("GET", c.method)
        assert.equal("aggway-health-check", c.headers["user-agent"])
      end
    end
    assert.is_true(probes >= 3)
  end)
end)

describe("endpoint host names", function()
  it("each address is an endpoint; a change keeps the state of the addresses that stay", function()
    local gw = testing.gateway { dir = DIR }
    gw:addresses("named", { "10.0.0.1:9101", "10.0.0.2:9101" })
    gw:stub("named", "/p/*", { json = { id = 1 } })
    gw:stub("named#2", "/p/*", { fault = "refuse" })
    for i = 1, 20 do assert.equal(200, gw:get("/named/" .. i).status) end
    local eps = gw:endpoints("named")
    assert.equal(8, #eps)
    assert.equal("10.0.0.1:9101", eps[1].address)
    assert.equal("ejected", eps[2].state) -- outlier.failures = 2
    assert.equal("gone", eps[3].state)
    local calls_1 = eps[1].calls
    assert.is_true(calls_1 >= 18)
    -- 10.0.0.1 leaves and 10.0.0.3 comes: it takes the free slot 1, afresh; slot 2 stays ejected
    gw:addresses("named", { "10.0.0.2:9101", "10.0.0.3:9101" })
    gw:advance(1000)
    eps = gw:endpoints("named")
    assert.equal("10.0.0.3:9101", eps[1].address)
    assert.equal(0, eps[1].calls)
    assert.equal("healthy", eps[1].state)
    assert.equal("10.0.0.2:9101", eps[2].address)
    assert.equal("ejected", eps[2].state)
    gw:clear_calls()
    for i = 1, 10 do assert.equal(200, gw:get("/named/" .. i).status) end
    for _, c in ipairs(gw:calls("named")) do assert.equal(1, c.endpoint) end
    -- a single address left: every call goes there, and it is never ejected (never every endpoint)
    gw:addresses("named", { "10.0.0.3:9101" })
    gw:stub("named#1", "/p/*", { fault = "refuse" })
    gw:advance(1000)
    for i = 1, 5 do gw:get("/named/" .. i) end
    eps = gw:endpoints("named")
    assert.equal("healthy", eps[1].state)
    assert.equal("gone", eps[2].state)
  end)

  it("sessions and hash keys name an address (URL@address), so a name's addresses are told apart", function()
    local gw = testing.gateway { dir = DIR }
    gw:addresses("named", { "10.0.0.1:9101", "10.0.0.2:9101", "10.0.0.3:9101" })
    local g = require("agg.group")
    gw:stub("named", "/p/*", { json = { id = 1 } })
    gw:get("/named/1")
    local grp = g.group_of("named")
    assert.are_not.equal(grp.eps[1].key, grp.eps[2].key)
    assert.equal("http://named.test:9101@10.0.0.1:9101", grp.eps[1].key)
  end)
end)

describe("call options of groups", function()
  it("hash_key on an upstream that does not hash is a mistake at the script's line", function()
    local gw = testing.gateway { dir = DIR }
    gw:stub("rr", "/p/*", { json = { id = 1 } })
    local ok, err = pcall(function()
      require("agg.callspec").normalize({ "rr", "/p/1", hash_key = "k" }, gw.gen.upstreams, 1)
    end)
    assert.is_false(ok)
    assert.matches("hash_key", err)
  end)
end)
