"""Decoding IDs in bulk (the CLI's `decode`): fast enough for millions of IDs from stdin."""
from __future__ import annotations

from typing import Iterable, Iterator

from .errors import InputError
from .layout import Layout, iso_ms, parse_id


def decode_one(layout: Layout, value: int) -> dict[str, object]:
    ms, shard, seq = layout.decode(value)
    return {"id": value, "timestamp": iso_ms(ms), "shard": shard, "sequence": seq}


def decode_lines(layout: Layout, lines: Iterable[str], *, as_json: bool) -> Iterator[str]:
    """One output line per ID; blank input lines are skipped, a malformed one stops with its line number."""
    ts_shift, shard_shift = layout.time_shift, layout.shard_shift
    tmask, smask, qmask = layout.max_time, layout.max_shards - 1, layout.ids_per_ms - 1
    epoch = layout.epoch_ms
    cache_sec = -1
    cache_prefix = ""
    for lineno, raw in enumerate(lines, 1):
        text = raw.strip()
        if not text:
            continue
        if text.isascii() and text.isdigit() and len(text) <= 20:
            value = int(text)
            if value >> 64:
                raise InputError(f"line {lineno}: {text} is larger than 2^64-1", hint="an ID is a 64-bit number")
        else:
            try:
                value = parse_id(text)
            except InputError as e:
                raise InputError(f"line {lineno}: {e.what}", hint=e.hint) from None
        ms = epoch + ((value >> ts_shift) & tmask)
        sec = ms // 1000
        if sec != cache_sec:
            cache_sec, cache_prefix = sec, iso_ms(sec * 1000)[:-5]
        stamp = f"{cache_prefix}.{ms % 1000:03d}Z"
        shard = (value >> shard_shift) & smask
        seq = value & qmask
        if as_json:
            yield f'{{"id": {value}, "timestamp": "{stamp}", "shard": {shard}, "sequence": {seq}}}'
        else:
            yield f"{value}\t{stamp}\tshard {shard}\tsequence {seq}"
