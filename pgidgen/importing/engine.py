"""The import's driver: named steps, each recorded in the source's journal once done, each safe to run again.

schema -> staging -> replicating -> copied (stops here with --follow) -> frozen -> verified -> done.
A killed import goes on with --resume (or --cutover after --follow); before `done`, --rollback leaves the source
as it was (no trigger, slot, publication or journal: the pgidgen_import schema is dropped) and the shards' tables
empty (they stay, as the ledger records their DDL); on a source its tables' owner prepared (prepared.py), the
owner's objects stay and only the gate opens again. Nothing is written before source.inspect's checks pass.
"""
from __future__ import annotations

import json
import re
import subprocess
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import psycopg
from psycopg import sql

from .. import pgbin
from ..config import Config
from ..db import connect, execute_script, pg_message, tool_args
from ..ddl.apply import apply_ddl
from ..ddl.dumpfile import parse_dump
from ..errors import ConflictError, DatabaseError, InputError, PgidgenError
from ..idgen import schema_name
from ..lockwait import LockPolicy, with_lock_retries
from . import ahead, prepared, settle, sqltext
from .ahead import Ahead
from .ids import prove
from .keyof import KeyOf
from .replication import drop_replication, each_target
from .source import WORK_SCHEMA, ImportPlan, TablePlan, inspect

#: Detaches per transaction in the teardown, which runs while the application writes to the shards.
DETACH_CHUNK = 50
STEPS = ("started", "schema", "staging", "replicating", "copied", "frozen", "verified", "done")
Say = Callable[[str], None]
#: called at named points (after each step's work, before its journal line): tests stop an import there
Hook = Callable[[str], None]


@dataclass
class ImportResult:
    plan: ImportPlan
    step: str
    pause_s: float | None = None
    verified: dict[str, int] = field(default_factory=dict)  # table -> rows checked
    lag_bytes: dict[str, int] = field(default_factory=dict)
    #: the verification's rounds ahead of the pause, and the keys the pause compared (None: it compared every row)
    ahead: Ahead | None = field(default=None, repr=False)
    pause_checked: int | None = None
    sequences_ahead: dict[str, int] | None = field(default=None, repr=False)  # the shards' sequences, set before the pause

    def as_dict(self) -> dict[str, Any]:
        return {"schema": self.plan.schema, "key": self.plan.key, "step": self.step, "pause_s": self.pause_s,
                "tables": [t.name for t in self.plan.tables], "skipped": self.plan.skipped,
                "targets": {n: len(s) for n, s in self.plan.targets.items()}, "verified_rows": self.verified, "lag_bytes": self.lag_bytes,
                "id_columns": self.plan.id_columns, "id_bound": self.plan.id_bound,
                "pause_checked_keys": self.pause_checked}


def _source(dsn: str) -> psycopg.Connection[Any]:
    return connect("source", dsn, autocommit=True)


def _journal(conn: psycopg.Connection[Any], schema: str) -> tuple[str, ImportPlan] | None:
    if conn.execute("SELECT pg_catalog.to_regclass('pgidgen_import.journal')").fetchone() == (None,):
        return None
    row = conn.execute("SELECT step, plan FROM pgidgen_import.journal WHERE schema_name = %s", (schema,)).fetchone()
    return None if row is None else (str(row[0]), ImportPlan.from_json(row[1]))


def _record(conn: psycopg.Connection[Any], plan: ImportPlan, step: str) -> None:
    conn.execute("UPDATE pgidgen_import.journal SET step = %s, updated_at = now() WHERE schema_name = %s", (step, plan.schema))


def plan_import(config: Config, source_dsn: str, *, schema: str, key: str, skip: list[str], follow: bool = False,
                ids: str | None = None, key_of: dict[str, KeyOf] | None = None) -> ImportPlan:
    """The checks and the plan, nothing written (--dry-run)."""
    with _source(source_dsn) as conn:
        if _journal(conn, schema) is not None:
            raise ConflictError(f"an import of schema {schema} is under way", where="the source", hint="go on with --resume (or --cutover), or undo it with --rollback")
        plan = inspect(config, conn, schema=schema, key=key, skip=skip, follow=follow, ids=ids, key_of=key_of)
        if plan.prepared:
            prepared.check(conn, plan)
        return plan


def owner_sql(config: Config, source_dsn: str, *, schema: str, key: str, skip: list[str], ids: str | None = None,
              key_of: dict[str, KeyOf] | None = None) -> str:
    """--owner-sql: the SQL with which the tables' owner prepares the source for this import by the connecting role."""
    with _source(source_dsn) as conn:
        if _journal(conn, schema) is not None:
            raise ConflictError(f"an import of schema {schema} is under way", where="the source", hint="go on with --resume (or --cutover), or undo it with --rollback")
        plan = inspect(config, conn, schema=schema, key=key, skip=skip, follow=False, ids=ids, key_of=key_of, owner_sql=True)
        role = conn.execute("SELECT current_user").fetchone()
        assert role is not None
        return prepared.owner_sql(plan, str(role[0]))


def owner_undo_sql(source_dsn: str, *, schema: str) -> str:
    """--owner-sql --rollback: the SQL with which the tables' owner takes the preparation back."""
    with _source(source_dsn) as conn:
        found = _journal(conn, schema)
        return prepared.undo_for(conn, schema, None if found is None else found[0])


def start_import(config: Config, source_dsn: str, *, schema: str, key: str, skip: list[str], follow: bool = False, ids: str | None = None,
                 key_of: dict[str, KeyOf] | None = None, say: Say = lambda _: None, lock_policy: LockPolicy | None = None,
                 hook: Hook | None = None) -> ImportResult:
    plan = plan_import(config, source_dsn, schema=schema, key=key, skip=skip, follow=follow, ids=ids, key_of=key_of)
    with _source(source_dsn) as conn:
        with conn.transaction():
            if not plan.prepared:  # else the owner's preparation made the schema
                execute_script(conn, sqltext.journal_sql())
            conn.execute("INSERT INTO pgidgen_import.journal (schema_name, step, plan) VALUES (%s, 'started', %s)",
                         (schema, json.dumps(plan.as_json())))
    return _run(config, source_dsn, plan, "started", cutover=not follow, say=say, lock_policy=lock_policy, hook=hook)


def resume_import(config: Config, source_dsn: str, *, schema: str, cutover: bool = False, say: Say = lambda _: None,
                  lock_policy: LockPolicy | None = None, hook: Hook | None = None) -> ImportResult:
    """--resume goes as far as the import was asked to (to `copied` with --follow); --cutover to the end."""
    with _source(source_dsn) as conn:
        found = _journal(conn, schema)
    if found is None:
        raise InputError(f"no import of schema {schema} is under way", where="the source", hint="start one with pgidgen import SOURCE --key COLUMN")
    step, plan = found
    return _run(config, source_dsn, plan, step, cutover=cutover or not plan.follow, say=say, lock_policy=lock_policy, hook=hook)


def _run(config: Config, dsn: str, plan: ImportPlan, step: str, *, cutover: bool, say: Say, lock_policy: LockPolicy | None,
         hook: Hook | None) -> ImportResult:
    result = ImportResult(plan, step)
    at = hook or (lambda _: None)
    with _source(dsn) as src:
        steps: list[tuple[str, Callable[[], None]]] = [
            ("schema", lambda: _schema(config, dsn, src, plan, say)),
            ("staging", lambda: _staging(config, plan)),
            ("replicating", lambda: _replicating(config, dsn, src, plan)),
            ("copied", lambda: _wait_copied(config, src, plan, result, say)),
            ("frozen", lambda: _freeze(config, dsn, src, plan, result, lock_policy, say, at)),
            ("verified", lambda: _verify(config, src, plan, result)),
            ("done", lambda: _teardown(config, src, plan, at)),
        ]
        for name, work in steps:
            if STEPS.index(name) <= STEPS.index(step):
                continue
            if name == "frozen" and not cutover:
                result.lag_bytes = _lag(src, plan)
                break
            say(f"import: {name}")
            work()
            at(f"after:{name}")
            _record(src, plan, name)
            result.step = step = name
            if name == "verified" and result.pause_s is not None:  # the shards are open: the writes' pause ends here
                result.pause_s = time.monotonic() - result.pause_s
                say(f"import: verified; the shards are open after a write pause of {result.pause_s * 1000:.0f} ms: write through the Router")
    return result


def _schema(config: Config, dsn: str, src: psycopg.Connection[Any], plan: ImportPlan, say: Say) -> None:
    """The source's own schema, as pg_dump --schema-only writes it, applied to every shard (apply-ddl --from-schema).
    The dump is kept in the journal: a resumed import applies the same file (dumped again, it would differ: the
    import sets some tables' replica identity FULL while it runs)."""
    row = src.execute("SELECT dump FROM pgidgen_import.journal WHERE schema_name = %s", (plan.schema,)).fetchone()
    text = row[0] if row is not None and row[0] is not None else None
    if text is None:
        tool = pgbin.clients_for(src.info.server_version // 10000).bindir / "pg_dump"
        conninfo, env = tool_args(dsn)
        argv = [str(tool), "--schema-only", "--no-owner", "--no-privileges", "-n", plan.schema,
                *[f"--exclude-table={sql.Identifier(plan.schema, t).as_string(None)}" for t in plan.skipped], "-d", conninfo]
        done = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise DatabaseError(f"pg_dump of the source's schema failed: {done.stderr.strip().splitlines()[-1] if done.stderr.strip() else done.returncode}",
                                where="the source")
        # pg_dump's \restrict lines carry a random key, of no use to the shards
        text = re.sub(r"^\\(?:un)?restrict .*\n", "", done.stdout, flags=re.M) + sqltext.ids_sql(plan)
        if plan.prepared:
            text = prepared.strip_dump(text, plan)
        src.execute("UPDATE pgidgen_import.journal SET dump = %s WHERE schema_name = %s", (text, plan.schema))
    parsed = parse_dump(text, f"import-{plan.schema}.sql", plan.schema)
    for line in parsed.summary:
        say(line)
    apply_ddl(config, parsed)


def _staging(config: Config, plan: ImportPlan) -> None:
    def work(name: str, conn: psycopg.Connection[Any]) -> None:
        if conn.execute("SELECT FROM pg_catalog.pg_namespace WHERE nspname = %s", (WORK_SCHEMA,)).fetchone() is None:
            with conn.transaction():
                execute_script(conn, sqltext.staging_sql(plan, name) + settle.staging_all_sql(plan, name))
    each_target(config, plan, work, doing="making the staging tables")


def _replicating(config: Config, dsn: str, src: psycopg.Connection[Any], plan: ImportPlan) -> None:
    if plan.full_identity and not plan.prepared:  # before the slots: every change they decode carries its whole old row
        _on_source(src, plan, sqltext.identity_full_sql(plan))
    try:
        for name in plan.targets:
            slot = plan.slot(name)
            if src.execute("SELECT FROM pg_catalog.pg_publication WHERE pubname = %s", (slot,)).fetchone() is None:
                if plan.prepared:
                    raise DatabaseError(f"the source lacks publication {slot}, which its owner's preparation made", where="the source",
                                        hint="have the tables' owner run the SQL pgidgen import --owner-sql prints again, then pgidgen import --resume")
                src.execute(sqltext.publication_sql(plan, name).encode())
            if src.execute("SELECT FROM pg_catalog.pg_replication_slots WHERE slot_name = %s", (slot,)).fetchone() is None:
                src.execute(sqltext.slot_sql(plan, name).encode())
    except psycopg.Error as e:
        raise DatabaseError(f"the source failed while making publications and slots: {pg_message(e)}",
                            hint="fix what it says, then pgidgen import --resume (or --rollback)") from None

    def work(name: str, conn: psycopg.Connection[Any]) -> None:
        if conn.execute("SELECT FROM pg_catalog.pg_subscription WHERE subname = %s", (plan.slot(name),)).fetchone() is None:
            conn.execute(sqltext.subscription_sql(plan, name, dsn).encode())
    each_target(config, plan, work, doing="subscribing to the source")


def _on_source(src: psycopg.Connection[Any], plan: ImportPlan, script: str) -> None:
    """ALTERs of the source's tables: under a short lock_timeout, retried (the application is not queued behind them)."""
    try:
        with_lock_retries(src, lambda c: execute_script(c, script), schemas=[plan.schema], where="the source")
    except psycopg.Error as e:
        raise DatabaseError(f"the source failed while setting its tables' replica identity: {pg_message(e)}",
                            hint="fix what it says, then pgidgen import --resume (or --rollback)") from None


def _lag(src: psycopg.Connection[Any], plan: ImportPlan) -> dict[str, int]:
    rows = src.execute("SELECT slot_name, pg_catalog.pg_wal_lsn_diff(pg_catalog.pg_current_wal_lsn(), confirmed_flush_lsn)::bigint"
                       " FROM pg_catalog.pg_replication_slots WHERE slot_name = ANY(%s)", ([plan.slot(n) for n in plan.targets],)).fetchall()
    by_slot = {r[0]: int(r[1] or 0) for r in rows}
    return {n: by_slot.get(plan.slot(n), 0) for n in plan.targets}


def _wait_copied(config: Config, src: psycopg.Connection[Any], plan: ImportPlan, result: ImportResult, say: Say) -> None:
    """Until every target's subscription has copied every table (each relation 'r', ready: streaming)."""
    conns = {n: connect(n, config.dsn(n), autocommit=True) for n in plan.targets}
    try:
        last = started = time.monotonic()
        while True:
            pending = 0
            if time.monotonic() - last > 5:
                say(_progress(plan, conns, time.monotonic() - started))
                last = time.monotonic()
            for name, conn in conns.items():
                row = conn.execute(
                    "SELECT count(*) FILTER (WHERE r.srsubstate = 'r'), count(*), coalesce(max(st.sync_error_count + st.apply_error_count), 0)"
                    " FROM pg_catalog.pg_subscription s LEFT JOIN pg_catalog.pg_subscription_rel r ON r.srsubid = s.oid"
                    " LEFT JOIN pg_catalog.pg_stat_subscription_stats st ON st.subid = s.oid WHERE s.subname = %s", (plan.slot(name),)).fetchone()
                assert row is not None
                if row[2]:
                    raise DatabaseError(f"replication into database {name} fails (its server log says why)",
                                        hint="fix it (a row that breaks a shard table's constraint, a full disk), then --resume; or --rollback")
                pending += len(plan.tables) + 1 - int(row[0])
            if pending == 0:
                if settle.keyed_tables(plan):
                    say(f"import: copied; routing every row of {', '.join(t.name for t in settle.keyed_tables(plan))} to its parent's shard")
                settle.make_maps(config, plan)
                settle.settle(config, plan, whole=True)  # key-of tables: every copied row to its parent's shard
                result.lag_bytes = _lag(src, plan)
                return
            time.sleep(0.2)
    finally:
        for c in conns.values():
            c.close()


def _progress(plan: ImportPlan, conns: dict[str, psycopg.Connection[Any]], elapsed: float) -> str:
    """The copy's progress line: rows of the tables copied (the planner's estimates) and of the copies running
    (pg_stat_progress_copy), against the rows every target is to receive; the time left at the pace so far."""
    done = total = 0
    for name, conn in conns.items():
        ready = {str(r[0]) for r in conn.execute(
            "SELECT c.relname FROM pg_catalog.pg_subscription s JOIN pg_catalog.pg_subscription_rel r ON r.srsubid = s.oid"
            " JOIN pg_catalog.pg_class c ON c.oid = r.srrelid WHERE s.subname = %s AND r.srsubstate IN ('r', 's')", (plan.slot(name),))}
        running = conn.execute("SELECT coalesce(sum(tuples_processed), 0)::bigint FROM pg_catalog.pg_stat_progress_copy"
                               " WHERE datname = pg_catalog.current_database()").fetchone()
        total += sum(plan.share(t, name, t.rows) for t in plan.tables)
        done += sum(plan.share(t, name, t.rows) for t in plan.tables if t.name in ready) + int(running[0] if running else 0)
    if not total:
        return "import: copying"
    share = min(done / total, 0.99)
    left = f", about {_duration(elapsed * (1 - share) / share)} left" if share > 0.01 else ""
    return f"import: copying, {share:.0%} (about {done:,} of {total:,} rows){left}"


def _duration(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.0f} min"


def _freeze(config: Config, dsn: str, src: psycopg.Connection[Any], plan: ImportPlan, result: ImportResult, policy: LockPolicy | None,
            say: Say, at: Hook) -> None:
    """The verification's rounds (ahead.py), then the source's writes stopped and every target caught up."""
    settle.catch_up(config, plan)  # key-of tables: the rows changed while following, routed before the pause
    before = _sequence_values(src, plan)
    ahead.arm(config, plan)
    rounds = Ahead.make(config, src, plan, _forms(src, plan))
    problems = rounds.run(dsn, src, say)
    if problems:
        raise DatabaseError(f"verification failed before the cutover: {_listed(problems)}",
                            hint="the source serves on, nothing was cut over: pgidgen import --rollback undoes the import")
    result.ahead = rounds
    result.sequences_ahead = _sequences_ahead(config, src, plan, before)
    at("frozen:ahead")
    _stop_writes(config, dsn, src, plan, result, policy, at)


def _stop_writes(config: Config, dsn: str, src: psycopg.Connection[Any], plan: ImportPlan, result: ImportResult, policy: LockPolicy | None,
                 at: Hook) -> None:
    token = uuid.uuid4().hex
    where_to = f"{plan.shard_count} shards on {', '.join(plan.targets)}"

    def work(conn: psycopg.Connection[Any]) -> None:
        if plan.prepared:  # the owner's gate (prepared.py) for the LOCK and the trigger
            lock, shut = prepared.close_sql(plan)
            conn.execute(lock.encode())
            conn.execute(b"SET LOCAL lock_timeout = 0")
            conn.execute(shut.encode())
            at("frozen:gate")  # shut, not committed
            conn.execute(f"INSERT INTO {sql.Identifier(WORK_SCHEMA).as_string(conn)}.heartbeat (token) VALUES (%s)".encode(), (token,))
        else:
            conn.execute(sqltext.lock_sql(plan).encode())
            conn.execute(b"SET LOCAL lock_timeout = 0")
            execute_script(conn, sqltext.freeze_sql(plan, token, where_to))
        _record(conn, plan, "frozen")

    try:
        with_lock_retries(src, work, schemas=[plan.schema], policy=policy or LockPolicy(wait=60), where="the source")
    except BaseException:
        if plan.prepared:  # the gate's setval is not undone with its transaction: opened again unless the freeze committed
            _reopen_gate(dsn, plan)
        raise
    result.pause_s = time.monotonic()
    conns = {n: connect(n, config.dsn(n), autocommit=True) for n in plan.targets}
    try:
        for name, conn in conns.items():
            deadline = time.monotonic() + 600
            while conn.execute("SELECT FROM pgidgen_import.heartbeat WHERE token = %s", (token,)).fetchone() is None:
                if time.monotonic() > deadline:
                    raise DatabaseError(f"database {name} did not catch up with the source in 10 minutes",
                                        hint="the source's writes are stopped: --resume waits again, --rollback lets them go on")
                time.sleep(0.005)
    finally:
        for c in conns.values():
            c.close()


def _reopen_gate(dsn: str, plan: ImportPlan) -> None:
    try:
        with _source(dsn) as conn, conn.transaction():
            found = _journal(conn, plan.schema)
            if found is not None and STEPS.index(found[0]) < STEPS.index("frozen"):
                execute_script(conn, prepared.open_sql())
    except (PgidgenError, psycopg.Error):
        pass  # the error being raised says what to do; --resume or --rollback set the gate right


def _verify(config: Config, src: psycopg.Connection[Any], plan: ImportPlan, result: ImportResult) -> None:
    """Rows and their checksum, the source (its writes stopped) against the shards: after the rounds ahead of the
    pause, the keys written since (ahead.py); resumed, or for a table a TRUNCATE reached, every row, per shard (the
    catch-all partitions hold other databases' rows and are not read). Key-of tables: settled a last time first
    (this runs again on --resume), and read on the source by their parent's shard. With --ids next_id, the proof
    again: rows that came while the import followed the source are under the bound too."""
    if plan.prepared:  # the freeze committed: the gate shut for good, not by its transaction's status (prepared.py)
        execute_script(src, prepared.shut_sql())
    _compare(config, src, plan, result)
    ahead.disarm(config, plan)  # the shards open next: the application's writes are not recorded
    _carry_sequences(config, src, plan, result.sequences_ahead)  # before the shards open


def _compare(config: Config, src: psycopg.Connection[Any], plan: ImportPlan, result: ImportResult) -> None:
    settle.settle(config, plan)  # the pause's: key-of rows the last changes touched
    if plan.id_bound is not None:
        try:
            prove(src, config.layout, schema=plan.schema, columns=plan.id_columns, bound=plan.id_bound)
        except ConflictError as e:
            raise ConflictError(e.what, where=e.where, hint="the source's writes are stopped: pgidgen import --rollback lets them go on, nothing lost") from None
    problems: list[str] = []
    whole = plan.tables
    if result.ahead is not None:  # the rounds before the pause compared the rest
        problems, verified = result.ahead.finish(src)
        result.verified.update(verified)
        result.pause_checked = result.ahead.checked
        whole = [t for t in plan.tables if t.name in result.ahead.whole]
    if whole:
        problems += _verify_whole(config, src, plan, whole, result)
    if problems:
        raise DatabaseError(f"verification failed: {_listed(problems)}", hint="the source's writes are stopped: pgidgen import --rollback lets them go on, nothing lost")


def _listed(problems: list[str]) -> str:
    return "; ".join(problems[:3]) + (f" (and {len(problems) - 3} more)" if len(problems) > 3 else "")


def _forms(src: psycopg.Connection[Any], plan: ImportPlan) -> dict[str, bool]:
    return {t.name: _by_text(src, plan, t) for t in plan.tables}


def _verify_whole(config: Config, src: psycopg.Connection[Any], plan: ImportPlan, tables: list[TablePlan], result: ImportResult) -> list[str]:
    """Every row of these tables, per shard; the problems found."""
    problems: list[str] = []
    forms = _forms(src, plan)

    def target_side(name: str) -> dict[str, dict[int, tuple[int, int]]]:
        with connect(name, config.dsn(name), autocommit=True) as conn:
            try:
                return {t.name: {int(r[0]): (int(r[1]), int(r[2]))
                                 for r in _settled(conn, sqltext.shard_checksums_sql(plan, t.name, name, by_text=forms[t.name]))}
                        for t in tables}
            except psycopg.Error as e:
                raise DatabaseError(f"database {name} failed while being verified: {pg_message(e)}",
                                    hint="fix what it says, then pgidgen import --resume (or --rollback)") from None

    with ThreadPoolExecutor(max_workers=len(plan.targets)) as pool:  # the targets read while the source is
        pending = {name: pool.submit(target_side, name) for name in plan.targets}
        wants = {t.name: _settled(src, sqltext.checksum_sql(plan, t, by_text=forms[t.name])) for t in tables}
        haves = {name: f.result() for name, f in pending.items()}
    for t in tables:
        rows = wants[t.name]
        want = {int(r[0]): (int(r[1]), int(r[2])) for r in rows if r[0] is not None}
        orphans = sum(int(r[1]) for r in rows if r[0] is None)
        if orphans:
            problems.append(f"{orphans} rows of {plan.schema}.{t.name} {sqltext.orphaned(plan, t)}: they have no shard")
        result.verified[t.name] = sum(n for n, _ in want.values())
        for name in plan.targets:
            have = haves[name][t.name]
            for s in plan.targets[name]:
                (n, sum_have), (m, sum_want) = have.get(s, (0, 0)), want.get(s, (0, 0))
                if n != m:
                    problems.append(f"{schema_name(s)}.{t.name} on {name}: {n} rows, the source {m}")
                elif sum_have != sum_want:
                    problems.append(f"{schema_name(s)}.{t.name} on {name}: its {n} rows differ from the source's (checksum)")
    return problems


def _by_text(src: psycopg.Connection[Any], plan: ImportPlan, t: TablePlan) -> bool:
    """Whether a table is checksummed by its rows' text: a column type not built in, or one without a hash
    function (json, point: hash_record_extended fails on the first row, tried here on one)."""
    if not _builtin_types(src, plan, t.name):
        return True
    try:
        with src.transaction():
            src.execute(sql.SQL("SELECT pg_catalog.hash_record_extended(r, 0) FROM {} AS r LIMIT 1").format(sql.Identifier(plan.schema, t.name)))
    except psycopg.errors.UndefinedFunction:
        return True
    return False


def _builtin_types(src: psycopg.Connection[Any], plan: ImportPlan, table: str) -> bool:
    """Whether every column's type is built in: a type the dump makes anew (an enum's hash is its label's OID,
    which differs on each server; a composite or domain over one) is checksummed by its rows' text instead."""
    row = src.execute("SELECT pg_catalog.bool_and(a.atttypid < 16384) FROM pg_catalog.pg_attribute a"
                      " WHERE a.attrelid = %s::pg_catalog.regclass AND a.attnum > 0 AND NOT a.attisdropped",
                      (sql.Identifier(plan.schema, table).as_string(src),)).fetchone()
    return bool(row and row[0])


def _settled(conn: psycopg.Connection[Any], query: str) -> list[tuple[Any, ...]]:
    """A checksum query under the settings that fix rows' text form (time zone, date and float styles), which
    source and targets may set differently."""
    with conn.transaction():
        execute_script(conn, sqltext.TEXT_FORM_SQL)
        return conn.execute(query.encode()).fetchall()


def _sequence_values(src: psycopg.Connection[Any], plan: ImportPlan) -> dict[str, int]:
    """The source's sequences' last values (those ever called)."""
    values = {}
    for seq in plan.sequences:
        row = src.execute(sql.SQL("SELECT last_value, is_called FROM {}").format(sql.Identifier(plan.schema, seq))).fetchone()
        if row is not None and row[1]:
            values[seq] = int(row[0])
    return values


def _set_sequences(config: Config, plan: ImportPlan, values: dict[str, int]) -> None:
    if values:
        each_target(config, plan, lambda name, conn: execute_script(conn, sqltext.sequences_sql(plan, name, values)),
                     doing="carrying the sequences over", parallel=True)


def _sequences_ahead(config: Config, src: psycopg.Connection[Any], plan: ImportPlan, before: dict[str, int]) -> dict[str, int]:
    """Before the pause: every shard's sequences set past the source's value by ten times what it moved during the
    verification's rounds (at least 1000): the pause then only reads the source's (a sequence has gaps anyway)."""
    now = _sequence_values(src, plan)
    ahead = {seq: v + max(1000, 10 * (v - before.get(seq, v))) for seq, v in now.items()}
    _set_sequences(config, plan, ahead)
    return ahead


def _carry_sequences(config: Config, src: psycopg.Connection[Any], plan: ImportPlan, ahead: dict[str, int] | None) -> None:
    """Every shard's copy of the schema's sequences goes on from the source's value (frozen), before the shards open:
    already, when the values set ahead of the pause are past the source's; else set now."""
    values = _sequence_values(src, plan)
    if ahead is None or any(seq not in ahead or v > ahead[seq] for seq, v in values.items()):
        _set_sequences(config, plan, values)


def _teardown(config: Config, src: psycopg.Connection[Any], plan: ImportPlan, at: Hook) -> None:
    """After the shards opened (the application may write to them): replication gone, the shards' tables detached
    from the staging tables in small transactions, each under a short lock_timeout and retried (a detach locks its
    shard's table: the application waits at most one try), then the staging tables dropped."""
    drop_replication(config, src, plan)
    if plan.full_identity and not plan.prepared:
        _on_source(src, plan, sqltext.identity_restore_sql(plan))
    at("done:replication-dropped")

    def work(name: str, conn: psycopg.Connection[Any]) -> None:
        detach = ahead.drop_triggers_sql(conn, plan) + sqltext.detach_sql(plan, name, _attached(conn, plan))
        shards = [schema_name(s) for s in plan.targets[name]]
        for i in range(0, len(detach), DETACH_CHUNK):
            chunk = "\n".join(detach[i:i + DETACH_CHUNK])

            def run(c: psycopg.Connection[Any], chunk: str = chunk) -> None:
                execute_script(c, chunk)
            with_lock_retries(conn, run, schemas=shards, where=f"database {name}")
        with_lock_retries(conn, lambda c: execute_script(c, sqltext.drop_staging_sql(plan, name)), schemas=[plan.schema, WORK_SCHEMA],
                          where=f"database {name}")
    each_target(config, plan, work, doing="taking the staging tables apart")


def _attached(conn: psycopg.Connection[Any], plan: ImportPlan) -> list[str]:
    rows = conn.execute("SELECT cn.nspname, c.relname FROM pg_catalog.pg_inherits i JOIN pg_catalog.pg_class c ON c.oid = i.inhrelid"
                        " JOIN pg_catalog.pg_namespace cn ON cn.oid = c.relnamespace"
                        " JOIN pg_catalog.pg_class p ON p.oid = i.inhparent JOIN pg_catalog.pg_namespace n ON n.oid = p.relnamespace"
                        " WHERE n.nspname = %s AND p.relkind = 'p'", (plan.schema,)).fetchall()
    return [sql.Identifier(str(r[0]), str(r[1])).as_string(None) for r in rows]


def rollback_import(config: Config, source_dsn: str, *, schema: str, say: Say = lambda _: None) -> ImportPlan:
    """Undo an import that has not finished: the source as it was, serving; the shards' tables empty."""
    with _source(source_dsn) as src:
        found = _journal(src, schema)
        if found is None:
            raise InputError(f"no import of schema {schema} is under way", where="the source", hint="nothing to roll back")
        step, plan = found
        if step == "done":
            raise ConflictError(f"the import of schema {schema} is done", where="the source",
                                hint="the shards are authoritative now; there is no rollback after the cutover")
        if step == "verified":
            raise ConflictError(f"the import of schema {schema} has cut over: the shards are open and may hold new writes", where="the source",
                                hint="there is no rollback after the cutover: finish it with pgidgen import --resume SOURCE (it takes the staging tables apart)")
        say("import: rolling back")
        drop_replication(config, src, plan)

        def work(name: str, conn: psycopg.Connection[Any]) -> None:
            with conn.transaction():
                attached = _attached(conn, plan)
                execute_script(conn, sqltext.unstage_sql(plan, name, attached) if conn.execute(
                    "SELECT FROM pg_catalog.pg_namespace WHERE nspname = %s", (WORK_SCHEMA,)).fetchone() is not None else "")
                if all(conn.execute("SELECT pg_catalog.to_regclass(%s)", (sql.Identifier(schema_name(s), t.name).as_string(conn),)).fetchone() != (None,)
                       for t in plan.tables for s in plan.targets[name]):
                    execute_script(conn, sqltext.empty_shards_sql(plan, name))
        each_target(config, plan, work, doing="rolling back")
        if plan.full_identity and not plan.prepared:
            _on_source(src, plan, sqltext.identity_restore_sql(plan))
        with src.transaction():
            if plan.prepared:
                execute_script(src, prepared.forget_sql(plan.schema))
            else:
                execute_script(src, sqltext.unfreeze_sql(plan))
                src.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(WORK_SCHEMA)))
    return plan
