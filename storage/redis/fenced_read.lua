-- The fenced read's fast path, run before value.lua's helpers are made (Lua
-- makes them anew on every run): a first send of a get whose fence is the
-- key's mark (same resource, token and holder) and whose value is live
-- without expiry changes nothing and answers at once, as fenced.lua would.
-- Anything else (another fence, no value, an expiry, a resend, a key this
-- store cannot use) goes on to fenced.lua, which reads the key again:
-- nothing here has written. KEYS and ARGV are fenced.lua's.
if ARGV[1] == 'get' and string.sub(ARGV[6], 1, 1) ~= '-' then
  local h = redis.pcall('HMGET', KEYS[1], 'v', 'ver', 'tok', 'hold', 'res', 'exp')
  if not h.err and h[1] and h[2] and not h[6] and h[3] == ARGV[3] and h[4] == ARGV[4] and h[5] == ARGV[2] then
    return {'OK', tonumber(h[2]), h[1], 0}
  end
end
