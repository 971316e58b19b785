-- agg.testing_front: a request's arrival in the spec harness, as the C worker handles it before
-- and around the script: the route match (the gateway's own router), the edge's verdict for a
-- spec's user (401/403), priority shedding and limits (the same C limiter), runtime.start, and a
-- client that goes away. Its functions are methods of agg.testing's gateways (gw:send, gw:gate,
-- gw:disconnect).
local str_find, str_match = string.find, string.match
local json = require "agg.json"
local router = require "agg.router"
local rt = require "agg.runtime"
local problem = require "agg.problem"
local limiter = require "agg.limiter"
local limits = require "agg.limits"
local args = require "agg.testing_args"
local clock = require "agg.testing_clock"
local transport = require "agg.testing_transport"

local F = {}

-- agg.testing, required when first needed: it requires this module
local function harness() return require "agg.testing" end

local timed, split_path, check_options = clock.timed, transport.split_path, args.check_options

-- Routes as serve does: the gateway's own router (gateway/router.h), built once per endpoint list.
local routers = setmetatable({}, { __mode = "k" })

local function match_route_uncached(eps, method, path)
  local r = routers[eps]
  if not r then r = router.new(eps) routers[eps] = r end
  local what, a, b = r:match(method, path) -- not a string: the router's method
  if what == "found" then return a, b end
  return nil, what, a
end

-- Route matches of a gateway, remembered by method and path (specs send the same paths often).
local route_cache = setmetatable({}, { __mode = "k" })

local function match_route(eps, method, path)
  local c = route_cache[eps]
  if not c then c = {} route_cache[eps] = c end
  local key = method .. " " .. path
  local hit = c[key]
  if not hit then
    hit = { match_route_uncached(eps, method, path) }
    c[key] = hit
  end
  if not hit[1] then return nil, hit[2], hit[3] end
  -- each request gets its own params table: a script may change it
  local params = {}
  for k, v in pairs(hit[2]) do params[k] = v end
  return hit[1], params
end

-- A response's `json` is its body decoded, on first read.
local response_mt = { __index = function(r, k)
  if k == "json" and r.status then
    local ct = r.headers and r.headers["content-type"] or ""
    local v = nil
    if str_find(ct, "json", 1, true) and r.body ~= "" then v = json.decode(r.body) end
    rawset(r, "json", v)
    return v
  end
end }

-- A response record as gw:send, gw:run and gw:request hand it back.
local function finish_response(r) return r end

-- A spec's user ({ sub, scopes, claims, aud } for a token, { app, plan } for an API key) as the
-- edge hands it to the runtime (gateway/edge/edge.h): the user table and the token a call with
-- identity would carry ("spec-token-<sub>", stable per user; nothing is signed: the edge's C
-- checks are the C and integration tests' business).
local function spec_user(u, cfg)
  if type(u) ~= "table" then error("opts.user must be a table like { sub = \"alice\", scopes = { … } }", 3) end
  if u.app ~= nil then
    return { via = "api_key", app = u.app, plan = u.plan or "" }, nil
  end
  local claims = {}
  for k, v in pairs(u.claims or {}) do claims[k] = v end
  claims.sub = claims.sub or u.sub
  local auds = cfg.auth and cfg.auth.jwt and cfg.auth.jwt.audiences or {}
  claims.aud = claims.aud or u.aud or (#auds == 1 and auds[1]) or auds
  claims.scope = claims.scope or (u.scopes and table.concat(u.scopes, " "))
  local scopes = {}
  for i, sc in ipairs(u.scopes or {}) do scopes[i] = sc end
  return { via = "jwt", sub = claims.sub, scopes = scopes, claims = claims },
         "spec-token-" .. tostring(claims.sub or "anonymous")
end

-- The edge's refusal of a request to an endpoint with policy (gateway/edge/auth.h), or nil.
local function spec_refusal(policy, user)
  local want = policy.kind
  if want == "none" then return nil end
  if user == nil or user.via ~= want then
    return 401, problem.new("unauthorized", want == "jwt" and "a bearer token is required" or "an API key is required", 401),
           want == "jwt" and 'Bearer realm="aggway"' or 'APIKey realm="aggway"'
  end
  for _, sc in ipairs(policy.scopes or {}) do
    local has = false
    for _, s in ipairs(user.scopes or {}) do if s == sc then has = true end end
    if not has then
      return 403, problem.new("insufficient-scope", "the access token lacks a scope this resource requires", 403),
             'Bearer realm="aggway", error="insufficient_scope", scope="' .. table.concat(policy.scopes, " ") .. '"'
    end
  end
  return nil
end
F.finish_response = finish_response

--- Sends a request without waiting: returns its response record, filled in (status, headers,
-- body, json, elapsed_ms) once the virtual clock has run far enough (gw:run()). For several
-- requests in flight at once.
function F:send(method, path, opts)
  opts = opts or {}
  check_options("gw:" .. method:lower(), opts, args.REQUEST_OPTIONS)
  if harness().current ~= self then self:install() end
  local rid = self.next_rid
  self.next_rid = rid + 1
  local r = setmetatable({ started_ms = self.clock, rid = rid }, response_mt)
  self.responses[rid] = r
  self.pending_responses = self.pending_responses or {}
  self.pending_responses[#self.pending_responses + 1] = r
  local p, q = split_path(path)
  local idx, params, allow = match_route(self.gen.endpoints, method, p)
  r.request = method .. " " .. path
  if idx then r.script, r.route = self.gen.endpoints[idx].file, self.gen.endpoints[idx].route end
  if not idx then -- as worker/request.c answers
    local pr
    if params == "method_not_allowed" then
      pr = problem.new("method-not-allowed", "this route does not accept this method", 405)
    elseif params == "bad_param" then
      pr = problem.new("bad-route-parameter", "a path segment holds characters a route parameter may not", 400)
    else
      pr = problem.new("route-not-found", "no route matches this path", 404)
    end
    r.status, r.body, r.elapsed_ms = pr.status, json.encode(pr), 0
    r.headers = { ["content-type"] = "application/problem+json", allow = allow }
    return finish_response(r)
  end
  local user, token
  if opts.user ~= nil then user, token = spec_user(opts.user, self.gen.config) end
  local policy = self.gen.endpoints[idx].auth or { kind = "none" }
  -- an address over its rate is refused before the edge looks at its credentials, and the edge's
  -- refusals count against it (worker/limits.c: agw_worker_gate_before_edge, agw_worker_gate_charge)
  if policy.kind ~= "none" and self:address_gate(r, self.gen.endpoints[idx], opts, "peek") then
    return finish_response(r)
  end
  local st, pr, challenge = spec_refusal(policy, user)
  if st then
    if policy.kind ~= "none" then self:address_gate(r, self.gen.endpoints[idx], opts, "charge") end
    r.status, r.body, r.elapsed_ms = st, json.encode(pr), 0
    r.headers = { ["content-type"] = "application/problem+json", ["www-authenticate"] = challenge }
    return finish_response(r)
  end
  -- an endpoint without auth authenticates no one: its script and its limits see no user, whatever
  -- the spec's request says (as the edge does: gateway/edge/edge.h)
  if policy.kind == "none" then user, token = nil, nil end
  local headers = {}
  -- (a value without the spaces and tabs around it, as h2o gives the C worker: RFC 9110 §5.5)
  for k, v in pairs(opts.headers or {}) do
    if type(v) == "string" then v = str_match(v, "^[ \t]*(.-)[ \t]*$") end
    headers[k:lower()] = v
  end
  if self:gate(r, self.gen.endpoints[idx], headers, opts, user) then return finish_response(r) end
  local body = opts.body
  if opts.json ~= nil then
    body = assert(json.encode(opts.json))
    headers["content-type"] = headers["content-type"] or "application/json"
  end
  self.open = self.open + 1
  -- the headers and the user are not handed over with the request: the runtime asks
  -- core.request_headers and core.request_user when it first needs them, as it does the C worker
  -- (nil once the request is answered or gone), and core.request_tls whether it came over TLS
  r.req_headers, r.req_user, r.req_token, r.req_tls = headers, user, token, opts.tls
  timed(self, rt.start, rid, idx, method, p, params, q ~= "" and q or nil, body, user ~= nil or nil, 0)
  return r
end

-- Priority shedding and limits, as worker/limits.c does them before any Lua (limits/gate.h, the
-- same C): answers r and returns true when the request is shed (503) or refused (429); else
-- counts it and leaves the RateLimit fields (limits.headers) for its response. The client's
-- address is opts.ip (default "127.0.0.1"); in-flight pages are this gateway's requests not yet
-- answered.
-- Answers r with a problem of the gate (status, its fields, its body). Returns true.
local function refuse(r, status, fields, body)
  r.status, r.body, r.elapsed_ms = status, body, 0
  r.headers = { ["content-type"] = "application/problem+json", ["cache-control"] = "no-store" }
  for k, v in pairs(fields) do r.headers[k] = v end
  return true
end

function F:gate(r, ep, headers, opts, user)
  local cfg = self.gen.config
  local function answer(status, fields, body) return refuse(r, status, fields, body) end
  if limiter.shed(cfg.max_in_flight, ep.priority, self.open) then
    local bound = math.floor(cfg.max_in_flight * (5 - ep.priority) / 2)
    return answer(503, { ["retry-after"] = "1" }, json.encode {
      type = "https://iana.org/assignments/http-problem-types#temporary-reduced-capacity",
      title = "The gateway is overloaded", status = 503,
      detail = ("requests of priority %d are shed while a worker has more than %d pages in flight; retry in 1 s")
               :format(ep.priority, bound) })
  end
  if not ep.limits or #ep.limits == 0 then return false end
  local lim, asks, freq = cfg.limits, {}, nil
  for _, name in ipairs(ep.limits) do
    local rule = lim.rules[lim.by_name[name]]
    local key = ""
    if rule.key == "ip" then key = opts.ip or "127.0.0.1"
    elseif rule.key == "route" then key = ep.route
    elseif rule.key == "api_key" then key = user and user.app or ""
    elseif rule.key == "user" then -- (named by its kind, as gateway/worker/limits.c names it)
      key = user and (user.sub and "jwt:" .. user.sub or user.app and "api_key:" .. user.app) or ""
    elseif rule.key == "function" then -- as worker/limits.c: the same req fields, the same errors
      if not freq then
        local u = user and (user.via == "api_key" and { via = "api_key", app = user.app, plan = user.plan }
                            or { via = "jwt", sub = user.sub }) or nil
        local method, path, query = str_match(r.request, "^(%S+) ([^?]*)%??(.*)$")
        freq = { method = method, path = path, route = ep.route, query = query ~= "" and query or nil,
                 headers = headers, ip = opts.ip or "127.0.0.1", user = u }
      end
      local err
      key, err = limits.key_of(rule, freq)
      if err then self.log_lines[#self.log_lines + 1] = "warn: " .. err end
    else key = headers[rule.header] or "" end
    if key then
      local ask = { rule = rule, key = key }
      -- store = "redis": counted in the spec's Redis (testing.gateway's redis option, which several
      -- gateways may share); while it is down, hangs or lies, the rule's on_redis_error decides
      local store = self.redis
      if rule.store == "redis" and store then
        if store.down or store.hang or store.corrupt then
          local why = store.down and "not connected" or store.hang and "timeout" or "an answer that is not the limits script's"
          if not self.redis_outage then
            self.redis_outage = true
            self.log_lines[#self.log_lines + 1] = "warn: limits: Redis did not answer a check (" .. why ..
              "); Redis rules follow their on_redis_error until it answers again"
          end
          if rule.on_redis_error ~= "local" then ask.outcome = rule.on_redis_error end
        else
          if self.redis_outage then
            self.redis_outage = false
            self.log_lines[#self.log_lines + 1] = "info: limits: Redis answers checks again"
          end
          store.limits = store.limits or limiter.new(4096)
          ask.redis = true
        end
      end
      asks[#asks + 1] = ask
    end
  end
  if #asks == 0 then return false end
  local remote = self.redis and self.redis.limits or nil
  local ok, fields, body, status = self.limiter:check(asks, self.utc_ms + self.clock, lim.headers, remote)
  if not ok then return answer(status, fields, body) end
  r.limit_fields = fields
  return false
end

-- The endpoint's rules that stand before the edge (key = "ip", before_auth), as worker/limits.c
-- does them: with mode "peek", answers r (429) and returns true when one of them has no count left
-- in the process's store (nothing is counted; a Redis rule's count there is its shadow: the
-- refusals charged to it); with mode "charge", counts an edge's refusal against each in the
-- process's store, and the Redis ones in the spec's Redis too (each on its own, unless it is down,
-- hangs or lies: the gateway's command would fail), and returns false.
function F:address_gate(r, ep, opts, mode)
  if not ep.limits or #ep.limits == 0 then return false end
  local lim, store = self.gen.config.limits, self.redis
  local up = store and not (store.down or store.hang or store.corrupt)
  local asks = {}
  for _, name in ipairs(ep.limits) do
    local rule = lim.rules[lim.by_name[name]]
    if rule.before_auth then
      local key = opts.ip or "127.0.0.1"
      -- (a Redis rule's shadow is a count of its own in the process's store: another key here)
      asks[#asks + 1] = { rule = rule, key = rule.store == "redis" and store and key .. "\0shadow" or key }
      if mode == "charge" and rule.store == "redis" and up then
        asks[#asks + 1] = { rule = rule, key = key, redis = true }
      end
    end
  end
  if #asks == 0 then return false end
  local now = self.utc_ms + self.clock
  if mode == "charge" then
    if store then store.limits = store.limits or limiter.new(4096) end
    self.limiter:check(asks, now, false, store and store.limits or nil, "charge")
    return false
  end
  local ok, fields, body, status = self.limiter:check(asks, now, lim.headers, nil, "peek")
  if ok then return false end
  return refuse(r, status, fields, body)
end

--- The client of a request sent with gw:send goes away (as a closed connection does in serve).
function F:disconnect(r)
  if not r.status then
    r.status, r.disconnected = 499, true
    r.headers, r.body = {}, ""
    self.open = self.open - 1
    timed(self, rt.abort, r.rid)
  end
end

return F
