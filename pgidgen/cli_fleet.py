"""Commands for looking after a fleet of shards: `pgidgen cleanup` (retired copies in bulk). Registered on the
main group by cli.py; the same thin-wrapper rules apply."""
from __future__ import annotations

import json
import re

import click

from .cli import Bar, get_config, interactive
from .errors import InputError

_AGE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|m|h|d|w)\s*$", re.IGNORECASE)
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_age(text: str) -> float:
    """Seconds from '2d', '12h', '30m', '90s', '1w'."""
    m = _AGE.match(text)
    if m is None:
        raise InputError(f"--older-than {text!r} is not an age", hint="write it like 2d, 12h, 30m, 90s or 1w")
    return float(m.group(1)) * _UNIT_S[m.group(2).lower()]


@click.command("cleanup")
@click.option("--older-than", metavar="AGE", help="Only copies retired longer ago than AGE (2d, 12h, 30m, 1w).")
@click.option("--databases", metavar="NAMES", help="Comma-separated databases whose retired copies go (default: all).")
@click.option("--dry-run", is_flag=True, help="List the copies that would be dropped, and drop nothing.")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON report, no progress bar.")
@click.pass_context
def cleanup_cmd(ctx: click.Context, older_than: str | None, databases: str | None, dry_run: bool, as_json: bool) -> None:
    """Drop the retired read-only copies moves left on their sources, all at once (exit 1 if one must stay)."""
    from .move.retired import cleanup_retired, plan_retired
    from .sizes import human

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
