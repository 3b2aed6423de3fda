"""The subscription's apply worker watched during catch-up: a failure that reconnecting cures is waited for, one
that stays fails the move (used by steps/replication.py; apart from it so that the mover's base can name it)."""
from __future__ import annotations

import time
from typing import Any

from ..context import MoveError

#: A subscription whose apply worker failed this many times with nothing applied in between fails for a reason
#: that stays (a lost connection fails it once, and the worker reconnects and applies what waited).
APPLY_REPEATS = 3
#: PostgreSQL 18's conflicts that stop the apply worker (the others are logged and skipped).
ERROR_CONFLICTS = ("confl_insert_exists", "confl_update_exists", "confl_multiple_unique_conflicts")


class ApplyWatch:
    """The subscription's apply worker between heartbeats that do not arrive. Its failures (apply_error_count on
    the target) that reconnecting cures (the subscription's connection to the source lost: it fails once, the
    launcher starts it again after wal_retrieve_retry_interval) are waited for, up to --fault-wait; a failure
    whose cause the catalogs show fails the move at once (ReplicationSteps._apply_cause), and so does one that
    comes back APPLY_REPEATS times with nothing applied in between (the slot's confirmed position did not move):
    a permission, a constraint, anything that will fail the same way again."""

    def __init__(self, mover: Any, oid: int) -> None:
        """mover: the Mover (its ReplicationSteps: _errors, _conflicts, _apply_cause, _confirmed, report, journal)."""
        self.mover, self.oid = mover, oid
        self.errors = mover._errors(oid)
        self.conflicts = mover._conflicts(oid)
        self.streak = 0  # failures since something was last applied
        self.confirmed: int | None = None  # the slot's position at the last failure
        self.since: float | None = None  # the first failure not yet followed by a heartbeat
        self.failures = 0

    def look(self, arrived: bool, sent: float) -> str | None:
        """After a heartbeat (written at sent) that did not arrive in time: what the move waits for (None: nothing
        failed), or a MoveError. arrived: it came late, so the worker applies again (what failed is not failing now)."""
        m = self.mover
        errors = m._errors(self.oid)
        if errors > self.errors:
            new, self.errors = errors - self.errors, errors
            m._apply_cause(self.conflicts)
            confirmed = m._confirmed()
            self.streak = new if self.confirmed is not None and confirmed != self.confirmed else self.streak + new
            self.confirmed = confirmed
            self.failures += new
            if self.since is None:
                self.since = sent  # the failure came after the last heartbeat that arrived
            if self.streak >= APPLY_REPEATS and not arrived:
                raise MoveError(f"applying changes of {m.what} on {m.ctx.target} fails again and again ({self.streak} times with nothing applied"
                                " in between): not a lost connection", where=f"{m.ctx.target}'s server log names the error",
                                hint=f"fix the cause, then --resume {m.ctx.shard}, or --rollback {m.ctx.shard}")
        if self.since is None:
            return None
        waited = time.perf_counter() - self.since
        if waited > m.opts.fault_wait:
            raise MoveError(f"the subscription of {m.what} on {m.ctx.target} has applied nothing for {waited:.0f}s since its connection to"
                            f" {m.ctx.source} was lost (--fault-wait {m.opts.fault_wait:g}s)", where=f"{m.ctx.target}'s server log",
                            hint=f"see that {m.ctx.target}'s server reaches {m.ctx.source} (the subscription's connection string,"
                                 f" --subscription-dsn), then --resume {m.ctx.shard}, or --rollback {m.ctx.shard}")
        return (f"waiting for the subscription on {m.ctx.target} to reconnect to {m.ctx.source}"
                f" (its apply worker failed {self.failures} time{'s' if self.failures > 1 else ''}, {waited:.0f}s ago)")

    def applied(self) -> None:
        """A heartbeat arrived: whatever failed is over (noted in the report when something had)."""
        if self.since is not None:
            took = time.perf_counter() - self.since
            m = self.mover
            m.report.faults.append({"step": "catchup", "lost": f"the subscription's connection to {m.ctx.source}",
                                    "error": f"its apply worker failed {self.failures} time{'s' if self.failures > 1 else ''}", "seconds": round(took, 3)})
            m.journal.log("catchup", "fault", {"lost": "subscription", "apply_errors": self.failures, "seconds": round(took, 3)})
            m._waiting(None)
        self.since, self.streak, self.failures, self.confirmed = None, 0, 0, None
