-- Merged calls (call option batch): items asked for one by one go out as one upstream call per
-- batch. Fixture scripts: spec/fixtures/merge. README "Batching".
local testing = require "agg.testing"
local rt = require "agg.runtime"

local DIR = "spec/fixtures/merge"

local function split_ids(s)
  local t = {}
  for id in s:gmatch("[^,]+") do t[#t + 1] = id end
  return t
end

-- /products?ids=…: every id asked for, except those in missing, as { id = n, name = "p<n>" }
local function products(missing, latency)
  return function(call)
    local items = {}
    for _, id in ipairs(split_ids(call.query.ids)) do
      if not (missing and missing[id]) then items[#items + 1] = { id = tonumber(id), name = "p" .. id } end
    end
    return { json = items, latency_ms = latency or 10 }
  end
end

describe("merged calls", function()
  local gw
  before_each(function()
    gw = testing.gateway { dir = DIR }
    gw:stub("catalog", "/products", products())
  end)

  it("sends the 50 items of one page as one upstream call that carries every id", function()
    local page = gw:get("/cart/1/50")
    assert.equal(200, page.status)
    local calls = gw:calls("catalog")
    assert.equal(1, #calls)
    local ids = split_ids(calls[1].query.ids)
    assert.equal(50, #ids)
    for i = 1, 50 do
      assert.equal("ok", page.json["item" .. i].status)
      assert.same({ id = i, name = "p" .. i }, page.json["item" .. i].data)
    end
    -- the 50th id fills the batch (max = 50): it goes out at once, without waiting for the window
    assert.equal(10, page.elapsed_ms)
    -- fewer than max wait for the window (2 ms), then the upstream (10 ms)
    assert.equal(12, gw:get("/cart/1/3").elapsed_ms)
  end)

  it("splits at max: 60 items make two calls of 50 and 10 ids", function()
    local page = gw:get("/cart/1/60")
    assert.equal(200, page.status)
    local calls = gw:calls("catalog")
    assert.equal(2, #calls)
    assert.equal(50, #split_ids(calls[1].query.ids))
    assert.equal(10, #split_ids(calls[2].query.ids))
    for i = 1, 60 do assert.equal(i, page.json["item" .. i].data.id) end
  end)

  it("merges the items of concurrent pages, asking for each id once", function()
    local pages = {}
    for i = 1, 20 do pages[i] = gw:send("GET", "/cart/" .. i .. "/10") end -- ids 1 .. 29, overlapping
    gw:run()
    local calls = gw:calls("catalog")
    assert.equal(1, #calls)
    assert.equal(29, #split_ids(calls[1].query.ids))
    for i, p in ipairs(pages) do
      assert.equal(200, p.status)
      for id = i, i + 9 do assert.equal("p" .. id, p.json["item" .. id].data.name) end
    end
    local s = rt.merge_stats("catalog")
    assert.equal(1, s.merged_calls)
    assert.equal(200, s.merged_items)
  end)

  it("lets a page whose ids are already in flight join that call", function()
    gw:stub("catalog", "/products", products(nil, 50))
    local a = gw:send("GET", "/cart/1/5")
    gw:advance(20)
    local b = gw:send("GET", "/cart/3/5")   -- ids 3..5 in flight, 6..7 new
    gw:run()
    local calls = gw:calls("catalog")
    assert.equal(2, #calls)
    assert.equal("6,7", calls[2].query.ids)
    assert.equal(200, a.status)
    assert.equal(200, b.status)
    assert.equal("p3", b.json.item3.data.name)
    assert.equal(3, rt.merge_stats("catalog").merged_joined)
  end)

  it("sends a merged call to one endpoint of an upstream group, and balances the next", function()
    gw:stub("grouped", "/products", products())
    local a = gw:get("/gcart/5")
    assert.equal(200, a.status)
    assert.equal("p5", a.json.item5.data.name)
    gw:get("/gcart/5")
    local calls = gw:calls("grouped")
    assert.equal(2, #calls)
    assert.truthy(calls[1].endpoint)
  end)

  it("gives a group's endpoint back when a merged call ends, and counts its answer for that endpoint", function()
    -- (found in review: a merged call held the endpoint the balancer chose for good, and its answer
    -- went to the upstream's breaker as if the group had one endpoint)
    local group = require "agg.group"
    gw:stub("guarded", "/products", products())
    gw:stub("guarded#1", "/products", { status = 503, latency_ms = 5 })
    for i = 1, 30 do gw:get("/guarded/" .. (i % 3 + 1)) end
    local g = group.group_of("guarded")
    assert.equal(0, g.inflight)
    local called, answered = 0, 0
    for _, e in ipairs(g.eps) do
      assert.equal(0, e.inflight)
      called, answered = called + e.calls, answered + e.answered
    end
    assert.equal(30, called)
    assert.equal(30, answered)
    -- endpoint 1 is ejected by its merged calls' failures (outlier ejection: 5 in a row), and the
    -- upstream's breaker stays closed while endpoint 2 answers
    local states = {}
    for i, e in ipairs(gw:endpoints("guarded")) do states[i] = e.state end
    assert.same({ "ejected", "healthy" }, states)
    local page = gw:get("/guarded/2")
    assert.equal("ok", page.json.item1.status)
    assert.equal("ok", page.json.item2.status)
  end)

  -- each endpoint of upstream name answers its items with from = its number (latency ms)
  local function stub_endpoints(name, latency)
    for ep = 1, 3 do
      gw:stub(name .. "#" .. ep, "/products", function(call)
        local items = {}
        for _, id in ipairs(split_ids(call.query.ids)) do items[#items + 1] = { id = tonumber(id), from = ep } end
        return { json = items, latency_ms = latency or 10 }
      end)
    end
  end

  local function from(page, first, n)
    local t = {}
    for i = first, first + n - 1 do t[#t + 1] = page.json["item" .. i].data.from end
    return table.concat(t, ",")
  end

  it("merges the calls of pages whose sessions pin one endpoint, and sends each session's to its own", function()
    -- (found by an attack review: a merged call went where the first caller's session pinned, and
    -- a caller pinned elsewhere got that endpoint's items and no session)
    stub_endpoints("sessioned")
    local group = require "agg.group"
    local function session(port) return { cookie = ("s=%08x.0.0"):format(group.hash("http://127.0.0.1:" .. port)) } end
    local a = gw:send("GET", "/of/sessioned/1/2", { headers = session(9) })
    local b = gw:send("GET", "/of/sessioned/2/2", { headers = session(7) })
    local c = gw:send("GET", "/of/sessioned/5/1", { headers = session(7) })
    gw:run()
    assert.equal("3,3", from(a, 1, 2))
    assert.equal("1,1", from(b, 2, 2))
    assert.equal("1", from(c, 5, 1))
    for _, p in ipairs { a, b, c } do assert.is_nil(p.headers["set-cookie"]) end -- pinned: nothing to set
    assert.equal(2, #gw:calls("sessioned")) -- b and c share one
  end)

  it("gives each caller without a session the session of the endpoint its merged call went to", function()
    stub_endpoints("sessioned", 50)
    local a = gw:send("GET", "/of/sessioned/1/2")
    local b = gw:send("GET", "/of/sessioned/2/2")
    gw:advance(20)
    local c = gw:send("GET", "/of/sessioned/1/1") -- joins the call in flight
    gw:run()
    local calls = gw:calls("sessioned")
    assert.equal(1, #calls)
    local ep = calls[1].endpoint
    assert.equal(1, rt.merge_stats("sessioned").merged_joined)
    local group = require "agg.group"
    local id = ("%08x"):format(group.hash("http://127.0.0.1:" .. (6 + ep)))
    for _, p in ipairs { a, b, c } do
      assert.equal(200, p.status)
      assert.equal(tostring(ep), p.json.item1 and from(p, 1, 1) or from(p, 2, 1))
      assert.matches("^s=" .. id .. "%.", p.headers["set-cookie"])
    end
  end)

  it("merges only calls of one hash key on a hash-balanced upstream: each shard answers its own keys", function()
    -- (found by an attack review: with sharded endpoints, a caller was given another shard's items)
    stub_endpoints("sharded")
    local shard, users = {}, {}
    for i = 1, 50 do
      local u = "user" .. i
      gw:get("/of/sharded/1/1", { headers = { ["x-user"] = u } })
      local calls = gw:calls("sharded")
      local ep = calls[#calls].endpoint
      if not shard[ep] then shard[ep] = u users[#users + 1] = u end
      if #users == 2 then break end
    end
    assert.equal(2, #users)
    gw:clear_calls()
    local a = gw:send("GET", "/of/sharded/1/2", { headers = { ["x-user"] = users[1] } })
    local b = gw:send("GET", "/of/sharded/2/2", { headers = { ["x-user"] = users[2] } })
    local a2 = gw:send("GET", "/of/sharded/3/2", { headers = { ["x-user"] = users[1] } })
    gw:run()
    local ep_of = {}
    for ep, u in pairs(shard) do ep_of[u] = tostring(ep) end
    assert.equal(ep_of[users[1]] .. "," .. ep_of[users[1]], from(a, 1, 2))
    assert.equal(ep_of[users[2]] .. "," .. ep_of[users[2]], from(b, 2, 2))
    assert.equal(ep_of[users[1]] .. "," .. ep_of[users[1]], from(a2, 3, 2))
    assert.equal(2, #gw:calls("sharded")) -- a and a2, one key, share one
  end)

  it("forgets a hash key's batch group once its merged call is answered (memory bound)", function()
    -- (review of 036a1d9: every distinct hash key is a batch group of its own, and merge.lua's
    -- inflight[group] table stayed after its call was answered: one empty table and group string
    -- per key a client ever sent, about 190 bytes each, until a reload)
    stub_endpoints("sharded", 1)
    for i = 1, 500 do gw:get("/of/sharded/1/1", { headers = { ["x-user"] = "u" .. i } }) end
    assert.equal(0, require("agg.merge").open_groups())
  end)

  it("does not let a caller pinned to a usable endpoint join a merged call that went elsewhere", function()
    -- (review of 036a1d9: the batch's route is taken at join time; a batch of "s<A>" flushed while
    -- A was out of service went to B, and a caller pinned to A, usable again while the call was
    -- out, joined it in flight: B's item, and its session moved to B)
    stub_endpoints("sessioned", 100)
    local group = require "agg.group"
    local function session(port) return { cookie = ("s=%08x.0.0"):format(group.hash("http://127.0.0.1:" .. port)) } end
    gw:get("/of/sessioned/100/1", { headers = session(9) })
    gw:clear_calls()
    local g = group.group_of("sessioned")
    local iA
    for i, e in ipairs(g.eps) do if e.url == "http://127.0.0.1:9" then iA = i end end
    gw:send("GET", "/of/sessioned/1/1", { headers = session(9) })
    g.eps[iA].until_ms = gw:now() + 10 -- A out of service (as an ejection) while the batch is flushed
    gw:advance(5)
    gw:advance(10) -- A usable again; the merged call is still out
    local c = gw:send("GET", "/of/sessioned/1/1", { headers = session(9) })
    gw:run()
    assert.equal(iA, c.json.item1.data.from)
    assert.is_nil(c.headers["set-cookie"]) -- pinned to A, and A is usable: nothing to set
  end)

  it("gives each caller its own copy of a shared item", function()
    local a = gw:send("GET", "/rename/4")
    local b = gw:send("GET", "/cart/4/1")
    local c = gw:send("GET", "/rename/4")
    gw:run()
    assert.equal(1, #gw:calls("catalog"))
    assert.equal("renamed", a.json.item.data.name)
    assert.equal("p4", b.json.item4.data.name)
    assert.equal("renamed", c.json.item.data.name)
  end)

  it("fails only the caller whose item is missing, with a not-found problem", function()
    gw:stub("catalog", "/products", products({ ["3"] = true }))
    local page = gw:get("/cart/1/5")
    assert.equal(200, page.status)
    testing.expect_section(page, "item3", "unavailable", "upstream-not-found")
    assert.equal(404, page.json.item3.error.status)
    for _, i in ipairs { 1, 2, 4, 5 } do assert.equal("ok", page.json["item" .. i].status) end
    assert.equal("false", page.headers["x-aggregation-completed"])
    -- a required item that is missing fails its page with 404
    local lone = gw:get("/item/3")
    assert.equal(404, lone.status)
  end)

  it("fails each caller with the merged call's problem when it fails", function()
    gw:stub("catalog", "/products", { status = 503, json = { error = "down" } })
    local page = gw:get("/cart/1/3")
    assert.equal(502, page.status)
    for i = 1, 3 do testing.expect_section(page, "item" .. i, "unavailable", "upstream-error") end
    gw:stub("catalog", "/products", { fault = "hang" })
    page = gw:get("/item/1")
    assert.equal(504, page.status)
  end)

  it("keeps each caller's deadline: a caller with less time stops waiting, the others get their item", function()
    gw:stub("catalog", "/products", products(nil, 100))
    local slow = gw:send("GET", "/cart/1/2")
    local hurry = gw:send("GET", "/hurry/1")
    gw:run()
    assert.equal(200, slow.status)
    assert.equal("ok", slow.json.item1.status)
    assert.equal(102, slow.elapsed_ms)
    testing.expect_section(hurry, "item", "unavailable", "upstream-timeout")
    assert.equal(50, hurry.elapsed_ms)
    assert.equal(1, #gw:calls("catalog"))
  end)

  it("does not let a caller join a call in flight that times out before its own timeout", function()
    -- the short caller's batch left first; the page with more time asks for the same id while it
    -- is in flight: joining would fail it at the short caller's 50 ms
    gw:stub("catalog", "/products", products(nil, 100))
    local hurry = gw:send("GET", "/hurry/1")
    gw:advance(20)
    local slow = gw:send("GET", "/cart/1/2")
    gw:run()
    testing.expect_section(hurry, "item", "unavailable", "upstream-timeout")
    assert.equal(200, slow.status)
    assert.equal("ok", slow.json.item1.status)
    assert.equal("p1", slow.json.item1.data.name)
    local calls = gw:calls("catalog")
    assert.equal(2, #calls)
    assert.equal("1,2", calls[2].query.ids)
    assert.equal(0, rt.merge_stats("catalog").merged_joined)
  end)

  it("cancels the merged call when every caller has gone", function()
    gw:stub("catalog", "/products", { fault = "hang" })
    local a = gw:send("GET", "/cart/1/3")
    local b = gw:send("GET", "/cart/2/3")
    gw:advance(20)
    assert.equal(1, #gw:calls("catalog"))
    gw:disconnect(a)
    assert.is_nil(gw:calls("catalog")[1].cancelled) -- b still waits for items 2 and 3
    gw:disconnect(b)
    assert.is_true(gw:calls("catalog")[1].cancelled)
    local reqs, in_flight = rt.stats()
    assert.equal(0, reqs)
    assert.equal(0, in_flight)
  end)

  it("times out with the longest caller's timeout, each shorter caller at its own", function()
    gw:stub("catalog", "/products", { fault = "hang" })
    local hurry = gw:send("GET", "/hurry/1")
    local slow = gw:send("GET", "/cart/1/1")
    gw:run()
    assert.equal(50, hurry.elapsed_ms)
    assert.equal(300, slow.elapsed_ms) -- the upstream's timeout_ms: the merged call's own timeout
    assert.equal("timeout", gw:calls("catalog")[1].outcome)
    testing.expect_section(slow, "item1", "unavailable", "upstream-timeout")
  end)

  it("passes the breaker once per merged call and counts it once", function()
    gw:stub("catalog", "/products", { fault = "refuse" })
    for i = 1, 3 do gw:get("/cart/" .. (i * 10) .. "/5") end
    assert.equal(3, #gw:calls("catalog"))
    local page = gw:get("/cart/100/5")
    testing.expect_section(page, "item100", "unavailable", "circuit-open")
    assert.equal(3, #gw:calls("catalog"))
  end)

  it("builds the merged request and splits the answer with the script's functions", function()
    gw:stub("prices", "/prices/lookup", function(call)
      local out = {}
      for sku in call.query.skus:gmatch("[^ ]+") do out[sku] = { sku = sku, eur = #sku } end
      return { json = { prices = out } }
    end)
    local page = gw:get("/prices/ab/xyz")
    assert.equal(200, page.status)
    assert.equal("/prices/lookup?skus=ab+xyz", gw:calls("prices")[1].path)
    assert.equal(3, page.json.b.data.eur)
    assert.equal(2, page.json.a.data.eur)
  end)

  it("a split that raises a value other than a string fails its items, the value named by its type", function()
    gw:stub("prices", "/prices/lookup", { json = { prices = {} } })
    local page = gw:get("/split-raises/ab")
    assert.equal(502, page.status) -- its only section
    assert.equal("unavailable", page.json.sections.a.status)
    assert.equal("urn:aggway:problem:upstream-bad-json", page.json.sections.a.error.type)
    assert.equal(0, #gw:calls("catalog")) -- its __tostring never ran
    local seen
    for _, l in ipairs(gw:logs()) do
      if l:find("merged call to upstream prices: an error value of type table", 1, true) then seen = true end
    end
    assert.truthy(seen)
  end)

  it("fills a path template and finds items by another field of a list under a member", function()
    gw:stub("catalog", "/by-sku/{list}", function(call)
      local items = {}
      for s in call.route_path:match("/by%-sku/(.*)"):gmatch("[^;]+") do items[#items + 1] = { sku = s } end
      return { json = { items = items } }
    end)
    local page = gw:get("/skus/A-1/B-2")
    assert.equal(200, page.status)
    assert.equal("/by-sku/A-1;B-2", gw:calls("catalog")[1].path)
    assert.equal("B-2", page.json.b.data.sku)
  end)

  it("writes a whole-number key whole: ids of 15 and 16 digits are asked for and matched as they are", function()
    -- (tostring writes 14 significant digits: 100000000000001 and 100000000000002 were one key,
    -- "1e+14", asked for as such, and both callers were given the upstream's item 100000000000000)
    local page = gw:get("/big-ids/100000000000001/1234567890123456")
    assert.equal(200, page.status)
    local calls = gw:calls("catalog")
    assert.equal(1, #calls)
    assert.same({ "100000000000001", "1234567890123456" }, split_ids(calls[1].query.ids))
    assert.equal(100000000000001, page.json.a.data.id)
    assert.equal(1234567890123456, page.json.b.data.id)
    -- a key given as text matches the answer's numeric id of 15 digits
    page = gw:get("/item/123456789012345")
    assert.equal(200, page.status)
    assert.equal(123456789012345, page.json.item.data.id)
    -- and so do keys that are not whole numbers, as tostring writes them when it can
    assert.equal(200, gw:get("/big-ids/2.5/0.1").status)
  end)

  it("keeps the answer's JSON as it came: big integers, empty arrays, key order", function()
    gw:stub("catalog", "/products", { body = '[{"id":1,"big":9007199254740993,"tags":[],"z":1,"a":2}]',
                                      headers = { ["content-type"] = "application/json" } })
    local page = gw:get("/cart/1/1")
    assert.truthy(page.body:find('"data":{"id":1,"big":9007199254740993,"tags":[],"z":1,"a":2}', 1, true))
  end)
end)

describe("the batch option", function()
  local agg_rt = rt
  local callspec = require "agg.callspec"
  local ups = { catalog = { index = 1, timeout_ms = 100 } }
  local function norm(spec) return callspec.normalize(spec, ups, 1) end

  it("refuses an unknown option, a missing key, no way to build the request, and retry", function()
    assert.has_error(function() norm { "catalog", "/p", batch = { key = 1, param = "ids", maxx = 3 } } end)
    assert.error_matches(function() norm { "catalog", "/p", batch = { key = 1, param = "ids", maxx = 3 } } end,
                         "unknown option 'maxx' (did you mean 'max'?) (items, key,", nil, true)
    assert.error_matches(function() norm { "catalog", "/p", batch = { param = "ids" } } end, "'key'")
    assert.error_matches(function() norm { "catalog", "/p", batch = { key = 1 } } end, "exactly one of")
    assert.error_matches(function() norm { "catalog", "/p", batch = { key = 1, param = "ids", max = 0 } } end, "'max'")
    assert.error_matches(function() norm { "catalog", "/p", retry = { attempts = 2 }, batch = { key = 1, param = "ids" } } end,
                         "tried once")
    assert.error_matches(function() norm { "catalog", "/p", batch = { key = 1, param = "ids", window_ms = "2" } } end,
                         "must be a number")
    -- parsed JSON is data, not a function, though type() says "function" (a raw ref is a C closure)
    local ref = require("agg.json").parse("[1]")
    assert.error_matches(function() norm { "catalog", "/p", batch = { key = 1, request = ref } } end,
                         "option 'request' must be a function, got an agg.json raw ref (JSON data)", 1, true)
    assert.error_matches(function() norm { "catalog", "/p", batch = { key = 1, param = "ids", split = ref } } end,
                         "option 'split' must be a function, got an agg.json raw ref (JSON data)", 1, true)
    assert.is_table(agg_rt)
  end)
end)
