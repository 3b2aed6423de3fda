from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pgidgen.config import config_from_dict
from pgidgen.errors import ConfigError, InputError, LayoutError
from pgidgen.layout import Layout, iso_ms, parse_epoch, parse_id


def test_defaults() -> None:
    L = Layout.make()
    assert (L.time_bits, L.shard_bits, L.sequence_bits) == (40, 13, 10)
    assert L.epoch_ms == 1767225600000
    assert L.max_shards == 8192 and L.ids_per_ms == 1024
    assert L.years > 30
    assert iso_ms(L.epoch_ms + (1 << 40)) == "2060-11-03T19:53:47.776Z"


def test_fields_must_fit_below_sign_bit() -> None:
    with pytest.raises(LayoutError, match=r"time_bits 41 \+ shard_bits 13 \+ sequence_bits 10 = 64 bits, more than 63"):
        Layout.make(time_bits=41)


def test_time_field_must_last_thirty_years() -> None:
    with pytest.raises(LayoutError) as e:
        Layout.make(shard_bits=14, sequence_bits=10)
    assert e.value.render() == (
        "39 time bits last only 17.4 years from the epoch, fewer than 30: "
        "give time at least 40 bits by taking them from shard_bits or sequence_bits"
    )


def test_shard_count_checked() -> None:
    L = Layout.make()
    with pytest.raises(LayoutError, match="must be at least 1"):
        L.check_shard_count(0)
    with pytest.raises(LayoutError, match="8193 shards do not fit in 13 shard bits"):
        L.check_shard_count(8193)
    L.check_shard_count(8192)


def test_epoch_forms() -> None:
    assert parse_epoch("2026-01-01T00:00:00Z") == 1767225600000
    assert parse_epoch(1314220021721) == 1314220021721
    assert parse_epoch("1314220021721") == 1314220021721
    assert parse_epoch(dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)) == 1767225600000
    with pytest.raises(LayoutError, match="has no time zone"):
        parse_epoch("2026-01-01T00:00:00")
    with pytest.raises(LayoutError, match="neither milliseconds nor an ISO-8601 time"):
        parse_epoch("yesterday")


def test_config_layout_validation_names_the_file() -> None:
    with pytest.raises(ConfigError) as e:
        config_from_dict({"layout": {"shard_bits": 30, "sequence_bits": 30, "time_bits": 10}}, path=Path("x.toml"))
    assert e.value.render() == "time_bits 10 + shard_bits 30 + sequence_bits 30 = 70 bits, more than 63 (x.toml): generated IDs must fit below the sign bit; use fewer bits"
    with pytest.raises(ConfigError, match="unknown \\[layout\\] key"):
        config_from_dict({"layout": {"shards": 3}})


def test_parse_id_rejects() -> None:
    with pytest.raises(InputError, match="'abc' is not an ID"):
        parse_id("abc")
    with pytest.raises(InputError, match="'-1' is not an ID"):
        parse_id("-1")
    with pytest.raises(InputError, match="larger than 2\\^64-1"):
        parse_id(str(1 << 64))
    assert parse_id(str((1 << 64) - 1)) == (1 << 64) - 1


layouts = st.builds(
    lambda shard_bits, seq_bits: Layout.make(shard_bits=shard_bits, sequence_bits=seq_bits),
    st.integers(1, 13),
    st.integers(1, 10),
)


@given(layouts, st.data())
def test_decode_encode_roundtrip(L: Layout, data: st.DataObject) -> None:
    ms = data.draw(st.integers(L.epoch_ms, L.epoch_ms + L.max_time))
    shard = data.draw(st.integers(0, L.max_shards - 1))
    seq = data.draw(st.integers(0, L.ids_per_ms - 1))
    value = L.encode(ms, shard, seq)
    assert 0 <= value < 1 << 63
    assert L.decode(value) == (ms, shard, seq)
    assert L.min_id(ms) <= value <= L.max_id(ms)


def test_instagram_layout_is_unsigned() -> None:
    ig = Layout.make(epoch_ms=1314220021721, time_bits=41, shard_bits=13, sequence_bits=10, for_generation=False)
    value = ((1 << 40) + 12345) << 23 | 5000 << 10 | 7
    assert value >= 1 << 63
    assert ig.decode(value)[1:] == (5000, 7)
    assert ig.decode(value - (1 << 64))[1:] == (5000, 7)


def test_decode_refuses_values_wider_than_the_layout() -> None:
    """Layout.decode masked the bits above the layout away, so Router.shard_of routed 2^63 + an ID to that ID's
    shard, and -1 to shard 8191 (found by a review); a 64-bit layout reads every 64-bit value, signed or not."""
    L = Layout.make()
    good = L.encode(L.epoch_ms + 5, 7, 1)
    assert L.decode(good) == (L.epoch_ms + 5, 7, 1)
    for bad in ((1 << 63) | good, -1, -good):
        with pytest.raises(InputError, match="does not fit in this layout's 63 bits"):
            L.decode(bad)
    ig = Layout.make(epoch_ms=1314220021721, time_bits=41, shard_bits=13, sequence_bits=10, for_generation=False)
    assert ig.decode(-1)[1:] == ig.decode((1 << 64) - 1)[1:] == (8191, 1023)


def test_epochs_that_only_look_like_numbers_are_one_line_errors() -> None:
    """'²' passed str.isdigit() and int() raised: a traceback from decode --epoch and from a config's epoch (found
    by a review); so did a number past int()'s 4,300 digits."""
    from click.testing import CliRunner

    from pgidgen.cli import main

    for text in ("\u00b2", "\u0661\u0662", "1" * 5000):  # superscript two, Arabic-Indic digits, too long
        with pytest.raises(LayoutError, match="is neither milliseconds nor an ISO-8601 time"):
            parse_epoch(text)
        r = CliRunner().invoke(main, ["decode", "--epoch", text, "1"], env={"PGIDGEN_CONFIG": ""})
        assert r.exit_code == 1 and r.stdout == "" and "Traceback" not in r.stderr, r.stderr
        assert r.stderr.startswith("Error: epoch ") and len(r.stderr.splitlines()) == 1, r.stderr
