-- relocate_export.lua: a suspended session's export moved to another tier (issue 12: a draining pod moves the
-- copies in its host memory to the shared tier before it exits).
--
-- KEYS[1] session record
-- ARGV[1] from location   ARGV[2] to location   ARGV[3] to tier
--
-- Only while the record still points at the old copy: `location` of a suspended session, or `resume_from` of one
-- placed again that has not imported it yet. Anything else (resumed, closed, re-admitted) leaves the record as it
-- is: the caller removes the new copy.
-- Returns {OK, 1} (relocated) | {OK, 0}
local session_key = KEYS[1]
local from = ARGV[1]
local s = redis.call('HMGET', session_key, 'state', 'location', 'resume_from')
if s[1] == 'suspended' and s[2] == from then
  redis.call('HSET', session_key, 'tier', ARGV[3], 'location', ARGV[2])
  return {OK, 1}
end
if s[1] ~= false and s[1] ~= 'closed' and s[3] == from then
  redis.call('HSET', session_key, 'resume_from', ARGV[2])
  return {OK, 1}
end
return {OK, 0}
