-- GET /dashboard/{user}: the Japanese social app's home screen. The user is required (without it
-- there is no screen to draw); the posts are optional (the screen shows "posts will appear
-- shortly" from the fallback). The whole page has a 250 ms latency budget: whatever has not
-- answered by then is cut, so a slow posts service never makes the screen slow.
local agg = require "agg"

return {
  route = "GET /dashboard/{user}",
  deadline_ms = 250,
  handler = function(req)
    local id = req.params.user
    local res = agg.fetch_all {
      user = { "users", "/users/" .. id, required = true },
      -- posts may take their time (400 ms)… but never more than the page's budget
      posts = { "posts", "/users/" .. id .. "/posts", query = { limit = 20 }, timeout_ms = 400,
                fallback = { items = agg.array(), notice = "posts will appear shortly" } },
    }
    agg.shape(res.user, function(u) return agg.pick(u, { "id", "displayName", "avatar" }) end)
    agg.shape(res.posts, function(p)
      return { items = agg.map(agg.limit(p.items, 20), function(post)
                 return agg.pick(post, { "id", "text", "likes", "createdAt" })
               end), notice = p.notice }
    end)
    return agg.page(res)
  end,
}
