-- limit_redis.lua: the cluster-wide store of rate limits and quotas, run inside Redis (EVALSHA,
-- EVAL on NOSCRIPT) so that one request's check and count are one atomic step for every gateway
-- sharing the Redis (issue 18). The same arithmetic as the local store (gateway/limits/limit.c):
--   - a rate is GCRA on the theoretical arrival time, microseconds since the epoch;
--   - a quota is a count in a fixed UTC window whose end the caller computes (limit.h:
--     agw_limit_window_bounds), stored as "END_MS:COUNT".
-- Only accepted requests are counted, and a request is counted under all its rules or none: every
-- rule is judged first, and the counts are written only when every rule accepts.
--
-- KEYS[i]: "agw:rl:{rule}:{key}", one per rule of the request.
-- ARGV[1]: now, ms since the epoch (the caller's clock; gateways sharing a Redis keep NTP time).
-- ARGV[1 + 3i - 2 .. 1 + 3i] for rule i:
--   "r", emission interval µs (per_s * 1e6 / rate rounded up: agw_limit_emission_us), tau µs (emission * burst)
--   "q", quota, the window's end in ms since the epoch
-- ARGV[2 + 3n]: the check, a whole number below 2^53 that the reply gives back, so that the
--   gateway knows the reply answers this command (a server or proxy that sends one reply twice
--   shifts every later one onto the command after it).
-- Reply: { all_allowed, then per rule: allowed (0/1), remaining, reset_ms, then the check };
-- reset_ms as limit.h's agw_limit_result_t (a quota's is the window's end minus now).
-- Numbers: Redis's Lua has doubles, exact to 2^53 (µs since the epoch stay below it until the year
-- 2255); they are written with "%.0f" since tostring keeps only 14 digits.
local now_ms = tonumber(ARGV[1])
local check = tonumber(ARGV[#ARGV])
if now_ms == nil or check == nil or #ARGV ~= 2 + 3 * #KEYS then
  return redis.error_reply("ERR agw limits: bad arguments")
end
local now = now_ms * 1000
local n = #KEYS
local reply, writes, all = { 1 }, {}, 1

local function ceil_div(a, b) return math.floor((a + b - 1) / b) end

for i = 1, n do
  local kind, a, b = ARGV[3 * i - 1], tonumber(ARGV[3 * i]), tonumber(ARGV[3 * i + 1])
  if a == nil or b == nil or a < 1 or b < 1 then
    return redis.error_reply("ERR agw limits: bad arguments for rule " .. i)
  end
  local stored = redis.call("GET", KEYS[i])
  local allowed, remaining, reset_ms
  if kind == "r" then
    local t, tau = a, b
    local tat = tonumber(stored) or 0
    if tat < now then tat = now end
    local nxt = tat + t
    if nxt - now > tau then
      allowed, remaining = 0, 0
      reset_ms = ceil_div(nxt - tau - now, 1000)
      if reset_ms == 0 then reset_ms = 1 end
    else
      local used = nxt - now
      allowed = 1
      remaining = used >= tau and 0 or math.floor((tau - used) / t)
      reset_ms = ceil_div(used, 1000)
      writes[#writes + 1] = { KEYS[i], string.format("%.0f", nxt), reset_ms + 1000 }
    end
  elseif kind == "q" then
    local quota, end_ms = a, b
    local count = 0
    if stored then
      local e, c = string.match(stored, "^(%d+):(%d+)$")
      if tonumber(e) == end_ms then count = tonumber(c) end
    end
    reset_ms = end_ms > now_ms and end_ms - now_ms or 0
    if count >= quota then
      allowed, remaining = 0, 0
    else
      allowed, remaining = 1, quota - count - 1
      writes[#writes + 1] = { KEYS[i], string.format("%.0f:%d", end_ms, count + 1), reset_ms + 1000 }
    end
  else
    return redis.error_reply("ERR agw limits: unknown kind for rule " .. i)
  end
  if allowed == 0 then all = 0 end
  reply[#reply + 1] = allowed
  reply[#reply + 1] = remaining
  reply[#reply + 1] = reset_ms
end

reply[1] = all
reply[#reply + 1] = check
if all == 1 then
  for _, w in ipairs(writes) do
    redis.call("SET", w[1], w[2], "PX", string.format("%.0f", w[3]))
  end
end
return reply
