"""`pgidgen init`: the catalog and the shard schemas, spread over the databases in contiguous ranges.

Policy: one transaction per database. Each database either gets everything planned for it or nothing; the
report says per database what happened. Databases run in parallel. New shards get the sharded-DDL ledger
replayed in the same transaction (pgidgen/ddl/ledger.py), so they hold exactly what the other shards hold.
"""
from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import psycopg

from .catalog import IDENTITY_SQL, CatalogState, read_state
from .config import Config
from .db import Outcome, connect, each_database, execute_script, read_each, transaction
from .ddl.ledger import read_history, replay_for_new_shards
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
from .ranges import collapse

BATCH = 100
Progress = Callable[[int], None]


@dataclass
class InitPlan:
    """What init will create where: shards per database (the rendering twin works from this alone)."""

    layout: Layout
    shard_count: int
    assignment: dict[str, list[int]]
    install_catalog: dict[str, bool]
    grant_roles: tuple[str, ...] = ()
    generator: str = DEFAULT_GENERATOR

    @property
    def total(self) -> int:
        return sum(len(v) for v in self.assignment.values())


def spread(shard_count: int, databases: Sequence[str]) -> dict[str, list[int]]:
    """Even contiguous ranges: shard i goes to databases[i * len // count]."""
    n = len(databases)
    out: dict[str, list[int]] = {name: [] for name in databases}
    for shard in range(shard_count):
        out[databases[shard * n // shard_count]].append(shard)
    return out


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


def render_database(plan: InitPlan, name: str) -> list[str]:
    """Chunks of SQL for one database: the catalog, then batches of shards."""
    chunks: list[str] = []
    head = f"-- pgidgen init: database {name}\n"
    if plan.install_catalog.get(name, True):
        head += render_catalog(plan.layout, shard_count=plan.shard_count, generator=plan.generator)
    if plan.grant_roles:
        head += render_catalog_grants(plan.grant_roles)
    chunks.append(head)
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
) -> list[Outcome]:
    """Create what is missing; on_plan sees the plan before anything runs (to size a progress bar)."""
    names = config.select(list(databases) if databases else None)
    with one_init_at_a_time(config, list(config.databases)):
        return _init(config, shard_count, names, grant_roles=grant_roles, progress=progress, on_plan=on_plan)


def _init(config: Config, shard_count: int, names: list[str], *, grant_roles: Sequence[str], progress: Progress | None,
          on_plan: Callable[[InitPlan], None] | None) -> list[Outcome]:
    plan, states = plan_init(config, shard_count, names, grant_roles=grant_roles)
    check_grant_roles(config, names, plan.grant_roles)
    history = read_history(config, list(config.databases)) if plan.total else {}
    if on_plan is not None:
        on_plan(plan)
    lock = threading.Lock()

    def tick(n: int) -> None:
        if progress is not None:
            with lock:
                progress(n)

    def work(name: str) -> Outcome:
        shards = plan.assignment[name]
        needs_work = bool(shards) or plan.install_catalog[name] or bool(plan.grant_roles)
        if not needs_work:
            held = sorted(states[name].active)
            return Outcome(name, changed=False, summary=f"unchanged (holds {len(held)} shards: {collapse(held) or 'none'})")
        chunks = render_database(plan, name)
        if plan.grant_roles:  # the shards already there get the same grants (and lose any older, wider ones)
            existing = sorted(states[name].active - set(shards))
            chunks += [render_shard_grants(existing[i:i + BATCH], plan.grant_roles) for i in range(0, len(existing), BATCH)]
        with transaction(name, config.dsn(name), doing="initialising shards") as conn:
            conn.execute("SELECT pg_advisory_xact_lock(%s, %s)", (LOCK_CLASS, INIT_LOCK))
            again = read_state(conn)
            if again.active != states[name].active or again.has_catalog != states[name].has_catalog:
                raise DatabaseError(f"database {name} changed while init was planning", hint="another init ran at the same time; run init again")
            if shards:
                check_argument_order(conn, name)
            execute_script(conn, chunks[0])
            done = 0
            for chunk in chunks[1:]:
                execute_script(conn, chunk)
                n = min(BATCH, len(shards) - done)
                done += n
                tick(n)
            replayed = replay_for_new_shards(conn, shards, history)
            for chunk in replayed.chunks:
                execute_script(conn, chunk)
        parts = []
        if plan.install_catalog[name]:
            parts.append(f"catalog upgraded to revision {CATALOG_REVISION}" if states[name].has_catalog and states[name].layout is not None
                         else "catalog installed")
        parts.append(f"created {len(shards)} shards ({collapse(shards) or 'none'})")
        if shards and replayed.files:
            parts.append(f"replayed {replayed.files} sharded DDL files on them")
        if plan.grant_roles:
            parts.append(f"granted to {', '.join(plan.grant_roles)}")
        return Outcome(name, changed=True, summary=", ".join(parts), details={"created": len(shards)})

    results = each_database(names, work)
    outcomes: list[Outcome] = []
    for name in names:
        res = results[name]
        if isinstance(res, PgidgenError):
            outcomes.append(Outcome(name, ok=False, summary="failed, rolled back", error=res.render()))
        else:
            outcomes.append(res)
    return outcomes
