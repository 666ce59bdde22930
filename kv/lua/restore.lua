-- restore.lua: rebuild a session record from the session CR's status after Redis lost its data.
--
-- KEYS[1] session record   KEYS[2] pod record   KEYS[3] open pods (zset)   KEYS[4] residents (zset)
-- KEYS[5] LRU index (zset)   KEYS[6] compute headroom (zset)
-- ARGV[1] session   ARGV[2] pool   ARGV[3] token_sha256   ARGV[4] seed   ARGV[5] prompt   ARGV[6] image
-- ARGV[7] max_chunks   ARGV[8] priority   ARGV[9] eviction_policy   ARGV[10] playout_fps
-- ARGV[11] playout_buffer_chunks   ARGV[12] history_keep_chunks   ARGV[13] fork_from
-- ARGV[14] pod ('' = suspended)   ARGV[15] pod_epoch   ARGV[16] chunk_index   ARGV[17] reset_required (1|0)
-- ARGV[18] tier   ARGV[19] location   ARGV[20] bytes (a suspended session's export)
--
-- Only if the session has no record. A placed session is bound again only if the pod record exists with that
-- epoch (a heartbeat healed it) and has a free slot; a suspended one (issue 12) gets its record back with no pod
-- and no slot, its export where the status says (the shared tier outlives Redis' data), to resume on demand.
-- A restored binding takes its slot and its demand (playout_fps) whatever the pod's compute: it existed before.
-- Otherwise nothing changes and the operator re-places the session.
-- Returns {OK, 1, endpoint} (restored; endpoint '' when suspended) | {OK, 0} (refused)
local session_key = KEYS[1]
local pod_key = KEYS[2]
local open_key = KEYS[3]
local residents_key = KEYS[4]
local lru_key = KEYS[5]
local headroom_key = KEYS[6]
local session = ARGV[1]
local pod = ARGV[14]

if redis.call('EXISTS', session_key) == 1 then
  return {OK, 0}
end
local now = now_ms()
if pod == '' then
  write_record(session_key, 'suspended', '', 0, ARGV[16], 0, now)
  forget_exports(session_key)
  redis.call('HSET', session_key, 'tier', ARGV[18], 'location', ARGV[19], 'bytes', ARGV[20],
    'suspended_chunk', ARGV[16])
  return {OK, 1, ''}
end
local p = redis.call('HMGET', pod_key, 'epoch', 'used', 'capacity', 'endpoint')
if p[1] ~= ARGV[15] or tonumber(p[2]) >= tonumber(p[3]) then
  return {OK, 0}
end
bind(session_key, residents_key, lru_key, session, pod, ARGV[15], ARGV[16], ARGV[17], now)
charge(pod_key, session_key, 1)
refresh_open(open_key, headroom_key, pod_key, pod)
return {OK, 1, p[4]}
