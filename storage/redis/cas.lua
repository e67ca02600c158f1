-- Version-checked write or delete of one value hash, needing no fence. It
-- neither checks nor changes the high-water mark. Runs after value.lua.
--
-- KEYS[1]  the value hash
-- ARGV[1]  operation: "set" or "del"
-- ARGV[2]  expected version
-- ARGV[3]  value bytes (set only)
-- ARGV[4]  value lifetime in milliseconds, 0 for none (set only)
-- ARGV[5]  retention in milliseconds of a key holding no live value, 0 to keep it forever
-- ARGV[6]  write id, unique to the call
-- ARGV[7]  retry window in milliseconds: how long write records are kept
--
-- A write whose id is recorded is a retry of a run that already happened: it
-- gets that run's reply, before any check. Otherwise every check comes before
-- the first write, so a refused call changes nothing.
-- Replies: {"OK", version, false, expiresAtMs}, {"CONFLICT", version}, {"WRONGTYPE", type}.

local key = KEYS[1]
local op = ARGV[1]

local expected, wid = tonumber(ARGV[2]), ARGV[6]
local s, refusal = read_value(key, wid)
if not s then
  return refusal
end
if s.record then
  return replay(s.record)
end
if expected ~= s.ver then
  return {'CONFLICT', s.ver}
end

-- Checks are done; writes start here.
local retention, window = tonumber(ARGV[5]), tonumber(ARGV[7])

if op == 'set' then
  return write_value(key, s, ARGV[3], tonumber(ARGV[4]), retention, {}, wid, window)
end

-- del: a missing value stays missing and keeps its version.
if s.live then
  s.ver = s.ver + 1
end
if s.kind == 'none' then
  -- Nothing to change, so nothing to record: a retry runs again.
  return {'OK', s.ver, false, 0}
end
redis.call('HSET', key, 'ver', s.ver)
drop_value(key, s, retention)
return remember(key, s, wid, window, {'OK', s.ver, false, 0})
