-- agg.url: percent-coding (RFC 3986 §2.1) and query strings, written once for the runtime, the
-- call specs, the script API (agg.escape, agg.unescape) and the spec harness.
local str_gmatch, str_gsub, str_match = string.gmatch, string.gsub, string.match
local M = {}

local function hex_byte(c) return ("%%%02X"):format(c:byte()) end
local function byte_of(h) return string.char(tonumber(h, 16)) end

--- s percent-encoded for a URL path segment or query value: every byte but the unreserved
-- characters A-Z a-z 0-9 - . _ ~ (RFC 3986 §2.3) becomes %XX.
function M.escape(s)
  return (str_gsub(tostring(s), "[^%w%-%._~]", hex_byte))
end

--- s with its %XX sequences decoded (a stray % stays as it is).
function M.unescape(s)
  return (str_gsub(tostring(s), "%%(%x%x)", byte_of))
end

--- A query component as HTML forms send it: "+" is a space, then %XX decoded.
function M.unescape_form(s)
  return (str_gsub(str_gsub(s, "+", " "), "%%(%x%x)", byte_of))
end

--- Parses a raw query string ("a=1&b=x+y&a=2", without "?") into { a = { "1", "2" }, b = "x y" }:
-- keys and values decoded as forms send them, a key given more than once gives a list in order,
-- a key without "=" the value "". nil or "" gives {}.
function M.parse_query(q)
  local t = {}
  if q == nil or q == "" then return t end
  for pair in str_gmatch(q, "[^&]+") do
    local k, v = str_match(pair, "^([^=]*)=?(.*)$")
    k, v = M.unescape_form(k), M.unescape_form(v)
    local cur = t[k]
    if cur == nil then t[k] = v
    elseif type(cur) == "table" then cur[#cur + 1] = v
    else t[k] = { cur, v } end
  end
  return t
end

return M
