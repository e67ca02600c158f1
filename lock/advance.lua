-- Raise a token counter to at least ARGV[1]; never lower it.
-- KEYS[1] counter key; ARGV[1] decimal token. Returns the counter afterwards.
-- Checks come before the write: a counter of the wrong type is left as it is.
local t = redis.call('TYPE', KEYS[1]).ok
if t ~= 'none' and t ~= 'string' then
  return redis.error_reply('WRONGTYPE token counter ' .. KEYS[1] .. ' holds a ' .. t .. ', not an integer')
end
local want = tonumber(ARGV[1])
if t == 'string' then
  local v = redis.call('GET', KEYS[1])
  if not string.match(v, '^%d+$') then
    return redis.error_reply('WRONGTYPE token counter ' .. KEYS[1] .. ' holds ' .. string.format('%q', v) .. ', not a non-negative integer')
  end
  local have = tonumber(v)
  if have >= want then
    return have
  end
end
redis.call('SET', KEYS[1], ARGV[1])
return want
