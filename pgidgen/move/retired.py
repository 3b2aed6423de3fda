"""`pgidgen cleanup`: drop every retired copy (what moves left on their sources) at once, or those older than an age.

The same rules as `move-shard --cleanup` for each copy — never the only copy (the shard must be active in a
reachable database), never while a move of the shard is unfinished, never objects outside the copy that depend
on it — read once for all databases; each copy is dropped in a transaction of its own (a DROP SCHEMA of a big
copy locks all its objects), so what is dropped stays dropped if the run stops. A copy that may not go is kept
and named, the others go on. What each copy holds is read in one pass over the catalogs before the first drop
(a retired copy does not change), so each drop's check of what depends on it is a look-up in pg_depend's index:
the cleanup is linear in the copies, where a pass per copy made it quadratic.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import psycopg

from ..config import Config
from ..db import connect, translate
from ..errors import PgidgenError
from ..sizes import human, read_sizes
from .cleanup import CopyObjects, drop_copy, retired_objects
from .context import read_states


@dataclass
class Copy:
    database: str
    shard: int
    bytes: int
    age_s: float
    schema: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {"database": self.database, "shard": self.shard, "schema": self.schema, "bytes": self.bytes, "age_s": round(self.age_s)}


@dataclass
class RetiredCleanup:
    dropped: list[Copy] = field(default_factory=list)
    kept: list[tuple[Copy, str]] = field(default_factory=list)  # a copy that may not go, and why
    younger: int = 0  # copies left because they are younger than --older-than
    unreachable: dict[str, str] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.kept and not self.unreachable

    def as_dict(self) -> dict[str, Any]:
        return {"dropped": [c.as_dict() for c in self.dropped], "bytes": sum(c.bytes for c in self.dropped),
                "kept": [{**c.as_dict(), "why": why} for c, why in self.kept], "younger": self.younger,
                "unreachable": self.unreachable, "ok": self.ok}

    def lines(self) -> list[str]:
        out = []
        by_db: dict[str, list[Copy]] = {}
        for c in self.dropped:
            by_db.setdefault(c.database, []).append(c)
        for name, copies in by_db.items():
            out.append(f"{name}: dropped {len(copies)} retired {'copy' if len(copies) == 1 else 'copies'}, {human(sum(c.bytes for c in copies))}")
        out += [f"{c.database}: kept the retired copy of shard {c.shard}: {why}" for c, why in self.kept]
        out += [f"{name}: UNREACHABLE: {err}" for name, err in self.unreachable.items()]
        if self.younger:
            out.append(f"left {self.younger} retired {'copy' if self.younger == 1 else 'copies'} younger than --older-than")
        if not self.dropped and not self.kept and not self.younger:
            out.append("nothing to do: no database keeps a retired copy")
        return out


def plan_retired(config: Config, databases: Sequence[str] | None = None, *, older_than: float | None = None) -> tuple[list[Copy], RetiredCleanup]:
    """The retired copies that may be dropped (oldest first), and a report holding those kept and why."""
    names = config.select(list(databases) if databases else None)
    states, down = read_states(config)
    report = RetiredCleanup(unreachable={n: e for n, e in down.items() if n in names})
    active = {s for st in states.values() for s in st.active}
    busy = {s for st in states.values() for s, state in st.shards.items() if state in ("moving", "incoming")}
    busy |= {s for st in states.values() for s in st.open_moves}
    todo: list[Copy] = []
    for name in names:
        st = states.get(name)
        if st is None or not any(v == "retired" for v in st.shards.values()):
            continue
        conn = connect(name, config.dsn(name), autocommit=True)
        try:
            sizes = read_sizes(conn)
        except psycopg.Error as e:
            raise translate(name, e, doing="reading the sizes of its retired copies") from None
        finally:
            conn.close()
        for z in sorted(sizes.values(), key=lambda z: -z.age_s):
            if z.state != "retired":
                continue
            c = Copy(name, z.shard, z.bytes, z.age_s)
            if older_than is not None and z.age_s < older_than:
                report.younger += 1
            elif z.shard in busy:
                report.kept.append((c, f"a move of shard {z.shard} is not finished: 'pgidgen move-shard {z.shard} --resume' or '--rollback' first"))
            elif z.shard not in active:
                where = f" (unreachable: {', '.join(sorted(down))})" if down else ""
                report.kept.append((c, f"shard {z.shard} is active in no reachable database{where}, so this copy may be the only one"))
            else:
                todo.append(c)
    return todo, report


def cleanup_retired(
    config: Config,
    databases: Sequence[str] | None = None,
    *,
    older_than: float | None = None,
    progress: Callable[[int], None] | None = None,
    on_plan: Callable[[list[Copy]], None] | None = None,
) -> RetiredCleanup:
    """Drop the retired copies of the named databases (default: all), only those retired more than older_than
    seconds ago when given; one transaction per copy."""
    todo, report = plan_retired(config, databases, older_than=older_than)
    if on_plan is not None:
        on_plan(todo)
    conns: dict[str, psycopg.Connection[Any]] = {}
    objects: dict[str, dict[int, CopyObjects]] = {}
    try:
        for c in todo:
            conn = conns.get(c.database)
            if conn is None:
                conn = conns[c.database] = connect(c.database, config.dsn(c.database), autocommit=True)
            try:
                if c.database not in objects:  # one pass over the catalogs for all its copies, not one per copy
                    objects[c.database] = retired_objects(conn)
                schema = drop_copy(conn, c.database, c.shard, objects=objects[c.database].get(c.shard))
            except PgidgenError as e:
                report.kept.append((c, e.what))
                continue
            except psycopg.Error as e:
                report.kept.append((c, translate(c.database, e, doing="dropping it").what))
                continue
            if schema is not None:
                c.schema = schema
                report.dropped.append(c)
            if progress is not None:
                progress(1)
    finally:
        for conn in conns.values():
            conn.close()
    return report
