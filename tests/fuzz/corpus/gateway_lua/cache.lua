-- Upstreams for the cache specs (spec/cache_spec.lua); nothing listens, specs stub calls.
return {
  listen = { { port = 18082 } },
  deadline_ms = 2000,
  redis = { url = "redis://127.0.0.1:6379/0", timeout_ms = 5 },
  cache = { memory_bytes = 1024 * 1024, redis = true },
  upstreams = {
    product = { url = "http://127.0.0.1:1", timeout_ms = 500, breaker = false,
                cache = { ttl_s = 60, swr_s = 30, stale_if_error_s = 300 } },
    stock   = { url = "http://127.0.0.1:2", timeout_ms = 500, breaker = false },
    cc      = { url = "http://127.0.0.1:3", timeout_ms = 500, breaker = false, cache = {} },
  },
}
