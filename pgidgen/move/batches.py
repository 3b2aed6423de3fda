"""How a set of shards is cut into batches, each moved with one replication stream and one cutover.

A batch's write pause is its cutover's work: the freeze locks every table of the batch, retires each shard's
copy on the source (a schema renamed; its write guards come after the flip) and activates each on the target (generator,
sequences, catalog row). That grows with the shards and tables in it, so a batch is filled while its estimated
pause stays within a share of --max-pause (the rest is left for the last changes to arrive under the freeze).
The transactions that create and retire a batch hold a lock per relation of it: a batch also stays within a
share of the smaller lock table of its two servers. A cutover that still does not fit is rolled back and its
batch moved again as two halves (engine.move_shards).
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..config import Config
from ..db import connect
from ..ranges import collapse
from ..versions import has

if TYPE_CHECKING:
    from .context import ShardContext
    from .steps.base import MoveOptions

#: The cutover's cost (seconds): a fixed part, per shard and per table (retire renames the batch's schemas and
#: updates its catalog rows in one statement; activate advances its generators and sets its sequences, one
#: statement each). Measured by bench/bench_scale.py's rebalance of 8192 shards of 2 tables under its writers, on 2
#: shared cores: 1-3 ms a shard on PostgreSQL 18 and 15 (pauses of 200-370 shards, median 318-324 ms), rounded up;
#: a move of several batches corrects it by the pauses it measures (Pacer). At 24 ms a shard, the estimate when
#: the pause worked shard by shard, a move began with batches of 10 shards and took five more to reach 300: on
#: 15 each batch waits up to 5 s for its worker (launcher_interval_s).
PAUSE_BASE_S = 0.05
PAUSE_PER_SHARD_S = 0.002
PAUSE_PER_TABLE_S = 0.0005
#: The share of --max-pause a batch's estimated pause may take: the pacer holds pauses near it, and under load a
#: pause came in at up to twice its estimate (8192 shards on 15 at half: median 460 ms, the longest 1003 ms).
PAUSE_SHARE = 0.4
#: The share of a server's lock table (max_locks_per_transaction * (max_connections + max_prepared_transactions))
#: one batch's transactions may take: two batches may run at once, beside the applications.
LOCK_SHARE = 0.2
#: Locks a shard's cutover and copy take besides one per relation (its schema, catalog row, move and claim advisory locks).
LOCKS_PER_SHARD = 4


@dataclass(frozen=True)
class ShardCost:
    shard: int
    tables: int
    relations: int  # tables, indexes, sequences, views, TOAST tables and their indexes: what the copy creates and holds locks on


#: A batch's whole move (seconds), for the dry run's time: a fixed part (slot, publication, subscription, catch-up,
#: cutover, verification), per shard, and per byte copied. Measured on 2 shared cores under other load, PostgreSQL 18
#: (rebalance of 600 small shards: 10 shards 1.1-1.3 s, 42 shards 2.4-3.2 s, 77 shards 3.1-3.9 s; a 1M-row shard's
#: copy at about 100 MB/s, bench/bench_move.py).
BATCH_S = 0.8
BATCH_PER_SHARD_S = 0.04
BATCH_BYTES_PER_S = 100e6


def estimate_seconds(costs: Sequence[ShardCost], nbytes: int, *, start_s: float = 0.0) -> float:
    """start_s: how long the target's launcher may take to start the subscription's worker (Pacer.start_s)."""
    return BATCH_S + start_s + BATCH_PER_SHARD_S * len(costs) + nbytes / BATCH_BYTES_PER_S


def estimate_pause(costs: Sequence[ShardCost], *, scale: float = 1.0) -> float:
    return PAUSE_BASE_S + scale * sum(PAUSE_PER_SHARD_S + PAUSE_PER_TABLE_S * c.tables for c in costs)


def cut(costs: Sequence[ShardCost], *, max_pause: float | None, lock_budget: int, scale: float = 1.0) -> list[list[ShardCost]]:
    """Consecutive runs of the shards, each as long as its estimated pause (max_pause None: not limited) and
    lock count allow; a shard too large for either alone is a batch of one."""
    out: list[list[ShardCost]] = []
    batch: list[ShardCost] = []
    locks = 0
    for c in costs:
        need = c.relations + LOCKS_PER_SHARD
        over_pause = max_pause is not None and estimate_pause([*batch, c], scale=scale) > PAUSE_SHARE * max_pause
        if batch and (over_pause or locks + need > lock_budget):
            out.append(batch)
            batch, locks = [], 0
        batch.append(c)
        locks += need
    if batch:
        out.append(batch)
    return out


#: per schema: its tables, and its relations with each one's TOAST table and TOAST index (in pg_toast, locked with it)
COSTS_SQL = """
SELECT n.nspname, count(*) FILTER (WHERE c.relkind IN ('r', 'p')), count(c.oid) + 2 * count(*) FILTER (WHERE c.reltoastrelid <> 0)
FROM pg_catalog.pg_namespace n LEFT JOIN pg_catalog.pg_class c ON c.relnamespace = n.oid
WHERE n.nspname = ANY(%s) GROUP BY 1
"""

LOCK_TABLE_SQL = ("SELECT current_setting('max_locks_per_transaction')::int"
                  " * (current_setting('max_connections')::int + current_setting('max_prepared_transactions')::int)")


def lock_table_size(conn: Any) -> int:
    return int(conn.execute(LOCK_TABLE_SQL).fetchone()[0])


def launcher_interval_s(conn: Any) -> float:
    """wal_retrieve_retry_interval: before 18, the most a new subscription's worker waits for the launcher (measured:
    a rebalance batch of small shards on 15 took 6-8 s against 1-4 s on 18, with the default 5 s)."""
    return float(conn.execute("SELECT setting::float / 1000 FROM pg_catalog.pg_settings WHERE name = 'wal_retrieve_retry_interval'").fetchone()[0])


@dataclass
class Batch:
    ctxs: list[ShardContext]
    pause_s: float  # estimated
    locks: int
    costs: list[ShardCost] = field(default_factory=list)

    @property
    def shards(self) -> list[int]:
        return [c.shard for c in self.ctxs]

    def as_dict(self, offline: bool = False) -> dict[str, Any]:
        """What line() says (offline, no estimate: writes pause for the whole copy)."""
        return {"shards": collapse(self.shards), "count": len(self.ctxs), "source": self.ctxs[0].source, "target": self.ctxs[0].target,
                "estimated_pause_ms": None if offline else round(self.pause_s * 1000), "locks": self.locks}

    def line(self, offline: bool = False) -> str:
        pause = "writes to them paused for the whole copy" if offline else f"estimated write pause {self.pause_s * 1000:.0f} ms"
        return (f"shards {collapse(self.shards)} ({len(self.ctxs)}): {self.ctxs[0].source} -> {self.ctxs[0].target},"
                f" {pause}, about {self.locks} locks")


def plan_batches(config: Config, ctxs: list[ShardContext], options: MoveOptions) -> tuple[Pacer, list[Batch]]:
    """The batches a move of ctxs (one source, one target) runs as, in shard order. One shard is a batch of one
    (its move does not wait for the estimate, which it cannot change)."""
    if len(ctxs) == 1:
        one = ShardCost(ctxs[0].shard, 0, 0)
        return Pacer(None, 1), [Batch(ctxs, estimate_pause([one]), 0, [one])]
    source, target = ctxs[0].source, ctxs[0].target
    with connect(source, config.dsn(source), autocommit=True) as src:
        rows = {r[0]: (int(r[1]), int(r[2])) for r in src.execute(COSTS_SQL, ([c.schema for c in ctxs],))}
        capacity = lock_table_size(src)
    with connect(target, config.dsn(target), autocommit=True) as tgt:
        capacity = min(capacity, lock_table_size(tgt))
        start_s = 0.0 if has(tgt, "launcher_wakes_on_create") else launcher_interval_s(tgt)
    costs = [ShardCost(c.shard, *rows.get(c.schema, (0, 0))) for c in ctxs]
    by_shard = {c.shard: c for c in ctxs}
    # offline, the pause is the whole copy anyway: batches are cut by locks only
    pacer = Pacer(None if options.offline else options.max_pause, max(1, int(capacity * LOCK_SHARE)))
    pacer.start_s = 0.0 if options.offline else start_s
    return pacer, pacer.cut(costs, by_shard)


class Pacer:
    """Cuts batches and corrects its estimate by the pauses it is told of: the next batches are cut with the
    estimate scaled by measured / estimated, at most halved at a time (a batch at most doubles: an estimate
    too low overshoots the pause) and at most four times larger."""

    def __init__(self, max_pause: float | None, lock_budget: int) -> None:
        self.max_pause = max_pause
        self.lock_budget = lock_budget
        self.scale = 1.0
        #: the target's launcher delay for a new subscription (estimate_seconds), read by plan_batches
        self.start_s = 0.0

    def cut(self, costs: Sequence[ShardCost], by_shard: dict[int, ShardContext]) -> list[Batch]:
        runs = cut(costs, max_pause=self.max_pause, lock_budget=self.lock_budget, scale=self.scale)
        return [Batch([by_shard[c.shard] for c in run], estimate_pause(run, scale=self.scale), sum(c.relations + LOCKS_PER_SHARD for c in run), list(run))
                for run in runs]

    def measured(self, batch: Batch, pause_s: float) -> bool:
        """A batch's pause as it was: whether the estimate changed enough (a fifth) to cut the rest again. A batch
        of one shard counts too: else a move whose batches an outlier's pause cut down to one shard never grew
        them again (a rebalance of 8192 shards to four databases went on one shard a batch, 0.6 moves/s, for 39
        minutes on one of its targets while the others took 4-5 minutes for as many shards)."""
        if self.max_pause is None or not batch.costs:
            return False
        work = estimate_pause(batch.costs, scale=self.scale) - PAUSE_BASE_S
        if work <= 0:
            return False
        ratio = min(4.0, max(0.5, (pause_s - PAUSE_BASE_S) / work))  # at most double, shrink at once
        if 0.9 <= ratio <= 1.1:
            return False
        self.scale *= ratio
        return True

    def run_through(self, costs: Sequence[ShardCost], *, ratio: float = 1.0) -> list[list[ShardCost]]:
        """The batches a move of costs is cut into when every pause comes in at ratio times its estimate (1: as
        estimated, no batch cut again; 0.5 or less: each batch up to twice the last): move_shards' loop, with the
        pauses assumed. The dry run's forecast; this pacer is left as it was."""
        pacer = Pacer(self.max_pause, self.lock_budget)
        pacer.scale = self.scale
        queue = cut(costs, max_pause=pacer.max_pause, lock_budget=pacer.lock_budget, scale=pacer.scale)
        out: list[list[ShardCost]] = []
        while queue:
            run = queue.pop(0)
            out.append(run)
            assumed = PAUSE_BASE_S + ratio * (estimate_pause(run, scale=pacer.scale) - PAUSE_BASE_S)
            if pacer.measured(Batch([], 0.0, 0, list(run)), assumed) and queue:
                queue = cut([c for r in queue for c in r], max_pause=pacer.max_pause, lock_budget=pacer.lock_budget, scale=pacer.scale)
        return out

