"""The rendering twin of a move (`--dry-run`): every step, the database it runs on, its SQL and the locks it
takes, after the same read-only checks a real move makes. Nothing is written anywhere."""
from __future__ import annotations

from collections.abc import Sequence

from ..config import Config
from ..db import connect
from ..versions import has
from . import identity as replica
from . import sqltext as q
from .context import (
    check_external_references,
    check_outside_dependents,
    check_owners,
    check_roles,
    check_servers,
    check_tables,
    identity_changes,
    locate,
    read_tables,
)
from .engine import MoveOptions
from .sqltext import ColumnHash, PlannedStep
from .transfer import TableCopy, plan_tables
from .verify import column_hashes


def plan_move(config: Config, shard: int, target: str, *, options: MoveOptions | None = None) -> list[PlannedStep]:
    opts = options or MoveOptions()
    ctx = locate(config, shard, target)
    src = connect(ctx.source, config.dsn(ctx.source), autocommit=True)
    try:
        check_owners([ctx], src, src, target=False)
        ctx.tables, ctx.sequences = read_tables(src, ctx.schema)
        columns = column_hashes(src, ctx.schema)
        check_tables(ctx, online=not opts.offline)
        check_outside_dependents(ctx, src)
        tgt = connect(target, config.dsn(target), autocommit=True)
        try:
            check_roles(ctx, src, tgt)
            check_owners([ctx], src, tgt, target=True)
            check_external_references(ctx, src, tgt)
            if not opts.offline:
                check_servers(ctx, src, tgt)
            streams = plan_tables(src, tgt, ctx.schema, [t.name for t in ctx.tables])
            parents = q.partitioned_of(src, [ctx.schema])[ctx.schema]
            failover = has(src, "failover_slots")
        finally:
            tgt.close()
    finally:
        src.close()
    return render_plan(config, ctx.shard, ctx.source, target, [t.name for t in ctx.tables], options=opts,
                       target_has_catalog=ctx.target_state.has_catalog, columns=columns, streams=streams, parents=parents,
                       identities=[] if opts.offline else identity_changes(ctx), failover_slots=failover)


def render_plan(
    config: Config,
    shard: int,
    source: str,
    target: str,
    tables: list[str],
    *,
    options: MoveOptions,
    target_has_catalog: bool = True,
    columns: dict[str, list[ColumnHash]] | None = None,
    streams: list[TableCopy] | None = None,
    parents: Sequence[str] = (),
    identities: Sequence[replica.Change] = (),
    failover_slots: bool = False,
) -> list[PlannedStep]:
    schema = f"shard_{shard}"
    streams = streams if streams is not None else [TableCopy(t, True) for t in tables]
    names = q.Names(f"{shard}_<token>")
    refs = [q.TableRef(schema, t) for t in tables]
    retired = f"{schema}_moved_<yyyymmddhhmmss>"
    ms = int(options.max_pause * 1000)
    catalog = "install or upgrade the pgidgen catalog" + ("" if target_has_catalog else " (the target has none yet)")
    steps: list[PlannedStep] = [
        *([PlannedStep("prepare", target, catalog)] if options.offline else []),
        PlannedStep("prepare", source, "journal the move (pgidgen.moves) and mark the shard moving; it is still served here",
                    q.source_moving_sql(shard), ["session advisory lock (pgidgen, -16777216 - shard): one mover per shard", "shared advisory xact lock (pgidgen, -4): not while apply-ddl runs"]),
    ]
    if options.offline:
        steps.append(PlannedStep("schema", target, f"create {schema} from pg_dump --section=pre-data --schema={schema} of {source}"
                                 " (tables, functions, sequences, grants; indexes and constraints come after the rows), in one transaction",
                                 q.target_row_sql(shard, schema)))
    else:
        if identities:
            steps.append(PlannedStep(
                "publication", source, "tables without a usable replica identity get one while the move publishes them: "
                + "; ".join(c.describe(schema) for c in identities)
                + f" (each ALTER waits at most {replica.LOCK_TRY_MS} ms for its lock, tried again with backoff for up to {replica.LOCK_WAIT_S:g} s)",
                replica.render(schema, identities), [f"ACCESS EXCLUSIVE on each of these tables, at most {replica.LOCK_TRY_MS} ms a try"]))
        steps += [
            PlannedStep("publication", source, "publish the shard's tables and this move's heartbeat row", q.publication_sql(names, refs)),
            PlannedStep("copy", target, catalog + ", beside the slot and pg_dump"),
            PlannedStep("copy", f"{source} -> {target}", "a logical slot exporting a snapshot (replication connection), then the shard at"
                        f" that snapshot, in one target transaction: the pre-data of pg_dump --schema-only --schema={schema} (started during"
                        " the checks, before the snapshot; printed by pg_restore --section=pre-data), each table's rows as a binary COPY stream (psql at the snapshot on the"
                        " source), its post-data (indexes and constraints), " + ("the move's replica identities, " if identities else "")
                        + "and the target's catalog row",
                        q.slot_sql(names, failover=failover_slots) + ";\n" + _copy_sql(schema, streams) + replica.render(schema, identities)
                        + q.target_row_sql(shard, schema, reset_offset=False)),
            PlannedStep("subscription", target, "subscribe without copying: apply streams every change after the snapshot",
                        q.subscription_sql(names, options.subscription_conninfo or config.dsn(source), show=True)),
            PlannedStep("catchup", source, "heartbeats until one arrives within half of --max-pause; measure the clock skew",
                        q.heartbeat_sql(names.token, 0)),
        ]
    guarded = [q.TableRef(schema, t) for t in parents] + refs  # partitioned parents too, first (as writers lock them)
    freeze = q.freeze_sql(shard, guarded, ms) + (
        "-- the tables, their columns (on both sides)" + ("" if options.offline else " and the publication's hold on them")
        + " as they stand: any change since the move began stops it here, before the flip (their indexes, constraints,"
        " grants, ... and objects outside the shard depending on it are checked right before this)\n")
    cut = ("copy the rows (binary COPY streams into the emptied target tables), then the post-data of pg_dump --schema-only, in one target transaction, then verify" if options.offline
           else "write a heartbeat and wait (within --max-pause) until the target has applied it")
    steps += [
        PlannedStep("cutover", source, f"freeze the shard's writes; {cut}; retire the source copy; one transaction (the write guards after it, beside activate)",
                    freeze + "-- " + cut + "\n" + q.retire_sql(shard, schema, retired, guarded, target),
                    [f"EXCLUSIVE on {len(guarded)} tables of {schema} for at most {ms} ms plus the flip (reads go on, writes wait)"]),
        PlannedStep("activate", target, "carry the DDL-ledger rows, sequences and the generator (last ID from the source, clock skew), go active",
                    q.activate_sql(shard, schema, last_id=":last_id", ahead_ms=":skew_ms",
                                   subscription=None if options.offline else names.subscription),
                    ["advisory lock (pgidgen, shard) inside advance_generator"]),
    ]
    if not options.offline:
        steps += [
            PlannedStep("teardown", target, "drop the subscription", q.drop_subscription_sql(names.subscription)),
            PlannedStep("teardown", source, "drop the slots and the publication", q.drop_slots_sql(names, None) + q.drop_publication_sql(names)),
        ]
    if identities:
        steps.append(PlannedStep("identity", f"{source}+{target}", "the replica identities as they were before the move, on the source copy"
                                 f" and on {target}, once the verification has read them (each lock tried as above)",
                                 replica.render(retired, identities, back=True) + replica.render(schema, identities, back=True)))
    steps.append(PlannedStep("verify", f"{source}+{target}", "row count and checksum per table, source copy vs the target's snapshot at the cutover",
                             "\n".join(q.checksum_sql(schema, t, None if columns is None else columns.get(t, [])) + ";" for t in tables) + ("\n" if tables else "")))
    if options.drop_source:
        steps.append(PlannedStep("cleanup", source, "drop the retired source copy", f"DROP SCHEMA {q.ident(retired)} CASCADE;\n"))
    return steps


def _copy_sql(schema: str, streams: list[TableCopy]) -> str:
    """Each table's stream: the source's statement, the target's (binary, or text for types not built in)."""
    return "".join(
        f"{q.copy_out_sql(schema, t.name, binary=t.binary, columns=t.columns)};  -- source, at the snapshot\n"
        f"{q.copy_in_sql(schema, t.name, binary=t.binary, freeze=True, columns=t.columns)};  -- target\n" for t in streams
    )
