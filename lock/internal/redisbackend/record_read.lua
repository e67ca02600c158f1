-- Read the current leader: the record's value and token, only while the
-- term that wrote it still holds the lock.
-- KEYS[1] the lock key, KEYS[2] the leader record.
-- Returns {value, token, holder, n} while the record's term holds the lock
-- (n counts the values proclaimed, false when none was), and an empty array
-- when nobody leads (no record, the lock is free, or it has been handed to
-- a candidate that has not recorded itself yet). The holder id is only
-- compared by the caller (a Redlock read counts the nodes that agree); it
-- never leaves the election package. Reads only.
local rec = redis.call('HMGET', KEYS[2], 'v', 't', 'h', 'n')
if not rec[3] then
  return {}
end
local ok, cur = pcall(redis.call, 'GET', KEYS[1])
if not ok or cur ~= rec[3] then
  return {}
end
return rec
