-- The fenced script's fast paths, run before value.lua's helpers are made
-- (Lua makes them anew on every run): a first send (not a resend) whose
-- fence is already the key's mark (same resource, token and holder), on a
-- live value without expiry. Such a get changes nothing and answers at
-- once; such a set without a version check and without a lifetime writes
-- the value with the next version and its retry record, exactly as
-- fenced.lua and value.lua's write_value would (the mark stays as it is,
-- and so does the hash's retention when it needs no change). Anything else
-- (another fence, no value, an expiry, a resend, a retention to change, a
-- key this store cannot use) goes on to fenced.lua, which reads the key
-- again: nothing here has written. KEYS and ARGV are fenced.lua's.
--
-- A hash takes this path only in the exact shape this store gives it (see
-- value.lua's is_ours): v, ver, tok, hold and res (which equal the fence,
-- itself checked by the caller), rt or not, no other field, and a version
-- and a retention of the store's form. One HLEN, the only command added to
-- the HMGET, tells that no other field is there.
local op = ARGV[1]
if op ~= 'del' and string.sub(ARGV[6], 1, 1) ~= '-' then
  local h = redis.pcall('HMGET', KEYS[1], 'v', 'ver', 'tok', 'hold', 'res', 'exp', 'rt')
  if not h.err and h[1] and h[2] and not h[6] and h[3] == ARGV[3] and h[4] == ARGV[4] and h[5] == ARGV[2]
      and #h[2] <= 15 and string.find(h[2], '^[1-9]%d*$')
      and (not h[7] or (#h[7] <= 15 and string.find(h[7], '^[1-9]%d*$')))
      and redis.call('HLEN', KEYS[1]) == (h[7] and 6 or 5) then
    local ver = tonumber(h[2])
    if op == 'get' then
      return {'OK', ver, h[1], 0}
    end
    -- The hash's retention needs no change when it has none (kept as
    -- long as the mark needs) or one at least this store's (see
    -- value.lua's hold_for and claim).
    if ARGV[7] == '' and ARGV[9] == '0' and (not h[7] or (ARGV[5] ~= '0' and tonumber(h[7]) >= tonumber(ARGV[5]))) then
      ver = ver + 1
      local sver = tostring(ver)
      redis.call('HSET', KEYS[1], 'v', ARGV[8], 'ver', sver)
      redis.call('SET', KEYS[2], 'OK ' .. sver .. ' 0', 'PX', ARGV[6])
      return {'OK', ver, false, 0}
    end
  end
end
