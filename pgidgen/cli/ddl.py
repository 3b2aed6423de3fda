"""`pgidgen apply-ddl`: a DDL file written once, applied to every shard (pgidgen.ddl holds the work)."""
from __future__ import annotations

import json
from typing import Any

import click

from ..errors import ConfigError
from .common import Bar, LockWaits, get_config, interactive, lock_options, lock_policy, print_sql, report

# -- apply-ddl -----------------------------------------------------------------------------------------


@click.command("apply-ddl")
@click.argument("file", type=click.Path(dir_okay=False))
@click.option("--databases", metavar="NAMES", help="Comma-separated databases whose shards get the file (default: all).")
@click.option("--name", help="Name the ledger records the file under (default: the file's base name).")
@click.option("--from-schema", "from_schema", metavar="SCHEMA",
              help="FILE is a schema dump (pg_dump --schema-only, Rails' structure.sql) whose objects live in SCHEMA: they become every shard's.")
@click.option("--owner", metavar="ROLE", help="With --from-schema: the dump's OWNER TO name ROLE (default: left out; objects belong to the role pgidgen runs as).")
@click.option("--reapply-changed", is_flag=True, help="Run a file whose content changed since it was applied again, on every shard.")
@click.option("--commit-every", type=int, metavar="N", help="Commit every N shards (default: a transaction commits once it has held its shards' locks 50 ms; re-runs resume).")
@click.option("--atomic", is_flag=True, help="All or nothing: each database's shards in one transaction, committed when every database succeeded (the application waits on each shard's locks until then).")
@click.option("--dry-run", is_flag=True, help="Print per statement the lock it takes on which table, whether it rewrites the table, and warnings with the online alternative; apply nothing.")
@click.option("--sql", "sql_only", is_flag=True, help="Print the SQL per database without connecting (needs --shards).")
@click.option("--shards", type=int, help="With --sql: the shard count, shards spread as init spreads them.")
@lock_options()
@click.option("--jobs", type=int, metavar="N", help="Databases worked on at once (default: all of them, at most 16).")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON report, no progress bar.")
@click.pass_context
def apply_ddl_cmd(
    ctx: click.Context,
    file: str,
    databases: str | None,
    name: str | None,
    from_schema: str | None,
    owner: str | None,
    reapply_changed: bool,
    commit_every: int | None,
    atomic: bool,
    dry_run: bool,
    sql_only: bool,
    shards: int | None,
    lock_timeout: str,
    lock_wait: str,
    jobs: int | None,
    as_json: bool,
) -> None:
    """Apply a DDL file written once, unqualified (or a schema dump, --from-schema), to every shard; record it in the ledger."""
    from ..ddl.apply import apply_ddl, offline_plan, read_file, render_apply
    from ..ddl.lockplan import plan_file

    config = get_config(ctx)
    policy = lock_policy(lock_timeout, lock_wait)
    parsed = read_file(file, name, from_schema=from_schema, owner=owner)
    if shards is not None and not sql_only:
        raise ConfigError("--shards is only used with --sql", hint="apply-ddl applies to the shards the databases hold")
    if dry_run:
        if sql_only:
            raise ConfigError("--dry-run and --sql are two ways to look before applying", hint="give one of them")
        _dry_run(config, parsed, config.select(databases), as_json)
        return
    if sql_only:
        if shards is None:
            raise ConfigError("--sql needs --shards N", hint="--sql does not connect, so it renders for shards spread as init --shards N spreads them")
        for line in parsed.summary:
            click.echo(f"-- {line}")
        for line in lock_lines([s for s in plan_file(parsed) if not s.harmless]):
            click.echo(f"-- {line}")
        plan = offline_plan(config, parsed, shards, config.select(databases), commit_every=commit_every)
        print_sql(render_apply(plan), transaction=not plan.online)
        return
    for line in parsed.summary:
        click.echo(line, err=as_json)
    bar = Bar(interactive(as_json), f"applying {parsed.name}")
    waits = LockWaits(bar)
    try:
        result = apply_ddl(
            config,
            parsed,
            config.select(databases),
            reapply_changed=reapply_changed,
            commit_every=commit_every,
            progress=bar.advance,
            on_plan=lambda p: _planned(p, bar, waits),
            lock_policy=policy,
            on_lock_wait=None if as_json else waits.say,
            jobs=jobs,
            atomic=atomic,
        )
    finally:
        bar.close()
    report(result.outcomes, as_json)
    if not as_json and not result.changed:
        click.echo(f"nothing to do: every shard already has {parsed.name} (#{result.plan.version.position}, sha256 {parsed.sha256[:12]})")


def _dry_run(config: Any, parsed: Any, databases: list[str], as_json: bool) -> None:
    from ..ddl.lockplan import forecast

    result = forecast(config, parsed, databases)
    if as_json:
        click.echo(json.dumps(result.as_dict(), indent=2))
        return
    for line in lock_lines(result.statements):
        click.echo(line)
    if result.note:
        click.echo(result.note, err=True)
    warned = sum(1 for s in result.statements if s.warnings)
    sizes = f"table sizes from {result.sizes_from}" if result.sizes_from else "no table sizes"
    click.echo(f"dry run of {parsed.name}: {len(result.statements)} statements, {warned} with warnings ({sizes}); nothing applied")


def lock_lines(statements: Any) -> list[str]:
    """Per statement its locks and rewrite, then its warnings indented (what --dry-run prints, and --sql as comments)."""
    lines = []
    for s in statements:
        lines.append(s.describe())
        lines.extend(f"  warning: {w}" for w in s.warnings)
    return lines


def _planned(plan: Any, bar: Bar, waits: LockWaits) -> None:
    waits.online = plan.online
    if plan.online and bar.enabled:
        click.echo(f"{plan.file.name}: online statements: shard by shard outside a transaction, each shard recorded when done", err=True)
    say_sizing(plan, bar.enabled)
    bar.start(plan.total)


def say_sizing(plan: Any, enabled: bool) -> None:
    """On a terminal, one line per database split into several transactions, before the work starts."""
    for name, sizing in plan.sizing.items():
        if enabled and sizing.transactions > 1 and not sizing.chosen:
            click.echo(sizing.describe(name), err=True)
