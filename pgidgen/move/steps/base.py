"""What every phase of a move shares: its options and report, the connections it keeps, the crash-test points."""
from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generic, TypeVar

import psycopg

from ... import redact
from ...config import Config
from ...db import connect, execute_script, own_session
from ...errors import PgidgenError
from ...ranges import collapse
from ...redact import scrub
from .. import sqltext as q
from ..context import MoveError, ShardContext
from ..journal import POINT_OF_NO_RETURN, Journal
from ..transfer import SchemaDump
from ..verify import Verification

if TYPE_CHECKING:
    from .applywatch import ApplyWatch

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
    #: how long a lost connection (pgidgen's own, or the subscription's) is waited for before the move gives up
    #: (resumable); 0: at once
    fault_wait: float = 60.0
    origin: str = "move-shard"  # or "rebalance": a rebalance run again finishes the moves it left unfinished

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
    #: set while the move waits for a lost connection to come back: what it waits for
    waiting: str | None = None


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
    shards: list[int] = field(default_factory=list)  # the batch (shard is its lowest)
    retired_schemas: dict[int, str] = field(default_factory=dict)  # per shard of the batch
    bytes_copied: int = 0
    pause_parts: dict[str, float] = field(default_factory=dict)  # ms: where the pause went
    #: a rollback whose target did not answer: what it left there (named in the report)
    left_on_target: str | None = None
    #: tables whose replica identity the move set while it published them, put back after: table, was, during
    identities: list[dict[str, str]] = field(default_factory=list)
    #: the lost connections the move rode through: step, what was lost, seconds until it went on
    faults: list[dict[str, Any]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.shards = self.shards or [self.shard]

    @property
    def what(self) -> str:
        return f"shard {self.shard}" if len(self.shards) == 1 else f"shards {collapse(self.shards)}"

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "shard": self.shard, "shards": self.shards, "source": self.source, "target": self.target, "mode": self.mode, "move_id": self.move_id,
            "status": self.status, "pause_ms": self.pause_ms, "seconds": round(self.seconds, 3), "last_id": self.last_id,
            "clock_skew_ms": self.skew_ms, "retired_schema": self.retired_schema, "cutover_attempts": self.attempts,
            "retired_schemas": {str(k): v for k, v in sorted(self.retired_schemas.items())}, "bytes_copied": self.bytes_copied,
            "pause_parts_ms": self.pause_parts, "notes": self.notes, "faults": self.faults,
        }
        if self.identities:
            out["replica_identities"] = self.identities
        if self.verification is not None:
            out["verification"] = self.verification.as_dict()
        return out

    def lines(self) -> list[str]:
        out = []
        if self.status == "done":
            out.append(f"moved {self.what} from {self.source} to {self.target} ({self.mode}) in {self.seconds:.1f}s")
            if self.pause_ms is not None:
                out.append(f"write pause: {self.pause_ms:.0f} ms (cutover attempts: {self.attempts})")
            if self.skew_ms is not None:
                out.append(f"clock skew {self.target} - {self.source}: {round(self.skew_ms):+d} ms (accounted for in the ID generator)")
            if self.retired_schema:
                out.append(f"the source copy is kept read-only as {self.source}.{self.retired_schema}; drop it with 'pgidgen move-shard --cleanup {self.shard}'")
            elif self.retired_schemas:
                out.append(f"the source copies are kept read-only on {self.source} as shard_N_moved_...; drop them with"
                           f" 'pgidgen move-shard --cleanup N' for each of {collapse(self.retired_schemas)}")
        elif self.status == "rolled_back" and self.left_on_target:
            out.append(f"rolled back the move of {self.what} to {self.target}: {self.source} serves it as before, its slot and publication"
                       f" are dropped; {self.target} did not answer: {self.left_on_target} are left there")
        elif self.status == "rolled_back":
            out.append(f"rolled back the move of {self.what} to {self.target}: {self.source} serves it as before; nothing is left on {self.target}")
        if self.faults:
            out.append(f"rode through {len(self.faults)} lost connection{'s' if len(self.faults) > 1 else ''}: "
                       + "; ".join(f"{f['lost']} in step {f['step']} ({f['seconds']:.1f}s)" for f in self.faults))
        if self.verification is not None:
            v = self.verification
            out.append(f"verified {v.when}: {len(v.tables)} tables, {v.rows} rows: " + ("all match" if v.ok else "MISMATCH"))
            out.extend("  " + t.describe() for t in v.tables if not t.ok)
        out.extend(self.notes)
        return out



def stop_hook_from_env() -> Hook | None:
    """Crash tests: PGIDGEN_MOVE_STOP_AT=step makes the CLI announce the step on stderr and hang there until killed
    (or, with PGIDGEN_MOVE_STOP_FOR=seconds, that long, then go on: a Ctrl-C test's window)."""
    where = os.environ.get("PGIDGEN_MOVE_STOP_AT")
    if not where:
        return None
    seconds = float(os.environ.get("PGIDGEN_MOVE_STOP_FOR") or 3600)

    def hook(point: str) -> None:
        if point == where:
            sys.stderr.write(f"pgidgen: stopped at {point}\n")
            sys.stderr.flush()
            time.sleep(seconds)

    return hook



class Background(Generic[T]):
    """One function on a thread of its own; result() re-raises what it raised."""

    def __init__(self, fn: Callable[[], T]) -> None:
        self._value: T | None = None
        self._error: BaseException | None = None
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(fn,), daemon=True)
        self._thread.start()

    def _run(self, fn: Callable[[], T]) -> None:
        try:
            self._value = fn()
        except BaseException as e:  # noqa: BLE001 - handed to result()
            self._error = e
        finally:
            self._done.set()

    def join(self, timeout: float | None = None) -> bool:
        """Waits for fn (at most timeout seconds: whether it ended). A Ctrl-C may interrupt it and it may be called
        again (a Thread.join() interrupted so can return early the next time, before Python 3.13)."""
        return self._done.wait(timeout)

    def done(self) -> bool:
        """Whether fn has ended (read without taking a lock)."""
        return self._done.is_set()

    def result(self) -> T:
        if not self._done.is_set():
            self._done.wait()
        if self._error is not None:
            raise self._error
        return self._value  # type: ignore[return-value]


class StopFlag:
    """run_stoppable's stop: is_set() as threading.Event's, set by a plain attribute store, so that a second Ctrl-C
    cannot land inside it (an Event takes a lock to set; an interrupt between its acquire and release, or inside
    an Event.wait, leaves a Condition's lock half-released: "release unlocked lock", seen in CI)."""

    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = False

    def is_set(self) -> bool:
        return self.value


def run_stoppable(fn: Callable[[StopFlag], T], *, on_interrupt: Callable[[], None] | None = None) -> tuple[T, bool]:
    """fn(stop) on a thread of its own while this thread (the main one) only waits: a Ctrl-C sets stop, which fn
    heeds between batches (the ones in flight finish, or roll back), and the wait goes on, so it never lands inside
    one of fn's steps. A second Ctrl-C does not cut fn short either (kill does; the journal then says where it
    stood). fn's result (or what it raised), and whether a Ctrl-C came; on_interrupt() runs once, after the first.

    A Ctrl-C may come at any instant of the wait, as often as the key is pressed. On the main thread, while
    SIGINT has Python's default handler, the wait puts in its own, which only sets stop: no KeyboardInterrupt is
    raised at all (one raised inside threading's waits can leave a Condition's lock half-released, "release
    unlocked lock", seen in CI on a second Ctrl-C; one raised in this loop's own bookkeeping would end it). The
    wait is time.sleep in short turns reading fn's end without a lock; a signal the kernel hands to another thread
    is seen at the next turn (Python runs handlers on the main thread). Elsewhere a KeyboardInterrupt sets stop."""
    stop = StopFlag()
    work = Background(lambda: fn(stop))

    def interrupted(signum: int, frame: Any) -> None:
        stop.value = True

    mine = threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGINT) is signal.default_int_handler
    if mine:
        signal.signal(signal.SIGINT, interrupted)
    try:
        told = False
        while True:
            try:
                if work.done():
                    break
                if stop.value and not told:
                    told = True
                    if on_interrupt is not None:
                        try:
                            on_interrupt()
                        except Exception:  # noqa: BLE001 - the notice is best effort
                            pass  # one that cannot be written (2>&1 | tee: the Ctrl-C ended tee) must not end the
                            # wait: fn's thread is a daemon, and the process's end would cut the batch in flight short
                time.sleep(0.05)
            except KeyboardInterrupt:
                stop.value = True
    finally:
        if mine and signal.getsignal(signal.SIGINT) is interrupted:  # on_interrupt may have put in its own
            signal.signal(signal.SIGINT, signal.default_int_handler)
    return work.result(), stop.value


class CutoverAborted(Exception):
    """Catch-up or the lock did not fit in --max-pause: the source was left serving."""


class PauseExceeded(MoveError):
    """A move's cutover did not fit --max-pause (CutoverAborted, after its attempts): nothing flipped."""


class MoverBase:
    """The state one move carries from phase to phase (connections, journal, report)."""

    def __init__(
        self,
        config: Config,
        ctxs: list[ShardContext],
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
        self.ctxs = ctxs  # the batch, by shard
        self.ctx = ctxs[0]  # its lowest shard: the journal's row, the source and target of all
        self.journal = journal
        self.rec = journal.record
        self.opts = options
        self.progress = progress
        self.hook = hook or stop_hook_from_env()
        self.names = q.Names(self.rec.token)
        self.admin = journal.conn  # source, autocommit, holds the move lock
        self._tgt: psycopg.Connection[Any] | None = tgt  # target, autocommit
        #: per database, the server pids of this move's writing sessions (admin, target, the pause's) whose
        #: connection was lost or replaced: a ride waits for them to end before it looks at what they committed
        self.stale: dict[str, set[int]] = {}
        self.pids: dict[str, int] = {"admin": self.admin.info.backend_pid}
        if tgt is not None:
            self.pids["tgt"] = tgt.info.backend_pid
        self.rides: dict[str, tuple[float, int]] = {}  # per step not yet through: its first lost connection, and how many
        self.apply_watch: ApplyWatch | None = None  # the subscription's apply worker, from the first catch-up on
        self.finishing = False  # the journal's last write (done) sent: a ride may find it went through
        self.snapshot: psycopg.Connection[Any] | None = None
        self.verification: Verification | None = None
        self.checking: Background[Verification] | None = None
        self.catalog_ahead: Background[None] | None = None  # the target's catalog, started by step_prepare
        self.ahead: Background[list[psycopg.Connection[Any]]] | None = None
        self.check_src: psycopg.Connection[Any] | None = None
        self.guarding: Background[None] | None = None  # the retired copies' write guards, made after the flip (activate.py)
        self.report = MoveReport(self.ctx.shard, self.ctx.source, self.ctx.target, self.rec.mode, self.rec.move_id, "running",
                                 shards=[c.shard for c in ctxs])
        self.t0 = time.perf_counter()
        self.resumed_step: str | None = None  # the step a resumed run starts from
        self.ledger_sql: str | None = None  # activate's DDL-ledger rows, rendered before the pause
        self.pause_parts: dict[str, float] = {}  # seconds: lock, compare, catchup, retire (cutover), then activate's

    # connections ----------------------------------------------------------------------------------
    @property
    def tgt(self) -> psycopg.Connection[Any]:
        if self._tgt is None or self._tgt.closed:
            if self._tgt is not None:  # lost (closed by pgidgen only at the end): its session may linger
                self.lost_session(self.ctx.target, self.pids.pop("tgt", 0))
            self._tgt = connect(self.ctx.target, self.config.dsn(self.ctx.target), autocommit=True)
            self.pids["tgt"] = self._tgt.info.backend_pid
        return self._tgt

    def _guard_apart(self, retiring: list[q.Retiring]) -> Background[None]:
        """guard_sql on a source connection of its own, on a thread (made again by a resumed run: CREATE OR REPLACE)."""
        def run() -> None:
            if not retiring:
                return
            with connect(self.ctx.source, self.config.dsn(self.ctx.source), autocommit=True) as conn, conn.transaction():
                execute_script(conn, q.guard_sql(retiring, self.ctx.target))

        return Background(run)

    def lost_session(self, database: str, pid: int) -> None:
        """A session of this move whose connection was lost: a ride waits for its end (steps/ride.py)."""
        if pid:
            self.stale.setdefault(database, set()).add(pid)

    def _close(self) -> None:
        if self.schema_dump is not None:
            self.schema_dump.close()
            self.schema_dump = None
        if self.checking is not None:
            self.checking.join()
        if self.catalog_ahead is not None:
            self.catalog_ahead.join()
        if self.guarding is not None:
            self.guarding.join()
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

    def _waiting(self, what: str | None) -> None:
        """Progress: what the move waits for (a lost connection to come back), or None once it goes on."""
        if self.progress is not None:
            n = sum(len(c.tables) for c in self.ctxs)
            self.progress(CopyProgress(n, n, 0, 0, 0, None, waiting=what))

    def _point(self, name: str) -> None:
        if self.hook is not None:
            self.hook(name)

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

    @property
    def shards(self) -> list[int]:
        return [c.shard for c in self.ctxs]

    @property
    def what(self) -> str:
        return self.report.what

    def _target_rows(self) -> dict[int, tuple[str, str]]:
        """The batch's rows in the target's catalog: shard -> (state, schema)."""
        if not self.tgt.execute("SELECT to_regclass('pgidgen.shards') IS NOT NULL").fetchone()[0]:  # type: ignore[index]
            return {}
        return {int(r[0]): (r[1], r[2]) for r in self.tgt.execute(
            "SELECT shard, state, schema_name FROM pgidgen.shards WHERE shard = ANY(%s)", (self.shards,))}

    def _target_state(self) -> str | None:
        """The batch's one state on the target (its rows change together), or None when it has none of them."""
        rows = self._target_rows()
        states = {st for st, _ in rows.values()}
        if not rows:
            return None
        if len(states) > 1 or len(rows) != len(self.ctxs):
            raise MoveError(f"database {self.ctx.target} holds the shards of this move in different states"
                            f" ({', '.join(f'{s} {st}' for s, (st, _) in sorted(rows.items()))})", hint="see 'pgidgen map' and the journal (pgidgen.move_log)")
        return states.pop()

    def _reset_target(self) -> None:
        """The target connection's settings back to pgidgen's session after a restore script changed them."""
        self.tgt.execute("RESET ALL")
        self.tgt.execute("SET search_path TO DEFAULT")
        own_session(self.tgt)

    # one phase calls another: implemented in their modules, mixed into engine.Mover
    def step_schema(self) -> None:
        raise NotImplementedError

    def step_catchup(self) -> None:
        raise NotImplementedError

    def _ensure_target_catalog(self, conn: psycopg.Connection[Any] | None = None) -> None:
        raise NotImplementedError

    def _set_identities(self) -> None:
        raise NotImplementedError

    def _identities_on_target_sql(self) -> str:
        raise NotImplementedError

    def _put_back_on_source(self) -> None:
        raise NotImplementedError

    def _reset_copy(self) -> None:
        raise NotImplementedError

    def _drop_target_copy(self) -> None:
        raise NotImplementedError

    def _ledger(self) -> str:
        raise NotImplementedError

    def _shard_depends_on_catalog(self) -> bool:
        raise NotImplementedError

    def _install_target_catalog_apart(self) -> None:
        raise NotImplementedError

    def _offline_copy(self) -> None:
        raise NotImplementedError

    def _lag(self) -> int | None:
        raise NotImplementedError

    def _beat(self, deadline: float) -> bool:
        raise NotImplementedError

    def _sub_oid(self) -> int | None:
        raise NotImplementedError

    def _measure_skew(self) -> None:
        raise NotImplementedError

    def _tables_as_they_stand(self, conn: psycopg.Connection[Any], schemas: list[str], *, prepare: bool | None = None) -> dict[str, dict[str, tuple[str, bool]]]:
        raise NotImplementedError

    def _changed_tables(self, mine: dict[str, tuple[str, bool]], theirs: dict[str, tuple[str, bool]]) -> list[str]:
        raise NotImplementedError

    def _start_checking(self, snap: psycopg.Connection[Any]) -> None:
        raise NotImplementedError

    def _compare_all(self, src: psycopg.Connection[Any], source_schemas: dict[int, str], tgt: psycopg.Connection[Any], *, when: str | None = None) -> Verification:
        raise NotImplementedError
