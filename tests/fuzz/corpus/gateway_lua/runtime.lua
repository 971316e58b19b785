-- Upstreams for the runtime specs (nothing listens: specs stub every call).
return {
  listen = { { port = 18080 } },
  deadline_ms = 1000,
  upstreams = {
    a = { url = "http://127.0.0.1:1", timeout_ms = 500 },
    b = { url = "http://127.0.0.1:2", timeout_ms = 500 },
    c = { url = "http://127.0.0.1:3/base", timeout_ms = 500, max_body_bytes = 1000 },
  },
}
