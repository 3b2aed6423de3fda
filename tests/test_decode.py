"""decode: Python, SQL and CLI agree (property-tested), and bad IDs get one-line errors."""
from __future__ import annotations

import json

import psycopg
import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pgidgen.cli import main
from pgidgen.config import Config
from pgidgen.errors import InputError
from pgidgen.init import init
from pgidgen.layout import Layout, iso_ms


def cli(*args: str, input: str | None = None):
    return CliRunner().invoke(main, ["--config", "/nonexistent-ok.toml", *args], input=input)


def decode_cli(*args: str, input: str | None = None):
    # decode needs no config file: point PGIDGEN_CONFIG nowhere by running in an empty dir
    return CliRunner().invoke(main, ["decode", *args], input=input, env={"PGIDGEN_CONFIG": ""})


def test_decode_text_and_json() -> None:
    L = Layout.make()
    value = L.encode(1767225600000 + 123456789, 5, 7)
    r = decode_cli(str(value))
    assert r.exit_code == 0
    assert r.stdout == f"{value}\t{iso_ms(1767225600000 + 123456789)}\tshard 5\tsequence 7\n"
    r = decode_cli("--json", str(value), str(value + 1))
    rows = [json.loads(line) for line in r.stdout.splitlines()]
    assert rows[0] == {"id": value, "timestamp": "2026-01-02T10:17:36.789Z", "shard": 5, "sequence": 7}
    assert rows[1]["sequence"] == 8


def test_decode_stdin() -> None:
    L = Layout.make()
    ids = [L.encode(1767225600000 + i, i % 50, i % 1024) for i in range(7, 5000, 7)]  # from the epoch's 8th ms: time field 0 is no ID
    r = decode_cli("--json", input="\n".join(map(str, ids)) + "\n\n")
    assert r.exit_code == 0
    got = [json.loads(line) for line in r.stdout.splitlines()]
    assert [g["id"] for g in got] == ids
    assert all(g["shard"] == i % 50 for g, i in zip(got, range(7, 5000, 7), strict=True))


@pytest.mark.parametrize(
    "arg, message",
    [
        ("abc", "Error: 'abc' is not an ID: give a whole number from 0 to 9223372036854775807\n"),
        ("-1", "Error: '-1' is not an ID: give a whole number from 0 to 9223372036854775807\n"),
        ("18446744073709551616", "Error: 18446744073709551616 is larger than 2^64-1: an ID of this layout is at most 9223372036854775807\n"),
        ("1.5", "Error: '1.5' is not an ID: give a whole number from 0 to 9223372036854775807\n"),
    ],
)
def test_decode_bad_ids(arg: str, message: str) -> None:
    r = decode_cli("--", arg)
    assert (r.exit_code, r.stdout, r.stderr) == (1, "", message)


def test_decode_bad_stdin_line() -> None:
    r = decode_cli(input="8388609\nxyz\n")  # the epoch's second millisecond, shard 0, sequence 1
    assert r.stdout.startswith("8388609\t2026-01-01T00:00:00.001Z\tshard 0\tsequence 1")
    assert r.exit_code == 1
    assert r.stderr == "Error: line 2: 'xyz' is not an ID: give a whole number from 0 to 9223372036854775807\n"
    for digits in ("\u00b2", "\u0663"):  # superscript two, Arabic-Indic three: digits to str.isdigit, not IDs
        r = decode_cli(input=f"8388609\n{digits}\n")
        assert (r.exit_code, r.stderr) == (1, f"Error: line 2: {digits!r} is not an ID: give a whole number from 0 to 9223372036854775807\n")


def test_instagram_ids_decode_unsigned() -> None:
    value = ((1 << 40) + 99) << 23 | 5000 << 10 | 1
    for args in (["--instagram"], ["--epoch", "1314220021721", "--time-bits", "41", "--shard-bits", "13", "--sequence-bits", "10"],
                 ["--instagram", "--epoch", "1314220021721"], ["--instagram", "--shard-bits", "13"]):  # options that restate it keep 41 time bits
        r = decode_cli("--json", *args, str(value))
        assert r.exit_code == 0, r.output
        row = json.loads(r.stdout)
        assert (row["shard"], row["sequence"]) == (5000, 1)
        assert row["timestamp"] == iso_ms(1314220021721 + (1 << 40) + 99)


def test_decode_layout_options_validated() -> None:
    r = decode_cli("--shard-bits", "40", "--sequence-bits", "30", "8388609")
    assert r.exit_code == 1
    assert r.stderr.startswith("Error: time_bits must be at least 1")


@pytest.fixture
def db_layout() -> Layout:
    return Layout.make(shard_bits=10, sequence_bits=8)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_python_sql_cli_agree(data: st.DataObject, fresh_dsns: dict[str, str]) -> None:
    L = Layout.make(shard_bits=10, sequence_bits=8)
    cfg = Config(layout=L, databases={"db1": fresh_dsns["db1"]})
    with psycopg.connect(fresh_dsns["db1"], autocommit=True) as conn:
        if conn.execute("SELECT to_regnamespace('pgidgen')").fetchone()[0] is None:
            init(cfg, 2, ["db1"])
        ms = data.draw(st.integers(L.epoch_ms, L.epoch_ms + L.max_time))
        shard = data.draw(st.integers(0, L.max_shards - 1))
        seq = data.draw(st.integers(0, L.ids_per_ms - 1))
        value = L.encode(ms, shard, seq)
        row = conn.execute(
            "SELECT (pgidgen.decode(%(v)s)).*, pgidgen.min_id(pgidgen.id_time(%(v)s)), pgidgen.max_id(pgidgen.id_time(%(v)s)),"
            " floor(extract(epoch FROM pgidgen.id_time(%(v)s)) * 1000)::bigint",
            {"v": value},
        ).fetchone()
    ts, sshard, sseq, lo, hi, sms = row
    assert (sms, sshard, sseq) == L.decode(value) == (ms, shard, seq)
    assert lo == L.min_id(ms) and hi == L.max_id(ms) and lo <= value <= hi
    r = CliRunner().invoke(main, ["decode", "--json", "--epoch", str(L.epoch_ms), "--shard-bits", "10", "--sequence-bits", "8", str(value)])
    if ms == L.epoch_ms:  # time field 0: no next_id() made it, the CLI says so
        assert r.exit_code == 1 and "is not a pgidgen ID" in r.stderr
    else:
        assert json.loads(r.stdout) == {"id": value, "timestamp": iso_ms(ms), "shard": shard, "sequence": seq}
    assert ts.isoformat(timespec="milliseconds").replace("+00:00", "Z") == iso_ms(ms)


def test_time_range_bounds_outside_the_layout(config: Config) -> None:
    """min_id/max_id past either end of the time field bound what exists instead of clamping into the first or
    last millisecond: a range wholly before the epoch or after the last millisecond matches no ID (but the very
    last one the layout can make, which no test can reach); infinity too; `<` still means "made before". The
    Python layout agrees."""
    L = config.layout
    init(config, 1, ["db1"])
    first, last = L.encode(L.epoch_ms, 0, 0), L.encode(L.epoch_ms + L.max_time, L.max_shards - 1, L.ids_per_ms - 1)
    before, after = L.epoch_ms - 86_400_000, L.epoch_ms + L.max_time + 86_400_000
    with psycopg.connect(config.dsn("db1"), autocommit=True) as conn:
        def bounds(ts: str) -> tuple[int, int]:
            return conn.execute(f"SELECT pgidgen.min_id({ts}), pgidgen.max_id({ts})").fetchone()  # type: ignore[return-value]

        def ms(unix_ms: int) -> str:
            return f"to_timestamp({unix_ms} / 1000.0)"

        assert bounds(ms(before)) == (0, -1) == (L.min_id(before), L.max_id(before))
        assert bounds(ms(after)) == (2**63 - 1, 2**63 - 1) == (L.min_id(after), L.max_id(after))
        assert bounds("'-infinity'::timestamptz") == (0, -1)
        assert bounds("'infinity'::timestamptz") == (2**63 - 1, 2**63 - 1)
        assert bounds(ms(L.epoch_ms)) == (first, L.max_id(L.epoch_ms)) == (L.min_id(L.epoch_ms), L.max_id(L.epoch_ms))
        assert bounds(ms(L.epoch_ms + L.max_time))[1] == last
        count = "SELECT count(*) FROM (VALUES (%s::bigint), (%s::bigint)) AS v (id) WHERE id BETWEEN pgidgen.min_id({}) AND pgidgen.max_id({})"
        late = L.encode(L.epoch_ms + L.max_time, 0, 0)  # in the last millisecond, not the last ID itself
        assert conn.execute(count.format(ms(before - 1000), ms(before)), (first, late)).fetchone()[0] == 0
        assert conn.execute(count.format(ms(after), ms(after + 1000)), (first, late)).fetchone()[0] == 0
        assert conn.execute(count.format("'-infinity'", "'infinity'"), (first, last)).fetchone()[0] == 2
        assert conn.execute(count.format(ms(before), ms(after)), (first, last)).fetchone()[0] == 2
        below = "SELECT count(*) FROM (VALUES (%s::bigint), (%s::bigint)) AS v (id) WHERE id < pgidgen.min_id({})"
        assert conn.execute(below.format(ms(after)), (first, first + 1)).fetchone()[0] == 2
        assert conn.execute(below.format("'infinity'"), (first, first + 1)).fetchone()[0] == 2


def test_time_range_uses_primary_key(config: Config) -> None:
    init(config, 4, ["db1"])
    with psycopg.connect(config.dsn("db1"), autocommit=True) as conn:
        conn.execute("CREATE TABLE shard_2.events (id bigint PRIMARY KEY DEFAULT shard_2.next_id(), v int)")
        conn.execute("INSERT INTO shard_2.events (v) SELECT g FROM generate_series(1, 20000) g")
        conn.execute("ANALYZE shard_2.events")
        plan = "\n".join(
            r[0]
            for r in conn.execute(
                "EXPLAIN SELECT * FROM shard_2.events WHERE id BETWEEN pgidgen.min_id(now() - interval '1 hour') AND pgidgen.max_id(now())"
            )
        )
        assert "events_pkey" in plan
        n = conn.execute(
            "SELECT count(*) FROM shard_2.events WHERE id BETWEEN pgidgen.min_id(now() - interval '1 hour') AND pgidgen.max_id(clock_timestamp())"
        ).fetchone()[0]
        assert n == 20000
        assert conn.execute("SELECT count(*) FROM shard_2.events WHERE id < pgidgen.min_id(now() - interval '1 hour')").fetchone()[0] == 0


@pytest.mark.parametrize("args, message", [
    (["init", "--shards", "abc"], "Error: Invalid value for '--shards': 'abc' is not a valid integer. (pgidgen init): see 'pgidgen init --help'"),
    (["move-shard", "--frob", "1", "db2"], "Error: No such option '--frob'. (pgidgen move-shard): see 'pgidgen move-shard --help'"),
    (["nosuch"], "Error: No such command 'nosuch'. (pgidgen): see 'pgidgen --help'"),
])
def test_usage_errors_are_one_line_and_exit_1(args: list[str], message: str) -> None:
    """Like every other error (README: one line, exit status 1), not click's usage text and status 2."""
    r = CliRunner().invoke(main, args, prog_name="pgidgen")
    assert r.exit_code == 1 and r.output == message + "\n", r.output


def test_decode_huge_and_negative_numbers_are_one_line_errors() -> None:
    """Past 4,300 digits int() raised (a traceback); '-1' without '--' was taken for an option (found by a review)."""
    huge = "1" * 4301
    for r, hint in ((decode_cli(huge), "an ID of this layout is at most 9223372036854775807"), (decode_cli(input=huge + "\n"), "an ID of this layout is at most 9223372036854775807")):
        assert r.exit_code == 1 and r.stdout == "" and "Traceback" not in r.stderr
        assert f"11111111111111111111...(4301 digits) is larger than 2^64-1: {hint}" in r.stderr, r.stderr
    r = decode_cli("-1")
    assert (r.exit_code, r.stderr) == (1, "Error: '-1' is not an ID: give a whole number from 0 to 9223372036854775807\n")
    r = decode_cli("000000000000000000000008388650")  # leading zeros are still the number
    assert r.exit_code == 0 and "shard 0\tsequence 42" in r.stdout


def test_ids_wider_than_the_layout_are_refused() -> None:
    """The default layout's IDs have 63 bits: 2^63 decoded as the epoch, shard 0, sequence 0 (the same as ID 0),
    and 2^64-1 as a plausible time in 2060, shard 8191 (found by a review). Arguments: refused before anything is
    printed; stdin: refused at its line. A 64-bit layout (--instagram) still reads them."""
    wide = "Error: {} does not fit in this layout's 63 bits (40 time + 13 shard + 10 sequence), so it is not one of its IDs: its IDs run from 0 to 9223372036854775807; decode it with the layout that made it ([layout] in the config; decode also takes --epoch, --time-bits, --shard-bits, --sequence-bits, --instagram)\n"
    for value in (1 << 63, (1 << 64) - 1):
        r = decode_cli("1", str(value))
        assert (r.exit_code, r.stdout, r.stderr) == (1, "", wide.format(value))
        r = decode_cli(input=f"8388609\n{value}\n")
        assert r.exit_code == 1 and r.stdout.startswith("8388609\t") and r.stderr == wide.format(f"line 2: {value}"), r.stderr
        assert decode_cli("--instagram", str(value)).exit_code == 0
    r = decode_cli("--shard-bits", "8", "--sequence-bits", "8", "--time-bits", "40", str(1 << 56))  # a 56-bit layout
    assert r.exit_code == 1 and "does not fit in this layout's 56 bits (40 time + 8 shard + 8 sequence)" in r.stderr, r.stderr
    r = decode_cli(str((1 << 63) - 1))  # the last ID of the layout
    assert r.exit_code == 0 and "shard 8191\tsequence 1023" in r.stdout


def test_a_number_no_next_id_made_is_not_decoded() -> None:
    """An ID kept from before `pgidgen import` (a serial's 300) decoded as made in the epoch's first millisecond:
    a number whose time field is 0 is refused, in arguments before anything is printed, on stdin at its line."""
    said = "Error: {} is not a pgidgen ID (its time field is 0: no next_id() made it): an ID from before an import is kept as it was: find its row by its key, pgidgen locate KEY\n"
    r = decode_cli("8388609", "300")
    assert (r.exit_code, r.stdout, r.stderr) == (1, "", said.format(300))
    r = decode_cli(input="8388609\n8388607\n")  # the last number of the epoch's first millisecond
    assert r.exit_code == 1 and r.stdout.startswith("8388609\t") and r.stderr == said.format("line 2: 8388607")
    assert decode_cli("8388608").exit_code == 0  # the epoch's second millisecond, shard 0, sequence 0


def test_a_malformed_id_is_told_the_layouts_range() -> None:
    """decode hinted "a whole number from 0 to 18446744073709551615" and then refused 2^64-1: the default layout has
    63 bits (found by a newcomer, issue 36). With the layout known the hint gives its own range, and 2^64-1 gets the
    refusal that names the layout's bits; an Instagram (64-bit) layout takes up to 2^64-1."""
    from pgidgen.decode import parse_ids

    L = Layout.make()
    for text in ("abc", "-1", "1.5", ""):
        with pytest.raises(InputError) as e:
            parse_ids(L, ["1", text])
        assert e.value.render() == f"{text!r} is not an ID: give a whole number from 0 to 9223372036854775807"
    with pytest.raises(InputError) as e:
        parse_ids(L, [str(2**64 - 1)])
    assert e.value.render().startswith("18446744073709551615 does not fit in this layout's 63 bits (40 time + 13 shard + 10 sequence),"
                                       " so it is not one of its IDs: its IDs run from 0 to 9223372036854775807; ")
    assert parse_ids(L, [str(2**63 - 1), " 7 "]) == [2**63 - 1, 7]
    narrow = Layout.make(shard_bits=8, sequence_bits=8, time_bits=40)
    with pytest.raises(InputError, match=r"^'x' is not an ID: give a whole number from 0 to 72057594037927935$"):
        parse_ids(narrow, ["x"])
    instagram = Layout(epoch_ms=1314220021721, time_bits=41, shard_bits=13, sequence_bits=10)
    assert parse_ids(instagram, [str(2**64 - 1)]) == [2**64 - 1]
    with pytest.raises(InputError, match=r"^'x' is not an ID: give a whole number from 0 to 18446744073709551615$"):
        parse_ids(instagram, ["x"])
    with pytest.raises(InputError, match=r"^99999999999999999999999 is larger than 2\^64-1: an ID of this layout is at most 9223372036854775807$"):
        parse_ids(L, ["99999999999999999999999"])
    r = decode_cli(input="8388609\nabc\n")  # stdin: the config's layout (here the default) is known
    assert r.stderr == "Error: line 2: 'abc' is not an ID: give a whole number from 0 to 9223372036854775807\n"


@pytest.mark.parametrize("args", [["decode", "8388609"], ["--help"], ["layout"]])
def test_output_to_a_full_disk_is_a_one_line_error(args: list[str]) -> None:
    """`pgidgen decode 123 > /dev/full` (a full disk) printed a traceback (found by a review): one line, exit 1."""
    import subprocess
    import sys

    with open("/dev/full", "w") as full:
        r = subprocess.run([sys.executable, "-m", "pgidgen", *args], stdout=full, stderr=subprocess.PIPE, text=True, timeout=60)
    assert r.returncode == 1, r.stderr
    assert r.stderr == "Error: cannot write the output: No space left on device: free some space, or write it elsewhere\n", r.stderr


@pytest.mark.parametrize("time_bits", [None, 41])  # the whole 63 bits, and a layout narrower than them
def test_sql_readers_refuse_what_is_not_an_id(fresh_dsns: dict[str, str], time_bits: int | None) -> None:
    """pgidgen.decode/shard_of/id_time/id_sequence masked a negative bigint (or one with bits above the layout's
    fields) into some other ID's time, shard and sequence (-1 read as the last shard), where `pgidgen decode` and
    Router.shard_of refuse it (found by a review): they raise 22003 with the Python side's message."""
    L = Layout.make(shard_bits=10, sequence_bits=8, time_bits=time_bits)
    init(Config(layout=L, databases={"db1": fresh_dsns["db1"]}), 2, ["db1"])
    last = (1 << L.bits) - 1
    bad = [-1, -(2**63)] + ([1 << L.bits, 2**63 - 1] if L.bits < 63 else [])
    with psycopg.connect(fresh_dsns["db1"], autocommit=True) as conn:
        for fn in ("decode", "shard_of", "id_time", "id_sequence"):
            for value in bad:
                with pytest.raises(psycopg.errors.NumericValueOutOfRange) as e:
                    conn.execute(f"SELECT pgidgen.{fn}(%s::bigint)", (value,))
                assert e.value.diag.message_primary == f"pgidgen: {L.not_an_id(value).what}", (fn, value)
                assert "decode it with the layout that made it" in (e.value.diag.message_hint or "")
        row = conn.execute("SELECT (pgidgen.decode(%(v)s)).*, pgidgen.shard_of(%(v)s), pgidgen.id_sequence(%(v)s)",
                           {"v": last}).fetchone()
        ms, shard, seq = L.decode(last)
        assert row[1:] == (shard, seq, shard, seq) and row[1:3] == (L.max_shards - 1, L.ids_per_ms - 1)
        assert conn.execute("SELECT pgidgen.shard_of(id) FROM (VALUES (0::bigint), (%s), (NULL)) AS v (id)", (last,)).fetchall() == [
            (0,), (L.max_shards - 1,), (None,)]
