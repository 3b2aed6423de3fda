"""Router.fan_out: one statement on every shard (or the given ones), in one round trip per database, the databases
in parallel, the rows merged (fanmerge.py).

Each database is sent one pipeline: for every chunk of its shards (fansql.CHUNK), a transaction that claims them all
(pgidgen.claim_shard of each, a read claim unless read_only=False) and runs the statement over them (fansql.py: the
statement once per shard, qualified with its schema, under UNION ALL); one network write, one read.

Every shard is read exactly once, on the database that serves it at that moment, as Router.run reads it:
- the map (the cache of every catalog) decides where each shard is tried;
- the claim reads that database's own row of each shard of the chunk, and refuses the chunk (PGR01) unless each is
  'active' or 'moving' there: a shard a move retired is not read there, and its chunk reads nothing;
- a move that retires a shard after its claim renames its schema: the chunk's statement, which names the schema,
  fails (3F000/42P01) if it starts after that, and reads nothing; if it started before, it reads the old copy,
  which a move leaves complete as of its flip (it blocked the shard's writes, copied them, then flipped) — the
  shard read once, as of the flip, as a read-only Router.run overlapping the flip reads it;
- a chunk that failed so is rolled back; the database's own rows of its shards say which it no longer serves: those
  are routed again by the map, re-read (retried for up to retry_for seconds, as Router.run's), and read where they
  are now; the others, and the chunks after a failed one in the pipeline (which the server skipped), are read again.
Different shards are read at different moments: a fan-out is not one snapshot of the whole fleet. A write fan-out
(read_only=False) takes each shard's claim lock (a move's flip waits for it) and commits chunk by chunk.

A database that cannot be connected to raises DatabaseUnavailableError naming it and the shards not read, or, with
partial=True, is left out: the result holds what the others returned and names what is missing."""
from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Generator, Iterable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import psycopg
from psycopg import errors as e
from psycopg import generators, pq, sql
from psycopg._preparing import Prepare
from psycopg._queries import PostgresQuery
from psycopg.adapt import Transformer

from ..config import Config, describe_dsn
from ..db import pg_message
from ..errors import DatabaseUnavailableError, InputError, PgidgenError, QueryError, ShardMovedError, ShardUnavailableError
from ..idgen import schema_name
from ..ranges import collapse
from .claiming import _send
from .fanmerge import Combine, FanOutResult, Stream, parse_combine
from .fansql import (
    CHUNK,
    CLAIM_SQL,
    CLAIM_TYPES,
    NAMES_SQL,
    Order,
    ShardNames,
    Template,
    chunk_sql,
    claim_params,
    claim_text,
    parse_order,
    rewrite,
)
from .mapcache import MapCache, RoutingMap
from .nogil import pipeline_sync
from .pools import Pools
from .unit import MOVE_SYMPTOMS, NOT_SERVED, Units

BEGIN = b"BEGIN"
BEGIN_READ = b"BEGIN READ ONLY"
COMMIT = b"COMMIT"
TUPLES_OK = pq.ExecStatus.TUPLES_OK
PIPELINE_SYNC = pq.ExecStatus.PIPELINE_SYNC
PIPELINE_ABORTED = pq.ExecStatus.PIPELINE_ABORTED
INERROR = pq.TransactionStatus.INERROR
#: a name the statement uses that no schema on the path has: maybe one the shards got since their names were read
NAME_MISSING = frozenset({"42P01", "42883", "42704", "3F000"})
#: the server has not got a statement psycopg's cache says it prepared (an application's DEALLOCATE)
LOST_STATEMENT = "26000"
#: templates kept (by the statement's text), and chunks' statements
TEMPLATES = 128
CHUNKS = 512


@dataclass(frozen=True)
class Spec:
    """What the caller asked for."""

    query: Any
    params: Any = None
    order: tuple[Order, ...] = ()
    limit: int | None = None
    read_only: bool = True
    with_shard: bool = False
    combine: Combine = None
    partial: bool = False

    @classmethod
    def make(cls, query: Any, params: Any = None, *, order_by: str | Sequence[str] | None = None, limit: int | None = None,
             read_only: bool = True, with_shard: bool = False, combine: Combine = None, partial: bool = False) -> Spec:
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 0):
            raise InputError(f"limit must be a whole number from 0, not {limit!r}")
        if combine is not None and with_shard:
            raise InputError("combine and with_shard do not go together: a combined row is every shard's",
                             hint="drop with_shard, or combine yourself by the shard column")
        if combine is not None:
            parse_combine(combine, [""] * (1 if isinstance(combine, str) else len(combine)))  # the names now, the count with the columns
        return cls(query, params, parse_order(order_by), limit, read_only, with_shard, combine, partial)


@dataclass
class Outcome:
    """One database's part of a round."""

    streams: list[Stream] = field(default_factory=list)
    #: the database no longer serves them (its own rows say so): to be read where they are now
    moved: list[int] = field(default_factory=list)
    #: not read this time (after another chunk failed, or the connection broke): to be read again
    again: list[int] = field(default_factory=list)
    #: a name the shard schema may have got since its names were read: read them again, once a fan-out
    stale: bool = False
    error: PgidgenError | None = None


class _Statement:
    """What claiming._send and psycopg's prepared-statement cache need of a query."""

    __slots__ = ("query", "params", "types", "formats")

    def __init__(self, query: bytes, like: Any) -> None:
        self.query = query
        self.params, self.types, self.formats = like.params, like.types, like.formats


class FanOut:
    """A Router's fan-outs: the names of the shard schemas and the templates made with them (shared by every
    fan-out of the Router), and the threads that read databases in parallel."""

    def __init__(self, config: Config, pools: Pools, maps: MapCache, units: Units) -> None:
        self.config = config
        self.pools = pools
        self.maps = maps
        self.units = units
        self.search_path = sql.SQL(", ").join(sql.Identifier(s) for s in units.search_path).as_string(None)
        self._names: ShardNames | None = None
        self._templates: OrderedDict[bytes, Template] = OrderedDict()
        self._chunks: OrderedDict[tuple[Any, ...], str] = OrderedDict()
        self._lock = threading.Lock()
        self._executor: ThreadPoolExecutor | None = None

    def close(self) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=True)

    def forget(self) -> None:
        """The shard schemas' names and the templates made with them are read and made again on next use."""
        with self._lock:
            self._names = None
            self._templates.clear()
            self._chunks.clear()

    # -- the sync Router's: databases on threads ----------------------------------------------------------

    def run(self, spec: Spec, shards: Iterable[int] | None) -> FanOutResult:
        rounds = Rounds(self, spec, shards, self.maps.get())
        while rounds.pending:
            by_database = rounds.plan(self.maps.get())
            wait = rounds.settle(self._each(by_database, spec))
            if wait:
                time.sleep(wait)
        return rounds.result()

    def _each(self, by_database: dict[str, list[int]], spec: Spec) -> dict[str, Outcome | BaseException]:
        names = list(by_database)
        out: dict[str, Outcome | BaseException] = {}
        futures: dict[str, Future[Outcome]] = {}
        if len(names) > 1:
            if self._executor is None:
                with self._lock:
                    if self._executor is None:
                        self._executor = ThreadPoolExecutor(max_workers=len(self.config.databases), thread_name_prefix="pgidgen-fan-out")
            futures = {name: self._executor.submit(self.read, name, by_database[name], spec) for name in names[1:]}
        for name in names:
            try:
                out[name] = futures[name].result() if name in futures else self.read(name, by_database[name], spec)
            except BaseException as ex:  # every database's outcome first (their connections go back), then it is raised
                out[name] = ex
        return out

    def read(self, name: str, shards: list[int], spec: Spec) -> Outcome:
        """One database's shards in one pipeline, on a pooled connection."""
        try:
            conn = self.pools.borrow(name)
        except DatabaseUnavailableError as ex:
            return Outcome(error=ex)
        sent: list[bool] = []
        try:
            with conn.lock:
                return psycopg.Connection.wait(conn, read_gen(self, conn, name, shards, spec, sent))
        except psycopg.Error as ex:
            return self.broken(conn, name, shards, spec, sent, ex, self.pools.lost)
        finally:
            self.pools.give_back(name, conn)

    def broken(self, conn: Any, name: str, shards: list[int], spec: Spec, sent: list[bool], ex: psycopg.Error,
               lost: Callable[[str], DatabaseUnavailableError | None]) -> Outcome:
        """After ex ended a database's part on conn: what the round makes of it (ex itself, raised, unless the
        connection broke: the database down, or that connection's alone, read again on a new one, unless writes had
        left on it: those may have committed, and are not sent again)."""
        if not conn.broken:
            raise ex
        down = lost(name)
        if down is not None:
            return Outcome(error=down)
        if sent and not spec.read_only:
            raise ex
        return Outcome(again=list(shards))

    # -- what a database is sent ---------------------------------------------------------------------------

    def render(self, spec: Spec, shards: Iterable[int] | None) -> dict[str, list[str]]:
        """The rendering twin of run(): per database, the SQL it would be sent now (its parameters as literals),
        one line a statement; nothing of the statement runs (the shard schemas' names are read)."""
        m = self.maps.get()
        rounds = Rounds(self, spec, shards, m)
        by_database = rounds.plan(m)
        if rounds.down:
            raise rounds._missing()[0]
        if rounds.waiting:
            raise rounds.unavailable or ShardUnavailableError(f"no database serves shards {collapse(rounds.waiting)} right now")
        begin = (BEGIN_READ if spec.read_only else BEGIN).decode()
        out: dict[str, list[str]] = {}
        for name, part in by_database.items():
            with self.pools.connection(name) as conn:
                text = psycopg.ClientCursor(conn).mogrify(spec.query, spec.params) if spec.params is not None else spec.query
                if isinstance(text, sql.Composable):
                    text = text.as_string(conn)
                elif isinstance(text, bytes):
                    text = text.decode(conn.info.encoding)
                template = rewrite(text, conn.wait(names_gen(self, conn, part[0])))
            template.check(spec.read_only)
            lines = out[name] = []
            chunks = [part[i:i + CHUNK] for i in range(0, len(part), CHUNK)]
            for chunk, claim in zip(chunks, claimed(chunks, spec.read_only), strict=True):
                lines += [f"{begin};", f"{claim_text(claim, self.search_path, not spec.read_only)};",
                          self.chunk(b"literal:" + text.encode(), template, chunk, spec) + ";", "COMMIT;"]
        return out

    def cached(self, text: bytes) -> Template | None:
        with self._lock:
            template = self._templates.get(text)
            if template is not None:
                self._templates.move_to_end(text)
            return template

    def keep(self, text: bytes, template: Template) -> None:
        with self._lock:
            self._templates[text] = template
            while len(self._templates) > TEMPLATES:
                self._templates.popitem(last=False)

    def chunk(self, key: bytes, template: Template, shards: list[int], spec: Spec) -> str:
        """chunk_sql for these shards, kept while the same fan-outs run (the map, so the chunks, rarely change).
        A combine's order and limit are the combined rows', not pushed to the shards."""
        order, limit = (spec.order, spec.limit) if spec.combine is None else ((), None)
        k = (key, tuple(shards), order, limit, spec.with_shard)
        with self._lock:
            text = self._chunks.get(k)
            if text is not None:
                self._chunks.move_to_end(k)
                return text
        text = chunk_sql(template, shards, order=order, limit=limit, with_shard=spec.with_shard)
        with self._lock:
            self._chunks[k] = text
            while len(self._chunks) > CHUNKS:
                self._chunks.popitem(last=False)
        return text

    def where(self, name: str) -> str:
        return f"{name}, {describe_dsn(self.config.app_dsn(name))}"


def read_gen(fan: FanOut, conn: Any, name: str, shards: list[int], spec: Spec, sent: list[bool]) -> Generator[Any, Any, Outcome]:
    """One database's part of a round, as a psycopg generator (the sync Router waits for it on a thread, the
    AsyncRouter awaits it): the statement per chunk, the pipeline, then, if a chunk failed, the rollback and the
    database's own rows of its shards. sent gets True once the pipeline may have left."""
    encoding = conn.info.encoding
    pgq = PostgresQuery(Transformer(conn))
    pgq.convert(spec.query, spec.params)
    template = fan.cached(pgq.query)
    if template is None:
        template = rewrite(pgq.query.decode(encoding), (yield from names_gen(fan, conn, shards[0])))
        fan.keep(pgq.query, template)
    template.check(spec.read_only)
    chunks = [shards[i:i + CHUNK] for i in range(0, len(shards), CHUNK)]
    statements = [_Statement(fan.chunk(pgq.query, template, c, spec).encode(encoding), pgq) for c in chunks]
    claims = [claim_params(c, fan.search_path, not spec.read_only) for c in claimed(chunks, spec.read_only)]
    if not spec.read_only:  # a server process that ended while the connection sat in the pool shows here, before
        conn.pgconn.consume_input()  # any write leaves (two reads: its last words, then the end of the stream)
        conn.pgconn.consume_input()
    sent.append(True)
    done = yield from _pipeline(conn, statements, claims, spec.read_only)
    if conn.pgconn.transaction_status == INERROR:
        yield from conn._exec_command(b"ROLLBACK")
    out = Outcome()
    again: set[int] = set()
    suspects: list[tuple[list[int], psycopg.Error]] = []  # failed the way a move would fail them
    for chunk, (status, payload) in zip(chunks, done, strict=True):
        state = getattr(payload, "sqlstate", None)
        if status == "ok":
            out.streams.append(Stream(name, chunk, payload, Transformer(conn), encoding))
        elif status == "aborted" or state == LOST_STATEMENT:
            again.update(chunk)  # skipped after another chunk's error; or prepared on a server that has forgotten it
            if payload is not None:
                conn._prepared.clear()
        elif status == "claim" and state == NOT_SERVED:  # a read's claim is the database's shards', in its first chunk
            suspects.append((shards if spec.read_only else chunk, payload))
        elif status == "statement" and state in MOVE_SYMPTOMS | NAME_MISSING:
            suspects.append((chunk, payload))
        else:
            out.error = _failed(fan, name, chunk, payload, status, spec.read_only)
            return out
    if suspects:
        asked = sorted({s for chunk, _ in suspects for s in chunk})
        res = yield from conn._exec_command(
            f"SELECT shard FROM pgidgen.shards WHERE shard = ANY('{{{','.join(map(str, asked))}}}'::pg_catalog.int4[])"
            " AND state IN ('active', 'moving')".encode())
        served = {int(res.get_value(i, 0)) for i in range(res.ntuples)}
        for chunk, err in suspects:
            gone = [s for s in chunk if s not in served]
            if gone or err.sqlstate == NOT_SERVED:
                out.moved += gone
                again.update(s for s in chunk if s in served)
            elif err.sqlstate in NAME_MISSING:
                out.stale = True
                again.update(chunk)
                out.error = _failed(fan, name, chunk, err, "statement", spec.read_only)  # raised if the names were read again already
            else:
                out.error = _failed(fan, name, chunk, err, "statement", spec.read_only)
                return out
    out.again = sorted(again - set(out.moved))
    return out


def claimed(chunks: list[list[int]], read_only: bool) -> list[list[int]]:
    """The shards each chunk's claim names. A write claims its chunk's in its transaction (their claim locks are
    held until it commits). A read holds no lock: all the database's shards are checked at once, before any chunk's
    statement runs, by the first chunk's claim (one statement for them all: a tenth of the cost of one a chunk)."""
    if not read_only:
        return chunks
    return [[s for c in chunks for s in c], *([] for _ in chunks[1:])]


def names_gen(fan: FanOut, conn: Any, shard: int) -> Generator[Any, Any, ShardNames]:
    """The names the shard schemas hold, read from shard's (a shard conn's database serves) unless known."""
    names = fan._names
    if names is None:
        encoding = conn.info.encoding
        res = yield from conn._exec_command(sql.SQL(NAMES_SQL).format(schema=sql.Literal(schema_name(shard))).as_bytes(conn))
        names = fan._names = ShardNames.from_rows(
            (res.get_value(i, 0).decode(encoding), res.get_value(i, 1).decode(encoding)) for i in range(res.ntuples))
    return names


def _failed(fan: FanOut, name: str, chunk: Sequence[int], err: psycopg.Error, status: str, read_only: bool) -> PgidgenError:
    state = getattr(err, "sqlstate", None)
    message = pg_message(err)
    if state == "42883" and "claim_shard" in message:
        return QueryError(f"database {name} has a pgidgen catalog without pgidgen.claim_shard()", database=name, shards=chunk,
                          sqlstate=state, where=fan.where(name), hint="upgrade it: run pgidgen's sql/catalog.sql there (idempotent)")
    what = {"claim": "claiming its shards", "commit": "committing"}.get(status, "the statement")
    error = QueryError(f"the fan-out failed on database {name}, shards {collapse(chunk)}, at {what}: {message}",
                       database=name, shards=chunk, sqlstate=state, where=fan.where(name),
                       hint="fix the statement" if read_only else f"fix the statement; a write fan-out commits {CHUNK} shards at a time, so"
                       " other shards' writes may have committed: make it safe to run again, and run it again")
    error.__cause__ = err
    return error


def _pipeline(conn: Any, statements: list[_Statement], claims: list[list[bytes | None]], read_only: bool) -> Generator[Any, Any, list[tuple[str, Any]]]:
    """Every chunk's BEGIN, claim, statement and COMMIT in one pipeline (one Sync: after an error the server skips
    the rest, which is read again); per chunk ("ok", its result), ("claim" | "statement" | "commit", the error) or
    ("aborted", None). The statements are prepared as psycopg prepares any (after a few runs, where the connection
    prepares at all): a chunk's plan is most of its cost, and stays valid while the map does."""
    pgconn = conn.pgconn
    prepared = conn._prepared
    sent: list[tuple[Prepare, bytes, Any]] = []
    rows: list[tuple[list[Any], list[Any], list[Any]]] = []
    pgconn.enter_pipeline_mode()
    done = False
    try:
        for statement, claim in zip(statements, claims, strict=True):
            pgconn.send_query_params(BEGIN_READ if read_only else BEGIN, None)
            pgconn.send_query_params(CLAIM_SQL, claim, param_types=CLAIM_TYPES)
            prep, pname = prepared.get(statement, None)
            sent.append((prep, pname, _send(pgconn, prepared, statement, prep, pname, pq.Format.TEXT)))
            pgconn.send_query_params(COMMIT, None)
        pipeline_sync(pgconn)
        yield from generators.send(pgconn)
        for prep, _, _ in sent:
            yield from generators.fetch_many(pgconn)  # BEGIN
            claimed = yield from generators.fetch_many(pgconn)
            if prep is Prepare.SHOULD:
                claimed += yield from generators.fetch_many(pgconn)  # the statement's Parse
            results = yield from generators.fetch_many(pgconn)
            committed = yield from generators.fetch_many(pgconn)
            rows.append((claimed, results, committed))
        synced = yield from generators.fetch_many(pgconn)
        while synced and synced[-1].status != PIPELINE_SYNC:
            synced += yield from generators.fetch_many(pgconn)
        done = True
    finally:
        try:
            pgconn.exit_pipeline_mode()
        except psycopg.Error:
            if done:
                raise
    out: list[tuple[str, Any]] = []
    lost = False
    for (prep, pname, key), (claimed, results, committed) in zip(sent, rows, strict=True):
        if key is not None:
            prepared.validate(key, prep, pname, results)
        if prep is Prepare.SHOULD and not (results and results[-1].status == TUPLES_OK):
            lost = True  # its Parse did not run, where psycopg's cache counts it prepared
        failed = next((("claim" if r in claimed else "statement" if r in results else "commit", r)
                       for r in (*claimed, *results, *committed) if r.status == pq.ExecStatus.FATAL_ERROR), None)
        if failed is not None:
            out.append((failed[0], e.error_from_result(failed[1], encoding=conn.info.encoding)))
        elif not results or results[-1].status == PIPELINE_ABORTED or any(r.status == PIPELINE_ABORTED for r in committed):
            out.append(("aborted", None))
        else:
            out.append(("ok", results[-1]))
    if lost:
        prepared.clear()
    if getattr(prepared, "_to_flush", True):
        yield from prepared.maintain_gen(conn)
    return out


class Rounds:
    """One fan-out across its rounds: the shards still to read, the streams read, the databases that did not
    answer; how long to wait before the next round when a move has the map behind."""

    def __init__(self, fan: FanOut, spec: Spec, shards: Iterable[int] | None, first: RoutingMap) -> None:
        self.fan = fan
        self.spec = spec
        asked = range(first.shard_count) if shards is None else sorted(set(shards))
        if shards is not None:
            for s in asked:
                if isinstance(s, bool) or not isinstance(s, int) or not 0 <= s < first.shard_count:
                    raise InputError(f"shard {s!r} does not exist", hint=f"shards are numbered 0 to {first.shard_count - 1}")
        self.asked = list(asked)
        self.pending = list(asked)
        self.streams: list[Stream] = []
        self.down: dict[str, tuple[DatabaseUnavailableError, list[int]]] = {}
        self.refused: dict[int, str] = {}  # shard -> the database that said it no longer serves it
        self.deadline = time.monotonic() + fan.units.retry_for
        self.delay = 0.005
        self.renamed = False
        self.waiting: list[int] = []
        self.planned: dict[str, list[int]] = {}
        self.unavailable: ShardUnavailableError | None = None

    def plan(self, m: RoutingMap) -> dict[str, list[int]]:
        """The pending shards by the database the map says serves each; those no database serves right now (a
        move is switching them over), or only the one that just refused them, wait for the next round."""
        by_database: dict[str, list[int]] = {}
        self.waiting = []
        for s in self.pending:
            try:
                database = m.route(s).database
            except ShardUnavailableError as ex:
                self.waiting.append(s)
                self.unavailable = ex
                continue
            except DatabaseUnavailableError as ex:  # served by no database that answers: the one down has it, most likely,
                database = ex.database  # and reading there says why it is down (or reads it, if it is back)
            if self.refused.get(s) == database:  # the map has not caught up with the move yet
                self.waiting.append(s)
                continue
            by_database.setdefault(database, []).append(s)
        self.pending = []
        self.planned = by_database
        return by_database

    def settle(self, outcomes: dict[str, Outcome | BaseException]) -> float:
        """Take in a round's outcomes; the seconds to wait before the next (0: at once), or raise."""
        moved: list[int] = []
        stale = False
        for name, out in outcomes.items():
            if isinstance(out, BaseException):
                raise out
            if isinstance(out.error, DatabaseUnavailableError):
                self.down.setdefault(name, (out.error, []))[1].extend(self.planned[name])
                continue
            if out.error is not None and not (out.stale and not self.renamed):
                raise out.error
            stale = stale or out.stale
            self.streams += out.streams
            self.pending += out.again
            moved += out.moved
            for s in out.moved:
                self.refused[s] = name
        if self.down and not self.spec.partial:
            raise self._missing()[0]
        if stale:
            self.renamed = True
            self.fan.forget()
        self.pending += moved + self.waiting
        if not self.pending:
            return 0.0
        self.fan.units.stats["retries"] += 1
        if moved:
            self.fan.maps.invalidate()
            self.fan.units.stats["moved"] += len(moved)
        if time.monotonic() >= self.deadline:
            raise self._late(moved)
        if self.waiting:
            self.fan.maps.invalidate()
            wait, self.delay = min(self.delay, max(0.0, self.deadline - time.monotonic())), min(self.delay * 2, 0.25)
            return wait
        return 0.0

    def _late(self, moved: list[int]) -> PgidgenError:
        if self.waiting and self.unavailable is not None:
            return ShardUnavailableError(f"no database serves shards {collapse(self.waiting)} right now; the fan-out read the others",
                                         hint=self.unavailable.hint)
        shard = (moved or self.pending)[0]
        database = self.refused.get(shard, "?")
        return ShardMovedError(f"database {database} no longer serves shards {collapse(moved or self.pending)}, and the map has not"
                               f" caught up within {self.fan.units.retry_for:g}s", shard=shard, database=database,
                               hint="the shards moved: retry the fan-out")

    def _missing(self) -> list[DatabaseUnavailableError]:
        out = []
        for name, (ex, shards) in self.down.items():
            out.append(DatabaseUnavailableError(f"{ex.what}; its shards {collapse(shards)} were not read", database=name,
                                                shards=sorted(shards), where=ex.where, hint=ex.hint))
        return out

    def result(self) -> FanOutResult:
        spec = self.spec
        first = self.streams[0] if self.streams else None
        columns = first.columns if first is not None else []
        combine = parse_combine(spec.combine, columns, first.types()) if spec.combine is not None and first is not None else None
        missing = {s for _, shards in self.down.values() for s in shards}
        return FanOutResult(self.streams, columns, [s for s in self.asked if s not in missing], order=spec.order if first else (),
                            limit=spec.limit, combine=combine, missing=self._missing())


__all__ = ["FanOut", "Outcome", "Rounds", "Spec", "read_gen"]
