-- GET /product-detail/{id}: a dependent chain. Reviews are looked up by the SKU that Product
-- returns, so they start the moment Product answers; Inventory runs beside the chain.
local agg = require "agg"

return {
  route = "GET /product-detail/{id}",
  deadline_ms = 300,
  handler = function(req)
    local id = req.params.id
    local res = agg.fetch_all {
      product   = { "product", "/products/" .. id, required = true },
      inventory = { "inventory", "/stock/" .. id },
      reviews   = agg.fetch_then("product", function(product)
        return { "reviews", "/reviews", query = { sku = product.data.sku }, timeout_ms = 150,
                 fallback = { items = agg.array() } }
      end),
    }
    return agg.page(res)
  end,
}
