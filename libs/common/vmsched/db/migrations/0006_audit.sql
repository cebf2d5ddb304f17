-- Who changed what (issue 19): every policy version names its author, and every administrative
-- write or destructive action (policies, attachments, removals, requeued dead letters) leaves a row
-- in audit_log. Authors and actors are AMQP user names as the broker vouched for them (the
-- user_id property); versions stored before this migration, and built-ins, have none (NULL).
ALTER TABLE policy_version ADD COLUMN author text CHECK (length(author) BETWEEN 1 AND 255);

CREATE TABLE audit_log (
    id      bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at      timestamptz NOT NULL DEFAULT now(),
    actor   text NOT NULL CHECK (length(actor) BETWEEN 1 AND 255),
    -- policy.created, policy.updated, policy.cloned, policy.deleted, policy.rolled-back,
    -- cluster.attached, cluster.detached, cluster.removed, hosts.removed, dead-letters.requeued
    action  text NOT NULL CHECK (length(action) BETWEEN 1 AND 64),
    -- A policy's name, a cluster's id, or the dead-letter queue.
    target  text NOT NULL CHECK (length(target) <= 255),
    details jsonb NOT NULL DEFAULT '{}'::jsonb CHECK (jsonb_typeof(details) = 'object')
);
-- `vmsched audit` reads the newest rows, optionally one actor's or one action's.
CREATE INDEX audit_log_at ON audit_log (at DESC, id DESC);
CREATE INDEX audit_log_actor ON audit_log (actor, at DESC);
CREATE INDEX audit_log_action ON audit_log (action, at DESC);
