"""pgidgen import of a partitioned source table (events by month, as apps keep logs): every shard gets the table
partitioned as the source's, and each row lands in its key's shard and, there, in its month's partition. And the
DELETEs of tables whose primary key lacks the shard key (events, notes): found in their shard."""
from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest
from conftest import TestServer
from movekit import leftovers
from test_import import SHARDS, source_database, two  # noqa: F401

from pgidgen.config import Config
from pgidgen.importing import resume_import, start_import

SOURCE = """
CREATE TABLE users (user_id bigint PRIMARY KEY, name text);
CREATE TABLE events (id bigserial, user_id bigint NOT NULL, at date NOT NULL, what text,
                     PRIMARY KEY (id, at)) PARTITION BY RANGE (at);
CREATE TABLE events_2026_01 PARTITION OF events FOR VALUES FROM ('2026-01-01') TO ('2026-02-01');
CREATE TABLE events_2026_02 PARTITION OF events FOR VALUES FROM ('2026-02-01') TO ('2026-03-01');
CREATE TABLE events_other PARTITION OF events DEFAULT;
CREATE TABLE notes (id bigserial PRIMARY KEY, user_id bigint NOT NULL, body text);
INSERT INTO users SELECT g, 'u' || g FROM generate_series(1, 40) g;
INSERT INTO notes (user_id, body) SELECT 1 + g % 40, 'n' || g FROM generate_series(1, 50) g;
INSERT INTO events (user_id, at, what) SELECT 1 + g % 40, date '2025-12-20' + g % 75, 'e' || g FROM generate_series(1, 300) g;
"""


@pytest.fixture
def source(pg_servers: list[TestServer]) -> Iterator[str]:
    yield from source_database(pg_servers[0], SOURCE)


def test_a_partitioned_table_is_imported_partitioned_in_every_shard(source: str, two: Config) -> None:  # noqa: F811
    followed = start_import(two, source, schema="public", key="user_id", skip=[], follow=True)
    assert followed.step == "copied"
    with psycopg.connect(source, autocommit=True) as c:  # changes while following reach the shards through the root
        c.execute("INSERT INTO events (user_id, at, what) VALUES (7, '2026-01-15', 'late'), (8, '2026-02-03', 'late')")
        c.execute("DELETE FROM events WHERE what = 'e10'")
        c.execute("UPDATE events SET what = 'moved', at = '2026-02-10' WHERE what = 'e20'")  # to another partition
        # a DELETE's old row names only the primary key, which lacks user_id: the import makes it whole (FULL) meanwhile
        c.execute("DELETE FROM notes WHERE body IN ('n1', 'n2')")
    done = resume_import(two, source, schema="public", cutover=True)
    assert done.step == "done" and done.verified == {"events": 301, "notes": 48, "users": 40}
    placed: dict[tuple[int, str], str] = {}
    for dsn in two.databases.values():
        with psycopg.connect(dsn) as c:
            for (shard,) in c.execute("SELECT shard FROM pgidgen.shards WHERE state = 'active'").fetchall():
                assert c.execute(f"SELECT relkind FROM pg_class WHERE oid = 'shard_{shard}.events'::regclass").fetchone() == ("p",)
                for user, what, part in c.execute(f"SELECT user_id, what, tableoid::regclass::text FROM shard_{shard}.events"):
                    assert user % SHARDS == shard
                    placed[(user, what)] = part.split(".")[1]
    assert len(placed) == 301 and ("e10" not in {w for _, w in placed})
    assert placed[(7, "late")] == "events_2026_01" and placed[(8, "late")] == "events_2026_02"
    assert placed[(21, "moved")] == "events_2026_02"
    assert leftovers({"source": source, **two.databases}) == []
    with psycopg.connect(source) as c:  # the replica identities as they were
        assert c.execute("SELECT string_agg(relname || ' ' || relreplident::text, ', ' ORDER BY relname) FROM pg_class"
                         " WHERE relnamespace = 'public'::regnamespace AND relkind IN ('r', 'p')").fetchone() == (
            "events d, events_2026_01 d, events_2026_02 d, events_other d, notes d, users d",)
