"""What the ORM integrations share: telling a move from a database that is down and from any other error, and
running a unit of work again (after a move only)."""
from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

import psycopg

from ..errors import DatabaseUnavailableError, ShardMovedError, ShardUnavailableError
from ..routing import MOVE_SYMPTOMS, NOT_SERVED, Router

T = TypeVar("T")


def _psycopg_error(error: BaseException) -> BaseException | None:
    """The psycopg error inside an ORM's wrapper of it (its __cause__, or SQLAlchemy's .orig), if any."""
    cause: BaseException | None = error
    while cause is not None and not isinstance(cause, psycopg.Error):
        cause = cause.__cause__ or getattr(cause, "orig", None)
    return cause


def failed_error(router: Router, shard: int, database: str, error: BaseException) -> ShardMovedError | DatabaseUnavailableError | None:
    """What to raise instead of error (an ORM's), which ended a unit of work on shard's database: ShardMovedError
    if a move explains it (moved_error), DatabaseUnavailableError if its connection could not be made or broke
    and the database does not answer now (the Router's breaker then fails the next calls for it at once); None
    for the work's own errors."""
    moved = moved_error(router, shard, database, error)
    if moved is not None:
        return moved
    cause = _psycopg_error(error)
    return router.connection_lost(database, cause) if cause is not None else None


def moved_error(router: Router, shard: int, database: str, error: BaseException) -> ShardMovedError | None:
    """The ShardMovedError to raise instead of error (a psycopg error, or an ORM's wrapper of one) when the shard
    is not served by database (any more): PGR01 from the claim says so itself; for the other symptoms a move can
    cause (a renamed schema, a write-blocking trigger, ...) the map read again must name another database."""
    cause: BaseException | None = error
    while cause is not None and getattr(cause, "sqlstate", None) is None:
        cause = cause.__cause__ or getattr(cause, "orig", None)
    state = getattr(cause, "sqlstate", None)
    if state not in MOVE_SYMPTOMS:
        return None
    router.invalidate()
    if state != NOT_SERVED:
        try:
            if router.database_for(shard) == database:
                return None  # still served there: the error is the work's own
        except ShardUnavailableError:
            pass  # between databases right now: a move
    return ShardMovedError(
        f"database {database} no longer serves shard {shard}; nothing was written there",
        shard=shard,
        database=database,
        hint="the shard moved: run the unit of work again (the integrations' run helpers do)",
    )


def retry(router: Router, shard: int, attempt: Callable[[], T], *, retry_for: float = 10.0) -> T:
    """attempt() until it does not fail with ShardMovedError or ShardUnavailableError, for up to retry_for seconds.
    Every failed attempt rolled back, so attempt must only be safe to run again in that sense. A database that is
    down (DatabaseUnavailableError) is not retried: no move will bring it back."""
    deadline = time.monotonic() + retry_for
    delay = 0.005
    while True:
        try:
            return attempt()
        except (ShardMovedError, ShardUnavailableError) as e:
            router.invalidate()
            if time.monotonic() >= deadline:
                raise
            stale = e.database if isinstance(e, ShardMovedError) else None
            try:
                again = router.database_for(shard) == stale
            except ShardUnavailableError:
                again = True
            if again:  # the map has not caught up with the move yet
                time.sleep(min(delay, max(0.0, deadline - time.monotonic())))
                delay = min(delay * 2, 0.25)
