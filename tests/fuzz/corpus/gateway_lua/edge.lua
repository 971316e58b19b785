-- Fixture of spec/edge_spec.lua: a JWT-protected folder whose upstreams take the user's identity.
return {
  listen = { { port = 18080 } },
  auth = {
    jwt = { issuer = "https://id.spec", audiences = { "aggway" }, jwks_file = "keys/jwks.json" },
    default = "jwt",
  },
  token_exchange = { url = "http://127.0.0.1:19500/token", client_id = "aggway",
                     client_secret_file = "keys/te-secret", timeout_ms = 300 },
  upstreams = {
    orders    = { url = "http://127.0.0.1:19001", identity = "forward", audience = "orders" },
    inventory = { url = "http://127.0.0.1:19002", identity = "exchange", audience = "inventory" },
    catalog   = { url = "http://127.0.0.1:19003" },
  },
}
