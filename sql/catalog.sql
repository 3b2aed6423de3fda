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
CREATE OR REPLACE TRIGGER map_changed AFTER INSERT OR UPDATE OR DELETE ON pgidgen.shards
    FOR EACH STATEMENT EXECUTE FUNCTION pgidgen.map_changed();

CREATE OR REPLACE VIEW pgidgen.shard_map AS
    SELECT shard, schema_name, state, updated_at FROM pgidgen.shards;
