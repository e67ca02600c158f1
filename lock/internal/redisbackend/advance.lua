-- Raise a resource's token counter to at least ARGV[1]; never lower it.
-- Runs after tokenstate.lua.
-- KEYS[1] token state; ARGV[1] decimal token below 2^53-1, ARGV[2] token
-- retention in ms. Returns the counter afterwards.
-- Checks come before the write: a state of the wrong type is left as it is.
local n, g, h = read_state(KEYS[1], 'token state')
if not n then
  return g
end
local want = tonumber(ARGV[1])
if n >= want then
  return n
end
local now = now_us()
local pttl = redis.call('PTTL', KEYS[1])
local keep = keep_ms(want, now, 0, tonumber(ARGV[2]))
if pttl > keep then
  keep = pttl
end
local v = num(want)
if h then
  v = state(want, g, h)
end
redis.call('SET', KEYS[1], v, 'PX', keep)
return want
