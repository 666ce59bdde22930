-- mark_suspended.lua: the worker wrote a session's export (issue 12): the session leaves its pod and its slot.
--
-- KEYS[1] session record   KEYS[2] pod record   KEYS[3] open pods (zset)   KEYS[4] residents (zset)
-- KEYS[5] LRU index (zset)   KEYS[6] suspending sessions (zset)   KEYS[7] compute headroom (zset)
-- ARGV[1] session   ARGV[2] pod   ARGV[3] pod epoch   ARGV[4] tier   ARGV[5] location ('' = the export failed)
-- ARGV[6] bytes   ARGV[7] chunk_index (the next chunk the export continues at)
--
-- Only for a `suspending` (or `placed`) session on that pod incarnation. The slot is freed either way. With a
-- location: state=suspended, pod/pod_epoch cleared, tier/location/bytes/suspended_chunk set; a demand to resume set
-- while it was suspending (migration, or a tick meanwhile) is kept, a placed session gets none. Without one (the
-- export failed): state=evicted with reset_required=1 (today's eviction; the worker drops the KV itself). A repeated
-- report of the same location answers OK again. Either way it keeps no chunks any more (issue 26: kept chunks are not
-- in the export).
-- Returns {OK, 'suspended'|'evicted'} | {UNKNOWN_SESSION} | {POD_FENCED, current epoch}
--      | {SESSION_NOT_HERE, state, pod, pod_epoch}
local session_key = KEYS[1]
local pod_key = KEYS[2]
local open_key = KEYS[3]
local residents_key = KEYS[4]
local lru_key = KEYS[5]
local suspending_key = KEYS[6]
local headroom_key = KEYS[7]
local session = ARGV[1]
local pod = ARGV[2]
local epoch = tonumber(ARGV[3])
local location = ARGV[5]

local done = redis.call('HMGET', session_key, 'state', 'location')
if done[1] == 'suspended' and location ~= '' and done[2] == location then
  return {OK, 'suspended'}  -- a repeated report of the same export
end
local refused, s = check_bound(session_key, pod_key, pod, epoch, {})
if refused then
  return refused
end

local was_placed = s[1] == 'placed'
redis.call('HSET', session_key, 'kept_chunks', '')
redis.call('ZREM', suspending_key, session)
if redis.call('EXISTS', pod_key) == 1 then
  charge(pod_key, session_key, -1)
  refresh_open(open_key, headroom_key, pod_key, pod)
end
if location == '' then
  unbind(session_key, residents_key, lru_key, pod, session, 'evicted')
  redis.call('HSET', session_key, 'reset_required', 1, 'chunk_index', 0, 'resume_requested_ms', 0)
  return {OK, 'evicted'}
end
unbind(session_key, residents_key, lru_key, pod, session, 'suspended')
redis.call('HSET', session_key, 'pod', '', 'pod_epoch', 0, 'tier', ARGV[4], 'location', location, 'bytes', ARGV[6],
  'suspended_chunk', ARGV[7], 'chunk_index', ARGV[7], 'resume_from', '')
if was_placed then
  redis.call('HSET', session_key, 'resume_requested_ms', 0)
end
return {OK, 'suspended'}
