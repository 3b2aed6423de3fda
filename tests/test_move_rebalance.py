"""pgidgen rebalance: the plan, moves onto a new database, around a move in progress and retired copies."""
from __future__ import annotations

import json
import re
from pathlib import Path

import psycopg
import pytest
from click.testing import CliRunner
from movekit import leftovers
from moveshards import journal_statuses, no_bytes, quick_subscription_start, rows_of, setup_on_one, setup_shards, start_cli, state_of, wait_stopped  # noqa: F401 (an autouse fixture)

from pgidgen.cli import main
from pgidgen.config import Config
from pgidgen.move import batches as batches_
from pgidgen.move import cleanup, move_shard, rollback_move
from pgidgen.move.rebalance import plan_rebalance, spread
from pgidgen.ranges import expand
from pgidgen.shardmap import read_map


def test_rebalance_onto_a_new_database(config: Config, config_file: Path) -> None:
    setup_shards(config, rows=30)
    with psycopg.connect(config.dsn("db2"), autocommit=True) as c:
        for shard in range(4, 8):
            c.execute(f"CREATE TABLE shard_{shard}.t (id bigint PRIMARY KEY DEFAULT shard_{shard}.next_id(), v int)")
            c.execute(f"INSERT INTO shard_{shard}.t (v) SELECT g FROM generate_series(1, 30) g")
    runner = CliRunner()
    res = runner.invoke(main, ["--config", str(config_file), "rebalance", "--dry-run", "--by", "count"])
    assert res.exit_code == 0, res.output
    assert no_bytes(res.output) == [
        "db1: 4 shards -> 3 shards (0-2)", "db2: 4 shards -> 3 shards (4-6)", "db3: 0 shards -> 2 shards (3,7)",
        "db1 -> db3: 1 shard, 1 batch (estimated write pause up to N ms), about N s",
        "db2 -> db3: 1 shard, 1 batch (estimated write pause up to N ms), about N s",
        "in 2 batches (one replication stream and one write pause each), at most 2 at a time: about N s ('--verbose' lists every move and batch)",
    ]
    res = runner.invoke(main, ["--config", str(config_file), "rebalance", "--dry-run", "--by", "count", "--verbose"])
    assert no_bytes(res.output)[3:] == [
        "move shard 3: db1 -> db3", "move shard 7: db2 -> db3",
        "db1 -> db3: 1 shard, 1 batch (estimated write pause up to N ms), about N s",
        "db2 -> db3: 1 shard, 1 batch (estimated write pause up to N ms), about N s",
        "in 2 batches (one replication stream and one write pause each), at most 2 at a time: about N s",
        "  db1 -> db3: 1 shard (3)", "  db2 -> db3: 1 shard (7)",
    ], res.output
    assert leftovers(config.databases) == []  # the dry run changed nothing
    res = runner.invoke(main, ["--config", str(config_file), "rebalance", "--parallel", "2", "--json", "--by", "count"])
    assert res.exit_code == 0, res.output
    m = read_map(config)
    assert m.ok and {n: len(s) for n, s in m.databases.items()} == {"db1": 3, "db2": 3, "db3": 2}
    assert len(rows_of(config.dsn("db3"), "shard_3")) == 30 and len(rows_of(config.dsn("db3"), "shard_7")) == 30
    assert leftovers(config.databases) == []
    res = runner.invoke(main, ["--config", str(config_file), "rebalance", "--dry-run", "--by", "count"])
    assert res.output.splitlines()[-1] == "nothing to do: the shards are spread evenly"


def test_rebalance_plan_says_when_retired_copies_keep_it_uneven() -> None:
    """When every shard that could even the spread has its retired copy on the database short of shards, the plan
    does what it can and says why it stays uneven, instead of "spread evenly"."""
    plan = spread(["db1", "db2", "db3"], {"db1": [0, 1, 2], "db2": [3, 4, 5], "db3": []}, fixed=set(), retired={"db3": {0, 1, 2}})
    assert [(m.shard, m.source, m.target) for m in plan.moves] == [(5, "db2", "db3")]
    assert not plan.even and plan.as_dict()["even"] is False
    assert plan.lines()[-1] == "not spread evenly: db3 still holds the retired copies of shards 0-2 ('pgidgen move-shard --cleanup N' drops it)"
    even = spread(["db1", "db2"], {"db1": list(range(8)), "db2": []}, fixed=set(), retired={})
    assert [m.shard for m in even.moves] == [4, 5, 6, 7] and even.even and even.lines()[-1] == "move shard 7: db1 -> db2"
    # a database whose shards are all mid-move keeps them; the others still even out as far as they can (a review
    # found 4/3/1 where 4/2/2 was possible), and so when the retired copies are on one of the short databases
    pinned = spread(["a", "b", "c"], {"a": [1, 2, 3, 4], "b": [5, 6, 7, 8], "c": []}, fixed={1, 2, 3, 4}, retired={})
    assert {n: len(v) for n, v in pinned.after.items()} == {"a": 4, "b": 2, "c": 2}
    around = spread(["a", "b", "c"], {"a": [1, 2, 3, 4, 5, 6], "b": [], "c": []}, fixed=set(), retired={"b": {1, 2, 3, 4, 5, 6}})
    assert {n: len(v) for n, v in around.after.items()} == {"a": 3, "b": 0, "c": 3}
    # a shard is moved once per plan: a second move of it ran at the same time as the first and failed (a review)
    once = spread(["A", "B", "C"], {"A": [1, 2, 3, 4, 5, 6], "B": [], "C": []}, fixed=set(), retired={"C": {1, 2, 3, 4, 5}})
    assert len({m.shard for m in once.moves}) == len(once.moves)


def test_rebalance_around_a_move_in_progress_and_a_retired_copy(config: Config, config_file: Path) -> None:
    """A shard in the middle of a move stays where it is (the rest is still planned and run), and a shard whose
    retired copy is on the database short of shards is replaced by its neighbour instead of leaving the spread
    uneven (found by a review: rebalance refused outright, and stopped at 3/4/1 saying "spread evenly")."""
    setup_shards(config, rows=20)
    with psycopg.connect(config.dsn("db2"), autocommit=True) as c:
        for shard in range(4, 8):
            c.execute(f"CREATE TABLE shard_{shard}.t (id bigint PRIMARY KEY DEFAULT shard_{shard}.next_id(), v int)")
            c.execute(f"INSERT INTO shard_{shard}.t (v) SELECT g FROM generate_series(1, 20) g")
    move_shard(config, 7, "db3")
    cleanup(config, 7)
    move_shard(config, 7, "db2")  # db3 keeps shard 7's retired copy
    proc = start_cli(config_file, "3", "db2", stop_at="copy")
    try:
        wait_stopped(proc)
    finally:
        proc.kill()
        proc.wait()
    assert state_of(config.dsn("db1"), 3)[0] == "moving"  # type: ignore[index]
    runner = CliRunner()
    res = runner.invoke(main, ["--config", str(config_file), "map"])
    assert "MOVING: shard 3 from db1 to db2 " in res.output, res.output  # map tells of the interrupted move
    assert read_map(config).as_dict()["moving"][0]["from"] == "db1"
    res = runner.invoke(main, ["--config", str(config_file), "rebalance", "--dry-run", "--by", "count"])
    assert res.exit_code == 0, res.output
    assert no_bytes(res.output) == [
        "db1: 4 shards -> 3 shards (0-1,3)", "db2: 4 shards -> 3 shards (4-5,7)", "db3: 0 shards -> 2 shards (2,6)",
        "db1 -> db3: 1 shard, 1 batch (estimated write pause up to N ms), about N s",
        "db2 -> db3: 1 shard, 1 batch (estimated write pause up to N ms), about N s",
        "in 2 batches (one replication stream and one write pause each), at most 2 at a time: about N s ('--verbose' lists every move and batch)",
        "shard 3 is in the middle of a move: left on db1 (finish it with 'pgidgen move-shard 3 --resume' or '--rollback')",
    ]
    res = runner.invoke(main, ["--config", str(config_file), "rebalance", "--by", "count"])
    assert res.exit_code == 0, res.output
    assert no_bytes(res.output)[-4:-1] == ["db1: 4 shards -> 3 shards (0-1,3)", "db2: 4 shards -> 3 shards (4-5,7)", "db3: 0 shards -> 2 shards (2,6)"]
    assert len(rows_of(config.dsn("db3"), "shard_2")) == 20 and len(rows_of(config.dsn("db3"), "shard_6")) == 20
    rollback_move(config, 3)
    m = read_map(config)
    assert m.ok and {n: len(s) for n, s in m.databases.items()} == {"db1": 3, "db2": 3, "db3": 2}
    assert leftovers(config.databases) == []


def test_rebalance_moves_a_shard_with_an_unlogged_table(config: Config, config_file: Path) -> None:
    """A shard with an unlogged table failed every rebalance run (found by a review): its rows are now copied in
    the pause, online (logical replication does not carry them)."""
    setup_shards(config, rows=10)
    with psycopg.connect(config.dsn("db1"), autocommit=True) as c:
        c.execute("CREATE UNLOGGED TABLE shard_3.cache (k int PRIMARY KEY)")
        c.execute("INSERT INTO shard_3.cache SELECT generate_series(1, 5)")
    runner = CliRunner()
    res = runner.invoke(main, ["--config", str(config_file), "rebalance", "--databases", "db1,db3", "--by", "count"])
    assert res.exit_code == 0, res.output
    assert {n: len(s) for n, s in read_map(config).databases.items() if n != "db2"} == {"db1": 2, "db3": 2}
    assert len(rows_of(config.dsn("db3"), "shard_3", "cache")) == 5
    assert leftovers(config.databases) == []


def test_rebalance_dry_run_shows_the_batches_a_run_then_moves(config: Config, config_file: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """36 shards on db1 spread over three databases: 12 moves per pair, cut as a run cuts them (by the estimate,
    here ten shards of two tables fill 0.4 of --max-pause 1s), shown in text and JSON; the run moves those batches."""
    monkeypatch.setattr(batches_, "PAUSE_PER_SHARD_S", 0.005)  # 34 ms a shard of two tables: ten fit in 0.4 s
    monkeypatch.setattr(batches_, "PAUSE_PER_TABLE_S", 0.0145)
    setup_on_one(config, 36)
    runner = CliRunner()
    summary = runner.invoke(main, ["--config", str(config_file), "rebalance", "--by", "count", "--dry-run"])
    assert summary.exit_code == 0, summary.output
    assert sorted(ln for ln in no_bytes(summary.output) if " -> " in ln and ": 12 shards" in ln) == [
        f"db1 -> {t}: 12 shards, 2 batches (estimated write pause up to N ms), about N s" for t in ("db2", "db3")], summary.output
    res = runner.invoke(main, ["--config", str(config_file), "rebalance", "--by", "count", "--dry-run", "--verbose"])
    assert res.exit_code == 0, res.output
    data = json.loads(runner.invoke(main, ["--config", str(config_file), "rebalance", "--by", "count", "--dry-run", "--json"]).output)
    assert leftovers(config.databases) == [] and journal_statuses(config.databases) == {}  # the dry runs changed nothing
    plan = plan_rebalance(config, by="count")
    batches = [(b["source"], b["target"], expand(b["shards"])) for b in data["batches"]]
    assert data["parallel"] == 2 and [b["count"] for b in data["batches"]] == [len(s) for _, _, s in batches]
    assert [b["bytes"] for b in data["batches"]] == [plan.bytes_of(s) for _, _, s in batches]
    assert all(b["estimated_pause_ms"] <= 400 for b in data["batches"])  # within 0.4 of --max-pause
    # every planned move in exactly one batch, each batch one pair's
    assert sorted(s for _, _, shards in batches for s in shards) == [m.shard for m in plan.moves]
    pair = {m.shard: (m.source, m.target) for m in plan.moves}
    assert all({pair[s] for s in shards} == {(src, tgt)} for src, tgt, shards in batches)
    assert sorted(len(s) for _, _, s in batches) == [2, 2, 10, 10], batches  # each pair in two batches
    lines = res.output.splitlines()
    at = next(i for i, ln in enumerate(lines) if ln.startswith("in 4 batches (one replication stream and one write pause each), at most 2 at a time: about "))
    shown = [re.fullmatch(r"  (\w+) -> (\w+): (\d+) shards?, [0-9.]+ (?:bytes|kB|MB) \(([0-9,-]+)\), estimated write pause \d+ ms", ln)
             for ln in lines[at + 1:at + 5]]
    assert all(shown), lines[at + 1:at + 5]
    assert [(m[1], m[2], expand(m[4])) for m in shown if m] == batches and [int(m[3]) for m in shown if m] == [len(s) for _, _, s in batches]
    res = runner.invoke(main, ["--config", str(config_file), "rebalance", "--by", "count", "--json"])
    assert res.exit_code == 0, res.output
    moved = sorted((r["source"], r["target"], r["shards"]) for r in json.loads(res.output)["moves"])
    assert moved == sorted(batches)
    assert {n: len(s) for n, s in read_map(config).databases.items()} == {"db1": 12, "db2": 12, "db3": 12}
    assert leftovers(config.databases) == []


@pytest.mark.sensitive  # the launcher starts a new subscription's worker at once from 18 on
def test_dry_run_names_a_target_whose_launcher_holds_each_batch(config: Config, config_file: Path) -> None:
    """Before 18, each batch's new subscription waits up to wal_retrieve_retry_interval for its worker: a dry run
    whose batches to a target may wait 30 s or more for it in all says so, and what to set (at 10 s: 4 batches of
    one shard, 40 s); from 18 on it says nothing of it."""
    setup_on_one(config, 8)
    with psycopg.connect(config.dsn("db2"), autocommit=True) as c:
        major = int(c.execute("SHOW server_version_num").fetchone()[0]) // 10000
        c.execute("ALTER SYSTEM SET wal_retrieve_retry_interval = '10s'")
        c.execute("SELECT pg_reload_conf()")
        try:
            args = ["--config", str(config_file), "rebalance", "--databases", "db1,db2", "--by", "count", "--max-pause", "10ms", "--dry-run"]
            res = CliRunner().invoke(main, args)
            data = json.loads(CliRunner().invoke(main, [*args, "--json"]).output)
        finally:
            c.execute("ALTER SYSTEM SET wal_retrieve_retry_interval = '100ms'")  # as quick_subscription_start left it
            c.execute("SELECT pg_reload_conf()")
    assert res.exit_code == 0, res.output
    told = [ln for ln in res.output.splitlines() if "wal_retrieve_retry_interval" in ln]
    if major >= 18:
        assert told == [] and data["launcher_waits"] == {}, res.output
    else:
        assert told == ["db2: its server starts each batch's subscription worker up to 10 s late (wal_retrieve_retry_interval; before PostgreSQL 18):"
                        " 4 batches may wait 40 s for it; set it lower there for this run"
                        " (ALTER SYSTEM SET wal_retrieve_retry_interval = '1s'; SELECT pg_reload_conf())"], res.output
        assert data["launcher_waits"] == {"db2": {"interval_s": 10.0, "batches": 4, "wait_s": 40.0}}
    assert leftovers(config.databases) == []
