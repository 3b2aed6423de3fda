"""The fleet's view and upkeep: `map` and `status` (the shards, sizes and retired copies of every database),
`cleanup` (retired copies in bulk) and `rebalance` (shards spread evenly over the databases)."""
from __future__ import annotations

import json
import re
import time
from typing import Any

import click

from ..errors import InputError, PgidgenError
from ..ranges import collapse
from ..redact import scrub
from ..sizes import human
from .common import Bar, get_config, interactive, parse_duration, parse_wait, typed

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


# -- map, status -----------------------------------------------------------------------------------------------


def _map(ctx: click.Context, as_json: bool) -> None:
    from ..shardmap import read_map

    m = read_map(get_config(ctx))
    if as_json:
        click.echo(json.dumps(m.as_dict(), indent=2))
    else:
        print_map(m)
    if not m.ok:
        ctx.exit(1)


@click.command("map")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
def map_cmd(ctx: click.Context, as_json: bool) -> None:
    """Show which database holds which shards, and anything inconsistent (exit 1 if so)."""
    _map(ctx, as_json)


@click.command("status")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.option("--drift", is_flag=True, help="Also compare the shards' schemas and DDL ledgers (exit 1 if they differ).")
@click.pass_context
def status_cmd(ctx: click.Context, as_json: bool, drift: bool) -> None:
    """Same as map; with --drift, also whether every shard holds the same tables, columns and indexes."""
    if not drift:
        _map(ctx, as_json)
        return
    from ..ddl.drift import read_drift
    from ..shardmap import read_map

    config = get_config(ctx)
    m, d = read_map(config), read_drift(config)
    if as_json:
        click.echo(json.dumps({**m.as_dict(), "drift": d.as_dict()}, indent=2))
    else:
        print_map(m)
        for p in d.problems:
            click.echo(f"DRIFT: {p}")
        if not d.problems and not d.unreachable:
            click.echo(f"ok: all {d.shards} shards hold the same schema and the same DDL ledger")
    if not (m.ok and d.ok):
        ctx.exit(1)



# -- cleanup ---------------------------------------------------------------------------------------------


@click.command("cleanup")
@click.option("--older-than", metavar="AGE", help="Only copies retired longer ago than AGE (2d, 12h, 30m, 1w).")
@click.option("--databases", metavar="NAMES", help="Comma-separated databases whose retired copies go (default: all).")
@click.option("--dry-run", is_flag=True, help="List the copies that would be dropped, and drop nothing.")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON report, no progress bar.")
@click.pass_context
def cleanup_cmd(ctx: click.Context, older_than: str | None, databases: str | None, dry_run: bool, as_json: bool) -> None:
    """Drop the retired read-only copies moves left on their sources, all at once (exit 1 if one must stay)."""
    from ..move.retired import cleanup_retired, plan_retired

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
        if not report.ok:  # as the real cleanup: a copy that must stay, or a database unreachable
            ctx.exit(1)
        return
    bar = Bar(interactive(as_json), "dropping retired copies")
    try:
        result = cleanup_retired(config, names, older_than=age, progress=bar.advance, on_plan=lambda todo: bar.start(len(todo)))
    finally:
        bar.close()
    click.echo(json.dumps(result.as_dict(), indent=2) if as_json else "\n".join(result.lines()))
    if not result.ok:
        ctx.exit(1)


# -- rebalance -----------------------------------------------------------------------------------------


@click.command("rebalance")
@click.option("--databases", metavar="NAMES", help="Comma-separated databases to spread the shards over, two or more (default: all).")
@click.option("--parallel", type=int, default=2, show_default=True, help="How many moves run at once.")
@click.option("--max-pause", default="1s", show_default=True, metavar="DURATION", help="Longest write pause of each move's cutover.")
@click.option("--offline", is_flag=True, help="Move every shard offline (dump and restore under a write lock): for sources without logical replication, or shards with unlogged tables.")
@click.option("--by", type=click.Choice(["size", "count"]), default="size", show_default=True,
              help="Even out the bytes on disk (the shards' tables and indexes), or the number of shards.")
@click.option("--drop-source", is_flag=True, help="Drop each source copy right after its verified move.")
@click.option("--fault-wait", default="60s", show_default=True, metavar="DURATION",
              help="How long each move waits for a lost connection (its own, or its subscription's) before it stops, resumable; 0: not at all.")
@click.option("--dry-run", is_flag=True, help="Print the plan (shards and bytes per database before and after; per source -> target pair its shards, bytes, batches, estimated pause and time), and change nothing.")
@click.option("--verbose", is_flag=True, help="With --dry-run: every move and every batch too.")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON report.")
@click.pass_context
def rebalance_cmd(ctx: click.Context, databases: str | None, parallel: int, max_pause: str, offline: bool, by: str, drop_source: bool,
                  fault_wait: str, dry_run: bool, verbose: bool, as_json: bool) -> None:
    """Move shards so every database holds an even share of bytes (or of shards), several moves at once."""
    from .. import move
    from ..move.rebalance import Interrupted, plan_batches_of, plan_rebalance, rebalance
    from ..ranges import collapse

    config = get_config(ctx)
    names = config.select(databases)
    opts = move.MoveOptions(max_pause=parse_duration(max_pause), offline=offline, drop_source=drop_source,
                            fault_wait=parse_wait(fault_wait, "--fault-wait"))
    if dry_run:
        plan = plan_rebalance(config, names, by=by)
        plan_batches_of(config, plan, parallel=parallel, options=opts)
        click.echo(json.dumps(plan.as_dict(), indent=2) if as_json else "\n".join(plan.lines(verbose=verbose)))
        return
    # the plan's shards, known once an earlier run's unfinished moves are finished (those come first, counted apart)
    t0, tally = time.monotonic(), {"shards": 0, "bytes": 0, "total": 0}

    def show(r: Any, shards: list[int]) -> None:
        """A line per batch: what it did, the shards and bytes done so far, and an ETA from the rate so far."""
        if isinstance(r, PgidgenError):
            click.echo(f"shards {collapse(shards)}: FAILED: {scrub(r.render())}", err=True)
            return
        if r.verification is not None and not r.verification.ok:
            click.echo(f"shards {collapse(shards)}: verification MISMATCH: " + "; ".join(t.describe() for t in r.verification.mismatches()), err=True)
        if any("resumed" in n for n in r.notes):  # an earlier run's move, finished before the plan is made
            click.echo(f"shards {collapse(shards)}: {r.source} -> {r.target}: resumed, done, pause {r.pause_ms or 0:.0f} ms", err=True)
            return
        tally["shards"] += len(shards)
        tally["bytes"] += r.bytes_copied
        total = tally["total"]
        elapsed = time.monotonic() - t0
        eta = elapsed / tally["shards"] * max(0, total - tally["shards"]) if total and tally["shards"] else 0.0
        click.echo(f"shards {collapse(shards)}: {r.source} -> {r.target}: done,"
                   f" pause {r.pause_ms or 0:.0f} ms; {tally['shards']}/{total} shards, {tally['bytes'] / 1e6:.1f} MB"
                   + (f", ETA {eta:.0f}s" if tally["shards"] < total else ""), err=True)

    def planned(plan: Any) -> None:
        tally["total"] = len(plan.moves)

    try:
        result, interrupted = rebalance(config, names, parallel=parallel, options=opts, by=by, on_batch=None if as_json else show,
                                        journaled_pause=not typed(ctx, "max_pause"), on_plan=planned), False
    except Interrupted as e:
        result, interrupted = e.result, True
    if not as_json:
        from ..shardmap import read_map

        now = read_map(config)  # as the databases report it: a move that failed past its flip left its shard on the target
        click.echo("\n".join(result.lines(now.databases, list(now.unreachable), now.bytes) + result.plan.tail()))
    else:
        click.echo(json.dumps(result.as_dict(), indent=2))
    if interrupted:
        moved = sum(len(r.shards) for r in result.reports)
        failed = f", {len(result.failures)} failed" if result.failures else ""
        raise click.ClickException(f"rebalance interrupted: {moved} shards moved{failed}, the batches in flight finished and no other started;"
                                   " run 'pgidgen rebalance' again to continue")
    if result.differ and not result.failures:
        raise click.ClickException(f"the verification of shard{'s' if len(result.differ) > 1 else ''} {collapse(result.differ)} found differences"
                                   f" (see above): the source copies stay read-only for repair; investigate with 'pgidgen move-shard {result.differ[0]} --verify'")
    if not result.ok:
        done = len(result.plan.moves) - len(result.failures)
        raise click.ClickException(f"{len(result.failures)} of {len(result.plan.moves)} moves failed"
                                   + (f"; the other {done} are done (see above)" if done else " (see above)"))
