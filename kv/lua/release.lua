-- release.lua: close a session (the operator's one teardown path); idempotent.
--
-- KEYS[1] session record   KEYS[2] open pods (zset)   KEYS[3] residents (zset)   KEYS[4] LRU index (zset)
-- KEYS[5] suspending sessions (zset)   KEYS[6] compute headroom (zset)
-- KEYS[7...] plan: the pod the session is placed on (see _lib.lua)
-- ARGV[1] session   ARGV[2] reason   ARGV[3] closed_ttl_ms   ARGV[4] stream maxlen   ARGV[5...] plan
--
-- A placed (or suspending) session frees its slot and a `close` event goes to its pod's stream. The record stays with
-- state=closed for closed_ttl_ms, so the worker can still answer 410 for it; its image (up to 1 MiB) and prompt go at
-- once (nothing reads them from a closed record, and an hour of them per deleted session is unbounded memory).
-- Returns {OK, previous state or false (no record)} | {STALE_PLAN, {pod}, {}}
local session_key = KEYS[1]
local open_key = KEYS[2]
local residents_key = KEYS[3]
local lru_key = KEYS[4]
local suspending_key = KEYS[5]
local headroom_key = KEYS[6]
local session = ARGV[1]
local plan = read_plan(7, 5)

local s = redis.call('HMGET', session_key, 'state', 'pod', 'pod_epoch')
if s[1] == false then
  return {OK, false}
end
if s[1] == 'closed' then
  return {OK, 'closed'}
end
if s[1] == 'placed' or s[1] == 'suspending' then
  local owner = s[2]
  local missing = new_missing()
  need_pod(plan, missing, owner)
  if missing.any then
    return stale_reply(missing)
  end
  local pod_key = plan.pod_keys[owner]
  unbind(session_key, residents_key, lru_key, owner, session, 'closed')
  redis.call('ZREM', suspending_key, session)
  if redis.call('EXISTS', pod_key) == 1 then
    charge(pod_key, session_key, -1)
    refresh_open(open_key, headroom_key, pod_key, owner)
  end
  post_event(plan.stream_keys[owner], ARGV[4], 'close', session, ARGV[2], s[3])
end
redis.call('HSET', session_key, 'state', 'closed')
redis.call('HDEL', session_key, 'image', 'prompt')
redis.call('PEXPIRE', session_key, ARGV[3])
return {OK, s[1]}
