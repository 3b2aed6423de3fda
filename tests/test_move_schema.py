"""What a shard's schema may hold and what may happen to it mid-move: DDL before the flip, objects outside the
shard depending on it or used by it, roles and grants, the DDL ledger."""
from __future__ import annotations

import time
from pathlib import Path

import psycopg
import pytest
from click.testing import CliRunner
from movekit import leftovers
from moveshards import SHARDS, open_moves, our_children, quick_subscription_start, rows_of, setup_shards, state_of  # noqa: F401 (an autouse fixture)

from pgidgen.cli import main
from pgidgen.config import Config
from pgidgen.init import init
from pgidgen.move import MoveError, MoveOptions, cleanup, move_shard, rollback_move


def test_a_table_created_again_mid_move_stops_the_move_before_the_flip(config: Config) -> None:
    """Its rows since were never replicated (the publication holds the old table): caught under the freeze, so
    the source keeps serving and nothing reached the target's map."""
    setup_shards(config, rows=5)

    def recreate(point: str) -> None:
        if point == "cutover":
            with psycopg.connect(config.dsn("db1"), autocommit=True) as c:
                c.execute("DROP TABLE shard_1.tags")
                c.execute("CREATE TABLE shard_1.tags (tag text PRIMARY KEY, n serial)")
                c.execute("INSERT INTO shard_1.tags (tag) VALUES ('new')")

    with pytest.raises(MoveError, match=r"the tables of shard_1 changed during the move \(tags: not the table the move publishes"):
        move_shard(config, 1, "db3", hook=recreate)
    assert state_of(config.dsn("db1"), 1) == ("moving", "shard_1")
    assert state_of(config.dsn("db3"), 1) == ("incoming", "shard_1")
    report = rollback_move(config, 1)
    assert report.status == "rolled_back" and state_of(config.dsn("db1"), 1) == ("active", "shard_1")
    assert leftovers(config.databases) == []


DDL = """
CREATE TABLE photos (id bigint PRIMARY KEY DEFAULT next_id(), user_id bigint NOT NULL, caption text);
CREATE INDEX ON photos (user_id, id);
CREATE TABLE likes (id bigint PRIMARY KEY DEFAULT next_id(), photo_id bigint NOT NULL REFERENCES photos (id), user_id bigint NOT NULL);
"""


def test_ddl_ledger_travels_with_the_shard(config: Config, config_file: Path, tmp_path: Path) -> None:
    assert all(o.ok for o in init(config, SHARDS, ["db1", "db2"]))
    schema = tmp_path / "schema.sql"
    schema.write_text(DDL, encoding="utf-8")
    runner = CliRunner()
    res = runner.invoke(main, ["--config", str(config_file), "apply-ddl", str(schema)])
    assert res.exit_code == 0, res.output
    with psycopg.connect(config.dsn("db1"), autocommit=True) as c:
        c.execute("INSERT INTO shard_1.photos (user_id) SELECT g FROM generate_series(1, 20) g")
        c.execute("INSERT INTO shard_1.likes (photo_id, user_id) SELECT id, 7 FROM shard_1.photos")
        ledger = c.execute("SELECT position, sha256, applied_at FROM pgidgen.ddl_ledger WHERE shard = 1").fetchall()
    assert ledger
    report = move_shard(config, 1, "db3")
    assert report.verification is not None and report.verification.ok and report.verification.rows == 40
    with psycopg.connect(config.dsn("db3"), autocommit=True) as c:
        assert c.execute("SELECT position, sha256, applied_at FROM pgidgen.ddl_ledger WHERE shard = 1").fetchall() == ledger
    cleanup(config, 1)
    with psycopg.connect(config.dsn("db1"), autocommit=True) as c:
        assert c.execute("SELECT count(*) FROM pgidgen.ddl_ledger WHERE shard = 1").fetchone()[0] == 0
    # the moved shard counts as up to date: applying the same file again changes nothing anywhere
    res = runner.invoke(main, ["--config", str(config_file), "apply-ddl", str(schema)])
    assert res.exit_code == 0, res.output
    assert "db3: up to date" in res.output, res.output


def test_a_role_missing_on_the_target_is_refused_up_front(config: Config, config_file: Path) -> None:
    """Roles belong to the server: a grant to a role the target's server lacks failed the restore at the copy step,
    with a slot and publication in place, on every move of a rebalance onto a new server (found by a review). Now
    refused before anything is created, dry run included."""
    import uuid

    role = f"app_{uuid.uuid4().hex[:8]}"
    setup_shards(config, rows=10)
    others = [f"{role}_defacl", f"{role}_stats"]  # in the schema's default privileges; owning an extended statistics object
    with psycopg.connect(config.dsn("db1"), autocommit=True) as c:
        for r in (role, *others):
            c.execute(f"CREATE ROLE {r}")
        c.execute(f"GRANT USAGE ON SCHEMA shard_1 TO {role}")
        c.execute(f"GRANT SELECT (v) ON shard_1.t TO {role}")
        c.execute(f"ALTER DEFAULT PRIVILEGES IN SCHEMA shard_1 GRANT SELECT ON TABLES TO {others[0]}")
        c.execute("CREATE STATISTICS shard_1.t_stats ON v, note FROM shard_1.t")
        c.execute(f"ALTER STATISTICS shard_1.t_stats OWNER TO {others[1]}")
    for args in (["move-shard", "1", "db3", "--dry-run"], ["move-shard", "1", "db3"]):
        res = CliRunner().invoke(main, ["--config", str(config_file), *args])
        assert res.exit_code == 1
        assert res.output.strip() == (f"Error: roles {', '.join(sorted([role, *others]))} of shard_1 (owner or grantee of its objects on db1)"
                                      " do not exist on db3: create them on db3 (roles belong to the server, not the database), then move"), res.output
    assert leftovers(config.databases) == [] and open_moves(config.dsn("db1")) == 0
    with psycopg.connect(config.dsn("db3"), autocommit=True) as c:
        for r in (role, *others):
            c.execute(f"CREATE ROLE {r}")
    report = move_shard(config, 1, "db3")
    assert report.verification is not None and report.verification.ok


def test_objects_outside_the_shard_that_depend_on_it_stop_the_move_and_the_cleanup(config: Config) -> None:
    """A view, a foreign key or a column default outside the shard cannot follow it; the move used to leave them
    bound to the retired copy, and --cleanup's DROP SCHEMA ... CASCADE then dropped them silently (found by a
    review)."""
    setup_shards(config, rows=10)
    with psycopg.connect(config.dsn("db1"), autocommit=True) as c:
        c.execute("CREATE VIEW public.notes AS SELECT note FROM shard_1.t")
        c.execute("CREATE TABLE public.audit (id bigint PRIMARY KEY DEFAULT shard_1.next_id(), t_id bigint REFERENCES shard_1.t (id))")
    for dry_run in (True, False):
        with pytest.raises(MoveError, match=r"objects outside shard_1 on db1 depend on it and cannot move with it: .*view public\.notes"):
            if dry_run:
                from pgidgen.move import plan_move
                plan_move(config, 1, "db3")
            else:
                move_shard(config, 1, "db3")
    assert state_of(config.dsn("db1"), 1) == ("active", "shard_1") and leftovers(config.databases) == []
    with psycopg.connect(config.dsn("db1"), autocommit=True) as c:
        c.execute("DROP VIEW public.notes")
        c.execute("DROP TABLE public.audit")
    report = move_shard(config, 1, "db3")
    with psycopg.connect(config.dsn("db1"), autocommit=True) as c:  # made later, on the retired copy
        c.execute(f"CREATE VIEW public.kept AS SELECT count(*) FROM {report.retired_schema}.t")
    with pytest.raises(MoveError, match=r"objects outside db1\.shard_1_moved_\w+ depend on it: view public\.kept"):
        cleanup(config, 1)
    with psycopg.connect(config.dsn("db1"), autocommit=True) as c:
        assert c.execute("SELECT * FROM public.kept").fetchone()[0] == 10
        c.execute("DROP VIEW public.kept")
    assert cleanup(config, 1).dropped == [f"db1.{report.retired_schema}"]


@pytest.mark.parametrize("ddl", [
    "DROP INDEX shard_1.t_v",
    "CREATE UNIQUE INDEX ON shard_1.tags (n)",
    "ALTER TABLE shard_1.t ADD CONSTRAINT v_positive CHECK (v > 0)",
    "ALTER TABLE shard_1.t ALTER COLUMN note SET DEFAULT 'x'",
    "GRANT SELECT ON shard_1.t TO pg_monitor",
    "GRANT UPDATE (note) ON shard_1.t TO pg_monitor",
    "ALTER TABLE shard_1.t ENABLE ROW LEVEL SECURITY; CREATE POLICY mine ON shard_1.t USING (v > 0)",
    "ALTER TABLE shard_1.p DETACH PARTITION shard_1.p1",
    "ALTER TABLE shard_1.tags OWNER TO pg_monitor",
    "CREATE RULE no_del AS ON DELETE TO shard_1.t DO INSTEAD NOTHING",
    "ALTER SEQUENCE shard_1.tags_n_seq INCREMENT BY 10",
    "CREATE STATISTICS shard_1.st ON v, note FROM shard_1.t",
    "ALTER TABLE shard_1.t SET (fillfactor = 50)",
    "ALTER TABLE shard_1.t REPLICA IDENTITY FULL",
    "ALTER TABLE shard_1.t ALTER COLUMN note SET STORAGE EXTERNAL",
    "ALTER FUNCTION shard_1.bump(int) STRICT",
])
def test_ddl_on_the_source_during_the_copy_stops_the_move_before_the_flip(config: Config, ddl: str) -> None:
    """Only rows are replicated: an index, constraint or default changed on the source after the copy read its
    schema would have been missing on the target, while the move said all was well (found by a review)."""
    setup_shards(config, rows=5)
    with psycopg.connect(config.dsn("db1"), autocommit=True) as c:
        c.execute("CREATE INDEX t_v ON shard_1.t (v)")
        c.execute("CREATE TABLE shard_1.p (k int PRIMARY KEY) PARTITION BY RANGE (k)")
        c.execute("CREATE TABLE shard_1.p1 PARTITION OF shard_1.p FOR VALUES FROM (0) TO (10)")
        c.execute("CREATE TABLE shard_1.child (id int PRIMARY KEY, tid bigint REFERENCES shard_1.t)")
        c.execute("CREATE FUNCTION shard_1.bump(x int) RETURNS int LANGUAGE sql AS 'SELECT x + 1'")

    def change(point: str) -> None:
        if point == "cutover":
            with psycopg.connect(config.dsn("db1"), autocommit=True) as c:
                c.execute(ddl)

    with pytest.raises(MoveError, match=r"the tables of shard_1 changed during the move \(only on db1: |the tables of shard_1 changed during the move \(only on db3: "):
        move_shard(config, 1, "db3", hook=change)
    assert state_of(config.dsn("db1"), 1) == ("moving", "shard_1")
    report = rollback_move(config, 1)
    assert report.status == "rolled_back" and state_of(config.dsn("db1"), 1) == ("active", "shard_1")
    assert leftovers(config.databases) == []
    assert move_shard(config, 1, "db3").status == "done"  # moved again, the change included


@pytest.mark.parametrize("ddl,stops,mark", [
    ("CREATE UNIQUE INDEX ON shard_1.tags (n)", True, "UNIQUE INDEX tags_n_idx"),
    ("ALTER TABLE shard_1.t ALTER COLUMN note SET DEFAULT 'x'", True, "'x'::text"),
    ("GRANT SELECT ON shard_1.t TO pg_monitor", False, "pg_monitor=SELECT/"),  # the copy sets its owners' grants to the source's
])
def test_ddl_between_the_schema_dump_and_the_snapshot(config: Config, ddl: str, stops: bool, mark: str) -> None:
    """The schema's pg_dump runs while the move is checked, before the slot's snapshot exists. DDL committed in
    between is in the rows' snapshot but not in the dump: either the compare before the pause stops the move (as
    for DDL during the copy), or the copy carries it anyway; never a target that differs."""
    setup_shards(config, rows=5)
    seen: list[int] = []

    def change(point: str) -> None:
        if point == "copy":  # the pg_dump started during the checks: wait until it has read the schema
            deadline = time.monotonic() + 30
            while our_children("pg_dump") and time.monotonic() < deadline:
                time.sleep(0.01)
            seen.append(len(our_children("pg_dump")))
            with psycopg.connect(config.dsn("db1"), autocommit=True) as c:
                c.execute(ddl)

    if stops:
        with pytest.raises(MoveError, match=r"the tables of shard_1 changed during the move \(only on db1: "):
            move_shard(config, 1, "db3", hook=change)
        assert seen == [0]
        assert state_of(config.dsn("db1"), 1) == ("moving", "shard_1")
        assert rollback_move(config, 1).status == "rolled_back" and state_of(config.dsn("db1"), 1) == ("active", "shard_1")
        assert leftovers(config.databases) == []
        assert move_shard(config, 1, "db3").status == "done"
    else:
        assert move_shard(config, 1, "db3", hook=change).status == "done"
        assert seen == [0]
    from pgidgen.ddl.drift import schema_items
    with psycopg.connect(config.dsn("db1"), autocommit=True) as a, psycopg.connect(config.dsn("db3"), autocommit=True) as b:
        retired = a.execute("SELECT schema_name FROM pgidgen.shards WHERE shard = 1").fetchone()[0]
        mine = {i for i in schema_items(a, retired) if "pgidgen_retired" not in i}
        assert mine == schema_items(b, "shard_1")
        assert any(mark in i for i in mine), sorted(mine)


@pytest.mark.parametrize("setup,message", [
    ("CREATE TABLE shard_1.j (a int, j json, pt point); ALTER TABLE shard_1.j REPLICA IDENTITY FULL",
     r"table shard_1\.j has REPLICA IDENTITY FULL and column j, pt of a type without equality"),
    ("CREATE DOMAIN public.dj AS json; CREATE DOMAIN public.djj AS public.dj; CREATE TYPE public.cj AS (a int, j json);"
     " CREATE DOMAIN public.jnn AS json NOT NULL; CREATE DOMAIN public.pchk AS point CHECK (VALUE IS NOT NULL);"
     " CREATE TABLE shard_1.d (a int, d public.djj, c public.cj, x xml[], j public.jnn, p public.pchk); ALTER TABLE shard_1.d REPLICA IDENTITY FULL",
     r"table shard_1\.d has REPLICA IDENTITY FULL and column d, c, x, j, p of a type without equality"),
    ("CREATE FUNCTION shard_1.audit() RETURNS trigger LANGUAGE plpgsql AS $$BEGIN RETURN NEW; END$$;"
     " CREATE TRIGGER audit AFTER INSERT ON shard_1.t FOR EACH ROW EXECUTE FUNCTION shard_1.audit();"
     " ALTER TABLE shard_1.t ENABLE ALWAYS TRIGGER audit",
     r"table shard_1\.t has trigger audit enabled ALWAYS or REPLICA"),
])
def test_tables_whose_changes_the_target_could_not_apply_are_refused_up_front(config: Config, setup: str, message: str) -> None:
    """These used to pass the checks and stop the move at catch-up, with a slot holding WAL (found by a review);
    a table of json under REPLICA IDENTITY FULL still moves when it has a primary key, and offline always."""
    setup_shards(config, rows=5)
    with psycopg.connect(config.dsn("db1"), autocommit=True) as c:
        c.execute(setup)
        c.execute("CREATE TABLE shard_1.fine (id int PRIMARY KEY, j json, v int[], w jsonb)")  # json, but a primary key
        # all with equality, most through a binary-coercible operator class (a review found varchar refused)
        c.execute("CREATE DOMAIN public.vd AS varchar(9)[]")
        c.execute("CREATE TABLE shard_1.full_ok (e varchar(20), tags varchar[], net cidr, r regclass, w jsonb, z int4range, v public.vd)")
        c.execute("ALTER TABLE shard_1.full_ok REPLICA IDENTITY FULL")
        from pgidgen.move.identity import unequal_columns
        assert unequal_columns(c, "shard_1", "full_ok") == ()
        c.execute("DROP TABLE shard_1.full_ok")
    with pytest.raises(MoveError, match=message):
        move_shard(config, 1, "db3")
    assert state_of(config.dsn("db1"), 1) == ("active", "shard_1") and leftovers(config.databases) == []
    if setup.startswith("CREATE DOMAIN"):  # the types it uses, on the target too
        with psycopg.connect(config.dsn("db3"), autocommit=True) as c:
            c.execute(setup.split(" CREATE TABLE")[0])
    assert move_shard(config, 1, "db3", options=MoveOptions(offline=True)).status == "done"


def test_objects_outside_the_shard_it_uses_must_exist_on_the_target(config: Config) -> None:
    """A foreign key to public.countries, a column of a type in public: missing on the target, the copy failed
    halfway with the slot in place, and the dry run passed (found by a review). Refused up front now."""
    setup_shards(config, rows=5)
    with psycopg.connect(config.dsn("db1"), autocommit=True) as c:
        c.execute("CREATE TYPE public.mood AS ENUM ('ok', 'sad')")
        c.execute("CREATE TABLE public.countries (code text PRIMARY KEY)")
        c.execute("INSERT INTO public.countries VALUES ('fr')")
        c.execute("CREATE TABLE shard_1.people (id bigint PRIMARY KEY DEFAULT shard_1.next_id(), country text REFERENCES public.countries, m public.mood)")
        c.execute("INSERT INTO shard_1.people (country, m) VALUES ('fr', 'ok')")
    from pgidgen.move import plan_move
    for attempt in (lambda: plan_move(config, 1, "db3"), lambda: move_shard(config, 1, "db3")):
        with pytest.raises(MoveError, match=r"shard_1 uses table public\.countries; type public\.mood from outside the shard, missing on db3"):
            attempt()
    assert state_of(config.dsn("db1"), 1) == ("active", "shard_1") and leftovers(config.databases) == []
    with psycopg.connect(config.dsn("db3"), autocommit=True) as c:
        c.execute("CREATE TYPE public.mood AS ENUM ('ok', 'sad')")
        c.execute("CREATE TABLE public.countries (code text PRIMARY KEY)")
        c.execute("INSERT INTO public.countries VALUES ('fr')")
    assert move_shard(config, 1, "db3").status == "done"
    assert rows_of(config.dsn("db3"), "shard_1", "people")[0][1:] == ("fr", "ok")


def test_what_pg_dump_does_not_copy_as_it_stands_does_not_stop_a_move(config: Config) -> None:
    """An invalid index (a failed CREATE UNIQUE INDEX CONCURRENTLY: pg_dump leaves it out), and a foreign key to a
    partitioned table whose partitions came after it (the per-partition constraints are named in creation order,
    which the restore does not repeat): the schema check under the freeze refused these moves every time (found
    by a review)."""
    setup_shards(config, rows=5)
    with psycopg.connect(config.dsn("db1"), autocommit=True) as c:
        c.execute("CREATE TABLE shard_1.posts (id bigint PRIMARY KEY, k int)")
        c.execute("INSERT INTO shard_1.posts VALUES (1, 1), (2, 1)")
        with pytest.raises(psycopg.errors.UniqueViolation):
            c.execute("CREATE UNIQUE INDEX CONCURRENTLY posts_k ON shard_1.posts (k)")
        c.execute("CREATE TABLE shard_1.r (id int PRIMARY KEY) PARTITION BY RANGE (id)")
        c.execute("CREATE TABLE shard_1.r2 PARTITION OF shard_1.r FOR VALUES FROM (10) TO (20)")
        c.execute("CREATE TABLE shard_1.x (id int PRIMARY KEY, rid int REFERENCES shard_1.r)")
        c.execute("CREATE TABLE shard_1.r1 PARTITION OF shard_1.r FOR VALUES FROM (0) TO (10)")
        c.execute("CREATE POLICY mine ON shard_1.x TO pg_monitor, public USING (id > 0)")
        c.execute("GRANT SELECT ON shard_1.x TO pg_monitor")
    assert move_shard(config, 1, "db3").status == "done"


def test_an_operator_class_of_the_shard_moves_with_it(config: Config) -> None:
    """An operator class and family in the shard over the shard's own function (as apply-ddl --from-schema makes
    from a dump): its members (pg_amproc, pg_amop rows) were taken for objects outside the shard depending on it,
    and the move refused (found by trying a real app's schema)."""
    setup_shards(config, rows=5)
    with psycopg.connect(config.dsn("db1"), autocommit=True) as c:
        c.execute("CREATE FUNCTION shard_1.cmp_len(text, text) RETURNS int LANGUAGE sql IMMUTABLE"
                  " AS 'SELECT pg_catalog.btint4cmp(pg_catalog.length($1), pg_catalog.length($2))'")
        c.execute("CREATE OPERATOR CLASS shard_1.len_ops FOR TYPE text USING btree"
                  " AS OPERATOR 1 pg_catalog.< (text, text), FUNCTION 1 shard_1.cmp_len(text, text)")
        c.execute("CREATE TABLE shard_1.words (w text PRIMARY KEY)")
        c.execute("CREATE INDEX words_len ON shard_1.words (w shard_1.len_ops)")
    assert move_shard(config, 1, "db3").status == "done"
    with psycopg.connect(config.dsn("db3")) as c:
        assert c.execute("SELECT count(*) FROM pg_catalog.pg_opclass WHERE opcname = 'len_ops'"
                         " AND opcnamespace = 'shard_1'::regnamespace").fetchone() == (1,)


def test_an_outside_object_made_during_the_move_stops_it_and_drop_source_keeps_a_copy_in_use(config: Config) -> None:
    """A view on the shard made mid-move used to pass (the check ran only at the start) and stay bound to the
    retired copy; and --drop-source, unable to drop a copy something depends on, turned the finished move into an
    error (found by a review)."""
    setup_shards(config, rows=5)

    def view_on_shard(point: str) -> None:
        if point == "cutover":
            with psycopg.connect(config.dsn("db1"), autocommit=True) as c:
                c.execute("CREATE VIEW public.v2 AS SELECT count(*) FROM shard_1.t")

    with pytest.raises(MoveError, match=r"the tables of shard_1 changed during the move \(objects outside it now depend on it: view public\.v2\)"):
        move_shard(config, 1, "db3", hook=view_on_shard)
    assert rollback_move(config, 1).status == "rolled_back"
    with psycopg.connect(config.dsn("db1"), autocommit=True) as c:
        c.execute("DROP VIEW public.v2")

    def view_on_retired(point: str) -> None:
        if point == "teardown":
            with psycopg.connect(config.dsn("db1"), autocommit=True) as c:
                retired = c.execute("SELECT schema_name FROM pgidgen.shards WHERE shard = 1").fetchone()[0]
                c.execute(f"CREATE VIEW public.v3 AS SELECT count(*) FROM {retired}.t")

    report = move_shard(config, 1, "db3", options=MoveOptions(drop_source=True), hook=view_on_retired)
    assert report.status == "done" and report.retired_schema is not None
    assert report.notes[-1].startswith(f"kept the source copy db1.{report.retired_schema}: objects outside db1.{report.retired_schema} depend on it: view public.v3")
    assert state_of(config.dsn("db3"), 1) == ("active", "shard_1") and leftovers(config.databases) == []


@pytest.mark.sensitive
@pytest.mark.parametrize("offline", [False, True])
def test_default_privileges_on_the_target_do_not_change_the_shards_grants(config: Config, offline: bool) -> None:
    """The restore runs as the target's superuser, whose default privileges (ALTER DEFAULT PRIVILEGES) added
    grants to the copy, or took PUBLIC's EXECUTE away: online moves then failed at every cutover, offline ones
    changed the grants silently (found by a review). The copy's owner grants are made the source's."""
    setup_shards(config, rows=5)
    for db in ("db1", "db3"):
        with psycopg.connect(config.dsn(db), autocommit=True) as c:
            c.execute("CREATE DOMAIN public.posint AS int CHECK (VALUE > 0)")
    with psycopg.connect(config.dsn("db1"), autocommit=True) as c:
        c.execute("CREATE FUNCTION shard_1.bump(x int) RETURNS int LANGUAGE sql AS 'SELECT x + 1'")
        c.execute("CREATE FUNCTION shard_1.f(x public.posint) RETURNS int LANGUAGE sql AS 'SELECT x'")  # a type outside, in the signature
        c.execute("CREATE AGGREGATE shard_1.osa(float8 ORDER BY anyelement) (sfunc = ordered_set_transition_multi, stype = internal,"
                  " finalfunc = percentile_disc_final, finalfunc_extra)")
        c.execute("CREATE TYPE shard_1.floatrange AS RANGE (subtype = float8)")  # and its multirange
        c.execute("CREATE TYPE shard_1.mood AS ENUM ('ok')")
        c.execute("GRANT SELECT (v) ON shard_1.t TO pg_read_all_stats")  # a column grant to the role the table-wide default adds
        c.execute("REVOKE ALL ON shard_1.t FROM postgres; GRANT ALL ON shard_1.t TO postgres")  # its ACL in another order
        c.execute("GRANT SELECT (note) ON shard_1.t TO pg_monitor")
    with psycopg.connect(config.dsn("db3"), autocommit=True) as c:
        c.execute("ALTER DEFAULT PRIVILEGES GRANT SELECT ON TABLES TO pg_read_all_stats")
        c.execute("ALTER DEFAULT PRIVILEGES REVOKE EXECUTE ON FUNCTIONS FROM PUBLIC")
        c.execute("ALTER DEFAULT PRIVILEGES REVOKE USAGE ON TYPES FROM PUBLIC")
        c.execute("ALTER DEFAULT PRIVILEGES GRANT USAGE ON SEQUENCES TO pg_monitor WITH GRANT OPTION")
    try:
        assert move_shard(config, 1, "db3", options=MoveOptions(offline=offline)).status == "done"
        with psycopg.connect(config.dsn("db3"), autocommit=True) as c:
            assert c.execute("SELECT has_table_privilege('pg_read_all_stats', 'shard_1.t', 'SELECT')").fetchone()[0] is False
            assert c.execute("SELECT has_function_privilege('public', 'shard_1.bump(int)', 'EXECUTE')").fetchone()[0] is True
            assert c.execute("SELECT has_type_privilege('public', 'shard_1.mood', 'USAGE')").fetchone()[0] is True
            assert c.execute("SELECT has_sequence_privilege('pg_monitor', 'shard_1.tags_n_seq', 'USAGE')").fetchone()[0] is False
            assert c.execute("SELECT has_column_privilege('pg_monitor', 'shard_1.t', 'note', 'SELECT')").fetchone()[0] is True
            assert c.execute("SELECT has_column_privilege('pg_read_all_stats', 'shard_1.t', 'v', 'SELECT')").fetchone()[0] is True
            assert c.execute("SELECT has_type_privilege('public', 'shard_1.floatmultirange', 'USAGE')").fetchone()[0] is True
            assert c.execute("SELECT has_function_privilege('public', 'shard_1.f(public.posint)', 'EXECUTE')").fetchone()[0] is True
        from pgidgen.ddl.drift import schema_items
        with psycopg.connect(config.dsn("db1"), autocommit=True) as a, psycopg.connect(config.dsn("db3"), autocommit=True) as b:
            retired = a.execute("SELECT schema_name FROM pgidgen.shards WHERE shard = 1").fetchone()[0]
            mine = {i for i in schema_items(a, retired) if "pgidgen_retired" not in i}
            assert mine == schema_items(b, "shard_1")
    finally:
        with psycopg.connect(config.dsn("db3"), autocommit=True) as c:
            c.execute("ALTER DEFAULT PRIVILEGES REVOKE SELECT ON TABLES FROM pg_read_all_stats")
            c.execute("ALTER DEFAULT PRIVILEGES GRANT EXECUTE ON FUNCTIONS TO PUBLIC")
            c.execute("ALTER DEFAULT PRIVILEGES GRANT USAGE ON TYPES TO PUBLIC")
            c.execute("ALTER DEFAULT PRIVILEGES REVOKE USAGE ON SEQUENCES FROM pg_monitor")


def test_ddl_that_commits_while_the_freeze_waits_for_its_lock_stops_the_move(config: Config) -> None:
    """A CREATE INDEX in flight when the pause starts holds a lock the freeze waits for, and commits meanwhile:
    after the check made before the pause. The wait itself triggers the check again (found by a review)."""
    import threading

    setup_shards(config, rows=5)
    done = threading.Event()

    def index_in_flight(point: str) -> None:
        if point != "cutover":
            return
        conn = psycopg.connect(config.dsn("db1"))
        conn.execute("CREATE UNIQUE INDEX t_note ON shard_1.t (note)")  # holds SHARE on the table, not committed

        def later() -> None:
            time.sleep(0.4)
            conn.commit()
            conn.close()
            done.set()

        threading.Thread(target=later, daemon=True).start()

    with pytest.raises(MoveError, match=r"the tables of shard_1 changed during the move \(only on db1: index CREATE UNIQUE INDEX t_note"):
        move_shard(config, 1, "db3", hook=index_in_flight)
    assert done.wait(10)
    assert rollback_move(config, 1).status == "rolled_back" and leftovers(config.databases) == []
