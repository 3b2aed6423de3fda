"""identity: the replica identities a move set on tables without a usable one (see move/identity.py), put back as
they were on both copies once the move is done; set on the source before the publication, on the target's copy
with its schema; put back on the source by a rollback."""
from __future__ import annotations

from ...errors import ConflictError
from .. import identity as replica
from ..context import MoveError
from .base import MoverBase


class IdentitySteps(MoverBase):
    def _identities(self) -> dict[int, list[replica.Change]]:
        """Per shard of the batch, the changes its journal holds (journaled with the move, before any was made)."""
        changes = replica.from_journal(self.rec.detail)
        return {c.shard: changes[c.schema] for c in self.ctxs if changes.get(c.schema)}

    def _set_identities(self) -> None:
        """On the source, before the publication: each table's identity for the move (the application's writes wait
        at most one lock try; see identity.with_lock_retries)."""
        shard, found = self.ctx.shard, self._identities()
        for c in self.ctxs:
            changes = found.get(c.shard)
            if changes:
                self._put(self.ctx.source, c.source_schema or c.schema, changes, back=False,
                          hint=f"nothing is published yet: end what holds the lock (or wait), then 'pgidgen move-shard --resume {shard}', or undo with --rollback {shard}")

    def _identities_on_target_sql(self) -> str:
        """The move's identities on the target's copy, in the copy's transaction (the tables are its own yet):
        pg_dump gave the copy whatever the source had when it read it, and the apply needs the source's."""
        found = self._identities()
        return "".join(replica.render(c.schema, found[c.shard]) for c in self.ctxs if c.shard in found)

    def step_identity(self) -> None:
        """Both copies' tables get the identity they had before the move: the retired source copy (nobody writes
        there) and the target's, which serves (each ALTER's lock tried briefly, again and again). The comparison
        at the cutover point (started at activate) reads both copies: it finishes first, and its snapshot on the
        target lets go of the tables (step_verify collects what it found)."""
        found = self._identities()
        if not found:
            return
        if self.checking is not None:
            self.checking.join()
        if self.snapshot is not None and not self.snapshot.closed:
            self.snapshot.rollback()
        shard = self.ctx.shard
        hint = f"the move is done but for this: end what holds the lock (or wait), then 'pgidgen move-shard --resume {shard}'"
        for c in self.ctxs:
            changes = found.get(c.shard)
            if not changes:
                continue
            self._put(self.ctx.source, c.source_schema or c.schema, changes, back=True, hint=hint)
            self._put(self.ctx.target, c.schema, changes, back=True, hint=hint)
            for ch in changes:
                self.report.identities.append({"table": f"{c.schema}.{ch.table}", "was": str(ch.was), "during": str(ch.during)})
                self.report.notes.append(f"{c.schema}.{ch.table} ({replica.lacking(ch.was)}) moved with REPLICA IDENTITY {ch.during};"
                                         f" {ch.was} again on both copies")

    def _put_back_on_source(self) -> None:
        """A rollback's: the source's tables (the publication is gone) as they were before the move."""
        found = self._identities()
        for c in self.ctxs:
            changes = found.get(c.shard)
            if changes:
                self._put(self.ctx.source, c.source_schema or c.schema, changes, back=True,
                          hint=f"end what holds the lock (or wait), then 'pgidgen move-shard --rollback {self.ctx.shard}' again")
                self.report.notes.extend(f"{c.schema}.{ch.table}: REPLICA IDENTITY {ch.was} again" for ch in changes)

    def _put(self, database: str, schema: str, changes: list[replica.Change], *, back: bool, hint: str) -> None:
        conn = self.admin if database == self.ctx.source else self.tgt
        try:
            replica.put(conn, database, schema, changes, back=back, hint=hint)
        except ConflictError as e:
            raise MoveError(e.what, where=e.where, hint=e.hint) from None
