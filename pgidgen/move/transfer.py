"""How a shard's rows travel: binary COPY streams from the source into one target transaction.

pg_dump | psql moves rows as text: every value is printed on the source and parsed again on the target, and
pg_dump does one table after another. Here the schema still comes from pg_dump (`--section=pre-data`, and
`--section=post-data` for indexes and constraints after the rows, as pg_dump orders them), but each table's
rows come from `COPY ... TO STDOUT (FORMAT binary)` in a psql on the source, at the given snapshot, and go into
`COPY ... FROM STDIN (FORMAT binary, FREEZE)` on the caller's target transaction, which created the table:
no text conversion, and rows are written frozen, so nothing (the verification's scan included) has to set hint
bits on every page afterwards. Both pg_dumps and the first table's stream start at once, so their start-up
overlaps. psql streams in C; this process only relays large blocks between a pipe and the target connection.

A table whose columns use types defined in the database (enums, composites, arrays of them) or a source and
target of different major versions take the text format: binary values of those carry type OIDs that differ
between databases.
"""
from __future__ import annotations

import fcntl
import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from typing import IO, Any, Callable, Sequence

import psycopg

from ..db import scrub, tool_args
from ..errors import PgidgenError
from . import sqltext as q
from .context import MoveError

#: Linux F_SETPIPE_SZ: a 1 MB pipe lets psql run ahead of the relay instead of waiting on every 64 kB.
_SETPIPE_SZ = 1031
_BLOCK = 1 << 20
#: Types below this OID are built in: their binary form is the same in every database of one major version.
_FIRST_USER_OID = 16384

OnBlock = Callable[[str, int], None]


@dataclass
class TableCopy:
    name: str
    binary: bool


def plan_tables(src: psycopg.Connection[Any], tgt: psycopg.Connection[Any], schema: str, tables: Sequence[str]) -> list[TableCopy]:
    """Binary where safe (see the module docstring), text otherwise, per table."""
    same_major = _major(src) == _major(tgt)
    custom = {
        r[0]
        for r in src.execute(
            "SELECT c.relname FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid JOIN pg_namespace n ON n.oid = c.relnamespace"
            " JOIN pg_type t ON t.oid = a.atttypid"
            " WHERE n.nspname = %s AND a.attnum > 0 AND NOT a.attisdropped"
            " AND (CASE WHEN t.typtype = 'd' THEN t.typbasetype ELSE t.oid END)::bigint >= %s",
            (schema, _FIRST_USER_OID),
        )
    }
    return [TableCopy(t, same_major and t not in custom) for t in tables]


def _major(conn: psycopg.Connection[Any]) -> int:
    return conn.info.server_version // 10000


def tool(name: str) -> str:
    found = shutil.which(name)
    if found:
        return found
    try:
        from ..sandbox import find_bindir

        path = find_bindir() / name
        if path.exists():
            return str(path)
    except PgidgenError:
        pass
    raise MoveError(f"{name} was not found", hint="install PostgreSQL's client programs or put them on PATH")


def die_with_parent() -> None:
    """In pg_dump/psql children: a mover killed with -9 takes them along, so no restore commits behind its back."""
    try:
        import ctypes
        import signal

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def last_line(text: str) -> str:
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1] if lines else "no message"


def script_of(dump: bytes, schema: str) -> bytes:
    """pg_dump's plain output as SQL the server runs: its \\restrict guards dropped, any other psql command refused.
    Bytes in the dump's encoding (the source database's), for a session whose client_encoding is that."""
    lines = []
    for line in dump.split(b"\n"):
        if line.startswith(b"\\"):
            if re.match(rb"^\\(un)?restrict\b", line):
                continue
            raise MoveError(f"pg_dump of {schema} printed a psql command pgidgen cannot run: {line[:40].decode(errors='replace')}")
        lines.append(line)
    return b"\n".join(lines) + b"\n"


class _Proc:
    """A client program whose stderr goes to a temp file (read only when it failed)."""

    def __init__(self, argv: list[str], env: dict[str, str], *, stdout: Any) -> None:
        self.out: IO[bytes] | None = stdout if stdout is not subprocess.PIPE else None
        self.err: IO[bytes] = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(argv, stdout=stdout, stderr=self.err, stdin=subprocess.DEVNULL, env=env, preexec_fn=die_with_parent)

    def error(self) -> str:
        self.err.seek(0)
        return scrub(last_line(self.err.read().decode(errors="replace")))

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        for f in (self.proc.stdout, self.out, self.err):
            if f is not None:
                f.close()


class Transfer:
    """One copy of a shard: start() launches the source side; the caller's target transaction runs
    pre_data(), copy_rows(), post_data() in that order; close() ends whatever still runs."""

    def __init__(
        self,
        source_dsn: str,
        schema: str,
        tables: Sequence[TableCopy],
        *,
        snapshot: str | None,
        encoding: str,
        sections: Sequence[str] = ("pre-data", "post-data"),
        freeze: bool = True,
    ) -> None:
        self.dsn, self.env = tool_args(source_dsn)
        self.env["PGCLIENTENCODING"] = encoding
        self.schema = schema
        self.tables = list(tables)
        self.snapshot = snapshot
        self.encoding = encoding
        self.sections = tuple(sections)
        self.freeze = freeze
        self.dumps: dict[str, _Proc] = {}
        self.streams: dict[str, _Proc] = {}
        self.bytes = 0

    def __enter__(self) -> Transfer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self) -> None:
        """The schema's pg_dump and the first table's stream; the post-data pg_dump starts once the schema is
        out of the way, and runs while the rows flow."""
        for section in self.sections[:1]:
            self.dumps[section] = self._dump(section)
        if self.tables:
            self._stream(self.tables[0])

    def close(self) -> None:
        for p in [*self.dumps.values(), *self.streams.values()]:
            p.stop()
        self.dumps.clear()
        self.streams.clear()

    def _dump(self, section: str) -> _Proc:
        argv = [tool("pg_dump"), f"--schema={self.schema}", f"--section={section}", "--no-publications", "--no-subscriptions",
                "--no-tablespaces", "--no-security-labels", "-d", self.dsn]
        if self.snapshot:
            argv += ["--snapshot", self.snapshot]
        return _Proc(argv, self.env, stdout=tempfile.TemporaryFile())

    def section(self, section: str) -> bytes:
        """The SQL of one pg_dump section, once that pg_dump finished."""
        p = self.dumps[section]
        if p.proc.wait() != 0:
            raise MoveError(f"pg_dump of {self.schema} failed: {p.error()}")
        out = p.out
        assert out is not None
        out.seek(0)
        return script_of(out.read(), self.schema)

    def _stream(self, table: TableCopy) -> _Proc:
        cmds = ["SET TRANSACTION ISOLATION LEVEL REPEATABLE READ"]
        if self.snapshot:
            cmds.append(f"SET TRANSACTION SNAPSHOT {q.literal(self.snapshot)}")
        cmds += q.COPY_OUT_SETTINGS
        cmds.append(q.copy_out_sql(self.schema, table.name, binary=table.binary))
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
        self.streams[table.name] = p
        return p

    def restore(self, tgt: psycopg.Connection[Any], on_block: OnBlock | None = None) -> None:
        """Into tgt's open transaction: the schema, the rows, then indexes and constraints (the sections started)."""
        tgt.execute(f"SET client_encoding = {q.literal(self.encoding)}")
        for section in ("pre-data", "data", "post-data"):
            if section == "data":
                self.copy_rows(tgt, on_block)
            elif section in self.sections:
                if section not in self.dumps:
                    self.dumps[section] = self._dump(section)
                script = self.section(section)
                if script.strip():
                    tgt.execute(script)

    def copy_rows(self, tgt: psycopg.Connection[Any], on_block: OnBlock | None = None) -> None:
        """Every table's rows into tgt's open transaction; the next table's stream starts while this one flows."""
        for section in self.sections:
            if section not in self.dumps:
                self.dumps[section] = self._dump(section)
        for i, table in enumerate(self.tables):
            p = self.streams.get(table.name) or self._stream(table)
            if i + 1 < len(self.tables):
                self._stream(self.tables[i + 1])
            self._relay(tgt, table, p, on_block)
            p.stop()
            del self.streams[table.name]

    def _relay(self, tgt: psycopg.Connection[Any], table: TableCopy, p: _Proc, on_block: OnBlock | None) -> None:
        assert p.proc.stdout is not None
        fd = p.proc.stdout.fileno()
        sql = q.copy_in_sql(self.schema, table.name, binary=table.binary, freeze=self.freeze)
        try:
            with tgt.cursor().copy(sql) as cp:
                while True:
                    block = os.read(fd, _BLOCK)
                    if not block:
                        break
                    cp.write(block)
                    self.bytes += len(block)
                    if on_block is not None:
                        on_block(table.name, len(block))
                if p.proc.wait() != 0:
                    raise _SourceFailed(p.error())
        except _SourceFailed as e:
            raise MoveError(f"reading {self.schema}.{table.name} on the source failed: {e}") from None
        except psycopg.Error:
            if p.proc.poll() not in (None, 0):
                raise MoveError(f"reading {self.schema}.{table.name} on the source failed: {p.error()}") from None
            raise


class _SourceFailed(Exception):
    pass

