"""The shard map: which database holds which shards, read from every database's catalog, and what is wrong."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .catalog import CatalogState, no_catalog_hint, read_state, uncatalogued
from .config import Config, describe_dsn
from .db import read_each
from .idgen import schema_name
from .ranges import collapse
from .sizes import ShardSize, read_sizes


@dataclass
class ShardMap:
    shard_count: int | None
    databases: dict[str, list[int]] = field(default_factory=dict)  # active shards per database
    retired: dict[str, list[int]] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    unreachable: dict[str, str] = field(default_factory=dict)
    #: shards in the middle of a move (running, or interrupted: its replication slot holds WAL on the source)
    moving: dict[int, dict[str, str | None]] = field(default_factory=dict)
    #: bytes on disk per database: of its active shards, and of its retired copies
    bytes: dict[str, int] = field(default_factory=dict)
    retired_bytes: dict[str, int] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.problems and not self.unreachable

    def lost(self) -> list[int]:
        """Shards no reachable database holds, once the shard count is known and every database answered."""
        if self.shard_count is None or self.unreachable:
            return []
        return sorted(set(range(self.shard_count)) - {s for shards in self.databases.values() for s in shards})

    def owner(self) -> dict[int, str]:
        return {s: name for name, shards in self.databases.items() for s in shards}

    def as_dict(self) -> dict[str, Any]:
        return {
            "shard_count": self.shard_count,
            "databases": {name: {"shards": collapse(s), "count": len(s), "bytes": self.bytes.get(name)} for name, s in self.databases.items()},
            "retired": {name: collapse(s) for name, s in self.retired.items() if s},
            "retired_copies": {name: {"count": len(s), "bytes": self.retired_bytes.get(name)} for name, s in self.retired.items() if s},
            "unreachable": self.unreachable,
            "problems": self.problems,
            "moving": [{"shard": sh, **ends} for sh, ends in sorted(self.moving.items())],
            "ok": self.ok,
        }


def read_map(config: Config) -> ShardMap:
    names = config.select(None)

    both, unreachable = read_each(config, names, _read_with_sizes, need=())
    states = {n: st for n, (st, _) in both.items()}
    m = build_map(states, unreachable)
    for name in uncatalogued(states) if m.lost() else ():  # with every shard held, a database without one is a new one
        m.problems.append(f"no pgidgen catalog in {name} ({describe_dsn(config.dsn(name))}): {no_catalog_hint(name, m.shard_count)}")
    add_sizes(m, {n: sizes for n, (_, sizes) in both.items()})
    installed = {st.layout for st in states.values() if st.layout is not None}
    if len(installed) == 1 and config.layout not in installed:
        (theirs,) = installed
        m.problems.append(
            f"the config's layout ({_describe(config.layout)}) is not the one installed ({_describe(theirs)}): decode and locate"
            f" would read IDs wrongly; set [layout] in {config.path or 'the config'} to the installed one"
        )
    return m


def _read_with_sizes(conn: Any) -> tuple[CatalogState, dict[int, ShardSize]]:
    st = read_state(conn)
    return st, (read_sizes(conn) if st.has_catalog else {})


def add_sizes(m: ShardMap, sizes: dict[str, dict[int, ShardSize]]) -> None:
    for name, per_shard in sizes.items():
        m.bytes[name] = sum(z.bytes for z in per_shard.values() if z.state in ("active", "moving"))
        m.retired_bytes[name] = sum(z.bytes for z in per_shard.values() if z.state == "retired")


def _describe(layout: Any) -> str:
    from .layout import iso_ms

    return f"epoch {iso_ms(layout.epoch_ms)}, {layout.time_bits}/{layout.shard_bits}/{layout.sequence_bits} bits"


def build_map(states: dict[str, CatalogState], unreachable: dict[str, str] | None = None) -> ShardMap:
    counts = {st.shard_count for st in states.values() if st.shard_count is not None}
    layouts = {st.layout for st in states.values() if st.layout is not None}
    m = ShardMap(shard_count=max(counts) if counts else None, unreachable=dict(unreachable or {}))
    if len(counts) > 1:
        m.problems.append(f"databases disagree on the shard count: {', '.join(str(c) for c in sorted(counts))}")
    if len(layouts) > 1:
        m.problems.append("databases disagree on the ID layout")
    seen: dict[str, str] = {}
    for name, st in states.items():
        if st.identity and st.identity in seen:
            m.problems.append(f"{seen[st.identity]} and {name} are the same database (two config names for one): remove one from the config")
        seen.setdefault(st.identity, name)
    holders: dict[int, list[str]] = {}
    for name, st in states.items():
        if st.foreign_catalog:
            m.problems.append(f"{name}: schema pgidgen exists but was not created by pgidgen")
        active = sorted(st.active)
        m.databases[name] = active
        m.retired[name] = sorted(s for s, state in st.shards.items() if state == "retired")
        for s in active:
            holders.setdefault(s, []).append(name)
            if s not in st.shard_schemas:
                m.problems.append(f"{name}: shard {s} is in the catalog but schema {schema_name(s)} is missing")
            elif s not in st.complete:
                m.problems.append(f"{name}: schema {schema_name(s)} is missing its next_id() function or a generator sequence")
            if s in st.cached:
                m.problems.append(
                    f"{name}: a generator sequence of {schema_name(s)} has CACHE > 1, so next_id() could repeat IDs: "
                    f"ALTER SEQUENCE {schema_name(s)}.pgidgen_counter CACHE 1 (and pgidgen_offset)"
                )
        count = st.shard_count if st.shard_count is not None else m.shard_count
        beyond = [s for s in active if count is not None and s >= count]  # a row added by hand: no key or ID routes to it
        if beyond and count is not None:
            many = len(beyond) > 1
            m.problems.append(
                f"{name}: shard{'s' if many else ''} {collapse(beyond)} {'are' if many else 'is'} active in the catalog but the"
                f" shard count is {count} (shards 0-{count - 1}), so nothing routes to {'them' if many else 'it'}: delete"
                f" {'their rows' if many else 'its row'} from pgidgen.shards (and the schema{'s' if many else ''}, once any data is saved)"
            )
        stray = sorted(st.shard_schemas - set(st.shards))
        if stray:
            m.problems.append(f"{name}: schemas named like shards but not in pgidgen's catalog: {_names(stray)}")
    for name, st in states.items():
        for s, state in st.shards.items():
            if state in ("moving", "incoming"):
                m.moving.setdefault(s, {"from": None, "to": None})["from" if state == "moving" else "to"] = name
        for s, (source, target, _step) in st.open_moves.items():  # the journal knows both ends, also before the states change
            m.moving[s] = {"from": source, "to": target}
    twice: dict[tuple[str, ...], list[int]] = {}  # one line per set of databases, its shards as ranges
    for s, dbs in sorted(holders.items()):
        if len(dbs) > 1:
            twice.setdefault(tuple(dbs), []).append(s)
    for both, shards in twice.items():
        m.problems.append(f"shard{'s' if len(shards) > 1 else ''} {collapse(shards)} {'are' if len(shards) > 1 else 'is'} active in more than one database: {', '.join(both)}")
    if m.shard_count is None and states and not m.unreachable and not any(st.foreign_catalog for st in states.values()):
        m.problems.append("no database is initialised: run 'pgidgen init --shards N'")
    missing = m.lost()
    if missing:
        m.problems.append(f"shards in no database: {collapse(missing)}")
    return m


def _names(shards: list[int]) -> str:
    shown = ", ".join(schema_name(s) for s in shards[:5])
    return shown + (f" and {len(shards) - 5} more" if len(shards) > 5 else "")
