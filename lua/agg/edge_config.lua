-- agg.edge_config: checks the edge's part of gateway.lua (DESIGN §9, §9.1): the `auth` block
-- (named authenticators: jwt, api_keys, default), an endpoint's `auth`, and an upstream's
-- `identity`/`audience`. Called by agg.config and agg.loader with their error collector; every
-- mistake is "file:line: where: what; what to do", with "did you mean" for a misspelt name.
local str_gsub, str_match = string.gsub, string.match
local sys = require "agg.sys"

local M = {}

local ALGORITHMS = { RS256 = true, RS384 = true, RS512 = true, PS256 = true, PS384 = true, PS512 = true,
                     ES256 = true, ES384 = true, ES512 = true, HS256 = true, HS384 = true, HS512 = true }
local JWT_KEYS = { issuer = true, audiences = true, algorithms = true, jwks_file = true, jwks_url = true,
                   secret_file = true, leeway_s = true, required_claims = true, max_token_bytes = true,
                   jwks_refresh_s = true, jwks_cooldown_s = true }
local JWT_LIST = "issuer, audiences, algorithms, jwks_file, jwks_url, secret_file, leeway_s, required_claims, " ..
                 "max_token_bytes, jwks_refresh_s, jwks_cooldown_s"
local APIKEY_KEYS = { file = true, header = true }
M.KINDS = { jwt = true, api_key = true, none = true }
M.IDENTITIES = { forward = true, exchange = true, none = true }

-- Levenshtein distance of a and b, stopping early past max (typos are a letter or two); also
-- agg.config's suggestions (one edit distance for every "did you mean").
local function distance(a, b, max)
  if math.abs(#a - #b) > max then return max + 1 end
  local prev = {}
  for j = 0, #b do prev[j] = j end
  for i = 1, #a do
    local cur, best = { [0] = i }, i
    for j = 1, #b do
      local cost = a:byte(i) == b:byte(j) and 0 or 1
      cur[j] = math.min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + cost)
      if cur[j] < best then best = cur[j] end
    end
    if best > max then return max + 1 end
    prev = cur
  end
  return prev[#b]
end

M.distance = distance

--- The known name closest to word within two edits (a typo), or nil.
function M.closest(word, known)
  local best, bestd
  for k in pairs(known) do
    if type(k) == "string" then
      local d = distance(word:lower(), k:lower(), 2)
      if d <= 2 and (not bestd or d < bestd or (d == bestd and k < best)) then best, bestd = k, d end
    end
  end
  return best
end

local function list_of_strings(v)
  if type(v) ~= "table" or #v == 0 then return false end
  for k, s in pairs(v) do
    if type(k) ~= "number" or type(s) ~= "string" or s == "" then return false end
  end
  return true
end

-- A file named in gateway.lua, relative to the scripts folder: its path and text, or nil after
-- reporting why it cannot be read.
local function read_named(c, value, line, where, max)
  if type(value) ~= "string" or value == "" then
    c.err(line, where, "must be a file path (relative to the scripts folder), got " .. c.show(value))
    return nil
  end
  local path = value
  if path:sub(1, 1) ~= "/" then path = c.dir .. "/" .. path end
  local text, why = sys.read_file(path, max)
  if not text then
    c.err(line, where, "cannot read " .. path .. ": " .. why)
    return nil
  end
  return path, text
end

local function unknown(c, line, where, k, known, list)
  c.err(line, where .. "." .. tostring(k), "unknown option" .. c.suggest(tostring(k), known) .. "; " .. where ..
        " knows " .. list)
end

--- Checks cfg.auth (c: the checker's helpers: err, line_of(name, from), show, suggest, dir).
-- Returns the normalized block, or nil (absent, or errors reported).
function M.check_auth(c, a)
  if a == nil then return nil end
  local aline = c.line_of("auth")
  if type(a) ~= "table" then
    c.err(aline, "auth", "must be a table like { jwt = { issuer = …, jwks_url = … }, default = \"jwt\" }")
    return nil
  end
  local out = {}
  for k in pairs(a) do
    if k ~= "jwt" and k ~= "api_keys" and k ~= "default" then
      unknown(c, c.line_of(k, aline) or aline, "auth", k, { jwt = 1, api_keys = 1, default = 1 }, "jwt, api_keys, default")
    end
  end
  -- jwt
  local j = a.jwt
  if j ~= nil then
    local jline = c.line_of("jwt", aline) or aline
    if type(j) ~= "table" then
      c.err(jline, "auth.jwt", "must be a table like { issuer = \"https://id.example\", audiences = { \"aggway\" }, " ..
            "algorithms = { \"RS256\" }, jwks_url = \"https://id.example/jwks\" }")
    else
      local e = { line = jline, leeway_s = 60, max_token_bytes = 8192, jwks_refresh_s = 300, jwks_cooldown_s = 30,
                  audiences = {}, required_claims = {}, algorithms = { "RS256", "PS256", "ES256" } }
      local ok = true
      local function bad(k, msg) c.err(c.line_of(k, jline) or jline, "auth.jwt." .. k, msg); ok = false end
      for k in pairs(j) do
        if not JWT_KEYS[k] then unknown(c, c.line_of(k, jline) or jline, "auth.jwt", k, JWT_KEYS, JWT_LIST); ok = false end
      end
      -- the issuer and the audiences are checked unless gateway.lua says false (RFC 8725 §3.8,
      -- §3.9): without them any token the key set verifies passes, one another issuer sharing the
      -- keys made, or one the identity provider issued for another application (an attack review)
      if j.issuer == nil then
        bad("issuer", "is required: the identifier the tokens' iss must equal, like \"https://id.example\" " ..
            "(issuer = false accepts tokens of any issuer the keys verify; RFC 8725 §3.8)")
      elseif j.issuer ~= false then
        if type(j.issuer) ~= "string" or j.issuer == "" then bad("issuer", "must be the issuer's identifier (the tokens' iss), got " .. c.show(j.issuer))
        else e.issuer = j.issuer end
      end
      if j.audiences == nil then
        bad("audiences", "is required: the names one of which the tokens' aud must hold, like { \"aggway\" } " ..
            "(audiences = false accepts tokens issued for any audience; RFC 8725 §3.9)")
      elseif j.audiences ~= false then
        if not list_of_strings(j.audiences) or #j.audiences == 0 then
          bad("audiences", "must be a list of strings like { \"aggway\" } (or false)")
        else e.audiences = j.audiences end
      end
      if j.algorithms ~= nil then
        if not list_of_strings(j.algorithms) then
          bad("algorithms", "must be a list like { \"RS256\", \"ES256\" }")
        else
          for _, alg in ipairs(j.algorithms) do
            if alg:lower() == "none" then
              bad("algorithms", "\"none\" is never accepted: unsigned tokens prove nothing (RFC 8725 §3.1)")
            elseif not ALGORITHMS[alg] then
              bad("algorithms", "unknown algorithm '" .. alg .. "'" .. c.suggest(alg, ALGORITHMS) ..
                  "; one of RS256 RS384 RS512 PS256 PS384 PS512 ES256 ES384 ES512 HS256 HS384 HS512")
            end
          end
          e.algorithms = j.algorithms
        end
      end
      local hmac, asym = false, false
      for _, alg in ipairs(e.algorithms) do
        if type(alg) == "string" and alg:sub(1, 2) == "HS" then hmac = true else asym = true end
      end
      for _, k in ipairs { "leeway_s", "max_token_bytes", "jwks_refresh_s", "jwks_cooldown_s" } do
        local v = j[k]
        if v ~= nil then
          if type(v) ~= "number" or v ~= v or v % 1 ~= 0 or v < 0 or (k ~= "leeway_s" and v == 0) or v > 86400 * 7 then
            bad(k, "must be a whole number" .. (k == "leeway_s" and " >= 0" or " > 0") .. ", got " .. c.show(v))
          else
            e[k] = v
          end
        end
      end
      if j.required_claims ~= nil then
        if not list_of_strings(j.required_claims) then bad("required_claims", "must be a list of claim names like { \"sub\" }")
        else e.required_claims = j.required_claims end
      end
      if j.jwks_file ~= nil and j.jwks_url ~= nil then
        bad("jwks_url", "give jwks_file or jwks_url, not both")
      elseif j.jwks_file ~= nil then
        local fl = c.line_of("jwks_file", jline) or jline
        local path = read_named(c, j.jwks_file, fl, "auth.jwt.jwks_file", 1048576)
        if path then e.jwks_file, e.jwks_file_line = path, fl else ok = false end
      elseif j.jwks_url ~= nil then
        local ul = c.line_of("jwks_url", jline) or jline
        if type(j.jwks_url) ~= "string" or not (str_match(j.jwks_url, "^https?://[^/]+")) then
          bad("jwks_url", "must be an http:// or https:// URL like \"https://id.example/.well-known/jwks.json\", got " ..
              c.show(j.jwks_url))
        else
          e.jwks_url, e.jwks_url_line = j.jwks_url, ul
        end
      elseif asym then
        bad("jwks_file", "the keys are missing: give jwks_url = \"https://…\" or jwks_file = \"keys/jwks.json\"" ..
            (hmac and " (or list only HS256 with secret_file)" or ""))
      end
      if j.secret_file ~= nil then
        local sl = c.line_of("secret_file", jline) or jline
        if not hmac then
          bad("secret_file", "a shared secret is only for HS256/HS384/HS512: add one to algorithms, or remove secret_file")
        else
          local path = read_named(c, j.secret_file, sl, "auth.jwt.secret_file", 4096)
          if path then e.secret_file, e.secret_file_line = path, sl else ok = false end
        end
      elseif hmac then
        bad("algorithms", "HS256/HS384/HS512 need secret_file = \"keys/jwt-secret\" (a JWKS never holds shared secrets)")
      end
      if ok then out.jwt = e end
    end
  end
  -- api_keys
  local k = a.api_keys
  if k ~= nil then
    local kline = c.line_of("api_keys", aline) or aline
    if type(k) ~= "table" then
      c.err(kline, "auth.api_keys", "must be a table like { file = \"keys/api-keys.json\", header = \"X-API-Key\" }")
    else
      local ok = true
      for kk in pairs(k) do
        if not APIKEY_KEYS[kk] then unknown(c, c.line_of(kk, kline) or kline, "auth.api_keys", kk, APIKEY_KEYS, "file, header"); ok = false end
      end
      local e = { header = "x-api-key" }
      if k.header ~= nil then
        if type(k.header) ~= "string" or not str_match(k.header, "^[%w%-_]+$") or k.header:lower() == "authorization" then
          c.err(c.line_of("header", kline) or kline, "auth.api_keys.header",
                "must be a header name like \"X-API-Key\" (not Authorization), got " .. c.show(k.header))
          ok = false
        else
          e.header = k.header:lower()
        end
      end
      local fl = c.line_of("file", kline) or kline
      if k.file == nil then
        c.err(kline, "auth.api_keys.file", "is required: a JSON list of { \"sha256\": …, \"app\": …, \"plan\": … }")
        ok = false
      else
        local path = read_named(c, k.file, fl, "auth.api_keys.file", 16 * 1048576)
        if path then e.file, e.file_line = path, fl else ok = false end
      end
      if ok then out.api_keys = e end
    end
  end
  -- default
  local d = a.default
  local dline = c.line_of("default", aline) or aline
  if d == nil then
    d = (j ~= nil and "jwt") or (k ~= nil and "api_key") or "none"
  elseif type(d) ~= "string" or not M.KINDS[d] then
    c.err(dline, "auth.default", "must be \"jwt\", \"api_key\" or \"none\", got " .. c.show(d) ..
          (type(d) == "string" and c.suggest(d, M.KINDS) or ""))
    d = "none"
  end
  if d == "jwt" and j == nil then
    c.err(dline, "auth.default", "is \"jwt\" but auth has no jwt block")
  elseif d == "api_key" and k == nil then
    c.err(dline, "auth.default", "is \"api_key\" but auth has no api_keys block")
  end
  out.default = d
  return out
end

--- Checks an endpoint's auth value v against the normalized auth block (nil when gateway.lua has
-- none). unknown: gateway.lua could not be read (its own error is reported), so whether it has a
-- jwt or api_keys block is not known and is not held against the endpoint. Returns { kind =
-- "jwt"|"api_key"|"none", scopes = {…} } or nil, message.
function M.check_endpoint(v, auth, unknown)
  local function suggest(s, known)
    local name = M.closest(s, known or M.KINDS)
    return name and (" (did you mean '" .. name .. "'?)") or ""
  end
  local policy
  if v == nil then
    policy = { kind = auth and auth.default or "none", scopes = {} }
  elseif type(v) == "string" then
    if not M.KINDS[v] then
      return nil, "auth: unknown authenticator '" .. v .. "'" .. suggest(v) .. "; use \"jwt\", \"api_key\", \"none\" " ..
                  "or { jwt = true, scopes = { \"orders:read\" } }"
    end
    policy = { kind = v, scopes = {} }
  elseif type(v) == "table" then
    for k in pairs(v) do
      if k ~= "jwt" and k ~= "api_key" and k ~= "scopes" then
        local hint = type(k) == "string" and suggest(k, { jwt = 1, api_key = 1, scopes = 1 }) or ""
        return nil, "auth: unknown option '" .. tostring(k) .. "'" .. hint .. " (jwt, api_key, scopes)"
      end
    end
    if (v.jwt == true) == (v.api_key == true) then
      return nil, "auth: give exactly one of jwt = true or api_key = true, like { jwt = true, scopes = { \"orders:read\" } }"
    end
    local scopes = v.scopes or {}
    if v.scopes ~= nil and not list_of_strings(v.scopes) then
      return nil, "auth: scopes must be a list of strings like { \"orders:read\" }"
    end
    if v.api_key and #scopes > 0 then
      return nil, "auth: scopes belong to tokens (jwt = true); API keys have none"
    end
    policy = { kind = v.jwt and "jwt" or "api_key", scopes = scopes }
  else
    return nil, "auth must be \"jwt\", \"api_key\", \"none\" or a table like { jwt = true, scopes = { … } }, got " .. type(v)
  end
  if unknown then return policy end
  if policy.kind == "jwt" and not (auth and auth.jwt) then
    return nil, "auth: this endpoint asks for a JWT but gateway.lua has no auth.jwt block"
  elseif policy.kind == "api_key" and not (auth and auth.api_keys) then
    return nil, "auth: this endpoint asks for an API key but gateway.lua has no auth.api_keys block"
  end
  return policy
end

--- Base64 (RFC 4648 §4), for the token endpoint's HTTP Basic credentials.
function M.base64(s)
  local A = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
  local out = {}
  for i = 1, #s, 3 do
    local a, b, c2 = s:byte(i, i + 2)
    local n = a * 65536 + (b or 0) * 256 + (c2 or 0)
    local q = { math.floor(n / 262144) % 64, math.floor(n / 4096) % 64, math.floor(n / 64) % 64, n % 64 }
    out[#out + 1] = A:sub(q[1] + 1, q[1] + 1) .. A:sub(q[2] + 1, q[2] + 1) ..
                    (b and A:sub(q[3] + 1, q[3] + 1) or "=") .. (c2 and A:sub(q[4] + 1, q[4] + 1) or "=")
  end
  return table.concat(out)
end

--- application/x-www-form-urlencoded escaping of one value (RFC 6749 Appendix B).
function M.form_escape(s)
  return (str_gsub(s, "[^%w%-%._~]", function(ch) return ("%%%02X"):format(ch:byte()) end))
end

return M
