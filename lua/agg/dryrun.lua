-- agg.dryrun: `aggway check` runs every endpoint once on the spec harness (issue 20), to catch the
-- call spec mistakes that only running shows: a spec built at run time, in a helper, from a table
-- the source does not show (agg.lint reads only what is written as a table constructor).
--
-- Each endpoint gets one request on the virtual clock: its route with every parameter "1", the
-- user its auth policy needs, and every upstream stubbed with `{}` (a 200 JSON object) after 1 ms.
-- The stubs are made up, so only the errors no made-up answer can cause are reported: those that
-- name a call spec — an unknown upstream or option, an option of the wrong type (the cache and
-- batch blocks' too), a fetch_then key missing from the table — with the file:line of the spec
-- (agg.where); an argument of agg's functions that is not what they take (agg.page's options, a
-- shaping helper's list of keys or function); and a call of a function agg does not have (`agg.fetchall { … }`),
-- on a line of a script that writes it so. Any other script error (indexing the made-up data)
-- says nothing about the script and is left to its specs. A handler the script time limit or
-- the memory limit stops is reported: nothing in answers of {} ends its loop, and a real
-- upstream may answer that. A handler that errors before reaching
-- a call hides that call's mistakes: the dry run finds what one run with empty answers reaches. A folder with
-- scripts = { trusted = true } is not run (its handlers may have effects outside the gateway).
local str_find, str_match, str_sub = string.find, string.match, string.sub
local testing = require "agg.testing"
local result = require "agg.result"
local sys = require "agg.sys"
local config = require "agg.config"
local where = require "agg.where"
local lint = require "agg.lint"
local sandbox = require "agg.sandbox"

local M = {}

--- Seconds the dry run of a folder may take (monotonic time), checked before each endpoint: the
-- endpoint running when it passes may add up to its script time limit.
M.BUDGET_S = 30

-- Messages of the mistakes the dry run reports whatever they got: names no made-up answer gives
-- (an unknown upstream, option, retry option or response key, a fetch_then key, a cycle, `agg`
-- read as a global by a script without its require: agg.sandbox; a handler that returned
-- agg.fetch_all's results without agg.page: agg.runtime), from
-- agg.callspec, agg.fanout, agg.cache, agg.merge, agg.page and agg.runtime. (An upstream name or a
-- path read from the answers is nil in a dry run: "a call spec starts with the upstream name" is
-- left to the specs.)
local SPEC_ERRORS = {
  "unknown upstream '", "unknown option", "is not supported", "retry option '",
  "fetch_then for '", "fetch_then dependency cycle", "agg.page: option 'headers' must be a table",
  "the handler's response has an unknown key '", "agg is not a global: ",
  "it returned the results of agg.fetch_all without agg.page",
  -- (the method is the script's: made-up data gives nil, which is GET)
  "option 'cache' is for GET and HEAD calls only",
  -- a lib/ module without its return, read (agg.sandbox)
  "returned nothing: end it with `return M`",
  -- a merged call with options it cannot have (agg.callspec): the script's own options, which no
  -- made-up answer sets (every request of the endpoint fails with them)
  "a merged call (batch) is tried once", "a merged call (batch) is not cached", "a merged call (batch) has no body",
}
-- Every mistake agg.callspec finds in a call ("call to 'name': …": an option, the cache and batch
-- blocks, retry, hedge) and the argument mistakes of agg's functions ("agg.pick: the list of keys
-- must be a table, got string") whose message says it was given what no made-up answer gives. Its
-- data is {} and every field of it nil, and a script derives numbers from them (a length, a
-- count) and tables (the data itself): a string, a boolean or a function where the mistake is is
-- the script's own ("got string", 'got "60"'), as is any unknown option's name; "got nil", a
-- table, a number, and the strings a script makes of a field ('got "nil"', tostring; 'got ""',
-- `(field or "")`) are left to the specs.
local CALL_ERROR = "call to '[^']*': "
local AGG_ERROR = "agg%.([%w_]+): "
local AGG_CHECKED = { pick = true, omit = true, rename = true, map = true, limit = true, shape = true,
                      fetch_then = true, page = true }
local LITERAL = { "got string", "got boolean", "got function", 'got "' }

local function is_spec_error(msg)
  local fn = str_match(msg, AGG_ERROR)
  if (str_find(msg, CALL_ERROR) or (fn and AGG_CHECKED[fn])) and not str_find(msg, 'got "nil"', 1, true) and
     not str_find(msg, 'got ""', 1, true) then
    for _, p in ipairs(LITERAL) do
      if str_find(msg, p, 1, true) then return true end
    end
  end
  for _, p in ipairs(SPEC_ERRORS) do
    if str_find(msg, p, 1, true) then return true end
  end
  return false
end

-- The lines of the script file an error message names (agg.where keeps each script's lines as
-- the loader loads it; nothing is read here): file as the message gives it, which LuaJIT cuts to
-- "...its end" when the path is long. nil for a file the loader did not load.
local function script_lines(file)
  local lines = where.sources[file]
  if lines or str_sub(file, 1, 3) ~= "..." then return lines end
  local tail = str_sub(file, 4)
  for path, l in pairs(where.sources) do
    if #path >= #tail and str_sub(path, -#tail) == tail then return l end
  end
  return nil
end

-- "file:line: agg.X is not a function of agg …" for a Lua error of the dry run that no made-up
-- answer causes: the call of a field agg does not have, written `agg.X(`, `agg.X {` or `agg.X "` on
-- the line of a script that the error names. nil for any other error. (A read through a field
-- the request lacks, `req.param.id`, is left out: in a helper, `req` may be anything, the
-- made-up data included.)
local function misnamed(msg)
  local file, line, field = str_match(msg, "^(.-):(%d+): attempt to call field '([%w_]+)' %(a nil value%)$")
  if not file then return nil end
  local lines = script_lines(file)
  local text = lines and lines[tonumber(line)]
  if not text then return nil end
  if not str_find(text, "%f[%w_]agg%." .. field .. "%s*[%({\"']") then return nil end
  local agg = require "agg"
  if agg[field] ~= nil then return nil end
  -- (agg is a read-only view: its names are its metatable's __index's, agg.readonly)
  return ("%s:%s: agg.%s is not a function of agg%s"):format(file, line, field,
                                                           config.suggest(field, debug.getmetatable(agg).__index))
end

-- The path of a route with every parameter "1": "GET /items/{id}/x" -> "/items/1/x".
local function sample_path(ep)
  local parts = {}
  for _, s in ipairs(ep.segments) do parts[#parts + 1] = type(s) == "string" and s or "1" end
  return "/" .. table.concat(parts, "/")
end

--- Runs each endpoint of the scripts folder dir once against generated stubs. Returns a list of
-- "file:line: message" strings (empty when nothing was found). The folder must load (run
-- agg.loader first: this returns its errors as they are otherwise).
function M.run(dir)
  local ok, gw = pcall(testing.gateway, { dir = dir })
  if not ok then return { tostring(gw) } end
  -- a trusted folder's handlers may do anything (io, os.execute): check does not run them
  if gw.gen.config.scripts.trusted then return {} end
  -- what each handler's source reads of its request (agg.lint.check_reads), against the text of
  -- every file of the folder
  local texts = {}
  local function read_all(prefix, rels)
    for _, rel in ipairs(rels) do
      local path = dir .. "/" .. prefix .. rel
      local f = io.open(path, "rb")
      if f then texts[path] = f:read(8 * 1024 * 1024) or ""; f:close() end
    end
  end
  read_all("", sys.listdir(dir))
  read_all("lib/", sys.listdir(dir .. "/lib"))
  local found, seen = lint.check_reads(gw.gen.endpoints, texts), {}
  for _, u in ipairs(gw.gen.config.upstreams) do
    if u.name == "@token_exchange" then
      gw:stub(u.name, "POST", "/*", { json = { access_token = "dry-run", token_type = "Bearer", expires_in = 60 } })
    else
      gw:stub(u.name, "/*", { json = {}, latency_ms = 1 })
    end
  end
  local started = sys.monotonic_s()
  for i, ep in ipairs(gw.gen.endpoints) do
    -- each run may take up to the script time limit: generated endpoints that all spin would make
    -- check (and so every deploy that runs it) last their number times the limit
    if sys.monotonic_s() - started > M.BUDGET_S then
      found[#found + 1] = ("%s:%d: the dry run stopped after %d s, before %s: %d endpoints were not run " ..
                           "(handlers that run into the script time limit with stubbed answers?)"):format(
                           ep.file, ep.line or 1, M.BUDGET_S, ep.route, #gw.gen.endpoints - i + 1)
      break
    end
    local policy = ep.auth or { kind = "none" }
    local user
    if policy.kind == "jwt" then
      user = { sub = "aggway-check", scopes = policy.scopes }
    elseif policy.kind == "api_key" then
      user = { app = "aggway-check" }
    end
    testing.clear_script_errors()
    -- a request that never settles or a call without a stub (a path the "/*" stub cannot match)
    -- is the harness's error, not the script's: the dry run goes on with the next endpoint
    pcall(gw.request, gw, ep.method == "*" and "GET" or ep.method, sample_path(ep), { user = user })
    for _, e in ipairs(testing.script_errors) do
      -- "script error in GET /x (file), section s: file:24: call to … (called at line 79) | stack…"
      local inner = result.script_message(result.without_traceback(e))
      local report = is_spec_error(inner) and inner or misnamed(inner)
      -- the script time limit or the memory limit stopped it on answers of {}: an endless loop (or
      -- growth) no data stops, which a real upstream's empty object would start as well
      -- (only with the place it stopped at: "file:line: stopped: …")
      if not report and str_find(inner, "^[^\n]-:%d+: stopped: ") and
         (str_find(inner, sandbox.STOP_TEXT, 1, true) or str_find(inner, sandbox.MEMORY_STOP_TEXT, 1, true)) then
        report = inner .. ", every upstream answering {}"
      end
      if report and not seen[report] then
        seen[report] = true
        found[#found + 1] = report .. " (found by a dry run of " .. ep.route .. ")"
      end
    end
  end
  return found
end

return M
