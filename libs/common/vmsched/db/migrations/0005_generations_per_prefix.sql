-- Generations belong to one Redis namespace (VMSCHED_REDIS_PREFIX): two deployments, or a bench run,
-- sharing one PostgreSQL under different key prefixes have clusters of the same name that are not
-- the same cluster, and one's keys being new must not read as the other's being lost.
ALTER TABLE redis_generation ADD COLUMN redis_prefix text NOT NULL DEFAULT '';
ALTER TABLE redis_generation DROP CONSTRAINT redis_generation_pkey;
ALTER TABLE redis_generation ADD PRIMARY KEY (redis_prefix, cluster_id);
