"""`pgidgen check`: what each database needs for init and for moves, one finding per line with what to change.

The same checks guard `move-shard` and `rebalance` before they journal anything (move.context.check_servers):

- the server's major (pgbin.SUPPORTED), and a pg_dump at least as new (pgbin.clients_for);
- that it is a primary, not a read-only standby (a reader endpoint, an old primary's address after a failover);
- for an online move out of it (the source): wal_level = logical, a free replication slot, two free WAL senders,
  and a role that may replicate (REPLICATION, or a managed service's replication role);
- for an online move into it (the target): a free logical replication worker, and a role that may CREATE
  SUBSCRIPTION (a superuser on 15; on 16+, a member of pg_create_subscription with CREATE on the database);
- for init and apply-ddl: CREATE on the database (its owner has it), and for init (and a move into a database
  without a catalog) TEMPORARY, which hardened setups revoke from PUBLIC: idgen.check_argument_order's probe;
- the shards' tables without a replica identity a move could use as it stands (no primary key, say): what an
  online move gives them while it publishes them, or that none would do (move/identity.py);
- whether a target can reach a source: a CREATE SUBSCRIPTION that connects (create_slot = false, enabled =
  false) in a transaction that is rolled back, so the target server itself logs in to the source with the
  connection string a move would give it, password included. Nothing is left behind.

A non-superuser's subscription must carry a password (PostgreSQL's password_required): pgidgen adds the one it
logged in to the source with (conninfo_for_subscription); redact keeps it out of every message.
"""
from __future__ import annotations

import re
import secrets
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import psycopg
import psycopg.conninfo
from psycopg import sql

from . import pgbin, redact
from .db import session_conninfo
from .errors import PgidgenError
from .versions import has, major

#: what one move takes on its source (the slot's own connection, the subscription's walsender) and target
SLOTS_PER_MOVE, SENDERS_PER_MOVE, WORKERS_PER_MOVE = 1, 2, 1

#: How each managed service grants what pgidgen's role needs (docs/guide.md: "PostgreSQL versions and privileges"). role = the role in the DSN.
SERVICE_GRANTS = {
    "replication": "ALTER ROLE {role} REPLICATION (Amazon RDS/Aurora: GRANT rds_replication TO {role}; Cloud SQL and Azure: ALTER ROLE {role} REPLICATION)",
    "wal_level": "set wal_level = logical and restart (Amazon RDS/Aurora: rds.logical_replication = 1 in the parameter group;"
                 " Cloud SQL: the flag cloudsql.logical_decoding = on; Azure: the server parameter wal_level = logical)",
}

FACTS_SQL = """
SELECT current_setting('server_version_num')::int, current_user, current_database(),
       current_setting('wal_level'),
       current_setting('max_replication_slots')::int, (SELECT count(*) FROM pg_catalog.pg_replication_slots)::int,
       current_setting('max_wal_senders')::int, (SELECT count(*) FROM pg_catalog.pg_stat_replication)::int,
       current_setting('max_logical_replication_workers')::int,
       (SELECT count(*) FROM pg_catalog.pg_stat_subscription WHERE pid IS NOT NULL)::int,
       r.rolsuper,
       r.rolreplication OR (pg_catalog.to_regrole('rds_replication') IS NOT NULL
                            AND pg_catalog.pg_has_role(current_user, 'rds_replication', 'MEMBER')),
       pg_catalog.has_database_privilege(current_database(), 'CREATE'),
       pg_catalog.to_regrole('pg_create_subscription') IS NOT NULL
           AND pg_catalog.pg_has_role(current_user, 'pg_create_subscription', 'USAGE'),
       coalesce(current_setting('max_active_replication_origins', true), current_setting('max_replication_slots'))::int,
       (SELECT count(DISTINCT subid) FROM pg_catalog.pg_stat_subscription)::int,
       pg_catalog.pg_is_in_recovery(),
       pg_catalog.has_database_privilege(current_database(), 'TEMPORARY')
FROM pg_catalog.pg_roles r WHERE r.rolname = current_user
"""


@dataclass
class Facts:
    """What one query reads of a server and the role pgidgen uses on it."""

    version: int
    role: str
    dbname: str
    wal_level: str
    max_slots: int
    slots: int
    max_senders: int
    senders: int
    max_workers: int
    workers: int
    superuser: bool
    replication: bool
    create_on_db: bool
    create_subscription: bool
    max_origins: int  # replication origins a subscription's apply needs one of (max_replication_slots before 18)
    origins: int
    standby: bool  # in recovery: read-only, so neither init nor either end of a move can write there
    temp_on_db: bool  # TEMPORARY: init's probe of the argument order (idgen.check_argument_order) creates temporary objects

    @classmethod
    def read(cls, conn: psycopg.Connection[Any]) -> Facts:
        row = conn.execute(FACTS_SQL).fetchone()
        assert row is not None
        return cls(*row)

    @property
    def major(self) -> int:
        return major(self.version)

    @property
    def may_subscribe(self) -> bool:
        if self.superuser:
            return True
        return has(self.version, "pg_create_subscription") and self.create_subscription and self.create_on_db


@dataclass
class Finding:
    database: str
    item: str  # version, primary, pg_dump, init, wal_level, slots, senders, workers, replication, subscription, reach <source>
    ok: bool
    text: str  # what was found
    fix: str | None = None  # what to change, when not ok
    #: which work a failed finding stops: "all", "init", "move from" (as the source), "move to" (as the target)
    stops: str = "all"

    def line(self) -> str:
        head = f"{self.database}: {'ok' if self.ok else 'FAIL'} {self.item}: {self.text}"
        return head if self.ok or not self.fix else f"{head}: {self.fix}"

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Report:
    findings: list[Finding] = field(default_factory=list)
    unreachable: dict[str, str] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.unreachable and all(f.ok for f in self.findings)

    def as_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "findings": [f.as_dict() for f in self.findings], "unreachable": dict(self.unreachable)}


def server_findings(name: str, facts: Facts, *, clients: bool = True) -> list[Finding]:
    """Everything about one database that needs no other: version, privileges, replication headroom, pg_dump
    (unless not clients)."""
    out: list[Finding] = []
    add = out.append
    v, role = facts.major, facts.role
    qrole = quoted(role)  # in the SQL a hint suggests: App_x as written
    supported = pgbin.SUPPORTED
    if v in supported:
        add(Finding(name, "version", True, f"PostgreSQL {v}"))
    elif v < supported[0]:
        add(Finding(name, "version", False, f"PostgreSQL {v} is not supported (14 reached its end of life in November 2026)",
                    f"upgrade it to {supported[0]}-{supported[-1]}, or move its shards to a newer server with --offline"))
    else:
        add(Finding(name, "version", True, f"PostgreSQL {v} (newer than pgidgen was tested on: {supported[-1]})"))
    if facts.standby:
        add(Finding(name, "primary", False, "the server is a standby (in recovery), read-only: init, apply-ddl and moves write to every database",
                    "point the config at the primary"))
    else:
        add(Finding(name, "primary", True, "not a standby"))
    try:
        if clients:
            inst = pgbin.clients_for(v)
            add(Finding(name, "pg_dump", True, f"pg_dump {inst.version} ({inst.source}: {inst.bindir})"))
    except PgidgenError as e:
        add(Finding(name, "pg_dump", False, e.what, e.hint, stops="move from"))
    add(_init_finding(name, facts))
    # an online move out of this database
    if facts.wal_level == "logical":
        add(Finding(name, "wal_level", True, "logical"))
    else:
        add(Finding(name, "wal_level", False, f"wal_level = {facts.wal_level}, an online move out of it needs logical",
                    SERVICE_GRANTS["wal_level"] + ", or move with --offline (writes pause for the whole copy)", stops="move from"))
    free_slots = facts.max_slots - facts.slots
    add(Finding(name, "slots", free_slots >= SLOTS_PER_MOVE,
                f"{free_slots} of max_replication_slots = {facts.max_slots} free",
                None if free_slots >= SLOTS_PER_MOVE else
                "raise max_replication_slots (restart), or drop unused ones (pg_replication_slots, pg_drop_replication_slot;"
                " an interrupted move's go with 'pgidgen move-shard --rollback N')", stops="move from"))
    free_senders = facts.max_senders - facts.senders
    add(Finding(name, "senders", free_senders >= SENDERS_PER_MOVE,
                f"{free_senders} of max_wal_senders = {facts.max_senders} free (a move needs {SENDERS_PER_MOVE})",
                None if free_senders >= SENDERS_PER_MOVE else "raise max_wal_senders (restart), or wait for other moves to finish",
                stops="move from"))
    if facts.superuser or facts.replication:
        add(Finding(name, "replication", True, f"role {role} may replicate" + (" (superuser)" if facts.superuser else "")))
    else:
        add(Finding(name, "replication", False, f"role {role} lacks REPLICATION, which an online move out of this database needs",
                    SERVICE_GRANTS["replication"].format(role=qrole) + ", or move with --offline", stops="move from"))
    # an online move into this database
    free_workers = facts.max_workers - facts.workers
    add(Finding(name, "workers", free_workers >= WORKERS_PER_MOVE,
                f"{free_workers} of max_logical_replication_workers = {facts.max_workers} free",
                None if free_workers >= WORKERS_PER_MOVE else
                "raise max_logical_replication_workers (and max_worker_processes) and restart, or wait for other moves to finish",
                stops="move to"))
    free_origins = facts.max_origins - facts.origins
    setting = "max_active_replication_origins" if facts.major >= 18 else "max_replication_slots"
    add(Finding(name, "origins", free_origins >= WORKERS_PER_MOVE,
                f"{free_origins} of {setting} = {facts.max_origins} free for subscriptions (replication origins)",
                None if free_origins >= WORKERS_PER_MOVE else
                f"raise {setting} (restart): a subscription's apply worker needs one, or it never starts", stops="move to"))
    add(_subscription_finding(name, facts))
    return out


def quoted(name: str) -> str:
    return sql.Identifier(name).as_string()


def _init_finding(name: str, facts: Facts) -> Finding:
    role, qrole, qdb = facts.role, quoted(facts.role), quoted(facts.dbname)
    if facts.superuser or (facts.create_on_db and facts.temp_on_db):
        return Finding(name, "init", True, f"role {role} may create schemas and temporary objects in {facts.dbname}"
                       + (" (superuser)" if facts.superuser else ""))
    lacks = [(w, g) for w, g, ok in (("schemas", f"GRANT CREATE ON DATABASE {qdb} TO {qrole}", facts.create_on_db),
                                     ("temporary objects", f"GRANT TEMPORARY ON DATABASE {qdb} TO {qrole}", facts.temp_on_db)) if not ok]
    why = "" if facts.temp_on_db else " (init checks the server's argument order with them)"
    return Finding(name, "init", False, f"role {role} may not create {' or '.join(w for w, _ in lacks)} in database {facts.dbname}{why}",
                   "; ".join(g for _, g in lacks) + f" (or make {role} the database's owner)", stops="init")


def _subscription_finding(name: str, facts: Facts) -> Finding:
    role, qrole, qdb = facts.role, quoted(facts.role), quoted(facts.dbname)
    if facts.may_subscribe:
        how = "superuser" if facts.superuser else "member of pg_create_subscription, CREATE on the database"
        return Finding(name, "subscription", True, f"role {role} may create subscriptions ({how})")
    if not has(facts.version, "pg_create_subscription"):
        return Finding(name, "subscription", False,
                       f"role {role} is not a superuser: on PostgreSQL {facts.major} only a superuser may CREATE SUBSCRIPTION,"
                       " which an online move into this database needs",
                       "use a superuser's DSN for this database, upgrade it to 16+"
                       f" (then GRANT pg_create_subscription TO {qrole}), or move with --offline", stops="move to")
    missing = [w for w, ok in (("membership of pg_create_subscription", facts.create_subscription),
                               (f"CREATE on database {facts.dbname}", facts.create_on_db)) if not ok]
    grants = [g for g, ok in ((f"GRANT pg_create_subscription TO {qrole}", facts.create_subscription),
                              (f"GRANT CREATE ON DATABASE {qdb} TO {qrole}", facts.create_on_db)) if not ok]
    return Finding(name, "subscription", False,
                   f"role {role} lacks {' and '.join(missing)}, which an online move into this database needs",
                   "; ".join(grants) + ", or move with --offline", stops="move to")


def conninfo_for_subscription(dsn: str, source: psycopg.Connection[Any]) -> str:
    """The connection string a target's subscription uses to reach the source: the config's DSN (or
    --subscription-dsn) with pgidgen's session settings, a connect_timeout (a source that never answers must
    not hang the move), and, when it names neither a password nor a passfile, the password pgidgen itself logged
    in to the source with (from PGPASSWORD or a passfile): a non-superuser's subscription must carry one."""
    conninfo = session_conninfo(dsn, source.info.server_version)
    params = psycopg.conninfo.conninfo_to_dict(conninfo)
    extra: dict[str, Any] = {}
    if not params.get("connect_timeout"):
        extra["connect_timeout"] = CONNECT_TIMEOUT
    password = source.info.password
    if not params.get("password") and not params.get("passfile") and password:
        extra["password"] = password
    if extra:
        conninfo = psycopg.conninfo.make_conninfo(conninfo, **extra)
    redact.register(conninfo)
    return conninfo


#: seconds a subscription's login to the source may take (probe and move)
CONNECT_TIMEOUT = 10
#: seconds CREATE SUBSCRIPTION may take beyond its login's connect_timeout (what follows the login: the probe's
#: refused setting, the move's list of published tables)
LOGIN_MARGIN = 5


@dataclass
class Refusal:
    """Why PostgreSQL refused a CREATE SUBSCRIPTION: its SQLSTATE and message (one line, scrubbed). 57014: the
    source did not answer the login in time (subscribe_quietly)."""

    sqlstate: str
    message: str


def login_wait(conninfo: str) -> int:
    """Seconds a CREATE SUBSCRIPTION with conninfo may run: its connect_timeout (CONNECT_TIMEOUT when it has none
    that bounds anything) and LOGIN_MARGIN."""
    given = psycopg.conninfo.conninfo_to_dict(conninfo).get("connect_timeout")
    try:
        seconds = int(str(given).strip())
    except ValueError:
        seconds = 0
    return (seconds if seconds > 0 else CONNECT_TIMEOUT) + LOGIN_MARGIN


def address(conninfo: str) -> str:
    """host:port of a connection string (each of a list), for messages: no password, no other setting. A string
    that names a service file's entry and no host says which entry (the host is in that file, on the server that
    connects)."""
    params = psycopg.conninfo.conninfo_to_dict(conninfo)
    if params.get("service") and not (params.get("host") or params.get("hostaddr")):
        return f"service {params['service']}" + (f" (port {params['port']})" if params.get("port") else "")
    hosts = str(params.get("host") or params.get("hostaddr") or "localhost").split(",")
    ports = str(params.get("port") or "5432").split(",")
    ports += [ports[-1]] * (len(hosts) - len(ports))
    return ",".join(f"{h or 'localhost'}:{p or '5432'}" for h, p in zip(hosts, ports, strict=False))


def subscribe_quietly(conn: psycopg.Connection[Any], create: str, *, keep: bool, conninfo: str) -> Refusal | None:
    """Run a CREATE SUBSCRIPTION statement (which holds a password) so that its failure cannot put its text in
    the server's log: a failed statement is logged with its text (log_min_error_statement, which only a superuser
    may lower), an error caught in PL/pgSQL is not (a cancel included: Ctrl-C). None when it worked (kept, or
    undone when not keep), else PostgreSQL's refusal. conn must be idle. (A server that logs every statement,
    log_statement = all or log_min_duration_statement = 0, logs this one too: see the guide.)

    The statement runs under a statement_timeout of login_wait(conninfo) seconds: the walreceiver's login inside
    it heeds no connect_timeout, so a source that accepts the connection and never answers would hold it (and
    the move) for as long as TCP lets it, minutes. A timeout and a cancel both end it with 57014; the block
    itself tells them apart, so that no Python-side bookkeeping of who cancelled is needed and a cancel from
    anywhere (Ctrl-C, engine.Probe.stop, pg_cancel_backend) stays a cancel: the timeout fires only once the
    statement has run for the whole wait (and so has its transaction, begun just before it: the timer's start is
    no earlier than the transaction's, whatever the protocol), a cancel that came sooner did not. A timeout is a
    Refusal (57014, the source's host:port); a cancel raises KeyboardInterrupt (reported as interrupted)."""
    tag = f"pgidgen_{secrets.token_hex(6)}"
    wait = login_wait(conninfo)
    undo = "" if keep else "RAISE SQLSTATE 'PGIDG' USING MESSAGE = 'pgidgen: undo';"
    body = (f"BEGIN {create.rstrip().rstrip(';')}; {undo}"
            f" EXCEPTION WHEN OTHERS OR query_canceled THEN PERFORM pg_catalog.set_config('pgidgen.subscribe_error',"
            f" CASE WHEN SQLSTATE = 'PGIDG' THEN ''"
            f" WHEN SQLSTATE = '57014' AND pg_catalog.clock_timestamp() - pg_catalog.transaction_timestamp() >= interval '{wait} s'"
            f" THEN 'timeout' ELSE SQLSTATE || ' ' || SQLERRM END, true); END")
    with conn.transaction():
        conn.execute(f"SET LOCAL statement_timeout = '{wait}s'".encode())
        conn.execute(f"DO ${tag}$ {body} ${tag}$".encode())
        row = conn.execute("SELECT pg_catalog.current_setting('pgidgen.subscribe_error', true)").fetchone()
    reason = row[0] if row else None
    if not reason:
        return None
    if reason == "timeout":
        return Refusal("57014", f"the source at {redact.scrub(address(conninfo))} did not answer the login within {wait} s"
                       " (a server that accepts connections and never answers, or a network that drops them)")
    sqlstate, _, message = reason.partition(" ")
    if sqlstate == "57014":
        raise KeyboardInterrupt("cancelled while the target's server was connecting to the source; nothing was created")
    return Refusal(sqlstate, redact.scrub(" ".join(message.split())))  # one line: libpq's messages have newlines


#: A setting no server has: the probe's login asks for it, so the source ends the session the moment the login
#: has succeeded (PostgreSQL reads the options after authentication), before the subscription would look for its
#: publication (a WARNING logged with the statement's text, password and all).
PROBE_SETTING = "pgidgen_reach_probe"


def probe_subscription(target: psycopg.Connection[Any], conninfo: str) -> Refusal | None:
    """Can the target's server log in to the source with conninfo, as a subscription would? None when it can,
    else PostgreSQL's refusal. A subscription that connects (and is undone at once), its login ended by the
    source right after authentication by the setting it asks for (PROBE_SETTING)."""
    params = psycopg.conninfo.conninfo_to_dict(conninfo)
    options = f"{params.get('options') or ''} -c {PROBE_SETTING}=1".strip()
    probing = psycopg.conninfo.make_conninfo(conninfo, options=options)
    create = sql.SQL(
        "CREATE SUBSCRIPTION {} CONNECTION {} PUBLICATION pgidgen_check"
        " WITH (connect = true, create_slot = false, enabled = false, slot_name = NONE, copy_data = false)"
    ).format(sql.Identifier(f"pgidgen_check_{secrets.token_hex(4)}"), sql.Literal(probing)).as_string(target)
    refusal = subscribe_quietly(target, create, keep=False, conninfo=probing)
    if refusal is None:
        return Refusal("XX000", "it logged in without being refused the setting it was given; report this to pgidgen")
    if PROBE_SETTING in refusal.message:  # logged in, then refused the setting as asked (quoted as its language quotes)
        return None
    refusal.message = re.sub(r'^subscription "pgidgen_check_\w+" ', "", refusal.message)
    return refusal


def unasked_password(source: psycopg.Connection[Any], target_facts: Facts) -> Refusal | None:
    """A non-superuser's subscription must log in with a password the source asked for (PostgreSQL's
    password_required): when the source let pgidgen's own login in without asking (trust, peer), it would refuse
    the subscription's the same way, after the move had started. (Only for the config's own DSN: a
    --subscription-dsn may take another way in.)"""
    if target_facts.superuser or source.pgconn.used_password:
        return None
    return Refusal("28000", f"the source lets role {source.info.user} in without asking for a password (pg_hba.conf: trust or peer),"
                   f" and a subscription owned by {target_facts.role}, no superuser, must log in with one; give the role a"
                   " password and make pg_hba.conf ask for it (scram-sha-256)")


def reach_finding(target_name: str, source_name: str, refusal: Refusal | None, *, custom: bool = False) -> Finding:
    """custom: the login tried is a --subscription-dsn's, not the config's (what to fix is then the one given)."""
    item = f"reach {source_name}"
    if refusal is None:
        return Finding(target_name, item, True, f"the server logs in to {source_name} as a subscription would")
    if refusal.sqlstate == "42501":  # the target refused the role the subscription itself (an inherited privilege)
        return Finding(target_name, "subscription", False, f"the server refused the role a subscription: {refusal.message}",
                       "GRANT pg_create_subscription (with INHERIT, on 16+) and CREATE on the database to the role,"
                       " use a superuser's DSN for this database, or move with --offline", stops="move to")
    if refusal.sqlstate == "57014":  # subscribe_quietly's timeout: the login got no answer at all
        if not custom:
            return Finding(target_name, item, False, f"the server's login to {source_name} as a subscription timed out: {refusal.message}",
                           f"check that the source's server is up and answering at that address and that {target_name}'s server"
                           " reaches it (network, firewall); or pass --subscription-dsn to move-shard with an address it answers on",
                           stops="move to")
        return Finding(target_name, item, False, f"the server's login to {source_name} as a subscription timed out: {refusal.message}",
                       f"check that the source's server answers at the address of the --subscription-dsn given, from"
                       f" {target_name}'s server (network, firewall), or give --subscription-dsn an address it answers on",
                       stops="move to")
    if not custom:
        return Finding(target_name, item, False, f"the server cannot log in to {source_name} as a subscription: {refusal.message}",
                       f"the target server itself must reach {source_name} with the config's connection string (a host it can"
                       " resolve, pg_hba.conf on the source allowing it with a password); or pass --subscription-dsn to move-shard",
                       stops="move to")
    return Finding(target_name, item, False, f"the server cannot log in to {source_name} as a subscription: {refusal.message}",
                   f"the target server itself must reach {source_name} with the --subscription-dsn given (a host it can resolve,"
                   " pg_hba.conf on the source allowing it with a password): fix it, or leave it out to use the config's",
                   stops="move to")


def check(config: Any, databases: Sequence[str] | None = None, *, reach: bool = True) -> Report:
    """Every database of the config (or those named): its findings, and each ordered pair's reach."""
    from .db import connect

    names = list(databases or config.databases)
    report = Report()
    conns: dict[str, psycopg.Connection[Any]] = {}
    facts: dict[str, Facts] = {}
    try:
        for name in names:
            try:
                conns[name] = connect(name, config.dsn(name), autocommit=True)
                facts[name] = Facts.read(conns[name])
            except PgidgenError as e:
                report.unreachable[name] = e.render()
                continue
            report.findings.extend(server_findings(name, facts[name]))
            report.findings.extend(keyless_findings(name, conns[name]))
        if reach:
            for tgt_name in facts:
                if not facts[tgt_name].may_subscribe:
                    continue  # said above; the probe would only repeat it
                for src_name in facts:
                    if src_name == tgt_name:
                        continue
                    conninfo = conninfo_for_subscription(config.dsn(src_name), conns[src_name])
                    reason = unasked_password(conns[src_name], facts[tgt_name]) or probe_subscription(conns[tgt_name], conninfo)
                    report.findings.append(reach_finding(tgt_name, src_name, reason))
    finally:
        for c in conns.values():
            c.close()
    return report


def keyless_findings(name: str, conn: psycopg.Connection[Any]) -> list[Finding]:
    """The tables of the shards this database serves that lack a replica identity an online move could use as it
    stands (no primary key, say): ok, with what a move gives them while it publishes them (move/identity.py);
    FAIL for those no identity would do for (no key, and a column without equality), which only --offline moves."""
    from .move.identity import keyless_tables, lacking
    from .ranges import collapse

    if not conn.execute("SELECT pg_catalog.to_regclass('pgidgen.shards') IS NOT NULL").fetchone()[0]:  # type: ignore[index]
        return []
    schemas = [r[0] for r in conn.execute("SELECT schema_name FROM pgidgen.shards WHERE state IN ('active', 'moving') ORDER BY shard")]
    movable: dict[str, list[int]] = {}
    stuck: dict[str, list[int]] = {}
    for schema, table, during, unequal, was in keyless_tables(conn, schemas):
        shard = int(schema.rpartition("_")[2])
        if during is not None:
            movable.setdefault(f"{table} ({lacking(was)}: {during} for a move)", []).append(shard)
        else:
            stuck.setdefault(f"{table} (no key, and column {', '.join(unequal)} without equality)", []).append(shard)
    out = []
    if movable:
        out.append(Finding(name, "keyless tables", True, "an online move gives these a replica identity while it publishes them, and"
                           " puts theirs back after: " + "; ".join(f"{t} in shard{'s' if len(v) > 1 else ''} {collapse(v)}" for t, v in movable.items())))
    if stuck:
        out.append(Finding(name, "keyless tables", False, "no replica identity would let an online move replicate updates and deletes of "
                           + "; ".join(f"{t} in shard{'s' if len(v) > 1 else ''} {collapse(v)}" for t, v in stuck.items()),
                           "give each a primary key (or a unique index on NOT NULL columns), or move those shards with --offline", stops="move from"))
    return out


def failures_for_move(source: str, source_facts: Facts, target: str, target_facts: Facts) -> Iterable[Finding]:
    """The failed findings that stop an online move from source to target, source's first."""
    for f in server_findings(source, source_facts):  # (its pg_dump: checked by the move before, as for --offline)
        if not f.ok and f.stops in ("all", "move from") and f.item != "pg_dump":
            yield f
    for f in server_findings(target, target_facts, clients=False):
        if not f.ok and f.stops in ("all", "move to"):
            yield f
