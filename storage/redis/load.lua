-- Unfenced read of one value hash: its value, version and high-water mark.
-- It writes nothing. Runs after value.lua.
--
-- KEYS[1]  the value hash
--
-- Replies: {"OK"|"NOTFOUND", version, data|false, expiresAtMs, resource|false,
--           token|false, holder|false}, {"WRONGTYPE", type}.

local s, refusal = read_value(KEYS[1])
if not s then
  return refusal
end
if not s.live then
  return {'NOTFOUND', s.ver, false, 0, s.res, s.tok, s.hold}
end
return {'OK', s.ver, s.data, tonumber(s.exp or '0'), s.res, s.tok, s.hold}
