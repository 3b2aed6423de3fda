"""pgidgen.claim remembers a shard it found served (sql/catalog.sql has the argument): a session skips the row's
read while pgidgen.map_version stays where it was when a write claim read the row. These tests hold it to the two
things that keep that true: a change to the map is seen at once (the version moved), and a change that takes a
shard out of service waits for the writes that claimed it (claim_fence), so no write claims it while the change is
open and then remembers the row the change has not committed yet."""
from __future__ import annotations

import threading
import uuid
from pathlib import Path
from typing import Any

import psycopg
import pytest
from click.testing import CliRunner
from psycopg import sql
from test_move_claim import _lock_waiters
from test_routing import count, hand_move, insert, sharded  # noqa: F401 - fixtures

from pgidgen.cli import main
from pgidgen.config import Config
from pgidgen.idgen import render_catalog_grants
from pgidgen.init import init
from pgidgen.routing import Router
from pgidgen.routing.claiming import has_claim_call

pytestmark = pytest.mark.sensitive  # pg_sequence_last_value and settings differ between majors: runs on every one


def _served(conn: psycopg.Connection[Any], shard: int) -> str | None:
    row = conn.execute("SELECT current_setting(%s, true)", (f"pgidgen.served_{shard}",)).fetchone()
    assert row is not None
    return row[0]


def _version(dsn: str) -> str:
    with psycopg.connect(dsn) as c:
        row = c.execute("SELECT pg_sequence_last_value('pgidgen.map_version')::text").fetchone()
        assert row is not None and row[0] is not None
        return str(row[0])


def _claim(conn: psycopg.Connection[Any], shard: int, *, write: bool = True) -> str | None:
    """One claim in a transaction of its own: None if it passed, else its SQLSTATE."""
    try:
        conn.execute("CALL pgidgen.claim(%s, %s, %s)", (shard, f"shard_{shard}", write))
        conn.commit()
        return None
    except psycopg.Error as e:
        conn.rollback()
        return e.sqlstate


def test_a_write_claim_remembers_and_a_move_is_seen_at_once(sharded: Config) -> None:
    """Only a write claim remembers (a read takes no lock); the next claim on the session, read or write, passes on
    it; after the shard moves (a real flip of the row and the schema), the same session is refused (PGR01)."""
    db1 = sharded.dsn("db1")
    with psycopg.connect(db1) as conn:
        assert _claim(conn, 2, write=False) is None and _served(conn, 2) is None
        assert _claim(conn, 2) is None
        assert _served(conn, 2) == _version(db1)  # remembered at the map's version
        assert _claim(conn, 2) is None and _claim(conn, 2, write=False) is None
        hand_move(sharded, 2, "db1", "db3")
        assert _claim(conn, 2) == "PGR01" and _claim(conn, 2, write=False) == "PGR01"
        assert _claim(conn, 1) is None  # another shard's claim reads its row again and passes


@pytest.mark.parametrize("change", [
    "UPDATE pgidgen.shards SET state = 'retired' WHERE shard = 2",
    "DELETE FROM pgidgen.shards WHERE shard = 2",
    "TRUNCATE pgidgen.shards CASCADE",
], ids=["update", "delete", "truncate"])
def test_a_change_by_hand_that_retires_a_shard_waits_for_its_writes(sharded: Config, change: str) -> None:
    """Without claim_fence this is the lost guarantee: a hand edit retires shard 2 but has not committed; a write
    claims shard 2 meanwhile (the edit took no claim lock), reads the row as still active, remembers it at the
    version the edit already moved, and from then on writes land on a database that no longer serves the shard.
    With the fence the edit holds the claim lock from its statement's end to its commit, so the claim waits, then
    reads the committed change and refuses; and an edit made while a write holds the claim waits for it."""
    db1 = sharded.dsn("db1")
    out: dict[str, Any] = {}
    with psycopg.connect(db1) as writer:
        assert _claim(writer, 2) is None  # remembered before the edit: the version it moves must undo that
        with psycopg.connect(db1) as editor:
            editor.execute(change)
            t = threading.Thread(target=lambda: out.update(first=_claim(writer, 2)))
            t.start()
            _lock_waiters(db1, 1)
            editor.commit()
            t.join(20)
        assert out == {"first": "PGR01"}
        assert _claim(writer, 2) == "PGR01" and _served(writer, 2) is not None  # the stale entry never passes again

    # the other order: a write holds the claim, the edit waits for it (lock_timeout: it would block until then)
    with psycopg.connect(sharded.dsn("db2")) as writer, psycopg.connect(sharded.dsn("db2"), autocommit=True) as editor:
        writer.execute("CALL pgidgen.claim(5, 'shard_5')")
        editor.execute("SET lock_timeout = '300ms'")
        with pytest.raises(psycopg.errors.LockNotAvailable):
            editor.execute(change.replace("shard = 2", "shard = 5"))
        writer.commit()
        editor.execute(change.replace("shard = 2", "shard = 5"))
        assert _claim(writer, 5) == "PGR01"


def test_a_router_session_follows_a_move(sharded: Config) -> None:
    """Through the Router, on one pooled connection per database: shard 2's writes remembered on db1's session, the
    shard moves to db3; the next write lands on db3 and nothing more on the copy db1 retired."""
    with Router(sharded, listen=False, max_age=0, min_size=1, max_size=1, retry_for=5.0) as r:
        ids = [r.run(2, insert(2, "before")), r.run(2, insert(2, "remembered"))]
        retired = hand_move(sharded, 2, "db1", "db3")
        ids += [r.run(2, insert(2, "after")) for _ in range(3)]
    assert len(set(ids)) == 5 and count(sharded.dsn("db3"), "shard_2") == 5
    assert count(sharded.dsn("db1"), retired) == 2


def test_a_role_that_may_not_read_the_map_version_claims_without_remembering(sharded: Config) -> None:
    """Before revision 7 a role with SELECT on pgidgen.shards and EXECUTE on the claim could CALL it (routers of
    that time check no more, docs/sql.md). The version is then not read: on 15 pg_sequence_last_value raises 42501
    for it, where 18's returns NULL, so the CALL must not depend on which: it claims, refuses, and remembers nothing."""
    db1 = sharded.dsn("db1")
    role = "app_" + uuid.uuid4().hex[:8]
    with psycopg.connect(db1, autocommit=True) as a:
        a.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(role)))
        a.execute(sql.SQL("GRANT USAGE ON SCHEMA pgidgen TO {0}; GRANT SELECT ON pgidgen.shards TO {0};"
                          " GRANT EXECUTE ON FUNCTION pgidgen.claim_shard(integer, boolean) TO {0}").format(sql.Identifier(role)))
    params = psycopg.conninfo.conninfo_to_dict(db1)
    params["user"] = role
    try:
        with psycopg.connect(**params) as conn:
            assert _claim(conn, 2) is None and _claim(conn, 2, write=False) is None and _served(conn, 2) is None
            has_claim_call(conn)
            assert conn.claim_call  # type: ignore[attr-defined]
            conn.rollback()
            hand_move(sharded, 2, "db1", "db3")
            assert _claim(conn, 2) == "PGR01"
    finally:
        with psycopg.connect(db1, autocommit=True) as a:
            a.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(role)))
            a.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))


def test_a_database_that_hides_pg_sequence_claims_without_remembering(sharded: Config) -> None:
    """Hardened databases may revoke SELECT on catalog tables from PUBLIC; the claim reads pg_sequence (the version's
    CACHE) on its way to remembering, so there an `init --grant` role's every write claim failed with 42501, where
    revision 6's CALL passed (found by a review). It claims, refuses, and remembers nothing instead."""
    db1 = sharded.dsn("db1")
    role = "app_" + uuid.uuid4().hex[:8]
    with psycopg.connect(db1, autocommit=True) as a:
        a.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(role)))
        a.execute(render_catalog_grants([role]))
        a.execute("REVOKE SELECT ON pg_catalog.pg_sequence FROM PUBLIC")
    params = psycopg.conninfo.conninfo_to_dict(db1)
    params["user"] = role
    try:
        with psycopg.connect(**params) as conn:
            assert _claim(conn, 2) is None and _claim(conn, 2) is None and _served(conn, 2) is None
            hand_move(sharded, 2, "db1", "db3")
            assert _claim(conn, 2) == "PGR01"
    finally:
        with psycopg.connect(db1, autocommit=True) as a:
            a.execute("GRANT SELECT ON pg_catalog.pg_sequence TO PUBLIC")
            a.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(role)))
            a.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))


def test_a_map_version_with_a_cache_remembers_nothing(sharded: Config) -> None:
    """With CACHE above 1 on pgidgen.map_version a session's nextval takes several values at once and later ones
    leave the sequence's stored last value where it was: a change to the map then does not move the version the
    claim reads. A write that remembered shard 2 at that version passed its claim after the shard was retired."""
    db1 = sharded.dsn("db1")
    with psycopg.connect(db1, autocommit=True) as a:
        a.execute("ALTER SEQUENCE pgidgen.map_version CACHE 10")
    with psycopg.connect(db1) as writer, psycopg.connect(db1, autocommit=True) as editor:
        editor.execute("UPDATE pgidgen.shards SET updated_at = now() WHERE shard = 1")  # the editor takes 10 versions
        assert _claim(writer, 2) is None and _served(writer, 2) is None
        version = _version(db1)
        editor.execute("UPDATE pgidgen.shards SET state = 'retired' WHERE shard = 2")
        assert _version(db1) == version  # what made remembering unsafe
        assert _claim(writer, 2) == "PGR01"


def test_a_remembered_claim_reads_no_table(sharded: Config) -> None:
    """What the remembering is for: a claim on a remembered shard scans no table of the catalog (the counters of
    the transaction so far, before and after the CALL), where one on a shard not remembered reads its row."""
    scans = "SELECT coalesce(sum(seq_scan + coalesce(idx_scan, 0)), 0) FROM pg_stat_xact_all_tables WHERE schemaname = 'pgidgen'"

    def scanned(conn: psycopg.Connection[Any], shard: int, write: bool) -> int:
        before = conn.execute(scans).fetchone()[0]  # type: ignore[index]
        conn.execute("CALL pgidgen.claim(%s, %s, %s)", (shard, f"shard_{shard}", write))
        after = conn.execute(scans).fetchone()[0]  # type: ignore[index]
        conn.rollback()
        return int(after - before)

    with psycopg.connect(sharded.dsn("db1")) as conn:
        assert _claim(conn, 2) is None
        assert scanned(conn, 2, True) == 0 and scanned(conn, 2, False) == 0
        assert scanned(conn, 1, True) > 0


#: what revision 7 added, taken back: a revision 6 catalog (its claim remembers nothing, no fence, no TRUNCATE).
REVISION_6 = """
DROP TRIGGER claim_fence_update ON pgidgen.shards; DROP TRIGGER claim_fence_delete ON pgidgen.shards;
DROP TRIGGER claim_fence_truncate ON pgidgen.shards; DROP FUNCTION pgidgen.claim_fence();
CREATE OR REPLACE TRIGGER map_changed AFTER INSERT OR UPDATE OR DELETE ON pgidgen.shards
    FOR EACH STATEMENT EXECUTE FUNCTION pgidgen.map_changed();
CREATE OR REPLACE PROCEDURE pgidgen.claim(shard integer, path text, for_write boolean DEFAULT true) LANGUAGE plpgsql
AS $$ BEGIN PERFORM pgidgen.claim_shard(shard, for_write); PERFORM pg_catalog.set_config('search_path', path, true); END $$;
COMMENT ON FUNCTION pgidgen.min_id(timestamptz) IS 'pgidgen catalog revision 6';
"""


@pytest.mark.parametrize("by", ["init", "move"])
def test_a_revision_6_catalog_gets_the_fence_with_the_memory(config: Config, config_file: Path, by: str) -> None:
    """The memory is only true with the fence: a database brought up to revision 7, by init or as a move's target,
    gets both (the claim that remembers, the claim_fence triggers, map_changed on TRUNCATE)."""
    db = "db1" if by == "init" else "db2"
    init(config, 4, ["db1", "db2"] if by == "move" else ["db1"])
    with psycopg.connect(config.dsn(db), autocommit=True) as c:
        c.execute(REVISION_6)
    args = ["init", "--shards", "4", "--databases", "db1"] if by == "init" else ["move-shard", "1", "db2"]
    r = CliRunner().invoke(main, ["--config", str(config_file), *args])
    assert r.exit_code == 0, r.output
    with psycopg.connect(config.dsn(db)) as conn:
        triggers = conn.execute("SELECT array_agg(pg_get_triggerdef(oid) ORDER BY tgname) FROM pg_trigger"
                                " WHERE tgrelid = 'pgidgen.shards'::regclass AND NOT tgisinternal").fetchone()[0]  # type: ignore[index]
        assert [t.split()[2] for t in triggers] == ["claim_fence_delete", "claim_fence_truncate", "claim_fence_update", "map_changed"]
        assert "TRUNCATE" in triggers[-1]
        assert _claim(conn, 1) is None and _served(conn, 1) == _version(config.dsn(db))
