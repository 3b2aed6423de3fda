"""`pgidgen init`: the catalog and the shard schemas, spread over the databases in contiguous ranges.

Policy: one transaction per database when the server's lock table holds all its new shards' locks (each database
gets everything planned for it or nothing); otherwise transactions of whole shards sized from the lock table
(pgidgen/locktable.py), each committed, so a run that stops leaves only whole shards and a run again creates the
rest. A shard's schema, generator, grants, catalog row and replayed DDL always commit together: the catalog never
lists a shard that is not whole. The report says per database what happened. Databases run in parallel. New
shards get the sharded-DDL ledger replayed in their own transaction (pgidgen/ddl/ledger.py), so they hold exactly
what the other shards hold. Every lock is taken under a short lock_timeout and retried (pgidgen/lockwait.py): the
catalog's tables and the tables a replayed file references may be in use by the application.
"""
from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import psycopg

from .catalog import IDENTITY_SQL, CatalogState, read_state
from .config import Config
from .db import Outcome, connect, each_database, execute_script, interrupted, read_each, transaction
from .ddl.ledger import FileVersion, lock_sql, read_history, replay_for_new_shards
from .ddl.locks import PER_SHARD, estimate_locks
from .errors import ConfigError, ConflictError, DatabaseError, PgidgenError
from .idgen import (
    CATALOG_REVISION,
    DEFAULT_GENERATOR,
    INIT_LOCK,
    INIT_RUN_LOCK,
    LOCK_CLASS,
    check_argument_order,
    render_catalog,
    render_catalog_grants,
    render_order_probe,
    render_shard,
    render_shard_grants,
    schema_name,
)
from .layout import Layout, iso_ms
from .locktable import LockBudget, Sizing, held, read_budget, room, sharing
from .lockwait import Holder, LockPolicy, LockWaitExceeded, holders
from .ranges import collapse, spread

BATCH = 100
#: Locks one shard's own objects hold until commit (schema, sequences, functions, catalog row: 6 measured on 15 and
#: 18, 8 for a transaction's first shard), rounded up; a run measures its first batch and shrinks when it took more.
SHARD_LOCKS = 7
#: Locks the catalog's installation holds (~100 measured), kept out of the shards' share of the lock table.
CATALOG_LOCKS = 120
INIT_RESUMES = "each commits whole shards with their catalog rows, so init run again creates only the missing ones"
Progress = Callable[[int], None]
LockWait = Callable[[str, list[int], list[Holder], float], None]


@dataclass
class InitPlan:
    """What init will create where: shards per database (the rendering twin works from this alone)."""

    layout: Layout
    shard_count: int
    assignment: dict[str, list[int]]
    install_catalog: dict[str, bool]
    grant_roles: tuple[str, ...] = ()
    generator: str = DEFAULT_GENERATOR
    #: how each database's new shards are split into transactions (filled once the servers are read)
    sizing: dict[str, Sizing] = field(default_factory=dict)

    @property
    def total(self) -> int:
        return sum(len(v) for v in self.assignment.values())


def check_roles(roles: Sequence[str]) -> tuple[str, ...]:
    cleaned = tuple(r.strip() for r in roles if r.strip())
    for r in cleaned:
        if len(r) > 63:
            raise ConfigError(f"role name {r[:20]}... is longer than 63 characters")
    return cleaned


def check_epoch_past(layout: Layout) -> None:
    """Generators of a layout whose epoch is still to come would stamp every ID with the epoch itself (a time
    field cannot go below 0), years before some of them were made; those of a layout whose time field has run out
    (an old epoch: 40 bits from 1990 end in 2024) would refuse every call."""
    now_ms = time.time() * 1000
    if layout.epoch_ms > now_ms:
        raise ConfigError(f"the layout's epoch {iso_ms(layout.epoch_ms)} is in the future: every ID made before it would carry the epoch as its time",
                          hint="set [layout] epoch to a moment in the past (the default is 2026-01-01T00:00:00Z)")
    if layout.epoch_ms + layout.max_time < now_ms:
        raise ConfigError(f"the layout's time field ran out at {iso_ms(layout.epoch_ms + (1 << layout.time_bits))} (epoch {iso_ms(layout.epoch_ms)},"
                          f" {layout.time_bits} time bits): next_id() could make no ID",
                          hint="set [layout] epoch to a recent moment in the past (the default is 2026-01-01T00:00:00Z)")


def offline_plan(config: Config, shard_count: int, databases: Sequence[str], *, grant_roles: Sequence[str] = ()) -> InitPlan:
    """The plan for empty databases, without connecting (for --sql)."""
    config.layout.check_shard_count(shard_count)
    check_epoch_past(config.layout)
    return InitPlan(
        layout=config.layout,
        shard_count=shard_count,
        assignment=spread(shard_count, databases),
        install_catalog={name: True for name in databases},
        grant_roles=check_roles(grant_roles),
    )


def render_init(plan: InitPlan) -> dict[str, str]:
    """Per database, the SQL init runs there (one transaction), starting with the check init makes first."""
    return {name: (render_order_probe() if plan.assignment[name] else "") + "".join(render_database(plan, name)) for name in plan.assignment}


def render_head(plan: InitPlan, name: str) -> str:
    """What a database's first transaction runs before its shards: the catalog and its grants."""
    head = f"-- pgidgen init: database {name}\n"
    if plan.install_catalog.get(name, True):
        head += render_catalog(plan.layout, shard_count=plan.shard_count, generator=plan.generator)
    if plan.grant_roles:
        head += render_catalog_grants(plan.grant_roles)
    return head


def render_database(plan: InitPlan, name: str) -> list[str]:
    """Chunks of SQL for one database: the catalog, then batches of shards."""
    chunks = [render_head(plan, name)]
    shards = plan.assignment[name]
    for i in range(0, len(shards), BATCH):
        chunks.append("".join(render_shard(plan.layout, s, grant_roles=plan.grant_roles, generator=plan.generator) for s in shards[i:i + BATCH]))
    return chunks


def read_all(config: Config, names: Sequence[str]) -> dict[str, CatalogState]:
    return read_each(config, names, read_state)[0]


def check_layouts(config: Config, states: dict[str, CatalogState], shard_count: int | None) -> None:
    for name, st in states.items():
        if st.foreign_catalog:
            raise ConflictError(
                f"database {name} has a schema named pgidgen that pgidgen did not create",
                hint="rename or drop that schema; pgidgen never writes into a schema it does not own",
            )
        if st.layout is not None and st.layout != config.layout:
            raise ConflictError(
                f"database {name} was initialised with a different layout ({_describe(st.layout)}) than the config ({_describe(config.layout)})",
                hint="the layout must never change under existing IDs: restore the [layout] the database has",
            )
        if shard_count is not None and st.shard_count is not None and st.shard_count != shard_count:
            raise ConflictError(
                f"database {name} was initialised with {st.shard_count} shards, not {shard_count}",
                hint=f"keys are routed by shard count: run init with --shards {st.shard_count}",
            )


def _describe(layout: Layout) -> str:
    return f"epoch {layout.epoch_ms}, {layout.time_bits}/{layout.shard_bits}/{layout.sequence_bits} bits"


#: How long init waits for another init of the deployment to finish.
RUN_PATIENCE = 120.0


@contextmanager
def one_init_at_a_time(config: Config, names: Sequence[str], *, patience: float | None = None) -> Iterator[None]:
    """INIT_RUN_LOCK on every named database for the duration: all or none (a lock taken by another init is waited
    for with all ours released, so two inits naming the databases in different orders cannot deadlock)."""
    conns: dict[str, psycopg.Connection[Any]] = {}
    wait = RUN_PATIENCE if patience is None else patience
    deadline = time.monotonic() + wait
    try:
        for name in names:
            conns[name] = connect(name, config.dsn(name), autocommit=True)
        seen: set[str] = set()
        distinct = []  # one database under two config names is locked once (plan_init then refuses the config)
        for name in names:
            row = conns[name].execute(IDENTITY_SQL).fetchone()
            if row is None or row[0] not in seen:
                distinct.append(name)
                seen.add(row[0] if row else name)
        while True:
            held: list[str] = []
            busy = None
            for name in distinct:
                if conns[name].execute("SELECT pg_try_advisory_lock(%s, %s)", (LOCK_CLASS, INIT_RUN_LOCK)).fetchone()[0]:  # type: ignore[index]
                    held.append(name)
                else:
                    busy = name
                    break
            if busy is None:
                break
            for name in held:
                conns[name].execute("SELECT pg_advisory_unlock(%s, %s)", (LOCK_CLASS, INIT_RUN_LOCK))
            if time.monotonic() >= deadline:
                raise ConflictError(f"another pgidgen init is running on database {busy} (waited {wait:.0f} s)",
                                    hint="let it finish, then run init again: it creates only what is still missing")
            time.sleep(0.2)
        yield
    finally:
        for conn in conns.values():
            conn.close()  # ends the session: its locks go with it


def check_grant_roles(config: Config, names: Sequence[str], roles: Sequence[str]) -> None:
    """--grant is for application roles: granting to the role that owns pgidgen's objects (or runs init, which will
    own them) would first revoke that role's own rights, the generator's slow path needs UPDATE on the offset."""
    if not roles:
        return

    def owners(conn: psycopg.Connection[Any]) -> set[str]:
        row = conn.execute("SELECT current_user::text, (SELECT pg_catalog.pg_get_userbyid(nspowner)::text FROM pg_catalog.pg_namespace WHERE nspname = 'pgidgen')").fetchone()
        assert row is not None
        return {str(r) for r in row if r is not None}

    found, _ = read_each(config, list(names), owners)
    for name, own in found.items():
        for role in roles:
            if role in own:
                raise ConfigError(f"--grant {role}: {role} owns pgidgen's objects on database {name} (or runs this init), and has every right on them already",
                                  hint="--grant is for the application's roles; run init as the owner and grant to the others")


def plan_init(
    config: Config,
    shard_count: int,
    databases: Sequence[str],
    *,
    grant_roles: Sequence[str] = (),
) -> tuple[InitPlan, dict[str, CatalogState]]:
    """Read every configured database and plan only what is missing: shards that exist anywhere stay put."""
    config.layout.check_shard_count(shard_count)
    check_epoch_past(config.layout)
    roles = check_roles(grant_roles)
    states = read_all(config, list(config.databases))
    seen: dict[str, str] = {}
    for name, st in states.items():
        if st.identity and st.identity in seen:
            raise ConfigError(f"{seen[st.identity]} and {name} in the config are the same database",
                              where=str(config.path) if config.path else None, hint="remove one of them from the config")
        seen.setdefault(st.identity, name)
    check_layouts(config, states, shard_count)
    for name, st in states.items():
        lost = sorted(set(st.active) - st.shard_schemas)
        if lost:
            raise ConflictError(
                f"database {name} lists shard{'s' if len(lost) > 1 else ''} {collapse(lost)} in its catalog, but {'their schemas are' if len(lost) > 1 else 'its schema is'} missing",
                hint="restore the schema from a backup (then its generator state: pgidgen.advance_generator); init never remakes a shard that once handed out IDs",
            )
    present: dict[int, list[str]] = {}
    for name, st in states.items():
        for s in st.active:
            present.setdefault(s, []).append(name)
    target = spread(shard_count, databases)
    assignment: dict[str, list[int]] = {name: [] for name in databases}
    for name, shards in target.items():
        st = states[name]
        for s in shards:
            if s in present:
                continue
            if s in st.shards:  # retired, moving or incoming here, active in no configured database
                raise ConflictError(
                    f"shard {s} is {st.shards[s]} in database {name} and active in no database of the config",
                    hint=f"add the database it moved to to the config (pgidgen.moves on {name} names it), or finish its move; init never makes a shard twice",
                )
            if s in st.shard_schemas:
                raise ConflictError(
                    f"database {name} already has a schema {schema_name(s)} that pgidgen did not create",
                    hint="rename or drop it; pgidgen never clobbers a schema it does not own",
                )
            assignment[name].append(s)
    install = {name: not states[name].has_catalog or states[name].layout is None or states[name].catalog_revision < CATALOG_REVISION
               for name in databases}
    return InitPlan(config.layout, shard_count, assignment, install, roles), states


def init(
    config: Config,
    shard_count: int,
    databases: Sequence[str] | None = None,
    *,
    grant_roles: Sequence[str] = (),
    progress: Progress | None = None,
    on_plan: Callable[[InitPlan], None] | None = None,
    lock_policy: LockPolicy | None = None,
    on_lock_wait: LockWait | None = None,
) -> list[Outcome]:
    """Create what is missing; on_plan sees the plan (with its sizing) before anything runs (to size a progress bar).

    Each transaction takes its locks under lock_policy's short lock_timeout: one that cannot get a lock in time rolls
    back (the shards committed before stay), pauses and tries again until lock_policy.wait, then LockWaitExceeded;
    on_lock_wait(database, shards, holders, seconds waited) says who held it.
    """
    names = config.select(list(databases) if databases else None)
    with one_init_at_a_time(config, list(config.databases)):
        return _init(config, shard_count, names, grant_roles=grant_roles, progress=progress, on_plan=on_plan,
                     policy=lock_policy or LockPolicy(), on_lock_wait=on_lock_wait)


def size_init(plan: InitPlan, budgets: Mapping[str, LockBudget], history: Mapping[int, FileVersion]) -> dict[str, Sizing]:
    """Each database's Sizing from its server's lock table: a shard's own objects (SHARD_LOCKS) and the ledger's
    files replayed on it (their estimate); the catalog's locks reserved in the first transaction."""
    per_shard = SHARD_LOCKS + (estimate_locks(history.values()) - PER_SHARD if history else 0)
    shared = sharing({n: budgets[n] for n in plan.assignment if plan.assignment[n]})
    out: dict[str, Sizing] = {}
    for name, shards in plan.assignment.items():
        if not shards:
            continue
        b = budgets[name]
        out[name] = sizing = Sizing(len(shards), len(shards), capacity=b.capacity, room=room(b, shared[name]), resumes=INIT_RESUMES,
                                    reserved=CATALOG_LOCKS if plan.install_catalog.get(name, True) else 0)
        sizing.refit(per_shard)
    return out


def _init(config: Config, shard_count: int, names: list[str], *, grant_roles: Sequence[str], progress: Progress | None,
          on_plan: Callable[[InitPlan], None] | None, policy: LockPolicy, on_lock_wait: LockWait | None) -> list[Outcome]:
    plan, states = plan_init(config, shard_count, names, grant_roles=grant_roles)
    check_grant_roles(config, names, plan.grant_roles)
    history = read_history(config, list(config.databases)) if plan.total else {}
    busy = [n for n in names if plan.assignment[n]]
    plan.sizing = size_init(plan, read_each(config, busy, read_budget)[0], history) if busy else {}
    if on_plan is not None:
        on_plan(plan)
    lock = threading.Lock()

    def tick(n: int) -> None:
        if progress is not None and n > 0:
            with lock:
                progress(n)

    def work(name: str) -> Outcome:
        shards = plan.assignment[name]
        needs_work = bool(shards) or plan.install_catalog[name] or bool(plan.grant_roles)
        if not needs_work:
            held_now = sorted(states[name].active)
            return Outcome(name, changed=False, summary=f"unchanged (holds {len(held_now)} shards: {collapse(held_now) or 'none'})")
        run = _Run(config, plan, name, states[name], history, policy, on_lock_wait, tick)
        run.all()
        parts = []
        if plan.install_catalog[name]:
            parts.append(f"catalog upgraded to revision {CATALOG_REVISION}" if states[name].has_catalog and states[name].layout is not None
                         else "catalog installed")
        parts.append(f"created {len(shards)} shards ({collapse(shards) or 'none'})")
        if shards and run.replayed:
            parts.append(f"replayed {run.replayed} sharded DDL files on them")
        if plan.grant_roles:
            parts.append(f"granted to {', '.join(plan.grant_roles)}")
        if run.transactions > 1:
            parts.append(f"in {run.transactions} transactions")
        return Outcome(name, changed=True, summary=", ".join(parts), details={"created": len(shards), "transactions": run.transactions})

    results = each_database(names, work)
    outcomes: list[Outcome] = []
    for name in names:
        res = results[name]
        if isinstance(res, PgidgenError):
            committed = getattr(res, "committed", [])
            outcomes.append(Outcome(name, ok=False, summary=f"failed; shards {collapse(committed)} were committed before" if committed
                                    else "failed, rolled back", error=res.render()))
        else:
            outcomes.append(res)
    return outcomes


class _LockTimedOut(Exception):
    def __init__(self, who: list[Holder]) -> None:
        super().__init__("lock timeout")
        self.who = who


class _Run:
    """One database's init: its shards in the transactions plan.sizing gives it, each whole (a shard's schema,
    generator, catalog row, grants and replayed DDL commit together), each retried under the lock policy."""

    def __init__(self, config: Config, plan: InitPlan, name: str, state: CatalogState, history: Mapping[int, FileVersion],
                 policy: LockPolicy, on_lock_wait: LockWait | None, tick: Progress) -> None:
        self.config, self.plan, self.name, self.state, self.history = config, plan, name, state, history
        self.policy, self.on_lock_wait, self.tick = policy, on_lock_wait, tick
        self.committed: list[int] = []
        self.catalog_done = False
        self.transactions = 0
        self.replayed = 0
        self.measured = False  # the first batch's locks, checked against the estimate
        self.files_locks = estimate_locks(history.values()) - PER_SHARD if history else 0

    def all(self) -> None:
        shards = self.plan.assignment[self.name]
        while True:
            if self.committed and interrupted():  # Ctrl-C between transactions: none more
                raise DatabaseError(f"database {self.name}: interrupted, the shards not yet committed were not made")
            rest = shards[len(self.committed):]
            sizing = self.plan.sizing.get(self.name)
            self._retried(rest[:(sizing.per_tx if self.committed else sizing.first)] if sizing is not None else rest, rest)
            if len(self.committed) == len(shards):
                return

    def _retried(self, group: list[int], rest: list[int]) -> None:
        began, pause, ticked = time.monotonic(), self.policy.sleeps(), [0]
        while True:
            try:
                self._one(group, rest, ticked)
                return
            except _LockTimedOut as e:
                waited = time.monotonic() - began
                if self.on_lock_wait is not None:
                    self.on_lock_wait(self.name, group, e.who, waited)
                sleep = pause()
                if waited + sleep > self.policy.wait:
                    who = "; ".join(h.describe() for h in e.who[:3]) or "a session that has since let go"
                    done = f"shards {collapse(self.committed)} were committed before" if self.committed else "nothing was created there"
                    err = LockWaitExceeded(f"gave up after {waited:.0f} s waiting for a lock held by {who}",
                                           where=f"{self.name}, {_shards(group) if group else 'the catalog'}",
                                           hint=f"end or wait for that transaction (pg_terminate_backend(pid) ends it), then run init again ({done})")
                    err.committed = list(self.committed)  # type: ignore[attr-defined]
                    raise err from None
                time.sleep(sleep)
            except PgidgenError as e:
                e.committed = list(self.committed)  # type: ignore[attr-defined]
                if self.committed:
                    e.hint = (f"shards {collapse(self.committed)} were committed before, whole (run init again once the cause is fixed: it creates"
                              f" only the missing ones){'; ' + e.hint if e.hint else ''}")
                raise

    def _one(self, group: list[int], rest: list[int], ticked: list[int]) -> None:
        """One transaction: the catalog (the first time), then group's shards, fewer when the first batch took more
        locks per shard than estimated, their replayed DDL, and (with the last shards) the grants on the others."""
        plan, name = self.plan, self.name
        sizing = plan.sizing.get(name)
        with transaction(name, self.config.dsn(name), doing="initialising shards") as conn:
            conn.execute("SELECT pg_advisory_xact_lock(%s, %s)", (LOCK_CLASS, INIT_LOCK))
            if group:  # the ledger's lock first too: waiting for an apply-ddl queues no application query
                execute_script(conn, lock_sql())
            conn.execute(f"SET LOCAL lock_timeout = '{max(1, round(self.policy.lock_timeout * 1000))}ms'".encode())
            try:
                again = read_state(conn, schemas=False)
                if again.active != self.state.active | set(self.committed) or again.has_catalog != (self.state.has_catalog or self.catalog_done):
                    raise DatabaseError(f"database {name} changed while init was planning", hint="another init ran at the same time; run init again")
                if not self.catalog_done:
                    if plan.assignment[name]:
                        check_argument_order(conn, name)
                    execute_script(conn, render_head(plan, name))
                done = 0
                while done < len(group):
                    if interrupted():  # Ctrl-C while this batch was rendered (no statement running to cancel)
                        raise DatabaseError(f"database {name}: interrupted, rolled back")
                    part = group[done:done + BATCH]
                    before = held(conn) if sizing is not None and not self.measured else 0
                    execute_script(conn, "".join(render_shard(plan.layout, s, grant_roles=plan.grant_roles, generator=plan.generator) for s in part))
                    if sizing is not None and not self.measured:
                        self.measured = True
                        sizing.check(-(-(held(conn) - before) // len(part)) + self.files_locks)
                        group = group[:max(sizing.per_tx if self.committed else sizing.first, len(part))]
                    done += len(part)
                    self.tick(done - ticked[0])
                    ticked[0] = max(ticked[0], done)
                replayed = replay_for_new_shards(conn, group, self.history)
                for chunk in replayed.chunks:
                    execute_script(conn, chunk)
                if len(group) == len(rest) and plan.grant_roles:  # the shards already there get the same grants (and lose older, wider ones)
                    existing = sorted(self.state.active - set(plan.assignment[name]))
                    for i in range(0, len(existing), BATCH):
                        execute_script(conn, render_shard_grants(existing[i:i + BATCH], plan.grant_roles))
            except psycopg.errors.LockNotAvailable:
                conn.rollback()
                raise _LockTimedOut(holders(conn, _touched(conn, group))) from None
        self.transactions += 1
        self.catalog_done = True
        self.committed += group
        self.replayed = max(self.replayed, replayed.files)


def _touched(conn: psycopg.Connection[Any], group: Sequence[int]) -> list[str]:
    """The schemas whose tables init may lock: its catalog's, the new shards', and any other schema a replayed file
    may reference (public, the application's); never the shards already there."""
    rows = conn.execute("SELECT nspname FROM pg_catalog.pg_namespace WHERE nspname !~ '^(pg_|shard_[0-9])' AND nspname <> 'information_schema'")
    return [str(r[0]) for r in rows] + [schema_name(s) for s in group]


def _shards(shards: Sequence[int]) -> str:
    return f"shards {collapse(list(shards))}" if len(shards) > 1 else f"shard {shards[0]}"
