-- agg.redis_config: the shared Redis and the response cache's tiers in gateway.lua: `redis`
-- (one client per worker, gateway/redis/redis.h; the cache's tier 2 and Redis limit rules use
-- it) and `cache` (tier 1's memory, tier 2 on or off; agg.cache). Called by agg.config with its
-- checking context c (see agg.config); each function writes its part of out and reports every
-- mistake through c.err.
local str_match = string.match
local M = {}

-- redis = { url = "redis://host:port/db", timeout_ms = 5 }: one client per worker (gateway/redis/redis.h);
-- the URL's parts are checked again, and the host resolved, when the C side loads it
function M.check_redis(cfg, out, c)
  local lines, err, show, posint, find_line = c.lines, c.err, c.show, c.posint, c.find_line
  local suggest = c.suggest
  if cfg.redis ~= nil then
    local rline = find_line(lines, "redis")
    local r = cfg.redis
    if type(r) ~= "table" then
      err(rline, "redis", 'must be a table like { url = "redis://127.0.0.1:6379/0", timeout_ms = 5 }')
    else
      local e = { timeout_ms = 5, line = rline }
      local ok = true
      for k, v in pairs(r) do
        local kline = find_line(lines, k, rline) or rline
        if k == "url" then
          if type(v) ~= "string" or not str_match(v, "^redis://[^/]") then
            err(kline, "redis.url", 'must be a URL like "redis://127.0.0.1:6379/0", got ' .. show(v)); ok = false
          else
            e.url = v
          end
        elseif k == "timeout_ms" then
          if posint(v, "redis.timeout_ms", kline, 10000) then e.timeout_ms = v else ok = false end
        else
          err(kline, "redis." .. tostring(k), "unknown option" .. suggest(tostring(k), { url = true, timeout_ms = true }) ..
              "; redis knows url, timeout_ms")
          ok = false
        end
      end
      if not e.url and ok then
        err(rline, "redis.url", 'is required, like url = "redis://127.0.0.1:6379/0"'); ok = false
      end
      if ok then out.redis = e end
    end
  end
end

-- cache = { memory_bytes = 64 MiB, redis = true }: the tiers (agg.cache)
function M.check_cache(cfg, out, c)
  local lines, err, show, find_line, suggest = c.lines, c.err, c.show, c.find_line, c.suggest
  if cfg.cache ~= nil then
    local cline = find_line(lines, "cache")
    local c = cfg.cache
    if type(c) ~= "table" then
      err(cline, "cache", "must be a table like { memory_bytes = 64 * 1024 * 1024, redis = true }")
    else
      for k, v in pairs(c) do
        local kline = find_line(lines, k, cline) or cline
        if k == "memory_bytes" then
          if type(v) ~= "number" or v ~= v or v % 1 ~= 0 or v < 65536 or v > 2 ^ 40 then
            err(kline, "cache.memory_bytes", "must be a whole number of bytes from 65536 up, got " .. show(v))
          else
            out.cache.memory_bytes = v
          end
        elseif k == "redis" then
          if type(v) ~= "boolean" then
            err(kline, "cache.redis", "must be true or false, got " .. show(v))
          else
            out.cache.redis = v
          end
        else
          err(kline, "cache." .. tostring(k), "unknown option" .. suggest(tostring(k), { memory_bytes = true, redis = true }) ..
              "; the cache block of gateway.lua knows memory_bytes, redis (per upstream: ttl_s, swr_s, …)")
        end
      end
    end
  end
  if out.cache.redis and cfg.cache and cfg.cache.redis == true and cfg.redis == nil then
    err(find_line(lines, "cache"), "cache.redis", "is true but gateway.lua has no redis = { url = … } block")
  end
end

return M
