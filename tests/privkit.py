"""A least-privileged role, as managed services give one: it owns its database, has REPLICATION and, on 16+,
membership of pg_create_subscription, and logs in with scram-sha-256 (pg_hba lines ahead of the sandbox's trust)."""
from __future__ import annotations

import uuid
from dataclasses import dataclass
from pathlib import Path

import psycopg
from psycopg import sql

from pgidgen import sandbox


@dataclass
class Grant:
    replication: bool = True
    create_subscription: bool = True  # 16+ only


def least_privileged(server: sandbox.Server, role: str, password: str, dbname: str, grant: Grant | None = None) -> str:
    """Create role (if new on this server) and dbname owned by it on server; the DSN, with no password in it."""
    grant = grant or Grant()
    admin = f"host={server.datadir} port={server.port} user={sandbox.SUPERUSER} dbname=postgres"
    with psycopg.connect(admin, autocommit=True) as conn:
        if conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (role,)).fetchone() is None:
            conn.execute(sql.SQL("CREATE ROLE {} LOGIN PASSWORD {} {}").format(
                sql.Identifier(role), sql.Literal(password), sql.SQL("REPLICATION" if grant.replication else "NOREPLICATION")))
            if grant.create_subscription and conn.info.server_version >= 160000:
                conn.execute(sql.SQL("GRANT pg_create_subscription TO {}").format(sql.Identifier(role)))
        conn.execute(sql.SQL("CREATE DATABASE {} OWNER {}").format(sql.Identifier(dbname), sql.Identifier(role)))
        hba = Path(server.datadir) / "pg_hba.conf"
        text = hba.read_text()
        lines = "".join(f"{kind} {db} {role} {addr} scram-sha-256\n".replace("  ", " ")
                        for kind, addr in (("local", ""), ("host", "127.0.0.1/32")) for db in ("all", "replication"))
        if lines not in text:
            hba.write_text(lines + text)  # ahead of the trust lines; the file keeps its owner
            conn.execute("SELECT pg_reload_conf()")
    return f"host=127.0.0.1 port={server.port} user={role} dbname={dbname}"


def drop(server: sandbox.Server, dbname: str) -> None:
    admin = f"host={server.datadir} port={server.port} user={sandbox.SUPERUSER} dbname=postgres"
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(dbname)))


def names() -> tuple[str, str, str]:
    """A fresh (role, password, database) triple."""
    tag = uuid.uuid4().hex[:10]
    return f"app_{tag}", f"pw'q\\$x$ $t$;-{uuid.uuid4().hex}", f"t_{tag}"  # quotes, a backslash, dollars
