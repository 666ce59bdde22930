-- resumed.lua: the worker holding a session imported the export named in its resume_from (issue 12).
--
-- KEYS[1] session record   KEYS[2] pod record
-- ARGV[1] pod   ARGV[2] pod epoch   ARGV[3] note (JSON: how it came, bytes, seconds; '' = none)
--
-- Only the pod incarnation the session is placed on may report it; resume_from is cleared (a later placement after
-- a loss then continues from the latest snapshot instead). The note waits in resumed_note until the operator has
-- reported it as an Event (ack_resumed_note.lua).
-- Returns {OK} | {UNKNOWN_SESSION} | {POD_FENCED, current epoch} | {SESSION_NOT_HERE, state, pod, pod_epoch}
local session_key = KEYS[1]
local pod_key = KEYS[2]

local refused = check_bound(session_key, pod_key, ARGV[1], tonumber(ARGV[2]), {})
if refused then
  return refused
end
redis.call('HSET', session_key, 'resume_from', '')
if ARGV[3] and ARGV[3] ~= '' then
  redis.call('HSET', session_key, 'resumed_note', ARGV[3])
end
return {OK}
