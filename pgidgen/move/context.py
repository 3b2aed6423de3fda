"""Finding a shard and checking, before anything is written, that it can move to the target.

Every check here only reads; each failure is one line saying what is wrong and what to do.

What is checked where: here, before anything is written, what would make the copy or the apply fail halfway
(replica identity and its equality, triggers that fire on apply, roles, objects the shard uses outside its schema,
objects outside it that depend on it); right before the pause, the schema on both sides (ddl/drift.py's
SCHEMA_ITEMS_SQL, the items `status --drift` fingerprints) and outside dependents again; in the pause only what
is cheap (tables and columns, the publication's hold on them). pgidgen's own sessions turn statement and idle
timeouts off (db.connect, tool_args, the subscription's conninfo).
"""
from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import psycopg

from ..catalog import CatalogState, read_state
from ..config import Config
from ..db import connect, read_each
from ..errors import ConfigError, ConflictError, DatabaseError, InputError, PgidgenError
from ..idgen import schema_name
from ..layout import Layout
from ..ranges import collapse
from . import depsql as dq
from . import sqltext as q
from .identity import IDENTITY_COLUMNS_SQL, Change, Identity, Keys, for_move, keys_of, movable, unequal_columns
from .journal import POINT_OF_NO_RETURN, MoveRecord, lock_holder, open_move, open_moves

if TYPE_CHECKING:
    from ..check import Refusal


class MoveError(DatabaseError):
    """A move could not start, or stopped; the journal says where (resume or roll back)."""


@dataclass
class TableInfo:
    name: str
    persistence: str  # p permanent, u unlogged
    keys: Keys  # its replica identity and what could serve as one (see identity.py)
    est_rows: int
    bytes: int  # its rows' main fork and TOAST table (pg_table_size also opened each TOAST index and read four forks: twice the time)
    unequal: tuple[str, ...] = ()  # when FULL decides: columns whose type has no equality (json, point, ...)
    replica_triggers: tuple[str, ...] = ()  # user triggers ENABLE ALWAYS or ENABLE REPLICA: they fire in the apply worker

    @property
    def during(self) -> Identity | None:
        """The replica identity an online move gives it while it is published (None: its own works)."""
        return for_move(self.keys, self.unequal)


@dataclass
class ShardContext:
    """Where shard N is, where it goes, what it holds: everything a move plans from."""

    shard: int
    source: str
    target: str
    layout: Layout
    shard_count: int
    states: dict[str, CatalogState]
    tables: list[TableInfo] = field(default_factory=list)
    sequences: list[str] = field(default_factory=list)
    source_schema: str = ""

    @property
    def schema(self) -> str:
        return schema_name(self.shard)

    @property
    def target_state(self) -> CatalogState:
        return self.states[self.target]


def read_states(config: Config, *, need: tuple[str, ...] = (), shard: int | None = None) -> tuple[dict[str, CatalogState], dict[str, str]]:
    """Every configured database's catalog; those in need must be reachable, the others may be down. shard: of
    the shard schemas, only that one's (see catalog.read_state)."""
    return read_each(config, list(config.databases), functools.partial(read_state, shard=shard), need=need)


def check_shard_number(shard: int, states: dict[str, CatalogState]) -> tuple[Layout, int]:
    counts = {st.shard_count for st in states.values() if st.shard_count is not None}
    layouts = [st.layout for st in states.values() if st.layout is not None]
    if not counts or not layouts:
        raise ConfigError("no configured database holds a pgidgen catalog", hint="run 'pgidgen init --shards N' first")
    count = max(counts)
    if not 0 <= shard < count:
        raise InputError(f"shard {shard} does not exist", hint=f"shard numbers run from 0 to {count - 1}")
    return layouts[0], count


def find_holder(shard: int, states: dict[str, CatalogState], down: dict[str, str]) -> str:
    holders = [name for name, st in states.items() if st.shards.get(shard) in ("active", "moving")]
    if len(holders) > 1:
        raise ConflictError(f"shard {shard} is active in more than one database ({', '.join(holders)})", hint="fix the map first; see 'pgidgen map'")
    if not holders:
        if down:
            raise DatabaseError(
                f"shard {shard} is in no reachable database", where=", ".join(f"{n} unreachable" for n in down),
                hint="start the unreachable databases and try again",
            )
        raise ConflictError(f"shard {shard} is in no database", hint="see 'pgidgen map'")
    return holders[0]


def locate(config: Config, shard: int, target: str) -> ShardContext:
    """The source of shard and the checks that need only the catalogs: known names, not the same database,
    target free of the shard, same layout."""
    return locate_batch(config, [shard], target)[0]


def locate_batch(config: Config, shards: list[int], target: str) -> list[ShardContext]:
    """locate for a batch: one read of every catalog, every shard checked, all in one source database."""
    config.dsn(target)  # unknown database: ConfigError naming the configured ones
    # one shard: of the shard schemas, only its own (~100 ms per 2000 otherwise); a batch reads them all once
    states, down = read_states(config, need=(target,), shard=shards[0] if len(shards) == 1 else None)
    layout, count = check_shard_number(shards[0], states)
    for shard in shards[1:]:
        check_shard_number(shard, states)
    for name, st in states.items():  # an unfinished move of these shards, wherever its journal is (the catalog read
        # lists them: a connection of its own only to say which, not ~10 ms on every move)
        mine = [s for s in shards if st.has_catalog and s in st.shards and s in st.open_moves]
        if mine:
            conn = connect(name, config.dsn(name), autocommit=True)
            try:
                check_no_other_moves(conn, name, mine)
            finally:
                conn.close()
    holders = {shard: find_holder(shard, states, down) for shard in shards}
    sources = sorted(set(holders.values()))
    if len(sources) > 1:
        raise ConflictError(
            "the shards of one move must be in one database: " + "; ".join(f"{', '.join(str(s) for s in shards if holders[s] == n)} in {n}" for n in sources),
            hint="move the shards of each database with a move-shard of their own",
        )
    source = sources[0]
    if source == target:
        held = [s for s in shards if holders[s] == target]
        raise ConflictError(f"shard{'s' if len(held) > 1 else ''} {', '.join(map(str, held))} {'are' if len(held) > 1 else 'is'} already in database {target}",
                            hint="name another database to move it to")
    tst = states[target]
    if tst.foreign_catalog:
        raise ConflictError(f"database {target} has a schema named pgidgen that pgidgen did not create", hint="rename or drop that schema")
    if tst.layout is not None and tst.layout != layout:
        raise ConflictError(f"database {target} was initialised with a different ID layout than {source}", hint="a shard can only move between databases of one layout")
    for shard in shards:
        _check_target_free(shard, target, tst)
    return [ShardContext(shard=shard, source=source, target=target, layout=layout, shard_count=count, states=states) for shard in shards]


def _check_target_free(shard: int, target: str, tst: CatalogState) -> None:
    held = tst.shards.get(shard)
    if held == "retired":
        raise ConflictError(
            f"database {target} still keeps the retired copy of shard {shard} from an earlier move",
            hint=f"drop it first with 'pgidgen move-shard --cleanup {shard}'",
        )
    if held == "incoming":
        raise ConflictError(
            f"database {target} holds an incomplete copy of shard {shard} from an interrupted move",
            hint=f"finish or undo that move: 'pgidgen move-shard --resume {shard}' or '--rollback {shard}'",
        )
    if held is not None:
        raise ConflictError(f"database {target} already holds shard {shard}", hint="see 'pgidgen map'")
    if shard in tst.shard_schemas:
        raise ConflictError(
            f"database {target} already has a schema {schema_name(shard)} that pgidgen did not create",
            hint="rename or drop it; pgidgen never overwrites a schema it does not own",
        )


def read_tables(conn: psycopg.Connection[Any], schema: str) -> tuple[list[TableInfo], list[str]]:
    return read_tables_of(conn, [schema])[schema]


def read_tables_of(conn: psycopg.Connection[Any], schemas: list[str]) -> dict[str, tuple[list[TableInfo], list[str]]]:
    """Each schema's tables (with what the checks need) and its own sequences: two queries for all of them."""
    out: dict[str, tuple[list[TableInfo], list[str]]] = {s: ([], []) for s in schemas}
    verdict: dict[str, bool] = {}  # unequal_columns' probes, per type
    for r in conn.execute(
            """
            SELECT n.nspname, c.relname, c.relpersistence, c.relreplident::text,""" + IDENTITY_COLUMNS_SQL + """,
                   CASE WHEN c.reltuples < 0 THEN -1 ELSE c.reltuples::bigint END,
                   pg_catalog.pg_relation_size(c.oid) + CASE WHEN c.reltoastrelid = 0 THEN 0 ELSE pg_catalog.pg_relation_size(c.reltoastrelid) END,
                   ARRAY(SELECT tg.tgname::text FROM pg_trigger tg WHERE tg.tgrelid = c.oid AND NOT tg.tgisinternal
                         AND tg.tgenabled IN ('A', 'R') ORDER BY tg.tgname)
            FROM """ + q.RELATIONS_OF + """
            WHERE n.nspname = ANY(%s) AND c.relkind = 'r'
            ORDER BY c.relname
            """,
            (schemas,),
    ).fetchall():
        schema = r[0]
        keys = keys_of(r[3], r[4], r[5], r[6])
        t = TableInfo(name=r[1], persistence=r[2], keys=keys, est_rows=int(r[7]), bytes=int(r[8]),
                      unequal=unequal_columns(conn, schema, r[1], verdict) if keys.full_decides else (), replica_triggers=tuple(r[9] or ()))
        if t.est_rows < 0:  # never analysed: count, so the progress bar has a total
            t.est_rows = int(conn.execute(f"SELECT count(*) FROM ONLY {_q(schema, t.name)}").fetchone()[0])  # type: ignore[index]
        out[schema][0].append(t)
    for schema, name in conn.execute(
        f"SELECT n.nspname, c.relname FROM {q.RELATIONS_OF}"
        " WHERE n.nspname = ANY(%s) AND c.relkind = 'S' AND c.relname NOT IN ('pgidgen_counter', 'pgidgen_offset') ORDER BY 1, 2",
        (schemas,),
    ):
        out[schema][1].append(name)
    return out


def _q(schema: str, name: str) -> str:
    from .sqltext import ident

    return ident(schema, name)


def identity_changes(ctx: ShardContext) -> list[Change]:
    """The shard's tables whose replica identity an online move sets for as long as it publishes them."""
    return [Change(t.name, t.keys.identity, during) for t in ctx.tables if t.persistence == "p" and (during := t.during) is not None]


def check_tables(ctx: ShardContext, *, online: bool) -> None:
    """What an online move cannot replicate: a table no replica identity would do for (no key, and a column
    without equality), triggers that would fire again on the target. (Unlogged tables are not replicated at all:
    the cutover copies their rows in the pause, steps/unlogged.py.)"""
    if not online:
        return
    for t in ctx.tables:
        if t.persistence != "p":
            continue
        if not movable(t.keys, t.unequal):
            hint = "give the table a primary key (or a unique index on NOT NULL columns), or move with --offline"
            if t.keys.identity.kind == "f":
                raise MoveError(f"table {ctx.schema}.{t.name} has REPLICA IDENTITY FULL and column {', '.join(t.unequal)} of a type without"
                                " equality, so the target could not find the rows that updates and deletes change", where=ctx.source, hint=hint)
            raise MoveError(f"table {ctx.schema}.{t.name} has no primary key or unique index on NOT NULL columns, and column {', '.join(t.unequal)}"
                            " of a type without equality, so the target could not find the rows that updates and deletes change", where=ctx.source, hint=hint)
        if t.replica_triggers:
            raise MoveError(
                f"table {ctx.schema}.{t.name} has trigger {', '.join(t.replica_triggers)} enabled ALWAYS or REPLICA: on the target's"
                " copy it would fire again for every replicated change",
                where=ctx.source,
                hint=f"ALTER TABLE {ctx.schema}.{t.name} ENABLE TRIGGER ... (fires on the source only) for the move, or move with --offline",
            )


def check_servers(ctx: ShardContext, src: psycopg.Connection[Any], tgt: psycopg.Connection[Any], *, conninfo: str | None = None,
                  custom: bool = False, probed: Callable[[], Refusal | None] | None = None) -> None:
    """What an online move needs of both servers and of the roles pgidgen uses on them: check_pair."""
    check_pair(ctx.source, ctx.target, src, tgt, conninfo=conninfo, custom=custom, probed=probed)


def check_pair(source: str, target: str, src: psycopg.Connection[Any], tgt: psycopg.Connection[Any], *, conninfo: str | None = None,
               custom: bool = False, probed: Callable[[], Refusal | None] | None = None) -> None:
    """pgidgen.check's findings that stop an online move from source to target (the same `pgidgen check` prints),
    the first as a MoveError with what to change; with conninfo (what the subscription will use), whether the
    target's server can log in to the source with it (custom: it is --subscription-dsn, not the config's DSN).
    probed: that login's probe (check.probe_subscription), started earlier by the caller; its result is asked for
    where the probe would run, so the first finding is the same either way."""
    from ..check import Facts, failures_for_move, probe_subscription, reach_finding, unasked_password

    source_facts, target_facts = Facts.read(src), Facts.read(tgt)
    for f in failures_for_move(source, source_facts, target, target_facts):
        raise MoveError(f.text, where=f.database, hint=f.fix)
    if conninfo is not None:
        reason = (None if custom else unasked_password(src, target_facts)) or (probed() if probed is not None else probe_subscription(tgt, conninfo))
        if reason is not None:
            f = reach_finding(target, source, reason, custom=custom)
            raise MoveError(f.text, where=f.database, hint=f.fix)


def preflight(config: Config, pairs: Iterable[tuple[str, str]], *, online: bool = True, conninfo: str | None = None,
              at_once: Iterable[tuple[str, str]] = ()) -> None:
    """The checks of check_servers (and the pg_dump check), once for every (source, target) pair of a rebalance,
    before any move is journaled: a problem that would fail every move of a pair stops them all up front.
    at_once: the (source, target) of each move that may run at the same time (--parallel): together they need a
    slot and two WAL senders each on their source, a worker and a replication origin each on their target."""
    from .. import pgbin
    from ..check import conninfo_for_subscription
    from ..versions import major

    pairs = sorted(set(pairs))
    conns: dict[str, psycopg.Connection[Any]] = {}
    try:
        for name in sorted({n for pair in pairs for n in pair}):
            conns[name] = connect(name, config.dsn(name), autocommit=True)
        for name in sorted({s for s, _ in pairs}):  # a pg_dump too old for a source fails every move from it
            try:
                pgbin.clients_for(major(conns[name]))
            except PgidgenError as e:
                raise MoveError(e.what, where=name, hint=e.hint) from None
        if online:
            for source, target in pairs:
                check_pair(source, target, conns[source], conns[target], custom=conninfo is not None,
                           conninfo=conninfo_for_subscription(conninfo or config.dsn(source), conns[source]))
            check_room(conns, list(at_once))
    finally:
        for c in conns.values():
            c.close()


def check_room(conns: dict[str, psycopg.Connection[Any]], at_once: list[tuple[str, str]]) -> None:
    """Room on each server for the moves that run at the same time (check_pair made sure of one each)."""
    from ..check import SENDERS_PER_MOVE, Facts

    if not at_once:
        return
    out: dict[str, int] = {}
    into: dict[str, int] = {}
    for source, target in at_once:
        out[source] = out.get(source, 0) + 1
        into[target] = into.get(target, 0) + 1
    for name, n in sorted(out.items()):
        f = Facts.read(conns[name])
        room = min(f.max_slots - f.slots, (f.max_senders - f.senders) // SENDERS_PER_MOVE)
        if room < n:
            raise MoveError(f"database {name} has room for {room} of the {n} moves out of it that --parallel runs at once"
                            f" ({f.max_slots - f.slots} free replication slots, {f.max_senders - f.senders} free WAL senders)",
                            hint=f"run with --parallel {max(1, room)}, or raise max_replication_slots and max_wal_senders (restart)")
    for name, n in sorted(into.items()):
        f = Facts.read(conns[name])
        room = min(f.max_workers - f.workers, f.max_origins - f.origins)
        if room < n:
            raise MoveError(f"database {name} has room for {room} of the {n} moves into it that --parallel runs at once"
                            f" ({f.max_workers - f.workers} free logical replication workers, {f.max_origins - f.origins} free"
                            " replication origins)",
                            hint=f"run with --parallel {max(1, room)}, or raise max_logical_replication_workers (and"
                                 " max_worker_processes; on 18 max_active_replication_origins) and restart")


#: Every role the shard's schema refers to: owners of the schema and its objects (relations, functions, types,
#: statistics, operators and their classes and families, collations, conversions, text search configurations and
#: dictionaries), grantees and grantors in their ACLs (columns' too) and in the schema's default privileges, roles
#: of row-level policies. pg_dump's output names them; a target without one of them
#: fails the restore halfway ("role ... does not exist"), after the slot and publication exist.
ROLES_OF_SCHEMA_SQL = """
WITH n AS (SELECT oid, nspowner, nspacl FROM pg_catalog.pg_namespace WHERE nspname = %(schema)s),
cls AS MATERIALIZED (  -- read once (sqltext.relations_of: pg_class has no index on the schema), not once per join
    """ + q.relations_of("n", "c.oid, c.relnamespace, c.relowner, c.relacl") + """),
objs (owner, acl) AS (
    SELECT nspowner, nspacl FROM n
    UNION ALL SELECT c.relowner, c.relacl FROM cls c
    UNION ALL SELECT p.proowner, p.proacl FROM pg_catalog.pg_proc p JOIN n ON p.pronamespace = n.oid
    UNION ALL SELECT t.typowner, t.typacl FROM pg_catalog.pg_type t JOIN n ON t.typnamespace = n.oid
    UNION ALL SELECT NULL, a.attacl FROM cls c JOIN pg_catalog.pg_attribute a ON a.attrelid = c.oid WHERE a.attacl IS NOT NULL
    UNION ALL SELECT d.defaclrole, d.defaclacl FROM pg_catalog.pg_default_acl d JOIN n ON d.defaclnamespace = n.oid
    UNION ALL SELECT x.stxowner, NULL FROM pg_catalog.pg_statistic_ext x JOIN n ON x.stxnamespace = n.oid
    UNION ALL SELECT o.oprowner, NULL FROM pg_catalog.pg_operator o JOIN n ON o.oprnamespace = n.oid
    UNION ALL SELECT o.opcowner, NULL FROM pg_catalog.pg_opclass o JOIN n ON o.opcnamespace = n.oid
    UNION ALL SELECT o.opfowner, NULL FROM pg_catalog.pg_opfamily o JOIN n ON o.opfnamespace = n.oid
    UNION ALL SELECT o.collowner, NULL FROM pg_catalog.pg_collation o JOIN n ON o.collnamespace = n.oid
    UNION ALL SELECT o.conowner, NULL FROM pg_catalog.pg_conversion o JOIN n ON o.connamespace = n.oid
    UNION ALL SELECT o.cfgowner, NULL FROM pg_catalog.pg_ts_config o JOIN n ON o.cfgnamespace = n.oid
    UNION ALL SELECT o.dictowner, NULL FROM pg_catalog.pg_ts_dict o JOIN n ON o.dictnamespace = n.oid
),
roles (r) AS (
    SELECT owner FROM objs WHERE owner IS NOT NULL
    UNION SELECT (pg_catalog.aclexplode(acl)).grantee FROM objs WHERE acl IS NOT NULL
    UNION SELECT (pg_catalog.aclexplode(acl)).grantor FROM objs WHERE acl IS NOT NULL
    UNION SELECT pg_catalog.unnest(pol.polroles) FROM cls c JOIN pg_catalog.pg_policy pol ON pol.polrelid = c.oid
)
SELECT pg_catalog.array_agg(DISTINCT rolname ORDER BY rolname) FROM roles JOIN pg_catalog.pg_roles ON pg_roles.oid = roles.r
"""


def check_roles(ctx: ShardContext, src: psycopg.Connection[Any], tgt: psycopg.Connection[Any]) -> None:
    """The roles the shard's objects are owned by or granted to exist on the target (roles are per server)."""
    missing = _missing_roles(src, tgt, ROLES_OF_SCHEMA_SQL, {"schema": ctx.schema})
    if missing:
        raise MoveError(
            f"{'roles' if len(missing) > 1 else 'role'} {', '.join(missing)} of {ctx.schema} (owner or grantee of its objects on {ctx.source})"
            f" {'do' if len(missing) > 1 else 'does'} not exist on {ctx.target}",
            hint=f"create {'them' if len(missing) > 1 else 'it'} on {ctx.target} (roles belong to the server, not the database), then move",
        )


#: The roles that own the schemas' objects (ROLES_OF_SCHEMA_SQL's owners, and the roles of default privileges):
#: pg_dump's output makes each of them an owner again (ALTER ... OWNER TO, ALTER DEFAULT PRIVILEGES FOR ROLE).
OWNERS_OF_SCHEMAS_SQL = ROLES_OF_SCHEMA_SQL.replace("nspname = %(schema)s", "nspname = ANY(%(schemas)s)").replace(
    "    UNION SELECT (pg_catalog.aclexplode(acl)).grantee FROM objs WHERE acl IS NOT NULL\n"
    "    UNION SELECT (pg_catalog.aclexplode(acl)).grantor FROM objs WHERE acl IS NOT NULL\n"
    "    UNION SELECT pg_catalog.unnest(pol.polroles) FROM cls c JOIN pg_catalog.pg_policy pol ON pol.polrelid = c.oid\n",
    "")
assert OWNERS_OF_SCHEMAS_SQL.count("UNION SELECT") == 0

#: Of the roles %s, those (existing on this server) the session's role cannot act as: it lacks their privileges
#: (USAGE: a member that inherits them) or, with a second privilege, that too (SET, 16+: needed to make a role an
#: owner; on 15 membership, which USAGE implies).
_CANNOT_ACT_AS_SQL = """
SELECT pg_catalog.array_agg(r ORDER BY r) FROM pg_catalog.unnest(%s::text[]) AS r
WHERE r IN (SELECT rolname FROM pg_catalog.pg_roles)
  AND NOT (pg_catalog.pg_has_role(r::name, 'USAGE') AND pg_catalog.pg_has_role(r::name, %s))
"""


def owners_out_of_reach(ctxs: list[ShardContext], src: psycopg.Connection[Any], conn: psycopg.Connection[Any], *, target: bool) -> list[str]:
    """The owners of the shards' objects (on the source) that conn's role (on the source, or the target) cannot
    act as: the move reads, locks and retires the objects on the source, and creates them owned by the same roles
    on the target. Either fails halfway otherwise (permission denied, "must be able to SET ROLE")."""
    owners = src.execute(OWNERS_OF_SCHEMAS_SQL, {"schemas": [c.schema for c in ctxs]}).fetchone()[0] or []  # type: ignore[index]
    second = "SET" if target and conn.info.server_version >= 160000 else "USAGE"
    return list(conn.execute(_CANNOT_ACT_AS_SQL, (list(owners), second)).fetchone()[0] or [])  # type: ignore[index]


def check_owners(ctxs: list[ShardContext], src: psycopg.Connection[Any], conn: psycopg.Connection[Any], *, target: bool) -> None:
    """A one-line refusal, before anything is written, when owners_out_of_reach finds any."""
    roles = owners_out_of_reach(ctxs, src, conn, target=target)
    if not roles:
        return
    ctx = ctxs[0]
    where, user = ctx.target if target else ctx.source, conn.info.user
    what = ctx.schema if len(ctxs) == 1 else f"shards {collapse([c.shard for c in ctxs])}"
    grant = f"GRANT {', '.join(q.ident(r) for r in roles)} TO {q.ident(user)}"
    if target:
        raise MoveError(f"role {user} cannot create the objects of {what} owned by {', '.join(roles)}, as they are on {ctx.source}"
                        f" (it is not a member of {'them' if len(roles) > 1 else 'it'} with SET and INHERIT)",
                        where=where, hint=f"{grant} on {where}'s server (or move as a role that is), then move")
    raise MoveError(f"role {user} cannot read and lock the objects of {what} owned by {', '.join(roles)}"
                    f" (it is not a member of {'them' if len(roles) > 1 else 'it'} with INHERIT)",
                    where=where, hint=f"{grant} on {where}'s server (or move as a role that is), then move")


def outside_dependents(conn: psycopg.Connection[Any], schema: str, *, prepare: bool | None = None) -> list[str]:
    return [str(r[0]) for r in conn.execute(dq.OUTSIDE_DEPENDENTS_SQL, {"schema": schema}, prepare=prepare)]


def describe_dependents(found: list[str]) -> str:
    return "; ".join(found[:3]) + (f" and {len(found) - 3} more" if len(found) > 3 else "")


def check_outside_dependents(ctx: ShardContext, src: psycopg.Connection[Any]) -> None:
    """Objects outside the shard's schema bound to it cannot move with it: after the flip they would stay on the
    source, bound to the retired copy (a default drawing from its generator, a view reading its frozen rows)."""
    found = outside_dependents(src, ctx.schema)
    if found:
        raise MoveError(
            f"objects outside {ctx.schema} on {ctx.source} depend on it and cannot move with it: {describe_dependents(found)}",
            hint="drop them or make them independent of the shard first (a shard's objects belong in its schema)",
        )


def check_external_references(ctx: ShardContext, src: psycopg.Connection[Any], tgt: psycopg.Connection[Any]) -> None:
    """What the shard's objects use outside its schema (a table its foreign key references, a type, a function)
    exists on the target too: otherwise the copy fails halfway, with the source's replication slot in place."""
    _refuse_missing([ctx], _missing_references(src, tgt, dq.EXTERNAL_REFERENCES_SQL, {"schema": ctx.schema}), tgt)


def _refuse_missing(ctxs: list[ShardContext], missing: list[tuple[str, str | None, str | None]], tgt: psycopg.Connection[Any]) -> None:
    """The refusal for what the target lacks: the extensions that provide it, when the target has not got them,
    with the statements that install them; else the objects themselves."""
    if not missing:
        return
    ctx = ctxs[0]
    exts = {ext: schema for _, ext, schema in missing if ext is not None}
    there = {str(r[0]): str(r[1]) for r in tgt.execute("SELECT e.extname, n.nspname FROM pg_catalog.pg_extension e"
                                                      " JOIN pg_catalog.pg_namespace n ON n.oid = e.extnamespace WHERE e.extname = ANY(%s)", (list(exts),))}
    absent = set(exts) - set(there)
    elsewhere = sorted(e for e in exts if e in there and there[e] != exts[e])
    quoted = dict(tgt.execute("SELECT x, pg_catalog.quote_ident(x) FROM pg_catalog.unnest(%s::text[]) x", ([*exts, *exts.values()],)).fetchall())
    if not absent and elsewhere:
        e = elsewhere[0]
        raise MoveError(f"{ctx.schema if len(ctxs) == 1 else _what(ctxs)} use{'s' if len(ctxs) == 1 else ''} extension {e} in schema {exts[e]},"
                        f" which {ctx.target} has in schema {there[e]}",
                        hint=f"ALTER EXTENSION {quoted[e]} SET SCHEMA {quoted[exts[e]]}; on {ctx.target} (when nothing there needs it where it is), then move")
    if absent:
        objs = describe_dependents([shown for shown, ext, _ in missing if ext in absent])
        names = sorted(absent)
        install = " ".join(f"CREATE EXTENSION {quoted[e]}" + ("" if exts[e] == "public" else f" SCHEMA {quoted[exts[e]]}") + ";" for e in names)
        hint = f"install {'them' if len(names) > 1 else 'it'} there first ({install} on {ctx.target}, as a role that may), then move"
        extensions = f"extension{'s' if len(names) > 1 else ''} {', '.join(names)}"
        if len(ctxs) == 1:
            raise MoveError(f"{ctx.schema} uses {extensions} ({objs}), which {ctx.target} does not have", hint=hint)
        raise MoveError(f"{_what(ctxs)} use {extensions} ({objs}), which {ctx.target} does not have", hint=hint)
    shown = [s for s, _, _ in missing]
    them = "them" if len(shown) > 1 else "it"
    hint = f"create {them} on {ctx.target} first (CREATE EXTENSION, if an extension provides {them}), then move"
    if len(ctxs) == 1:
        raise MoveError(f"{ctx.schema} uses {describe_dependents(shown)} from outside the shard, missing on {ctx.target}", hint=hint)
    raise MoveError(f"{_what(ctxs)} use {describe_dependents(shown)} from outside the shards, missing on {ctx.target}", hint=hint)


def _missing_roles(src: psycopg.Connection[Any], tgt: psycopg.Connection[Any], sql: str, params: dict[str, Any]) -> list[str]:
    """The roles sql (ROLES_OF_SCHEMA_SQL) finds on the source that the target's server lacks."""
    needed = src.execute(sql, params).fetchone()[0] or []  # type: ignore[index]
    return list(tgt.execute("SELECT pg_catalog.array_agg(r ORDER BY r) FROM pg_catalog.unnest(%s::text[]) AS r"
                            " WHERE r NOT IN (SELECT rolname FROM pg_catalog.pg_roles)", (list(needed),)).fetchone()[0] or [])  # type: ignore[index]


def _missing_references(src: psycopg.Connection[Any], tgt: psycopg.Connection[Any], sql: str, params: dict[str, Any]
                        ) -> list[tuple[str, str | None, str | None]]:
    """The objects sql (EXTERNAL_REFERENCES_SQL) finds used on the source that the target does not have: each
    as shown, with the extension it belongs to on the source and that extension's schema (or None)."""
    missing = []
    for kind, names, args, shown, ext, ext_schema in src.execute(sql, params).fetchall():
        try:
            tgt.execute("SELECT pg_catalog.pg_get_object_address(%s, %s, %s)", (kind, names, args))
        except psycopg.Error:
            missing.append((str(shown), ext, ext_schema))
    return missing


def _what(ctxs: list[ShardContext]) -> str:
    return f"the schemas of shards {collapse([c.shard for c in ctxs])}"


def check_batch(ctxs: list[ShardContext], src: psycopg.Connection[Any], tgt: psycopg.Connection[Any]) -> None:
    """check_outside_dependents, check_roles and check_external_references for a batch: one query each for all
    of its schemas (each of those reads whole catalogs: some 10-40 ms a query on a database of 2000 shards)."""
    if len(ctxs) == 1:
        check_outside_dependents(ctxs[0], src)
        check_roles(ctxs[0], src, tgt)
        check_owners(ctxs, src, tgt, target=True)
        check_external_references(ctxs[0], src, tgt)
        return
    ctx, schemas = ctxs[0], [c.schema for c in ctxs]
    found = [str(r[0]) for r in src.execute(dq.OUTSIDE_DEPENDENTS_ANY_SQL, {"schemas": schemas})]
    if found:
        raise MoveError(
            f"objects outside {_what(ctxs)} on {ctx.source} depend on them and cannot move with them: {describe_dependents(found)}",
            hint="drop them or make them independent of the shards first (a shard's objects belong in its schema)",
        )
    missing = _missing_roles(src, tgt, ROLES_OF_SCHEMA_SQL.replace("nspname = %(schema)s", "nspname = ANY(%(schemas)s)"), {"schemas": schemas})
    if missing:
        raise MoveError(
            f"{'roles' if len(missing) > 1 else 'role'} {', '.join(missing)} of {_what(ctxs)} (owner or grantee of their objects on {ctx.source})"
            f" {'do' if len(missing) > 1 else 'does'} not exist on {ctx.target}",
            hint=f"create {'them' if len(missing) > 1 else 'it'} on {ctx.target} (roles belong to the server, not the database), then move",
        )
    check_owners(ctxs, src, tgt, target=True)
    _refuse_missing(ctxs, _missing_references(src, tgt, dq.EXTERNAL_REFERENCES_ANY_SQL, {"schemas": schemas}), tgt)


def check_no_other_moves(conn: psycopg.Connection[Any], ctx_source: str, shards: list[int]) -> None:
    """check_no_other_move of each of shards, in order, with one read of the journal."""
    found = open_moves(conn, shards)
    for shard in shards:
        rec = found.get(shard)
        if rec is not None:
            _refuse_open_move(conn, ctx_source, shard, rec)


def check_no_other_move(conn: psycopg.Connection[Any], ctx_source: str, shard: int) -> None:
    rec = open_move(conn, shard)
    if rec is not None:
        _refuse_open_move(conn, ctx_source, shard, rec)


def _refuse_open_move(conn: psycopg.Connection[Any], ctx_source: str, shard: int, rec: MoveRecord) -> None:
    pid = lock_holder(conn, shard)
    if pid is not None:
        raise MoveError(
            f"shard {shard} is being moved to {rec.target} right now by another pgidgen (move {rec.move_id}, step {rec.step})",
            where=f"{ctx_source}, backend pid {pid}",
            hint="wait for it to finish",
        )
    steps = rec.steps
    past_flip = rec.step in steps and POINT_OF_NO_RETURN in steps and steps.index(rec.step) > steps.index(POINT_OF_NO_RETURN)
    raise MoveError(
        f"an interrupted move of shard {shard} to {rec.target} exists (move {rec.move_id}, stopped at step {rec.step})",
        where=ctx_source,
        hint=(f"it is past its flip ({rec.target} serves the shard): finish it with 'pgidgen move-shard --resume {shard}'" if past_flip else
              f"finish it with 'pgidgen move-shard --resume {shard}' or undo it with 'pgidgen move-shard --rollback {shard}'"),
    )
