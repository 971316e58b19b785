-- GET /v1/concerts/{id}, GET /v2/web/concerts/{id}, GET /v2/mobile/concerts/{id}: the concert page
-- of the Indonesian ticket shop. The same three services feed every page; each page sends its
-- client what that client shows:
--   v1          the shape the old apps read (the services' own field names), kept as it was;
--   v2 web      the event renamed to v2's names, every ticket tier, twelve recommendations;
--   v2 mobile   the fields the app's first screen shows, the cheapest tiers, three recommendations.
-- The event is required (no page without it); tickets and recommendations degrade to a section
-- status. Events gets the visitor's Accept-Language (gateway.lua: forward_headers).
local agg = require "agg"

-- The calls of every version: written once, so v1 and v2 cannot drift apart.
local function calls(id, recommended)
  return {
    event = { "events", "/events/" .. id, required = true },
    tickets = { "tickets", "/events/" .. id .. "/tiers", fallback = { tiers = agg.array() } },
    recommendations = { "recommendations", "/events/" .. id .. "/recommendations",
                        query = { limit = recommended }, timeout_ms = 100 },
  }
end

-- v2's names for the service's fields (v1 keeps the service's own)
local V2_NAMES = { eventId = "id", eventName = "title", venueName = "venue", startsAt = "starts_at" }

local function v2_event(e)
  return agg.omit(agg.rename(e, V2_NAMES), { "internalNotes" })
end

return {
  {
    route = "GET /v1/concerts/{id}",
    handler = function(req)
      local res = agg.fetch_all(calls(req.params.id, 12))
      -- v1 apps read `concert`: the event under its v1 key keeps its status (and the page's
      -- problem title names `concert`)
      return agg.page {
        concert = agg.shape(res.event, function(e) return agg.omit(e, { "internalNotes" }) end),
        tickets = res.tickets,
        recommendations = res.recommendations,
      }
    end,
  },
  {
    route = "GET /v2/web/concerts/{id}",
    handler = function(req)
      local res = agg.fetch_all(calls(req.params.id, 12))
      agg.shape(res.event, v2_event)
      agg.shape(res.recommendations, function(r) return agg.limit(r.items, 12) end)
      return agg.page(res)
    end,
  },
  {
    route = "GET /v2/mobile/concerts/{id}",
    handler = function(req)
      local res = agg.fetch_all(calls(req.params.id, 3))
      agg.shape(res.event, function(e)
        return agg.pick(v2_event(e), { "id", "title", "venue", "starts_at", "poster" })
      end)
      agg.shape(res.tickets, function(t)
        local tiers = agg.map(t.tiers, function(tier)
          if tier.available > 0 then return agg.pick(tier, { "name", "price" }) end
        end)
        return { tiers = agg.limit(tiers, 2) }
      end)
      agg.shape(res.recommendations, function(r)
        return agg.map(agg.limit(r.items, 3), function(item) return agg.pick(item, { "id", "title" }) end)
      end)
      return agg.page(res)
    end,
  },
}
