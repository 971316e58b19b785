-- agg.identity: calling services with the user's identity (DESIGN §9; issue "edge"). Each
-- upstream says in gateway.lua how a call to it carries the user:
--   identity = "none"      nothing (the default): the inbound Authorization never reaches it
--   identity = "forward"   the user's own token, only when its aud names the upstream's audience
--   identity = "exchange"  a token for that audience from the token endpoint (OAuth 2.0 Token
--                          Exchange, RFC 8693 §2), cached per (subject token, audience) until
--                          shortly before it expires; concurrent exchanges of the same pair share
--                          one request (single-flight); invalid_target is cached briefly.
-- A call that cannot carry the identity is never sent without it: its section fails with an
-- identity-unavailable problem (503; a required section fails the page with it).
--
-- The token endpoint is called through the gateway's own upstream client: gateway.lua's
-- token_exchange becomes an internal upstream ("@token_exchange") that no script can name.
local str_gmatch, str_match = string.gmatch, string.match
local json = require "agg.json"
local problem = require "agg.problem"
local edge = require "agg.edge_config"
local request_user = require("agg.result").request_user

local M = {}

local core, te, hooks
local cache, cache_n = {}, 0   -- subject token .. "\0" .. audience -> { token, expires } | { failed = true, expires }
local pending = {}             -- same key -> { waiters = { … } } while an exchange is in flight
M.CACHE_MAX = 10000            -- entries per worker; beyond, expired ones go, then all
M.EARLY_MS = 30000             -- renew an exchanged token this long before it expires (half its life at most)
M.INVALID_TARGET_MS = 30000    -- how long the token endpoint's invalid_target answer is remembered
M.stats = { exchanges = 0, hits = 0, failures = 0, shared = 0 }

--- Called by agg.runtime.init. transport: core; token_exchange: the loader's gen.token_exchange
-- (nil when gateway.lua has none); h: { set_timer, clear_timer, register_call(id, fn) }.
function M.init(transport, token_exchange, h)
  core, te, hooks = transport, token_exchange, h
  cache, cache_n, pending = {}, 0, {}
  M.stats = { exchanges = 0, hits = 0, failures = 0, shared = 0 }
end

--- The claims of user u (the edge's table, gateway/edge/edge.h): made from its json ref on
-- first read, then kept.
function M.claims(u)
  local c = rawget(u, "claims")
  if c == nil and u.claims_ref then
    c = json.materialize(u.claims_ref)
    u.claims, u.claims_ref = c, nil
  end
  return c
end

--- The scopes of user u: the "scope" claim split on spaces, or the "scp" list (DESIGN §9.1).
function M.scopes(u)
  local s = rawget(u, "scopes")
  if s == nil then
    s = {}
    local c = M.claims(u) or {}
    if type(c.scope) == "string" then
      for w in str_gmatch(c.scope, "%S+") do s[#s + 1] = w end
    elseif type(c.scp) == "table" then
      for _, v in ipairs(c.scp) do if type(v) == "string" then s[#s + 1] = v end end
    elseif type(c.scp) == "string" then
      s[1] = c.scp
    end
    u.scopes = s
  end
  return s
end

-- The problem of a call that cannot carry the user's identity (RFC 9457): one title whatever the
-- call, and a detail that names the section and the upstream and says why in words a client may
-- read (`why`, one of the WHY texts). What the token endpoint or the transport said (its URL and
-- address, errno text, its status and error code, the audience) is internal: it goes to the log.
local WHY = {
  no_token = "the request carries no user token",
  audience = "the user's token is not meant for this upstream",
  no_exchange = "the user's token cannot be exchanged for this upstream",
  exchange_failed = "the token exchange failed",
}
-- refused: the user's credential was refused (no token, not for this upstream, an exchange the
-- token endpoint answered with a 4xx), not an outage (the token endpoint down, slow or answering
-- 5xx): a stale copy of the user's data answers an outage only (RFC 5861 §4, agg.cache).
local function unavailable(x, up, why, refused)
  local p = problem.new("identity-unavailable", "the call cannot carry the user's identity", 503,
                        problem.names(x.key, up.name) .. ": " .. why)
  return refused and problem.refuse_stale(p) or p
end

-- Sets the call's Authorization (replacing one the script set) and keeps it out of single-flight.
local function authorize(x, token)
  local h, out = x.headers, {}
  if h then
    for i = 1, #h, 2 do
      if h[i] ~= "authorization" then out[#out + 1] = h[i]; out[#out + 1] = h[i + 1] end
    end
  end
  out[#out + 1] = "authorization"
  out[#out + 1] = "Bearer " .. token
  x.headers = out
  x.collapse = nil -- credentials are never shared (nil: no key a call's table has no slot for)
end

local function aud_has(aud, want)
  if type(aud) == "string" then return aud == want end
  if type(aud) == "table" then
    for _, a in ipairs(aud) do if a == want then return true end end
  end
  return false
end

local function remember(key, entry)
  if cache[key] == nil then
    if cache_n >= M.CACHE_MAX then
      local now = core.now()
      for k, e in pairs(cache) do
        if e.expires <= now then cache[k] = nil; cache_n = cache_n - 1 end
      end
      if cache_n >= M.CACHE_MAX then cache, cache_n = {}, 0 end
    end
    cache_n = cache_n + 1
  end
  cache[key] = entry
end

-- The token endpoint's answer (RFC 8693 §2.2): the token and how long to keep it, or why not (for
-- the log: it is internal) and how long to remember the failure (0: not at all).
local function read_answer(up, outcome, http_status, body, detail)
  if outcome ~= "ok" then
    return nil, "the token endpoint did not answer (" .. outcome .. (detail and (": " .. detail) or "") .. ")", 0, false
  end
  local ok, doc = pcall(json.decode, body or "")
  if not ok or type(doc) ~= "table" then doc = nil end
  if http_status == 200 then
    local tok, ttype, exp = doc and doc.access_token, doc and doc.token_type, doc and doc.expires_in
    if type(tok) ~= "string" or tok == "" or not str_match(tok, "^[%w%-%._~%+/]+=*$") then
      return nil, "the token endpoint's answer has no usable access_token", 0, false
    end
    if type(ttype) == "string" and ttype:lower() ~= "bearer" then
      return nil, "the token endpoint issued a token of type " .. ttype .. ", not Bearer", 0, false
    end
    local life = (type(exp) == "number" and exp > 0) and exp * 1000 or 60000
    return tok, nil, life - math.min(M.EARLY_MS, life / 2)
  end
  local code = doc and type(doc.error) == "string" and doc.error or nil
  return nil, "the token endpoint refused the exchange for audience " .. up.audience ..
              " (HTTP " .. http_status .. (code and (", " .. code) or "") .. ")",
         code == "invalid_target" and M.INVALID_TARGET_MS or 0, http_status >= 400 and http_status < 500
end

local function start_exchange(ctx, token, up, key, pend)
  local body = "grant_type=" .. edge.form_escape("urn:ietf:params:oauth:grant-type:token-exchange") ..
               "&subject_token=" .. edge.form_escape(token) ..
               "&subject_token_type=" .. edge.form_escape(te.subject_token_type) ..
               "&requested_token_type=" .. edge.form_escape("urn:ietf:params:oauth:token-type:access_token") ..
               "&audience=" .. edge.form_escape(up.audience)
  local headers = { "content-type", "application/x-www-form-urlencoded", "accept", "application/json",
                    "authorization", te.basic }
  -- the token endpoint's own timeout: the exchange is shared by every request of this user that
  -- asks meanwhile, each waiting within its own deadline (M.prepare's timer). Cut by the deadline
  -- of the request that started it, a later request with more time failed with it.
  local t = te.timeout_ms
  M.stats.exchanges = M.stats.exchanges + 1
  -- the span (agg.contract): section "token-exchange", one attempt, never hedged
  local id = core.call(ctx.rid, te.index, "POST", te.path, headers, body, math.max(1, math.floor(t + 0.5)), false,
                       "token-exchange", 1, false, nil)
  hooks.register_call(id, function(outcome, http_status, _, rbody, _, ms, detail)
    pending[key] = nil
    local tok, why, keep_ms, refused = read_answer(up, outcome, http_status, rbody, detail)
    if tok then
      remember(key, { token = tok, expires = core.now() + keep_ms })
    else
      M.stats.failures = M.stats.failures + 1
      core.log("warn", "token exchange for upstream " .. up.name .. " failed: " .. why)
      if keep_ms > 0 then remember(key, { failed = true, refused = refused, expires = core.now() + keep_ms }) end
    end
    local timed = {}
    for _, w in ipairs(pend.waiters) do
      if not w.done then
        w.done = true
        if w.timer then hooks.clear_timer(w.timer) end
        -- every page that waited for the call shows it (one entry per page, however many of its
        -- calls waited; a page that had its token from the cache waited for none)
        local wctx = w.x.ctx
        if wctx and not wctx.done and not timed[wctx] then
          timed[wctx] = true
          hooks.add_timing(wctx, "token-exchange", ms or 0)
        end
        if tok then
          authorize(w.x, tok)
          w.go(nil)
        else
          -- the problem names the waiter's own section
          w.go(unavailable(w.x, up, WHY.exchange_failed, refused))
        end
      end
    end
  end)
end

--- Readies call x (its normalized spec, section x.key) of request ctx for upstream up's identity,
-- then calls go(nil) to send it, or go(problem) to fail it; go may run before this returns.
function M.prepare(ctx, x, up, go)
  local user, token = request_user(ctx)
  if not token then
    return go(unavailable(x, up, WHY.no_token, true))
  end
  if up.identity == "forward" then
    local claims = user and M.claims(user)
    if aud_has(claims and claims.aud, up.audience) then
      authorize(x, token)
      return go(nil)
    end
    return go(unavailable(x, up, WHY.audience, true))
  end
  if not te then return go(unavailable(x, up, WHY.no_exchange, true)) end
  local key = token .. "\0" .. up.audience -- the whole subject token: never another user's
  local c = cache[key]
  if c then
    if c.expires > core.now() then
      M.stats.hits = M.stats.hits + 1
      if c.token then
        authorize(x, c.token)
        return go(nil)
      end
      return go(unavailable(x, up, WHY.exchange_failed, c.refused))
    end
    cache[key] = nil
    cache_n = cache_n - 1
  end
  local w = { x = x, go = go, done = false, timer = false }
  -- waiting for the exchange counts against the request's deadline
  local remaining = ctx.deadline - core.now()
  w.timer = hooks.set_timer(math.max(0, remaining), function()
    w.timer = false
    if w.done then return end
    w.done = true
    go(problem.for_outcome("deadline", x.key, up.name, "the token exchange did not finish in time"))
  end)
  local pend = pending[key]
  if pend then
    M.stats.shared = M.stats.shared + 1
    pend.waiters[#pend.waiters + 1] = w
    return
  end
  pend = { waiters = { w } }
  pending[key] = pend
  start_exchange(ctx, token, up, key, pend)
end

--- The upstream answered 401 to a call with an exchanged token: forget that token, so that the
-- next prepare exchanges again.
function M.forget(ctx, up)
  local _, token = request_user(ctx)
  if token and up.audience then
    local key = token .. "\0" .. up.audience
    if cache[key] then cache[key] = nil; cache_n = cache_n - 1 end
  end
end

return M
