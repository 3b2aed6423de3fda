"""The commands about IDs and where they live: layout, init, decode, locate."""
from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from typing import Any

import click

from ..layout import INSTAGRAM_EPOCH_MS, Layout, parse_epoch, parse_id
from .common import Bar, LockWaits, TakesNegatives, get_config, interactive, lock_options, lock_policy, parse_key, print_sql, report

# -- layout --------------------------------------------------------------------------------------------


@click.command("layout")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
def layout_cmd(ctx: click.Context, as_json: bool) -> None:
    """Show the ID layout and its capacity: shards, IDs per ms per shard, when time runs out."""
    layout = get_config(ctx, required=False).layout
    info = layout.as_dict()
    if as_json:
        click.echo(json.dumps(info, indent=2))
        return
    click.echo(f"epoch:            {info['epoch']} ({layout.epoch_ms} ms)")
    click.echo(f"bits:             {layout.time_bits} time | {layout.shard_bits} shard | {layout.sequence_bits} sequence")
    click.echo(f"shards:           up to {layout.max_shards}")
    click.echo(f"IDs per ms:       {layout.ids_per_ms} per shard ({layout.ids_per_ms * 1000:,} per second per shard)")
    click.echo(f"time runs out:    {info['runs_out']} ({layout.years:.1f} years after the epoch)")


# -- init ----------------------------------------------------------------------------------------------


@click.command("init")
@click.option("--shards", type=int, required=True, help="Number of logical shards (fixed for the life of the data).")
@click.option("--databases", metavar="NAMES", help="Comma-separated databases to spread new shards over (default: all).")
@click.option("--grant", "grant_roles", multiple=True, metavar="ROLE", help="Let ROLE use the shards (repeatable).")
@click.option("--sql", "sql_only", is_flag=True, help="Print the SQL per database without connecting anywhere.")
@lock_options("pgidgen's catalog or a table a replayed DDL file references")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON report, no progress bar.")
@click.pass_context
def init_cmd(ctx: click.Context, shards: int, databases: str | None, grant_roles: tuple[str, ...], sql_only: bool, lock_timeout: str,
             lock_wait: str, as_json: bool) -> None:
    """Create the catalog and the shard schemas, each with its sequences and next_id()."""
    from ..init import init, offline_plan, render_init

    config = get_config(ctx)
    names = config.select(databases)
    policy = lock_policy(lock_timeout, lock_wait)
    if sql_only:
        print_sql(render_init(offline_plan(config, shards, names, grant_roles=grant_roles)))
        return
    bar = Bar(interactive(as_json), "creating shards")
    try:
        outcomes = init(config, shards, names, grant_roles=grant_roles, progress=bar.advance, on_plan=lambda p: _planned(p, bar),
                        lock_policy=policy, on_lock_wait=None if as_json else LockWaits(bar).say)
    finally:
        bar.close()
    report(outcomes, as_json)
    if not as_json and not any(o.changed for o in outcomes):
        click.echo("nothing to do: every shard already exists")


def _planned(plan: Any, bar: Bar) -> None:
    """On a terminal, one line per database split into several transactions, before the work starts."""
    for name, sizing in plan.sizing.items():
        if bar.enabled and sizing.chunked:
            click.echo(sizing.describe(name), err=True)
    bar.start(plan.total)


# -- decode --------------------------------------------------------------------------------------------


def _stdin_lines() -> Iterator[str]:
    yield from sys.stdin


@click.command("decode", context_settings={"ignore_unknown_options": True})
@click.argument("ids", nargs=-1)
@click.option("--json", "as_json", is_flag=True, help="One JSON object per ID: id, timestamp, shard, sequence.")
@click.option("--epoch", help="Epoch (ms or ISO-8601) instead of the config's.")
@click.option("--shard-bits", type=int, help="Shard bits instead of the config's.")
@click.option("--sequence-bits", type=int, help="Sequence bits instead of the config's.")
@click.option("--time-bits", type=int, help="Time bits (default: what remains below the sign bit; 41 with --instagram).")
@click.option("--instagram", is_flag=True, help="Instagram's published layout: 41/13/10 bits, epoch 1314220021721.")
@click.pass_context
def decode_cmd(
    ctx: click.Context,
    ids: tuple[str, ...],
    as_json: bool,
    epoch: str | None,
    shard_bits: int | None,
    sequence_bits: int | None,
    time_bits: int | None,
    instagram: bool,
) -> None:
    """Decode IDs (arguments, or one per line on stdin) into time, shard and sequence."""
    from ..decode import check_generated, decode_lines, parse_ids

    layout = get_config(ctx, required=False).layout
    if instagram:
        layout = Layout(epoch_ms=INSTAGRAM_EPOCH_MS, time_bits=41, shard_bits=13, sequence_bits=10)
    if any(v is not None for v in (epoch, shard_bits, sequence_bits, time_bits)):
        shard_bits = shard_bits if shard_bits is not None else layout.shard_bits
        sequence_bits = sequence_bits if sequence_bits is not None else layout.sequence_bits
        if time_bits is None and instagram and (shard_bits, sequence_bits) == (layout.shard_bits, layout.sequence_bits):
            time_bits = layout.time_bits  # --instagram's 41, unless the other fields changed size
        layout = Layout.make(
            epoch_ms=parse_epoch(epoch) if epoch is not None else layout.epoch_ms,
            shard_bits=shard_bits,
            sequence_bits=sequence_bits,
            time_bits=time_bits,
            for_generation=False,
        )
    check_generated(layout, parse_ids(layout, ids))  # arguments are checked up front, so a bad one prints nothing
    source = ids if ids else _stdin_lines()
    batch: list[str] = []
    try:
        for line in decode_lines(layout, source, as_json=as_json):
            batch.append(line)
            if len(batch) >= 8192:
                sys.stdout.write("\n".join(batch) + "\n")
                batch.clear()
    finally:  # the lines before a malformed one are still printed
        if batch:
            sys.stdout.write("\n".join(batch) + "\n")


# -- locate --------------------------------------------------------------------------------------------


@click.command("locate", cls=TakesNegatives)
@click.argument("key_args", nargs=-1, metavar="[KEYS]...")
@click.option("--key", "keys", multiple=True, type=int, metavar="KEY", help="A shard key, e.g. a user_id (repeatable; or as arguments).")
@click.option("--id", "ids", multiple=True, metavar="ID", help="An ID made by next_id() (repeatable).")
@click.option("--shard", "shards", multiple=True, type=int, metavar="N", help="A shard number (repeatable).")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per line.")
@click.pass_context
def locate_cmd(ctx: click.Context, key_args: tuple[str, ...], keys: tuple[int, ...], ids: tuple[str, ...], shards: tuple[int, ...],
               as_json: bool) -> None:
    """Which shard, database and schema keys (key % shard count, as arguments or --key), an ID or a shard lives in now."""
    from ..routing import locate

    keys = (*(parse_key(k) for k in key_args), *keys)

    if not (keys or ids or shards):
        raise click.UsageError("give at least one --key, --id or --shard")
    config = get_config(ctx)
    found = locate(config, keys=keys, ids=[_generated(config.layout, parse_id(i, config.layout)) for i in ids], shards=shards)
    for item in found:
        if as_json:
            click.echo(json.dumps(item))
        else:
            what = next(f"{k} {item[k]}" for k in ("key", "id", "shard") if k in item)
            click.echo(f"{what}: shard {item['shard']} on {item['database']} (schema {item['schema']}, {item['state']})")




def _generated(layout: Layout, value: int) -> int:
    if not layout.generated(value):
        raise layout.not_generated(value)
    return value
