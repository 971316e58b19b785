-- The script time limit in the spec harness (nothing listens: specs stub every call).
return {
  listen = { { port = 18080 } },
  deadline_ms = 1000,
  script_time_limit_ms = 50,
  upstreams = {
    a = { url = "http://127.0.0.1:1", timeout_ms = 500 },
  },
}
