-- Unfenced read of one value hash: its value, version and high-water mark.
-- It writes nothing.
--
-- KEYS[1]  the value hash
--
-- Replies: {"OK"|"NOTFOUND", version, data|false, expiresAtMs, resource|false,
--           token|false, holder|false}, {"WRONGTYPE", type}.

local key = KEYS[1]

local kind = redis.call('TYPE', key)['ok']
if kind ~= 'none' and kind ~= 'hash' then
  return {'WRONGTYPE', kind}
end
local h = redis.call('HMGET', key, 'v', 'ver', 'tok', 'hold', 'res', 'exp')
if kind == 'hash' and not h[2] then
  return {'WRONGTYPE', 'hash without a version field'}
end

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ver = tonumber(h[2] or '0')
local live = h[1] and (not h[6] or tonumber(h[6]) > now)
if h[1] and not live then
  -- An expired value counts as deleted at its expiry, so its version moves on.
  return {'NOTFOUND', ver + 1, false, 0, h[5], h[3], h[4]}
end
if not live then
  return {'NOTFOUND', ver, false, 0, h[5], h[3], h[4]}
end
return {'OK', ver, h[1], tonumber(h[6] or '0'), h[5], h[3], h[4]}
