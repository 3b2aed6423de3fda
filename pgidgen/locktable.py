"""How much of the server's lock table one transaction may fill, and how many shards that makes.

Every table, index, sequence, function and schema a transaction creates or alters stays locked until it commits,
in a lock table of fixed size: max_locks_per_transaction * (max_connections + max_prepared_transactions) entries
shared by the whole server (the default settings give 6400). A command that changes thousands of shards (init,
apply-ddl) estimates the locks one shard takes, checks the estimate against what the first shards really took,
and gives each transaction as many shards as half of the free lock table holds: one transaction when they all
fit (nothing half-made), otherwise chunks of whole shards, each committed with what records it (the catalog's
rows for init, the ledger's for apply-ddl), so a run that stops resumes where it stopped.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import psycopg

#: The share of the free lock table one command may fill: the rest stays for the server's other sessions.
HEADROOM = 0.5

#: What the server's lock table holds, what is in use now, and which server it is (databases on one server share it).
BUDGET_SQL = (
    "SELECT current_setting('max_locks_per_transaction')::int"
    " * (current_setting('max_connections')::int + current_setting('max_prepared_transactions')::int),"
    " (SELECT count(*) FROM pg_catalog.pg_locks WHERE NOT fastpath),"
    " extract(epoch FROM pg_catalog.pg_postmaster_start_time())::text || ':' || current_setting('port')"
)
#: Locks this session holds in the shared lock table (fast-path locks take none).
HELD_SQL = "SELECT count(*) FROM pg_catalog.pg_locks WHERE pid = pg_catalog.pg_backend_pid() AND NOT fastpath"

#: What a run split into transactions says about resuming (apply-ddl's wording is the default).
LEDGER_RESUMES = "each commits with its ledger rows, so an interrupted run resumes where it stopped"


@dataclass(frozen=True)
class LockBudget:
    capacity: int
    in_use: int
    server: str


def read_budget(conn: psycopg.Connection[Any]) -> LockBudget:
    row = conn.execute(BUDGET_SQL).fetchone()
    assert row is not None
    return LockBudget(capacity=int(row[0]), in_use=int(row[1]), server=str(row[2]))


def held(conn: psycopg.Connection[Any]) -> int:
    row = conn.execute(HELD_SQL).fetchone()
    return int(row[0]) if row else 0


@dataclass
class Sizing:
    """How one database's shards are split into transactions."""

    shards: int
    per_tx: int  # shards per transaction
    locks_per_shard: int = 0
    capacity: int = 0  # the server's lock table (0: --commit-every chose the size)
    room: int = 0  # the locks one transaction of this database may take
    chosen: bool = False  # by --commit-every
    resumes: str = LEDGER_RESUMES
    reserved: int = 0  # locks the first transaction takes besides its shards (init's catalog)
    hold: float = 0.0  # when > 0: a transaction also commits once it has held its shards' locks this long (seconds)

    @property
    def first(self) -> int:
        """Shards in the first transaction."""
        if self.chosen or not self.reserved:
            return min(self.shards, self.per_tx)
        return max(1, min(self.shards, self.per_tx, (self.room - self.reserved) // max(1, self.locks_per_shard)))

    @property
    def transactions(self) -> int:
        return 1 + -(-(self.shards - self.first) // self.per_tx) if self.shards else 0

    @property
    def chunked(self) -> bool:
        return self.transactions > 1 or self.chosen or self.hold > 0

    def describe(self, name: str) -> str:
        if self.chosen:
            return f"{name}: {self.shards} shards in {self.transactions} transactions of up to {self.per_tx} (--commit-every)"
        if self.hold:
            return (f"{name}: {self.shards} shards in transactions of up to {self.per_tx} shards or {self.hold * 1000:.0f} ms each"
                    f" (the application waits on a shard at most that plus the lock timeout); {self.resumes}")
        if not self.chunked:
            return f"{name}: {self.shards} shards in one transaction (~{self.locks_per_shard} locks per shard, the lock table holds {self.capacity})"
        return (f"{name}: {self.shards} shards in {self.transactions} transactions of up to {self.per_tx}: ~{self.locks_per_shard} locks per shard"
                f" and the server's lock table holds {self.capacity} (max_locks_per_transaction x connections); {self.resumes}")

    def refit(self, locks_per_shard: int) -> None:
        self.locks_per_shard = locks_per_shard
        self.per_tx = max(1, min(self.shards, self.room // max(1, locks_per_shard)))

    def check(self, measured: int) -> None:
        """What the first shards really took, when more than the estimate, shrinks the transactions (never grows
        them: the plan announced is an upper bound)."""
        if self.chosen or measured <= self.locks_per_shard or not self.locks_per_shard:
            return
        self.refit(measured)


def room(budget: LockBudget, sharing: int) -> int:
    """HEADROOM of the free lock table, split between the databases working on this server at once."""
    return max(0, int(budget.capacity * HEADROOM) - budget.in_use) // max(1, sharing)


def sharing(budgets: Mapping[str, LockBudget]) -> dict[str, int]:
    """How many of these databases share each one's server (and so its lock table)."""
    per_server: dict[str, int] = {}
    for b in budgets.values():
        per_server[b.server] = per_server.get(b.server, 0) + 1
    return {name: per_server[b.server] for name, b in budgets.items()}
