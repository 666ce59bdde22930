-- touch.lua: a worker ticked a session (one round trip per tick).
--
-- KEYS[1] session record   KEYS[2] pod record   KEYS[3] LRU index (zset)
-- ARGV[1] session   ARGV[2] pod   ARGV[3] pod epoch   ARGV[4] chunk_index (next chunk expected)
-- ARGV[5] reset_done (1: the tick reset the session, clear reset_required)
--
-- Only the pod incarnation the session is placed on may touch it. Sets chunk_index and last_tick_ms (server
-- time) and moves the session in the LRU index. A reset starts a new world: the session's snapshot (issue 12) is
-- forgotten, so a later pod loss cannot bring back the world before the reset; so are its kept chunks (issue 26).
-- Returns {OK, last_tick_ms} | {UNKNOWN_SESSION} | {POD_FENCED, current epoch}
--      | {SESSION_NOT_HERE, state, pod, pod_epoch}
local session_key = KEYS[1]
local pod_key = KEYS[2]
local lru_key = KEYS[3]
local session = ARGV[1]
local pod = ARGV[2]

local refused, s = check_bound(session_key, pod_key, pod, tonumber(ARGV[3]), {'priority', 'eviction_policy'})
if refused then
  return refused
end
local now = now_ms()
redis.call('HSET', session_key, 'chunk_index', ARGV[4], 'last_tick_ms', int_text(now))
if ARGV[5] == '1' then
  redis.call('HSET', session_key, 'reset_required', 0, 'snapshot_location', '', 'snapshot_chunk', 0, 'resume_from', '',
    'kept_chunks', '')
end
if s[5] == 'LRU' then
  redis.call('ZADD', lru_key, 'XX', lru_score(s[4], now), resident(pod, session))
end
return {OK, int_text(now)}
