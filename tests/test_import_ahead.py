"""The import's verification ahead of the cutover's pause (importing/ahead.py): the pause compares only the keys
written since the rounds (a TRUNCATE's table whole), and what the rounds or the pause find wrong is refused, the
source left serving and nothing behind after a rollback."""
from __future__ import annotations

from collections.abc import Callable

import psycopg
import pytest
from movekit import leftovers
from test_import import _rows, source, two  # noqa: F401
from test_import_keyof import ROUTE, keyed  # noqa: F401

from pgidgen.config import Config
from pgidgen.errors import PgidgenError
from pgidgen.importing import rollback_import, start_import
from pgidgen.importing.engine import _progress


def _at(point: str, work: Callable[[], None]) -> Callable[[str], None]:
    def hook(where: str) -> None:
        if where == point:
            work()
    return hook


def _holder(cfg: Config, shard: int) -> str:
    for dsn in cfg.databases.values():
        with psycopg.connect(dsn) as c:
            if c.execute("SELECT 1 FROM pgidgen.shards WHERE shard = %s AND state = 'active'", (shard,)).fetchone():
                return dsn
    raise AssertionError(f"no database serves shard {shard}")


def test_the_pause_compares_the_keys_written_since_the_rounds(keyed: str, two: Config) -> None:  # noqa: F811
    def writes() -> None:  # after the rounds, before the source's writes stop
        with psycopg.connect(keyed, autocommit=True) as c:
            c.execute("INSERT INTO photos (id, user_id, caption) VALUES (9001, 7, 'late'), (9002, 7, 'late')")
            c.execute("INSERT INTO likes (photo_id, n) VALUES (9001, 1)")
            c.execute("UPDATE users SET name = 'late' WHERE user_id = 9")
            c.execute("TRUNCATE logs")  # compared whole

    done = start_import(two, keyed, schema="public", key="user_id", skip=["countries"], key_of=ROUTE, hook=_at("frozen:ahead", writes))
    assert done.step == "done"
    # users 9, photos of user 7, likes of photos 9001 and 9002 (a photo records its likes' key too)
    assert done.pause_checked == 4
    assert done.verified == {"users": 126, "photos": 302, "likes": 401, "logs": 0}
    assert _rows(two, "logs", "n") == []
    assert sorted(r for _, r in _rows(two, "photos", "id, user_id") if r[0] > 9000) == [(9001, 7), (9002, 7)]
    with psycopg.connect(keyed) as c:  # the shards' sequences were set ahead of the pause, 1000 past the source's
        (last,) = c.execute("SELECT last_value FROM photos_id_seq").fetchone()  # type: ignore[misc]
    assert _sequence(two, "photos_id_seq") == {last + 1000}
    for dsn in two.databases.values():
        with psycopg.connect(dsn) as c:
            assert c.execute("SELECT count(*) FROM pg_trigger WHERE tgname LIKE 'pgidgen_changed%'").fetchone() == (0,)
    assert leftovers({"source": keyed, **two.databases}) == []


def _sequence(cfg: Config, seq: str) -> set[int]:
    """The last values of every shard's copy of seq."""
    return {int(row[0]) for _, row in _rows(cfg, seq, "last_value")}


def test_a_sequence_past_what_was_set_ahead_is_set_in_the_pause(source: str, two: Config) -> None:  # noqa: F811
    def advance() -> None:
        with psycopg.connect(source, autocommit=True) as c:
            c.execute("SELECT setval('photos_id_seq', 50000)")

    assert start_import(two, source, schema="public", key="user_id", skip=["countries"], hook=_at("frozen:ahead", advance)).step == "done"
    assert _sequence(two, "photos_id_seq") == {50000}


def test_a_row_written_into_a_shard_behind_the_replication_is_found_in_the_pause(keyed: str, two: Config) -> None:  # noqa: F811
    def stray() -> None:
        with psycopg.connect(_holder(two, 7), autocommit=True) as c:
            c.execute("INSERT INTO shard_7.photos (id, user_id, caption) VALUES (9100, 7, 'stray')")

    with pytest.raises(PgidgenError, match=r"verification failed: shard_7\.photos on db\d, rows whose user_id is 7: \d+ rows, the source \d+"):
        start_import(two, keyed, schema="public", key="user_id", skip=["countries"], key_of=ROUTE, hook=_at("frozen:ahead", stray))
    rollback_import(two, keyed, schema="public")
    assert leftovers({"source": keyed, **two.databases}) == []
    with psycopg.connect(keyed, autocommit=True) as c:
        c.execute("INSERT INTO photos (user_id) VALUES (7)")  # serving as before


def test_a_row_lost_before_the_rounds_is_refused_before_the_pause(source: str, two: Config) -> None:  # noqa: F811
    def lose() -> None:
        with psycopg.connect(_holder(two, 7), autocommit=True) as c:
            c.execute("DELETE FROM shard_7.users WHERE user_id = 23")

    with pytest.raises(PgidgenError, match=r"verification failed before the cutover: shard_7\.users on db\d: \d+ rows, the source \d+"):
        start_import(two, source, schema="public", key="user_id", skip=["countries"], hook=_at("after:copied", lose))
    with psycopg.connect(source, autocommit=True) as c:  # never frozen
        c.execute("INSERT INTO users VALUES (1000, 'still served')")
    rollback_import(two, source, schema="public")
    assert leftovers({"source": source, **two.databases}) == []


def test_the_copy_says_its_progress(source: str, two: Config) -> None:  # noqa: F811
    """Rows of the tables copied (the planner's estimates) against what every target receives: all of them, once
    copied (filtered tables: each database its shards' share; the catch-all's: every row)."""
    with psycopg.connect(source, autocommit=True) as c:
        c.execute("ANALYZE")  # the estimates
    followed = start_import(two, source, schema="public", key="user_id", skip=["countries"], follow=True)
    conns = {n: psycopg.connect(dsn, autocommit=True) for n, dsn in two.databases.items()}
    try:
        line = _progress(followed.plan, conns, 30.0)
    finally:
        for c in conns.values():
            c.close()
    total = sum(t.rows * len(s) // 16 if t.filtered else t.rows for t in followed.plan.tables for s in followed.plan.targets.values())
    assert total > 0 and line == f"import: copying, 99% (about {total:,} of {total:,} rows), about 0 s left"
    rollback_import(two, source, schema="public")
