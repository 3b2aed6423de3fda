"""The sharded-DDL ledger in each database's catalog, and replaying it for shards that lack part of it.

History is global: `pgidgen.ddl_files` holds every applied file version at a position that is the same in every
database, `pgidgen.ddl_ledger` which shard got which position. A shard is up to date when it has every
position; catching up a shard (a new one from init, one an apply skipped) replays the missing templates in
position order. The rows of shard N are `WHERE shard = N`; `ledger_copy_sql` renders them for another database.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import psycopg

from .. import __version__
from ..errors import ConflictError
from ..idgen import LOCK_CLASS
from ..render import literal, static_sql
from .online_sql import in_transaction, online_steps
from .rewrite import render_template

#: Advisory lock object (class idgen.LOCK_CLASS) serialising apply-ddl runs and init's ledger replay.
DDL_LOCK = -4
#: Shards per round trip when applying.
BATCH = 50
_BEGIN = "-- Sharded DDL (pgidgen apply-ddl)"
_END = "-- end of sharded DDL"


@dataclass(frozen=True)
class FileVersion:
    """One applied version of a file: its global position, and the template every shard got."""

    position: int
    name: str
    sha256: str
    source: str
    template: str
    placeholder: str
    pgidgen_version: str = __version__

    def for_shard(self, shard: int) -> str:
        """The shard's SQL in a transaction (an online file's plain form: online.py runs it shard by shard instead)."""
        return render_template(in_transaction(self.template), self.placeholder, shard)

    @property
    def online(self) -> bool:
        return online_steps(self.template) is not None


@dataclass
class DatabaseLedger:
    """What one database's catalog says about sharded DDL."""

    has_catalog: bool = False
    has_tables: bool = False
    files: dict[int, FileVersion] = field(default_factory=dict)
    shards: dict[int, set[int]] = field(default_factory=dict)  # shard -> positions it has
    active: set[int] = field(default_factory=set)
    moving: set[int] = field(default_factory=set)
    incoming: set[int] = field(default_factory=set)  # a move's copy, not yet activated

    def latest(self, name: str, shard: int) -> FileVersion | None:
        """The newest version of a file name this shard has."""
        have = [self.files[p] for p in self.shards.get(shard, ()) if p in self.files and self.files[p].name == name]
        return max(have, key=lambda f: f.position) if have else None


def read_ledger(conn: psycopg.Connection[Any]) -> DatabaseLedger:
    led = DatabaseLedger()
    row = conn.execute(
        "SELECT to_regclass('pgidgen.shards') IS NOT NULL, to_regclass('pgidgen.ddl_files') IS NOT NULL"
        " AND to_regclass('pgidgen.ddl_ledger') IS NOT NULL"
    ).fetchone()
    led.has_catalog, led.has_tables = bool(row and row[0]), bool(row and row[1])
    if led.has_catalog:
        for shard, state in conn.execute("SELECT shard, state FROM pgidgen.shards"):
            if state == "active":
                led.active.add(int(shard))
            elif state == "moving":
                led.moving.add(int(shard))
            elif state == "incoming":
                led.incoming.add(int(shard))
    if led.has_tables:
        for r in conn.execute("SELECT position, name, sha256, source, template, placeholder, pgidgen_version FROM pgidgen.ddl_files"):
            led.files[int(r[0])] = FileVersion(*r)
        for shard, positions in conn.execute("SELECT shard, array_agg(position) FROM pgidgen.ddl_ledger GROUP BY shard"):
            led.shards[int(shard)] = set(positions)
    return led


def merge_history(ledgers: Mapping[str, DatabaseLedger]) -> dict[int, FileVersion]:
    """The global history: every position any database knows; databases must agree on each."""
    history: dict[int, FileVersion] = {}
    seen_in: dict[int, str] = {}
    for name, led in ledgers.items():
        for pos, f in led.files.items():
            other = history.get(pos)
            if other is None:
                history[pos] = f
                seen_in[pos] = name
            elif other.sha256 != f.sha256:
                raise ConflictError(
                    f"databases {seen_in[pos]} and {name} disagree on sharded DDL file #{pos} ({other.name} vs {f.name})",
                    hint="two apply-ddl runs raced or a ledger was edited by hand; compare pgidgen.ddl_files in both and fix one",
                )
    return dict(sorted(history.items()))


def missing_positions(history: Mapping[int, FileVersion], have: Iterable[int]) -> list[int]:
    got = set(have)
    return [p for p in history if p not in got]


def ledger_tables_sql() -> str:
    """The ledger's part of catalog.sql (idempotent), for catalogs installed before it existed."""
    text = static_sql("catalog.sql")
    start = text.index(_BEGIN)
    return text[start:text.index(_END, start) + len(_END)] + "\n"


def render_upgrade(led: DatabaseLedger) -> str:
    return "" if led.has_tables else ledger_tables_sql()


def render_files(files: Iterable[FileVersion]) -> str:
    out = []
    for f in files:
        out.append(
            "INSERT INTO pgidgen.ddl_files (position, name, sha256, source, template, placeholder, pgidgen_version)\n"
            f"VALUES ({f.position}, {literal(f.name)}, {literal(f.sha256)}, {literal(f.source)}, {literal(f.template)}, "
            f"{literal(f.placeholder)}, {literal(f.pgidgen_version)}) ON CONFLICT (position) DO NOTHING;\n"
        )
    return "".join(out)


def render_ledger_rows(rows: Sequence[tuple[int, FileVersion]]) -> str:
    if not rows:
        return ""
    values = ",\n".join(f"({shard}, {f.position}, {literal(f.sha256)})" for shard, f in rows)
    return f"INSERT INTO pgidgen.ddl_ledger (shard, position, sha256) VALUES\n{values};\n"


def render_shard(shard: int, files: Sequence[FileVersion]) -> str:
    return "".join(f"-- shard {shard}: {f.name} (#{f.position})\n" + f.for_shard(shard) for f in files)


def render_batches(work: Mapping[int, Sequence[FileVersion]], *, batch: int = BATCH) -> list[tuple[list[int], str]]:
    """(shards, SQL) per round trip: each shard's missing files in order, then their ledger rows, then RESET."""
    shards = sorted(s for s, files in work.items() if files)
    out: list[tuple[list[int], str]] = []
    for i in range(0, len(shards), batch):
        part = shards[i:i + batch]
        body = "".join(render_shard(s, work[s]) for s in part)
        rows = [(s, f) for s in part for f in work[s]]
        out.append((part, body + "RESET search_path;\n" + render_ledger_rows(rows)))
    return out


def lock_sql() -> str:
    return f"SELECT pg_catalog.pg_advisory_xact_lock({LOCK_CLASS}, {DDL_LOCK});\n"


@dataclass
class Replay:
    chunks: list[str] = field(default_factory=list)
    files: int = 0


def replay_for_new_shards(conn: psycopg.Connection[Any], shards: Sequence[int], history: Mapping[int, FileVersion]) -> Replay:
    """Init's hook: the SQL that gives brand-new shards the whole ledger, run in init's own transaction.

    Takes the DDL lock, then merges this database's own ledger (an apply-ddl may have committed here since
    init read the others), so the new shards get every file the database's shards have.
    """
    if not shards:
        return Replay()
    conn.execute(lock_sql().encode())
    local = read_ledger(conn)
    merged = merge_history({"(read before)": DatabaseLedger(files=dict(history)), "(this database)": local})
    if not merged:
        return Replay()
    head = render_upgrade(local) + render_files(f for p, f in merged.items() if p not in local.files)
    files = list(merged.values())
    chunks = [head] + [sql for _, sql in render_batches({s: files for s in shards})]
    return Replay(chunks=chunks, files=len(files))


def ledger_copy_sql(conn: psycopg.Connection[Any], shard: int) -> str:
    """SQL that records shard's ledger rows in another database (for a shard move); run it there after the copy.

    The file rows go first (ON CONFLICT DO NOTHING: positions are global); the foreign key from ddl_ledger to
    (position, sha256) fails the move if the target database disagrees about a file.
    """
    led = read_ledger(conn)
    positions = sorted(led.shards.get(shard, ()))
    if not positions:
        return ""
    files = [led.files[p] for p in positions]
    rows = conn.execute("SELECT position, applied_at::text FROM pgidgen.ddl_ledger WHERE shard = %s ORDER BY position", (shard,)).fetchall()
    values = ",\n".join(f"({shard}, {p}, {literal(led.files[p].sha256)}, {literal(at)}::timestamptz)" for p, at in rows)
    return (
        ledger_tables_sql()
        + render_files(files)
        + f"INSERT INTO pgidgen.ddl_ledger (shard, position, sha256, applied_at) VALUES\n{values}\nON CONFLICT (shard, position) DO NOTHING;\n"
    )


def ledger_copy_sql_of(conn: psycopg.Connection[Any], shards: Sequence[int]) -> str:
    """ledger_copy_sql for a batch of shards: the ledger read once, one INSERT for all their rows."""
    if len(shards) == 1:
        return ledger_copy_sql(conn, shards[0])
    led = read_ledger(conn)
    positions = sorted({p for s in shards for p in led.shards.get(s, ())})
    if not positions:
        return ""
    rows = conn.execute("SELECT shard, position, applied_at::text FROM pgidgen.ddl_ledger WHERE shard = ANY(%s) ORDER BY shard, position",
                        (list(shards),)).fetchall()
    values = ",\n".join(f"({s}, {p}, {literal(led.files[p].sha256)}, {literal(at)}::timestamptz)" for s, p, at in rows)
    return (
        ledger_tables_sql()
        + render_files([led.files[p] for p in positions])
        + f"INSERT INTO pgidgen.ddl_ledger (shard, position, sha256, applied_at) VALUES\n{values}\nON CONFLICT (shard, position) DO NOTHING;\n"
    )


def read_history(config: Any, names: Sequence[str]) -> dict[int, FileVersion]:
    """The global DDL history from every named database (init reads it before creating shards)."""
    from ..db import read_each

    ledgers, _ = read_each(config, names, read_ledger)
    return merge_history(ledgers)
