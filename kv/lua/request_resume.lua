-- request_resume.lua: a tick reached a suspended session: that is a demand to resume it (issue 12).
--
-- KEYS[1] session record
-- ARGV[1] session (for the header's sake: the record is KEYS[1])
--
-- For a `suspended` or `suspending` session, sets resume_requested_ms (server time) unless a demand is already
-- recorded (idempotent: the first demand's time stays); the operator places suspended sessions that have one.
-- Any other state is left alone.
-- Returns {OK, state or false (no record)}
local session_key = KEYS[1]

local s = redis.call('HMGET', session_key, 'state', 'resume_requested_ms')
if s[1] == false then
  return {OK, false}
end
if (s[1] == 'suspended' or s[1] == 'suspending') and (tonumber(s[2]) or 0) == 0 then
  local now = now_ms()
  redis.call('HSET', session_key, 'resume_requested_ms', int_text(now))
end
return {OK, s[1]}
