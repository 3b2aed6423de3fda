"""apply-ddl's online way: shard by shard, each shard committed and recorded in the ledger on its own.

A run takes this way when some shard's work holds an online file (online_sql.py: CREATE INDEX / REINDEX / DROP
INDEX CONCURRENTLY, VALIDATE CONSTRAINT). Each shard's missing files run in order: an ordinary file (an earlier
one the shard lacks) in a transaction of its own under the short lock_timeout and retries of pgidgen.lockwait; an
online file statement by statement outside a transaction, then its ledger row. A run that stops (an error, Ctrl-C,
a killed process) leaves every finished shard recorded: the next run resumes with the others, and drops by name
the invalid index a killed build left before building it again.

An online statement's locks never make the application's reads and writes queue (SHARE UPDATE EXCLUSIVE at most),
but CONCURRENTLY waits for every older transaction to end, and its waits come after the build: a short
lock_timeout would throw the build away each time. So it waits, up to --lock-wait, while a watcher on a second
connection says which sessions it waits for (pg_blocking_pids) and cancels it at the deadline.
"""
from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import psycopg

from ..db import Outcome, connect, execute_script, interrupted, pg_message
from ..errors import DatabaseError, PgidgenError
from ..idgen import schema_name
from ..lockwait import Holder, LockPolicy, LockWaitExceeded, with_lock_retries
from ..ranges import collapse
from .ledger import FileVersion, render_ledger_rows
from .online_sql import BLOCKERS_SQL, INDEX_SQL, LEFTOVERS_SQL, REINDEX_LEFTOVERS, Step, for_shard, online_steps, quoted, render_online, search_path
from .rewrite import ShardedFile, parse_file

#: how often the watcher looks at what a running online statement waits for
WATCH_S = 0.5
Waits = Callable[[str, list[int], list[Holder], float], None]


def render_shard(shard: int, files: Sequence[FileVersion]) -> str:
    """One shard's part of an online run, as the executor runs it (for --sql)."""
    out = []
    for f in files:
        steps = online_steps(f.template)
        rows = render_ledger_rows([(shard, f)])
        if steps is None:
            out.append(f"-- shard {shard}: {f.name} (#{f.position}), in a transaction of its own\n"
                       f"BEGIN;\n{f.for_shard(shard)}RESET search_path;\n{rows}COMMIT;\n")
        else:
            out.append(f"-- shard {shard}: {f.name} (#{f.position}), outside a transaction, statement by statement\n"
                       + render_online(steps, f.placeholder, shard, rows))
    return "".join(out)


class Online:
    """One database's online run on its admin connection (autocommit), with a second connection to watch it."""

    def __init__(self, name: str, dsn: str, conn: psycopg.Connection[Any], *, policy: LockPolicy, current: ShardedFile,
                 on_wait: Waits | None, tick: Callable[[int], None]) -> None:
        self.name, self.dsn, self.conn, self.policy, self.current = name, dsn, conn, policy, current
        self.on_wait, self.tick = on_wait, tick
        self.done: list[int] = []
        self._watcher: psycopg.Connection[Any] | None = None

    def run(self, work: dict[int, list[FileVersion]]) -> list[int]:
        try:
            for shard in sorted(work):
                if interrupted():
                    raise DatabaseError(f"database {self.name}: interrupted before {schema_name(shard)}", hint=self._state())
                for f in work[shard]:
                    if f.online:
                        self._online(shard, f)
                    else:
                        self._transaction(shard, f)
                self.done.append(shard)
                self.tick(1)
        finally:
            if self._watcher is not None:
                self._watcher.close()
        return self.done

    def _state(self) -> str:
        done = f"shards {collapse(self.done)} of {self.name} are done and recorded" if self.done else f"no shard of {self.name} was finished"
        return f"{done}; run apply-ddl again to resume (an invalid index a build left is dropped and built again)"

    def _where(self, f: FileVersion, i: int) -> str:
        try:
            parsed = self.current if self.current.sha256 == f.sha256 else parse_file(f.source, f.name)
            st = parsed.statements[i]
            return f"statement {st.number} ({st.kind}) of {f.name}:{st.line}:{st.column}"
        except (PgidgenError, IndexError):
            return f.name

    def _failed(self, shard: int, f: FileVersion, i: int, e: psycopg.Error) -> DatabaseError:
        return DatabaseError(f"database {self.name} failed in {schema_name(shard)} at {self._where(f, i)}: {pg_message(e)}", hint=self._state())

    def _transaction(self, shard: int, f: FileVersion) -> None:
        sql = f.for_shard(shard) + "RESET search_path;\n" + render_ledger_rows([(shard, f)])
        try:
            with_lock_retries(self.conn, lambda c: execute_script(c, sql), schemas=[schema_name(shard)], policy=self.policy,
                              where=f"{self.name}, shard {shard}",
                              on_wait=None if self.on_wait is None else lambda who, s: self._say(shard, who, s))
        except LockWaitExceeded as e:
            e.hint = f"end or wait for that transaction (pg_terminate_backend(pid) ends it), then {self._state()}"
            raise
        except psycopg.Error as e:
            raise self._failed(shard, f, 0, e) from None

    def _say(self, shard: int, who: list[Holder], waited: float) -> None:
        if self.on_wait is not None:
            self.on_wait(self.name, [shard], who, waited)

    def _online(self, shard: int, f: FileVersion) -> None:
        steps = online_steps(f.template) or ()
        i = 0
        try:
            self.conn.execute(search_path(shard).encode())
            for i in range(len(steps)):
                if self._prepare(shard, steps[i]):
                    self._watched(shard, for_shard(steps[i], f.placeholder, shard))
            self.conn.execute(b"RESET search_path")
            execute_script(self.conn, render_ledger_rows([(shard, f)]))
        except LockWaitExceeded:
            raise
        except psycopg.Error as e:
            raise self._failed(shard, f, i, e) from None

    def _prepare(self, shard: int, step: Step) -> bool:
        """Clear what an earlier, killed run left; False when the statement has nothing left to do."""
        schema = schema_name(shard)
        if step.kind in ("create index", "drop index") and step.index:
            row = self.conn.execute(INDEX_SQL, (schema, step.index)).fetchone()
            if step.kind == "drop index":
                return row is not None
            if row is not None and row[0]:
                return False  # built and valid: the run that built it stopped before its ledger row
            if row is not None:
                self._watched_drop(shard, step.index)
        elif step.kind == "reindex":
            for (index,) in self.conn.execute(LEFTOVERS_SQL, (schema, *REINDEX_LEFTOVERS)).fetchall():
                self._watched_drop(shard, index)
        return True

    def _watched_drop(self, shard: int, index: str) -> None:
        self._watched(shard, f"DROP INDEX CONCURRENTLY IF EXISTS {quoted(schema_name(shard), index)}")

    def _watched(self, shard: int, sql: str) -> None:
        """Run one online statement, up to the lock wait; the watcher names what it waits for and cancels it then."""
        if self._watcher is None:
            self._watcher = connect(self.name, self.dsn, autocommit=True)
        watcher, conn, pid = self._watcher, self.conn, self.conn.info.backend_pid
        stop, gave_up, seen = threading.Event(), threading.Event(), list[Holder]()
        start = time.monotonic()

        def watch() -> None:
            while not stop.wait(WATCH_S):
                try:
                    rows = watcher.execute(BLOCKERS_SQL, (pid,)).fetchall()
                except psycopg.Error:
                    return
                who = [Holder(int(r[0]), str(r[1]), None if r[2] is None else float(r[2]), str(r[3]), schema_name(shard)) for r in rows]
                if who:
                    seen[:] = who
                    self._say(shard, who, time.monotonic() - start)
                if time.monotonic() - start > self.policy.wait:
                    gave_up.set()
                    conn.cancel_safe()
                    return

        thread = threading.Thread(target=watch, daemon=True)
        conn.execute(f"SET lock_timeout = '{max(1, round(self.policy.wait * 1000))}ms'".encode())
        thread.start()
        try:
            conn.execute(sql.encode("utf-8"))
        except (psycopg.errors.QueryCanceled, psycopg.errors.LockNotAvailable) as e:
            if not gave_up.is_set() and not isinstance(e, psycopg.errors.LockNotAvailable):
                raise
            held_by = "; ".join(h.describe() for h in seen[:3]) or "a session that has since let go"
            raise LockWaitExceeded(
                f"gave up after {time.monotonic() - start:.0f} s waiting for older transactions held by {held_by}",
                where=f"{self.name}, shard {shard}",
                hint=f"end or wait for that transaction (pg_terminate_backend(pid) ends it), then {self._state()}",
            ) from None
        finally:
            stop.set()
            thread.join()
            try:
                conn.execute(b"RESET lock_timeout")
            except psycopg.Error:
                pass


def run_online(name: str, dsn: str, conn: psycopg.Connection[Any], work: dict[int, list[FileVersion]], *, policy: LockPolicy,
               current: ShardedFile, version: int, on_wait: Waits | None, tick: Callable[[int], None]) -> Outcome:
    """One database's online run; its Outcome says what was applied and caught up."""
    Online(name, dsn, conn, policy=policy, current=current, on_wait=on_wait, tick=tick).run(work)
    applied = sorted(s for s, files in work.items() if any(f.position == version for f in files))
    caught_up = sorted(s for s, files in work.items() if any(f.position != version for f in files))
    parts = [f"applied {current.name} (#{version}) to {len(applied)} shards ({collapse(applied) or 'none'}), shard by shard"]
    if caught_up:
        parts.append(f"caught up {len(caught_up)} shards on earlier files")
    return Outcome(name, changed=True, summary=", ".join(parts), details={"applied": len(applied), "caught_up": len(caught_up), "online": True})
