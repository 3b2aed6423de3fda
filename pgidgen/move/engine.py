"""Where shards move: the steps of a move, each journaled before it runs and safe to run again.

Policy across databases: every step is one transaction on one database (or a non-transactional replication
command), in a fixed order, and the journal on the source says which step was last started. A step that runs
again after a crash first looks at what is already there. Until the target goes active ("activate") the source
copy is authoritative and a rollback loses nothing; after it, the only way is forward (resume).
"""
from __future__ import annotations

import math
import os
import secrets
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Generic, TypeVar

import psycopg

from ..config import Config
from .. import redact
from ..ddl.drift import schema_items
from ..db import connect, execute_script, own_session, pg_message, scrub, tool_args
from ..errors import ConflictError, DatabaseError, PgidgenError
from ..ddl.ledger import DDL_LOCK, ledger_copy_sql
from ..idgen import CATALOG_REVISION, CATALOG_REVISION_SQL, INIT_LOCK, LOCK_CLASS, check_argument_order, render_catalog
from ..layout import Layout
from ..render import static_sql
from . import sqltext as q
from .context import (
    MoveError,
    ShardContext,
    check_no_other_move,
    check_external_references,
    check_outside_dependents,
    describe_dependents,
    outside_dependents,
    check_roles,
    check_servers,
    check_tables,
    locate,
    read_states,
    read_tables,
)
from ..check import conninfo_for_subscription, subscribe_quietly
from .compat import check_clients, check_restorable
from .journal import POINT_OF_NO_RETURN, Journal, MoveRecord, lock_holder, open_move, release, try_lock
from .transfer import COPY_SECTIONS, DUMP_OPTIONS, SchemaDump, Transfer, last_line, plan_tables, script_of, tool
from .verify import Verification, compare

Hook = Callable[[str], None]
T = TypeVar("T")
POLL = 0.002


@dataclass
class MoveOptions:
    max_pause: float = 1.0
    offline: bool = False
    attempts: int = 3
    verify_in_pause: bool = False
    drop_source: bool = False
    catchup_timeout: float = 600.0
    subscription_conninfo: str | None = None

    def __post_init__(self) -> None:
        redact.register(self.subscription_conninfo)


@dataclass
class CopyProgress:
    tables_ready: int
    tables_total: int
    rows_copied: int
    rows_total: int
    bytes_copied: int
    lag_bytes: int | None


#: A freeze that took longer than this (seconds) waited for locks: the schema is compared again in the pause.
LOCK_WAIT_RECHECK = 0.01


@dataclass
class MoveReport:
    shard: int
    source: str
    target: str
    mode: str
    move_id: int
    status: str
    pause_ms: float | None = None
    seconds: float = 0.0
    last_id: int | None = None
    skew_ms: float | None = None
    retired_schema: str | None = None
    attempts: int = 0
    verification: Verification | None = None
    notes: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "shard": self.shard, "source": self.source, "target": self.target, "mode": self.mode, "move_id": self.move_id,
            "status": self.status, "pause_ms": self.pause_ms, "seconds": round(self.seconds, 3), "last_id": self.last_id,
            "clock_skew_ms": self.skew_ms, "retired_schema": self.retired_schema, "cutover_attempts": self.attempts,
            "notes": self.notes,
        }
        if self.verification is not None:
            out["verification"] = self.verification.as_dict()
        return out

    def lines(self) -> list[str]:
        out = []
        if self.status == "done":
            out.append(f"moved shard {self.shard} from {self.source} to {self.target} ({self.mode}) in {self.seconds:.1f}s")
            if self.pause_ms is not None:
                out.append(f"write pause: {self.pause_ms:.0f} ms (cutover attempts: {self.attempts})")
            if self.skew_ms is not None:
                out.append(f"clock skew {self.target} - {self.source}: {round(self.skew_ms):+d} ms (accounted for in the ID generator)")
            if self.retired_schema:
                out.append(f"the source copy is kept read-only as {self.source}.{self.retired_schema}; drop it with 'pgidgen move-shard --cleanup {self.shard}'")
        elif self.status == "rolled_back":
            out.append(f"rolled back the move of shard {self.shard} to {self.target}: {self.source} serves it as before; nothing is left on {self.target}")
        if self.verification is not None:
            v = self.verification
            out.append(f"verified {v.when}: {len(v.tables)} tables, {v.rows} rows: " + ("all match" if v.ok else "MISMATCH"))
            out.extend("  " + t.describe() for t in v.tables if not t.ok)
        out.extend(self.notes)
        return out


# -- entry points -------------------------------------------------------------------------------------


def move_shard(
    config: Config,
    shard: int,
    target: str,
    *,
    options: MoveOptions | None = None,
    progress: Callable[[CopyProgress], None] | None = None,
    hook: Hook | None = None,
) -> MoveReport:
    """Move shard to target while the application keeps writing (or, with options.offline, under a write lock)."""
    opts = options or MoveOptions()
    ctx = locate(config, shard, target)
    admin = connect(ctx.source, config.dsn(ctx.source), autocommit=True)
    # The target's connection opens while the source is checked; the mover keeps it.
    opening: Background[psycopg.Connection[Any]] = Background(lambda: connect(target, config.dsn(target), autocommit=True))
    tgt: psycopg.Connection[Any] | None = None
    early: SchemaDump | None = None
    try:
        ensure_catalog(admin, ctx.source, config)
        if not try_lock(admin, shard):
            check_no_other_move(admin, ctx.source, shard)
            pid = lock_holder(admin, shard)
            raise MoveError(f"shard {shard} is being moved right now by another pgidgen", where=f"{ctx.source}, backend pid {pid}", hint="wait for it to finish")
        check_no_other_move(admin, ctx.source, shard)
        row = admin.execute("SELECT state FROM pgidgen.shards WHERE shard = %s", (shard,)).fetchone()
        if row is None or row[0] not in ("active", "moving"):
            raise ConflictError(f"shard {shard} left database {ctx.source} while the move was starting", hint="see 'pgidgen map'")
        ctx.source_schema = ctx.schema
        check_clients(ctx, admin)
        if not opts.offline:
            # The schema's pg_dump (some 50-100 ms, most of it pg_dump reading the catalog) runs while the move is
            # checked and journaled, instead of after the slot, where the rows wait for the tables it creates.
            encoding = str(admin.execute("SHOW server_encoding").fetchone()[0])  # type: ignore[index]
            early = SchemaDump(config.dsn(ctx.source), ctx.schema, encoding=encoding, sections=COPY_SECTIONS)
        ctx.tables, ctx.sequences = read_tables(admin, ctx.schema)
        check_tables(ctx, online=not opts.offline)
        check_outside_dependents(ctx, admin)
        tgt = opening.result()
        check_roles(ctx, admin, tgt)
        check_external_references(ctx, admin, tgt)
        check_restorable(ctx, config.dsn(ctx.source), admin, tgt, schema_dump=early)
        if not opts.offline:
            check_servers(ctx, admin, tgt, conninfo=conninfo_for_subscription(opts.subscription_conninfo or config.dsn(ctx.source), admin))
        token = f"{shard}_{secrets.token_hex(4)}"
        journal = Journal.open_new(
            admin, shard=shard, source=ctx.source, target=target, mode="offline" if opts.offline else "online", token=token,
            detail={"tables": [t.name for t in ctx.tables], "max_pause_ms": int(opts.max_pause * 1000)},
        )
        mover, tgt = Mover(config, ctx, journal, opts, progress, hook, tgt=tgt, schema_dump=early), None
        early = None  # the mover's now
        return mover.run()
    finally:
        if early is not None:
            early.close()
        if tgt is None:
            try:
                tgt = opening.result()
            except PgidgenError:
                tgt = None
        if tgt is not None:
            tgt.close()
        release(admin, shard)


def find_open_move(config: Config, shard: int) -> tuple[str, MoveRecord]:
    """The database whose journal holds shard's unfinished move (the move's source)."""
    states, down = read_states(config)
    for name in config.databases:
        if name not in states or not states[name].has_catalog:
            continue
        conn = connect(name, config.dsn(name), autocommit=True)
        try:
            rec = open_move(conn, shard)
        finally:
            conn.close()
        if rec is not None:
            return name, rec
    where = ", ".join(f"{n} unreachable" for n in down) or None
    raise MoveError(f"no interrupted move of shard {shard} was found", where=where, hint="nothing to resume or roll back; see 'pgidgen map'")


def _reopen(config: Config, shard: int) -> tuple[ShardContext, psycopg.Connection[Any], Journal]:
    source, rec = find_open_move(config, shard)
    config.dsn(rec.target)
    admin = connect(source, config.dsn(source), autocommit=True)
    try:
        if not try_lock(admin, shard):
            pid = lock_holder(admin, shard)
            raise MoveError(
                f"shard {shard} is being moved right now by another pgidgen (move {rec.move_id}, step {rec.step})",
                where=f"{source}, backend pid {pid}", hint="wait for it to finish, or stop that process first",
            )
        rec = open_move(admin, shard) or rec
        states, _ = read_states(config, need=(source, rec.target))
        layout = states[source].layout or states[rec.target].layout
        assert layout is not None
        ctx = ShardContext(shard=shard, source=source, target=rec.target, layout=layout,
                           shard_count=states[source].shard_count or 0, states=states)
        retired = rec.detail.get("retired_schema")
        live = admin.execute("SELECT schema_name, state FROM pgidgen.shards WHERE shard = %s", (shard,)).fetchone()
        ctx.source_schema = live[0] if live and live[1] == "retired" and live[0] == retired else ctx.schema
        ctx.tables, ctx.sequences = read_tables(admin, ctx.source_schema)
        return ctx, admin, Journal(admin, rec)
    except BaseException:
        release(admin, shard)
        raise


def resume_move(
    config: Config,
    shard: int,
    *,
    options: MoveOptions | None = None,
    progress: Callable[[CopyProgress], None] | None = None,
    hook: Hook | None = None,
) -> MoveReport:
    """Finish an interrupted move from the step its journal last started."""
    ctx, admin, journal = _reopen(config, shard)
    try:
        opts = options or MoveOptions()
        opts.offline = journal.record.mode == "offline"
        journal.log(journal.record.step, "resume", {})
        return Mover(config, ctx, journal, opts, progress, hook).run(resumed=True)
    finally:
        release(admin, shard)


def rollback_move(config: Config, shard: int) -> MoveReport:
    """Undo an interrupted move: the source serves the shard as before, nothing is left on the target."""
    ctx, admin, journal = _reopen(config, shard)
    try:
        return Mover(config, ctx, journal, MoveOptions(), None, None).rollback()
    finally:
        release(admin, shard)


def ensure_catalog(conn: psycopg.Connection[Any], name: str, config: Config, *, layout: Any = None, shard_count: int = 0) -> None:
    """Bring an existing catalog up to this version's (journal tables, and catalog functions older than
    CATALOG_REVISION), or install one on an empty target."""
    have = conn.execute(
        "SELECT to_regclass('pgidgen.layout') IS NOT NULL, to_regclass('pgidgen.move_heartbeat') IS NOT NULL,"
        f" {CATALOG_REVISION_SQL}"
    ).fetchone()
    assert have is not None
    if have[0] and have[1] and have[2] >= CATALOG_REVISION:
        return
    try:
        with conn.transaction():
            # init's lock: two movers (or a mover and an init) bringing one catalog up at once would collide
            # ("tuple concurrently updated" on CREATE OR REPLACE); the second re-runs the same SQL after the first
            conn.execute("SELECT pg_catalog.pg_advisory_xact_lock(%s, %s)", (LOCK_CLASS, INIT_LOCK))
            if not have[0]:
                if layout is None:
                    raise MoveError(f"database {name} has no pgidgen catalog", hint="run 'pgidgen init' first")
                check_argument_order(conn, name)  # a database that gets its first shard by a move: init's check
                execute_script(conn, render_catalog(layout, shard_count=shard_count))
            else:  # an older catalog: its own layout's functions as of this version (all safe to run again)
                row = conn.execute("SELECT epoch_ms, time_bits, shard_bits, sequence_bits, shard_count, generator FROM pgidgen.layout").fetchone()
                if row is None:
                    execute_script(conn, static_sql("catalog.sql"))
                else:
                    own = Layout(epoch_ms=row[0], time_bits=row[1], shard_bits=row[2], sequence_bits=row[3])
                    execute_script(conn, render_catalog(own, shard_count=row[4], generator=row[5]))
    except psycopg.Error as e:
        raise DatabaseError(f"database {name} failed while upgrading the pgidgen catalog: {pg_message(e)}") from None


def stop_hook_from_env() -> Hook | None:
    """Crash tests: PGIDGEN_MOVE_STOP_AT=step makes the CLI announce the step on stderr and hang there until killed."""
    where = os.environ.get("PGIDGEN_MOVE_STOP_AT")
    if not where:
        return None

    def hook(point: str) -> None:
        if point == where:
            sys.stderr.write(f"pgidgen: stopped at {point}\n")
            sys.stderr.flush()
            time.sleep(3600)

    return hook


# -- the mover ----------------------------------------------------------------------------------------


class Background(Generic[T]):
    """One function on a thread of its own; result() re-raises what it raised."""

    def __init__(self, fn: Callable[[], T]) -> None:
        self._value: T | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(fn,), daemon=True)
        self._thread.start()

    def _run(self, fn: Callable[[], T]) -> None:
        try:
            self._value = fn()
        except BaseException as e:  # noqa: BLE001 - handed to result()
            self._error = e

    def join(self) -> None:
        self._thread.join()

    def result(self) -> T:
        self._thread.join()
        if self._error is not None:
            raise self._error
        return self._value  # type: ignore[return-value]


class CutoverAborted(Exception):
    """Catch-up or the lock did not fit in --max-pause: the source was left serving."""


class Mover:
    def __init__(
        self,
        config: Config,
        ctx: ShardContext,
        journal: Journal,
        options: MoveOptions,
        progress: Callable[[CopyProgress], None] | None,
        hook: Hook | None,
        *,
        tgt: psycopg.Connection[Any] | None = None,
        schema_dump: SchemaDump | None = None,
    ) -> None:
        self.config = config
        self.schema_dump = schema_dump  # started before the move was journaled, for the copy step
        self.ctx = ctx
        self.journal = journal
        self.rec = journal.record
        self.opts = options
        self.progress = progress
        self.hook = hook or stop_hook_from_env()
        self.names = q.Names(self.rec.token)
        self.admin = journal.conn  # source, autocommit, holds the move lock
        self._tgt: psycopg.Connection[Any] | None = tgt  # target, autocommit
        self.snapshot: psycopg.Connection[Any] | None = None
        self.verification: Verification | None = None
        self.checking: Background[Verification] | None = None
        self.ahead: Background[list[psycopg.Connection[Any]]] | None = None
        self.check_src: psycopg.Connection[Any] | None = None
        self.report = MoveReport(ctx.shard, ctx.source, ctx.target, self.rec.mode, self.rec.move_id, "running")
        self.t0 = time.perf_counter()

    # connections ----------------------------------------------------------------------------------
    @property
    def tgt(self) -> psycopg.Connection[Any]:
        if self._tgt is None or self._tgt.closed:
            self._tgt = connect(self.ctx.target, self.config.dsn(self.ctx.target), autocommit=True)
        return self._tgt

    def _close(self) -> None:
        if self.schema_dump is not None:
            self.schema_dump.close()
            self.schema_dump = None
        if self.checking is not None:
            self.checking.join()
        for c in (self._tgt, self.snapshot, self.check_src, *(self._take_ahead() or [])):
            if c is not None and not c.closed:
                c.close()

    def _open_ahead(self) -> None:
        """The cutover's two connections (source, target snapshot) and the verification's source connection,
        opened on a thread while catch-up waits: a few ms each, otherwise all on the way to the flip."""
        if self.ahead is not None:
            return
        wanted = [(self.ctx.source, False), (self.ctx.target, False), (self.ctx.source, True)]

        def open_all() -> list[psycopg.Connection[Any]]:
            conns: list[psycopg.Connection[Any]] = []
            try:
                for name, autocommit in wanted:
                    conns.append(connect(name, self.config.dsn(name), autocommit=autocommit))
            except BaseException:
                for c in conns:
                    c.close()
                raise
            return conns

        self.ahead = Background(open_all)

    def _take_ahead(self) -> list[psycopg.Connection[Any]] | None:
        ahead, self.ahead = self.ahead, None
        if ahead is None:
            return None
        try:
            return ahead.result()
        except PgidgenError:
            return None

    def _point(self, name: str) -> None:
        if self.hook is not None:
            self.hook(name)

    # running --------------------------------------------------------------------------------------
    def run(self, *, resumed: bool = False) -> MoveReport:
        steps = self.rec.steps
        first = steps.index(self.rec.step) if self.rec.step in steps else 0
        self.resumed_step = self.rec.step if resumed else None
        step = self.rec.step
        try:
            for step in steps[first:]:
                self.journal.start(step)
                self._point(step)
                getattr(self, "step_" + step)()
            self.journal.finish("done")
        except CutoverAborted as e:
            self.journal.start("cutover" if self.opts.offline else "catchup")
            self.journal.fail("cutover", str(e))
            raise MoveError(
                f"shard {self.ctx.shard} did not move: {e}", where=self.ctx.source,
                hint=f"the source keeps serving it; retry with 'pgidgen move-shard --resume {self.ctx.shard}' "
                f"(perhaps with a larger --max-pause, or when writes are lighter) or undo with --rollback {self.ctx.shard}",
            ) from None
        except PgidgenError as e:
            self._fail(step, e.render())
            raise
        except psycopg.Error as e:
            msg = f"database error during step {step} of the move of shard {self.ctx.shard}: {pg_message(e)}"
            self._fail(step, msg)
            raise MoveError(msg, hint=self._next_hint(step)) from None
        except BaseException as e:
            self._fail(step, f"{type(e).__name__}: {e}")
            raise
        finally:
            self._close()
        self.report.status = "done"
        self.report.seconds = time.perf_counter() - self.t0
        self.report.verification = self.verification
        d = self.rec.detail
        self.report.retired_schema = d.get("retired_schema")
        self.report.last_id = d.get("last_id")
        self.report.skew_ms = d.get("skew_ms")
        if resumed:
            self.report.notes.append(f"resumed move {self.rec.move_id}")
        if self.opts.drop_source and self.report.retired_schema:
            from .cleanup import cleanup

            try:
                cleanup(self.config, self.ctx.shard, only=(self.ctx.source, self.report.retired_schema))
            except PgidgenError as e:  # the move itself is done; the copy stays, as without --drop-source
                self.report.notes.append(f"kept the source copy {self.ctx.source}.{self.report.retired_schema}: {e.render()}")
            else:
                self.report.notes.append(f"dropped the source copy {self.ctx.source}.{self.report.retired_schema}")
                self.report.retired_schema = None
        return self.report

    def _fail(self, step: str, error: str) -> None:
        try:
            if not self.admin.closed:
                self.journal.fail(step, scrub(error))
        except psycopg.Error:
            pass

    def _next_hint(self, step: str) -> str:
        steps = self.rec.steps
        if step in steps and steps.index(step) > steps.index(POINT_OF_NO_RETURN):
            return f"the target serves the shard already; finish with 'pgidgen move-shard --resume {self.ctx.shard}'"
        return f"fix the cause, then 'pgidgen move-shard --resume {self.ctx.shard}' or undo with '--rollback {self.ctx.shard}'"

    def _target_row(self) -> tuple[str, str] | None:
        if not self.tgt.execute("SELECT to_regclass('pgidgen.shards') IS NOT NULL").fetchone()[0]:  # type: ignore[index]
            return None
        row = self.tgt.execute("SELECT state, schema_name FROM pgidgen.shards WHERE shard = %s", (self.ctx.shard,)).fetchone()
        return (row[0], row[1]) if row else None

    # steps ----------------------------------------------------------------------------------------
    def step_prepare(self) -> None:
        if self.opts.offline:  # an online move has the copy step do it, beside the source's slot and pg_dump
            self._ensure_target_catalog()
        with self.admin.transaction():
            if not self.admin.execute("SELECT pg_try_advisory_xact_lock_shared(%s, %s)", (LOCK_CLASS, DDL_LOCK)).fetchone()[0]:  # type: ignore[index]
                raise MoveError(f"pgidgen apply-ddl is changing shards in database {self.ctx.source}",
                                hint=f"wait for it to finish, then 'pgidgen move-shard --resume {self.ctx.shard}'")
            self.admin.execute(q.source_moving_sql(self.ctx.shard))

    def _ensure_target_catalog(self, conn: psycopg.Connection[Any] | None = None) -> None:
        ensure_catalog(conn or self.tgt, self.ctx.target, self.config, layout=self.ctx.layout, shard_count=self.ctx.shard_count)

    def _install_target_catalog_apart(self) -> None:
        """_ensure_target_catalog on a connection of its own, so that it can run while the copy goes into the
        target on self.tgt (a new database's catalog takes 100-200 ms, most of it init's argument-order probe)."""
        with connect(self.ctx.target, self.config.dsn(self.ctx.target), autocommit=True) as conn:
            self._ensure_target_catalog(conn)

    def _shard_depends_on_catalog(self) -> bool:
        """Whether any object of the shard's schema depends on one in the pgidgen schema (a column DEFAULT or a
        CHECK calling a pgidgen function, a pgidgen type, ...): then the catalog must exist before the schema."""
        row = self.admin.execute(q.DEPENDS_ON_CATALOG_SQL, {"schema": self.ctx.source_schema or self.ctx.schema}).fetchone()
        return bool(row and row[0])

    def dump_schema(self) -> bytes:
        src_dsn, src_env = tool_args(self.config.dsn(self.ctx.source))
        proc = subprocess.run(
            [tool("pg_dump"), "--section=pre-data", f"--schema={self.ctx.schema}", *DUMP_OPTIONS, "-d", src_dsn],
            capture_output=True, env=src_env,
        )
        if proc.returncode != 0:
            raise MoveError(f"pg_dump of {self.ctx.schema} on {self.ctx.source} failed: {scrub(last_line(proc.stderr.decode(errors='replace')))}")
        return script_of(proc.stdout, self.ctx.schema)

    def step_schema(self) -> None:
        row = self._target_row()
        if row is not None:
            if row[0] == "incoming":
                return  # committed together with the schema: already done
            raise ConflictError(f"database {self.ctx.target} holds shard {self.ctx.shard} as {row[0]}", hint="see 'pgidgen map'")
        script = self.dump_schema()
        try:
            with self.tgt.transaction():
                encoding = str(self.admin.execute("SHOW server_encoding").fetchone()[0])  # type: ignore[index]
                self.tgt.execute(f"SET client_encoding = {q.literal(encoding)}")
                self.tgt.execute(script)
                execute_script(self.tgt, q.target_row_sql(self.ctx.shard, self.ctx.schema))
        except psycopg.Error as e:
            raise MoveError(
                f"database {self.ctx.target} refused the schema of shard {self.ctx.shard}: {pg_message(e)}",
                hint="create the roles the shard's objects belong to on the target, then --resume" if getattr(e, "sqlstate", "") == "42704" else self._next_hint("schema"),
            ) from None
        finally:
            self._reset_target()

    def _reset_target(self) -> None:
        """The target connection's settings back to pgidgen's session after a restore script changed them."""
        self.tgt.execute("RESET ALL")
        self.tgt.execute("SET search_path TO DEFAULT")
        own_session(self.tgt)

    def step_publication(self) -> None:
        if self.admin.execute("SELECT 1 FROM pg_publication WHERE pubname = %s", (self.names.publication,)).fetchone():
            return
        tables = [q.TableRef(self.ctx.schema, t.name) for t in self.ctx.tables]
        with self.admin.transaction():
            execute_script(self.admin, q.publication_sql(self.names, tables))

    def step_subscription(self) -> None:
        row = self.tgt.execute("SELECT oid FROM pg_subscription WHERE subname = %s", (self.names.subscription,)).fetchone()
        if row is None:
            conninfo = conninfo_for_subscription(self.opts.subscription_conninfo or self.config.dsn(self.ctx.source), self.admin)
            # a failed CREATE SUBSCRIPTION is logged with its text, which holds the password: run so that it is not
            failed = subscribe_quietly(self.tgt, q.subscription_sql(self.names, conninfo), keep=True)
            if failed is not None:
                raise MoveError(
                    f"database {self.ctx.target} could not subscribe to {self.ctx.source}: {failed}",
                    hint=f"the target server itself must reach the source with the connection string in the config (with the password pgidgen logged in with; 'pgidgen check' tests it);"
                         f" then 'pgidgen move-shard {self.ctx.shard} --resume' (with --subscription-dsn DSN if it needs another one), or '--rollback'",
                )
            row = self.tgt.execute("SELECT oid FROM pg_subscription WHERE subname = %s", (self.names.subscription,)).fetchone()
        assert row is not None
        self.journal.note("subscription", subscription_oid=int(row[0]))

    def _sub_oid(self) -> int | None:
        row = self.tgt.execute("SELECT oid FROM pg_subscription WHERE subname = %s", (self.names.subscription,)).fetchone()
        return int(row[0]) if row else None

    def _errors(self, oid: int) -> int:
        row = self.tgt.execute("SELECT coalesce(apply_error_count + sync_error_count, 0) FROM pg_stat_subscription_stats WHERE subid = %s", (oid,)).fetchone()
        return int(row[0]) if row else 0

    def step_copy(self) -> None:
        """The shard: a slot whose exported snapshot the copy reads at, so the subscription (copy_data = false)
        streams exactly the changes after it. Schema, rows (binary COPY streams, see transfer.py), then indexes
        and constraints, and the target's 'incoming' row, in one target transaction: a resume or rollback finds
        either the whole copy or nothing of it."""
        if self.resumed_step == "copy":
            self._ensure_target_catalog()
            self._reset_copy()
        row0 = self._target_row()
        if row0 is not None:
            raise ConflictError(f"database {self.ctx.target} holds shard {self.ctx.shard} as {row0[0]}", hint="see 'pgidgen map'")
        repl = connect(self.ctx.source, self.config.dsn(self.ctx.source), autocommit=True, replication="database")
        created: list[str] = []

        def slot() -> str:
            cur = psycopg.ClientCursor(repl)
            try:
                cur.execute(q.slot_sql(self.names))
            except psycopg.Error as e:
                raise MoveError(f"database {self.ctx.source} could not create the replication slot: {pg_message(e)}",
                                hint="see max_replication_slots and max_wal_senders on the source") from None
            row = cur.fetchone()
            assert row is not None
            created.append(str(row[1]))
            return str(row[2])

        # The target's catalog (on a new database: 100-200 ms, most of it the argument-order probe) goes in on a
        # connection of its own while this thread creates the slot, pg_dump runs and the rows flow; the copy's
        # transaction waits for it before it adds the shard's catalog row and commits (and before it starts,
        # when the shard's objects depend on catalog objects). A failed probe rolls the copy back.
        first = self._shard_depends_on_catalog()
        catalog: Background[None] = Background(self._install_target_catalog_apart)
        try:
            dump, self.schema_dump = self.schema_dump, None
            self._transfer(slot, COPY_SECTIONS, schema_dump=dump, then=q.target_row_sql(self.ctx.shard, self.ctx.schema, reset_offset=False),
                           started=lambda: self.journal.note("copy", consistent_point=created[0]),
                           ready=catalog if first else None, before_then=catalog)
        finally:
            catalog.join()
            repl.close()

    def _reset_copy(self) -> None:
        """An interrupted copy cannot continue (its snapshot died with it): drop the slot and the partial copy."""
        drop_slots(self.admin, self.names, None)
        with self.tgt.transaction():
            self.tgt.execute(f"DROP SCHEMA IF EXISTS {q.ident(self.ctx.schema)} CASCADE")
            self.tgt.execute("DELETE FROM pgidgen.shards WHERE shard = %s AND state = 'incoming'", (self.ctx.shard,))

    def _transfer(
        self,
        snapshot: Callable[[], str | None],
        sections: tuple[str, ...],
        *,
        then: str = "",
        truncate: bool = False,
        started: Callable[[], None] | None = None,
        ready: Background[None] | None = None,
        before_then: Background[None] | None = None,
        schema_dump: SchemaDump | None = None,
    ) -> None:
        """The shard's rows (and the given pg_dump sections around them) into one target transaction, followed by
        `then` in it. snapshot() gives the snapshot to copy at (the online copy creates its slot there): called
        once the tables' formats are planned, so the source's pg_dump and first stream start the moment it returns;
        started() runs right after. ready: work on the target, waited for before the transaction opens;
        before_then: waited for before `then` runs in it. schema_dump: the sections' pg_dump, started earlier
        (else the copy starts one at the snapshot). truncate: the tables exist already (offline), emptying
        them in this transaction lets the rows go in frozen all the same."""
        schema = self.ctx.schema
        try:
            plan = plan_tables(self.admin, self.tgt, self.ctx.source_schema or schema, [t.name for t in self.ctx.tables])
            encoding = str(self.admin.execute("SHOW server_encoding").fetchone()[0])  # type: ignore[index]
            # pg_dump's schema makes materialized views WITH NO DATA; those populated on the source are refreshed
            # from the copied rows (in creation order: one built on another comes later)
            views = [r[0] for r in self.admin.execute(
                "SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = %s AND c.relkind = 'm'"
                " AND c.relispopulated ORDER BY c.oid", (self.ctx.source_schema or schema,))]
            tr = Transfer(self.config.dsn(self.ctx.source), schema, plan, snapshot=snapshot(), encoding=encoding, sections=sections, schema_dump=schema_dump)
        except BaseException:
            if schema_dump is not None:
                schema_dump.close()
            raise
        try:
            tr.start()
            if started is not None:
                started()
            if ready is not None:
                ready.result()
            with self.tgt.transaction():
                if truncate and plan:
                    self.tgt.execute(f"TRUNCATE {', '.join('ONLY ' + q.ident(schema, t.name) for t in plan)}")
                tr.restore(self.tgt, self._copy_progress())
                for view in views:
                    self.tgt.execute(f"REFRESH MATERIALIZED VIEW {q.ident(schema, view)}")
                if "post-data" in sections:  # the whole schema is there: its owners' grants as on the source
                    self._match_grants(schema)
                if before_then is not None:
                    before_then.result()
                execute_script(self.tgt, then)
                self._point("copy:restored")  # all of it in, not yet committed
        except psycopg.Error as e:
            raise MoveError(f"restoring {schema} into {self.ctx.target} failed: {pg_message(e)}", hint=self._next_hint(self.rec.step)) from None
        except MoveError as e:
            e.hint = e.hint or self._next_hint(self.rec.step)
            raise
        finally:
            tr.close()
            if not self.tgt.closed and not self.tgt.broken:
                self._reset_target()
        if self.progress is not None:
            total = sum(t.est_rows for t in self.ctx.tables)
            self.progress(CopyProgress(len(self.ctx.tables), len(self.ctx.tables), total, total, tr.bytes, self._lag()))

    def _match_grants(self, schema: str) -> None:
        """Default privileges on the target (ALTER DEFAULT PRIVILEGES for the role restoring) add grants to the
        objects pg_dump's script creates, or take some away: make the owners' grants the source's again."""
        with self.admin.transaction():  # names schema-qualified alike on both sides
            self.admin.execute("SET LOCAL search_path = ''")
            source = {tuple(r) for r in self.admin.execute(q.OWNER_GRANTS_SQL, {"schema": self.ctx.source_schema or schema})}

        def target() -> set[tuple[Any, ...]]:
            self.tgt.execute("SET LOCAL search_path = ''")
            return {tuple(r) for r in self.tgt.execute(q.OWNER_GRANTS_SQL, {"schema": schema})}

        execute_script(self.tgt, q.revoke_grants_sql(schema, source, target()))
        execute_script(self.tgt, q.grant_missing_sql(schema, source, target()))

    def _copy_progress(self) -> Callable[[str, int], None] | None:
        """Rows as the source's COPY reports them (pg_stat_progress_copy), at most every 0.1 s."""
        if self.progress is None:
            return None
        report = self.progress
        est = {t.name: t.est_rows for t in self.ctx.tables}
        total = sum(est.values())
        done: list[str] = []
        state = {"at": 0.0, "bytes": 0}

        def on_block(table: str, nbytes: int) -> None:
            state["bytes"] += nbytes
            if table not in done:
                done.append(table)
            now = time.perf_counter()
            if now - state["at"] < 0.1:
                return
            state["at"] = now
            row = self.admin.execute(
                "SELECT coalesce(sum(p.tuples_processed), 0) FROM pg_stat_progress_copy p JOIN pg_class c ON c.oid = p.relid"
                " JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = %s AND c.relname = %s",
                (self.ctx.source_schema or self.ctx.schema, table),
            ).fetchone()
            rows = sum(est[t] for t in done[:-1]) + int(row[0] if row else 0)
            report(CopyProgress(len(done) - 1, len(est), min(rows, total), total, int(state["bytes"]), self._lag()))

        return on_block

    def _lag(self) -> int | None:
        row = self.admin.execute(
            "SELECT (pg_current_wal_lsn() - confirmed_flush_lsn)::bigint FROM pg_replication_slots WHERE slot_name = %s", (self.names.slot,)
        ).fetchone()
        return int(row[0]) if row and row[0] is not None else None

    def _beat(self, deadline: float) -> bool:
        """Write a heartbeat on the source and wait until the target has applied it (or the deadline passes).
        The wait is for this very row: a beat is a random number, not a time, so neither a clock that steps back
        nor a resume on another host can make an older beat pass for it."""
        beat = secrets.randbits(62) + 1
        execute_script(self.admin, q.heartbeat_sql(self.rec.token, beat))
        while True:
            if self.tgt.execute("SELECT 1 FROM pgidgen.move_heartbeat WHERE token = %s AND beat = %s", (self.rec.token, beat)).fetchone():
                return True
            if time.perf_counter() > deadline:
                return False
            time.sleep(POLL)

    def step_catchup(self) -> None:
        """Wait until replication keeps up (a heartbeat arrives within half the pause budget); measure the skew."""
        self._open_ahead()
        oid = self._sub_oid()
        errors0 = self._errors(oid) if oid else 0
        give_up = time.perf_counter() + self.opts.catchup_timeout
        while True:
            t = time.perf_counter()
            if self._beat(min(give_up, t + max(self.opts.max_pause, 5.0))) and time.perf_counter() - t <= self.opts.max_pause / 2:
                break
            if oid and self._errors(oid) > errors0:
                raise MoveError(f"applying changes of shard {self.ctx.shard} on {self.ctx.target} failed", where=f"{self.ctx.target}'s server log",
                                hint=f"fix the cause (see the log), then --resume {self.ctx.shard}, or --rollback {self.ctx.shard}")
            if time.perf_counter() > give_up:
                raise CutoverAborted(f"replication did not catch up within {self.opts.catchup_timeout:.0f}s")
            if self.progress is not None:
                self.progress(CopyProgress(len(self.ctx.tables), len(self.ctx.tables), 0, 0, 0, self._lag()))
        self._measure_skew()

    def _measure_skew(self) -> None:
        skew, unc = measure_skew(self.admin, self.tgt)
        self.journal.note("catchup", skew_ms=round(skew, 3), skew_uncertainty_ms=round(unc, 3))

    def step_cutover(self) -> None:
        if self._source_retired():
            return
        if self.opts.offline and self.resumed_step == "cutover":
            # The offline copy commits on the target before the source is retired: a run interrupted between
            # the two left a full copy there (indexes and constraints included), which the copy cannot go into
            # again. The source still serves; start the target's copy over (its schema too, should an earlier
            # resume have stopped between dropping and making it).
            if self._target_row() is not None:
                self._reset_copy()
            self.step_schema()
        if "skew_ms" not in self.rec.detail:
            self._measure_skew()
        attempts = max(1, self.opts.attempts)
        last: CutoverAborted | None = None
        for attempt in range(1, attempts + 1):
            self.report.attempts = attempt
            try:
                self._cutover_once()
                return
            except CutoverAborted as e:
                last = e
                self.journal.log("cutover", "aborted", {"attempt": attempt, "reason": str(e)})
                if attempt < attempts:
                    time.sleep(0.2 * attempt)
                    if not self.opts.offline:
                        self.step_catchup()
        assert last is not None
        raise CutoverAborted(f"{last} ({attempts} attempts)")

    def _source_retired(self) -> bool:
        retired = self.rec.detail.get("retired_schema")
        if not retired:
            return False
        row = self.admin.execute("SELECT state, schema_name FROM pgidgen.shards WHERE shard = %s", (self.ctx.shard,)).fetchone()
        if row is not None and row[0] == "retired" and row[1] == retired:
            self.ctx.source_schema = retired
            return True
        return False

    def _cutover_once(self) -> None:
        shard, schema = self.ctx.shard, self.ctx.schema
        retired = f"{schema}_moved_{time.strftime('%Y%m%d%H%M%S', time.gmtime())}"
        self.journal.note("cutover", retired_schema=retired)
        tables = [q.TableRef(schema, t.name) for t in self.ctx.tables]
        guarded = [q.TableRef(schema, name) for name in self._partitioned(schema)] + tables  # parents first, as writers lock them
        budget = self.opts.max_pause
        ahead = self._take_ahead()
        if ahead is not None:
            src, snap, self.check_src = ahead
        else:
            src = connect(self.ctx.source, self.config.dsn(self.ctx.source))
            snap = connect(self.ctx.target, self.config.dsn(self.ctx.target))  # before the pause
        theirs = self._tables_as_they_stand(self.tgt, schema)  # the target's side, read before the pause
        their_items = schema_items(self.tgt, schema) if not self.opts.offline else set()  # offline: post-data comes under the freeze
        if not self.opts.offline:
            # The schema on both sides, and nothing outside the shard depending on it, checked right before the
            # pause rather than in it (some 20 ms under load): DDL that does not wait for the freeze's locks
            # (a view, a grant, a function) could slip in after a check made in the pause just the same.
            changed = self._changed_objects(schema_items(src, schema), their_items)
            found = outside_dependents(src, schema)
            src.rollback()
            if found:  # made during the move: they would stay bound to the retired copy
                changed.append(f"objects outside it now depend on it: {describe_dependents(found)}")
            if changed:
                src.close()
                snap.close()
                raise MoveError(f"the tables of {schema} changed during the move ({'; '.join(changed)})", where=self.ctx.source,
                                hint=f"nothing was flipped; roll back with --rollback {shard} and move again")
            self._tables_as_they_stand(src, schema, prepare=True)  # the query the pause makes: planned before it
            src.rollback()
        committed = False
        try:
            t_start = time.perf_counter()
            deadline = t_start + budget
            try:
                execute_script(src, q.freeze_sql(shard, guarded, int(budget * 1000)))
            except (psycopg.errors.LockNotAvailable, psycopg.errors.DeadlockDetected):
                src.rollback()
                raise CutoverAborted(f"the shard's tables could not be locked within --max-pause {budget * 1000:.0f} ms (long transactions on them?)") from None
            waited = time.perf_counter() - t_start > LOCK_WAIT_RECHECK
            mine = self._tables_as_they_stand(src, schema, prepare=not self.opts.offline)
            now = set(mine)
            if now != {t.name for t in self.ctx.tables}:
                src.rollback()
                raise MoveError(
                    f"the tables of {schema} changed during the move ({', '.join(sorted(now ^ {t.name for t in self.ctx.tables}))})",
                    where=self.ctx.source, hint=f"tables created or dropped mid-move are not replicated: roll back with --rollback {shard} and move again",
                )
            changed = self._changed_tables(mine, theirs)
            if not changed and waited and not self.opts.offline:
                # the locks were waited for: DDL that held one (CREATE INDEX, ALTER TABLE, CREATE POLICY, ...) may
                # have committed meanwhile, after the check made before the pause
                changed = self._changed_objects(schema_items(src, schema), their_items)
            if changed:
                src.rollback()
                raise MoveError(
                    f"the tables of {schema} changed during the move ({'; '.join(changed)})", where=self.ctx.source,
                    hint=f"nothing was flipped; roll back with --rollback {shard} and move again",
                )
            if self.opts.offline:
                self._offline_copy()
            elif not self._beat(deadline):
                src.rollback()
                raise CutoverAborted(f"the target did not catch up within --max-pause {budget * 1000:.0f} ms")
            assert snap is not None
            snap.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
            snap.execute("SELECT 1 FROM pgidgen.shards LIMIT 1")  # the snapshot: the target at the cutover point
            self._point("cutover:frozen")
            if self.opts.offline or self.opts.verify_in_pause:
                v = compare(src, schema, snap, schema, [t.name for t in self.ctx.tables], when="at the cutover point, before the flip")
                if not v.ok:
                    src.rollback()
                    self.verification = v
                    raise MoveError(
                        f"the copy of shard {shard} on {self.ctx.target} differs from the source: "
                        + "; ".join(t.describe() for t in v.mismatches()),
                        hint=f"nothing was flipped; the source keeps serving; roll back with --rollback {shard}",
                    )
                self.verification = v
            execute_script(src, q.retire_sql(shard, schema, retired, guarded, self.ctx.target))
            src.commit()
            committed = True
            self.ctx.source_schema = retired
            self.pause_started = t_start
        finally:
            if not committed and not src.closed:
                src.rollback()
            src.close()
            if not committed and snap is not None:
                snap.close()
        self.snapshot = snap

    def _start_checking(self, snap: psycopg.Connection[Any], retired: str) -> None:
        """The comparison at the cutover point only reads: the retired source copy takes no more writes and snap
        holds the target's snapshot of that moment. So it runs from the end of the pause (activate's commit: its
        scans would slow the flip down, by more the larger the shard), beside teardown, and step_verify
        (journaled as before) collects the result."""
        tables = [t.name for t in self.ctx.tables]
        name, dsn, schema = self.ctx.source, self.config.dsn(self.ctx.source), self.ctx.schema
        opened, self.check_src = self.check_src, None

        def check() -> Verification:
            src = opened or connect(name, dsn, autocommit=True)
            try:
                return compare(src, retired, snap, schema, tables)
            finally:
                src.close()

        self.checking = Background(check)

    def _partitioned(self, schema: str) -> list[str]:
        return [r[0] for r in self.admin.execute(q.PARTITIONED_SQL, (schema,))]

    def _tables_as_they_stand(self, conn: psycopg.Connection[Any], schema: str, *, prepare: bool | None = None) -> dict[str, tuple[str, bool]]:
        """Per table of the schema: its columns (name and type, by name) and whether the move's publication
        holds it. One catalog query: on the source it runs inside the pause."""
        return {r[0]: (r[1] or "", bool(r[2])) for r in conn.execute(q.TABLES_AS_THEY_STAND_SQL, {"schema": schema, "publication": self.names.publication}, prepare=prepare)}

    def _changed_tables(self, mine: dict[str, tuple[str, bool]], theirs: dict[str, tuple[str, bool]]) -> list[str]:
        """Under the freeze, before the flip: tables whose columns differ between source and target (DDL on one
        side mid-move), and, online, tables the publication does not hold (dropped and created again under
        the same name: their rows since were never replicated)."""
        changed = [f"{name}: columns {mine[name][0] if name in mine else 'none'} on {self.ctx.source},"
                   f" {theirs[name][0] if name in theirs else 'none'} on {self.ctx.target}"
                   for name in sorted(set(mine) | set(theirs)) if mine.get(name, ("",))[0] != theirs.get(name, ("",))[0]]
        if not self.opts.offline:
            changed += [f"{name}: not the table the move publishes (created again?)" for name in sorted(mine) if not mine[name][1]]
        return changed

    def _changed_objects(self, mine: set[str], theirs: set[str]) -> list[str]:
        """Indexes, constraints, defaults, triggers, views, functions, types (what status --drift compares) that
        differ: DDL on the source after the copy read its schema is not replicated."""
        out = []
        for side, items in ((self.ctx.source, sorted(mine - theirs)), (self.ctx.target, sorted(theirs - mine))):
            if items:
                out.append(f"only on {side}: {', '.join(items[:3])}" + (f" and {len(items) - 3} more" if len(items) > 3 else ""))
        return out

    def _offline_copy(self) -> None:
        """Inside the freeze (no snapshot needed, nothing writes): the rows, then indexes and constraints."""
        self._transfer(lambda: None, ("post-data",), truncate=True)

    def step_activate(self) -> None:
        row = self._target_row()
        if row is not None and row[0] == "active":
            return
        if row is None or row[0] != "incoming":
            raise MoveError(f"database {self.ctx.target} lost its copy of shard {self.ctx.shard}", hint="see 'pgidgen map' and the journal (pgidgen.move_log)")
        shard, retired = self.ctx.shard, self.ctx.source_schema
        if self.resumed_step in ("cutover", "activate") and getattr(self, "pause_started", None) is None and not self.opts.offline and self._sub_oid():
            # The cutover's catch-up was in an earlier run: a target that restarted since may have lost applied
            # changes (the apply worker commits asynchronously) and must apply them again before it serves.
            if not self._beat(time.perf_counter() + self.opts.catchup_timeout):
                raise MoveError(f"database {self.ctx.target} has not applied all changes of shard {shard} made before the flip",
                                where=f"{self.ctx.target}'s subscription {self.names.subscription}",
                                hint=f"see pg_stat_subscription and the target's server log, then --resume {shard}")
        last_id = int(self.admin.execute("SELECT pgidgen.last_id(%s)", (shard,)).fetchone()[0])  # type: ignore[index]
        seqs = self._sequence_values(retired)
        skew = float(self.rec.detail.get("skew_ms", 0.0))
        unc = float(self.rec.detail.get("skew_uncertainty_ms", 0.0))
        ahead = math.ceil(-skew + unc) + 1
        self.journal.note("activate", last_id=last_id, ahead_ms=ahead)
        sub = None if self.opts.offline else (self.names.subscription if self._sub_oid() else None)
        ledger = ledger_copy_sql(self.admin, shard)
        with self.tgt.transaction():
            execute_script(self.tgt, ledger)
            execute_script(self.tgt, q.activate_sql(shard, self.ctx.schema, last_id=last_id, ahead_ms=ahead, sequences=seqs, subscription=sub))
        started = getattr(self, "pause_started", None)
        if self.snapshot is not None and self.verification is None and self.checking is None:
            self._start_checking(self.snapshot, retired)
        if started is not None:
            self.report.pause_ms = (time.perf_counter() - started) * 1000
            self.journal.note("activate", pause_ms=round(self.report.pause_ms, 1))

    def _sequence_values(self, schema: str) -> list[q.SeqValue]:
        """The shard's own sequences (serial, identity, ...) as they stand: last_value and is_called read from
        each sequence itself (pg_sequences shows NULL for one not yet called, as after ALTER SEQUENCE ... RESTART,
        and for one the reader may not see; carrying its start value instead would hand values out again)."""
        names = [r[0] for r in self.admin.execute(
            "SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = %s AND c.relkind = 'S'"
            " AND c.relname NOT IN ('pgidgen_counter', 'pgidgen_offset') ORDER BY 1", (schema,))]
        if not names:
            return []
        query = " UNION ALL ".join(f"SELECT {q.literal(n)}, last_value, is_called FROM {q.ident(schema, n)}" for n in names)
        return [q.SeqValue(r[0], int(r[1]), bool(r[2])) for r in self.admin.execute(query)]

    def step_teardown(self) -> None:
        teardown(self.admin, self.tgt, self.names, self.rec.detail.get("subscription_oid"))

    def step_verify(self) -> None:
        if self.verification is not None:
            if self.snapshot is not None:
                self.snapshot.close()
            self.journal.note("verify", verified=self.verification.ok)
            return
        tables = [t.name for t in self.ctx.tables]
        if self.snapshot is not None:
            if self.checking is not None:
                v = self.checking.result()
                self.checking = None
            else:
                v = compare(self.admin, self.ctx.source_schema, self.snapshot, self.ctx.schema, tables)
            self.snapshot.close()
        else:
            v = compare(self.admin, self.ctx.source_schema, self.tgt, self.ctx.schema, tables,
                        when="after a resume (the cutover snapshot died with the interrupted run; writes to the target since the flip show as differences)")
        self.verification = v
        self.journal.note("verify", verified=v.ok)
        if not v.ok and self.snapshot is not None:
            raise MoveError(
                f"shard {self.ctx.shard} moved, but its copy on {self.ctx.target} differs from the source at the cutover point: "
                + "; ".join(t.describe() for t in v.mismatches()),
                hint=f"the source copy is kept read-only as {self.ctx.source}.{self.ctx.source_schema} for repair; investigate before --cleanup",
            )

    # rollback -------------------------------------------------------------------------------------
    def rollback(self) -> MoveReport:
        shard = self.ctx.shard
        try:
            row = self._target_row()
            if row is not None and row[0] == "active":
                raise MoveError(
                    f"the move of shard {shard} is past its flip: {self.ctx.target} serves the shard and may have taken writes",
                    hint=f"finish it with 'pgidgen move-shard --resume {shard}'; to go back, move the shard again afterwards",
                )
            self.journal.log(self.rec.step, "rollback", {})
            teardown(self.admin, self.tgt, self.names, self.rec.detail.get("subscription_oid"))
            if row is not None and row[0] == "incoming":
                with self.tgt.transaction():
                    self.tgt.execute(f"DROP SCHEMA IF EXISTS {q.ident(self.ctx.schema)} CASCADE")
                    self.tgt.execute("DELETE FROM pgidgen.shards WHERE shard = %s AND state = 'incoming'", (shard,))
            src_row = self.admin.execute("SELECT state, schema_name FROM pgidgen.shards WHERE shard = %s", (shard,)).fetchone()
            with self.admin.transaction():
                if src_row is not None and src_row[0] == "retired":
                    execute_script(self.admin, q.unretire_sql(shard, self.ctx.schema, src_row[1], [t.name for t in self.ctx.tables] + self._partitioned(src_row[1])))
                else:
                    self.admin.execute("UPDATE pgidgen.shards SET state = 'active', updated_at = now() WHERE shard = %s AND state = 'moving'", (shard,))
            self.journal.finish("rolled_back")
        finally:
            self._close()
        self.report.status = "rolled_back"
        return self.report


def teardown(src: psycopg.Connection[Any], tgt: psycopg.Connection[Any], names: q.Names, sub_oid: int | None) -> None:
    """Drop the subscription, the slots (ours and any table-sync slots left behind) and the publication."""
    row = tgt.execute("SELECT oid FROM pg_subscription WHERE subname = %s", (names.subscription,)).fetchone()
    if row is not None:
        sub_oid = sub_oid or int(row[0])
        for stmt in q.drop_subscription_sql(names.subscription).splitlines():
            tgt.execute(stmt)
    drop_slots(src, names, sub_oid)
    execute_script(src, q.drop_publication_sql(names))
    if tgt.execute("SELECT to_regclass('pgidgen.move_heartbeat') IS NOT NULL").fetchone()[0]:  # type: ignore[index]
        tgt.execute("DELETE FROM pgidgen.move_heartbeat WHERE token = %s", (names.token,))


def drop_slots(src: psycopg.Connection[Any], names: q.Names, sub_oid: int | None, *, wait: float = 15.0) -> None:
    """A slot stays active until its walsender notices the subscriber left (usually within milliseconds): look
    again soon, then less often; after wait, end that walsender."""
    pattern = f"pg_{sub_oid}_sync_%" if sub_oid else None
    deadline = time.monotonic() + wait
    nap = POLL
    while True:
        rows = src.execute(
            "SELECT slot_name, active, active_pid FROM pg_replication_slots WHERE slot_name = %s OR slot_name LIKE %s",
            (names.slot, pattern or names.slot),
        ).fetchall()
        if not rows:
            return
        for name, active, pid in rows:
            if not active:
                try:
                    src.execute("SELECT pg_drop_replication_slot(%s)", (name,))
                except psycopg.errors.ObjectInUse:
                    pass
                except psycopg.errors.UndefinedObject:
                    pass
            elif time.monotonic() > deadline and pid:
                src.execute("SELECT pg_terminate_backend(%s)", (pid,))
        time.sleep(nap)
        nap = min(nap * 2, 0.05)


def measure_skew(src: psycopg.Connection[Any], tgt: psycopg.Connection[Any], rounds: int = 5) -> tuple[float, float]:
    """(target clock - source clock, uncertainty) in ms, each server read against this machine's clock; the
    round with the shortest round trips wins, and half of both round trips is the uncertainty."""
    best: tuple[float, float] | None = None
    query = "SELECT (extract(epoch FROM clock_timestamp()) * 1000)::float8"
    for _ in range(rounds):
        a0 = time.time()
        s = float(src.execute(query).fetchone()[0])  # type: ignore[index]
        a1 = time.time()
        b0 = time.time()
        t = float(tgt.execute(query).fetchone()[0])  # type: ignore[index]
        b1 = time.time()
        skew = (t - (b0 + b1) * 500) - (s - (a0 + a1) * 500)
        unc = ((a1 - a0) + (b1 - b0)) * 500
        if best is None or unc < best[1]:
            best = (skew, unc)
    assert best is not None
    return best


__all__ = ["MoveOptions", "MoveReport", "CopyProgress", "move_shard", "resume_move", "rollback_move"]
