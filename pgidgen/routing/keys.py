"""Keys and IDs to shards: the part of routing that needs no database."""
from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any

from ..errors import InputError
from ..layout import Layout

#: (key, shard_count) -> shard
ShardKey = Callable[[Any, int], int]


def modulo(key: Any, shard_count: int) -> int:
    """Instagram's rule: an integer key (a user_id) lives on shard key % shard_count. Python's %, so always a
    shard from 0 to shard_count - 1, a negative key too (-7 of 2000 shards: shard 1993); pgidgen.shard_for_key(key)
    is the same rule in SQL (catalog revision 8), for an application that routes there."""
    if isinstance(key, bool) or not isinstance(key, int):
        raise InputError(
            f"shard key {key!r} is not an integer",
            hint="route integer keys (like a user_id), or give Router(shard_key=hashed) for strings and other keys",
        )
    return key % shard_count


def hashed(key: Any, shard_count: int) -> int:
    """Any key whose str() is stable (strings, UUIDs): a 64-bit BLAKE2b of it, mod shard_count. Stable across
    processes and Python versions, unlike hash()."""
    digest = hashlib.blake2b(str(key).encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "big") % shard_count


def shard_of_id(layout: Layout, id_: int) -> int:
    """The shard inside an ID (the Python twin of pgidgen.shard_of)."""
    if isinstance(id_, bool) or not isinstance(id_, int):
        raise InputError(f"{id_!r} is not an ID", hint="an ID is a whole number")
    return layout.decode(id_)[1]
