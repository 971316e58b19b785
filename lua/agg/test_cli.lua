-- agg.test_cli: `aggway test` — runs the specs with busted inside a runtime VM (DESIGN §3 "Specs").
--
--   aggway test [-c DIR] [--watch] [BUSTED OPTIONS] [SPEC FILES OR FOLDERS]
--
-- What it adds to busted:
--   * `--help` prints the harness's own usage (busted's options follow it);
--   * a failure or an error in a test during which a script raised an error prints that error,
--     with its file:line, beside the assertion: `Expected 200, Passed in 500` then
--     `script errors in this test: scripts/page.lua:24: call to 'reviews': unknown option …`;
--   * `--watch` runs the specs, then again each time a .lua file under the scripts folder or the
--     spec folders changes (polled every WATCH_POLL_S; each run is a fresh process, so a changed
--     script is loaded anew). `--watch-runs N` stops after N runs (for scripts and tests).
local str_gsub, str_match = string.gsub, string.match
local M = {}

M.WATCH_POLL_S = 0.5

M.USAGE = [==[
usage: aggway test [-c DIR] [--watch [--watch-runs N]] [BUSTED OPTIONS] [SPEC ...]

Runs the page specs (default: the folder spec/ beside DIR) against the scripts folder DIR (default:
scripts) on the spec harness: stubbed upstreams, a virtual clock, the production runtime.

  -c DIR            the scripts folder the specs load (testing.gateway() with no dir),
                    anywhere on the line (busted's own -c is spelt --coverage here)
  --watch           run the specs, then again each time a .lua file in DIR or the spec
                    folders changes (Ctrl-C stops)
  --watch-runs N    with --watch: stop after N runs
  -h, --help        this text
  SPEC ...          spec files or folders (default: the spec folder beside DIR)

Every busted option works too (busted --help lists them), e.g.
  aggway test --filter "reviews time out"      only the tests whose name matches
  aggway test -o TAP spec/product-page_spec.lua

A spec in three lines (see docs/guide.md, "Testing your page"):
  local gw = require("agg.testing").gateway()
  gw:stub("product", "/products/42", { json = { id = 42 }, latency_ms = 40 })
  assert.equal(200, gw:get("/product-page/42").status)
]==]

-- The part of a logged script error a reader needs: "file:line: message" without the traceback.
local function short(line)
  local msg = str_gsub(line, "^error: ", "")
  local result = require "agg.result"
  return result.script_message(result.without_traceback(msg))
end

-- Makes the busted instance the runner creates print the script errors of a failed test beside
-- its assertion (busted.rewriteMessage makes every failure's message).
local function hook_busted()
  local testing = require "agg.testing"
  local make = require "busted.core"
  package.loaded["busted.core"] = function(...)
    local busted = make(...)
    local rewrite = busted.rewriteMessage
    busted.rewriteMessage = function(element, message, trace)
      local msg = rewrite(element, message, trace)
      local errs = testing.script_errors
      if element and element.descriptor == "it" and #errs > 0 then
        local seen, out = {}, {}
        for _, e in ipairs(errs) do
          local s = short(e)
          if not seen[s] then seen[s] = true out[#out + 1] = "  " .. s end
        end
        msg = msg .. "\nscript errors in this test:\n" .. table.concat(out, "\n")
      end
      return msg
    end
    busted.subscribe({ "test", "start" }, function()
      testing.clear_script_errors()
      return nil, true
    end)
    return busted
  end
end

local function quote(s) return "'" .. str_gsub(tostring(s), "'", "'\\''") .. "'" end

--- The spec folder run when none is named: spec/ beside the scripts folder (-c DIR's parent's
-- spec/, "spec" for a DIR without a parent part such as the default "scripts"), as the guide lays
-- a project out. Not the current directory's: `aggway test -c ../mine/scripts` from another
-- project ran that project's specs against the folder (a fresh user's trial).
function M.default_specs(dir)
  dir = str_gsub(dir or "scripts", "/+$", "")
  if dir == "." then return "../spec" end
  local parent = str_match(dir, "^(.*)/[^/]*$")
  if parent == nil then return "spec" end
  return parent .. "/spec" -- ("/scripts": "/spec")
end

-- (opened, not renamed onto itself: a read-only file system refuses the rename)
local function exists(path)
  local f = io.open(path, "r")
  if f then f:close() end
  return f ~= nil
end

-- busted's options that take the next argument as their value (busted --help): what follows
-- one of them is not a spec path
local VALUE_OPTS = {}
for _, o in ipairs { "-o", "--output", "--filter", "--filter-out", "-t", "--tags", "--exclude-tags", "-p", "--pattern",
                     "--exclude-pattern", "-m", "--lpath", "--cpath", "-r", "--run", "--seed", "--repeat", "-e",
                     "--lang", "--loaders", "--helper", "-C", "--directory", "--config-file", "-Xoutput", "-Xhelper",
                     "--coverage-config-file", "--lua", "-f" } do
  VALUE_OPTS[o] = true
end

-- The spec paths among busted's arguments args.
local function spec_paths(args)
  local paths, skip = {}, false
  for _, a in ipairs(args) do
    if skip then
      skip = false
    elseif a:sub(1, 1) == "-" then
      skip = VALUE_OPTS[a] == true
    else
      paths[#paths + 1] = a
    end
  end
  return paths
end

-- "path mtime" of every .lua file under the folders, sorted: a change anywhere changes the text.
local function snapshot(dirs)
  local q = {}
  for _, d in ipairs(dirs) do q[#q + 1] = quote(d) end
  local p = io.popen("find " .. table.concat(q, " ") .. " -name '*.lua' -printf '%p %T@\\n' 2>/dev/null | sort")
  local s = p:read("*a")
  p:close()
  return s
end

local function watch(args, runs)
  -- this aggway binary: the parent of the shell io.popen starts
  local p = io.popen("readlink /proc/$PPID/exe 2>/dev/null")
  local self = str_gsub((p:read("*l") or ""), "%s+$", "")
  p:close()
  if self == "" then self = "aggway" end
  local dir = AGGWAY_SCRIPTS or "scripts"
  local cmd = { quote(self), "test", "-c", quote(dir) }
  local roots = { dir }
  for _, a in ipairs(args) do cmd[#cmd + 1] = quote(a) end
  local paths = spec_paths(args)
  for _, a in ipairs(paths) do roots[#roots + 1] = a end
  if #paths == 0 then roots[#roots + 1] = M.default_specs(dir) end
  local line = table.concat(cmd, " ")
  local n = 0
  while true do
    local before = snapshot(roots)
    n = n + 1
    io.stdout:write(("aggway test --watch: run %d (%s)\n"):format(n, os.date("!%H:%M:%S")))
    io.stdout:flush()
    os.execute(line)
    if runs and n >= runs then return 0 end
    io.stdout:write("aggway test --watch: waiting for a change in " .. table.concat(roots, ", ") .. "\n")
    io.stdout:flush()
    while snapshot(roots) == before do
      -- os.execute returns non-zero when the sleep was interrupted (Ctrl-C): stop then
      local ok = os.execute("sleep " .. M.WATCH_POLL_S)
      if ok ~= 0 and ok ~= true then return 0 end
    end
  end
end

--- Runs `aggway test` with the global `arg` (arg[1..n]: what followed `test` and `-c DIR`).
function M.main()
  local args, rest = {}, {}
  local watching, runs = false, nil
  local i = 1
  while arg[i] ~= nil do
    local a = arg[i]
    if a == "-h" or a == "--help" then
      io.stdout:write(M.USAGE)
      os.exit(0)
    elseif a == "--watch" then
      watching = true
    elseif a == "--watch-runs" then
      runs = tonumber(arg[i + 1])
      if not runs or runs < 1 or runs % 1 ~= 0 then
        io.stderr:write("aggway test: --watch-runs takes a whole number of runs >= 1\n")
        os.exit(2)
      end
      i = i + 1
    else
      args[#args + 1] = a
    end
    i = i + 1
  end
  if runs and not watching then
    io.stderr:write("aggway test: --watch-runs goes with --watch\n")
    os.exit(2)
  end
  if watching then os.exit(watch(args, runs)) end
  for k = #arg, 1, -1 do arg[k] = nil end
  for k, a in ipairs(args) do arg[k] = a end
  if #spec_paths(args) == 0 then
    local specs = M.default_specs(AGGWAY_SCRIPTS)
    if not exists(specs) then
      io.stderr:write(("aggway test: no spec folder beside the scripts folder %s (%s): put the specs there, or name " ..
                       "them: aggway test -c %s path/to/spec\n"):format(AGGWAY_SCRIPTS or "scripts", specs,
                       AGGWAY_SCRIPTS or "scripts"))
      os.exit(2)
    end
    arg[#args + 1] = specs
  end
  hook_busted()
  require "busted.runner" ({ standalone = false })
end

return M
