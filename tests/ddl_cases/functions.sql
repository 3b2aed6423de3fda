-- A view over sharded tables, with a CTE and a pgidgen helper.
CREATE TABLE photos (id bigint PRIMARY KEY DEFAULT next_id(), user_id bigint NOT NULL);
CREATE VIEW recent_photos AS
  WITH r AS (SELECT * FROM photos ORDER BY id DESC LIMIT 10)
  SELECT r.id, pgidgen.id_time(r.id) AS created FROM r;
-- check: SELECT pg_get_viewdef('{shard}.recent_photos'::regclass) LIKE '%FROM {shard}.photos%' => True

-- A trigger with its function: the function goes into the shard, its search_path pinned.
CREATE TABLE docs (id bigint PRIMARY KEY DEFAULT next_id(), body text, updated_at timestamptz);
CREATE FUNCTION touch() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  NEW.updated_at := now();
  RETURN NEW;
END
$$;
CREATE TRIGGER docs_touch BEFORE INSERT OR UPDATE ON docs FOR EACH ROW EXECUTE FUNCTION touch();
-- check: SELECT p.pronamespace::regnamespace::text, array_to_string(p.proconfig, ';') FROM pg_proc p WHERE p.oid = '{shard}.touch()'::regprocedure => {shard}|search_path={shard}, pg_catalog, pg_temp
-- check: SELECT tgfoid::regproc::text FROM pg_trigger WHERE tgrelid = '{shard}.docs'::regclass AND tgname = 'docs_touch' => {shard}.touch
-- check: INSERT INTO {shard}.docs (body) VALUES ('x') RETURNING updated_at IS NOT NULL => True

-- A LANGUAGE sql function: its body is qualified too.
CREATE TABLE likes (id bigint PRIMARY KEY DEFAULT next_id(), photo bigint NOT NULL);
CREATE FUNCTION like_count(p bigint) RETURNS bigint LANGUAGE sql STABLE AS 'SELECT count(*) FROM likes WHERE photo = p';
-- check: SELECT prosrc FROM pg_proc WHERE oid = '{shard}.like_count(bigint)'::regprocedure => SELECT count(*) FROM {shard}.likes WHERE photo = p
-- check: SELECT {shard}.like_count(1) => 0

-- A plpgsql function finds its own shard's tables through its pinned search_path.
CREATE TABLE notes (id bigint PRIMARY KEY DEFAULT next_id());
CREATE FUNCTION note_count() RETURNS bigint LANGUAGE plpgsql STABLE AS $$ BEGIN RETURN (SELECT count(*) FROM notes); END $$;
-- check: WITH i AS (INSERT INTO {shard}.notes SELECT FROM generate_series(1, {n}) RETURNING id) SELECT count(*) FROM i => {n}
-- check: SELECT {shard}.note_count() => {n}

-- System catalogs and views stay unqualified: the shard's search_path reaches pg_catalog after the shard.
CREATE VIEW catalog_rows AS SELECT relname FROM pg_class WHERE relname = 'pg_class';
CREATE FUNCTION catalog_tables() RETURNS bigint LANGUAGE sql STABLE AS 'SELECT count(*) FROM pg_tables WHERE tablename = ''pg_class''';
-- check: SELECT relname::text FROM {shard}.catalog_rows => pg_class
-- check: SELECT {shard}.catalog_tables() => 1
