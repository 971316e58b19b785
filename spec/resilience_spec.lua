-- Resilience (issue "resilience"): circuit breaker, retries with a budget, hedging, single-flight,
-- fallbacks. Fixture scripts: spec/fixtures/resilience. Seed scenarios: DESIGN §1 rows 5 and 6.
local testing = require "agg.testing"
local rt = require "agg.runtime"

local DIR = "spec/fixtures/resilience"

describe("the circuit breaker", function()
  local gw
  before_each(function()
    gw = testing.gateway { dir = DIR }
    gw:stub("events", "/events/*", { json = { name = "Concert" }, latency_ms = 120 })
    gw:stub("recs", "/recs/*", { json = { items = {} }, latency_ms = 20 })
  end)

  it("seed: opens after 5 timeouts, so request 7 answers at the speed of the healthy calls", function()
    assert.equal(120, gw:get("/concert/1").elapsed_ms)
    gw:stub("recs", "/recs/*", { fault = "hang" })
    for i = 2, 6 do
      local page = gw:get("/concert/" .. i)
      assert.equal(200, page.status)
      assert.equal(1000, page.elapsed_ms)
      testing.expect_section(page, "recs", "unavailable", "upstream-timeout")
    end
    local page = gw:get("/concert/7")
    assert.equal(200, page.status)
    assert.equal(120, page.elapsed_ms)
    testing.expect_section(page, "recs", "unavailable", "circuit-open")
    assert.equal(503, page.json.recs.error.status)
    assert.equal(6, #gw:calls("recs")) -- request 7 never reached the upstream
  end)

  it("counts failed TLS handshakes as failures of the upstream", function()
    gw:stub("recs", "/recs/*", { fault = "tls", latency_ms = 5 })
    for i = 1, 5 do
      testing.expect_section(gw:get("/concert/" .. i), "recs", "unavailable", "upstream-tls")
    end
    testing.expect_section(gw:get("/concert/6"), "recs", "unavailable", "circuit-open")
    assert.equal(5, #gw:calls("recs"))
  end)

  it("counts only an upstream's failure_statuses: 500s a client provokes do not open it, 503s do", function()
    -- (an attack review: five requests for a path that answers 500 opened the breaker of the
    -- upstream for every client, and a burst each open_s kept it open)
    gw:stub("gated", "/g/*", { status = 500, json = { error = "boom" } })
    for i = 1, 10 do testing.expect_section(gw:get("/gated/" .. i), "g", "unavailable", "upstream-error") end
    assert.equal(10, #gw:calls("gated"))
    gw:stub("gated", "/g/*", { status = 503, json = { error = "down" } })
    for i = 1, 5 do testing.expect_section(gw:get("/gated/" .. i), "g", "unavailable", "upstream-error") end
    testing.expect_section(gw:get("/gated/6"), "g", "unavailable", "circuit-open")
    assert.equal(15, #gw:calls("gated"))
  end)

  it("lets exactly one probe through after open_s, even when 50 requests arrive at once", function()
    gw:stub("recs", "/recs/*", { fault = "refuse" })
    for i = 1, 5 do gw:get("/concert/" .. i) end
    gw:clear_calls()
    gw:advance(30000)
    gw:stub("recs", "/recs/*", { json = { items = {} }, latency_ms = 20 })
    local pages = {}
    for i = 1, 50 do pages[i] = gw:send("GET", "/concert/" .. (100 + i)) end
    gw:run()
    assert.equal(1, #gw:calls("recs"))
    local ok, open = 0, 0
    for _, p in ipairs(pages) do
      assert.equal(200, p.status)
      if p.json.recs.status == "ok" then ok = ok + 1 else open = open + 1 end
    end
    assert.equal(1, ok)
    assert.equal(49, open)
    -- the probe succeeded: the breaker is closed again
    assert.equal("ok", gw:get("/concert/200").json.recs.status)
    assert.equal(2, #gw:calls("recs"))
  end)

  it("opens again when the half-open probe fails", function()
    gw:stub("recs", "/recs/*", { fault = "refuse" })
    for i = 1, 5 do gw:get("/concert/" .. i) end
    gw:advance(30000)
    gw:get("/concert/6") -- the probe, refused
    gw:clear_calls()
    testing.expect_section(gw:get("/concert/7"), "recs", "unavailable", "circuit-open")
    assert.equal(0, #gw:calls("recs"))
  end)

  it("does not count calls the gateway gave up on", function()
    -- a page deadline shorter than the call's own timeout cuts the call: not the upstream's fault
    gw:stub("recs", "/recs/*", { fault = "hang" })
    for i = 1, 5 do
      local r = gw:send("GET", "/concert/" .. i)
      gw:advance(10)
      gw:disconnect(r) -- the client leaves: its calls are cancelled
    end
    gw:run()
    gw:stub("recs", "/recs/*", { json = { items = {} }, latency_ms = 20 })
    assert.equal("ok", gw:get("/concert/9").json.recs.status)
  end)

  it("fails a required section with 503 and Retry-After when open", function()
    gw:stub("recs", "/recs/*", { fault = "refuse" })
    for i = 1, 5 do gw:get("/concert/" .. i) end
    local page = gw:get("/must-recs/1")
    assert.equal(503, page.status)
    assert.equal("30", page.headers["retry-after"])
  end)
end)

describe("retries", function()
  local gw
  before_each(function() gw = testing.gateway { dir = DIR } end)

  it("retry a 503 with jittered backoff and serve the good answer", function()
    gw:stub("flaky", "/f", { { status = 503, latency_ms = 10 }, { status = 503, latency_ms = 10 },
                             { json = { v = 1 }, latency_ms = 10 } })
    local page = gw:get("/flaky")
    assert.equal(200, page.status)
    local calls = gw:calls("flaky")
    assert.equal(3, #calls)
    -- backoff: between half and all of 20 ms, then of 40 ms
    local gap1 = calls[2].started_ms - calls[1].ended_ms
    local gap2 = calls[3].started_ms - calls[2].ended_ms
    assert.is_true(gap1 >= 10 and gap1 <= 20, "first backoff " .. gap1)
    assert.is_true(gap2 >= 20 and gap2 <= 40, "second backoff " .. gap2)
    assert.equal(2, rt.upstream_stats("flaky").retries)
  end)

  it("stop after the configured attempts", function()
    gw:stub("flaky", "/f", { status = 502, latency_ms = 5 })
    local page = gw:get("/flaky")
    assert.equal(502, page.status)
    assert.equal(3, #gw:calls("flaky"))
  end)

  it("never retry a POST unless the call says it is safe", function()
    gw:stub("flaky", "POST", "/f", { status = 503, latency_ms = 5 })
    gw:request("POST", "/flaky")
    assert.equal(1, #gw:calls("flaky"))
    gw:clear_calls()
    gw:get("/flaky-safe-post")
    assert.equal(3, #gw:calls("flaky"))
  end)

  it("do not retry a 500 or a timeout (not in `on`, not a connect error)", function()
    gw:stub("flaky", "/f", { status = 500, latency_ms = 5 })
    gw:get("/flaky")
    assert.equal(1, #gw:calls("flaky"))
  end)

  it("retry refused connections", function()
    gw:stub("flaky", "/f", { { fault = "refuse" }, { json = { v = 1 } } })
    assert.equal(200, gw:get("/flaky").status)
    assert.equal(2, #gw:calls("flaky"))
  end)

  it("stay within the retry budget when many calls fail at once", function()
    gw:stub("flaky", "/f", { status = 503, latency_ms = 5 })
    local pages = {}
    for i = 1, 10 do pages[i] = gw:send("GET", "/flaky") end
    gw:run()
    local stats = rt.upstream_stats("flaky")
    -- 20 % of 10 active calls is 2; the floor is min_retries = 3 retries in flight at once
    assert.is_true(stats.retries_denied > 0)
    assert.is_true(#gw:calls("flaky") < 30)
    for _, p in ipairs(pages) do assert.equal(502, p.status) end
  end)
end)

describe("hedging", function()
  local gw
  before_each(function() gw = testing.gateway { dir = DIR } end)

  it("sends a second copy after `after` ms and takes the first good answer", function()
    gw:stub("slow", "/s", { { json = { from = "first" }, latency_ms = 500 }, { json = { from = "hedge" }, latency_ms = 10 } })
    local page = gw:get("/hedged")
    assert.equal(200, page.status)
    assert.equal(60, page.elapsed_ms)
    assert.equal("hedge", page.json.s.data.from)
    local calls = gw:calls("slow")
    assert.equal(2, #calls)
    assert.is_true(calls[1].cancelled) -- the loser is cancelled
    assert.equal(50, calls[2].started_ms)
  end)

  it("does not hedge a call that answers before `after`", function()
    gw:stub("slow", "/s", { json = { from = "first" }, latency_ms = 30 })
    gw:get("/hedged")
    assert.equal(1, #gw:calls("slow"))
  end)

  it("hedges at the upstream's observed p95 once it has 20 answers to go by", function()
    gw:stub("slow95", "/s", { json = { from = "usual" }, latency_ms = 10 })
    for _ = 1, 19 do gw:get("/hedged-p95") end
    assert.equal(19, #gw:calls("slow95")) -- no hedging before 20 samples
    for _ = 1, 20 do gw:get("/hedged-p95") end
    gw:clear_calls()
    gw:stub("slow95", "/s", { { json = { from = "stuck" }, latency_ms = 900 }, { json = { from = "hedge" }, latency_ms = 10 } })
    local page = gw:get("/hedged-p95")
    assert.equal("hedge", page.json.s.data.from)
    assert.equal(20, page.elapsed_ms) -- hedged at p95 = 10 ms, answered 10 ms later
    assert.equal(2, #gw:calls("slow95"))
  end)

  it("caps hedges at about max_percent of the calls", function()
    gw:stub("slow", "/s", { json = { from = "any" }, latency_ms = 80 })
    for _ = 1, 100 do gw:get("/hedged") end
    local hedges = #gw:calls("slow") - 100
    assert.is_true(hedges >= 1 and hedges <= 7, "hedges: " .. hedges)
  end)
end)

describe("single-flight", function()
  local gw
  before_each(function()
    gw = testing.gateway { dir = DIR }
    gw:stub("shared", "/catalog", { json = { items = { 1, 2 } }, latency_ms = 30 })
    gw:stub("shared", "/me", { json = { me = true }, latency_ms = 30 })
  end)

  it("shares one upstream call among identical calls in flight", function()
    local pages = {}
    for i = 1, 10 do pages[i] = gw:send("GET", "/shared/u" .. i) end
    gw:run()
    local catalog = 0
    for _, c in ipairs(gw:calls("shared")) do if c.path == "/catalog" then catalog = catalog + 1 end end
    assert.equal(1, catalog)
    for _, p in ipairs(pages) do assert.equal('{"items":[1,2]}', require("agg.json").encode(p.json.catalog.data)) end
  end)

  it("never shares calls that carry the user's credentials", function()
    for i = 1, 5 do gw:send("GET", "/shared/u" .. i) end
    gw:run()
    local me = 0
    for _, c in ipairs(gw:calls("shared")) do if c.path == "/me" then me = me + 1 end end
    assert.equal(5, me)
  end)

  it("is off per call on request", function()
    for _ = 1, 4 do gw:send("GET", "/uncollapsed") end
    gw:run()
    assert.equal(4, #gw:calls("shared"))
  end)

  it("keeps the shared call going for the others when the first caller leaves", function()
    local a = gw:send("GET", "/shared/a")
    gw:advance(5)
    local b = gw:send("GET", "/shared/b")
    gw:advance(5)
    gw:disconnect(a)
    gw:run()
    assert.equal(200, b.status)
    assert.equal("ok", b.json.catalog.status)
    local catalog = {}
    for _, c in ipairs(gw:calls("shared")) do if c.path == "/catalog" then catalog[#catalog + 1] = c end end
    assert.equal(1, #catalog)
    assert.is_falsy(catalog[1].cancelled)
  end)

  it("seed: 10,000 requests spread over 1 s to a 30 ms upstream make about 34 calls", function()
    local pages = {}
    for i = 1, 10000 do
      gw:at((i - 1) * 0.1, function() pages[i] = gw:send("GET", "/catalog") end)
    end
    gw:run()
    local calls = #gw:calls("shared")
    assert.is_true(calls >= 30 and calls <= 40, "upstream calls: " .. calls)
    for i = 1, 10000 do assert.equal(200, pages[i].status) end
  end)
end)

describe("fallbacks", function()
  it("serve a function of the problem, with status fallback and the problem kept", function()
    local gw = testing.gateway { dir = DIR }
    gw:stub("events", "/events/1", { json = { name = "Concert" } })
    gw:stub("recs", "/recs/1", { status = 500 })
    local page = gw:get("/fallback")
    local recs = testing.expect_section(page, "recs", "fallback", "upstream-error")
    assert.equal("urn:aggway:problem:upstream-error", recs.data.reason)
  end)
end)

describe("the breaker handle (upstream/breaker.c)", function()
  it("answers its methods and refuses anything that is not a breaker as self", function()
    local breaker = require "agg.breaker"
    local b = breaker.new(1, 1000, 1)
    assert.equal("allow", (b:allow(1)))
    assert.equal("open", b:report("failure", false, 2))
    assert.equal("deny", (b:allow(3)))
    for _, other in ipairs { {}, io.stdout, false, "x" } do
      local ok, err = pcall(b.allow, other, 1)
      assert.is_false(ok)
      assert.truthy(err:find("agw.breaker expected", 1, true), err)
    end
    local ok, err = pcall(b.report) -- no self at all
    assert.is_false(ok)
    assert.truthy(err:find("agw.breaker expected, got no value", 1, true), err)
  end)

  it("keeps its quiet word (what the runtime reads through the FFI instead of calling allow and report) 1 exactly while closed with no failure counted, or off", function()
    local breaker, ffi = require "agg.breaker", require "ffi"
    local b = breaker.new(2, 1000, 1)
    local q = ffi.cast("const volatile int *", breaker.quiet_word(b))
    assert.equal(1, q[0])
    assert.is_nil(b:report("failure", false, 1)) -- one failure counted: the next success must reach C
    assert.equal(0, q[0])
    assert.is_nil(b:report("success", false, 2))
    assert.equal(1, q[0])
    b:report("failure", false, 3)
    assert.equal("open", b:report("failure", false, 4))
    assert.equal(0, q[0])
    assert.equal("probe", (b:allow(1004))) -- half-open
    assert.equal(0, q[0])
    assert.equal("open", b:report("failure", true, 1005)) -- the probe failed
    assert.equal(0, q[0])
    assert.equal("probe", (b:allow(2005)))
    assert.equal("closed", b:report("success", true, 2006))
    assert.equal(1, q[0])
    -- an ignored outcome while a failure is counted leaves the count (and the word) as it is
    b:report("failure", false, 2007)
    b:report("ignore", false, 2008)
    assert.equal(0, q[0])
    -- a breaker that is off is always quiet
    local off = breaker.new(0, 1000, 1)
    local qo = ffi.cast("const volatile int *", breaker.quiet_word(off))
    off:report("failure", false, 1)
    assert.equal(1, qo[0])
    assert.has_error(function() breaker.quiet_word({}) end)
  end)
end)
