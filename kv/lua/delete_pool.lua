-- delete_pool.lua: delete a batch of a pool's keys (the caller lists them with SCAN; all share the pool's tag).
--
-- KEYS[1...] the keys to delete
-- ARGV: none
-- Returns {OK, number of keys deleted}
return {OK, redis.call('UNLINK', unpack(KEYS))}
