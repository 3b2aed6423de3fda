"""A fan-out's result (fanout.py): the rows of every chunk of shards, merged as they are read.

Each chunk's rows stay in the result libpq received (at most `limit` of them when a limit is given), and become
Python values only when the merge reaches them: with an order, heapq.merge of the chunks' sorted streams (each
sorted by its server), so the first rows come after one row of each chunk has been looked at, not all of them;
without one, the chunks one after the other. Combines (sum, min, max, grouped by the other columns) and their
order and limit are done on the rows every shard returned, which for an aggregate is one row (or one a group) a
shard."""
from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from psycopg.abc import Transformer
from psycopg.pq.abc import PGresult

from ..errors import DatabaseUnavailableError, InputError
from .fansql import Order

COMBINES = ("sum", "min", "max")
Combine = str | Sequence[str | None] | None


class Stream:
    """The rows one statement (a chunk of a database's shards) returned, loaded as they are iterated. transformer:
    psycopg's, made for this result while its connection was at hand (the loaders know its encoding)."""

    __slots__ = ("database", "shards", "result", "transformer", "columns")

    def __init__(self, database: str, shards: Sequence[int], result: PGresult, transformer: Transformer, encoding: str) -> None:
        self.database = database
        self.shards = list(shards)
        self.result = result
        self.transformer = transformer
        transformer.set_pgresult(result)
        self.columns = [(result.fname(i) or b"").decode(encoding) for i in range(result.nfields)]

    def types(self) -> list[str]:
        """The columns' PostgreSQL types, by name (the OID where psycopg does not know it)."""
        known = self.transformer.adapters.types
        return [getattr(known.get(oid), "name", str(oid)) for oid in (self.result.ftype(i) for i in range(self.result.nfields))]

    def __iter__(self) -> Iterator[tuple[Any, ...]]:
        load = self.transformer.load_row
        for i in range(self.result.ntuples):
            yield load(i, tuple)


class _Desc:
    """A key that sorts the other way (for a descending key among ascending ones)."""

    __slots__ = ("key",)

    def __init__(self, key: Any) -> None:
        self.key = key

    def __lt__(self, other: _Desc) -> bool:
        return bool(other.key < self.key)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Desc) and bool(self.key == other.key)

    __hash__ = None  # type: ignore[assignment]


def sort_key(columns: Sequence[str], order: Sequence[Order]) -> tuple[Callable[[tuple[Any, ...]], Any], bool]:
    """A key for rows of these columns sorted as PostgreSQL sorts them by order (NULLS last ascending, first
    descending), and whether to reverse: (key, reverse) for sorted() and heapq.merge."""
    positions = []
    for o in order:
        if o.column not in columns:
            raise InputError(f"order_by names {o.column!r}, which the statement does not return",
                             hint=f"order by one of its columns: {', '.join(columns)}")
        positions.append(columns.index(o.column))
    directions = {o.descending for o in order}
    if len(directions) == 1:  # all one way: a plain key, reversed for descending
        if len(positions) == 1:
            (i,) = positions

            def one(row: tuple[Any, ...]) -> Any:
                v = row[i]
                return (v is None, v)
            return one, directions == {True}
        return (lambda row: tuple((row[i] is None, row[i]) for i in positions)), directions == {True}
    pairs = list(zip(positions, (o.descending for o in order), strict=True))
    return (lambda row: tuple(_Desc((row[i] is None, row[i])) if desc else (row[i] is None, row[i]) for i, desc in pairs)), False


#: the types whose values sum adds up (as PostgreSQL's sum does)
SUMMABLE = frozenset({"int2", "int4", "int8", "numeric", "float4", "float8", "money", "interval"})


def parse_combine(combine: Combine, columns: Sequence[str], types: Sequence[str] | None = None) -> list[str | None] | None:
    """combine as given: one of COMBINES for every column, or one for each column (None: a column to group by);
    types, the columns' (fanmerge.Stream.types): sum only what adds up."""
    if combine is None:
        return None
    ops: list[str | None] = [combine] * len(columns) if isinstance(combine, str) else list(combine)
    if len(ops) != len(columns):
        raise InputError(f"combine names {len(ops)} operations for {len(columns)} columns ({', '.join(columns)})",
                         hint="give one for each column: sum, min, max, or None (on the command line: group) for a column to group by")
    for op in ops:
        if op is not None and op not in COMBINES:
            raise InputError(f"combine {op!r} is not one of {', '.join(COMBINES)}",
                             hint="counts add up with sum; for an average, return a sum and a count, and divide")
    for op, column, kind in zip(ops, columns, types or (), strict=False):
        if op == "sum" and kind not in SUMMABLE:
            raise InputError(f"combine 'sum' cannot add up {column}: its values are not numbers ({kind})",
                             hint="combine numbers, and group by the others (group)")
    return ops


def combined(rows: Iterator[tuple[Any, ...]], ops: Sequence[str | None]) -> list[tuple[Any, ...]]:
    """The rows of every shard combined: grouped by the columns whose op is None (in the order groups are first
    seen), each other column summed, or its min or max taken, NULLs left out as SQL's aggregates leave them."""
    keys = [i for i, op in enumerate(ops) if op is None]
    folds = [(i, op) for i, op in enumerate(ops) if op is not None]
    groups: dict[tuple[Any, ...], list[Any]] = {}
    for row in rows:
        key = tuple(row[i] for i in keys)
        acc = groups.get(key)
        if acc is None:
            groups[key] = list(row)
            continue
        for i, op in folds:
            v = row[i]
            if v is None:
                continue
            a = acc[i]
            if a is None:
                acc[i] = v
            elif op == "sum":
                acc[i] = a + v
            elif op == "min":
                acc[i] = v if v < a else a
            else:
                acc[i] = v if v > a else a
    return [tuple(acc) for acc in groups.values()]


class FanOutResult:
    """What Router.fan_out returns: iterate it for the rows (tuples; merged in order when an order was given, at
    most limit of them), as often as needed.

    columns: the statement's column names (with_shard: "shard" first); shards: the shards read; missing: with
    partial=True, a DatabaseUnavailableError for each database that could not be read (.database, .shards),
    else always empty."""

    def __init__(self, streams: Sequence[Stream], columns: list[str], shards: Sequence[int], *, order: Sequence[Order] = (),
                 limit: int | None = None, combine: list[str | None] | None = None,
                 missing: Sequence[DatabaseUnavailableError] = ()) -> None:
        self.streams = list(streams)
        self.columns = columns
        self.shards = sorted(shards)
        self.missing = list(missing)
        self.limit = limit
        self.order = tuple(order)
        self._combine = combine
        self._combined: list[tuple[Any, ...]] | None = None
        self._key = sort_key(columns, order) if order else None

    @property
    def complete(self) -> bool:
        """Whether every shard asked for was read (always, unless partial=True and a database did not answer)."""
        return not self.missing

    def __iter__(self) -> Iterator[tuple[Any, ...]]:
        if self._combine is not None:
            if self._combined is None:
                rows = combined(itertools.chain.from_iterable(self.streams), self._combine)
                if self._key is not None:
                    rows.sort(key=self._key[0], reverse=self._key[1])
                self._combined = rows
            it: Iterator[tuple[Any, ...]] = iter(self._combined)
        elif self._key is not None and len(self.streams) > 1:
            it = heapq.merge(*self.streams, key=self._key[0], reverse=self._key[1])
        else:
            it = itertools.chain.from_iterable(self.streams)
        return itertools.islice(it, self.limit) if self.limit is not None else it

    def scalar(self) -> Any:
        """The first column of the first row (None without rows): a count's total, with combine="sum"."""
        for row in self:
            return row[0] if row else None
        return None

    def __repr__(self) -> str:
        more = f", missing {[e.database for e in self.missing]}" if self.missing else ""
        return f"<FanOutResult {len(self.shards)} shards in {len(self.streams)} streams, columns {self.columns}{more}>"


__all__ = ["COMBINES", "FanOutResult", "Stream", "combined", "parse_combine", "sort_key"]
