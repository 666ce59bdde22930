-- set_eviction.lua: the operator applies a session's changed `priority` or `evictionPolicy` (issue 40 item 4: a
-- spec walk found a placed session kept the values it was admitted with).
--
-- KEYS[1] session record   KEYS[2] LRU index (zset)
-- ARGV[1] session   ARGV[2] priority   ARGV[3] eviction_policy (LRU|Never)
--
-- Writes both to the record, whatever its state (a session placed again later is placed with its record's), and,
-- where it is placed, moves it in the LRU index: scored by the new priority and its last tick, or out of it for
-- `Never` (only placed sessions are in the index). A record that already holds them is left alone.
-- Returns {OK, 1 (written) | 0 (already so)} | {UNKNOWN_SESSION}
local session_key = KEYS[1]
local lru_key = KEYS[2]
local session = ARGV[1]

local s = redis.call('HMGET', session_key, 'state', 'pod', 'last_tick_ms', 'priority', 'eviction_policy')
if not s[1] then
  return {UNKNOWN_SESSION}
end
if s[4] == ARGV[2] and s[5] == ARGV[3] then
  return {OK, 0}
end
redis.call('HSET', session_key, 'priority', ARGV[2], 'eviction_policy', ARGV[3])
if s[1] == 'placed' then
  local member = resident(s[2], session)
  if ARGV[3] == 'LRU' then
    local score = lru_score(ARGV[2], tonumber(s[3]))
    redis.call('ZADD', lru_key, score, member)
  else
    redis.call('ZREM', lru_key, member)
  end
end
return {OK, 1}
