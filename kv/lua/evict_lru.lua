-- evict_lru.lua: evict the session that place.lua would evict first, freeing its slot.
--
-- KEYS[1] open pods (zset)   KEYS[2] residents (zset)   KEYS[3] LRU index (zset)   KEYS[4] compute headroom (zset)
-- KEYS[5...] plan: the victim and its pod (see _lib.lua)
-- ARGV[1] min_idle_ms   ARGV[2] max_priority   ARGV[3] reason   ARGV[4] stream maxlen   ARGV[5...] plan
--
-- Victim: evictable (not `Never`), priority <= max_priority, idle >= min_idle_ms; lowest priority first, then
-- least recently ticked (on a repeated call: the first declared of the VICTIM_CANDIDATES best, see _lib.lua).
-- Its record becomes `evicted` (keeps its pod) and an `evict` event goes to its pod.
-- Returns {OK, victim or false, hint pod, hint session} (hint: the next victim, so the caller can declare its
-- keys next time) | {STALE_PLAN, {pod}, {session}}
local open_key = KEYS[1]
local residents_key = KEYS[2]
local lru_key = KEYS[3]
local headroom_key = KEYS[4]
local plan = read_plan(5, 5)

local function any_pod()
  return true
end
local max_priority = tonumber(ARGV[2])
local cutoff_ms = now_ms() - tonumber(ARGV[1])
local victims = find_victims(lru_key, max_priority, cutoff_ms, any_pod, plan.retry and VICTIM_CANDIDATES or 1)
if #victims == 0 then
  return {OK, false, false, false}
end
local missing = new_missing()
local chosen = first_declared(plan, missing, victims)
if chosen == nil then
  return stale_reply(missing)
end
local pod, victim = chosen[1], chosen[2]
local pod_key = plan.pod_keys[pod]
evict(plan, residents_key, lru_key, pod, victim, ARGV[4], ARGV[3])
charge(pod_key, plan.session_keys[victim], -1)
refresh_open(open_key, headroom_key, pod_key, pod)
local hint = find_victims(lru_key, max_priority, cutoff_ms, any_pod, 1)[1] or {false, false}
return {OK, victim, hint[1], hint[2]}
