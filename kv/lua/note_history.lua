-- note_history.lua: the chunk boundaries the worker holding a session keeps now (issue 26), and a rewind.
--
-- KEYS[1] session record   KEYS[2] pod record
-- ARGV[1] pod   ARGV[2] pod epoch   ARGV[3] kept_chunks (ascending, comma-separated; '' = none)
-- ARGV[4] chunk_index ('' = unchanged; else the kept chunk the session was rewound to)
--
-- Only the pod incarnation the session is placed on may report it. Sets kept_chunks; with a chunk_index (a rewind)
-- also chunk_index, and forgets a periodic snapshot taken after it (a later pod loss must not bring back the world
-- the rewind left), in the same atomic step.
-- Returns {OK} | {UNKNOWN_SESSION} | {POD_FENCED, current epoch} | {SESSION_NOT_HERE, state, pod, pod_epoch}
local session_key = KEYS[1]
local pod_key = KEYS[2]

local refused, s = check_bound(session_key, pod_key, ARGV[1], tonumber(ARGV[2]), {'snapshot_chunk'})
if refused then
  return refused
end
redis.call('HSET', session_key, 'kept_chunks', ARGV[3])
if ARGV[4] ~= '' then
  local chunk_index = tonumber(ARGV[4])
  redis.call('HSET', session_key, 'chunk_index', ARGV[4])
  if (tonumber(s[4]) or 0) > chunk_index then
    redis.call('HSET', session_key, 'snapshot_location', '', 'snapshot_chunk', 0)
  end
end
return {OK}
