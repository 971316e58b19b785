-- agg.lint: checks the call specs a script's source shows, without running it (issue 20).
--
-- A call spec's options are only read when a request comes, so `requird = true` inside a handler
-- would pass `aggway check` and fail in production. This module reads the source with a small Lua
-- tokenizer and looks at every table constructor that starts like a call spec — a string, a comma,
-- then an expression whose first token is a string starting with '/':
--   { "reviews", "/reviews/" .. id, timeout_ms = 100, requird = true }
-- and at every agg.fetch_then("key", …) / agg.fetch_then({ "a", "b" }, …) written as a field of a
-- table constructor (the fetch_all table). What it can see, it checks:
--   * the upstream is declared in gateway.lua;
--   * every option is one agg.callspec knows (else "unknown option … (did you mean …?)");
--   * an option whose value is a literal (string, number, true/false, table, function) has the type
--     agg.callspec wants;
--   * a fetch_then dependency names a sibling key of the same table constructor.
-- Specs built at run time (a variable, a function's result) are out of its sight: the run-time
-- checks of agg.callspec catch those, at the line the spec was written (see agg.fanout).
local str_find, str_gmatch, str_gsub, str_match = string.find, string.gmatch, string.gsub, string.match
local callspec = require "agg.callspec"
local config = require "agg.config"

local M = {}

-- Splits src into tokens { t = kind, v = text, line = n }. kind: "name", "string" (v is the
-- string's value for plain quoted strings, nil for long strings), "number", "op" (one symbol or
-- the multi-char ones Lua has), "eof". Comments and white space are dropped. A source Lua itself
-- would refuse gives whatever tokens come; the loader reports the syntax error.
function M.tokenize(src)
  local toks, i, line, n = {}, 1, 1, #src
  local function add(t, v, l) toks[#toks + 1] = { t = t, v = v, line = l } end
  local function long_bracket(at)
    local eq = str_match(src, "^%[(=*)%[", at)
    if not eq then return nil end
    local close = "]" .. eq .. "]"
    local s = at + #eq + 2
    local e = str_find(src, close, s, true)
    local stop = e and (e + #close) or (n + 1)
    local body = src:sub(s, (e or n + 1) - 1)
    return stop, body
  end
  while i <= n do
    local c = src:sub(i, i)
    if c == "\n" then
      line, i = line + 1, i + 1
    elseif str_find(c, "%s") then
      i = i + 1
    elseif src:sub(i, i + 1) == "--" then
      local stop, body = long_bracket(i + 2)
      if stop then
        local _, nl = str_gsub(body, "\n", "")
        line, i = line + nl, stop
      else
        local e = str_find(src, "\n", i, true)
        i = e or n + 1
      end
    elseif c == "[" and str_find(src, "^%[=*%[", i) then
      local stop, body = long_bracket(i)
      add("string", nil, line)
      local _, nl = str_gsub(body, "\n", "")
      line, i = line + nl, stop
    elseif c == '"' or c == "'" then
      local j, buf, l0 = i + 1, {}, line
      while j <= n do
        local d = src:sub(j, j)
        if d == c then break end
        if d == "\\" then
          local e = src:sub(j + 1, j + 1)
          if e == "\n" then line = line + 1 end
          buf[#buf + 1] = ({ n = "\n", t = "\t", r = "\r" })[e] or e
          j = j + 2
        else
          if d == "\n" then line = line + 1 end
          buf[#buf + 1] = d
          j = j + 1
        end
      end
      add("string", table.concat(buf), l0)
      i = j + 1
    elseif str_find(c, "[%a_]") then
      local w = str_match(src, "^[%w_]+", i)
      add("name", w, line)
      i = i + #w
    elseif str_find(c, "%d") or (c == "." and str_find(src:sub(i + 1, i + 1), "%d")) then
      local w = str_match(src, "^0[xX][%x%.]+[pP]?[-+]?%x*", i) or str_match(src, "^[%d%.]+[eE][-+]?%d+", i)
        or str_match(src, "^[%d%.]+", i)
      w = w .. (str_match(src, "^[uUlLi]+", i + #w) or "")
      add("number", w, line)
      i = i + #w
    else
      local op = str_match(src, "^%.%.%.", i) or str_match(src, "^[=~<>]=", i) or str_match(src, "^%.%.", i)
        or str_match(src, "^::", i) or c
      add("op", op, line)
      i = i + #op
    end
  end
  add("eof", nil, line)
  return toks
end

-- The Lua type a value expression certainly has, from its tokens [a, b] (the whole expression at
-- one level), or nil when that needs running it.
local function literal_type(toks, a, b)
  local t = toks[a]
  if a == b then
    if t.t == "string" then return "string" end
    if t.t == "number" then return "number" end
    if t.t == "name" and (t.v == "true" or t.v == "false") then return "boolean" end
    if t.t == "name" and t.v == "nil" then return "nil" end
    return nil
  end
  if t.t == "op" and t.v == "{" and toks[b].v == "}" then
    -- one constructor, not { … } .. x: its closing brace must be the expression's last token
    local depth = 0
    for k = a, b do
      local v = toks[k].t == "op" and toks[k].v
      if v == "{" or v == "(" or v == "[" then depth = depth + 1
      elseif v == "}" or v == ")" or v == "]" then
        depth = depth - 1
        if depth == 0 and k < b then return nil end
      end
    end
    return "table"
  end
  if t.t == "name" and t.v == "function" then
    local e = toks[b]
    if e.t == "name" and e.v == "end" then return "function" end
  end
  -- a string followed only by concatenations of names or strings is a string
  if t.t == "string" then
    for k = a + 1, b do
      local v = toks[k]
      if not (v.t == "op" and v.v == "..") and v.t ~= "string" and v.t ~= "name" and v.t ~= "number"
        and not (v.t == "op" and v.v == ".") then
        return nil
      end
    end
    return "string"
  end
  return nil
end

-- Splits the table constructor whose '{' is toks[open] into its fields. Returns the index of its
-- '}' and a list of fields { key = "name" or nil, key_tok, a, b } (a..b: the value's tokens).
local function fields_of(toks, open)
  local fields, depth, k = {}, 0, open + 1
  local start = k
  local function close_field(stop)
    if stop < start then return end
    local f = { a = start, b = stop }
    local t1, t2 = toks[start], toks[start + 1]
    if t1.t == "name" and t2 and t2.t == "op" and t2.v == "=" then
      f.key, f.key_tok, f.a = t1.v, t1, start + 2
    elseif t1.t == "op" and t1.v == "[" and toks[start + 1].t == "string" and toks[start + 2].v == "]"
      and toks[start + 3].v == "=" then
      f.key, f.key_tok, f.a = toks[start + 1].v, toks[start + 1], start + 4
    end
    if f.a <= f.b then fields[#fields + 1] = f end
  end
  while toks[k].t ~= "eof" do
    local t = toks[k]
    if t.t == "op" then
      if t.v == "{" or t.v == "(" or t.v == "[" then depth = depth + 1
      elseif t.v == "}" or t.v == ")" or t.v == "]" then
        if depth == 0 then
          close_field(k - 1)
          return k, fields
        end
        depth = depth - 1
      elseif (t.v == "," or t.v == ";") and depth == 0 then
        close_field(k - 1)
        start = k + 1
      end
    elseif t.t == "name" and (t.v == "function" or t.v == "do" or t.v == "then") then
      -- blocks end with 'end': count them as brackets so a ',' inside does not split the field
      depth = depth + 1
    elseif t.t == "name" and t.v == "end" then
      depth = depth - 1
    elseif t.t == "name" and t.v == "repeat" then
      depth = depth + 1
    elseif t.t == "name" and t.v == "until" then
      depth = depth - 1
    end
    k = k + 1
  end
  return k, fields
end

-- (while/for bodies open with 'do', if with 'then' (elseif's 'then' is closed by the same 'end'))
local function fix_elseif(toks)
  -- 'elseif … then' adds a 'then' without its own 'end': drop those 'then' from the count by
  -- marking them as plain ops
  for k = 1, #toks do
    if toks[k].t == "name" and toks[k].v == "elseif" then
      for j = k + 1, #toks do
        if toks[j].t == "name" and toks[j].v == "then" then toks[j] = { t = "op", v = "then", line = toks[j].line } break end
      end
    end
  end
end

local names_of = config.names

-- Results by file, text and upstream names: the spec harness loads the same folder for every test,
-- and a reload mostly the same files (kept bounded: cleared when it holds 256 entries).
local memo, memo_n = {}, 0

--- Checks the call specs in src (the text of file). upstreams: set of declared upstream names
-- (name -> anything). Returns a list of "file:line: message" strings (empty when all is well).
function M.check(src, file, upstreams)
  local names = {}
  for k in pairs(upstreams or {}) do names[#names + 1] = k end
  table.sort(names)
  local key = file .. "\0" .. table.concat(names, ",") .. "\0" .. src
  local hit = memo[key]
  if hit then return hit end
  local errors = M.check_uncached(src, file, upstreams)
  if memo_n >= 256 then memo, memo_n = {}, 0 end
  memo[key], memo_n = errors, memo_n + 1
  return errors
end

function M.check_uncached(src, file, upstreams)
  local toks = M.tokenize(src)
  fix_elseif(toks)
  local errors = {}
  local function err(line, msg) errors[#errors + 1] = ("%s:%d: %s"):format(file, line, msg) end
  local options = callspec.OPTIONS
  for k = 1, #toks do
    local t = toks[k]
    if t.t == "op" and t.v == "{" then
      local _, fields = fields_of(toks, k)
      local f1, f2 = fields[1], fields[2]
      -- a call spec: { "upstream", "/path…" … }
      if f1 and f2 and not f1.key and not f2.key and f1.a == f1.b and toks[f1.a].t == "string"
        and toks[f2.a].t == "string" and (toks[f2.a].v or ""):byte(1) == 47 then
        local name = toks[f1.a].v
        if upstreams and not upstreams[name] then
          err(toks[f1.a].line, ("call to unknown upstream '%s'%s (gateway.lua declares: %s)"):format(
            name, config.suggest(name, upstreams), names_of(upstreams)))
        end
        for _, f in ipairs(fields) do
          if f.key then
            local want = options[f.key]
            if want == nil then
              if f.key == "forward_auth" then
                err(f.key_tok.line, ("call to '%s': " .. callspec.FORWARD_AUTH_TEXT):format(name))
              elseif callspec.NOT_YET[f.key] then
                err(f.key_tok.line, ("call to '%s': option '%s' is not supported by this version of aggway"):format(name, f.key))
              else
                err(f.key_tok.line, ("call to '%s': unknown option '%s'%s"):format(name, f.key, config.suggest(f.key, options)))
              end
            elseif want ~= true then
              local got = literal_type(toks, f.a, f.b)
              if got and got ~= "nil" and got ~= want then
                err(f.key_tok.line, ("call to '%s': option '%s' must be a %s, got %s"):format(name, f.key, want, got))
              end
            end
          end
        end
      end
      -- fetch_then dependencies written as fields of this table
      local keys = {}
      for _, f in ipairs(fields) do if f.key then keys[f.key] = true end end
      for _, f in ipairs(fields) do
        local a = f.a
        -- [agg.]fetch_then ( dep
        local j = a
        if toks[j].t == "name" and toks[j + 1].v == "." then j = j + 2 end
        if toks[j].t == "name" and toks[j].v == "fetch_then" and toks[j + 1].v == "(" then
          local d = j + 2
          local deps = {}
          if toks[d].t == "string" and toks[d].v then
            deps[1] = toks[d]
          elseif toks[d].v == "{" then
            local _, dfields = fields_of(toks, d)
            local spec = dfields[2] and toks[dfields[2].a].t == "string" and (toks[dfields[2].a].v or ""):byte(1) == 47
            if not spec then
              for _, df in ipairs(dfields) do
                if not df.key and df.a == df.b and toks[df.a].t == "string" and toks[df.a].v then deps[#deps + 1] = toks[df.a] end
              end
            end
          end
          for _, dt in ipairs(deps) do
            if not keys[dt.v] then
              err(dt.line, ("fetch_then for '%s' depends on '%s', which is not a key of this table%s (keys: %s)"):format(
                f.key or "?", dt.v, config.suggest(dt.v, keys), names_of(keys)))
            elseif dt.v == f.key then
              err(dt.line, ("fetch_then for '%s' depends on itself"):format(dt.v))
            end
          end
        end
      end
    end
  end
  return errors
end

-- The fields of a handler's req (agg.runtime; docs/api.md "req").
local REQ_FIELDS = { method = true, path = true, params = true, query = true, headers = true, body = true,
                     json = true, route = true, remaining_ms = true, trace_id = true, user = true }

-- The known name within two edits of name, or nil (no prefix rule: `req.user_id` is a script's
-- own field, not a misspelt `user`).
local function near(name, known)
  local distance = require("agg.edge_config").distance
  local best, bestd
  for k in pairs(known) do
    local d = distance(name, k, 2)
    if d <= 2 and (not bestd or d < bestd or (d == bestd and k < best)) then best, bestd = k, d end
  end
  return best
end

--- What each handler reads of its request, against its routes, for aggway check (agg.dryrun):
-- `req.params.NAME` (or `req.params["NAME"]`) for a NAME none of its routes has, and a field of
-- req within two edits of one the runtime gives (`req.param`); a route segment written `:name` that
-- the handler reads as a parameter is named as the literal it is. Each reads nil at run time, and the
-- script then fails on every request ("attempt to concatenate a nil value", naming neither the
-- route nor the name; a fresh user's trial), which no made-up answer tells apart. endpoints: the
-- loader's (handler, segments, file, route); texts: path -> source text of every Lua file of the
-- folder (a field assigned in any of them, `x.NAME = …`, is a script's own). Read from the
-- tokens of the handler's own lines (comments and strings are not code), its first parameter as
-- the request. Left alone, as what a reading of the text cannot be sure of: a definition whose
-- lines another handler's share (two on one line), one that declares its parameter's name again
-- (an inner function's, a loop's or a local's), a read through another name (`x.req.params`,
-- an alias). Every closure of one definition (a handler factory) reads against the parameters
-- of all their routes. Returns { "file:line: message", … }.
-- The handler definitions of endpoints (each closure of one definition counts as it): { file,
-- first, last (its lines), params (the names of all its routes' parameters), colon (names written
-- :name in them), routes }, in the order first met.
local function handler_defs(endpoints)
  local defs, order = {}, {}
  for _, e in ipairs(endpoints) do
    local info = type(e.handler) == "function" and debug.getinfo(e.handler, "S")
    if info and info.linedefined > 0 and info.source:sub(1, 1) == "@" then
      local key = info.source .. ":" .. info.linedefined
      local d = defs[key]
      if not d then
        d = { file = info.source:sub(2), first = info.linedefined, last = info.lastlinedefined, params = {},
              colon = {}, routes = {} }
        defs[key] = d
        order[#order + 1] = d
      end
      for _, s in ipairs(e.segments) do
        if type(s) == "table" then
          d.params[s.param] = true
        elseif str_find(s, "^:[%a_][%w_]*$") then
          d.colon[s:sub(2)] = true -- (the parameter syntax of other routers, Express or Rails: a literal here)
        end
      end
      d.routes[#d.routes + 1] = e.route
    end
  end
  return order
end

-- The name of the first parameter of the function whose tokens t start (`function [name] ( req`),
-- and the index of the token after it; nil when it has none.
local function request_name(t)
  for i = 1, #t - 2 do
    if t[i].t == "name" and t[i].v == "function" then
      local j = i + 1
      while t[j] and t[j].t ~= "op" do j = j + 1 end
      while t[j] and t[j].t == "op" and (t[j].v == "." or t[j].v == ":") do j = j + 2 end
      if t[j] and t[j].v == "(" and t[j + 1] and t[j + 1].t == "name" then return t[j + 1].v, j + 2 end
      return nil
    end
  end
  return nil
end

-- Whether tokens t from body on declare req again (a local, a loop variable, an inner function's
-- parameter): a read of it may then be another's.
local function declared_again(t, body, req)
  local declaring = false
  for i = body, #t do
    local tk = t[i]
    if tk.t == "name" and (tk.v == "local" or tk.v == "for" or tk.v == "function") then
      declaring = true
    elseif declaring and tk.t == "name" and tk.v == req then
      return true
    elseif declaring and ((tk.t == "op" and (tk.v == "=" or tk.v == ")")) or (tk.t == "name" and tk.v == "in")) then
      declaring = false
    end
  end
  return false
end

-- What tokens t from body on read through req: { { param = x | field = f, line } }, and the
-- parameters and fields they assign (`req.params.x = …`, `req.f = …`: the handler's own).
local function reads_of(t, body, req)
  local reads, written_params, written = {}, {}, {}
  for i = body, #t do
    local prev = t[i - 1]
    if t[i].t == "name" and t[i].v == req and not (prev and prev.t == "op" and (prev.v == "." or prev.v == ":"))
       and t[i + 1] and t[i + 1].t == "op" and t[i + 1].v == "." and t[i + 2] and t[i + 2].t == "name" then
      local f = t[i + 2].v
      if f == "params" then
        local x, after
        if t[i + 3] and t[i + 3].v == "." and t[i + 4] and t[i + 4].t == "name" then
          x, after = t[i + 4].v, t[i + 5]
        elseif t[i + 3] and t[i + 3].v == "[" and t[i + 4] and t[i + 4].t == "string" and t[i + 4].v and
               t[i + 5] and t[i + 5].v == "]" then
          x, after = t[i + 4].v, t[i + 6]
        end
        if x and after and after.t == "op" and after.v == "=" then
          written_params[x] = true
        elseif x then
          reads[#reads + 1] = { param = x, line = t[i].line }
        end
      else
        local after = t[i + 3]
        if after and after.t == "op" and after.v == "=" then
          written[f] = true
        else
          reads[#reads + 1] = { field = f, line = t[i].line }
        end
      end
    end
  end
  return reads, written_params, written
end

function M.check_reads(endpoints, texts)
  local order = handler_defs(endpoints)
  -- a field any file of the folder assigns is the scripts' own
  local assigned = {}
  for _, text in pairs(texts) do
    for k in str_gmatch(text, "%.%s*([%a_][%w_]*)%s*=[^=]") do assigned[k] = true end
  end
  local toks_of, out = {}, {}
  for _, d in ipairs(order) do
    local shared = false
    for _, o in ipairs(order) do
      if o ~= d and o.file == d.file and o.first <= d.last and d.first <= o.last then shared = true end
    end
    local text = not shared and texts[d.file]
    local t = {}
    if text then
      local toks = toks_of[d.file]
      if not toks then toks = M.tokenize(text); toks_of[d.file] = toks end
      for _, tk in ipairs(toks) do
        if tk.line >= d.first and tk.line <= d.last and tk.t ~= "eof" then t[#t + 1] = tk end
      end
    end
    local req, body = request_name(t)
    if req and not declared_again(t, body, req) then
      local reads, written_params, written = reads_of(t, body, req)
      local names = {}
      for k in pairs(d.params) do names[#names + 1] = k end
      table.sort(names)
      local seen = {}
      for _, r in ipairs(reads) do
        if r.param and not d.params[r.param] and not written_params[r.param] and not seen[r.param] then
          seen[r.param] = true
          local hint = near(r.param, d.params)
          local why = d.colon[r.param] and
            (" (its segment ':%s' is the literal text; a parameter is written {%s})"):format(r.param, r.param) or
            hint and (" (did you mean '" .. hint .. "'?)") or
            (#names > 0 and (" (its parameters: " .. table.concat(names, ", ") .. ")") or " (it has no parameters)")
          out[#out + 1] = ("%s:%d: %s reads %s.params.%s, but its route has no parameter '%s'%s"):format(d.file,
            r.line, d.routes[1], req, r.param, r.param, why)
        elseif r.field and not REQ_FIELDS[r.field] and not written[r.field] and not assigned[r.field] and
               not seen["." .. r.field] then
          local hint = near(r.field, REQ_FIELDS)
          if hint then
            seen["." .. r.field] = true
            out[#out + 1] = ("%s:%d: %s reads %s.%s, which a request does not have (did you mean '%s'?)"):format(
              d.file, r.line, d.routes[1], req, r.field, hint)
          end
        end
      end
    end
  end
  return out
end

return M
