-- The concert page (examples/concert/scripts/concert.lua): three shapes from the same services.
--   aggway test -c examples/concert/scripts examples/concert/spec
local testing = require "agg.testing"

local EVENT = {
  eventId = 77, eventName = "Konser Malam Jakarta", venueName = "GBK Arena", startsAt = "2027-03-01T19:00:00+07:00",
  poster = "https://img.example/77.jpg", internalNotes = "promoter contract #4411",
  description = string.rep("Malam penuh musik dari band-band terbaik Indonesia. ", 40),
  lineup = { "Band A", "Band B", "Band C", "Band D" },
}
local TIERS = { tiers = {
  { name = "Festival", price = 750000, available = 120, perks = { "standing" } },
  { name = "VIP", price = 2500000, available = 0, perks = { "lounge", "merch" } },
  { name = "Tribun", price = 450000, available = 800, perks = {} },
  { name = "Tribun Atas", price = 300000, available = 50, perks = {} },
} }
local function recommendations(n)
  local items = {}
  for i = 1, n do
    items[i] = { id = 100 + i, title = "Konser " .. i, poster = "https://img.example/" .. i .. ".jpg",
                 summary = string.rep("Rekomendasi untuk Anda. ", 10) }
  end
  return { items = items }
end

describe("the concert page", function()
  local gw
  before_each(function()
    gw = testing.gateway()
    gw:stub("events", "/events/77", { json = EVENT, latency_ms = 40 })
    gw:stub("tickets", "/events/77/tiers", { json = TIERS, latency_ms = 60 })
    gw:stub("recommendations", "/events/77/recommendations?limit=12", { json = recommendations(15), latency_ms = 80 })
    gw:stub("recommendations", "/events/77/recommendations?limit=3", { json = recommendations(3), latency_ms = 50 })
  end)

  it("v1 keeps the shape the old apps read, under the key concert, without internal notes", function()
    local page = gw:get("/v1/concerts/77")
    assert.equal(200, page.status)
    assert.equal("Konser Malam Jakarta", page.json.concert.data.eventName)
    assert.is_nil(page.json.concert.data.internalNotes)
    assert.is_nil(page.json.event)
    assert.equal(15, #page.json.recommendations.data.items)
  end)

  it("v2 web renames the event's fields and shows twelve recommendations", function()
    local page = gw:get("/v2/web/concerts/77")
    assert.equal(200, page.status)
    local e = page.json.event.data
    assert.equal(77, e.id)
    assert.equal("GBK Arena", e.venue)
    assert.is_nil(e.eventName)
    assert.is_nil(e.internalNotes)
    assert.equal(4, #page.json.tickets.data.tiers)
    assert.equal(12, #page.json.recommendations.data)
    assert.equal(80, page.elapsed_ms) -- the three calls in parallel: the slowest one
  end)

  it("v2 mobile sends what the first screen shows: a body several times smaller than web's", function()
    local web, mobile = gw:get("/v2/web/concerts/77"), gw:get("/v2/mobile/concerts/77")
    assert.equal(200, mobile.status)
    assert.same({ "id", "poster", "starts_at", "title", "venue" }, (function()
      local keys = {}
      for k in pairs(mobile.json.event.data) do keys[#keys + 1] = k end
      table.sort(keys)
      return keys
    end)())
    -- sold-out tiers left out, the two first available ones, name and price only
    assert.same({ { name = "Festival", price = 750000 }, { name = "Tribun", price = 450000 } }, mobile.json.tickets.data.tiers)
    assert.same({ id = 101, title = "Konser 1" }, mobile.json.recommendations.data[1])
    assert.equal(3, #mobile.json.recommendations.data)
    assert.is_true(#mobile.body * 5 < #web.body, ("mobile %d bytes, web %d bytes"):format(#mobile.body, #web.body))
    assert.equal("limit=3", gw:calls("recommendations")[2].path:match("limit=%d+"))
  end)

  it("passes the visitor's Accept-Language to events only", function()
    gw:get("/v2/mobile/concerts/77", { headers = { ["Accept-Language"] = "id-ID" } })
    assert.equal("id-ID", gw:calls("events")[1].headers["accept-language"])
    assert.is_nil(gw:calls("tickets")[1].headers["accept-language"])
    assert.is_nil(gw:calls("recommendations")[1].headers["accept-language"])
  end)

  it("still answers 200 when recommendations time out, with that section unavailable", function()
    gw:stub("recommendations", "/events/77/recommendations?limit=3", { fault = "hang" })
    local page = gw:get("/v2/mobile/concerts/77")
    assert.equal(200, page.status)
    testing.expect_section(page, "recommendations", "unavailable", "upstream-timeout")
    assert.equal("false", page.headers["x-aggregation-completed"])
    assert.equal(100, page.elapsed_ms) -- the call's own 100 ms, not the page's 300 ms deadline
  end)

  it("serves the tickets fallback when the ticket service fails", function()
    gw:stub("tickets", "/events/77/tiers", { status = 503 })
    local page = gw:get("/v2/web/concerts/77")
    assert.equal(200, page.status)
    assert.equal("fallback", page.json.tickets.status)
    assert.same({}, page.json.tickets.data.tiers)
  end)

  it("fails with a detail naming the page's key when the event is unavailable", function()
    gw:stub("events", "/events/77", { fault = "refuse" })
    local v1, v2 = gw:get("/v1/concerts/77"), gw:get("/v2/web/concerts/77")
    assert.equal(502, v1.status)
    assert.equal("a required section is unavailable", v1.json.title)
    assert.equal("section concert: the upstream could not be reached", v1.json.detail)
    assert.equal("section event: the upstream could not be reached", v2.json.detail)
  end)
end)
