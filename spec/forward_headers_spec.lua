-- upstreams.X.forward_headers in gateway.lua: a list of client header names every call to X
-- carries (the concert and personal examples show it through a page); checked at load.
local config = require "agg.config"

local function check(fh)
  local src = "return {\n  upstreams = {\n    a = { url = \"http://127.0.0.1:1\",\n      forward_headers = FH },\n  },\n}"
  local c, errs = config.check({ upstreams = { a = { url = "http://127.0.0.1:1", forward_headers = fh } } }, src, "gateway.lua")
  return c, errs and table.concat(errs, "\n") or ""
end

describe("forward_headers", function()
  it("keeps a list of header names, lowercased and once each", function()
    local c = assert(check { "Accept-Language", "x-device", "accept-language" })
    assert.same({ "accept-language", "x-device" }, c.upstreams[1].forward_headers)
  end)

  it("refuses what is not a list of header names, at the option's line", function()
    local _, e = check("accept-language")
    assert.matches("gateway.lua:4: upstreams.a.forward_headers: must be a list of header names", e, 1, true)
    _, e = check { "accept language" }
    assert.matches("item 1 must be a header name", e, 1, true)
    _, e = check { lang = "accept-language" }
    assert.matches("must be a list of header names", e, 1, true)
  end)

  it("refuses the headers of this connection only", function()
    for _, h in ipairs { "Host", "connection", "transfer-encoding", "content-length", "te", "upgrade" } do
      local _, e = check { h }
      assert.matches("'" .. h .. "' belongs to this connection only and is never forwarded", e, 1, true)
    end
  end)

  it("refuses the client's credentials, naming the upstream and the header and pointing to identity", function()
    for _, h in ipairs { "Authorization", "proxy-authorization", "Cookie", "X-API-Key" } do
      local c, e = check { "accept-language", h }
      assert.is_nil(c, h)
      assert.matches("gateway.lua:4: upstreams.a.forward_headers: '" .. h .. "' carries the client's credentials " ..
                     "and is never forwarded as it is", e, 1, true)
      assert.matches("identity = \"forward\"", e, 1, true)
    end
  end)

  it("refuses the API key header auth.api_keys reads", function()
    local src = "return {\n  upstreams = {\n    a = { url = \"http://127.0.0.1:1\",\n      forward_headers = FH },\n  },\n}"
    local cfg = { auth = { api_keys = { file = "keys.json", header = "X-Client-Key" } },
                  upstreams = { a = { url = "http://127.0.0.1:1", forward_headers = { "x-client-key" } } } }
    local _, errs = config.check(cfg, src, "gateway.lua")
    assert.matches("upstreams.a.forward_headers: 'x-client-key' carries the client's credentials",
                   table.concat(errs or {}, "\n"), 1, true)
    -- without such a block, a header of that name is anyone's
    assert.same({ "x-client-key" }, assert(check { "x-client-key" }).upstreams[1].forward_headers)
  end)

  it("suggests the option when it is misspelt", function()
    local c, errs = config.check({ upstreams = { a = { url = "http://127.0.0.1:1", forward_header = { "x" } } } },
      "return {}", "gateway.lua")
    assert.is_nil(c)
    assert.matches("unknown option (did you mean 'forward_headers'?)", table.concat(errs, "\n"), 1, true)
  end)
end)
