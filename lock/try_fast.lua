-- The uncontended try's fast path, which runs before the shared token-state
-- helpers are defined (Lua makes them anew on every run, which costs more
-- than the calls below): a free lock with nobody queued and token state
-- that is missing or in its short form "<n> <h>", with n below the top of
-- the token space, is granted here, as try.lua would grant it. Anything
-- else goes on to try.lua, which reads everything again: nothing here has
-- written. KEYS and ARGV as for try.lua.
if redis.call('EXISTS', KEYS[1], KEYS[3] or KEYS[1]) == 0 then
  local v = redis.pcall('GET', KEYS[2])
  local n = 0
  if v then
    local d = type(v) == 'string' and string.match(v, '^(%d+) %S+$')
    if d and (#d < 16 or (#d == 16 and d < '9007199254740991')) then
      n = tonumber(d)
    else
      n = nil
    end
  end
  if n then
    local t = redis.call('TIME')
    local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
    local ts, keep, token = nil, ARGV[3], now
    if n < now then
      ts = t[1] .. string.rep('0', 6 - #t[2]) .. t[2]
    else
      token = n + 1
      ts = string.format('%.0f', token)
      keep = tonumber(keep) + math.ceil((token - now) / 1000)
    end
    redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
    redis.call('SET', KEYS[2], ts .. ' ' .. string.sub(ARGV[1], 1, 8), 'PX', keep)
    if n == 0 then
      return {1, token, 1}
    end
    return {1, token}
  end
end
