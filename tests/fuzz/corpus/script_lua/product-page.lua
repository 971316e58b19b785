-- GET /product-page/{id}: the seed's product page. Product, Reviews and Inventory in parallel,
-- under one 200 ms deadline; Product is required, the others degrade to a section status.
local agg = require "agg"

return {
  route = "GET /product-page/{id}",
  deadline_ms = 200,
  handler = function(req)
    local id = req.params.id
    local res = agg.fetch_all {
      product   = { "product", "/products/" .. id, timeout_ms = 150, required = true },
      reviews   = { "reviews", "/reviews/" .. id, timeout_ms = 100 },
      inventory = { "inventory", "/stock/" .. id, timeout_ms = 100 },
    }
    if res.product.ok then
      res.product.data.description = nil      -- the phone does not show it
    end
    return agg.page(res)
  end,
}
