"""The targets' fan-out, and the import's replication taken down (a teardown's, a rollback's).

each_target runs one piece of work on every target database, in parallel, each failure one line. drop_replication
disables each target's subscription, ends the source's sessions still serving its table copies (_quiesce), drops the
subscriptions, then the slots, and the publications unless the tables' owner made them (prepared.py).
"""
from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import psycopg
from psycopg import sql

from ..config import Config
from ..db import connect, each_database, pg_message
from ..errors import DatabaseError, PgidgenError
from . import sqltext
from .source import ImportPlan


def each_target(config: Config, plan: ImportPlan, work: Callable[[str, psycopg.Connection[Any]], None], *, doing: str,
                parallel: bool = False) -> None:
    """work on every target database, one after another (or in parallel: in the pause)."""
    def one(name: str) -> None:
        with connect(name, config.dsn(name), autocommit=True) as conn:
            try:
                work(name, conn)
            except psycopg.Error as e:
                raise DatabaseError(f"database {name} failed while {doing}: {pg_message(e)}",
                                    hint="fix what it says, then pgidgen import --resume (or --rollback)") from None
    for outcome in each_database(list(plan.targets), one, parallel=parallel).values():
        if isinstance(outcome, PgidgenError):
            raise outcome


def drop_replication(config: Config, src: psycopg.Connection[Any], plan: ImportPlan) -> None:
    subids: dict[str, int] = {}

    def disable(name: str, conn: psycopg.Connection[Any]) -> None:
        row = conn.execute("SELECT oid FROM pg_catalog.pg_subscription WHERE subname = %s", (plan.slot(name),)).fetchone()
        if row is not None:
            subids[name] = int(row[0])
            for stmt in sqltext.disable_subscription_sql(plan.slot(name)).splitlines():
                conn.execute(stmt.encode())

    def drop(name: str, conn: psycopg.Connection[Any]) -> None:
        if name in subids:
            conn.execute(sql.SQL("DROP SUBSCRIPTION IF EXISTS {}").format(sql.Identifier(plan.slot(name))))
    each_target(config, plan, disable, doing="disabling its subscription")
    patterns = [f"pg_{i}_sync_%" for i in subids.values()]
    _quiesce(config, src, subids, patterns)
    each_target(config, plan, drop, doing="dropping its subscription")
    names = [plan.slot(n) for n in plan.targets]
    deadline = time.monotonic() + 30
    while True:
        left = src.execute("SELECT slot_name, active FROM pg_catalog.pg_replication_slots WHERE slot_name = ANY(%s) OR slot_name LIKE ANY(%s)",
                           (names, patterns)).fetchall()
        for slot, active in left:
            if not active:
                src.execute("SELECT pg_catalog.pg_drop_replication_slot(%s)", (slot,))
        if not left or all(not a for _, a in left):
            break
        if time.monotonic() > deadline:
            raise DatabaseError(f"replication slot {left[0][0]} on the source stays in use", hint="run again in a moment: --resume or --rollback")
        time.sleep(0.1)
    for n in names if not plan.prepared else []:  # a prepared source's are its owner's
        src.execute(sql.SQL("DROP PUBLICATION IF EXISTS {}").format(sql.Identifier(n)))


def _quiesce(config: Config, src: psycopg.Connection[Any], subids: dict[str, int], patterns: list[str]) -> None:
    """The disabled subscriptions' workers gone before they are dropped. A table's copy creates its slot on the
    source, which waits for every transaction running there to end; DROP SUBSCRIPTION, which drops that slot
    and waits for it to be free, is one of them when a target is a database of the source's server: each would
    wait for the other, for ever (seen: 17 minutes). So the source's sessions serving those copies are ended
    first (their slots go with them, or are dropped after), and the workers, disabled, are not started again."""
    conns = {n: connect(n, config.dsn(n), autocommit=True) for n in subids}
    deadline = time.monotonic() + 30
    try:
        while True:
            src.execute("SELECT pg_catalog.pg_terminate_backend(s.active_pid) FROM pg_catalog.pg_replication_slots s"
                        " JOIN pg_catalog.pg_stat_activity a ON a.pid = s.active_pid"
                        " WHERE s.slot_name LIKE ANY(%s) AND pg_catalog.pg_has_role(a.usesysid, 'MEMBER')", (patterns,))
            busy = [n for n, c in conns.items() if c.execute("SELECT FROM pg_catalog.pg_stat_subscription WHERE subid = %s AND pid IS NOT NULL",
                                                             (subids[n],)).fetchone() is not None]
            if not busy:
                return
            if time.monotonic() > deadline:
                raise DatabaseError(f"database {busy[0]}: the import's subscription, disabled, still has workers after 30 s",
                                    hint="run again in a moment: --resume or --rollback")
            time.sleep(0.1)
    finally:
        for c in conns.values():
            c.close()
