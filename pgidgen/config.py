"""pgidgen.toml: the layout and the physical databases. Secrets come from the environment, never the file."""
from __future__ import annotations

import difflib
import os
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg.conninfo

from . import redact
from .errors import ConfigError
from .layout import DEFAULT_EPOCH_MS, DEFAULT_SEQUENCE_BITS, DEFAULT_SHARD_BITS, Layout, parse_epoch

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

DEFAULT_NAME = "pgidgen.toml"
ENV_VAR = "PGIDGEN_CONFIG"
_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]{0,62}$")
_INTERP_RE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
#: pooler = ... in a database's table: what sits between the application and the database. "transaction"
#: (PgBouncer's pool_mode = transaction: no session state, no server-side prepared statements unless
#: prepared_statements = true), "session", or "none" (a direct connection).
POOLERS = ("transaction", "session", "none")
_DB_KEYS = ("admin_dsn", "app_dsn", "pooler", "prepared_statements")


@dataclass(frozen=True)
class Config:
    layout: Layout
    databases: dict[str, str] = field(default_factory=dict)
    path: Path | None = None
    #: databases whose connection string names an unset ${VAR}: an error only for commands that connect to them
    unset: dict[str, ConfigError] = field(default_factory=dict, compare=False)
    #: the connection string applications (the Router) use, when it is not the one above: through a pooler
    app_dsns: dict[str, str] = field(default_factory=dict)
    #: what sits behind app_dsns: POOLERS; none named: the Router probes
    poolers: dict[str, str] = field(default_factory=dict)
    #: databases whose transaction pooler keeps prepared statements per client (PgBouncer 1.21+ max_prepared_statements)
    pooler_prepares: frozenset[str] = frozenset()
    app_unset: dict[str, ConfigError] = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        for dsn in (*self.databases.values(), *self.app_dsns.values()):
            redact.register(dsn)

    def __repr__(self) -> str:
        """The dataclass's, scrubbed: a debugger, a traceback's locals (Django's error page) and pytest show it."""
        fields = ", ".join(f"{f}={getattr(self, f)!r}" for f in self.__dataclass_fields__)
        return redact.scrub(f"Config({fields})")

    def app_dsn(self, name: str) -> str:
        """The connection string for applications: app_dsn when the database names one (a pooler), else the one
        pgidgen's own commands use."""
        if name in self.app_unset:
            e = self.app_unset[name]
            raise ConfigError(e.what, where=e.where, hint=e.hint)
        return self.app_dsns.get(name) or self.dsn(name)

    def dsn(self, name: str) -> str:
        if name in self.unset:
            e = self.unset[name]
            raise ConfigError(e.what, where=e.where, hint=e.hint)  # a fresh one: a stored one would pile up tracebacks
        try:
            return self.databases[name]
        except KeyError:
            raise ConfigError(
                f"unknown database {name!r}",
                where=str(self.path) if self.path else None,
                hint=f"configured databases are: {', '.join(self.databases) or 'none'}",
            ) from None

    def select(self, names: str | list[str] | None) -> list[str]:
        """Database names from a comma-separated option, in config order when none are named."""
        if not self.databases:
            raise ConfigError(
                "no databases are configured",
                where=str(self.path) if self.path else None,
                hint="add a [databases] section, or run 'pgidgen sandbox up' for local throwaway servers",
            )
        if names is None:
            return list(self.databases)
        items = names.split(",") if isinstance(names, str) else list(names)
        chosen: list[str] = []
        for raw in items:
            name = raw.strip()
            if not name:
                continue
            self.dsn(name)
            if name not in chosen:
                chosen.append(name)
        if not chosen:
            raise ConfigError("--databases names no database", hint="give names like db1,db2")
        return chosen


def find_config_path(explicit: str | os.PathLike[str] | None = None) -> Path | None:
    if explicit:
        return Path(explicit)
    env = os.environ.get(ENV_VAR)
    if env:
        return Path(env)
    local = Path.cwd() / DEFAULT_NAME
    return local if local.exists() else None


def load_config(explicit: str | os.PathLike[str] | None = None, *, required: bool = True) -> Config:
    path = find_config_path(explicit)
    if path is None:
        if required:
            raise ConfigError(
                f"no {DEFAULT_NAME} in {Path.cwd()}",
                hint=f"pass --config PATH (before the command: pgidgen --config PATH init ...), set {ENV_VAR}, or run 'pgidgen sandbox up' to create one",
            )
        return Config(layout=Layout.make())
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"config file {path} does not exist", hint=f"pass an existing file to --config or {ENV_VAR}") from None
    except OSError as e:
        raise ConfigError(f"cannot read config file {path}: {e.strerror}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"config file {path} is not UTF-8 text", hint="save it as UTF-8 (TOML files are)") from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{path} is not valid TOML: {e}", hint="fix the file") from None
    return config_from_dict(data, path=path)


def config_from_dict(data: Mapping[str, Any], *, path: Path | None = None) -> Config:
    where = str(path) if path else None
    unknown = set(data) - {"layout", "databases"}
    if unknown:
        raise ConfigError(f"unknown section(s) {', '.join(sorted(unknown))}", where=where, hint="use [layout] and [databases]")
    for section in ("layout", "databases"):
        if not isinstance(data.get(section, {}), dict):
            raise ConfigError(f"{section} must be a [{section}] table, not a value", where=where, hint=f"write [{section}] on a line of its own, its keys below it")
    layout_data = dict(data.get("layout", {}))
    known = {"epoch", "shard_bits", "sequence_bits", "time_bits"}
    extra = set(layout_data) - known
    if extra:
        raise ConfigError(f"unknown [layout] key(s) {', '.join(sorted(extra))}", where=where, hint=f"use {', '.join(sorted(known))}")
    try:
        layout = Layout.make(
            epoch_ms=parse_epoch(layout_data.get("epoch", DEFAULT_EPOCH_MS)),
            shard_bits=layout_data.get("shard_bits", DEFAULT_SHARD_BITS),
            sequence_bits=layout_data.get("sequence_bits", DEFAULT_SEQUENCE_BITS),
            time_bits=layout_data.get("time_bits"),
        )
    except ConfigError as e:
        e.where = e.where or where
        raise type(e)(e.what, where=e.where, hint=e.hint) from None
    databases: dict[str, str] = {}
    unset: dict[str, ConfigError] = {}
    app_dsns: dict[str, str] = {}
    app_unset: dict[str, ConfigError] = {}
    poolers: dict[str, str] = {}
    prepares: set[str] = set()
    for name, value in dict(data.get("databases", {})).items():
        if not _NAME_RE.match(name):
            raise ConfigError(f"database name {name!r} is not a plain name", where=where, hint="use letters, digits, _ and -")
        app: str | None = None
        if isinstance(value, dict):
            value, app, pooler, prepared = _database_table(name, value, where)
            if pooler is not None:
                poolers[name] = pooler
            if prepared:
                prepares.add(name)
        if not isinstance(value, str):
            raise ConfigError(f"database {name} must be a connection string", where=where,
                              hint=f'write it as {name} = "postgresql://user@host:5432/dbname" (a password as ${{VAR}}, from the environment)')
        for dsn in (value, app):
            bad = scheme_error(name, dsn, where=where) if dsn is not None else None
            if bad is not None:
                raise bad
            if dsn is not None and password_in(dsn):
                raise ConfigError(
                    f"the connection string of {name} contains a password",
                    where=where,
                    hint="keep secrets out of the file: use ${VAR} interpolation, PGPASSWORD or ~/.pgpass",
                )
        try:
            databases[name] = interpolate(value, name=name, where=where)
        except ConfigError as e:  # raised when a command connects to it: decode, layout, --sql never do
            databases[name], unset[name] = value, e
        if app is not None:
            try:
                app_dsns[name] = interpolate(app, name=name, where=where)
            except ConfigError as e:
                app_dsns[name], app_unset[name] = app, e
    return Config(layout=layout, databases=databases, path=path, unset=unset, app_dsns=app_dsns, poolers=poolers,
                  pooler_prepares=frozenset(prepares), app_unset=app_unset)


def _database_table(name: str, table: Mapping[str, Any], where: str | None) -> tuple[Any, str | None, str | None, bool]:
    """db = { admin_dsn = "...", app_dsn = "...", pooler = "transaction" }: the direct connection string for
    pgidgen's commands (init, moves, LISTEN), the one applications use (through a pooler), and what that is."""
    extra = set(table) - set(_DB_KEYS)
    if extra or "admin_dsn" not in table:
        raise ConfigError(
            f"database {name}: {'unknown key(s) ' + ', '.join(sorted(extra)) if extra else 'admin_dsn is missing'}",
            where=where,
            hint=f'write {name} = {{ admin_dsn = "postgresql://host/db", app_dsn = "postgresql://pgbouncer:6432/db", pooler = "transaction" }}',
        )
    app = table.get("app_dsn")
    if app is not None and not isinstance(app, str):
        raise ConfigError(f"database {name}: app_dsn must be a connection string", where=where)
    pooler = table.get("pooler")
    if pooler is not None and pooler not in POOLERS:
        raise ConfigError(f"database {name}: pooler = {pooler!r} is not one of {', '.join(POOLERS)}", where=where,
                          hint="PgBouncer's pool_mode (statement mode cannot run a transaction of several statements)")
    prepared = table.get("prepared_statements", False)
    if not isinstance(prepared, bool):
        raise ConfigError(f"database {name}: prepared_statements must be true or false", where=where)
    return table["admin_dsn"], app, pooler, prepared


def interpolate(value: str, *, name: str, where: str | None) -> str:
    def sub(m: re.Match[str]) -> str:
        var = m.group(1)
        if var not in os.environ:
            raise ConfigError(f"database {name} uses ${{{var}}}, which is not set", where=where, hint=f"export {var}")
        return os.environ[var]

    refs = _INTERP_RE.findall(value)
    value = _INTERP_RE.sub(sub, value)
    if not value.strip():  # libpq would take it for "the local default server": not what anyone configured
        empty = f" (${{{refs[0]}}} is set to an empty string)" if refs else ""
        raise ConfigError(f"database {name} has an empty connection string{empty}", where=where,
                          hint=f"give it the database's connection string, e.g. {name} = \"postgresql://user@host:5432/dbname\"")
    bad = scheme_error(name, value, where=where) if refs else None  # the file's own text was checked already
    if bad is not None:
        raise bad
    redact.register(value)
    return value


#: The start of a connection string meant as a URI: a scheme, then ':' or '//' (a keyword string starts key=).
_SCHEME_RE = re.compile(r"\s*([A-Za-z][A-Za-z0-9+.-]*)(:/*|//+)")
URI_SCHEMES = ("postgresql", "postgres")


def scheme_error(name: str, dsn: str, *, where: str | None = None) -> ConfigError | None:
    """What is wrong with a connection string libpq cannot read that starts like a URI (a scheme and ':'), or None.
    libpq takes anything not starting with postgresql:// or postgres:// for key=value pairs, and its complaint
    (missing "=") quotes the whole string, which the password patterns then take for a password: a typo in the
    scheme was reported as a password in the file. Only the scheme is quoted, never what follows it."""
    if redact.parses(_INTERP_RE.sub("PGIDGENREF", dsn)):
        return None
    m = _SCHEME_RE.match(dsn)
    if m is None:
        return None
    scheme, sep = m.groups()
    shown = f"'{scheme}{sep}'"
    example = f'{name} = "postgresql://user@host:5432/dbname"'
    if scheme.lower() in URI_SCHEMES:
        if scheme not in URI_SCHEMES:
            return ConfigError(f"the connection string of {name} starts with {shown}, a scheme libpq reads only in lower case",
                               where=where, hint=f"write {scheme.lower()}://, e.g. {example}")
        if sep.startswith("://"):
            return None  # the scheme is right: what is wrong is further on (the password checks look there)
        return ConfigError(f"the connection string of {name} starts with {shown}, not '{scheme}://'", where=where,
                           hint=f"write {scheme}:// (a colon and two slashes), e.g. {example}")
    if "/" in sep or scheme.lower() == "jdbc" or difflib.get_close_matches(scheme.lower(), URI_SCHEMES, n=1, cutoff=0.6):
        return ConfigError(f"the connection string of {name} starts with {shown}, which is no PostgreSQL URI scheme", where=where,
                           hint=f"begin it with postgresql:// (or postgres://), e.g. {example}")
    return ConfigError(f"the connection string of {name} is neither a postgresql:// URI nor key=value pairs", where=where,
                       hint=f"write it as {example}, or as \"host=... port=... dbname=...\"")


def password_in(dsn: str) -> bool:
    """Does the connection string, as written in the file, hold a literal password? A password that is wholly a
    ${VAR} reference is not one (it comes from the environment). A URI's user info is read up to its last '@', as
    written, since a password holding '/' or '@' is misread by libpq as a host or a database."""
    if _INTERP_RE.fullmatch(dsn.strip()):
        return False
    refs = [m.group(0) for m in _INTERP_RE.finditer(dsn)]
    marked = _INTERP_RE.sub(lambda m: f"PGIDGENREF{refs.index(m.group(0))}X", dsn)  # parses where ${...} may not

    def literal(value: str) -> bool:
        return not re.fullmatch(r"PGIDGENREF\d+X", value.strip().strip("'"))

    return any(literal(pw) for pw in redact.passwords_in(marked))


def describe_dsn(dsn: str) -> str:
    """host:port/dbname of a connection string, with no user secrets, for messages."""
    try:
        params = psycopg.conninfo.conninfo_to_dict(redact.strip_userinfo(dsn))
    except psycopg.ProgrammingError:
        return "an unparsable connection string"
    host = str(params.get("host") or "localhost")
    port = str(params.get("port") or "5432")
    db = str(params.get("dbname") or params.get("user") or "")
    redact.register(dsn)
    return redact.scrub(f"{host}:{port}/{db}")  # whatever a misread password left in host or dbname


def write_config(path: Path, layout: Layout, databases: Mapping[str, str]) -> None:
    path.write_text(config_text(layout, databases), encoding="utf-8")


def config_text(layout: Layout, databases: Mapping[str, str]) -> str:
    from .layout import iso_ms

    lines = [
        "# written by pgidgen",
        "[layout]",
        f'epoch = "{iso_ms(layout.epoch_ms)}"',
        f"shard_bits = {layout.shard_bits}",
        f"sequence_bits = {layout.sequence_bits}",
        "",
        "[databases]",
    ]
    lines += [f'{name} = "{dsn}"' for name, dsn in databases.items()]
    return "\n".join(lines) + "\n"
