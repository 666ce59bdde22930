-- restore.lua: rebuild a binding from the session CR's status after Redis lost its data.
--
-- KEYS[1] session record   KEYS[2] pod record   KEYS[3] open pods (zset)   KEYS[4] residents (zset)
-- KEYS[5] LRU index (zset)
-- ARGV[1] session   ARGV[2] pool   ARGV[3] token_sha256   ARGV[4] seed   ARGV[5] prompt   ARGV[6] image
-- ARGV[7] max_chunks   ARGV[8] priority   ARGV[9] eviction_policy   ARGV[10] pod   ARGV[11] pod_epoch
-- ARGV[12] chunk_index   ARGV[13] reset_required (1|0)
--
-- Succeeds only if the session has no record and the pod record exists with that epoch (a heartbeat healed
-- it) and has a free slot; otherwise nothing changes and the operator re-places the session.
-- Returns {OK, 1, endpoint} (restored) | {OK, 0} (refused)
local session_key = KEYS[1]
local pod_key = KEYS[2]
local open_key = KEYS[3]
local residents_key = KEYS[4]
local lru_key = KEYS[5]
local session = ARGV[1]
local pod = ARGV[10]

if redis.call('EXISTS', session_key) == 1 then
  return {OK, 0}
end
local p = redis.call('HMGET', pod_key, 'epoch', 'used', 'capacity', 'endpoint')
if p[1] ~= ARGV[11] or tonumber(p[2]) >= tonumber(p[3]) then
  return {OK, 0}
end
local now = now_ms()
bind(session_key, residents_key, lru_key, session, pod, ARGV[11], ARGV[12], ARGV[13], now)
redis.call('HINCRBY', pod_key, 'used', 1)
refresh_open(open_key, pod_key, pod)
return {OK, 1, p[4]}
