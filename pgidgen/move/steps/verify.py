"""verify: the retired source copy against the target's snapshot at the cutover point (started in the
background at activate, collected here)."""
from __future__ import annotations

from typing import Any

import psycopg

from ...db import connect
from ..context import MoveError
from ..verify import Verification, compare
from .base import Background, MoverBase


class VerifyStep(MoverBase):
    def _start_checking(self, snap: psycopg.Connection[Any], retired: str) -> None:
        """The comparison at the cutover point only reads: the retired source copy takes no more writes and snap
        holds the target's snapshot of that moment. So it runs from the end of the pause (activate's commit: its
        scans would slow the flip down, by more the larger the shard), beside teardown, and step_verify
        (journaled as before) collects the result."""
        tables = [t.name for t in self.ctx.tables]
        name, dsn, schema = self.ctx.source, self.config.dsn(self.ctx.source), self.ctx.schema
        opened, self.check_src = self.check_src, None

        def check() -> Verification:
            src = opened or connect(name, dsn, autocommit=True)
            try:
                return compare(src, retired, snap, schema, tables)
            finally:
                src.close()

        self.checking = Background(check)

    def step_verify(self) -> None:
        if self.verification is not None:
            if self.snapshot is not None:
                self.snapshot.close()
            self.journal.note("verify", verified=self.verification.ok)
            return
        tables = [t.name for t in self.ctx.tables]
        if self.snapshot is not None:
            if self.checking is not None:
                v = self.checking.result()
                self.checking = None
            else:
                v = compare(self.admin, self.ctx.source_schema, self.snapshot, self.ctx.schema, tables)
            self.snapshot.close()
        else:
            v = compare(self.admin, self.ctx.source_schema, self.tgt, self.ctx.schema, tables,
                        when="after a resume (the cutover snapshot died with the interrupted run; writes to the target since the flip show as differences)")
        self.verification = v
        self.journal.note("verify", verified=v.ok)
        if not v.ok and self.snapshot is not None:
            raise MoveError(
                f"shard {self.ctx.shard} moved, but its copy on {self.ctx.target} differs from the source at the cutover point: "
                + "; ".join(t.describe() for t in v.mismatches()),
                hint=f"the source copy is kept read-only as {self.ctx.source}.{self.ctx.source_schema} for repair; investigate before --cleanup",
            )
