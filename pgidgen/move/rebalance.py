"""`pgidgen rebalance`: spread the shards evenly over the databases by moving whole shards, several at once.

Every move is an ordinary move-shard (same checks, journal, cutover, verification); rebalance only chooses them.
By size (the default) it evens out the bytes on disk (balance.py); by count, the fewest moves that leave every
database within one shard of the others, taking from each crowded database its highest-numbered shards (so what
stays keeps its contiguous ranges). Shards in the middle of a move stay where
they are, and a shard never goes back to a database that still holds its retired copy: another one goes instead.
A failed move does not stop the others; it stays resumable on its own (`pgidgen move-shard N --resume`, or
`--rollback` when it failed before activating the target).
"""
from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import psycopg

from ..config import Config
from ..db import connect, pg_message
from ..errors import ConfigError, PgidgenError
from ..db import read_each
from ..ranges import collapse
from ..sizes import human, read_sizes
from .balance import spread_bytes
from .context import MoveError, preflight, read_states
from .engine import MoveOptions, MoveReport, ensure_catalog, move_shard


@dataclass
class PlannedMove:
    shard: int
    source: str
    target: str

    def as_dict(self) -> dict[str, Any]:
        return {"shard": self.shard, "source": self.source, "target": self.target}


@dataclass
class RebalancePlan:
    before: dict[str, list[int]]
    after: dict[str, list[int]]
    moves: list[PlannedMove] = field(default_factory=list)
    #: shards in the middle of a move, where they serve from: left where they are
    midmove: dict[int, str] = field(default_factory=dict)
    #: shards that would have evened the spread but whose retired copy is still on the database short of shards
    blocked: dict[int, str] = field(default_factory=dict)
    by: str = "count"
    #: bytes on disk of every shard held (empty: not read)
    sizes: dict[int, int] = field(default_factory=dict)

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
            "moves": [m.as_dict() for m in self.moves],
            "left_mid_move": [{"shard": s, "database": n} for s, n in sorted(self.midmove.items())],
            "blocked_by_retired_copy": [{"shard": s, "database": n} for s, n in sorted(self.blocked.items())],
            "even": self.even,
        }

    def lines(self) -> list[str]:
        out = [f"{n}: {self._held(self.before[n])} -> {self._held(self.after[n])} ({collapse(self.after[n]) or '-'})" for n in self.before]
        out += [f"move shard {m.shard}: {m.source} -> {m.target}" + (f" ({human(self.sizes.get(m.shard, 0))})" if self.sizes else "")
                for m in self.moves]
        out += [f"shard {s} is in the middle of a move: left on {n} (finish it with 'pgidgen move-shard {s} --resume' or '--rollback')"
                for s, n in sorted(self.midmove.items())]
        if not self.even:
            by_db: dict[str, list[int]] = {}
            for s, n in sorted(self.blocked.items()):
                by_db.setdefault(n, []).append(s)
            why = "; ".join(f"{n} still holds the retired copies of shards {collapse(v)}" if len(v) > 1 else f"{n} still holds the retired copy of shard {v[0]}"
                            for n, v in by_db.items())
            out.append("not spread evenly: " + (why + " ('pgidgen move-shard --cleanup N' drops it)" if why else "shards in the middle of a move stay where they are"))
        elif not self.moves:
            out.append("nothing to do: the shards are spread evenly")
        return out


@dataclass
class RebalanceResult:
    plan: RebalancePlan
    reports: list[MoveReport] = field(default_factory=list)
    failures: list[tuple[PlannedMove, str]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.failures

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


def plan_rebalance(config: Config, databases: Sequence[str] | None = None, *, by: str = "size") -> RebalancePlan:
    """by="size": even out the bytes on disk; by="count": the number of shards."""
    if by not in ("size", "count"):
        raise ConfigError(f"--by {by!r}: rebalance plans by size or by count")
    names = config.select(list(databases) if databases else None)
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
    sizes = {s: z.bytes for n in names for s, z in found[n].items() if s in set(held[n])}
    if by == "count":
        plan = spread(names, held, fixed=set(midmove), retired=retired, midmove=midmove)
    else:
        moves, blocked = spread_bytes(names, held, sizes, fixed=set(midmove), retired=retired)
        after = {n: set(v) for n, v in held.items()}
        for s, d, r in moves:
            after[d].discard(s)
            after[r].add(s)
        plan = RebalancePlan(before={n: sorted(v) for n, v in held.items()}, after={n: sorted(v) for n, v in after.items()},
                             moves=sorted((PlannedMove(*m) for m in moves), key=lambda m: m.shard), midmove=dict(midmove), blocked=blocked)
    plan.by, plan.sizes = by, sizes
    return plan


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


def rebalance(
    config: Config,
    databases: Sequence[str] | None = None,
    *,
    parallel: int = 2,
    options: MoveOptions | None = None,
    on_done: Callable[[PlannedMove, MoveReport | PgidgenError], None] | None = None,
    by: str = "size",
) -> RebalanceResult:
    """Run the plan's moves, at most `parallel` at a time; each is a full move-shard with its own guarantees."""
    if parallel < 1:
        raise ConfigError(f"--parallel must be at least 1, not {parallel}")
    plan = plan_rebalance(config, databases, by=by)
    result = RebalanceResult(plan)
    if not plan.moves:
        return result
    layout_state, _ = read_states(config, need=tuple({m.source for m in plan.moves} | {m.target for m in plan.moves}))
    preflight(config, [(m.source, m.target) for m in plan.moves], online=not (options and options.offline),
              conninfo=options.subscription_conninfo if options else None)
    # catalogs first, one database at a time: concurrent first-time installs would collide
    any_state = next(st for st in layout_state.values() if st.layout is not None)
    for name in sorted({m.source for m in plan.moves} | {m.target for m in plan.moves}):
        conn = connect(name, config.dsn(name), autocommit=True)
        try:
            ensure_catalog(conn, name, config, layout=any_state.layout, shard_count=any_state.shard_count or 0)
        finally:
            conn.close()
    lock = threading.Lock()

    def one(m: PlannedMove) -> None:
        opts = MoveOptions(**vars(options)) if options else MoveOptions()
        try:
            report: MoveReport | PgidgenError = move_shard(config, m.shard, m.target, options=opts)
        except PgidgenError as e:
            report = e
        except psycopg.Error as e:  # reported as that move's failure; the other moves' results stay in the report
            report = MoveError(f"move of shard {m.shard} to {m.target} failed: {pg_message(e)}",
                               hint=f"see 'pgidgen move-shard --resume {m.shard}' or '--rollback {m.shard}'")
        with lock:
            if isinstance(report, PgidgenError):
                result.failures.append((m, report.render()))
            else:
                result.reports.append(report)
            if on_done is not None:
                on_done(m, report)

    with ThreadPoolExecutor(max_workers=parallel) as pool:
        list(pool.map(one, plan.moves))
    result.reports.sort(key=lambda r: r.shard)
    return result
