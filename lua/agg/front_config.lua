-- agg.front_config: the front of gateway.lua, what clients meet: `listen` (ports, addresses,
-- TLS certificates), `admin` (the admin listener), `batch` (the batch endpoint) and `clients`
-- (the limits a client meets, gateway/guard/). Called by agg.config with its checking context
-- c (see agg.config); each function writes its part of out (the normalized config) and reports
-- every mistake through c.err.
local str_find, str_match = string.find, string.match
local sys = require "agg.sys"

local M = {}

local LISTEN_KEYS = { port = true, host = true, tls = true, reuse_port = true }
local ADMIN_KEYS = { port = true, host = true, allowed_hosts = true }

-- listen = { { port = 8080, host = "0.0.0.0", reuse_port = true, tls = { cert, key } }, … }
function M.check_listen(cfg, out, c)
  local lines, err, show, posint, find_line = c.lines, c.err, c.show, c.posint, c.find_line
  local file = c.file
  local listen = cfg.listen
  if listen == nil then listen = { { port = 8080 } } end
  local lline = find_line(lines, "listen")
  if type(listen) ~= "table" or #listen == 0 then
    err(lline, "listen", "must be a list like { { port = 8080 }, { port = 8443, tls = { cert = …, key = … } } }")
  else
    for i, l in ipairs(listen) do
      local where = "listen[" .. i .. "]"
      if type(l) ~= "table" then
        err(lline, where, "must be a table like { port = 8080 }")
      else
        for k in pairs(l) do
          if not LISTEN_KEYS[k] then
            err(find_line(lines, k, lline), where .. "." .. tostring(k),
                "unknown option" .. c.suggest(tostring(k), LISTEN_KEYS) .. " (port, host, tls, reuse_port)")
          end
        end
        -- (a missing port on the listen line: the next "port" text may be another block's)
        if posint(l.port, where .. ".port", l.port == nil and lline or find_line(lines, "port", lline), 65535) then
          local e = { port = l.port, host = l.host or "0.0.0.0" }
          -- reuse_port: other processes (another aggway of the same user) may listen on this port
          -- too and the kernel spreads the connections (SO_REUSEPORT); off, a port in use stops the start
          if l.reuse_port ~= nil and type(l.reuse_port) ~= "boolean" then
            err(find_line(lines, "reuse_port", lline) or lline, where .. ".reuse_port",
                "must be true or false, got " .. show(l.reuse_port))
          elseif l.reuse_port then
            e.reuse_port = 1
          end
          local h = e.host
          if type(h) ~= "string" or not (str_match(h, "^%d+%.%d+%.%d+%.%d+$") or str_find(h, ":", 1, true)) then
            err(find_line(lines, "host", lline) or lline, where .. ".host",
                "must be an IP address like \"0.0.0.0\", \"127.0.0.1\" or \"::\", got " .. show(h))
          end
          for _, other in ipairs(out.listen) do
            if other.port == e.port then err(find_line(lines, "port", lline), where .. ".port", "port " .. e.port .. " is listed twice") end
          end
          if l.tls ~= nil then
            local tline = find_line(lines, "tls", lline)
            if type(l.tls) ~= "table" or type(l.tls.cert) ~= "string" or type(l.tls.key) ~= "string" then
              err(tline, where .. ".tls", "must be { cert = \"path/cert.pem\", key = \"path/key.pem\" }")
            else
              e.cert, e.key = l.tls.cert, l.tls.key
              -- the files are read at start-up and on every reload (the C side then loads them
              -- with OpenSSL, whose messages carry these lines): check here that they are there
              -- and look like PEM
              local dir = str_match(file, "^(.*)/[^/]*$") or "."
              for _, kind in ipairs { "cert", "key" } do
                local path = l.tls[kind]
                local kline = find_line(lines, kind, tline) or tline
                e[kind .. "_line"] = kline
                if path:sub(1, 1) ~= "/" then path = dir .. "/" .. path end
                local text, why = sys.read_file(path, 65536)
                if not text then
                  err(kline, where .. ".tls." .. kind, "cannot read " .. path .. ": " .. why)
                elseif not str_find(text, "-----BEGIN", 1, true) then
                  err(kline, where .. ".tls." .. kind, path .. " is not a PEM file")
                end
              end
            end
          end
          out.listen[#out.listen + 1] = e
        end
      end
    end
  end
end

-- admin = { port = 9090, host = "127.0.0.1", allowed_hosts = { "gw-1.internal" } }: /healthz /readyz
-- /metrics /routes … (none when absent or false). allowed_hosts: the names besides IP addresses and
-- localhost a request's Host may give (gateway/front/admin.h: DNS rebinding), normalized to one
-- lowercase string, names separated by a space.
function M.check_admin(cfg, out, c)
  local lines, err, show, posint, find_line = c.lines, c.err, c.show, c.posint, c.find_line
  if cfg.admin ~= nil and cfg.admin ~= false then
    local aline = find_line(lines, "admin")
    local a = cfg.admin
    if type(a) ~= "table" then
      err(aline, "admin", "must be a table like { port = 9090, host = \"127.0.0.1\" } (or false)")
    else
      local ok = true
      for k in pairs(a) do
        if not ADMIN_KEYS[k] then
          err(find_line(lines, k, aline) or aline, "admin." .. tostring(k),
              "unknown option" .. c.suggest(tostring(k), ADMIN_KEYS) .. " (port, host, allowed_hosts)")
          ok = false
        end
      end
      local port = a.port == nil and 9090 or a.port
      if not posint(port, "admin.port", find_line(lines, "port", aline) or aline, 65535) then ok = false end
      local h = a.host == nil and "127.0.0.1" or a.host
      if type(h) ~= "string" or not (str_match(h, "^%d+%.%d+%.%d+%.%d+$") or str_find(h, ":", 1, true)) then
        err(find_line(lines, "host", aline) or aline, "admin.host",
            "must be an IP address like \"127.0.0.1\" or \"0.0.0.0\", got " .. show(h))
        ok = false
      end
      for _, l in ipairs(out.listen) do
        if l.port == port then
          err(find_line(lines, "port", aline) or aline, "admin.port", "port " .. tostring(port) .. " is also a listen port")
          ok = false
        end
      end
      local names = {}
      if a.allowed_hosts ~= nil then
        local hline = find_line(lines, "allowed_hosts", aline) or aline
        if type(a.allowed_hosts) ~= "table" then
          err(hline, "admin.allowed_hosts", "must be a list of host names like { \"gw-1.internal\" }, got "
              .. show(a.allowed_hosts))
          ok = false
        else
          for i, name in ipairs(a.allowed_hosts) do
            -- a reg-name of letters, digits, '-' and '.' (RFC 3986 §3.2.2 as DNS names use it); no
            -- port: a Host's port is never compared
            if type(name) ~= "string" or #name == 0 or #name > 253 or str_find(name, "[^%w%-%.]") then
              err(hline, "admin.allowed_hosts[" .. i .. "]",
                  "must be a host name like \"gw-1.internal\" (no port, no scheme; IP addresses and localhost "
                  .. "are always allowed), got " .. show(name))
              ok = false
            else
              names[#names + 1] = string.lower(name)
            end
          end
          for k in pairs(a.allowed_hosts) do
            if type(k) ~= "number" or k < 1 or k > #a.allowed_hosts or k % 1 ~= 0 then
              err(hline, "admin.allowed_hosts", "must be a list (no keys), got the key " .. show(k))
              ok = false
              break
            end
          end
        end
      end
      if ok then
        out.admin = { port = port, host = h, allowed_hosts = #names > 0 and table.concat(names, " ") or nil }
      end
    end
  end
end

-- batch = { route = "POST /batch", max_requests = 20, deadline_ms = … } (absent or false: no batch endpoint)
function M.check_batch(cfg, out, c)
  local lines, err, show, posint, find_line = c.lines, c.err, c.show, c.posint, c.find_line
  local suggest = c.suggest
  if cfg.batch ~= nil and cfg.batch ~= false then
    local bline = find_line(lines, "batch")
    local b = cfg.batch
    local KNOWN = { route = true, max_requests = true, deadline_ms = true }
    if type(b) ~= "table" then
      err(bline, "batch", "must be a table like { route = \"POST /batch\", max_requests = 20 } (or false)")
    else
      local ok = true
      for k in pairs(b) do
        if not KNOWN[k] then
          err(find_line(lines, tostring(k), bline) or bline, "batch." .. tostring(k),
              "unknown option" .. suggest(tostring(k), KNOWN) .. " (route, max_requests, deadline_ms)")
          ok = false
        end
      end
      local route = b.route == nil and "POST /batch" or b.route
      local method, path
      if type(route) == "string" then method, path = str_match(route, "^(POST) (/[%w%-%._~/]*)$") end
      if not method then
        err(find_line(lines, "route", bline) or bline, "batch.route",
            "must be \"POST /path\" with a literal path (no parameters), got " .. show(route))
        ok = false
      end
      local max = b.max_requests == nil and 20 or b.max_requests
      if not posint(max, "batch.max_requests", find_line(lines, "max_requests", bline) or bline, 1000) then ok = false end
      local dl = b.deadline_ms
      if dl ~= nil and not posint(dl, "batch.deadline_ms", find_line(lines, "deadline_ms", bline) or bline, 3600000) then ok = false end
      if ok then out.batch = { method = method, path = path, route = route, max_requests = max, deadline_ms = dl or false } end
    end
  end
end

-- clients = { max_connections, max_headers, max_header_bytes, max_uri_bytes, max_cancelled_streams,
-- cancel_window_s, send_timeout_s, max_unsent_bytes }:
-- the limits a client meets (gateway/guard/); out.clients holds every one, defaults filled in
-- (max_connections 0: "auto", resolved from RLIMIT_NOFILE by the C side)
function M.check_clients(cfg, out, c)
  local lines, err, show, posint, find_line = c.lines, c.err, c.show, c.posint, c.find_line
  local suggest = c.suggest
  out.clients = { max_connections = 0, max_headers = 100, max_header_bytes = 65536, max_uri_bytes = 8192,
                  max_cancelled_streams = 100, cancel_window_s = 10, send_timeout_s = 60,
                  max_unsent_bytes = 16777216 }
  if cfg.clients ~= nil then
    local cline = find_line(lines, "clients")
    local t = cfg.clients
    local CLIENTS = { max_connections = 1000000, max_headers = 10000, max_header_bytes = 16777216,
                      max_uri_bytes = 1048576, max_cancelled_streams = 1000000, cancel_window_s = 3600,
                      send_timeout_s = 3600, max_unsent_bytes = 1073741824 }
    if type(t) ~= "table" then
      err(cline, "clients", "must be a table like { max_connections = 4096, max_headers = 100 }")
    else
      for k, v in pairs(t) do
        local kline = find_line(lines, k, cline) or cline
        if not CLIENTS[k] then
          err(kline, "clients." .. tostring(k), "unknown option" .. suggest(tostring(k), CLIENTS) ..
              "; clients knows max_connections, max_headers, max_header_bytes, max_uri_bytes, max_cancelled_streams, " ..
              "cancel_window_s, send_timeout_s, max_unsent_bytes")
        elseif k == "max_connections" and v == "auto" then
          out.clients.max_connections = 0
        elseif posint(v, "clients." .. k, kline, CLIENTS[k]) then
          out.clients[k] = v
        end
      end
    end
  end
end

return M
