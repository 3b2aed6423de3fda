"""After a move: re-verify against the kept source copy, and drop that copy once the DBA is satisfied."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import psycopg

from ..config import Config
from ..db import connect
from ..errors import ConflictError
from . import depsql as dq
from . import sqltext as q
from .context import MoveError, describe_dependents, outside_dependents, read_states
from .journal import MEMBER_SQL, MoveRecord, has_journal, open_move, record_from_row, retired_names
from .verify import Verification, compare


@dataclass
class CleanupReport:
    shard: int
    dropped: list[str] = field(default_factory=list)  # "db1.shard_5_moved_..."

    #: nothing to find wrong: a copy that must stay is refused with an error before anything is dropped
    ok = True

    def lines(self) -> list[str]:
        return [f"dropped {', '.join(self.dropped)}"]

    def as_dict(self) -> dict[str, Any]:
        return {"shard": self.shard, "dropped": self.dropped}


def cleanup(config: Config, shard: int, *, only: tuple[str, str] | None = None) -> CleanupReport:
    """Drop the retired (renamed, read-only) copies of shard, but never the only copy, never mid-move, and never
    objects outside the copy that depend on it. only=(database, schema): that copy alone (--drop-source: the
    move's own; older copies, perhaps kept for repair, stay)."""
    states, down = read_states(config)
    retired = [name for name, st in states.items() if st.shards.get(shard) == "retired" and (only is None or name == only[0])]
    active = [name for name, st in states.items() if st.shards.get(shard) == "active"]
    if not retired and down:
        raise MoveError(f"no database pgidgen could read keeps a retired copy of shard {shard}", where=", ".join(sorted(down)),
                        hint=f"{'; '.join(down[n] for n in sorted(down))}")
    if not retired:
        raise MoveError(f"no database keeps a retired copy of shard {shard}", hint="nothing to clean up; see 'pgidgen map'")
    if not active:
        raise ConflictError(
            f"shard {shard} is active in no reachable database, so its retired copy may be the only one",
            where=", ".join(down) or None, hint="check 'pgidgen map'; pgidgen will not drop it",
        )
    report = CleanupReport(shard)
    for name in retired:
        conn = connect(name, config.dsn(name), autocommit=True)
        try:
            rec = open_move(conn, shard)
            if rec is not None:
                raise MoveError(f"a move of shard {shard} is not finished (move {rec.move_id}, step {rec.step})", where=name,
                                hint=f"resume or roll it back first: 'pgidgen move-shard --resume {shard}'")
            schema = drop_copy(conn, name, shard, only=None if only is None else only[1])
            if schema is not None:
                report.dropped.append(f"{name}.{schema}")
        finally:
            conn.close()
    return report


#: A retired copy's schema and its objects (RETIRED_OBJECTS_SQL): (schema, catalogs, oids).
CopyObjects = tuple[str, list[int], list[int]]


def retired_objects(conn: psycopg.Connection[Any]) -> dict[int, CopyObjects]:
    """The objects of every retired copy of this database, by shard, in one pass over the catalogs."""
    out: dict[int, CopyObjects] = {}
    for shard, schema, classid, oid in conn.execute(dq.RETIRED_OBJECTS_SQL):
        _, classes, oids = out.setdefault(int(shard), (str(schema), [], []))
        classes.append(int(classid))
        oids.append(int(oid))
    return out


def drop_copy(conn: psycopg.Connection[Any], name: str, shard: int, *, only: str | None = None, objects: CopyObjects | None = None) -> str | None:
    """Drop this database's retired copy of shard (only: if it is that schema) in one transaction; its schema name,
    or None when there is none. Refuses, naming them, when objects outside the copy depend on it. objects: the
    copy's, read beforehand for many copies at once (retired_objects), so that the check of what depends on it
    looks only in pg_depend's index; read here when not given or not of this schema."""
    with conn.transaction():
        row = conn.execute("SELECT schema_name FROM pgidgen.shards WHERE shard = %s AND state = 'retired' FOR UPDATE", (shard,)).fetchone()
        if row is None or (only is not None and row[0] != only):
            return None
        if objects is not None and objects[0] == row[0]:
            found = [str(r[0]) for r in conn.execute(dq.OUTSIDE_DEPENDENTS_OF_SQL, {"schema": row[0], "classes": objects[1], "oids": objects[2]})]
        else:
            found = outside_dependents(conn, row[0])
        if found:
            raise MoveError(f"objects outside {name}.{row[0]} depend on it: {describe_dependents(found)}",
                            hint="dropping the copy would drop them too: drop them or make them independent of it first, then clean up again")
        conn.execute(f"DROP SCHEMA IF EXISTS {q.ident(row[0])} CASCADE")
        conn.execute("DELETE FROM pgidgen.shards WHERE shard = %s AND state = 'retired'", (shard,))
        if conn.execute("SELECT to_regclass('pgidgen.ddl_ledger') IS NOT NULL").fetchone()[0]:  # type: ignore[index]
            conn.execute("DELETE FROM pgidgen.ddl_ledger WHERE shard = %s", (shard,))
    return str(row[0])


def last_done_move(config: Config, shard: int) -> MoveRecord:
    states, _ = read_states(config)
    best: tuple[Any, MoveRecord] | None = None
    for name, st in states.items():
        if not st.has_catalog:
            continue
        conn = connect(name, config.dsn(name), autocommit=True)
        try:
            if not has_journal(conn):
                continue
            row = conn.execute(
                "SELECT finished_at, move_id, shard, source, target, mode, token, step, status, detail FROM pgidgen.moves"
                f" WHERE {MEMBER_SQL} AND status = 'done' ORDER BY finished_at DESC LIMIT 1", {"shard": shard}).fetchone()
        finally:
            conn.close()
        if row is not None and (best is None or row[0] > best[0]):
            best = (row[0], record_from_row(row[1:10]))
    if best is None:
        raise MoveError(f"shard {shard} has no finished move to verify", hint="--verify compares a moved shard with the copy it left behind")
    return best[1]


def verify_move(config: Config, shard: int) -> Verification:
    """Compare the shard now with the read-only source copy its last move left behind."""
    rec = last_done_move(config, shard)
    retired = retired_names(rec).get(shard)
    src = connect(rec.source, config.dsn(rec.source), autocommit=True)
    tgt = connect(rec.target, config.dsn(rec.target), autocommit=True)
    try:
        row = src.execute("SELECT schema_name FROM pgidgen.shards WHERE shard = %s AND state = 'retired'", (shard,)).fetchone()
        if row is None or row[0] != retired:
            raise MoveError(f"the source copy of shard {shard} ({rec.source}.{retired}) is gone", hint="it was dropped by --cleanup; nothing to compare with")
        assert retired is not None
        tables = [r[0] for r in src.execute(
            "SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = %s AND c.relkind = 'r' ORDER BY 1",
            (retired,))]
        return compare(src, retired, tgt, f"shard_{shard}", tables,
                       when=f"now against {rec.source}.{retired} (rows written on {rec.target} since the move show as differences)")
    finally:
        src.close()
        tgt.close()
