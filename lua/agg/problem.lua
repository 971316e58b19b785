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

-- Problems a stale copy must not answer (agg.cache, stale-if-error): the user's credential was
-- refused, so the user's cached data must not outlive it. A mark kept beside the problem (weak
-- keys), not a member of it: a problem's members go to the client.
local no_stale = setmetatable({}, { __mode = "k" })

--- Marks problem p as one a stale copy never answers (agg.identity: a refused token); returns p.
function M.refuse_stale(p)
  no_stale[p] = true
  return p
end

--- True when problem p was marked by refuse_stale.
function M.stale_refused(p)
  return no_stale[p] == true
end

--- Returns the kind part of a problem's type ("upstream-timeout"), or nil.
function M.kind(p)
  local t = type(p) == "table" and p.type
  return type(t) == "string" and t:sub(#PREFIX + 1) or nil
end

-- How each transport outcome of a call is described to the client: a type and a title per kind
-- of failure that never change from one occurrence to the next (RFC 9457 §3.1.3), and a detail
-- that names the section and the upstream by their names in the scripts. What the transport said
-- (the upstream's URL and address, errno text, the TLS library's reason) is internal: it goes to
-- the gateway's log, the call's span and the waterfall, never to the client. `timeout` outcomes
-- map to 504 so that a required section that timed out fails the page with 504 (DESIGN §2.2).
local OUTCOMES = {
  refused         = { "upstream-unreachable", "the upstream could not be reached", 502 },
  connect_timeout = { "upstream-timeout", "the upstream did not accept a connection in time", 504 },
  timeout         = { "upstream-timeout", "the upstream did not answer in time", 504 },
  deadline        = { "deadline-exceeded", "the request deadline had passed before the call", 504 },
  reset           = { "upstream-bad-response", "the upstream closed the connection before answering", 502 },
  truncated       = { "upstream-bad-response", "the upstream's answer was incomplete", 502 },
  bad_response    = { "upstream-bad-response", "the upstream sent an invalid HTTP response", 502 },
  too_large       = { "upstream-too-large", "the upstream's answer was over its size limit", 502 },
  tls             = { "upstream-tls", "the secure connection to the upstream failed", 502 },
  overload        = { "upstream-overloaded", "the upstream is at its limit of calls (connections, queue or rate)", 503 },
  bad_request     = { "invalid-call", "the call was not sent: its path or headers are invalid", 502 },
  bad_json        = { "upstream-bad-json", "the upstream's answer is not valid JSON", 502 },
  cancelled       = { "call-cancelled", "the call was cancelled", 504 },
  -- the gateway's own side (out of descriptors or local ports): not the upstream's failure
  ["local"]       = { "gateway-overloaded", "the gateway had no free socket for the call", 503 },
}

--- The title of a kind of failure (for agg.runtime's circuit-open and specs): see OUTCOMES.
M.CIRCUIT_OPEN_TITLE = "the upstream is failing; calls to it are paused"

--- "section product, upstream product" (the names the script uses): how a problem's detail names
-- the call it is about.
local function names(section, upstream)
  return ("section %s, upstream %s"):format(tostring(section), tostring(upstream))
end
M.names = names

--- Problem for a call that failed in transport (outcome name from the upstream client). The
-- transport's own text is not taken: the caller logs it (agg.runtime) and the span keeps it.
function M.for_outcome(outcome, section, upstream)
  local o = OUTCOMES[outcome] or OUTCOMES.bad_response
  return M.new(o[1], o[2], o[3], names(section, upstream))
end

--- Problem for a call whose upstream answered with a non-2xx HTTP status. 404 and 410 keep their
-- status so that a required section passes them through (DESIGN §2.2); other statuses are 502.
function M.for_http_status(code, section, upstream)
  if code == 404 then
    return M.new("upstream-not-found", "the upstream answered 404 Not Found", 404, names(section, upstream))
  elseif code == 410 then
    return M.new("upstream-gone", "the upstream answered 410 Gone", 410, names(section, upstream))
  end
  return M.new("upstream-error", "the upstream answered with an error status", 502,
               names(section, upstream) .. ": HTTP status " .. code)
end

--- Problem for a dependent call whose dependency failed; carries the cause's kind and title
-- (DESIGN §2.1).
function M.dependency_failed(section, dep, cause)
  local why = tostring(cause and (cause.title or cause.type) or "failed")
  return M.new("dependency-failed", "a section this one depends on failed", cause and cause.status or 502,
               ("section %s was not called: %s failed: %s"):format(tostring(section), tostring(dep), why))
end

--- Problem for a call whose retry was not sent because the upstream's retry budget is spent
-- (Gateway API retryConstraint: 503); cause: the failure it would have retried.
function M.retry_budget_exhausted(section, upstream, cause)
  return M.new("retry-budget-exhausted", "the upstream failed and its retry budget is spent", 503,
               names(section, upstream) .. ": " .. tostring(cause and (cause.title or cause.type) or "failed"))
end

--- Problem for a section cancelled because required section `failed` failed (fail fast).
function M.cancelled_by(section, failed)
  return M.new("call-cancelled", "the call was cancelled", 504,
               ("section %s was cancelled: required section %s failed"):format(tostring(section), tostring(failed)))
end

--- Problem for a script error inside a section's continuation. The detail never carries the
-- Lua message (it is logged with file:line instead).
function M.script_error(section)
  return M.new("script-error", "the page script failed", 500,
               (section and ("section " .. section .. ": ") or "") .. "the error was logged by the gateway")
end

return M
