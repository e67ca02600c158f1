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
--
-- Every check comes before the first write, so a refused call changes nothing.
-- Replies: {"OK", version, false, expiresAtMs}, {"CONFLICT", version}, {"WRONGTYPE", type}.

local key = KEYS[1]
local op = ARGV[1]

local s, refusal = read_value(key)
if not s then
  return refusal
end
local expected, wid = tonumber(ARGV[2]), ARGV[6]
if expected ~= s.ver then
  if replayed(s, wid, expected) then
    return replay_reply(s, expected)
  end
  return {'CONFLICT', s.ver}
end

-- Checks are done; writes start here.
local retention = tonumber(ARGV[5])

if op == 'set' then
  return write_value(key, s, ARGV[3], tonumber(ARGV[4]), retention, {'wid', wid})
end

-- del: a missing value stays missing and keeps its version.
if s.live then
  s.ver = s.ver + 1
end
if s.kind == 'none' then
  return {'OK', s.ver, false, 0}
end
redis.call('HSET', key, 'ver', s.ver, 'wid', wid)
drop_value(key, s, retention)
return {'OK', s.ver, false, 0}
