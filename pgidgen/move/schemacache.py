"""One schema-only pg_dump of a set move's shards, ahead of its batches, instead of one per batch.

pg_dump reads the whole catalog of its database however few schemas it dumps (some 1.5 s a batch at 2000 shards,
four times that at 8192): a set move of many batches paid it for each. SchemaCache dumps the shards a set move
will take in one run (several only where a share of the lock table does not hold them: pg_dump locks every
table it dumps), on a thread of its own while the first batch moves; each batch then takes its schemas' part,
waiting for a run being read (cache_for, SchemaCache.take).

A batch takes the cache's part only when its schemas stand as they stood when the cache read them: a fingerprint
of their catalog rows (each row's xmin: a change makes a new row version) taken at the dump's snapshot, compared
with one taken when the batch starts, where the batch's own pg_dump would have started (after apply-ddl's
shards are done, see wait_for_apply_ddl). A schema changed since, a part not begun yet (or not read within
TAKE_WAIT_S), or a dump pgidgen cannot cut by schema: the batch runs its own pg_dump, as without the cache.

pg_restore's script is cut at its entries' headers (`-- Name: x; Type: T; Schema: s; Owner: o`): an entry
belongs to its schema, a schema's own entries (Type SCHEMA, and its COMMENT and ACL, Schema "-") to the schema
they name; any other entry outside the schemas makes the dump unusable here. The `SET default_tablespace` and
`SET default_table_access_method` pg_restore prints between entries are a state: each entry of the kinds they
apply to gets the state it was printed under.
"""
from __future__ import annotations

import re
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import psycopg

from ..db import connect, server_encoding
from .sqltext import relations_of
from .transfer import COPY_SECTIONS, SchemaDump, script_of

if TYPE_CHECKING:
    from .batches import Batch

_HEADER = re.compile(rb"^-- Name: (.*); Type: (.*); Schema: (.*); Owner: (.*)$")
_STATE = re.compile(rb"^SET (default_tablespace|default_table_access_method) = .*;$")
#: the entries pg_restore sets each state for (its _selectTablespace and _selectTableAccessMethod)
_STATE_KINDS = {
    b"default_tablespace": {b"TABLE", b"INDEX", b"CONSTRAINT", b"MATERIALIZED VIEW"},
    b"default_table_access_method": {b"TABLE", b"MATERIALIZED VIEW"},
}
_SCHEMA_OF_SCHEMA = {b"COMMENT", b"ACL", b"SECURITY LABEL"}


#: How long a batch waits for the cache's run being read before it dumps its schemas itself (a run of 2018 schemas
#: took 10.6 s at 8192 shards under a rebalance's load).
TAKE_WAIT_S = 60.0


class Uncuttable(Exception):
    """A script with an entry that belongs to none of the dumped schemas."""


@dataclass
class _Entry:
    schema: str
    kind: bytes
    text: bytes
    state: dict[bytes, bytes]  # the state lines in effect where it was printed


@dataclass
class SplitScript:
    """One pg_restore section's script, cut into its entries by schema."""

    head: bytes
    entries: list[_Entry]
    tail: bytes

    @classmethod
    def parse(cls, script: bytes, schemas: Sequence[str]) -> SplitScript:
        lines = script.split(b"\n")
        starts = [i for i in range(len(lines) - 2) if lines[i] == b"--" and _HEADER.match(lines[i + 1]) and lines[i + 2] == b"--"]
        end = next((i for i in range(len(lines) - 1) if lines[i] == b"--" and lines[i + 1] == b"-- PostgreSQL database dump complete"), len(lines))
        wanted = set(schemas)
        state: dict[bytes, bytes] = {}
        head = _without_state(lines[: starts[0]] if starts else lines[:end], state)
        entries = []
        for n, i in enumerate(starts):
            m = _HEADER.match(lines[i + 1])
            assert m is not None
            name, kind, schema = m.group(1), m.group(2), m.group(3)
            owner = _schema_of(name, kind, schema)
            if owner not in wanted:
                raise Uncuttable(f"{kind.decode(errors='replace')} {name.decode(errors='replace')} belongs to none of the dumped schemas")
            taken = dict(state)
            text = _without_state(lines[i: starts[n + 1] if n + 1 < len(starts) else end], state)
            entries.append(_Entry(owner, kind, text, taken))
        return cls(head, entries, b"\n".join(lines[end:]))

    def part(self, schemas: set[str], state: dict[bytes, bytes]) -> bytes:
        """The entries of schemas, in order, each under the state it was printed under (state: what the script
        this part goes into has set so far; updated)."""
        out = []
        for e in self.entries:
            if e.schema not in schemas:
                continue
            for key, line in e.state.items():
                if e.kind in _STATE_KINDS[key] and state.get(key) != line:
                    out.append(line + b"\n\n")
                    state[key] = line
            out.append(e.text)
        return b"".join(out)


def _schema_of(name: bytes, kind: bytes, schema: bytes) -> str:
    if schema != b"-":
        return schema.decode()
    if kind == b"SCHEMA":
        return _unquote(name)
    if kind in _SCHEMA_OF_SCHEMA and name.startswith(b"SCHEMA "):
        return _unquote(name[len(b"SCHEMA "):])
    return ""


def _unquote(name: bytes) -> str:
    text = name.decode()
    return text[1:-1].replace('""', '"') if len(text) > 1 and text.startswith('"') and text.endswith('"') else text


def _without_state(lines: list[bytes], state: dict[bytes, bytes]) -> bytes:
    """lines as text, but the state lines at their end (among blank lines: pg_restore prints them before the
    next entry's header, never inside an entry) taken into state."""
    cut = len(lines)
    while cut > 0 and (lines[cut - 1] == b"" or _STATE.match(lines[cut - 1])):
        cut -= 1
    for line in lines[cut:]:
        m = _STATE.match(line)
        if m:
            state[m.group(1)] = line
    kept = lines[:cut]
    return b"\n".join(kept) + (b"\n\n" if kept else b"")


#: Per schema, an md5 of its catalog rows' (catalog, oid, sub-id, xmin): what pg_dump prints of a schema is in
#: these rows, and any change to one makes a new row version. At a dump's snapshot, then when a batch starts.
FINGERPRINT_SQL = f"""
WITH n AS (SELECT oid, nspname FROM pg_catalog.pg_namespace WHERE nspname = ANY(%(schemas)s)),
rel AS MATERIALIZED ({relations_of("n", "c.oid, n.nspname, c.xmin")}),
objs AS (
    SELECT n.nspname, 'n' AS k, x.oid, 0 AS sub, x.xmin FROM pg_catalog.pg_namespace x JOIN n ON x.oid = n.oid
    UNION ALL SELECT r.nspname, 'c', r.oid, 0, r.xmin FROM rel r
    UNION ALL SELECT r.nspname, 'a', a.attrelid, a.attnum, a.xmin FROM pg_catalog.pg_attribute a JOIN rel r ON a.attrelid = r.oid WHERE a.attnum > 0
    UNION ALL SELECT r.nspname, 'd', x.oid, 0, x.xmin FROM pg_catalog.pg_attrdef x JOIN rel r ON x.adrelid = r.oid
    UNION ALL SELECT r.nspname, 'i', x.indexrelid, 0, x.xmin FROM pg_catalog.pg_index x JOIN rel r ON x.indrelid = r.oid
    UNION ALL SELECT r.nspname, 't', x.oid, 0, x.xmin FROM pg_catalog.pg_trigger x JOIN rel r ON x.tgrelid = r.oid
    UNION ALL SELECT r.nspname, 'r', x.oid, 0, x.xmin FROM pg_catalog.pg_rewrite x JOIN rel r ON x.ev_class = r.oid
    UNION ALL SELECT r.nspname, 'p', x.oid, 0, x.xmin FROM pg_catalog.pg_policy x JOIN rel r ON x.polrelid = r.oid
    UNION ALL SELECT r.nspname, 's', x.seqrelid, 0, x.xmin FROM pg_catalog.pg_sequence x JOIN rel r ON x.seqrelid = r.oid
    UNION ALL SELECT r.nspname, 'h', x.inhrelid, x.inhseqno, x.xmin FROM pg_catalog.pg_inherits x JOIN rel r ON x.inhrelid = r.oid
    UNION ALL SELECT r.nspname, 'o', x.objid, x.refobjid::pg_catalog.int4, x.xmin FROM pg_catalog.pg_depend x JOIN rel r ON x.objid = r.oid
        WHERE x.classid = 'pg_catalog.pg_class'::pg_catalog.regclass AND x.deptype = 'a'
    UNION ALL SELECT n.nspname, 'k', x.oid, 0, x.xmin FROM pg_catalog.pg_constraint x JOIN n ON x.connamespace = n.oid
    UNION ALL SELECT n.nspname, 'f', x.oid, 0, x.xmin FROM pg_catalog.pg_proc x JOIN n ON x.pronamespace = n.oid
    UNION ALL SELECT n.nspname, 'y', x.oid, 0, x.xmin FROM pg_catalog.pg_type x JOIN n ON x.typnamespace = n.oid
    UNION ALL SELECT n.nspname, 'x', x.oid, 0, x.xmin FROM pg_catalog.pg_statistic_ext x JOIN n ON x.stxnamespace = n.oid
    UNION ALL SELECT n.nspname, 'l', x.oid, 0, x.xmin FROM pg_catalog.pg_collation x JOIN n ON x.collnamespace = n.oid
    UNION ALL SELECT n.nspname, 'e', x.oid, 0, x.xmin FROM pg_catalog.pg_operator x JOIN n ON x.oprnamespace = n.oid
    UNION ALL SELECT n.nspname, 'u', x.oid, 0, x.xmin FROM pg_catalog.pg_opclass x JOIN n ON x.opcnamespace = n.oid
    UNION ALL SELECT n.nspname, 'v', x.oid, 0, x.xmin FROM pg_catalog.pg_opfamily x JOIN n ON x.opfnamespace = n.oid
    UNION ALL SELECT n.nspname, 'g', x.oid, 0, x.xmin FROM pg_catalog.pg_ts_config x JOIN n ON x.cfgnamespace = n.oid
    UNION ALL SELECT n.nspname, 'j', x.oid, 0, x.xmin FROM pg_catalog.pg_ts_dict x JOIN n ON x.dictnamespace = n.oid
    UNION ALL SELECT n.nspname, 'q', x.oid, 0, x.xmin FROM pg_catalog.pg_default_acl x JOIN n ON x.defaclnamespace = n.oid
),
notes AS (
    SELECT DISTINCT o.nspname, 'm' AS k, m.objoid AS oid, m.objsubid AS sub, m.xmin
    FROM pg_catalog.pg_description m JOIN objs o ON m.objoid = o.oid
)
SELECT nspname, pg_catalog.md5(pg_catalog.string_agg(k || ':' || oid || ':' || sub || ':' || xmin::text, ',' ORDER BY k, oid, sub, xmin::text))
FROM (SELECT * FROM objs UNION ALL SELECT * FROM notes) a
GROUP BY nspname
"""


def fingerprints(conn: psycopg.Connection[Any], schemas: Sequence[str]) -> dict[str, str]:
    return {str(r[0]): str(r[1]) for r in conn.execute(FINGERPRINT_SQL, {"schemas": list(schemas)})}


@dataclass
class _Part:
    """One run of the cache: its schemas, their fingerprints at its snapshot, its sections cut by schema (None
    until read; error: why it cannot serve)."""

    schemas: list[str]
    prints: dict[str, str] = field(default_factory=dict)
    sections: dict[str, SplitScript] | None = None
    error: str = ""
    started: threading.Event = field(default_factory=threading.Event)
    done: threading.Event = field(default_factory=threading.Event)


class CachedDump(SchemaDump):
    """A batch's part of the cache, read as a SchemaDump is (section, close). Whether its schemas still stand as
    the cache read them is asked on a thread of its own, beside the batch's checks (the catalog query takes some
    0.3 s at 8192 shards); when one changed, that thread runs the batch's own pg_dump, and section() is its."""

    def __init__(self, source_dsn: str, parts: list[tuple[_Part, set[str]]], schemas: Sequence[str], *, encoding: str) -> None:  # noqa: D107
        self.dsn = source_dsn
        self._parts = parts
        self._schemas = list(schemas)
        self.encoding = encoding
        self.schema = schemas[0] if len(schemas) == 1 else f"{schemas[0]} and {len(schemas) - 1} more schemas"
        self.sections = COPY_SECTIONS
        self.dump = None
        self.printing = {}
        self.tee = None
        self._ok = False
        self._own: SchemaDump | None = None
        self._scripts: dict[str, bytes] = {}
        self._error: BaseException | None = None
        self._closed = False
        self._lock = threading.Lock()
        self._check = threading.Thread(target=self._verify, daemon=True)  # its pg_dump dies with it (transfer._spawn)
        self._check.start()

    def _verify(self) -> None:
        try:
            with connect("the source", self.dsn, autocommit=True) as conn:
                now = fingerprints(conn, self._schemas)
            prints = {s: p.prints.get(s) for p, mine in self._parts for s in mine}
            if all(now.get(s) is not None and now[s] == prints.get(s) for s in self._schemas):
                self._ok = True
                return
            with self._lock:
                if self._closed:
                    return
                own = self._own = SchemaDump(self.dsn, self._schemas, encoding=self.encoding, sections=COPY_SECTIONS)
            try:
                self._scripts = {s: own.section(s) for s in COPY_SECTIONS}
            finally:
                own.close()
        except BaseException as e:  # noqa: BLE001 - section() raises it
            self._error = e

    def served(self) -> bool:
        """Whether the cache's part served (else the batch's own pg_dump did): once the check is done."""
        self._check.join()
        return self._ok

    def close(self) -> None:
        with self._lock:
            self._closed = True
            own = self._own
        if own is not None:
            own.close()
        self._check.join()

    def section(self, section: str) -> bytes:
        self._check.join()
        if self._error is not None:
            raise self._error
        if not self._ok:
            return self._scripts[section]
        state: dict[bytes, bytes] = {}
        body = b"".join(p.sections[section].part(mine, state) for p, mine in self._parts if p.sections is not None)
        first = next(p.sections[section] for p, _ in self._parts if p.sections is not None)
        return script_of(first.head + body + first.tail, self.schema)


class SchemaCache:
    """The schema-only dumps of runs (lists of schemas, in the order the batches will want them) from source_dsn,
    one after another on a thread of its own; take() hands a batch its part. close() stops a dump running."""

    def __init__(self, source_dsn: str, runs: Sequence[Sequence[str]]) -> None:
        self.dsn = source_dsn
        self.parts = [_Part(list(r)) for r in runs if r]
        self._of = {s: p for p in self.parts for s in p.schemas}
        self._stop = threading.Event()
        self._running: SchemaDump | None = None
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._read_all, daemon=True)  # its pg_dump dies with it (transfer._spawn)
        self._thread.start()

    def _read_all(self) -> None:
        for part in self.parts:
            part.started.set()
            if self._stop.is_set():
                part.error = "stopped"
            else:
                try:
                    self._read(part)
                except Exception as e:  # noqa: BLE001 - a batch without its part dumps its own schema
                    part.error = str(e) or type(e).__name__
            part.done.set()

    def _read(self, part: _Part) -> None:
        with connect("the source", self.dsn, autocommit=True) as conn:
            encoding = server_encoding(conn)
            conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ, READ ONLY")
            snapshot = str(conn.execute("SELECT pg_catalog.pg_export_snapshot()").fetchone()[0])  # type: ignore[index]
            part.prints = fingerprints(conn, part.schemas)
            with self._lock:
                if self._stop.is_set():
                    raise RuntimeError("stopped")
                dump = self._running = SchemaDump(self.dsn, part.schemas, encoding=encoding, sections=COPY_SECTIONS, snapshot=snapshot)
            try:
                scripts = {s: dump.section(s) for s in COPY_SECTIONS}
            finally:
                with self._lock:
                    self._running = None
                dump.close()
            conn.rollback()
        part.sections = {s: SplitScript.parse(text, part.schemas) for s, text in scripts.items()}

    def take(self, conn: psycopg.Connection[Any], schemas: Sequence[str]) -> CachedDump | None:
        """The dump of schemas from the cache, if every one is in a part read already or being read (waited for:
        pg_dump's read of the whole catalog is most of either's time, and a dump of the batch's own beside the
        cache's would take CPU from both); else None: the caller dumps them itself. It checks on a thread of its own that they are unchanged
        since, else dumps them afresh (CachedDump)."""
        parts: dict[int, tuple[_Part, set[str]]] = {}
        for s in schemas:
            part = self._of.get(s)
            if part is None:
                return None
            parts.setdefault(id(part), (part, set()))[1].add(s)
        for part, _ in parts.values():
            if not part.started.is_set():
                return None
            # being read: no later than a pg_dump of the batch's own would be (each reads the whole catalog); one
            # that waits on a lock (DDL queued behind a long transaction) is given up after TAKE_WAIT_S
            if not part.done.wait(TAKE_WAIT_S) or part.sections is None:
                return None
        return CachedDump(self.dsn, sorted(parts.values(), key=lambda p: self.parts.index(p[0])), schemas, encoding=server_encoding(conn))

    def close(self) -> None:
        self._stop.set()
        with self._lock:
            if self._running is not None:
                self._running.close()
        self._thread.join()


def cache_for(source_dsn: str, batches: Sequence[Batch], lock_budget: int) -> SchemaCache | None:
    """The cache of a set move cut into batches: one run of the shards of all but the first (that one dumps its
    own while the cache reads the rest). Each run pays pg_dump's read of the whole catalog (1.5 s at 8192 shards
    on an idle server, 6-7 s under a rebalance's load), and dumping more schemas in it costs little more (2018
    schemas of two tables: 10.6 s): runs growing fourfold made five a stream at 8192 shards, and batches that
    outgrew them (the pacer doubles batches) dumped their own beside them, 18 pg_dumps in all for two streams.
    A batch waits for the run being read (take). A run's tables (pg_dump locks each) take at most half of a
    batch's share of the lock table (it runs beside a batch): on a server of default lock settings the shards
    are cut into runs that fit, read one after another. None for a move of one batch."""
    if len(batches) < 2:
        return None
    runs: list[list[str]] = [[]]
    locks = 0
    for b in batches[1:]:
        for ctx, cost in zip(b.ctxs, b.costs, strict=True):
            need = max(1, cost.tables)
            if runs[-1] and locks + need > max(1, lock_budget // 2):
                runs.append([])
                locks = 0
            runs[-1].append(ctx.schema)
            locks += need
    return SchemaCache(source_dsn, runs)
