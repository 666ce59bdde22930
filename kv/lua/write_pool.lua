-- write_pool.lua: the operator's record of a pool (issue 37), written at the end of each of its rounds.
--
-- KEYS[1] pool record
-- ARGV[1] tls_ca (the PEM bundle that verifies the pool's pods over https; '' for a plain pool)
-- ARGV[2] tls_ca_sha256 (its SHA-256 hex; '' with it)
--
-- The front door reads the CA's digest with every route (the PEM once per digest), and a pool record's absence
-- tells it that the store lost its data (or that the pool is not one the operator serves).
-- Returns {OK}
redis.call('HSET', KEYS[1], 'tls_ca', ARGV[1], 'tls_ca_sha256', ARGV[2])
return {OK}
