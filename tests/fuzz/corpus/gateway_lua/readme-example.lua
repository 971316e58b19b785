return {
  listen  = { { port = 8080 }, { port = 8443, tls = { cert = "tls/cert.pem", key = "tls/key.pem" } } },
  admin   = { port = 9090, host = "127.0.0.1" },  -- /healthz /readyz /metrics /routes /waterfall (default: none)
  access_log = "logs/access.log",    -- or "stderr"; false or absent: off (the default)
  workers = "auto",                  -- one per core, or a number
  deadline_ms = 1000,                -- default request deadline
  max_request_body_bytes = 1048576,  -- larger request bodies get 413
  shutdown_grace_ms = 10000,         -- SIGTERM/SIGINT: how long requests in flight may finish
  script_time_limit_ms = 1000,       -- a script running this long without waiting for a call is
                                     -- stopped (10 to 600000; see "Script time limit")
  tracing = {                        -- absent or false: spans are not exported (traceparent still is)
    otlp_http = "http://127.0.0.1:4318/v1/traces",  -- OTLP/HTTP collector (http:// only)
    service_name = "aggway",         -- resource attribute service.name ("aggway")
    timeout_ms = 2000,               -- one export at most: connect, send, status line (2000)
  },
  upstreams = {
    product = {
      url = "http://127.0.0.1:9001",   -- scripts name "product", never the URL; a path prefix is kept
      timeout_ms = 150,                -- default call timeout (1000)
      connect_timeout_ms = 50,         -- (100)
      idle_timeout_ms = 60000,         -- idle keep-alive connections close after this (60000)
      max_connections = 64,            -- per worker (64)
      max_pending = 256,               -- calls waiting for a connection, per worker; beyond: overload (256)
      max_body_bytes = 8388608,        -- larger answers fail the call at once (8 MiB)
    },
    billing = {
      url = "https://billing.internal:8443/v1",   -- HTTPS: TLS 1.2 or later, port 443 by default
      tls = {
        ca_file = "tls/internal-ca.pem",  -- PEM bundle of the CAs to trust (default: the system trust store)
        server_name = "billing.internal", -- sent as SNI and checked against the certificate (default: the URL host)
        verify = true,                    -- (true) false accepts any certificate, with a warning at load
      },
    },
  },
}
