-- agg.health: active health checks of an upstream's endpoints (gateway.lua `health = { path,
-- every_s, timeout_ms, healthy_after, unhealthy_after, expect_status }`; docs/operations.md
-- "Upstream groups"). Each worker probes each endpoint of each health-checked upstream itself, on
-- its own loop and off any request's path, as it keeps its own outlier ejection (DESIGN §9:
-- ejection stays per worker): a GET of `path` every `every_s`, one probe per endpoint at a time,
-- bounded by `timeout_ms` and by the upstream's pool (max_body_bytes, max_connections), so a
-- health endpoint that hangs, resets or answers a huge body costs one failed probe, never a
-- blocked worker. `unhealthy_after` failed probes in a row take the endpoint out of service,
-- `healthy_after` passing ones put it back (agg.group.set_health: the group's ejection limits
-- hold for both kinds of ejection), and `healthy_after` passing probes since an outlier ejection
-- began end it early (agg.group.end_ejection).
--
-- Probes are started from runtime.report_stats(true), which the worker calls once a second on
-- its current generation only: a generation that is no longer current stops probing, and no timer
-- keeps it alive. A probe is core.call with request id 0 (no request: no span, not in the
-- upstream's call metrics).
local group = require "agg.group"

local M = {}

local core, hooks
local checked = {}  -- one per health-checked upstream: { name, index, policy, every_ms, eps = { per endpoint } }

local HEADERS = { "user-agent", "aggway-health-check" }

--- Binds the transport, the upstream table (name -> the loader's entry) and the exchange's hooks
-- ({ register_call(id, fn) }); probing starts at the next tick. State of a previous binding is
-- forgotten (its probes' answers go nowhere).
function M.bind(transport, ups, h)
  core, hooks, checked = transport, h, {}
  for name, up in pairs(ups or {}) do
    if type(up) == "table" and up.health and up.endpoints then
      checked[#checked + 1] = { name = name, index = up.index, policy = up.health, every_ms = up.health.every_s * 1000,
                                eps = false }
    end
  end
  table.sort(checked, function(a, b) return a.index < b.index end)
end

-- The probe's verdict: passing when the endpoint answered with an expected status.
local function passed(policy, outcome, http_status)
  if outcome ~= "ok" then return false end
  if policy.expect_status then return policy.expect_status[http_status] == true end
  return http_status >= 200 and http_status < 300
end

local function on_probe(c, i, st, outcome, http_status, detail)
  st.busy = false
  local g = group.group_of(c.name)
  local e = g.eps[i]
  if st.e ~= e then return end -- the slot has another address now: this answer is about the old one
  e.probes = e.probes + 1
  local now = core.now()
  if passed(c.policy, outcome, http_status) then
    st.bad = 0
    st.ok = st.ok + 1
    if st.ok >= c.policy.healthy_after then group.set_health(g, i, true) end
    -- an outlier ejection ends once healthy_after probes passed since it began
    if e.until_ms > now and e.ejected_ms then
      if st.ejected_ms ~= e.ejected_ms then st.ejected_ms, st.after = e.ejected_ms, 0 end
      st.after = st.after + 1
      if st.after >= c.policy.healthy_after then group.end_ejection(g, i) end
    end
  else
    e.probe_failures = e.probe_failures + 1
    st.ok = 0
    st.bad = st.bad + 1
    if st.bad >= c.policy.unhealthy_after then
      local why = outcome == "ok" and ("status " .. http_status) or (outcome .. (detail and (": " .. detail) or ""))
      group.set_health(g, i, false, why)
    end
  end
end

-- Starts the probe of endpoint i of upstream c.
local function probe(c, i, st, now)
  st.next_ms = now + c.every_ms
  local ok, id = pcall(core.call, 0, c.index, "GET", c.policy.path, HEADERS, nil, c.policy.timeout_ms, false,
                       "health", 1, false, i)
  if not ok then return end -- the pool is closing (a reload under way): the next tick tries again
  st.busy = true
  hooks.register_call(id, function(outcome, http_status, _, _, _, _, detail)
    on_probe(c, i, st, outcome, http_status, detail)
  end)
end

--- Probes every endpoint whose turn has come (the worker's once-a-second tick). The first probe
-- of an endpoint comes at a random point of its first interval, so workers and endpoints do not
-- probe in step.
function M.tick()
  if not core then return end
  local now = core.now()
  for _, c in ipairs(checked) do
    if not c.eps then
      c.eps = {}
      for i = 1, #group.group_of(c.name).eps do
        c.eps[i] = { e = false, busy = false, ok = 0, bad = 0, ejected_ms = false, after = 0,
                     next_ms = now + math.floor(core.random() * c.every_ms) }
      end
    end
    local eps = group.group_of(c.name).eps
    for i, st in ipairs(c.eps) do
      local e = eps[i]
      if st.e ~= e then -- a new address in this slot (agg.group.sync): its checks start afresh
        st.e, st.ok, st.bad, st.ejected_ms, st.after = e, 0, 0, false, 0
      end
      if not st.busy and not e.gone and now >= st.next_ms then probe(c, i, st, now) end
    end
  end
end

return M
