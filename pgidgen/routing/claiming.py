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

from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any, cast

import psycopg
from psycopg import adapt, generators, pq, sql
from psycopg import errors as e
from psycopg._preparing import Prepare

from .ending import GONE, refuse_ending, refuse_sending
from .nogil import pipeline_sync

IN_UNIT = "commit() and rollback() are not allowed inside a Router unit of work: it commits when the block ends"


#: a read's transaction is read-only from its BEGIN (BEGIN_READ), not by a third call in the claim: one call less
#: for the server to plan and run in every read
_SELECT_READ = "SELECT pgidgen.claim_shard({shard}, false), pg_catalog.set_config('search_path', {path}, true)"
_SELECT_WRITE = "SELECT pgidgen.claim_shard({shard}), pg_catalog.set_config('search_path', {path}, true)"
#: the same as one CALL (sql/catalog.sql: pgidgen.claim), where the database's catalog has it
_CALL_READ = "CALL pgidgen.claim({shard}, {path}, false)"
_CALL_WRITE = "CALL pgidgen.claim({shard}, {path})"
_INT4, _TEXT = 23, 25
DIAG_SQLSTATE = pq.DiagnosticField.SQLSTATE
#: invalid_sql_statement_name: the server does not have the prepared statement the cache names.
LOST_STATEMENT = b"26000"
#: whether this connection's role may CALL pgidgen.claim (set on each new pooled connection: has_claim_call). It
#: runs with the caller's rights: the role needs SELECT on pgidgen.shards (and on pgidgen.map_version and
#: pg_catalog.pg_sequence to remember a shard served, else it reads the row each time), and EXECUTE on what it
#: calls that claim_shard (SECURITY DEFINER) calls as the catalog's owner, which hardened databases may revoke
#: from PUBLIC
HAS_CALL_SQL = (
    "SELECT coalesce(pg_catalog.has_function_privilege(p, 'EXECUTE') AND pg_catalog.has_table_privilege(t, 'SELECT')"
    " AND pg_catalog.has_function_privilege('pg_catalog.has_sequence_privilege(oid,pg_catalog.text)', 'EXECUTE')"
    " AND pg_catalog.has_function_privilege('pg_catalog.pg_advisory_xact_lock_shared(integer,integer)', 'EXECUTE')"
    " AND pg_catalog.has_function_privilege('pg_catalog.pg_sequence_last_value(pg_catalog.regclass)', 'EXECUTE')"
    " AND pg_catalog.has_function_privilege('pg_catalog.current_setting(pg_catalog.text,boolean)', 'EXECUTE')"
    " AND pg_catalog.has_function_privilege('pg_catalog.current_setting(pg_catalog.text)', 'EXECUTE'), false)"
    " FROM pg_catalog.to_regprocedure('pgidgen.claim(integer,pg_catalog.text,boolean)') AS p, pg_catalog.to_regclass('pgidgen.shards') AS t"
)


class ClaimForm:
    """One way to send a claim: `text`, with its arguments as literals (psycopg's internal command path and the
    simple query protocol take no parameters), and `query` with `params` ($1 the shard, $2 the search_path),
    which a connection prepares once under `name` (one per kind: every shard's claim is the same text), so the
    server neither parses nor plans it again, which is most of what the claim costs. Not through psycopg's
    statement cache: keeping count costs a microsecond a unit."""

    __slots__ = ("text", "query", "params", "types", "formats", "name")

    def __init__(self, template: str, name: bytes, shard: int, search_path: str) -> None:
        self.name = name
        self.text = sql.SQL(template).format(shard=sql.Literal(shard), path=sql.Literal(search_path)).as_string(None).encode("utf-8")
        self.query = template.format(shard="$1", path="$2").encode("utf-8")
        self.params: list[bytes | None] = [str(shard).encode("ascii"), search_path.encode("utf-8")]
        self.types = (_INT4, _TEXT)
        self.formats = None


class Claim:
    """The claim of one shard, read or write: `call`, the CALL of pgidgen.claim, and `select`, the SELECT of
    pgidgen.claim_shard and set_config it stands for, for a database whose catalog predates it or a role that
    may not call it (a connection's claim_call says which); `begin`, the BEGIN it follows."""

    __slots__ = ("select", "call", "begin")

    def __init__(self, shard: int, search_path: str, read_only: bool) -> None:
        self.begin = BEGIN_READ if read_only else BEGIN
        kind = "r" if read_only else "w"
        self.select = ClaimForm(_SELECT_READ if read_only else _SELECT_WRITE, b"_pgidgen_claim_" + kind.encode(), shard, search_path)
        self.call = ClaimForm(_CALL_READ if read_only else _CALL_WRITE, b"_pgidgen_call_" + kind.encode(), shard, search_path)


def has_claim_call(conn: psycopg.Connection[Any]) -> None:
    """psycopg_pool's configure: whether the new connection claims by CALL (claim_call). Asked once a connection:
    a catalog upgraded meanwhile is used from the next new connection on."""
    try:
        row = conn.execute(HAS_CALL_SQL, prepare=False).fetchone()
    except psycopg.Error:
        row = None  # the SELECT form, which says what is wrong when a unit claims
    conn.claim_call = bool(row and row[0])  # type: ignore[attr-defined]


async def async_has_claim_call(conn: psycopg.AsyncConnection[Any]) -> None:
    """has_claim_call for the AsyncRouter's pools."""
    try:
        row = await (await conn.execute(HAS_CALL_SQL, prepare=False)).fetchone()
    except psycopg.Error:
        row = None
    conn.claim_call = bool(row and row[0])  # type: ignore[attr-defined]


class Command:
    """A statement without parameters (BEGIN), prepared like the claim: the server then skips its Parse on every
    unit of work (measured: 5 us of a unit's 55 on one shared CPU)."""

    __slots__ = ("query", "params", "types", "formats", "name")

    def __init__(self, query: bytes, name: bytes) -> None:
        self.query = query
        self.params: list[bytes | None] | None = None
        self.types: tuple[int, ...] = ()
        self.formats = None
        self.name = name


BEGIN = Command(b"BEGIN", b"_pgidgen_begin")
BEGIN_READ = Command(b"BEGIN READ ONLY", b"_pgidgen_begin_r")


def _fast_path_available() -> bool:
    """The one-round-trip path drives libpq's pipeline directly with a few of psycopg's cursor internals (3.1+);
    anything missing and every statement takes the generic path (the claim a round trip of its own)."""
    needed = (*(hasattr(psycopg.Cursor, n) for n in ("_convert_query", "_check_results", "_set_results", "_reset")),
              hasattr(Prepare, "SHOULD"), hasattr(adapt, "Transformer"))
    return all(needed) and all(hasattr(generators, n) for n in ("send", "fetch_many", "execute")) and psycopg.Pipeline.is_supported()


class ClaimingCursor(psycopg.Cursor[Any]):
    def execute(self, query: Any, params: Any = None, *, prepare: bool | None = None, binary: bool | None = None) -> ClaimingCursor:
        conn = cast("ClaimingConnection", self._conn)
        if getattr(conn, "in_unit", False):
            refuse_ending(conn, query)
        claim = getattr(conn, "pending_claim", None)
        if claim is None or conn._pipeline is not None or not FAST:
            super().execute(query, params, prepare=prepare, binary=binary)
            return self
        conn.pending_claim = None
        try:
            with conn.lock:  # psycopg's wait, not the connection's: this generator's statement was looked at above
                _wait(conn, claimed_execute_gen(self, query, params, claim, prepare, binary, with_commit=conn.with_commit))
        except BaseException as ex:
            raise _failed_first(conn, claim, ex)  # noqa: B904 - the caught exception itself, raised again: no chain to state
        return self

    def copy(self, statement: Any, params: Any = None, *, writer: Any = None) -> Any:
        """As psycopg's: a string of several statements goes as one simple query, a COMMIT among them too."""
        if getattr(self._conn, "in_unit", False):
            refuse_ending(self._conn, statement)
        return super().copy(statement, params, writer=writer)


def _failed_first(conn: Any, claim: Claim, ex: BaseException) -> BaseException:
    """What to raise when a unit's first statement failed: the claim goes with the next statement if nothing left
    (psycopg refused the statement's parameters before sending), and psycopg's errors without the traceback."""
    if not conn.claim_sent:
        conn.pending_claim = claim
    return ex.with_traceback(None) if isinstance(ex, e._NO_TRACEBACK) else ex


def claimed_execute_gen(self: Any, query: Any, params: Any, claim: Claim, prepare: bool | None, binary: bool | None,
                        again: bool = True, with_commit: bool = False) -> Any:
    """BEGIN, the claim and the statement in one pipeline and one network write; the results in one read.
    psycopg's own pipeline sends each command on its own and costs more than the round trip it saves. BEGIN and
    the claim are prepared once per connection (unless the connection prepares nothing, as behind a transaction
    pooler), the statement as psycopg would prepare it. Should the server have lost them (the application
    ran DEALLOCATE in an earlier unit, where psycopg's cache did not see it), nothing ran after it: roll back,
    forget what the cache holds, and start over once.
    with_commit (Router.execute): COMMIT follows the statement in the same pipeline, one round trip in all. The
    transaction stays an explicit block, not the extended protocol's implicit one, so the server refuses there
    what would end the claim's transaction halfway, as in Router.run: PostgreSQL before 18 lets a procedure
    COMMIT in an implicit one and run on unclaimed. And the statement goes by the extended protocol even without
    parameters: one statement, never a string where a COMMIT ends the claim's transaction and the rest runs
    unclaimed (even writes, under read_only).
    self: a psycopg Cursor or AsyncCursor (the generator is psycopg's way to serve both)."""
    _start(self, query)
    pgq = self._convert_query(query, params)
    self._query = pgq
    fmt = self.format if binary is None else (pq.Format.BINARY if binary else pq.Format.TEXT)
    pgconn = self._pgconn
    if not pgq.params and fmt == pq.Format.TEXT and not with_commit:
        # no parameters: psycopg sends such a query as a simple one (it may hold several statements); so do we,
        # behind BEGIN and the claim in the same message
        self._conn.claim_sent = True
        form = claim.call if self._conn.claim_call else claim.select
        pgconn.send_query(claim.begin.query + b"; " + form.text + b"; " + pgq.query)
        results = yield from generators.execute(pgconn)
        if _DISCARDS:  # where psycopg has it (else: the retry below)
            self._conn._prepared._should_discard(Prepare.NO, results)  # DEALLOCATE ALL, ROLLBACK, DROP, ALTER: what the server forgot or may plan anew
        if any(res.command_status == b"DEALLOCATE ALL" for res in results[2:]):
            self._conn.own_prepared.clear()  # BEGIN's and the claims' go too (by name: the retry below)
        head, results = results[:2], results[2:]
        _raise_first(head, pgconn)
        self._check_results(results)
        self._set_results(results)
        self._last_query = query
        # now, as psycopg does after each statement: a DEALLOCATE ALL left for later would drop the claim the next
        # unit prepares again
        yield from self._conn._prepared.maintain_gen(self._conn)
        return
    if with_commit:
        # a connection whose server process ended while it sat in the pool (a restart, an idle timeout) is found
        # out here, before the write leaves, and Router.execute tries again on another; found out after, the
        # server may have committed the write, and the error is the caller's. Two reads: libpq takes the server's
        # last words (an error it files as a notice) in one, and sees the end of the stream only in the next.
        pgconn.consume_input()
        pgconn.consume_input()
    conn = self._conn
    prepared = conn._prepared
    own = conn.own_prepared if prepared.prepare_threshold is not None else None  # None: the connection prepares nothing
    prep, name = prepared.get(pgq, prepare)
    conn.claim_sent = True  # from here on the claim may have left (the caller puts it back if not)
    pgconn.enter_pipeline_mode()
    done = False
    try:
        begin = claim.begin
        form = claim.call if conn.claim_call else claim.select
        bnew, cnew = _send_head(pgconn, own, begin, form)
        key = _send(pgconn, prepared, pgq, prep, name, fmt)
        if with_commit:  # not prepared: a COMMIT the server lost would fail after the statement ran
            pgconn.send_query_params(b"COMMIT", None)
        pipeline_sync(pgconn)  # without the interpreter lock: nogil.py
        conn.commit_sent = with_commit
        yield from generators.send(pgconn)
        head = (yield from generators.fetch_many(pgconn)) if bnew else []
        began = yield from generators.fetch_many(pgconn)  # BEGIN
        head += began
        if cnew:
            head += yield from generators.fetch_many(pgconn)
        claimed = yield from generators.fetch_many(pgconn)
        head += claimed
        if prep is Prepare.SHOULD:
            head += yield from generators.fetch_many(pgconn)
        results = yield from generators.fetch_many(pgconn)
        committed = (yield from generators.fetch_many(pgconn)) if with_commit else []
        synced = yield from generators.fetch_many(pgconn)  # the sync (an error first, were there one)
        while synced and synced[-1].status != pq.ExecStatus.PIPELINE_SYNC:
            synced += yield from generators.fetch_many(pgconn)
        done = True
    finally:
        try:
            pgconn.exit_pipeline_mode()
        except psycopg.Error:
            if done:
                raise
    if key is not None:
        prepared.validate(key, prep, name, results)
    if _DISCARDS:  # as after the simple query: a DEALLOCATE ALL psycopg's cache saw before
        prepared._should_discard(Prepare.NO, results)
    failed = not claimed or claimed[-1].status not in _CLAIMED  # (aborted, after an error before it)
    if failed and prep is Prepare.SHOULD:
        prepared.clear()  # the statement's Parse was aborted with the rest, where psycopg's cache counts it prepared
    if own is not None and not failed:
        if bnew:
            own.add(begin.name)
        if cnew:
            own.add(form.name)
    if failed and again and own is not None and _lost(head):
        # the server has not got a statement this connection prepared (an application's DEALLOCATE in an
        # earlier unit), or has one it was to prepare: nothing ran after it. Start over once, both sides cleared
        yield from conn._exec_command(b"ROLLBACK")
        prepared.clear()
        yield from prepared.maintain_gen(conn)  # psycopg's DEALLOCATE ALL, if its cache held any
        yield from conn._deallocate_all()  # and ours, whatever the server holds
        conn.claim_sent = False  # rolled back: the claim leaves again, with the statement
        return (yield from claimed_execute_gen(self, query, params, claim, prepare, binary, again=False, with_commit=with_commit))
    if failed or prep is Prepare.SHOULD:  # (BEGIN, the claim or a Parse: what ran before the statement)
        _raise_first(head, pgconn)
    self._check_results(results)
    if committed or len(synced) > 1:  # a COMMIT that failed (a deferred constraint): nothing of it stays
        _raise_first(committed + synced, pgconn)
    self._set_results(results)
    self._last_query = query
    if getattr(prepared, "_to_flush", True):  # psycopg's DEALLOCATEs due, if any (the generator costs more than the look)
        yield from prepared.maintain_gen(self._conn)


def _start(cursor: Any, query: Any) -> None:
    """psycopg's Cursor._start_query for a unit's claimed first statement, without the connection's part (an
    autocommit connection starts nothing; the claim is this statement's, taken off already): a few generator
    frames less per unit."""
    if cursor.closed:
        raise e.InterfaceError("the cursor is closed")
    cursor._reset()
    if not cursor._last_query or cursor._last_query is not query:
        cursor._last_query = None
        cursor._tx = adapt.Transformer(cursor)


#: psycopg (3.2+) forgets its prepared statements after a DEALLOCATE ALL, ROLLBACK, DROP or ALTER it sees
_DISCARDS = hasattr(psycopg._preparing.PrepareManager, "_should_discard")

#: a claim that ran: the SELECT's row, or the CALL's completion
_CLAIMED = (pq.ExecStatus.TUPLES_OK, pq.ExecStatus.COMMAND_OK)


def _send_head(pgconn: Any, own: set[bytes] | None, begin: Command, form: ClaimForm) -> tuple[bool, bool]:
    """Queue BEGIN and the claim in the pipeline, by the names of their own this connection prepares them under
    (psycopg's cache would spend a microsecond a statement keeping count of them); whether a Parse went with
    each."""
    if own is None:  # the connection prepares nothing (behind a transaction pooler)
        pgconn.send_query_params(begin.query, None)
        pgconn.send_query_params(form.query, form.params, param_types=form.types)
        return False, False
    new = []
    for q in (begin, form):
        if q.name in own:
            new.append(False)
        else:
            pgconn.send_prepare(q.name, q.query, param_types=q.types)
            new.append(True)
        pgconn.send_query_prepared(q.name, q.params)
    return new[0], new[1]


#: the server has no such prepared statement, or has one by that name already
_LOST = frozenset({LOST_STATEMENT, b"42P05"})


def _lost(head: list[Any]) -> bool:
    return any(res.status == pq.ExecStatus.FATAL_ERROR and res.error_field(DIAG_SQLSTATE) in _LOST for res in head)


def _send(pgconn: Any, prepared: Any, q: Any, prep: Prepare, name: bytes, fmt: pq.Format) -> Any:
    """Queue q (a PostgresQuery or a Claim) in the pipeline, prepared if the cache says so; its cache key."""
    if prep is Prepare.NO:
        pgconn.send_query_params(q.query, q.params, param_formats=q.formats, param_types=q.types, result_format=fmt)
    else:
        if prep is Prepare.SHOULD:
            pgconn.send_prepare(name, q.query, param_types=q.types)
        pgconn.send_query_prepared(name, q.params, param_formats=q.formats, result_format=fmt)
    return prepared.maybe_add_to_cache(q, prep, name)


def _raise_first(results: list[Any], pgconn: Any) -> None:
    for res in results:
        if res.status == pq.ExecStatus.FATAL_ERROR:
            raise e.error_from_result(res, encoding=pgconn._encoding)


FAST = _fast_path_available()


class _Unit:
    """What the sync and async connection classes share: the claim held back until the first statement."""

    pending_claim: Claim | None = None
    #: claims by CALL pgidgen.claim (has_claim_call), else by the SELECT of claim_shard
    claim_call = False
    #: the unit's transaction began with its claim: from then on it must not end before the unit does
    claim_sent = False
    in_unit = False
    with_commit = False
    #: a COMMIT left with the statement (Router.execute): broken after that, the write may have been committed
    commit_sent = False

    #: BEGIN's and the claims' statement names this connection prepared on the server (its own, apart from
    #: psycopg's cache; set per connection in __init__)
    own_prepared: set[bytes]

    def _deallocate(self, name: bytes | None) -> Any:  # psycopg's generator for DEALLOCATE (3.2+)
        if name is None:  # DEALLOCATE ALL: ours go too
            self.own_prepared.clear()
        return (yield from super()._deallocate(name))  # type: ignore[misc]

    def _deallocate_all(self) -> Any:
        self.own_prepared.clear()
        yield from self._exec_command(b"DEALLOCATE ALL")  # type: ignore[attr-defined]

    def begin_unit(self, claim: Claim, with_commit: bool = False) -> None:
        self.pending_claim = claim
        self.claim_sent = False
        self.in_unit = True
        self.with_commit = with_commit
        self.commit_sent = False

    def end_unit(self) -> bool:
        """Leave the unit; whether its transaction began (the claim was sent)."""
        began = self.pending_claim is None
        self.pending_claim = None
        self.in_unit = False
        return began

    def _start_query(self) -> Any:  # psycopg's generator that every statement starts with
        claim = self.pending_claim
        if claim is None:
            if self.claim_sent and self.in_unit and self.pgconn.transaction_status == pq.TransactionStatus.IDLE:  # type: ignore[attr-defined]
                raise psycopg.ProgrammingError(GONE)  # see ending.py
            return (yield from super()._start_query())  # type: ignore[misc]
        self.pending_claim = None
        yield from self._exec_command(claim.begin.query)  # type: ignore[attr-defined]
        yield from self._exec_command((claim.call if self.claim_call else claim.select).text)  # type: ignore[attr-defined]
        self.claim_sent = True
        return None


class ClaimingConnection(_Unit, psycopg.Connection[Any]):
    """An autocommit connection that, between begin_unit() and end_unit(), opens its transaction with the claim."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.cursor_factory = ClaimingCursor
        self.own_prepared = set()

    def claim_now(self) -> None:
        if self.pending_claim is not None:
            with self.lock:
                self.wait(self._start_query())

    def wait(self, gen: Any, *args: Any, **kwargs: Any) -> Any:
        """psycopg's: every statement a cursor sends passes here, that of a cursor class not the connection's too."""
        if self.in_unit:
            refuse_sending(self, gen, CHECKED)
        return super().wait(gen, *args, **kwargs)

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

    def commit_unit(self) -> None:
        """The unit's COMMIT, once it has ended (end_unit): psycopg's commit() without the calls in between."""
        with self.lock:
            _wait(self, self._commit_gen())

    def rollback(self) -> None:
        if self.in_unit:
            raise psycopg.ProgrammingError(IN_UNIT)
        super().rollback()


class AsyncClaimingCursor(psycopg.AsyncCursor[Any]):
    async def execute(self, query: Any, params: Any = None, *, prepare: bool | None = None, binary: bool | None = None) -> AsyncClaimingCursor:
        conn = cast("AsyncClaimingConnection", self._conn)
        if getattr(conn, "in_unit", False):
            refuse_ending(conn, query)
        claim = getattr(conn, "pending_claim", None)
        if claim is None or conn._pipeline is not None or not FAST:
            await super().execute(query, params, prepare=prepare, binary=binary)
            return self
        conn.pending_claim = None
        try:
            async with conn.lock:  # ClaimingCursor.execute
                await _async_wait(conn, claimed_execute_gen(self, query, params, claim, prepare, binary, with_commit=conn.with_commit))
        except BaseException as ex:
            raise _failed_first(conn, claim, ex)  # noqa: B904 - the caught exception itself, raised again: no chain to state
        return self

    def copy(self, statement: Any, params: Any = None, *, writer: Any = None) -> Any:
        """ClaimingCursor.copy."""
        if getattr(self._conn, "in_unit", False):
            refuse_ending(self._conn, statement)
        return super().copy(statement, params, writer=writer)


class AsyncClaimingConnection(_Unit, psycopg.AsyncConnection[Any]):
    """ClaimingConnection for asyncio (AsyncRouter)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.cursor_factory = AsyncClaimingCursor
        self.own_prepared = set()

    async def claim_now(self) -> None:
        if self.pending_claim is not None:
            async with self.lock:
                await self.wait(self._start_query())

    async def wait(self, gen: Any, *args: Any, **kwargs: Any) -> Any:
        """ClaimingConnection.wait."""
        if self.in_unit:
            refuse_sending(self, gen, CHECKED)
        return await super().wait(gen, *args, **kwargs)

    @asynccontextmanager
    async def transaction(self, savepoint_name: str | None = None, force_rollback: bool = False) -> AsyncIterator[psycopg.AsyncTransaction]:
        await self.claim_now()
        async with super().transaction(savepoint_name, force_rollback) as tx:
            yield tx

    async def commit(self) -> None:
        if self.in_unit:
            raise psycopg.ProgrammingError(IN_UNIT)
        await super().commit()

    async def commit_unit(self) -> None:
        """ClaimingConnection.commit_unit."""
        async with self.lock:
            await _async_wait(self, self._commit_gen())

    async def rollback(self) -> None:
        if self.in_unit:
            raise psycopg.ProgrammingError(IN_UNIT)
        await super().rollback()


_wait = psycopg.Connection.wait
_async_wait = psycopg.AsyncConnection.wait

#: the cursor classes whose execute() and copy() look at their text themselves
CHECKED = (ClaimingCursor, AsyncClaimingCursor)
