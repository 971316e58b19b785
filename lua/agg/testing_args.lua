-- agg.testing_args: what the spec harness (agg.testing) accepts, checked like the mock's config:
-- the options of testing.gateway, gw:get/send/request and stub answers, and the errors they
-- raise at the spec's own line.
local str_find = string.find
local config = require "agg.config"

local M = {}

-- What the harness accepts, checked like the mock's config (tools/mock): an unknown option, a
-- value of the wrong type or an unknown fault is an error naming it, never silently ignored
-- (a stub's `latncy_ms = 500` would otherwise answer at 0 ms).
local GATEWAY_OPTIONS = { dir = "string", clock = "number", redis = "table", utc_ms = "number" }
local REQUEST_OPTIONS = { headers = "table", body = "string", json = true, user = "table", ip = "string",
                          tls = "boolean" }
local ANSWER_OPTIONS = { status = "number", headers = "table", json = true, body = "string", latency_ms = "number",
                         fault = "string" }
local FAULTS = { hang = true, drip = true, refuse = true, tls = true, reset = true, short = true, non_json = true,
                 invalid_utf8 = true, huge = true }

local sorted_names = config.names

-- Raises msg at the line of the spec that called the harness (the first frame outside the
-- harness's files, lua/agg/testing*.lua).
local function raise(msg)
  local l = 2
  while true do
    local info = debug.getinfo(l, "Sl")
    if not info then break end
    if not str_find(info.source, "agg/testing[%w_]*%.lua$") and info.currentline > 0 then
      error(("%s:%d: %s"):format(info.short_src, info.currentline, msg), 0)
    end
    l = l + 1
  end
  error(msg, 0)
end

-- Errors (at the spec's line) when opts has a key known does not list, or a value of the
-- wrong type. where names the function, like "gw:stub".
local function check_options(where, opts, known)
  if type(opts) ~= "table" then raise(("%s: options must be a table, got %s"):format(where, type(opts))) end
  for k, v in pairs(opts) do
    local want = known[k]
    if want == nil then
      raise(("%s: unknown option '%s'%s (%s)"):format(where, tostring(k), config.suggest(k, known), sorted_names(known)))
    end
    if want ~= true and type(v) ~= want then
      raise(("%s: option '%s' must be a %s, got %s"):format(where, k, want, type(v)))
    end
  end
end

-- Checks one stub answer.
local function check_answer(where, ans)
  check_options(where, ans, ANSWER_OPTIONS)
  if ans.fault ~= nil and not FAULTS[ans.fault] then
    raise(("%s: unknown fault '%s'%s (%s)"):format(where, ans.fault, config.suggest(ans.fault, FAULTS), sorted_names(FAULTS)))
  end
  if ans.latency_ms ~= nil and (ans.latency_ms < 0 or ans.latency_ms ~= ans.latency_ms) then
    raise(("%s: latency_ms must be a number of milliseconds >= 0"):format(where))
  end
  if ans.status ~= nil and (ans.status < 100 or ans.status > 599 or ans.status % 1 ~= 0) then
    raise(("%s: status must be an HTTP status code (100-599), got %s"):format(where, tostring(ans.status)))
  end
  if ans.json ~= nil and ans.body ~= nil then
    raise(("%s: give either json or body, not both"):format(where))
  end
end

M.GATEWAY_OPTIONS, M.REQUEST_OPTIONS = GATEWAY_OPTIONS, REQUEST_OPTIONS
M.sorted_names, M.raise, M.check_options, M.check_answer = sorted_names, raise, check_options, check_answer

return M
