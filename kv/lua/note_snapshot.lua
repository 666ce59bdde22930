-- note_snapshot.lua: the worker wrote a periodic snapshot of a session to the shared tier (issue 12).
--
-- KEYS[1] session record   KEYS[2] pod record
-- ARGV[1] pod   ARGV[2] pod epoch   ARGV[3] location   ARGV[4] chunk_index (the next chunk it continues at)
--
-- Only the pod incarnation the session is placed on may report it. Sets snapshot_location/snapshot_chunk: a session
-- that loses its pod is placed again from it (resume_from) without reset_required.
-- Returns {OK} | {UNKNOWN_SESSION} | {POD_FENCED, current epoch} | {SESSION_NOT_HERE, state, pod, pod_epoch}
local session_key = KEYS[1]
local pod_key = KEYS[2]

local refused = check_bound(session_key, pod_key, ARGV[1], tonumber(ARGV[2]), {})
if refused then
  return refused
end
redis.call('HSET', session_key, 'snapshot_location', ARGV[3], 'snapshot_chunk', ARGV[4])
return {OK}
