-- evict_lru.lua: evict the session that place.lua would evict first, freeing its slot.
--
-- KEYS[1] open pods (zset)   KEYS[2] residents (zset)   KEYS[3] LRU index (zset)
-- KEYS[4...] plan: the victim and its pod (see _lib.lua)
-- ARGV[1] min_idle_ms   ARGV[2] max_priority   ARGV[3] reason   ARGV[4] stream maxlen   ARGV[5...] plan
--
-- Victim: evictable (not `Never`), priority <= max_priority, idle >= min_idle_ms; lowest priority first, then
-- least recently ticked. Its record becomes `evicted` (keeps its pod) and an `evict` event goes to its pod.
-- Returns {OK, victim or false, hint pod, hint session} (hint: the next victim, so the caller can declare its
-- keys next time) | {STALE_PLAN, {pod}, {session}}
local open_key = KEYS[1]
local residents_key = KEYS[2]
local lru_key = KEYS[3]
local plan = read_plan(4, 5)

local function any_pod()
  return true
end
local max_priority = tonumber(ARGV[2])
local cutoff_ms = now_ms() - tonumber(ARGV[1])
local pod, victim = find_victim(lru_key, max_priority, cutoff_ms, any_pod)
if pod == nil then
  return {OK, false, false, false}
end
local missing = new_missing()
need_pod(plan, missing, pod)
need_session(plan, missing, victim)
if missing.any then
  return stale_reply(missing)
end
local victim_key = plan.session_keys[victim]
local pod_key = plan.pod_keys[pod]
local victim_epoch = redis.call('HGET', victim_key, 'pod_epoch')
unbind(victim_key, residents_key, lru_key, pod, victim, 'evicted')
redis.call('HINCRBY', pod_key, 'used', -1)
refresh_open(open_key, pod_key, pod)
post_event(plan.stream_keys[pod], ARGV[4], 'evict', victim, ARGV[3], victim_epoch)
local hint_pod, hint_session = find_victim(lru_key, max_priority, cutoff_ms, any_pod)
return {OK, victim, hint_pod or false, hint_session or false}
