"""Shard numbers as collapsed ranges: [0, 1, 2, 5] <-> "0-2,5"."""
from __future__ import annotations

from collections.abc import Iterable, Sequence

from .errors import InputError


def collapse(shards: Iterable[int]) -> str:
    items = sorted(set(shards))
    parts: list[str] = []
    i = 0
    while i < len(items):
        j = i
        while j + 1 < len(items) and items[j + 1] == items[j] + 1:
            j += 1
        parts.append(str(items[i]) if i == j else f"{items[i]}-{items[j]}")
        i = j + 1
    return ",".join(parts)


#: more shards than a set can name: the list is built before any database is asked which shards exist, and
#: `0-9999999999` (a typo) would fill memory first
MAX_SHARDS = 1 << 20


def expand(text: str) -> list[int]:
    out: list[int] = []
    parts = [part.strip() for part in text.split(",")]
    if any(parts) and not all(parts):  # '1,,2' or '1,2,': a number left out (an empty shell variable, a typo)
        raise InputError(f"{text!r} has an empty item between its commas", hint="write shards like 0-99,120, a number or range between each two commas")
    for part in parts:
        if not part:
            continue
        lo, dash, hi = part.partition("-")
        if not lo.isdecimal() or (dash and not hi.isdecimal()):
            raise InputError(f"{part!r} is not a shard number or range", hint="write shards like 0-99,120")
        a, b = int(lo), int(hi) if hi else int(lo)
        if b < a:
            raise InputError(f"range {part} runs backwards", hint="write the smaller number first")
        if b - a + 1 + len(out) > MAX_SHARDS:
            raise InputError(f"{text!r} names more than {MAX_SHARDS} shards", hint="name the shards that exist: see 'pgidgen map'")
        out.extend(range(a, b + 1))
    return out


def spread(shard_count: int, databases: Sequence[str]) -> dict[str, list[int]]:
    """Even contiguous ranges: shard i goes to databases[i * len // count] (init's layout; apply-ddl --sql renders
    for it)."""
    n = len(databases)
    out: dict[str, list[int]] = {name: [] for name in databases}
    for shard in range(shard_count):
        out[databases[shard * n // shard_count]].append(shard)
    return out
