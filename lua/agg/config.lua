-- agg.config: reads and checks scripts/gateway.lua, the operator's file (DESIGN §2.4).
--
-- Every option has a default; a misspelt key, a wrong type or a value out of range is an error
-- message "scripts/gateway.lua:LINE: where: what is wrong; what to do". All errors are collected,
-- not only the first.
--
-- This module holds the top level (its keys, the process's options: workers, deadlines, the
-- script time limit, scripts) and the checking context every part is checked with. The parts are
-- modules of their own, called in this order (the order errors are listed in):
--   agg.front_config     listen, admin, batch, (access_log,) clients
--   agg.ops_config       access_log, tracing
--   agg.redis_config     redis, cache
--   (here)               workers, deadline_ms, max_request_body_bytes, script_time_limit_ms,
--                        script_memory_limit_mb, max_sections_per_request, max_request_json_values,
--                        shutdown_grace_ms, scripts
--   agg.limits           limits, max_in_flight
--   agg.upstream_config  upstreams; then agg.edge_config's auth; then token_exchange and what
--                        upstreams' identity needs
-- A part is a function (cfg, out, c): it reads cfg, writes its part of out (the normalized
-- config) and reports each mistake through c.err(line, where, message). The context c: lines
-- (the source's lines), file (its display path), dir (the scripts folder), err, show(v) (a value
-- as a message names it), posint(v, where, line, max) (true, or false after an error; max 2^31-1 when nil),
-- find_line(lines, name, from), line_of(name, from), suggest(key, known),
-- parse_http_url(url, allow_https), not_yet (options of a later version: name -> why).
local str_find, str_gmatch, str_gsub, str_match = string.find, string.gmatch, string.gsub, string.match
local edge = require "agg.edge_config"
local limits = require "agg.limits"
local front = require "agg.front_config"
local ops = require "agg.ops_config"
local redis = require "agg.redis_config"
local upstreams = require "agg.upstream_config"

local M = {}

local NOT_YET = {}

-- Finds the line of the first `name =` (or `name=`) at or after line `from` in the source.
local function find_line(lines, name, from)
  local pat = "[%s{,]" .. str_gsub(tostring(name), "%p", "%%%0") .. "%s*="
  for i = from or 1, #lines do
    if str_find((" " .. lines[i]), pat) then return i end
  end
  return nil
end

-- Edit distance between a and b, stopping at limit + 1 (agg.edge_config's).
local distance = edge.distance

--- " (did you mean 'k'?)" for the key of `known` (a set: name -> anything) closest to `key`, or
-- "" when none is close: two edits at most, or a shared prefix of three letters or more.
-- agg.lint and agg.callspec use it too, so every misspelling gets the same help.
function M.suggest(key, known)
  key = tostring(key)
  local best, bestd
  for k in pairs(known) do
    if type(k) == "string" then
      local d = distance(key, k, 2)
      if d <= 2 and (not bestd or d < bestd or (d == bestd and k < best)) then best, bestd = k, d end
    end
  end
  if not best then
    for k in pairs(known) do
      if type(k) == "string" then
        -- shared prefix length and length difference
        local n = 0
        while n < #k and n < #key and k:byte(n + 1) == key:byte(n + 1) do n = n + 1 end
        local d = 100 + math.max(#k, #key) - n
        if n >= 3 and (not bestd or d < bestd or (d == bestd and k < best)) then best, bestd = k, d end
      end
    end
  end
  best = best or edge.closest(key, known) -- a typo inside the word ("isuer")
  return best and (" (did you mean '" .. best .. "'?)") or ""
end
local suggest = M.suggest

--- The names of a set (name -> anything), sorted and joined with ", ": the list of what is known
-- that a message about a misspelt name ends with. agg.lint and the spec harness use it too.
function M.names(set)
  local out = {}
  for k in pairs(set) do out[#out + 1] = k end
  table.sort(out)
  return table.concat(out, ", ")
end

-- Splits "http[s]://host[:port][/base]" (upstream URLs, the OTLP collector, the token endpoint)
-- -> host, port, base path (no trailing '/'), "host[:port]", scheme; or nil and a message.
-- https is accepted only when allow_https is true.
local function parse_http_url(url, allow_https)
  -- a URL's user info ("user:password@host") is not shown in a message: the reload page on the
  -- admin listener and the log show what is wrong, never a password (an attack review)
  local shown = str_gsub(url, "^([^/]*//)[^/]*@", "%1…@")
  if shown ~= url then
    return nil, "'" .. shown .. "': user info (user:password@) is not supported in URLs; the password is not shown"
  end
  local scheme, rest = str_match(url, "^(%a[%w+.-]*)://(.*)$")
  if scheme == "https" and not allow_https then
    return nil, "'" .. url .. "': https is not supported; use http://"
  elseif scheme ~= "http" and scheme ~= "https" then
    return nil, "'" .. url .. "': " .. (allow_https and "URLs must start with http:// or https://" or
                                      "only http:// URLs are supported")
  end
  local hostport, path = str_match(rest, "^([^/]*)(.*)$")
  local host, port = str_match(hostport, "^%[(.-)%]:?(%d*)$")
  if not host then host, port = str_match(hostport, "^([^:]*):?(%d*)$") end
  if not host or host == "" then return nil, "'" .. url .. "' has no host" end
  port = port ~= "" and tonumber(port) or (scheme == "https" and 443 or 80)
  if port < 1 or port > 65535 then return nil, "'" .. url .. "': port out of range" end
  path = str_gsub(path, "/+$", "")
  if str_find(path, "[?#]") then return nil, "'" .. url .. "' must not contain a query or fragment" end
  return host, port, path, hostport, scheme
end

--- Checks the table `cfg` that gateway.lua returned. src is the file's text (for line numbers),
-- file its display path. Returns the normalized config, or nil and a list of error strings.
function M.check(cfg, src, file)
  local lines = {}
  for l in str_gmatch((src .. "\n"), "([^\n]*)\n") do lines[#lines + 1] = l end
  local errors = {}
  local function err(line, where, msg)
    errors[#errors + 1] = ("%s:%s: %s: %s"):format(file, line or 1, where, msg)
  end
  if type(cfg) ~= "table" then
    err(1, "gateway.lua", "must return a table, like: return { listen = { { port = 8080 } }, upstreams = { … } }")
    return nil, errors
  end
  local out = { listen = {}, upstreams = {}, workers = 0, deadline_ms = 1000, max_request_body_bytes = 1024 * 1024,
                shutdown_grace_ms = 10000, script_time_limit_ms = 1000, script_memory_limit_mb = 1024,
                max_sections_per_request = 1000, max_request_json_values = 10000,
                scripts = { trusted = false },
                cache = { memory_bytes = 64 * 1024 * 1024, redis = true } }
  local TOP = { listen = true, workers = true, deadline_ms = true, upstreams = true, max_request_body_bytes = true,
                admin = true, access_log = true, shutdown_grace_ms = true, tracing = true, script_time_limit_ms = true,
                script_memory_limit_mb = true, max_sections_per_request = true, max_request_json_values = true,
                clients = true, scripts = true, redis = true, cache = true, auth = true, token_exchange = true,
                limits = true, max_in_flight = true, batch = true }
  for k in pairs(cfg) do
    if NOT_YET[k] then
      err(find_line(lines, k), k, NOT_YET[k] .. " is not available in this version of aggway; remove '" .. k .. "'")
    elseif not TOP[k] then
      err(find_line(lines, k), tostring(k), "unknown option" .. suggest(tostring(k), TOP) ..
          "; gateway.lua knows listen, admin, workers, deadline_ms, max_request_body_bytes, " ..
          "shutdown_grace_ms, script_time_limit_ms, script_memory_limit_mb, max_sections_per_request, " ..
          "max_request_json_values, clients, scripts, access_log, tracing, " ..
          "redis, cache, limits, " ..
          "max_in_flight, upstreams, auth, token_exchange, batch")
    end
  end
  local function show(v)
    if type(v) == "string" then return ("string %q"):format(v) end
    if type(v) == "number" then return tostring(v) end
    return type(v)
  end
  local function posint(v, where, line, max)
    max = max or 2147483647 -- every number the C side reads fits an int32 unless a caller says more
    if type(v) ~= "number" or v ~= v or v % 1 ~= 0 or v <= 0 or v > max then
      err(line, where, ("must be a positive whole number up to %d, got %s"):format(max, show(v)))
      return false
    end
    return true
  end
  local c = { lines = lines, file = file, dir = str_match(file, "^(.*)/[^/]*$") or ".", err = err, show = show,
              posint = posint, find_line = find_line, suggest = suggest, parse_http_url = parse_http_url,
              not_yet = NOT_YET, line_of = function(name, from) return find_line(lines, name, from) end }
  front.check_listen(cfg, out, c)
  front.check_admin(cfg, out, c)
  front.check_batch(cfg, out, c)
  ops.check_access_log(cfg, out, c)
  front.check_clients(cfg, out, c)
  ops.check_tracing(cfg, out, c)
  redis.check_redis(cfg, out, c)
  redis.check_cache(cfg, out, c)
  -- workers
  if cfg.workers ~= nil and cfg.workers ~= "auto" then
    local v = cfg.workers
    if type(v) ~= "number" or v ~= v or v % 1 ~= 0 or v <= 0 or v > 256 then
      err(find_line(lines, "workers"), "workers", ("must be \"auto\" (one per core) or a whole number from 1 to 256, got %s")
          :format(show(v)))
    else
      out.workers = v
    end
  end
  if cfg.deadline_ms ~= nil and posint(cfg.deadline_ms, "deadline_ms", find_line(lines, "deadline_ms"), 3600000) then
    out.deadline_ms = cfg.deadline_ms
  end
  if cfg.max_request_body_bytes ~= nil and
     posint(cfg.max_request_body_bytes, "max_request_body_bytes", find_line(lines, "max_request_body_bytes"),
            1073741824) then
    out.max_request_body_bytes = cfg.max_request_body_bytes
  end
  -- a whole number of `unit` (milliseconds, megabytes) from lo to hi, or an error at its line
  local function whole(key, lo, hi, unit)
    local v = cfg[key]
    if v == nil then return end
    if type(v) ~= "number" or v ~= v or v % 1 ~= 0 or v < lo or v > hi then
      err(find_line(lines, key), key,
          ("must be a whole number of %s from %d to %d, got %s"):format(unit, lo, hi, show(v)))
    else
      out[key] = v
    end
  end
  -- how long a script may run without waiting for a call before the gateway stops it
  -- (worker/watchdog.h): from 10 ms to 10 minutes
  whole("script_time_limit_ms", 10, 600000, "milliseconds")
  -- how large a worker's Lua heap may grow before a script that grows it is stopped
  -- (base/heap.h): 16 MB to 1 TB
  whole("script_memory_limit_mb", 16, 1048576, "megabytes")
  whole("shutdown_grace_ms", 0, 3600000, "milliseconds")
  -- how many sections one request's fan-outs may have in all (agg.fanout): every call, chain
  -- and nested fan-out a request starts is one; bounds what one client request makes upstream
  whole("max_sections_per_request", 1, 100000, "sections")
  -- how many values and member names req.json may make of a request body (agg.runtime): each
  -- costs a Lua slot, table or string, about 25 times the body's bytes for "[{},{},…]"
  whole("max_request_json_values", 1, 10000000, "values")
  -- scripts = { trusted = true }: the folder's scripts run without the sandbox (agg.sandbox)
  if cfg.scripts ~= nil then
    local sline = find_line(lines, "scripts")
    local sc = cfg.scripts
    if type(sc) ~= "table" then
      err(sline, "scripts", "must be a table like { trusted = true }, got " .. show(sc))
    else
      for k in pairs(sc) do
        if k ~= "trusted" then
          err(find_line(lines, k, sline) or sline, "scripts." .. tostring(k), "unknown option" ..
              suggest(tostring(k), { trusted = true }) .. " (trusted)")
        end
      end
      if sc.trusted ~= nil and type(sc.trusted) ~= "boolean" then
        err(find_line(lines, "trusted", sline) or sline, "scripts.trusted", "must be true or false, got " .. show(sc.trusted))
      else
        out.scripts.trusted = sc.trusted == true
      end
    end
  end
  -- limits = { store, headers, rules, default, local_keys } and max_in_flight (agg.limits)
  out.limits = limits.check(cfg, c)
  out.max_in_flight = limits.check_max_in_flight(cfg, c)
  upstreams.check_upstreams(cfg, out, c)
  -- the edge: auth (edge_config.lua), token_exchange, and what upstreams' identity needs
  out.auth = edge.check_auth(c, cfg.auth)
  upstreams.check_token_exchange(cfg, out, c)
  if #errors > 0 then return nil, errors end
  return out
end

return M
