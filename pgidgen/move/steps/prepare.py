"""prepare: the source marks the shard moving (unless apply-ddl is changing it); schema: an offline move's empty
tables on the target; the target's pgidgen catalog, installed or brought up to date."""
from __future__ import annotations

import subprocess
import time
from typing import Any

import psycopg

from ...config import Config
from ...db import connect, execute_script, pg_message, server_encoding, tool_args
from ...ddl.ledger import DDL_LOCK
from ...errors import ConflictError, DatabaseError
from ...idgen import CATALOG_REVISION, CATALOG_REVISION_SQL, INIT_LOCK, LOCK_CLASS, check_argument_order, render_catalog
from ...layout import Layout
from ...redact import scrub
from ...render import static_sql
from .. import depsql as dq
from .. import sqltext as q
from ..casts import casts_sql
from ..context import MoveError
from ..transfer import DUMP_OPTIONS, OWN_GROUP, last_line, script_of, sigint_held, tool
from .base import Background, MoverBase


def ensure_catalog(conn: psycopg.Connection[Any], name: str, config: Config, *, layout: Any = None, shard_count: int = 0) -> None:
    """Bring an existing catalog up to this version's (journal tables, and catalog functions older than
    CATALOG_REVISION), or install one on an empty target."""
    have = conn.execute(
        "SELECT to_regclass('pgidgen.layout') IS NOT NULL, to_regclass('pgidgen.move_heartbeat') IS NOT NULL,"
        f" {CATALOG_REVISION_SQL}"
    ).fetchone()
    assert have is not None
    if have[0] and have[1] and have[2] >= CATALOG_REVISION:
        return
    try:
        with conn.transaction():
            # init's lock: two movers (or a mover and an init) bringing one catalog up at once would collide
            # ("tuple concurrently updated" on CREATE OR REPLACE); the second re-runs the same SQL after the first
            conn.execute("SELECT pg_catalog.pg_advisory_xact_lock(%s, %s)", (LOCK_CLASS, INIT_LOCK))
            if not have[0]:
                if layout is None:
                    raise MoveError(f"database {name} has no pgidgen catalog", hint="run 'pgidgen init' first")
                check_argument_order(conn, name)  # a database that gets its first shard by a move: init's check
                execute_script(conn, render_catalog(layout, shard_count=shard_count))
            else:  # an older catalog: its own layout's functions as of this version (all safe to run again)
                row = conn.execute("SELECT epoch_ms, time_bits, shard_bits, sequence_bits, shard_count, generator FROM pgidgen.layout").fetchone()
                if row is None:
                    execute_script(conn, static_sql("catalog.sql"))
                else:
                    own = Layout(epoch_ms=row[0], time_bits=row[1], shard_bits=row[2], sequence_bits=row[3])
                    execute_script(conn, render_catalog(own, shard_count=row[4], generator=row[5]))
    except psycopg.Error as e:
        raise DatabaseError(f"database {name} failed while upgrading the pgidgen catalog: {pg_message(e)}") from None



#: How long a move waits for an apply-ddl running in its source database before it gives up.
APPLY_DDL_WAIT_S = 120


def wait_for_apply_ddl(admin: psycopg.Connection[Any], source: str) -> None:
    """Before a move reads the shard's schema: wait (up to APPLY_DDL_WAIT_S) while an apply-ddl runs in the source
    database (it holds DDL_LOCK for its run; it leaves shards in flight alone, but these are not in flight yet)."""
    deadline = time.monotonic() + APPLY_DDL_WAIT_S
    while True:
        with admin.transaction():
            if admin.execute("SELECT pg_try_advisory_xact_lock_shared(%s, %s)", (LOCK_CLASS, DDL_LOCK)).fetchone()[0]:  # type: ignore[index]
                return
        if time.monotonic() > deadline:
            raise MoveError(f"pgidgen apply-ddl has been changing shards in database {source} for over {APPLY_DDL_WAIT_S} s",
                            hint="wait for it to finish, then move again")
        time.sleep(0.2)


class PrepareSteps(MoverBase):
    def step_prepare(self) -> None:
        if self.opts.offline:  # an online move does it on a connection of its own, see below and step_copy
            self._ensure_target_catalog()
        with self.admin.transaction():  # an apply-ddl was waited for before the schema was read (wait_for_apply_ddl)
            if not self.admin.execute("SELECT pg_try_advisory_xact_lock_shared(%s, %s)", (LOCK_CLASS, DDL_LOCK)).fetchone()[0]:  # type: ignore[index]
                raise MoveError(f"pgidgen apply-ddl began changing shards in database {self.ctx.source} as the move started",
                                hint=f"wait for it to finish, then 'pgidgen move-shard --resume {self.ctx.shard}'")
            self.admin.execute(q.source_moving_sql(self.shards))
        if not self.opts.offline and self.catalog_ahead is None:
            # a target's catalog (on a new database some 50-150 ms) goes in from here, beside the publication, the
            # slot and the schema, rather than later beside the rows, whose COPY it would slow down
            self.catalog_ahead = Background(self._install_target_catalog_apart)

    def _ensure_target_catalog(self, conn: psycopg.Connection[Any] | None = None) -> None:
        ensure_catalog(conn or self.tgt, self.ctx.target, self.config, layout=self.ctx.layout, shard_count=self.ctx.shard_count)

    def _install_target_catalog_apart(self) -> None:
        """_ensure_target_catalog on a connection of its own, so that it can run while the copy goes into the
        target on self.tgt (a new database's catalog takes 100-200 ms, most of it init's argument-order probe)."""
        with connect(self.ctx.target, self.config.dsn(self.ctx.target), autocommit=True) as conn:
            self._ensure_target_catalog(conn)

    def _shard_depends_on_catalog(self) -> bool:
        """Whether any object of the batch's schemas depends on one in the pgidgen schema (a column DEFAULT or a
        CHECK calling a pgidgen function, a pgidgen type, ...): then the catalog must exist before the schemas."""
        row = self.admin.execute(dq.DEPENDS_ON_CATALOG_ANY_SQL, {"schemas": [c.source_schema or c.schema for c in self.ctxs]}).fetchone()
        return bool(row and row[0])

    def dump_schema(self) -> bytes:
        src_dsn, src_env = tool_args(self.config.dsn(self.ctx.source))
        with sigint_held():  # see transfer.sigint_held
            proc = subprocess.Popen(
                [tool("pg_dump"), "--section=pre-data", *(f"--schema={c.schema}" for c in self.ctxs), *DUMP_OPTIONS, "-d", src_dsn],
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=src_env, **OWN_GROUP,
            )
        out, err = proc.communicate()
        if proc.returncode != 0:
            raise MoveError(f"pg_dump of {self.ctx.schema} on {self.ctx.source} failed: {scrub(last_line(err.decode(errors='replace')))}")
        return script_of(out, self.ctx.schema)

    def step_schema(self) -> None:
        state = self._target_state()
        if state is not None:
            if state == "incoming":
                return  # committed together with the schemas: already done
            raise ConflictError(f"database {self.ctx.target} holds {self.what} as {state}", hint="see 'pgidgen map'")
        script = self.dump_schema()
        try:
            with self.tgt.transaction():
                encoding = server_encoding(self.admin)
                self.tgt.execute(f"SET client_encoding = {q.literal(encoding)}")
                self.tgt.execute(script)
                execute_script(self.tgt, casts_sql(self.admin, {c.source_schema or c.schema: c.schema for c in self.ctxs}))
                for ctx in self.ctxs:
                    execute_script(self.tgt, q.target_row_sql(ctx.shard, ctx.schema))
        except psycopg.Error as e:
            raise MoveError(
                f"database {self.ctx.target} refused the schema of {self.what}: {pg_message(e)}",
                hint="create the roles the shard's objects belong to on the target, then --resume" if getattr(e, "sqlstate", "") == "42704" else self._next_hint("schema"),
            ) from None
        finally:
            self._reset_target()
