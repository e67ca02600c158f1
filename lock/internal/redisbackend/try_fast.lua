-- The uncontended try's fast path, which runs before the shared token-state
-- helpers are defined (Lua makes them anew on every run, which costs more
-- than the calls below): a free lock with nobody queued and token state
-- that is missing, or in its short form "<n> <h>" with n behind the clock,
-- is granted here with the clock as its token, as try.lua would grant it.
-- Anything else (the counter at or ahead of the clock, the long form, a
-- key of another type) goes on to try.lua, which reads everything again:
-- nothing here has written. KEYS and ARGV as for try.lua.
--
-- n is compared with the clock as text: both are digits without a sign,
-- so the shorter is the smaller, and at equal length the order of the
-- text is that of the numbers. This spares a conversion to a number and
-- back, which costs Redis more than the rest of the comparison.
-- Returns the token as a bulk string: "<token>" when the state was found,
-- "<token> 0" when it was missing (the token came from the clock alone; a
-- string, like the other grant, because an array costs Redis a table and
-- the client an allocation per element), and try.lua's replies otherwise.
if redis.call('EXISTS', KEYS[1], KEYS[3] or KEYS[1]) == 0 then
  local v = redis.pcall('GET', KEYS[2])
  local t = redis.call('TIME')
  -- The µs are padded to six digits only when they need it (one time in
  -- ten): string.rep would cost every run a call.
  local ts = t[2]
  if #ts < 6 then
    ts = string.rep('0', 6 - #ts) .. ts
  end
  ts = t[1] .. ts
  if not v then
    redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
    redis.call('SET', KEYS[2], ts .. ' ' .. string.sub(ARGV[1], 1, 8), 'PX', ARGV[3])
    return ts .. ' 0'
  end
  local d = type(v) == 'string' and string.match(v, '^(%d+) %S+$')
  if d and (#d < #ts or (#d == #ts and d < ts)) then
    redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
    redis.call('SET', KEYS[2], ts .. ' ' .. string.sub(ARGV[1], 1, 8), 'PX', ARGV[3])
    return ts
  end
end
