-- A minimal gateway for the loader specs (nothing is served).
return { listen = { { port = 18081 } }, upstreams = {} }
