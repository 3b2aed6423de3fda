"""The fleet's view and upkeep: how map/status print the shards, sizes and retired copies of every database,
apply-ddl's line about its transactions, and `pgidgen cleanup` (retired copies in bulk, registered on the main
group by cli.py). The same thin-wrapper rules as cli.py."""
from __future__ import annotations

import json
import re
from typing import Any

import click

from .cli import Bar, get_config, interactive
from .errors import InputError
from .ranges import collapse
from .sizes import human

_AGE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|m|h|d|w)\s*$", re.IGNORECASE)
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_age(text: str) -> float:
    """Seconds from '2d', '12h', '30m', '90s', '1w'."""
    m = _AGE.match(text)
    if m is None:
        raise InputError(f"--older-than {text!r} is not an age", hint="write it like 2d, 12h, 30m, 90s or 1w")
    return float(m.group(1)) * _UNIT_S[m.group(2).lower()]


def print_map(m: Any) -> None:
    """map/status: each database's shards and bytes, its retired copies, then what is wrong."""
    click.echo(f"shard count: {m.shard_count if m.shard_count is not None else 'not initialised'}")
    for name, shards in m.databases.items():
        line = f"{name}: {len(shards)} shards {collapse(shards) or '-'}" + (f", {human(m.bytes[name])}" if shards and name in m.bytes else "")
        if m.retired.get(name):
            line += f" (retired copies: {collapse(m.retired[name])}, {human(m.retired_bytes.get(name, 0))})"
        click.echo(line)
    copies = sum(len(v) for v in m.retired.values())
    if copies:
        click.echo(f"retired copies: {copies}, {human(sum(m.retired_bytes.values()))} (what moves left on their sources: 'pgidgen cleanup"
                   " [--older-than 2d]' drops them)")
    for name, err in m.unreachable.items():
        click.echo(f"{name}: {'CANNOT READ' if ' failed while ' in err else 'UNREACHABLE'}: {err}")  # reached, but refused (rights)
    for p in m.problems:
        click.echo(f"PROBLEM: {p}")
    for shard, ends in sorted(m.moving.items()):
        click.echo(f"MOVING: shard {shard} from {ends['from'] or '?'} to {ends['to'] or '?'} (a move running, or interrupted:"
                   f" 'pgidgen move-shard {shard} --resume', or '--rollback' if it has not activated the target; an online"
                   " move's replication slot keeps WAL on the source until teardown)")
    if m.ok:
        click.echo("ok: every shard is in exactly one database")


def say_sizing(plan: Any, enabled: bool) -> None:
    """On a terminal, one line per database split into several transactions, before the work starts."""
    for name, sizing in plan.sizing.items():
        if enabled and sizing.transactions > 1 and not sizing.chosen:
            click.echo(sizing.describe(name), err=True)


@click.command("cleanup")
@click.option("--older-than", metavar="AGE", help="Only copies retired longer ago than AGE (2d, 12h, 30m, 1w).")
@click.option("--databases", metavar="NAMES", help="Comma-separated databases whose retired copies go (default: all).")
@click.option("--dry-run", is_flag=True, help="List the copies that would be dropped, and drop nothing.")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON report, no progress bar.")
@click.pass_context
def cleanup_cmd(ctx: click.Context, older_than: str | None, databases: str | None, dry_run: bool, as_json: bool) -> None:
    """Drop the retired read-only copies moves left on their sources, all at once (exit 1 if one must stay)."""
    from .move.retired import cleanup_retired, plan_retired

    config = get_config(ctx)
    age = parse_age(older_than) if older_than is not None else None
    names = config.select(databases)
    if dry_run:
        todo, report = plan_retired(config, names, older_than=age)
        if as_json:
            click.echo(json.dumps({"would_drop": [c.as_dict() for c in todo], **report.as_dict()}, indent=2))
        else:
            for c in todo:
                click.echo(f"would drop {c.database}: retired copy of shard {c.shard}, {human(c.bytes)}, retired {c.age_s / 3600:.1f} h ago")
            click.echo(f"would drop {len(todo)} retired copies, {human(sum(c.bytes for c in todo))}")
            for line in report.lines():
                if not line.startswith("nothing to do"):
                    click.echo(line)
        return
    bar = Bar(interactive(as_json), "dropping retired copies")
    try:
        result = cleanup_retired(config, names, older_than=age, progress=bar.advance, on_plan=lambda todo: bar.start(len(todo)))
    finally:
        bar.close()
    click.echo(json.dumps(result.as_dict(), indent=2) if as_json else "\n".join(result.lines()))
    if not result.ok:
        ctx.exit(1)
