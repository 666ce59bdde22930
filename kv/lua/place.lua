-- place.lua: give a session a slot (idempotent), evicting the least recently ticked session if allowed.
--
-- KEYS[1] session record   KEYS[2] open pods (zset)   KEYS[3] leases (zset)   KEYS[4] draining pods (set)
-- KEYS[5] residents (zset) KEYS[6] LRU index (zset)   KEYS[7] suspending sessions (zset)
-- KEYS[8] compute headroom (zset)   KEYS[9...] plan: chosen pod and victim (see _lib.lua)
-- ARGV[1] session   ARGV[2] pool   ARGV[3] token_sha256   ARGV[4] seed   ARGV[5] prompt   ARGV[6] image
-- ARGV[7] max_chunks   ARGV[8] priority   ARGV[9] eviction_policy (LRU|Never)   ARGV[10] playout_fps
-- ARGV[11] playout_buffer_chunks   ARGV[12] history_keep_chunks   ARGV[13] fork_from ('' | kept:<pod>/<s>/<chunk>)
-- ARGV[14] may_evict (1|0)   ARGV[15] min_idle_ms   ARGV[16] policy (least-loaded|pack)   ARGV[17] stream maxlen
-- ARGV[18] prefer_pod ('' = none)   ARGV[19...] plan
--
-- A placed session is returned as is. Otherwise: prefer_pod when it takes the session by every rule below (live,
-- open, compute), else the live, non-draining pod with a free slot that the policy prefers (least-loaded: lowest
-- used/capacity; pack: highest). With no such pod, a first admission (no record,
-- or `closed`) or a `lost` session (its pod died under it) called with may_evict=1 evicts the session with the
-- lowest priority (<= its own), then the least recently ticked, idle >= min_idle_ms, never `Never`, on a live
-- non-draining pod, and takes its slot; the victim's record becomes `evicted` (it keeps its pod) and an `evict`
-- event goes to that pod's stream. `evicted` sessions take free slots only (a victim never evicts in turn);
-- `evicted`/`lost` sessions come back with reset_required=1.
-- Issue 12 (suspension): a victim on a pod that exports (`exports=1`) is not evicted but becomes `suspending`: it
-- keeps its slot until its worker has written the export (mark_suspended), its pod gets a `suspend` event (reason
-- `evicted`), and this session is NOT placed now (outcome 'suspending'; the caller places it again once the slot is
-- free). While any session of the pool is suspending, nobody is evicted (a slot is about to free up: no cascade).
-- A `suspended` session (placed only on demand) may evict like a first admission and comes back with
-- resume_from = its export's location and chunk_index = suspended_chunk; a `lost` one comes back from the export it
-- had not imported yet (resume_from still set), else from its latest snapshot (snapshot_chunk), with
-- reset_required=0 — reset_required=1 only when it has neither. A `suspending` session stays where it is (pending).
-- Issue 26 (fork): a first admission with fork_from comes back with resume_from = fork_from and chunk_index = its
-- chunk, reset_required=0 (its worker imports the kept chunk before the first tick); fork_from never becomes the
-- record's location or tier.
-- Preferences yield to progress: when the call repeats after STALE_PLAN and the preferred pod or victim changed
-- again meanwhile (concurrent placers), the best declared pod, or the first declared victim among the
-- VICTIM_CANDIDATES best, is taken; the rules (live, not draining, free slot; priority bound, idle time, never `Never`) always hold.
-- Issue 25 (compute): a pod is taken only if the session *fits*: it is open (not draining, a free slot, and
-- demand_fps < compute_fps where compute_fps > 0) and demand_fps + the session's playout_fps <= compute_fps
-- (compute_fps = 0: KV slots only), or it has no demand yet (an empty pod takes any one session). Pods that do not fit are skipped like expired leases. A victim's pod must fit
-- once the victim's demand leaves it (the first victim in LRU order is checked; if it does not, nobody is
-- evicted and the session waits for compute). The session's playout_fps joins its pod's demand_fps atomically
-- with `used` (an idle session's demand counts in full while it holds a slot).
-- Returns {OK, outcome ('placed'|'already'|'pending'|'suspending'), pod, pod_epoch, endpoint, reset_required,
--          victim, hint pod, hint victim pod, hint victim session, resume_from, pending_reason} (hints: the
--          pods/sessions the next call will likely need; pending_reason: '' unless pending, 'compute' when some
--          live non-draining pod had a free slot but no compute for this session, else 'capacity'),
--          then what the caller's status needs, so that it reads nothing after the call: the session's binding
--          fields after it (false each where the record lacks it), the POD_FIELDS of the pod it holds a slot
--          on ({} unless placed or suspending) and the server time in ms
--       or {STALE_PLAN, {pods}, {sessions}}
local session_key = KEYS[1]
local open_key = KEYS[2]
local leases_key = KEYS[3]
local draining_key = KEYS[4]
local residents_key = KEYS[5]
local lru_key = KEYS[6]
local suspending_key = KEYS[7]
local headroom_key = KEYS[8]
local session = ARGV[1]
local fps = tonumber(ARGV[10])
local priority = tonumber(ARGV[8])
local fork_from = ARGV[13]
local may_evict = ARGV[14] == '1'
local min_idle_ms = tonumber(ARGV[15])
local pack = ARGV[16] == 'pack'
local stream_maxlen = ARGV[17]
local prefer_pod = ARGV[18]
local plan = read_plan(9, 19)
local missing = new_missing()

local now = now_ms()
local function placeable(pod)
  return lease_live(leases_key, pod, now) and redis.call('SISMEMBER', draining_key, pod) == 0
end

-- Open, live, and with compute for this session.
local function takes(pod)
  return lease_live(leases_key, pod, now) and fits(headroom_key, pod, fps)
end

-- The first pod in `open_key` in policy order that `takes` this session (pods there are non-draining with a
-- free slot and compute left).
local function preferred_pod()
  local start = 0
  while true do
    local batch
    if pack then
      batch = redis.call('ZRANGE', open_key, start, start + SCAN_BATCH - 1, 'REV', 'WITHSCORES')
    else
      batch = redis.call('ZRANGE', open_key, start, start + SCAN_BATCH - 1, 'WITHSCORES')
    end
    for i = 1, #batch, 2 do
      if takes(batch[i]) then
        return batch[i], batch[i + 1]
      end
    end
    if #batch < 2 * SCAN_BATCH then
      return nil
    end
    start = start + SCAN_BATCH
  end
end

-- Up to `limit` pods of `open_key` that take this session, in policy order.
local function open_pods(limit)
  local found, start = {}, 0
  while #found < limit do
    local batch
    if pack then
      batch = redis.call('ZRANGE', open_key, start, start + SCAN_BATCH - 1, 'REV')
    else
      batch = redis.call('ZRANGE', open_key, start, start + SCAN_BATCH - 1)
    end
    for i = 1, #batch do
      if #found < limit and takes(batch[i]) then
        table.insert(found, batch[i])
      end
    end
    if #batch < SCAN_BATCH then
      return found
    end
    start = start + SCAN_BATCH
  end
  return found
end

local function preferred_load(a, b)
  if pack then
    return a > b
  end
  return a < b
end

-- prefer_pod if it takes this session; else the preferred pod; or a declared one with the same load (saves a round
-- trip on ties); or, on a retry, the declared pod the policy prefers among those still open.
local function choose_pod()
  if prefer_pod ~= '' and redis.call('ZSCORE', open_key, prefer_pod) ~= false and takes(prefer_pod) then
    return prefer_pod
  end
  local best, load = preferred_pod()
  if best == nil or plan.pod_keys[best] ~= nil then
    return best
  end
  local fallback, fallback_load = nil, nil
  for pod, _ in pairs(plan.pod_keys) do
    local score = redis.call('ZSCORE', open_key, pod)
    if score ~= false and takes(pod) then
      if score == load then
        return pod
      end
      if plan.retry and (fallback == nil or preferred_load(tonumber(score), fallback_load)) then
        fallback, fallback_load = pod, tonumber(score)
      end
    end
  end
  if fallback == nil and plan.retry then
    -- Every declared pod filled up meanwhile: concurrent placers herd to the same least-loaded pods of a nearly
    -- full pool. Declare several open pods at once, so that the next attempt can take whichever is left.
    for _, pod in ipairs(open_pods(POD_CANDIDATES)) do
      need_pod(plan, missing, pod)
    end
  end
  return fallback or best
end

-- Whether this session fits on `pod_key` once `victim_key`'s demand leaves it.
local function fits_instead_of(pod_key, victim_key)
  local p = redis.call('HMGET', pod_key, 'compute_fps', 'demand_fps')
  local compute = tonumber(p[1]) or 0
  local left = (tonumber(p[2]) or 0) - (tonumber(redis.call('HGET', victim_key, 'playout_fps')) or 0)
  return compute == 0 or left <= FPS_EPSILON or left + fps <= compute + FPS_EPSILON
end

-- An OK reply with the session's binding, the record of the pod it holds a slot on, and the time appended.
local function answer(reply)
  local binding = redis.call('HMGET', session_key, unpack(BINDING_FIELDS))
  local held_pod = binding[2]
  local pod_record = {}
  if (binding[1] == 'placed' or binding[1] == 'suspending') and plan.pod_keys[held_pod] then
    local held_pod_key = plan.pod_keys[held_pod]
    pod_record = redis.call('HMGET', held_pod_key, unpack(POD_FIELDS))
  end
  table.insert(reply, binding)
  table.insert(reply, pod_record)
  table.insert(reply, now)
  return reply
end

local function hints()
  local pod = preferred_pod()
  if pod ~= nil then
    return pod, false, false
  end
  local victim = find_victims(lru_key, priority, now - min_idle_ms, placeable, 1)[1] or {false, false}
  return false, victim[1], victim[2]
end

local function pending(reason)
  local hint_pod, hint_victim_pod, hint_victim = hints()
  return answer({OK, 'pending', false, false, false, 0, false, hint_pod, hint_victim_pod, hint_victim, '', reason})
end

local s = redis.call('HMGET', session_key, 'state', 'pod', 'pod_epoch', 'reset_required', 'location',
  'suspended_chunk', 'resume_from', 'snapshot_location', 'snapshot_chunk', 'chunk_index')
if s[1] == 'placed' then
  need_pod(plan, missing, s[2])
  if missing.any then
    return stale_reply(missing)
  end
  local endpoint = redis.call('HGET', plan.pod_keys[s[2]], 'endpoint')
  return answer({OK, 'already', s[2], s[3], endpoint or '', tonumber(s[4]) or 0, false, false, false, false,
    s[7] or '', ''})
end
if s[1] == 'suspending' then  -- it still holds its slot on its pod until the export is written
  need_pod(plan, missing, s[2])
  if missing.any then
    return stale_reply(missing)
  end
  return answer({OK, 'pending', false, false, false, 0, false, false, false, false, '', 'capacity'})
end
local first_admission = s[1] == false or s[1] == 'closed'
local may_take_slot = (first_admission or s[1] == 'lost' or s[1] == 'suspended')
  and redis.call('ZCARD', suspending_key) == 0

local pod = choose_pod()
local victim = false
if pod == nil and may_take_slot and may_evict then
  local limit = plan.retry and VICTIM_CANDIDATES or 1
  local chosen = first_declared(plan, missing, find_victims(lru_key, priority, now - min_idle_ms, placeable, limit))
  if chosen ~= nil then
    pod, victim = chosen[1], chosen[2]
  end
elseif pod ~= nil then
  need_pod(plan, missing, pod)
end
if missing.any then
  return stale_reply(missing)
end
if pod == nil then
  return pending(compute_bound(headroom_key, leases_key, fps, now) and 'compute' or 'capacity')
end

local pod_key = plan.pod_keys[pod]
if victim and not fits_instead_of(pod_key, plan.session_keys[victim]) then
  return pending('compute')
end
local p = redis.call('HMGET', pod_key, 'epoch', 'endpoint')
if victim and redis.call('HGET', pod_key, 'exports') == '1' then
  begin_suspend(plan.session_keys[victim], lru_key, suspending_key, plan.stream_keys[pod], stream_maxlen, pod, victim,
    'evicted', 0, now)
  return answer({OK, 'suspending', false, false, false, 0, victim, false, false, false, '', ''})
end
if victim then
  evict(plan, residents_key, lru_key, pod, victim, stream_maxlen, 'evicted for ' .. session)
  charge(pod_key, plan.session_keys[victim], -1)
end
local reset_required, chunk_index, resume_from = 0, 0, ''
if first_admission then
  forget_exports(session_key)
  if fork_from ~= '' then
    resume_from, chunk_index = fork_from, tonumber(string.match(fork_from, '/(%d+)$'))
  end
elseif s[1] == 'suspended' then
  resume_from, chunk_index = s[5] or '', tonumber(s[6]) or 0
elseif s[1] == 'lost' and (s[7] or '') ~= '' then  -- placed from an export it never imported: import it now
  resume_from, chunk_index = s[7], tonumber(s[10]) or 0
elseif s[1] == 'lost' and (s[8] or '') ~= '' then
  resume_from, chunk_index = s[8], tonumber(s[9]) or 0
else  -- evicted, or lost without a snapshot: a new world
  reset_required = 1
  forget_exports(session_key)
end
bind(session_key, residents_key, lru_key, session, pod, p[1], chunk_index, reset_required, now)
redis.call('HSET', session_key, 'resume_from', resume_from, 'resume_requested_ms', 0)
charge(pod_key, session_key, 1)
refresh_open(open_key, headroom_key, pod_key, pod)
local hint_pod, hint_victim_pod, hint_victim = hints()
return answer({OK, 'placed', pod, p[1], p[2], reset_required, victim, hint_pod, hint_victim_pod, hint_victim,
  resume_from, ''})
