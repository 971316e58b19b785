-- The demo gateway: three upstream services run by tools/demo (aggway-mock with tools/mock/demo.json).
return {
  listen = { { port = 8080 } },
  workers = "auto",
  deadline_ms = 1000,
  upstreams = {
    product   = { url = "http://127.0.0.1:9001", timeout_ms = 150, connect_timeout_ms = 50 },
    reviews   = { url = "http://127.0.0.1:9002", timeout_ms = 100 },
    inventory = { url = "http://127.0.0.1:9003", timeout_ms = 100 },
  },
}
