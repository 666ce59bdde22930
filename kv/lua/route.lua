-- route.lua: where the front door sends a request for a session (issue 37). Read-only: the gateway runs it with
-- FCALL_RO (a `no-writes` function), one round trip per request when its plan names the pod.
--
-- KEYS[1] session record   KEYS[2] pool record   KEYS[3] leases (zset)   KEYS[4...] plan (_lib.lua)
-- ARGV[1] any_live (1: when the session holds no slot on a pod with a live lease, answer a live pod of the pool
--         instead, for the requests any pod answers)   ARGV[2...] plan
--
-- Reads the session's state, pod, pod_epoch and token_sha256; the record of the pod it holds a slot on (placed or
-- suspending), or with any_live and no such pod alive, of the live pod whose lease ends first; the server time; and
-- the pool record's CA digest (false: no pool record, the store lost its data or the pool is not served).
-- Returns {OK, {state, pod, pod_epoch, token_sha256} or false, pod name or '', POD_FIELDS values or {}, now_ms,
--          tls_ca_sha256 or false}
--      | {STALE_PLAN, {pod}, {}} (the pod to read was not declared)
local session_key = KEYS[1]
local pool_key = KEYS[2]
local leases_key = KEYS[3]
local any_live = ARGV[1] == '1'
local plan = read_plan(4, 2)

local now = now_ms()
local s = redis.call('HMGET', session_key, 'state', 'pod', 'pod_epoch', 'token_sha256')
local session = s
if s[1] == false then
  session = false
end
local pod = ''
if session and (s[1] == 'placed' or s[1] == 'suspending') and s[2] and s[2] ~= '' then
  pod = s[2]
end
if any_live and (pod == '' or not lease_live(leases_key, pod, now)) then
  local after_now = '(' .. int_text(now)
  local live = redis.call('ZRANGEBYSCORE', leases_key, after_now, '+inf', 'LIMIT', 0, 1)
  pod = live[1] or ''
end
local pod_values = {}
if pod ~= '' then
  local missing = new_missing()
  need_pod(plan, missing, pod)
  if missing.any then
    return stale_reply(missing)
  end
  pod_values = redis.call('HMGET', plan.pod_keys[pod], unpack(POD_FIELDS))
end
-- The operator writes the field with every pool record ('' for a plain pool): false only without a record.
local ca = redis.call('HGET', pool_key, 'tls_ca_sha256')
return {OK, session, pod, pod_values, int_text(now), ca}
