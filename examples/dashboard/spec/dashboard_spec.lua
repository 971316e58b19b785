-- The dashboard (examples/dashboard/scripts/dashboard.lua): user required, posts optional, 250 ms.
--   aggway test -c examples/dashboard/scripts examples/dashboard/spec
local testing = require "agg.testing"

local USER = { id = "u1", displayName = "山田太郎", avatar = "https://img.example/u1.png", email = "taro@example.jp" }
local function posts(n)
  local items = {}
  for i = 1, n do items[i] = { id = i, text = "投稿 " .. i, likes = i * 3, createdAt = "2027-01-0" .. (i % 9 + 1), draft = false } end
  return { items = items }
end

describe("the dashboard", function()
  local gw
  before_each(function()
    gw = testing.gateway()
    gw:stub("users", "/users/u1", { json = USER, latency_ms = 30 })
    gw:stub("posts", "/users/u1/posts?limit=20", { json = posts(25), latency_ms = 90 })
  end)

  it("shows the user and at most twenty posts, with only the fields the screen draws", function()
    local page = gw:get("/dashboard/u1")
    assert.equal(200, page.status)
    assert.equal("山田太郎", page.json.user.data.displayName)
    assert.is_nil(page.json.user.data.email)
    assert.equal(20, #page.json.posts.data.items)
    assert.is_nil(page.json.posts.data.items[1].draft)
    assert.equal(90, page.elapsed_ms)
  end)

  it("keeps the 250 ms budget when posts are slow: the screen comes with the fallback", function()
    gw:stub("posts", "/users/u1/posts?limit=20", { fault = "hang" })
    local page = gw:get("/dashboard/u1")
    assert.equal(200, page.status)
    assert.equal("fallback", page.json.posts.status)
    assert.equal("posts will appear shortly", page.json.posts.data.notice)
    assert.equal(250, page.elapsed_ms) -- the budget, not posts' own 400 ms
  end)

  it("shows posts that answer late but inside the budget", function()
    gw:stub("posts", "/users/u1/posts?limit=20", { json = posts(2), latency_ms = 240 })
    local page = gw:get("/dashboard/u1")
    assert.equal("ok", page.json.posts.status)
    assert.equal(240, page.elapsed_ms)
  end)

  it("never waits past the budget, even for the required user", function()
    gw:stub("users", "/users/u1", { fault = "hang" })
    local page = gw:get("/dashboard/u1")
    assert.equal(504, page.status)
    assert.equal("section user: the upstream did not answer in time", page.json.detail)
    assert.equal(150, page.elapsed_ms) -- users' own timeout: the page does not wait for posts
  end)

  it("fails when the user service refuses, whatever the posts", function()
    gw:stub("users", "/users/u1", { status = 404 })
    local page = gw:get("/dashboard/u1")
    assert.equal(404, page.status)
    assert.equal("unavailable", page.json.sections.user.status)
  end)
end)
