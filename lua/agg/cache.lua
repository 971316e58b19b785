-- agg.cache: per-section caching (issue 16; DESIGN §9, §9.1): cache-aside in front of a call.
--
-- A call with a `cache` policy (its own, or its upstream's default in gateway.lua) is looked up
-- before it starts, beside the page's other calls (every call of a fetch_all starts at once):
--   tier 1  core.cache_entry/cache_set: this worker's in-process LRU bounded by bytes (gateway/cache/lru.h);
--           a hit comes back read (cache/entry.h), its JSON body already the section's raw ref
--   tier 2  core.redis_get/redis_set: the shared Redis (gateway/redis/redis.h), when configured;
--           its answer comes back through M.on_redis; an error or a timeout is a miss
-- A miss goes upstream through the scheduler's single-flight, so a cold key costs one call.
--   fresh (now < fresh_until)                  served, status ok, outcome "hit"
--   within swr_s after expiry                  served, status ok, outcome "stale"; one refresh of
--                                              the key in the background at a time ("refresh" on
--                                              the page that started it)
--   call failed within stale_if_error_s        served, status "stale" with the call's problem
--   404                                        kept negative_ttl_s (default 10) and served as the 404
-- Never stored: a failed answer, a fallback, a stale copy, a 2xx body that is not JSON, a
-- response with Cache-Control no-store or no-cache, or private (scope shared), whatever TTL the
-- policy gives. A call that carries Authorization or Cookie is keyed by user (scope "user",
-- logged once per upstream), never shared.
-- Entries are text: "AGWC1 fresh stale error status hlen blen\n" .. headers .. body; a value
-- that does not parse, or is over MAX_ENTRY bytes, is a miss. Redis is not trusted with more than
-- the gateway puts there: a value from it that no gateway stores (a status other than 2xx or 404)
-- is a miss too, and its times are cut to what the call's policy gives (admit, M.on_redis).
local str_find, str_gmatch, str_match, str_gsub = string.find, string.gmatch, string.match, string.gsub
-- A field name is a token (RFC 9110 §5.1); NOT_TCHAR finds a byte that cannot be in one.
local TOKEN, NOT_TCHAR = "^[%w!#$%%&'*+.^_`|~-]+$", "[^%w!#$%%&'*+.^_`|~-]"
local bit = require "bit"
local json = require "agg.json"
local where = require "agg.where"
local problem = require "agg.problem"
local new_tab = require "table.new" -- table.new(narray, nhash): room for what it will hold

local str_format = string.format
local M = {}

local FORMAT = "AGWC1"
M.MAX_ENTRY = 4 * 1024 * 1024
-- The longest lifetime (s) an entry is given, a year: a policy's ttl_s, swr_s, stale_if_error_s and
-- negative_ttl_s (check_block), and what an upstream's Cache-Control says (M.lifetimes).
local MAX_SECS = 31536000
M.MAX_SECS = MAX_SECS
local JITTER = 0.1               -- TTLs are shortened by up to 10 % so a crowd of keys does not expire at once

local core, api
local use_redis = false
local pending = {}               -- redis command id -> lookup waiting on it
local refreshing = {}            -- cache key -> true while its background refresh runs
local logged_user = {}           -- upstream -> true once the shared->user scope switch was logged
local logged_cookie = {}         -- upstream -> true once an answer not stored for its Set-Cookie was logged
local logged_redis = {}          -- "refused" / "cut" -> true once a value Redis gave was logged so (M.on_redis)
M.stats = { hits = 0, misses = 0, stale = 0, stale_if_error = 0, refreshes = 0, stores = 0, negative = 0,
            bloom_hits = 0, redis_hits = 0, redis_misses = 0, redis_errors = 0, corrupt = 0 }

---------------------------------------------------------------------------------------------------
-- Policy: the `cache` block of an upstream (gateway.lua) or of a call.
---------------------------------------------------------------------------------------------------

local FIELDS = { ttl_s = "secs", swr_s = "secs", stale_if_error_s = "secs", negative_ttl_s = "secs",
                 scope = "scope", vary = "list", key = "key" }
M.FIELDS = FIELDS

--- Checks a cache block. Returns the normalized policy, or nil, the field and what is wrong.
-- allow_key: a call may give its own key; an upstream may not.
local MAX_VARY = 32 -- request header names one policy may vary on

local got = where.got

function M.check_block(t, allow_key)
  if type(t) ~= "table" then
    return nil, nil, "must be a table like { ttl_s = 60, swr_s = 30 } (or false)" .. got(t)
  end
  -- room for every field (8), so the policy made for each call never grows
  local p = new_tab(0, 8)
  p.scope, p.negative_ttl_s, p.vary = "shared", 10, false
  for k, v in pairs(t) do
    local kind = FIELDS[k]
    if not kind or (k == "key" and not allow_key) then
      local names, set = {}, {}
      for n in pairs(FIELDS) do if n ~= "key" or allow_key then names[#names + 1] = n; set[n] = true end end
      table.sort(names)
      -- (agg.config required here, off the hot path: it requires this module)
      local hint = type(k) == "string" and require("agg.config").suggest(k, set) or ""
      return nil, where.key_name(k), "unknown option" .. hint .. "; cache knows " .. table.concat(names, ", ")
    elseif kind == "secs" then
      if type(v) ~= "number" or v ~= v or v < 0 or v > MAX_SECS then
        return nil, k, "must be a number of seconds from 0 to " .. MAX_SECS .. (type(v) == "number" and got(v) or ", got " .. type(v))
      end
      p[k] = v
    elseif kind == "scope" then
      if v ~= "shared" and v ~= "user" then return nil, k, 'must be "shared" or "user"' .. got(v) end
      p.scope = v
    elseif kind == "list" then
      if type(v) ~= "table" then return nil, k, 'must be a list of request header names like { "accept-language" }' .. got(v) end
      -- (checked, lowercased and sorted for every call that gives it: a list is short, or a page
      -- that shares one long list among its calls holds the worker in the runtime's code)
      if #v > MAX_VARY then return nil, k, ("must name at most %d request headers, got %d"):format(MAX_VARY, #v) end
      local l = {}
      for i, h in ipairs(v) do
        if type(h) ~= "string" or not str_match(h, TOKEN) then
          return nil, k, "item " .. i .. " must be a header name" .. got(h)
        end
        l[#l + 1] = h:lower()
      end
      table.sort(l)
      p.vary = l
    elseif kind == "key" then
      if type(v) ~= "string" or v == "" or #v > 512 then
        return nil, k, "must be a string of 1 to 512 bytes" .. (type(v) == "string" and ", got " .. #v .. " bytes" or got(v))
      end
      p.key = v
    end
  end
  return p
end

-- A short digest of a policy: part of the key, so entries made under other settings are not served
-- after a reload that changed them (tier 1 survives reloads, gateway/cache/lru.h).
local function fnv(s, h)
  h = h or 2166136261
  for i = 1, #s do
    h = bit.bxor(h, s:byte(i))
    h = bit.tobit(h * 16777619)
  end
  return h
end
M.fnv = fnv

local VERSIONED = { "ttl_s", "swr_s", "stale_if_error_s", "negative_ttl_s", "scope" }

-- p.origin: the base path of the upstream's URL as gateway.lua gives it (agg.upstream_config,
-- agg.callspec): an upstream pointed at another API version ("/v2") keys its entries anew, while
-- its host, port and endpoints do not (a service moved or scaled keeps its cache). It goes into
-- the digest only when it is not empty, as "@path" (a vary name, a header name, has no "@"), so
-- the keys of an upstream without a path are those earlier versions made.
-- The rules an entry was stored by, first in the digest: entries that older rules stored (an answer
-- marked private or no-store that a ttl_s kept, before 2026-12-07: a review) are on other keys,
-- which no lookup finds again, in tier 1 across a reload as in the Redis of a rolling upgrade.
local STORE_RULES = "2"

local function version_of(p, vary)
  local parts = { STORE_RULES }
  for i = 1, #VERSIONED do parts[i + 1] = tostring(p[VERSIONED[i]]) end
  local origin = p.origin
  if origin and origin ~= "" then parts[#parts + 1] = "@" .. origin end
  parts[#parts + 1] = vary
  return bit.tohex(fnv(table.concat(parts, "|")), 6)
end

-- The versions already made, by the policy's fields: versions[ttl_s][swr_s][stale_if_error_s]
-- [negative_ttl_s][scope][origin][vary joined by ","] (NONE for a field not set, NEG_ZERO for -0). A call's own cache block
-- is checked and merged on every call, and the digest in Lua cost about 7,000 instructions a call
-- (CACHE=hit tools/bench/callgrind: 134,398 per page of three hits, 114,860 with the version
-- looked up). At most MAX_VERSIONS policies are kept (a script that computes its ttl_s from the
-- data could make a new one every call): then it starts again from none.
local NONE, NEG_ZERO, MAX_VERSIONS = {}, {}, 1024
local versions, n_versions = {}, 0

--- The version of policy p (as check_block makes it): a digest of its fields (six hex digits),
-- part of its entries' keys (M.key). The same policy gives the same version in every instance and
-- after every reload (it is part of the keys shared in Redis).
function M.version(p)
  local vary = p.vary and table.concat(p.vary, ",") or ""
  local t = versions
  for i = 1, #VERSIONED do
    local v = p[VERSIONED[i]]
    if v == nil then
      v = NONE
    elseif v == 0 and 1 / v < 0 then
      v = NEG_ZERO -- one table key with 0, but tostring gives "-0": a version of its own
    end
    local sub = t[v]
    if not sub then sub = {} t[v] = sub end
    t = sub
  end
  local origin = p.origin or NONE
  local sub = t[origin]
  if not sub then sub = {} t[origin] = sub end
  t = sub
  local ver = t[vary]
  if not ver then
    if n_versions >= MAX_VERSIONS then versions, n_versions = {}, 0 return M.version(p) end
    ver = version_of(p, vary)
    t[vary] = ver
    n_versions = n_versions + 1
  end
  return ver
end

--- Policy p varying on names as well (request header names, lowercased): p itself when it varies
-- on every one already, else a copy with the sorted union and its version. An upstream's
-- forward_headers: every call to it carries the client's values of those headers, so its answers
-- may differ by them, and an entry keyed without them was served to clients that sent other
-- values (another user's token, another language).
function M.with_vary(p, names)
  if not names or #names == 0 then return p end
  local have, l = {}, {}
  for _, n in ipairs(p.vary or {}) do have[n] = true l[#l + 1] = n end
  local added = false
  for _, n in ipairs(names) do
    if not have[n] then have[n] = true l[#l + 1] = n added = true end
  end
  if not added then return p end
  table.sort(l)
  local q = new_tab(0, 8)
  for k, v in pairs(p) do q[k] = v end
  q.vary = l
  q.version = M.version(q)
  return q
end

--- The policy of a call: the upstream's default overridden field by field by the call's block
-- (call false: off). Returns the policy, or false. forwarded: the upstream's forward_headers,
-- which the policy varies on whatever the call's block says (M.with_vary).
-- The last policy merged for each upstream name from a call's block without a `key`: a page's
-- calls write their block as a table constructor (`cache = { ttl_s = 60 }`), a new table with the
-- same fields at every call, and checking, merging and versioning it cost about 2,800
-- instructions a cached call (CACHE=hit tools/bench/callgrind: 87,051 a page of three hits
-- against 78,468 with the same policy on the upstream). A block with the fields and values of the
-- last one, under the same upstream policy, forwarded headers and base path, gets its policy
-- again: a policy is never changed once merged (agg.cache reads it; M.with_vary and
-- with_learned make copies), so calls share it as they share their upstream's. A block with a
-- `key` names an item, which changes from call to call: never kept. One entry per name, replaced
-- by the next block that differs.
local merged = {}

-- Whether call block b has exactly the fields of memo entry m's block, with the same values
-- (checked by value: 0 and -0 are other versions, M.version; a vary list item by item, as
-- check_block reads it).
local function same_block(m, b)
  local kept, n = m.block, 0
  for k, v in pairs(b) do
    local was = kept[k]
    if was == nil then return false end
    if k == "vary" then
      if type(v) ~= "table" or #v ~= #was then return false end
      for i = 1, #was do
        if rawget(v, i) ~= was[i] then return false end
      end
    elseif v ~= was or (v == 0 and 1 / v ~= 1 / was) then
      return false
    end
    n = n + 1
  end
  return n == m.n
end

-- Memo entry of block b (no key) and what it merged to.
local function remember(b, up_policy, forwarded, origin, p)
  local kept, n = {}, 0
  for k, v in pairs(b) do
    if k == "vary" then
      local l = {}
      for i = 1, #v do l[i] = rawget(v, i) end
      v = l
    end
    kept[k] = v
    n = n + 1
  end
  return { up = up_policy or false, forwarded = forwarded or false, origin = origin or false, block = kept, n = n, p = p }
end

function M.merge(up_policy, call_block, level, name, forwarded, origin)
  if call_block == false then return false end
  if call_block == nil then return up_policy or false end
  local plain = getmetatable(call_block) == nil -- (pairs sees no field a metatable gives: never kept)
  local m = plain and merged[name]
  if m and rawequal(m.up, up_policy or false) and rawequal(m.forwarded, forwarded or false) and
     m.origin == (origin or false) and same_block(m, call_block) then
    return m.p
  end
  local p, field, why = M.check_block(call_block, true)
  if not p then
    -- at the line of the faulty field (or of the cache option), as agg.callspec places the call's
    -- other options (a fresh user's trial: the fetch_all's line was named)
    where.raise(("call to '%s': cache%s %s"):format(name, field and ("." .. field) or "", why), level + 1,
                where.option(field or "cache"))
  end
  if up_policy then
    for k, v in pairs(up_policy) do
      if call_block[k] == nil and k ~= "version" then p[k] = v end
    end
  end
  p.origin = origin -- (the upstream's: see VERSIONED)
  if forwarded then p = M.with_vary(p, forwarded) end
  p.version = M.version(p)
  if plain and call_block.key == nil then merged[name] = remember(call_block, up_policy, forwarded, origin, p) end
  return p
end

---------------------------------------------------------------------------------------------------
-- Entries
---------------------------------------------------------------------------------------------------

function M.encode(fresh, stale, err_until, status, headers, body)
  -- (LuaJIT's format: a string's :format is the scripts', which checks its size first)
  return str_format("%s %d %d %d %d %d %d\n", FORMAT, fresh, stale, err_until, status, #headers, #body) .. headers .. body
end

-- The whole number at v[i..] up to the byte `stop` (plain finds and tonumber: a page's hit path
-- stays in compiled code, where string.match would not); nil when it is not digits only.
local function field(v, i, stop)
  local j = str_find(v, stop, i, true)
  if not j or j == i or j - i > 15 then return nil end
  local n = tonumber(v:sub(i, j - 1))
  if not n or n < 0 or n % 1 ~= 0 or v:byte(i) == 43 then return nil end -- digits only ("+1", "1e3" and "0x1" fail below)
  for k = i, j - 1 do
    local b = v:byte(k)
    if b < 48 or b > 57 then return nil end
  end
  return n, j + 1
end

--- The answer of core.cache_entry for entry text v (nil: a miss): what the C worker computes in one
-- call, made here from M.decode and json.parse (the spec harness's tier 1, and agg.testing).
function M.entry_fields(v, decode)
  if v == nil then return nil end
  local e = M.decode(v)
  if not e then return false end
  if decode and e.status >= 200 and e.status < 300 and e.body ~= "" then
    local ref = json.parse(e.body)
    if not ref then return false end
    return e.fresh, e.stale, e.error_until, e.status, ref, e.headers
  end
  return e.fresh, e.stale, e.error_until, e.status, e.body, e.headers
end

--- Decodes an entry, or nil when it is not one (corrupt, other format, lengths that disagree).
function M.decode(v)
  if type(v) ~= "string" or #v > M.MAX_ENTRY or v:sub(1, 6) ~= "AGWC1 " then return nil end
  local fresh, stale, eu, st, hl, bl
  local i = 7
  fresh, i = field(v, i, " ")
  if fresh then stale, i = field(v, i, " ") end
  if stale then eu, i = field(v, i, " ") end
  if eu then st, i = field(v, i, " ") end
  if st then hl, i = field(v, i, " ") end
  if hl then bl, i = field(v, i, "\n") end
  if not bl or i + hl + bl - 1 ~= #v then return nil end
  return { fresh = fresh, stale = stale, error_until = eu, status = st,
           headers = v:sub(i, i + hl - 1), body = v:sub(i + hl), raw = v }
end

-- The value of header name (lowercase) in a header block "name\0value\0…" (names lowercased, as
-- the transport gives them), or nil; repeated names are joined with ", " (RFC 9110 §5.3).
local function block_get(block, name)
  local out
  local pos = 1
  local n = #block
  while pos <= n do
    local z1 = str_find(block, "\0", pos, true)
    if not z1 then break end
    local z2 = str_find(block, "\0", z1 + 1, true)
    if not z2 then break end
    if z1 - pos == #name and block:sub(pos, z1 - 1) == name then
      local v = block:sub(z1 + 1, z2 - 1)
      out = out and (out .. ", " .. v) or v
    end
    pos = z2 + 1
  end
  return out
end
M.block_get = block_get

--- The directives of a Cache-Control value s, appended to out (commas inside a quoted string do not
-- split: no-cache="a, b"), trimmed, empty ones left out.
local function cc_directives(s, out)
  local start, quoted, escaped = 1, false, false
  for i = 1, #s + 1 do
    local c = s:byte(i)
    if escaped then
      escaped = false
    elseif quoted and c == 92 then
      escaped = true
    elseif c == 34 then
      quoted = not quoted
    elseif c == nil or (c == 44 and not quoted) then
      local d = str_match(s:sub(start, i - 1), "^%s*(.-)%s*$")
      if d ~= "" then out[#out + 1] = d end
      start = i + 1
    end
  end
end
M.cc_directives = cc_directives

-- Cache-Control directives (RFC 9111 §5.2.2; RFC 5861 §3, §4) of an upstream response (cc: the
-- header's value or nil).
local function cache_control(cc)
  if type(cc) ~= "string" then return nil end
  local d, items = {}, {}
  cc_directives(cc:lower(), items)
  for _, item in ipairs(items) do
    local name, val = str_match(item, "^%s*([%w%-]+)%s*=?%s*\"?([^\"]*)\"?%s*$")
    if name then d[name] = tonumber(val) or true end
  end
  return d
end
M.cache_control = cache_control

-- Whether an answer whose parsed Cache-Control is cc (nil: none) may be stored under policy p at
-- all: the upstream's to say, whatever lifetime the policy gives it (RFC 9111 §5.2.2.5, §5.2.2.4,
-- §5.2.2.7): no-store never, no-cache never (the gateway does not revalidate), private never in a
-- shared entry (an attack review: with a ttl_s, an answer marked private for one user was served
-- to the others). A 404 too, for its negative_ttl_s.
-- per_user: the call is keyed by its user whatever the policy's scope (M.key: it carried
-- credentials or the user's identity), so its entry is that user's own: private may be kept.
local function storable(p, cc, per_user)
  return not (cc and (cc["no-store"] or cc["no-cache"] or (cc["private"] and p.scope == "shared" and not per_user)))
end

-- The seconds directive value v (cache_control's: a number, or true) gives, or nil for none: a
-- number from 0, at most MAX_SECS. RFC 9111 §1.2.2: a delta-seconds larger than a cache can
-- represent is taken as the largest it can (here the policy's own bound, a year: an attack review
-- sent stale-if-error=1e400, whose infinity the C worker turned into a Redis PX of 0, and 10^17,
-- a PX past LLONG_MAX); NaN and a negative number are no delta-seconds.
local function cc_secs(v)
  if type(v) ~= "number" or v ~= v or v < 0 then return nil end
  return v < MAX_SECS and v or MAX_SECS
end

--- Lifetimes (s) of an answer whose Cache-Control value is cc_value (nil: none) under policy p:
-- fresh, swr, stale_if_error, each from 0 to MAX_SECS; nil when it must not be stored. The
-- policy's own fields when set (check_block bounds them), else the answer's s-maxage or max-age
-- (RFC 9111 §5.2.2.10, §5.2.2.1; none or 0: not stored), stale-while-revalidate and stale-if-error
-- (RFC 5861 §3, §4; none: 0), cut to MAX_SECS (cc_secs). per_user: see storable.
-- Example: cache.lifetimes({ scope = "shared" }, "max-age=60, stale-if-error=1e400") --> 60, 0, 31536000
function M.lifetimes(p, cc_value, per_user)
  local cc = cache_control(cc_value)
  local ttl, swr, sie = p.ttl_s, p.swr_s, p.stale_if_error_s
  if not storable(p, cc, per_user) then return nil end
  if ttl == nil then
    if not cc then return nil end
    local age = cc_secs(cc["s-maxage"]) or cc_secs(cc["max-age"]) -- s-maxage for shared caches (§5.2.2.10)
    if not age or age <= 0 then return nil end
    ttl = age
  end
  if swr == nil then swr = cc and cc_secs(cc["stale-while-revalidate"]) or 0 end
  if sie == nil then sie = cc and cc_secs(cc["stale-if-error"]) or 0 end
  return ttl, swr, sie
end

---------------------------------------------------------------------------------------------------
-- Bloom filter of keys known missing (404): a rotating pair, each filter current for half of
-- negative_ttl_s, so a key is known missing for at most negative_ttl_s; a key in either is
-- answered 404 without Redis or the upstream (a false positive, about 0.01 % at 100,000 keys,
-- answers 404 for at most negative_ttl_s).
-- Clients choose the keys that fill it (ids that do not exist), so it is kept from their reach:
--   - the bits of a key come from SipHash under a key drawn at random per process (agg.sys
--     keyed_hash): with an unkeyed hash a client computed offline a handful of missing ids whose
--     404s set every bit of a real item's key, and that item was answered 404 without the upstream;
--   - a filter takes at most BLOOM_KEYS keys: past them a 404 is not added (it is still kept in the
--     cache's tiers for negative_ttl_s), so a flood of missing ids cannot fill the filter's bits and
--     raise the false positives of every other key above the design's 0.01 %.
-- A purge (POST /cache/purge, M.on_purge) must forget the keys it names here too, or a purged 404
-- went on being answered from the filter, without the upstream, for up to negative_ttl_s (an
-- attack review). A Bloom filter cannot delete a key, and it cannot list them: the pair remembers
-- the heads of the keys it took ("agw:{upstream}:version:", at most MAX_HEADS, then "any"), and a
-- purge whose prefix could start a key of one of them empties both filters. What they forget is
-- still in the tiers (a 404 entry is kept for negative_ttl_s; the purge drops only its own keys'):
-- the other missing keys are still answered without the upstream, by tier 1 or Redis.
---------------------------------------------------------------------------------------------------

local BLOOM_BITS = 2 ^ 21        -- 256 KiB per filter, 7 probes: about 0.01 % false positives at 100,000 keys
local BLOOM_KEYS = 100000        -- keys a filter takes at most (the false-positive rate above)
local MAX_HEADS = 64             -- key heads the pair remembers; past them any purge empties it
-- heads: head -> true for the keys either filter took since both were last empty (n_heads of
-- them; any: a key past MAX_HEADS, or one without a head, was taken)
local bloom = { cur = {}, old = {}, n = 0, since = nil, every = 10000, heads = {}, n_heads = 0, any = false }

-- Both filters empty (a purge, M.init).
local function bloom_clear()
  bloom.cur, bloom.old, bloom.since, bloom.n = {}, {}, nil, 0
  bloom.heads, bloom.n_heads, bloom.any = {}, 0, false
end

local bloom_idx = require("agg.sys").keyed_hash -- key -> h1, h2 (h2 odd)
M.BLOOM_KEYS = BLOOM_KEYS

local function bloom_has(f, h1, h2)
  for i = 0, 6 do
    local b = (h1 + i * h2) % BLOOM_BITS
    local w = f[math.floor(b / 32)]
    if not w or bit.band(w, bit.lshift(1, b % 32)) == 0 then return false end
  end
  return true
end

local function bloom_rotate(now)
  if not bloom.since then bloom.since = now end
  local elapsed = now - bloom.since
  if elapsed >= 2 * bloom.every then
    bloom_clear()
    bloom.since = now
  elseif elapsed >= bloom.every then
    bloom.old, bloom.cur, bloom.since, bloom.n = bloom.cur, {}, now, 0
  end
end

--- Adds key (a 404's cache key) to the current filter, unless it holds BLOOM_KEYS already.
function M.bloom_add(key, now, every_ms)
  bloom.every = every_ms
  bloom_rotate(now)
  if bloom.n >= BLOOM_KEYS then return end
  bloom.n = bloom.n + 1
  if not bloom.any then
    -- (an upstream's name is an identifier, agg.upstream_config: no "}" in it)
    local head = str_match(key, "^agw:{[^}]*}:[^:]*:")
    if not head or (not bloom.heads[head] and bloom.n_heads >= MAX_HEADS) then
      bloom.any = true
    elseif not bloom.heads[head] then
      bloom.heads[head], bloom.n_heads = true, bloom.n_heads + 1
    end
  end
  local h1, h2 = bloom_idx(key)
  local f = bloom.cur
  for i = 0, 6 do
    local b = (h1 + i * h2) % BLOOM_BITS
    local wi = math.floor(b / 32)
    f[wi] = bit.bor(f[wi] or 0, bit.lshift(1, b % 32))
  end
end

function M.bloom_check(key, now)
  bloom_rotate(now)
  local h1, h2 = bloom_idx(key)
  return bloom_has(bloom.cur, h1, h2) or bloom_has(bloom.old, h1, h2)
end

--- The cache entries whose keys start with prefix were purged (POST /cache/purge: the worker
-- hands each prefix to every VM on its next tick, runtime.on_purge, after it purged its tier 1):
-- the keys known missing are forgotten too when any of them could start with prefix (see above:
-- both filters are emptied). Returns true when they were.
-- Example: cache.on_purge("agw:{product}") --> true when a 404 of product is remembered
function M.on_purge(prefix)
  if type(prefix) ~= "string" or bloom.n_heads == 0 and not bloom.any then return false end
  local match = bloom.any
  if not match then
    for head in pairs(bloom.heads) do
      local n = math.min(#head, #prefix)
      if head:sub(1, n) == prefix:sub(1, n) then match = true break end -- one starts the other
    end
  end
  if match then bloom_clear() end
  return match
end

---------------------------------------------------------------------------------------------------
-- Keys
---------------------------------------------------------------------------------------------------

-- Request headers that carry a user's credentials (RFC 9110 §11.6.2 Authorization, §11.7.2
-- Proxy-Authorization; RFC 6265 §5.4 Cookie; X-API-Key and the header gateway.lua's
-- auth.api_keys names, M.add_credential_header): a call with one is cached per user and never
-- shared, and never joins another client's call (agg.callspec's single-flight, agg.merge's
-- batches). A call that passed the client's X-API-Key on was cached as one shared entry: every
-- other client, with another key or none, was given the first client's account.
local BASE_CREDENTIALS = { authorization = true, cookie = true, ["proxy-authorization"] = true, ["x-api-key"] = true }
local CREDENTIALS = {}
for n in pairs(BASE_CREDENTIALS) do CREDENTIALS[n] = true end
M.CREDENTIALS = CREDENTIALS
-- (the four alone, whatever folder was loaded: agg.upstream_config's forward_headers check; read-only)
M.BASE_CREDENTIALS = BASE_CREDENTIALS

--- Makes CREDENTIALS the base four and the request header name (any case; nil or a value that is
-- not a string: none): the header gateway.lua's auth.api_keys names (agg.loader, as a generation
-- is loaded). The last load's: a VM that loads several folders (the spec harness) keeps no other.
function M.set_credential_header(name)
  for k in pairs(CREDENTIALS) do CREDENTIALS[k] = nil end
  for n in pairs(BASE_CREDENTIALS) do CREDENTIALS[n] = true end
  if type(name) == "string" then CREDENTIALS[name:lower()] = true end
end

-- The call's request header (lowercased name) or nil; headers is the flat list name, value, ….
-- The last credentials a key was made for and their digest. A client's Cookie may be 64 KB: its
-- SHA-256 for each of a page's 1,000 calls cost about 130 ms of the worker's time.
local last_cred, last_user

local function header_of(headers, name)
  if not headers then return nil end
  for i = 1, #headers, 2 do if headers[i] == name then return headers[i + 1] end end
  return nil
end

-- What a key holds in place of a credential or a header's value: its digest (core.digest:
-- SHA-256, 32 hex digits; the spec harness has none and uses FNV).
local function digest(s)
  return core.digest and core.digest(s) or bit.tohex(fnv(s)) .. bit.tohex(fnv(s, 99991))
end

-- A request header's value in a key: its digest, so that a key never holds a client's token or any
-- other value it forwards (Redis shows keys to whoever can list them; logs and the admin API's
-- purge name them). An empty value has a digest too: only an absent header is "" (RFC 9111 §4.1:
-- a header absent from one request matches only its absence). The last 256 values are
-- remembered: a page's calls carry the same few.
local vary_memo, vary_memo_n = {}, 0
local function vary_digest(v)
  local d = vary_memo[v]
  if d then return d end
  d = digest(v)
  if vary_memo_n >= 256 then vary_memo, vary_memo_n = {}, 0 end
  vary_memo[v], vary_memo_n = d, vary_memo_n + 1
  return d
end

-- s as a key's path or script key: a '|' written %7C, so that every '|' after it is the gateway's
-- (the vary parts, the user's part) and a client cannot name a path whose key is another user's or
-- another variant's entry ("/p?id=1|u:<digest>" was that user's key).
local function key_text(s)
  if str_find(s, "|", 1, true) then return (str_gsub(s, "|", "%%7C")) end
  return s
end

-- a and b joined, or the one that is there (or nil)
local function both_credentials(a, b)
  if a and b then return a .. "\0" .. b end
  return a or b
end

-- The credentials call headers h (the flat list name, value, …; names lowercased) carry: each
-- header of CREDENTIALS that is there, as "name:value", sorted and joined by "\0", or nil. All
-- of them: a call may carry a service's Authorization and the user's Cookie (keyed by the first
-- alone, every user shared one entry). Sorted: the list's order is the script's table's, which
-- differs from VM to VM (each worker's, each generation's), and a user's key must not.
local function credentials_of(h)
  if not h then return nil end
  local c, parts
  for i = 1, #h, 2 do
    local name = h[i]
    if CREDENTIALS[name] then
      local v = name .. ":" .. h[i + 1]
      if not c then c = v
      else
        parts = parts or { c }
        parts[#parts + 1] = v
      end
    end
  end
  if parts then
    table.sort(parts)
    return table.concat(parts, "\0")
  end
  return c
end

--- The cache key of a call, or nil when it cannot be cached (scope user with no user to key by).
-- "agw:{upstream}:version:" .. (the script's key, or "METHOD path" and the vary headers) ..
-- ("|u:" .. digest of the credentials for scope user). The braces are a Redis Cluster hash tag.
function M.key(ctx, spec, p)
  local h = spec.headers
  local scope = p.scope
  local cred = credentials_of(h)
  -- a call that will carry the user's identity (the upstream's `identity`, agg.identity) is as
  -- personal as one that carries credentials of its own: the token is added after this lookup
  if (cred or spec.personal) and scope == "shared" then
    scope = "user"
    if not logged_user[spec.upstream] then
      logged_user[spec.upstream] = true
      core.log("warn", ("cache: calls to %s carry credentials (Authorization, Proxy-Authorization, Cookie, an API key's header) or the user's identity: cached per user, never shared"):format(spec.upstream))
    end
  end
  local path = key_text(spec.path)
  local body = spec.body
  if scope ~= "user" and not p.key and not p.vary and not body then
    -- the common key in one concatenation (no table)
    return "agw:{" .. spec.upstream .. "}:" .. (p.version or "0") .. ":" .. spec.method .. " " .. path
  end
  local parts = { "agw:{", spec.upstream, "}:", p.version or "0", ":" }
  if p.key then
    -- "key " before a script's own key: a method is upper case, so no key a script computes (from
    -- a client's input, "GET /price/1") is the key of a call by path (an attack review)
    parts[#parts + 1] = "key "
    parts[#parts + 1] = key_text(p.key)
  else
    parts[#parts + 1] = spec.method
    parts[#parts + 1] = " "
    parts[#parts + 1] = path
  end
  -- the vary headers (with the upstream's forward_headers) key a script's own key too: a key names
  -- the item, not the client headers its answer may differ by
  if p.vary then
    for _, name in ipairs(p.vary) do
      local v = header_of(h, name)
      parts[#parts + 1] = "|" .. name .. "=" .. (v and vary_digest(v) or "")
    end
  end
  -- a GET's body (a search's query, as some APIs take): the answer differs by it, so the key holds
  -- its digest (an attack review: two users' searches shared one entry). "|b:" is no vary part
  -- (a field name has no ':')
  if body then
    parts[#parts + 1] = "|b:"
    parts[#parts + 1] = digest(body)
  end
  if scope == "user" then
    -- (written only when true: the call's table has no slot for it, agg.callspec)
    spec.cache_user = true
    -- every credential that says who the user is goes into the key, with the call's own (a
    -- cookie it forwards; a service key every user's call carries is no user's): the token the
    -- edge verified for the page, which alone names the user (a cookie beside it, an analytics
    -- or a load balancer's that changes every page, must not make every page a miss); else the
    -- app of the API key it verified (a client application, which its users share) and the page
    -- request's Authorization or Cookie, which tell an app's users, or an open endpoint's, apart.
    -- ("\0" starts no header value: the app's mark is no token's or cookie's text.)
    local user, token = api.request_user(ctx)
    if token then
      cred = both_credentials(cred, token)
    else
      local app = user and user.via == "api_key" and "\0api_key:" .. tostring(user.app) or nil
      -- the page request's, found once per request (ctx.cache_cred: false for none)
      local rcred = ctx.cache_cred
      if rcred == nil then
        local rh = api.request_headers(ctx)
        if type(rh) == "string" then
          rcred = both_credentials(block_get(rh, "authorization"), block_get(rh, "cookie"))
        elseif type(rh) == "table" then
          rcred = both_credentials(rh.authorization, rh.cookie)
        end
        ctx.cache_cred = rcred or false
      end
      cred = both_credentials(cred, both_credentials(app, rcred or nil))
    end
    if not cred then return nil end
    parts[#parts + 1] = "|u:"
    if cred ~= last_cred then -- (a page's calls carry the same: digested once, not per call)
      last_cred = cred
      last_user = digest(cred)
    end
    parts[#parts + 1] = last_user
  end
  return table.concat(parts)
end

---------------------------------------------------------------------------------------------------
-- The path of a call
---------------------------------------------------------------------------------------------------

--- How long the data of the result whose info (agg.result's: the call's table) is x stays fresh
-- (ms from now), when it is a shared cache entry served fresh or just stored; nil for anything else
-- (a user's entry, a stale copy, an uncached call). (The call's table holds it, x.fresh_until: a
-- weak table from result to time, one entry a cached section, was rehashed whole every few dozen
-- pages and walked at every atomic step of the collector.)
function M.fresh_left_ms(x)
  local t = x.fresh_until
  if not t then return nil end
  local left = t - core.now()
  return left > 0 and left or nil
end

--- True when the data of the call behind result info x (agg.result's info: the call's spec) is one
-- user's: the call carried Authorization or Cookie or the user's identity, or was cached per user.
function M.personal(x)
  if not x then return false end
  if x.personal or x.cache_user then return true end
  return credentials_of(x.headers) ~= nil
end

--- The scheduler's functions the cache calls (agg.runtime, once at load).
function M.bind(runtime_api) api = runtime_api end

-- The names learned from upstreams' Vary (see vary_learn below), per upstream; and the Vary names
-- logged, per upstream (once per VM: M.init starts them again).
local learned, learned_memo, MAX_LEARNED = {}, setmetatable({}, { __mode = "k" }), 16
local logged_vary = {}

--- A fresh start with transport core (agg.runtime.init): tier 2 is used when the transport has
-- core.redis_get (the C worker has it when gateway.lua configures redis and cache.redis).
function M.init(transport)
  core = transport
  use_redis = core.redis_get ~= nil
  pending, refreshing = {}, {}
  learned, learned_memo, logged_vary, logged_user = {}, setmetatable({}, { __mode = "k" }), {}, {}
  logged_cookie = {}
  logged_redis = {}
  merged = {}
  bloom_clear()
  for k in pairs(M.stats) do M.stats[k] = 0 end
end

--- The key under which ctx.cache_desc keeps the outcomes already given to Server-Timing entries,
-- by entry (agg.exchange add_timing): a table, so no section key equals it.
M.BY_ENTRY = {}

-- Notes the cache outcome of the call of section sec of ctx, for its Server-Timing entry (the
-- next one of sec: agg.exchange add_timing takes it from here).
local function outcome(ctx, sec, what)
  local d = ctx.cache_desc
  if not d then d = new_tab(0, 4) ctx.cache_desc = d end -- room for a page's few cached sections
  d[sec] = what
end

-- The result of entry e for exchange spec (section sec of ctx), or nil when its body is not JSON.
-- e.ref: the body as a raw JSON ref already (a tier-1 hit, core.cache_entry), the header block
-- inside it when e.headers is true.
local function result_of(ctx, sec, spec, e)
  local data = e.ref
  if not data and spec.decode and e.status >= 200 and e.status < 300 and e.body ~= "" then
    data = api.parse(e.body)
    if not data then return nil end
  end
  spec.ctx, spec.key = ctx, sec
  local r = api.make_result(spec, "ok", e.status, e.headers, spec.decode and e.status < 300 and nil or e.body, data, 0)
  spec.ctx = false -- the result's info must not lead back to the request (see runtime's finish_exchange)
  return r
end

-- The request headers each upstream's answers said they vary on (their Vary field) beyond the
-- names its calls' keys held: learned[upstream] = sorted list of names, at most MAX_LEARNED; a
-- list is replaced, never changed, when a name is added. From then on every cached call to that
-- upstream is keyed by them too (with_learned, in M.lookup and in store): RFC 9111 §4.1, a stored
-- answer serves a later request only when the headers its Vary names match those of the request
-- it answered; an entry keyed by their values matches by construction. An answer with
-- `Vary: Accept-Encoding` from an upstream that was not configured to vary on it is so stored for
-- the calls' value (the gateway sends none unless a script sets it), and one whose Vary names a
-- header a script sets on some calls only is stored per value. Never learned: `*` (the answer is
-- not stored), the headers the gateway sets on each request itself (trace context: a key per
-- request), and Authorization and Cookie (a call that carries them is cached per user already,
-- by a digest of them; a shared entry's calls carry none).
local PER_REQUEST = { traceparent = true, tracestate = true }
local MAX_NAME = 64 -- longer names are refused (a name is part of every key of the upstream)

-- Policy p with the names learned for upstream up (p itself when none), one copy per policy and list.
local function with_learned(p, up)
  local names = learned[up]
  if not names then return p end
  local m = learned_memo[p]
  if m and m.names == names then return m.q end
  local q = M.with_vary(p, names)
  learned_memo[p] = { names = names, q = q }
  return q
end

-- What the Vary field v (nil: none) of an answer to call x, keyed under policy p, asks: true when
-- the call's key holds every header it names; false when it cannot be stored (`*`, a header set
-- per request, no field name, or more names than an upstream may learn); nil when the call's key
-- left names out: they are learned for the upstream (those not learned yet) and the caller keys
-- the call again with them. A call sent before a name was learned has a key without it: it is
-- keyed again too, never stored under the key it was looked up with (other VMs, a reload, or the
-- shared tier would find it there for every value). A refusal and each name learned are logged
-- once per upstream and name (at most 64 names per VM).
local function vary_learn(x, p, v)
  if not v then return true end
  local keyed = {}
  for _, h in ipairs(p.vary or {}) do keyed[h] = true end
  local have = learned[x.upstream] or {}
  local known = {}
  for _, h in ipairs(have) do known[h] = true end
  local missing, add, refuse = false, nil, nil
  for name in str_gmatch(v, "[^,%s]+") do
    name = name:lower()
    if name == "*" or PER_REQUEST[name] or #name > MAX_NAME or str_find(name, NOT_TCHAR) then
      -- `*`, a header set per request, or what is no field name (RFC 9110 §5.1: a token; a quoted
      -- or parametered name would be learned and match no header, so every caller shared one entry)
      refuse = #name > MAX_NAME and name:sub(1, MAX_NAME) or name
      refuse = str_gsub(refuse, NOT_TCHAR, "?")
    elseif not keyed[name] and not CREDENTIALS[name] then
      missing = true
      keyed[name] = true
      if not known[name] then
        known[name] = true
        add = add or {}
        add[#add + 1] = name
      end
    end
  end
  local seen = logged_vary[x.upstream]
  if not seen then seen = {} logged_vary[x.upstream] = seen end
  if not refuse and add and #have + #add > MAX_LEARNED then refuse = ("(more than %d names)"):format(MAX_LEARNED) end
  if refuse then
    if not seen[refuse] and #seen < 64 then
      seen[#seen + 1], seen[refuse] = refuse, true
      core.log("warn", ("cache: answers of %s carry Vary: %s: not stored%s"):format(x.upstream, refuse,
        refuse == "*" and "" or PER_REQUEST[refuse] and " (the gateway sets that header on every request)" or
        str_find(refuse, "^%(") and "" or " (not a field name of at most 64 bytes)"))
    end
    return false
  end
  if not missing then return true end
  if add then
    local l = {}
    for i = 1, #have do l[i] = have[i] end
    for _, name in ipairs(add) do
      l[#l + 1] = name
      if not seen[name] and #seen < 64 then
        seen[#seen + 1], seen[name] = name, true
        core.log("info", ("cache: answers of %s carry Vary: %s: its entries are keyed by that request header from now on"):format(
          x.upstream, name))
      end
    end
    table.sort(l)
    learned[x.upstream] = l
  end
  return nil
end

-- Stores result r of exchange x; returns when its data stops being fresh (ms), or nil.
local function store(x, r, now)
  local p = x.cache
  local ck = x.cache_key
  local status = r.http_status or 0
  -- the answer's headers as the transport gave them: a header block, or the body's raw ref that
  -- keeps them (core.cache_store makes the block of it, no Lua string); or, when the script has
  -- read result.headers already, a block made again from that table
  local hdrs = x.raw_headers
  if not hdrs then
    local h = rawget(r, "headers")
    local hb = {}
    if type(h) == "table" then
      for k, v in pairs(h) do hb[#hb + 1] = k .. "\0" .. v .. "\0" end
      table.sort(hb)
    end
    hdrs = table.concat(hb)
  end
  -- the block, made once (core.cache_store takes it as it is): its Vary is read before storing
  if type(hdrs) ~= "string" then hdrs = json.raw_extra(hdrs) or "" end
  local fits = vary_learn(x, p, block_get(hdrs, "vary"))
  if fits == false then return end
  if fits == nil then
    -- (a user's entry: its next calls are keyed by the names, this answer is not stored)
    if x.cache_user then return end
    -- keyed again with the names just learned: the entry is found only by calls whose values of
    -- them are this call's (and the page that shows it says Vary with them, agg.page)
    p = with_learned(p, x.upstream)
    ck = M.key(x.ctx, x, p)
    if not ck then return end
    x.cache, x.cache_key = p, ck
  end
  -- an answer that sets a cookie (a session, a CSRF token) is its client's: an entry would give
  -- it to every client whose script reads result.headers (an attack review: the second client was
  -- shown the first one's session cookie), a user's entry too (one keyed by an API key's app is
  -- shared by the app's users). Not stored, as shared caches do by default (Varnish's built-in
  -- rule; RFC 9111 §3 leaves it to the cache).
  if block_get(hdrs, "set-cookie") then
    if not logged_cookie[x.upstream] then
      logged_cookie[x.upstream] = true
      core.log("info", ("cache: an answer of %s carries Set-Cookie: not stored (this is logged once)")
        :format(x.upstream))
    end
    return
  end
  local fresh, swr, sie
  -- (read whatever ttl_s says: whether the answer may be stored at all is the upstream's, see
  -- storable; a ttl_s alone kept a private answer from being read, and it was stored)
  local cc = block_get(hdrs, "cache-control")
  if status == 404 then
    fresh, swr, sie = p.negative_ttl_s, 0, 0
    if fresh <= 0 or not storable(p, cache_control(cc), x.cache_user) then return end
    M.stats.negative = M.stats.negative + 1
    M.bloom_add(ck, now, fresh * 1000 / 2) -- a key stays in the pair for at most negative_ttl_s
  else
    fresh, swr, sie = M.lifetimes(p, cc, x.cache_user)
    if not fresh or fresh <= 0 then return end
  end
  fresh = fresh * 1000 * (1 - JITTER * core.random())
  local fresh_until = math.floor(now + fresh)
  local stale_until = math.floor(fresh_until + swr * 1000)
  local err_until = math.floor(fresh_until + sie * 1000)
  -- the body as the upstream sent it: the text (a JSON body's raw ref when the script never made
  -- a string of it)
  local body = ""
  if status ~= 404 then body = rawget(r, "body") or x.body_ref or r.body or "" end
  local keep = math.max(stale_until, err_until)
  if not core.cache_store(ck, fresh_until, stale_until, err_until, status, hdrs, body, keep,
                          use_redis and keep - now or nil) then
    return -- over MAX_ENTRY: not stored
  end
  M.stats.stores = M.stats.stores + 1
  return fresh_until
end

-- Whether a failed call's result may be answered with a stale copy (stale_if_error_s). RFC 5861
-- §4: for an error that would be a 500, 502, 503 or 504: a transport failure (no answer, a timeout,
-- the breaker), an answer the gateway cannot use (a 2xx that is not valid JSON, too large), the
-- upstream's own 500, 502, 503 or 504, or the token endpoint's outage. Never for another status the
-- upstream chose (401, 403, 410, 429 …: it answered about this request, it did not fail), nor for
-- a call whose user's credential was refused (agg.identity: the user's data must not outlive it).
local STALE_IF_ERROR_STATUS = { [500] = true, [502] = true, [503] = true, [504] = true }
local function stale_may_answer(x, r)
  local hs = r.http_status
  if hs and hs >= 300 and not STALE_IF_ERROR_STATUS[hs] then return false end
  -- (x.credential_refused: one of its attempts was refused, agg.exchange after_failure)
  return not (x.credential_refused or problem.stale_refused(r.error))
end

-- A result r ended exchange x of a cached call: store it, or serve the stale copy when it failed.
-- Returns the result to deliver.
function M.on_result(x, r)
  local ck = x.cache_key
  if not ck then return r end
  local now = core.now()
  local ctx, sec = x.ctx, x.key
  if r.status == "ok" and r.ok then
    local fresh_until = store(x, r, now)
    if fresh_until and not x.cache_user then x.fresh_until = fresh_until end
    if ctx then outcome(ctx, sec, x.cache_refresh and "refresh" or "miss") end
    r.cache = "miss"
    return r
  end
  if r.http_status == 404 then
    store(x, r, now)
    r.cache = "miss"
    if ctx then outcome(ctx, sec, "miss") end
    return r
  end
  local e = x.cache_stale
  if e and now < e.error_until and ctx and not x.cache_refresh and stale_may_answer(x, r) then
    local copy = api.copy_spec(x)
    local s = result_of(ctx, sec, copy, e)
    if s then
      M.stats.stale_if_error = M.stats.stale_if_error + 1
      s.ok, s.status, s.error, s.cache = false, "stale", r.error, "stale"
      s.ms = r.ms
      outcome(ctx, sec, "stale")
      if core.cache_span then core.cache_span(ctx.rid, api.upstream_index(x.upstream), sec, "stale", e.status) end
      return s
    end
  end
  if ctx then outcome(ctx, sec, "miss") end
  r.cache = "miss"
  return r
end

-- Starts the background refresh of key ck for the call spec (at most one per key at a time).
local function refresh(spec, sec, ck)
  if refreshing[ck] then return false end
  refreshing[ck] = true
  M.stats.refreshes = M.stats.refreshes + 1
  local now = core.now()
  local rctx = { rid = 0, ep = false, started = now, deadline = now + spec.timeout_ms, exchanges = false,
                 done = false, co = false }
  local g = { results = {}, pending = 1, thens = {}, waiting = false,
              on_complete = function() refreshing[ck] = nil end }
  local x = api.copy_spec(spec)
  x.cache_key, x.cache_refresh, x.cache_stale = ck, true, false
  api.start(rctx, sec, x, g, false)
  return true
end

-- Serves entry e for the call if it is fresh or within swr; returns true when it did.
local function serve(ctx, sec, spec, g, chain, e, now)
  -- (a call that carries the user's identity has no stale-while-revalidate: the refresh runs
  -- without a request, so without a user, and its identity step would fail every time while the
  -- stale copy went on being served; past fresh it is a miss, stale-if-error still applies)
  if now < e.fresh or (now < e.stale and not spec.personal) then
    local r = result_of(ctx, sec, spec, e)
    if not r then M.stats.corrupt = M.stats.corrupt + 1 return false end
    local what = "hit"
    if now >= e.fresh then
      what = refresh(spec, sec, spec.cache_key) and "refresh" or "stale"
      M.stats.stale = M.stats.stale + 1
    else
      M.stats.hits = M.stats.hits + 1
    end
    r.cache = what == "hit" and "hit" or "stale"
    if what == "hit" and not spec.cache_user and e.status < 300 then spec.fresh_until = e.fresh end
    outcome(ctx, sec, what)
    if core.cache_span then core.cache_span(ctx.rid, api.upstream_index(spec.upstream), sec, what, e.status) end
    api.deliver_now(ctx, sec, g, chain, r)
    return true
  end
  if now < e.error_until then spec.cache_stale = e end
  return false
end

-- Asks Redis for key ck of the call (M.lookup's tier 2; left: the page's time left, ms). Returns
-- true when the call now waits for the answer, false when the ask failed. (Its own function: a
-- function that makes a closure closes upvalues at each of its returns, a bytecode (UCLO) LuaJIT
-- 2.1 does not compile, and every cached call's lookup ran in the interpreter.)
local function wait_for_redis(ctx, sec, spec, g, chain, ck, left)
  local id = core.redis_get(ck)
  if not id then return false end
  -- (linked from the request, newest first: ctx.lookups, w.next, for cancel_lookups and
  -- waiting_for; one that ended is no longer pending[w.id])
  local w = { ctx = ctx, sec = sec, spec = spec, g = g, chain = chain, timer = false, id = id,
              next = ctx.lookups or false }
  ctx.lookups = w
  pending[id] = w
  -- the page's deadline bounds the wait, as it bounds a call: a Redis slower than what is left
  -- (its own timeout_ms may be longer) is not waited for; the call starts with no time left
  -- and its section fails as past the deadline; Redis's late answer finds nothing pending
  w.timer = api.set_timer(left, function()
    if pending[id] ~= w then return end
    pending[id] = nil
    M.stats.redis_errors = M.stats.redis_errors + 1
    if not ctx.done then api.start(ctx, sec, spec, g, chain) end
  end)
  return true
end

--- Looks call spec (section sec of ctx, group g, chain) up. Returns true when the cache took the
-- call (served it, or waits for Redis and will serve it or start it); false: start it now.
function M.lookup(ctx, sec, spec, g, chain)
  local p = with_learned(spec.cache, spec.upstream)
  spec.cache = p
  local ck = M.key(ctx, spec, p)
  if not ck then return false end
  spec.cache_key = ck
  local now = core.now()
  local fresh, stale, err_until, status, payload, headers = core.cache_entry(ck, spec.decode)
  if fresh then
    local e = { fresh = fresh, stale = stale, error_until = err_until, status = status, headers = headers }
    if type(payload) == "string" then e.body = payload else e.ref = payload end
    if serve(ctx, sec, spec, g, chain, e, now) then return true end
  elseif fresh == false then
    M.stats.corrupt = M.stats.corrupt + 1
  end
  if p.negative_ttl_s > 0 and M.bloom_check(ck, now) then
    -- known missing: the 404 without Redis or the upstream
    M.stats.bloom_hits = M.stats.bloom_hits + 1
    local r = result_of(ctx, sec, spec, { status = 404, headers = "", body = "" })
    r.cache = "hit"
    outcome(ctx, sec, "hit")
    if core.cache_span then core.cache_span(ctx.rid, api.upstream_index(spec.upstream), sec, "hit", 404) end
    api.deliver_now(ctx, sec, g, chain, r)
    return true
  end
  M.stats.misses = M.stats.misses + 1
  local left = ctx.deadline - now
  if use_redis and left > 0 then
    if wait_for_redis(ctx, sec, spec, g, chain, ck, left) then return true end
    M.stats.redis_errors = M.stats.redis_errors + 1
  end
  return false
end

--- Forgets request ctx's tier-2 lookups made for a fan-out group g for which pred(g) is true
-- (agg.fanout's fail fast: the sections they were for are cancelled). Their calls never start,
-- and Redis's late answers find nothing pending. The sections are the caller's to settle.
function M.cancel_lookups(ctx, pred)
  local w = ctx.lookups
  while w do
    if pending[w.id] == w and pred(w.g) then
      pending[w.id] = nil
      api.clear_timer(w.timer)
    end
    w = w.next
  end
end

--- True while a tier-2 lookup of request ctx waits for Redis (its answer, the Redis client's
-- timeout_ms or the page's deadline settles it; runtime.answer_overdue leaves such a page alone).
function M.waiting_for(ctx)
  local w = ctx.lookups
  while w do
    if pending[w.id] == w then return true end
    w = w.next
  end
  return false
end

-- Entry e (M.decode's) that Redis gave for a call under policy p, as this gateway could have
-- stored it by time now (ms). Redis is shared, and what it answers is not taken on trust (an attack
-- review: a Redis that lied had entries of status 0, 302, 500 or 10^15 served as failed sections
-- without the upstream and kept in tier 1 for their own times, up to 10^15 ms, and one whose
-- error_until was 10^14 served stale under a policy without stale_if_error_s). Returns nil and
-- what is wrong when store writes no such entry: a status other than 2xx or 404 (on_result stores
-- only those), a 404 with a body or under negative_ttl_s 0, a 2xx under ttl_s 0. Else e, each time
-- cut to what store could have given it (a time past that is a lie, or another instance's clock
-- ahead of this one's): fresh to now + ttl_s (or the answer's lifetime: at most MAX_SECS, as
-- M.lifetimes gives), stale to fresh + swr_s, error_until to fresh + stale_if_error_s (the
-- answer's, at most MAX_SECS, when the policy has none); a 404's all three to now +
-- negative_ttl_s. The second result is true when a time was cut.
local function admit(e, p, now)
  local st = e.status
  local fresh_s, swr_s, sie_s
  if st == 404 then
    if p.negative_ttl_s <= 0 then return nil, "a 404, which its policy does not keep (negative_ttl_s 0)" end
    if e.body ~= "" then return nil, "a 404 with a body" end
    fresh_s, swr_s, sie_s = p.negative_ttl_s, 0, 0
  elseif st >= 200 and st < 300 then
    fresh_s, swr_s, sie_s = p.ttl_s or MAX_SECS, p.swr_s or MAX_SECS, p.stale_if_error_s or MAX_SECS
    if fresh_s <= 0 then return nil, "a 2xx, which its policy does not keep (ttl_s 0)" end
  else
    return nil, "status " .. st .. ": the gateway stores 2xx answers and 404s only"
  end
  -- (an entry an older build stored, or another writer: its cookie is its first client's)
  if block_get(e.headers, "set-cookie") then return nil, "an answer with Set-Cookie" end
  local fresh = math.min(e.fresh, math.floor(now + fresh_s * 1000))
  -- (as store computes them: floor(fresh + s * 1000), whose rounding floor(s * 1000) may be 1 under)
  local stale = math.min(e.stale, math.floor(fresh + swr_s * 1000))
  local err_until = math.min(e.error_until, math.floor(fresh + sie_s * 1000))
  if fresh == e.fresh and stale == e.stale and err_until == e.error_until then return e, false end
  e.fresh, e.stale, e.error_until = fresh, stale, err_until
  return e, true
end

-- Logs once per VM (kind: "refused" or "cut") what was wrong with a value Redis gave for a call
-- to upstream up; never the value.
local function log_redis_value(kind, up, what)
  if logged_redis[kind] then return end
  logged_redis[kind] = true
  if kind == "refused" then
    core.log("warn", ("cache: Redis gave an entry for a call to %s that no gateway stores (%s): a miss, the " ..
      "upstream is called; is something else writing the cache's keys? (logged once)"):format(up, what))
  else
    core.log("warn", ("cache: Redis gave an entry for a call to %s whose times pass what its cache policy gives: " ..
      "cut to it (something else writes the cache's keys, or another instance's clock is ahead of this " ..
      "one's; logged once)"):format(up))
  end
end

--- Transport: the Redis GET id answered (value: string or nil for none; err: why it failed). A
-- value is served, and copied into tier 1, only as an entry this gateway could have stored for the
-- call (admit): any other is a miss (counted as corrupt), and times past the call's policy are cut.
function M.on_redis(id, value, err)
  local w = pending[id]
  if not w then return end
  pending[id] = nil
  api.clear_timer(w.timer)
  local ctx = w.ctx
  if ctx.done then return end
  local now = core.now()
  if err then
    M.stats.redis_errors = M.stats.redis_errors + 1
  elseif value then
    local e, cut = M.decode(value), false
    if e then
      local what
      e, what = admit(e, w.spec.cache, now)
      if e then cut = what else log_redis_value("refused", w.spec.upstream, what) end
    end
    if e then
      M.stats.redis_hits = M.stats.redis_hits + 1
      if cut then
        log_redis_value("cut", w.spec.upstream)
        value = M.encode(e.fresh, e.stale, e.error_until, e.status, e.headers, e.body) -- (tier 1 keeps what is served)
      end
      core.cache_set(w.spec.cache_key, value, math.max(e.stale, e.error_until))
      if serve(ctx, w.sec, w.spec, w.g, w.chain, e, now) then
        M.stats.misses = M.stats.misses - 1 -- a miss of tier 1 only: serve counted the hit
        return
      end
    else
      M.stats.corrupt = M.stats.corrupt + 1
    end
  else
    M.stats.redis_misses = M.stats.redis_misses + 1
  end
  api.start(ctx, w.sec, w.spec, w.g, w.chain)
end

return M
