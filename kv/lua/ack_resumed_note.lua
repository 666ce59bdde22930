-- ack_resumed_note.lua: the operator reported a session's resume (its Event is out): forget the note (issue 12).
--
-- KEYS[1] session record
-- ARGV[1] the note as the operator read it
--
-- Cleared only while it is still that note, so a newer resume reported meanwhile is not lost.
-- Returns {OK, 1} (cleared) | {OK, 0} (no record, or another note by now)
local current = redis.call('HGET', KEYS[1], 'resumed_note')
if current and current == ARGV[1] then
  redis.call('HSET', KEYS[1], 'resumed_note', '')
  return {OK, 1}
end
return {OK, 0}
