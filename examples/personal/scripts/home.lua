-- GET /home: the shop's home page for a signed-in customer. Featured items are the same for
-- everyone; the "for you" section comes from the recommendations service, which needs the
-- caller's own token (gateway.lua: identity = "forward"). The edge verifies the token before this
-- script runs (a request without one gets 401); the catalogue never sees it.
local agg = require "agg"

return {
  route = "GET /home",
  auth = "jwt",
  handler = function(req)
    local res = agg.fetch_all {
      featured = { "catalog", "/featured", required = true },
      foryou = { "foryou", "/recommendations", query = { limit = 6 }, fallback = agg.array() },
    }
    agg.shape(res.featured, function(f)
      return agg.map(agg.limit(f.items, 8), function(i) return agg.pick(i, { "id", "name", "price" }) end)
    end)
    res.greeting = "Hello, " .. tostring(req.user.claims and req.user.claims.name or req.user.sub)
    return agg.page(res)
  end,
}
