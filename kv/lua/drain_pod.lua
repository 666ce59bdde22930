-- drain_pod.lua: stop (or resume) placing sessions on a pod.
--
-- KEYS[1] pod record   KEYS[2] open pods (zset)   KEYS[3] draining pods (set)   KEYS[4] compute headroom (zset)
-- ARGV[1] pod   ARGV[2] draining (1|0)   ARGV[3] only_if_empty (1: refuse while the pod holds a session)
--
-- Returns {OK, 1} when the flag was set, {OK, 0} when refused (the pod holds sessions), or {UNKNOWN_POD}.
local pod_key = KEYS[1]
local open_key = KEYS[2]
local draining_key = KEYS[3]
local headroom_key = KEYS[4]
local pod = ARGV[1]

local used = redis.call('HGET', pod_key, 'used')
if used == false then
  return {UNKNOWN_POD}
end
if ARGV[3] == '1' and tonumber(used) > 0 then
  return {OK, 0}
end
redis.call('HSET', pod_key, 'draining', ARGV[2])
if ARGV[2] == '1' then
  redis.call('SADD', draining_key, pod)
else
  redis.call('SREM', draining_key, pod)
end
refresh_open(open_key, headroom_key, pod_key, pod)
return {OK, 1}
