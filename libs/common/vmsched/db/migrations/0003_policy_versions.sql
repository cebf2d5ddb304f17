-- Every stored change of a policy is a new version, and each version's document is kept, so an
-- administrator can see what changed and go back (vmsched policy history / rollback).
ALTER TABLE policy ADD COLUMN version integer NOT NULL DEFAULT 1 CHECK (version >= 1);

CREATE TABLE policy_version (
    policy_id  uuid NOT NULL REFERENCES policy (id) ON DELETE CASCADE,
    version    integer NOT NULL CHECK (version >= 1),
    -- The policy as an administrator writes it (vmsched.contracts.PolicyDocument).
    document   jsonb NOT NULL CHECK (jsonb_typeof(document) = 'object'),
    stored_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (policy_id, version)
);
