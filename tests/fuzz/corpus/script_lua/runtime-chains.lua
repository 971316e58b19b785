-- Endpoints exercising agg.fetch_then in every form (spec/runtime_spec.lua).
local agg = require "agg"

return {
  {
    route = "GET /then/list",
    handler = function()
      return agg.page(agg.fetch_all {
        x = { "a", "/x" },
        y = { "b", "/y" },
        both = agg.fetch_then({ "x", "y" }, function(x, y)
          return { "c", "/sum", query = { n = x.data.n + y.data.n } }
        end),
      })
    end,
  },
  {
    route = "GET /then/spec",
    handler = function()
      return agg.page(agg.fetch_all {
        other = { "b", "/y" },
        chained = agg.fetch_then({ "a", "/x" }, function(x) return { "c", "/n/" .. x.data.n } end),
      })
    end,
  },
  {
    route = "GET /then/standalone",
    handler = function()
      local r = agg.fetch_then({ "a", "/x" }, function(x) return { "c", "/n/" .. x.data.n } end)
      return { status = r.ok and 200 or 502, json = { n = r.data and r.data.n or agg.null } }
    end,
  },
  {
    -- standalone chains put straight into agg.page: they run there, together
    route = "GET /then/in-page",
    handler = function()
      return agg.page {
        r = agg.fetch_then({ "a", "/x" }, function(x) return { "c", "/n/" .. x.data.n } end),
        s = agg.fetch_then({ "b", "/y" }, function(y) return y.data.n * 10 end),
      }
    end,
  },
  {
    -- a standalone chain the script already read: agg.page uses its result, runs nothing again
    route = "GET /then/in-page-read",
    handler = function()
      local r = agg.fetch_then({ "a", "/x" }, function(x) return { "c", "/n/" .. x.data.n } end)
      if not r.ok then return { status = 502 } end
      return agg.page { r = r }
    end,
  },
  {
    route = "GET /then/fanout",
    handler = function()
      return agg.page(agg.fetch_all {
        x = { "a", "/x" },
        more = agg.fetch_then("x", function(x)
          return { first = { "b", "/y" }, second = { "c", "/n/" .. x.data.n } }
        end),
      })
    end,
  },
  {
    route = "GET /then/value",
    handler = function()
      return agg.page(agg.fetch_all {
        x = { "a", "/x" },
        double = agg.fetch_then("x", function(x) return { n = x.data.n * 2 } end),
        nothing = agg.fetch_then("x", function() return nil end),
      })
    end,
  },
  {
    route = "GET /then/nested",
    handler = function()
      return agg.page(agg.fetch_all {
        x = { "a", "/x" },
        inner = agg.fetch_then("x", function()
          local r = agg.fetch_all { p = { "b", "/y" }, q = { "c", "/n/1" } }
          return { p = r.p.data.n, q = r.q.data.n }
        end),
      })
    end,
  },
  {
    route = "GET /then/chain",
    handler = function()
      return agg.page(agg.fetch_all {
        x = { "a", "/x" },
        chained = agg.fetch_then("x", function(x)
          return agg.fetch_then({ "b", "/y" }, function(y) return { "c", "/n/" .. (x.data.n + y.data.n) } end)
        end),
      })
    end,
  },
  {
    route = "GET /then/error",
    handler = function()
      return agg.page(agg.fetch_all {
        x = { "a", "/x" },
        broken = agg.fetch_then("x", function(x) return x.data.missing.field end),
      })
    end,
  },
  {
    route = "GET /then/required",
    handler = function()
      return agg.page(agg.fetch_all {
        x = { "a", "/x" },
        y = agg.fetch_then("x", function() return { "b", "/y" } end, { required = true }),
      })
    end,
  },
}
