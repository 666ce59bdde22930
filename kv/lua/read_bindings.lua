-- read_bindings.lua: the binding fields of many sessions in one call (read-only; no record is changed).
--
-- KEYS[1...] session records   ARGV none: the fields read are BINDING_FIELDS (SessionBinding.FIELDS, `state` first)
--
-- One JSON document instead of an HMGET reply per session: the client parses one string, not thousands of
-- replies (at 100,000 sessions that is most of an operator round's read time).
-- Returns {OK, json}: a JSON array with, per key, false (no record) or the array of field values (false for
-- a field the record lacks).
local records = {}
for i = 1, #KEYS do
  local values = redis.call('HMGET', KEYS[i], unpack(BINDING_FIELDS))
  if values[1] == false then
    records[i] = false
  else
    records[i] = values
  end
end
return {OK, cjson.encode(records)}
