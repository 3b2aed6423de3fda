"""How many locks one shard of an apply-ddl takes, estimated from the statements of its files (pgidgen.locktable
turns that into transactions).

A table is itself, its TOAST table and the TOAST table's index; an index, a constraint, a serial column, a
default's function add theirs (2000 shards of two tables need ~40 000 locks, the default lock table holds 6400).
apply-ddl checks the estimate against what the first shard really took.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from functools import lru_cache
from typing import Any

from pglast import parse_sql
from pglast.enums import ConstrType
from pglast.visitors import Visitor

from ..locktable import LockBudget, Sizing, room, sharing
from .ledger import FileVersion

#: Locks a shard takes whatever its file says: its schema and its next_id() (object locks).
PER_SHARD = 2
_SERIAL = {"serial", "serial2", "serial4", "serial8", "smallserial", "bigserial"}
_INDEXED = {ConstrType.CONSTR_PRIMARY, ConstrType.CONSTR_UNIQUE, ConstrType.CONSTR_EXCLUSION, ConstrType.CONSTR_FOREIGN}


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


def size_all(work: Mapping[str, Mapping[int, Sequence[FileVersion]]], budgets: Mapping[str, LockBudget],
             commit_every: int | None) -> dict[str, Sizing]:
    """Each database's Sizing: --commit-every when given, otherwise what its server's lock table holds."""
    if commit_every:  # no lock table needed (--sql reads none)
        return {name: Sizing(len(shards), commit_every, chosen=True) for name, shards in work.items() if shards}
    out: dict[str, Sizing] = {}
    shared = sharing({name: budgets[name] for name, shards in work.items() if shards})
    for name, shards in work.items():
        if not shards:
            continue
        b = budgets[name]
        out[name] = sizing = Sizing(len(shards), len(shards), capacity=b.capacity, room=room(b, shared[name]))
        sizing.refit(max(estimate_locks(files) for files in shards.values()))
    return out
