-- Version-checked write or delete of one value hash, needing no fence. It
-- neither checks nor changes the high-water mark. Runs after value.lua.
--
-- KEYS[1]  the value hash
-- KEYS[2]  the call's retry record (see value.lua)
-- ARGV[1]  operation: "set" or "del"
-- ARGV[2]  expected version
-- ARGV[3]  retention in milliseconds of a key holding no live value, 0 to keep it forever
-- ARGV[4]  retry window in milliseconds: how long the call's record is kept;
--          negative on a send that may repeat one that already ran (a
--          client's resend), the only kind that looks for the call's record
-- ARGV[5]  value bytes (set only)
-- ARGV[6]  value lifetime in milliseconds, 0 for none (set only)
--
-- A resent write whose record exists is a retry of a run that already
-- happened: it gets that run's reply, before any check; a first send skips
-- the look-up. Otherwise every check comes before
-- the first write, so a refused call changes nothing.
-- Replies: {"OK", version, false, expiresAtMs}, {"CONFLICT", version}, {"WRONGTYPE", type}.

local key, rkey = KEYS[1], KEYS[2]
local op, expected = ARGV[1], tonumber(ARGV[2])
local retention, window = tonumber(ARGV[3]), tonumber(ARGV[4])
local resent = window < 0
window = math.abs(window)

if resent then
  local record = redis.call('GET', rkey)
  if record then
    return replay(record)
  end
end
local s, refusal = read_value(key)
if not s then
  return refusal
end
if expected ~= s.ver then
  return {'CONFLICT', s.ver}
end

-- Checks are done; writes start here.

if op == 'set' then
  return remember(rkey, window, write_value(key, s, ARGV[5], tonumber(ARGV[6]), retention, {}))
end

-- del: a missing value stays missing and keeps its version.
if s.live then
  s.ver = s.ver + 1
end
if s.kind ~= 'none' then
  redis.call('HSET', key, 'ver', s.ver)
  drop_value(key, s, retention)
end
return remember(rkey, window, {'OK', s.ver, false, 0})
