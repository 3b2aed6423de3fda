"""The extensions a schema dump uses, checked in every database before apply-ddl runs anything.

A dump's `CREATE EXTENSION IF NOT EXISTS x WITH SCHEMA s` stays in the shard's SQL (dumpfile.py): the first shard
of a database creates the extension, the others find it, and a shard that init replays the ledger into later
gets it too. What could stop it halfway (the extension's files missing on that server, a role that may not
create it) is found here first: an extension that is missing is created in a transaction rolled back at once,
and a failure is one line naming the database and the exact statement to run there.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import psycopg

from ..db import pg_message
from ..errors import DatabaseError


def check_extensions(conns: Mapping[str, psycopg.Connection[Any]], extensions: Sequence[tuple[str, str]]) -> None:
    """Each (name, statement) present, or creatable by the config's role, in every database given (autocommit
    connections); raises before anything is written otherwise."""
    if not extensions:
        return
    wanted = [name for name, _ in extensions]
    for database, conn in sorted(conns.items()):
        try:
            have = {r[0] for r in conn.execute("SELECT extname::text FROM pg_catalog.pg_extension WHERE extname = ANY(%s)", (wanted,))}
        except psycopg.Error as e:
            raise DatabaseError(f"database {database} failed while reading its extensions: {pg_message(e)}") from None
        for name, statement in extensions:
            if name in have:
                continue
            try:
                conn.execute(b"BEGIN")
                conn.execute(statement.encode("utf-8"))
            except psycopg.Error as e:
                raise DatabaseError(
                    f"database {database} lacks extension {name}, and the config's role cannot create it: {pg_message(e)}",
                    hint=f"run {statement} in database {database} as a role that may (a superuser; the database's owner for a "
                    "trusted extension), or install the extension's package on that server; nothing was applied",
                ) from None
            finally:
                _rollback(conn)


def _rollback(conn: psycopg.Connection[Any]) -> None:
    try:
        conn.execute(b"ROLLBACK")
    except psycopg.Error:
        pass  # the connection broke: the server rolled back by itself
