-- agg.shape: response shaping for the common cases (issue 20), so a page sends the client only what
-- it shows. Each helper returns a new value and leaves its argument as it was; each raises an error
-- at the script's line when given something it cannot shape (a programming mistake).
--
--   agg.pick(t, { "id", "name" })          -> { id = t.id, name = t.name } (keys t has)
--   agg.omit(t, { "description" })         -> a copy of t without those keys
--   agg.rename(t, { productId = "id" })    -> a copy of t with the keys renamed
--   agg.map(list, function(item, i) … end) -> a JSON array of the results (nil results left out)
--   agg.limit(list, 3)                     -> a JSON array of the first 3 items
--   agg.shape(result, fn)                  -> result, its data replaced by fn(data) when it has
--                                             data (ok, fallback, stale); status and error kept
local json = require "agg.json"
local callable = require "agg.callable"
local where = require "agg.where"

local M = {}

local function check_table(fn, what, v, level)
  if type(v) ~= "table" then
    error(("agg.%s: %s must be a table, got %s"):format(fn, what, v == json.null and "agg.null" or type(v)), level + 1)
  end
end

-- A list of key names (level: the script's line).
local function check_keys(fn, keys, level)
  check_table(fn, "the list of keys", keys, level + 1)
  for i, k in ipairs(keys) do
    if type(k) ~= "string" then
      error(("agg.%s: key %d of the list must be a string, got %s"):format(fn, i, type(k)), level + 1)
    end
  end
end

--- agg.pick(t, keys) -> a table with only the keys of the list `keys` that t has.
-- nil and agg.null pass through (a section without data). Errors: t or keys not tables, a key not
-- a string.
function M.pick(t, keys)
  check_keys("pick", keys, 2)
  if t == nil or t == json.null then return t end
  check_table("pick", "the value", t, 2)
  local out = {}
  for _, k in ipairs(keys) do out[k] = t[k] end
  return out
end

--- agg.omit(t, keys) -> a copy of t without the keys of the list `keys`.
function M.omit(t, keys)
  check_keys("omit", keys, 2)
  if t == nil or t == json.null then return t end
  check_table("omit", "the value", t, 2)
  local drop = {}
  for _, k in ipairs(keys) do drop[k] = true end
  local out = {}
  for k, v in pairs(t) do
    if not drop[k] then out[k] = v end
  end
  return out
end

--- agg.rename(t, names) -> a copy of t where each key old of names { old = "new" } is called new.
-- Errors: a new name that is not a string, two keys renamed to one name.
function M.rename(t, names)
  check_table("rename", "the names", names, 2)
  local taken, olds = {}, {}
  for old in pairs(names) do olds[#olds + 1] = tostring(old) end
  table.sort(olds) -- (the same message every run)
  for _, o in ipairs(olds) do
    local old = names[o] ~= nil and o or tonumber(o)
    local new = names[old]
    if type(new) ~= "string" then
      error(("agg.rename: the new name of '%s' must be a string, got %s"):format(tostring(old), type(new)), 2)
    end
    if taken[new] then
      error(("agg.rename: '%s' and '%s' are both renamed to '%s'"):format(tostring(taken[new]), tostring(old), new), 2)
    end
    taken[new] = old
  end
  if t == nil or t == json.null then return t end
  check_table("rename", "the value", t, 2)
  local out = {}
  for k, v in pairs(t) do
    if names[k] == nil then out[k] = v end
  end
  for old, new in pairs(names) do
    if t[old] ~= nil then out[new] = t[old] end
  end
  return out
end

--- agg.map(list, fn) -> a JSON array of fn(item, index) for each item of list, in order; items for
-- which fn returns nil are left out. nil or agg.null gives an empty array.
function M.map(list, fn)
  if not callable.is(fn) then
    error("agg.map: the second argument must be a function(item, index), got " .. callable.kind(fn), 2)
  end
  local out = json.array()
  if list == nil or list == json.null then return out end
  check_table("map", "the list", list, 2)
  local n = 0
  for i = 1, #list do
    local v = fn(list[i], i)
    if v ~= nil then n = n + 1; out[n] = v end
  end
  return out
end

--- agg.limit(list, n) -> a JSON array of the first n items of list (all of them when it has fewer).
-- Errors: n not a whole number >= 0.
function M.limit(list, n)
  if type(n) ~= "number" or n < 0 or n % 1 ~= 0 then
    error("agg.limit: the length must be a whole number >= 0" .. where.got(n), 2)
  end
  local out = json.array()
  if list == nil or list == json.null then return out end
  check_table("limit", "the list", list, 2)
  for i = 1, math.min(n, #list) do out[i] = list[i] end
  return out
end

--- agg.shape(result, fn) -> result, with result.data = fn(result.data) when the section has data
-- (status ok, fallback or stale); an unavailable section is returned as it is, so the page keeps
-- its status and problem. Errors: result not a table, fn not a function.
function M.shape(r, fn)
  if not callable.is(fn) then
    error("agg.shape: the second argument must be a function(data), got " .. callable.kind(fn), 2)
  end
  check_table("shape", "the result", r, 2)
  if r.status ~= "unavailable" and r.status ~= "skipped" then r.data = fn(r.data) end
  return r
end

return M
