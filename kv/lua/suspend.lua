-- suspend.lua: the operator asks a session's worker to export it (migration off a pod that is going away).
--
-- KEYS[1] session record   KEYS[2] LRU index (zset)   KEYS[3] suspending sessions (zset)
-- KEYS[4...] plan: the pod the session is placed on (see _lib.lua)
-- ARGV[1] session   ARGV[2] reason   ARGV[3] stream maxlen   ARGV[4...] plan
--
-- A `placed` session on a pod with exports=1 becomes `suspending` (it keeps its slot until mark_suspended) and its
-- pod gets a `suspend` event with `reason`; reason 'migrate' records the demand to resume it at once, so it is
-- placed again (elsewhere) as soon as it is suspended. A session already suspending is left as it is (OK, 1).
-- Returns {OK, 1} (suspending) | {OK, 0} (not placed, or its pod cannot export) | {STALE_PLAN, {pod}, {}}
local session_key = KEYS[1]
local lru_key = KEYS[2]
local suspending_key = KEYS[3]
local session = ARGV[1]
local reason = ARGV[2]
local plan = read_plan(4, 4)

local s = redis.call('HMGET', session_key, 'state', 'pod')
if s[1] == 'suspending' then
  return {OK, 1}
end
if s[1] ~= 'placed' then
  return {OK, 0}
end
local pod = s[2]
local missing = new_missing()
need_pod(plan, missing, pod)
if missing.any then
  return stale_reply(missing)
end
if redis.call('HGET', plan.pod_keys[pod], 'exports') ~= '1' then
  return {OK, 0}
end
local now = now_ms()
local demand = 0
if reason == 'migrate' then
  demand = now
end
begin_suspend(session_key, lru_key, suspending_key, plan.stream_keys[pod], ARGV[3], pod, session, reason, demand, now)
return {OK, 1}
