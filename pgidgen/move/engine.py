"""Where shards move: the driver that walks a move's steps (steps/), each journaled before it runs and safe to run again.

Policy across databases: every step is one transaction on one database (or a non-transactional replication
command), in a fixed order, and the journal on the source says which step was last started. A step that runs
again after a crash first looks at what is already there. Until the target goes active ("activate") the source
copy is authoritative and a rollback loses nothing; after it, the only way is forward (resume).
"""
from __future__ import annotations

import secrets
import time
from typing import Any, Callable

import psycopg

from ..check import conninfo_for_subscription
from ..config import Config
from ..db import connect, pg_message
from ..errors import ConflictError, PgidgenError
from .context import (
    MoveError,
    ShardContext,
    check_no_other_move,
    check_external_references,
    check_outside_dependents,
    check_roles,
    check_servers,
    check_tables,
    locate,
    read_states,
    read_tables,
)
from .compat import check_clients, check_restorable
from .journal import Journal, MoveRecord, lock_holder, open_move, release, try_lock
from .transfer import COPY_SECTIONS, SchemaDump
from .steps.activate import ActivateStep
from .steps.base import Background, CopyProgress, CutoverAborted, Hook, MoveOptions, MoveReport, stop_hook_from_env
from .steps.copy import CopySteps
from .steps.cutover import CutoverSteps
from .steps.prepare import PrepareSteps, ensure_catalog
from .steps.replication import ReplicationSteps, drop_slots, measure_skew, teardown
from .steps.rollback import RollbackStep
from .steps.verify import VerifyStep


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



class Mover(PrepareSteps, CopySteps, ReplicationSteps, CutoverSteps, ActivateStep, VerifyStep, RollbackStep):
    """Walks the journal's steps from the one last started; each step_<name> lives in its phase's module."""

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



__all__ = [
    "Background", "CopyProgress", "CutoverAborted", "Hook", "MoveOptions", "MoveReport", "Mover", "drop_slots", "ensure_catalog",
    "find_open_move", "measure_skew", "move_shard", "resume_move", "rollback_move", "stop_hook_from_env", "teardown",
]
