-- Fenced read, write or delete of one value hash, admitted by the fence rule.
-- Runs after value.lua.
--
-- KEYS[1]  the value hash
-- ARGV[1]  operation: "get", "set" or "del"
-- ARGV[2]  fence resource
-- ARGV[3]  fence token (decimal, no leading zeros)
-- ARGV[4]  fence holder
-- ARGV[5]  retention in milliseconds of a key holding no live value, 0 to keep it forever
-- ARGV[6]  expected version, "" for no version check
-- ARGV[7]  value bytes (set only)
-- ARGV[8]  value lifetime in milliseconds, 0 for none (set only)
-- ARGV[9]  write id, unique to the call ("set" and "del")
-- ARGV[10] retry window in milliseconds: how long write records are kept
-- A "get" passes ARGV[1] to ARGV[5] only: the fewer arguments, the cheaper
-- the call.
--
-- A write whose id is recorded is a retry of a run that already happened: it
-- gets that run's reply, before any check. Otherwise every check comes before
-- the first write, so a refused call changes nothing but the retention of the
-- mark that refused it.
-- Replies: {"OK", version, data|false, expiresAtMs} for a live value,
--          {"NOTFOUND", version} when no live value is left or found,
--          {"STALE", resource, token, holder}, {"RESOURCE", resource},
--          {"CONFLICT", version}, {"WRONGTYPE", type}.

local key = KEYS[1]
local op, res, tok, hold = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local retention, wid = tonumber(ARGV[5]), ARGV[9] or ''

local s, refusal = read_value(key, wid)
if not s then
  return refusal
end
if s.record then
  return replay(s.record)
end
if s.res and s.res ~= res then
  keep_mark(key, s, retention)
  return {'RESOURCE', s.res}
end

-- Tokens are compared as decimal strings so that every int64 compares exactly.
local function cmp(a, b)
  if #a ~= #b then
    return #a < #b and -1 or 1
  end
  if a == b then
    return 0
  end
  return a < b and -1 or 1
end

if s.tok then
  local c = cmp(tok, s.tok)
  if c < 0 or (c == 0 and hold ~= s.hold) then
    keep_mark(key, s, retention)
    return {'STALE', s.res or res, s.tok, s.hold or ''}
  end
end
if ARGV[6] and ARGV[6] ~= '' and tonumber(ARGV[6]) ~= s.ver then
  return {'CONFLICT', s.ver}
end

-- Checks are done; writes start here.
local window = tonumber(ARGV[10])

if op == 'set' then
  return write_value(key, s, ARGV[7], tonumber(ARGV[8]), retention, {'tok', tok, 'hold', hold, 'res', res}, wid, window)
end

if op == 'del' and s.live then
  s.ver = s.ver + 1
end
if s.tok ~= tok or s.hold ~= hold or s.res ~= res or s.stored_ver ~= tostring(s.ver) then
  redis.call('HSET', key, 'ver', s.ver, 'tok', tok, 'hold', hold, 'res', res)
end
if s.live and op == 'get' then
  return {'OK', s.ver, s.data, tonumber(s.exp or '0')}
end
drop_value(key, s, retention)
if op == 'del' then
  return remember(key, s, wid, window, {'NOTFOUND', s.ver})
end
return {'NOTFOUND', s.ver}
