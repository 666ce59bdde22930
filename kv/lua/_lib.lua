-- _lib.lua: helpers shared by the placement operations. kv/scripts.py (`library_source`) puts this file once in
-- the store's Redis function library, after the tables BINDING_FIELDS and POD_FIELDS it generates from
-- SessionBinding.FIELDS and PodRecord.FIELDS and before the operations, each the body of one function (ONE
-- atomic call). Defined once, at FUNCTION LOAD; KEYS and ARGV are the running call's, set by its callback.
--
-- No key is ever built here: every key name arrives through KEYS, either as a fixed pool key or in the call's
-- *plan* (the per-pod and per-session keys the caller declared up front, as Redis Cluster requires).
-- Key variables end in `_key`, key tables in `_keys`; tests/kv/test_placement_lua.py checks both rules.

-- Status codes: kv/errors.py (ScriptStatus) maps them to typed exceptions.
local OK = 0
local STALE_PLAN = 1
local POD_FENCED = 2
local SESSION_NOT_HERE = 3
local UNKNOWN_SESSION = 4
local UNKNOWN_POD = 5
local CAPACITY_BELOW_USED = 6

-- LRU score = priority * 2^42 + last_tick_ms: one sorted set orders sessions by priority, then by last tick.
-- 2^42 ms lasts until 2109 and 1000 * 2^42 < 2^53, so scores stay exact doubles.
local PRIORITY_SCALE = 4398046511104
local SCAN_BATCH = 16
-- Slack in compute comparisons: `demand_fps` is a running float sum (HINCRBYFLOAT), so an exact fit may read
-- back a hair over.
local FPS_EPSILON = 1e-6
-- The headroom an empty compute-limited pod is indexed with: it takes any one session, even one whose
-- playout_fps exceeds its whole compute_fps (played as fast as the pod can, rather than never placed).
local EMPTY_POD_HEADROOM = 1e12

local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- Exact decimal text for integral doubles (tostring would switch to %.14g and lose digits).
local function int_text(n)
  return string.format('%.0f', n)
end

-- Sorted-set member naming one session on one pod: `<pod>/<session>` (names are DNS labels, never contain '/').
local function resident(pod, session)
  return pod .. '/' .. session
end

local function split_resident(member)
  local slash = string.find(member, '/', 1, true)
  return string.sub(member, 1, slash - 1), string.sub(member, slash + 1)
end

-- Sessions that `residents_key` lists for `pod`: a lexicographic range over `<pod>/...`.
local function residents_of(residents_key, pod)
  local members = redis.call('ZRANGE', residents_key, '[' .. pod .. '/', '[' .. pod .. '/\255', 'BYLEX')
  local sessions = {}
  for i, member in ipairs(members) do
    local _, session = split_resident(member)
    sessions[i] = session
  end
  return sessions
end

-- The plan: ARGV[first_arg] = 1 when this call repeats one that answered STALE_PLAN, ARGV[first_arg + 1] = number
-- of pods P, ARGV[first_arg + 2] = number of sessions S, then P pod names and S session names; KEYS from
-- first_key: per pod (record, event stream), then per session (record).
local function read_plan(first_key, first_arg)
  local plan = {pod_keys = {}, stream_keys = {}, session_keys = {}, retry = ARGV[first_arg] == '1'}
  local n_pods = tonumber(ARGV[first_arg + 1])
  local n_sessions = tonumber(ARGV[first_arg + 2])
  local k = first_key
  local a = first_arg + 3
  for _ = 1, n_pods do
    plan.pod_keys[ARGV[a]] = KEYS[k]
    plan.stream_keys[ARGV[a]] = KEYS[k + 1]
    k = k + 2
    a = a + 1
  end
  for _ = 1, n_sessions do
    plan.session_keys[ARGV[a]] = KEYS[k]
    k = k + 1
    a = a + 1
  end
  return plan
end

-- Collects the pods and sessions a call needs but did not declare; `stale_reply` asks the caller to retry
-- with them. Nothing has been written when a script returns it.
local function new_missing()
  return {pods = {}, sessions = {}, any = false}
end

local function need_pod(plan, missing, pod)
  if plan.pod_keys[pod] == nil then
    table.insert(missing.pods, pod)
    missing.any = true
  end
end

local function need_session(plan, missing, session)
  if plan.session_keys[session] == nil then
    table.insert(missing.sessions, session)
    missing.any = true
  end
end

local function stale_reply(missing)
  return {STALE_PLAN, missing.pods, missing.sessions}
end

-- A pod accepts placements iff it is not draining, has a free slot and, when its compute is limited
-- (compute_fps > 0), demand_fps < compute_fps; `open_key` holds exactly those pods, scored by load:
-- max(used / capacity, demand_fps / compute_fps). `headroom_key` holds the compute-limited pods that are not
-- draining and have a free slot, scored compute_fps - demand_fps (whether a session's playout_fps fits, and
-- whether a pending session waits for compute rather than for a slot). Lease expiry is checked at use.
local function refresh_open(open_key, headroom_key, pod_key, pod)
  local rec = redis.call('HMGET', pod_key, 'capacity', 'used', 'draining', 'compute_fps', 'demand_fps')
  local capacity = tonumber(rec[1]) or 0
  local used = tonumber(rec[2]) or 0
  local compute = tonumber(rec[4]) or 0
  local demand = tonumber(rec[5]) or 0
  local has_slot = rec[3] == '0' and used < capacity
  if has_slot and compute > 0 then
    redis.call('ZADD', headroom_key, demand <= FPS_EPSILON and EMPTY_POD_HEADROOM or compute - demand, pod)
  else
    redis.call('ZREM', headroom_key, pod)
  end
  if has_slot and (compute == 0 or demand < compute) then
    local load = used / capacity
    if compute > 0 then
      load = math.max(load, demand / compute)
    end
    redis.call('ZADD', open_key, load, pod)
  else
    redis.call('ZREM', open_key, pod)
  end
end

-- A session takes (+1) or gives back (-1) a slot of its pod: `used` and `demand_fps` (the sum of the playout_fps
-- of the sessions holding the pod's slots) change together, in the same script. The session record's
-- playout_fps is only written while it holds no slot (place, restore), so what is given back is what was taken.
-- demand_fps is set to exactly 0 when used is (no float residue survives an empty pod). The caller refreshes the
-- open index.
local function charge(pod_key, session_key, delta)
  local used = redis.call('HINCRBY', pod_key, 'used', delta)
  local fps = tonumber(redis.call('HGET', session_key, 'playout_fps')) or 0
  if used == 0 then
    redis.call('HSET', pod_key, 'demand_fps', 0)
  elseif fps > 0 then
    redis.call('HINCRBYFLOAT', pod_key, 'demand_fps', string.format('%.17g', delta * fps))
  end
end

local function lease_live(leases_key, pod, now)
  local expires = redis.call('ZSCORE', leases_key, pod)
  return expires ~= false and tonumber(expires) > now
end

-- Whether pod `pod` of the open index has compute for one more session at `fps` (a pod absent from
-- `headroom_key` is not compute-limited).
local function fits(headroom_key, pod, fps)
  local headroom = redis.call('ZSCORE', headroom_key, pod)
  return headroom == false or (fps <= tonumber(headroom) + FPS_EPSILON)
end

-- Whether some live pod has a free slot but no compute for one more session at `fps`: the session waits for
-- compute, not for a slot. Bounded batches over `headroom_key`, lowest headroom first.
local function compute_bound(headroom_key, leases_key, fps, now)
  local start = 0
  while true do
    local batch = redis.call('ZRANGE', headroom_key, start, start + SCAN_BATCH - 1, 'WITHSCORES')
    for i = 1, #batch, 2 do
      local headroom = tonumber(batch[i + 1])
      if headroom > 0 and fps <= headroom + FPS_EPSILON then
        return false  -- every further pod has at least this much headroom: the rest fit (or are dead)
      end
      if lease_live(leases_key, batch[i], now) then
        return true
      end
    end
    if #batch < 2 * SCAN_BATCH then
      return false
    end
    start = start + SCAN_BATCH
  end
end

local function lru_score(priority, last_tick_ms)
  return int_text(tonumber(priority) * PRIORITY_SCALE + last_tick_ms)
end

local function post_event(stream_key, maxlen, kind, session, reason, epoch)
  redis.call('XADD', stream_key, 'MAXLEN', '~', maxlen, '*',
    'kind', kind, 'session', session, 'reason', reason, 'epoch', epoch)
end

-- The session loses its slot: it leaves the resident and LRU indexes and its record gets `state`.
local function unbind(session_key, residents_key, lru_key, pod, session, state)
  local member = resident(pod, session)
  redis.call('ZREM', residents_key, member)
  redis.call('ZREM', lru_key, member)
  redis.call('HSET', session_key, 'state', state)
end

-- The evictable sessions to evict first, at most `limit`, best first: lowest priority level (<= max_priority)
-- first, then least recently ticked; idle since `cutoff_ms` or earlier; on a pod `accept(pod)` approves. One
-- range query per priority level present, plus one per batch of rejected candidates. Returns {{pod, session}...}.
local function find_victims(lru_key, max_priority, cutoff_ms, accept, limit)
  local found = {}
  local floor = 0
  while cutoff_ms >= 0 do
    local first = redis.call('ZRANGE', lru_key, int_text(floor), '+inf', 'BYSCORE', 'LIMIT', 0, 1, 'WITHSCORES')
    if #first == 0 then
      break
    end
    local level = math.floor(tonumber(first[2]) / PRIORITY_SCALE)
    if level > max_priority then
      break
    end
    local base = level * PRIORITY_SCALE
    local offset = 0
    while true do
      local batch = redis.call('ZRANGE', lru_key, int_text(base), int_text(base + cutoff_ms), 'BYSCORE',
        'LIMIT', offset, SCAN_BATCH)
      for _, member in ipairs(batch) do
        local pod, session = split_resident(member)
        if accept(pod) then
          table.insert(found, {pod, session})
          if #found == limit then
            return found
          end
        end
      end
      if #batch < SCAN_BATCH then
        break
      end
      offset = offset + SCAN_BATCH
    end
    floor = base + PRIORITY_SCALE
  end
  return found
end

-- How many victims a repeated call considers: every concurrent placer wants the same few victims, so a call that
-- answered STALE_PLAN takes the first declared one among this many best rather than insisting on the very best.
local VICTIM_CANDIDATES = 8
-- Likewise for pods: a repeated call whose declared pods all filled up meanwhile declares this many open ones.
local POD_CANDIDATES = 16

-- The first candidate {pod, session} whose keys the call declared; else nil, with every candidate in `missing`.
local function first_declared(plan, missing, candidates)
  for _, candidate in ipairs(candidates) do
    if plan.pod_keys[candidate[1]] ~= nil and plan.session_keys[candidate[2]] ~= nil then
      return candidate
    end
  end
  for _, candidate in ipairs(candidates) do
    need_pod(plan, missing, candidate[1])
    need_session(plan, missing, candidate[2])
  end
  return nil
end

-- Unbind `sessions` (the residents of `pod`, placed or suspending) as `lost`; their records stay for the
-- operator. A suspending one whose export never completed leaves the suspending index.
local function lose_sessions(k, plan, pod, sessions)
  for _, session in ipairs(sessions) do
    unbind(plan.session_keys[session], k.residents_key, k.lru_key, pod, session, 'lost')
    redis.call('ZREM', k.suspending_key, session)
  end
  return sessions
end

-- Evict `victim` from `pod`, telling the pod through its stream (with the epoch the victim was placed under).
local function evict(plan, residents_key, lru_key, pod, victim, stream_maxlen, reason)
  local victim_key = plan.session_keys[victim]
  local victim_epoch = redis.call('HGET', victim_key, 'pod_epoch')
  unbind(victim_key, residents_key, lru_key, pod, victim, 'evicted')
  post_event(plan.stream_keys[pod], stream_maxlen, 'evict', victim, reason, victim_epoch)
end

-- Forget pod `pod` and everything bound to it (`residents`, read while planning): its sessions become `lost`.
local function drop_pod(k, plan, pod, residents)
  local lost = lose_sessions(k, plan, pod, residents)
  redis.call('DEL', plan.pod_keys[pod], plan.stream_keys[pod])
  redis.call('SREM', k.pods_key, pod)
  redis.call('ZREM', k.open_key, pod)
  redis.call('ZREM', k.headroom_key, pod)
  redis.call('ZREM', k.leases_key, pod)
  redis.call('SREM', k.draining_key, pod)
  return lost
end

-- Reads the session record (state, pod, pod_epoch, then `extra` fields) and checks that pod `pod` at `epoch`
-- holds it. Returns nil and the fields, or the reply to return: an older incarnation of the pod is fenced.
local function check_bound(session_key, pod_key, pod, epoch, extra)
  local s = redis.call('HMGET', session_key, 'state', 'pod', 'pod_epoch', unpack(extra))
  if s[1] == false then
    return {UNKNOWN_SESSION}
  end
  local pod_epoch = tonumber(redis.call('HGET', pod_key, 'epoch'))
  if pod_epoch ~= nil and epoch < pod_epoch then
    return {POD_FENCED, int_text(pod_epoch)}
  end
  local session_epoch = tonumber(s[3]) or 0
  if s[2] == pod and epoch < session_epoch then
    return {POD_FENCED, int_text(session_epoch)}
  end
  -- A suspending session is still bound: the tick it had in flight when its suspension began finishes (and
  -- touches it) before its worker writes the export.
  if (s[1] ~= 'placed' and s[1] ~= 'suspending') or s[2] ~= pod or session_epoch ~= epoch then
    return {SESSION_NOT_HERE, s[1], s[2], int_text(session_epoch)}
  end
  return nil, s
end

-- Issue 12: the fields of an export (suspension) and of a periodic snapshot, cleared when a session starts a new
-- world (first admission, reset); with them the chunks its worker keeps (issue 26).
local function forget_exports(session_key)
  redis.call('HSET', session_key, 'tier', '', 'location', '', 'bytes', 0, 'suspended_chunk', 0,
    'resume_requested_ms', 0, 'resume_from', '', 'snapshot_location', '', 'snapshot_chunk', 0, 'kept_chunks', '')
end

-- Marks a placed session `suspending`: it keeps its pod, its slot and its resident entry, leaves the LRU index
-- (no one picks it as a victim again), joins the suspending index, and its pod gets a `suspend` event with the
-- epoch it was placed under. `demand_ms` > 0 (migration) asks for it to be placed again as soon as it is
-- suspended; 0 (eviction) waits for a tick.
local function begin_suspend(session_key, lru_key, suspending_key, stream_key, stream_maxlen, pod, session, reason,
                             demand_ms, now)
  local epoch = redis.call('HGET', session_key, 'pod_epoch')
  redis.call('ZREM', lru_key, resident(pod, session))
  redis.call('ZADD', suspending_key, int_text(now), session)
  redis.call('HSET', session_key, 'state', 'suspending', 'resume_requested_ms', int_text(demand_ms))
  post_event(stream_key, stream_maxlen, 'suspend', session, reason, epoch)
end

-- Writes a session record's spec (from ARGV[2..13] = pool, token_sha256, seed, prompt, image, max_chunks,
-- priority, eviction_policy, playout_fps, playout_buffer_chunks, history_keep_chunks, fork_from: the layout
-- place.lua and restore.lua share), where it is, and how far it ticked. A new binding keeps no chunks yet (issue 26:
-- kept chunks live in one pod's memory; its worker reports them with note_history).
local function write_record(session_key, state, pod, pod_epoch, chunk_index, reset_required, now)
  redis.call('HSET', session_key, 'pool', ARGV[2], 'pod', pod, 'pod_epoch', pod_epoch, 'state', state,
    'token_sha256', ARGV[3], 'seed', ARGV[4], 'prompt', ARGV[5], 'image', ARGV[6], 'reset_required', reset_required,
    'max_chunks', ARGV[7], 'priority', ARGV[8], 'eviction_policy', ARGV[9], 'chunk_index', chunk_index,
    'last_tick_ms', int_text(now), 'playout_fps', ARGV[10], 'playout_buffer_chunks', ARGV[11],
    'history_keep_chunks', ARGV[12], 'fork_from', ARGV[13], 'kept_chunks', '')
  redis.call('PERSIST', session_key)
end

-- Binds a session to `pod`: its record (`write_record`) and its index entries. The caller accounts for the
-- pod's `used`.
local function bind(session_key, residents_key, lru_key, session, pod, pod_epoch, chunk_index, reset_required, now)
  write_record(session_key, 'placed', pod, pod_epoch, chunk_index, reset_required, now)
  redis.call('ZADD', residents_key, 0, resident(pod, session))
  if ARGV[9] == 'LRU' then
    redis.call('ZADD', lru_key, lru_score(ARGV[8], now), resident(pod, session))
  end
end

-- Operation script follows.
