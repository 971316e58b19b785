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
local str_find, str_gsub, str_match = string.find, string.gsub, string.match
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

return M
