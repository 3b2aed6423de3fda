"""Looking after many shards: retired copies counted, sized and dropped in bulk (`pgidgen cleanup`, `rebalance
--drop-source`), and the size-aware rebalance plan (`--by size|count`) on skewed shards, against real servers."""
from __future__ import annotations

import json
import re
from pathlib import Path

import psycopg
import pytest
from click.testing import CliRunner, Result
from movekit import leftovers
from moveshards import Crash, crash_at, journal_statuses, no_bytes, quick_subscription_start, setup_shards  # noqa: F401 - the fixture applies here too

from pgidgen.cli import main
from pgidgen.config import Config
from pgidgen.init import init
from pgidgen.move import MoveOptions, batches, move_shard
from pgidgen.move.balance import FLOOR, spread_bytes
from pgidgen.move.rebalance import plan_rebalance, rebalance, spread
from pgidgen.shardmap import read_map


def cli(config_file: Path, *args: str) -> Result:
    return CliRunner().invoke(main, ["--config", str(config_file), *args])


def retired_rows(dsn: str) -> dict[int, str]:
    with psycopg.connect(dsn, autocommit=True) as c:
        return {int(r[0]): str(r[1]) for r in c.execute("SELECT shard, schema_name FROM pgidgen.shards WHERE state = 'retired'")}


def schema_bytes(dsn: str, schema: str) -> int:
    with psycopg.connect(dsn, autocommit=True) as c:
        row = c.execute("SELECT coalesce(sum(pg_total_relation_size(oid)), 0) FROM pg_class WHERE relnamespace = %s::regnamespace"
                        " AND relkind = 'r'", (schema,)).fetchone()
    return int(row[0]) if row else 0


def test_status_counts_retired_copies_and_cleanup_drops_them_by_age(config: Config, config_file: Path) -> None:
    setup_shards(config, rows=50)
    for shard in (0, 1, 2):
        move_shard(config, shard, "db3")
    copies = retired_rows(config.dsn("db1"))
    assert sorted(copies) == [0, 1, 2]
    total = sum(schema_bytes(config.dsn("db1"), s) for s in copies.values())
    assert total > 0
    m = read_map(config)
    assert m.as_dict()["retired_copies"] == {"db1": {"count": 3, "bytes": total}}
    res = cli(config_file, "status")
    assert res.exit_code == 0, res.output
    assert re.search(r"^db1: 1 shards 3, [0-9.]+ kB \(retired copies: 0-2, [0-9.]+ kB\)$", res.output, re.M), res.output
    assert re.search(r"^retired copies: 3, [0-9.]+ kB \(what moves left on their sources: 'pgidgen cleanup \[--older-than 2d\]' drops them\)$",
                     res.output, re.M), res.output

    res = cli(config_file, "cleanup", "--older-than", "1h")  # all three were retired seconds ago
    assert (res.exit_code, res.output) == (0, "left 3 retired copies younger than --older-than\n")
    with psycopg.connect(config.dsn("db1"), autocommit=True) as c:
        c.execute("UPDATE pgidgen.shards SET updated_at = now() - interval '3 days' WHERE shard IN (0, 1)")
        c.execute(f"CREATE VIEW public.keeps_it AS SELECT * FROM {copies[1]}.t")  # outside the copy, depends on it
    res = cli(config_file, "cleanup", "--older-than", "2d", "--dry-run")
    assert res.exit_code == 0, res.output
    assert no_bytes(res.output)[-2:] == ["would drop 2 retired copies", "left 1 retired copy younger than --older-than"], res.output
    assert sorted(retired_rows(config.dsn("db1"))) == [0, 1, 2]  # the dry run dropped nothing
    res = cli(config_file, "cleanup", "--older-than", "2d")
    assert res.exit_code == 1
    assert no_bytes(res.output) == [
        "db1: dropped 1 retired copy",
        f"db1: kept the retired copy of shard 1: objects outside db1.{copies[1]} depend on it: view public.keeps_it",
        "left 1 retired copy younger than --older-than",
    ], res.output
    assert sorted(retired_rows(config.dsn("db1"))) == [1, 2]
    with psycopg.connect(config.dsn("db1"), autocommit=True) as c:
        assert c.execute("SELECT to_regnamespace(%s)", (copies[0],)).fetchone()[0] is None
        c.execute("DROP VIEW public.keeps_it")
    res = cli(config_file, "cleanup", "--json")
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    assert sorted(c["shard"] for c in out["dropped"]) == [1, 2] and out["bytes"] > 0 and out["ok"] is True
    assert retired_rows(config.dsn("db1")) == {}
    res = cli(config_file, "status")
    assert "retired copies" not in res.output, res.output
    assert cli(config_file, "cleanup").output == "nothing to do: no database keeps a retired copy\n"
    assert cli(config_file, "cleanup", "--older-than", "2x").output == (
        "Error: --older-than '2x' is not an age: write it like 2d, 12h, 30m, 90s or 1w\n")
    assert {n: len(s) for n, s in read_map(config).databases.items()} == {"db1": 1, "db2": 4, "db3": 3}


def test_cleanup_finds_what_depends_on_a_copy_from_the_objects_it_read_once(config: Config) -> None:
    """cleanup reads every retired copy's objects in one pass (retired_objects) and then looks only in pg_depend's
    index per copy: that finds what the per-copy pass over the catalogs finds, whatever kind of object depends."""
    from pgidgen.move import depsql as dq
    from pgidgen.move.cleanup import retired_objects

    setup_shards(config, rows=5)
    for shard in (0, 1):
        move_shard(config, shard, "db3")
    copies = retired_rows(config.dsn("db1"))
    with psycopg.connect(config.dsn("db1"), autocommit=True) as c:
        c.execute(f"CREATE VIEW public.v AS SELECT note FROM {copies[0]}.t")
        c.execute(f"CREATE TABLE public.audit (id bigint PRIMARY KEY DEFAULT {copies[0]}.next_id(), t_id bigint REFERENCES {copies[0]}.t (id),"
                  f" row {copies[0]}.tags)")
        objects = retired_objects(c)
        assert sorted(objects) == [0, 1] and objects[0][0] == copies[0]
        for shard, schema in copies.items():
            whole = [r[0] for r in c.execute(dq.OUTSIDE_DEPENDENTS_SQL, {"schema": schema})]
            indexed = [r[0] for r in c.execute(dq.OUTSIDE_DEPENDENTS_OF_SQL, {"schema": schema, "classes": objects[shard][1], "oids": objects[shard][2]})]
            assert indexed == whole and bool(whole) == (shard == 0), (shard, whole, indexed)


def test_rebalance_drop_source_leaves_no_retired_copy(config: Config, config_file: Path) -> None:
    setup_shards(config, rows=20)
    res = cli(config_file, "rebalance", "--by", "count", "--drop-source")
    assert res.exit_code == 0, res.output
    m = read_map(config)
    assert m.ok and {n: len(s) for n, s in m.databases.items()} == {"db1": 3, "db2": 3, "db3": 2}
    assert all(not v for v in m.retired.values()), m.retired
    assert leftovers(config.databases) == []


def test_dry_run_after_an_interrupted_rebalance_shows_the_plan_the_next_run_follows(config: Config, config_file: Path) -> None:
    """A run first finishes the moves an earlier rebalance left unfinished, then plans: its dry run says so and
    plans from there (found by a review: it left shards 2-3 "in the middle of a move" on db1 and planned moves of
    shards 1 and 7 to db3, while the run finished 2-3 onto db3 and moved shard 7 to db1)."""
    setup_shards(config, rows=20)
    with pytest.raises(Crash):
        rebalance(config, ["db1", "db3"], parallel=1, by="count", hook=crash_at("cutover"))
    res = cli(config_file, "rebalance", "--by", "count", "--dry-run")
    assert res.exit_code == 0, res.output
    planned = no_bytes(res.output)
    assert planned == [
        "db1: 4 shards -> 3 shards (0-1,7)", "db2: 4 shards -> 3 shards (4-6)", "db3: 0 shards -> 2 shards (2-3)",
        "finish the move of shards 2-3: db1 -> db3 (left unfinished by an earlier rebalance; from its journal, first)",
        "db2 -> db1: 1 shard, 1 batch (estimated write pause up to N ms), about N s",
        "in 1 batch (one replication stream and one write pause each), at most 2 at a time: about N s ('--verbose' lists every move and batch)",
    ], res.output
    data = json.loads(cli(config_file, "rebalance", "--by", "count", "--dry-run", "--json").output)
    assert data["finishing"] == [{"shard": 2, "source": "db1", "target": "db3"}, {"shard": 3, "source": "db1", "target": "db3"}]
    assert data["moves"] == [{"shard": 7, "source": "db2", "target": "db1"}] and data["after"] == {"db1": 3, "db2": 3, "db3": 2}
    assert {n: s for n, s in read_map(config).databases.items()} == {"db1": [0, 1, 2, 3], "db2": [4, 5, 6, 7], "db3": []}  # nothing written
    res = cli(config_file, "rebalance", "--by", "count")
    assert res.exit_code == 0, res.output
    assert "shards 2-3: db1 -> db3: resumed, done" in res.output and "shards 7: db2 -> db1: done" in res.output, res.output
    assert read_map(config).databases == {"db1": [0, 1, 7], "db2": [4, 5, 6], "db3": [2, 3]}
    assert no_bytes(cli(config_file, "rebalance", "--by", "count").output)[-1] == "nothing to do: the shards are spread evenly"
    assert leftovers(config.databases) == []


def test_rebalance_over_one_database_is_refused(config: Config, config_file: Path) -> None:
    """Over one database the shards are always "even": `--databases db1` (or db1 twice) said "nothing to do: the
    shards are spread evenly" and exit 0 (found by a review), to a user who meant to spread them."""
    setup_shards(config, rows=5)
    with pytest.raises(Crash):  # an unfinished move a run would resume first: the refusal comes before it
        rebalance(config, ["db1", "db3"], parallel=1, by="count", hook=crash_at("cutover"))
    for args in (["--databases", "db1"], ["--databases", "db1,db1", "--dry-run"], ["--databases", " db2 ,", "--json"]):
        res = cli(config_file, "rebalance", *args)
        name = "db2" if "db2" in args[1] else "db1"
        assert (res.exit_code, res.output) == (1, f"Error: rebalance spreads the shards over two or more databases, not {name} alone: name them"
                                                  " all, like --databases db1,db2 (a new database goes in the config's [databases] first)\n"), args
    assert journal_statuses(config.databases) == {"failed": 1}  # the crashed move, neither resumed nor another journaled
    assert cli(config_file, "rebalance", "--by", "count", "--databases", "db1,db3").exit_code == 0
    assert leftovers(config.databases) == []


def test_drop_source_keeps_a_copy_its_resumed_verification_found_different(config: Config, config_file: Path) -> None:
    """A rebalance stopped before its verification is finished by the next `rebalance --drop-source`; a row the
    target lost since the flip makes the resumed verification differ: the source copy stays (it is what the
    difference is checked against) and the exit code says so (found by a review: the copy was dropped, exit 0)."""
    setup_shards(config, rows=20)
    with pytest.raises(Crash):
        rebalance(config, ["db1", "db3"], parallel=1, by="count", options=MoveOptions(drop_source=True), hook=crash_at("verify"))
    copies = retired_rows(config.dsn("db1"))
    assert sorted(copies) == [2, 3]
    with psycopg.connect(config.dsn("db3"), autocommit=True) as c:
        c.execute("DELETE FROM shard_3.t WHERE v = 1")
    res = cli(config_file, "rebalance", "--by", "count", "--databases", "db1,db3", "--drop-source")
    assert res.exit_code == 1, res.output
    assert "verification" in res.output and "shard_3.t" in res.output, res.output
    assert retired_rows(config.dsn("db1")) == copies
    assert leftovers(config.databases) == []


def test_a_rebalance_run_again_keeps_the_max_pause_its_unfinished_move_started_with(config: Config, config_file: Path,
                                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """The rebalance that finishes an earlier one's interrupted move bounds its write pause by the --max-pause that
    move started with unless one is given again (as move-shard --resume; found by a review: the default 1s)."""
    monkeypatch.setattr(batches, "PAUSE_PER_SHARD_S", 0.15)  # one shard a batch under --max-pause 200ms
    setup_shards(config, rows=20)
    with pytest.raises(Crash):
        rebalance(config, ["db1", "db3"], parallel=1, by="count", options=MoveOptions(max_pause=0.2), hook=crash_at("cutover"))
    held = psycopg.connect(config.dsn("db1"))
    try:
        held.execute("INSERT INTO shard_2.t (v) VALUES (-9)")  # a long transaction: the freeze cannot lock the table
        res = cli(config_file, "rebalance", "--by", "count", "--databases", "db1,db3")
        assert res.exit_code == 1 and "within --max-pause 200 ms" in res.output, res.output
        held.rollback()
    finally:
        held.close()
    res = cli(config_file, "rebalance", "--by", "count", "--databases", "db1,db3")
    assert res.exit_code == 0, res.output
    # the resumed move is shown apart; the count is the plan's, made after it (it read "1/2", then "2/2", of a
    # plan made before, that moved shards 1 and 3; a review saw "2/0")
    assert "shards 2: db1 -> db3: resumed, done, pause " in res.output and "; 1/1 shards" in res.output, res.output
    assert leftovers(config.databases) == []


def skewed(config: Config) -> None:
    """8 shards on db1, each with a table; shard 0 holds 20 times the rows of the others."""
    init(config, 8, ["db1"])
    with psycopg.connect(config.dsn("db1"), autocommit=True) as c:
        for shard in range(8):
            c.execute(f"CREATE TABLE shard_{shard}.t (id bigint PRIMARY KEY DEFAULT shard_{shard}.next_id(), note text)")
            c.execute(f"INSERT INTO shard_{shard}.t (note) SELECT md5(g::text) FROM generate_series(1, {20000 if shard == 0 else 1000}) g")
            # vacuumed now, so that autovacuum's insert pass cannot add the free-space and visibility maps (8 kB
            # each) between two reads of the sizes (a CI run saw 3121152 bytes, then 3129344)
            c.execute(f"VACUUM shard_{shard}.t")


def test_size_plan_balances_bytes_the_count_plan_counts(config: Config, config_file: Path) -> None:
    skewed(config)
    by_size = plan_rebalance(config, ["db1", "db2"], by="size")
    by_count = plan_rebalance(config, ["db1", "db2"], by="count")
    assert [m.shard for m in by_count.moves] == [4, 5, 6, 7]
    assert {n: len(s) for n, s in by_count.after.items()} == {"db1": 4, "db2": 4}
    assert [m.shard for m in by_size.moves] == [0]  # the big one alone weighs more than the seven others
    heaviest = {p.by: max(p.bytes_of(p.after["db1"]), p.bytes_of(p.after["db2"])) for p in (by_size, by_count)}
    gap = {p.by: abs(p.bytes_of(p.after["db1"]) - p.bytes_of(p.after["db2"])) for p in (by_size, by_count)}
    assert heaviest["size"] < heaviest["count"] and gap["size"] < gap["count"], (heaviest, gap)
    big, small = by_size.sizes[0], by_size.sizes[1]
    assert big > 10 * small
    res = cli(config_file, "rebalance", "--databases", "db1,db2", "--dry-run")
    assert res.exit_code == 0, res.output
    lines = res.output.splitlines()
    assert re.fullmatch(r"db1: 8 shards, [0-9.]+ MB -> 7 shards, [0-9.]+ (kB|MB) \(1-7\)", lines[0]), lines
    assert re.fullmatch(r"db2: 0 shards, 0 bytes -> 1 shards, [0-9.]+ MB \(0\)", lines[1]), lines
    assert re.fullmatch(r"db1 -> db2: 1 shard, [0-9.]+ MB, 1 batch \(estimated write pause up to [0-9]+ ms\), about [0-9]+ s", lines[2]), lines
    data = json.loads(cli(config_file, "rebalance", "--databases", "db1,db2", "--dry-run", "--json").output)
    assert data["by"] == "size" and data["bytes_before"] == {"db1": by_size.bytes_of(range(8)), "db2": 0}
    res = cli(config_file, "rebalance", "--databases", "db1,db2")
    assert res.exit_code == 0, res.output
    with psycopg.connect(config.dsn("db2"), autocommit=True) as c:
        c.execute("VACUUM shard_0.t")  # the copied rows' maps made now, not between the two reads below
    m = read_map(config)
    assert {n: len(s) for n, s in m.databases.items()} == {"db1": 7, "db2": 1, "db3": 0}
    assert m.bytes["db2"] > m.bytes["db1"] > 0
    assert json.loads(cli(config_file, "map", "--json").output)["databases"]["db2"]["bytes"] == m.bytes["db2"]
    assert re.search(r"^db2: 1 shards 0, [0-9.]+ MB$", cli(config_file, "map").output, re.M)
    assert plan_rebalance(config, ["db1", "db2"], by="size").moves == []  # nothing left that narrows the gap


def test_size_plan_rules() -> None:
    """Equal shards move as the count plan moves them; a retired copy on the light side keeps a shard away and
    the plan says so; pinned shards stay."""
    names = ["db1", "db2", "db3"]
    held = {"db1": [0, 1, 2, 3], "db2": [4, 5, 6, 7], "db3": []}
    equal = {s: 4 * FLOOR for s in range(8)}
    moves, _ = spread_bytes(names, held, equal, fixed=set(), retired={})
    count = spread(names, held, fixed=set(), retired={})
    assert sorted(moves) == sorted((m.shard, m.source, m.target) for m in count.moves) == [(3, "db1", "db3"), (7, "db2", "db3")]
    sizes = {0: 100 * FLOOR, 1: FLOOR, 2: FLOOR, 3: FLOOR}
    moves, blocked = spread_bytes(["a", "b"], {"a": [0, 1, 2, 3], "b": []}, sizes, fixed=set(), retired={})
    assert [s for s, _, _ in moves] == [0] and blocked == {}  # the big one: a 6 floors, b 101
    moves, blocked = spread_bytes(["a", "b"], {"a": [0, 1, 2, 3], "b": []}, sizes, fixed=set(), retired={"b": {0}})
    assert [s for s, _, _ in moves] == [3, 2, 1] and blocked == {}  # as close as it gets without shard 0
    moves, blocked = spread_bytes(["a", "b"], {"a": [0, 1], "b": []}, {0: FLOOR, 1: FLOOR}, fixed=set(), retired={"b": {0, 1}})
    assert moves == [] and blocked == {0: "b", 1: "b"}
    moves, _ = spread_bytes(["a", "b"], {"a": [0, 1, 2, 3], "b": []}, sizes, fixed={0}, retired={})
    assert [s for s, _, _ in moves] == [3, 2, 1]
