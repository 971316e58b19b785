-- agg.readonly: read-only views of tables every script of a worker shares (the standard libraries
-- in the sandbox, the agg module and what it reaches). A view is an empty table whose metatable
-- reads through to the real one and refuses writes; the metatable is protected (getmetatable
-- gives the name, setmetatable raises), and agg.sandbox's rawset refuses views, so no script can
-- change what another one sees.
local M = {}

local views = setmetatable({}, { __mode = "k" }) -- view -> true

--- Returns a read-only view of t. name ("string", "agg") is what error messages and
-- getmetatable(view) say. Writes raise "NAME is shared by every script and read-only …" at the
-- writer's line.
function M.view(t, name)
  local v = setmetatable({}, {
    __index = t,
    __newindex = function(_, k)
      error(name .. " is shared by every script and read-only (tried to set " .. name .. "." .. tostring(k) .. ")", 2)
    end,
    __metatable = name,
  })
  views[v] = true
  return v
end

--- True when t is a view made by M.view.
function M.is_view(t)
  return views[t] == true
end

return M
