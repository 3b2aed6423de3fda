"""Decoding IDs in bulk (the CLI's `decode`): fast enough for millions of IDs from stdin.

A number whose time field is 0 is refused, not decoded: next_id() never makes one, and it is most often an ID kept
from before `pgidgen import` (decoded, it would claim to be made in the epoch's first millisecond).
"""
from __future__ import annotations

from collections.abc import Iterable, Iterator

from .errors import InputError
from .layout import Layout, iso_ms, parse_id


def decode_one(layout: Layout, value: int) -> dict[str, object]:
    ms, shard, seq = layout.decode(value)
    return {"id": value, "timestamp": iso_ms(ms), "shard": shard, "sequence": seq}


def parse_ids(layout: Layout, texts: Iterable[str]) -> list[int]:
    """IDs given as arguments, all checked against the layout before any is decoded (so a bad one prints nothing);
    a malformed one is told the layout's range of IDs."""
    return [parse_id(text, layout) for text in texts]


def check_generated(layout: Layout, ids: Iterable[int]) -> None:
    """Refuses the first number no next_id() made (time field 0: an ID kept from before an import, most often)."""
    for value in ids:
        if not layout.generated(value):
            raise layout.not_generated(value)


def decode_lines(layout: Layout, lines: Iterable[str], *, as_json: bool) -> Iterator[str]:
    """One output line per ID; blank input lines are skipped, a malformed one stops with its line number."""
    ts_shift, shard_shift = layout.time_shift, layout.shard_shift
    tmask, smask, qmask = layout.max_time, layout.max_shards - 1, layout.ids_per_ms - 1
    epoch, width = layout.epoch_ms, layout.bits
    days: dict[int, str] = {}  # day number -> "YYYY-MM-DDT": a layout's time field spans some 10^4 days
    cache_sec, cache_prefix = None, ""  # the last second's "YYYY-MM-DDTHH:MM:SS": IDs often come in time order
    for lineno, raw in enumerate(lines, 1):
        text = raw.strip()
        if not text:
            continue
        if text.isascii() and text.isdigit() and len(text) <= 20:
            value = int(text)
            if value >> 64:
                raise InputError(f"line {lineno}: {text} is larger than 2^64-1", hint=f"an ID of this layout is at most {layout.largest_id}")
        else:
            try:
                value = parse_id(text, layout)
            except InputError as e:
                raise InputError(f"line {lineno}: {e.what}", hint=e.hint) from None
        if value >> width:
            raise layout.not_an_id(f"line {lineno}: {value}")
        if not value >> ts_shift:
            raise layout.not_generated(f"line {lineno}: {value}")
        ms = epoch + ((value >> ts_shift) & tmask)
        sec, milli = divmod(ms, 1000)
        if sec != cache_sec:
            day, rem = divmod(sec, 86_400)
            prefix = days.get(day)
            if prefix is None:
                prefix = days[day] = iso_ms(day * 86_400_000)[:11]
            if prefix[-1] == "T":
                h, rem = divmod(rem, 3_600)
                cache_sec, cache_prefix = sec, f"{prefix}{h:02d}:{rem // 60:02d}:{rem % 60:02d}"
            else:  # past the year 9999: no ISO form
                cache_sec, cache_prefix = None, ""
        stamp = f"{cache_prefix}.{milli:03d}Z" if cache_sec is not None else iso_ms(ms)
        shard = (value >> shard_shift) & smask
        seq = value & qmask
        if as_json:
            yield f'{{"id": {value}, "timestamp": "{stamp}", "shard": {shard}, "sequence": {seq}}}'
        else:
            yield f"{value}\t{stamp}\tshard {shard}\tsequence {seq}"
