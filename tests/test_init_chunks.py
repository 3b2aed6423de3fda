"""init sizes its transactions from the server's lock table: one per database when the shards fit, otherwise
chunks of whole shards, each committed, so init killed halfway and run again completes with no shard half-made and
a catalog that never lists a shard that is not whole. Its locks (the catalog's, the tables a replayed DDL file
references) are taken under a short lock_timeout, retried, and given up at --lock-wait naming the holder. On a real
server with a small lock table (max_locks_per_transaction 10, max_connections 20)."""
from __future__ import annotations

import json
import signal
import threading
import time
from pathlib import Path

import psycopg
import pytest
from moveshards import ended, pgidgen
from test_ddl_locks import cli, one_db, small_locks  # noqa: F401 (fixtures)

from pgidgen.config import Config
from pgidgen.init import init, offline_plan, render_init
from pgidgen.lockwait import LockPolicy

SHARDS = 600  # one transaction of them runs out of shared memory on that server


def seen(config: Config) -> tuple[set[int], set[int], set[int]]:
    """(shards the catalog lists, shard schemas, shard schemas whole: both sequences and next_id()), as one snapshot."""
    with psycopg.connect(config.databases["a"]) as conn:  # one snapshot for both reads (repeatable read)
        conn.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
        if conn.execute("SELECT to_regclass('pgidgen.shards') IS NULL").fetchone() == (True,):
            listed: set[int] = set()
        else:
            listed = {int(r[0]) for r in conn.execute("SELECT shard FROM pgidgen.shards")}
        schemas: set[int] = set()
        whole: set[int] = set()
        for name, ok in conn.execute(
            "SELECT n.nspname,"
            " (SELECT count(*) FROM pg_class c WHERE c.relnamespace = n.oid AND c.relkind = 'S' AND c.relname IN ('pgidgen_counter', 'pgidgen_offset')) = 2"
            " AND EXISTS (SELECT 1 FROM pg_proc p WHERE p.pronamespace = n.oid AND p.proname = 'next_id')"
            " FROM pg_namespace n WHERE n.nspname ~ '^shard_[0-9]+$'"):
            schemas.add(int(name[6:]))
            if ok:
                whole.add(int(name[6:]))
    return listed, schemas, whole


def makes_ids(config: Config, shards: range) -> None:
    with psycopg.connect(config.databases["a"], autocommit=True) as conn:
        ids = conn.execute("SELECT " + ", ".join(f"shard_{s}.next_id()" for s in shards)).fetchone()
    assert ids is not None
    assert [config.layout.decode(i)[1] for i in ids] == list(shards)


def test_more_shards_than_one_transaction_holds_are_made_in_chunks(one_db: tuple[Config, Path]) -> None:
    config, config_file = one_db
    with psycopg.connect(config.databases["a"]) as conn, pytest.raises(psycopg.errors.OutOfMemory):
        conn.execute(render_init(offline_plan(config, SHARDS, ["a"]))["a"].encode())  # what one transaction does here
    assert seen(config) == (set(), set(), set())
    res = cli(config_file, "init", "--shards", str(SHARDS), "--json")
    assert res.exit_code == 0, res.output
    (out,) = json.loads(res.output)
    assert out["created"] == SHARDS and out["transactions"] > 1
    assert out["summary"] == f"catalog installed, created {SHARDS} shards (0-{SHARDS - 1}), in {out['transactions']} transactions"
    assert seen(config) == (set(range(SHARDS)),) * 3
    makes_ids(config, range(0, SHARDS, 97))
    again = cli(config_file, "init", "--shards", str(SHARDS))
    assert again.exit_code == 0 and again.output.endswith("nothing to do: every shard already exists\n"), again.output


def test_the_plan_a_terminal_is_told(one_db: tuple[Config, Path]) -> None:
    config, _ = one_db
    plans: list[object] = []
    init(config, SHARDS, on_plan=plans.append)
    sizing = plans[0].sizing["a"]  # type: ignore[attr-defined]
    assert sizing.chunked and sizing.first < sizing.per_tx  # the catalog's locks are left out of the first
    assert sizing.describe("a") == (
        f"a: {SHARDS} shards in {sizing.transactions} transactions of up to {sizing.per_tx}: ~{sizing.locks_per_shard} locks per shard"
        " and the server's lock table holds 200 (max_locks_per_transaction x connections); each commits whole shards with their"
        " catalog rows, so init run again creates only the missing ones")


def test_a_few_shards_stay_one_transaction(config: Config) -> None:
    """On servers of ordinary settings (conftest's), each database's shards and catalog in one transaction."""
    outcome, *_ = init(config, 6)
    assert (outcome.summary, outcome.details) == ("catalog installed, created 2 shards (0-1)", {"created": 2, "transactions": 1})


def test_init_killed_between_chunks_resumes_and_no_shard_is_half_made(one_db: tuple[Config, Path]) -> None:
    config, config_file = one_db
    proc = pgidgen(config_file, "init", "--shards", str(SHARDS))
    observed: list[int] = []
    try:
        while proc.poll() is None:
            listed, schemas, whole = seen(config)
            assert listed == schemas == whole  # at every moment: the catalog lists exactly the shards there are, all whole
            observed.append(len(listed))
            if listed:
                proc.send_signal(signal.SIGKILL)
                break
            time.sleep(0.02)
    finally:
        ended(proc)
    assert proc.returncode == -signal.SIGKILL
    time.sleep(0.2)  # the killed client's backend rolls its transaction back
    listed, schemas, whole = seen(config)
    assert listed == schemas == whole == set(range(len(listed)))
    assert 0 < len(listed) < SHARDS
    res = cli(config_file, "init", "--shards", str(SHARDS))
    assert res.exit_code == 0, res.output
    assert res.output.startswith(f"a: created {SHARDS - len(listed)} shards ({len(listed)}-{SHARDS - 1}), in "), res.output
    assert seen(config) == (set(range(SHARDS)),) * 3
    makes_ids(config, range(0, SHARDS, 53))


NOTES = "CREATE TABLE notes (id bigint PRIMARY KEY DEFAULT next_id(), account bigint REFERENCES public.accounts (id));\n"


def test_the_replay_waits_for_a_lock_names_the_holder_and_gives_up(one_db: tuple[Config, Path], tmp_path: Path) -> None:
    """A replayed file's foreign key locks public.accounts, which an application's open transaction writes to:
    init waits under a short lock_timeout, says who holds it, gives up at --lock-wait with exit 1, and completes
    once the holder is gone."""
    config, config_file = one_db
    init(config, 2)
    dsn = config.databases["a"]
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE public.accounts (id bigint PRIMARY KEY)")
    ddl = tmp_path / "notes.sql"
    ddl.write_text(NOTES)
    assert cli(config_file, "apply-ddl", str(ddl)).exit_code == 0
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("DROP SCHEMA shard_1 CASCADE")
        conn.execute("DELETE FROM pgidgen.ddl_ledger WHERE shard = 1")
        conn.execute("DELETE FROM pgidgen.shards WHERE shard = 1")
    with psycopg.connect(dsn, application_name="billing") as app:
        app.execute("INSERT INTO public.accounts VALUES (1)")  # its transaction stays open
        pid = app.info.backend_pid
        res = cli(config_file, "init", "--shards", "2", "--lock-timeout", "50ms", "--lock-wait", "1s")
        assert res.exit_code == 1, res.output
        assert f"a: shard_1 waits for a lock held by pid {pid} (billing), transaction open " in res.output
        assert f"gave up after 1 s waiting for a lock held by pid {pid} (billing), transaction open " in res.output
        assert "INSERT INTO public.accounts VALUES (1) (a, shard 1): end or wait for that transaction" in res.output, res.output
        assert seen(config)[0] == {0}  # nothing of shard 1 committed
        waits: list[float] = []
        done: list[object] = []
        worker = threading.Thread(target=lambda: done.append(init(config, 2, lock_policy=LockPolicy(lock_timeout=0.05, wait=60),
                                                                  on_lock_wait=lambda *a: waits.append(a[3]))))
        worker.start()
        while not waits:
            time.sleep(0.01)
        app.commit()  # the holder ends: the next try gets the lock
        worker.join()
    (outcome,) = done[0]  # type: ignore[misc]
    assert outcome.summary == "created 1 shards (1), replayed 1 sharded DDL files on them"
    assert seen(config) == ({0, 1},) * 3
    with psycopg.connect(dsn, autocommit=True) as conn:
        assert conn.execute("SELECT count(*) FROM pg_class WHERE relname = 'notes'").fetchone() == (2,)
