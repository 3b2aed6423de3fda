"""A move between PostgreSQL majors: checked before anything is journaled, created or locked.

- The client programs: the pg_dump pgidgen uses (pgbin.clients) must be at least as new as the source server,
  or it refuses to dump it; found here, not at the copy step after the slot exists.
- A move down a major (the target older than the source): the shard's schema, as pg_dump prints it, is run on
  the target in a transaction that is rolled back. Whatever the older server lacks (a VIRTUAL generated column
  on 18 going to 15, a newer syntax, a missing function) refuses the move with the server's own message.
  Upward moves need no trial: a newer server restores what an older one dumped.
"""
from __future__ import annotations

from typing import Any

import psycopg

from .. import pgbin
from ..db import execute_script, pg_message, server_encoding
from ..errors import PgidgenError
from ..idgen import render_catalog
from ..versions import major
from . import sqltext as q
from .context import MoveError, ShardContext
from .transfer import COPY_SECTIONS, SchemaDump


def check_clients(ctx: ShardContext, src: psycopg.Connection[Any]) -> pgbin.Install:
    try:
        return pgbin.clients_for(major(src))
    except PgidgenError as e:
        raise MoveError(e.what, where=ctx.source, hint=e.hint) from None


def check_restorable(
    ctx: ShardContext, source_dsn: str, src: psycopg.Connection[Any], tgt: psycopg.Connection[Any], *, schema_dump: SchemaDump | None = None
) -> None:
    """On a move down a major: the shard's schema (pre- and post-data) created on the target and rolled back."""
    source_major, target_major = major(src), major(tgt)
    if target_major >= source_major:
        return
    encoding = server_encoding(src)
    dump = schema_dump or SchemaDump(source_dsn, ctx.schema, encoding=encoding, sections=COPY_SECTIONS)
    try:
        scripts = [dump.section(s) for s in COPY_SECTIONS]
    finally:
        if schema_dump is None:
            dump.close()
    has_catalog = tgt.execute("SELECT to_regclass('pgidgen.layout') IS NOT NULL").fetchone()[0]  # type: ignore[index]
    try:
        with tgt.transaction():
            tgt.execute(f"SET LOCAL client_encoding = {q.literal(encoding)}")
            if not has_catalog:  # what the shard's objects may refer to, as the move would create it
                execute_script(tgt, render_catalog(ctx.layout, shard_count=ctx.shard_count))
            for script in scripts:
                if script.strip():
                    tgt.execute(script)
            raise psycopg.Rollback()
    except psycopg.Error as e:
        raise MoveError(
            f"shard {ctx.shard}'s schema {ctx.schema} cannot be created on {ctx.target} (PostgreSQL {target_major};"
            f" {ctx.source} is PostgreSQL {source_major}): {pg_message(e)}",
            hint=f"move it to a server of PostgreSQL {source_major} or newer, or first change what {target_major} lacks",
        ) from None
