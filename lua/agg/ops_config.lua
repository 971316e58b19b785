-- agg.ops_config: what gateway.lua says of the gateway's output for operators: `access_log`
-- (a file, stderr, or off) and `tracing` (the OTLP/HTTP collector spans are exported to). Called
-- by agg.config with its checking context c (see agg.config); each function writes its part of
-- out and reports every mistake through c.err.
local M = {}

-- access_log = "path" | "stderr" | false (default: off)
function M.check_access_log(cfg, out, c)
  local lines, err, show, find_line = c.lines, c.err, c.show, c.find_line
  if cfg.access_log ~= nil and cfg.access_log ~= false then
    local v = cfg.access_log
    if type(v) ~= "string" or v == "" then
      err(find_line(lines, "access_log"), "access_log",
          "must be a file path, \"stderr\", or false, got " .. show(v))
    else
      out.access_log = v
      -- its line, for aggway check's look at whether serve could open it (main.c: not here, as a
      -- reload, which keeps the log open, must not fail when its folder moved)
      out.access_log_line = find_line(lines, "access_log") or 1
    end
  end
end

-- tracing = { otlp_http = "http://127.0.0.1:4318/v1/traces", service_name = "aggway", timeout_ms = 2000 }
-- (absent or false: spans are not exported; traceparent is propagated all the same)
function M.check_tracing(cfg, out, c)
  local lines, err, show, posint, find_line = c.lines, c.err, c.show, c.posint, c.find_line
  local suggest, parse_http_url = c.suggest, c.parse_http_url
  if cfg.tracing ~= nil and cfg.tracing ~= false then
    local tline = find_line(lines, "tracing")
    local t = cfg.tracing
    if type(t) ~= "table" then
      err(tline, "tracing", "must be a table like { otlp_http = \"http://127.0.0.1:4318/v1/traces\" } (or false)")
    else
      local ok = true
      local TRACING = { otlp_http = true, service_name = true, timeout_ms = true }
      for k in pairs(t) do
        if not TRACING[k] then
          err(find_line(lines, k, tline) or tline, "tracing." .. tostring(k), "unknown option" ..
              suggest(tostring(k), TRACING) .. "; tracing knows otlp_http, service_name, timeout_ms")
          ok = false
        end
      end
      local e = { service_name = "aggway", timeout_ms = 2000 }
      local uline = find_line(lines, "otlp_http", tline) or tline
      if type(t.otlp_http) ~= "string" then
        err(uline, "tracing.otlp_http", "is required, like otlp_http = \"http://127.0.0.1:4318/v1/traces\", got " ..
            show(t.otlp_http))
        ok = false
      else
        local host, port, path, hostport = parse_http_url(t.otlp_http)
        if not host then
          err(uline, "tracing.otlp_http", port)
          ok = false
        else
          e.otlp_http, e.host, e.port, e.host_header, e.line = t.otlp_http, host, port, hostport, uline
          e.path = path ~= "" and path or "/v1/traces"
        end
      end
      if t.service_name ~= nil then
        if type(t.service_name) ~= "string" or t.service_name == "" or #t.service_name > 128 then
          err(find_line(lines, "service_name", tline) or tline, "tracing.service_name",
              "must be a non-empty string of up to 128 characters, got " .. show(t.service_name))
          ok = false
        else
          e.service_name = t.service_name
        end
      end
      if t.timeout_ms ~= nil then
        if posint(t.timeout_ms, "tracing.timeout_ms", find_line(lines, "timeout_ms", tline) or tline, 60000) then
          e.timeout_ms = t.timeout_ms
        else
          ok = false
        end
      end
      if ok then out.tracing = e end
    end
  end
end

return M
