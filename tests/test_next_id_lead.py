"""next_id()'s time field against the clock: a busy shard runs at most LEAD_MS ahead, an idle one is at the clock.

The default layout (10 sequence bits, 1,024 IDs per ms), so that a trickle never fills a millisecond and nothing
borrows: every difference between an ID's time and the clock comes from how the slow path raises the offset.
Each call is timed by the server clock read just before and just after it, in a PL/pgSQL loop.
"""
from __future__ import annotations

from itertools import pairwise

import psycopg

from pgidgen.config import Config
from pgidgen.idgen import LEAD_MS
from pgidgen.init import init

TRICKLE = """
CREATE FUNCTION public.trickle(n int, pause interval)
RETURNS TABLE (before_ms bigint, id bigint, after_ms bigint, offset_value bigint)
LANGUAGE plpgsql AS $$
DECLARE t timestamptz;
BEGIN
    FOR i IN 1..n LOOP
        before_ms := floor(extract(epoch FROM clock_timestamp()) * 1000);
        id := shard_3.next_id();
        after_ms := floor(extract(epoch FROM clock_timestamp()) * 1000);
        offset_value := pg_sequence_last_value('shard_3.pgidgen_offset');
        RETURN NEXT;
        t := clock_timestamp();
        WHILE clock_timestamp() < t + pause LOOP END LOOP;  -- busy-wait: pg_sleep rounds up to milliseconds
    END LOOP;
END $$
"""

Row = tuple[int, int, int, int]


def trickle(conn: psycopg.Connection, n: int, pause_ms: float) -> list[Row]:
    return conn.execute("SELECT * FROM public.trickle(%s, make_interval(secs => %s))", (n, pause_ms / 1000)).fetchall()


def id_ms(config: Config, value: int) -> int:
    return config.layout.decode(value)[0]


def test_a_busy_shard_runs_at_most_lead_ms_ahead_and_takes_the_lock_at_most_every_other_ms(config: Config) -> None:
    """A call every ~0.3 ms for ~60 ms: each ID's time is in [clock before the call, clock after it + LEAD_MS],
    some are ahead (the lead engaged), and the offset is raised at most once per 2 ms of the run. Without the
    lead it is raised in every millisecond (a raise to the clock lasts until the clock's next millisecond); with
    it, a raise to LEAD_MS ahead lasts LEAD_MS + 1 ms, and only a pause of 2 ms or more (a descheduled backend)
    brings a raise to the clock, which lasts at least 1 ms and is followed by a lead raise, or 2 ms."""
    assert all(o.ok for o in init(config, 4, ["db1"]))
    with psycopg.connect(config.dsn("db1"), autocommit=True) as conn:
        conn.execute(TRICKLE)
        rows = trickle(conn, 200, 0.3)
    ids = [r[1] for r in rows]
    assert all(b > a for a, b in pairwise(ids)), "IDs not increasing"
    times = [id_ms(config, i) for i in ids]
    outside = [(b, t, a) for (b, _, a, _), t in zip(rows, times, strict=True) if not b <= t <= a + LEAD_MS]
    assert not outside, f"IDs outside [clock before, clock after + {LEAD_MS} ms]: {outside[:3]}"
    assert any(t > a for (_, _, a, _), t in zip(rows, times, strict=True)), "no ID ahead of the clock: the lead never engaged"
    span = rows[-1][2] - rows[0][0]
    assert span >= 30, f"the trickle took {span} ms: too short to show anything"
    raises = len({r[3] for r in rows})  # the offset's distinct values: each is one raise (the first one included)
    assert raises <= span / 2 + 2, f"{raises} raises of the offset in {span} ms"


def test_a_shard_called_less_than_every_millisecond_gets_the_clock(config: Config) -> None:
    """After a busy spell (IDs 4 ms ahead), calls 3 ms apart, and a call after 50 ms idle: each ID carries the
    clock exactly. The lead is for shards drawing IDs in every millisecond, not for a history of having been busy:
    judged by "an ID in the last 5 ms", a shard called every 3 ms would stay 4 ms ahead forever."""
    assert all(o.ok for o in init(config, 4, ["db1"]))
    with psycopg.connect(config.dsn("db1"), autocommit=True) as conn:
        conn.execute(TRICKLE)
        primed = trickle(conn, 40, 0.2)
        assert any(id_ms(config, i) > a for _, i, a, _ in primed), "the busy spell never ran ahead"
        conn.execute("SELECT pg_sleep(0.007)")  # the lead window of the spell's last raise (5 ms) passes
        spaced = trickle(conn, 15, 3)
        conn.execute("SELECT pg_sleep(0.05)")
        idle = trickle(conn, 1, 0)
    for before, i, after, _ in spaced + idle:
        assert before <= id_ms(config, i) <= after, (before, id_ms(config, i), after)
