"""`pgidgen rebalance`: spread the shards evenly over the databases by moving whole shards, several at once.

Every move is an ordinary move-shard (same checks, journal, cutover, verification); rebalance only chooses them:
the fewest moves that leave every database within one shard of the others, taking from each crowded database
its highest-numbered shards (so what stays keeps its contiguous ranges). A failed move does not stop the others;
it stays resumable on its own (`pgidgen move-shard N --resume` / `--rollback`).
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
from ..ranges import collapse
from .context import MoveError, read_states
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

    def as_dict(self) -> dict[str, Any]:
        return {
            "before": {n: len(s) for n, s in self.before.items()},
            "after": {n: len(s) for n, s in self.after.items()},
            "moves": [m.as_dict() for m in self.moves],
        }

    def lines(self) -> list[str]:
        out = [f"{n}: {len(self.before[n])} shards -> {len(self.after[n])} ({collapse(self.after[n]) or '-'})" for n in self.before]
        out += [f"move shard {m.shard}: {m.source} -> {m.target}" for m in self.moves]
        if not self.moves:
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


def plan_rebalance(config: Config, databases: Sequence[str] | None = None) -> RebalancePlan:
    names = config.select(list(databases) if databases else None)
    states, _ = read_states(config, need=tuple(names))
    for name in names:
        moving = sorted(s for s, st in states[name].shards.items() if st in ("moving", "incoming"))
        if moving:
            raise MoveError(f"database {name} has shards in the middle of a move ({collapse(moving)})",
                            hint="finish or roll those moves back first ('pgidgen move-shard N --resume' or '--rollback')")
    held = {n: sorted(states[n].active) for n in names}
    total = sum(len(v) for v in held.values())
    if total == 0:
        raise ConfigError("the named databases hold no shards", hint="run 'pgidgen init' first")
    # the fullest databases keep the larger quotas, so as few shards as possible move
    order = sorted(names, key=lambda n: (-len(held[n]), names.index(n)))
    quota = {n: total // len(names) + (1 if i < total % len(names) else 0) for i, n in enumerate(order)}
    after = {n: list(v) for n, v in held.items()}
    give: list[tuple[int, str]] = []
    for n in order:
        extra = len(after[n]) - quota[n]
        if extra > 0:
            give += [(s, n) for s in after[n][-extra:]]
            after[n] = after[n][:-extra]
    moves: list[PlannedMove] = []
    for n in sorted(names, key=lambda n: len(after[n])):
        while len(after[n]) < quota[n] and give:
            # a shard whose retired copy is still on n cannot go there until --cleanup: take another
            pick = next((i for i, (s, _) in enumerate(give) if states[n].shards.get(s) != "retired"), None)
            if pick is None:
                break
            shard, src = give.pop(pick)
            moves.append(PlannedMove(shard, src, n))
            after[n].append(shard)
    for src_shard, src in give:  # could not be placed: it stays
        after[src].append(src_shard)
    return RebalancePlan(before=held, after={n: sorted(v) for n, v in after.items()}, moves=sorted(moves, key=lambda m: m.shard))


def rebalance(
    config: Config,
    databases: Sequence[str] | None = None,
    *,
    parallel: int = 2,
    options: MoveOptions | None = None,
    on_done: Callable[[PlannedMove, MoveReport | PgidgenError], None] | None = None,
) -> RebalanceResult:
    """Run the plan's moves, at most `parallel` at a time; each is a full move-shard with its own guarantees."""
    if parallel < 1:
        raise ConfigError(f"--parallel must be at least 1, not {parallel}")
    plan = plan_rebalance(config, databases)
    result = RebalanceResult(plan)
    if not plan.moves:
        return result
    layout_state, _ = read_states(config, need=tuple({m.source for m in plan.moves} | {m.target for m in plan.moves}))
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
