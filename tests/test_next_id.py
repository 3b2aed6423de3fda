"""next_id() on real servers: no duplicate and always increasing per shard, under overflow, concurrency,
cancellation and a hostile search_path; the generator state (last_id / advance_generator).

Layouts with 3 sequence bits (8 IDs per ms per shard) so that 2 cores overflow a millisecond all the time.
The clock, crash and move tests (servers of their own) are in test_next_id_servers.py.
"""
from __future__ import annotations

import threading
import time
from itertools import pairwise
from typing import Any

import psycopg
import pytest
from psycopg import errors

from pgidgen.config import Config
from pgidgen.init import init
from pgidgen.layout import Layout

pytestmark = pytest.mark.sensitive  # behaviour can differ between majors: runs on every one

SEQ_BITS = 3
SHARD_BITS = 8
LAYOUT = Layout.make(sequence_bits=SEQ_BITS, shard_bits=SHARD_BITS)


@pytest.fixture
def layout() -> Layout:
    return LAYOUT


@pytest.fixture
def dsn(config: Config) -> str:
    """db1 with shards 0-3."""
    outcomes = init(config, 4, ["db1"])
    assert all(o.ok for o in outcomes), outcomes
    return config.dsn("db1")


def now_ms(conn: psycopg.Connection[Any]) -> int:
    return int(conn.execute("SELECT floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint").fetchone()[0])


def decode(value: int) -> tuple[int, int, int]:
    return LAYOUT.decode(value)


def assert_strictly_increasing(ids: list[int], what: str) -> None:
    bad = [(a, b) for a, b in pairwise(ids) if b <= a]
    assert not bad, f"{what}: {len(bad)} IDs not above their predecessor, e.g. {bad[:3]}"


def test_sequences_are_cache_1_and_the_offset_reads_zero(dsn: str) -> None:
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(
            "SELECT sequencename, cache_size, last_value FROM pg_sequences WHERE schemaname = 'shard_0' ORDER BY 1"
        ).fetchall()
    assert rows == [("pgidgen_counter", 1, None), ("pgidgen_offset", 1, 0)]


def test_the_fast_path_reads_are_the_defaults_in_the_order_the_protocol_needs(dsn: str) -> None:
    """The seqlock's reads are next_id's parameter defaults, which the calling statement evaluates: the offset,
    then nextval, then the offset again (docs/next_id.md). Both halves of that are checked here: the declared order,
    and that this server evaluates defaults in parameter order, in a SELECT list, a DEFAULT of an INSERT and a
    prepared statement (a probe whose three defaults draw from one sequence must see them increase)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        args = conn.execute("SELECT pg_get_function_arguments('shard_2.next_id'::regproc)").fetchone()[0]
        order = [a.split(" DEFAULT ")[1] for a in args.split(", _")]
        assert order == [
            "pg_sequence_last_value('shard_2.pgidgen_offset'::regclass)",
            "nextval('shard_2.pgidgen_counter'::regclass)",
            "pg_sequence_last_value('shard_2.pgidgen_offset'::regclass)",
            "clock_timestamp()",
            "pg_current_xact_id_if_assigned()",
        ]
        conn.execute("CREATE SEQUENCE public.probe_seq")
        conn.execute(
            "CREATE FUNCTION public.probe(a bigint DEFAULT nextval('public.probe_seq'), b bigint DEFAULT nextval('public.probe_seq'),"
            " c bigint DEFAULT nextval('public.probe_seq')) RETURNS bigint[] LANGUAGE plpgsql AS $$ BEGIN RETURN ARRAY[a, b, c]; END $$"
        )
        conn.execute("CREATE TABLE public.probed (p bigint[] DEFAULT public.probe(), v int)")
        rows = [r[0] for r in conn.execute("SELECT public.probe() FROM generate_series(1, 2000)")]
        conn.execute("INSERT INTO public.probed (v) SELECT g FROM generate_series(1, 2000) g")
        for _ in range(8):  # psycopg prepares a statement on its 5th run
            conn.execute("INSERT INTO public.probed (v) VALUES (%s)", (1,))
        rows += [r[0] for r in conn.execute("SELECT p FROM public.probed")]
    assert len(rows) == 4008
    assert all(a < b < c for a, b, c in rows), [r for r in rows if not r[0] < r[1] < r[2]][:3]


def test_single_statement_burst_is_strictly_increasing_in_call_order(dsn: str) -> None:
    n = 60_000
    with psycopg.connect(dsn) as conn:
        start = now_ms(conn)
        rows = conn.execute("SELECT n, shard_1.next_id() FROM generate_series(1, %s) AS n ORDER BY n", (n,)).fetchall()
        end = now_ms(conn)
    ids = [r[1] for r in rows]
    assert len(set(ids)) == n
    assert_strictly_increasing(ids, "burst")
    times = [decode(i)[0] for i in ids]
    assert {decode(i)[1] for i in ids} == {1}
    assert times[0] >= start - 1  # never before the call
    # 60,000 IDs at 8 per ms cannot fit in the wall-clock time the burst took: the time field borrowed ahead.
    assert times[-1] - times[0] >= n // LAYOUT.ids_per_ms - 1
    assert times[-1] > end


def test_the_instagram_formula_duplicates_in_the_same_burst(dsn: str) -> None:
    """The baseline: nextval % 2^sequence_bits beside the clock. Shows the burst test can fail."""
    shift = LAYOUT.time_shift
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE SEQUENCE public.insta_seq")
        conn.execute(
            f"""CREATE FUNCTION public.insta_next_id() RETURNS bigint LANGUAGE sql VOLATILE AS $$
            SELECT ((floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint - {LAYOUT.epoch_ms}) << {shift})
                   | (1 << {SEQ_BITS}) | (nextval('public.insta_seq') % {LAYOUT.ids_per_ms}) $$"""
        )
        total, distinct = conn.execute(
            "SELECT count(*), count(DISTINCT id) FROM (SELECT public.insta_next_id() AS id FROM generate_series(1, 60000)) t"
        ).fetchone()
    assert total == 60_000 and distinct < total


def test_many_sessions_on_one_shard_never_duplicate_and_each_session_increases(dsn: str) -> None:
    sessions, batches, per_batch = 6, 30, 200
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE public.ids (session int, n int, id bigint)")
    failures: list[BaseException] = []
    behind: list[int] = []  # ms by which a batch's first ID is older than the client clock before the batch
    barrier = threading.Barrier(sessions)

    def work(k: int) -> None:
        try:
            with psycopg.connect(dsn, autocommit=True) as conn:
                barrier.wait()
                for b in range(batches):
                    before = int(time.time() * 1000)
                    first = conn.execute(
                        "INSERT INTO public.ids SELECT %s, %s * 100000 + g, shard_2.next_id() FROM generate_series(1, %s) AS g"
                        " ORDER BY g RETURNING id",
                        (k, b, per_batch),
                    ).fetchone()[0]
                    behind.append(before - decode(first)[0])
                    if b % 10 == 9:
                        time.sleep(0.01)  # let the clock get ahead now and then: the offset is raised under load
        except BaseException as e:  # pragma: no cover - reported below
            failures.append(e)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(sessions)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failures, failures
    assert max(behind) <= 1, "an ID behind the clock"  # 1 ms: client and server read the clock at different instants
    with psycopg.connect(dsn) as conn:
        total, distinct = conn.execute("SELECT count(*), count(DISTINCT id) FROM public.ids").fetchone()
        assert total == sessions * batches * per_batch
        assert distinct == total
        backwards = conn.execute(
            "SELECT count(*) FROM (SELECT id <= lag(id) OVER (PARTITION BY session ORDER BY n) AS back FROM public.ids) t WHERE back"
        ).fetchone()[0]
        assert backwards == 0
        # Sessions interleaved: IDs of different sessions alternate in the shard's order.
        switches = conn.execute(
            "SELECT count(*) FROM (SELECT session <> lag(session) OVER (ORDER BY id) AS sw FROM public.ids) t WHERE sw"
        ).fetchone()[0]
        assert switches > sessions
        assert conn.execute("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'").fetchone()[0] == 0


def test_last_id_and_advance_generator(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        ids = [r[0] for r in conn.execute("SELECT shard_3.next_id() FROM generate_series(1, 1000)")]
        last = conn.execute("SELECT pgidgen.last_id(3)").fetchone()[0]
        assert last >= max(ids) and decode(last)[1] == 3
        # An hour ahead, as a move to a server whose clock is behind would carry.
        target = conn.execute(
            "SELECT pgidgen.min_id(clock_timestamp() + interval '1 hour') | %s", ((3 << SEQ_BITS) | 5,)
        ).fetchone()[0]
        got = conn.execute("SELECT pgidgen.advance_generator(3, %s)", (target,)).fetchone()[0]
        assert got >= target
        after = [r[0] for r in conn.execute("SELECT shard_3.next_id() FROM generate_series(1, 100)")]
        assert min(after) > target
        assert_strictly_increasing(after, "after advance")
        # Going back is a no-op: the generator never moves backwards.
        again = conn.execute("SELECT pgidgen.advance_generator(3, %s)", (ids[0],)).fetchone()[0]
        assert conn.execute("SELECT shard_3.next_id()").fetchone()[0] > max(after) and again >= max(after)
        # Another shard's ID works as a position too; the next IDs are above it whatever its shard bits.
        other = max(after) + 10 * LAYOUT.ids_per_ms * (1 << SHARD_BITS)
        conn.execute("SELECT pgidgen.advance_generator(3, %s)", (other | (200 << SEQ_BITS),))
        assert conn.execute("SELECT shard_3.next_id()").fetchone()[0] > other | (200 << SEQ_BITS)
        assert conn.execute("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'").fetchone()[0] == 0


def test_advance_generators_moves_many_shards_at_once_and_holds_their_locks_to_commit(dsn: str) -> None:
    """A move's activate advances its batch's generators in one call: each shard past its own ID (one a reset
    offset, whose pg_sequence_last_value is NULL), the locks held until the transaction ends; the arrays must match."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SELECT shard_1.next_id() FROM generate_series(1, 10)")
        conn.execute("SELECT setval('shard_2.pgidgen_offset', 0, false)")  # reset: is_called false
        ahead = {s: conn.execute("SELECT pgidgen.min_id(clock_timestamp() + interval '1 hour') + %s", (s * 1000,)).fetchone()[0] | (s << SEQ_BITS)
                 for s in (1, 2)}
        with conn.transaction():
            conn.execute("SELECT pgidgen.advance_generators(%s::int[], %s::bigint[])", ([2, 1], [ahead[2], ahead[1]]))
            assert conn.execute("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid()").fetchone()[0] == 2
        assert conn.execute("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'").fetchone()[0] == 0
        for s in (1, 2):
            assert conn.execute(f"SELECT shard_{s}.next_id()").fetchone()[0] > ahead[s], s
        with pytest.raises(errors.InvalidParameterValue, match="2 shards and 1 IDs"):
            conn.execute("SELECT pgidgen.advance_generators('{1,2}'::int[], '{1}'::bigint[])")
        with pytest.raises(errors.NoDataFound, match="shard 99 is not in this database"):
            conn.execute("SELECT pgidgen.advance_generators('{1,99}'::int[], '{1,1}'::bigint[])")
        with pytest.raises(errors.NullValueNotAllowed, match="a NULL among the shards or IDs"):
            conn.execute("SELECT pgidgen.advance_generators('{1,2}'::int[], '{1,NULL}'::bigint[])")


def test_the_python_twin_of_last_id_agrees_with_it(dsn: str) -> None:
    """Layout.last_id (a move's pause reads a batch's generator sequences in one statement) gives pgidgen.last_id's
    answer: a fresh shard, one that handed out IDs, one moved an hour ahead, one whose offset is past the layout's end."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SELECT shard_1.next_id() FROM generate_series(1, 37)")
        conn.execute("SELECT pgidgen.advance_generator(2, pgidgen.min_id(clock_timestamp() + interval '1 hour') | %s)", ((2 << SEQ_BITS) | 5,))
        conn.execute("SELECT setval('shard_3.pgidgen_offset', %s)", (LAYOUT.max_time * LAYOUT.ids_per_ms + LAYOUT.ids_per_ms - 1,))
        for shard in range(4):
            counter, offset = (conn.execute(f"SELECT last_value FROM shard_{shard}.pgidgen_{name}").fetchone()[0] for name in ("counter", "offset"))
            assert LAYOUT.last_id(shard, counter, offset) == conn.execute("SELECT pgidgen.last_id(%s)", (shard,)).fetchone()[0], shard


def test_advance_generator_refuses_ids_beyond_the_layout(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        with pytest.raises(errors.NumericValueOutOfRange, match=r"-1 is not an ID of this layout \(IDs are not negative\)"):
            conn.execute("SELECT pgidgen.advance_generator(3, %s)", (-1,))
        with pytest.raises(errors.NumericValueOutOfRange, match="beyond the last ID of this layout"):
            conn.execute("SELECT pgidgen.advance_generator(3, %s)", ((LAYOUT.max_time << LAYOUT.time_shift) | (3 << SEQ_BITS) | (LAYOUT.ids_per_ms - 1),))
        with pytest.raises(errors.NoDataFound):
            conn.execute("SELECT pgidgen.advance_generator(99, 1)")


def test_a_used_up_time_field_is_an_error_not_a_wrap(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        near_end = (LAYOUT.max_time << LAYOUT.time_shift) | (LAYOUT.ids_per_ms - 3)
        conn.execute("SELECT pgidgen.advance_generator(0, %s)", (near_end,))
        ids = [conn.execute("SELECT shard_0.next_id()").fetchone()[0] for _ in range(2)]
        assert ids == [near_end + 1, near_end + 2] and decode(ids[-1])[0] == LAYOUT.epoch_ms + LAYOUT.max_time
        with pytest.raises(errors.NumericValueOutOfRange, match="shard 0 has used up its 52-bit time field") as info:
            conn.execute("SELECT shard_0.next_id()")
        assert "run out at" in (info.value.diag.message_hint or "")


def test_a_reset_offset_is_an_error_and_advance_generator_repairs_it(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SET statement_timeout = '10s'")  # the old generator looped forever here
        before = [r[0] for r in conn.execute("SELECT shard_1.next_id() FROM generate_series(1, 500)")]
        conn.execute("SELECT setval('shard_1.pgidgen_offset', 7, false)")  # is_called false: reads as NULL
        with pytest.raises(errors.ObjectNotInPrerequisiteState, match="generator of shard 1 has no state") as info:
            conn.execute("SELECT shard_1.next_id()")
        assert "pgidgen.advance_generator(1," in (info.value.diag.message_hint or "")
        last = conn.execute("SELECT pgidgen.last_id(1)").fetchone()[0]
        conn.execute("SELECT pgidgen.advance_generator(1, %s)", (max(before),))
        after = conn.execute("SELECT shard_1.next_id()").fetchone()[0]
        assert after > max(before) and last is not None


def test_a_hostile_search_path_changes_nothing(dsn: str) -> None:
    """Every function and operator next_id uses has a look-alike in a schema searched before pg_catalog."""
    types = ["bigint", "integer", "double precision", "timestamptz", "boolean", "regclass", "text", "numeric"]
    operators = ["+", "-", "*", "/", "=", "<>", "<", "<=", ">", ">=", "<<", ">>", "|", "&"]
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE SCHEMA evil")
        pairs = [(t, t) for t in types] + [(t, "integer") for t in types if t != "integer"]
        for i, (left, right) in enumerate(pairs):
            conn.execute(
                f"CREATE FUNCTION evil.boom{i}(a {left}, b {right}) RETURNS {left} LANGUAGE plpgsql"
                " AS $$ BEGIN RAISE EXCEPTION 'evil operator called'; END $$"
            )
            for name in operators:
                conn.execute(f"CREATE OPERATOR evil.{name} (LEFTARG = {left}, RIGHTARG = {right}, FUNCTION = evil.boom{i})")
        for sig, ret in [
            ("nextval(regclass)", "bigint"), ("currval(regclass)", "bigint"), ("setval(regclass, bigint)", "bigint"),
            ("pg_sequence_last_value(regclass)", "bigint"), ("clock_timestamp()", "timestamptz"),
            ("now()", "timestamptz"), ("to_timestamp(double precision)", "timestamptz"),
            ("floor(double precision)", "double precision"), ("date_part(text, timestamptz)", "double precision"),
            ("pg_try_advisory_xact_lock(integer, integer)", "boolean"), ("pg_advisory_xact_lock(integer, integer)", "void"), ("pg_current_xact_id()", "xid8"),
            ("int8(double precision)", "bigint"), ("float8(bigint)", "double precision"),
        ]:
            conn.execute(f"CREATE FUNCTION evil.{sig} RETURNS {ret} LANGUAGE plpgsql AS $$ BEGIN RAISE EXCEPTION 'evil function called'; END $$")
        conn.execute("SET search_path = evil, pg_catalog")
        with pytest.raises(errors.RaiseException, match="evil"):
            conn.execute("SELECT 1::bigint + 1::bigint")  # the trap is armed
        with pytest.raises(errors.RaiseException, match="evil"):
            conn.execute("SELECT nextval('shard_2.pgidgen_counter')")
        start = int(time.time() * 1000)
        burst = [r[0] for r in conn.execute("SELECT shard_2.next_id() FROM generate_series(1, 3000)")]  # fast path
        slow = []
        for _ in range(20):  # below 8 per ms: the slow path raises the offset
            slow.append(conn.execute("SELECT shard_2.next_id()").fetchone()[0])
            time.sleep(0.003)
        ids = burst + slow
        assert len(set(ids)) == len(ids)
        assert_strictly_increasing(ids, "under a hostile search_path")
        assert {decode(i)[1] for i in ids} == {2}
        assert decode(slow[-1])[0] >= start
        conn.execute("SELECT pgidgen.advance_generator(2, %s)", (ids[-1] + 1000,))
        assert conn.execute("SELECT shard_2.next_id()").fetchone()[0] > ids[-1] + 1000
        assert conn.execute("SELECT pgidgen.last_id(2)").fetchone()[0] > ids[-1] + 1000


def test_cancelled_inside_next_id_leaves_nothing_locked_or_broken(dsn: str) -> None:
    """statement_timeout = 1ms under load: cancels land in the fast path, the slow path and the lock."""
    sessions, seconds = 4, 4.0
    inside: list[int] = [0] * sessions
    cancelled: list[int] = [0] * sessions
    kept: list[list[int]] = [[] for _ in range(sessions)]
    failures: list[BaseException] = []
    conns = [psycopg.connect(dsn, autocommit=True) for _ in range(sessions)]
    deadline = time.monotonic() + seconds

    def work(k: int) -> None:
        conn = conns[k]
        try:
            conn.execute("SET statement_timeout = '1ms'")
            i = 0
            while time.monotonic() < deadline:
                i += 1
                # Alternate bursts (fast path, ahead of the clock) with paced calls (the offset is raised often).
                query = (
                    "SELECT shard_0.next_id() FROM generate_series(1, 400)"
                    if i % 2
                    else "SELECT shard_0.next_id() FROM generate_series(1, 40) WHERE pg_sleep(0.00005) IS NOT NULL"
                )
                try:
                    kept[k].extend(r[0] for r in conn.execute(query))
                except errors.QueryCanceled as e:
                    cancelled[k] += 1
                    # inside the generator's PL/pgSQL: pgidgen's shared functions, or seqlock's own in the shard
                    if any(f in (e.diag.context or "") for f in ("function pgidgen.next_id_of(", "function pgidgen.locked_next_id(", "function shard_0.")):
                        inside[k] += 1
        except BaseException as e:  # pragma: no cover - reported below
            failures.append(e)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(sessions)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failures, failures
    assert sum(inside) > 10, (cancelled, inside)
    with psycopg.connect(dsn, autocommit=True) as check:
        assert check.execute("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'").fetchone()[0] == 0
        assert check.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND state LIKE 'idle in transaction%'"
        ).fetchone()[0] == 0
    # The same sessions, and a new one, carry on; nothing handed out twice, each session still increasing.
    for k, conn in enumerate(conns):
        conn.execute("SET statement_timeout = 0")
        kept[k].extend(r[0] for r in conn.execute("SELECT shard_0.next_id() FROM generate_series(1, 50)"))
        time.sleep(0.002)
        kept[k].append(conn.execute("SELECT shard_0.next_id()").fetchone()[0])
        assert_strictly_increasing(kept[k], f"session {k}")
        conn.close()
    with psycopg.connect(dsn) as conn:
        fresh = [r[0] for r in conn.execute("SELECT shard_0.next_id() FROM generate_series(1, 50)")]
    every = [i for ids in kept for i in ids] + fresh
    assert len(every) == len(set(every))
    assert min(fresh) > max(i for ids in kept for i in ids)



def test_a_session_that_draws_from_many_shards_holds_one_set_of_plans(config: Config) -> None:
    """The shared generator: a session's cached plans do not grow with the shards it draws IDs from (seqlock's
    PL/pgSQL in every shard left 18 per shard, and PostgreSQL checks each of them for every relation invalidated:
    an application connection stalled for seconds during a migration), and an invalidation costs it nothing."""
    assert all(o.ok for o in init(config, 60, ["db1"]))
    with psycopg.connect(config.dsn("db1"), autocommit=True) as conn:
        def plans() -> int:
            row = conn.execute("SELECT count(*) FROM pg_backend_memory_contexts WHERE name = 'CachedPlanSource'").fetchone()
            return int(row[0]) if row else 0

        ids = [conn.execute(f"SELECT shard_{s}.next_id()").fetchone()[0] for s in (0, 1)]  # type: ignore[index]
        few = plans()
        ids += [conn.execute(f"SELECT shard_{s}.next_id()").fetchone()[0] for s in range(2, 60)]  # type: ignore[index]
        assert plans() == few, "cached plans grew with the shards drawn from"
        assert few < 40, few
        assert [decode(i)[1] for i in ids] == [0, 1, *range(2, 60)], "each ID carries its own shard"
