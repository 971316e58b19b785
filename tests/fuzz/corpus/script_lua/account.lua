-- GET /account/{id}: the product page of a signed-in customer. `auth = "jwt"`: the edge checks the
-- bearer token (signature against the identity provider's JWKS, issuer, audience, expiry) before
-- this script runs; without a valid one the answer is 401 with WWW-Authenticate: Bearer (RFC 6750)
-- and a problem body (RFC 9457). tools/demo starts the identity provider (tools/mock-auth) and
-- prints a token to try it with.
local agg = require "agg"

return {
  route = "GET /account/{id:[0-9]+}",
  auth = "jwt",
  handler = function(req)
    local id = req.params.id
    local res = agg.fetch_all {
      product   = { "product", "/products/" .. id, timeout_ms = 150, required = true },
      inventory = { "inventory", "/stock/" .. id, timeout_ms = 100 },
    }
    res.customer = { sub = req.user.sub, scopes = req.user.scopes }
    return agg.page(res)
  end,
}
