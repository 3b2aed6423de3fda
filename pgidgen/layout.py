"""The bit layout of an ID: [time | shard | sequence], read as an unsigned 64-bit number.

Generated IDs keep the sign bit clear (time + shard + sequence <= 63) so they are never negative in a bigint;
decoding also accepts 64-bit layouts such as Instagram's published 41/13/10, whose IDs set the sign bit.
"""
from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from .errors import InputError, LayoutError

MS_PER_YEAR = 365.2425 * 24 * 3600 * 1000
MIN_YEARS = 30
DEFAULT_EPOCH_MS = 1767225600000  # 2026-01-01T00:00:00Z
DEFAULT_SHARD_BITS = 13
DEFAULT_SEQUENCE_BITS = 10
INSTAGRAM_EPOCH_MS = 1314220021721
U64_MAX = (1 << 64) - 1
UTC = dt.timezone.utc


@dataclass(frozen=True)
class Layout:
    epoch_ms: int = DEFAULT_EPOCH_MS
    shard_bits: int = DEFAULT_SHARD_BITS
    sequence_bits: int = DEFAULT_SEQUENCE_BITS
    time_bits: int = 63 - DEFAULT_SHARD_BITS - DEFAULT_SEQUENCE_BITS

    @classmethod
    def make(
        cls,
        *,
        epoch_ms: int = DEFAULT_EPOCH_MS,
        shard_bits: int = DEFAULT_SHARD_BITS,
        sequence_bits: int = DEFAULT_SEQUENCE_BITS,
        time_bits: int | None = None,
        for_generation: bool = True,
    ) -> Layout:
        """Build and validate a layout; time_bits defaults to what remains below the sign bit."""
        for name, value in (("shard_bits", shard_bits), ("sequence_bits", sequence_bits)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise LayoutError(f"{name} must be a whole number of at least 1, not {value!r}", hint="fix [layout]")
        if time_bits is None:
            time_bits = 63 - shard_bits - sequence_bits
        if not isinstance(time_bits, int) or isinstance(time_bits, bool) or time_bits < 1:
            raise LayoutError(
                f"time_bits must be at least 1, but shard_bits {shard_bits} + sequence_bits {sequence_bits} leave {time_bits}",
                hint="use fewer shard or sequence bits",
            )
        total = time_bits + shard_bits + sequence_bits
        limit = 63 if for_generation else 64
        if total > limit:
            raise LayoutError(
                f"time_bits {time_bits} + shard_bits {shard_bits} + sequence_bits {sequence_bits} = {total} bits, more than {limit}",
                hint="generated IDs must fit below the sign bit; use fewer bits" if for_generation else "an ID has 64 bits",
            )
        if not isinstance(epoch_ms, int) or isinstance(epoch_ms, bool) or epoch_ms < 0:
            raise LayoutError(f"epoch must be a time after 1970, not {epoch_ms!r}", hint="fix [layout] epoch")
        layout = cls(epoch_ms=epoch_ms, shard_bits=shard_bits, sequence_bits=sequence_bits, time_bits=time_bits)
        if for_generation and layout.years < MIN_YEARS:
            raise LayoutError(
                f"{time_bits} time bits last only {layout.years:.1f} years from the epoch, fewer than {MIN_YEARS}",
                hint=f"give time at least {layout.min_time_bits()} bits by taking them from shard_bits or sequence_bits",
            )
        return layout

    @staticmethod
    def min_time_bits() -> int:
        bits = 1
        while (1 << bits) / MS_PER_YEAR < MIN_YEARS:
            bits += 1
        return bits

    # capacity -----------------------------------------------------------------------------------------
    @property
    def max_shards(self) -> int:
        return 1 << self.shard_bits

    @property
    def ids_per_ms(self) -> int:
        return 1 << self.sequence_bits

    @property
    def max_time(self) -> int:
        return (1 << self.time_bits) - 1

    @property
    def years(self) -> float:
        return (1 << self.time_bits) / MS_PER_YEAR

    @property
    def runs_out(self) -> dt.datetime:
        return ms_to_datetime(self.epoch_ms + (1 << self.time_bits))

    @property
    def epoch(self) -> dt.datetime:
        return ms_to_datetime(self.epoch_ms)

    # shifting -----------------------------------------------------------------------------------------
    @property
    def shard_shift(self) -> int:
        return self.sequence_bits

    @property
    def time_shift(self) -> int:
        return self.sequence_bits + self.shard_bits

    def check_shard_count(self, shards: int) -> None:
        if shards < 1:
            raise LayoutError(f"--shards must be at least 1, not {shards}", hint="give the number of logical shards, e.g. --shards 2000")
        if shards > self.max_shards:
            raise LayoutError(
                f"{shards} shards do not fit in {self.shard_bits} shard bits (at most {self.max_shards})",
                hint="use fewer shards or raise shard_bits in [layout] before the first init",
            )

    def encode(self, ms: int, shard: int, sequence: int) -> int:
        """The ID for a Unix time in ms, a shard and a sequence number (Python twin of next_id's packing)."""
        t = ms - self.epoch_ms
        if not 0 <= t <= self.max_time:
            raise InputError(f"time {ms} ms is outside this layout's range")
        if not 0 <= shard < self.max_shards:
            raise InputError(f"shard {shard} does not fit in {self.shard_bits} bits")
        if not 0 <= sequence < self.ids_per_ms:
            raise InputError(f"sequence {sequence} does not fit in {self.sequence_bits} bits")
        return (t << self.time_shift) | (shard << self.shard_shift) | sequence

    def last_id(self, shard: int, counter: int, offset: int) -> int:
        """The largest ID a shard's generator has handed out, from its counter and offset sequences' last_value
        (Python twin of pgidgen.last_id: a move reads a batch's sequences in one statement)."""
        v = min(counter + offset, self.max_time * self.ids_per_ms + self.ids_per_ms - 1)
        return ((v >> self.sequence_bits) << self.time_shift) | (shard << self.shard_shift) | (v & (self.ids_per_ms - 1))

    @property
    def bits(self) -> int:
        return self.time_bits + self.shard_bits + self.sequence_bits

    @property
    def largest_id(self) -> int:
        """The largest number that is an ID of this layout (2^bits - 1: 2^63-1 for a generating layout)."""
        return (1 << self.bits) - 1

    def not_an_id(self, what: object) -> InputError:
        """A value with bits above the layout's fields: masking them away would decode it as some other ID."""
        return InputError(
            f"{what} does not fit in this layout's {self.bits} bits ({self.time_bits} time + {self.shard_bits} shard + "
            f"{self.sequence_bits} sequence), so it is not one of its IDs",
            hint=f"its IDs run from 0 to {self.largest_id}; decode it with the layout that made it ([layout] in the config;"
                 " decode also takes --epoch, --time-bits, --shard-bits, --sequence-bits, --instagram)",
        )

    def not_generated(self, what: object) -> InputError:
        """An ID whose time field is 0: next_id() never makes one (init refuses an epoch that has not passed), so it
        is a number from elsewhere, most often an ID kept from before `pgidgen import`."""
        return InputError(f"{what} is not a pgidgen ID (its time field is 0: no next_id() made it)",
                          hint="an ID from before an import is kept as it was: find its row by its key, pgidgen locate KEY")

    def generated(self, value: int) -> bool:
        """False for a number below the first ID of the epoch's second millisecond (time field 0), which
        next_id() never returns."""
        return value < 0 or value >> self.time_shift != 0

    def decode(self, value: int) -> tuple[int, int, int]:
        """(Unix time in ms, shard, sequence) of an ID read as unsigned 64-bit (a negative one is the signed
        reading of a 64-bit layout's ID)."""
        if value < 0 and self.bits == 64:
            value &= U64_MAX
        if value < 0 or value >> self.bits:
            raise self.not_an_id(value)
        t = (value >> self.time_shift) & self.max_time
        shard = (value >> self.shard_shift) & (self.max_shards - 1)
        seq = value & (self.ids_per_ms - 1)
        return self.epoch_ms + t, shard, seq

    def min_id(self, ms: int) -> int:
        """The smallest ID of millisecond ms (Unix time): 0 before the epoch, 2^63-1 after the time field's last
        millisecond (above every ID but the last one possible), as pgidgen.min_id() in SQL."""
        t = ms - self.epoch_ms
        if t > self.max_time:
            return (1 << 63) - 1
        return max(t, 0) << self.time_shift

    def max_id(self, ms: int) -> int:
        """The largest ID of millisecond ms: -1 before the epoch (no ID is that early), 2^63-1 after the time
        field's last millisecond, as pgidgen.max_id() in SQL."""
        t = ms - self.epoch_ms
        if t < 0:
            return -1
        if t > self.max_time:
            return (1 << 63) - 1
        return (t << self.time_shift) | ((1 << self.time_shift) - 1)

    def as_dict(self) -> dict[str, object]:
        return {
            "epoch_ms": self.epoch_ms,
            "epoch": iso_ms(self.epoch_ms),
            "time_bits": self.time_bits,
            "shard_bits": self.shard_bits,
            "sequence_bits": self.sequence_bits,
            "max_shards": self.max_shards,
            "ids_per_ms_per_shard": self.ids_per_ms,
            "years": round(self.years, 1),
            "runs_out": iso_ms(self.epoch_ms + (1 << self.time_bits)),
        }


def ms_to_datetime(ms: int) -> dt.datetime:
    return dt.datetime(1970, 1, 1, tzinfo=UTC) + dt.timedelta(milliseconds=ms)


def iso_ms(ms: int) -> str:
    """ISO-8601 UTC with milliseconds, e.g. 2026-01-01T00:00:00.000Z (fast path for bulk decoding).

    Times past the year 9999 (layouts with many time bits run out there) have no ISO form: they read as such.
    """
    try:
        d = ms_to_datetime(ms)
    except OverflowError:
        return "after 9999-12-31T23:59:59.999Z"
    return f"{d.year:04d}-{d.month:02d}-{d.day:02d}T{d.hour:02d}:{d.minute:02d}:{d.second:02d}.{ms % 1000:03d}Z"


def parse_epoch(value: object) -> int:
    """Epoch from the config: milliseconds since the Unix epoch, or an ISO-8601 time with a zone."""
    if isinstance(value, bool):
        raise LayoutError(f"epoch must be milliseconds or an ISO-8601 time, not {value!r}", hint="fix [layout] epoch")
    if isinstance(value, int):
        return value
    if isinstance(value, dt.datetime):
        if value.tzinfo is None:
            raise LayoutError(f"epoch {value.isoformat()} has no time zone", hint='write it like "2026-01-01T00:00:00Z"')
        return _datetime_ms(value)
    if isinstance(value, str):
        text = value.strip()
        shown = value if len(value) <= 40 else f"{value[:20]}...({len(value)} characters)"
        if text.isascii() and text.isdigit():  # ('²' is a digit to isdigit, not to int)
            if len(text) <= 30:
                return int(text)
            raise LayoutError(f"epoch {shown!r} is neither milliseconds nor an ISO-8601 time", hint='write it like "2026-01-01T00:00:00Z"')
        try:
            parsed = dt.datetime.fromisoformat(text.replace("Z", "+00:00").replace("z", "+00:00"))
        except ValueError:
            raise LayoutError(
                f"epoch {shown!r} is neither milliseconds nor an ISO-8601 time", hint='write it like "2026-01-01T00:00:00Z"'
            ) from None
        if parsed.tzinfo is None:
            raise LayoutError(f"epoch {shown!r} has no time zone", hint='write it like "2026-01-01T00:00:00Z"')
        return _datetime_ms(parsed)
    raise LayoutError(f"epoch must be milliseconds or an ISO-8601 time, not {value!r}", hint="fix [layout] epoch")


def _datetime_ms(value: dt.datetime) -> int:
    delta = value - dt.datetime(1970, 1, 1, tzinfo=UTC)
    return delta.days * 86_400_000 + delta.seconds * 1000 + delta.microseconds // 1000


def parse_id(text: str, layout: Layout | None = None) -> int:
    """An ID as typed: a decimal number from 0 to the layout's largest ID. Without a layout (a caller that checks
    it against one later) up to 2^64-1, and the hint gives both widths a layout can have."""
    s = text.strip()
    if not s.isdigit() or not s.isascii():
        raise InputError(f"{s!r} is not an ID", hint=f"give a whole number from 0 to {_id_range(layout)}")
    digits = s.lstrip("0") or "0"
    if len(digits) > 20 or int(digits) > U64_MAX:  # (and int() refuses past 4,300 digits)
        shown = s if len(s) <= 40 else f"{s[:20]}...({len(s)} digits)"
        raise InputError(f"{shown} is larger than 2^64-1",
                         hint="an ID is a 64-bit number" if layout is None else f"an ID of this layout is at most {layout.largest_id}")
    value = int(digits)
    if layout is not None and value >> layout.bits:
        raise layout.not_an_id(value)
    return value


def _id_range(layout: Layout | None) -> str:
    """The end of the range parse_id's hint gives: the layout's largest ID, or both widths when no layout is known
    (a generating layout's IDs stay below the sign bit; a 64-bit one such as Instagram's only decodes)."""
    if layout is not None:
        return str(layout.largest_id)
    return f"{(1 << 63) - 1} (2^63-1; 2^64-1 for a 64-bit layout such as --instagram)"
