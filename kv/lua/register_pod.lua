-- register_pod.lua: a worker (re)registers its pod, or renews its lease (heartbeat).
--
-- KEYS[1] pod record          KEYS[2] pod event stream     KEYS[3] pods (set)         KEYS[4] open pods (zset)
-- KEYS[5] leases (zset)       KEYS[6] draining pods (set)  KEYS[7] residents (zset)   KEYS[8] LRU index (zset)
-- KEYS[9] suspending sessions (zset)   KEYS[10] compute headroom (zset)   KEYS[11] reaped pods (zset)
-- KEYS[12...] plan: the records of the sessions the pod holds (_lib.lua)
-- ARGV[1] pod name   ARGV[2] epoch: 0 = register (mint a new epoch), else the heartbeat's epoch
-- ARGV[3] capacity   ARGV[4] endpoint   ARGV[5] lease_ms   ARGV[6] exports (1|0: the worker can export sessions)
-- ARGV[7] compute_fps (frames/s the pod may be asked for; 0 = not limited)   ARGV[8] tick_ms (its measured
-- forward time per full chunk)   ARGV[9] address (`<ip>:<port>` the front door connects to, issue 37; '' = none)
-- ARGV[10...] plan
--
-- Register mints epoch = max(now_ms, previous + 1). A heartbeat with the record's epoch renews the lease; with an
-- older epoch it is fenced; so is one whose record the operator reaped when its lease lapsed (remove_pods.lua:
-- its sessions went elsewhere, its KV is stale; epoch 0 in the reply); with a newer epoch, or when the record is
-- missing otherwise (Redis lost its data), it re-creates the record. Whenever a record is (re)created, sessions
-- bound to an earlier incarnation become `lost`, and the pod leaves the reaped index.
-- Returns {OK, epoch, outcome ('registered'|'renewed'|'recreated'), {lost sessions}}
--      or {POD_FENCED, record epoch or 0} | {CAPACITY_BELOW_USED, used} | {STALE_PLAN, {}, {sessions}}
local k = {pods_key = KEYS[3], open_key = KEYS[4], leases_key = KEYS[5], draining_key = KEYS[6],
  residents_key = KEYS[7], lru_key = KEYS[8], suspending_key = KEYS[9], headroom_key = KEYS[10],
  reaped_key = KEYS[11]}
local pod_key = KEYS[1]
local stream_key = KEYS[2]
local pod = ARGV[1]
local epoch = tonumber(ARGV[2])
local capacity = tonumber(ARGV[3])
local endpoint = ARGV[4]
local lease_ms = tonumber(ARGV[5])
local exports = ARGV[6]
local compute_fps = ARGV[7]
local tick_ms = ARGV[8]
local address = ARGV[9]
local plan = read_plan(12, 10)

local now = now_ms()
local rec = redis.call('HMGET', pod_key, 'epoch', 'used')
local previous = tonumber(rec[1])
local outcome = 'registered'

if epoch == 0 then
  epoch = math.max(now, (previous or 0) + 1)
elseif previous == nil and redis.call('ZSCORE', k.reaped_key, pod) then
  return {POD_FENCED, '0'}
elseif previous ~= nil and epoch < previous then
  return {POD_FENCED, int_text(previous)}
elseif previous == epoch then
  local used = tonumber(rec[2])
  if capacity < used then
    return {CAPACITY_BELOW_USED, used}
  end
  local lease = now + lease_ms
  redis.call('HSET', pod_key, 'capacity', capacity, 'endpoint', endpoint, 'lease_expires_ms', int_text(lease),
    'exports', exports, 'compute_fps', compute_fps, 'tick_ms', tick_ms, 'address', address)
  redis.call('ZADD', k.leases_key, int_text(lease), pod)
  refresh_open(k.open_key, k.headroom_key, pod_key, pod)
  return {OK, int_text(epoch), 'renewed', {}}
else
  outcome = 'recreated'
end

local residents = residents_of(k.residents_key, pod)
local missing = new_missing()
for _, session in ipairs(residents) do
  need_session(plan, missing, session)
end
if missing.any then
  return stale_reply(missing)
end

local lost = lose_sessions(k, plan, pod, residents)
local lease = now + lease_ms
redis.call('HSET', pod_key, 'capacity', capacity, 'used', 0, 'endpoint', endpoint, 'epoch', int_text(epoch),
  'lease_expires_ms', int_text(lease), 'draining', 0, 'exports', exports, 'compute_fps', compute_fps,
  'tick_ms', tick_ms, 'demand_fps', 0, 'address', address)
redis.call('SADD', k.pods_key, pod)
redis.call('ZADD', k.leases_key, int_text(lease), pod)
redis.call('SREM', k.draining_key, pod)
redis.call('ZREM', k.reaped_key, pod)
refresh_open(k.open_key, k.headroom_key, pod_key, pod)
-- The worker's consumer group: start from the stream's beginning so nothing posted before it is skipped.
redis.pcall('XGROUP', 'CREATE', stream_key, 'worker', '0', 'MKSTREAM')
return {OK, int_text(epoch), outcome, lost}
