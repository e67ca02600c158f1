-- Fenced read, write or delete of one value hash, admitted by the fence rule.
-- Runs after value.lua.
--
-- KEYS[1]  the value hash
-- KEYS[2]  the call's retry record (see value.lua)
-- ARGV[1]  operation: "get", "set" or "del"
-- ARGV[2]  fence resource
-- ARGV[3]  fence token (decimal, no leading zeros)
-- ARGV[4]  fence holder
-- ARGV[5]  retention in milliseconds of a key holding no live value, 0 to keep it forever
-- ARGV[6]  retry window in milliseconds: how long the call's record is kept;
--          negative on a send that may repeat one that already ran (a
--          client's resend), the only kind that looks for the call's record
-- ARGV[7]  expected version, "" for no version check (set only)
-- ARGV[8]  value bytes (set only)
-- ARGV[9]  value lifetime in milliseconds, 0 for none (set only)
-- "get" and "del" pass ARGV[1] to ARGV[6] only: the fewer arguments, the
-- cheaper the call.
--
-- A resent write whose record exists is a retry of a run that already
-- happened: it gets that run's reply, before any check. A get is recorded
-- only when it raises the mark; a resent get that raises nothing (its fence
-- is the mark, or is refused) looks for the record of an earlier run of the
-- same call, which was admitted: it answers as that run did while the value
-- is as that run saw it, and with LOST once the value has changed since. A
-- first send skips every look-up: it cannot repeat anything. Otherwise every
-- check comes before the first write, so a refused call changes nothing but
-- the retention of the mark that refused it.
-- Replies: {"OK", version, data|false, expiresAtMs} for a live value,
--          {"NOTFOUND", version} when no live value is left or found,
--          {"STALE", resource, token, holder}, {"RESOURCE", resource},
--          {"CONFLICT", version}, {"WRONGTYPE", type}, {"LOST", version}.

local key, rkey = KEYS[1], KEYS[2]
local op, res, tok, hold = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local retention, window = tonumber(ARGV[5]), tonumber(ARGV[6])
local resent = window < 0
-- The window as sent, without its sign: Redis takes it as text, where a Lua
-- number would cost a conversion.
window = resent and string.sub(ARGV[6], 2) or ARGV[6]

if resent and op ~= 'get' then
  local record = redis.call('GET', rkey)
  if record then
    return replay(record)
  end
end
local s, refusal = read_value(key)
if not s then
  return refusal
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

local c = 1
if s.tok then
  c = cmp(tok, s.tok)
end
local stale = c < 0 or (c == 0 and hold ~= s.hold)

-- read_reply is what a get answers from the state it found.
local function read_reply()
  if s.live then
    return {'OK', s.ver, s.data, tonumber(s.exp or '0')}
  end
  return {'NOTFOUND', s.ver}
end

if resent and op == 'get' and c <= 0 then
  -- A get that raises nothing: is it a retry of one that did?
  local record = redis.call('GET', rkey)
  if record then
    local status, ver, exp = parse(record)
    local now = read_reply()
    if status ~= now[1] or ver ~= s.ver or (s.live and exp ~= now[4]) then
      return {'LOST', ver}
    end
    if stale then
      -- Its first run was admitted, and the value is still as it saw it;
      -- the mark has moved on since and stays where it is.
      return now
    end
  end
end
if stale then
  keep_mark(key, s, retention)
  return {'STALE', s.res or res, s.tok, s.hold or ''}
end
if ARGV[7] and ARGV[7] ~= '' and tonumber(ARGV[7]) ~= s.ver then
  return {'CONFLICT', s.ver}
end

-- Checks are done; writes start here.

if op == 'set' then
  return remember(rkey, window,
    write_value(key, s, ARGV[8], tonumber(ARGV[9]), retention, {'tok', tok, 'hold', hold, 'res', res}))
end

local raises = c > 0 or s.res ~= res
if op == 'del' and s.live then
  s.ver = s.ver + 1
end
if raises or s.stored_ver ~= tostring(s.ver) then
  redis.call('HSET', key, 'ver', s.ver, 'tok', tok, 'hold', hold, 'res', res)
  claim(key, s, hold_for(s, retention))
end
local reply = read_reply()
if op == 'del' then
  reply = {'NOTFOUND', s.ver}
end
if not (s.live and op == 'get') then
  drop_value(key, s, retention)
end
if op == 'del' or raises then
  remember(rkey, window, reply)
end
return reply
