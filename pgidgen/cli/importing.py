"""`pgidgen import`: an unsharded database's tables into the shards, online (pgidgen.importing holds the work)."""
from __future__ import annotations

import json

import click

from ..errors import ConfigError
from ..layout import iso_ms
from ..sizes import human
from .common import get_config, interactive


@click.command("import")
@click.argument("source", metavar="SOURCE_DSN")
@click.option("--schema", default="public", show_default=True, help="The source schema whose tables are imported.")
@click.option("--key", metavar="COLUMN", help="The shard key column every imported table has (shard = key % shard count).")
@click.option("--key-of", "key_of", metavar="TABLE=COLUMN:PARENT.PARENTCOL", multiple=True,
              help="A table without the key column, routed by its parent: its COLUMN equals PARENT.PARENTCOL, a parent with the key or routed in turn (several: comma-separated).")
@click.option("--skip", metavar="TABLES", help="Comma-separated tables of the schema to leave alone (not imported).")
@click.option("--ids", type=click.Choice(["next_id"]), help="New rows' IDs: 'next_id' makes each table's bigint primary key default to its shard's next_id() (existing IDs are kept, proved never to collide).")
@click.option("--follow", is_flag=True, help="Copy, then keep carrying the source's changes over until 'pgidgen import --cutover'.")
@click.option("--cutover", is_flag=True, help="Go on with an import started with --follow: stop the source's writes, verify, finish.")
@click.option("--resume", is_flag=True, help="Go on with an interrupted import from its last journaled step.")
@click.option("--rollback", is_flag=True, help="Undo an import that has not finished: the source as it was, the shards' tables empty.")
@click.option("--owner-sql", is_flag=True,
              help="Print the SQL with which the tables' owner prepares the source once, so that this role (REPLICATION, SELECT) imports; with --rollback, the SQL that takes it back.")
@click.option("--dry-run", is_flag=True, help="Check and print the plan and the SQL per database; write nothing.")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON report.")
@click.pass_context
def import_cmd(ctx: click.Context, source: str, schema: str, key: str | None, key_of: tuple[str, ...], skip: str | None, ids: str | None,
               follow: bool,
               cutover: bool, resume: bool, rollback: bool, owner_sql: bool, dry_run: bool, as_json: bool) -> None:
    """Import an unsharded database's tables into the shards, online: copied, kept in step, verified, cut over."""
    from ..importing import ahead, engine, plan_import, resume_import, rollback_import, settle, sqltext, start_import
    from ..importing.keyof import parse_key_of

    config = get_config(ctx)
    if sum((cutover, resume, rollback, dry_run, owner_sql and not rollback)) > 1:
        raise ConfigError("--cutover, --resume, --rollback, --owner-sql and --dry-run go one at a time", hint="give one of them (--owner-sql --rollback: the SQL that takes the owner's preparation back)")
    if ids and (cutover or resume or rollback):
        raise ConfigError("--ids is given when an import starts", hint="the import under way goes on with the --ids it was started with: leave --ids out")
    if key_of and (cutover or resume or rollback):
        raise ConfigError("--key-of is given when an import starts", hint="the import under way goes on with the routes it was started with: leave --key-of out")
    say = (lambda line: click.echo(line, err=True)) if interactive(as_json) else (lambda _line: None)
    if owner_sql and rollback:
        click.echo(engine.owner_undo_sql(source, schema=schema), nl=False)
        return
    if rollback:
        plan = rollback_import(config, source, schema=schema, say=say)
        click.echo(json.dumps({"schema": plan.schema, "rolled_back": True}) if as_json else
                   f"rolled back the import of {plan.schema}: the source serves as before; the shards' tables are empty")
        if plan.prepared and not as_json:
            click.echo(f"the tables' owner may take its preparation back: the SQL pgidgen import --owner-sql --rollback --schema {plan.schema} prints")
        return
    if cutover or resume:
        result = resume_import(config, source, schema=schema, cutover=cutover, say=say)
    else:
        if not key:
            raise ConfigError("pgidgen import needs --key COLUMN", hint="name the column every table is sharded by, e.g. --key user_id")
        skipped = [s.strip() for s in (skip or "").split(",") if s.strip()]
        routes = parse_key_of(key_of)
        if owner_sql:
            click.echo(engine.owner_sql(config, source, schema=schema, key=key, skip=skipped, ids=ids, key_of=routes), nl=False)
            return
        if dry_run:
            plan = plan_import(config, source, schema=schema, key=key, skip=skipped, follow=follow, ids=ids, key_of=routes)
            if as_json:
                click.echo(json.dumps({**plan.as_json(), "estimates": {n: {"rows": r, "bytes": b} for n, (r, b) in plan.estimates().items()}}, indent=2))
                return
            for t in plan.tables:
                click.echo(f"-- {plan.schema}.{t.name}: about {t.rows} rows, {t.bytes} bytes; {t.route()}; rows filtered by shard: "
                           + ("no (every row to every database, routed there by its parent's shard)" if t.parent else 'yes' if t.filtered else 'no (catch-all)'))
            for name, (rows, size) in plan.estimates().items():
                click.echo(f"-- database {name}: {len(plan.targets[name])} shards; receives about {rows} rows, {human(size)}"
                           " (the source's statistics; a --key-of table's every row, routed there)")
            if plan.id_bound is not None:
                click.echo(f"-- --ids next_id: every ID next_id() may return is >= {plan.id_bound} ({iso_ms(config.layout.decode(plan.id_bound)[0])});"
                           " every kept ID is below it (checked again at the cutover)")
                click.echo(f"-- ===== every shard, with the source's schema =====\n{sqltext.ids_sql(plan).strip()}")
            if plan.full_identity:
                click.echo(f"-- ===== the source, for the import's time (their own given back at the end) =====\n{sqltext.identity_full_sql(plan).rstrip()}")
            for name in plan.targets:
                click.echo(f"-- ===== database {name} ({len(plan.targets[name])} shards) =====")
                click.echo((sqltext.staging_sql(plan, name) + settle.staging_all_sql(plan, name)).rstrip("\n"))
                click.echo(f"-- ===== the source, for {name} =====")
                publication = f"-- made by the owner's preparation: {sqltext.publication_sql(plan, name)}" if plan.prepared else sqltext.publication_sql(plan, name)
                click.echo((publication + sqltext.slot_sql(plan, name)).rstrip("\n"))
                click.echo(f"-- ===== database {name} =====")
                click.echo(sqltext.subscription_sql(plan, name, source, show=True).rstrip("\n"))
                if settle.keyed_tables(plan):
                    click.echo(f"-- once the copy is done:\n{(settle.map_sql(plan) + ''.join(settle.marking_sql(plan))).rstrip()}")
                    click.echo(f"-- after the copy (whole = true), before and in the cutover's pause:\n{settle.settle_sql(plan, whole=False).rstrip()}")
                click.echo(f"-- the cutover, before its pause (the verification's rounds record the keys written since):\n{(ahead.arm_sql(plan, name) + ''.join(ahead.staged_triggers_sql(plan))).rstrip()}")
            return
        result = start_import(config, source, schema=schema, key=key, skip=skipped, follow=follow, ids=ids, key_of=routes, say=say)
    if as_json:
        click.echo(json.dumps(result.as_dict(), indent=2))
    elif result.step == "done":
        rows = sum(result.verified.values())
        click.echo(f"imported {len(result.plan.tables)} tables of {result.plan.schema} ({rows} rows, counts and checksums verified per shard)"
                   f" into {result.plan.shard_count} shards on {', '.join(result.plan.targets)}")
        if result.plan.id_columns:
            click.echo("new IDs from each shard's next_id(): " + ", ".join(f"{t}.{c}" for t, c in result.plan.id_columns.items()))
        if result.pause_s is not None:
            click.echo(f"write pause: {result.pause_s * 1000:.0f} ms; writes to the source's tables now fail: write through the Router")
        if result.plan.prepared:
            click.echo(f"the tables' owner may drop the publications and give the replica identities back: the SQL"
                       f" pgidgen import --owner-sql --rollback --schema {result.plan.schema} prints (writes keep failing)")
    else:
        lag = ", ".join(f"{n} {b} bytes behind" for n, b in result.lag_bytes.items())
        click.echo(f"copied; following the source's changes ({lag}): run pgidgen import --cutover SOURCE when ready")
