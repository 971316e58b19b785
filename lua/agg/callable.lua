-- agg.callable: whether a value a script gives where the runtime wants a function is one (an
-- endpoint's handler, a continuation, agg.map's and agg.shape's callbacks, a merged call's request
-- and split, a limit's key). A raw JSON ref (agg.json: an upstream's body, json.parse's) is a C
-- closure, so type() says "function", but it is data and raises when called: it is refused
-- wherever a function is checked, and taken as the value it is where a value is allowed too (a
-- call's fallback, agg.result).
local is_ref = require("agg.json").is_ref

local M = {}

--- True when v is a function the runtime may call: a Lua or C function, not a raw JSON ref.
function M.is(v)
  return type(v) == "function" and not is_ref(v)
end

--- What v is, for a message that says a function was wanted: its type, or "an agg.json raw ref
-- (JSON data)" for a raw ref.
function M.kind(v)
  if type(v) == "function" and is_ref(v) then return "an agg.json raw ref (JSON data)" end
  return type(v)
end

return M
