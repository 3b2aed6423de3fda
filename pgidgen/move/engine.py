"""Where shards move: the driver that walks a move's steps (steps/), each journaled before it runs and safe to run again.

Policy across databases: every step is one transaction on one database (or a non-transactional replication
command), in a fixed order, and the journal on the source says which step was last started. A step that runs
again after a crash first looks at what is already there. Until the target goes active ("activate") the source
copy is authoritative and a rollback loses nothing; after it, the only way is forward (resume). A connection lost
during a step is waited for (--fault-wait) and the step run again the same way, in this process (steps/ride.py).
"""
from __future__ import annotations

import secrets
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import psycopg

from ..check import Refusal, conninfo_for_subscription, probe_subscription
from ..config import Config
from ..db import connect, pg_message, server_encoding
from ..errors import ConfigError, ConflictError, InputError, PgidgenError
from ..ranges import collapse
from .batches import Batch, plan_batches
from .compat import check_clients, check_restorable
from .context import (
    MoveError,
    ShardContext,
    check_batch,
    check_no_other_move,
    check_no_other_moves,
    check_owners,
    check_servers,
    check_tables,
    identity_changes,
    locate_batch,
    read_states,
    read_tables_of,
)
from .identity import journal_form
from .journal import Journal, MoveRecord, lock_holder, open_move, release, retired_names, try_lock_all
from .schemacache import SchemaCache, cache_for
from .steps.activate import ActivateStep
from .steps.base import (
    Background,
    CopyProgress,
    CutoverAborted,
    Hook,
    MoveOptions,
    MoveReport,
    PauseExceeded,
    run_stoppable,
    stop_hook_from_env,
)
from .steps.copy import CopySteps
from .steps.cutover import CutoverSteps
from .steps.failover import FailoverSteps
from .steps.identity import IdentitySteps
from .steps.prepare import PrepareSteps, ensure_catalog, wait_for_apply_ddl
from .steps.replication import ReplicationSteps, drop_slots, measure_skew, teardown
from .steps.ride import RideThrough
from .steps.rollback import RollbackStep
from .steps.verify import VerifyStep
from .transfer import COPY_SECTIONS, SchemaDump

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
    """Move shard to target while the application keeps writing (or, with options.offline, under a write lock):
    a batch of one."""
    return move_shards(config, [shard], target, options=options, progress=progress, hook=hook)[0]


def move_shards(
    config: Config,
    shards: Sequence[int],
    target: str,
    *,
    options: MoveOptions | None = None,
    progress: Callable[[CopyProgress], None] | None = None,
    hook: Hook | None = None,
    on_batch: Callable[[MoveReport], None] | None = None,
    should_stop: Callable[[], bool] | None = None,
    on_rollback: Callable[[list[int]], None] | None = None,
) -> list[MoveReport]:
    """Move a set of shards, all in one database, to target: in batches, each with one slot, publication,
    subscription, consistent copy, catch-up and cutover, all its shards flipping in one transaction. A batch is
    as large as its estimated write pause allows (see batches.py); a batch whose cutover still did not fit
    --max-pause is rolled back (nothing flipped; on_rollback(its shards)) and moved again as two halves. One report
    per batch moved; should_stop() is asked before each batch (a Ctrl-C of rebalance or move-shard: the batch in
    flight finishes, no other starts; see move_shards_interruptible)."""
    opts = options or MoveOptions()
    wanted = sorted(set(shards))
    if not wanted:
        raise InputError("no shards to move", hint="name them like 10-19,42")
    ctxs = locate_batch(config, wanted, target)
    pacer, queue = plan_batches(config, ctxs, opts)
    by_shard = {c.shard: c for c in ctxs}
    reports: list[MoveReport] = []
    cache = None if opts.offline else cache_for(config.dsn(ctxs[0].source), queue, pacer.lock_budget)
    try:
        while queue and not (should_stop is not None and should_stop()):
            batch = queue.pop(0)
            try:
                report = _move_batch(config, batch.ctxs, target, opts, progress, hook, should_stop, cache)
            except NotStarted:
                break  # a Ctrl-C before the batch wrote anything: it is not in flight, so it does not start
            except PauseExceeded:
                if len(batch.ctxs) == 1:
                    raise
                rollback_move(config, batch.ctxs[0].shard)  # nothing flipped: the source serves them all as before
                if on_rollback is not None:
                    on_rollback([c.shard for c in batch.ctxs])
                half = len(batch.ctxs) // 2
                queue[:0] = [Batch(_fresh(batch.ctxs[:half]), 0.0, 0, batch.costs[:half]), Batch(_fresh(batch.ctxs[half:]), 0.0, 0, batch.costs[half:])]
                continue
            if report.pause_ms is not None and pacer.measured(batch, report.pause_ms / 1000) and queue:
                queue = pacer.cut([c for b in queue for c in b.costs], by_shard)  # the rest, cut again by what the pause was
            reports.append(report)
            if on_batch is not None:
                on_batch(report)
    finally:
        if cache is not None:
            cache.close()
    return reports


class NotStarted(Exception):
    """A batch stopped by should_stop() during its checks, before it journaled anything: nothing was written."""


class MovesInterrupted(KeyboardInterrupt):
    """Ctrl-C stopped a move of a set of shards between batches: the batch in flight finished (or rolled back, when
    its cutover did not fit), no other started. reports: the batches moved; left: the shards that did not move;
    rolled_back: whether a batch was rolled back (so, with no report, something was done all the same)."""

    def __init__(self, reports: list[MoveReport], left: list[int], target: str, rolled_back: bool = False) -> None:
        super().__init__("move-shard interrupted")
        self.reports, self.left, self.target, self.rolled_back = reports, left, target, rolled_back


class BatchesFailed(MoveError):
    """A batch of a set move failed after earlier batches moved: reports holds theirs (the error alone would hide
    that some shards moved), left the shards that did not move; cause is the batch's own error."""

    def __init__(self, cause: PgidgenError, reports: list[MoveReport], left: list[int], target: str) -> None:
        moved = sorted(s for r in reports for s in r.shards)
        rest = f"shard{'s' if len(left) > 1 else ''} {collapse(left)} did not move ('pgidgen map' shows where each is)"
        super().__init__(f"{cause.what}, after {len(moved)} shards moved to {target} ({collapse(moved)})", where=cause.where,
                         hint=f"{cause.hint}; {rest}" if cause.hint else rest)
        self.cause, self.reports, self.left, self.target = cause, reports, left, target


def move_shards_interruptible(
    config: Config,
    shards: Sequence[int],
    target: str,
    *,
    options: MoveOptions | None = None,
    progress: Callable[[CopyProgress], None] | None = None,
    hook: Hook | None = None,
    on_interrupt: Callable[[], None] | None = None,
) -> list[MoveReport]:
    """move_shards for the main thread of a program a terminal's Ctrl-C may stop (the CLI): the moves run on a
    thread of their own (run_stoppable), so a Ctrl-C never lands inside a step. It lets the batch in flight
    finish (or roll back) and starts no other, then raises MovesInterrupted; a second one does not cut the batch
    short either. A Ctrl-C during the last batch changes nothing: the reports are returned."""
    reports: list[MoveReport] = []
    rolled: list[list[int]] = []
    try:
        _, interrupted = run_stoppable(lambda stop: move_shards(config, shards, target, options=options, progress=progress, hook=hook,
                                                                on_batch=reports.append, should_stop=stop.is_set, on_rollback=rolled.append),
                                       on_interrupt=on_interrupt)
    except PgidgenError as e:
        if not reports:
            raise
        moved = {s for r in reports for s in r.shards}
        raise BatchesFailed(e, reports, [s for s in sorted(set(shards)) if s not in moved], target) from None
    moved = {s for r in reports for s in r.shards}
    left = [s for s in sorted(set(shards)) if s not in moved]
    if interrupted and left:
        raise MovesInterrupted(reports, left, target, rolled_back=bool(rolled))
    return reports


def plan_shards(config: Config, shards: Sequence[int], target: str, *, options: MoveOptions | None = None) -> list[Batch]:
    """The dry run of a set of shards: the batches it would move in, after the checks that need only the
    catalogs. Nothing is written."""
    return plan_batches(config, locate_batch(config, sorted(set(shards)), target), options or MoveOptions())[1]


def _fresh(ctxs: list[ShardContext]) -> list[ShardContext]:
    """The contexts of a batch to run again: what the checks read is read again."""
    return [ShardContext(shard=c.shard, source=c.source, target=c.target, layout=c.layout, shard_count=c.shard_count, states=c.states) for c in ctxs]


def _move_batch(
    config: Config,
    ctxs: list[ShardContext],
    target: str,
    opts: MoveOptions,
    progress: Callable[[CopyProgress], None] | None,
    hook: Hook | None,
    should_stop: Callable[[], bool] | None = None,
    cache: SchemaCache | None = None,
) -> MoveReport:
    """One batch: the checks (a Ctrl-C that comes before the journal is written stops it there, NotStarted: the
    batch in flight a Ctrl-C lets finish is one that has written something), the journal, then the Mover."""
    ctx, shards = ctxs[0], [c.shard for c in ctxs]
    # The target's connection opens while the source is checked; the mover keeps it. So does a second source
    # connection, for check_batch's catalog queries beside the other checks (see below).
    opening: Background[psycopg.Connection[Any]] = Background(lambda: connect(target, config.dsn(target), autocommit=True))
    src_for_check: Background[psycopg.Connection[Any]] = Background(lambda: connect(ctx.source, config.dsn(ctx.source), autocommit=True))
    opening_src: Background[psycopg.Connection[Any]] | None = src_for_check  # None once check_batch has it (it closes it)
    try:
        admin = connect(ctx.source, config.dsn(ctx.source), autocommit=True)
    except BaseException:
        _close_opened(opening, src_for_check)
        raise
    tgt: psycopg.Connection[Any] | None = None
    journal: Journal | None = None
    early: SchemaDump | None = None
    probing: Probe | None = None
    batch_checked: Background[None] | None = None
    try:
        ensure_catalog(admin, ctx.source, config)
        wait_for_apply_ddl(admin, ctx.source)  # before anything reads the shard's schema
        busy = try_lock_all(admin, shards)
        if busy is not None:
            check_no_other_move(admin, ctx.source, busy)
            pid = lock_holder(admin, busy)
            raise MoveError(f"shard {busy} is being moved right now by another pgidgen", where=f"{ctx.source}, backend pid {pid}", hint="wait for it to finish")
        # the client tools pg_dump needs, looked at before it starts; a refusal comes in its turn, after the
        # interrupted moves and the shards' states, as when the checks ran one after another
        clients_refused: MoveError | None = None
        try:
            check_clients(ctx, admin)
        except MoveError as e:
            clients_refused = e
        # check_batch's catalog queries (some 20 ms, more on a database of many shards) on connections of their
        # own, beside the checks below; its answer is asked for in its turn, so the first finding is the same
        opening_src = None
        batch_checked = Background(lambda: _check_batch_apart(ctxs, src_for_check, opening))
        if not opts.offline and clients_refused is None:
            # The schema's pg_dump (50-100 ms, most of it pg_dump reading the catalog; more on a busy server) runs
            # while the move is checked and journaled, instead of after the slot, where the rows wait for the
            # tables it creates. It starts once the shards are this process's (its table locks must not hold up
            # another mover's freeze) and only reads: a move the checks refuse stops it (finally). (Its processes
            # start on this thread: they die with the thread that started them, see transfer._spawn.)
            # A set move's later batches take their part of its one dump when it is read and their schemas are
            # unchanged since (schemacache.py).
            early = cache.take(admin, [c.schema for c in ctxs]) if cache is not None else None
            if early is None:
                early = SchemaDump(config.dsn(ctx.source), [c.schema for c in ctxs], encoding=server_encoding(admin), sections=COPY_SECTIONS)
            # whether the target's server can log in to the source as the subscription will (check_servers asks
            # for the answer in its turn): 10-20 ms, most of it the target connecting to the source
            conninfo = conninfo_for_subscription(opts.subscription_conninfo or config.dsn(ctx.source), admin)
            probing = Probe(target, config.dsn(target), conninfo)
        check_no_other_moves(admin, ctx.source, shards)
        states = dict(admin.execute("SELECT shard, state FROM pgidgen.shards WHERE shard = ANY(%s)", (shards,)).fetchall())
        gone = [s for s in shards if states.get(s) not in ("active", "moving")]
        if gone:
            raise ConflictError(f"shard{'s' if len(gone) > 1 else ''} {collapse(gone)} left database {ctx.source} while the move was starting", hint="see 'pgidgen map'")
        if clients_refused is not None:
            raise clients_refused
        check_owners(ctxs, admin, admin, target=False)  # else reading the tables fails with "permission denied"
        read = read_tables_of(admin, [c.schema for c in ctxs])
        for c in ctxs:
            c.source_schema = c.schema
            c.tables, c.sequences = read[c.schema]
            check_tables(c, online=not opts.offline)
        tgt = opening.result()
        checked, batch_checked = batch_checked, None
        assert checked is not None
        checked.result()
        if opts.offline:
            for c in ctxs:
                check_restorable(c, config.dsn(ctx.source), admin, tgt)
        else:  # the batch's one dump holds every schema: one trial restore
            check_restorable(ctx, config.dsn(ctx.source), admin, tgt, schema_dump=early)
            assert probing is not None
            probe = probing
            check_servers(ctx, admin, tgt, conninfo=conninfo, custom=opts.subscription_conninfo is not None, probed=lambda: probe.result(should_stop))
        if should_stop is not None and should_stop():
            raise NotStarted
        token = f"{shards[0]}_{secrets.token_hex(4)}"
        detail: dict[str, Any] = {"max_pause_ms": int(opts.max_pause * 1000)}
        if opts.origin != "move-shard":
            detail["origin"] = opts.origin
        if len(ctxs) == 1:
            detail["tables"] = [t.name for t in ctx.tables]
        else:
            detail["shards"] = shards
        if not opts.offline:  # what the move will change, journaled before it changes anything
            changed = journal_form({c.schema: identity_changes(c) for c in ctxs})
            if changed:
                detail["identity"] = changed
        journal = Journal.open_new(
            admin, shard=shards[0], source=ctx.source, target=target, mode="offline" if opts.offline else "online", token=token, detail=detail,
        )
        mover, tgt = Mover(config, ctxs, journal, opts, progress, hook, tgt=tgt, schema_dump=early), None
        early = None  # the mover's now
        return mover.run()
    finally:
        if journal is not None and journal.conn is not admin:  # a ride connected again: the locks are that session's
            release(journal.conn, shards[0])
        if probing is not None:
            probing.stop()
        if batch_checked is not None:
            batch_checked.join()
        if opening_src is not None:  # stopped before check_batch took it
            _close_opened(opening_src)
        if early is not None:
            early.close()
        if tgt is None:
            try:
                tgt = opening.result()
            except PgidgenError:
                tgt = None
        if tgt is not None:
            tgt.close()
        release(admin, shards[0])


def _check_batch_apart(ctxs: list[ShardContext], src: Background[psycopg.Connection[Any]], tgt: Background[psycopg.Connection[Any]]) -> None:
    """check_batch (it reads only the catalogs) on a source connection of its own and the target connection the
    move keeps (opened at the batch's start, both): the caller does not touch the target connection until this
    has returned. The source connection is closed here."""
    conn = src.result()
    try:
        check_batch(ctxs, conn, tgt.result())
    finally:
        conn.close()


def _close_opened(*opening: Background[psycopg.Connection[Any]]) -> None:
    """Close connections being opened on threads (a move that stopped before it used them)."""
    for o in opening:
        try:
            o.result().close()
        except PgidgenError:
            pass


class Probe:
    """check.probe_subscription on a target connection of its own, on a thread: result() is its answer (None: the
    login works); stop() cancels it if it still runs (a move that stopped at an earlier check does not wait for
    the target to give up connecting: its walreceiver login heeds no connect_timeout, only the statement's own
    bound, check.login_wait) and ends the thread. A probe stopped before its connection is up never starts; one
    whose statement was not yet sent when the cancel came is cancelled again until it ends."""

    def __init__(self, name: str, dsn: str, conninfo: str) -> None:
        self.conn: psycopg.Connection[Any] | None = None
        self._done = False
        self._stopped = False
        self._lock = threading.Lock()

        def run() -> Refusal | None:
            conn = connect(name, dsn, autocommit=True)
            try:
                with self._lock:
                    if self._stopped:
                        return None
                    self.conn = conn
                return probe_subscription(conn, conninfo)
            finally:
                conn.close()

        self._thread: Background[Refusal | None] = Background(run)

    def result(self, should_stop: Callable[[], bool] | None = None) -> Refusal | None:
        """The answer; NotStarted (the probe stopped) if should_stop() says so first: a login that hangs must not
        keep a Ctrl-C waiting for its bound (check.login_wait) before a move that has written nothing."""
        while should_stop is not None and not self._thread.join(0.05):
            if should_stop():
                self.stop()
                raise NotStarted
        value = self._thread.result()
        self._done = True
        return value

    def stop(self) -> None:
        if self._done:
            return
        with self._lock:
            self._stopped = True
        while not self._thread.join(timeout=0.05):
            conn = self.conn
            if conn is not None and not conn.closed:
                try:
                    conn.cancel_safe()
                except (psycopg.Error, OSError):
                    pass


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


def _reopen(config: Config, shard: int, *, target_needed: bool = True) -> tuple[list[ShardContext], psycopg.Connection[Any], Journal]:
    """The interrupted move shard belongs to (a batch: all of its shards), locked for this process.
    target_needed=False (a rollback): the target may be down; the source's catalog says all that is needed."""
    source, rec = find_open_move(config, shard)
    config.dsn(rec.target)
    admin = connect(source, config.dsn(source), autocommit=True)
    try:
        busy = try_lock_all(admin, rec.shards)
        if busy is not None:
            pid = lock_holder(admin, busy)
            raise MoveError(
                f"shard {busy} is being moved right now by another pgidgen (move {rec.move_id}, step {rec.step})",
                where=f"{source}, backend pid {pid}", hint="wait for it to finish, or stop that process first",
            )
        rec = open_move(admin, shard) or rec
        states, _ = read_states(config, need=(source, rec.target) if target_needed else (source,), shard=shard if len(rec.shards) == 1 else None)
        layout = states[source].layout or (states[rec.target].layout if rec.target in states else None)
        assert layout is not None
        retired = retired_names(rec)
        live = {int(r[0]): (r[1], r[2]) for r in admin.execute(
            "SELECT shard, schema_name, state FROM pgidgen.shards WHERE shard = ANY(%s)", (rec.shards,))}
        ctxs = []
        for s in rec.shards:
            ctx = ShardContext(shard=s, source=source, target=rec.target, layout=layout, shard_count=states[source].shard_count or 0, states=states)
            row = live.get(s)
            ctx.source_schema = row[0] if row and row[1] == "retired" and row[0] == retired.get(s) else ctx.schema
            ctxs.append(ctx)
        read = read_tables_of(admin, [c.source_schema for c in ctxs])
        for ctx in ctxs:
            ctx.tables, ctx.sequences = read[ctx.source_schema]
        return ctxs, admin, Journal(admin, rec)
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
    journaled_pause: bool = False,
    expect_target: str | None = None,
    expect_offline: bool = False,
) -> MoveReport:
    """Finish an interrupted move (of shard's batch) from the step its journal last started. journaled_pause: the
    write pause bounded by the --max-pause the move started with (its journal's), not options' (a --resume that
    names none must not loosen the bound its writers were promised). The journal says where to and how: a target
    or offline mode asked for that differs from it is refused (before anything is written), not ignored."""
    ctxs, admin, journal = _reopen(config, shard)
    try:
        rec = journal.record
        if expect_target is not None and expect_target != rec.target:
            raise ConfigError(f"shard {shard}'s interrupted move goes to {rec.target}, not {expect_target}",
                              hint=f"'pgidgen move-shard {shard} --resume' finishes it to {rec.target}; to move elsewhere, --rollback it first")
        if expect_offline and rec.mode != "offline":
            raise ConfigError(f"shard {shard}'s interrupted move is an online one", hint="resume it without --offline, or --rollback it first")
        opts = options or MoveOptions()
        opts.offline = journal.record.mode == "offline"
        if journaled_pause and journal.record.detail.get("max_pause_ms"):
            opts.max_pause = int(journal.record.detail["max_pause_ms"]) / 1000
        journal.log(journal.record.step, "resume", {})
        return Mover(config, ctxs, journal, opts, progress, hook).run(resumed=True)
    finally:
        if journal.conn is not admin:  # a ride connected again: the locks are that session's
            release(journal.conn, shard)
        release(admin, shard)


def rollback_move(config: Config, shard: int) -> MoveReport:
    """Undo an interrupted move (of shard's batch): the source serves its shards as before, nothing is left on the target."""
    ctxs, admin, journal = _reopen(config, shard, target_needed=False)
    try:
        return Mover(config, ctxs, journal, MoveOptions(), None, None).rollback()
    finally:
        release(admin, shard)


class Mover(PrepareSteps, CopySteps, ReplicationSteps, CutoverSteps, ActivateStep, VerifyStep, IdentitySteps, RollbackStep, RideThrough, FailoverSteps):
    """Walks the journal's steps from the one last started; each step_<name> lives in its phase's module."""

    def run(self, *, resumed: bool = False) -> MoveReport:
        steps = self.rec.steps
        first = steps.index(self.rec.step) if self.rec.step in steps else 0
        self.resumed_step = self.rec.step if resumed else None
        step = self.rec.step
        try:
            i = first
            while i < len(steps):
                step = steps[i]
                try:
                    if step == self.resumed_step and self._slot_lost(step):  # the source failed over: steps/failover.py
                        i = steps.index("copy")
                        self.resumed_step = "copy"
                        continue
                    self.journal.start(step)
                    self._point(step)
                    getattr(self, "step_" + step)()
                except (psycopg.Error, PgidgenError) as e:
                    if not self._ride(step, e):  # a lost connection: back, and the journal read again (steps/ride.py)
                        raise
                    i = steps.index(self.rec.step) if self.rec.step in steps else i
                    self.resumed_step = self.rec.step
                    continue
                self.rides.pop(step, None)
                i += 1
            self.finishing = True
            while self.rec.status != "done":
                try:
                    self.journal.finish("done")
                except (psycopg.Error, PgidgenError) as e:
                    if not self._ride(step, e):
                        raise
        except CutoverAborted as e:
            self.journal.start("cutover" if self.opts.offline else "catchup")
            self.journal.fail("cutover", str(e))
            raise PauseExceeded(
                f"{self.what} did not move: {e}", where=self.ctx.source,
                hint=f"the source keeps serving {'it' if len(self.ctxs) == 1 else 'them'}; retry with 'pgidgen move-shard --resume {self.ctx.shard}' "
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
        if len(self.ctxs) > 1:
            self.report.retired_schemas = retired_names(self.rec)
        self.report.last_id = d.get("last_id")
        self.report.skew_ms = d.get("skew_ms")
        if resumed:
            self.report.notes.append(f"resumed move {self.rec.move_id}")
        if self.opts.drop_source and self.verification is not None and not self.verification.ok:
            # a resumed verification that differs does not stop the move: the copy it compared against stays
            self.report.notes.append(f"kept the source {'copy' if len(self.ctxs) == 1 else 'copies'} on {self.ctx.source}: the verification found differences")
        elif self.opts.drop_source:
            self._drop_sources()
        return self.report


    def _drop_sources(self) -> None:
        """--drop-source: each shard's retired copy this move made (older copies, perhaps kept for repair, stay)."""
        from .cleanup import cleanup

        kept: dict[int, str] = {}
        for shard, retired in sorted(retired_names(self.rec).items()):
            try:
                cleanup(self.config, shard, only=(self.ctx.source, retired))
            except PgidgenError as e:  # the move itself is done; the copy stays, as without --drop-source
                self.report.notes.append(f"kept the source copy {self.ctx.source}.{retired}: {e.render()}")
                kept[shard] = retired
            else:
                self.report.notes.append(f"dropped the source copy {self.ctx.source}.{retired}")
        if self.report.retired_schema and self.ctx.shard not in kept:
            self.report.retired_schema = None
        self.report.retired_schemas = kept if len(self.ctxs) > 1 else {}


__all__ = [
    "Background", "CopyProgress", "CutoverAborted", "Hook", "MoveOptions", "MoveReport", "Mover", "drop_slots", "ensure_catalog",
    "find_open_move", "measure_skew", "move_shard", "move_shards", "move_shards_interruptible", "MovesInterrupted", "plan_shards",
    "resume_move", "rollback_move", "stop_hook_from_env", "teardown",
]
