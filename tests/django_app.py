"""A Django application process for tests/test_integrations.py (Django is configured once per process): it checks
pgidgen.integrations.django on the databases of PGIDGEN_CONFIG, then writes to shard SHARD through run_on_shard
until told (a line on stdin) that the shard has moved, and prints what it wrote as JSON.

Protocol: prints "ready" after 50 writes; on a line from stdin it writes 50 more, stops, prints the JSON result."""
from __future__ import annotations

import json
import sys
from typing import Any

import django
from django.conf import settings

from pgidgen.integrations.django import databases

SHARD = 1  # on db1 of db1/db2, moved to db3 by the test
OTHER = 0  # another shard of db1

settings.configure(
    DATABASES=databases(conn_max_age=60),
    DATABASE_ROUTERS=["pgidgen.integrations.django.ShardRouter"],
    PGIDGEN_SHARDED_APPS=["app"],
    INSTALLED_APPS=[],
    USE_TZ=True,
)
django.setup()

from django.db import DatabaseError, connections, models, transaction  # noqa: E402 - after settings
from movekit import writes_around  # noqa: E402 - beside this file

from pgidgen.errors import RoutingError  # noqa: E402
from pgidgen.integrations.django import ShardRouter, get_router, run_on_shard, shard_atomic  # noqa: E402


class Row(models.Model):
    id = models.BigAutoField(primary_key=True)  # the table's DEFAULT next_id(), read back by RETURNING
    v = models.IntegerField()

    class Meta:
        app_label = "app"
        db_table = "t"
        managed = False


class ShardRow(models.Model):  # not sharded: a table of every database's own
    shard = models.IntegerField(primary_key=True)
    state = models.TextField()

    class Meta:
        app_label = "meta"
        db_table = 'pgidgen"."shards'
        managed = False


def checks() -> None:
    router = get_router()
    assert set(settings.DATABASES) == {"db1", "db2", "db3", "default"}
    # a sharded model outside a shard block: refused, not sent to "default"
    try:
        Row.objects.count()
    except RoutingError as e:
        assert "no shard block is open" in str(e), e
    else:
        raise AssertionError("a query outside a shard block was not refused")
    # nested blocks of two shards of one database: each write lands in its own block's shard
    with shard_atomic(SHARD) as alias:
        with shard_atomic(OTHER):
            inner = Row.objects.create(v=-1)
        outer = Row.objects.create(v=-2)
        assert alias == "db1" and Row.objects.db_manager(hints={"shard": SHARD}).filter(id=outer.id).exists()
    assert (router.shard_of(inner.id), router.shard_of(outer.id)) == (OTHER, SHARD)
    # in a plain transaction.atomic on the same database (ATOMIC_REQUESTS), the block gives the enclosing
    # transaction its search_path back: unqualified SQL after it does not go on in the shard's schema
    with transaction.atomic(using=alias), connections[alias].cursor() as cursor:
        cursor.execute("SELECT pg_catalog.current_setting('search_path')")
        before = cursor.fetchone()[0]
        with shard_atomic(SHARD):
            Row.objects.exists()
        cursor.execute("SELECT pg_catalog.current_setting('search_path')")
        assert cursor.fetchone()[0] == before, "a shard block left its search_path to the enclosing transaction"
    # an instance's ID routes it: saved again in its own shard's block, refused in another shard's
    with shard_atomic(SHARD):
        outer.v = -3
        outer.save()
    with shard_atomic(OTHER):
        try:
            outer.save()
        except RoutingError as e:
            assert "outside a block of shard 1" in str(e), e
        else:
            raise AssertionError("an instance of shard 1 was saved in shard 0's block")
    assert run_on_shard(SHARD, lambda: Row.objects.get(id=outer.id).v, read_only=True) == -3
    assert ShardRouter().allow_migrate("db1", "app") is False and ShardRouter().allow_migrate("db1", "auth") is None
    assert ShardRouter().allow_relation(outer, inner) is False and ShardRouter().allow_relation(outer, outer) is True
    # an unsharded query's server-side cursor (iterator() outside a transaction: WITH HOLD) read in two transactions,
    # while another client holds the server connection of the first (through a transaction pooler: PgBouncer's LIFO)
    rows = ShardRow.objects.using("default").order_by("shard").iterator(chunk_size=1)
    first = next(rows).shard
    with shard_atomic(SHARD):
        Row.objects.exists()
        assert [first, *(r.shard for r in rows)] == [0, 1]
    # a write in a read_only block (claimed without the lock, which holds a move's flip off): refused, as Router's
    try:
        with shard_atomic(SHARD, read_only=True):
            Row.objects.create(v=-4)
    except DatabaseError as e:
        assert "read-only transaction" in str(e), e
    else:
        raise AssertionError("a write in a read_only block was let through")
    # nested in a writable transaction, which must stay writable after it: the block claims with the lock
    with shard_atomic(OTHER) as alias, shard_atomic(SHARD, read_only=True), connections[alias].cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_catalog.pg_locks WHERE locktype = 'advisory' AND pid = pg_catalog.pg_backend_pid()"
                       " AND classid = 1885825380 AND objid::bigint = 4294967296 - 1073741824 - %s", [SHARD])
        assert cursor.fetchone() == (1,), "a read_only block in a writable transaction claimed without the lock"
    with shard_atomic(SHARD):  # a read_only block nested in a write block leaves the outer one writable
        with shard_atomic(OTHER, read_only=True):
            Row.objects.filter(id=inner.id).exists()
        Row.objects.filter(id=outer.id).update(v=-3)
    # a statement's error caught in the work: the transaction is aborted, so the block raises rather than let
    # Django's atomic roll it back without a word (the row reported as written)
    for failing in ("raw", "orm"):
        def caught() -> int:
            row = Row.objects.create(v=-6)
            try:
                if failing == "raw":  # noqa: B023 - run within this iteration
                    with connections[get_router().database_for(SHARD)].cursor() as cursor:
                        cursor.execute("SELECT 1 / 0")
                else:
                    Row.objects.create(id=row.id, v=-7)  # a duplicate key
            except DatabaseError:
                pass
            return row.id
        try:
            run_on_shard(SHARD, caught)
        except RoutingError as e:
            assert "so nothing of it was committed" in str(e), e
        else:
            raise AssertionError(f"a block whose transaction was aborted ({failing}) returned as if it committed")
    assert not run_on_shard(SHARD, lambda: Row.objects.filter(v=-6).exists(), read_only=True)
    with shard_atomic(OTHER):
        Row.objects.filter(id=inner.id).delete()
    with shard_atomic(SHARD):
        Row.objects.filter(id=outer.id).delete()


def main() -> None:
    checks()

    def moved_meanwhile() -> None:  # the test moves the shard between "ready" and the line it sends back
        print("ready", flush=True)
        sys.stdin.readline()

    ids, errors, _ = writes_around(lambda n: run_on_shard(SHARD, lambda: Row.objects.create(v=n).id), moved_meanwhile,
                                   finish=connections.close_all)
    result: dict[str, Any] = {"ids": ids, "errors": [f"{type(e).__name__}: {e}" for e in errors],
                              "database": get_router().database_for(SHARD)}
    get_router().close()
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
