-- agg.upstream_config: the `upstreams` of gateway.lua (each upstream's URL or endpoints, TLS,
-- pool settings, resilience blocks, cache, identity, balancing, sessions, health checks,
-- forwarded headers) and `token_exchange` (the RFC 8693 token endpoint, an upstream of the
-- gateway's own) with what upstreams' identity needs of it and of auth. Called by agg.config with
-- its checking context c (see agg.config); each function writes its part of out and reports
-- every mistake through c.err.
local str_find, str_gsub, str_match = string.find, string.gsub, string.match
local sys = require "agg.sys"
local cache = require "agg.cache"
local edge = require "agg.edge_config"

local M = {}

local UPSTREAM_DEFAULTS = {
  timeout_ms = 1000, connect_timeout_ms = 100, idle_timeout_ms = 60000,
  max_connections = 64, max_pending = 256, max_body_bytes = 8 * 1024 * 1024,
}
local BALANCES = { p2c = true, round_robin = true, hash = true }

-- Resilience blocks of an upstream (issue "resilience"): option -> { kind, default, check }.
local BLOCKS = {
  breaker = { failures = { "count", 5 }, open_s = { "number", 30 }, half_open_probes = { "count", 1 } },
  retry = { attempts = { "count", 1 }, on = { "statuses", { 502, 503, 504 } }, backoff_ms = { "number", 25 },
            budget = { { percent = { "percent", 20 }, interval_s = { "positive", 10 } } },
            min_retry_rate = { { count = { "count", 10 }, interval_s = { "positive", 1 } } } },
  -- outlier ejection of one endpoint of a group (agg.group)
  outlier = { failures = { "count", 5 }, eject_s = { "positive", 10 }, max_eject_s = { "positive", 300 },
              max_percent = { "percent", 50 }, failure_percent = { "percent", 0 }, min_requests = { "count", 10 },
              interval_s = { "positive", 10 } },
  hedge = { after = { "after", "p95" }, max_percent = { "percent", 5 } },
}

-- Headers a gateway must never copy from the client to an upstream: they frame or route this hop
-- only (RFC 9110 §7.6.1 connection options, §7.2 Host, §8.6 Content-Length; RFC 9112 §6.1).
local HOP_BY_HOP = { connection = true, ["keep-alive"] = true, ["proxy-connection"] = true, te = true,
                     trailer = true, ["transfer-encoding"] = true, upgrade = true, host = true,
                     ["content-length"] = true, expect = true }

-- Headers that carry the client's credentials (RFC 9110 §11.6.2 Authorization, §11.7.2
-- Proxy-Authorization; RFC 6265 §5.4 Cookie; X-API-Key, auth.api_keys' default header): forwarded
-- as they are, an upstream would get the client's raw bearer token, whatever its aud, or its API
-- key, which the gateway never passes on (docs/operations.md, "Identity toward upstreams").
local CREDENTIALS = cache.BASE_CREDENTIALS

-- The credential headers of gateway.lua cfg: CREDENTIALS and the API key header auth.api_keys
-- names (agg.edge_config checks the name; here it only has to be a string).
local function credential_headers(cfg)
  local a = type(cfg.auth) == "table" and cfg.auth.api_keys
  local h = type(a) == "table" and a.header
  if type(h) ~= "string" or CREDENTIALS[h:lower()] then return CREDENTIALS end
  local out = { [h:lower()] = true }
  for k in pairs(CREDENTIALS) do out[k] = true end
  return out
end

-- upstreams.X.failure_statuses = { 502, 503, 504 }: the statuses of an answer that count as the
-- upstream failing, for its circuit breaker and its endpoints' outlier ejection (agg.exchange
-- breaker_verdict; default: every 5xx). Returns the set status -> true, or nil after err().
local function check_failure_statuses(v, where, line, err, show)
  local set, ok = {}, type(v) == "table" and #v > 0
  if ok then
    for i, st in pairs(v) do
      if type(i) ~= "number" or type(st) ~= "number" or st % 1 ~= 0 or st < 400 or st > 599 then ok = false break end
      set[st] = true
    end
  end
  if not ok then
    err(line, where, "must be a list of HTTP statuses from 400 to 599, like { 502, 503, 504 }, got " .. show(v))
    return nil
  end
  return set
end

-- upstreams.X.forward_headers = { "accept-language", … }: the client request headers every call to
-- the upstream carries (a call's own headers win), never one of credentials (credential_headers).
-- Returns the list lowercased, or nil after err().
local function check_forward_headers(v, where, line, err, credentials)
  if type(v) ~= "table" or (next(v) ~= nil and #v == 0) then
    err(line, where, "must be a list of header names, like { \"accept-language\", \"x-device\" }")
    return nil
  end
  local out, seen = {}, {}
  for i, name in pairs(v) do
    if type(i) ~= "number" or type(name) ~= "string" or not str_find(name, "^[!#$%%&'*+%-.^_`|~%w]+$") then
      err(line, where, ("item %s must be a header name (letters, digits and !#$%%&'*+-.^_`|~), got %s"):format(
        tostring(i), type(name) == "string" and ("'" .. name .. "'") or type(name)))
    else
      local lname = name:lower()
      if HOP_BY_HOP[lname] then
        err(line, where, ("'%s' belongs to this connection only and is never forwarded; remove it"):format(name))
      elseif credentials[lname] then
        err(line, where, ("'%s' carries the client's credentials and is never forwarded as it is: remove it; to pass "
            .. "the user's identity on, give the upstream identity = \"forward\" (the user's token, when its aud "
            .. "names the upstream's audience) or \"exchange\" (a token for it from token_exchange); for an "
            .. "upstream that checks the client's own credential itself, give it in the calls that need it, "
            .. "headers = { [\"%s\"] = req.headers[\"%s\"] }"):format(name, lname, lname))
      elseif not seen[lname] then
        seen[lname] = true
        out[#out + 1] = lname
      end
    end
  end
  return out
end

-- health = { path, every_s, timeout_ms, healthy_after, unhealthy_after, expect_status } (active
-- health checks of an upstream's endpoints, agg.health): returns the checked block with its
-- defaults, or nil after reporting every mistake through c.err(line, where, message).
local HEALTH = { path = true, every_s = true, timeout_ms = true, healthy_after = true, unhealthy_after = true,
                 expect_status = true }
local function check_health(c, h, where, line, call_timeout_ms)
  local line_of, err, suggest = c.line_of, c.err, c.suggest
  if type(h) ~= "table" then
    err(line, where, "must be a table like { path = \"/healthz\", every_s = 5, timeout_ms = 200 } (or false)")
    return nil
  end
  local ok = true
  local function bad(f, msg)
    ok = false
    err(line_of(f, line) or line, where .. "." .. f, msg)
  end
  for k in pairs(h) do
    if not HEALTH[k] then
      bad(tostring(k), "unknown option" .. suggest(tostring(k), HEALTH) ..
          "; health knows path, every_s, timeout_ms, healthy_after, unhealthy_after, expect_status")
    end
  end
  -- the default timeout: the upstream's, at most 1000 ms and half of every_s (a probe at a time:
  -- shorter than every_s, so every_s = 1 takes no timeout_ms of its own; a fresh user's trial)
  local every = h.every_s or 5
  local def_timeout = math.min(1000, call_timeout_ms)
  if type(every) == "number" and every >= 1 then def_timeout = math.min(def_timeout, math.floor(every * 500)) end
  local out = { path = h.path, every_s = every, timeout_ms = h.timeout_ms or def_timeout,
                healthy_after = h.healthy_after or 2, unhealthy_after = h.unhealthy_after or 3 }
  if type(h.path) ~= "string" or h.path:sub(1, 1) ~= "/" or str_find(h.path, "[%s%c]") then
    bad("path", "is required: the path each endpoint is probed on, starting with '/', like path = \"/healthz\"")
  end
  local function whole(f, lo, hi, unit)
    local v = out[f]
    if not (type(v) == "number" and v % 1 == 0 and v >= lo and v <= hi) then
      bad(f, ("must be a whole number of %s from %d to %d, got %s"):format(unit, lo, hi, tostring(v)))
    end
  end
  whole("every_s", 1, 3600, "seconds")
  whole("timeout_ms", 1, 60000, "ms")
  whole("healthy_after", 1, 100, "probes")
  whole("unhealthy_after", 1, 100, "probes")
  if ok and out.timeout_ms >= out.every_s * 1000 then
    bad("timeout_ms", ("(%d ms) must be shorter than every_s (%d s): one probe per endpoint at a time"):format(
        out.timeout_ms, out.every_s))
  end
  -- expect_status: a status or a list of them; default any 2xx
  local es = h.expect_status
  if es ~= nil then
    local list = type(es) == "table" and es or { es }
    local set, n = {}, 0
    for _, s in pairs(list) do
      if type(s) ~= "number" or s % 1 ~= 0 or s < 100 or s > 599 then
        set = nil
        break
      end
      set[s], n = true, n + 1
    end
    if not set or n == 0 then
      bad("expect_status", "must be an HTTP status or a list of them, like expect_status = { 200, 204 } " ..
          "(default: any 2xx)")
    else
      out.expect_status = set
    end
  end
  return ok and out or nil
end

-- tls = { ca_file, server_name, verify } of an https:// upstream: a table for the C side
-- (ca_file resolved against the scripts folder), or nil after reporting errors
local function check_upstream_tls(c, t, host, where, nline)
  local lines, err, show, find_line, suggest, file = c.lines, c.err, c.show, c.find_line, c.suggest, c.file
  local e = { server_name = host, verify = true }
  if t == nil then return e end
  local tline = find_line(lines, "tls", nline) or nline
  where = where .. ".tls"
  if type(t) ~= "table" then
    err(tline, where, "must be a table like { ca_file = \"ca.pem\", server_name = \"api.internal\", verify = true }")
    return nil
  end
  local ok = true
  for k, v in pairs(t) do
    local kline = find_line(lines, k, tline) or tline
    local kwhere = where .. "." .. tostring(k)
    if k == "ca_file" then
      if type(v) ~= "string" or v == "" then
        err(kline, kwhere, "must be the path of a PEM file of CA certificates, got " .. show(v)); ok = false
      else
        local path = v
        if path:sub(1, 1) ~= "/" then path = (str_match(file, "^(.*)/[^/]*$") or ".") .. "/" .. path end
        local text, why = sys.read_file(path, 1048576)
        if not text then
          err(kline, kwhere, "cannot read " .. path .. ": " .. why); ok = false
        elseif not str_find(text, "-----BEGIN CERTIFICATE-----", 1, true) then
          err(kline, kwhere, path .. " holds no PEM certificate (-----BEGIN CERTIFICATE-----)"); ok = false
        else
          e.ca_file = path
        end
      end
    elseif k == "server_name" then
      if type(v) ~= "string" or not str_match(v, "^[%w%.%-_:]+$") then
        err(kline, kwhere, "must be a host name like \"api.internal\" (or an IP address), got " .. show(v)); ok = false
      else
        e.server_name = v
      end
    elseif k == "verify" then
      if type(v) ~= "boolean" then
        err(kline, kwhere, "must be true or false, got " .. show(v)); ok = false
      else
        e.verify = v
      end
    else
      err(kline, kwhere, "unknown option" .. suggest(tostring(k), { ca_file = 1, server_name = 1, verify = 1 }) ..
          "; tls knows ca_file, server_name, verify"); ok = false
    end
  end
  e.line = tline
  return ok and e or nil
end

-- upstreams = { name = { url = "http://host:port", … }, … }: out.upstreams, sorted by name
function M.check_upstreams(cfg, out, c)
  local lines, err, show, posint, find_line = c.lines, c.err, c.show, c.posint, c.find_line
  local suggest, parse_http_url, NOT_YET = c.suggest, c.parse_http_url, c.not_yet
  local ups = cfg.upstreams
  local uline = find_line(lines, "upstreams")
  if ups == nil then ups = {} end
  if type(ups) ~= "table" then
    err(uline, "upstreams", "must be a table of name = { url = \"http://host:port\" }")
    ups = {}
  end
  local names = {}
  for name in pairs(ups) do names[#names + 1] = name end
  table.sort(names, function(a, b) return tostring(a) < tostring(b) end)
  local credentials = credential_headers(cfg)
  for _, name in ipairs(names) do
    local u = ups[name]
    local where = "upstreams." .. tostring(name)
    local nline = find_line(lines, name, uline) or uline
    if type(name) ~= "string" or not str_match(name, "^[%a_][%w_%-]*$") then
      err(nline, where, "upstream names must be identifiers like product or user_service")
    elseif type(u) ~= "table" then
      err(nline, where, "must be a table like { url = \"http://127.0.0.1:9001\" }")
    else
      local e = { name = name }
      for k, v in pairs(UPSTREAM_DEFAULTS) do e[k] = v end
      for k, v in pairs(u) do
        local kline = find_line(lines, k, nline) or nline
        if NOT_YET[k] then
          err(kline, where .. "." .. k, NOT_YET[k] .. " is not available in this version of aggway; remove '" .. k .. "'")
        elseif BLOCKS[k] then
          -- checked below
        elseif k == "url" or k == "tls" or k == "identity" or k == "audience" or k == "endpoints" or k == "balance" or
               k == "hash_key" or k == "session" or k == "health" then
          -- checked below
        elseif k == "forward_headers" then
          e.forward_headers = check_forward_headers(v, where .. ".forward_headers", kline, err, credentials)
        elseif k == "failure_statuses" then
          e.failure_statuses = check_failure_statuses(v, where .. ".failure_statuses", kline, err, show)
        elseif k == "resolve_every_s" then
          -- how often the endpoints' host names are resolved again (group/directory.h); 0: at load only
          if not (type(v) == "number" and v % 1 == 0 and v >= 0 and v <= 86400) then
            err(kline, where .. ".resolve_every_s", "must be a whole number of seconds from 0 (resolve at load only) " ..
                "to 86400, got " .. show(v))
          else
            e.resolve_every_s = v
          end
        elseif k == "max_rps" then
          -- calls a second across the process's workers (gateway/upstream/pool.h, agw_pool_set_limits)
          if posint(v, where .. ".max_rps", kline, 1e9) then e.max_rps = v end
        elseif k == "cache" then
          if v ~= false then
            local p, field, why = cache.check_block(v, false)
            if p then
              p.version = cache.version(p)
              e.cache = p
            else
              err(field and find_line(lines, field, kline) or kline, where .. ".cache" .. (field and ("." .. field) or ""), why)
            end
          end
        elseif UPSTREAM_DEFAULTS[k] then
          if posint(v, where .. "." .. k, kline) then e[k] = v end
        else
          local known = { url = true, tls = true, breaker = true, retry = true, hedge = true, identity = true,
                          audience = true, cache = true, endpoints = true, balance = true, hash_key = true,
                          outlier = true, session = true, health = true, max_rps = true, forward_headers = true,
                          resolve_every_s = true, failure_statuses = true }
          for kk in pairs(UPSTREAM_DEFAULTS) do known[kk] = true end
          err(kline, where .. "." .. tostring(k), "unknown option" .. suggest(tostring(k), known) ..
              "; upstreams know url, tls, timeout_ms, connect_timeout_ms, idle_timeout_ms, max_connections, max_pending, " ..
              "max_body_bytes, max_rps, breaker, retry, hedge, cache, identity, audience, endpoints, resolve_every_s, balance, " ..
              "hash_key, outlier, session, health, forward_headers, failure_statuses")
        end
      end
      -- a block's fields (and its sub-blocks, like retry.budget) checked into a table of values
      local function check_block(v, fields, where_b, bline, block)
        local out_b = {}
        for f, d in pairs(fields) do
          if type(d[1]) == "table" then out_b[f] = check_block(nil, d[1], where_b .. "." .. f, bline, f)
          else out_b[f] = d[2] end
        end
        if v == nil then return out_b end
        for f, fv in pairs(v) do
          local d = fields[f]
          local fwhere = where_b .. "." .. tostring(f)
          local fline = find_line(lines, f, bline) or bline
          if not d then
            local names = {}
            for n in pairs(fields) do names[#names + 1] = n end
            table.sort(names)
            err(fline, fwhere, "unknown option" .. suggest(tostring(f), fields) ..
                "; " .. block .. " knows " .. table.concat(names, ", "))
          elseif type(d[1]) == "table" then
            if type(fv) ~= "table" then
              local example = {}
              for n, nd in pairs(d[1]) do example[#example + 1] = n .. " = " .. tostring(nd[2]) end
              table.sort(example)
              err(fline, fwhere, "must be a table like { " .. table.concat(example, ", ") .. " }")
            else
              out_b[f] = check_block(fv, d[1], fwhere, fline, f)
            end
          elseif d[1] == "count" and not (type(fv) == "number" and fv % 1 == 0 and fv >= 0 and fv <= 1000000) then
            err(fline, fwhere, "must be a whole number from 0 to 1000000")
          elseif d[1] == "number" and not (type(fv) == "number" and fv >= 0 and fv <= 2147483647) then
            err(fline, fwhere, "must be a number from 0 to 2147483647")
          elseif d[1] == "positive" and not (type(fv) == "number" and fv > 0 and fv <= 2147483647) then
            err(fline, fwhere, "must be a number of seconds > 0, up to 2147483647")
          elseif d[1] == "percent" and not (type(fv) == "number" and fv >= 0 and fv <= 100) then
            err(fline, fwhere, "must be a percentage between 0 and 100")
          elseif d[1] == "statuses" and not (type(fv) == "table" and #fv > 0) then
            err(fline, fwhere, "must be a list of HTTP statuses like { 502, 503, 504 }")
          elseif d[1] == "after" and not (fv == "p95" or (type(fv) == "number" and fv > 0 and fv <= 2147483647)) then
            err(fline, fwhere, "must be \"p95\" or a number of milliseconds")
          else
            out_b[f] = fv
          end
        end
        return out_b
      end
      for block, fields in pairs(BLOCKS) do
        local v = u[block]
        local bline = find_line(lines, block, nline) or nline
        local where_b = where .. "." .. block
        if v == false then
          e[block] = check_block(nil, fields, where_b, bline, block)
          e[block].off = true
        elseif v ~= nil and type(v) ~= "table" then
          err(bline, where_b, "must be a table (or false to turn it off)")
          e[block] = check_block(nil, fields, where_b, bline, block)
        else
          e[block] = check_block(v, fields, where_b, bline, block)
        end
      end
      if e.retry.attempts < 1 then e.retry.attempts = 1 end
      -- a cached upstream's entries are keyed by the headers every call to it forwards (agg.cache
      -- with_vary): without them one client's section was served to clients that sent others
      if e.cache and e.forward_headers then e.cache = cache.with_vary(e.cache, e.forward_headers) end
      -- identity = "forward" | "exchange" | "none" (default), audience = "the service's name in tokens"
      local id, idline = u.identity, find_line(lines, "identity", nline) or nline
      if id ~= nil and (type(id) ~= "string" or not edge.IDENTITIES[id]) then
        err(idline, where .. ".identity", "must be \"forward\", \"exchange\" or \"none\", got " .. show(id) ..
            (type(id) == "string" and suggest(id, edge.IDENTITIES) or ""))
      elseif id ~= nil and id ~= "none" then
        e.identity = id
        if type(u.audience) ~= "string" or u.audience == "" then
          err(find_line(lines, "audience", nline) or idline, where .. ".audience",
              "is required with identity = \"" .. id .. "\": the service's name in tokens' aud, like audience = \"" ..
              name .. "\"")
        else
          e.audience = u.audience
        end
        e.identity_line = idline
      end
      if u.audience ~= nil and (id == nil or id == "none") then
        err(find_line(lines, "audience", nline) or nline, where .. ".audience",
            "only means something with identity = \"forward\" or \"exchange\"")
      end
      -- url = "…" (one endpoint) or endpoints = { "…", … } (a group): same scheme, and so the
      -- same TLS settings, for all; e.url, e.host, e.port, … are the first endpoint's
      local urls, urlline = nil, find_line(lines, "url", nline) or nline
      if u.url ~= nil and u.endpoints ~= nil then
        err(urlline, where, "give either url or endpoints, not both")
      elseif u.endpoints ~= nil then
        urlline = find_line(lines, "endpoints", nline) or nline
        if type(u.endpoints) ~= "table" or #u.endpoints == 0 then
          err(urlline, where .. ".endpoints", "must be a list of URLs like { \"http://10.0.0.1:9001\", \"http://10.0.0.2:9001\" }")
        elseif #u.endpoints > 255 then
          err(urlline, where .. ".endpoints", "has " .. #u.endpoints .. " URLs; an upstream has at most 255 endpoints")
        else
          urls = {}
          for i, v in ipairs(u.endpoints) do
            if type(v) ~= "string" then
              err(urlline, where .. ".endpoints[" .. i .. "]", "must be a URL string like \"http://10.0.0.1:9001\"")
              urls = nil
              break
            end
            urls[i] = v
          end
        end
      elseif type(u.url) ~= "string" then
        err(urlline, where .. ".url", "is required, like url = \"http://127.0.0.1:9001\" (or endpoints = { … })")
      else
        urls = { u.url }
      end
      if urls then
        local eps, seen, first_scheme = {}, {}, nil
        for i, url in ipairs(urls) do
          local ewhere = u.endpoints and (where .. ".endpoints[" .. i .. "]") or (where .. ".url")
          local host, port, path, hostport, scheme = parse_http_url(url, true)
          if not host then
            err(urlline, ewhere, port)
          elseif first_scheme and scheme ~= first_scheme then
            err(urlline, ewhere, "'" .. url .. "': every endpoint of an upstream uses the same scheme (" ..
                first_scheme .. "://), as they share one TLS setting")
          elseif seen[url] then
            err(urlline, ewhere, "'" .. url .. "' is listed twice")
          else
            first_scheme, seen[url] = scheme, true
            eps[#eps + 1] = { url = url, host = host, port = port, base_path = path, host_header = hostport }
          end
        end
        if #eps == #urls then
          local f = eps[1]
          e.url, e.host, e.port, e.base_path, e.host_header = f.url, f.host, f.port, f.base_path, f.host_header
          e.line = urlline
          e.endpoints = {}
          for i, ep in ipairs(eps) do e.endpoints[i] = ep.url end
          e.endpoint_list = eps
          if first_scheme == "https" then
            e.tls = check_upstream_tls(c, u.tls, f.host, where, nline)
          elseif u.tls ~= nil then
            err(find_line(lines, "tls", nline) or nline, where .. ".tls",
                "is only for https:// upstreams; use url = \"https://…\" or remove tls")
          end
          -- the cache's entries are keyed by the URL's base path too (agg.cache VERSIONED)
          if e.cache then
            e.cache.origin = e.base_path
            e.cache.version = cache.version(e.cache)
          end
        end
      end
      local bal = u.balance
      if bal ~= nil and not BALANCES[bal] then
        err(find_line(lines, "balance", nline) or nline, where .. ".balance",
            "must be \"p2c\" (power of two choices, the default), \"round_robin\" or \"hash\"" ..
            (type(bal) == "string" and suggest(bal, BALANCES) or ""))
      end
      e.balance = BALANCES[bal] and bal or "p2c"
      -- session = { type = "cookie" | "header", name, absolute_timeout_s, idle_timeout_s, secure }
      local sess = u.session
      if sess ~= nil then
        local sline = find_line(lines, "session", nline) or nline
        local swhere = where .. ".session"
        local SESSION = { type = true, name = true, absolute_timeout_s = true, idle_timeout_s = true, secure = true }
        if type(sess) ~= "table" then
          err(sline, swhere, "must be a table like { type = \"cookie\", name = \"agw-" .. name .. "\" }")
        else
          local ok = true
          for k in pairs(sess) do
            if not SESSION[k] then
              ok = false
              err(find_line(lines, k, sline) or sline, swhere .. "." .. tostring(k), "unknown option" ..
                  suggest(tostring(k), SESSION) .. "; session knows type, name, absolute_timeout_s, idle_timeout_s, secure")
            end
          end
          if sess.type ~= nil and sess.type ~= "cookie" and sess.type ~= "header" then
            ok = false
            err(find_line(lines, "type", sline) or sline, swhere .. ".type", "must be \"cookie\" or \"header\"")
          end
          if type(sess.name) ~= "string" or not str_match(sess.name, "^[%w!#$%%&'*+%-.^_`|~]+$") then
            ok = false
            err(find_line(lines, "name", sline) or sline, swhere .. ".name",
                "is required: the cookie's or header's name, like name = \"agw-" .. name .. "\"")
          end
          -- secure = true: the cookie is Secure whatever the request came over (a proxy in front
          -- ends TLS); without it, Secure when the request came over TLS
          if sess.secure ~= nil and sess.secure ~= true and sess.secure ~= false then
            ok = false
            err(find_line(lines, "secure", sline) or sline, swhere .. ".secure",
                "must be true (the cookie is Secure on every response: a proxy in front of the gateway ends " ..
                "TLS) or false (the default: Secure when the request came over TLS), got " .. type(sess.secure))
          elseif sess.secure ~= nil and sess.type == "header" then
            ok = false
            err(find_line(lines, "secure", sline) or sline, swhere .. ".secure",
                "is for a cookie session: a header session (type = \"header\") has no cookie to mark Secure")
          end
          for _, f in ipairs({ "absolute_timeout_s", "idle_timeout_s" }) do
            local v = sess[f]
            if v ~= nil and not (type(v) == "number" and v >= 1 and v % 1 == 0 and v <= 2147483647) then
              ok = false
              err(find_line(lines, f, sline) or sline, swhere .. "." .. f,
                  "must be a whole number of seconds from 1 to 2147483647")
            end
          end
          if ok then
            e.session = { type = sess.type or "cookie", name = sess.name, absolute_timeout_s = sess.absolute_timeout_s,
                          idle_timeout_s = sess.idle_timeout_s, secure = sess.secure == true }
          end
        end
      end
      if u.health ~= nil and u.health ~= false then
        e.health = check_health(c, u.health, where .. ".health", find_line(lines, "health", nline) or nline,
                                e.timeout_ms)
      end
      local hk = u.hash_key
      if hk ~= nil then
        local hline = find_line(lines, "hash_key", nline) or nline
        if type(hk) ~= "string" or not (str_match(hk, "^header:[%w%-_]+$") or str_match(hk, "^cookie:[%w%-_.]+$")) then
          err(hline, where .. ".hash_key", "must be \"header:NAME\" or \"cookie:NAME\" (the page request's header or cookie)")
        elseif e.balance ~= "hash" then
          err(hline, where .. ".hash_key", "is only for balance = \"hash\"")
        else
          e.hash_key = hk
        end
      end
      out.upstreams[#out.upstreams + 1] = e
    end
  end
end

-- token_exchange = { url, client_id, client_secret_file, timeout_ms, subject_token_type }: the
-- token endpoint, appended to out.upstreams as "@token_exchange"; then what each upstream's
-- identity needs (a token_exchange block, an auth.jwt block). Runs after agg.edge_config's
-- check_auth (out.auth).
function M.check_token_exchange(cfg, out, c)
  local lines, err, show, posint, find_line = c.lines, c.err, c.show, c.posint, c.find_line
  local suggest, parse_http_url = c.suggest, c.parse_http_url
  local te = cfg.token_exchange
  local teline = find_line(lines, "token_exchange")
  if te ~= nil then
    local TE = { url = true, client_id = true, client_secret_file = true, timeout_ms = true, subject_token_type = true }
    if type(te) ~= "table" then
      err(teline, "token_exchange", "must be a table like { url = \"http://127.0.0.1:9500/token\", client_id = \"aggway\", " ..
          "client_secret_file = \"keys/te\" }")
    else
      local ok = true
      for k in pairs(te) do
        if not TE[k] then
          err(find_line(lines, k, teline) or teline, "token_exchange." .. tostring(k), "unknown option" ..
              suggest(tostring(k), TE) .. "; token_exchange knows url, client_id, client_secret_file, timeout_ms, " ..
              "subject_token_type")
          ok = false
        end
      end
      local ul = find_line(lines, "url", teline) or teline
      local host, port, path, hostport, scheme
      if type(te.url) ~= "string" then
        err(ul, "token_exchange.url", "is required, like url = \"https://id.example/token\"")
        ok = false
      else
        host, port, path, hostport, scheme = parse_http_url(te.url, true)
        if not host then err(ul, "token_exchange.url", port); ok = false end
      end
      if type(te.client_id) ~= "string" or te.client_id == "" then
        err(find_line(lines, "client_id", teline) or teline, "token_exchange.client_id",
            "is required: the gateway's client id at the token endpoint, got " .. show(te.client_id))
        ok = false
      end
      local secret
      local sl = find_line(lines, "client_secret_file", teline) or teline
      if type(te.client_secret_file) ~= "string" then
        err(sl, "token_exchange.client_secret_file", "is required: a file holding the client secret, got " ..
            show(te.client_secret_file))
        ok = false
      else
        local spath = te.client_secret_file
        if spath:sub(1, 1) ~= "/" then spath = c.dir .. "/" .. spath end
        local text, why = sys.read_file(spath, 4096)
        secret = text and str_gsub(text, "%s+$", "")
        if not text then err(sl, "token_exchange.client_secret_file", "cannot read " .. spath .. ": " .. why); ok = false
        elseif secret == "" then err(sl, "token_exchange.client_secret_file", spath .. " is empty"); ok = false end
      end
      local timeout = te.timeout_ms or 1000
      if not posint(timeout, "token_exchange.timeout_ms", find_line(lines, "timeout_ms", teline) or teline, 60000) then ok = false end
      local stt = te.subject_token_type or "urn:ietf:params:oauth:token-type:access_token"
      if type(stt) ~= "string" or not str_match(stt, "^urn:") then
        err(find_line(lines, "subject_token_type", teline) or teline, "token_exchange.subject_token_type",
            "must be a token type URN (RFC 8693 §3), got " .. show(stt))
        ok = false
      end
      if ok then
        local name = "@token_exchange" -- not an identifier: no script can name it in a call
        local e = { name = name, url = te.url, host = host, port = port, base_path = "", host_header = hostport,
                    line = ul, internal = true, breaker = { off = true, failures = 0, open_s = 0, half_open_probes = 1 },
                    retry = { attempts = 1, on = {}, budget_percent = 0, min_retries = 0, backoff_ms = 0 },
                    hedge = { off = true } }
        for k, v in pairs(UPSTREAM_DEFAULTS) do e[k] = v end
        e.timeout_ms, e.max_body_bytes = timeout, 65536
        if scheme == "https" then e.tls = check_upstream_tls(c, nil, host, "token_exchange", teline) end
        out.upstreams[#out.upstreams + 1] = e
        out.token_exchange = { path = path ~= "" and path or "/", timeout_ms = timeout, subject_token_type = stt,
                               basic = "Basic " .. edge.base64(edge.form_escape(te.client_id) .. ":" ..
                                                               edge.form_escape(secret)) }
      end
    end
  end
  for _, u in ipairs(out.upstreams) do
    if u.identity == "exchange" and te == nil then
      err(u.identity_line, "upstreams." .. u.name .. ".identity",
          "\"exchange\" needs a token_exchange block in gateway.lua (url, client_id, client_secret_file)")
    elseif u.identity and not (out.auth and out.auth.jwt) then
      err(u.identity_line, "upstreams." .. u.name .. ".identity",
          "\"" .. u.identity .. "\" passes on the user's token: gateway.lua needs an auth.jwt block")
    end
  end
end

return M
