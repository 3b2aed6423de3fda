"""failover: a move resumed (or ridden through) after its source failed over to a physical standby, whose slot
did not come along (slots are not replicated to a standby; PostgreSQL 17+'s failover slots are, when the standby
synchronizes them). The journal is on the source, so the promoted server knows the move and its step; the
subscription on the target can never stream again, so the move goes back to its copy: the subscription dropped,
the copy and its slot made again on the new source. Safe while nothing has flipped: the target never served the
shard, and the source's rows are the whole truth."""
from __future__ import annotations

from .. import sqltext as q
from .base import MoverBase

#: The steps that stream from the copy's slot: run again without it, they would wait for ever.
SLOT_STEPS = ("subscription", "catchup", "cutover")


class FailoverSteps(MoverBase):
    def _slot_lost(self, step: str) -> bool:
        """Before step runs again (a --resume, or a ride): when the source's slot is gone and nothing has flipped,
        the subscription is dropped and the journal goes back to the copy (True: the caller runs "copy" next)."""
        if step not in SLOT_STEPS or self.rec.mode != "online":  # an offline move has no slot
            return False
        if self.admin.execute("SELECT 1 FROM pg_catalog.pg_replication_slots WHERE slot_name = %s", (self.names.slot,)).fetchone():
            return False
        states = {r[0] for r in self.admin.execute("SELECT state FROM pgidgen.shards WHERE shard = ANY(%s)", (self.shards,))}
        if states != {"moving"} or any(st != "incoming" for st, _ in self._target_rows().values()):
            return False  # the cutover committed (it needs no slot after it) or something else holds: the step says
        self.journal.log(step, "slot_lost", {"slot": self.names.slot})
        if self.tgt.execute("SELECT 1 FROM pg_catalog.pg_subscription WHERE subname = %s", (self.names.subscription,)).fetchone():
            for stmt in q.drop_subscription_sql(self.names.subscription).splitlines():  # never reaches the source
                self.tgt.execute(stmt)
        self.apply_watch = None
        self.journal.start("copy", subscription_oid=None)
        self.report.notes.append(f"the source's slot was gone (a failover of {self.ctx.source}?): copied {self.what} again (the target had never served it)")
        return True
