"""Where shards move: `pgidgen move-shard` and `pgidgen rebalance`.

- context.py   finding the shard and the read-only checks before a move
- sqltext.py   every statement a move runs, rendered as text (the dry run prints these)
- depsql.py    the catalog checks' SQL: what a shard owns, what depends on it from outside, what it uses, its grants
- journal.py   the journal on the source database: each step recorded before it runs
- engine.py    the driver: checks, journal, the steps in order; resume and rollback; a set of shards in batches
- batches.py   how a set of shards is cut into batches (estimated pause, lock table)
- steps/       one module per phase: prepare, copy, replication (publication, subscription, catchup, teardown),
               cutover, activate, identity, verify, rollback; ride (a lost connection waited for, the step run again)
- identity.py  tables without a primary key: the replica identity a move gives them, set and put back (lock retries)
- faults.py    which errors are a lost connection (ridden through within --fault-wait), which are not
- transfer.py  the rows: binary COPY streams at the slot's snapshot into one target transaction
- verify.py    per-table row counts and checksums
- cleanup.py   --verify afterwards, and --cleanup of the retired source copy
- plan.py      --dry-run
- rebalance.py pgidgen rebalance: even spread, several moves at once
- balance.py   rebalance --by size: the plan that evens out bytes on disk
- retired.py   pgidgen cleanup: every retired copy (or those older than an age) dropped at once
"""
from __future__ import annotations

from .cleanup import CleanupReport, cleanup, verify_move
from .context import MoveError
from .engine import (
    CopyProgress,
    MoveOptions,
    MoveReport,
    MovesInterrupted,
    move_shard,
    move_shards,
    move_shards_interruptible,
    plan_shards,
    resume_move,
    rollback_move,
)
from .plan import plan_move

__all__ = [
    "CleanupReport", "CopyProgress", "MoveError", "MoveOptions", "MoveReport", "MovesInterrupted",
    "cleanup", "move_shard", "move_shards", "move_shards_interruptible", "plan_move", "plan_shards", "resume_move", "rollback_move", "verify_move",
]
