-- The Indonesian concert page (examples/concert): one set of services, three pages. Events answers
-- in the language the visitor asked for, so Accept-Language goes with every call to it.
return {
  listen = { { port = 8080 } },
  deadline_ms = 300,
  upstreams = {
    events          = { url = "http://127.0.0.1:9101", timeout_ms = 200, forward_headers = { "accept-language" } },
    tickets         = { url = "http://127.0.0.1:9102", timeout_ms = 150 },
    recommendations = { url = "http://127.0.0.1:9103", timeout_ms = 120 },
  },
}
