-- agg.result: the result of a section's call, as a script sees it ({ ok, status, data, error, ms,
-- http_status, headers, body }), and the facts the runtime keeps about it out of the script's
-- sight (section, required, decode, the parsed body's ref): agg.exchange makes results from
-- answers, agg.fanout from continuations and nested fan-outs, agg.page reads them.
local str_find, str_gmatch, str_gsub, str_match = string.find, string.gmatch, string.gsub, string.match
local json = require "agg.json"
local callable = require "agg.callable"

-- "@/…/lua/" of the runtime's own files (a place there is never the script's)
local RUNTIME_PREFIX = str_match(debug.getinfo(1, "S").source, "^(@.*/)agg/[^/]*$")

local M = {}

local core                                             -- the transport (agg.runtime binds it)
-- A result's facts ({ key (its section), required, raw, … }: the call's spec, or a table of their
-- own) are its metatable's `info` (one metatable per result): they live exactly as long as the
-- result. (A weak-keyed table result -> info marks its values while the key is being found dead,
-- so the facts, the call's spec and the answer's body outlived every page by a collector cycle.)
-- A call's result has the call's own table as its metatable instead (agg.callspec puts the
-- metamethods in it: one table less per call): its info is its metatable.
local getmt = debug.getmetatable
local result_index, call_index, result_newindex
local function info_of(t)
  local mt = getmt(t)
  if mt then
    local ix = rawget(mt, "__index")
    if ix == call_index then return mt end
    if ix == result_index then return rawget(mt, "info") end
  end
  return nil
end

--- Binds the transport (agg.runtime.init).
function M.bind(transport) core = transport end

--- The page request's headers for request context ctx: "name\0value\0…" (the transport's form;
-- "" for none), or the table agg.group made of them. The C worker does not hand them over with
-- every request (runtime.start has none, ctx.req_headers false): the first to need them asks
-- core.request_headers once (agg.contract), and they are kept in ctx.
function M.request_headers(ctx)
  local h = ctx.req_headers
  if h == false then
    h = core.request_headers and core.request_headers(ctx.rid) or ""
    ctx.req_headers = h
  end
  return h
end

--- The user the edge authenticated request context ctx as, and its verified bearer token: the
-- user table ({ via = "jwt", sub, claims_ref } or { via = "api_key", app, plan }) or nil, and the
-- token (a JWT's) or nil. The C worker does not hand them over with every request (ctx.user is
-- true when there is a user, false when the endpoint has no auth): the first to need them (req.user,
-- an identity, a per-user cache key) asks core.request_user once, and they are kept in ctx. A
-- request that has ended gives none (ctx.user becomes false: agg.runtime.request_private, which
-- reads ctx.user, is asked only while the request runs).
function M.request_user(ctx)
  local u = ctx.user
  if u == true then
    local user, token = core.request_user(ctx.rid)
    u = user or false
    ctx.user, ctx.token = u, token or false
  end
  return u or nil, ctx.token or nil
end

-- A result's `data` is materialized from the parsed upstream JSON on first read; a section the
-- script never reads is encoded straight from the parsed JSON.
-- Upstream response headers arrive as "name\0value\0…" and become a table on first read;
-- repeated names are joined with ", " (RFC 9110 §5.3).
local function parse_headers(s)
  local h = {}
  for name, value in str_gmatch(s, "([^%z]*)%z([^%z]*)%z") do
    local cur = h[name]
    h[name] = cur and (cur .. ", " .. value) or value
  end
  return h
end

-- What a result t whose facts are info gives for a field it does not hold.
local function lookup(info, t, k)
    if k == "headers" then
      local raw = info and info.raw_headers
      if raw then
        info.raw_headers = nil
        if type(raw) ~= "string" then raw = json.raw_extra(raw) or "" end -- kept in the body's ref
        local h = parse_headers(raw)
        rawset(t, "headers", h)
        return h
      end
    elseif k == "body" then
      -- the text of a JSON body, kept once in its raw ref until someone asks for it
      local ref = info and info.body_ref
      if ref then
        local b = json.raw(ref)
        rawset(t, "body", b)
        return b
      end
    elseif k == "data" then
      local ref = info and info.ref
      if ref then
        local d = json.materialize(ref)
        info.ref = nil
        rawset(t, "data", d)
        return d
      end
    end
    return nil
end
result_index = function(t, k) return lookup(rawget(getmt(t), "info"), t, k) end
call_index = function(t, k) return lookup(getmt(t), t, k) end
result_newindex = function(t, k, v)
    if k == "data" then
      local info = info_of(t)
      if info then info.ref = nil end
    end
    rawset(t, k, v)
end

--- The metatable of a new result whose facts are info (getmetatable gives scripts a name, never
-- the table).
local function mt_for(info)
  if M.on_new then M.on_new(info) end
  return { __index = result_index, __newindex = result_newindex, __metatable = "agg.result", info = info }
end

M.info_of, M.parse_headers = info_of, parse_headers
--- The metamethods a call's table holds (agg.callspec's constructor), so that it serves as the
-- metatable of its results as is (M.of_call): __index, __newindex and __metatable ("agg.result":
-- getmetatable gives scripts a name, never the table).
M.CALL_INDEX, M.NEWINDEX, M.METATABLE = call_index, result_newindex, "agg.result"

--- The metatable of a new result of call x (a table agg.callspec made, or its copy): x itself.
-- Calls M.on_new as mt_for does.
function M.of_call(x)
  local on_new = M.on_new
  if on_new then on_new(x) end
  return x
end
--- M.on_new (nil): a spec's function(info), called with each new result's facts (the harness
-- looks at call tables with it).
M.on_new = nil

--- True when r is a call result made by the scheduler.
function M.is_result(r) return info_of(r) ~= nil end

--- The data of a result as the page encoder wants it: a Lua value, a json ref, or nil. info: r's
-- facts when the caller has them (info_of), else nil.
function M.section_data(r, info)
  local d = rawget(r, "data")
  if d ~= nil then return d end
  info = info or info_of(r)
  local ref = info and info.ref
  if ref then return ref end
  if info and info.decode == false and r.ok then return r.body end
  return nil
end

function M.section_name(r)
  local info = info_of(r)
  return info and tostring(info.key) or "?"
end

function M.is_required(r)
  local info = info_of(r)
  -- a section cancelled because another required one failed (fail fast) does not decide the page
  return info ~= nil and info.required and not info.cancelled
end

--- Logs a script error of request ctx (what: where in the request; co: the coroutine, for its
-- traceback).
local function where_of(ctx)
  return ctx and ctx.ep and (ctx.ep.route .. " (" .. ctx.ep.file .. ")") or "?"
end

-- The traceback's frames are joined with " | " on the error's one log line ("… boom | stack
-- traceback: | scripts/x.lua:3: in function 'handler' | …"): one record per event, readable as is,
-- while a newline in the message itself (a client's decoded %0A) is still escaped by the log.
function M.traceback_line(co)
  local tb = str_gsub(debug.traceback(co, "", 0), "^\n", "")
  local frames = {}
  for frame in str_gmatch(tb, "[^\n]+") do frames[#frames + 1] = (str_gsub(frame, "^%s+", "")) end
  return table.concat(frames, " | ")
end

--- A logged script error without its traceback (what a spec failure or `aggway check` shows).
function M.without_traceback(msg)
  local at = str_find(msg, " | stack traceback:", 1, true)
  return at and msg:sub(1, at - 1) or msg
end

--- The script's own message in a line M.log_error wrote, its traceback already off
-- (M.without_traceback): "script error in GET /x (scripts/x.lua), section s: scripts/x.lua:3: boom"
-- gives "scripts/x.lua:3: boom". The part from the script's file:line, else from the first ": "
-- after the first parenthesized part without parentheses inside (a route's pattern or a section
-- key may hold ':', "GET /o/{id:[0-9]+}"); msg itself when it is no such line.
function M.script_message(msg)
  local _, inner = str_match(msg, "^script error in .-%(([^()]+)%).-: (%1:%d+:.*)$")
  if not inner then _, inner = str_match(msg, "^script error in .-%(([^()]+)%)[^:]*: (.*)$") end
  return inner or msg
end

--- An xpcall message handler for the runtime's reads of what a script returned (its metamethods
-- run there, on the runtime's own thread): a message that names the runtime's line or no line is
-- put at the script's frame on the stack, the metamethod that raised. Other values are returned
-- as they are.
function M.at_script_frame(e)
  if type(e) ~= "string" then return e end
  local src, rest = str_match(e, "^([^\n]-):%d+: (.*)$")
  if src and not (RUNTIME_PREFIX and ("@" .. src):sub(1, #RUNTIME_PREFIX) == RUNTIME_PREFIX) then return e end
  for level = 2, 100 do
    local info = debug.getinfo(level, "Sl")
    if not info then break end
    if info.currentline > 0 and info.source:byte(1) == 64 and
       not (RUNTIME_PREFIX and info.source:sub(1, #RUNTIME_PREFIX) == RUNTIME_PREFIX) then
      return ("%s:%d: %s"):format(info.short_src, info.currentline, rest or e)
    end
  end
  return e
end

-- How much of a script's error message a log line quotes, bytes: the log cuts a line at 8 KB
-- (base/log.c), and the traceback comes after the message.
local MESSAGE_MAX = 4096

--- What a log line quotes of an error value a script raised: a string, cut to MESSAGE_MAX bytes
-- and its size named ("…(52428800 bytes in all)"); any other value by its type. Never runs the
-- script's code (a table's __tostring), and never copies more than MESSAGE_MAX bytes of a long
-- message (a 300 MB one was formatted whole: about 1.4 s in the runtime, where no script limit
-- stops).
function M.error_text(err)
  if type(err) ~= "string" then
    return ("an error value of type %s (use error(\"message\") to say what is wrong)"):format(type(err))
  end
  -- (a newcomer's first mistake: "attempt to index global 'agg' (a nil value)" named no cure, and
  -- aggway check's dry run passed it, agg.dryrun; the global stays nil, as `agg or require "agg"`
  -- reads it)
  if str_find(err, "global 'agg' (a nil value)", 1, true) then err = err .. ": " .. M.NO_AGG end
  if #err > MESSAGE_MAX then
    return err:sub(1, MESSAGE_MAX) .. ("…(%d bytes in all)"):format(#err)
  end
  return err
end

--- What a script that uses `agg` without its require is told (M.error_text adds it to the message).
M.NO_AGG = 'agg is not a global: begin the script with local agg = require "agg"'

--- Logs a script error of request ctx: what (nil, or "continuation of s", "fallback of s"), err
-- (the error value), co: the coroutine it was raised in (its traceback is logged, and a message
-- placed in the runtime or nowhere gets the script's line on its stack), or the script's function
-- that raised outside a coroutine (a fallback: its first line), or nil.
function M.log_error(ctx, what, err, co)
  local raw = err
  err = M.error_text(err)
  if type(raw) ~= "string" then
    -- its type, said as is
  elseif co then
    -- a message placed in the runtime (error("…", 2) from a handler names the runtime's line that
    -- called it) or nowhere (error("…", 0), a level past the stack) is put at the script's line on
    -- the coroutine's stack instead
    local src, rest = str_match(err, "^([^\n]-):%d+: (.*)$")
    if not src then rest = err end
    if type(co) == "function" then
      -- a function of the script that raised outside a coroutine of its own (a fallback): its
      -- first line when the message names the runtime or nothing
      local info = debug.getinfo(co, "S")
      if (not src or (RUNTIME_PREFIX and ("@" .. src):sub(1, #RUNTIME_PREFIX) == RUNTIME_PREFIX)) and
         info.source:byte(1) == 64 and info.linedefined > 0 then
        err = ("%s:%d: %s"):format(info.short_src, info.linedefined, rest)
      end
      co = nil
    elseif not src or (RUNTIME_PREFIX and ("@" .. src):sub(1, #RUNTIME_PREFIX) == RUNTIME_PREFIX) then
      for level = 0, 100 do
        local info = debug.getinfo(co, level, "Sl")
        if not info then break end
        if info.currentline > 0 and info.source:byte(1) == 64 and
           info.source:sub(1, #RUNTIME_PREFIX) ~= RUNTIME_PREFIX then
          err = ("%s:%d: %s"):format(info.short_src, info.currentline, rest)
          break
        end
      end
    end
  end
  -- (a traceback only of a coroutine: co may still be the script's function when the error was no
  -- string, error(p) of a fallback that raises its problem table)
  core.log("error", ("script error in %s%s: %s%s"):format(where_of(ctx), what and (", " .. what) or "",
    err, type(co) == "thread" and (" | " .. M.traceback_line(co)) or ""))
end

--- Logs why a call of request ctx failed, with the transport's own text (why: the upstream's URL
-- and address, errno text, TLS reason …). The client's problem has none of it (agg.problem).
function M.log_call_failure(ctx, section, upstream, why)
  core.log("warn", ("call failed in %s, section %s, upstream %s: %s"):format(where_of(ctx), tostring(section),
    tostring(upstream), tostring(why)))
end

-- A result's internal facts (key: its section, required, raw) are its metatable's info. A call's
-- normalized spec already carries them (its key is set when the call starts), so it serves as the
-- info as is, and as the metatable itself when it is a call's table (M.of_call).
function M.new(section, spec)
  if spec and spec.key == section then
    return setmetatable({}, rawget(spec, "__index") == call_index and M.of_call(spec) or mt_for(spec))
  end
  return setmetatable({}, mt_for({ key = section, required = spec and spec.required or false,
                                    decode = not spec or spec.decode ~= false }))
end

-- Script functions the runtime calls in the middle of its own work (a fallback, a response's
-- metamethods, a merged call's request and split functions) must not wait: an agg.fetch_all there
-- would suspend the coroutine the runtime is working in, half way through (a fan-out being
-- started, the ready continuations being run, another request's answer delivered). While one
-- runs, agg.fanout refuses to wait in that coroutine. Marked per coroutine (weak keys): a trusted
-- script that yields there anyway leaves only its own coroutine marked.
local in_callback = setmetatable({}, { __mode = "k" }) -- coroutine (or MAIN) -> callbacks running
local MAIN = {}

--- Marks the running coroutine as running a script callback of the runtime's until
-- leave_callback(key); returns the key to give it. (The page's own path, runtime.finish_request,
-- uses the pair directly: callback_pcall's pass-through of results costs it instructions.)
function M.enter_callback()
  local k = coroutine.running() or MAIN
  in_callback[k] = (in_callback[k] or 0) + 1
  return k
end

--- Ends what enter_callback began.
function M.leave_callback(k)
  local d = (in_callback[k] or 1) - 1
  in_callback[k] = d > 0 and d or nil
end

local function leave_with(k, ...)
  M.leave_callback(k)
  return ...
end

--- pcall(f, ...) of a script callback the runtime makes in the middle of its own work (a fallback,
-- a merged call's functions), marked as such while it runs (see above). Returns what pcall returns.
function M.callback_pcall(f, ...)
  return leave_with(M.enter_callback(), pcall(f, ...))
end

--- True while the running coroutine runs a script callback of the runtime's (see enter_callback).
function M.in_callback()
  return in_callback[coroutine.running() or MAIN] ~= nil
end

-- Marks r failed with problem p, serving the call's fallback when it has one.
function M.fail(ctx, r, p, spec)
  r.ok = false
  r.error = p
  if spec and spec.fallback ~= nil then
    local fb = spec.fallback
    -- (a raw JSON ref, json.parse's, is a C closure but data: a value, never called)
    if callable.is(fb) then
      local ok, v = M.callback_pcall(fb, p)
      if not ok then
        M.log_error(ctx, "fallback of " .. info_of(r).key, v, fb)
        r.status = "unavailable"
        return r
      end
      fb = v
    end
    r.status = "fallback"
    r.data = fb
  else
    r.status = "unavailable"
  end
  return r
end

return M
