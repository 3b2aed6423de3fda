"""The unit of work: a transaction on the database the map names, which first claims the shard there
(pgidgen.claim_shard; sent with the work's first statement: claiming.py) and sets its search_path; a failure a
move explains becomes ShardMovedError, and `run` runs the work again where the shard lives now. The argument is
in the package's docstring."""
from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any, Literal, TypeVar

import psycopg
from psycopg import sql
from psycopg.pq import TransactionStatus

from ..config import Config, describe_dsn
from ..db import pg_message
from ..errors import DatabaseError, PgidgenError, RoutingError, ShardMovedError, ShardUnavailableError
from ..idgen import schema_name
from .claiming import Claim
from .mapcache import SERVING, MapCache, Route
from .pools import Pools

IDLE = TransactionStatus.IDLE
INERROR = TransactionStatus.INERROR

T = TypeVar("T")
#: Raised by pgidgen.claim_shard() when the database does not serve the shard.
NOT_SERVED = "PGR01"
#: Errors a move can cause in a routed transaction: the map is checked again before one is blamed on it.
MOVE_SYMPTOMS = frozenset({NOT_SERVED, "3F000", "42P01", "42883", "25006", "40001", "40P01", "55P03", "57P01"})


class Units:
    """Claimed transactions and retries over a router's pools and map."""

    def __init__(
        self, config: Config, pools: Pools, maps: MapCache, *, search_path: Sequence[str], retry_for: float, stats: dict[str, int]
    ) -> None:
        self.config = config
        self.pools = pools
        self.maps = maps
        self.search_path = tuple(search_path)
        self.retry_for = retry_for
        self.stats = stats
        self._paths: dict[int, str] = {}
        self._claims: dict[int, Claim] = {}

    def search_path_for(self, shard: int) -> str:
        path = self._paths.get(shard)
        if path is None:
            path = sql.SQL(", ").join(sql.Identifier(s) for s in (schema_name(shard), *self.search_path)).as_string(None)
            self._paths[shard] = path
        return path

    def transaction(self, shard: int, *, read_only: bool = False) -> UnitOfWork:
        return UnitOfWork(self, shard, read_only)

    def execute(self, shard: int, query: Any, params: Any = None, *, read_only: bool = False) -> list[Any]:
        """One statement as a unit of work of its own (its COMMIT sent with it), retried like run(); its rows
        (none: [])."""
        def one(conn: psycopg.Connection[Any]) -> list[Any]:
            cur = conn.cursor()
            cur.execute(query, params)
            return cur.fetchall() if cur.description is not None else []

        return self.run(shard, one, read_only=read_only, with_commit=True)

    def _failed(self, conn: Any, route: Route, e: BaseException, committing: bool) -> PgidgenError | None:
        """After e ended a unit of work on conn: roll back what is left, and the error to raise instead of e
        (None: e itself)."""
        conn.end_unit()
        if not conn.broken and conn.pgconn.transaction_status != IDLE:
            try:
                conn.rollback()
            except psycopg.Error:
                pass
        if not isinstance(e, psycopg.Error):
            return None
        if conn.broken:
            if committing:  # the COMMIT left: whether it was applied no one can tell, so it is not run again
                return None
            # nothing was committed. A server that is gone fails it (and the calls after it, at once: the breaker);
            # a connection dropped by a restart, a pooler or an idle timeout is tried again on a new one
            return self.pools.lost(route.database) or ShardUnavailableError(
                f"the connection to database {route.database} broke before the transaction committed: {pg_message(e)}",
                hint="nothing was written; Router.run retries with a new connection",
            )
        return self._diagnose(conn, route, e)

    def claim_for(self, shard: int, read_only: bool) -> Claim:
        key = -shard - 1 if read_only else shard
        claim = self._claims.get(key)
        if claim is None:
            claim = self._claims[key] = Claim(shard, self.search_path_for(shard), read_only)
        return claim

    def run(self, shard: int, work: Callable[[psycopg.Connection[Any]], T], *, read_only: bool = False, with_commit: bool = False) -> T:
        deadline = time.monotonic() + self.retry_for
        delay = 0.005
        while True:
            try:
                with UnitOfWork(self, shard, read_only, with_commit) as conn:
                    return work(conn)
            except (ShardMovedError, ShardUnavailableError) as e:
                wait, delay = next_try(self, shard, e, deadline, delay)
                if wait:
                    time.sleep(wait)

    def _diagnose(self, conn: psycopg.Connection[Any], route: Route, e: psycopg.Error) -> PgidgenError | None:
        """The error to raise instead of e, if e means the shard is not (or no longer) served there."""
        if not needs_row(e):
            return verdict(self, route, e, served=False)
        return verdict(self, route, e, served=self._still_serves(conn, route))

    def _still_serves(self, conn: psycopg.Connection[Any], route: Route) -> bool:
        """The database's own row, read again after the failed transaction (not the cached map)."""
        query = "SELECT state FROM pgidgen.shards WHERE shard = %s"
        try:
            if conn.broken or conn.closed:
                with self.pools.fresh(route.database) as fresh:
                    row = fresh.execute(query, (route.shard,)).fetchone()
            else:
                row = conn.execute(query, (route.shard,)).fetchone()
        except (psycopg.Error, PgidgenError):
            return True  # cannot tell: report the original error, not a move
        return row is not None and row[0] in SERVING


class UnitOfWork:
    """Units.transaction(): on entering, a pooled connection to the database the map names, its transaction to
    claim the shard with the first statement; on leaving, commit, or roll back and say why. A class rather than
    a generator-based context manager: it runs for every unit of work, and that costs a few microseconds less."""

    __slots__ = ("units", "shard", "read_only", "with_commit", "route", "conn")

    def __init__(self, units: Units, shard: int, read_only: bool, with_commit: bool = False) -> None:
        self.units = units
        self.shard = shard
        self.read_only = read_only
        self.with_commit = with_commit

    def __enter__(self) -> psycopg.Connection[Any]:
        units = self.units
        self.route = route = units.maps.get().route(self.shard)
        self.conn = conn = units.pools.borrow(route.database)
        try:
            conn.begin_unit(units.claim_for(self.shard, self.read_only), self.with_commit)
        except BaseException:
            units.pools.give_back(route.database, conn)
            raise
        return conn

    def __exit__(self, typ: type[BaseException] | None, e: BaseException | None, tb: Any) -> Literal[False]:
        units, conn, route = self.units, self.conn, self.route
        try:
            if e is None:
                committing = False
                try:
                    if conn.end_unit():
                        status = conn.pgconn.transaction_status
                        if status != IDLE:
                            if status == INERROR and not self.read_only:
                                raise aborted(route.shard)
                            committing = True
                            conn.commit_unit()
                    return False
                except BaseException as err:
                    e = err
                    failure = units._failed(conn, route, err, committing)
                    if failure is None:
                        raise
            else:
                # a write sent with its COMMIT (execute): a connection that broke meanwhile may have committed it
                failure = units._failed(conn, route, e, conn.commit_sent and not self.read_only)
                if failure is None:
                    return False  # e itself goes on
            raise failure from e
        finally:
            units.pools.give_back(route.database, conn)


def aborted(shard: int) -> RoutingError:
    """A write unit whose work caught a statement's error and returned: the server aborted its transaction, and its
    COMMIT would roll everything back without an error, the work's result (an ID it inserted) reported as written.
    Also the ORM integrations' (a ShardSession's commit, a shard_atomic block)."""
    return RoutingError(
        f"a statement of the unit of work on shard {shard} failed and the work went on: its transaction was"
        " aborted there, so nothing of it was committed",
        hint="let the error leave the unit of work (it is rolled back), or run the statement that may fail in a savepoint"
        " (conn.transaction(), session.begin_nested(), transaction.atomic()) and handle its error there",
    )


def needs_row(e: psycopg.Error) -> bool:
    """Whether e may be a move's doing but only the database's own row of the shard can tell."""
    state = getattr(e, "sqlstate", None)
    return state in MOVE_SYMPTOMS and state != NOT_SERVED


def verdict(units: Any, route: Route, e: psycopg.Error, *, served: bool) -> PgidgenError | None:
    """The error to raise instead of e (None: e itself), served: the row says the database still serves it.
    units: Units or AsyncUnits (config, maps, stats)."""
    state = getattr(e, "sqlstate", None)
    where = f"{route.database}, {describe_dsn(units.config.app_dsn(route.database))}"
    message = getattr(e.diag, "message_primary", None) or ""
    if state == "42883" and ("claim_shard" in message or "pgidgen.claim(" in message):
        missing = "pgidgen.claim_shard()" if "claim_shard" in message else "pgidgen.claim()"
        return DatabaseError(
            f"database {route.database} has a pgidgen catalog without {missing}",
            where=where,
            hint="upgrade it: run pgidgen's sql/catalog.sql there (idempotent)",
        )
    if state not in MOVE_SYMPTOMS or served:
        return None
    units.maps.invalidate()
    units.stats["moved"] += 1
    return ShardMovedError(
        f"database {route.database} no longer serves shard {route.shard}; nothing was written there",
        shard=route.shard,
        database=route.database,
        where=where,
        hint="the shard moved: Router.run retries on the database that serves it now",
    )


def next_try(units: Any, shard: int, e: RoutingError, deadline: float, delay: float) -> tuple[float, float]:
    """After a retryable failure (ShardMovedError, ShardUnavailableError): how long to wait before the next attempt,
    and the delay after that; e itself once retry_for has passed. units: Units or AsyncUnits."""
    stale = e.database if isinstance(e, ShardMovedError) else None
    units.maps.invalidate()
    if time.monotonic() >= deadline:
        raise e
    units.stats["retries"] += 1
    try:
        again = units.maps.get().route(shard).database == stale
    except ShardUnavailableError:
        again = True
    if again:  # the map has not caught up with the move yet: wait for it
        return min(delay, max(0.0, deadline - time.monotonic())), min(delay * 2, 0.25)
    return 0.0, delay
