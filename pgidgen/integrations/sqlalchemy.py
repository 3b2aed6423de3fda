"""SQLAlchemy 2: a ShardedSession (sqlalchemy.ext.horizontal_shard) whose shard ids are pgidgen's shard numbers.

    sharding = Sharding(Router.from_config())           # one engine per pgidgen database, through its app_dsn
    photo_id = sharding.run(router.shard_for(user_id), lambda session: add(session, Photo(user_id=user_id)))
    photo = sharding.run(router.shard_of(photo_id), lambda session: session.get(Photo, photo_id))

Shard N's bind is its database's engine (Router.database_for) with schema_translate_map {None: "shard_N"}: an
engine of its own to the session, so every shard gets its own connection and transaction, and that transaction
starts with pgidgen.claim_shard(N) (search_path is set as well, for text() SQL). Binds are chosen again from the
map at the start of every session transaction, so a session follows moves from one transaction to the next;
Sharding.run runs a unit of work again when a move refused it (nothing was written).

A SELECT in a session with no shard that names none runs on every shard, by Router.fan_out (fan_out_execute below):
one round trip a database, the rows merged by its ORDER BY and cut at its LIMIT, the objects loaded as from any
query, read-only."""
from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Iterator
from functools import partial
from typing import Any, TypeVar

import psycopg
from psycopg.pq import TransactionStatus
from sqlalchemy import create_engine, event
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.horizontal_shard import ShardedSession
from sqlalchemy.orm import Mapper, ORMExecuteState, SessionTransaction
from sqlalchemy.sql import Select, operators, visitors
from sqlalchemy.sql.elements import ClauseElement, UnaryExpression
from sqlalchemy.sql.functions import FunctionElement

from ..config import Config
from ..db import timeout_for
from ..errors import InputError, RoutingError
from ..idgen import schema_name
from ..routing import APPLICATION_NAME, FanOutResult, Router
from ..routing.breaker import CONNECT_TIMEOUT
from ..routing.pools import Policy, policy_for
from ..routing.unit import aborted
from .retrying import failed_error, retry

T = TypeVar("T")
SHARD_OPTION = "pgidgen_shard"
DATABASE_OPTION = "pgidgen_database"


def create_engines(config: Config, *, connect_timeout: int = CONNECT_TIMEOUT, **engine_options: Any) -> dict[str, Engine]:
    """An engine per database of pgidgen.toml, on the DSN applications use (app_dsn: through a pooler when one is
    configured). Through a transaction pooler (or one the config does not name: the safe side) psycopg prepares
    nothing on the server, as the next transaction may run on another server connection, unless the config says
    the pooler keeps prepared statements per client. What sits in between is decided as the Router does
    (pools.policy_for: the pooler the config names, else one probe, on the engine's first connection), so a
    connection string that leads to a pooler unannounced is found out too. connect_timeout: as the Router's (the
    DSN's or PGCONNECT_TIMEOUT's first)."""
    engines = {}
    for name in config.databases:
        engines[name] = create_engine("postgresql+psycopg://", creator=_connector(config, name, connect_timeout), **engine_options)
    return engines


def _connector(config: Config, name: str, connect_timeout: int) -> Callable[[], psycopg.Connection[Any]]:
    dsn = config.app_dsn(name)
    policies: list[Policy] = []

    def connect() -> psycopg.Connection[Any]:
        if not policies:
            policies.append(policy_for(config, name, APPLICATION_NAME, connect_timeout=connect_timeout))
        extra: dict[str, Any] = {} if policies[0].prepare else {"prepare_threshold": None}
        return psycopg.connect(dsn, **extra, **timeout_for(dsn, connect_timeout))

    return connect


class ShardSession(ShardedSession):
    """A ShardedSession over pgidgen's map. shard: where new objects without an ID go and where queries run that
    name no shard (set_shard_id("N") names one); objects with an ID go to the shard in its bits."""

    def __init__(self, router: Router, engines: dict[str, Engine], *, shard: int | None = None, read_only: bool = False,
                 fan_out: Engine | None = None, **options: Any) -> None:
        super().__init__(shard_chooser=self.shard_chooser, identity_chooser=self.identity_chooser,
                         execute_chooser=self.execute_chooser, **options)
        self.router = router
        self.engines = engines
        self.fan_out = fan_out
        self.shard = shard
        self.read_only = read_only
        self._bound: set[str] = set()
        self._claimed: list[tuple[int, Connection]] = []
        event.listen(self, "after_transaction_create", self._rebind)
        event.listen(self, "after_begin", self._claim)
        event.listen(self, "before_commit", self._committable)

    # -- the choosers horizontal_shard calls --------------------------------------------------------

    def shard_chooser(self, mapper: Mapper[Any] | None, instance: Any, clause: Any = None, **kw: Any) -> str:  # type: ignore[override]  # horizontal_shard types its choosers as Protocol attributes, which no method's signature matches
        ident = mapper.primary_key_from_instance(instance) if mapper is not None and instance is not None else None
        shard = self._id_shard(ident[0]) if ident and len(ident) == 1 else None
        return self._bind(self._default() if shard is None else shard)

    def identity_chooser(self, mapper: Mapper[Any], primary_key: Any, **kw: Any) -> list[str]:  # type: ignore[override]  # horizontal_shard types its choosers as Protocol attributes, which no method's signature matches
        ident = primary_key if isinstance(primary_key, (tuple, list)) else (primary_key,)
        shard = self._id_shard(ident[0]) if len(ident) == 1 else None
        return [self._bind(self._default() if shard is None else shard)]

    def execute_chooser(self, orm_context: ORMExecuteState) -> Iterable[str]:
        """The session's shard; with none, a SELECT goes to every shard at once (the fan-out engine's bind)."""
        if self.shard is None and self.fan_out is not None and orm_context.is_select:
            return [self.execute_chooser_fan_out()]
        return [self._bind(self._default())]

    def execute_chooser_fan_out(self) -> str:
        """The fan-out engine's bind (what a SELECT naming no shard, and the objects it loaded, go to)."""
        if FAN_OUT not in self._bound:
            assert self.fan_out is not None
            self.bind_shard(FAN_OUT, self.fan_out)
            self._bound.add(FAN_OUT)
        return FAN_OUT

    def get(self, entity: Any, ident: Any, **kw: Any) -> Any:
        """By ID alone: the shard is in the ID's bits (without this, a miss would query the session's shard)."""
        if kw.get("identity_token") is None:
            shard = self._id_shard(ident)
            if shard is not None:
                kw["identity_token"] = self._bind(shard)
        return super().get(entity, ident, **kw)

    def _id_shard(self, value: Any) -> int | None:
        """The shard in value's bits when it can be an ID of this installation; else None, as for a key that is no
        integer: the session's shard. A number no ID can be (negative, too wide, naming a shard beyond the count:
        a bogus ID from a URL) is looked up like any other key, not an InputError out of session.get."""
        if isinstance(value, bool) or not isinstance(value, int):
            return None
        try:
            return self.router.shard_of(value)
        except InputError:
            return None

    # -- binds and claims -------------------------------------------------------------------------

    def get_bind(self, mapper: Any = None, *, shard_id: str | None = None, **kw: Any) -> Any:
        if shard_id == FAN_OUT and self.fan_out is not None:
            self.execute_chooser_fan_out()
        elif shard_id is not None:
            self._bind(int(shard_id))
        return super().get_bind(mapper, shard_id=shard_id, **kw)

    def _default(self) -> int:
        if self.shard is None:
            raise RoutingError("this session has no shard for objects without an ID and queries that name none",
                               hint="open it with shard=N, or name one: .options(set_shard_id(str(N)))")
        return self.shard

    def _bind(self, shard: int) -> str:
        shard_id = str(shard)
        if shard_id not in self._bound:
            database = self.router.database_for(shard)
            self.router.check_reachable(database)  # a database found down fails at once (the Router's breaker)
            engine = self.engines.get(database)
            if engine is None:  # engines given, made before a database joined the config
                raise RoutingError(f"shard {shard} is on database {database}, for which this Sharding has no engine",
                                   hint="give Sharding an engine for every database of pgidgen.toml (engines=None makes them)")
            options = {SHARD_OPTION: shard, DATABASE_OPTION: database}
            self.bind_shard(shard_id, engine.execution_options(schema_translate_map={None: schema_name(shard)}, **options))
            self._bound.add(shard_id)
        return shard_id

    def _rebind(self, session: Any, transaction: SessionTransaction) -> None:
        if transaction.parent is None:  # a new outermost transaction: the map may have changed since the last one
            self._bound.clear()
            self._claimed.clear()

    def _claim(self, session: Any, transaction: SessionTransaction, connection: Connection) -> None:
        options = connection.get_execution_options()
        shard = options.get(SHARD_OPTION)
        if shard is None:
            return
        if not self.read_only and getattr(getattr(connection.connection, "dbapi_connection", None), "autocommit", False):
            # each statement its own transaction: the claim's lock would end with the claim, before the writes
            raise RoutingError(f"a write session on shard {shard} runs in AUTOCOMMIT mode, where the claim protects nothing",
                               hint="drop isolation_level='AUTOCOMMIT' from the engines of a Sharding (read_only sessions may keep it)")
        claim = "SELECT pgidgen.claim_shard(%s, %s), pg_catalog.set_config('search_path', %s, true)"
        if self.read_only:  # no claim lock: a write would not hold a flip off, so none is let through (as Router's)
            claim += ", pg_catalog.set_config('transaction_read_only', 'on', true)"
        try:
            connection.exec_driver_sql(claim, (shard, not self.read_only, self.router.search_path_for(shard)))
        except DBAPIError as e:
            failed = failed_error(self.router, shard, options[DATABASE_OPTION], e)
            if failed is None:
                raise
            raise failed from e
        self._claimed.append((shard, connection))

    def _committable(self, session: Any) -> None:
        """Before the COMMITs: a shard's transaction that a failed statement aborted (its error caught in the work)
        would roll back on COMMIT without an error, and the session report its writes as done (as Router's units)."""
        if self.read_only:
            return
        for shard, connection in self._claimed:
            if connection.closed or connection.invalidated:
                continue
            dbapi = connection.connection.dbapi_connection
            if dbapi is not None and dbapi.info.transaction_status == TransactionStatus.INERROR:
                raise aborted(shard)


class Sharding:
    """The engines and the router an application holds; sessions per unit of work, and run() with retries."""

    def __init__(self, router: Router, engines: dict[str, Engine] | None = None, **engine_options: Any) -> None:
        self.router = router
        self.engines = engines if engines is not None else create_engines(
            router.config, connect_timeout=router.pools.connect_timeout, **engine_options)
        self.fan_out = fan_out_engine(router, connect_timeout=router.pools.connect_timeout)

    def session(self, shard: int | None = None, *, read_only: bool = False, **options: Any) -> ShardSession:
        """A session whose new objects and unnamed queries go to shard; with shard=None, a SELECT that names no
        shard runs on every shard (Router.fan_out), merged by its ORDER BY, cut at its LIMIT. expire_on_commit is off
        by default: the objects a unit of work returns are read after it committed."""
        options.setdefault("expire_on_commit", False)
        return ShardSession(self.router, self.engines, shard=shard, read_only=read_only, fan_out=self.fan_out, **options)

    def run(self, shard: int, work: Callable[[ShardSession], T], *, read_only: bool = False, retry_for: float = 10.0) -> T:
        """work(session) in one transaction of a new session on shard, run again on the shard's new database when
        a move refused it (for up to retry_for seconds). work must be safe to run again: every failed attempt
        rolled back. A database that cannot be connected to raises DatabaseUnavailableError (not retried)."""

        def attempt() -> T:
            database = self.router.database_for(shard)
            self.router.check_reachable(database)
            try:
                with self.session(shard, read_only=read_only) as session, session.begin():
                    return work(session)
            except DBAPIError as e:
                failed = failed_error(self.router, shard, database, e)
                if failed is None:
                    raise
                raise failed from e

        return retry(self.router, shard, attempt, retry_for=retry_for)

    def dispose(self) -> None:
        for engine in (*self.engines.values(), self.fan_out):
            engine.dispose()


# -- every shard at once ----------------------------------------------------------------------------------

#: the shard id of the fan-out engine's bind, and the identity token of what it loads
FAN_OUT = "fan_out"
#: execution option: how to combine the shards' rows of a query that groups or aggregates (Router.fan_out's combine)
COMBINE_OPTION = "pgidgen_combine"


class FanOutCursor(psycopg.Cursor[Any]):
    """The fan-out engine's cursor: a psycopg cursor that, once given a fan-out's result (fan_out_execute), reads
    its merged rows as if the statement had run on it."""

    _merged: Iterator[tuple[Any, ...]] | None = None
    _fan_description: list[tuple[Any, ...]] | None = None

    def load(self, result: FanOutResult) -> None:
        first = result.streams[0].result if result.streams else None
        self._fan_description = [(name, first.ftype(i) if first is not None else 0, None, None, None, None, None)
                                 for i, name in enumerate(result.columns)]
        self._merged = iter(result)

    @property
    def description(self) -> Any:
        return self._fan_description if self._merged is not None else super().description

    @property
    def rowcount(self) -> int:
        return -1 if self._merged is not None else super().rowcount

    def fetchone(self) -> Any:
        return next(self._merged, None) if self._merged is not None else super().fetchone()

    def fetchmany(self, size: int = 0) -> Any:
        if self._merged is None:
            return super().fetchmany(size)
        return list(itertools.islice(self._merged, size or self.arraysize))

    def fetchall(self) -> Any:
        return list(self._merged) if self._merged is not None else super().fetchall()

    def __iter__(self) -> Any:
        return iter(self._merged) if self._merged is not None else super().__iter__()


def fan_out_engine(router: Router, *, connect_timeout: int = CONNECT_TIMEOUT) -> Engine:
    """The engine a ShardSession with no shard sends a SELECT naming none to: its statements run by
    router.fan_out on every shard (fan_out_execute), none on the connection it holds (to the first database, for
    SQLAlchemy's own questions when it connects). Read-only: a write through it (to an object it loaded) is refused."""
    name = router.config.select(None)[0]
    connect = _connector(router.config, name, connect_timeout)
    engine = create_engine("postgresql+psycopg://", creator=lambda: _with_cursor(connect()), pool_size=1, max_overflow=2)
    event.listen(engine, "do_execute", partial(fan_out_execute, router))
    return engine


def _with_cursor(conn: psycopg.Connection[Any]) -> psycopg.Connection[Any]:
    conn.cursor_factory = FanOutCursor
    return conn


def fan_out_execute(router: Router, cursor: Any, statement: str, parameters: Any, context: Any) -> bool:
    """SQLAlchemy's do_execute on the fan-out engine: a SELECT runs by router.fan_out, its ORDER BY (of columns it
    selects) and LIMIT the merge's; the rows are the cursor's. SQLAlchemy's own questions (no statement compiled) run on
    the engine's connection. A query that groups or aggregates needs
    execution_options(pgidgen_combine=...); an OFFSET is refused (page by the order key instead)."""
    compiled: Any = getattr(context, "compiled", None)
    if compiled is None:  # SQL of SQLAlchemy's own (the server's version when it connects): run as it is
        return False
    select = getattr(compiled, "statement", None)
    if context.isinsert or context.isupdate or context.isdelete or not isinstance(select, Select):
        raise RoutingError("objects read from every shard at once are read-only, and only a SELECT runs on every shard",
                           hint="load the object by its ID (session.get: its shard) to change it, or open the session on a shard")
    combine = context.execution_options.get(COMBINE_OPTION)
    functions = any(isinstance(e, FunctionElement) for c in select.selected_columns for e in visitors.iterate(c))
    if combine is None and (select._group_by_clauses or select._having_criteria or select._distinct or functions):
        raise InputError("a query on every shard that groups or aggregates returns a row a shard (a group a shard)",
                         hint="combine them: .execution_options(pgidgen_combine=(None, 'sum')), one for each column (None: grouped by)")
    if select._offset_clause is not None:
        raise InputError("an OFFSET cannot run on every shard: each shard would skip its own first rows",
                         hint="page by the order key instead (WHERE id < the last ID seen)")
    names = [rc.name for rc in compiled._result_columns]
    order = [_order_name(clause, compiled._result_columns, names) for clause in select._order_by_clauses]
    cursor.load(router.fan_out(statement, parameters, order_by=order or None, limit=select._limit, combine=combine))
    return True


def _order_name(clause: Any, columns: Any, names: list[str]) -> str:
    """An ORDER BY clause as fan_out's order_by: the name of the result column it sorts by ("-name": descending)."""
    desc = isinstance(clause, UnaryExpression) and clause.modifier is operators.desc_op
    element = clause.element if isinstance(clause, UnaryExpression) and clause.modifier in (operators.desc_op, operators.asc_op) else clause
    for rc in columns:
        if any(isinstance(o, ClauseElement) and o.compare(element) for o in rc.objects):
            return f"-{rc.name}" if desc else rc.name
    label = getattr(element, "element", None) if type(element).__name__ == "_textual_label_reference" else getattr(element, "name", None)
    if isinstance(label, str) and label in names:
        return f"-{label}" if desc else label
    raise InputError(f"the query is ordered by {clause}, which a query on every shard cannot merge by",
                     hint="order by columns the query selects, ascending or descending (NULLs where PostgreSQL puts them)")


__all__ = ["COMBINE_OPTION", "DATABASE_OPTION", "FAN_OUT", "FanOutCursor", "SHARD_OPTION", "ShardSession", "Sharding", "create_engines",
           "fan_out_engine", "fan_out_execute"]
