-- The demo gateway: three upstream services run by tools/demo (aggway-mock with tools/mock/demo.json).
return {
  listen = { { port = 8080 } },
  admin = { port = 9090 },            -- 127.0.0.1:9090: /waterfall /metrics /routes /readyz (tools/demo prints the links)
  workers = "auto",
  deadline_ms = 1000,
  -- who the caller is: tokens from the demo's identity provider (tools/mock-auth on 127.0.0.1:9500,
  -- which tools/demo starts), checked at the edge before any script. Pages are open unless their
  -- script asks for a token (account.lua: auth = "jwt").
  auth = {
    jwt = { issuer = "https://id.test", audiences = { "aggway" }, jwks_url = "http://127.0.0.1:9500/jwks" },
    default = "none",
  },
  upstreams = {
    product   = { url = "http://127.0.0.1:9001", timeout_ms = 150, connect_timeout_ms = 50 },
    reviews   = { url = "http://127.0.0.1:9002", timeout_ms = 100 },
    inventory = { url = "http://127.0.0.1:9003", timeout_ms = 100 },
  },
}
