"""The move journal (pgidgen.moves, pgidgen.move_log on the source database): every step is written here, in
its own committed transaction, before it runs, so a move killed anywhere can be resumed or rolled back.

It lives on the source because the source is the authority on the shard until the flip, and a second mover
of the same shard must meet the first one there (the advisory lock and the one-open-move index).
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

import psycopg

from ..idgen import LOCK_CLASS

#: The steps of an online move, in order. Offline moves skip the replication steps.
ONLINE_STEPS = ("prepare", "publication", "copy", "subscription", "catchup", "cutover", "activate", "teardown", "identity", "verify")
OFFLINE_STEPS = ("prepare", "schema", "cutover", "activate", "verify")
#: Before this step completes the source holds the authoritative copy and a rollback loses nothing.
POINT_OF_NO_RETURN = "activate"


#: Advisory-lock objects of "shard N is being moved": MOVE_LOCK_BASE - N, far below the small negative objects
#: other features use (init: -1, apply-ddl: -4) and disjoint from the generators (N >= 0).
MOVE_LOCK_BASE = -(1 << 24)


def move_lock_key(shard: int) -> int:
    return MOVE_LOCK_BASE - shard


@dataclass
class MoveRecord:
    move_id: int
    shard: int
    source: str
    target: str
    mode: str
    token: str
    step: str
    status: str
    detail: dict[str, Any] = field(default_factory=dict)

    @property
    def steps(self) -> tuple[str, ...]:
        return ONLINE_STEPS if self.mode == "online" else OFFLINE_STEPS

    @property
    def shards(self) -> list[int]:
        """The batch's shards: the row's shard is the lowest of them, detail 'shards' lists all (older moves: one)."""
        return [int(s) for s in self.detail.get("shards") or [self.shard]]


def retired_names(rec: MoveRecord) -> dict[int, str]:
    """The retired source copies a move's cutover named, per shard (a move of one shard journals one name)."""
    if rec.detail.get("retired_schemas"):
        return {int(k): str(v) for k, v in rec.detail["retired_schemas"].items()}
    if rec.detail.get("retired_schema"):
        return {rec.shard: str(rec.detail["retired_schema"])}
    return {}


#: A move's row names the lowest shard of its batch; the others are in detail's 'shards' list.
MEMBER_SQL = "(shard = %(shard)s OR detail -> 'shards' @> pg_catalog.to_jsonb(%(shard)s::int))"


_COLUMNS = "move_id, shard, source, target, mode, token, step, status, detail"


def record_from_row(row: Any) -> MoveRecord:
    move_id, shard, source, target, mode, token, step, status, detail = row
    return MoveRecord(move_id, shard, source, target, mode, token, step, status, dict(detail or {}))


class Journal:
    """Writes go through an autocommit connection of their own: a journal entry is durable before the step runs."""

    def __init__(self, conn: psycopg.Connection[Any], record: MoveRecord) -> None:
        self.conn = conn
        self.record = record

    @classmethod
    def open_new(
        cls, conn: psycopg.Connection[Any], *, shard: int, source: str, target: str, mode: str, token: str, detail: dict[str, Any]
    ) -> Journal:
        row = conn.execute(
            f"INSERT INTO pgidgen.moves (shard, source, target, mode, token, step, status, detail)"
            f" VALUES (%s, %s, %s, %s, %s, 'prepare', 'running', %s) RETURNING {_COLUMNS}",
            (shard, source, target, mode, token, json.dumps(detail)),
        ).fetchone()
        j = cls(conn, record_from_row(row))
        j.log("prepare", "begin", detail)
        return j

    def start(self, step: str, **detail: Any) -> None:
        """Record that step is about to run (and any values it will need on resume)."""
        self.record.step = step
        self.record.status = "running"
        self.record.detail.update(detail)
        self._update_and_log("step = %s, status = 'running', detail = detail || %s::jsonb", (step, json.dumps(detail)), step, "start", detail)

    def note(self, step: str, **detail: Any) -> None:
        self.record.detail.update(detail)
        self._update_and_log("detail = detail || %s::jsonb", (json.dumps(detail),), step, "note", detail)

    def fail(self, step: str, error: str) -> None:
        self.record.status = "failed"
        self.conn.execute(
            "UPDATE pgidgen.moves SET status = 'failed', updated_at = now() WHERE move_id = %s AND status = 'running'",
            (self.record.move_id,),
        )
        self.log(step, "error", {"error": error})

    def finish(self, status: str) -> None:
        self.record.status = status
        self.record.step = "done" if status == "done" else self.record.step
        self._update_and_log("status = %s, step = %s, finished_at = now()", (status, self.record.step), self.record.step, status, {})

    def _update_and_log(self, assignments: str, params: tuple[Any, ...], step: str, event: str, detail: dict[str, Any]) -> None:
        """The move's row and its log entry in one statement: one round trip and one commit per journal write
        (a move writes some twenty), and never the one without the other."""
        self.conn.execute(
            f"WITH m AS (UPDATE pgidgen.moves SET {assignments}, updated_at = now() WHERE move_id = %s RETURNING move_id)"
            " INSERT INTO pgidgen.move_log (move_id, step, event, detail) SELECT move_id, %s::text, %s::text, %s::jsonb FROM m",
            (*params, self.record.move_id, step, event, json.dumps(detail, default=str)),
        )

    def log(self, step: str, event: str, detail: dict[str, Any]) -> None:
        self.conn.execute(
            "INSERT INTO pgidgen.move_log (move_id, step, event, detail) VALUES (%s, %s, %s, %s)",
            (self.record.move_id, step, event, json.dumps(detail, default=str)),
        )


def open_move(conn: psycopg.Connection[Any], shard: int) -> MoveRecord | None:
    """The unfinished move of shard (running or failed) recorded in this database's journal, if any."""
    if not has_journal(conn):
        return None
    row = conn.execute(
        f"SELECT {_COLUMNS} FROM pgidgen.moves WHERE {MEMBER_SQL} AND status IN ('running', 'failed') ORDER BY move_id DESC LIMIT 1",
        {"shard": shard},
    ).fetchone()
    return record_from_row(row) if row else None


def open_moves(conn: psycopg.Connection[Any], shards: list[int]) -> dict[int, MoveRecord]:
    """open_move of each of shards (those with one), in one query: the journal's unfinished moves are few, and a
    query per shard of a batch of hundreds made a round trip each."""
    if not has_journal(conn):
        return {}
    wanted = set(shards)
    out: dict[int, MoveRecord] = {}
    for row in conn.execute(f"SELECT {_COLUMNS} FROM pgidgen.moves WHERE status IN ('running', 'failed') ORDER BY move_id DESC").fetchall():
        rec = record_from_row(row)
        for s in rec.shards:
            if s in wanted and s not in out:
                out[s] = rec
    return out


def last_move(conn: psycopg.Connection[Any], shard: int, *, status: str = "done") -> MoveRecord | None:
    if not has_journal(conn):
        return None
    row = conn.execute(
        f"SELECT {_COLUMNS} FROM pgidgen.moves WHERE {MEMBER_SQL} AND status = %(status)s ORDER BY move_id DESC LIMIT 1",
        {"shard": shard, "status": status},
    ).fetchone()
    return record_from_row(row) if row else None


def has_journal(conn: psycopg.Connection[Any]) -> bool:
    row = conn.execute("SELECT to_regclass('pgidgen.moves') IS NOT NULL").fetchone()
    return bool(row and row[0])


def try_lock_all(conn: psycopg.Connection[Any], shards: list[int], *, patience: float = 2.0) -> int | None:
    """try_lock for every shard of a batch, one statement for all of them (a round trip per shard added up over
    thousands): None, or the first shard (in shards' order) another mover still holds after patience. Try-locks
    never wait, so the order they are taken in cannot deadlock; release() unlocks all of them."""
    deadline = time.monotonic() + patience
    left = list(shards)
    while True:
        keys = {move_lock_key(s): s for s in left}
        busy = {keys[int(r[0])] for r in conn.execute(
            "SELECT k FROM pg_catalog.unnest(%s::int[]) k WHERE NOT pg_catalog.pg_try_advisory_lock(%s::int, k)", (list(keys), LOCK_CLASS))}
        if not busy:
            return None
        left = [s for s in left if s in busy]
        if time.monotonic() > deadline:
            return left[0]
        time.sleep(0.1)


def try_lock(conn: psycopg.Connection[Any], shard: int, *, patience: float = 2.0) -> bool:
    """Session-level: held for as long as this mover's connection lives, released by the server if it dies.
    A mover killed a moment ago may still hold it until its backend notices: wait a little before giving up."""
    deadline = time.monotonic() + patience
    while True:
        if conn.execute("SELECT pg_try_advisory_lock(%s, %s)", (LOCK_CLASS, move_lock_key(shard))).fetchone()[0]:  # type: ignore[index]
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)


def release(conn: psycopg.Connection[Any], shard: int) -> None:
    """Unlock and close: the next mover must not see a lock that only lingers while the backend exits."""
    try:
        if not conn.closed and not conn.broken:
            conn.execute("SELECT pg_advisory_unlock_all()")
    except psycopg.Error:
        pass
    finally:
        conn.close()


def lock_holder(conn: psycopg.Connection[Any], shard: int) -> int | None:
    row = conn.execute(
        "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND classid = %s::bigint::oid AND objid = %s::bigint::oid"
        " AND objsubid = 2 AND granted AND pid <> pg_backend_pid() AND database = (SELECT oid FROM pg_database WHERE datname = current_database())",
        (LOCK_CLASS, move_lock_key(shard) & 0xFFFFFFFF),
    ).fetchone()
    return int(row[0]) if row else None
