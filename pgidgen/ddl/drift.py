"""Drift between shards (`pgidgen status --drift`): do all shards hold the same tables, columns, indexes, ...?

One query per database returns a fingerprint per shard schema (an md5 over a normalised description of its
objects, the schema's own name replaced by `shard_N`), plus each shard's ledger positions. Only when
fingerprints differ does a second query per database describe one representative shard per fingerprint, so a
report can say *what* differs: "missing column photos.caption", "extra index ...".
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import psycopg

from ..config import Config
from ..db import connect, each_database, translate
from ..errors import PgidgenError
from ..ranges import collapse
from .ledger import DatabaseLedger, merge_history, missing_positions, read_ledger

_N = "replace({x}, s.nspname || '.', 'shard_N.')"
#: An ACL as its effective privileges (the default ones when it is NULL), sorted: the same grants compare equal
#: whatever their order in the array, and whether or not they were ever written out. Not the owner's MAINTAIN,
#: which PostgreSQL 17 added to every owner's defaults: the same table on 15 and on 18 has the same grants.
_ACL = ("coalesce((SELECT pg_catalog.string_agg(g, ',' ORDER BY g) FROM (SELECT CASE WHEN e.grantee = 0 THEN 'public'"
        " ELSE pg_catalog.pg_get_userbyid(e.grantee)::text END || '=' || e.privilege_type || CASE WHEN e.is_grantable THEN '*' ELSE '' END"
        " || '/' || pg_catalog.pg_get_userbyid(e.grantor) AS g FROM pg_catalog.aclexplode(coalesce({acl}, pg_catalog.acldefault('{kind}', {owner}))) e"
        " WHERE NOT (e.privilege_type = 'MAINTAIN' AND e.grantee = {owner})) q),"
        " 'none')")

#: A view's definition with every qualifier taken off its names: PostgreSQL 16 stopped printing them for a
#: query over one table (`likes.t_id` on 15 is `t_id` on 16+), so the same view reads alike on every major.
_UNQUALIFIED = "pg_catalog.regexp_replace({x}, '(\\m[[:alpha:]_][[:alnum:]_$]*|\"[^\"]*\")\\.(?=[[:alpha:]_\"])', '', 'g')"

#: A column's default as pg_get_expr prints it, but `shard_5.next_id()` (a call without arguments of a function of
#: the table's own schema) named from the catalog: to decide whether to qualify a function's name, pg_get_expr
#: looks at every function of that name, and every shard has a next_id (measured at 8192 shards: a pass over
#: 8192 of them per column, 380 ms of the 1.2 s a database's fingerprint took; linear again with this).
_DEFAULT = """coalesce((
        SELECT pg_catalog.quote_ident(dn.nspname) || '.' || pg_catalog.quote_ident(dp.proname) || '()'
        FROM (SELECT d.adbin::pg_catalog.text AS t) x
        JOIN pg_catalog.pg_proc dp ON dp.oid = CASE  -- string tests: a regular expression cost as much as the pass
            WHEN pg_catalog.starts_with(x.t, '{FUNCEXPR :funcid ') AND pg_catalog.strpos(pg_catalog.substr(x.t, 2), '{') = 0
             AND pg_catalog.strpos(x.t, ' :funcformat 0 ') > 0 AND pg_catalog.strpos(x.t, ' :args <> ') > 0
            THEN pg_catalog.split_part(x.t, ' ', 3)::pg_catalog.oid END
        JOIN pg_catalog.pg_namespace dn ON dn.oid = dp.pronamespace
        WHERE dp.pronamespace = c.relnamespace),
    pg_catalog.pg_get_expr(d.adbin, d.adrelid))"""

ITEMS_SQL = """
WITH s AS (
    SELECT n.oid AS nsp, n.nspname, sh.shard
    FROM pgidgen.shards sh JOIN pg_catalog.pg_namespace n ON n.nspname = sh.schema_name
    WHERE sh.state IN ('active', 'moving') {filter}
), cls AS MATERIALIZED (  -- the schemas' relations, read once: pg_class has no index on the schema, so each
                          -- branch joining it read all of it again (eleven passes over a catalog that grows with the shards)
    SELECT c.* FROM pg_catalog.pg_class c WHERE c.relnamespace IN (SELECT nsp FROM s)
), items AS (
    SELECT s.shard, 'relation ' || c.relname || ' (' || c.relkind::text || ')' || coalesce(' with ' || pg_catalog.array_to_string(c.reloptions, ','), '')
        || CASE WHEN c.relkind IN ('r', 'p') THEN ' replica identity ' || c.relreplident::text ELSE '' END
        || CASE WHEN c.relkind = 'r' AND c.relpersistence = 'u' THEN ' unlogged' ELSE '' END || coalesce(' partition by ' || pg_catalog.pg_get_partkeydef(c.oid), '') AS item
    FROM s JOIN cls c ON c.relnamespace = s.nsp
    WHERE c.relkind IN ('r', 'p', 'v', 'm', 'S', 'f', 'c') AND c.relname NOT IN ('pgidgen_counter', 'pgidgen_offset')
  UNION ALL
    SELECT s.shard, 'sequence ' || c.relname || ' ' || pg_catalog.format_type(q.seqtypid, NULL) || ' increment ' || q.seqincrement
        || ' min ' || q.seqmin || ' max ' || q.seqmax || ' cache ' || q.seqcache || CASE WHEN q.seqcycle THEN ' cycle' ELSE '' END
    FROM s JOIN cls c ON c.relnamespace = s.nsp AND c.relkind = 'S' JOIN pg_catalog.pg_sequence q ON q.seqrelid = c.oid
    WHERE c.relname NOT IN ('pgidgen_counter', 'pgidgen_offset')
  UNION ALL
    SELECT s.shard, 'rule ' || r.rulename || ' on ' || c.relname || ' ' || pg_catalog.md5({ruledef}) || ' ' || r.ev_enabled::text
    FROM s JOIN cls c ON c.relnamespace = s.nsp JOIN pg_catalog.pg_rewrite r ON r.ev_class = c.oid AND r.rulename <> '_RETURN'
  UNION ALL
    SELECT s.shard, 'statistics ' || {statsdef}
    FROM s JOIN pg_catalog.pg_statistic_ext x ON x.stxnamespace = s.nsp

  UNION ALL
    SELECT s.shard, 'row level security on ' || c.relname || CASE WHEN c.relforcerowsecurity THEN ' (forced)' ELSE '' END
    FROM s JOIN cls c ON c.relnamespace = s.nsp AND c.relrowsecurity
  UNION ALL
    SELECT s.shard, 'column ' || c.relname || '.' || a.attname || ' ' || pg_catalog.format_type(a.atttypid, a.atttypmod)
        || CASE WHEN a.attnotnull THEN ' not null' ELSE '' END
        || CASE a.attidentity WHEN 'a' THEN ' identity always' WHEN 'd' THEN ' identity by default' ELSE '' END
        || coalesce(' default ' || {default}, '')
        || CASE WHEN a.attcollation <> ty.typcollation THEN ' collate ' || coalesce((SELECT collname FROM pg_catalog.pg_collation WHERE oid = a.attcollation), '?') ELSE '' END
        || CASE WHEN a.attstorage <> ty.typstorage THEN ' storage ' || a.attstorage::text ELSE '' END
        || CASE WHEN a.attstattarget >= 0 THEN ' statistics ' || a.attstattarget ELSE '' END
    FROM s JOIN cls c ON c.relnamespace = s.nsp
    JOIN pg_catalog.pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
    JOIN pg_catalog.pg_type ty ON ty.oid = a.atttypid
    LEFT JOIN pg_catalog.pg_attrdef d ON d.adrelid = c.oid AND d.adnum = a.attnum
    WHERE c.relkind IN ('r', 'p', 'v', 'm', 'f', 'c')
  UNION ALL
    SELECT s.shard, 'index ' || {indexdef} || CASE WHEN ix.indisvalid THEN '' ELSE ' (invalid)' END
    FROM s JOIN cls c ON c.relnamespace = s.nsp AND c.relkind IN ('i', 'I')
    JOIN pg_catalog.pg_index ix ON ix.indexrelid = c.oid {index_filter}
  UNION ALL
    -- not the constraints a partitioned table's foreign key or check gets on each partition: named in creation
    -- order (pg_dump's restore orders them otherwise), and implied by the parent's, which is compared
    SELECT s.shard, 'constraint ' || co.conname || ' on ' || coalesce(c.relname, '-') || ' ' || {condef}
    -- nor NOT NULL constraints, which PostgreSQL 18 keeps as rows of their own (contype n): the column's
    -- "not null" says the same on every major
    FROM s JOIN pg_catalog.pg_constraint co ON co.connamespace = s.nsp AND co.conparentid = 0 AND co.contype <> 'n'
    LEFT JOIN pg_catalog.pg_class c ON c.oid = co.conrelid
  UNION ALL
    SELECT s.shard, 'grants on schema ' || {nspacl} || ' owner ' || pg_catalog.pg_get_userbyid(n.nspowner)
    FROM s JOIN pg_catalog.pg_namespace n ON n.oid = s.nsp
  UNION ALL
    SELECT s.shard, 'grants on ' || c.relname || ' ' || CASE WHEN c.relkind = 'S' THEN {seqacl} ELSE {relacl} END || ' owner ' || pg_catalog.pg_get_userbyid(c.relowner)
        || coalesce(' columns ' || (SELECT string_agg(a.attname || ' ' || {attacl}, ', ' ORDER BY a.attname)
                                    FROM pg_catalog.pg_attribute a WHERE a.attrelid = c.oid AND a.attacl IS NOT NULL), '')
    FROM s JOIN cls c ON c.relnamespace = s.nsp
    WHERE c.relkind IN ('r', 'p', 'v', 'm', 'S', 'f') AND c.relname NOT IN ('pgidgen_counter', 'pgidgen_offset')
  UNION ALL
    SELECT s.shard, 'policy ' || p.polname || ' on ' || c.relname || ' ' || p.polcmd::text || CASE WHEN p.polpermissive THEN ' permissive' ELSE ' restrictive' END
        || ' to ' || (SELECT string_agg(x, ',' ORDER BY x) FROM (SELECT CASE WHEN r = 0 THEN 'public' ELSE pg_catalog.pg_get_userbyid(r)::text END AS x
                      FROM pg_catalog.unnest(p.polroles) r) q)
        || coalesce(' using ' || {polqual}, '') || coalesce(' check ' || {polcheck}, '')
    FROM s JOIN cls c ON c.relnamespace = s.nsp JOIN pg_catalog.pg_policy p ON p.polrelid = c.oid
  UNION ALL
    SELECT s.shard, 'inherits ' || c.relname || ' from ' || pc.oid::pg_catalog.regclass::text || coalesce(' ' || pg_catalog.pg_get_expr(c.relpartbound, c.oid), '')
    FROM s JOIN cls c ON c.relnamespace = s.nsp AND c.relkind IN ('r', 'p', 'f')
    JOIN pg_catalog.pg_inherits i ON i.inhrelid = c.oid JOIN pg_catalog.pg_class pc ON pc.oid = i.inhparent
  UNION ALL
    SELECT s.shard, 'trigger ' || {trigdef} || ' ' || t.tgenabled::text
    FROM s JOIN cls c ON c.relnamespace = s.nsp
    JOIN pg_catalog.pg_trigger t ON t.tgrelid = c.oid AND NOT t.tgisinternal
  UNION ALL
    SELECT s.shard, 'view ' || c.relname || ' ' || pg_catalog.md5({viewdef})
    FROM s JOIN cls c ON c.relnamespace = s.nsp AND c.relkind IN ('v', 'm')
  UNION ALL
    SELECT s.shard, 'function ' || p.proname || '(' || pg_catalog.pg_get_function_identity_arguments(p.oid) || ') '
        || coalesce(pg_catalog.pg_get_function_result(p.oid), 'procedure') || ' '
        || pg_catalog.md5({prosrc}) || CASE WHEN p.prosecdef THEN ' security definer' ELSE '' END || ' ' || p.provolatile::text
        || ' ' || p.proisstrict::text || p.proleakproof::text || p.proparallel::text
        || ' grants ' || {proacl} || ' owner ' || pg_catalog.pg_get_userbyid(p.proowner)
    FROM s JOIN pg_catalog.pg_proc p ON p.pronamespace = s.nsp
    WHERE p.proname NOT IN ('next_id', 'pgidgen_locked_next_id')
  UNION ALL
    SELECT s.shard, 'type ' || t.typname || ' (' || t.typtype::text || ')'
        || CASE WHEN t.typtype = 'd' THEN ' over ' || pg_catalog.format_type(t.typbasetype, t.typtypmod) ELSE '' END
        || CASE WHEN t.typnotnull THEN ' not null' ELSE '' END
        || coalesce(' ' || (SELECT string_agg(e.enumlabel::text, ',' ORDER BY e.enumsortorder) FROM pg_catalog.pg_enum e WHERE e.enumtypid = t.oid), '')
        || coalesce(' default ' || t.typdefault, '')
        || ' grants ' || {typacl} || ' owner ' || pg_catalog.pg_get_userbyid(t.typowner)
    FROM s JOIN pg_catalog.pg_type t ON t.typnamespace = s.nsp AND t.typtype IN ('e', 'd', 'r', 'm')
  UNION ALL
    SELECT s.shard, 'operator ' || o.oprname || '(' || pg_catalog.format_type(o.oprleft, NULL) || ', ' || pg_catalog.format_type(o.oprright, NULL)
        || ') ' || o.oprcode::pg_catalog.regprocedure::text || coalesce(' commutator ' || nullif(o.oprcom, 0)::pg_catalog.regoperator::text, '')
        || coalesce(' negator ' || nullif(o.oprnegate, 0)::pg_catalog.regoperator::text, '')
    FROM s JOIN pg_catalog.pg_operator o ON o.oprnamespace = s.nsp
    WHERE NOT EXISTS (SELECT FROM pg_catalog.pg_depend e WHERE e.classid = 'pg_catalog.pg_operator'::pg_catalog.regclass AND e.objid = o.oid AND e.deptype = 'e')
  UNION ALL
    SELECT s.shard, 'operator family ' || f.opfname || ' using ' || am.amname
        || ' operators ' || coalesce((SELECT string_agg(a.amopstrategy || ' ' || a.amopopr::pg_catalog.regoperator::text, ', ' ORDER BY a.amopstrategy, a.amopopr::pg_catalog.regoperator::text)
                                      FROM pg_catalog.pg_amop a WHERE a.amopfamily = f.oid), '-')
        || ' functions ' || coalesce((SELECT string_agg(a.amprocnum || ' ' || a.amproc::pg_catalog.regprocedure::text, ', ' ORDER BY a.amprocnum, a.amproc::pg_catalog.regprocedure::text)
                                      FROM pg_catalog.pg_amproc a WHERE a.amprocfamily = f.oid), '-')
        || coalesce(' classes ' || (SELECT string_agg(c.opcname || ' for ' || pg_catalog.format_type(c.opcintype, NULL) || CASE WHEN c.opcdefault THEN ' default' ELSE '' END, ', ' ORDER BY c.opcname)
                                    FROM pg_catalog.pg_opclass c WHERE c.opcfamily = f.oid), '')
    FROM s JOIN pg_catalog.pg_opfamily f ON f.opfnamespace = s.nsp JOIN pg_catalog.pg_am am ON am.oid = f.opfmethod
    WHERE NOT EXISTS (SELECT FROM pg_catalog.pg_depend e WHERE e.classid = 'pg_catalog.pg_opfamily'::pg_catalog.regclass AND e.objid = f.oid AND e.deptype = 'e')
  UNION ALL
    SELECT s.shard, 'collation ' || c.collname || ' provider ' || c.collprovider::text || CASE WHEN c.collisdeterministic THEN '' ELSE ' nondeterministic' END
    FROM s JOIN pg_catalog.pg_collation c ON c.collnamespace = s.nsp
  UNION ALL
    SELECT s.shard, 'text search dictionary ' || d.dictname || ' template ' || d.dicttemplate::pg_catalog.regproc::text || ' ' || coalesce(d.dictinitoption, '')
    FROM s JOIN pg_catalog.pg_ts_dict d ON d.dictnamespace = s.nsp
  UNION ALL
    SELECT s.shard, 'text search configuration ' || c.cfgname || ' parser ' || p.prsname || ' '
        || coalesce((SELECT string_agg(m.maptokentype || '.' || m.mapseqno || ' ' || m.mapdict::pg_catalog.regdictionary::text, ', ' ORDER BY m.maptokentype, m.mapseqno)
                     FROM pg_catalog.pg_ts_config_map m WHERE m.mapcfg = c.oid), '-')
    FROM s JOIN pg_catalog.pg_ts_config c ON c.cfgnamespace = s.nsp JOIN pg_catalog.pg_ts_parser p ON p.oid = c.cfgparser
  UNION ALL
    -- a cast has no schema: the shard's are those with its type or function (move/casts.py), made by CREATE CAST
    SELECT s.shard, 'cast ' || pg_catalog.format_type(k.castsource, NULL) || ' as ' || pg_catalog.format_type(k.casttarget, NULL)
        || ' ' || k.castmethod::text || k.castcontext::text || coalesce(' ' || nullif(k.castfunc, 0)::pg_catalog.regprocedure::text, '')
    FROM (SELECT DISTINCT k.castsource, k.casttarget, k.castmethod, k.castcontext, k.castfunc, u.nsp
          FROM pg_catalog.pg_cast k CROSS JOIN LATERAL (VALUES ((SELECT typnamespace FROM pg_catalog.pg_type WHERE oid = k.castsource)),
                                                              ((SELECT typnamespace FROM pg_catalog.pg_type WHERE oid = k.casttarget)),
                                                              ((SELECT pronamespace FROM pg_catalog.pg_proc WHERE oid = k.castfunc))) AS u (nsp)
          WHERE u.nsp <> 'pg_catalog'::pg_catalog.regnamespace AND NOT EXISTS (
              SELECT FROM pg_catalog.pg_depend e WHERE e.classid = 'pg_catalog.pg_cast'::pg_catalog.regclass AND e.objid = k.oid AND e.deptype IN ('i', 'e'))) k
    JOIN s ON s.nsp = k.nsp
)
""".format(
    filter="{filter}",
    index_filter="{index_filter}",
    nspacl=_ACL.format(acl="n.nspacl", kind="n", owner="n.nspowner"),
    relacl=_ACL.format(acl="c.relacl", kind="r", owner="c.relowner"),
    seqacl=_ACL.format(acl="c.relacl", kind="s", owner="c.relowner"),
    attacl=_ACL.format(acl="a.attacl", kind="c", owner="c.relowner"),
    proacl=_ACL.format(acl="p.proacl", kind="f", owner="p.proowner"),
    typacl=_ACL.format(acl="t.typacl", kind="T", owner="t.typowner"),
    ruledef=_N.format(x="pg_catalog.pg_get_ruledef(r.oid)"),
    statsdef=_N.format(x="pg_catalog.pg_get_statisticsobjdef(x.oid)"),
    polqual=_N.format(x="pg_catalog.pg_get_expr(p.polqual, p.polrelid)"),
    polcheck=_N.format(x="pg_catalog.pg_get_expr(p.polwithcheck, p.polrelid)"),
    default=_N.format(x=_DEFAULT),
    indexdef=_N.format(x="pg_catalog.pg_get_indexdef(c.oid)"),
    condef=_N.format(x="pg_catalog.pg_get_constraintdef(co.oid)"),
    trigdef=_N.format(x="pg_catalog.pg_get_triggerdef(t.oid)"),
    viewdef=_UNQUALIFIED.format(x=_N.format(x="pg_catalog.pg_get_viewdef(c.oid)")),
    prosrc=_N.format(x="coalesce(p.prosrc, '') || coalesce(pg_catalog.pg_get_function_sqlbody(p.oid), '')")
    + " || replace(coalesce(pg_catalog.array_to_string(p.proconfig, ','), ''), 'search_path=' || s.nspname || ',', 'search_path=shard_N,')",
)

FINGERPRINT_SQL = (
    ITEMS_SQL.replace("{filter}", "").replace("{index_filter}", "")
    + """
SELECT s.shard, coalesce(pg_catalog.md5(string_agg(replace(i.item, s.nspname || '.', 'shard_N.'), E'\\n' ORDER BY replace(i.item, s.nspname || '.', 'shard_N.'))), pg_catalog.md5(''))
FROM s LEFT JOIN items i ON i.shard = s.shard
GROUP BY s.shard
"""
)

DETAIL_SQL = (
    ITEMS_SQL.replace("{filter}", "AND sh.shard = ANY(%s)").replace("{index_filter}", "")
    + "SELECT i.shard, replace(i.item, s.nspname || '.', 'shard_N.') FROM items i JOIN s ON s.shard = i.shard"
)


#: One schema's items by its name, whatever its state (a move compares the source's and the target's copy). Not
#: invalid indexes (a failed CREATE INDEX CONCURRENTLY), which pg_dump does not copy.
SCHEMA_ITEMS_SQL = ITEMS_SQL.replace(
    """    SELECT n.oid AS nsp, n.nspname, sh.shard
    FROM pgidgen.shards sh JOIN pg_catalog.pg_namespace n ON n.nspname = sh.schema_name
    WHERE sh.state IN ('active', 'moving') {filter}""",
    """    SELECT n.oid AS nsp, n.nspname, 0 AS shard FROM pg_catalog.pg_namespace n WHERE n.nspname = %(schema)s""",
).replace("{index_filter}", "AND ix.indisvalid") + "SELECT replace(i.item, s.nspname || '.', 'shard_N.') FROM items i JOIN s ON s.shard = i.shard"
assert "%(schema)s" in SCHEMA_ITEMS_SQL


def schema_items(conn: psycopg.Connection[Any], schema: str, *, prepare: bool | None = None) -> set[str]:
    """What status --drift compares, for one schema: its tables, columns, indexes, constraints, triggers, ...
    prepare=True: a prepared statement (run it once ahead, and the second run skips planning)."""
    return {str(r[0]) for r in conn.execute(SCHEMA_ITEMS_SQL, {"schema": schema}, prepare=prepare)}


@dataclass
class DatabaseDrift:
    fingerprints: dict[int, str]
    details: dict[int, set[str]] = field(default_factory=dict)
    ledger: DatabaseLedger = field(default_factory=DatabaseLedger)


@dataclass
class Drift:
    """How the shards differ; empty `problems` means every shard looks the same."""

    shards: int = 0
    fingerprints: int = 0
    problems: list[str] = field(default_factory=list)
    unreachable: dict[str, str] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.problems and not self.unreachable

    def as_dict(self) -> dict[str, Any]:
        return {
            "shards": self.shards,
            "schemas_alike": len(self.problems) == 0,
            "fingerprints": self.fingerprints,
            "problems": self.problems,
            "unreachable": self.unreachable,
            "ok": self.ok,
        }


def _read(conn: psycopg.Connection[Any], name: str) -> DatabaseDrift:
    try:
        ledger = read_ledger(conn)
        if not ledger.has_catalog:
            return DatabaseDrift({}, ledger=ledger)
        # In one round trip: nested loops off, right after DDL on thousands of shards catalog statistics are stale;
        # which before PostgreSQL 18 adds a cost of 10^10 per join it turns off: past jit_above_cost, a server built
        # with JIT spent 6.6 s of a 6.9 s query compiling it (15, 2000 shards), and a catalog query gains nothing
        # from JIT; work_mem, as its relations, sorts and hashes spilled to disk from some 4000 shards a database
        # (4 MB by default): 17% of the query at 8192 shards; this session's only query, so a fixed cost.
        conn.execute(b"SET enable_nestloop = off; SET jit = off; SET work_mem = '64MB'")
        rows = conn.execute(FINGERPRINT_SQL.encode()).fetchall()
    except psycopg.Error as e:
        raise translate(name, e, doing="reading the shards' schemas") from None
    return DatabaseDrift({int(s): str(fp) for s, fp in rows}, ledger=ledger)


def _describe(conn: psycopg.Connection[Any], shards: Sequence[int]) -> dict[int, set[str]]:
    out: dict[int, set[str]] = {s: set() for s in shards}
    for shard, item in conn.execute(DETAIL_SQL, (list(shards),)):
        out[int(shard)].add(str(item))
    return out


def _differences(conns: dict[str, psycopg.Connection[Any]], drift: Drift, where: dict[int, str], by_fp: dict[str, list[int]],
                 behind: dict[int, tuple[int, ...]]) -> list[str]:
    """What sets apart the shards whose fingerprint is not the reference's. The reference is what the shards the
    ledger has up to date look like (the most of them, by majority only when none is): after an apply that missed a
    database, its shards are behind (said by the ledger's lines), and the applied ones are not the odd ones out
    however many the others are. A shard behind in the ledger is compared once it has caught up."""
    judged = {fp: [s for s in shards if s not in behind] for fp, shards in by_fp.items()}
    if not any(judged.values()):  # no ledger, or every shard lacks some file: by majority
        judged = by_fp
    reference = max((fp for fp, shards in judged.items() if shards), key=lambda fp: (len(judged[fp]), -min(judged[fp])))
    odd = {fp: shards for fp, shards in judged.items() if shards and fp != reference}
    if not odd:
        return []
    reps = {fp: min(shards) for fp, shards in odd.items()}
    reps[reference] = min(judged[reference])
    wanted: dict[str, list[int]] = {}
    for s in reps.values():
        wanted.setdefault(where[s], []).append(s)
    described: dict[int, set[str]] = {}
    for name, shards in wanted.items():
        try:
            described.update(_describe(conns[name], shards))
        except psycopg.Error as e:
            drift.unreachable[name] = translate(name, e, doing="describing shards").render()
    base = described.get(reps[reference], set())
    out: list[str] = []
    for fp, shards in sorted(odd.items(), key=lambda kv: min(kv[1])):
        items = described.get(reps[fp], set())
        diffs = [f"missing {i}" for i in sorted(base - items)] + [f"extra {i}" for i in sorted(items - base)]
        dbs = sorted({where[s] for s in shards})
        out.append(
            f"shards {collapse(shards)} ({', '.join(dbs)}) differ from the {len(by_fp[reference])} shards like shard {reps[reference]}: "
            + ("; ".join(diffs[:8]) + (f"; and {len(diffs) - 8} more" if len(diffs) > 8 else "") if diffs else "details differ")
        )
    return out


def read_drift(config: Config) -> Drift:
    """Compare every shard in every configured database (one fingerprint query per database)."""
    names = config.select(None)
    conns: dict[str, psycopg.Connection[Any]] = {}

    def work(name: str) -> DatabaseDrift:
        conn = connect(name, config.dsn(name), autocommit=True)
        conns[name] = conn
        return _read(conn, name)

    try:
        results = each_database(names, work)
        per_db: dict[str, DatabaseDrift] = {}
        drift = Drift()
        for name, res in results.items():
            if isinstance(res, PgidgenError):
                drift.unreachable[name] = res.render()
            else:
                per_db[name] = res
        where = {s: name for name, d in per_db.items() for s in d.fingerprints}
        by_fp: dict[str, list[int]] = {}
        for d in per_db.values():
            for s, fp in d.fingerprints.items():
                by_fp.setdefault(fp, []).append(s)
        drift.shards = len(where)
        drift.fingerprints = len(by_fp)
        try:
            history = merge_history({n: d.ledger for n, d in per_db.items()})
        except PgidgenError as e:
            drift.problems.append(e.render())
            history = {}
        behind = {s: tuple(lacking) for d in per_db.values() for s in d.fingerprints
                  if (lacking := missing_positions(history, d.ledger.shards.get(s, ())))}
        if len(by_fp) > 1:
            drift.problems += _differences(conns, drift, where, by_fp, behind)
        for name, d in per_db.items():
            lacking_of: dict[tuple[int, ...], list[int]] = {}
            for s in sorted(d.fingerprints):
                if s in behind:
                    lacking_of.setdefault(behind[s], []).append(s)
            for files, shards in lacking_of.items():
                many = len(shards) > 1
                drift.problems.append(
                    f"shard{'s' if many else ''} {collapse(shards)} on {name} {'are' if many else 'is'} behind: missing"
                    f" {', '.join(f'{history[p].name} (#{p})' for p in files)}; run 'pgidgen apply-ddl"
                    f" {history[max(history)].name}' again to catch {'them' if many else 'it'} up"
                )
        return drift
    finally:
        for conn in conns.values():
            conn.close()
