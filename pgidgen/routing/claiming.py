"""The connection class of the router's pools: the claim of a unit of work travels with its first statement.

A unit of work starts a transaction that claims the shard (pgidgen.claim_shard) before anything else runs in it.
Sent on its own that is a round trip before the work's first statement; here the claim waits on the connection
until the first statement, and every way a statement starts (psycopg's Connection._start_query, which all
cursors, COPY and server-side cursors go through) sends BEGIN and the claim first. A plain execute() on the
connection or its cursors goes further: BEGIN, the claim and the statement leave in one pipeline, one round
trip, where plain psycopg spends two on BEGIN and the statement. The order inside the transaction is the same as
before, so is the guarantee: nothing of the work runs before the claim, and if the claim fails the pipeline
aborts the statements after it."""
from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Iterator

import psycopg
from psycopg import sql

IN_UNIT = "commit() and rollback() are not allowed inside a Router unit of work: it commits when the block ends"


def claim_sql(shard: int, search_path: str, read_only: bool) -> bytes:
    """The claim with its arguments as literals (it is sent by psycopg's internal command path, unparametrised)."""
    if read_only:
        q = sql.SQL(
            "SELECT pgidgen.claim_shard({}, false), pg_catalog.set_config('search_path', {}, true),"
            " pg_catalog.set_config('transaction_read_only', 'on', true)"
        )
    else:
        q = sql.SQL("SELECT pgidgen.claim_shard({}), pg_catalog.set_config('search_path', {}, true)")
    return q.format(sql.Literal(shard), sql.Literal(search_path)).as_string(None).encode("utf-8")


class ClaimingCursor(psycopg.Cursor[Any]):
    def execute(self, query: Any, params: Any = None, *, prepare: bool | None = None, binary: bool | None = None) -> ClaimingCursor:
        conn = self._conn
        if getattr(conn, "pending_claim", None) is None or conn._pipeline is not None:
            super().execute(query, params, prepare=prepare, binary=binary)
            return self
        with conn.pipeline():  # BEGIN, the claim (queued by _start_query) and this statement: one round trip
            super().execute(query, params, prepare=prepare, binary=binary)
        return self


class ClaimingConnection(psycopg.Connection[Any]):
    """An autocommit connection that, between begin_unit() and end_unit(), opens its transaction with the claim."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.cursor_factory = ClaimingCursor
        self.pending_claim: bytes | None = None
        self.in_unit = False

    def begin_unit(self, claim: bytes) -> None:
        self.pending_claim = claim
        self.in_unit = True

    def end_unit(self) -> bool:
        """Leave the unit; whether its transaction began (the claim was sent)."""
        began = self.pending_claim is None
        self.pending_claim = None
        self.in_unit = False
        return began

    def _start_query(self) -> Any:  # psycopg's generator that every statement starts with
        claim = self.pending_claim
        if claim is None:
            return (yield from super()._start_query())
        self.pending_claim = None
        yield from self._exec_command(b"BEGIN")
        yield from self._exec_command(claim)
        return None

    def claim_now(self) -> None:
        if self.pending_claim is not None:
            with self.lock:
                self.wait(self._start_query())

    @contextmanager
    def transaction(self, savepoint_name: str | None = None, force_rollback: bool = False) -> Iterator[psycopg.Transaction]:
        """Inside a unit of work: a savepoint, after the claim."""
        self.claim_now()
        with super().transaction(savepoint_name, force_rollback) as tx:
            yield tx

    def commit(self) -> None:
        if self.in_unit:
            raise psycopg.ProgrammingError(IN_UNIT)
        super().commit()

    def rollback(self) -> None:
        if self.in_unit:
            raise psycopg.ProgrammingError(IN_UNIT)
        super().rollback()
