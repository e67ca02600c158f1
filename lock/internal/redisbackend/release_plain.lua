-- The plain release's fast path, which runs before the shared helpers of
-- release.lua are defined (defining them costs each run time): a lease
-- without owner released by its holder, not by a waiter giving up (no
-- ARGV[3], so the plain release sends two arguments), that finds nobody
-- queued deletes the lock and is done. See release.lua for KEYS and ARGV.
-- Anything else goes on to release.lua: nothing here has written.
-- held_by_caller tells release.lua that the lock was read here and is this
-- caller's, so that a release that found waiters and hands the lock over
-- does not read it a second time before the grant (what the script
-- publishes reaches the waiter only once it is done).
local held_by_caller = false
if not ARGV[3] and KEYS[5] and #ARGV[2] > 1 then
  if redis.call('GET', KEYS[1]) ~= ARGV[1] then
    return 0
  end
  if redis.call('EXISTS', KEYS[4]) == 0 then
    redis.call('DEL', KEYS[1])
    return 1
  end
  held_by_caller = true
end
