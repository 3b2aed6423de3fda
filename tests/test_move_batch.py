"""Batch moves: a set of shards with one slot, publication, subscription, copy, catch-up and one cutover; crashes
at every step then rollback and resume of the whole batch; batches cut smaller when their pause would not fit."""
from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest
from click.testing import CliRunner
from movekit import Writer, leftovers
from moveshards import POINTS, Crash, crash_at, open_moves, quick_subscription_start, rows_of, setup_shards, start_cli, state_of, wait_stopped  # noqa: F401 (an autouse fixture)

from pgidgen.cli import main
from pgidgen.config import Config
from pgidgen.idgen import LOCK_CLASS
from pgidgen.init import init
from pgidgen.move import MoveError, MoveOptions, batches, move_shards, resume_move, rollback_move, verify_move
from pgidgen.move.journal import ONLINE_STEPS, POINT_OF_NO_RETURN, move_lock_key
from pgidgen.move.rebalance import rebalance
from pgidgen.shardmap import read_map

BATCH = [0, 1, 2, 3]  # setup_shards: db1 holds 0-3 with tables


def replication_objects_made(dsn: str) -> int:
    """Moves journaled on the source: one per batch."""
    with psycopg.connect(dsn, autocommit=True) as c:
        return int(c.execute("SELECT count(*) FROM pgidgen.moves").fetchone()[0])


def test_a_batch_moves_under_writers_on_several_of_its_shards(config: Config) -> None:
    setup_shards(config)
    before = {s: rows_of(config.dsn("db1"), f"shard_{s}") for s in BATCH}
    writers = {s: Writer(config.databases, s) for s in (0, 1, 3)}
    for w in writers.values():
        w.start()
    time.sleep(0.3)
    counts = {s: len(w.ids) for s, w in writers.items()}
    reports = move_shards(config, BATCH, "db3")
    at = {s: len(w.ids) for s, w in writers.items()}
    time.sleep(0.3)
    for w in writers.values():
        w.stop()
    assert len(reports) == 1, "four small shards are one batch"
    report = reports[0]
    assert report.shards == BATCH and report.status == "done" and report.pause_ms is not None
    assert report.verification is not None and report.verification.ok
    assert {t.table for t in report.verification.tables} == {f"shard_{s}.{t}" for s in BATCH for t in ("t", "tags")}
    assert replication_objects_made(config.dsn("db1")) == 1
    for s, w in writers.items():
        assert counts[s] > 0 and len(w.ids) > at[s], f"the writer of shard {s} kept writing before and after the move"
        ids = w.ids
        assert len(set(ids)) == len(ids), f"shard {s}: an ID acknowledged twice"
        assert ids == sorted(ids), f"shard {s}: IDs after the move are greater than those before"
        target_ids = [r[0] for r in rows_of(config.dsn("db3"), f"shard_{s}")]
        assert len(target_ids) == len(before[s]) + len(ids), f"shard {s}: rows lost or duplicated"
        assert set(target_ids) == {r[0] for r in before[s]} | set(ids)
        assert not w.errors or all("db1" in e for e in w.errors)
    assert verify_move(config, 2).ok  # --verify finds a batch's shard (no writer on it) by its journal
    m = read_map(config)
    assert m.ok and set(BATCH) <= set(m.databases["db3"]) and not set(BATCH) & set(m.databases.get("db1", []))
    for s in BATCH:
        assert state_of(config.dsn("db3"), s) == ("active", f"shard_{s}")
        assert state_of(config.dsn("db1"), s) == ("retired", report.retired_schemas[s])
        with psycopg.connect(config.dsn("db3"), autocommit=True) as c:  # each shard's own sequence came along
            assert c.execute(f"INSERT INTO shard_{s}.tags (tag) VALUES ('new') RETURNING n").fetchone()[0] == 11
    with psycopg.connect(config.dsn("db1"), autocommit=True) as c:
        with pytest.raises(psycopg.errors.ReadOnlySqlTransaction, match="moved to database db3"):
            c.execute(f"INSERT INTO {report.retired_schemas[2]}.t (v) VALUES (1)")
    assert leftovers(config.databases) == []
    assert open_moves(config.dsn("db1")) == 0
    # the shard after it in db1's map was not part of the batch: still there
    assert state_of(config.dsn("db2"), 4) == ("active", "shard_4")


def test_a_batch_one_of_whose_shards_another_mover_holds_is_refused_by_that_shard(config: Config) -> None:
    """The batch's shards are locked in one statement: the one held elsewhere is named, nothing is journaled,
    and the locks taken on the others are let go (the same batch moves once the holder is gone)."""
    setup_shards(config, rows=5)
    with psycopg.connect(config.dsn("db1"), autocommit=True) as holder:
        assert holder.execute("SELECT pg_try_advisory_lock(%s, %s)", (LOCK_CLASS, move_lock_key(2))).fetchone()[0]
        with pytest.raises(MoveError, match=r"shard 2 is being moved right now by another pgidgen"):
            move_shards(config, BATCH, "db3")
        assert open_moves(config.dsn("db1")) == 0
        held = holder.execute("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND classid = %s::bigint::oid AND pid <> pg_backend_pid()",
                              (LOCK_CLASS,)).fetchone()[0]
        assert held == 0
    reports = move_shards(config, BATCH, "db3")
    assert [s for r in reports for s in r.shards] == BATCH


@pytest.mark.parametrize("point", POINTS)
def test_a_batch_crashed_at_every_step_rolls_back_and_resumes(config: Config, point: str) -> None:
    setup_shards(config, rows=50)
    source = {s: rows_of(config.dsn("db1"), f"shard_{s}") for s in BATCH}
    with pytest.raises(Crash):
        move_shards(config, BATCH, "db3", hook=crash_at(point))
    assert open_moves(config.dsn("db1")) == 1
    with pytest.raises(MoveError, match="an interrupted move of shard 2 to db3 exists"):
        move_shards(config, [2], "db2")  # a member of the open batch is refused on its own too
    past_flip = ONLINE_STEPS.index(point.split(":")[0]) > ONLINE_STEPS.index(POINT_OF_NO_RETURN)
    if not past_flip:
        report = rollback_move(config, 3)  # any shard of the batch names it
        assert report.status == "rolled_back" and report.shards == BATCH
        for s in BATCH:
            assert state_of(config.dsn("db1"), s) == ("active", f"shard_{s}")
            assert state_of(config.dsn("db3"), s) is None
            assert rows_of(config.dsn("db1"), f"shard_{s}") == source[s]
        assert leftovers(config.databases) == []
        with psycopg.connect(config.dsn("db3"), autocommit=True) as c:
            assert c.execute("SELECT count(*) FROM pg_namespace WHERE nspname LIKE 'shard_%'").fetchone()[0] == 0
        with pytest.raises(Crash):
            move_shards(config, BATCH, "db3", hook=crash_at(point))
    else:
        with pytest.raises(MoveError, match="past its flip"):
            rollback_move(config, 0)
    report = resume_move(config, 1)
    assert report.status == "done" and report.shards == BATCH
    assert report.verification is not None and report.verification.ok
    for s in BATCH:
        assert rows_of(config.dsn("db3"), f"shard_{s}") == source[s]
        assert state_of(config.dsn("db3"), s) == ("active", f"shard_{s}")
        assert state_of(config.dsn("db1"), s)[0] == "retired"  # type: ignore[index]
        with psycopg.connect(config.dsn("db3"), autocommit=True) as c:
            assert c.execute(f"INSERT INTO shard_{s}.t (v) VALUES (0) RETURNING id").fetchone()[0] > source[s][-1][0]
    assert leftovers(config.databases) == []
    assert open_moves(config.dsn("db1")) == 0
    assert read_map(config).ok


def test_kill9_of_a_batch_while_frozen_then_resume_by_another_of_its_shards(config: Config, config_file: Path) -> None:
    setup_shards(config, rows=50)
    proc = start_cli(config_file, "0-3", "db3", stop_at="cutover:frozen")
    try:
        wait_stopped(proc)
        proc.kill()
        proc.wait()
    finally:
        if proc.poll() is None:
            proc.kill()
    moving = read_map(config).as_dict()["moving"]
    assert [(m["shard"], m["from"], m["to"]) for m in moving] == [(s, "db1", "db3") for s in BATCH]  # map names every shard of the batch
    r = CliRunner().invoke(main, ["--config", str(config_file), "move-shard", "2", "--resume"])
    assert r.exit_code == 0, r.output
    assert "moved shards 0-3 from db1 to db3" in r.output
    assert all(state_of(config.dsn("db3"), s) == ("active", f"shard_{s}") for s in BATCH)
    assert leftovers(config.databases) == []


def test_a_batch_whose_estimated_pause_exceeds_max_pause_is_cut(config: Config, monkeypatch: pytest.MonkeyPatch) -> None:
    setup_shards(config, rows=20)
    # each shard's cutover estimated at about 150 ms: 0.4 of --max-pause 1s holds two
    monkeypatch.setattr(batches, "PAUSE_PER_SHARD_S", 0.15)
    done: list[list[int]] = []
    reports = move_shards(config, BATCH, "db3", options=MoveOptions(max_pause=1.0), on_batch=lambda r: done.append(r.shards))
    assert [r.shards for r in reports] == [[0, 1], [2, 3]] == done
    assert all(r.status == "done" and r.verification is not None and r.verification.ok for r in reports)
    assert replication_objects_made(config.dsn("db1")) == 2
    assert all(state_of(config.dsn("db3"), s) == ("active", f"shard_{s}") for s in BATCH)
    assert leftovers(config.databases) == []


def test_a_batch_whose_cutover_does_not_fit_is_moved_as_halves(config: Config) -> None:
    """Shard 3's table is locked by a long transaction: the batch's freeze cannot get it within --max-pause, so
    the batch is rolled back and moved as halves; the half without shard 3 moves, shard 3 alone fails and stays
    resumable, served by its source."""
    setup_shards(config, rows=20)
    with psycopg.connect(config.dsn("db1")) as blocker:
        blocker.execute("LOCK TABLE shard_3.tags IN ROW EXCLUSIVE MODE")
        done: list[list[int]] = []
        with pytest.raises(MoveError, match="shard 3 did not move"):
            move_shards(config, BATCH, "db3", options=MoveOptions(max_pause=1.0, attempts=1), on_batch=lambda r: done.append(r.shards))
        blocker.rollback()
    assert done == [[0, 1], [2]]
    assert all(state_of(config.dsn("db3"), s) == ("active", f"shard_{s}") for s in (0, 1, 2))
    assert state_of(config.dsn("db1"), 3) == ("moving", "shard_3")
    report = resume_move(config, 3)
    assert report.status == "done" and report.shards == [3]
    assert leftovers(config.databases) == []
    assert read_map(config).ok


def test_rebalance_moves_a_pair_in_one_batch(config: Config) -> None:
    setup_shards(config, rows=20)
    result = rebalance(config, ["db1", "db3"], parallel=1)
    assert result.ok and [r.shards for r in result.reports] == [[2, 3]]
    assert {n: sorted(s) for n, s in read_map(config).databases.items() if n != "db2"} == {"db1": [0, 1], "db3": [2, 3]}
    assert leftovers(config.databases) == []


def test_an_interrupted_rebalance_continues_where_it_stopped(config: Config, monkeypatch: pytest.MonkeyPatch) -> None:
    """A rebalance that dies in its second batch's pause leaves that batch's move journaled; the next rebalance
    finishes it from its journal before planning, and then finds nothing left to do."""
    setup_shards(config, rows=20)
    monkeypatch.setattr(batches, "PAUSE_PER_SHARD_S", 0.3)  # one shard per batch under --max-pause 1s
    seen: list[str] = []

    def second_pause(point: str) -> None:
        seen.append(point)
        if point == "cutover:frozen" and seen.count(point) == 2:
            raise Crash(point)

    with pytest.raises(Crash):
        rebalance(config, ["db1", "db3"], parallel=1, hook=second_pause)
    assert state_of(config.dsn("db3"), 2) == ("active", "shard_2")
    assert state_of(config.dsn("db1"), 3) == ("moving", "shard_3") and open_moves(config.dsn("db1")) == 1
    result = rebalance(config, ["db1", "db3"], parallel=1)
    assert result.ok and [r.shards for r in result.reports] == [[3]] and not result.plan.moves
    assert "resumed move" in " ".join(result.reports[0].notes)
    assert {n: sorted(s) for n, s in read_map(config).databases.items() if n != "db2"} == {"db1": [0, 1], "db3": [2, 3]}
    assert open_moves(config.dsn("db1")) == 0 and leftovers(config.databases) == []


def test_a_batch_is_checked_as_a_whole_before_anything_is_journaled(config: Config) -> None:
    setup_shards(config, rows=10)
    with psycopg.connect(config.dsn("db1"), autocommit=True) as c:
        c.execute("CREATE VIEW public.recent AS SELECT * FROM shard_2.t")
    with pytest.raises(MoveError, match=r"objects outside the schemas of shards 0-3 on db1 depend on them and cannot move with them: view public.recent"):
        move_shards(config, BATCH, "db3")
    with psycopg.connect(config.dsn("db1"), autocommit=True) as c:
        assert c.execute("SELECT count(*) FROM pgidgen.moves").fetchone()[0] == 0
        c.execute("DROP VIEW public.recent")
        c.execute("CREATE ROLE batch_reader_x")
        c.execute("GRANT SELECT ON shard_3.tags TO batch_reader_x")
    try:
        with pytest.raises(MoveError, match="role batch_reader_x of the schemas of shards 0-3 .* does not exist on db3"):
            move_shards(config, BATCH, "db3")
    finally:
        with psycopg.connect(config.dsn("db1"), autocommit=True) as c:
            c.execute("REVOKE ALL ON shard_3.tags FROM batch_reader_x")
            c.execute("DROP ROLE batch_reader_x")
    assert open_moves(config.dsn("db1")) == 0 and leftovers(config.databases) == []
    assert all(state_of(config.dsn("db1"), s) == ("active", f"shard_{s}") for s in BATCH)


def test_a_batch_keeps_each_shards_grants_whatever_the_targets_default_privileges(config: Config) -> None:
    setup_shards(config, rows=10)
    with psycopg.connect(config.dsn("db1"), autocommit=True) as c:
        c.execute("GRANT SELECT ON shard_1.t TO PUBLIC")
    with psycopg.connect(config.dsn("db3"), autocommit=True) as c:
        c.execute("ALTER DEFAULT PRIVILEGES GRANT INSERT ON TABLES TO PUBLIC")
    try:
        [report] = move_shards(config, BATCH, "db3")
        assert report.verification is not None and report.verification.ok
        with psycopg.connect(config.dsn("db3"), autocommit=True) as c:
            def public(table: str) -> list[str]:
                return [r[0] for r in c.execute(
                    "SELECT privilege_type FROM pg_class, aclexplode(relacl) WHERE oid = %s::regclass AND grantee = 0 ORDER BY 1", (table,))]
            assert public("shard_1.t") == ["SELECT"]
            assert public("shard_2.t") == [] and public("shard_0.tags") == []
    finally:
        with psycopg.connect(config.dsn("db3"), autocommit=True) as c:
            c.execute("ALTER DEFAULT PRIVILEGES REVOKE INSERT ON TABLES FROM PUBLIC")


def test_a_batch_carries_each_shards_ddl_ledger(config: Config, config_file: Path, tmp_path: Path) -> None:
    assert all(o.ok for o in init(config, 8, ["db1", "db2"]))
    schema = tmp_path / "schema.sql"
    schema.write_text("CREATE TABLE photos (id bigint PRIMARY KEY DEFAULT next_id(), caption text);\n", encoding="utf-8")
    runner = CliRunner()
    res = runner.invoke(main, ["--config", str(config_file), "apply-ddl", str(schema)])
    assert res.exit_code == 0, res.output
    with psycopg.connect(config.dsn("db1"), autocommit=True) as c:
        ledger = c.execute("SELECT shard, position, sha256, applied_at FROM pgidgen.ddl_ledger WHERE shard = ANY(%s) ORDER BY 1, 2", (BATCH,)).fetchall()
    assert [r[0] for r in ledger] == BATCH
    [report] = move_shards(config, BATCH, "db3")
    assert report.verification is not None and report.verification.ok
    with psycopg.connect(config.dsn("db3"), autocommit=True) as c:
        assert c.execute("SELECT shard, position, sha256, applied_at FROM pgidgen.ddl_ledger ORDER BY 1, 2").fetchall() == ledger
    res = runner.invoke(main, ["--config", str(config_file), "apply-ddl", str(schema)])
    assert res.exit_code == 0 and "db3: up to date" in res.output, res.output


def test_dry_run_of_a_set_prints_its_batches_and_changes_nothing(config: Config, config_file: Path) -> None:
    setup_shards(config, rows=10)
    runner = CliRunner()
    res = runner.invoke(main, ["--config", str(config_file), "move-shard", "0-3", "db3", "--dry-run"])
    assert res.exit_code == 0, res.output
    lines = res.output.splitlines()
    assert lines[0].startswith("-- 4 shards in 1 batch, each with one slot, publication, subscription, copy and cutover")
    assert lines[1].startswith("-- shards 0-3 (4): db1 -> db3, estimated write pause ")
    # offline: no replication objects, and the pause is the whole copy, not a cutover's estimate
    res = runner.invoke(main, ["--config", str(config_file), "move-shard", "0-3", "db3", "--offline", "--dry-run"])
    assert res.exit_code == 0, res.output
    lines = res.output.splitlines()
    assert lines[0].startswith("-- 4 shards in 1 batch, each with one copy, its shards' writes paused throughout"), lines
    assert lines[1].startswith("-- shards 0-3 (4): db1 -> db3, writes to them paused for the whole copy, about "), lines
    for extra, pause in (((), int), (("--offline",), type(None))):  # --json: the batches as JSON, not the lines
        res = runner.invoke(main, ["--config", str(config_file), "move-shard", "0-3", "db3", "--dry-run", "--json", *extra])
        assert res.exit_code == 0, res.output
        plan = json.loads(res.output)
        assert (plan["shards"], plan["target"], plan["mode"]) == ("0-3", "db3", "offline" if extra else "online")
        [batch] = plan["batches"]
        assert (batch["shards"], batch["count"], batch["source"]) == ("0-3", 4, "db1") and isinstance(batch["estimated_pause_ms"], pause)
    assert leftovers(config.databases) == [] and replication_objects_made(config.dsn("db1")) == 0
    res = runner.invoke(main, ["--config", str(config_file), "move-shard", "0-3", "--resume"])
    assert res.exit_code == 1 and "Error: --resume takes one shard, not 0-3" in res.output, res.output
    res = runner.invoke(main, ["--config", str(config_file), "move-shard", "2-5", "db3"])
    assert res.exit_code == 1 and "the shards of one move must be in one database: 2, 3 in db1; 4, 5 in db2" in res.output, res.output
    assert replication_objects_made(config.dsn("db1")) == 0


def test_a_malformed_set_of_shards_is_refused(config: Config, config_file: Path) -> None:
    """'2-' (a range cut short, e.g. by an empty shell variable) moved shard 2 alone, '1-²' ended in a traceback,
    and '1,,2' moved shards 1 and 2 (found by reviews): all are refused, nothing moves."""
    setup_shards(config, rows=10)
    runner = CliRunner()
    for text in ("2-", "1-²", "²"):
        res = runner.invoke(main, ["--config", str(config_file), "move-shard", text, "db3"])
        assert res.exit_code == 1 and isinstance(res.exception, SystemExit), (text, res.output, res.exception)
        assert f"Error: {text!r} is not a shard number or range" in res.output, (text, res.output)
    for text in ("1,,2", "1,2,", ",3"):  # a shard left out (moved the others, found by a review)
        res = runner.invoke(main, ["--config", str(config_file), "move-shard", text, "db3"])
        assert (res.exit_code, res.output) == (1, f"Error: {text!r} has an empty item between its commas: write shards like 0-99,120,"
                                                  " a number or range between each two commas\n"), text
    # a typo naming ten billion shards is refused before the list is built (it filled memory first)
    res = runner.invoke(main, ["--config", str(config_file), "move-shard", "0-9999999999", "db3"])
    assert res.exit_code == 1 and "'0-9999999999' names more than 1048576 shards" in res.output, res.output
    assert state_of(config.dsn("db1"), 2) == ("active", "shard_2") and state_of(config.dsn("db3"), 2) is None
    assert leftovers(config.databases) == [] and replication_objects_made(config.dsn("db1")) == 0


def test_a_batch_counts_a_lock_for_every_relation_its_copy_holds(config: Config) -> None:
    """A batch is cut to stay within a share of the lock table: the transaction that creates a shard's copy holds a
    lock on each of its relations, TOAST tables and their indexes too (a table with a text column has both; they
    were not counted, and a batch could take some 40% more locks than planned). Counted here against what a
    transaction dropping the schema actually holds (it locks each relation it drops, as the creating one does)."""
    from pgidgen.move import plan_shards

    setup_shards(config, rows=10)
    [batch] = plan_shards(config, [0, 1], "db3")
    cost = {c.shard: c for c in batch.costs}[0]
    with psycopg.connect(config.dsn("db1")) as c:
        c.execute("DROP SCHEMA shard_0 CASCADE")
        held = c.execute(
            "SELECT count(*) FROM pg_locks WHERE pid = pg_backend_pid() AND locktype = 'relation'"
            " AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
            " AND relation NOT IN (SELECT oid FROM pg_class WHERE relnamespace = 'pg_catalog'::regnamespace)").fetchone()[0]  # type: ignore[index]
        c.rollback()
    assert cost.relations == held, (cost, held)


def test_the_dry_runs_forecast_follows_the_pacer() -> None:
    """rebalance --dry-run forecasts a run's batches with the run's own pacer: at the estimate, the first cut;
    with every pause at half the estimate or less, each batch up to twice the last (what a newcomer's run did:
    10, 21, 42, 85, 171 shards of two tables, against 68 batches of 10 planned)."""
    from pgidgen.move.batches import Pacer, ShardCost

    costs = [ShardCost(i, 2, 8) for i in range(680)]
    pacer = Pacer(1.0, 100_000)
    assert [len(b) for b in pacer.run_through(costs)] == [116] * 5 + [100]  # 3 ms a shard of two tables
    assert [len(b) for b in pacer.run_through(costs, ratio=0.5)] == [116, 233, 331]
    assert pacer.scale == 1.0  # the forecast leaves the pacer as it was
    assert [len(b) for b in Pacer(None, 100_000).run_through(costs, ratio=0.1)] == [680]  # offline: by locks only


def test_batches_cut_down_to_one_shard_grow_again_when_pauses_allow() -> None:
    """An outlier's pause can cut a move's batches down to one shard; the pauses of one-shard batches must count,
    or the move goes on one shard a batch to its end (a rebalance of 8192 shards did, for 39 minutes)."""
    from pgidgen.move.batches import Pacer, ShardCost

    costs = [ShardCost(i, 2, 8) for i in range(400)]
    pacer = Pacer(1.0, 100_000)
    pacer.scale = 200.0  # after outliers: one shard a batch
    sizes = []
    while costs:
        batch = pacer.cut(costs, {c.shard: None for c in costs})[0]  # type: ignore[misc]
        sizes.append(len(batch.costs))
        costs = costs[len(batch.costs):]
        pacer.measured(batch, 0.06 + 0.01 * len(batch.costs))  # the pauses: 10 ms a shard
    assert sizes[0] == 1 and max(sizes) >= 30, sizes  # as many as 10 ms a shard fits in 0.4 s


def test_a_set_move_that_fails_after_some_batches_reports_them_and_the_rest(config: Config, config_file: Path) -> None:
    """The command line prints the batches that moved before the error, and the error says what moved and what
    moves the rest (it said only the failing batch's error, so the moved shards looked unmoved)."""
    setup_shards(config, rows=20)
    with psycopg.connect(config.dsn("db1")) as blocker:
        blocker.execute("LOCK TABLE shard_3.tags IN ROW EXCLUSIVE MODE")
        res = CliRunner().invoke(main, ["--config", str(config_file), "move-shard", "0-3", "db3", "--max-pause", "300ms"])
        blocker.rollback()
    assert res.exit_code == 1, res.output
    assert "moved shards 0-1 from db1 to db3" in res.output and "moved shard 2 from db1 to db3" in res.output, res.output
    last = res.output.strip().splitlines()[-1]
    assert last.startswith("Error: shard 3 did not move") and ", after 3 shards moved to db3 (0-2)" in last, last
    assert last.endswith("; shard 3 did not move ('pgidgen map' shows where each is)"), last
    assert resume_move(config, 3).status == "done"
    assert leftovers(config.databases) == []


def test_a_batch_is_checksummed_in_few_statements_and_a_table_that_cannot_falls_back(config: Config, monkeypatch: pytest.MonkeyPatch) -> None:
    """compare_many checksums a batch's tables TABLES_PER_STATEMENT at a time in one statement each; a run with a
    table the native form does not fit on one side (a column missing on the target) goes shard by shard in the
    forms checksums() picks. Differences are found in either path, and only where they are."""
    from pgidgen.move import verify

    monkeypatch.setattr(verify, "TABLES_PER_STATEMENT", 4)  # 6 shards of 2 tables: runs of two shards
    ddl = "".join(f"CREATE SCHEMA s{i}; CREATE TABLE s{i}.a (id bigint PRIMARY KEY, v text, d date); CREATE TABLE s{i}.b (k int, doc json);"
                  f" INSERT INTO s{i}.a SELECT g, md5(g::text), date '2026-01-01' + g FROM generate_series(1, 30) g;"
                  f" INSERT INTO s{i}.b SELECT g, json_build_object('g', g) FROM generate_series(1, 5) g;" for i in range(6))
    src, tgt = psycopg.connect(config.dsn("db1"), autocommit=True), psycopg.connect(config.dsn("db2"), autocommit=True)
    with src, tgt:
        src.execute(ddl)
        tgt.execute(ddl)
        tgt.execute("UPDATE s1.a SET v = 'x' WHERE id = 7")  # a run checksummed in one statement
        tgt.execute("ALTER TABLE s4.b DROP COLUMN doc")  # its run falls back; s5 in it differs too
        tgt.execute("DELETE FROM s5.a WHERE id = 3")
        statements: list[str] = []
        real = verify._native_in_one

        def counted(conn: psycopg.Connection[Any], items: Any) -> Any:
            statements.append(conn.info.dsn)
            return real(conn, items)

        monkeypatch.setattr(verify, "_native_in_one", counted)
        v = verify.compare_many(src, tgt, [(f"s{i}", f"s{i}", ["a", "b"]) for i in range(6)])
    assert len(statements) == 6  # three runs a side
    assert sorted(t.table for t in v.mismatches()) == ["s1.a", "s4.b", "s5.a"]
    assert {t.table: t.source_rows for t in v.tables}["s5.a"] == 30 and {t.table: t.target_rows for t in v.tables}["s5.a"] == 29


def test_a_generator_sequence_gone_after_the_flip_stops_the_activation_until_it_is_back(config: Config) -> None:
    """The pause reads the retired copies' generator sequences in one statement: one that is gone (renamed here;
    dropping it takes CASCADE) is named, nothing activates, and the resume once it is back carries the generator."""
    setup_shards(config, rows=20)
    with pytest.raises(Crash):
        move_shards(config, BATCH, "db3", hook=crash_at("activate"))
    retired = state_of(config.dsn("db1"), 2)[1]  # type: ignore[index]
    with psycopg.connect(config.dsn("db1"), autocommit=True) as c:
        c.execute(f"ALTER SEQUENCE {retired}.pgidgen_offset RENAME TO elsewhere")
    with pytest.raises(MoveError, match=rf"the source copy lost its ID generator's sequence {retired}\.pgidgen_offset") as info:
        resume_move(config, 0)
    assert "put that sequence back" in (info.value.hint or "")
    assert all(state_of(config.dsn("db3"), s)[0] == "incoming" for s in BATCH)  # type: ignore[index]
    with psycopg.connect(config.dsn("db1"), autocommit=True) as c:
        c.execute(f"ALTER SEQUENCE {retired}.elsewhere RENAME TO pgidgen_offset")
    report = resume_move(config, 0)
    assert report.status == "done" and report.verification is not None and report.verification.ok
    assert all(state_of(config.dsn("db3"), s)[0] == "active" for s in BATCH)  # type: ignore[index]
