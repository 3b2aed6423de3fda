"""A small photo-sharing app on pgidgen: users' photos and likes, sharded by user_id.

    pgidgen apply-ddl examples/schema.sql      # the tables in every shard (or: python examples/photos.py setup)
    python examples/photos.py demo             # insert, list, fetch by ID alone, like, a time range
    python examples/photos.py write --user 42 --seconds 5   # a continuous writer (run a move meanwhile)
    python examples/photos.py show --user 42   # a user's photos and where they live

Every query is plain SQL on unqualified tables: the router puts the user's shard schema first on search_path,
so `INSERT INTO photos ...` lands in shard_N.photos and `DEFAULT next_id()` is shard_N.next_id().
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg

from pgidgen.config import Config
from pgidgen.db import Outcome
from pgidgen.ddl.apply import apply_ddl, read_file
from pgidgen.errors import PgidgenError
from pgidgen.layout import ms_to_datetime
from pgidgen.routing import Router

SCHEMA_FILE = Path(__file__).resolve().parent / "schema.sql"


@dataclass(frozen=True)
class Photo:
    id: int
    user_id: int
    caption: str
    created_at: dt.datetime


class PhotoApp:
    def __init__(self, router: Router) -> None:
        self.router = router

    # writes go to the owner's shard; Router.run re-runs them on the new database if a move flips the shard
    def add_photo(self, user_id: int, caption: str) -> int:
        def work(conn: psycopg.Connection[Any]) -> int:
            row = conn.execute("INSERT INTO photos (user_id, caption) VALUES (%s, %s) RETURNING id", (user_id, caption)).fetchone()
            assert row is not None
            return int(row[0])

        return self.router.run_for_key(user_id, work)

    def like(self, photo_id: int, user_id: int) -> bool:
        """A like lives with the photo: the shard inside the photo's ID says where."""

        def work(conn: psycopg.Connection[Any]) -> bool:
            cur = conn.execute(
                "INSERT INTO likes (photo_id, user_id) SELECT id, %s FROM photos WHERE id = %s ON CONFLICT DO NOTHING",
                (user_id, photo_id),
            )
            return cur.rowcount == 1

        return self.router.run_for_id(photo_id, work)

    def id_time(self, any_id: int) -> dt.datetime:
        """When an ID was made, no query needed: to the millisecond, or up to 4 ms later for a busy shard
        (docs/next_id.md, "Time")."""
        return ms_to_datetime(self.router.layout.decode(any_id)[0])

    # reads
    def photos_of(self, user_id: int, *, limit: int = 20) -> list[Photo]:
        """Newest first: IDs are time-sortable, so ORDER BY id is ORDER BY creation time."""
        return self.router.run_for_key(
            user_id,
            lambda conn: _photos(conn, "SELECT id, user_id, caption, created_at FROM photos WHERE user_id = %s ORDER BY id DESC LIMIT %s", (user_id, limit)),
            read_only=True,
        )

    def photo(self, photo_id: int) -> Photo | None:
        """By ID alone: decode the shard from the ID, go to the database serving it."""
        found = self.router.run_for_id(
            photo_id,
            lambda conn: _photos(conn, "SELECT id, user_id, caption, created_at FROM photos WHERE id = %s", (photo_id,)),
            read_only=True,
        )
        return found[0] if found else None

    def likers(self, photo_id: int) -> list[int]:
        return self.router.run_for_id(
            photo_id,
            lambda conn: [r[0] for r in conn.execute("SELECT user_id FROM likes WHERE photo_id = %s ORDER BY user_id", (photo_id,))],
            read_only=True,
        )

    def photos_between(self, user_id: int, start: dt.datetime, end: dt.datetime) -> list[Photo]:
        """A time range on the primary key alone: the ID's high bits are its creation time (give or take the
        4 ms a busy shard's IDs may run ahead; docs/next_id.md, "Time")."""
        return self.router.run_for_key(
            user_id,
            lambda conn: _photos(
                conn,
                "SELECT id, user_id, caption, created_at FROM photos"
                " WHERE user_id = %s AND id BETWEEN pgidgen.min_id(%s) AND pgidgen.max_id(%s) ORDER BY id",
                (user_id, start, end),
            ),
            read_only=True,
        )


def _photos(conn: psycopg.Connection[Any], query: str, params: Sequence[Any]) -> list[Photo]:
    return [Photo(*row) for row in conn.execute(query, params)]


def create_tables(config: Config, ddl_path: Path = SCHEMA_FILE) -> list[Outcome]:
    """The schema file in every shard of every database: `pgidgen apply-ddl examples/schema.sql`, from Python
    (all or nothing across databases, recorded in the DDL ledger, a no-op when already applied)."""
    return apply_ddl(config, read_file(ddl_path)).outcomes


# -- the command line ------------------------------------------------------------------------------------


def cmd_demo(app: PhotoApp, users: int) -> None:
    r = app.router
    start = dt.datetime.now(dt.timezone.utc)
    ids: dict[int, list[int]] = {}
    for user in range(1, users + 1):
        ids[user] = [app.add_photo(user, f"photo {n} of user {user}") for n in range(1, 4)]
    for user, got in ids.items():
        shard = r.shard_for(user)
        print(f"user {user}: shard {shard} on {r.database_for(shard)}, photo IDs {got}")
    first = ids[1][0]
    p = app.photo(first)
    assert p is not None
    print(f"photo {first} by ID alone: shard {r.shard_of(first)} on {r.database_for(r.shard_of(first))}: {p.caption!r} by user {p.user_id}")
    for liker in (2, 3):
        app.like(first, liker)
    print(f"photo {first} is liked by users {app.likers(first)}")
    latest = app.photos_of(1)
    print(f"user 1's photos, newest first: {[x.id for x in latest]}")
    second = ids[1][1]
    until = app.id_time(second)
    between = app.photos_between(1, start, until)
    print(f"user 1's photos made from {start:%H:%M:%S.%f} to {until:%H:%M:%S.%f} (photo {second}'s time): {[x.id for x in between]}")


def cmd_write(app: PhotoApp, user: int, seconds: float) -> int:
    """Write photos for one user for a while, then read every one back: a move during this must lose nothing."""
    r = app.router
    shard = r.shard_for(user)
    before = r.database_for(shard)
    written: list[int] = []
    slowest = 0.0
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        t0 = time.monotonic()
        written.append(app.add_photo(user, f"photo {len(written)}"))
        slowest = max(slowest, time.monotonic() - t0)
    missing = [i for i in written if app.photo(i) is None]
    after = r.database_for(shard)
    out = {
        "user": user,
        "shard": shard,
        "database_before": before,
        "database_after": after,
        "written": len(written),
        "duplicates": len(written) - len(set(written)),
        "increasing": written == sorted(written),
        "missing": len(missing),
        "slowest_write_ms": round(slowest * 1000, 1),
        "moved_errors_retried": r.stats["moved"],
        "map_loads": r.stats["map_loads"],
    }
    print(json.dumps(out))
    return 0 if not missing and out["duplicates"] == 0 and out["increasing"] else 1


def cmd_show(app: PhotoApp, user: int) -> None:
    r = app.router
    shard = r.shard_for(user)
    photos = app.photos_of(user, limit=1_000_000)
    print(f"user {user}: shard {shard} on {r.database_for(shard)}, {len(photos)} photos" + (f", newest {photos[0].id}" if photos else ""))


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="photos.py", description="A photo app sharded by user_id on pgidgen.")
    ap.add_argument("--config", help="pgidgen config file (default: ./pgidgen.toml or $PGIDGEN_CONFIG)")
    sub = ap.add_subparsers(dest="command", required=True)
    sub.add_parser("setup", help="examples/schema.sql in every shard (what `pgidgen apply-ddl` does)")
    d = sub.add_parser("demo", help="insert, list, fetch by ID, like, time range")
    d.add_argument("--users", type=int, default=3)
    w = sub.add_parser("write", help="write photos for one user for a while, then verify them all")
    w.add_argument("--user", type=int, required=True)
    w.add_argument("--seconds", type=float, default=5.0)
    s = sub.add_parser("show", help="a user's photo count and where they live")
    s.add_argument("--user", type=int, required=True)
    args = ap.parse_args(argv)
    try:
        with Router.from_config(args.config) as router:
            app = PhotoApp(router)
            if args.command == "setup":
                outcomes = create_tables(router.config)
                for o in outcomes:
                    print(f"{o.database}: {o.summary}" + (f": {o.error}" if o.error else ""))
                if not all(o.ok for o in outcomes):
                    return 1
            elif args.command == "demo":
                cmd_demo(app, args.users)
            elif args.command == "write":
                return cmd_write(app, args.user, args.seconds)
            elif args.command == "show":
                cmd_show(app, args.user)
    except PgidgenError as e:
        print(f"Error: {e.render()}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
