-- agg.loader: loads a scripts folder as one generation: gateway.lua plus every endpoint script
-- (DESIGN §2). The same code runs in `aggway check`, in every worker of `aggway serve` and in
-- `aggway test`, so what check accepts is what serve runs.
--
-- Endpoint script: returns { route = "GET /x/{id}", deadline_ms = n, handler = function(req) … end }
-- or a list of such tables. Files under lib/ are modules for require "lib.x", never endpoints.
local str_find, str_gmatch, str_gsub, str_match = string.find, string.gmatch, string.gsub, string.match
local config = require "agg.config"
local edge = require "agg.edge_config"
local sys = require "agg.sys"
local lint = require "agg.lint"
local where = require "agg.where"
local handler_loaded = where.handler_loaded -- (the loop below names its endpoint text `where`)
local key_name, distance = where.key_name, edge.distance
local sandbox = require "agg.sandbox"
local router = require "agg.router"

local M = {}

local METHODS = { GET = true, HEAD = true, POST = true, PUT = true, PATCH = true, DELETE = true, OPTIONS = true }
local ENDPOINT_KEYS = { route = true, deadline_ms = true, handler = true, auth = true, limits = true, priority = true }
local limits = require "agg.limits"
local callable = require "agg.callable"

local function read(path)
  local f = io.open(path, "rb")
  if not f then return nil end
  local s = f:read("*a")
  f:close()
  return s
end

-- The line of src where key needle is given a value (`needle = …`, outside a comment); else the
-- first line that mentions it; else 1. (A comment above an endpoint that talks about its auth must
-- not take the error meant for `auth = …`.)
-- With from, the lines before it are passed over first (an endpoint's keys are looked for from
-- its route's line: a file of several endpoints names each one's own), and the whole file is
-- searched when nothing matches from there.
local function line_of(src, needle, from)
  local key = "%f[%w_]" .. str_gsub(needle, "%p", "%%%0") .. "%f[^%w_]%s*=[^=]"
  local n, first = 1, nil
  from = from or 1
  for l in str_gmatch((src .. "\n"), "([^\n]*)\n") do
    if n >= from then
      local code = str_gsub(l, "%-%-.*$", "")
      if str_find((code .. " "), key) then return n end
      if not first and str_find(l, needle, 1, true) then first = n end
    end
    n = n + 1
  end
  if not first and from > 1 then return line_of(src, needle) end
  return first or 1
end

-- The routes of src written as `route = "…"` (or '…'), outside comments: literal -> its first
-- line. One pass over the file, made only when a message needs an endpoint's line (a file of
-- thousands of endpoints is not scanned once per endpoint).
local function route_lines(src)
  local at, n = {}, 1
  for l in str_gmatch((src .. "\n"), "([^\n]*)\n") do
    local code = str_gsub(l, "%-%-.*$", "")
    for _, lit in str_gmatch(code, "%f[%w_]route%s*=%s*([\"'])(.-)%1") do
      if not at[lit] then at[lit] = n end
    end
    n = n + 1
  end
  return at
end

-- A key as a message shows it: control characters as \xNN (a key with a newline would split the
-- file:line message, an escape sequence would reach the terminal of aggway check), cut at 80 bytes.
local function key_shown(k)
  local t = #k > 80 and (k:sub(1, 80) .. "…") or k
  return (str_gsub(t, "%c", function(c) return ("\\x%02x"):format(c:byte()) end))
end

-- Each endpoint file runs in an environment of its own, the sandbox (agg.sandbox): its globals
-- stay its own, and what every script shares is read-only, so one script cannot break another.
-- A folder whose gateway.lua says scripts = { trusted = true } runs without it.
--- The text of the script time limit's stop (agg.sandbox.STOP_TEXT).
M.STOP_TEXT = sandbox.STOP_TEXT

-- Runs a loaded chunk. An error value that is not a string (error({…})) carries no position:
-- the message then names the file and the line where it was raised, taken from the traceback.
--
-- A script's top level only sets things up; a folder whose top levels run longer than
-- M.LOAD_BUDGET_S seconds in all is stuck (an endless loop there would hold up start-up,
-- `aggway check` and every reload, and a reload cannot be cancelled). It is stopped with
-- "file:line: … took longer than …", file:line being where it was running (the script or a module
-- it required). The JIT is off meanwhile: compiled loops do not run hooks. A string pattern that
-- backtracks for long is stopped too (agg.pattern runs the hook). Not stopped: another long C
-- call, a finalizer or error handler that loops, a script that removes the hook itself.
M.LOAD_BUDGET_S = 5
local LOADER_SOURCE = debug.getinfo(1, "S").source
local HOOK_EVERY = 100000 -- VM instructions between clock readings

local load_deadline -- the whole folder's, set by M.load (N files do not get N budgets)

local function too_long(where)
  return ("%s: loading the scripts took longer than %g s (an endless loop?); stopped here " ..
          "(a script's top level should only define endpoints: work belongs in handlers)"):format(
          where, M.LOAD_BUDGET_S)
end

-- An error of a file's top level (its message e, a string) at its place in the scripts folder dir:
-- kept when it already names a file of the folder ("dir/x.lua:7: …"); otherwise put at the line
-- the folder's code was running (the deepest frame from dir on the stack), after taking off a
-- place in the runtime ("…/agg/loader.lua:256: ", which is no business of the script's author).
-- A message raised past the script (error(msg, 0), a C function's "bad argument", a function the
-- top level tail-called, whose caller's frame is gone) gets that line, or line 1 of the file.
local function placed(e, file, dir)
  -- one line of text whatever the script raised: a NUL would end the message in C
  e = str_gsub(e, "%z", "\\0")
  -- coroutine.wrap puts its caller's place before a message that has one already: one place
  -- when the two are the same
  e = str_gsub(e, "^([^\n]-:%d+: )%1", "%1")
  local src, rest = str_match(e, "^(.-):%d+: (.*)$")
  local folder = dir .. "/"
  if src and src:sub(1, #folder) == folder then return e end
  if src and M.runtime_source("@" .. src) then e = rest end
  for level = 3, 200 do
    local info = debug.getinfo(level, "Sl")
    if not info then break end
    if info.currentline > 0 and info.source:sub(1, #folder + 1) == "@" .. folder then
      return ("%s:%d: %s"):format(info.source:sub(2), info.currentline, e)
    end
  end
  return ("%s:1: %s"):format(file, e)
end

-- A copy of what a file's top level returned, made with raw access only (next, no metamethods):
-- the loader reads it after the load budget's hook is gone, so a __index, __tostring or __len
-- that looped or raised would hang the load or fail it from inside the runtime. Tables with a
-- metatable, userdata, threads and cdata are refused (an endpoint and gateway.lua are plain
-- data and functions); a table met twice is copied once. Returns the copy, or nil and why.
local PLAIN_DEPTH = 64
local function plain_copy(v, seen, depth)
  local t = type(v)
  if t ~= "table" then
    if t == "userdata" or t == "thread" or t == "cdata" then return nil, "a " .. t .. " is not plain data" end
    return v
  end
  if seen[v] then return seen[v] end
  if debug.getmetatable(v) ~= nil then return nil, "a table with a metatable is not plain data" end
  if depth > PLAIN_DEPTH then return nil, "tables nested more than " .. PLAIN_DEPTH .. " deep" end
  local c = {}
  seen[v] = c
  for k, x in next, v do
    local ck, why = plain_copy(k, seen, depth + 1)
    if ck == nil then return nil, why end
    local cx, why2 = plain_copy(x, seen, depth + 1)
    if cx == nil then return nil, why2 end
    c[ck] = cx
  end
  return c
end

local function run_chunk(chunk, file, dir)
  local deadline = load_deadline
  local budget_hit = false
  local hook
  hook = function()
    -- back here, or in the runtime's code on the way (agg.sandbox's require)
    if budget_hit and M.runtime_source(debug.getinfo(2, "S").source) then return end
    if budget_hit or sys.monotonic_s() > deadline then
      -- from now on at every instruction: a script that catches the error (pcall in a loop) is
      -- stopped again as soon as it runs anything outside the pcall
      if not budget_hit then debug.sethook(hook, "", 1) end
      budget_hit = true
      -- where it was running: the script, or a module it required (the nearest file of the
      -- folder's on the stack: past a string pattern's poll, agg.pattern, or a chunk it loaded)
      local where = file .. ":1"
      for level = 2, 50 do
        local info = debug.getinfo(level, "Sl")
        if not info then break end
        if info.source:sub(1, 1) == "@" and info.currentline > 0 and not M.runtime_source(info.source) then
          where = info.source:sub(2) .. ":" .. info.currentline
          break
        end
      end
      error(too_long(where), 0)
    end
  end
  -- a script may turn the JIT off (or on) for good at its top level: that wish outlives the load
  local jit_was_on, jit_wish, real_on, real_off = jit and jit.status(), nil, jit and jit.on, jit and jit.off
  if jit then
    real_off()
    -- (turned on only once the chunk has returned: compiled loops would escape the budget)
    jit.on = function(...) if select("#", ...) == 0 then jit_wish = true return end return real_on(...) end
    jit.off = function(...) if select("#", ...) == 0 then jit_wish = false end return real_off(...) end
  end
  debug.sethook(hook, "", HOOK_EVERY)
  local ok, v = xpcall(chunk, function(e)
    if type(e) == "string" then return placed(e, file, dir) end
    local tb = debug.traceback("", 2)
    local line = str_match(tb, str_gsub(file, "%p", "%%%0") .. ":(%d+):") or "1"
    return ("%s:%s: raised an error value of type %s (use error(\"message\") to say what is wrong)"):format(file, line, type(e))
  end)
  debug.sethook()
  if jit then
    jit.on, jit.off = real_on, real_off
    if jit_wish == nil then jit_wish = jit_was_on end
    if jit_wish then real_on() else real_off() end
  end
  if budget_hit and ok then ok, v = false, too_long(file .. ":1") end
  return ok, v
end

-- The scripts' own functions run in LuaJIT's interpreter: compiled code does not run hooks, and
-- the script time limit (worker/watchdog.h) stops a runaway script with one. The agg library
-- stays compiled. A sandboxed script cannot turn the JIT on (agg.sandbox); a trusted folder's
-- script can, and the limit then cannot stop a loop inside what it compiled.
local interpreted = sandbox.interpreted

-- Modules the scripts of a trusted folder (and specs) require from the scripts folder (lib/x.lua
-- for require "lib.x") load interpreted too: a searcher placed before Lua's own file searcher, for
-- that folder only. (A sandboxed script's require is agg.sandbox's.)
local scripts_path -- "dir/?.lua;dir/?/init.lua" of the folder being loaded
-- the runtime's own modules (agg, agg.json …) come first, as they did on package.path: a file of
-- the scripts folder cannot stand in for one
local LUA_DIR = str_match(LOADER_SOURCE, "^@(.*)/agg/[^/]*$")
local RUNTIME_PATH = LUA_DIR and (LUA_DIR .. "/?.lua;" .. LUA_DIR .. "/?/init.lua")
local RUNTIME_PREFIX = LUA_DIR and ("@" .. LUA_DIR .. "/")

--- Whether source (a debug.getinfo source, "@path") is a file of the runtime's Lua half (lua/agg),
-- as worker/watchdog.c's runtime_source tells: where the script time limit never raises its stop.
function M.runtime_source(source)
  return RUNTIME_PREFIX ~= nil and type(source) == "string" and source:sub(1, #RUNTIME_PREFIX) == RUNTIME_PREFIX
end
local function script_module_searcher(name)
  if not scripts_path then return nil end
  if RUNTIME_PATH and package.searchpath(name, RUNTIME_PATH) then return nil end
  local file = package.searchpath(name, scripts_path)
  if not file then return nil end -- Lua's own searchers say where they looked
  local chunk, err = sandbox.load_source(file)
  if not chunk then
    error(("error loading module '%s' from file '%s':\n\t%s"):format(name, file, err), 0)
  end
  return setfenv(interpreted(chunk), sandbox.env(scripts_path)) -- a module is sandboxed as a script is
end

-- A route or segment for a message: quoted, control characters and non-ASCII bytes as \ddd, so
-- an error line stays one line of text.
local function shown(s)
  return "'" .. str_gsub(s, "[%c\128-\255\\']", function(c) return ("\\%03d"):format(c:byte()) end) .. "'"
end

--- Parses "GET /product-page/{id}" into { method, segments = { "product-page", { param = "id" } } };
-- a parameter may carry a pattern, "{id:[0-9]+}" -> { param = "id", pattern = "[0-9]+" }, compiled
-- here by the router's own code (route/route_param.h) so that check refuses what serve
-- could not run. Returns nil, message on a malformed route.
function M.parse_route(route)
  if type(route) ~= "string" then return nil, "route must be a string like \"GET /product-page/{id}\"" end
  local method, path = str_match(route, "^(%u+)%s+(/%S*)$")
  if not method then return nil, "route " .. shown(route) .. " must look like \"GET /product-page/{id}\"" end
  if not METHODS[method] then return nil, "route " .. shown(route) .. ": unknown method " .. method end
  local segs, seen = {}, {}
  if path ~= "/" then
    for seg in str_gmatch((path:sub(2) .. "/"), "([^/]*)/") do
      local p, pattern = str_match(seg, "^{([%a_][%w_]*)}$"), nil
      if not p then p, pattern = str_match(seg, "^{([%a_][%w_]*):(.*)}$") end
      if p then
        if seen[p] then return nil, "route " .. shown(route) .. ": parameter {" .. p .. "} appears twice" end
        seen[p] = true
        if pattern then
          local ok, err = router.compile(pattern)
          if not ok then return nil, "route " .. shown(route) .. ": parameter {" .. p .. "}: pattern " .. err end
        end
        segs[#segs + 1] = { param = p, pattern = pattern }
      elseif str_find(seg, "[^%w%-%._~!%$&'%(%)%*%+,;=:@]") then
        -- RFC 3986 §3.3 pchar without pct-encoded: a byte no request path can hold as it is (a
        -- space, a control character, non-ASCII, '%', '{', '?', '#') would make a route that never
        -- matches, or matches only what a client should not send
        return nil, ("route %s: segment %s must be literal path characters (letters, digits and -._~!$&'()*+,;=:@) or a {name} parameter"):format(shown(route), shown(seg))
      else
        segs[#segs + 1] = seg
      end
    end
  end
  return { method = method, segments = segs }
end

local function shape(r)
  local parts = { r.method }
  for _, s in ipairs(r.segments) do parts[#parts + 1] = type(s) == "table" and "{}" or s end
  return table.concat(parts, "/")
end

--- Loads dir. Returns gen = { config, upstreams (name -> { index, timeout_ms }), endpoints (list, in
-- match order: more literal segments first) } or nil, { "file:line: message", … }.
-- (load_folder does the work; M.load, at the end, puts the folder under one load budget.)
local function load_folder(dir)
  local errors = {}
  local gfile = dir .. "/gateway.lua"
  local src = read(gfile)
  local cfg
  if not src then
    errors[#errors + 1] = gfile .. ":1: cannot read the gateway configuration; create it (see docs/operations.md, 'gateway.lua')"
  else
    local chunk, err = sandbox.load_source(gfile, src)
    if not chunk then
      errors[#errors + 1] = err
    else
      local ok, v = run_chunk(chunk, gfile, dir)
      local why
      if ok and type(v) == "table" then v, why = plain_copy(v, {}, 1) end
      if not ok then
        errors[#errors + 1] = tostring(v)
      elseif why then
        errors[#errors + 1] = ("%s:1: gateway.lua must return plain tables: %s"):format(gfile, why)
      else
        local c, errs = config.check(v, src, gfile)
        if not c then
          for _, e in ipairs(errs) do errors[#errors + 1] = e end
        end
        cfg = c
      end
    end
  end
  local ups = {}
  if cfg then
    for i, u in ipairs(cfg.upstreams) do
      ups[u.name] = { index = i, name = u.name, timeout_ms = u.timeout_ms, retry = u.retry, hedge = u.hedge,
                      breaker = u.breaker, cache = u.cache or false, identity = u.identity, audience = u.audience,
                      internal = u.internal, endpoints = u.endpoints, balance = u.balance, hash_key = u.hash_key,
                      outlier = u.outlier, session = u.session, health = u.health,
                      forward_headers = u.forward_headers, base_path = u.base_path,
                      failure_statuses = u.failure_statuses or false }
    end
  end
  local trusted = cfg and cfg.scripts.trusted
  local endpoints, shapes = {}, {}
  local files = sys.listdir(dir)
  for _, rel in ipairs(files) do
    local file = dir .. "/" .. rel
    local fsrc = read(file) or ""
    where.remember(file, fsrc)
    -- the line of an option named in an error, found once per name and file (a file with many
    -- endpoints or keys would otherwise be scanned once per error)
    local found_at = {}
    -- an endpoint's route line, where its keys are looked for from (several endpoints in a file)
    local routes_at
    local function from_of(route)
      if type(route) ~= "string" then return nil end
      routes_at = routes_at or route_lines(fsrc)
      return routes_at[route]
    end
    local function at(name, from)
      local k = from and (name .. "\0" .. from) or name
      local n = found_at[k]
      if not n then n = line_of(fsrc, name, from); found_at[k] = n end
      return n
    end
    local chunk, err = sandbox.load_source(file)
    -- call specs run only when a request comes, but what the source shows of them (upstream,
    -- options and their types, fetch_then keys) is worth checking now (agg.lint); not in a file
    -- that does not compile: a missing brace makes the lint read one table as another, and its
    -- findings would bury the one error that matters
    if cfg and chunk then
      local declared = {}
      for name, u in pairs(ups) do if not u.internal then declared[name] = true end end
      for _, e in ipairs(lint.check(fsrc, file, declared)) do errors[#errors + 1] = e end -- (a shared list: copied)
    end
    if chunk then setfenv(interpreted(chunk), trusted and sandbox.trusted_env() or sandbox.env(scripts_path)) end
    if not chunk then
      errors[#errors + 1] = err
    else
      local ok, v = run_chunk(chunk, file, dir)
      local why
      if ok and type(v) == "table" then v, why = plain_copy(v, {}, 1) end
      if not ok then
        errors[#errors + 1] = tostring(v)
      elseif why then
        errors[#errors + 1] = ("%s:1: an endpoint script must return plain tables of route, handler and options: %s"):format(file, why)
      elseif type(v) ~= "table" then
        errors[#errors + 1] = ("%s:1: an endpoint script must return { route = \"GET /path\", handler = function(req) … end } or a list of them (got %s)"):format(file, type(v))
      else
        local list = (v.route ~= nil or v.handler ~= nil) and { v } or v
        if #list == 0 then
          -- (a helper module put beside the endpoints: they load every .lua file outside lib/)
          errors[#errors + 1] = ("%s:1: the returned table has no route and no endpoints: every .lua file of the " ..
                                 "folder outside lib/ is an endpoint script; a module goes in lib/ (lib/x.lua is " ..
                                 "require \"lib.x\")"):format(file)
        end
        for i, ep in ipairs(list) do
          local where = #list > 1 and ("endpoint " .. i) or "endpoint"
          local e_line = type(ep) == "table" and callable.is(ep.handler) and debug.getinfo(ep.handler, "S").linedefined or 1
          local bad = false
          if type(ep) ~= "table" then
            errors[#errors + 1] = ("%s:1: %s must be a table with route and handler"):format(file, where)
            bad = true
          else
            local unknown = 0
            -- of the unknown keys named (ten at most), the one most like a misspelt handler: a
            -- missing handler is reported on its line, naming it (one holding a function first,
            -- then the nearest spelling, then bytewise)
            local handler_typo, typo_rank
            for k in pairs(ep) do
              if not ENDPOINT_KEYS[k] then
                unknown = unknown + 1
                -- (ten named, and only those get a suggestion: a generated table of a million keys
                -- would bury the rest, and the suggestions' work is outside the load time limit)
                if unknown <= 10 then
                  local hint = config.suggest(k, ENDPOINT_KEYS)
                  local kn = key_name(k)
                  if ep.handler == nil and type(k) == "string" and hint == " (did you mean 'handler'?)" then
                    local rank = (callable.is(ep[k]) and 0 or 10) + distance(k, "handler", 9)
                    if not typo_rank or rank < typo_rank or (rank == typo_rank and k < handler_typo) then
                      handler_typo, typo_rank = k, rank
                    end
                  end
                  errors[#errors + 1] = ("%s:%d: %s: unknown key '%s'%s (route, deadline_ms, handler, auth, limits, priority)"):format(
                    file, at(kn, from_of(ep.route)), where, key_shown(kn), hint)
                end
                bad = true
              end
            end
            if unknown > 10 then
              errors[#errors + 1] = ("%s:%d: %s: %d more unknown keys"):format(file, e_line, where, unknown - 10)
            end
            local r, rerr = M.parse_route(ep.route)
            if not r and ep.route == nil then
              -- (on the handler's line, naming the endpoint: the text "route" may be another
              -- endpoint's, or nowhere; a fresh user's trial got "route must be a string" at the
              -- first endpoint's line)
              errors[#errors + 1] = ("%s:%d: %s: route is missing: give it route = \"GET /product-page/{id}\""):format(
                file, e_line, where)
              bad = true
            elseif not r then
              errors[#errors + 1] = ("%s:%d: %s"):format(file, from_of(ep.route) or at("route"), rerr)
              bad = true
            end
            if ep.handler == nil and handler_typo then
              errors[#errors + 1] = ("%s:%d: %s: handler is missing (is '%s' meant to be it?)"):format(file,
                at(handler_typo, from_of(ep.route)), where, key_shown(handler_typo))
              bad = true
            elseif ep.handler == nil then
              -- (on the endpoint's route line: the table the handler belongs in)
              errors[#errors + 1] = ("%s:%d: %s: handler is missing: give it handler = function(req) … end"):format(
                file, from_of(ep.route) or (ep.route ~= nil and at("route")) or 1, where)
              bad = true
            elseif not callable.is(ep.handler) then
              errors[#errors + 1] = ("%s:%d: %s: handler must be a function(req), got %s"):format(file,
                at("handler", from_of(ep.route)), where,
                callable.kind(ep.handler))
              bad = true
            else
              handler_loaded(ep.handler) -- (agg.where: a mistake's text in another handler is its own)
            end
            local dl = ep.deadline_ms
            if dl ~= nil and (type(dl) ~= "number" or dl <= 0 or dl ~= dl) then
              errors[#errors + 1] = ("%s:%d: %s: deadline_ms must be a positive number of milliseconds"):format(file,
                at("deadline_ms", from_of(ep.route)), where)
              bad = true
            end
            -- limits = { "rule", … } (default: gateway.lua's limits.default), priority = 1 | 2 | 3
            local lim_names = cfg and cfg.limits and cfg.limits.default or {}
            if ep.limits ~= nil and cfg then
              lim_names = limits.check_names(ep.limits, cfg and cfg.limits or { by_name = {} }, function(msg)
                errors[#errors + 1] = ("%s:%d: %s: limits: %s"):format(file, at("limits", from_of(ep.route)), where, msg)
              end)
              if not lim_names then bad = true end
            end
            local prio = ep.priority
            if prio == nil then
              prio = limits.PRIORITY_DEFAULT
            elseif prio ~= 1 and prio ~= 2 and prio ~= 3 then
              errors[#errors + 1] = ("%s:%d: %s: priority must be 1 (shed last), 2 or 3 (shed first), got %s"):format(
                file, at("priority", from_of(ep.route)), where, tostring(prio))
              bad = true
            end
            -- (gateway.lua did not load: its error is reported; the endpoint's auth is checked on its
            -- own, not against an auth block that may well be there)
            local policy, perr = edge.check_endpoint(ep.auth, cfg and cfg.auth, cfg == nil)
            if not policy then
              errors[#errors + 1] = ("%s:%d: %s: %s"):format(file, at(ep.auth ~= nil and "auth" or "route", from_of(ep.route)),
                where, perr)
              bad = true
            end
            if not bad then
              local sh = shape(r)
              local other = shapes[sh]
              if other then
                -- named at both lines (the same route text twice in one file: this one's handler line,
                -- as the text's first line is the other's)
                local line = from_of(ep.route) or at("route")
                if other.file == file and other.route_line == line then line = e_line end
                errors[#errors + 1] = ("%s:%d: route '%s' conflicts with '%s' at %s:%d"):format(file, line, ep.route,
                  other.route, other.file, other.route_line)
              else
                local lit = 0
                for _, s in ipairs(r.segments) do if type(s) == "string" then lit = lit + 1 end end
                local e = { route = ep.route, method = r.method, segments = r.segments, handler = ep.handler,
                            deadline_ms = dl or (cfg and cfg.deadline_ms) or 1000, file = file, line = e_line,
                            max_sections = (cfg and cfg.max_sections_per_request) or 1000,
                            max_json_values = (cfg and cfg.max_request_json_values) or 10000,
                            route_line = from_of(ep.route) or at("route"),
                            limits = lim_names, priority = prio,
                            -- its accepted responses carry this client's RateLimit fields
                            -- (worker/limits.c): agg.runtime makes them private
                            rate_fields = (cfg and cfg.limits and cfg.limits.headers and #lim_names > 0) or false,
                            literals = lit, order = #endpoints + 1, auth = policy }
                shapes[sh] = e
                endpoints[#endpoints + 1] = e
              end
            end
          end
        end
      end
    end
  end
  -- the batch endpoint is matched before the scripts' routes: a script route of the same method
  -- and literal path would never be reached
  local batch = cfg and cfg.batch
  if batch then
    local want = {}
    for seg in str_gmatch(batch.path, "[^/]+") do want[#want + 1] = seg end
    for _, e in ipairs(endpoints) do
      local same = e.method == "POST" and #e.segments == #want
      for i = 1, same and #want or 0 do if e.segments[i] ~= want[i] then same = false end end
      if same then
        errors[#errors + 1] = ("%s:%d: route '%s' is the batch endpoint's (gateway.lua batch.route): it would never be reached; rename one of them")
          :format(e.file, e.route_line or e.line or 1, e.route)
      end
    end
  end
  if #errors > 0 then return nil, errors end
  table.sort(endpoints, function(a, b)
    if a.literals ~= b.literals then return a.literals > b.literals end
    return a.order < b.order
  end)
  local te = cfg and cfg.token_exchange
  if te then te.index = ups["@token_exchange"].index end
  -- the API key's header is a credential: a call that passes it on is cached per user (agg.cache)
  local keys = cfg and cfg.auth and cfg.auth.api_keys
  require("agg.cache").set_credential_header(keys and keys.header)
  return { config = cfg, upstreams = ups, endpoints = endpoints, token_exchange = te }
end

-- Puts "file:line: message" errors in reading order: files as they came, lines ascending within
-- a file, the order found for the same line (the checks run by kind, a reader goes by line).
local function by_line(errors)
  local files, keyed = {}, {}
  for i, e in ipairs(errors) do
    local file, line = str_match(e, "^(.-):(%d+):")
    file = file or ""
    if not files[file] then files[file] = i end
    keyed[i] = { e = e, f = files[file], l = tonumber(line) or 0, i = i }
  end
  table.sort(keyed, function(a, b)
    if a.f ~= b.f then return a.f < b.f end
    if a.l ~= b.l then return a.l < b.l end
    return a.i < b.i
  end)
  for i, k in ipairs(keyed) do errors[i] = k.e end
  return errors
end

function M.load(dir)
  scripts_path = dir .. "/?.lua;" .. dir .. "/?/init.lua"
  local loaders = package.loaders
  if loaders[2] ~= script_module_searcher then table.insert(loaders, 2, script_module_searcher) end
  load_deadline = sys.monotonic_s() + M.LOAD_BUDGET_S
  local ok, gen, errors = pcall(load_folder, dir)
  load_deadline = nil
  if not ok then error(gen, 0) end
  if errors then by_line(errors) end
  return gen, errors
end

return M
