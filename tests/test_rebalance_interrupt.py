"""Ctrl-C during `pgidgen rebalance`, as a terminal sends it: SIGINT to the whole foreground process group, so
pgidgen's pg_dump, pg_restore and psql children get it too. The batches in flight finish (or roll back), no other
starts, nothing is left half-done, and the next rebalance continues to the planned balance."""
from __future__ import annotations

from pathlib import Path

import psycopg
import pytest
from movekit import Writer, leftovers
from moveshards import (  # noqa: F401 (quick_subscription_start: an autouse fixture)
    ctrl_c_in_flight,
    journal_statuses,
    nothing_half_done,
    pgidgen,
    quick_subscription_start,
    rows_of,
    setup_on_one,
    writers_saw_nothing_lost,
)

from pgidgen.config import Config
from pgidgen.move.rebalance import plan_rebalance, work_units
from pgidgen.shardmap import read_map

pytestmark = pytest.mark.sensitive  # replication workers and signals differ between majors: runs on every one

SHARDS = 60  # all on db1; by count over three databases: 40 moves, 20 per pair, each pair in several batches


def test_ctrl_c_during_a_rebalance_leaves_nothing_half_done_and_the_next_one_continues(config: Config, config_file: Path) -> None:
    setup_on_one(config, SHARDS, rows=50)
    plan = plan_rebalance(config, by="count")
    assert {n: len(v) for n, v in plan.after.items()} == {"db1": 20, "db2": 20, "db3": 20}
    units = work_units(plan.moves, 2)
    assert len(units) == 2, units  # one per pair
    with psycopg.connect(config.dsn("db1"), autocommit=True) as c:
        for s in (shards[0] for _, shards in units):  # a table too large to come through pgidgen: a psql streams it
            c.execute(f"CREATE TABLE shard_{s}.big (id int PRIMARY KEY, note text)")
            c.execute(f"INSERT INTO shard_{s}.big SELECT g, md5(g::text) FROM generate_series(1, 30000) g")
    # writers on each pair's first shard (in the first batches, in flight at the Ctrl-C), its last (moved by the
    # second run) and on a shard that stays
    watched = sorted({0, *(shards[0] for _, shards in units), *(shards[-1] for _, shards in units)})
    before = {s: rows_of(config.dsn("db1"), f"shard_{s}") for s in watched}
    writers = {s: Writer(config.databases, s) for s in watched}
    for w in writers.values():
        w.start()
    try:
        # 45 ms a shard: batches of about ten, each pair's twenty in several
        proc = pgidgen(config_file, "rebalance", "--by", "count", "--parallel", "2", pause_per_shard=0.045)
        caught, _, out, err = ctrl_c_in_flight(proc, config)  # each pair's first batch
        assert caught, f"the first batches ended before one was seen in flight with a client program running:\n{err}"
        assert proc.returncode == 1, (proc.returncode, out, err)
        assert "Traceback" not in err, err
        assert "FAILED" not in err, err
        errors = [ln for ln in err.splitlines() if ln.startswith("Error:")]
        assert errors == [ln for ln in err.splitlines() if not ln.startswith("shards ")] and len(errors) == 1, err
        assert errors[0].startswith("Error: rebalance interrupted: "), errors
        on = nothing_half_done(config, SHARDS)
        moved = len(on["db2"]) + len(on["db3"])
        assert 0 < moved < len(plan.moves), f"the Ctrl-C stopped the rebalance part-way: {moved} of {len(plan.moves)} moved; caught {caught}, output:\n{err}"
        # the next rebalance continues to the planned balance
        again = pgidgen(config_file, "rebalance", "--by", "count", "--parallel", "2")
        out, err = again.communicate(timeout=600)
        assert again.returncode == 0, (out, err)
    finally:
        for w in writers.values():
            w.stop()
    m = read_map(config)
    assert m.ok and {n: len(v) for n, v in m.databases.items()} == {"db1": 20, "db2": 20, "db3": 20}
    assert sorted(m.databases["db1"]) == plan.after["db1"]
    assert set(journal_statuses(config.databases)) <= {"done"} and leftovers(config.databases) == []
    writers_saw_nothing_lost(config, writers, before)
