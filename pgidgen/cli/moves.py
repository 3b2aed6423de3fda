"""`pgidgen move-shard`: the command (pgidgen.move holds the engine)."""
from __future__ import annotations

import json
import shlex
import signal
from typing import Any

import click

from ..redact import scrub
from .common import Bar, TakesNegatives, get_config, interactive, parse_duration, parse_wait, typed

# -- move-shard ----------------------------------------------------------------------------------------


class _CopyBar(Bar):
    """The copy's progress: rows against the source's row count, with bytes and replication lag in the label."""

    waiting: str | None = None

    def show(self, p: Any) -> None:
        if p.waiting != self.waiting:  # a lost connection waited for, or back: a line of its own, bar or not
            if p.waiting is not None or self.waiting is not None:
                click.echo(("\n" if self._bar is not None else "") + f"pgidgen: {p.waiting or 'connection back, going on'}", err=True)
            self.waiting = p.waiting
        if not self.enabled or p.waiting is not None:
            return
        if self._bar is None and p.rows_total:
            self.start(p.rows_total)
        if self._bar is not None:
            lag = "?" if p.lag_bytes is None else f"{p.lag_bytes / 1e6:.1f} MB"
            self._bar.label = f"{self.label}: {p.tables_ready}/{p.tables_total} tables, {p.bytes_copied / 1e6:.0f} MB, WAL held {lag}"
            self._bar.update(p.rows_copied - self._bar.pos)


@click.command("move-shard", cls=TakesNegatives)
@click.argument("shard", metavar="SHARDS")
@click.argument("target", required=False, metavar="[TARGET_DB]")
@click.option("--max-pause", default="1s", show_default=True, metavar="DURATION", help="Longest write pause allowed at the cutover; longer catch-up aborts it. --resume keeps the move's own unless given.")
@click.option("--offline", is_flag=True, help="No logical replication: dump and restore under a write lock (writes pause for the whole copy).")
@click.option("--dry-run", is_flag=True, help="Print the plan (steps, SQL, locks) after the checks, and change nothing.")
@click.option("--resume", is_flag=True, help="Finish an interrupted move of SHARD from its journal.")
@click.option("--rollback", is_flag=True, help="Undo an interrupted move of SHARD: the source serves it as before. A Ctrl-C lets it finish.")
@click.option("--verify", "verify_only", is_flag=True, help="Compare SHARD with the source copy its last move kept (row counts, checksums).")
@click.option("--cleanup", is_flag=True, help="Drop the retired read-only source copy of SHARD.")
@click.option("--drop-source", is_flag=True, help="Drop the source copy right after a verified move.")
@click.option("--verify-in-pause", is_flag=True, help="Verify before the flip, inside the write pause (the pause then grows with the shard).")
@click.option("--subscription-dsn", metavar="CONNINFO", help="How the target server reaches the source (default: the source's DSN from the config).")
@click.option("--fault-wait", default="60s", show_default=True, metavar="DURATION",
              help="How long a lost connection (pgidgen's own, or the subscription's) is waited for before the move stops, resumable; 0: not at all.")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON report, no progress bar.")
@click.pass_context
def move_shard_cmd(ctx: click.Context, shard: str, target: str | None, max_pause: str, offline: bool, dry_run: bool, resume: bool,
                   rollback: bool, verify_only: bool, cleanup: bool, drop_source: bool, verify_in_pause: bool,
                   subscription_dsn: str | None, fault_wait: str, as_json: bool) -> None:
    """Move logical SHARDS (a number, or a set like 10-19,42) to TARGET_DB online (logical replication), verified
    and crash-safe. A set moves in batches: one replication stream and one write pause each. Ctrl-C lets the batch
    in flight finish (or roll back), starts no other, and prints the command that moves the rest."""
    from .. import move
    from ..move.engine import BatchesFailed
    from ..move.request import MoveRequest, carry_out, inspect
    from ..move.request import dry_run as plan
    from ..ranges import collapse

    config = get_config(ctx)
    flags = {"--resume": resume, "--rollback": rollback, "--verify": verify_only, "--cleanup": cleanup}
    given = [f"--{n.replace('_', '-')}" for n in ctx.params if typed(ctx, n)]
    opts = move.MoveOptions(max_pause=parse_duration(max_pause), offline=offline, drop_source=drop_source, verify_in_pause=verify_in_pause,
                            subscription_conninfo=subscription_dsn, fault_wait=parse_wait(fault_wait, "--fault-wait"))
    request = MoveRequest.make(config, shard, target, modes=[m for m, on in flags.items() if on], options=opts, given=given, dry_run=dry_run)
    if dry_run:
        planned = plan(config, request)
        click.echo(json.dumps(planned.as_dict(), indent=2) if as_json else "\n".join(planned.lines()))
        return
    if verify_only or cleanup:
        result = inspect(config, request)
        click.echo(json.dumps(result.as_dict(), indent=2) if as_json else "\n".join(result.lines()))
        if not result.ok:
            ctx.exit(1)
        return
    bar = _CopyBar(interactive(as_json), f"copying shard{'s' if len(request.shards) > 1 else ''} {collapse(request.shards)}")

    def notice() -> None:
        """At the first Ctrl-C: what happens now (the move runs on another thread: run_stoppable). Later ones are
        let go by from then on (the command is the process's last work): none cuts short the lines it prints."""
        signal.signal(signal.SIGINT, lambda *_: None)
        what = "the rollback" if rollback else "the batch in flight"
        click.echo(("\n" if bar._bar is not None else "")
                   + f"pgidgen: Ctrl-C: finishing {what}, then stopping (a second Ctrl-C does not cut it short)", err=True)

    interrupted: move.MovesInterrupted | None = None
    failed: BatchesFailed | None = None
    try:
        reports = carry_out(config, request, progress=bar.show, on_interrupt=notice)
    except move.MovesInterrupted as e:
        reports, interrupted = e.reports, e
    except BatchesFailed as e:  # the batches that moved are reported, then the error
        reports, failed = e.reports, e
    finally:
        bar.close()
    if as_json:
        click.echo(json.dumps(reports[0].as_dict() if len(reports) == 1 else {"batches": [r.as_dict() for r in reports]}, indent=2))
    elif reports:
        click.echo("\n".join(line for r in reports for line in r.lines()))
    if interrupted is not None:
        raise click.ClickException(_interrupted(ctx, request, interrupted, bool(reports)))
    if failed is not None:
        raise failed
    if any(r.verification is not None and not r.verification.ok for r in reports):
        ctx.exit(1)


def _interrupted(ctx: click.Context, request: Any, e: Any, reported: bool) -> str:
    """What a Ctrl-C left, and the command that moves the rest."""
    from ..ranges import collapse

    again = _move_command(ctx, collapse(e.left), e.target)
    moved = len(request.shards) - len(e.left)
    left = f"shard{'s' if len(e.left) > 1 else ''} {collapse(e.left)}"
    if not moved and not reported and not e.rolled_back:  # stopped in the first batch's checks
        return f"move-shard interrupted during its checks: nothing was written; run '{again}' to move {left}"
    return (f"move-shard interrupted: {moved} of {len(request.shards)} shards moved to {e.target} (the batch in flight finished or rolled back,"
            f" no other started); {left} did not move: run '{again}' to move the rest")


def _move_command(ctx: click.Context, shards: str, target: str) -> str:
    """The command line that moves shards to target with this command's options (and --config, when given). Each
    word is scrubbed before it is quoted: a --subscription-dsn's password goes, a quoted one too (its shell quoting
    would hide it from scrub's patterns), and the connection string stays one shell word."""
    words = ["pgidgen"]
    parent = ctx.parent
    if parent is not None and parent.get_parameter_source("config_path") == click.core.ParameterSource.COMMANDLINE:
        words += ["--config", parent.params["config_path"]]
    words += ["move-shard", shards, target]
    for name, value in ctx.params.items():
        if name in ("shard", "target") or value in (None, False) or not typed(ctx, name):
            continue
        flag = next(o for o in ctx.command.params if o.name == name).opts[0]
        words += [flag] if value is True else [flag, str(value)]
    return shlex.join(scrub(w) for w in words)
