"""`pgidgen psql DB [ARGS]...`: psql on a database of the config (the psql pgidgen finds: no system PostgreSQL
needed, e.g. on a sandbox's servers)."""
from __future__ import annotations

import os

import click

from .common import get_config


@click.command("psql", context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.argument("database")
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
@click.pass_context
def psql_cmd(ctx: click.Context, database: str, args: tuple[str, ...]) -> None:
    """Run psql on a database of the config, the psql pgidgen finds.

    DATABASE is a name in the config; ARGS go to psql as they are (e.g. -c 'SELECT 1'). The connection string
    comes from the config, its password from the environment, as for every command."""
    from ..errors import ConfigError
    from ..pgbin import newest_client

    config = get_config(ctx)
    config.select(None)  # none at all: say how to add one
    if database not in config.databases:
        raise ConfigError(f"no database {database!r} in the config", hint=f"use one of {', '.join(config.databases)}")
    from urllib.parse import unquote

    import psycopg.conninfo

    from ..db import pg_message
    from ..errors import DatabaseError
    from ..redact import uri_password

    dsn = config.dsn(database)
    try:
        params = psycopg.conninfo.conninfo_to_dict(dsn)
    except psycopg.ProgrammingError as e:
        raise DatabaseError(f"database {database} has an invalid connection string: {pg_message(e)}",
                            hint="fix it where it comes from (the config, or the environment variable it names)") from None
    written = uri_password(dsn)
    if written is not None and unquote(written) != params.get("password"):  # psql would get pieces of it as host or port
        raise ConfigError(f"database {database}: libpq misreads the password in its connection string as another part of the URI",
                          hint="percent-encode the password's special characters (@ as %40, / as %2F, # as %23, ? as %3F, space as %20)")
    env = dict(os.environ)
    if params.get("password"):  # through the environment, not the command line (which `ps` shows)
        env["PGPASSWORD"] = str(params.pop("password"))
    program = str(newest_client("psql"))
    os.execve(program, [program, "-X", "-d", psycopg.conninfo.make_conninfo("", **params), *args], env)
