"""copy: a slot whose exported snapshot the copy reads at; the schema, the rows (transfer.py) and the target's
'incoming' row in one target transaction. An offline move copies the rows inside the freeze instead."""
from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import psycopg

from ...db import connect, execute_script, pg_message, server_encoding
from ...errors import ConflictError, PgidgenError
from ...versions import has
from .. import depsql as dq
from .. import sqltext as q
from ..casts import casts_sql
from ..context import MoveError
from ..transfer import COPY_SECTIONS, SchemaDump, Transfer, plan_tables, plan_tables_of
from .base import Background, CopyProgress, MoverBase
from .replication import drop_slots

#: Tables smaller than this (on disk: their rows and TOAST) are copied inline (transfer.Transfer.copy_rows).
INLINE_BYTES = 1 << 20


class CopySteps(MoverBase):
    def step_copy(self) -> None:
        """The batch: a slot whose exported snapshot the copy reads at, so the subscription (copy_data = false)
        streams exactly the changes after it. Schemas, rows (binary COPY streams, see transfer.py), then indexes
        and constraints, and the target's 'incoming' rows, in one target transaction: a resume or rollback finds
        either the whole copy or nothing of it."""
        if self.resumed_step == "copy":
            self._ensure_target_catalog()
            self._reset_copy()
        # the slot's replication connection opens while the target is looked at and the tables planned
        opening = Background(lambda: connect(self.ctx.source, self.config.dsn(self.ctx.source), autocommit=True, replication="database"))
        try:
            rows0 = self._target_rows()
            if rows0:
                raise ConflictError(f"database {self.ctx.target} holds {', '.join(f'shard {s} as {st}' for s, (st, _) in sorted(rows0.items()))}",
                                    hint="see 'pgidgen map'")
            self._copy_with_slot(opening)
        finally:
            try:
                opening.result().close()
            except PgidgenError:
                pass

    def _copy_with_slot(self, opening: Background[psycopg.Connection[Any]]) -> None:
        created: list[str] = []

        def slot() -> str:
            cur = psycopg.ClientCursor(opening.result())
            try:
                cur.execute(q.slot_sql(self.names, failover=has(self.admin, "failover_slots")))
            except psycopg.Error as e:
                raise MoveError(f"database {self.ctx.source} could not create the replication slot: {pg_message(e)}",
                                hint="see max_replication_slots and max_wal_senders on the source") from None
            row = cur.fetchone()
            assert row is not None
            created.append(str(row[1]))
            return str(row[2])

        # The target's catalog (on a new database: 50-150 ms) goes in on a connection of its own (started by
        # step_prepare, or here on a resume) while this thread creates the slot and the rows flow; the copy's
        # transaction waits for it before it adds the shard's catalog row and commits (and before it starts,
        # when the shard's objects depend on catalog objects). A failed argument-order probe rolls the copy back.
        first = self._shard_depends_on_catalog()
        catalog, self.catalog_ahead = self.catalog_ahead or Background(self._install_target_catalog_apart), None
        try:
            dump, self.schema_dump = self.schema_dump, None
            then = self._identities_on_target_sql() + "".join(q.target_row_sql(c.shard, c.schema, reset_offset=False) for c in self.ctxs)
            self._transfer(slot, COPY_SECTIONS, schema_dump=dump, then=then,
                           started=lambda: self.journal.note("copy", consistent_point=created[0]),
                           ready=catalog if first else None, before_then=catalog)
        finally:
            catalog.join()

    def _reset_copy(self) -> None:
        """An interrupted copy cannot continue (its snapshot died with it): drop the slot and the partial copy."""
        drop_slots(self.admin, self.names, None)
        with self.tgt.transaction():
            self._drop_target_copy()

    def _drop_target_copy(self) -> None:
        """In the target's open transaction: the batch's schemas and 'incoming' rows."""
        self.tgt.execute(f"DROP SCHEMA IF EXISTS {', '.join(q.ident(c.schema) for c in self.ctxs)} CASCADE")
        self.tgt.execute("DELETE FROM pgidgen.shards WHERE shard = ANY(%s) AND state = 'incoming'", (self.shards,))

    def _transfer(
        self,
        snapshot: Callable[[], str | None],
        sections: tuple[str, ...],
        *,
        then: str = "",
        truncate: bool = False,
        started: Callable[[], None] | None = None,
        ready: Background[None] | None = None,
        before_then: Background[None] | None = None,
        schema_dump: SchemaDump | None = None,
    ) -> None:
        """The batch's rows (and the given pg_dump sections around them) into one target transaction, followed by
        `then` in it. snapshot() gives the snapshot to copy at (the online copy creates its slot there): called
        once the tables' formats are planned, so the source's pg_dump and first stream start the moment it returns;
        started() runs right after. ready: work on the target, waited for before the transaction opens;
        before_then: waited for before `then` runs in it. schema_dump: the sections' pg_dump, started earlier
        (else the copy starts one at the snapshot). truncate: the tables exist already (offline), emptying
        them in this transaction lets the rows go in frozen all the same."""
        schemas = [c.schema for c in self.ctxs]
        what = schemas[0] if len(schemas) == 1 else f"the schemas of {self.what}"
        try:
            if len(self.ctxs) == 1:
                plan = plan_tables(self.admin, self.tgt, self.ctx.source_schema or self.ctx.schema, [t.name for t in self.ctx.tables])
            else:  # a batch copies before its source copies are retired: the schemas have their own names on both sides
                plan = plan_tables_of(self.admin, self.tgt, {c.schema: [t.name for t in c.tables] for c in self.ctxs})
            size = {(c.schema if len(self.ctxs) > 1 else "", t.name): t.bytes for c in self.ctxs for t in c.tables}
            for t in plan:
                t.inline = size.get((t.schema, t.name), INLINE_BYTES) < INLINE_BYTES
            encoding = server_encoding(self.admin)
            # pg_dump's schema makes materialized views WITH NO DATA; those populated on the source are refreshed
            # from the copied rows (in creation order: one built on another comes later)
            named = {c.source_schema or c.schema: c.schema for c in self.ctxs}
            views = [(named[r[0]], r[1]) for r in self.admin.execute(
                "SELECT n.nspname, c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = ANY(%s)"
                " AND c.relkind = 'm' AND c.relispopulated ORDER BY c.oid", (list(named),))]
            casts = casts_sql(self.admin, named) if "pre-data" in sections else ""
            tr = Transfer(self.config.dsn(self.ctx.source), schemas, plan, snapshot=snapshot(), encoding=encoding, sections=sections, schema_dump=schema_dump)
        except BaseException:
            if schema_dump is not None:
                schema_dump.close()
            raise
        try:
            tr.start()
            if started is not None:
                started()
            if ready is not None:
                ready.result()
            with self.tgt.transaction():
                if truncate and plan:
                    self.tgt.execute(f"TRUNCATE {', '.join('ONLY ' + q.ident(t.schema or schemas[0], t.name) for t in plan)}")
                tr.restore(self.tgt, self._copy_progress(), after_pre_data=casts)
                for schema, view in views:
                    self.tgt.execute(f"REFRESH MATERIALIZED VIEW {q.ident(schema, view)}")
                if "post-data" in sections:  # the whole schema is there: its owners' grants as on the source
                    if len(self.ctxs) == 1:
                        self._match_grants(self.ctx.schema, self.ctx.source_schema or self.ctx.schema)
                    else:
                        self._match_grants_of_batch()
                if before_then is not None:
                    before_then.result()
                execute_script(self.tgt, then)
                self._point("copy:restored")  # all of it in, not yet committed
        except psycopg.Error as e:
            raise MoveError(f"restoring {what} into {self.ctx.target} failed: {pg_message(e)}", hint=self._next_hint(self.rec.step)) from None
        except MoveError as e:
            e.hint = e.hint or self._next_hint(self.rec.step)
            raise
        finally:
            tr.close()
            if not self.tgt.closed and not self.tgt.broken:
                self._reset_target()
        self.report.bytes_copied = tr.bytes
        if self.progress is not None:
            total = sum(t.est_rows for c in self.ctxs for t in c.tables)
            ntables = sum(len(c.tables) for c in self.ctxs)
            self.progress(CopyProgress(ntables, ntables, total, total, tr.bytes, self._lag()))

    def _match_grants(self, schema: str, source_schema: str) -> None:
        """Default privileges on the target (ALTER DEFAULT PRIVILEGES for the role restoring) add grants to the
        objects pg_dump's script creates, or take some away: make the owners' grants the source's again."""
        with self.admin.transaction():  # names schema-qualified alike on both sides
            self.admin.execute("SET LOCAL search_path = ''")
            source = {tuple(r) for r in self.admin.execute(dq.OWNER_GRANTS_SQL, {"schema": source_schema})}

        def target() -> set[tuple[Any, ...]]:
            self.tgt.execute("SET LOCAL search_path = ''")
            return {tuple(r) for r in self.tgt.execute(dq.OWNER_GRANTS_SQL, {"schema": schema})}

        execute_script(self.tgt, dq.revoke_grants_sql(schema, source, target()))
        execute_script(self.tgt, dq.grant_missing_sql(schema, source, target()))

    def _match_grants_of_batch(self) -> None:
        """_match_grants for every schema of a batch: four catalog reads in all instead of three per shard."""
        schemas = [c.schema for c in self.ctxs]

        def read(conn: psycopg.Connection[Any]) -> dict[str, set[tuple[Any, ...]]]:
            conn.execute("SET LOCAL search_path = ''")
            out: dict[str, set[tuple[Any, ...]]] = {s: set() for s in schemas}
            for r in conn.execute(dq.OWNER_GRANTS_MANY_SQL, {"schemas": schemas}):
                out[r[0]].add(tuple(r[1:]))
            return out

        with self.admin.transaction():
            source = read(self.admin)
        theirs = read(self.tgt)
        revoke = "\n".join(r for r in (dq.revoke_grants_sql(s, source[s], theirs[s]) for s in schemas) if r)
        if revoke:  # what a revoke took away (a column's too, with its table's) is read again
            execute_script(self.tgt, revoke)
            theirs = read(self.tgt)
        execute_script(self.tgt, "\n".join(dq.grant_missing_sql(s, source[s], theirs[s]) for s in schemas))

    def _copy_progress(self) -> Callable[[str, int], None] | None:
        """Rows as the source's COPY reports them (pg_stat_progress_copy), at most every 0.1 s."""
        if self.progress is None:
            return None
        report = self.progress
        est = {f"{c.schema}.{t.name}": t.est_rows for c in self.ctxs for t in c.tables}
        source_schemas = {c.schema: c.source_schema or c.schema for c in self.ctxs}
        total = sum(est.values())
        done: list[str] = []
        state = {"at": 0.0, "bytes": 0}

        def on_block(table: str, nbytes: int) -> None:
            state["bytes"] += nbytes
            if table not in done:
                done.append(table)
            now = time.perf_counter()
            if now - state["at"] < 0.1:
                return
            state["at"] = now
            schema, _, name = table.partition(".")
            row = self.admin.execute(
                "SELECT coalesce(sum(p.tuples_processed), 0) FROM pg_stat_progress_copy p JOIN pg_class c ON c.oid = p.relid"
                " JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = %s AND c.relname = %s",
                (source_schemas.get(schema, schema), name),
            ).fetchone()
            rows = sum(est[t] for t in done[:-1]) + int(row[0] if row else 0)
            report(CopyProgress(len(done) - 1, len(est), min(rows, total), total, int(state["bytes"]), self._lag()))

        return on_block

    def _offline_copy(self) -> None:
        """Inside the freeze (no snapshot needed, nothing writes): the rows, then indexes and constraints."""
        self._transfer(lambda: None, ("post-data",), truncate=True)
