from __future__ import annotations

from pathlib import Path

import pytest

from pgidgen.config import config_from_dict, describe_dsn, load_config
from pgidgen.errors import ConfigError


def test_env_interpolation(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DB2_DSN", "postgresql://app:s3cret@db2.example:5433/app")
    cfg = config_from_dict({"databases": {"db1": "postgresql://app@localhost/app", "db2": "${DB2_DSN}"}})
    assert cfg.databases["db2"] == "postgresql://app:s3cret@db2.example:5433/app"
    assert describe_dsn(cfg.databases["db2"]) == "db2.example:5433/app"


def test_missing_env_var(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NOPE_DSN", raising=False)
    cfg = config_from_dict({"databases": {"db1": "postgresql://localhost/app", "db2": "${NOPE_DSN}"}})
    assert cfg.dsn("db1") == "postgresql://localhost/app"
    with pytest.raises(ConfigError, match=r"database db2 uses \$\{NOPE_DSN\}, which is not set: export NOPE_DSN"):
        cfg.dsn("db2")
    # set but empty (a CI secret that is not there): libpq would connect to the local default server instead
    monkeypatch.setenv("NOPE_DSN", "")
    cfg = config_from_dict({"databases": {"db1": "postgresql://localhost/app", "db2": "${NOPE_DSN}", "db3": " "}})
    with pytest.raises(ConfigError, match=r"^database db2 has an empty connection string \(\$\{NOPE_DSN\} is set to an empty string\)"):
        cfg.dsn("db2")
    with pytest.raises(ConfigError, match=r"^database db3 has an empty connection string: give it"):
        cfg.dsn("db3")


def test_commands_that_do_not_connect_need_no_secrets(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """decode, layout and --sql never connect: an unset ${VAR} (a secret not exported here) does not stop them, as it
    did (found by a README review); a command that connects to that database names it."""
    from click.testing import CliRunner

    from pgidgen.cli import main

    monkeypatch.delenv("NOPE_DSN", raising=False)
    path = tmp_path / "pgidgen.toml"
    path.write_text('[databases]\ndb1 = "postgresql://app@127.0.0.1:1/app"\ndb2 = "${NOPE_DSN}"\n')
    runner = CliRunner()
    for args in (["decode", "8388609"], ["decode", "--instagram", "1387263000588282244"], ["layout"], ["init", "--shards", "4", "--sql"]):
        r = runner.invoke(main, ["--config", str(path), *args])
        assert r.exit_code == 0, (args, r.output)
    r = runner.invoke(main, ["--config", str(path), "map"])
    assert r.exit_code == 1 and "db2: UNREACHABLE: database db2 uses ${NOPE_DSN}, which is not set" in r.output, r.output
    # inside a password: the reference is not a secret (it showed as *** in its own message; found by a review)
    path.write_text('[databases]\ndb1 = "host=127.0.0.1 port=1 dbname=app password=${NOPE_PASSWORD}"\n')
    monkeypatch.delenv("NOPE_PASSWORD", raising=False)
    r = runner.invoke(main, ["--config", str(path), "init", "--shards", "4"])
    assert r.exit_code == 1 and "database db1 uses ${NOPE_PASSWORD}, which is not set" in r.output, r.output


def test_password_in_file_refused(tmp_path: Path) -> None:
    path = tmp_path / "pgidgen.toml"
    path.write_text('[databases]\ndb1 = "postgresql://app:hunter2@localhost/app"\n')
    with pytest.raises(ConfigError) as e:
        load_config(path)
    assert "hunter2" not in e.value.render()
    assert e.value.render() == (
        f"the connection string of db1 contains a password ({path}): "
        "keep secrets out of the file: use ${VAR} interpolation, PGPASSWORD or ~/.pgpass"
    )


def test_missing_and_bad_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("PGIDGEN_CONFIG", raising=False)
    with pytest.raises(ConfigError, match="no pgidgen.toml in"):
        load_config(None)
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "nope.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("[layout\n")
    with pytest.raises(ConfigError, match="is not valid TOML"):
        load_config(bad)


def test_unknown_database_name() -> None:
    cfg = config_from_dict({"databases": {"db1": "postgresql://localhost/app"}})
    with pytest.raises(ConfigError, match="unknown database 'db9': configured databases are: db1"):
        cfg.select("db1,db9")


def test_client_programs_get_the_password_by_environment() -> None:
    import psycopg

    from pgidgen.db import scrub, tool_args

    dsn, env = tool_args("postgresql://app:s3cret@db.example:5433/app")
    assert "s3cret" not in dsn and env["PGPASSWORD"] == "s3cret"
    assert "db.example" in dsn and "5433" in dsn
    assert psycopg.conninfo.conninfo_to_dict(tool_args("host=x user=y")[0]) == {"host": "x", "user": "y", "options": "-c statement_timeout=0 -c idle_in_transaction_session_timeout=0 -c idle_session_timeout=0"}
    assert "-c geqo=off -c statement_timeout=0" in tool_args("host=x options='-c geqo=off'")[0]  # after the string's own
    assert scrub("connection postgresql://app:s3cret@h/app failed, password=hunter2") == "connection postgresql://app:***@h/app failed, password=***"
    assert scrub("host=h password='my secret \\' phrase' dbname=app") == "host=h password=*** dbname=app"
    assert scrub("host=h password = 'two words'") == "host=h password = ***"


@pytest.mark.parametrize("dsn", [
    "postgresql://app:Zx9/Kq+Pw7SECRET@127.0.0.1:1/app",  # '/' in the password: libpq reads "app" as the host
    "postgresql://app:top@secret@127.0.0.1:1/app",
    "postgresql://app:top secret@127.0.0.1:1/app",
    "postgresql://app:abSE%ZZCRET@127.0.0.1:1/app",
    "host=127.0.0.1 password=hunter2",
    "postgresql://app@127.0.0.1/app?password=hunter2",
    "postgresql://app:${PW}@127.0.0.1/app?password=hunter2",  # the user info's ${PW} does not excuse the query's
    "postgresql://app@127.0.0.1/app?pass%77ord=hunter2",
    "postgresql://app:S3cret/pass?word99@db.example.com/app",  # '?' and '/' in the password
    "postgresql://app:S3cret#pass/word99@db.example.com/app",
    "postgresql://u:abcdef/ghijk?sslmode=x@host/db",  # libpq reads u:abcdef as host:port, and a query after it
    "postgresql://127.0.0.1:1/db?pass%77ord=hunter22&x=1",
])
def test_any_literal_password_in_the_file_is_refused(tmp_path: Path, dsn: str) -> None:
    path = tmp_path / "pgidgen.toml"
    path.write_text(f'[databases]\ndb1 = "{dsn}"\n')
    with pytest.raises(ConfigError, match="the connection string of db1 contains a password"):
        load_config(path)


def test_a_password_from_the_environment_inside_a_connection_string(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PW", "s3cr/et")
    cfg = config_from_dict({"databases": {"db1": "postgresql://app:${PW}@db1.example:5433/app", "db2": "host=db2.example password=${PW}"}})
    assert cfg.databases["db1"] == "postgresql://app:s3cr/et@db1.example:5433/app"
    assert describe_dsn(cfg.databases["db1"]) == "db1.example:5433/app"


@pytest.mark.parametrize("dsn", [
    "postgresql://app:Zx9/Kq+Pw7SECRET@127.0.0.1:1/app",
    "postgresql://app:top@SECRETpart@127.0.0.1:1/app",
    "postgresql://app:top SECRETpart@127.0.0.1:1/app",
    "postgresql://app:abSE%ZZSECRET@127.0.0.1:1/app",
    "host=127.0.0.1 port=1 password=abc\\ SECRETpart",
    "postgresql://app:SECRET#pass/word99@127.0.0.1:1/app",
    "postgresql://app:SECRET/pass?word99@127.0.0.1:1/app",
    "postgresql://u:ab/cd?SECRETkey=1@127.0.0.1:1/db",  # libpq: invalid URI query parameter "SECRETkey"
    "postgresql://u:12,SECREThost/x@127.0.0.1:1/db",  # libpq: failed to resolve host 'SECREThost'
    "postgresql://127.0.0.1:1/db?pass%77ord=sec ret SECRETword",
])
def test_no_part_of_a_password_in_any_message(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, dsn: str) -> None:
    """libpq's messages quote what it could not use of a connection string (a host that was a password's tail,
    an unparsable token): the CLI's messages never show a password or a part of one (found by a review)."""
    from click.testing import CliRunner

    from pgidgen.cli import main

    path = tmp_path / "pgidgen.toml"
    path.write_text('[databases]\ndb1 = "${DB1}"\n')
    monkeypatch.setenv("DB1", dsn)
    for args in (["map"], ["init", "--shards", "2"], ["map", "--json"]):
        res = CliRunner().invoke(main, ["--config", str(path), *args])
        assert res.exit_code == 1
        assert "SECRET" not in res.output and "Traceback" not in res.output, res.output
    assert "SECRET" not in describe_dsn(dsn)
    assert describe_dsn(dsn).startswith(("127.0.0.1:1/", "an unparsable connection string")), describe_dsn(dsn)


@pytest.mark.parametrize("dsn, password", [
    ("host=127.0.0.1 port=1 password=pa ss/wo'rd", "pa ss/wo'rd"),  # libpq: missing "=" after "ss/wo'rd"
    ("postgresql://u:pa/ss#wo%zz@127.0.0.1:1/db", "pa/ss#wo%zz"),  # libpq: invalid percent-encoded token: "ss#wo%zz@..."
])
def test_no_piece_of_a_password_that_libpq_quotes_across_its_special_characters(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                              dsn: str, password: str) -> None:
    """A password of short runs between special characters (each under 5 characters) showed 7 or 8 of its
    characters: libpq cuts a misread string at some of them only, so the piece it quoted was never registered."""
    from click.testing import CliRunner

    from pgidgen.cli import main

    path = tmp_path / "pgidgen.toml"
    path.write_text('[databases]\ndb1 = "${DB1}"\n')
    monkeypatch.setenv("DB1", dsn)
    pieces = {password[i:j] for i in range(len(password)) for j in range(i + 5, len(password) + 1)}
    for args in (["map"], ["init", "--shards", "2"], ["map", "--json"]):
        res = CliRunner().invoke(main, ["--config", str(path), *args])
        assert res.exit_code == 1 and "Traceback" not in res.output
        assert not [p for p in pieces if p in res.output.replace('\\"', '"')], res.output


@pytest.mark.parametrize("text, message", [
    (b"layout = 5\n", "layout must be a [layout] table, not a value"),
    (b"databases = 5\n", "databases must be a [databases] table, not a value"),
    (b"\xff\xfe", "is not UTF-8 text"),
])
def test_malformed_config_files(tmp_path: Path, text: bytes, message: str) -> None:
    path = tmp_path / "pgidgen.toml"
    path.write_bytes(text)
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("]", r"\]")):
        load_config(path)


@pytest.mark.parametrize("dsn, where", [
    ("postgresql://h:5432/db?user=admin@myserver&sslmode=require", "h:5432/db"),  # an Azure-style user@server login
    ("postgresql://[::1]/db?application_name=a@b", "::1:5432/db"),
    ("postgresql:///app?host=/tmp&user=a@b", "/tmp:5432/app"),
])
def test_an_at_sign_in_the_query_is_not_a_password(dsn: str, where: str) -> None:
    cfg = config_from_dict({"databases": {"db1": dsn}})
    assert describe_dsn(cfg.databases["db1"]) == where


def test_query_values_with_an_at_sign_do_not_take_names_out_of_messages() -> None:
    """A first reading of user info up to the last '@' took 'orders_db' for part of a password (a review)."""
    from pgidgen.redact import scrub

    assert describe_dsn("postgresql://127.0.0.1:1/orders_db?user=admin@corp") == "127.0.0.1:1/orders_db"
    assert scrub("database orders_db on host 127.0.0.1") == "database orders_db on host 127.0.0.1"


def test_a_short_password_does_not_take_words_out_of_messages() -> None:
    from pgidgen.redact import register, scrub

    register("postgresql://app:e@127.0.0.1:1/app")
    assert scrub("connection refused: is the server running?") == "connection refused: is the server running?"


def test_a_service_files_options_are_not_replaced(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """pgidgen's session settings went into an explicit options=, which replaced a pg_service.conf entry's own
    (a role or search_path set there; found by a review): with a service, they are SET after connecting."""
    import psycopg

    from pgidgen.db import _options, session_conninfo, tool_args

    monkeypatch.delenv("PGSERVICE", raising=False)
    monkeypatch.delenv("PGOPTIONS", raising=False)
    assert _options("service=s1") is None and tool_args("service=s1")[0] == "service=s1"
    assert _options("service=s1 options='-c work_mem=77MB'") == "-c work_mem=77MB -c statement_timeout=0 -c idle_in_transaction_session_timeout=0"
    monkeypatch.setenv("PGSERVICE", "s1")
    assert _options("host=h") is None
    monkeypatch.delenv("PGSERVICE")
    monkeypatch.setenv("PGOPTIONS", "-c geqo=off")
    assert _options("host=h") == "-c geqo=off -c statement_timeout=0 -c idle_in_transaction_session_timeout=0"
    sub = psycopg.conninfo.conninfo_to_dict(session_conninfo("host=h", 150000))  # the server's connection: not our PGOPTIONS
    assert sub["options"] == "-c statement_timeout=0 -c idle_in_transaction_session_timeout=0 -c idle_session_timeout=0"


def test_a_database_with_a_pooler_for_the_app(monkeypatch: pytest.MonkeyPatch) -> None:
    """admin_dsn for pgidgen's commands (direct), app_dsn for the Router (through a pooler); plain strings as before."""
    monkeypatch.setenv("PGIDGEN_T_PW", "s3cret")
    cfg = config_from_dict({"databases": {
        "db1": "postgresql://h1/app",
        "db2": {"admin_dsn": "postgresql://h2/app", "app_dsn": "postgresql://u:${PGIDGEN_T_PW}@bouncer:6432/db2", "pooler": "transaction"},
        "db3": {"admin_dsn": "postgresql://h3/app", "pooler": "session", "prepared_statements": True},
    }})
    assert cfg.dsn("db2") == "postgresql://h2/app" and cfg.app_dsn("db2") == "postgresql://u:s3cret@bouncer:6432/db2"
    assert cfg.app_dsn("db1") == cfg.dsn("db1") and cfg.app_dsn("db3") == cfg.dsn("db3")
    assert cfg.poolers == {"db2": "transaction", "db3": "session"} and cfg.pooler_prepares == {"db3"}
    for table, message in [
        ({"app_dsn": "postgresql://b/x"}, "database db9: admin_dsn is missing"),
        ({"admin_dsn": "postgresql://h/x", "pooler": "statement"}, "database db9: pooler = 'statement' is not one of transaction, session, none"),
        ({"admin_dsn": "postgresql://h/x", "user": "x"}, "database db9: unknown key(s) user"),
        ({"admin_dsn": "postgresql://h/x", "app_dsn": "postgresql://u:pw@b/x"}, "the connection string of db9 contains a password"),
    ]:
        with pytest.raises(ConfigError) as err:
            config_from_dict({"databases": {"db9": table}})
        assert err.value.what == message


def test_a_configs_repr_shows_no_password(monkeypatch: pytest.MonkeyPatch) -> None:
    """repr(config) is what a debugger, a traceback's locals (Django's error page, Sentry) and pytest show."""
    monkeypatch.setenv("PGIDGEN_T_PW", "Zq8s3cretWord")
    cfg = config_from_dict({"databases": {
        "db1": "postgresql://u:${PGIDGEN_T_PW}@h1/app",
        "db2": {"admin_dsn": "host=h2 password=${PGIDGEN_T_PW}", "app_dsn": "postgresql://u:${PGIDGEN_T_PW}@bouncer:6432/db2"},
    }})
    assert "Zq8s3cretWord" not in repr(cfg) and "Zq8s3" not in repr(cfg)
    assert "h1/app" in repr(cfg) and "bouncer:6432/db2" in repr(cfg)


@pytest.mark.parametrize("dsn", [
    "Zq9-PLUGHword",  # the password alone where the whole string goes: libpq: missing "=" after "Zq9-PLUGHword"
    "host=127.0.0.1 port=1 user=app Zq9-PLUGHword",  # its key left out: the same message
    "host=127.0.0.1 port=1 user=app 'Zq9 PLUGHword'",
])
def test_a_password_without_its_key_is_in_no_message(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, dsn: str) -> None:
    """A ${VAR} holding only the password, put where the whole connection string goes (or a string missing its
    'password='): libpq quotes the token that has no '=', and no pattern knew it for a password (found by a
    review: `move-shard`, `map` and `check` printed it). Its own marker: earlier cases register parts of theirs."""
    from click.testing import CliRunner

    from pgidgen.cli import main

    path = tmp_path / "pgidgen.toml"
    path.write_text('[databases]\ndb1 = "${DB1}"\ndb2 = "${DB1}"\n')
    monkeypatch.setenv("DB1", dsn)
    for args in (["map"], ["check"], ["move-shard", "1", "db2"], ["map", "--json"]):
        res = CliRunner().invoke(main, ["--config", str(path), *args])
        assert res.exit_code == 1 and "Traceback" not in res.output, res.output
        assert "PLUGH" not in res.output, res.output


@pytest.mark.parametrize("dsn, message", [
    ("postgressql://app@db2.example:5432/app",
     "the connection string of db2 starts with 'postgressql://', which is no PostgreSQL URI scheme ({path}): begin it with"
     ' postgresql:// (or postgres://), e.g. db2 = "postgresql://user@host:5432/dbname"'),
    ("postgresql:/db2.example:5432/app",
     "the connection string of db2 starts with 'postgresql:/', not 'postgresql://' ({path}): write postgresql:// (a colon and"
     ' two slashes), e.g. db2 = "postgresql://user@host:5432/dbname"'),
    ("postgres//db2.example/app",
     "the connection string of db2 starts with 'postgres//', not 'postgres://' ({path}): write postgres:// (a colon and two"
     ' slashes), e.g. db2 = "postgresql://user@host:5432/dbname"'),
    ("PostgreSQL://db2.example/app",
     "the connection string of db2 starts with 'PostgreSQL://', a scheme libpq reads only in lower case ({path}): write"
     ' postgresql://, e.g. db2 = "postgresql://user@host:5432/dbname"'),
    ("jdbc:postgresql://db2.example/app",
     "the connection string of db2 starts with 'jdbc:', which is no PostgreSQL URI scheme ({path}): begin it with"
     ' postgresql:// (or postgres://), e.g. db2 = "postgresql://user@host:5432/dbname"'),
    ("db2.example:5432/app",
     "the connection string of db2 is neither a postgresql:// URI nor key=value pairs ({path}): write it as"
     ' db2 = "postgresql://user@host:5432/dbname", or as "host=... port=... dbname=..."'),
    # the scheme first: a password in the file is told once the string can be read
    ("postgressql://app:hunter2@db2.example/app",
     "the connection string of db2 starts with 'postgressql://', which is no PostgreSQL URI scheme ({path}): begin it with"
     ' postgresql:// (or postgres://), e.g. db2 = "postgresql://user@host:5432/dbname"'),
])
def test_a_typo_in_the_scheme_is_named(tmp_path: Path, dsn: str, message: str) -> None:
    """`postgressql://...` and `postgresql:/...` were reported as `the connection string of db2 contains a password`
    (libpq reads them as key=value pairs and quotes them whole; issue 36): the scheme is named, and what to write."""
    from click.testing import CliRunner

    from pgidgen.cli import main

    path = tmp_path / "pgidgen.toml"
    path.write_text(f'[databases]\ndb1 = "postgresql://app@db1.example/app"\ndb2 = "{dsn}"\n')
    with pytest.raises(ConfigError) as e:
        load_config(path)
    assert e.value.render() == message.format(path=path)
    assert "hunter2" not in e.value.render()
    res = CliRunner().invoke(main, ["--config", str(path), "map"])
    assert (res.exit_code, res.output) == (1, f"Error: {message.format(path=path)}\n")
    # an admin_dsn/app_dsn table is read the same way
    with pytest.raises(ConfigError) as e:
        config_from_dict({"databases": {"db2": {"admin_dsn": "postgresql://h/app", "app_dsn": dsn}}})
    assert e.value.what == message.split(" ({path})")[0]


def test_a_typo_in_the_scheme_from_the_environment_is_named_when_used(monkeypatch: pytest.MonkeyPatch) -> None:
    """A ${VAR} holding the whole string: named by the commands that connect to it (decode and --sql need it not);
    a Config made in code meets it when connecting (libpq's own message quotes the string, a password with it)."""
    from pgidgen.db import connect
    from pgidgen.errors import DatabaseError

    monkeypatch.setenv("PGIDGEN_T_DB2", "pgsqll://app:Zq7s3cret@db2.example/app")
    cfg = config_from_dict({"databases": {"db1": "postgresql://app@db1.example/app", "db2": "${PGIDGEN_T_DB2}"}})
    assert cfg.dsn("db1") == "postgresql://app@db1.example/app"
    with pytest.raises(ConfigError) as e:
        cfg.dsn("db2")
    assert e.value.render() == ("the connection string of db2 starts with 'pgsqll://', which is no PostgreSQL URI scheme: begin it"
                                ' with postgresql:// (or postgres://), e.g. db2 = "postgresql://user@host:5432/dbname"')
    with pytest.raises(DatabaseError) as d:
        connect("db3", "postgresql:db3.example/app")
    assert d.value.render() == ("the connection string of db3 starts with 'postgresql:', not 'postgresql://': write postgresql://"
                                ' (a colon and two slashes), e.g. db3 = "postgresql://user@host:5432/dbname"')
