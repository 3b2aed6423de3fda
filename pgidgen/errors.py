"""One error root; the CLI turns every PgidgenError into a one-line message and exit status 1."""
from __future__ import annotations

from collections.abc import Sequence


class PgidgenError(Exception):
    """Something the user can fix: the message says what is wrong and what to do."""

    def __init__(self, what: str, *, where: str | None = None, hint: str | None = None) -> None:
        self.what = what
        self.where = where
        self.hint = hint
        super().__init__(self.render())

    def render(self) -> str:
        text = self.what
        if self.where:
            text += f" ({self.where})"
        if self.hint:
            text += f": {self.hint}"
        return text


class ConfigError(PgidgenError):
    """The configuration file or the options given are wrong."""


class LayoutError(ConfigError):
    """The bit layout cannot hold what was asked of it."""


class InputError(PgidgenError):
    """A value given on the command line or stdin is malformed."""


class DatabaseError(PgidgenError):
    """A database refused, failed or could not be reached."""


class ConflictError(DatabaseError):
    """The databases hold something that pgidgen will not overwrite."""


class TemplateError(PgidgenError):
    """A SQL template failed to render (a bug in pgidgen or a custom template)."""


class SandboxError(PgidgenError):
    """Local throwaway servers could not be started or stopped."""


class RoutingError(PgidgenError):
    """A key, an ID or a shard cannot be routed to a database (see pgidgen/routing/)."""

    #: True when the same work may succeed if retried shortly (a move is flipping the map).
    retryable = False


class ShardMovedError(RoutingError):
    """The database a shard was routed to no longer serves it: nothing was written there. Re-read the map and
    retry on the database that serves it now (Router.run does this)."""

    retryable = True

    def __init__(self, what: str, *, shard: int, database: str, where: str | None = None, hint: str | None = None) -> None:
        self.shard = shard
        self.database = database
        super().__init__(what, where=where, hint=hint)


class ShardUnavailableError(RoutingError):
    """No reachable database serves the shard right now (for a moment during a move's cutover; for good when
    the map is broken)."""

    retryable = True


class DatabaseUnavailableError(RoutingError):
    """The database serving a shard cannot be connected to: its server is down or unreachable. Not a move, so not
    retried: the Router fails the calls for that database at once while it stays down (its breaker), and lets one
    through now and then to notice it is back. shards: those a fan-out could not read there."""

    def __init__(self, what: str, *, database: str, shards: Sequence[int] = (), where: str | None = None, hint: str | None = None) -> None:
        self.database = database
        self.shards = list(shards)
        super().__init__(what, where=where, hint=hint)


class QueryError(DatabaseError):
    """A fan-out's statement failed on a database: the database and the shards it ran for are named; the psycopg
    error is its __cause__, and its SQLSTATE .sqlstate."""

    def __init__(self, what: str, *, database: str, shards: Sequence[int], sqlstate: str | None = None, where: str | None = None,
                 hint: str | None = None) -> None:
        self.database = database
        self.shards = list(shards)
        self.sqlstate = sqlstate
        super().__init__(what, where=where, hint=hint)
