"""`pgidgen apply-ddl`: plan (pure), render (per database SQL), execute.

Policy: all or nothing. Every target database runs its shards in one transaction (a batch of shards per round
trip), databases in parallel, and the transactions are committed only when every database succeeded. Every
configured database is read and locked first (advisory lock idgen.LOCK_CLASS / ledger.DDL_LOCK, in name order)
because file positions are global. A run applies the file and catches each target shard up on any earlier file
it lacks, so every shard ends with the same history.
"""
from __future__ import annotations

import threading
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import psycopg
from pglast import split

from ..config import Config
from ..db import Outcome, connect, each_database, execute_script, pg_message, translate
from ..errors import ConfigError, ConflictError, DatabaseError, InputError, PgidgenError
from ..idgen import LOCK_CLASS, schema_name
from ..init import spread
from ..ranges import collapse
from .ledger import (
    DDL_LOCK,
    DatabaseLedger,
    FileVersion,
    merge_history,
    missing_positions,
    read_ledger,
    render_batches,
    render_files,
    render_ledger_rows,
    render_upgrade,
)
from .rewrite import ShardedFile, parse_file

Progress = Callable[[int], None]


@dataclass
class ApplyPlan:
    """What apply-ddl runs where; the rendering twin works from this alone."""

    file: ShardedFile
    version: FileVersion
    history: dict[int, FileVersion]
    work: dict[str, dict[int, list[FileVersion]]]
    head: dict[str, str]
    up_to_date: dict[str, list[int]] = field(default_factory=dict)

    @property
    def total(self) -> int:
        return sum(len(w) for w in self.work.values())

    @property
    def is_new(self) -> bool:
        return self.version.position not in self.history or self.history[self.version.position].sha256 != self.version.sha256


def read_file(path: str | Path, name: str | None = None) -> ShardedFile:
    p = Path(path)
    if name is not None and (not name.strip() or len(name) > 200):
        raise InputError(f"--name {name!r} is not a usable file name", hint="give a short non-empty name, e.g. schema.sql")
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InputError(f"file {p} does not exist", hint="give the path of a .sql file") from None
    except UnicodeDecodeError as e:
        raise InputError(f"file {p} is not UTF-8 text (byte {e.start})", hint="save it as UTF-8") from None
    except OSError as e:
        raise InputError(f"cannot read {p}: {e.strerror}") from None
    return parse_file(text, name or p.name)


def plan_apply(
    file: ShardedFile,
    ledgers: dict[str, DatabaseLedger],
    targets: Sequence[str],
    *,
    reapply_changed: bool = False,
) -> ApplyPlan:
    """Decide, from every database's ledger, which shards get which files; refuses changed files and moves."""
    history = merge_history(ledgers)
    versions = [f for f in history.values() if f.name == file.name]
    latest = max(versions, key=lambda f: f.position) if versions else None
    if latest is not None and latest.sha256 == file.sha256:
        version = latest
    else:
        if latest is not None and not reapply_changed:
            what = "only comments or formatting differ" if latest.template == file.template else "its SQL differs"
            raise ConflictError(
                f"{file.name} was applied before with other content (#{latest.position}, sha256 {latest.sha256[:12]}; {what})",
                hint="pgidgen never re-runs an edited file by itself: put the change into a new file, or pass --reapply-changed "
                "to run the whole new version on every shard (write it re-runnable: IF NOT EXISTS, OR REPLACE)",
            )
        version = FileVersion(
            position=max(history, default=0) + 1,
            name=file.name,
            sha256=file.sha256,
            source=file.source,
            template=file.template,
            placeholder=file.placeholder,
        )
    full = dict(history)
    full[version.position] = version
    work: dict[str, dict[int, list[FileVersion]]] = {}
    head: dict[str, str] = {}
    up_to_date: dict[str, list[int]] = {}
    for name in targets:
        led = ledgers[name]
        if led.moving:
            raise ConflictError(
                f"database {name} has shards being moved ({collapse(sorted(led.moving))})",
                hint="a move copies the shard's tables as they are: apply DDL after the move finishes",
            )
        per_shard: dict[int, list[FileVersion]] = {}
        done: list[int] = []
        for shard in sorted(led.active):
            missing = missing_positions(full, led.shards.get(shard, ()))
            if missing:
                per_shard[shard] = [full[p] for p in missing]
            else:
                done.append(shard)
        work[name] = per_shard
        up_to_date[name] = done
        needed = {f.position for files in per_shard.values() for f in files}
        head[name] = (render_upgrade(led) + render_files(full[p] for p in sorted(needed) if p not in led.files)) if per_shard else ""
    return ApplyPlan(file=file, version=version, history=history, work=work, head=head, up_to_date=up_to_date)


def offline_plan(config: Config, file: ShardedFile, shard_count: int, databases: Sequence[str]) -> ApplyPlan:
    """The plan for databases freshly initialised with `init --shards N` over the same databases (for --sql)."""
    config.layout.check_shard_count(shard_count)
    assignment = spread(shard_count, databases)
    ledgers = {name: DatabaseLedger(has_catalog=True, has_tables=True, active=set(assignment[name])) for name in databases}
    return plan_apply(file, ledgers, databases)


def render_database(plan: ApplyPlan, name: str) -> list[tuple[list[int], str]]:
    """(shards, SQL) chunks for one database, one round trip each; the first chunk (no shards) is the catalog part."""
    if not plan.work.get(name):
        return []
    return [([], plan.head[name])] + render_batches(plan.work[name])


def render_apply(plan: ApplyPlan) -> dict[str, str]:
    return {
        name: f"-- pgidgen apply-ddl {plan.file.name} (#{plan.version.position}): database {name}\n"
        + "".join(sql for _, sql in render_database(plan, name))
        for name in plan.work
    }


@dataclass
class ApplyResult:
    plan: ApplyPlan
    outcomes: list[Outcome]

    @property
    def changed(self) -> bool:
        return any(o.changed for o in self.outcomes)


def _lock_all(stack: ExitStack, config: Config) -> dict[str, psycopg.Connection[Any]]:
    conns: dict[str, psycopg.Connection[Any]] = {}
    for name in sorted(config.databases):
        try:
            conn = connect(name, config.dsn(name), autocommit=True)
        except DatabaseError as e:
            raise DatabaseError(
                e.what,
                hint="apply-ddl reads every configured database (the order of DDL files is global): bring it back, "
                "or remove it from the config",
            ) from None
        stack.callback(conn.close)
        conns[name] = conn
        try:
            got = conn.execute("SELECT pg_catalog.pg_try_advisory_lock(%s, %s)", (LOCK_CLASS, DDL_LOCK)).fetchone()
        except psycopg.Error as e:
            raise translate(name, e, doing="taking pgidgen's DDL lock") from None
        if not got or not got[0]:
            raise ConflictError(f"another pgidgen apply-ddl or init is changing shards in database {name}", hint="wait for it to finish, then run again")
    return conns


def _hint(e: psycopg.Error, name: str, committed: Sequence[int], per_batch: bool, otherwise: str) -> str:
    if per_batch:
        done = f"shards {collapse(committed)} of {name} were committed before" if committed else f"nothing was committed in {name}"
        state = f"{done}; the other databases went on: fix the cause and run apply-ddl again, it resumes where it stopped"
    else:
        state = "nothing was applied anywhere (rolled back)"
    if getattr(e, "sqlstate", None) == "53200":
        return (
            f"{state}; creating tables locks them until commit and the server's lock table is full: pass --commit-every N "
            "(e.g. 200) to commit every N shards, or raise max_locks_per_transaction"
        )
    return f"{state}; {otherwise}"


def _run_first_shard(conn: psycopg.Connection[Any], name: str, shard: int, files: Sequence[FileVersion], *, committed: bool = False) -> None:
    """The first shard runs statement by statement, so an error names the file, statement and line."""
    for f in files:
        parts = split(f.for_shard(shard))
        conn.execute(parts[0].encode("utf-8"))  # SET LOCAL search_path
        for i, stmt in enumerate(parts[1:], 1):
            try:
                conn.execute(stmt.encode("utf-8"))
            except psycopg.Error as e:
                where = f.name
                try:
                    st = parse_file(f.source, f.name).statements[i - 1]
                    where = f"statement {st.number} ({st.kind}) of {f.name}:{st.line}:{st.column}"
                except (PgidgenError, IndexError):
                    pass
                raise DatabaseError(
                    f"database {name} failed in {schema_name(shard)} at {where}: {pg_message(e)}",
                    hint=_hint(e, name, (), committed, "fix the file, or the shards it does not fit"),
                ) from None
    conn.execute(b"RESET search_path")


def apply_ddl(
    config: Config,
    file: ShardedFile,
    databases: Sequence[str] | None = None,
    *,
    reapply_changed: bool = False,
    commit_every: int | None = None,
    progress: Progress | None = None,
    on_plan: Callable[[ApplyPlan], None] | None = None,
) -> ApplyResult:
    """Apply a parsed file to every shard of the target databases (default: all), catching shards up on the way.

    commit_every=N trades all-or-nothing for a bounded lock table: each database commits every N shards (the
    ledger is written in the same transactions, so a failed or interrupted run resumes where it stopped).
    """
    if commit_every is not None and commit_every < 1:
        raise ConfigError("--commit-every must be at least 1", hint="give the number of shards per transaction, e.g. 200")
    targets = config.select(list(databases) if databases else None)
    lock = threading.Lock()

    def tick(n: int) -> None:
        if progress is not None:
            with lock:
                progress(n)

    with ExitStack() as stack:
        conns = _lock_all(stack, config)
        ledgers: dict[str, DatabaseLedger] = {}
        for name, conn in conns.items():
            try:
                ledgers[name] = read_ledger(conn)
            except psycopg.Error as e:
                raise translate(name, e, doing="reading the DDL ledger") from None
        plan = plan_apply(file, ledgers, targets, reapply_changed=reapply_changed)
        if on_plan is not None:
            on_plan(plan)

        def work(name: str) -> Outcome:
            led = ledgers[name]
            shards = plan.work[name]
            if not shards:
                if not led.active:
                    what = "holds no shards" if led.has_catalog else "holds no shards (not initialised)"
                    return Outcome(name, summary=what, details={"applied": 0})
                return Outcome(
                    name,
                    summary=f"up to date: {len(led.active)} shards already have {file.name} (#{plan.version.position})",
                    details={"applied": 0},
                )
            conn = conns[name]
            ordered = sorted(shards)
            groups = [ordered] if not commit_every else [ordered[i:i + commit_every] for i in range(0, len(ordered), commit_every)]
            committed: list[int] = []
            for gi, group in enumerate(groups):
                try:
                    conn.execute(b"BEGIN")
                    rest = group
                    if gi == 0:
                        execute_script(conn, plan.head[name])
                        first = group[0]
                        _run_first_shard(conn, name, first, shards[first], committed=bool(commit_every))
                        execute_script(conn, render_ledger_rows([(first, f) for f in shards[first]]))
                        tick(1)
                        rest = group[1:]
                    for part, sql in render_batches({s: shards[s] for s in rest}):
                        try:
                            execute_script(conn, sql)
                        except psycopg.Error as e:
                            raise DatabaseError(
                                f"database {name} failed in one of {_shards(part)}: {pg_message(e)}",
                                hint=_hint(e, name, committed, bool(commit_every), "`pgidgen status --drift` shows how those shards differ"),
                            ) from None
                        tick(len(part))
                    if commit_every:
                        conn.execute(b"COMMIT")
                        committed.extend(group)
                except psycopg.Error as e:
                    raise DatabaseError(
                        f"database {name} failed while applying {file.name}: {pg_message(e)}",
                        hint=_hint(e, name, committed, bool(commit_every), "see the server's log"),
                    ) from None
                except PgidgenError:
                    if commit_every and conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
                        conn.execute(b"ROLLBACK")
                    raise
            applied = sorted(s for s, files in shards.items() if any(f.position == plan.version.position for f in files))
            caught_up = sorted(s for s, files in shards.items() if any(f.position != plan.version.position for f in files))
            parts = [f"applied {file.name} (#{plan.version.position}) to {len(applied)} shards ({collapse(applied) or 'none'})"]
            if caught_up:
                earlier = sorted({f.position for s in caught_up for f in shards[s] if f.position != plan.version.position})
                parts.append(f"caught up {len(caught_up)} shards on earlier files ({', '.join('#' + str(p) for p in earlier)})")
            return Outcome(name, changed=True, summary=", ".join(parts), details={"applied": len(applied), "caught_up": len(caught_up)})

        results = each_database(targets, work)
        failed = [n for n, r in results.items() if isinstance(r, PgidgenError)]
        outcomes = _finish(conns, targets, results, commit=not failed, per_batch=bool(commit_every))
    return ApplyResult(plan, outcomes)


def _finish(
    conns: dict[str, psycopg.Connection[Any]], targets: Sequence[str], results: dict[str, Any], *, commit: bool, per_batch: bool
) -> list[Outcome]:
    """All or nothing across databases: commit everywhere only when every database succeeded."""
    failed = [n for n in targets if isinstance(results[n], PgidgenError)]
    outcomes: list[Outcome] = []
    for name in targets:
        res = results[name]
        conn = conns[name]
        in_tx = conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE
        if isinstance(res, PgidgenError):
            if in_tx:
                conn.execute(b"ROLLBACK")
            outcomes.append(Outcome(name, ok=False, summary="failed" if per_batch else "failed, rolled back", error=res.render()))
            continue
        if not in_tx:
            outcomes.append(res)
        elif commit:
            try:
                conn.execute(b"COMMIT")
                outcomes.append(res)
            except psycopg.Error as e:
                outcomes.append(Outcome(name, ok=False, summary="commit failed", error=translate(name, e, doing="committing").render()))
        else:
            conn.execute(b"ROLLBACK")
            outcomes.append(Outcome(name, ok=False, changed=False, summary=f"rolled back because {', '.join(failed)} failed"))
    return outcomes


def _shards(shards: Sequence[int]) -> str:
    return f"shards {collapse(list(shards))}" if len(shards) > 1 else f"shard {shards[0]}"
