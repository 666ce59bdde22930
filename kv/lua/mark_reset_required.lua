-- mark_reset_required.lua: a forward failed and the runner freed the session's KV (fail-closed).
--
-- KEYS[1] session record   KEYS[2] pod record
-- ARGV[1] pod   ARGV[2] pod epoch
--
-- The session keeps its slot; its next tick must be a reset at chunk 0 (reset_required=1, chunk_index=0).
-- Returns {OK} | {UNKNOWN_SESSION} | {POD_FENCED, current epoch} | {SESSION_NOT_HERE, state, pod, pod_epoch}
local session_key = KEYS[1]
local pod_key = KEYS[2]

local refused = check_bound(session_key, pod_key, ARGV[1], tonumber(ARGV[2]), {})
if refused then
  return refused
end
redis.call('HSET', session_key, 'reset_required', 1, 'chunk_index', 0)
return {OK}
