-- expire_suspending.lua: suspensions whose worker never reported the export (issue 12) end as evictions.
--
-- KEYS[1] open pods (zset)   KEYS[2] residents (zset)   KEYS[3] LRU index (zset)   KEYS[4] suspending sessions (zset)
-- KEYS[5] compute headroom (zset)   KEYS[6...] plan: the overdue sessions and their pods (see _lib.lua)
-- ARGV[1] timeout_ms   ARGV[2] stream maxlen   ARGV[3...] plan
--
-- While a session is `suspending` its slot stays taken and `place` evicts nobody in the pool, so a worker that never
-- reports (hung, or it lost the event) would block evictions forever. A session suspending for timeout_ms or more
-- becomes `evicted` with reset_required=1 (its KV counts as lost), its slot is freed, and its pod gets an `evict`
-- event (reason `suspend-timeout`, the epoch it was placed under) so a worker that is still alive drops it; the
-- export it may still report is refused (SESSION_NOT_HERE) and removed by that worker.
-- Returns {OK, {session...}} | {STALE_PLAN, {pod...}, {session...}}
local open_key = KEYS[1]
local residents_key = KEYS[2]
local lru_key = KEYS[3]
local suspending_key = KEYS[4]
local headroom_key = KEYS[5]
local plan = read_plan(6, 3)

local cutoff = now_ms() - tonumber(ARGV[1])
local overdue = redis.call('ZRANGE', suspending_key, '-inf', int_text(cutoff), 'BYSCORE')
local missing = new_missing()
for _, session in ipairs(overdue) do
  need_session(plan, missing, session)
end
if missing.any then
  return stale_reply(missing)
end
for _, session in ipairs(overdue) do
  local pod = redis.call('HGET', plan.session_keys[session], 'pod')
  if pod then
    need_pod(plan, missing, pod)
  end
end
if missing.any then
  return stale_reply(missing)
end

local expired = {}
for _, session in ipairs(overdue) do
  local session_key = plan.session_keys[session]
  local s = redis.call('HMGET', session_key, 'state', 'pod')
  redis.call('ZREM', suspending_key, session)
  if s[1] == 'suspending' then
    local pod = s[2]
    local pod_key = plan.pod_keys[pod]
    evict(plan, residents_key, lru_key, pod, session, ARGV[2], 'suspend-timeout')
    redis.call('HSET', session_key, 'reset_required', 1, 'chunk_index', 0, 'resume_requested_ms', 0)
    if redis.call('EXISTS', pod_key) == 1 then
      charge(pod_key, session_key, -1)
      refresh_open(open_key, headroom_key, pod_key, pod)
    end
    table.insert(expired, session)
  end
end
return {OK, expired}
