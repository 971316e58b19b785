-- Upstreams for the merged-call specs (spec/merge_spec.lua); nothing listens, specs stub calls.
return {
  listen = { { port = 18082 } },
  deadline_ms = 1000,
  upstreams = {
    catalog = { url = "http://127.0.0.1:1", timeout_ms = 300,
                breaker = { failures = 3, open_s = 30, half_open_probes = 1 } },
    prices  = { url = "http://127.0.0.1:2", timeout_ms = 300, breaker = false },
    grouped = { endpoints = { "http://127.0.0.1:3", "http://127.0.0.1:4" }, timeout_ms = 300, breaker = false },
  },
}
