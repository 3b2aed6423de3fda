"""What each PostgreSQL major does differently, in one table (pg_dump's `remoteVersion >= 180000` checks, kept
in one place): the code that cares asks `has(conn_or_version, FEATURE)` instead of comparing versions itself.

pgidgen supports 15, 16, 17 and 18 (pgbin.SUPPORTED); 14 reached its end of life in November 2026.
"""
from __future__ import annotations

from typing import Any

#: The oldest major pgidgen supports (pgbin.SUPPORTED[0]).
OLDEST_SUPPORTED = 15

#: The first major that has each feature.
SINCE: dict[str, int] = {
    # idle_session_timeout exists (pgidgen turns it off in its own sessions)
    "idle_session_timeout": 14,
    # a non-superuser may CREATE SUBSCRIPTION as a member of pg_create_subscription with CREATE on the database
    # (on 15 only a superuser may); its connection string must then carry a password (password_required)
    "pg_create_subscription": 16,
    # transaction_timeout exists: pgidgen turns it off, and pg_dump 17+ prints `SET transaction_timeout = 0`,
    # which an older server rejects
    "transaction_timeout": 17,
    # a logical slot may be a failover slot (CREATE_REPLICATION_SLOT ... (FAILOVER true)): a standby that
    # synchronizes slots (sync_replication_slots) keeps it, so a move survives its source's failover as it stands
    "failover_slots": 17,
    # the MAINTAIN privilege exists, and every owner's default privileges include it
    "maintain_privilege": 17,
    # NOT NULL constraints are pg_constraint rows (contype 'n') besides pg_attribute.attnotnull
    "not_null_constraints": 18,
    # CREATE SUBSCRIPTION wakes the logical replication launcher at once (before, the launcher starts workers at
    # most once per wal_retrieve_retry_interval, 5 s by default)
    "launcher_wakes_on_create": 18,
    # pg_stat_subscription_stats counts the apply worker's conflicts by kind (confl_insert_exists, ...): a move
    # names the unique constraint that stops its subscription instead of waiting for it to fail again
    "subscription_conflict_stats": 18,
}


def major(version: Any) -> int:
    """The major of a server_version_num (150004), a major (15) or a connection."""
    if hasattr(version, "info"):
        version = version.info.server_version
    number = int(version)
    return number // 10000 if number >= 10000 else number


def has(version: Any, feature: str) -> bool:
    return major(version) >= SINCE[feature]
