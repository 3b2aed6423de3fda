"""A throwaway PgBouncer in front of throwaway servers, for the tests and benches of the Router behind a pooler.

Debian's `pgbouncer` package (tests/ensure-deps.sh installs it); PgBouncer refuses to run as root, so as root it
runs as the sandbox's unprivileged user, in a directory of the sandbox's making (sandbox.make_root)."""
from __future__ import annotations

import os
import pwd
import shutil
import socket
import subprocess
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import psycopg.conninfo

from . import sandbox
from .errors import SandboxError

MODES = ("transaction", "session")


def find() -> str | None:
    """The pgbouncer program: on PATH, or where Debian puts it (/usr/sbin, off a normal user's PATH)."""
    return shutil.which("pgbouncer") or next((p for p in ("/usr/sbin/pgbouncer",) if os.access(p, os.X_OK)), None)


@dataclass
class Bouncer:
    root: Path
    port: int
    mode: str
    proc: subprocess.Popen[bytes]

    def dsn(self, alias: str, user: str = sandbox.SUPERUSER) -> str:
        return f"postgresql://{user}@127.0.0.1:{self.port}/{alias}"

    def log(self) -> str:
        try:
            return (self.root / "pgbouncer.log").read_text(encoding="utf-8", errors="replace")
        except OSError:
            return ""

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def start(root: Path, databases: Mapping[str, str], *, mode: str = "transaction", pool_size: int = 20) -> Bouncer:
    """PgBouncer on 127.0.0.1 (no unix socket) with pool_mode = mode, serving each alias in databases (alias ->
    a sandbox server's connection string, trust authentication)."""
    program = find()
    if program is None:
        raise SandboxError("pgbouncer is not installed", hint="apt-get install pgbouncer (make deps does)")
    if mode not in MODES:
        raise SandboxError(f"pool_mode {mode!r} is not one of {', '.join(MODES)}")
    users: set[str] = set()
    lines = ["[databases]"]
    for alias, dsn in databases.items():
        p = psycopg.conninfo.conninfo_to_dict(dsn)
        users.add(str(p.get("user") or sandbox.SUPERUSER))
        lines.append(f"{alias} = host={p.get('host', '127.0.0.1')} port={p.get('port', 5432)} dbname={p.get('dbname')} user={p.get('user', sandbox.SUPERUSER)}")
    port = sandbox.free_port()
    lines += [
        "[pgbouncer]",
        "listen_addr = 127.0.0.1",
        f"listen_port = {port}",
        "unix_socket_dir =",
        "auth_type = trust",
        f"auth_file = {root / 'users.txt'}",
        f"pool_mode = {mode}",
        "max_client_conn = 500",
        f"default_pool_size = {pool_size}",
        f"logfile = {root / 'pgbouncer.log'}",
        "log_connections = 0",
        "log_disconnections = 0",
    ]
    (root / "pgbouncer.ini").write_text("\n".join(lines) + "\n", encoding="utf-8")
    (root / "users.txt").write_text("".join(f'"{u}" ""\n' for u in sorted(users)), encoding="utf-8")
    user = sandbox.run_as()
    argv = [program, str(root / "pgbouncer.ini")]
    if user:
        pw = pwd.getpwnam(user)
        for f in ("pgbouncer.ini", "users.txt"):
            os.chown(root / f, pw.pw_uid, pw.pw_gid)
        argv = ["setpriv", f"--reuid={pw.pw_uid}", f"--regid={pw.pw_gid}", "--init-groups", "--", *argv]
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    bouncer = Bouncer(root=root, port=port, mode=mode, proc=proc)
    deadline = time.monotonic() + 15
    while True:
        if proc.poll() is not None:
            raise SandboxError(f"pgbouncer exited at start: {bouncer.log().strip().splitlines()[-1:] or proc.returncode}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return bouncer
        except OSError:
            if time.monotonic() > deadline:
                bouncer.stop()
                raise SandboxError("pgbouncer did not accept connections within 15s") from None
            time.sleep(0.05)
