"""How apply-ddl's transactions run on one database: its DDL lock, the first shard statement by statement (to name
a failing statement), a failed batch pinpointed, the hints a failure gives, and the end of each transaction."""
from __future__ import annotations

from collections.abc import Sequence
from contextlib import ExitStack
from typing import Any

import psycopg
from pglast import split

from ..config import Config
from ..db import Outcome, connect, pg_message, translate
from ..errors import ConflictError, DatabaseError, PgidgenError
from ..idgen import LOCK_CLASS, schema_name
from ..ranges import collapse
from .ledger import DDL_LOCK, FileVersion
from .rewrite import ShardedFile, parse_file

#: How long apply-ddl waits for another run (or init's replay, or a move's flip) to release the DDL lock.
LOCK_WAIT_S = 10


def lock_all(stack: ExitStack, config: Config) -> dict[str, psycopg.Connection[Any]]:
    conns: dict[str, psycopg.Connection[Any]] = {}
    for name in sorted(config.databases):
        try:
            conn = connect(name, config.dsn(name), autocommit=True)
        except DatabaseError as e:
            raise DatabaseError(
                e.what,
                hint=f"nothing was applied: apply-ddl needs every configured database (the order of DDL files is global); start {name}"
                " or fix its connection string, and run it again (the ledger keeps what each shard has)",
            ) from None
        stack.callback(conn.close)
        conns[name] = conn
        try:
            conn.execute(f"SET lock_timeout = '{LOCK_WAIT_S}s'".encode())
            conn.execute("SELECT pg_catalog.pg_advisory_lock(%s, %s)", (LOCK_CLASS, DDL_LOCK))
            conn.execute(b"RESET lock_timeout")
        except psycopg.errors.LockNotAvailable:
            raise ConflictError(
                f"another pgidgen apply-ddl, init or move-shard is changing shards in database {name}",
                hint="wait for it to finish, then run again",
            ) from None
        except psycopg.Error as e:
            raise translate(name, e, doing="taking pgidgen's DDL lock") from None
        # released explicitly: a closed connection's backend may still hold it for a moment after close()
        stack.callback(_unlock, conn)
    return conns


def _unlock(conn: psycopg.Connection[Any]) -> None:
    try:
        if conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
            conn.execute(b"ROLLBACK")
        conn.execute("SELECT pg_catalog.pg_advisory_unlock(%s, %s)", (LOCK_CLASS, DDL_LOCK))
    except psycopg.Error:
        pass  # the connection broke: the server released the lock with the session


def hint(e: psycopg.Error, name: str, committed: Sequence[int], per_batch: bool, otherwise: str) -> str:
    if per_batch:
        done = f"shards {collapse(committed)} of {name} were committed before" if committed else f"nothing was committed in {name}"
        state = f"{done}; the other databases went on: fix the cause and run apply-ddl again, it resumes where it stopped"
    else:
        state = "nothing was applied anywhere (rolled back)"
    if getattr(e, "sqlstate", None) == "42501":
        return (f"{state}; the config's role for {name} lacks the rights to change the shards: run apply-ddl as the role that"
                " ran init (it owns the shards and pgidgen's catalog)")
    if getattr(e, "sqlstate", None) == "53200":
        return (
            f"{state}; creating tables locks them until commit and the server's lock table is full (other sessions hold"
            " locks too): pass --commit-every N with a smaller N, or raise max_locks_per_transaction"
        )
    return f"{state}; {otherwise}"


class LockTimedOut(Exception):
    """A shard's statement could not get its lock within the lock timeout: the transaction is to be rolled back
    (releasing every lock it held, so nothing queues behind it) and tried again."""

    def __init__(self, shards: Sequence[int]) -> None:
        super().__init__(f"lock timeout in {shards_text(shards)}")
        self.shards = list(shards)


def pinpoint(conn: psycopg.Connection[Any], name: str, part: Sequence[int], shards: dict[int, Any], current: ShardedFile) -> str | None:
    """A batch of shards failed (its transaction is aborted): run them again one by one, statement by statement, from
    the batch's savepoint, to name the shard, statement and line (the whole transaction is rolled back anyway)."""
    try:
        conn.execute(b"ROLLBACK TO SAVEPOINT pgidgen_batch")
        for s in part:
            try:
                run_first_shard(conn, name, s, shards[s], current=current)
            except DatabaseError as e:
                return getattr(e, "location", None)
    except psycopg.Error:
        pass
    return None


def run_first_shard(conn: psycopg.Connection[Any], name: str, shard: int, files: Sequence[FileVersion], *, committed: bool = False,
                     current: ShardedFile | None = None) -> None:
    """The first shard runs statement by statement, so an error names the file, statement and line (of the file
    being applied, `current`, as parsed; an earlier file's found by parsing its source again)."""
    for f in files:
        parts = split(f.for_shard(shard))
        conn.execute(parts[0].encode("utf-8"))  # SET LOCAL search_path
        for i, stmt in enumerate(parts[1:], 1):
            try:
                conn.execute(stmt.encode("utf-8"))
            except psycopg.errors.LockNotAvailable:
                raise LockTimedOut([shard]) from None
            except psycopg.Error as e:
                where = f.name
                try:
                    parsed = current if current is not None and current.sha256 == f.sha256 else parse_file(f.source, f.name)
                    st = parsed.statements[i - 1]
                    where = f"statement {st.number} ({st.kind}) of {f.name}:{st.line}:{st.column}"
                except (PgidgenError, IndexError):
                    pass
                err = DatabaseError(
                    f"database {name} failed in {schema_name(shard)} at {where}: {pg_message(e)}",
                    hint=hint(e, name, (), committed, "fix the file, or the shards it does not fit"),
                )
                err.location = f"{schema_name(shard)} at {where}"  # type: ignore[attr-defined]
                raise err from None
    conn.execute(b"RESET search_path")


def finish(
    conns: dict[str, psycopg.Connection[Any]], targets: Sequence[str], results: dict[str, Any], *, commit: bool, per_batch: set[str]
) -> list[Outcome]:
    """All or nothing across databases: commit everywhere only when every database succeeded."""
    failed = [n for n in targets if isinstance(results[n], PgidgenError)]
    outcomes: list[Outcome] = []
    for name in targets:
        res = results[name]
        conn = conns[name]
        in_tx = conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE
        if isinstance(res, PgidgenError):
            if in_tx:
                end(conn, b"ROLLBACK")
            outcomes.append(Outcome(name, ok=False, summary="failed" if name in per_batch else "failed, rolled back", error=res.render()))
        elif not in_tx:
            outcomes.append(res)
        elif commit:
            error = end(conn, b"COMMIT")
            if error is None:
                outcomes.append(res)
            else:
                e = translate(name, error, doing="committing")
                e.hint = ("the other databases' commits stand (no two-phase commit across servers): run the same apply-ddl again,"
                          " it applies the file where it is missing and nowhere twice")
                outcomes.append(Outcome(name, ok=False, summary="commit failed", error=e.render()))
        else:
            end(conn, b"ROLLBACK")
            outcomes.append(Outcome(name, ok=False, changed=False, summary=f"rolled back because {', '.join(failed)} failed"))
    return outcomes


def end(conn: psycopg.Connection[Any], command: bytes) -> psycopg.Error | None:
    """COMMIT or ROLLBACK; a connection that broke has rolled back by itself."""
    try:
        conn.execute(command)
    except psycopg.Error as e:
        return e
    return None


def shards_text(shards: Sequence[int]) -> str:
    return f"shards {collapse(list(shards))}" if len(shards) > 1 else f"shard {shards[0]}"
