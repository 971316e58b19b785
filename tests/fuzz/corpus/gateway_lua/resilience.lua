-- Upstreams for the resilience specs (spec/resilience_spec.lua); nothing listens, specs stub calls.
return {
  listen = { { port = 18081 } },
  deadline_ms = 5000,
  upstreams = {
    events = { url = "http://127.0.0.1:1", timeout_ms = 1000, breaker = false },
    recs   = { url = "http://127.0.0.1:2", timeout_ms = 1000,
               breaker = { failures = 5, open_s = 30, half_open_probes = 1 } },
    flaky  = { url = "http://127.0.0.1:3", timeout_ms = 300, breaker = false,
               retry = { attempts = 3, on = { 502, 503, 504 }, budget_percent = 20, min_retries = 3, backoff_ms = 20 } },
    slow   = { url = "http://127.0.0.1:4", timeout_ms = 1000, breaker = false, hedge = { after = 50, max_percent = 5 } },
    slow95 = { url = "http://127.0.0.1:6", timeout_ms = 1000, breaker = false, hedge = { after = "p95", max_percent = 50 } },
    shared = { url = "http://127.0.0.1:5", timeout_ms = 100, breaker = false },
  },
}
