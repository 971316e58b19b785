-- Limits fixture (spec/limits_spec.lua): a rate, a daily quota per client header, a default rule.
return {
  listen = { { port = 8080 } },
  max_in_flight = 2,
  redis = { url = "redis://127.0.0.1:6379/0", timeout_ms = 5 },
  -- the keys of /by-app and /by-user come from the edge: those endpoints ask for an API key and a
  -- JWT; every other endpoint is open
  auth = {
    jwt = { issuer = "https://id.spec", audiences = { "aggway" }, jwks_file = "keys/jwks.json" },
    api_keys = { file = "keys/api-keys.json" },
    default = "none",
  },
  limits = {
    headers = true,
    default = { "per-ip" },
    rules = {
      { name = "per-ip", key = "ip", rate = 10, per_s = 1, burst = 5 },
      { name = "daily", key = { header = "x-client" }, quota = 3, window = "day" },
      { name = "monthly", key = "route", quota = 4, window = "month" },
      { name = "per-app", key = "api_key", quota = 2, window = "hour" },
      { name = "per-user", key = "user", rate = 1, per_s = 10, burst = 1 },
      -- counted in Redis (shared by every gateway using it), each with its on_redis_error
      { name = "cluster-local", key = "route", rate = 1, per_s = 60, burst = 2, store = "redis" },
      { name = "cluster-allow", key = "route", rate = 1, per_s = 60, burst = 2, store = "redis",
        on_redis_error = "allow" },
      { name = "cluster-deny", key = "route", rate = 1, per_s = 60, burst = 2, store = "redis",
        on_redis_error = "deny" },
      -- function keys: a tenant from a header, unless the path says it is public (nil: not applied)
      { name = "per-tenant", quota = 2, window = "day",
        key = function(req)
          if req.path:match("^/tenant/public") then return nil end
          return (req.headers["x-tenant"] or "anonymous") .. "@" .. req.method
        end },
      { name = "broken-key", rate = 1, per_s = 60, burst = 1,
        key = function(req) if req.query == "number" then return 42 end; error("no tenant here") end },
    },
  },
  upstreams = {
    slow = { url = "http://127.0.0.1:9001", timeout_ms = 500 },
  },
}
