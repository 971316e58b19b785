-- The Lua↔C contract (lua/agg/contract.lua): the spec harness's transport (agg.testing) gives and
-- takes exactly the functions and table fields the contract declares, in every kind of answer.
-- The C worker is held to the same declaration by gateway/tests/worker/test_contract.c, so the
-- fake and the real transport cannot drift apart unnoticed.
local testing = require "agg.testing"
local contract = require "agg.contract"
local rt = require "agg.runtime"

local DIR = "spec/fixtures/resilience"

describe("the spec harness's transport keeps agg.contract", function()
  local real = {}
  local problems, seen, core_seen

  local function record(kind, t, only_declared)
    seen[kind] = (seen[kind] or 0) + 1
    local ok, err = contract.check(kind, t, only_declared)
    if not ok then problems[#problems + 1] = err end
  end

  local function check_args(name, decl, n)
    if n ~= #decl.args then
      problems[#problems + 1] = ("%s: called with %d arguments, the contract declares %d (%s)")
        :format(name, n, #decl.args, table.concat(decl.args, ", "))
    end
  end

  before_each(function()
    problems, seen, core_seen = {}, {}, nil
    for _, name in ipairs { "init", "start", "on_call", "on_timer", "abort", "on_redis" } do real[name] = rt[name] end
    rt.init = function(core, ups, eps, token_exchange)
      core_seen = core
      local wrapped = {}
      for name, f in pairs(core) do
        local decl = contract.core[name]
        if decl == nil then
          problems[#problems + 1] = "core." .. name .. " is not in the contract"
          wrapped[name] = f
        elseif type(f) ~= "function" then
          wrapped[name] = f
        else
          wrapped[name] = function(...)
            check_args("core." .. name, decl, select("#", ...))
            if name == "call" then
              local args = {}
              for i, arg in ipairs(decl.args) do args[arg] = (select(i, ...)) end
              record("call_args", args)
            end
            if name == "respond" then record("response", (select(2, ...))) end
            if name == "upstream_counters" then record("counters", (select(2, ...)), false) end
            if name == "endpoint_state" then record("endpoint_state", (select(3, ...))) end
            return f(...)
          end
        end
      end
      return real.init(wrapped, ups, eps, token_exchange)
    end
    rt.start = function(...)
      check_args("runtime.start", contract.runtime.start, select("#", ...))
      local args = {}
      for i, arg in ipairs(contract.runtime.start.args) do args[arg] = (select(i, ...)) end
      record("start_args", args)
      return real.start(...)
    end
    rt.on_call = function(...)
      check_args("runtime.on_call", contract.runtime.on_call, select("#", ...))
      local answer = select(6, ...)
      if answer ~= nil then record("answer", answer) end
      return real.on_call(...)
    end
    rt.on_timer = function(...)
      check_args("runtime.on_timer", contract.runtime.on_timer, select("#", ...))
      return real.on_timer(...)
    end
    rt.on_redis = function(...)
      check_args("runtime.on_redis", contract.runtime.on_redis, select("#", ...))
      return real.on_redis(...)
    end
    rt.abort = function(...)
      check_args("runtime.abort", contract.runtime.abort, select("#", ...))
      return real.abort(...)
    end
  end)

  after_each(function()
    for name, f in pairs(real) do rt[name] = f end
  end)

  it("offers every core function the contract requires, and nothing it does not declare", function()
    local gw = testing.gateway { dir = DIR }
    gw:stub("events", "/events/*", { json = { name = "Concert" } })
    gw:stub("recs", "/recs/*", { json = { items = {} } })
    gw:get("/concert/1")
    assert.is_table(core_seen)
    for name, decl in pairs(contract.core) do
      if not decl.optional then
        assert.is_not_nil(core_seen[name], "the harness has no core." .. name)
      end
    end
    assert.same({}, problems)
  end)

  it("passes only declared fields across, with their declared types, in every kind of answer", function()
    local gw = testing.gateway { dir = DIR }
    gw:stub("events", "/events/*", { json = { name = "Concert" }, latency_ms = 20 })
    gw:stub("recs", "/recs/*", { fault = "hang" })
    gw:get("/concert/1")                                   -- ok, and a timeout
    gw:stub("recs", "/recs/*", { fault = "non_json" })
    gw:get("/concert/2")                                   -- a body that is not JSON
    gw:stub("recs", "/recs/*", { status = 500, json = { e = 1 } })
    gw:get("/concert/3")                                   -- an HTTP error
    gw:stub("recs", "/recs/*", { fault = "refuse" })
    gw:get("/concert/4")                                   -- a failed call
    gw:stub("slow", "/s", { { json = { from = "first" }, latency_ms = 500 }, { json = { from = "hedge" }, latency_ms = 10 } })
    gw:get("/hedged")                                      -- a hedge, and a cancelled attempt
    gw:stub("flaky", "/f", { status = 503, json = { error = "busy" } })
    gw:get("/flaky")                                       -- retries on a timer
    gw:get("/must-recs/1")                                 -- a failed page (problem details)
    gw:get("/nowhere")                                     -- no route: no crossing at all
    assert.same({}, problems)
    for _, kind in ipairs { "call_args", "answer", "start_args", "response" } do
      assert.is_true((seen[kind] or 0) > 0, kind .. " never crossed")
    end
  end)

  it("keeps it with upstream groups (the call's endpoint) and the edge (runtime.start's user, then core.request_user)", function()
    local endpoints = {}
    local gw = testing.gateway { dir = "spec/fixtures/groups" }
    gw:stub("product", "/p/*", { json = { id = 1 } })
    gw:stub("product#2", "/p/*", { json = { id = 2 } })
    for i = 1, 6 do assert.equal(200, gw:get("/product/" .. i).status) end
    for _, c in ipairs(gw:calls("product")) do endpoints[c.endpoint] = true end
    assert.is_true(endpoints[1] and endpoints[2], "both endpoints of the group were called")
    local published = gw:report_stats()                     -- core.endpoint_state, once a second
    assert.is_true((seen.endpoint_state or 0) > 0, "endpoint_state never crossed")
    local calls = 0
    for _, eps in pairs(published.endpoints) do
      for _, st in pairs(eps) do calls = calls + st.calls end
    end
    assert.is_true(calls >= 6, "the endpoints' calls were published: " .. calls)
    local edge = testing.gateway { dir = "spec/fixtures/edge" }
    edge:stub("orders", "/orders/*", { json = { id = 1 } })
    edge:stub("inventory", "/stock/*", { json = { inStock = 3 } })
    edge:stub("catalog", "/items/*", { json = { name = "Sneaker" } })
    edge:stub("@token_exchange", "POST", "/token", { json = { access_token = "xt-1", token_type = "Bearer",
                                                               expires_in = 120 } })
    local page = edge:get("/orders/1", { user = { sub = "alice", scopes = { "orders:read" },
                                               aud = { "aggway", "orders" } } })
    assert.equal(200, page.status)
    assert.equal("alice", page.json.who.data)
    assert.same({}, problems)
  end)

  it("fails a table with a field the contract does not declare, or of the wrong type", function()
    assert.is_false((contract.check("answer", { headers = "", body = "x", detial = "x" })))
    assert.is_false((contract.check("answer", { headers = "", body = 200 })))
    local start = { rid = 1, endpoint = 1, method = "GET", path = "/p", params = {}, query = "a=1" }
    assert.is_true((contract.check("start_args", start)))
    start.headers = "" -- left to core.request_headers
    assert.is_false((contract.check("start_args", start)))
    start.headers = nil
    start.user = true -- core.request_user then
    assert.is_true((contract.check("start_args", start)))
    start.user = "alice"
    assert.is_false((contract.check("start_args", start)))
    start.user = { sub = "a" }
    assert.is_false((contract.check("start_args", start)))
    start.user, start.token = true, "t"
    assert.is_false((contract.check("start_args", start)))
    start.token, start.query = nil, 42
    assert.is_false((contract.check("start_args", start)))
    local call = { rid = 1, upstream = 1, method = "GET", path = "/", headers = false, body = false,
                   timeout_ms = 100, decode = true, section = "s", attempt = 1, endpoint = 2 }
    assert.is_true((contract.check("call_args", call)))
    call.endpoint = "2"
    assert.is_false((contract.check("call_args", call)))
  end)
end)
