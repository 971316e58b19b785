-- A call spec's closing brace is missing (line 8): the syntax error is the one error reported.
local agg = require "agg"
return {
  route = "GET /page",
  handler = function()
    local res = agg.fetch_all {
      product = { "product", "/p/1" },
      stock = { "inventory", "/s/1", timeout_ms = 60, fallback = { n = 0 } ,
      rating = agg.fetch_then("product", function(p) return { "product", "/r/1" } end),
    }
    return agg.page(res)
  end,
}
