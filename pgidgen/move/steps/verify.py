"""verify: the retired source copy against the target's snapshot at the cutover point (started in the
background at activate, collected here)."""
from __future__ import annotations

from typing import Any

import psycopg

from ...db import connect
from ..context import MoveError
from ..verify import Verification, compare, compare_many
from .base import Background, MoverBase


class VerifyStep(MoverBase):
    def _compare_all(self, src: psycopg.Connection[Any], source_schemas: dict[int, str], tgt: psycopg.Connection[Any], *, when: str | None = None) -> Verification:
        """compare() for each shard of the batch (its source copy by source_schemas), as one verification whose
        tables a batch names schema-qualified."""
        kw = {"when": when} if when else {}
        if len(self.ctxs) == 1:
            return compare(src, source_schemas[self.ctx.shard], tgt, self.ctx.schema, [t.name for t in self.ctx.tables], **kw)
        return compare_many(src, tgt, [(source_schemas[c.shard], c.schema, [t.name for t in c.tables]) for c in self.ctxs], **kw)

    def _start_checking(self, snap: psycopg.Connection[Any]) -> None:
        """The comparison at the cutover point only reads: the retired source copies take no more writes and snap
        holds the target's snapshot of that moment. So it runs from the end of the pause (activate's commit: its
        scans would slow the flip down, by more the larger the batch), beside teardown, and step_verify
        (journaled as before) collects the result."""
        retired = {c.shard: c.source_schema for c in self.ctxs}
        name, dsn = self.ctx.source, self.config.dsn(self.ctx.source)
        opened, self.check_src = self.check_src, None

        def check() -> Verification:
            src = opened or connect(name, dsn, autocommit=True)
            try:
                return self._compare_all(src, retired, snap)
            finally:
                src.close()

        self.checking = Background(check)

    def step_verify(self) -> None:
        if self.verification is not None:
            if self.snapshot is not None:
                self.snapshot.close()
            self.journal.note("verify", verified=self.verification.ok)
            return
        retired = {c.shard: c.source_schema for c in self.ctxs}
        if self.snapshot is not None:
            if self.checking is not None:
                v = self.checking.result()
                self.checking = None
            else:
                v = self._compare_all(self.admin, retired, self.snapshot)
            self.snapshot.close()
        else:
            v = self._compare_all(self.admin, retired, self.tgt,
                                  when="after a resume or a lost connection (the cutover snapshot died with it; writes to the target since the flip show as differences)")
        self.verification = v
        self.journal.note("verify", verified=v.ok)
        if not v.ok and self.snapshot is not None:
            kept = self.ctx.source_schema if len(self.ctxs) == 1 else "shard_N_moved_..."
            raise MoveError(
                f"{self.what} moved, but {'its copy' if len(self.ctxs) == 1 else 'their copies'} on {self.ctx.target} differs from the source at the cutover point: "
                + "; ".join(t.describe() for t in v.mismatches()),
                hint=f"the source copy is kept read-only as {self.ctx.source}.{kept} for repair; investigate before --cleanup",
            )
