-- Per cluster, the generation of what Redis holds for it (vmsched.store.generations): advanced each
-- time Redis is found to have forgotten the cluster, so counters issued after a loss are ordered
-- after every one issued before it. A cluster starts at 0: its stamps are the plain counters. Kept here because PostgreSQL is what survives Redis losing its data.
CREATE TABLE redis_generation (
    cluster_id  text PRIMARY KEY CHECK (length(cluster_id) BETWEEN 1 AND 256),
    generation  bigint NOT NULL CHECK (generation >= 0),
    started_at  timestamptz NOT NULL DEFAULT now()
);
