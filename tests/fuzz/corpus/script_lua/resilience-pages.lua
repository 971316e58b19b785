-- Pages for the resilience specs.
local agg = require "agg"

return {
  { -- seed: the concert page with a sick recommendations service
    route = "GET /concert/{id}",
    handler = function(req)
      return agg.page(agg.fetch_all {
        event = { "events", "/events/" .. req.params.id, required = true },
        recs  = { "recs", "/recs/" .. req.params.id },
      })
    end,
  },
  {
    route = "GET /must-recs/{id}",
    handler = function(req)
      return agg.page(agg.fetch_all { recs = { "recs", "/recs/" .. req.params.id, required = true } })
    end,
  },
  {
    route = "GET /flaky",
    handler = function()
      return agg.page(agg.fetch_all { f = { "flaky", "/f" } })
    end,
  },
  {
    route = "POST /flaky",
    handler = function()
      return agg.page(agg.fetch_all { f = { "flaky", "/f", method = "POST", json = { a = 1 } } })
    end,
  },
  {
    route = "GET /flaky-safe-post",
    handler = function()
      return agg.page(agg.fetch_all { f = { "flaky", "/f", method = "POST", retry = { safe = true } } })
    end,
  },
  {
    route = "GET /hedged",
    handler = function()
      return agg.page(agg.fetch_all { s = { "slow", "/s", hedge = true } })
    end,
  },
  {
    route = "GET /shared/{user}",
    handler = function(req)
      return agg.page(agg.fetch_all {
        catalog = { "shared", "/catalog" },
        private = { "shared", "/me", headers = { authorization = "Bearer " .. req.params.user } },
      })
    end,
  },
  {
    route = "GET /hedged-p95",
    handler = function()
      return agg.page(agg.fetch_all { s = { "slow95", "/s", hedge = true } })
    end,
  },
  {
    route = "GET /catalog",
    handler = function()
      return agg.page(agg.fetch_all { catalog = { "shared", "/catalog" } })
    end,
  },
  {
    route = "GET /uncollapsed",
    handler = function()
      return agg.page(agg.fetch_all { catalog = { "shared", "/catalog", collapse = false } })
    end,
  },
  {
    route = "GET /fallback",
    handler = function()
      return agg.page(agg.fetch_all {
        event = { "events", "/events/1" },
        recs = { "recs", "/recs/1", fallback = function(problem) return { reason = problem.type } end },
      })
    end,
  },
}
