"""`pgidgen rebalance`: spread the shards evenly over the databases by moving whole shards, several at once.

Every move is an ordinary move-shard (same checks, journal, cutover, verification), in batches per source and
target (one replication stream and one write pause per batch, see batches.py); rebalance only chooses them.
By size (the default) it evens out the bytes on disk (balance.py); by count, the fewest moves that leave every
database within one shard of the others, taking from each crowded database its highest-numbered shards (so what
stays keeps its contiguous ranges). Shards in the middle of a move stay where
they are, and a shard never goes back to a database that still holds its retired copy: another one goes instead.
A failed batch does not stop the other pairs; it stays resumable (`pgidgen rebalance` again finishes it, as
does `pgidgen move-shard N --resume`; `--rollback` undoes it when it failed before activating the target).
"""
from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import psycopg

from ..config import Config
from ..db import connect, pg_message, read_each
from ..errors import ConfigError, PgidgenError
from ..ranges import collapse
from ..redact import scrub
from ..sizes import human, read_sizes
from .balance import spread_bytes
from .batches import estimate_seconds, plan_batches
from .context import MoveError, locate_batch, preflight, read_states
from .engine import Hook, MoveOptions, MoveReport, ensure_catalog, move_shards, resume_move
from .journal import has_journal
from .steps.base import StopFlag, run_stoppable


@dataclass
class PlannedMove:
    shard: int
    source: str
    target: str

    def as_dict(self) -> dict[str, Any]:
        return {"shard": self.shard, "source": self.source, "target": self.target}


@dataclass
class PlannedBatch:
    """A batch the dry run expects: one replication stream and one write pause for its shards."""

    source: str
    target: str
    shards: list[int]
    bytes: int
    pause_s: float  # estimated (batches.py)
    seconds: float = 0.0  # estimated, the whole move of the batch (batches.estimate_seconds)

    def as_dict(self) -> dict[str, Any]:
        return {"source": self.source, "target": self.target, "shards": collapse(self.shards), "count": len(self.shards), "bytes": self.bytes,
                "estimated_pause_ms": round(self.pause_s * 1000), "estimated_seconds": round(self.seconds, 1)}

    def line(self) -> str:
        n = len(self.shards)
        return (f"  {self.source} -> {self.target}: {n} shard{'s' if n != 1 else ''}, {human(self.bytes)} ({collapse(self.shards)}),"
                f" estimated write pause {self.pause_s * 1000:.0f} ms")


#: a dry run names a target's launcher when its batches may wait this long for it in all (measured on 15: 8192
#: small shards from one database to two, 62 batches, took 299 s at the default 5 s and 155 s at 1 s)
LAUNCHER_WAIT_TOLD_S = 30.0


@dataclass
class RebalancePlan:
    before: dict[str, list[int]]
    after: dict[str, list[int]]
    moves: list[PlannedMove] = field(default_factory=list)
    #: shards in the middle of a move, where they serve from: left where they are
    midmove: dict[int, str] = field(default_factory=dict)
    #: the moves an earlier rebalance left unfinished, which a run finishes first (from their journals): the plan
    #: counts their shards on their targets, and moves them no further
    finishing: list[PlannedMove] = field(default_factory=list)
    #: shards that would have evened the spread but whose retired copy is still on the database short of shards
    blocked: dict[int, str] = field(default_factory=dict)
    by: str = "count"
    #: bytes on disk of every shard held (empty: not read)
    sizes: dict[int, int] = field(default_factory=dict)
    #: the batches the moves run in, `parallel` at a time (None: not planned; see plan_batches_of)
    batches: list[PlannedBatch] | None = None
    parallel: int = 1
    #: per source -> target pair, the batches a run cuts when every pause comes in at half its estimate or less
    #: (each batch up to twice the last: batches.Pacer), against the estimate's batches
    fewest: dict[tuple[str, str], int] = field(default_factory=dict)
    #: targets whose launcher starts a new subscription's worker up to this late (before 18: batches.launcher_interval_s)
    launcher_s: dict[str, float] = field(default_factory=dict)

    @property
    def even(self) -> bool:
        if self.by == "size":
            return not self.blocked
        counts = [len(v) for v in self.after.values()]
        return max(counts) - min(counts) <= 1

    def bytes_of(self, shards: Sequence[int]) -> int:
        return sum(self.sizes.get(s, 0) for s in shards)

    def _held(self, shards: Sequence[int]) -> str:
        return f"{len(shards)} shards" + (f", {human(self.bytes_of(shards))}" if self.sizes else "")

    def as_dict(self) -> dict[str, Any]:
        return {
            "by": self.by,
            "before": {n: len(s) for n, s in self.before.items()},
            "after": {n: len(s) for n, s in self.after.items()},
            "bytes_before": {n: self.bytes_of(s) for n, s in self.before.items()},
            "bytes_after": {n: self.bytes_of(s) for n, s in self.after.items()},
            "finishing": [m.as_dict() for m in self.finishing],
            "moves": [m.as_dict() for m in self.moves],
            "left_mid_move": [{"shard": s, "database": n} for s, n in sorted(self.midmove.items())],
            "blocked_by_retired_copy": [{"shard": s, "database": n} for s, n in sorted(self.blocked.items())],
            "even": self.even,
            **({"batches": [b.as_dict() for b in self.batches], "parallel": self.parallel, "summary": self.summary(),
                "estimated_seconds": round(self.seconds(), 1), "launcher_waits": self.launcher_waits()} if self.batches is not None else {}),
        }

    def summary(self) -> list[dict[str, Any]]:
        """Per source -> target pair (a dry run's): shards, bytes, batches, the longest estimated pause, time."""
        pairs: dict[tuple[str, str], list[PlannedBatch]] = {}
        for b in self.batches or []:
            pairs.setdefault((b.source, b.target), []).append(b)
        return [{"source": s, "target": t, "shards": sum(len(b.shards) for b in bs), "bytes": sum(b.bytes for b in bs), "batches": len(bs),
                 "fewest_batches": self.fewest.get((s, t), len(bs)), "estimated_pause_ms": round(max(b.pause_s for b in bs) * 1000),
                 "estimated_seconds": round(sum(b.seconds for b in bs), 1)} for (s, t), bs in pairs.items()]

    def launcher_waits(self) -> dict[str, dict[str, float]]:
        """Per target whose launcher is slow to start a new subscription's worker (before 18): its interval, its
        batches, and what they may wait for it in all (each batch is a new subscription)."""
        out = {}
        for target, interval in sorted(self.launcher_s.items()):
            n = sum(1 for b in self.batches or [] if b.target == target)
            out[target] = {"interval_s": interval, "batches": n, "wait_s": round(n * interval, 1)}
        return out

    def seconds(self) -> float:
        """The dry run's estimate of the whole run: its batches' time, `parallel` at a time."""
        lanes = [0.0] * max(1, self.parallel)
        for b in sorted(self.batches or [], key=lambda b: -b.seconds):
            lanes[lanes.index(min(lanes))] += b.seconds
        return max(lanes)

    def lines(self, *, verbose: bool = False) -> list[str]:
        """Shards per database before and after, the moves an earlier run left (finished first), then a dry run's
        summary per source -> target pair; with verbose, every move and every batch."""
        out = [f"{n}: {self._held(self.before[n])} -> {self._held(self.after[n])} ({collapse(self.after[n]) or '-'})" for n in self.before]
        pairs: dict[tuple[str, str], list[int]] = {}
        for m in self.finishing:
            pairs.setdefault((m.source, m.target), []).append(m.shard)
        out += [f"finish the move of shard{'s' if len(v) > 1 else ''} {collapse(v)}: {src} -> {tgt} (left unfinished by an earlier rebalance;"
                " from its journal, first)" for (src, tgt), v in pairs.items()]
        if self.batches is None or verbose:
            out += [f"move shard {m.shard}: {m.source} -> {m.target}" + (f" ({human(self.sizes.get(m.shard, 0))})" if self.sizes else "")
                    for m in self.moves]
        return out + self.tail(verbose=verbose)

    def tail(self, *, verbose: bool = False) -> list[str]:
        """The lines after the moves: their batches (a dry run's: a summary, each batch with verbose), what stays where
        it is, and whether it evens out."""
        out = []
        if self.batches:
            for p in self.summary():
                fewer = (f"; as few as {p['fewest_batches']} if its pauses come in at half the estimate or less"
                         if p["fewest_batches"] < p["batches"] else "")
                out.append(f"{p['source']} -> {p['target']}: {p['shards']} shard{'s' if p['shards'] != 1 else ''}, {human(p['bytes'])},"
                           f" {p['batches']} batch{'es' if p['batches'] != 1 else ''} (estimated write pause up to {p['estimated_pause_ms']} ms"
                           f"{fewer}), about {p['estimated_seconds']:.0f} s")
            n = len(self.batches)
            out.append(f"in {n} batch{'es' if n != 1 else ''} (one replication stream and one write pause each), at most {self.parallel} at a time:"
                       f" about {self.seconds():.0f} s" + ("" if verbose else " ('--verbose' lists every move and batch)"))
            out += [f"{target}: its server starts each batch's subscription worker up to {w['interval_s']:g} s late (wal_retrieve_retry_interval; before"
                    f" PostgreSQL 18): {w['batches']:.0f} batches may wait {w['wait_s']:.0f} s for it; set it lower there for this run"
                    " (ALTER SYSTEM SET wal_retrieve_retry_interval = '1s'; SELECT pg_reload_conf())"
                    for target, w in self.launcher_waits().items() if w["wait_s"] >= LAUNCHER_WAIT_TOLD_S]
            if verbose:
                out += [b.line() for b in self.batches]
        out += [f"shard {s} is in the middle of a move: left on {n} (finish it with 'pgidgen move-shard {s} --resume' or '--rollback')"
                for s, n in sorted(self.midmove.items())]
        if not self.even:
            by_db: dict[str, list[int]] = {}
            for s, db in sorted(self.blocked.items()):
                by_db.setdefault(db, []).append(s)
            why = "; ".join(f"{db} still holds the retired copies of shards {collapse(v)}" if len(v) > 1 else f"{db} still holds the retired copy of shard {v[0]}"
                            for db, v in by_db.items())
            out.append("not spread evenly: " + (why + " ('pgidgen move-shard --cleanup N' drops it)" if why else "shards in the middle of a move stay where they are"))
        elif not self.moves and not self.finishing:
            out.append("nothing to do: the shards are spread evenly")
        return out


@dataclass
class RebalanceResult:
    plan: RebalancePlan
    reports: list[MoveReport] = field(default_factory=list)
    failures: list[tuple[PlannedMove, str]] = field(default_factory=list)

    @property
    def differ(self) -> list[int]:
        """Shards moved whose verification found differences (a resumed move's: no error stops it)."""
        return sorted(s for r in self.reports if r.verification is not None and not r.verification.ok for s in r.shards)

    @property
    def ok(self) -> bool:
        return not self.failures and not self.differ

    def as_dict(self) -> dict[str, Any]:
        return {"plan": self.plan.as_dict(), "moves": [r.as_dict() for r in self.reports],
                "failed": [{**m.as_dict(), "error": e} for m, e in self.failures], "ok": self.ok}

    def lines(self, now: dict[str, list[int]], unreachable: Sequence[str] = (), now_bytes: dict[str, int] | None = None) -> list[str]:
        """Shards (and bytes) per database before the run and now (as the databases report it: read_map)."""
        def held(n: str) -> str:
            shards = now.get(n, [])
            return f"{len(shards)} shards" + (f", {human(now_bytes[n])}" if now_bytes and n in now_bytes else "")

        return [f"{n}: {self.plan._held(before)} -> " + ("? (unreachable now)" if n in unreachable else
                                                       f"{held(n)} ({collapse(sorted(now.get(n, []))) or '-'})")
                for n, before in self.plan.before.items()]


def plan_rebalance(config: Config, databases: Sequence[str] | None = None, *, by: str = "size", finished: Sequence[int] = ()) -> RebalancePlan:
    """by="size": even out the bytes on disk; by="count": the number of shards. The moves an earlier rebalance
    left unfinished count as finished (a run finishes them before it plans: the dry run shows the plan it makes
    then); their shards, and those of finished (what this run finished), move no further in this plan."""
    if by not in ("size", "count"):
        raise ConfigError(f"--by {by!r}: rebalance plans by size or by count")
    names = spread_over(config, databases)
    states, _ = read_states(config, need=tuple(names))
    # a shard mid-move counts where it serves: its source until the flip ('moving'), then its target ('incoming')
    midmove = {s: n for n in names for s, st in states[n].shards.items() if st == "moving"}
    midmove.update({s: n for n in names for s, st in states[n].shards.items()
                    if st == "incoming" and not any(states[m].shards.get(s) == "moving" for m in states)})
    held = {n: sorted(states[n].active | {s for s, m in midmove.items() if m == n}) for n in names}
    if sum(len(v) for v in held.values()) == 0:
        raise ConfigError("the named databases hold no shards", hint="run 'pgidgen init' first")
    retired = {n: {s for s, st in states[n].shards.items() if st == "retired"} for n in names}
    found, _ = read_each(config, names, read_sizes)
    held_sets = {n: set(v) for n, v in held.items()}
    sizes = {s: z.bytes for n in names for s, z in found[n].items() if s in held_sets[n]}
    finishing = [PlannedMove(s, source, target) for _, shards, source, target in unfinished_moves(config, names, states) for s in shards]
    before = {n: list(v) for n, v in held.items()}
    for m in finishing:  # where the run finds them once it has finished their moves
        midmove.pop(m.shard, None)
        for n in names:
            if m.shard in held[n]:
                held[n].remove(m.shard)
        if m.target in held:
            held[m.target] = sorted([*held[m.target], m.shard])
    fixed = set(midmove) | {m.shard for m in finishing} | set(finished)
    if by == "count":
        plan = spread(names, held, fixed=fixed, retired=retired, midmove=midmove)
    else:
        moves, blocked = spread_bytes(names, held, sizes, fixed=fixed, retired=retired)
        after = {n: set(v) for n, v in held.items()}
        for s, d, r in moves:
            after[d].discard(s)
            after[r].add(s)
        plan = RebalancePlan(before={n: sorted(v) for n, v in held.items()}, after={n: sorted(v) for n, v in after.items()},
                             moves=sorted((PlannedMove(*m) for m in moves), key=lambda m: m.shard), midmove=dict(midmove), blocked=blocked)
    plan.by, plan.sizes, plan.before, plan.finishing = by, sizes, before, sorted(finishing, key=lambda m: m.shard)
    return plan


def unfinished_moves(config: Config, names: Sequence[str], states: dict[str, Any]) -> list[tuple[int, list[int], str, str]]:
    """The moves an earlier rebalance started and did not finish, from the journals of the named databases (their
    sources), oldest first: (the shard its journal row names, its batch's shards, source, target)."""
    out: list[tuple[int, list[int], str, str]] = []
    for name in names:
        if not states[name].has_catalog:
            continue
        conn = connect(name, config.dsn(name), autocommit=True)
        try:
            if has_journal(conn):
                out += [(int(r[0]), [int(s) for s in (r[3] or {}).get("shards") or [r[0]]], str(r[1]), str(r[2])) for r in conn.execute(
                    "SELECT shard, source, target, detail FROM pgidgen.moves WHERE status IN ('running', 'failed')"
                    " AND detail ->> 'origin' = 'rebalance' ORDER BY move_id")]
        finally:
            conn.close()
    return out


def spread(
    names: Sequence[str], held: dict[str, list[int]], *, fixed: set[int], retired: dict[str, set[int]], midmove: dict[int, str] | None = None,
) -> RebalancePlan:
    """The moves, one at a time: from the fullest database that has a shard which may go to the emptiest one it
    is at least two shards ahead of (not fixed, no retired copy of it there), its highest-numbered such shard.
    Without constraints this is the fewest moves that leave every database within one shard of the others (the
    fullest keep the extra ones); pinned shards (mid-move) and retired copies only make it pick other shards or
    other pairs, so it gets as close to even as they allow."""
    names = list(names)
    after = {n: sorted(v) for n, v in held.items()}
    moves: list[PlannedMove] = []
    moved: set[int] = set()  # a shard moves once per plan (a second move of it would run at the same time and fail)
    while True:
        taken = None
        for d in sorted(names, key=lambda n: (-len(after[n]), names.index(n))):
            for r in sorted(names, key=lambda n: (len(after[n]), names.index(n))):
                if len(after[d]) - len(after[r]) < 2:
                    break
                shard = next((s for s in reversed(after[d]) if s not in fixed and s not in moved and s not in retired.get(r, set())), None)
                if shard is not None:
                    taken = (shard, d, r)
                    break
            if taken:
                break
        if taken is None:
            break
        shard, d, r = taken
        after[d].remove(shard)
        after[r].append(shard)
        moved.add(shard)
        moves.append(PlannedMove(shard, d, r))
    blocked: dict[int, str] = {}
    lo = min(len(v) for v in after.values())
    for r in (n for n in names if len(after[n]) == lo):
        for d in (n for n in names if len(after[n]) - lo >= 2):
            blocked.update({s: r for s in after[d] if s not in fixed and s in retired.get(r, set())})
    return RebalancePlan(before={n: sorted(v) for n, v in held.items()}, after={n: sorted(v) for n, v in after.items()},
                         moves=sorted(moves, key=lambda m: m.shard), midmove=dict(midmove or {}), blocked=blocked)


class Interrupted(KeyboardInterrupt):
    """Ctrl-C stopped a rebalance: the batches in flight finished (or rolled back), no other started; result is
    what it did (the next rebalance continues)."""

    def __init__(self, result: RebalanceResult) -> None:
        super().__init__("rebalance interrupted")
        self.result = result


def rebalance(
    config: Config,
    databases: Sequence[str] | None = None,
    *,
    parallel: int = 2,
    options: MoveOptions | None = None,
    on_done: Callable[[PlannedMove, MoveReport | PgidgenError], None] | None = None,
    on_batch: Callable[[MoveReport | PgidgenError, list[int]], None] | None = None,
    hook: Hook | None = None,
    by: str = "size",
    journaled_pause: bool = False,
    on_plan: Callable[[RebalancePlan], None] | None = None,
) -> RebalanceResult:
    """Run the plan's moves in batches per source -> target pair (move_shards: one replication stream and one
    cutover per batch), at most `parallel` batches at a time. Moves an earlier rebalance left unfinished (killed,
    Ctrl-C) are finished first, from their journals; interrupted moves made by hand are left alone.

    Ctrl-C (KeyboardInterrupt, which Python raises in the main thread) lets the batches in flight finish (or roll
    back, when their cutover does not fit) and starts no other, then raises Interrupted with what was done: the
    moves run on other threads, so the interrupt never lands inside a step; this one only waits (run_stoppable).
    journaled_pause: a move finished from its journal keeps the --max-pause it started with (resume_move).
    on_plan(plan): the plan, made once those moves are finished (before the first of its batches starts)."""
    _check_parallel(parallel)
    spread_over(config, databases)
    result, interrupted = run_stoppable(lambda stop: _rebalance(config, databases, parallel=parallel, options=options, on_done=on_done,
                                                                on_batch=on_batch, hook=hook, by=by, stop=stop, journaled_pause=journaled_pause,
                                                                on_plan=on_plan))
    if interrupted:
        raise Interrupted(result)
    return result


def _rebalance(
    config: Config,
    databases: Sequence[str] | None,
    *,
    parallel: int,
    options: MoveOptions | None,
    on_done: Callable[[PlannedMove, MoveReport | PgidgenError], None] | None,
    on_batch: Callable[[MoveReport | PgidgenError, list[int]], None] | None,
    hook: Hook | None,
    by: str,
    stop: StopFlag,
    journaled_pause: bool = False,
    on_plan: Callable[[RebalancePlan], None] | None = None,
) -> RebalanceResult:
    resumed = _finish_interrupted(config, databases, options, on_batch, stop, journaled_pause)
    plan = plan_rebalance(config, databases, by=by, finished=[s for r in resumed for s in r.shards])
    if on_plan is not None:
        on_plan(plan)
    result = RebalanceResult(plan, reports=resumed)
    if not plan.moves or stop.is_set():
        return result
    layout_state, _ = read_states(config, need=tuple({m.source for m in plan.moves} | {m.target for m in plan.moves}))
    units = work_units(plan.moves, parallel)
    sources = {m.shard: m.source for m in plan.moves}
    at_once = [(sources[shards[0]], target) for target, shards in units][:parallel]
    preflight(config, [(m.source, m.target) for m in plan.moves], online=not (options and options.offline),
              conninfo=options.subscription_conninfo if options else None, at_once=at_once)
    # catalogs first, one database at a time: concurrent first-time installs would collide
    any_state = next(st for st in layout_state.values() if st.layout is not None)
    for name in sorted({m.source for m in plan.moves} | {m.target for m in plan.moves}):
        conn = connect(name, config.dsn(name), autocommit=True)
        try:
            ensure_catalog(conn, name, config, layout=any_state.layout, shard_count=any_state.shard_count or 0)
        finally:
            conn.close()
    lock = threading.Lock()
    planned = {m.shard: m for m in plan.moves}

    def done(report: MoveReport | PgidgenError, shards: list[int]) -> None:
        with lock:
            if isinstance(report, PgidgenError):
                result.failures.extend((planned[s], scrub(report.render())) for s in shards)  # --json prints it too
            else:
                result.reports.append(report)
            if on_batch is not None:
                on_batch(report, shards)
            if on_done is not None:
                for s in shards:
                    on_done(planned[s], report)

    def run(unit: tuple[str, list[int]]) -> None:
        target, shards = unit
        if stop.is_set():
            return
        opts = MoveOptions(**vars(options)) if options else MoveOptions()
        opts.origin = "rebalance"
        left = list(shards)

        def moved(report: MoveReport) -> None:
            done(report, report.shards)
            left[:] = [s for s in left if s not in report.shards]

        try:
            move_shards(config, shards, target, options=opts, hook=hook, should_stop=stop.is_set, on_batch=moved)
        except PgidgenError as e:
            done(e, left)
        except psycopg.Error as e:  # reported as those moves' failure; the other moves' results stay in the report
            done(MoveError(f"move of shards {collapse(left)} to {target} failed: {pg_message(e)}",
                           hint=f"run 'pgidgen rebalance' again to finish it, or see 'pgidgen move-shard {left[0]} --resume'"), left)

    with ThreadPoolExecutor(max_workers=parallel) as pool:
        list(pool.map(run, units))
    result.reports.sort(key=lambda r: r.shard)
    return result


def spread_over(config: Config, databases: Sequence[str] | None) -> list[str]:
    """The databases to spread over: two or more (one alone is always "even", which a user who named only the new
    database would read as done)."""
    names = config.select(list(databases) if databases else None)
    if len(names) < 2:
        raise ConfigError(f"rebalance spreads the shards over two or more databases, not {names[0]} alone",
                          hint="name them all, like --databases db1,db2 (a new database goes in the config's [databases] first)")
    return names


def _check_parallel(parallel: int) -> None:
    if parallel < 1:
        raise ConfigError(f"--parallel must be at least 1, not {parallel}")


def plan_batches_of(config: Config, plan: RebalancePlan, *, parallel: int = 2, options: MoveOptions | None = None) -> list[PlannedBatch]:
    """The dry run's batches: the plan's moves cut as a run cuts them (work_units, then each unit's move_shards),
    in the order each unit runs them; nothing is written. A run cuts a unit's later batches again by the pauses it
    measures (batches.Pacer), so those may come out fewer and larger than estimated here."""
    _check_parallel(parallel)
    sources = {m.shard: m.source for m in plan.moves}
    out = []
    plan.fewest, plan.launcher_s = {}, {}
    for target, shards in work_units(plan.moves, parallel):
        pacer, batches = plan_batches(config, locate_batch(config, sorted(shards), target), options or MoveOptions())
        out += [PlannedBatch(sources[shards[0]], target, b.shards, plan.bytes_of(b.shards), b.pause_s,
                             estimate_seconds(b.costs, plan.bytes_of(b.shards), start_s=pacer.start_s)) for b in batches]
        if pacer.start_s:
            plan.launcher_s[target] = pacer.start_s
        pair = (sources[shards[0]], target)
        plan.fewest[pair] = plan.fewest.get(pair, 0) + len(pacer.run_through([c for b in batches for c in b.costs], ratio=0.5))
    plan.batches, plan.parallel = out, parallel
    return out


def work_units(moves: Sequence[PlannedMove], parallel: int) -> list[tuple[str, list[int]]]:
    """The plan's moves per source -> target pair, in shard order. With fewer pairs than `parallel`, a pair's
    shards are cut into consecutive runs that move at the same time (each a move_shards of its own)."""
    pairs: dict[tuple[str, str], list[int]] = {}
    for m in sorted(moves, key=lambda m: m.shard):
        pairs.setdefault((m.source, m.target), []).append(m.shard)
    ways = max(1, parallel // max(1, len(pairs)))
    units = []
    for (_, target), shards in pairs.items():
        n = min(ways, len(shards))
        size = -(-len(shards) // n)
        units += [(target, shards[i:i + size]) for i in range(0, len(shards), size)]
    return units


def _finish_interrupted(
    config: Config, databases: Sequence[str] | None, options: MoveOptions | None,
    on_batch: Callable[[MoveReport | PgidgenError, list[int]], None] | None, stop: StopFlag, journaled_pause: bool = False,
) -> list[MoveReport]:
    """Resume the moves an earlier rebalance started and did not finish (their journals say so), one at a time
    until stop is set."""
    names = config.select(list(databases) if databases else None)
    states, _ = read_states(config, need=tuple(names))
    reports = []
    for shard, _, _, _ in unfinished_moves(config, names, states):
        if stop.is_set():
            break
        opts = MoveOptions(**vars(options)) if options else MoveOptions()
        report = resume_move(config, shard, options=opts, journaled_pause=journaled_pause)
        reports.append(report)
        if on_batch is not None:
            on_batch(report, report.shards)
    return reports
