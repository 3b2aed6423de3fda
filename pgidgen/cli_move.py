"""`pgidgen move-shard` and `pgidgen rebalance`: the commands (pgidgen.move holds the engine)."""
from __future__ import annotations

import json
import shlex
import signal
import time
from typing import Any

import click

from .cli import Bar, get_config, interactive, main
from .errors import ConfigError, PgidgenError
from .redact import scrub

# -- move-shard ----------------------------------------------------------------------------------------


MAX_PAUSE_S = (2**31 - 1) // 1000


def _duration(text: str) -> float:
    """Seconds from '1s', '500ms', '2.5' (seconds)."""
    from .errors import InputError

    t = text.strip().lower()
    try:
        if t.endswith("ms"):
            value = float(t[:-2]) / 1000
        elif t.endswith("s"):
            value = float(t[:-1])
        else:
            value = float(t)
    except ValueError:
        raise InputError(f"{text!r} is not a duration", hint="write it like 1s, 500ms or 2.5") from None
    if not value > 0:
        raise InputError(f"--max-pause must be more than 0, not {text!r}")
    if value < 0.001:  # journaled, and given to lock_timeout, in whole ms (a journaled 0 reads as 'not given')
        raise InputError(f"--max-pause must be at least 1ms, not {text!r}", hint="write it like 1s or 500ms")
    if value > MAX_PAUSE_S:  # infinity too: the pause is a lock_timeout, at most 2^31 - 1 ms
        raise InputError(f"--max-pause must be at most {MAX_PAUSE_S}s, not {text!r}", hint="write it like 1s or 500ms")
    return value


class _CopyBar(Bar):
    """The copy's progress: rows against the source's row count, with bytes and replication lag in the label."""

    def show(self, p: Any) -> None:
        if not self.enabled:
            return
        if self._bar is None and p.rows_total:
            self.start(p.rows_total)
        if self._bar is not None:
            lag = "?" if p.lag_bytes is None else f"{p.lag_bytes / 1e6:.1f} MB"
            self._bar.label = f"{self.label}: {p.tables_ready}/{p.tables_total} tables, {p.bytes_copied / 1e6:.0f} MB, WAL held {lag}"
            self._bar.update(p.rows_copied - self._bar.pos)


@main.command("move-shard")
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
@click.option("--json", "as_json", is_flag=True, help="Print a JSON report, no progress bar.")
@click.pass_context
def move_shard_cmd(ctx: click.Context, shard: str, target: str | None, max_pause: str, offline: bool, dry_run: bool, resume: bool,
                   rollback: bool, verify_only: bool, cleanup: bool, drop_source: bool, verify_in_pause: bool,
                   subscription_dsn: str | None, as_json: bool) -> None:
    """Move logical SHARDS (a number, or a set like 10-19,42) to TARGET_DB online (logical replication), verified
    and crash-safe. A set moves in batches: one replication stream and one write pause each. Ctrl-C lets the batch
    in flight finish (or roll back), starts no other, and prints the command that moves the rest."""
    from . import move
    from .errors import InputError
    from .move.steps.base import run_stoppable
    from .ranges import collapse, expand

    config = get_config(ctx)
    shards = sorted(set(expand(shard)))
    if not shards:
        raise InputError(f"{shard!r} names no shard", hint="write shards like 7 or 10-19,42")
    modes = [n for n, on in (("--resume", resume), ("--rollback", rollback), ("--verify", verify_only), ("--cleanup", cleanup)) if on]
    if len(modes) > 1:
        raise ConfigError(f"{' and '.join(modes)} cannot be combined", hint="give one of them")
    if not modes and target is None:
        raise ConfigError("TARGET_DB is missing", hint=f"pgidgen move-shard {shard} DB (databases: {', '.join(config.databases)})")
    if modes and len(shards) > 1:
        raise InputError(f"{modes[0]} takes one shard, not {collapse(shards)}",
                         hint="name any one shard of the move (a batch's other shards follow it)" if resume or rollback else "give them one at a time")
    if rollback or verify_only or cleanup:  # they move nothing: a move's option given to them would be ignored
        unused = [f"--{n.replace('_', '-')}" for n in ("max_pause", "offline", "drop_source", "verify_in_pause", "subscription_dsn") if _typed(ctx, n)]
        if unused:
            raise ConfigError(f"{modes[0]} moves nothing: {' and '.join(unused)} would have no effect with it", hint=f"drop {' '.join(unused)}")
    opts = move.MoveOptions(max_pause=_duration(max_pause), offline=offline, drop_source=drop_source, verify_in_pause=verify_in_pause,
                            subscription_conninfo=subscription_dsn)
    if dry_run:
        if modes:
            raise ConfigError("--dry-run plans a new move", hint=f"drop {modes[0]}")
        mode = "offline" if offline else "online"
        if len(shards) > 1:
            batches = move.plan_shards(config, shards, target or "", options=opts)
            if as_json:  # a script reads the plan: the same as the lines below say
                click.echo(json.dumps({"dry_run": True, "shards": collapse(shards), "target": target, "mode": mode,
                                       "batches": [b.as_dict(offline) for b in batches]}, indent=2))
                return
            each = "one copy, its shards' writes paused throughout" if offline else "one slot, publication, subscription, copy and cutover"
            click.echo(f"-- {len(shards)} shards in {len(batches)} batch{'es' if len(batches) > 1 else ''}, each with {each}"
                       f" (the steps 'pgidgen move-shard N{' --offline' if offline else ''} --dry-run' prints, for all its shards at once):")
            for b in batches:
                click.echo(f"-- {b.line(offline)}")
            return
        steps = move.plan_move(config, shards[0], target or "", options=opts)
        if as_json:
            click.echo(json.dumps({"dry_run": True, "shard": shards[0], "target": target, "mode": mode,
                                   "steps": [{"step": st.name, "database": st.database, "what": st.what, "locks": st.locks, "sql": st.sql}
                                             for st in steps]}, indent=2))
            return
        for step in steps:
            click.echo(f"-- [{step.name}] on {step.database}: {step.what}")
            for lock in step.locks:
                click.echo(f"--   lock: {lock}")
            if step.sql:
                click.echo(step.sql.rstrip("\n"))
        return
    if verify_only or cleanup:
        result: Any = move.verify_move(config, shards[0]) if verify_only else move.cleanup(config, shards[0])
        if as_json:
            click.echo(json.dumps(result.as_dict(), indent=2))
        elif cleanup:
            click.echo(f"dropped {', '.join(result.dropped)}")
        else:
            click.echo(f"verified {result.when}: {len(result.tables)} tables")
            for t in result.tables:
                click.echo(f"  {t.describe()}")
        if verify_only and not result.ok:
            ctx.exit(1)
        return
    bar = _CopyBar(interactive(as_json), f"copying shard{'s' if len(shards) > 1 else ''} {collapse(shards)}")

    def notice() -> None:
        """At the first Ctrl-C: what happens now (the move runs on another thread; see move_shards_interruptible).
        Later ones are let go by from then on (the command is the process's last work): none cuts short the lines
        it prints at the end either."""
        signal.signal(signal.SIGINT, lambda *_: None)
        what = "the rollback" if rollback else "the batch in flight"
        click.echo(("\n" if bar._bar is not None else "")
                   + f"pgidgen: Ctrl-C: finishing {what}, then stopping (a second Ctrl-C does not cut it short)", err=True)

    interrupted: move.MovesInterrupted | None = None
    try:
        if rollback:  # undone whole or not at all by a Ctrl-C: it finishes (a kill leaves it to run again)
            reports = [run_stoppable(lambda _: move.rollback_move(config, shards[0]), on_interrupt=notice)[0]]
        elif resume:  # one batch: a Ctrl-C lets it finish
            reports = [run_stoppable(lambda _: move.resume_move(config, shards[0], options=opts, progress=bar.show, journaled_pause=not _typed(ctx, "max_pause"),
                                                                 expect_target=target, expect_offline=offline),
                                     on_interrupt=notice)[0]]
        else:
            reports = move.move_shards_interruptible(config, shards, target or "", options=opts, progress=bar.show, on_interrupt=notice)
    except move.MovesInterrupted as e:
        reports, interrupted = e.reports, e
    finally:
        bar.close()
    if as_json:
        click.echo(json.dumps(reports[0].as_dict() if len(reports) == 1 else {"batches": [r.as_dict() for r in reports]}, indent=2))
    elif reports:
        click.echo("\n".join(line for r in reports for line in r.lines()))
    if interrupted is not None:
        again = _move_command(ctx, collapse(interrupted.left), interrupted.target)
        moved = len(shards) - len(interrupted.left)
        left = f"shard{'s' if len(interrupted.left) > 1 else ''} {collapse(interrupted.left)}"
        if not moved and not reports and not interrupted.rolled_back:  # stopped in the first batch's checks
            raise click.ClickException(f"move-shard interrupted during its checks: nothing was written; run '{again}' to move {left}")
        raise click.ClickException(
            f"move-shard interrupted: {moved} of {len(shards)} shards moved to {interrupted.target} (the batch in flight finished or rolled back,"
            f" no other started); {left} did not move: run '{again}' to move the rest")
    if any(r.verification is not None and not r.verification.ok for r in reports):
        ctx.exit(1)


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
        if name in ("shard", "target") or value in (None, False) or not _typed(ctx, name):
            continue
        flag = next(o for o in ctx.command.params if o.name == name).opts[0]  # type: ignore[union-attr]
        words += [flag] if value is True else [flag, str(value)]
    return shlex.join(scrub(w) for w in words)


# -- rebalance -----------------------------------------------------------------------------------------


@main.command("rebalance")
@click.option("--databases", metavar="NAMES", help="Comma-separated databases to spread the shards over, two or more (default: all).")
@click.option("--parallel", type=int, default=2, show_default=True, help="How many moves run at once.")
@click.option("--max-pause", default="1s", show_default=True, metavar="DURATION", help="Longest write pause of each move's cutover.")
@click.option("--offline", is_flag=True, help="Move every shard offline (dump and restore under a write lock): for sources without logical replication, or shards with unlogged tables.")
@click.option("--by", type=click.Choice(["size", "count"]), default="size", show_default=True,
              help="Even out the bytes on disk (the shards' tables and indexes), or the number of shards.")
@click.option("--drop-source", is_flag=True, help="Drop each source copy right after its verified move.")
@click.option("--dry-run", is_flag=True, help="Print the plan (shards and bytes per database before and after, the moves and their batches), and change nothing.")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON report.")
@click.pass_context
def rebalance_cmd(ctx: click.Context, databases: str | None, parallel: int, max_pause: str, offline: bool, by: str, drop_source: bool,
                  dry_run: bool, as_json: bool) -> None:
    """Move shards so every database holds an even share of bytes (or of shards), several moves at once."""
    from . import move
    from .move.rebalance import Interrupted, plan_batches_of, plan_rebalance, rebalance
    from .ranges import collapse

    config = get_config(ctx)
    names = config.select(databases)
    opts = move.MoveOptions(max_pause=_duration(max_pause), offline=offline, drop_source=drop_source)
    if dry_run:
        plan = plan_rebalance(config, names, by=by)
        plan_batches_of(config, plan, parallel=parallel, options=opts)
        click.echo(json.dumps(plan.as_dict(), indent=2) if as_json else "\n".join(plan.lines()))
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
                                        journaled_pause=not _typed(ctx, "max_pause"), on_plan=planned), False
    except Interrupted as e:
        result, interrupted = e.result, True
    if not as_json:
        from .shardmap import read_map

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


def _typed(ctx: click.Context, name: str) -> bool:
    """Whether the option was given on the command line (else its default: a resumed move keeps its journal's)."""
    return ctx.get_parameter_source(name) == click.core.ParameterSource.COMMANDLINE
