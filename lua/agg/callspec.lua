-- agg.callspec: turns the call spec a script writes ({ "reviews", "/reviews", timeout_ms = 100 })
-- into the normalized form the scheduler sends, checking every option (DESIGN §2.1).
-- Mistakes are programming errors: they raise error() at the script's line.
local json = require "agg.json"

local M = {}

local OPTIONS = {
  timeout_ms = "number", required = "boolean", method = "string", query = "table",
  headers = "table", body = "string", decode = "boolean", fallback = true, json = true,
}
-- Options of the design that this version does not implement yet: refused by name, never ignored.
local NOT_YET = { cache = true, retry = true, hedge = true, collapse = true, forward_auth = true }
local METHODS = { GET = true, HEAD = true, POST = true, PUT = true, PATCH = true, DELETE = true, OPTIONS = true }

--- True when v looks like a call spec: a table whose [1] is an upstream name and [2] a path
-- ("/…"). The leading slash is what tells { "product", "/p/1" } from a list of sibling keys
-- { "product", "inventory" } in agg.fetch_then.
function M.is_spec(v)
  return type(v) == "table" and type(v[1]) == "string" and type(v[2]) == "string" and v[2]:byte(1) == 47
    and getmetatable(v) == nil
end

local function escape(s)
  return (tostring(s):gsub("[^%w%-%._~]", function(c) return string.format("%%%02X", c:byte()) end))
end

--- Encodes a query table ({ sku = "A 1", tag = { "x", "y" } }) as "sku=A%201&tag=x&tag=y", keys
-- sorted so the same table always gives the same URL.
function M.encode_query(q, level)
  local keys = {}
  for k in pairs(q) do
    if type(k) ~= "string" then error("call option 'query': keys must be strings", level) end
    keys[#keys + 1] = k
  end
  table.sort(keys)
  local out = {}
  for _, k in ipairs(keys) do
    local v = q[k]
    local list = type(v) == "table" and v or { v }
    for _, item in ipairs(list) do
      local t = type(item)
      if t ~= "string" and t ~= "number" and t ~= "boolean" then
        error("call option 'query': value of '" .. k .. "' must be a string, number, boolean or list of them", level)
      end
      out[#out + 1] = escape(k) .. "=" .. escape(item)
    end
  end
  return table.concat(out, "&")
end

--- Normalizes spec for the upstreams table (name -> { index, timeout_ms }). level is the error()
-- level that points at the script line. Returns { upstream, index, method, path, headers (flat
-- list name, value, …) or false, body or false, timeout_ms, decode, required, fallback }.
function M.normalize(spec, upstreams, level)
  level = level + 1
  if type(spec) ~= "table" then
    error("a call spec must be a table like { \"upstream\", \"/path\" }, got " .. type(spec), level)
  end
  local name, path = spec[1], spec[2]
  if type(name) ~= "string" then
    error("a call spec starts with the upstream name, like { \"product\", \"/products/1\" }", level)
  end
  local up = upstreams[name]
  if not up then
    local names = {}
    for n in pairs(upstreams) do names[#names + 1] = n end
    table.sort(names)
    error(("unknown upstream '%s' (gateway.lua declares: %s)"):format(name, table.concat(names, ", ")), level)
  end
  if type(path) ~= "string" or path:byte(1) ~= 47 then
    error(("call to '%s': the path must be a string starting with '/'"):format(name), level)
  end
  for k, v in pairs(spec) do
    if k ~= 1 and k ~= 2 then
      local want = OPTIONS[k]
      if want == nil then
        if NOT_YET[k] then
          error(("call to '%s': option '%s' is not supported by this version of aggway"):format(name, k), level)
        end
        error(("call to '%s': unknown option '%s'"):format(name, tostring(k)), level)
      end
      if want ~= true and type(v) ~= want then
        error(("call to '%s': option '%s' must be a %s, got %s"):format(name, k, want, type(v)), level)
      end
    end
  end
  -- the scheduler keeps its per-call state in this table too (ctx … ref): the fields are
  -- present from the start so the table never grows
  local n = {
    upstream = name, path = path, method = spec.method or "GET",
    timeout_ms = spec.timeout_ms or up.timeout_ms, decode = spec.decode ~= false,
    required = spec.required == true, fallback = spec.fallback,
    headers = false, body = false, ctx = false, section = false, group = false, chain = false,
    ref = false, body_ref = false, raw_headers = false,
  }
  if not METHODS[n.method] then
    error(("call to '%s': method '%s' is not one of GET HEAD POST PUT PATCH DELETE OPTIONS"):format(name, n.method), level)
  end
  if n.timeout_ms <= 0 or n.timeout_ms ~= n.timeout_ms then
    error(("call to '%s': timeout_ms must be a positive number of milliseconds"):format(name), level)
  end
  if spec.query then
    local q = M.encode_query(spec.query, level)
    if q ~= "" then n.path = path .. (path:find("?", 1, true) and "&" or "?") .. q end
  end
  local headers
  if spec.headers then
    headers = {}
    for k, v in pairs(spec.headers) do
      if type(k) ~= "string" or (type(v) ~= "string" and type(v) ~= "number") then
        error(("call to '%s': headers must map names to string values"):format(name), level)
      end
      headers[#headers + 1] = k:lower()
      headers[#headers + 1] = tostring(v)
    end
  end
  if spec.json ~= nil then
    if spec.body then error(("call to '%s': give either json or body, not both"):format(name), level) end
    local s, err = json.encode(spec.json)
    if not s then error(("call to '%s': option 'json' cannot be encoded: %s"):format(name, err), level) end
    n.body = s
    headers = headers or {}
    local has_ct = false
    for i = 1, #headers, 2 do if headers[i] == "content-type" then has_ct = true end end
    if not has_ct then
      headers[#headers + 1] = "content-type"
      headers[#headers + 1] = "application/json"
    end
  else
    n.body = spec.body or false
  end
  n.headers = headers or false
  return n
end

return M
