-- agg.problem: RFC 9457 problem details for failed calls, failed pages and gateway errors.
--
-- A problem is a plain table { type, title, status, detail } whose keys encode in that order.
-- `type` is a URN naming the kind of failure; clients switch on it, people read `title`.
local json = require "agg.json"

local M = {}

local PROBLEM_MT = json.ordered({ "type", "title", "status", "detail", "sections" }, "agg.problem")
local PREFIX = "urn:aggway:problem:"

--- Builds a problem table.
-- @param kind   short kind name ("upstream-timeout"); becomes the `type` URN
-- @param title  one human sentence
-- @param status HTTP status that best describes it (number)
-- @param detail optional longer text (string or nil)
function M.new(kind, title, status, detail)
  return setmetatable({ type = PREFIX .. kind, title = title, status = status, detail = detail }, PROBLEM_MT)
end

--- Returns the kind part of a problem's type ("upstream-timeout"), or nil.
function M.kind(p)
  local t = type(p) == "table" and p.type
  return type(t) == "string" and t:sub(#PREFIX + 1) or nil
end

-- How each transport outcome of a call is described. `timeout` outcomes map to 504 so that a
-- required section that timed out fails the page with 504 (DESIGN §2.2).
local OUTCOMES = {
  refused         = { "upstream-unreachable", "%s: could not connect to upstream %s", 502 },
  connect_timeout = { "upstream-timeout", "%s: connecting to upstream %s timed out", 504 },
  timeout         = { "upstream-timeout", "%s did not answer in time", 504 },
  deadline        = { "deadline-exceeded", "%s was not called: the request deadline had passed", 504 },
  reset           = { "upstream-bad-response", "%s: upstream %s reset the connection", 502 },
  truncated       = { "upstream-bad-response", "%s: upstream %s sent an incomplete response", 502 },
  bad_response    = { "upstream-bad-response", "%s: upstream %s sent an invalid HTTP response", 502 },
  too_large       = { "upstream-bad-response", "%s: upstream %s sent a body over its size limit", 502 },
  tls             = { "upstream-tls", "%s: the TLS handshake with upstream %s failed", 502 },
  overload        = { "upstream-overloaded", "%s: upstream %s has no free connection", 503 },
  bad_request     = { "invalid-call", "%s: the call to upstream %s has invalid characters in its path or headers", 502 },
  bad_json        = { "upstream-bad-json", "%s: upstream %s sent a body that is not valid JSON", 502 },
  cancelled       = { "call-cancelled", "%s: the call to upstream %s was cancelled", 504 },
  -- the gateway's own side (out of descriptors or local ports): not the upstream's failure
  ["local"]       = { "gateway-overloaded", "%s: the gateway had no free socket to call upstream %s", 503 },
}

--- Problem for a call that failed in transport (outcome name from the upstream client).
function M.for_outcome(outcome, section, upstream, detail)
  local o = OUTCOMES[outcome] or OUTCOMES.bad_response
  return M.new(o[1], o[2]:format(section, upstream), o[3], detail)
end

--- Problem for a call whose upstream answered with a non-2xx HTTP status. 404 and 410 keep their
-- status so that a required section passes them through (DESIGN §2.2); other statuses are 502.
function M.for_http_status(code, section, upstream)
  if code == 404 then
    return M.new("upstream-not-found", section .. ": upstream " .. upstream .. " answered 404 Not Found", 404)
  elseif code == 410 then
    return M.new("upstream-gone", section .. ": upstream " .. upstream .. " answered 410 Gone", 410)
  end
  return M.new("upstream-error", section .. ": upstream " .. upstream .. " answered HTTP " .. code, 502,
               "upstream status " .. code)
end

--- Problem for a dependent call whose dependency failed; carries the cause (DESIGN §2.1).
function M.dependency_failed(section, dep, cause)
  local why = tostring(cause and (cause.title or cause.type) or "failed")
  -- the cause's title usually names its section already ("product: upstream product timed out")
  if why:sub(1, #dep + 2) ~= dep .. ": " then why = dep .. ": " .. why end
  return M.new("dependency-failed", section .. " was not called: " .. dep .. " failed",
               cause and cause.status or 502, why)
end

--- Problem for a script error inside a section's continuation. The detail never carries the
-- Lua message (it is logged with file:line instead).
function M.script_error(section)
  return M.new("script-error", (section and (section .. ": ") or "") .. "the page script failed", 500,
               "the error was logged by the gateway")
end

return M
