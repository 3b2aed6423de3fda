-- pgidgen catalog: one per physical database. Safe to run again (upgrades add, never drop).
-- The shard map's single source of truth is pgidgen.shards: a database serves exactly the shards whose
-- row there is 'active'. move-shard flips rows; applications read them (see pgidgen.shard_map).
CREATE SCHEMA IF NOT EXISTS pgidgen;
COMMENT ON SCHEMA pgidgen IS 'pgidgen catalog';

CREATE TABLE IF NOT EXISTS pgidgen.layout (
    singleton       boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    epoch_ms        bigint  NOT NULL,
    time_bits       integer NOT NULL,
    shard_bits      integer NOT NULL,
    sequence_bits   integer NOT NULL,
    shard_count     integer NOT NULL CHECK (shard_count > 0),
    generator       text    NOT NULL,
    pgidgen_version text    NOT NULL,
    installed_at    timestamptz NOT NULL DEFAULT now()
);
COMMENT ON TABLE pgidgen.layout IS 'The ID layout; it must never change under existing IDs.';

CREATE TABLE IF NOT EXISTS pgidgen.shards (
    shard       integer PRIMARY KEY CHECK (shard >= 0),
    schema_name name    NOT NULL UNIQUE,
    state       text    NOT NULL DEFAULT 'active' CHECK (state IN ('active', 'moving', 'retired')),
    created_at  timestamptz NOT NULL DEFAULT now(),
    updated_at  timestamptz NOT NULL DEFAULT now()
);
COMMENT ON TABLE pgidgen.shards IS 'Shards this database holds; active rows are the ones it serves.';

-- Every change to the map bumps this sequence and notifies 'pgidgen_map', so routers can cache the map.
CREATE SEQUENCE IF NOT EXISTS pgidgen.map_version;

CREATE OR REPLACE FUNCTION pgidgen.map_changed() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM pg_catalog.pg_notify('pgidgen_map', pg_catalog.nextval('pgidgen.map_version'::pg_catalog.regclass)::text);
    RETURN NULL;
END
$$;
CREATE OR REPLACE TRIGGER map_changed AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON pgidgen.shards
    FOR EACH STATEMENT EXECUTE FUNCTION pgidgen.map_changed();

CREATE OR REPLACE VIEW pgidgen.shard_map AS
    SELECT shard, schema_name, state, updated_at FROM pgidgen.shards;

-- Routers call this first in every transaction on a shard (pgidgen/routing/, docs/orm.md). For a write it
-- takes the shard's claim lock, a shared advisory lock (1885825380, -1073741824 - shard: pgidgen.idgen.LOCK_CLASS
-- and CLAIM_LOCK_BASE) held until the transaction ends, which a move's cutover takes exclusively before it
-- retires the shard here; it refuses (SQLSTATE PGR01) a shard this database does not serve. So a writing
-- transaction that passed it commits before any flip of the map on this database, or not at all.
-- The state is read after the lock, with a snapshot of its own (READ COMMITTED): a claim that waited for a flip
-- sees it. Under REPEATABLE READ or SERIALIZABLE the transaction's snapshot may be older than the lock, so the
-- row is read FOR SHARE as well, which fails (40001) if a flip changed it since. (An advisory lock, not the row
-- FOR SHARE, in the common case: no transaction ID, no WAL record, no MultiXact when many writers share it.)
-- Readers pass for_write => false: no lock, a read-only transaction, and a move under them shows as the renamed
-- schema. SECURITY DEFINER because FOR SHARE needs UPDATE on pgidgen.shards, which application roles must not
-- have; EXECUTE only for granted roles.
CREATE OR REPLACE FUNCTION pgidgen.claim_shard(shard integer, for_write boolean DEFAULT true) RETURNS name
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    st text;
    s name;
BEGIN
    -- Not STRICT: a NULL shard (an unset bind parameter) must fail (22004, not PGR01: nothing to retry elsewhere),
    -- not return NULL unchecked and unlocked.
    IF shard IS NULL THEN
        RAISE EXCEPTION 'pgidgen: claim_shard() needs a shard number, not NULL' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF for_write IS DISTINCT FROM false THEN  -- NULL claims for writing: the safe side
        PERFORM pg_catalog.pg_advisory_xact_lock_shared(1885825380, -1073741824 - shard);
        IF pg_catalog.current_setting('transaction_isolation') = 'read committed' THEN
            SELECT shards.state, shards.schema_name INTO st, s FROM pgidgen.shards WHERE shards.shard = claim_shard.shard;
        ELSE
            SELECT shards.state, shards.schema_name INTO st, s FROM pgidgen.shards WHERE shards.shard = claim_shard.shard FOR SHARE;
        END IF;
    ELSE
        SELECT shards.state, shards.schema_name INTO st, s FROM pgidgen.shards WHERE shards.shard = claim_shard.shard;
    END IF;
    IF st IS NULL THEN
        RAISE EXCEPTION 'pgidgen: shard % is not in this database', shard
            USING ERRCODE = 'PGR01', HINT = 'route by the shard map (pgidgen map); the shard may have moved';
    ELSIF st NOT IN ('active', 'moving') THEN
        RAISE EXCEPTION 'pgidgen: shard % is % in this database, it moved', shard, st
            USING ERRCODE = 'PGR01', HINT = 're-read the shard map (pgidgen map) and retry on the database that serves it';
    END IF;
    RETURN s;
END
$$;
REVOKE ALL ON FUNCTION pgidgen.claim_shard(integer, boolean) FROM PUBLIC;

-- The claim as Routers send it (pgidgen/routing/claiming.py): claim_shard's check, then search_path = path for
-- the rest of the transaction, in one CALL. A CALL is not planned, and the server looks up one routine instead of
-- two; where it must be parsed for every transaction (behind a transaction pooler, which keeps no prepared
-- statements) that is most of what the claim costs (measured with pgbench: 5-7 us of 90 a unit on 15, 3-5 on 18).
-- Not SECURITY DEFINER, and no SET search_path, unlike the catalog's other functions: setting the caller's
-- search_path is what it is for, and a SET clause would undo that when it returns. So it runs with the caller's
-- rights (SELECT on pgidgen.shards, and on pgidgen.map_version to remember, which a router reads anyway), and every
-- name and operator in it is qualified, so no schema on the caller's search_path can stand in for them. Under
-- REPEATABLE READ and SERIALIZABLE, whose FOR SHARE needs the owner's rights, it calls claim_shard itself. Same
-- lock, same refusals.
-- The session remembers a shard it found served (the setting pgidgen.served_N, session-wide: the map version it
-- was read at), and while pgidgen.map_version has not moved since, the next claim skips the row's read, which is
-- most of what is left of the claim's cost (measured: 1.13x -> 1.10x plain psycopg, one CPU, on 15). Why a
-- remembered "served" is still true: it is only written by a write claim, under the claim lock, so no change
-- taking the shard out of service was open then (claim_fence below makes every such change take the lock
-- exclusively before it commits); and every change to pgidgen.shards moves map_version (map_changed) before it
-- commits, and sequences are not transactional, so a change committed since shows as a version that moved.
-- A refusal is never remembered. A session that sets pgidgen.served_N by hand only skips its own check.
CREATE OR REPLACE PROCEDURE pgidgen.claim(shard integer, path text, for_write boolean DEFAULT true)
LANGUAGE plpgsql AS $$
DECLARE
    st pg_catalog.text;
    served pg_catalog.text;  -- the setting that remembers this shard served
    version pg_catalog.text;  -- pgidgen.map_version now (NULL before its first change: nothing is remembered)
BEGIN
    IF shard IS NULL THEN
        RAISE EXCEPTION 'pgidgen: claim() needs a shard number, not NULL' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF for_write IS NOT FALSE THEN  -- NULL claims for writing: the safe side
        IF pg_catalog.current_setting('transaction_isolation') OPERATOR(pg_catalog.<>) 'read committed' THEN
            PERFORM pgidgen.claim_shard(shard, true);
            PERFORM pg_catalog.set_config('search_path', path, true);
            RETURN;
        END IF;
        PERFORM pg_catalog.pg_advisory_xact_lock_shared(1885825380, -1073741824 OPERATOR(pg_catalog.-) shard);
    END IF;
    served := 'pgidgen.served_' OPERATOR(pg_catalog.||) shard;
    -- Only where the role may read it (SELECT on shards was all the CALL needed before): without the right 15's
    -- pg_sequence_last_value raises 42501 where 18's returns NULL; NULL here on both, and nothing is remembered.
    IF pg_catalog.has_sequence_privilege('pgidgen.map_version'::pg_catalog.regclass, 'SELECT, USAGE') THEN
        version := pg_catalog.pg_sequence_last_value('pgidgen.map_version'::pg_catalog.regclass)::pg_catalog.text;
    END IF;
    IF version IS NULL OR pg_catalog.current_setting(served, true) IS DISTINCT FROM version THEN
        SELECT shards.state INTO st FROM pgidgen.shards WHERE shards.shard OPERATOR(pg_catalog.=) claim.shard;
        IF st IS NULL THEN
            RAISE EXCEPTION 'pgidgen: shard % is not in this database', shard
                USING ERRCODE = 'PGR01', HINT = 'route by the shard map (pgidgen map); the shard may have moved';
        ELSIF st OPERATOR(pg_catalog.<>) 'active' AND st OPERATOR(pg_catalog.<>) 'moving' THEN
            RAISE EXCEPTION 'pgidgen: shard % is % in this database, it moved', shard, st
                USING ERRCODE = 'PGR01', HINT = 're-read the shard map (pgidgen map) and retry on the database that serves it';
        END IF;
        -- Not with CACHE above 1 on the version (ALTER SEQUENCE by hand): a session's nextval then takes several
        -- values at once and the later ones leave the stored last value where it was, so a change may not move it.
        -- Read here, on the way to remembering, not on the way that skips the row. (ALTER SEQUENCE waits for this
        -- transaction: pg_sequence_last_value holds the sequence in ROW EXCLUSIVE.) Only where the role may read
        -- pg_sequence (hardened databases may revoke it from PUBLIC: the claim would fail with 42501 where it passed).
        IF for_write IS NOT FALSE AND version IS NOT NULL
                AND pg_catalog.has_table_privilege('pg_catalog.pg_sequence'::pg_catalog.regclass, 'SELECT') THEN
            IF (SELECT s.seqcache FROM pg_catalog.pg_sequence s
                    WHERE s.seqrelid OPERATOR(pg_catalog.=) 'pgidgen.map_version'::pg_catalog.regclass) OPERATOR(pg_catalog.=) 1 THEN
                PERFORM pg_catalog.set_config(served, version, false);
            END IF;
        END IF;
    END IF;
    PERFORM pg_catalog.set_config('search_path', path, true);
END
$$;

-- What keeps pgidgen.claim's remembered "served" true: a change that takes shards out of service here (a row
-- leaving 'active'/'moving', deleted, or renumbered) takes their claim locks exclusively before it commits, so it
-- waits for every write that claimed them and none claims them while it is open. move-shard's cutover holds these
-- locks already (this costs it nothing); a change by hand gets the same order, TRUNCATE included. (Triggers off,
-- as with session_replication_role = replica, would skip this and map_changed: don't edit the map that way.) One
-- statement-level query over the transition rows, not a call per row, for an UPDATE of many rows: a batch's cutover
-- retires its shards in one UPDATE (retire_many_sql), and its activate makes them active in one.
CREATE OR REPLACE FUNCTION pgidgen.claim_fence() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF TG_OP = 'TRUNCATE' THEN
        PERFORM pg_catalog.pg_advisory_xact_lock(1885825380, -1073741824 - o.shard)
            FROM pgidgen.shards o WHERE o.state IN ('active', 'moving') ORDER BY o.shard;
    ELSIF TG_OP = 'DELETE' THEN
        PERFORM pg_catalog.pg_advisory_xact_lock(1885825380, -1073741824 - o.shard)
            FROM leaving o WHERE o.state IN ('active', 'moving') ORDER BY o.shard;
    ELSE
        PERFORM pg_catalog.pg_advisory_xact_lock(1885825380, -1073741824 - o.shard)
            FROM leaving o WHERE o.state IN ('active', 'moving')
              AND NOT EXISTS (SELECT FROM staying n WHERE n.shard = o.shard AND n.state IN ('active', 'moving'))
            ORDER BY o.shard;
    END IF;
    RETURN NULL;
END
$$;
CREATE OR REPLACE TRIGGER claim_fence_update AFTER UPDATE ON pgidgen.shards
    REFERENCING OLD TABLE AS leaving NEW TABLE AS staying FOR EACH STATEMENT EXECUTE FUNCTION pgidgen.claim_fence();
CREATE OR REPLACE TRIGGER claim_fence_delete AFTER DELETE ON pgidgen.shards
    REFERENCING OLD TABLE AS leaving FOR EACH STATEMENT EXECUTE FUNCTION pgidgen.claim_fence();
CREATE OR REPLACE TRIGGER claim_fence_truncate BEFORE TRUNCATE ON pgidgen.shards
    FOR EACH STATEMENT EXECUTE FUNCTION pgidgen.claim_fence();

-- Sharded DDL (pgidgen apply-ddl). ddl_files: every version of every file applied, in one global order
-- (position is the same in every database); template is the SQL for one shard with `placeholder` standing for
-- its schema, so new shards replay exactly what the others got. ddl_ledger: which shard got which file.
-- The rows of shard N: SELECT * FROM pgidgen.ddl_ledger WHERE shard = N ORDER BY position, plus the
-- pgidgen.ddl_files rows they reference (a shard move copies both; the foreign key checks they agree).
CREATE TABLE IF NOT EXISTS pgidgen.ddl_files (
    position        integer PRIMARY KEY CHECK (position > 0),
    name            text    NOT NULL,
    sha256          text    NOT NULL,
    source          text    NOT NULL,
    template        text    NOT NULL,
    placeholder     text    NOT NULL,
    pgidgen_version text    NOT NULL,
    created_at      timestamptz NOT NULL DEFAULT now(),
    UNIQUE (position, sha256)
);
COMMENT ON TABLE pgidgen.ddl_files IS 'Sharded DDL files applied (pgidgen apply-ddl), in order; the same in every database.';

CREATE TABLE IF NOT EXISTS pgidgen.ddl_ledger (
    shard      integer NOT NULL CHECK (shard >= 0),
    position   integer NOT NULL,
    sha256     text    NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (shard, position),
    FOREIGN KEY (position, sha256) REFERENCES pgidgen.ddl_files (position, sha256)
);
COMMENT ON TABLE pgidgen.ddl_ledger IS 'Which shard has which sharded DDL file (rows of shard N: WHERE shard = N).';
-- end of sharded DDL

-- ---- move-shard (pgidgen/move/) -------------------------------------------------------------------------
-- 'incoming': the target's copy of a shard while a move fills it; served by nobody until the flip.
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_constraint WHERE conrelid = 'pgidgen.shards'::regclass
                   AND conname = 'shards_state_check' AND pg_get_constraintdef(oid) LIKE '%incoming%') THEN
        ALTER TABLE pgidgen.shards DROP CONSTRAINT IF EXISTS shards_state_check;
        ALTER TABLE pgidgen.shards ADD CONSTRAINT shards_state_check
            CHECK (state IN ('active', 'moving', 'retired', 'incoming'));
    END IF;
END
$$;

-- The move journal, kept on the source database: one row per move, and every step logged before it runs.
CREATE TABLE IF NOT EXISTS pgidgen.moves (
    move_id     bigserial PRIMARY KEY,
    shard       integer NOT NULL,
    source      text    NOT NULL,
    target      text    NOT NULL,
    mode        text    NOT NULL CHECK (mode IN ('online', 'offline')),
    token       text    NOT NULL UNIQUE,
    step        text    NOT NULL,
    status      text    NOT NULL CHECK (status IN ('running', 'failed', 'done', 'rolled_back')),
    detail      jsonb   NOT NULL DEFAULT '{}',
    started_at  timestamptz NOT NULL DEFAULT now(),
    updated_at  timestamptz NOT NULL DEFAULT now(),
    finished_at timestamptz
);
CREATE UNIQUE INDEX IF NOT EXISTS moves_one_open_per_shard ON pgidgen.moves (shard) WHERE status IN ('running', 'failed');
COMMENT ON TABLE pgidgen.moves IS 'pgidgen move-shard journal: a move not done or rolled back can be resumed or rolled back.';

CREATE TABLE IF NOT EXISTS pgidgen.move_log (
    seq     bigserial PRIMARY KEY,
    move_id bigint NOT NULL REFERENCES pgidgen.moves ON DELETE CASCADE,
    step    text   NOT NULL,
    event   text   NOT NULL,
    at      timestamptz NOT NULL DEFAULT clock_timestamp(),
    detail  jsonb  NOT NULL DEFAULT '{}'
);

-- Replicated alongside a moving shard (row filter on token): the source writes a beat while the shard is frozen,
-- and once the target shows it, the target has applied every earlier change (apply is in commit order).
CREATE TABLE IF NOT EXISTS pgidgen.move_heartbeat (
    token text   NOT NULL,
    beat  bigint NOT NULL,
    at    timestamptz NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (token, beat)
);

-- The guard on every table of a retired shard copy: a write that reaches it fails loudly.
CREATE OR REPLACE FUNCTION pgidgen.refuse_write() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    RAISE EXCEPTION 'pgidgen: shard % moved to database %; this copy is retired and read-only', TG_ARGV[0], TG_ARGV[1]
        USING ERRCODE = 'read_only_sql_transaction', HINT = 'reload the shard map (pgidgen.shards) and write to the new database';
END
$$;
