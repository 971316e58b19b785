-- Pages for the merged-call specs: items asked for one by one, sent as merged calls.
local agg = require "agg"

-- { "catalog", "/products", batch = … } for item id: /products?ids=1,2,3 answers a list of items
local function product(id, extra)
  local spec = { "catalog", "/products", batch = { key = id, param = "ids", max = 50, window_ms = 2 } }
  for k, v in pairs(extra or {}) do spec[k] = v end
  return spec
end

return {
  { -- a cart of n items (ids first .. first + n - 1), each asked for on its own
    route = "GET /cart/{first}/{n}",
    handler = function(req)
      local calls = {}
      local first = tonumber(req.params.first)
      for i = first, first + tonumber(req.params.n) - 1 do calls["item" .. i] = product(i) end
      return agg.page(agg.fetch_all(calls))
    end,
  },
  { -- a cart whose items come from an upstream with two endpoints
    route = "GET /gcart/{n}",
    handler = function(req)
      local calls = {}
      for i = 1, tonumber(req.params.n) do
        calls["item" .. i] = { "grouped", "/products", batch = { key = i, param = "ids" } }
      end
      return agg.page(agg.fetch_all(calls))
    end,
  },
  { -- one item, required: a missing item fails the page with 404
    route = "GET /item/{id}",
    deadline_ms = 200,
    handler = function(req)
      return agg.page(agg.fetch_all { item = product(req.params.id, { required = true }) })
    end,
  },
  { -- one item, changed by the page: another page's copy of it stays as it came
    route = "GET /rename/{id}",
    handler = function(req)
      local res = agg.fetch_all { item = product(req.params.id) }
      res.item.data.name = "renamed"
      return agg.page(res)
    end,
  },
  { -- one item with a short timeout of its own
    route = "GET /hurry/{id}",
    handler = function(req)
      return agg.page(agg.fetch_all { item = product(req.params.id, { timeout_ms = 50 }) })
    end,
  },
  { -- the function form: the merged request and the split are the script's; the answer is a map
    route = "GET /prices/{a}/{b}",
    handler = function(req)
      local function price(id)
        return { "prices", "/prices", batch = {
          key = id, window_ms = 5,
          request = function(keys) return "/prices/lookup?skus=" .. table.concat(keys, "+") end,
          split = function(data) return data.prices end,
        } }
      end
      return agg.page(agg.fetch_all { a = price(req.params.a), b = price(req.params.b) })
    end,
  },
  { -- the template form, with the answer's list under "items" and the key in "sku"
    route = "GET /skus/{a}/{b}",
    handler = function(req)
      local function sku(s)
        return { "catalog", "/by-sku/{keys}", batch = { key = s, sep = ";", items = "items", match = "sku" } }
      end
      return agg.page(agg.fetch_all { a = sku(req.params.a), b = sku(req.params.b) })
    end,
  },
}
