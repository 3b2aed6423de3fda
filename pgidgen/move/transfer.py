"""How a shard's rows travel: binary COPY streams from the source into one target transaction.

pg_dump | psql moves rows as text: every value is printed on the source and parsed again on the target, and
pg_dump does one table after another. Here the schema still comes from pg_dump (one `--schema-only` archive,
which pg_restore prints as pre-data, and post-data for indexes and constraints after the rows, as pg_dump
orders them), but each table's rows come from `COPY ... TO STDOUT (FORMAT binary)` in a psql on the source, at
the given snapshot, and go into `COPY ... FROM STDIN (FORMAT binary, FREEZE)` on the caller's target
transaction, which created the table: no text conversion, and rows are written frozen, so nothing (the
verification's scan included) has to set hint bits on every page afterwards. An online move starts the pg_dump
while it checks the shard, before the snapshot exists (SchemaDump), so its SQL is ready when the first table's
stream starts; otherwise the two start at once. psql streams in C; this process only relays large blocks
between a pipe and the target connection.

A table whose columns use types defined in the database (enums, composites, arrays of them) or a source and
target of different major versions take the text format: binary values of those carry type OIDs that differ
between databases.

One target transaction holds pg_dump's pre-data, every table's rows and the post-data, then the shard's
`incoming` catalog row, so a resume or rollback sees all of the copy or none of it. Columns are named on both
sides (a child table's columns can stand in another order on the target). pg_dump and psql children die with the
mover (PR_SET_PDEATHSIG, set by util-linux's `setpriv --pdeathsig` so the child starts by vfork; a preexec prctl
where setpriv is missing), so nothing commits behind a killed mover's back. In the copy's transaction, after the
post-data, populated materialized views are refreshed and the grants each object's owner made are set to the
source's (OWNER_GRANTS_SQL: the target's default privileges for the restoring role would otherwise change them)."""
from __future__ import annotations

import fcntl
import functools
import os
import re
import shutil
import signal
import subprocess
import tempfile
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import IO, Any

import psycopg

from .. import pgbin
from ..db import connect, execute_script, tool_args
from ..errors import PgidgenError
from ..redact import scrub
from . import sqltext as q
from .context import MoveError

#: Linux F_SETPIPE_SZ: a 1 MB pipe lets psql run ahead of the relay instead of waiting on every 64 kB.
_SETPIPE_SZ = 1031
_BLOCK = 1 << 20
#: The most the inline tables' reads ahead hold in memory at once (_Prefetch).
PREFETCH_BYTES = 64 << 20
STOP_WAIT_S = 10.0
#: Types below this OID are built in: their binary form is the same in every database of one major version.
_FIRST_USER_OID = 16384

OnBlock = Callable[[str, int], None]
#: What a shard's pg_dump leaves out: the move's own publication and subscription, and server-specific settings.
DUMP_OPTIONS = ["--no-publications", "--no-subscriptions", "--no-tablespaces", "--no-security-labels"]
#: The schema an online copy takes from pg_dump: tables and the rest before the rows, indexes and constraints after.
COPY_SECTIONS = ("pre-data", "post-data")


@dataclass
class TableCopy:
    name: str
    binary: bool
    columns: tuple[str, ...] = ()  # the source's stored columns in its order (generated ones are computed again)
    schema: str = ""  # in a batch's transfer: the table's schema (else the transfer's one)
    inline: bool = False  # small: its rows come through this process on one source connection (see copy_rows)


def plan_tables(src: psycopg.Connection[Any], tgt: psycopg.Connection[Any], schema: str, tables: Sequence[str], *, into: str = "") -> list[TableCopy]:
    """Binary where safe (see the module docstring), text otherwise, per table; with the columns to copy.
    into: the schema the rows go to on both sides' names (a batch's transfer), when not schema itself."""
    same_major = _major(src) == _major(tgt)
    columns: dict[str, list[str]] = {}
    custom: set[str] = set()
    for table, column, is_custom in src.execute(
        "SELECT c.relname, a.attname, (CASE WHEN t.typtype = 'd' THEN t.typbasetype ELSE t.oid END)::bigint >= %s"
        " FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid JOIN pg_namespace n ON n.oid = c.relnamespace"
        " JOIN pg_type t ON t.oid = a.atttypid"
        " WHERE n.nspname = %s AND a.attnum > 0 AND NOT a.attisdropped AND a.attgenerated = ''"
        " ORDER BY c.relname, a.attnum",
        (_FIRST_USER_OID, schema),
    ):
        columns.setdefault(table, []).append(column)
        if is_custom:
            custom.add(table)
    return [TableCopy(t, same_major and t not in custom, tuple(columns.get(t, ())), into) for t in tables]


def plan_tables_of(src: psycopg.Connection[Any], tgt: psycopg.Connection[Any], tables: dict[str, Sequence[str]]) -> list[TableCopy]:
    """plan_tables for a batch (schema -> its tables), in one query; each table names its schema."""
    same_major = _major(src) == _major(tgt)
    columns: dict[tuple[str, str], list[str]] = {}
    custom: set[tuple[str, str]] = set()
    for schema, table, column, is_custom in src.execute(
        "SELECT n.nspname, c.relname, a.attname, (CASE WHEN t.typtype = 'd' THEN t.typbasetype ELSE t.oid END)::bigint >= %s"
        f" FROM {q.RELATIONS_OF} JOIN pg_attribute a ON a.attrelid = c.oid"
        " JOIN pg_type t ON t.oid = a.atttypid"
        " WHERE n.nspname = ANY(%s) AND c.relkind IN ('r', 'p') AND a.attnum > 0 AND NOT a.attisdropped AND a.attgenerated = ''"
        " ORDER BY n.nspname, c.relname, a.attnum",
        (_FIRST_USER_OID, list(tables)),
    ):
        columns.setdefault((schema, table), []).append(column)
        if is_custom:
            custom.add((schema, table))
    return [TableCopy(t, same_major and (s, t) not in custom, tuple(columns.get((s, t), ())), s) for s, names in tables.items() for t in names]


def _major(conn: psycopg.Connection[Any]) -> int:
    return conn.info.server_version // 10000


@functools.cache
def tool(name: str) -> str:
    """The newest pg_dump, pg_restore or psql pgidgen finds (pgidgen.pgbin): one installation's pg_dump and
    pg_restore read each other's archives, and the newest reads every supported source. A move checks it
    against the source's version before it journals anything (pgidgen.check)."""
    try:
        return str(pgbin.newest_client(name))
    except PgidgenError as e:
        raise MoveError(e.what, hint=e.hint) from None


def _load_prctl() -> Callable[..., int] | None:
    try:
        import ctypes

        return ctypes.CDLL("libc.so.6", use_errno=True).prctl
    except (OSError, AttributeError):
        return None


#: Looked up once here, not in every child between fork and exec.
_PRCTL = _load_prctl()


def die_with_parent() -> None:
    """In pg_dump/psql children: a mover killed with -9 takes them along, so no restore commits behind its back."""
    if _PRCTL is not None:
        _PRCTL(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


#: Ctrl-C in a terminal signals the whole foreground process group: a pg_dump or psql there would die with the
#: batch in flight, which rebalance lets finish. In a session of their own, only pgidgen hears it and decides.
OWN_GROUP: dict[str, Any] = {"start_new_session": True}

#: util-linux's setpriv sets that same parent-death signal and then runs the program. Python starts a child
#: without a preexec function by vfork, in about 0.1 ms; with one it must fork this whole process (threads,
#: connections, the interpreter's memory), 5-10 ms a child, on the copy's critical path.
_SETPRIV = shutil.which("setpriv")
#: A parent killed after the fork but before setpriv set the signal (a millisecond) sends none: between the two,
#: a shell asks whether its parent is still the mover (it was adopted otherwise) and runs the program only then.
_STILL_OURS = 'if [ "$PPID" != "$0" ]; then exit 1; fi; exec "$@"'


@contextmanager
def sigint_held() -> Iterator[None]:
    """SIGINT blocked on this thread while a child starts. Between its fork and its setsid() a child is still in
    pgidgen's process group: a Ctrl-C (the group's SIGINT) that lands there stays pending in it, and kills the
    client program once it runs (seen as a batch's source psql 'killed by SIGINT' at a rebalance's Ctrl-C). The
    child inherits the blocked signal and keeps it pending, harmlessly (pgidgen stops its children with SIGKILL);
    pgidgen itself takes the Ctrl-C on another thread, or on this one once the child has started."""
    if not hasattr(signal, "pthread_sigmask"):
        yield
        return
    before = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, before)


def _spawn(argv: list[str], *, dies_with_parent: bool, **kwargs: Any) -> subprocess.Popen[bytes]:
    """A client program in a session of its own (OWN_GROUP)."""
    kwargs.update(OWN_GROUP)
    with sigint_held():
        if not dies_with_parent:
            return subprocess.Popen(argv, **kwargs)
        if _SETPRIV is not None:
            return subprocess.Popen([_SETPRIV, "--pdeathsig", "KILL", "--", "/bin/sh", "-c", _STILL_OURS, str(os.getpid()), *argv], **kwargs)
        return subprocess.Popen(argv, preexec_fn=die_with_parent, **kwargs)


def last_line(text: str) -> str:
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1] if lines else "no message"


def script_of(dump: bytes, schema: str) -> bytes:
    """pg_dump's plain output as SQL the server runs: its \\restrict guards dropped, any other psql command refused,
    and its `SET transaction_timeout = 0` (pg_dump 17+) dropped: an older target rejects it, and pgidgen's own
    session has that timeout off already where the server knows it (db.own_session). Bytes in the dump's encoding
    (the source database's), for a session whose client_encoding is that."""
    lines = []
    for line in dump.split(b"\n"):
        if line.startswith(b"SET transaction_timeout = "):
            continue
        if line.startswith(b"\\"):
            if re.match(rb"^\\(un)?restrict\b", line):
                continue
            raise MoveError(f"pg_dump of {schema} printed a psql command pgidgen cannot run: {line[:40].decode(errors='replace')}")
        lines.append(line)
    return b"\n".join(lines) + b"\n"


class _Proc:
    """A client program whose stderr goes to a temp file (read only when it failed)."""

    def __init__(self, argv: list[str], env: dict[str, str], *, stdout: Any, stdin: Any = subprocess.DEVNULL, connects: bool = True) -> None:
        """connects: the program holds a snapshot on the source, so it dies with the mover (pg_restore, which
        connects nowhere, need not)."""
        self.out: IO[bytes] | None = stdout if stdout is not subprocess.PIPE else None
        self.err: IO[bytes] = tempfile.TemporaryFile()
        self.proc = _spawn(argv, dies_with_parent=connects, stdout=stdout, stderr=self.err, stdin=stdin, env=env)

    def error(self) -> str:
        self.err.seek(0)
        return scrub(last_line(self.err.read().decode(errors="replace")))

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()

    def stop(self) -> None:
        self.kill()
        self.proc.wait()
        for f in (self.proc.stdin, self.proc.stdout, self.out, self.err):
            if f is not None:
                try:
                    f.close()
                except BrokenPipeError:  # the stdin's buffer, flushed into a process just killed: nothing to keep
                    pass


class SchemaDump:
    """One pg_dump of a schema (pre-data and post-data) in its archive format, uncompressed, which a pg_restore
    per section prints: pg_restore needs no connection, a second pg_dump would read the whole catalog again while
    the rows flow. The pg_restores start with the pg_dump, so each has its SQL out a moment after the archive is
    complete. snapshot: the one the rows are read at; None dumps the schema as it stands (an online move starts
    its dump before the slot exists, see Mover: what changes in between is caught by the schema compare before
    the pause, as any DDL during the move is)."""

    def __init__(self, source_dsn: str, schema: str | Sequence[str], *, encoding: str, sections: Sequence[str], snapshot: str | None = None) -> None:
        """schema: one, or a batch's (one pg_dump for all: its catalog reads are most of its time)."""
        self.dsn, self.env = tool_args(source_dsn)
        self.env["PGCLIENTENCODING"] = encoding
        schemas = [schema] if isinstance(schema, str) else list(schema)
        self.schema = schemas[0] if len(schemas) == 1 else f"{schemas[0]} and {len(schemas) - 1} more schemas"
        self.sections = tuple(sections)
        argv = [tool("pg_dump"), *(f"--schema={s}" for s in schemas), "--schema-only", "--format=custom", "--compress=0", *DUMP_OPTIONS, "-d", self.dsn]
        if snapshot:
            argv += ["--snapshot", snapshot]
        self.tee: threading.Thread | None = None
        self.printing: dict[str, _Proc] = {}  # section -> its pg_restore
        self.dump: _Proc | None = _Proc(argv, self.env, stdout=subprocess.PIPE)
        try:
            for name in self.sections:
                self.printing[name] = _Proc([tool("pg_restore"), f"--section={name}", "--file=-"], self.env,
                                            stdout=tempfile.TemporaryFile(), stdin=subprocess.PIPE, connects=False)
        except BaseException:
            self.close()
            raise
        self.tee = threading.Thread(target=self._tee, daemon=True)
        self.tee.start()

    def close(self) -> None:
        procs = [*([self.dump] if self.dump else []), *self.printing.values()]
        for p in procs:
            p.kill()
        if self.tee is not None:
            self.tee.join()
            self.tee = None
        for p in procs:
            p.stop()
        self.dump = None
        self.printing.clear()

    def _tee(self) -> None:
        """The archive (the schema only: small) from pg_dump to every pg_restore."""
        assert self.dump is not None and self.dump.proc.stdout is not None
        fd = self.dump.proc.stdout.fileno()
        sinks = [p.proc.stdin for p in self.printing.values() if p.proc.stdin is not None]
        try:
            while True:
                block = os.read(fd, 1 << 16)
                if not block:
                    break
                for sink in list(sinks):
                    try:
                        sink.write(block)
                    except (OSError, ValueError):  # that pg_restore ended early: section() reports its error
                        sinks.remove(sink)
        except OSError:
            pass
        finally:
            for sink in sinks:
                try:
                    sink.close()
                except (OSError, ValueError):
                    pass

    def section(self, section: str) -> bytes:
        """The SQL of one pg_dump section, once pg_dump and that section's pg_restore finished."""
        p = self.dump
        assert p is not None
        rc = p.proc.wait()
        if rc != 0:
            raise MoveError(f"pg_dump of {self.schema} failed: {p.error()}")
        r = self.printing[section]
        if r.proc.wait() != 0:
            raise MoveError(f"pg_restore of {self.schema}'s {section} failed: {r.error()}")
        assert r.out is not None
        r.out.seek(0)
        return script_of(r.out.read(), self.schema)


class Transfer:
    """One copy of a shard: start() launches the source side; the caller's target transaction runs restore()
    (the schema, the rows, indexes and constraints); close() ends whatever still runs."""

    def __init__(
        self,
        source_dsn: str,
        schema: str | Sequence[str],
        tables: Sequence[TableCopy],
        *,
        snapshot: str | None,
        encoding: str,
        sections: Sequence[str] = ("pre-data", "post-data"),
        freeze: bool = True,
        schema_dump: SchemaDump | None = None,
    ) -> None:
        """schema: one, or a batch's (then each table names its own). schema_dump: one started earlier, for these
        sections (else start() starts one at the snapshot)."""
        self.source_dsn = source_dsn
        self.dsn, self.env = tool_args(source_dsn)
        self.env["PGCLIENTENCODING"] = encoding
        self.schemas = [schema] if isinstance(schema, str) else list(schema)
        self.schema = self.schemas[0]
        self.tables = list(tables)
        self.snapshot = snapshot
        self.encoding = encoding
        self.sections = tuple(sections)
        self.freeze = freeze
        self.schema_dump = schema_dump
        self.streams: dict[tuple[str, str], _Proc] = {}
        self.bytes = 0
        self.reader: psycopg.Connection[Any] | None = None  # the inline tables' source connection, at the snapshot
        self.prefetch: _Prefetch | None = None  # its reads, ahead of the target

    def __enter__(self) -> Transfer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self) -> None:
        """The schema's pg_dump (unless one was started earlier) and the first table's stream, at once."""
        if self.sections and self.schema_dump is None:
            self.schema_dump = SchemaDump(self.source_dsn, self.schemas, encoding=self.encoding, sections=self.sections, snapshot=self.snapshot)
        if self.tables and not self.tables[0].inline:
            self._stream(self.tables[0])
        if any(t.inline for t in self.tables):
            self.reader = connect("the source", self.source_dsn, autocommit=True)
            self.reader.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
            if self.snapshot:
                self.reader.execute(f"SET TRANSACTION SNAPSHOT {q.literal(self.snapshot)}")
            for setting in q.COPY_OUT_SETTINGS:
                self.reader.execute(setting)
            self.reader.execute(f"SET client_encoding = {q.literal(self.encoding)}")
            self.prefetch = _Prefetch(self.reader, [(t.schema or self.schema, t.name, q.copy_out_sql(t.schema or self.schema, t.name, binary=t.binary,
                                                                                                  columns=t.columns)) for t in self.tables if t.inline])

    def close(self) -> None:
        if self.prefetch is not None:
            if not self.prefetch.stop():  # a read that does not end (a silent source): its connection is left to it
                self.reader = None
            self.prefetch = None
        if self.reader is not None:
            self.reader.close()
            self.reader = None
        for p in self.streams.values():
            p.kill()
        if self.schema_dump is not None:
            self.schema_dump.close()
            self.schema_dump = None
        for p in self.streams.values():
            p.stop()
        self.streams.clear()

    def section(self, section: str) -> bytes:
        assert self.schema_dump is not None
        return self.schema_dump.section(section)

    def _stream(self, table: TableCopy) -> _Proc:
        cmds = ["SET TRANSACTION ISOLATION LEVEL REPEATABLE READ"]
        if self.snapshot:
            cmds.append(f"SET TRANSACTION SNAPSHOT {q.literal(self.snapshot)}")
        cmds += q.COPY_OUT_SETTINGS
        cmds.append(q.copy_out_sql(table.schema or self.schema, table.name, binary=table.binary, columns=table.columns))
        argv = [tool("psql"), "-X", "-q", "-v", "ON_ERROR_STOP=1", "--single-transaction"]
        for c in cmds:
            argv += ["-c", c]
        argv += ["-d", self.dsn]
        p = _Proc(argv, self.env, stdout=subprocess.PIPE)
        assert p.proc.stdout is not None
        try:
            fcntl.fcntl(p.proc.stdout.fileno(), _SETPIPE_SZ, _BLOCK)
        except OSError:
            pass
        self.streams[(table.schema, table.name)] = p
        return p

    def restore(self, tgt: psycopg.Connection[Any], on_block: OnBlock | None = None, *, after_pre_data: str = "") -> None:
        """Into tgt's open transaction: the schema, the rows, then indexes and constraints (the sections started).
        after_pre_data: SQL run right after the pre-data section (what pg_dump --schema leaves out: casts.py)."""
        tgt.execute(f"SET client_encoding = {q.literal(self.encoding)}")
        for section in ("pre-data", "data", "post-data"):
            if section == "data":
                self.copy_rows(tgt, on_block)
            elif section in self.sections:
                script = self.section(section)
                if script.strip():
                    tgt.execute(script)
                if section == "pre-data":
                    execute_script(tgt, after_pre_data)

    def copy_rows(self, tgt: psycopg.Connection[Any], on_block: OnBlock | None = None) -> None:
        """Every table's rows into tgt's open transaction; the next table's stream starts while this one flows.
        An inline table's rows go from the source connection's COPY to the target's in this process: for a small
        table a psql of its own (a process and a connection, some 10 ms) costs more than its rows."""
        for i, table in enumerate(self.tables):
            if table.inline:
                self._relay_inline(tgt, table, on_block)
                continue
            p = self.streams.get((table.schema, table.name)) or self._stream(table)
            if i + 1 < len(self.tables) and not self.tables[i + 1].inline:
                self._stream(self.tables[i + 1])
            self._relay(tgt, table, p, on_block)
            p.stop()
            del self.streams[(table.schema, table.name)]

    def _relay(self, tgt: psycopg.Connection[Any], table: TableCopy, p: _Proc, on_block: OnBlock | None) -> None:
        assert p.proc.stdout is not None
        fd = p.proc.stdout.fileno()
        schema = table.schema or self.schema
        sql = q.copy_in_sql(schema, table.name, binary=table.binary, freeze=self.freeze, columns=table.columns)
        try:
            with tgt.cursor().copy(sql) as cp:
                while True:
                    block = os.read(fd, _BLOCK)
                    if not block:
                        break
                    cp.write(memoryview(block))  # sliced for libpq without copying
                    self.bytes += len(block)
                    if on_block is not None:
                        on_block(f"{schema}.{table.name}", len(block))
                if p.proc.wait() != 0:
                    raise _SourceFailed(p.error() + _status(p.proc.returncode))
        except _SourceFailed as e:
            raise MoveError(f"reading {schema}.{table.name} on the source failed: {e}") from None
        except psycopg.Error:
            if p.proc.poll() not in (None, 0):
                raise MoveError(f"reading {schema}.{table.name} on the source failed: {p.error()}") from None
            raise


    def _relay_inline(self, tgt: psycopg.Connection[Any], table: TableCopy, on_block: OnBlock | None) -> None:
        """An inline table's rows, read ahead from the source (_Prefetch), into the target's COPY."""
        assert self.prefetch is not None
        schema = table.schema or self.schema
        try:
            blocks = self.prefetch.take(schema, table.name)
        except psycopg.Error as e:
            raise MoveError(f"reading {schema}.{table.name} on the source failed: {scrub(str(e).splitlines()[0] if str(e) else type(e).__name__)}") from None
        with tgt.cursor().copy(q.copy_in_sql(schema, table.name, binary=table.binary, freeze=self.freeze, columns=table.columns)) as dst:
            for block in blocks:
                dst.write(block)
                self.bytes += len(block)
                if on_block is not None:
                    on_block(f"{schema}.{table.name}", len(block))


class _Prefetch:
    """The inline (small) tables' rows, read from the source on a thread of their own in the order the target takes
    them, while the target restores the schema before them: a batch of 100 shards has some 200 such tables, and
    reading each only when the target wanted it put a source round trip per table on the copy's path. Each
    table's COPY blocks are held in memory until taken; no new table is read while PREFETCH_BYTES are held."""

    def __init__(self, reader: psycopg.Connection[Any], tables: list[tuple[str, str, str]]) -> None:
        self.reader = reader
        self.tables = tables
        self.cond = threading.Condition()
        self.ready: dict[tuple[str, str], list[bytes]] = {}
        self.held = 0
        self.error: tuple[tuple[str, str], BaseException] | None = None
        self.stopped = False
        self.thread = threading.Thread(target=self._run, name="pgidgen-inline-reads", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        for schema, name, out in self.tables:
            with self.cond:
                self.cond.wait_for(lambda: self.stopped or self.held < PREFETCH_BYTES)
                if self.stopped:
                    return
            try:
                with self.reader.cursor().copy(out) as src:
                    blocks = [bytes(b) for b in src]
            except BaseException as e:  # given to the table's taker, raised there
                with self.cond:
                    self.error = ((schema, name), e)
                    self.cond.notify_all()
                return
            with self.cond:
                self.ready[(schema, name)] = blocks
                self.held += sum(len(b) for b in blocks)
                self.cond.notify_all()

    def take(self, schema: str, name: str) -> list[bytes]:
        """The table's blocks (waiting for them); the source's error instead, when its read failed."""
        with self.cond:
            self.cond.wait_for(lambda: (schema, name) in self.ready or self.error is not None)
            if (schema, name) not in self.ready:
                assert self.error is not None
                raise self.error[1]
            blocks = self.ready.pop((schema, name))
            self.held -= sum(len(b) for b in blocks)
            self.cond.notify_all()
            return blocks

    def stop(self) -> bool:
        """No more reads; whether the one under way ended (its table is small) within STOP_WAIT_S, so that the
        reader is free to close (not, while the thread may still be reading on it)."""
        with self.cond:
            self.stopped = True
            self.cond.notify_all()
        self.thread.join(STOP_WAIT_S)
        return not self.thread.is_alive()


class _SourceFailed(Exception):
    pass


def _status(code: int | None) -> str:
    """How a client program ended, for a failure it printed nothing about (killed by a signal, say)."""
    if code is None or code >= 0:
        return f" (exit status {code})"
    try:
        return f" (killed by {signal.Signals(-code).name})"
    except ValueError:
        return f" (killed by signal {-code})"

