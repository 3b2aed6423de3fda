"""How many shards one apply-ddl transaction can take before the server's lock table is full.

Every table, index, TOAST table, sequence and constraint a transaction creates or alters stays locked until it
commits, in a lock table of fixed size: max_locks_per_transaction * (max_connections + max_prepared_transactions)
entries shared by the whole server (the default settings give 6400; 2000 shards of two tables need ~40 000).
apply-ddl estimates the locks one shard takes from its statements, checks the estimate against what the first
shard really took, and gives each transaction as many shards as half of the free lock table holds: one
transaction when they all fit (nothing half-applied), otherwise chunks, each committed with its ledger rows so
a run that stops resumes where it stopped.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import psycopg
from pglast import parse_sql
from pglast.enums import ConstrType
from pglast.visitors import Visitor

from .ledger import FileVersion

#: The share of the free lock table one apply-ddl may fill: the rest stays for the server's other sessions.
HEADROOM = 0.5
#: Locks a shard takes whatever its file says: its schema and its next_id() (object locks).
PER_SHARD = 2
_SERIAL = {"serial", "serial2", "serial4", "serial8", "smallserial", "bigserial"}
_INDEXED = {ConstrType.CONSTR_PRIMARY, ConstrType.CONSTR_UNIQUE, ConstrType.CONSTR_EXCLUSION, ConstrType.CONSTR_FOREIGN}

#: What the server's lock table holds, what is in use now, and which server it is (databases on one server share it).
BUDGET_SQL = (
    "SELECT current_setting('max_locks_per_transaction')::int"
    " * (current_setting('max_connections')::int + current_setting('max_prepared_transactions')::int),"
    " (SELECT count(*) FROM pg_catalog.pg_locks WHERE NOT fastpath),"
    " extract(epoch FROM pg_catalog.pg_postmaster_start_time())::text || ':' || current_setting('port')"
)
#: Locks this session holds in the shared lock table (fast-path locks take none).
HELD_SQL = "SELECT count(*) FROM pg_catalog.pg_locks WHERE pid = pg_catalog.pg_backend_pid() AND NOT fastpath"


class _Counter(Visitor):
    def __init__(self) -> None:
        self.n = 0

    def visit_CreateStmt(self, ancestors: Any, node: Any) -> None:
        self.n += 3  # the table, its TOAST table and the TOAST table's index

    def visit_IndexStmt(self, ancestors: Any, node: Any) -> None:
        self.n += 2

    def visit_AlterTableCmd(self, ancestors: Any, node: Any) -> None:
        self.n += 2  # a rewrite locks a new heap and TOAST table

    def visit_CreateSeqStmt(self, ancestors: Any, node: Any) -> None:
        self.n += 1

    def visit_ViewStmt(self, ancestors: Any, node: Any) -> None:
        self.n += 2

    def visit_Constraint(self, ancestors: Any, node: Any) -> None:
        if node.contype in _INDEXED:
            self.n += 2  # its index (or the referenced table) and the constraint object
        elif node.contype in (ConstrType.CONSTR_CHECK, ConstrType.CONSTR_IDENTITY):
            self.n += 1 if node.contype == ConstrType.CONSTR_CHECK else 2

    def visit_ColumnDef(self, ancestors: Any, node: Any) -> None:
        names = [getattr(n, "sval", "") for n in (node.typeName.names or ())] if node.typeName is not None else []
        if names and names[-1].lower() in _SERIAL:
            self.n += 2  # its sequence, and the sequence's dependency

    def visit_RangeVar(self, ancestors: Any, node: Any) -> None:
        self.n += 1

    def visit_FuncCall(self, ancestors: Any, node: Any) -> None:
        self.n += 1  # a default's function (next_id()) is locked as an object


@lru_cache(maxsize=64)
def _file_estimate(source: str) -> int:
    total = 0
    for raw in parse_sql(source):
        counter = _Counter()
        if raw.stmt is not None:
            counter(raw.stmt)
        total += 1 + counter.n
    return total


def estimate_locks(files: Iterable[FileVersion]) -> int:
    """Locks one shard holds until commit after running these files (an upper estimate from their statements)."""
    return PER_SHARD + sum(_file_estimate(f.template) for f in files)  # the template: a schema dump's source is not all SQL


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

    @property
    def transactions(self) -> int:
        return max(1, -(-self.shards // self.per_tx)) if self.shards else 0

    @property
    def chunked(self) -> bool:
        return self.transactions > 1 or self.chosen

    def describe(self, name: str) -> str:
        if self.chosen:
            return f"{name}: {self.shards} shards in {self.transactions} transactions of up to {self.per_tx} (--commit-every)"
        if not self.chunked:
            return f"{name}: {self.shards} shards in one transaction (~{self.locks_per_shard} locks per shard, the lock table holds {self.capacity})"
        return (f"{name}: {self.shards} shards in {self.transactions} transactions of up to {self.per_tx}: ~{self.locks_per_shard} locks per shard"
                f" and the server's lock table holds {self.capacity} (max_locks_per_transaction x connections); each commits"
                " with its ledger rows, so an interrupted run resumes where it stopped")


    def refit(self, locks_per_shard: int) -> None:
        self.locks_per_shard = locks_per_shard
        self.per_tx = max(1, min(self.shards, self.room // max(1, locks_per_shard)))


def room(budget: LockBudget, sharing: int) -> int:
    """HEADROOM of the free lock table, split between the databases applying on this server at once."""
    return max(0, int(budget.capacity * HEADROOM) - budget.in_use) // max(1, sharing)


def size_all(work: Mapping[str, Mapping[int, Sequence[FileVersion]]], budgets: Mapping[str, LockBudget],
             commit_every: int | None) -> dict[str, Sizing]:
    """Each database's Sizing: --commit-every when given, otherwise what its server's lock table holds."""
    if commit_every:  # no lock table needed (--sql reads none)
        return {name: Sizing(len(shards), commit_every, chosen=True) for name, shards in work.items() if shards}
    out: dict[str, Sizing] = {}
    sharing: dict[str, int] = {}
    for name, shards in work.items():
        if shards:
            sharing[budgets[name].server] = sharing.get(budgets[name].server, 0) + 1
    for name, shards in work.items():
        if not shards:
            continue
        b = budgets[name]
        out[name] = sizing = Sizing(len(shards), len(shards), capacity=b.capacity, room=room(b, sharing[b.server]))
        sizing.refit(max(estimate_locks(files) for files in shards.values()))
    return out
