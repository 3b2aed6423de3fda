"""The cutover's verification done ahead of its pause, in rounds: the pause re-reads only the keys written since.

Verified whole in the pause, an import's every row is read twice (source and shard) while the application waits.
Here the whole comparison runs before the pause, while the source still takes writes; the pause compares only the
route values (keys) written since.

Armed on each target before the first round (arm_sql): a trigger on every shard table of the import, ENABLE ALWAYS
(it fires in the subscription's workers, and for settle's writes), records in pgidgen_import.changed each row's
table, route value (the key; a --key-of table's column that refers to its parent; on a parent, that column's value
for each child table too, whose rows' shard follows the parent's) and the shard schema it was written in. A TRUNCATE
records its table whole, compared whole in the pause. A --key-of table's route values are recorded also when the
subscription writes its staging table, and when a settle takes its rows to route again (_staged_sql): its rows reach
a shard only through a settle, which may place a row nowhere on a target (its parent came and left between two
settles) where the source has it in a shard; "no row written" must mean "no row that may have moved".

A round (Ahead.round):
1. a REPEATABLE READ snapshot on the source (S) and on every target (T);
2. a heartbeat written on the source after S, awaited on every target (every change S sees is applied), the
   --key-of rows settled, then the values written so far taken out of pgidgen_import.changed (X);
3. the first round compares every shard's count and checksum at S and T, each less the rows of the values in X. A
   value not in X had no row written on a target between the arming and the taking: each change of its rows that S
   sees was applied (and settled) before the heartbeat arrived, so before the arming, so T sees it; each change T
   sees came before the arming, so S sees it. Its rows are the same on both sides, and stay so until one is written
   again, which puts the value in a later X;
4. later rounds compare, value by value, the values taken before that are not in their own X; the others wait.
Rounds go on until few values wait. In the pause (the source's writes stopped, the targets caught up and settled),
Ahead.finish compares the waiting values and the last ones taken, as they are now. A target's rows of a value are
looked for in its source shard and in every shard a row of it was written to since it was last compared: a row put
in the wrong shard is found there. Killed and resumed, an import has no rounds in memory and verifies whole.
"""
from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import psycopg
from psycopg import sql

from ..config import Config
from ..db import connect, execute_script, pg_message
from ..errors import DatabaseError
from ..idgen import schema_name
from . import settle
from .source import WORK_SCHEMA, ImportPlan, TablePlan, shard_expr
from .sqltext import TEXT_FORM_SQL, checksum_sql, checksum_terms, orphaned, parent_join, shard_checksums_sql

#: rounds ahead of the pause stop when this few values wait (the pause reads their rows by index)
FEW = 2000
ROUNDS = 6
TRIGGERS = ("pgidgen_changed", "pgidgen_changed_all")
Key = tuple[str, str]  # (table, route value as text)
Sums = dict[Any, tuple[int, int]]  # shard (None: a row with no parent) -> (rows, checksum)
Say = Callable[[str], None]


def _s(c: sql.Composable) -> str:
    return c.as_string(None)


def _q(*parts: str) -> str:
    return _s(sql.Identifier(*parts))


def route_column(plan: ImportPlan, t: TablePlan) -> str:
    return t.via if t.parent and t.via else plan.key


def _records(plan: ImportPlan, t: TablePlan) -> list[tuple[str, str]]:
    """(table, column) pairs a write to t's rows records: its own route value, and its children's."""
    return [(t.name, route_column(plan, t))] + [(c.name, c.parent_column) for c in plan.tables if c.parent == t.name and c.parent_column]


def _function_sql(plan: ImportPlan, t: TablePlan, *, armed: bool) -> str:
    w = _q(WORK_SCHEMA)
    recs = _records(plan, t)

    def values(row: str, pairs: list[tuple[str, str]], d: int) -> str:
        return ", ".join(f"({_s(sql.Literal(tbl))}, {row}.{_q(col)}::text, TG_TABLE_SCHEMA, {d})" for tbl, col in pairs)
    whole = ", ".join(f"({_s(sql.Literal(tbl))}, NULL, TG_TABLE_SCHEMA, 0)" for tbl, _ in recs)
    own, children = recs[:1], recs[1:]
    moved = " OR ".join([f"OLD.{_q(route_column(plan, t))} IS DISTINCT FROM NEW.{_q(route_column(plan, t))}"] +
                        [f"OLD.{_q(col)} IS DISTINCT FROM NEW.{_q(col)}" for _, col in children])
    body = "    RETURN NULL;\n" if not armed else (
        f"    IF TG_TABLE_SCHEMA = {_s(sql.Literal(WORK_SCHEMA))} THEN RETURN NULL; END IF;  -- a catch-all: other databases' rows\n"
        f"    IF TG_LEVEL = 'STATEMENT' THEN INSERT INTO {w}.changed VALUES {whole}; RETURN NULL; END IF;\n"
        f"    IF TG_OP <> 'INSERT' THEN INSERT INTO {w}.changed VALUES {values('OLD', own, -1)}; END IF;\n"
        f"    IF TG_OP <> 'DELETE' THEN INSERT INTO {w}.changed VALUES {values('NEW', own, 1)}; END IF;\n"
        + (f"    IF TG_OP = 'UPDATE' AND NOT ({moved}) THEN RETURN NULL; END IF;\n"
           f"    IF TG_OP <> 'INSERT' THEN INSERT INTO {w}.changed VALUES {values('OLD', children, 0)}; END IF;\n"
           f"    IF TG_OP <> 'DELETE' THEN INSERT INTO {w}.changed VALUES {values('NEW', children, 0)}; END IF;\n" if children else "")
        + "    RETURN NULL;\n")
    return (f"CREATE OR REPLACE FUNCTION {_q(WORK_SCHEMA, f'changed_{t.name}')}() RETURNS trigger LANGUAGE plpgsql"
            f" SET search_path = pg_catalog AS $body$\nBEGIN\n{body}END\n$body$;\n")


def _staged_sql(plan: ImportPlan, t: TablePlan, *, armed: bool) -> str:
    """A --key-of table's other records, route values only (no rows counted, and in no shard: at is the work
    schema): the subscription's writes to its staging table (staged_), and the rows a settle takes to route again
    (took_, on the dirty keys' DELETE). A row may be routed nowhere on a target between two settles (its parent
    came to the database and left again), where the source's snapshot has it in a shard: nothing is written to a
    shard, yet the value's rows differ. So a value is recorded whenever its rows may move, not only when they do."""
    w, lit = _q(WORK_SCHEMA), _s(sql.Literal(t.name))
    col = _q(route_column(plan, t))
    row = ("    RETURN NULL;\n" if not armed else
           f"    IF TG_OP <> 'INSERT' THEN INSERT INTO {w}.changed VALUES ({lit}, OLD.{col}::text, {_s(sql.Literal(WORK_SCHEMA))}, 0); END IF;\n"
           f"    IF TG_OP <> 'DELETE' THEN INSERT INTO {w}.changed VALUES ({lit}, NEW.{col}::text, {_s(sql.Literal(WORK_SCHEMA))}, 0); END IF;\n"
           "    RETURN NULL;\n")
    took = ("    RETURN NULL;\n" if not armed else
            f"    INSERT INTO {w}.changed SELECT DISTINCT {lit}, s.{col}::text, {_s(sql.Literal(WORK_SCHEMA))}, 0::smallint"
            f" FROM pgidgen_took k JOIN {_q(plan.schema, t.name)} s ON ({_cols(t.pk, 's')}) = ({_cols(t.pk, 'k')});\n"
            "    RETURN NULL;\n")
    return "".join(f"CREATE OR REPLACE FUNCTION {_q(WORK_SCHEMA, f'{kind}_{t.name}')}() RETURNS trigger LANGUAGE plpgsql"
                   f" SET search_path = pg_catalog AS $body$\nBEGIN\n{body}END\n$body$;\n" for kind, body in (("staged", row), ("took", took)))


def _cols(columns: list[str], alias: str) -> str:
    return ", ".join(_q(alias, c) for c in columns)


def _relations(plan: ImportPlan, database: str, t: TablePlan) -> list[str]:
    """Where a table's trigger goes: a keyed table's staging table (its shards' tables are its partitions: the
    trigger is cloned onto each, and leaves with it when they are detached), a --key-of table's shard tables."""
    return [_q(schema_name(s), t.name) for s in plan.targets[database]] if t.parent else [_q(plan.schema, t.name)]


def arm_sql(plan: ImportPlan, database: str) -> str:
    """One target's recording of written values: the table, each table's function and its triggers; one transaction."""
    out = [f"CREATE TABLE {_q(WORK_SCHEMA, 'changed')} (tbl text NOT NULL, v text, at text NOT NULL, d smallint NOT NULL);"]
    for t in plan.tables:
        out.append(_function_sql(plan, t, armed=True).rstrip("\n"))
        fn = _q(WORK_SCHEMA, f"changed_{t.name}")
        for rel in _relations(plan, database, t):
            out.append(f"CREATE TRIGGER {TRIGGERS[0]} AFTER INSERT OR UPDATE OR DELETE ON {rel} FOR EACH ROW EXECUTE FUNCTION {fn}();")
            out.append(f"CREATE TRIGGER {TRIGGERS[1]} AFTER TRUNCATE ON {rel} FOR EACH STATEMENT EXECUTE FUNCTION {fn}();")
            out += [f"ALTER TABLE {rel} ENABLE ALWAYS TRIGGER {name};" for name in TRIGGERS]
        if t.parent:
            out.append(_staged_sql(plan, t, armed=True).rstrip("\n"))
    return "\n".join(out) + "\n"


def staged_triggers_sql(plan: ImportPlan) -> list[str]:
    """_staged_sql's triggers, a transaction each (arm_sql's transaction made their functions): each is on a table
    the subscription's worker writes in its own order, and one transaction that locked two of them could wait for
    it while it waits for this (seen: a lock timeout 20 times running under a writer). Made again on a resume."""
    out = []
    for t in plan.tables:
        if t.parent:
            staging, dirty = _q(plan.schema, t.name), _q(WORK_SCHEMA, f"{t.name}_dirty")
            out += [f"CREATE OR REPLACE TRIGGER pgidgen_staged AFTER INSERT OR UPDATE OR DELETE ON {staging} FOR EACH ROW"
                    f" EXECUTE FUNCTION {_q(WORK_SCHEMA, f'staged_{t.name}')}();\nALTER TABLE {staging} ENABLE ALWAYS TRIGGER pgidgen_staged;\n",
                    f"CREATE OR REPLACE TRIGGER pgidgen_took AFTER DELETE ON {dirty} REFERENCING OLD TABLE AS pgidgen_took FOR EACH STATEMENT"
                    f" EXECUTE FUNCTION {_q(WORK_SCHEMA, f'took_{t.name}')}();\nALTER TABLE {dirty} ENABLE ALWAYS TRIGGER pgidgen_took;\n"]
    return out


def disarm_sql(plan: ImportPlan) -> str:
    """The functions emptied (no table lock): once the shards open, the application's writes are not recorded."""
    return _functions_sql(plan, armed=False)


def _functions_sql(plan: ImportPlan, *, armed: bool) -> str:
    """Every recording function, armed (recording) or not."""
    return "".join(_function_sql(plan, t, armed=armed) + (_staged_sql(plan, t, armed=armed) if t.parent else "") for t in plan.tables)


def drop_triggers_sql(conn: psycopg.Connection[Any], plan: ImportPlan) -> list[str]:
    """The teardown's: the triggers left on --key-of shard tables (a keyed table's leave with their detach), a
    statement each."""
    rows = conn.execute("SELECT n.nspname, c.relname, g.tgname FROM pg_catalog.pg_trigger g JOIN pg_catalog.pg_class c ON c.oid = g.tgrelid"
                        " JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace"
                        " WHERE g.tgname = ANY(%s) AND g.tgparentid = 0 AND n.nspname <> ALL(%s) ORDER BY 1, 2",
                        (list(TRIGGERS), [plan.schema, WORK_SCHEMA])).fetchall()
    return [f"DROP TRIGGER {_q(str(g))} ON {_q(str(n), str(c))};" for n, c, g in rows]


def arm(config: Config, plan: ImportPlan) -> None:
    """Armed once (a resumed cutover finds the table and arms the functions again: recording went on meanwhile)."""
    for name in plan.targets:
        with connect(name, config.dsn(name), autocommit=True) as conn:
            def script(conn: psycopg.Connection[Any], name: str = name) -> str:
                made = conn.execute("SELECT pg_catalog.to_regclass(%s)", (_q(WORK_SCHEMA, "changed"),)).fetchone() != (None,)
                return _functions_sql(plan, armed=True) if made else arm_sql(plan, name)
            try:
                settle.under_writes(conn, script)
                for text in staged_triggers_sql(plan):
                    settle.under_writes(conn, text)
            except psycopg.Error as e:
                raise DatabaseError(f"database {name} failed while arming the verification: {pg_message(e)}",
                                    hint="fix what it says, then pgidgen import --cutover (or --rollback)") from None


def disarm(config: Config, plan: ImportPlan) -> None:
    for name in plan.targets:
        with connect(name, config.dsn(name), autocommit=True) as conn:
            if conn.execute("SELECT pg_catalog.to_regclass(%s)", (_q(WORK_SCHEMA, "changed"),)).fetchone() != (None,):
                execute_script(conn, disarm_sql(plan))


def _values_sql(plan: ImportPlan, t: TablePlan, typ: str, by_text: bool) -> str:
    """The source's rows of some route values ($1, text): (value, shard, rows, checksum)."""
    col = route_column(plan, t)
    terms = checksum_terms("pgidgen_row", by_text)
    want = f"{_q('pgidgen_row', col)} = ANY({{values}}::text[]::{typ}[])"
    if not t.parent:
        return _placed(f"SELECT {_q('pgidgen_row', col)}::text, {_s(shard_expr(plan.key, plan.shard_count))}, {terms}"
                       f" FROM {_q(plan.schema, t.name)} AS pgidgen_row WHERE {want} GROUP BY 1, 2")
    joins, shard = parent_join(plan, t)
    return _placed(f"SELECT {_q('pgidgen_row', col)}::text, {shard}, {terms} FROM {_q(plan.schema, t.name)} AS pgidgen_row{joins} WHERE {want} GROUP BY 1, 2")


def _shard_values_sql(plan: ImportPlan, t: TablePlan, typ: str, by_text: bool, schemas: list[str]) -> str:
    """A target's rows of some route values in some of its shards ($1 per shard, text): (shard, value, rows, checksum)."""
    col = _q("pgidgen_row", route_column(plan, t))
    terms = checksum_terms("pgidgen_row", by_text)
    return _placed("\nUNION ALL ".join(f"SELECT {int(s.removeprefix('shard_'))}, {col}::text, {terms} FROM {_q(s, t.name)} AS pgidgen_row"
                                       f" WHERE {col} = ANY({{values}}::text[]::{typ}[]) GROUP BY 2" for s in schemas))


def _placed(text: str) -> str:
    """A query's text for psycopg's parameters: its own % doubled, {values} the placeholders."""
    return text.replace("%", "%%").replace("{values}", "%s")


def _rows(n: int) -> str:
    return f"{n} row{'' if n == 1 else 's'}"


def _read(conn: psycopg.Connection[Any]) -> None:
    """A read-only snapshot, fixed now, under the settings that fix rows' text form."""
    conn.execute(b"BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
    execute_script(conn, TEXT_FORM_SQL)
    conn.execute(b"SELECT 1")


@dataclass
class Ahead:
    config: Config
    plan: ImportPlan
    forms: dict[str, bool]  # table -> checksummed by its rows' text
    types: dict[str, str]  # table -> its route column's type
    #: values taken and not yet compared since -> the shard schemas their rows were written to
    waiting: dict[Key, set[str]] = field(default_factory=dict)
    counts: dict[Key, int] = field(default_factory=dict)  # value -> its source rows when last compared
    base: dict[str, int] = field(default_factory=dict)  # table -> source rows of the first round outside its values taken
    whole: set[str] = field(default_factory=set)  # tables a TRUNCATE marked
    rounds: int = 0
    checked: int = 0  # values the pause compared
    seen: set[Key] = field(default_factory=set)  # the values the first round took (their rows are out of base)
    #: rows added less rows removed, per value, in what was taken after the first round: base counts a value the
    #: first round did not take as it was then, so its rows now are base's and this
    delta: dict[Key, int] = field(default_factory=dict)

    @classmethod
    def make(cls, config: Config, src: psycopg.Connection[Any], plan: ImportPlan, forms: dict[str, bool]) -> Ahead:
        types = {}
        for t in plan.tables:
            row = src.execute("SELECT pg_catalog.format_type(atttypid, atttypmod) FROM pg_catalog.pg_attribute"
                              " WHERE attrelid = %s::pg_catalog.regclass AND attname = %s",
                              (_q(plan.schema, t.name), route_column(plan, t))).fetchone()
            assert row is not None
            types[t.name] = str(row[0])
        return cls(config, plan, forms, types)

    def _db_of(self) -> dict[int, str]:
        return {s: name for name, shards in self.plan.targets.items() for s in shards}

    def _take(self, conns: dict[str, psycopg.Connection[Any]], *, first: bool = False) -> dict[Key, set[str]]:
        taken: dict[Key, set[str]] = {}
        for conn in conns.values():
            for tbl, v, at, d in conn.execute(f"DELETE FROM {_q(WORK_SCHEMA, 'changed')} RETURNING tbl, v, at, d".encode()).fetchall():
                if v is None:
                    self.whole.add(str(tbl))
                    continue
                k = (str(tbl), str(v))
                taken.setdefault(k, set()).add(str(at))
                if not first:
                    self.delta[k] = self.delta.get(k, 0) + int(d)
        return taken

    def _source_values(self, conn: psycopg.Connection[Any], keys: list[Key]) -> dict[Key, Sums]:
        out: dict[Key, Sums] = {k: {} for k in keys}
        for t in self.plan.tables:
            vs = [v for tbl, v in keys if tbl == t.name]
            if vs:
                q = _values_sql(self.plan, t, self.types[t.name], self.forms[t.name])
                for v, shard, n, total in conn.execute(q.encode(), (vs,)).fetchall():
                    out[(t.name, str(v))][None if shard is None else int(shard)] = (int(n), int(total))
        return out

    def _target_values(self, conns: dict[str, psycopg.Connection[Any]], where: dict[Key, set[str]]) -> dict[Key, Sums]:
        """Each value's rows on the targets, in the shards where says (those each database serves), the databases
        in parallel."""
        out: dict[Key, Sums] = {k: {} for k in where}
        with ThreadPoolExecutor(max_workers=len(conns)) as pool:
            for part in pool.map(lambda item: self._one_target(item[0], item[1], where), conns.items()):
                for k, sums in part.items():
                    out[k].update(sums)
        return out

    def _one_target(self, name: str, conn: psycopg.Connection[Any], where: dict[Key, set[str]]) -> dict[Key, Sums]:
        """One target's part of _target_values."""
        out: dict[Key, Sums] = {}
        mine = {schema_name(s) for s in self.plan.targets[name]}
        for t in self.plan.tables:
            by_schema: dict[str, list[str]] = {}
            for (tbl, v), schemas in where.items():
                if tbl == t.name:
                    for s in schemas & mine:
                        by_schema.setdefault(s, []).append(v)
            if by_schema:
                order = sorted(by_schema)
                q = _shard_values_sql(self.plan, t, self.types[t.name], self.forms[t.name], order)
                for shard, v, n, total in conn.execute(q.encode(), [by_schema[s] for s in order]).fetchall():
                    out.setdefault((t.name, str(v)), {})[int(shard)] = (int(n), int(total))
        return out

    def _compare_values(self, keys: list[Key], src: dict[Key, Sums], tgt: dict[Key, Sums], problems: list[str]) -> None:
        db_of = self._db_of()
        for k in keys:
            want, have = src[k], tgt[k]
            t = next(x for x in self.plan.tables if x.name == k[0])
            if None in want:
                problems.append(f"{want[None][0]} rows of {self.plan.schema}.{k[0]} whose {route_column(self.plan, t)} is {k[1]} {orphaned(self.plan, t)}:"
                                " they have no shard")
            for shard in sorted((set(want) | set(have)) - {None}):
                (n, a), (m, b) = have.get(shard, (0, 0)), want.get(shard, (0, 0))
                if (n, a) != (m, b):
                    problems.append(f"{schema_name(shard)}.{k[0]} on {db_of.get(shard, '?')}, rows whose {route_column(self.plan, t)} is {k[1]}: "
                                    + (f"{_rows(n)}, the source {m}" if n != m else f"its {_rows(n)} {'differs' if n == 1 else 'differ'} from the source's (checksum)"))
            self.counts[k] = sum(n for n, _ in want.values())


    def _where(self, locations: dict[Key, set[str]], keys: list[Key]) -> dict[Key, set[str]]:
        """Where a value's rows are looked for on the targets: every shard a row of it was written to since it was
        last compared, and a keyed table's in its key's shard. (A --key-of row not written since lies in its
        parent's shard, where any change of it or of its parent would have written it.)"""
        n = self.plan.shard_count
        keyed = {t.name for t in self.plan.tables if not t.parent}
        return {k: set(locations.get(k, ())) | ({schema_name((int(k[1]) % n + n) % n)} if k[0] in keyed else set()) for k in keys}

    def _values(self, source: psycopg.Connection[Any], conns: dict[str, psycopg.Connection[Any]], keys: list[Key],
                locations: dict[Key, set[str]]) -> tuple[dict[Key, Sums], dict[Key, Sums]]:
        """The values' rows on the source and on the targets, read at once; then, for a --key-of value, the
        targets' rows in the shards where the source has them and the first read did not look. Such a row's shard
        follows its parent's, on each target when that target settles the parent's change: a change the source
        made after its snapshot may be settled on one target and not yet on another, whose rows of the value are
        still where they were, where the source's snapshot has them too, and nothing written there recorded it."""
        where = self._where(locations, keys)
        with ThreadPoolExecutor(max_workers=1) as pool:
            found = pool.submit(self._source_values, source, keys)
            have = self._target_values(conns, where)
            want = found.result()
        routed = {t.name for t in self.plan.tables if t.parent}
        more = {k: extra for k in keys if k[0] in routed
                and (extra := {schema_name(s) for s in want.get(k, {}) if s is not None} - where[k])}
        if more:
            for k, sums in self._target_values(conns, more).items():
                have[k].update(sums)
        return want, have

    def round(self, dsn: str, heartbeat: psycopg.Connection[Any], say: Say) -> list[str]:
        """One round ahead of the pause (the first compares whole); the problems found."""
        first = self.rounds == 0
        self.rounds += 1
        names = list(self.plan.targets)
        reads = {n: connect(n, self.config.dsn(n), autocommit=True) for n in names}
        takes = {n: connect(n, self.config.dsn(n), autocommit=True) for n in names}
        source = connect("source", dsn, autocommit=True)
        problems: list[str] = []
        try:
            _read(source)
            for c in reads.values():
                _read(c)
            token = uuid.uuid4().hex
            heartbeat.execute(f"INSERT INTO {_q(WORK_SCHEMA, 'heartbeat')} (token) VALUES (%s)".encode(), (token,))
            deadline = time.monotonic() + 600
            for name, c in takes.items():
                while c.execute(f"SELECT FROM {_q(WORK_SCHEMA, 'heartbeat')} WHERE token = %s".encode(), (token,)).fetchone() is None:
                    if time.monotonic() > deadline:
                        raise DatabaseError(f"database {name} did not catch up with the source in 10 minutes",
                                            hint="the source serves on: look at that server's log, then pgidgen import --cutover again, or --rollback")
                    time.sleep(0.005)
            settle.settle(self.config, self.plan)
            taken = self._take(takes, first=first)
            if first:
                keys = [k for k in taken if k[0] not in self.whole]
                say(f"import: verifying ahead of the pause, round 1: every row ({len(keys)} keys written meanwhile)")
                self._compare_whole(source, reads, keys, taken, problems)
                self.waiting = dict(taken)
                self.seen = set(keys)
            else:
                keys = [k for k in self.waiting if k not in taken and k[0] not in self.whole]
                say(f"import: verifying ahead of the pause, round {self.rounds}: {len(keys)} keys ({len(taken)} written since)")
                self._compare_values(keys, *self._values(source, reads, keys, self.waiting), problems)
                for k in keys:
                    del self.waiting[k]
                for k, at in taken.items():
                    self.waiting.setdefault(k, set()).update(at)
        except psycopg.Error as e:
            raise DatabaseError(f"verifying ahead of the cutover failed: {pg_message(e)}",
                                hint="the source serves on: pgidgen import --cutover tries again, --rollback undoes the import") from None
        finally:
            for c in [source, *reads.values(), *takes.values()]:
                c.close()
        return problems

    def _compare_whole(self, source: psycopg.Connection[Any], reads: dict[str, psycopg.Connection[Any]], keys: list[Key],
                       taken: dict[Key, set[str]], problems: list[str]) -> None:
        """The first round: every shard's sums at S and T, less the rows of the values taken (compared later)."""
        plan = self.plan

        def target_side(name: str) -> dict[str, Sums]:
            conn = reads[name]
            return {t.name: {int(r[0]): (int(r[1]), int(r[2])) for r in conn.execute(
                shard_checksums_sql(plan, t.name, name, by_text=self.forms[t.name]).encode()).fetchall()} for t in plan.tables if t.name not in self.whole}

        with ThreadPoolExecutor(max_workers=len(reads)) as pool:
            pending = {name: pool.submit(target_side, name) for name in reads}
            wants = {t.name: {None if r[0] is None else int(r[0]): (int(r[1]), int(r[2])) for r in source.execute(
                checksum_sql(plan, t, by_text=self.forms[t.name]).encode()).fetchall()} for t in plan.tables if t.name not in self.whole}
            haves = {name: f.result() for name, f in pending.items()}
        src, tgt = self._values(source, reads, keys, taken)
        for t in plan.tables:
            if t.name in self.whole:
                continue
            want, have = dict(wants[t.name]), {s: v for name in haves for s, v in haves[name][t.name].items()}
            for sums, side in ((want, src), (have, tgt)):  # less the values taken
                for k in keys:
                    if k[0] == t.name:
                        for shard, (n, total) in side[k].items():
                            m, b = sums.get(shard, (0, 0))
                            sums[shard] = (m - n, b - total)
            orphans = want.pop(None, (0, 0))[0]
            if orphans:
                problems.append(f"{orphans} rows of {plan.schema}.{t.name} {orphaned(plan, t)}: they have no shard")
            db_of = self._db_of()
            for s in sorted(db_of):
                (n, a), (m, b) = have.get(s, (0, 0)), want.get(s, (0, 0))
                if n != m:
                    problems.append(f"{schema_name(s)}.{t.name} on {db_of[s]}: {n} rows, the source {m}")
                elif a != b:
                    problems.append(f"{schema_name(s)}.{t.name} on {db_of[s]}: its {n} rows differ from the source's (checksum)")
            self.base[t.name] = sum(n for n, _ in want.values())

    def run(self, dsn: str, heartbeat: psycopg.Connection[Any], say: Say) -> list[str]:
        """Rounds until few values wait (at most ROUNDS); the problems the first found."""
        while True:
            problems = self.round(dsn, heartbeat, say)
            if problems or len(self.waiting) <= FEW or self.rounds >= ROUNDS:
                return problems

    def finish(self, src: psycopg.Connection[Any]) -> tuple[list[str], dict[str, int]]:
        """In the pause: the waiting values and the last ones taken, compared as they are; (problems, rows verified
        per table). Tables a TRUNCATE marked are left out (the engine verifies them whole)."""
        names = list(self.plan.targets)
        conns = {n: connect(n, self.config.dsn(n), autocommit=True) for n in names}
        problems: list[str] = []
        try:
            for k, at in self._take(conns).items():
                self.waiting.setdefault(k, set()).update(at)
            keys = [k for k in self.waiting if k[0] not in self.whole]
            for c in [src, *conns.values()]:
                _read(c)
            try:
                self._compare_values(keys, *self._values(src, conns, keys, self.waiting), problems)
            finally:
                for c in [src, *conns.values()]:
                    c.execute(b"ROLLBACK")
        finally:
            for c in conns.values():
                c.close()
        verified = {t.name: self.base.get(t.name, 0) + sum(n for k, n in self.counts.items() if k[0] == t.name and k in self.seen)
                    + sum(d for k, d in self.delta.items() if k[0] == t.name and k not in self.seen)
                    for t in self.plan.tables if t.name not in self.whole}
        self.checked = len(keys)
        return problems, verified
