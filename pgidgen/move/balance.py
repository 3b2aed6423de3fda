"""The size-aware plan of `pgidgen rebalance --by size`: even out the bytes on disk, not the number of shards.

A shard weighs its tables and indexes on disk (sizes.py) plus FLOOR, so empty shards still spread. Greedy, one
move at a time, from the heaviest database to the lightest one it may give to, among the shards lighter than the
difference between them (moving one makes the pair more even, never less): while every such shard is small
beside the difference (under a quarter of it), the highest-numbered one no heavier than half of it, so what stays
keeps its contiguous ranges and equal shards move as the count plan moves them; otherwise the shard whose
weight is closest to half the difference (it closes the gap most: a hot shard moves alone rather than a crowd of
small ones). Each shard moves at most once per plan; pinned shards (mid-move) stay; a shard never goes
to a database that still holds its retired copy. It stops when every pair is within TOLERANCE of the average load
or no move would narrow a gap.
"""
from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Sequence

#: What a shard weighs beyond its bytes: an empty shard (no tables yet) still counts.
FLOOR = 8192
#: Loads within this share of the average database's are even enough: no moves for the last few kilobytes.
TOLERANCE = 0.01


def _closest(items: list[tuple[int, int]], gap: int, skip: set[int]) -> tuple[int, int] | None:
    """The (weight, shard) of items (sorted) lighter than gap whose weight is closest to gap / 2, the highest shard
    among equals, skipping shards in skip. Found by bisection: shards of equal weight (empty or small ones, a page
    each) are most of a fleet, and a pass over them per move made a plan of 8192 shards quadratic."""
    i = bisect_right(items, (gap // 2, 1 << 62))
    below = next((items[j] for j in range(i - 1, -1, -1) if items[j][1] not in skip), None)
    above = None
    first = next((j for j in range(i, len(items)) if items[j][0] >= gap or items[j][1] not in skip), None)
    if first is not None and items[first][0] < gap:
        end = bisect_left(items, (items[first][0] + 1, -(1 << 62)))  # past the last of that weight
        above = next(items[j] for j in range(end - 1, first - 1, -1) if items[j][1] not in skip)
    if below is None or (above is not None and 2 * above[0] - gap < gap - 2 * below[0]):
        return above
    return below


def _pick(items: list[tuple[int, int]], by_number: list[int], weight: dict[int, int], gap: int, skip: set[int]) -> tuple[int, int] | None:
    best = _closest(items, gap, skip)
    if best is None or 4 * best[0] >= gap:
        return best
    s = next((s for s in reversed(by_number) if 2 * weight[s] <= gap and s not in skip), None)
    return best if s is None else (weight[s], s)


def spread_bytes(
    names: Sequence[str], held: dict[str, list[int]], sizes: dict[int, int], *, fixed: set[int], retired: dict[str, set[int]],
) -> tuple[list[tuple[int, str, str]], dict[int, str]]:
    """(moves as (shard, source, target), blocked: shards whose retired copy on the lightest database kept them from
    narrowing the widest gap)."""
    names = list(names)
    weight = {s: sizes.get(s, 0) + FLOOR for shards in held.values() for s in shards}
    load = {n: sum(weight[s] for s in held[n]) for n in names}
    movable = {n: sorted((weight[s], s) for s in held[n] if s not in fixed) for n in names}
    by_number = {n: sorted(s for s in held[n] if s not in fixed) for n in names}  # _pick takes the highest first
    tol = max(FLOOR, int(sum(load.values()) / max(1, len(names)) * TOLERANCE))
    moves: list[tuple[int, str, str]] = []
    while True:
        taken = None
        for d in sorted(names, key=lambda n: (-load[n], names.index(n))):
            for r in sorted(names, key=lambda n: (load[n], names.index(n))):
                gap = load[d] - load[r]
                if gap <= tol:
                    break
                pick = _pick(movable[d], by_number[d], weight, gap, retired.get(r, set()))
                if pick is not None:
                    taken = (pick, d, r)
                    break
            if taken:
                break
        if taken is None:
            break
        (w, s), d, r = taken
        del movable[d][bisect_left(movable[d], (w, s))]  # sorted lists: list.remove's pass made the plan quadratic
        del by_number[d][bisect_left(by_number[d], s)]
        load[d] -= w
        load[r] += w
        moves.append((s, d, r))
    blocked: dict[int, str] = {}
    lightest = min(names, key=lambda n: (load[n], names.index(n)))
    for d in names:
        gap = load[d] - load[lightest]
        if gap > tol:
            blocked.update({s: lightest for w, s in movable[d] if w < gap and s in retired.get(lightest, set())})
    return moves, blocked
