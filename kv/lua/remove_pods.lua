-- remove_pods.lua: forget pods that are gone (deleted by the operator, or whose lease expired).
--
-- KEYS[1] pods (set)   KEYS[2] open pods (zset)   KEYS[3] leases (zset)   KEYS[4] draining pods (set)
-- KEYS[5] residents (zset)   KEYS[6] LRU index (zset)   KEYS[7] suspending sessions (zset)
-- KEYS[8] compute headroom (zset)   KEYS[9] reaped pods (zset)   KEYS[10...] plan: the pods and their sessions
-- (_lib.lua)
-- ARGV[1] mode: 'expired' (every pod whose lease ended) or 'named'   ARGV[2] the pod (mode 'named')
-- ARGV[3...] plan
--
-- Each pod's record and event stream are deleted; its sessions (placed or suspending) become `lost` (records kept,
-- slots gone). An expired pod enters the reaped index, so that its incarnation's heartbeat is fenced rather than
-- re-created (register_pod.lua); entries older than REAPED_KEEP_MS go, so the index stays bounded (a pod cut off
-- longer than that is re-created as a Redis data loss would be). A named pod (deleted) leaves it.
-- Returns {OK, {pod, {sessions}, pod, {sessions}, ...}} | {STALE_PLAN, {pods}, {sessions}}
local k = {pods_key = KEYS[1], open_key = KEYS[2], leases_key = KEYS[3], draining_key = KEYS[4],
  residents_key = KEYS[5], lru_key = KEYS[6], suspending_key = KEYS[7], headroom_key = KEYS[8],
  reaped_key = KEYS[9]}
local plan = read_plan(10, 3)
local REAPED_KEEP_MS = 86400000

local targets
local expired = ARGV[1] == 'expired'
local now = now_ms()
if expired then
  targets = redis.call('ZRANGE', k.leases_key, '-inf', int_text(now), 'BYSCORE')
elseif redis.call('SISMEMBER', k.pods_key, ARGV[2]) == 1 then
  targets = {ARGV[2]}
else
  targets = {}
end

local missing = new_missing()
local residents = {}
for _, pod in ipairs(targets) do
  need_pod(plan, missing, pod)
  residents[pod] = residents_of(k.residents_key, pod)
  for _, session in ipairs(residents[pod]) do
    need_session(plan, missing, session)
  end
end
if missing.any then
  return stale_reply(missing)
end

local removed = {}
for _, pod in ipairs(targets) do
  table.insert(removed, pod)
  table.insert(removed, drop_pod(k, plan, pod, residents[pod]))
  if expired then
    redis.call('ZADD', k.reaped_key, int_text(now), pod)
  else
    redis.call('ZREM', k.reaped_key, pod)
  end
end
if expired then
  redis.call('ZREMRANGEBYSCORE', k.reaped_key, '-inf', int_text(now - REAPED_KEEP_MS))
end
return {OK, removed}
