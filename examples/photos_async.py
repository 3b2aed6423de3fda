"""The photo app on asyncio: AsyncRouter (psycopg's async connections and pools), many users writing at once.

    pgidgen apply-ddl examples/schema.sql                        # the tables in every shard
    python examples/photos_async.py write --users 8 --seconds 5  # 8 concurrent writers, then every photo read back
    python examples/photos_async.py show --user 42               # a user's photo count and where they live

The same semantics as the sync Router (examples/photos.py): each unit of work claims its shard with its first
statement, and AsyncRouter.run runs it again on the new database when a move flips the shard, so a move during
`write` loses nothing and surfaces nothing: the JSON it prints says so.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections.abc import Sequence
from typing import Any

import psycopg

from pgidgen.errors import PgidgenError
from pgidgen.routing import AsyncRouter


async def add_photo(router: AsyncRouter, user_id: int, caption: str) -> int:
    async def work(conn: psycopg.AsyncConnection[Any]) -> int:
        cur = await conn.execute("INSERT INTO photos (user_id, caption) VALUES (%s, %s) RETURNING id", (user_id, caption))
        row = await cur.fetchone()
        assert row is not None
        return int(row[0])

    return await router.run_for_key(user_id, work)


async def photo_exists(router: AsyncRouter, photo_id: int) -> bool:
    """By ID alone: the shard is inside the ID."""
    async def work(conn: psycopg.AsyncConnection[Any]) -> bool:
        cur = await conn.execute("SELECT 1 FROM photos WHERE id = %s", (photo_id,))
        return await cur.fetchone() is not None

    return await router.run_for_id(photo_id, work, read_only=True)


async def cmd_write(router: AsyncRouter, users: Sequence[int], seconds: float) -> dict[str, Any]:
    """One task per user writing photos until the time is up; then every photo read back by its ID."""
    written: dict[int, list[int]] = {u: [] for u in users}
    errors: list[str] = []
    deadline = time.monotonic() + seconds

    async def writer(user: int) -> None:
        while time.monotonic() < deadline:
            try:
                written[user].append(await add_photo(router, user, f"photo {len(written[user])}"))
            except PgidgenError as e:  # what the application would see (none expected: moves are retried)
                errors.append(e.render())

    before = {u: await router.database_for(router.shard_for(u)) for u in users}
    await asyncio.gather(*(writer(u) for u in users))
    every = [i for ids in written.values() for i in ids]
    # read back with as many at a time as the pools hold connections: thousands of tasks all waiting on a pool at
    # once would each count the whole queue against the pool's timeout
    slots = asyncio.Semaphore(router.max_size)

    async def exists(photo_id: int) -> bool:
        async with slots:
            return await photo_exists(router, photo_id)

    found = await asyncio.gather(*(exists(i) for i in every))
    return {
        "users": len(users),
        "written": len(every),
        "duplicates": len(every) - len(set(every)),
        "increasing": all(ids == sorted(ids) for ids in written.values()),
        "missing": found.count(False),
        "errors": errors,
        "moved": sorted({u for u in users if await router.database_for(router.shard_for(u)) != before[u]}),
        "moved_errors_retried": router.stats["moved"],
    }


async def cmd_show(router: AsyncRouter, user: int) -> str:
    shard = router.shard_for(user)

    async def count(conn: psycopg.AsyncConnection[Any]) -> int:
        cur = await conn.execute("SELECT count(*) FROM photos WHERE user_id = %s", (user,))
        row = await cur.fetchone()
        return int(row[0]) if row else 0

    n = await router.run(shard, count, read_only=True)
    return f"user {user}: shard {shard} on {await router.database_for(shard)}, {n} photos"


async def amain(args: argparse.Namespace) -> int:
    async with AsyncRouter.from_config(args.config) as router:
        if args.command == "write":
            out = await cmd_write(router, list(range(args.first_user, args.first_user + args.users)), args.seconds)
            print(json.dumps(out))
            return 0 if not out["missing"] and not out["duplicates"] and not out["errors"] and out["increasing"] else 1
        print(await cmd_show(router, args.user))
        return 0


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="photos_async.py", description="The photo app on asyncio (AsyncRouter).")
    ap.add_argument("--config", help="pgidgen config file (default: ./pgidgen.toml or $PGIDGEN_CONFIG)")
    sub = ap.add_subparsers(dest="command", required=True)
    w = sub.add_parser("write", help="concurrent writers, one per user, then every photo read back")
    w.add_argument("--users", type=int, default=8)
    w.add_argument("--first-user", type=int, default=1)
    w.add_argument("--seconds", type=float, default=5.0)
    s = sub.add_parser("show", help="a user's photo count and where they live")
    s.add_argument("--user", type=int, required=True)
    args = ap.parse_args(argv)
    try:
        return asyncio.run(amain(args))
    except PgidgenError as e:
        print(f"Error: {e.render()}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
