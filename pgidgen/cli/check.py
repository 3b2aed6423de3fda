"""`pgidgen check`: the command (pgidgen.check holds the checks)."""
from __future__ import annotations

import json

import click

from .common import get_config


@click.command("check")
@click.option("--databases", metavar="NAMES", help="Only these databases (comma-separated; default: all in the config).")
@click.option("--no-reach", is_flag=True, help="Skip the test that each target's server can log in to each source.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
def check_cmd(ctx: click.Context, databases: str | None, no_reach: bool, as_json: bool) -> None:
    """What each database needs for init and for online moves (versions, wal_level, replication slots, WAL
    senders, workers, the role's privileges, pg_dump, whether targets reach sources): one line per finding with
    what to change; exit 1 if any fails. move-shard and rebalance make the same checks before they start."""
    from ..check import check

    config = get_config(ctx)
    result = check(config, config.select(databases), reach=not no_reach)
    if as_json:
        click.echo(json.dumps(result.as_dict(), indent=2))
    else:
        for f in result.findings:
            click.echo(f.line())
        for name, why in result.unreachable.items():
            click.echo(f"{name}: FAIL connect: {why}")
        failed = sum(not f.ok for f in result.findings) + len(result.unreachable)
        click.echo(f"{failed} of {len(result.findings) + len(result.unreachable)} checks failed" if failed else
                   f"ok: all {len(result.findings)} checks passed")
    if not result.ok:
        ctx.exit(1)
