-- Shared by the scripts that issue tokens, which run it before their body.
--
-- A resource's token state is one string key, "<n> <h>" or "<n> <g> <h>":
-- n the newest token issued or advanced to (the counter), g the token of the
-- current or last grant (n itself in the short form) and h the first
-- HOLDER_MARK characters of that grant's holder, enough to tell it from the
-- other grants of the resource. A bare decimal (a counter written by an
-- earlier release of this package) reads as n alone. The key expires a
-- retention window after the last grant's lease, so it lives only while the
-- resource is active; tokens are anchored to the server clock so that they
-- keep increasing once it is gone.

-- MAX_TOKEN is fence.MaxToken: Lua numbers are doubles, exact to 2^53.
local MAX_TOKEN = 9007199254740991

-- HOLDER_MARK is how much of a holder id the state keeps.
local HOLDER_MARK = 8

-- mark is what the state keeps of holder.
local function mark(holder)
  return string.sub(holder, 1, HOLDER_MARK)
end

-- num writes a token as a decimal string; tostring would round it.
local function num(x)
  return string.format('%.0f', x)
end

-- now_us is the server clock in microseconds since the epoch.
local function now_us()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end

-- in_range reports whether the decimal digits s are a token at most
-- MAX_TOKEN. Strings are compared by length first, so no digit is lost to a
-- double.
local function in_range(s)
  return #s < 16 or (#s == 16 and s <= '9007199254740991')
end

-- is_token reports whether s is a decimal token at most MAX_TOKEN.
local function is_token(s)
  return s and string.match(s, '^%d+$') and in_range(s) or false
end

-- read_state returns n, g, h of the token state at key (0, 0, false when it
-- is missing), or nil and an error reply when key holds something else. It
-- writes nothing.
local function read_state(key, what)
  local v = redis.pcall('GET', key)
  if type(v) == 'table' and v.err then
    return nil, redis.error_reply('WRONGTYPE ' .. what .. ' ' .. key .. ' is not a string: ' .. v.err)
  end
  if not v then
    return 0, 0, false
  end
  -- The short form is the common one; the captures are digits already, so
  -- only their range is checked.
  local n, h = string.match(v, '^(%d+) (%S+)$')
  local g = n
  if not n then
    n, g, h = string.match(v, '^(%d+) (%d+) (%S+)$')
  end
  local ok
  if n then
    ok = in_range(n) and (g == n or in_range(g))
  else
    n = v -- a bare counter: no grant recorded
    ok = is_token(n)
  end
  if not ok then
    return nil, redis.error_reply('WRONGTYPE ' .. what .. ' ' .. key .. ' holds ' .. string.format('%q', v) .. ', not a token state')
  end
  return tonumber(n), tonumber(g or '0'), h or false
end

-- state writes token state: counter n, grant g, holder mark h; sn, when
-- given, is n already written as a decimal.
local function state(n, g, h, sn)
  sn = sn or num(n)
  if n == g then
    return sn .. ' ' .. h
  end
  return sn .. ' ' .. num(g) .. ' ' .. h
end

-- next_token is the token after n: above n and not below the clock, or nil
-- and an error reply once the token space is exhausted.
local function next_token(n, now)
  local t = math.max(n + 1, now)
  if t > MAX_TOKEN then
    return nil, redis.error_reply('ERR token space exhausted: the next token would pass 2^53-1')
  end
  return t
end

-- keep_ms is how long token state with counter n must live from now: the
-- lease, the retention, and however far n runs ahead of the clock, so that
-- once the state is gone the clock alone has passed every token issued.
local function keep_ms(n, now, lease, retention)
  local ahead = 0
  if n > now then
    ahead = math.ceil((n - now) / 1000)
  end
  return lease + retention + ahead
end
