-- Pages for the cache specs: a product page whose product section is cached and whose stock is
-- fetched every time, a personal page, and a page whose upstream's Cache-Control decides.
local agg = require "agg"

return {
  {
    route = "GET /p/{id}",
    handler = function(req)
      return agg.page(agg.fetch_all {
        product = { "product", "/products/" .. req.params.id },
        stock   = { "stock", "/stock/" .. req.params.id },
      })
    end,
  },
  {
    route = "GET /lang/{id}",
    handler = function(req)
      return agg.page(agg.fetch_all {
        product = { "product", "/products/" .. req.params.id,
                    headers = { ["accept-language"] = req.headers["accept-language"] or "en" },
                    cache = { vary = { "accept-language" } } },
      })
    end,
  },
  {
    route = "GET /me",
    handler = function(req)
      return agg.page(agg.fetch_all {
        me = { "product", "/me", headers = { authorization = req.headers.authorization } },
      })
    end,
  },
  {
    route = "GET /cc/{id}",
    handler = function(req)
      return agg.page(agg.fetch_all { item = { "cc", "/items/" .. req.params.id } })
    end,
  },
  {
    route = "GET /bad/{kind}",
    handler = function(req)
      local opts = ({ field = { ttl = 5 }, type = "60", post = { ttl_s = 5 }, scope = { scope = "all" } })[req.params.kind]
      return agg.page(agg.fetch_all {
        x = { "product", "/products/1", cache = opts, method = req.params.kind == "post" and "POST" or "GET" },
      })
    end,
  },
  {
    route = "GET /nocache/{id}",
    handler = function(req)
      return agg.page(agg.fetch_all { product = { "product", "/products/" .. req.params.id, cache = false } })
    end,
  },
  {
    -- /me's personal call, never cached
    route = "GET /me-live",
    handler = function(req)
      return agg.page(agg.fetch_all {
        me = { "product", "/me", headers = { authorization = req.headers.authorization }, cache = false },
      })
    end,
  },
  {
    -- a call with its own cache key (the script names the entry)
    route = "GET /keyed/{id}",
    handler = function(req)
      return agg.page(agg.fetch_all {
        product = { "product", "/products/" .. req.params.id, cache = { ttl_s = 60, key = "item-" .. req.params.id } },
      })
    end,
  },
}
