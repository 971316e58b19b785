-- agg.page: the page contract of DESIGN §2.2 (seed 000, RFC 9110, RFC 9457).
--
-- Sections are the keys of the results table, written in sorted order so the same answers give
-- the same bytes. Each section is { status, data, error }:
--   ok           fresh data
--   fallback     the call failed and the script's fallback is served (error says why)
--   stale        a cached copy served because the call failed (error says why)
--   unavailable  nothing (error says why)
-- A section whose continuation returned nil is left out.
local json = require "agg.json"
local problem = require "agg.problem"
local rt = require "agg.runtime"
local cache = require "agg.cache"
local result = require "agg.result"
local where = require "agg.where"
local info_of, section_data = result.info_of, result.section_data
local new_tab = require "table.new"

local M = {}

-- agg.page's options (a misspelt one is an error: its header would go unsent, unseen)
local PAGE_OPTIONS = { headers = true }

-- a failed page's summary of each section, members in this order (a metatable: nothing recorded
-- per section)
local SUMMARY_MT = json.ordered({ "status", "error" }, "agg.page section")

-- True when key k of a headers table is a spelling of name (lowercase).
local function spells(k, name)
  return type(k) == "string" and #k == #name and k:lower() == name
end

-- Sets header name (lowercase) of a page to value. When the script gave extra headers (spelt), any
-- other spelling of name goes first: the page contract's own headers win over the script's.
local function set_header(headers, name, value, spelt)
  if spelt then
    for k in pairs(headers) do
      if k ~= name and spells(k, name) then headers[k] = nil end
    end
  end
  headers[name] = value
end

-- True when headers has name (lowercase) in any spelling.
local function has_header(headers, name, spelt)
  if headers[name] ~= nil then return true end
  if spelt then
    for k in pairs(headers) do
      if spells(k, name) then return true end
    end
  end
  return false
end

-- Adds value (header names, comma-separated) to the page's Vary (RFC 9110 §12.5.5): the script's
-- own Vary fields, in any spelling, are kept as fields of their own beside it.
local function add_vary(headers, value, spelt)
  local own
  if spelt then
    for k, v in pairs(headers) do
      if spells(k, "vary") then
        own = own or {}
        if type(v) == "table" then
          for _, e in ipairs(v) do own[#own + 1] = e end
        else
          own[#own + 1] = v
        end
        headers[k] = nil
      end
    end
  end
  if own then
    own[#own + 1] = value
    headers.vary = own
  else
    headers.vary = value
  end
end

local function page_status(failed)
  local p = failed.error or {}
  local kind = problem.kind(p)
  -- 503: the breaker is open, the retry budget is spent, or the user's identity for the service
  -- could not be had
  if kind == "circuit-open" or kind == "retry-budget-exhausted" or kind == "identity-unavailable" then return 503 end
  if p.status == 504 then return 504 end
  if p.status == 404 or p.status == 410 then return p.status end
  return 502
end

--- Builds the response for a results table (from agg.fetch_all, plus any plain values the script
-- added: a plain value becomes an `ok` section).
-- Returns { status, headers, json } for the handler to return; its metatable tells the transport
-- it is a page and whether it is complete. A 200 page's json is made only when read (agg.runtime's
-- page_response): until then the transport writes the sections into the page from their rows.
--   200  every required section has data; X-Aggregation-Completed says whether all are `ok`, and a
--        partial page carries Cache-Control: no-store
--   504/503/404/410/502  a required section failed (timeout / breaker open / passed through /
--        anything else), body application/problem+json with a `sections` member
--   502 (504 if every failure was a timeout)  no section has any data
-- opts (optional): { headers = { name = value } } extra response headers, names in any case; they
-- pass the transport's rules as a plain response's do (script/resp_headers.h: one spelling per
-- name, the one that sorts first bytewise wins; a list value gives one field per element), and the headers the page contract sets
-- (x-aggregation-completed, cache-control: no-store of a partial or failed page, content-type of a
-- failed page) replace every spelling of theirs.
function M.page(results, opts)
  if type(results) ~= "table" then
    where.raise("agg.page expects the results table of agg.fetch_all, got " .. type(results), 2)
  end
  if opts ~= nil then
    if type(opts) ~= "table" then where.raise("agg.page: options must be a table, got " .. type(opts), 2) end
    where.check_options(opts, PAGE_OPTIONS, "agg.page", "(options: headers)", 2)
    if opts.headers ~= nil and type(opts.headers) ~= "table" then
      where.raise("agg.page: option 'headers' must be a table of name = value, got " .. type(opts.headers), 2,
                  where.option("headers"))
    end
  end
  local keys, n = rt.take_list(), 0 -- (given back once the rows are made)
  -- values the script computed are sections too: at most max_sections_per_request in a page (the
  -- keys are sorted, and a page of a million was seconds of the runtime's work)
  local max = rt.max_sections()
  for k in pairs(results) do
    if type(k) ~= "string" then where.raise("agg.page: section names must be strings, got " .. type(k), 2) end
    n = n + 1
    keys[n] = k
    if n > max then
      where.raise(("agg.page: a page has at most %d sections (max_sections_per_request in gateway.lua)"):format(max), 2)
    end
  end
  rt.resolve_thens(results, 3) -- standalone fetch_then chains put in directly: run them now
  rt.sort_keys(keys, n) -- so the first failed required section decides the status: the same one every time
  -- the sections as rows { name, status, data, error, … } in sorted key order (agg.contract's
  -- response.rows; the hash part: page_response's four fields)
  local rows, nrows = new_tab(4 * n, 4), 0
  local complete, any_data, all_timeouts, counted = true, false, true, 0
  local max_age -- the smallest freshness left of the sections, while every one is a shared cache entry
  local vary -- the request headers those entries vary on (name -> true), or nil
  local personal = false -- a section's data is one user's (see "Cache-Control of a page" below)
  local failed_required, failed_key
  for _, k in ipairs(keys) do
    local r = rt.then_result(results[k])
    local info = info_of(r) -- (a result's facts, read once: nil for a value the script computed)
    if info then
      if r.status ~= "skipped" then
        counted = counted + 1
        local data
        if r.status ~= "unavailable" then
          data = section_data(r, info)
          if data == nil then data = json.null end
          any_data = true
        elseif info.required and not info.cancelled and not failed_required then
          failed_required, failed_key = r, k
        end
        -- (a result's error is its own field: agg.result's metamethods make none, so rawget finds
        -- it, or its absence, without calling them)
        local err = rawget(r, "error")
        rows[nrows + 1], rows[nrows + 2], rows[nrows + 3], rows[nrows + 4] = k, r.status, data, err
        nrows = nrows + 4
        if r.status ~= "ok" then complete = false end
        if not personal and cache.personal(info) then personal = true end
        if max_age ~= false then
          local left = cache.fresh_left_ms(info)
          if left and (not max_age or left < max_age) then max_age = left elseif not left then max_age = false end
          local p = left and info.cache
          if p and p.vary then
            vary = vary or {}
            for _, h in ipairs(p.vary) do vary[h] = true end
          end
        end
        if err and err.status ~= 504 then all_timeouts = false end
      end
    else
      counted = counted + 1
      any_data = true
      max_age = false -- a value the script computed: nothing says how long it stays true
      rows[nrows + 1], rows[nrows + 2] = k, "ok"
      rows[nrows + 3] = r
      nrows = nrows + 4
    end
  end
  rt.give_list(keys, n)
  local headers = new_tab(0, 4)
  -- the names and values as the script gave them: the transport settles them as a plain
  -- response's (tostring would send a table or function value as "table: 0x...")
  local spelt = opts and opts.headers ~= nil
  if spelt then
    for k, v in pairs(opts.headers) do headers[k] = v end
  end
  local status
  if failed_required then
    status = page_status(failed_required)
  elseif counted > 0 and not any_data then
    status = all_timeouts and 504 or 502
  end
  if status then
    local p
    if failed_required then
      local e = failed_required.error or {}
      -- the key the page puts it under (a result renamed into the page, { event = res.concert },
      -- is the page's section event: that is what `sections` lists)
      -- one title whatever the section (RFC 9457 §3.1.3); the detail names it and its failure
      p = problem.new("required-section-failed", "a required section is unavailable", status,
                      ("section %s: %s"):format(tostring(failed_key), tostring(e.title or "it failed")))
    else
      p = problem.new("no-section-available", "no section of the page could be served", status)
    end
    local summary = {}
    for i = 1, nrows, 4 do
      summary[rows[i]] = setmetatable({ status = rows[i + 1], error = rows[i + 3] }, SUMMARY_MT)
    end
    p.sections = summary
    set_header(headers, "content-type", "application/problem+json", spelt)
    set_header(headers, "cache-control", "no-store", spelt)
    set_header(headers, "x-aggregation-completed", "false", spelt)
    if status == 503 and not has_header(headers, "retry-after", spelt) then
      -- seconds until the breaker half-opens (RFC 9110 §10.2.3); 1 when the failure says nothing
      local after = failed_required and failed_required.retry_after or 1
      headers["retry-after"] = tostring(after)
    end
    -- (not a tail call: a trace cannot return through setmetatable to the script's frame)
    local resp = setmetatable({ status = status, headers = headers, json = p }, rt.PAGE_PARTIAL)
    return resp
  end
  set_header(headers, "x-aggregation-completed", complete and "true" or "false", spelt)
  -- Cache-Control of a page (RFC 9111; docs/operations.md, "Caching"). A partial page: no-store.
  -- A complete page (the script's own cache-control wins):
  --   a section is one user's, the edge authenticated the request,     private
  --   the script read req.headers, or it gave the page a Set-Cookie
  --     (a shared cache must not keep it, §5.2.2.7: with an API key in X-API-Key a shared cache
  --     would otherwise store the page and serve it without the key; a value the script took from
  --     a header field and wrote into a cached section's data would be served to clients that sent
  --     another, as a shared cache keys by URL and Vary only; a stored Set-Cookie would be given
  --     to every client. The gateway's own fields for this client, a group's session and the
  --     RateLimit fields, make any response private: agg.runtime's with_client_fields)
  --   and every section is a shared cache entry still fresh             private, max-age=N
  --   every section is a shared cache entry still fresh                 max-age=N
  --     N = the smallest freshness left of the sections (s): the page is no fresher than its most
  --     volatile section. Never `public`: without it a shared cache still keeps no answer to a
  --     request that carried Authorization (§3.5)
  --   anything else (a section fetched uncached, served stale, or     no-store
  --     fresh for less than a second): the page is no fresher than that section, and without a
  --     header a shared cache could keep a 200 on heuristic freshness (§4.2.2)
  if not complete then
    set_header(headers, "cache-control", "no-store", spelt)
  elseif not has_header(headers, "cache-control", spelt) then
    local cacheable = max_age and max_age >= 1000
    if cacheable and vary then
      -- the sections' entries vary on request headers (their `vary`, the upstreams'
      -- forward_headers): so does the page, and a cache in front must key it by them too (RFC 9111
      -- §4.1), or it serves one client's page to clients that sent other values
      local names = {}
      for h in pairs(vary) do names[#names + 1] = h end
      table.sort(names)
      add_vary(headers, table.concat(names, ", "), spelt)
    end
    if personal or rt.request_private() or (spelt and has_header(headers, "set-cookie", spelt)) then
      -- (a personal section is never a shared entry, so max_age is false then)
      headers["cache-control"] = cacheable and ("private, max-age=" .. math.floor(max_age / 1000)) or "private"
    elseif cacheable then
      headers["cache-control"] = "max-age=" .. math.floor(max_age / 1000)
    else
      headers["cache-control"] = "no-store"
    end
  end
  local resp = rt.page_response({ status = 200, headers = headers }, rows, complete and "complete" or "partial")
  return resp
end

return M
