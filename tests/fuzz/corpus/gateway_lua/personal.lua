-- A page with a personalised section (examples/personal): the catalogue is the same for everyone,
-- the "for you" list comes from a service that needs the caller's own token.
return {
  listen = { { port = 8080 } },
  auth = {
    -- keys/jwks.json: the identity provider's public keys (replace with yours, or use jwks_url)
    jwt = { issuer = "https://id.example", audiences = { "aggway" }, jwks_file = "keys/jwks.json" },
    default = "jwt",
  },
  upstreams = {
    catalog = { url = "http://127.0.0.1:9301", timeout_ms = 150 },
    -- the caller's token goes to this one only (its aud must name "foryou")
    foryou = { url = "http://127.0.0.1:9302", timeout_ms = 150, identity = "forward", audience = "foryou",
               forward_headers = { "accept-language" } },
  },
}
