"""The top of the command line: the `pgidgen` group and its error handling, in one place. Every PgidgenError (and
a database error no command translated) becomes one line, `Error: what (where): what to do`, and exit status 1;
usage errors too. The commands are registered on this group by the package (pgidgen/cli/__init__.py); this module
imports none of them."""
from __future__ import annotations

import errno
import os
import sys
from typing import Any

import click
import psycopg

from .. import __version__
from ..db import pg_message
from ..errors import PgidgenError
from ..redact import scrub

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
