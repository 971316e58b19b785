-- The Japanese dashboard (examples/dashboard): the user's profile and their latest posts.
return {
  listen = { { port = 8080 } },
  upstreams = {
    users = { url = "http://127.0.0.1:9201", timeout_ms = 150 },
    posts = { url = "http://127.0.0.1:9202", timeout_ms = 200 },
  },
}
