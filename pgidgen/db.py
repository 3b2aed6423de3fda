"""Where databases are talked to: connecting with safe error messages, and the one small executor.

Errors name the database by its config name and host:port/dbname, never the password.
"""
from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, TypeVar

import psycopg

from .config import describe_dsn, scheme_error
from .errors import DatabaseError, PgidgenError
from .redact import scrub
from .versions import OLDEST_SUPPORTED, has

T = TypeVar("T")
CONNECT_TIMEOUT = 10
def pg_message(e: BaseException) -> str:
    """The server's primary message (and SQLSTATE) of a psycopg error, on one line."""
    diag = getattr(e, "diag", None)
    primary = getattr(diag, "message_primary", None) if diag is not None else None
    text = " ".join((primary or str(e)).split()) or type(e).__name__
    state = getattr(e, "sqlstate", None)
    if state:
        text = f"{text} [SQLSTATE {state}]"
    return scrub(text)


#: pgidgen's own sessions do long work (init over thousands of shards, a shard's copy, a verification scan) and
#: wait idle while other connections work (a move's admin connection during the copy): a database's or role's
#: statement_timeout or idle timeouts, often set as a safety net for applications, must not cut them off halfway
#: (pg_dump does the same). Sent with the connection request (options), so they hold from its first moment;
#: idle_session_timeout and transaction_timeout (14+ and 17+: options naming a setting the server lacks would
#: fail the connection) are set right after. Locks keep the server's lock_timeout; the move's own lock waits set theirs.
SESSION_OPTIONS = "-c statement_timeout=0 -c idle_in_transaction_session_timeout=0"
#: Timeouts that only some majors know (versions.SINCE): off when the server has them.
_LATER_TIMEOUTS = ("idle_session_timeout", "transaction_timeout")


def _options(dsn: str, *, server_version: int = 0, env: bool = True) -> str | None:
    """SESSION_OPTIONS after the options the connection string (or PGOPTIONS) gives (later settings win); None
    when the options may come from a service file (service=, PGSERVICE), which an explicit one would replace:
    then the settings are only SET after connecting (own_session)."""
    try:
        params = psycopg.conninfo.conninfo_to_dict(dsn)
    except psycopg.ProgrammingError:
        return None
    given = params.get("options")
    if given is None and (params.get("service") or (env and os.environ.get("PGSERVICE"))):
        return None
    given = given if given is not None else (os.environ.get("PGOPTIONS", "") if env else "")
    extra = SESSION_OPTIONS + "".join(f" -c {name}=0" for name in _LATER_TIMEOUTS if server_version and has(server_version, name))
    return f"{given} {extra}".strip()


def session_conninfo(dsn: str, server_version: int) -> str:
    """dsn with pgidgen's session settings in its options, for a connection another server makes for pgidgen
    (a subscription's to the source: its start runs queries there)."""
    options = _options(dsn, server_version=server_version, env=False)  # our environment is not the server's
    return dsn if options is None else psycopg.conninfo.make_conninfo(dsn, options=options)


def timeout_for(dsn: str, seconds: int = CONNECT_TIMEOUT) -> dict[str, Any]:
    """connect_timeout=seconds as a connect() keyword, unless the DSN or PGCONNECT_TIMEOUT sets one: a keyword
    would override the user's (a multi-host string's short timeout, for a quick failover, among them)."""
    if os.environ.get("PGCONNECT_TIMEOUT"):
        return {}
    try:
        if "connect_timeout" in psycopg.conninfo.conninfo_to_dict(dsn):
            return {}
    except psycopg.ProgrammingError:
        pass  # connecting reports it
    return {"connect_timeout": seconds}


def connect(name: str, dsn: str, *, autocommit: bool = False, **kwargs: Any) -> psycopg.Connection[Any]:
    try:
        conn = _connect(dsn, autocommit=autocommit, **kwargs)
    except psycopg.OperationalError as e:
        raise DatabaseError(
            f"cannot connect to database {name} ({describe_dsn(dsn)}): {pg_message(e)}",
            hint="check that the server is running and the connection string in the config is right",
        ) from None
    except psycopg.ProgrammingError as e:  # libpq quotes what it could not use: scrubbed of the registered passwords
        bad = scheme_error(name, dsn)  # a Config made in code: a file's strings were checked as it was read
        if bad is not None:
            raise DatabaseError(bad.what, hint=bad.hint) from None
        raise DatabaseError(f"database {name} has an invalid connection string: {pg_message(e)}",
                            hint="fix it where it comes from (the config, or the environment variable it names)") from None
    try:
        own_session(conn)
    except psycopg.Error as e:
        conn.close()
        raise translate(name, e, doing="setting up its session") from None
    return conn


def _connect(dsn: str, *, autocommit: bool, **kwargs: Any) -> psycopg.Connection[Any]:
    """idle_session_timeout off from the first moment as well (the session is idle between its login and its
    first query: a database's 20 ms cut a session off there on a loaded machine); a server older than any pgidgen
    supports lacks it, and is then asked again without it, so that the version check can say what is wrong."""
    extra = {**timeout_for(dsn), **kwargs}
    for version in (OLDEST_SUPPORTED, 0):
        options = _options(dsn, server_version=version)
        try:
            return psycopg.connect(dsn, autocommit=autocommit, application_name="pgidgen",
                                   **({**extra, "options": options} if options is not None else extra))
        except psycopg.OperationalError as e:
            if version == 0 or '"idle_session_timeout"' not in str(e):
                raise
    raise AssertionError("unreachable")


def server_encoding(conn: psycopg.Connection[Any]) -> str:
    """The database's encoding, as the server reported it at login (no round trip)."""
    return conn.info.parameter_status("server_encoding") or str(conn.execute("SHOW server_encoding").fetchone()[0])  # type: ignore[index]


def own_session(conn: psycopg.Connection[Any]) -> None:
    """The settings of SESSION_OPTIONS on conn again (after a RESET ALL), and the later timeouts off."""
    conn.execute("SELECT pg_catalog.set_config('statement_timeout', '0', false), pg_catalog.set_config('idle_in_transaction_session_timeout', '0', false)"
                 + "".join(f", pg_catalog.set_config('{name}', '0', false)" for name in _LATER_TIMEOUTS if has(conn, name)))
    if not conn.autocommit:
        conn.commit()


def translate(name: str, e: psycopg.Error, *, doing: str) -> DatabaseError:
    hint = "see the server's log for details"
    if getattr(e, "sqlstate", None) == "53200":
        hint = "raise max_locks_per_transaction on the server (creating many shards locks many objects), or use more databases"
    elif getattr(e, "sqlstate", None) == "42501":
        hint = "the config's role for this database lacks the rights: connect as the role that ran init, or grant the rights this needs (pgidgen init --grant ROLE, as that role)"
    elif getattr(e, "sqlstate", None) == "42704" and "role" in str(e):
        hint = "create the role first (roles belong to the server), then run again"
    elif isinstance(e, psycopg.OperationalError):
        hint = "check that the server is running and reachable"
    return DatabaseError(f"database {name} failed while {doing}: {pg_message(e)}", hint=hint)


class _Interrupted(Exception):
    pass


#: Ctrl-C while each_database's threads run transaction()s: the main thread sets this and cancels their running
#: statements, so each transaction that has not committed yet rolls back instead of committing afterwards.
_interrupted = threading.Event()
_live: dict[int, psycopg.Connection[Any]] = {}
_committed: set[str] = set()
_live_lock = threading.Lock()


def interrupted() -> bool:
    """Ctrl-C arrived while each_database's threads run: commit nothing more."""
    return _interrupted.is_set()


def note_committed(name: str) -> None:
    with _live_lock:
        _committed.add(name)


@contextmanager
def tracked(conn: psycopg.Connection[Any]) -> Iterator[psycopg.Connection[Any]]:
    """A connection whose running statement a Ctrl-C in each_database cancels."""
    with _live_lock:
        _live[id(conn)] = conn
    try:
        yield conn
    finally:
        with _live_lock:
            _live.pop(id(conn), None)


@contextmanager
def transaction(name: str, dsn: str, *, doing: str) -> Iterator[psycopg.Connection[Any]]:
    """One transaction on one database; any error rolls it back and becomes a DatabaseError."""
    conn = connect(name, dsn)
    try:
        with tracked(conn), conn:
            yield conn
            if _interrupted.is_set():
                raise _Interrupted  # rolls back
        note_committed(name)
    except (psycopg.Error, _Interrupted) as e:
        if _interrupted.is_set():
            raise DatabaseError(f"database {name}: interrupted, rolled back") from None
        assert isinstance(e, psycopg.Error)
        raise translate(name, e, doing=doing) from None
    finally:
        conn.close()


@dataclass
class Outcome:
    """What happened on one database."""

    database: str
    ok: bool = True
    changed: bool = False
    summary: str = ""
    error: str | None = None
    details: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"database": self.database, "ok": self.ok, "changed": self.changed, "summary": self.summary}
        if self.error:
            out["error"] = self.error
        out.update(self.details)
        return out


def each_database(names: Sequence[str], work: Callable[[str], T], *, parallel: bool = True, every_one: bool = False) -> dict[str, T | PgidgenError]:
    """Run work(name) for every database, in parallel threads (at most 8, or one each with every_one: for work
    that waits on the others'); a PgidgenError is returned, not raised."""

    def guarded(name: str) -> T | PgidgenError:
        try:
            return work(name)
        except PgidgenError as e:
            return e

    with _live_lock:
        _committed.difference_update(names)
    if not parallel or len(names) < 2:  # Ctrl-C lands in the work itself, whose open transaction rolls back
        try:
            return {name: guarded(name) for name in names}
        except KeyboardInterrupt:
            raise KeyboardInterrupt(_interrupted_message(names)) from None
    pool = ThreadPoolExecutor(max_workers=len(names) if every_one else min(8, len(names)))
    try:
        futures = {name: pool.submit(guarded, name) for name in names}
        return {name: f.result() for name, f in futures.items()}
    except KeyboardInterrupt:
        _interrupted.set()
        with _live_lock:
            running = list(_live.values())
        for conn in running:
            try:
                conn.cancel()
            except Exception:  # noqa: BLE001 - a connection that just closed: nothing to cancel
                pass
        pool.shutdown(wait=True, cancel_futures=True)
        raise KeyboardInterrupt(_interrupted_message(names)) from None
    finally:
        pool.shutdown(wait=True)
        _interrupted.clear()


def _interrupted_message(names: Sequence[str]) -> str:
    with _live_lock:
        done = sorted(_committed & set(names))
    return "interrupted; " + (f"{', '.join(done)} had committed (some of) its work already, the rest was rolled back" if done
                              else "every database's transaction was rolled back")


def tool_args(dsn: str) -> tuple[str, dict[str, str]]:
    """A connection string for a client program (pg_dump, psql) with its password moved to PGPASSWORD, so the
    password never shows in the process list, and pgidgen's session settings in its options: (dsn, environment)."""
    env = dict(os.environ)
    try:
        params = psycopg.conninfo.conninfo_to_dict(dsn)
    except psycopg.ProgrammingError:
        return dsn, env
    password = params.pop("password", None)
    if password is not None:
        env["PGPASSWORD"] = str(password)
    # idle_session_timeout too, from the first moment, as connect() does: pg_dump, which was cut off between
    # its login and its first query. The programs only reach servers pgidgen has connected to and checked.
    options = _options(psycopg.conninfo.make_conninfo("", **params), server_version=OLDEST_SUPPORTED)
    if options is not None:
        params["options"] = options
    return psycopg.conninfo.make_conninfo("", **params), env


def read_each(
    config: Any,
    names: Sequence[str],
    reader: Callable[[psycopg.Connection[Any]], T],
    *,
    need: Sequence[str] | None = None,
) -> tuple[dict[str, T], dict[str, str]]:
    """reader(conn) on every named database in parallel, each on its own autocommit connection.

    Returns (results, unreachable messages). A database in `need` (default: all of them) that fails raises.
    """

    def work(name: str) -> T:
        conn = connect(name, config.dsn(name), autocommit=True)
        try:
            return reader(conn)
        except psycopg.Error as e:
            raise translate(name, e, doing="reading from it") from None
        finally:
            conn.close()

    required = set(names if need is None else need)
    results: dict[str, T] = {}
    down: dict[str, str] = {}
    for name, res in each_database(names, work).items():
        if isinstance(res, PgidgenError):
            if name in required:
                raise res
            down[name] = res.render()
        else:
            results[name] = res
    return results, down


def execute_script(conn: psycopg.Connection[Any], script: str) -> None:
    """Run literal SQL (no parameters): several statements go in one round trip."""
    if script.strip():
        conn.execute(script.encode("utf-8"))  # bytes: no placeholder parsing, sent as written
