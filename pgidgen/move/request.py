"""What `pgidgen move-shard` is asked to do, decided before anything connects (MoveRequest.make), and each of
its modes run from there: a dry run (dry_run), --verify or --cleanup (inspect), a new move, --resume or
--rollback (carry_out). The command parses options and prints; a test or an application calls these."""
from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import Any

from ..config import Config
from ..errors import ConfigError, InputError
from ..ranges import collapse, expand
from .cleanup import CleanupReport, cleanup, verify_move
from .engine import CopyProgress, MoveOptions, MoveReport, move_shards_interruptible, plan_shards, resume_move, rollback_move
from .plan import plan_move
from .steps.base import run_stoppable
from .verify import Verification

#: the modes that act on a move already made or begun, as the command line names them
MODES = ("--resume", "--rollback", "--verify", "--cleanup")
#: the options of a new move, which the modes that move nothing refuse (as their flags)
MOVE_ONLY = ("--max-pause", "--offline", "--drop-source", "--verify-in-pause", "--subscription-dsn", "--fault-wait")


@dataclass
class MoveRequest:
    """shards: sorted, at least one; target: None only for a mode; mode: one of MODES or None (a new move);
    given: the options typed on the command line (a resumed move keeps its journal's pause unless given)."""

    shards: list[int]
    target: str | None
    mode: str | None
    options: MoveOptions
    given: frozenset[str] = field(default_factory=frozenset)

    @classmethod
    def make(cls, config: Config, shards: str, target: str | None, *, modes: Collection[str] = (), options: MoveOptions | None = None,
             given: Collection[str] = (), dry_run: bool = False) -> MoveRequest:
        """Checks the combination: one mode at most, a target for a new move, one shard for a mode, no move option
        given to a mode that moves nothing, a dry run only of a new move."""
        numbers = sorted(set(expand(shards)))
        if not numbers:
            raise InputError(f"{shards!r} names no shard", hint="write shards like 7 or 10-19,42")
        chosen = [m for m in MODES if m in modes]
        if len(chosen) > 1:
            raise ConfigError(f"{' and '.join(chosen)} cannot be combined", hint="give one of them")
        mode = chosen[0] if chosen else None
        if mode is None and target is None:
            raise ConfigError("TARGET_DB is missing", hint=f"pgidgen move-shard {shards} DB (databases: {', '.join(config.databases)})")
        if mode is not None and len(numbers) > 1:
            raise InputError(f"{mode} takes one shard, not {collapse(numbers)}",
                             hint="name any one shard of the move (a batch's other shards follow it)" if mode in ("--resume", "--rollback")
                             else "give them one at a time")
        if mode in ("--rollback", "--verify", "--cleanup"):  # they move nothing: a move's option given to them would be ignored
            unused = [o for o in MOVE_ONLY if o in given]
            if unused:
                raise ConfigError(f"{mode} moves nothing: {' and '.join(unused)} would have no effect with it", hint=f"drop {' '.join(unused)}")
        if dry_run and mode is not None:
            raise ConfigError("--dry-run plans a new move", hint=f"drop {mode}")
        return cls(numbers, target, mode, options or MoveOptions(), frozenset(given))


@dataclass
class DryRun:
    """A new move's plan: its batches (a set of shards) or its steps with their SQL and locks (one shard)."""

    request: MoveRequest
    batches: list[Any] = field(default_factory=list)
    steps: list[Any] = field(default_factory=list)

    @property
    def mode(self) -> str:
        return "offline" if self.request.options.offline else "online"

    def as_dict(self) -> dict[str, Any]:
        r = self.request
        if len(r.shards) > 1:
            return {"dry_run": True, "shards": collapse(r.shards), "target": r.target, "mode": self.mode,
                    "batches": [b.as_dict(r.options.offline) for b in self.batches]}
        return {"dry_run": True, "shard": r.shards[0], "target": r.target, "mode": self.mode,
                "steps": [{"step": st.name, "database": st.database, "what": st.what, "locks": st.locks, "sql": st.sql} for st in self.steps]}

    def lines(self) -> list[str]:
        offline = self.request.options.offline
        if len(self.request.shards) > 1:
            n = len(self.batches)
            each = "one copy, its shards' writes paused throughout" if offline else "one slot, publication, subscription, copy and cutover"
            return [f"-- {len(self.request.shards)} shards in {n} batch{'es' if n > 1 else ''}, each with {each}"
                    f" (the steps 'pgidgen move-shard N{' --offline' if offline else ''} --dry-run' prints, for all its shards at once):",
                    *(f"-- {b.line(offline)}" for b in self.batches)]
        out: list[str] = []
        for step in self.steps:
            out.append(f"-- [{step.name}] on {step.database}: {step.what}")
            out += [f"--   lock: {lock}" for lock in step.locks]
            if step.sql:
                out.append(step.sql.rstrip("\n"))
        return out


def dry_run(config: Config, request: MoveRequest) -> DryRun:
    """The plan of a new move, after the checks that need only the catalogs. Nothing is written."""
    target = request.target or ""
    if len(request.shards) > 1:
        return DryRun(request, batches=plan_shards(config, request.shards, target, options=request.options))
    return DryRun(request, steps=plan_move(config, request.shards[0], target, options=request.options))


def inspect(config: Config, request: MoveRequest) -> Verification | CleanupReport:
    """--verify (the shard against the copy its last move kept) or --cleanup (that copy dropped)."""
    shard = request.shards[0]
    return verify_move(config, shard) if request.mode == "--verify" else cleanup(config, shard)


def carry_out(config: Config, request: MoveRequest, *, progress: Callable[[CopyProgress], None] | None = None,
              on_interrupt: Callable[[], None] | None = None) -> list[MoveReport]:
    """A new move of the request's shards (in batches; a Ctrl-C lets the batch in flight finish: MovesInterrupted),
    or --resume or --rollback of one move, which a Ctrl-C lets finish."""
    shard = request.shards[0]
    if request.mode == "--rollback":  # undone whole or not at all by a Ctrl-C (a kill leaves it to run again)
        return [run_stoppable(lambda _: rollback_move(config, shard), on_interrupt=on_interrupt)[0]]
    if request.mode == "--resume":
        return [run_stoppable(lambda _: resume_move(config, shard, options=request.options, progress=progress,
                                                    journaled_pause="--max-pause" not in request.given,
                                                    expect_target=request.target, expect_offline=request.options.offline),
                              on_interrupt=on_interrupt)[0]]
    return move_shards_interruptible(config, request.shards, request.target or "", options=request.options, progress=progress,
                                     on_interrupt=on_interrupt)
