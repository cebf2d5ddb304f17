-- A weight factor is a decimal (1.5; Nova's multipliers as they are, 1000000.0 included), no longer
-- a whole number. double precision, not numeric: the code holds factors as Python floats, and
-- asyncpg moves a float8 in binary, bit for bit, so 1.5 and 0.1 read back equal to what was
-- written (policy history, diffs and "unchanged" compare documents with ==); numeric would come
-- back as Decimal and round trip through text.
-- Idempotent: re-typing a double precision column to double precision changes nothing. The bound
-- stays 0002's (contracts.base.MAX_FACTOR); NaN and infinity fail it (PostgreSQL orders NaN above
-- every number), so only finite factors can be stored.
ALTER TABLE policy_unit_link ALTER COLUMN factor TYPE double precision USING factor::double precision;
ALTER TABLE policy_unit_link ALTER COLUMN factor SET DEFAULT 1;
ALTER TABLE policy_unit_link DROP CONSTRAINT IF EXISTS policy_unit_link_factor_check;
ALTER TABLE policy_unit_link
    ADD CONSTRAINT policy_unit_link_factor_check CHECK (factor BETWEEN -1000000 AND 1000000);
