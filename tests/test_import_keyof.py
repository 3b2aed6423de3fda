"""pgidgen import --key-of: a table that reaches the key through a foreign key (likes -> photos), under a writer
that inserts, moves and deletes its rows while the import follows and up to the cutover; the refusals; a rollback
that leaves the shards empty and nothing behind."""
from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from click.testing import CliRunner
from movekit import leftovers
from test_import import SHARDS, _config_file, _rows, source, two  # noqa: F401

from pgidgen import locktable
from pgidgen.cli import main
from pgidgen.config import Config
from pgidgen.errors import PgidgenError
from pgidgen.importing import ImportResult, resume_import, rollback_import, start_import
from pgidgen.importing.keyof import KeyOf, parse_key_of
from pgidgen.init import init
from pgidgen.move.rebalance import rebalance
from pgidgen.routing import Router

LIKES = """
CREATE TABLE likes (id bigserial PRIMARY KEY, photo_id bigint NOT NULL REFERENCES photos (id) ON DELETE CASCADE, n int);
INSERT INTO likes (photo_id, n) SELECT 1 + g % 300, g FROM generate_series(1, 400) g;
COMMENT ON CONSTRAINT likes_photo_id_fkey ON likes IS 'a like is of a photo';
ALTER TABLE likes ADD reply_to bigint, ADD CONSTRAINT likes_reply_to_fkey FOREIGN KEY (reply_to) REFERENCES likes (id) NOT VALID,
                  ADD liker bigint REFERENCES users (user_id);
"""
#: the shards' foreign keys from likes as the source's dump made them (the first settle drops and adds them again)
LIKES_FKS = [("likes_liker_fkey", "FOREIGN KEY (liker) REFERENCES shard_0.users(user_id)", True, None),
             ("likes_photo_id_fkey", "FOREIGN KEY (photo_id) REFERENCES shard_0.photos(id) ON DELETE CASCADE", True, "a like is of a photo"),
             ("likes_reply_to_fkey", "FOREIGN KEY (reply_to) REFERENCES shard_0.likes(id) NOT VALID", False, None)]
ROUTE = parse_key_of(["likes=photo_id:photos.id"])


@pytest.fixture
def keyed(source: str) -> Iterator[str]:  # noqa: F811
    with psycopg.connect(source, autocommit=True) as c:
        c.execute(LIKES)
    yield source


def _placed(cfg: Config) -> dict[int, int]:
    """like id -> the shard it is in (asserting it is in one only)."""
    at: dict[int, int] = {}
    for shard, (like,) in _rows(cfg, "likes", "id"):
        assert like not in at, f"like {like} in shards {at[like]} and {shard}"
        at[like] = shard
    return at


def _fks_added_again(c: psycopg.Connection[Any]) -> dict[str, bool]:
    """Each foreign key name of the shards' likes on a database -> whether the first settle added it again in every
    shard (after the rows), by oid: its oids are then all above those of the shards' tables and indexes."""
    rows = c.execute("SELECT conname, min(oid) > (SELECT max(oid) FROM pg_class WHERE relnamespace::regnamespace::text LIKE 'shard%%')"
                     " FROM pg_constraint WHERE conrelid::regclass::text LIKE 'shard%%.likes' AND contype = 'f' GROUP BY 1").fetchall()
    return dict(rows)


def _under_writer(source: str, cfg: Config, route: dict[str, KeyOf], step: Callable[[psycopg.Connection[Any], int], None]) -> ImportResult:
    """The import followed and cut over while a writer runs step(conn, n) in a transaction, n = 0, 1, ... until a
    write is refused (the cutover's); asserted done, after more than 10 steps."""
    stop = threading.Event()
    done_ops: list[int] = []

    def write() -> None:
        with psycopg.connect(source, autocommit=True) as c:
            n = 0
            while not stop.is_set():
                try:
                    with c.transaction():
                        step(c, n)
                except psycopg.Error:
                    return
                done_ops.append(n)
                n += 1

    th = threading.Thread(target=write, daemon=True)
    th.start()
    followed = start_import(cfg, source, schema="public", key="user_id", skip=["countries"], key_of=route, follow=True)
    assert followed.step == "copied"
    done = resume_import(cfg, source, schema="public", cutover=True)
    th.join(30)
    stop.set()
    assert done.step == "done" and len(done_ops) > 10
    return done


def test_key_of_rows_follow_their_parent_under_a_writer(keyed: str, two: Config) -> None:  # noqa: F811
    def step(c: psycopg.Connection[Any], n: int) -> None:
        c.execute("INSERT INTO likes (photo_id, n) VALUES (%s, %s)", (1 + n % 300, -n))
        c.execute("UPDATE likes SET photo_id = 1 + (photo_id + 7) %% 300 WHERE id = %s", (1 + n % 400,))  # to another parent
        c.execute("DELETE FROM likes WHERE id = %s", (400 - n % 400,))
        if n % 25 == 0:
            c.execute("DELETE FROM photos WHERE id = %s", (300 - n // 25,))  # its likes go by cascade

    done = _under_writer(keyed, two, ROUTE, step)
    with psycopg.connect(keyed) as c:
        want = dict(c.execute("SELECT l.id, p.user_id FROM likes l JOIN photos p ON p.id = l.photo_id").fetchall())
    assert done.verified["likes"] == len(want)
    placed = _placed(two)
    assert sorted(placed) == sorted(want)
    assert all(shard == want[like] % SHARDS for like, shard in placed.items())
    assert leftovers({"source": keyed, **two.databases}) == []
    with psycopg.connect(two.databases["db1"]) as c:
        assert c.execute("SELECT conname, pg_get_constraintdef(oid), convalidated, obj_description(oid, 'pg_constraint') FROM pg_constraint"
                         " WHERE conrelid = 'shard_0.likes'::regclass AND contype = 'f' ORDER BY 1").fetchall() == LIKES_FKS
        assert _fks_added_again(c) == {"likes_liker_fkey": False, "likes_photo_id_fkey": True, "likes_reply_to_fkey": False}
        assert c.execute("SELECT to_regclass('public.likes'), to_regnamespace('pgidgen_import')").fetchone() == (None, None)


def test_rollback_empties_the_shards_and_leaves_nothing(keyed: str, two: Config) -> None:  # noqa: F811
    start_import(two, keyed, schema="public", key="user_id", skip=["countries"], key_of=ROUTE, follow=True)
    assert len(_placed(two)) == 400  # routed once the copy is done
    rollback_import(two, keyed, schema="public")
    assert _rows(two, "likes", "id") == [] and _rows(two, "photos", "id") == []
    assert leftovers({"source": keyed, **two.databases}) == []
    for dsn in two.databases.values():
        with psycopg.connect(dsn) as c:
            assert c.execute("SELECT to_regclass('public.likes'), to_regnamespace('pgidgen_import')").fetchone() == (None, None)
    with psycopg.connect(keyed) as c:
        c.execute("INSERT INTO likes (photo_id) VALUES (1)")  # serving as before


@pytest.mark.parametrize("setup, key_of, message", [
    ("", [], "table public.likes has no column user_id (the source): route it through its parent with --key-of likes=COLUMN:PARENT.PARENTCOL"),
    ("", ["likes=photo_id"], "--key-of likes=photo_id is not TABLE=COLUMN:PARENT.PARENTCOL"),
    ("", ["likes=photo_id:pictures.id"], "--key-of likes: pictures is not a table of schema public"),
    ("", ["likes=pic_id:photos.id"], "--key-of likes: public.likes has no column pic_id"),
    ("", ["likes=photo_id:likes.id"], "--key-of likes: its parent is the table itself"),
    ("", ["likes=photo_id:photos.caption"], "--key-of likes: public.photos.caption is not unique"),
    ("ALTER TABLE likes ALTER COLUMN photo_id DROP NOT NULL; INSERT INTO likes (photo_id) VALUES (NULL)", ["likes=photo_id:photos.id"],
     "--key-of likes: public.likes.photo_id holds NULLs"),
    ("ALTER TABLE likes DROP CONSTRAINT likes_photo_id_fkey; INSERT INTO likes (photo_id) VALUES (100000)", ["likes=photo_id:photos.id"],
     "--key-of likes: rows of public.likes have a photo_id no photos.id has"),
    ("CREATE TABLE tags (photo_id bigint NOT NULL, tag text)", ["likes=photo_id:photos.id", "tags=photo_id:photos.id"],
     "--key-of tags: public.tags has no primary key"),
])
def test_key_of_refused_before_anything_is_written(keyed: str, two: Config, tmp_path: Path, setup: str, key_of: list[str], message: str) -> None:  # noqa: F811
    if setup:
        with psycopg.connect(keyed, autocommit=True) as c:
            c.execute(setup)
    args = [a for k in key_of for a in ("--key-of", k)]
    result = CliRunner().invoke(main, ["--config", _config_file(two, tmp_path), "import", keyed, "--key", "user_id", "--skip", "countries", *args])
    assert result.exit_code == 1 and message in result.output, result.output
    with psycopg.connect(keyed) as c:
        assert c.execute("SELECT to_regnamespace('pgidgen_import')").fetchone() == (None,)
    assert leftovers({"source": keyed, **two.databases}) == []


def test_dry_run_says_the_route(keyed: str, two: Config, tmp_path: Path) -> None:  # noqa: F811
    result = CliRunner().invoke(main, ["--config", _config_file(two, tmp_path), "import", keyed, "--key", "user_id", "--skip", "countries",
                                       "--key-of", "likes=photo_id:photos.id", "--dry-run"])
    assert result.exit_code == 0, result.output
    assert "-- public.likes: about" in result.output and "key via photo_id -> photos.id" in result.output
    assert 'ALTER TABLE "public"."likes" ENABLE REPLICA TRIGGER pgidgen_dirty;' in result.output
    assert 'SELECT "pgidgen_import"."settle_likes"(false, 3);' in result.output
    with psycopg.connect(keyed) as c:
        assert c.execute("SELECT to_regnamespace('pgidgen_import')").fetchone() == (None,)


def test_stopped_after_the_copy_then_resumed(keyed: str, two: Config) -> None:  # noqa: F811
    """The settle after the copy runs again on --resume (its journal line was not written): each row once still."""
    def crash(where: str) -> None:
        if where == "after:copied":
            raise RuntimeError(where)
    with pytest.raises(RuntimeError):
        start_import(two, keyed, schema="public", key="user_id", skip=["countries"], key_of=ROUTE, hook=crash)
    with psycopg.connect(keyed, autocommit=True) as c:
        c.execute("UPDATE likes SET photo_id = 2 WHERE id <= 50")
    done = resume_import(two, keyed, schema="public")
    assert done.step == "done" and done.verified["likes"] == 400
    with psycopg.connect(keyed) as c:
        want = dict(c.execute("SELECT l.id, p.user_id FROM likes l JOIN photos p ON p.id = l.photo_id").fetchall())
    assert _placed(two) == {like: user % SHARDS for like, user in want.items()}
    assert leftovers({"source": keyed, **two.databases}) == []


@pytest.mark.parametrize("deferred", [False, True])
def test_a_not_valid_foreign_key_still_checks_each_row(keyed: str, two: Config, deferred: bool) -> None:  # noqa: F811
    """The first settle adds a shard's validated foreign keys from likes to photos again after its rows; a NOT VALID one it
    leaves in place, checking each row as it goes in (added again, it would check none): a like that replies to a
    like in another shard fails the settle, and a rollback leaves nothing. Deferred, its pending checks would make
    the ALTER TABLE fail: the settle then checks every foreign key row by row."""
    with psycopg.connect(keyed, autocommit=True) as c:
        if deferred:
            c.execute("ALTER TABLE likes ALTER CONSTRAINT likes_reply_to_fkey DEFERRABLE INITIALLY DEFERRED")
        c.execute("UPDATE likes SET reply_to = (SELECT l.id FROM likes l JOIN photos p ON p.id = l.photo_id WHERE p.user_id %% %s <> ("
                  " SELECT p1.user_id %% %s FROM likes l1 JOIN photos p1 ON p1.id = l1.photo_id WHERE l1.id = 1) LIMIT 1) WHERE id = 1", (SHARDS, SHARDS))
    with pytest.raises(PgidgenError, match='violates foreign key constraint "likes_reply_to_fkey"'):
        start_import(two, keyed, schema="public", key="user_id", skip=["countries"], key_of=ROUTE)
    rollback_import(two, keyed, schema="public")
    assert _rows(two, "likes", "id") == [] and leftovers({"source": keyed, **two.databases}) == []


def test_the_lock_table_full_the_settle_checks_row_by_row(keyed: str, two: Config, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    """With no room in the lock table (locktable.HEADROOM 0), the first settle keeps the shards' foreign keys in
    place and checks each row, as when the lock table is short: the import completes all the same."""
    monkeypatch.setattr(locktable, "HEADROOM", 0.0)
    done = start_import(two, keyed, schema="public", key="user_id", skip=["countries"], key_of=ROUTE)
    assert done.step == "done" and len(_placed(two)) == 400
    for dsn in two.databases.values():
        with psycopg.connect(dsn) as c:
            assert _fks_added_again(c) == {"likes_liker_fkey": False, "likes_photo_id_fkey": False, "likes_reply_to_fkey": False}


def test_imported_shards_rebalance_to_a_third_database(keyed: str, fresh_dsns: dict[str, str], config: Config) -> None:  # noqa: F811
    """After the import, the shards are like any: a rebalance onto a database that joined later moves them, rows,
    routes and all, and the Router finds a user's rows there."""
    three = Config(layout=config.layout, databases={n: fresh_dsns[n] for n in ("db1", "db2", "db3")})
    assert all(o.ok for o in init(three, SHARDS, ["db1", "db2"]))
    assert start_import(three, keyed, schema="public", key="user_id", skip=["countries"], key_of=ROUTE).step == "done"
    result = rebalance(three, ["db1", "db2", "db3"], parallel=1, by="count")
    assert result.ok and result.reports and not result.differ
    moved = sorted(s for r in result.reports for s in r.shards)
    with psycopg.connect(keyed) as c:
        want = dict(c.execute("SELECT l.id, p.user_id FROM likes l JOIN photos p ON p.id = l.photo_id").fetchall())
        user = next(u for u in c.execute("SELECT user_id FROM users ORDER BY user_id").fetchall() if u[0] % SHARDS in moved)[0]
        liked = c.execute("SELECT count(*) FROM likes l JOIN photos p ON p.id = l.photo_id WHERE ((p.user_id %% 16) + 16) %% 16 = %s",
                          (user % SHARDS,)).fetchone()
    assert _placed(three) == {like: u % SHARDS for like, u in want.items()}
    with Router(three) as router:
        assert router.shard_for(user) == user % SHARDS and router.database_for(user % SHARDS) == "db3"
        got = router.run_for_key(user, lambda c: c.execute(f"SELECT count(*) FROM shard_{user % SHARDS}.likes").fetchone())
    assert got == liked
    assert leftovers({"source": keyed, **three.databases}) == []


def test_a_parent_whose_key_changes_takes_its_children_along(keyed: str, two: Config) -> None:  # noqa: F811
    """While the import follows: photo 5 moves to another shard of its database, photo 6 to a shard of the other
    database; their likes follow them (the parents' map marks them to be settled again)."""
    start_import(two, keyed, schema="public", key="user_id", skip=["countries"], key_of=ROUTE, follow=True)
    with psycopg.connect(keyed, autocommit=True) as c:
        c.execute("UPDATE photos SET user_id = 3 WHERE id = 5")  # shard 0 -> 3, on db1
        c.execute("UPDATE photos SET user_id = user_id + 8 WHERE id = 6")  # shard 1 -> 9, on db2
        want = dict(c.execute("SELECT l.id, p.user_id FROM likes l JOIN photos p ON p.id = l.photo_id").fetchall())
        moved = [r[0] for r in c.execute("SELECT id FROM likes WHERE photo_id IN (5, 6)")]
    done = resume_import(two, keyed, schema="public", cutover=True)
    assert done.step == "done" and moved
    placed = _placed(two)
    assert placed == {like: user % SHARDS for like, user in want.items()}
    assert {placed[like] for like in moved} == {3, 9}


COMMENTS = """
CREATE TABLE comments (id bigserial PRIMARY KEY, like_id bigint NOT NULL REFERENCES likes (id) ON DELETE CASCADE, body text);
CREATE INDEX ON comments (like_id);
INSERT INTO comments (like_id, body) SELECT 1 + g % 400, 'comment ' || g FROM generate_series(1, 500) g;
"""
CHAIN = parse_key_of(["comments=like_id:likes.id", "likes=photo_id:photos.id"])


def test_a_chain_of_key_of_follows_every_link_under_a_writer(keyed: str, two: Config) -> None:  # noqa: F811
    """comments -> likes -> photos, the child named first. While the import follows and up to the cutover, a writer
    adds comments, moves a comment to another like, a like to another photo (its comments follow it), a photo to
    a user on the other database (its likes and their comments follow), and deletes a like (its comments go by
    cascade). Every comment ends in the shard of its like's photo's user, once, and the verification agrees (ahead
    of the pause too: a photo that comes to a database and leaves it between two settles places its likes'
    comments nowhere there, yet the source's snapshot may have them in that shard; their value is recorded)."""
    with psycopg.connect(keyed, autocommit=True) as c:
        c.execute(COMMENTS)

    def step(c: psycopg.Connection[Any], n: int) -> None:
        c.execute("INSERT INTO comments (like_id, body) VALUES (%s, 'new')", (1 + n * 13 % 380,))
        c.execute("UPDATE comments SET like_id = %s WHERE id = %s", (1 + n * 7 % 380, 1 + n % 500))
        c.execute("UPDATE likes SET photo_id = 1 + (photo_id + 7) %% 290 WHERE id = %s", (1 + 2 * n % 380,))
        c.execute("UPDATE photos SET user_id = CASE WHEN user_id < 100 THEN user_id + 8 ELSE user_id - 80 END WHERE id = %s",
                  (1 + 3 * n % 290,))  # to another shard, of the other database or of its own
        if n % 5 == 0:
            c.execute("DELETE FROM likes WHERE id = (SELECT max(id) FROM likes) AND id > 385")

    done = _under_writer(keyed, two, CHAIN, step)
    with psycopg.connect(keyed) as c:
        want = dict(c.execute("SELECT m.id, p.user_id FROM comments m JOIN likes l ON l.id = m.like_id JOIN photos p ON p.id = l.photo_id").fetchall())
    assert done.verified["comments"] == len(want)
    at: dict[int, int] = {}
    for shard, (comment,) in _rows(two, "comments", "id"):
        assert comment not in at, f"comment {comment} in shards {at[comment]} and {shard}"
        at[comment] = shard
    assert at == {comment: user % SHARDS for comment, user in want.items()}
    for dsn in two.databases.values():  # on both databases
        with psycopg.connect(dsn) as c:
            shards = [r[0] for r in c.execute("SELECT shard FROM pgidgen.shards WHERE state = 'active'")]
        assert set(at.values()) & set(shards)
    assert leftovers({"source": keyed, **two.databases}) == []


def test_a_chain_with_plain_foreign_keys_settled_again_on_resume(keyed: str, two: Config) -> None:  # noqa: F811
    """The shards get the source's foreign keys: comments -> likes here without ON DELETE, so a like may leave its
    shard only after its comments, and come back before them. Killed after the copy, the import settles every row
    again on --resume (what the first settle put in the shards taken out first, children first); meanwhile likes
    with comments changed in place, moved to another photo, and a photo moved to another user."""
    with psycopg.connect(keyed, autocommit=True) as c:
        c.execute(COMMENTS.replace(" ON DELETE CASCADE", ""))

    def crash(where: str) -> None:
        if where == "after:copied":
            raise RuntimeError(where)
    with pytest.raises(RuntimeError):
        start_import(two, keyed, schema="public", key="user_id", skip=["countries"], key_of=CHAIN, follow=True, hook=crash)
    with psycopg.connect(keyed, autocommit=True) as c:
        c.execute("UPDATE likes SET n = n + 1 WHERE id <= 20")
        c.execute("UPDATE likes SET photo_id = 2 WHERE id BETWEEN 21 AND 40")
        c.execute("UPDATE photos SET user_id = user_id + 8 WHERE id IN (3, 4)")
    followed = resume_import(two, keyed, schema="public")
    assert followed.step == "copied"
    with psycopg.connect(keyed, autocommit=True) as c:  # while following: the same again, settled in the rounds
        c.execute("UPDATE likes SET n = n + 1 WHERE id <= 20")
        c.execute("UPDATE likes SET photo_id = 5 WHERE id BETWEEN 41 AND 60")
        c.execute("UPDATE photos SET user_id = user_id + 8 WHERE id IN (5, 6)")
    done = resume_import(two, keyed, schema="public", cutover=True)
    assert done.step == "done" and done.verified["comments"] == 500
    with psycopg.connect(keyed) as c:
        want = dict(c.execute("SELECT m.id, p.user_id FROM comments m JOIN likes l ON l.id = m.like_id JOIN photos p ON p.id = l.photo_id").fetchall())
    assert dict((comment, shard) for shard, (comment,) in _rows(two, "comments", "id")) == {m: user % SHARDS for m, user in want.items()}
    assert leftovers({"source": keyed, **two.databases}) == []


@pytest.mark.parametrize("setup, key_of, message", [
    ("", ["comments=like_id:likes.id", "likes=photo_id:comments.id"], "--key-of comments: its parents come back on themselves (comments -> likes -> comments)"),
    ("", ["comments=like_id:likes.n", "likes=photo_id:photos.id"], "--key-of comments: public.likes.n is not unique"),
    ("CREATE UNIQUE INDEX ON likes (n)", ["comments=like_id:likes.n", "likes=photo_id:photos.id"],
     "--key-of comments: public.likes.n is not the primary key of likes, which is routed by --key-of"),
    ("", ["comments=like_id:likes.id"], "--key-of comments: its parent public.likes has no column user_id"),
])
def test_a_chain_refused_before_anything_is_written(keyed: str, two: Config, tmp_path: Path, setup: str, key_of: list[str], message: str) -> None:  # noqa: F811
    with psycopg.connect(keyed, autocommit=True) as c:
        c.execute(COMMENTS + setup)
    args = [a for k in key_of for a in ("--key-of", k)]
    result = CliRunner().invoke(main, ["--config", _config_file(two, tmp_path), "import", keyed, "--key", "user_id", "--skip", "countries", *args])
    assert result.exit_code == 1 and message in result.output, result.output
    assert leftovers({"source": keyed, **two.databases}) == []


def test_a_comment_written_with_no_like_is_refused_before_the_pause(keyed: str, two: Config) -> None:  # noqa: F811
    """Without a foreign key the application may write a child whose chain breaks (here the comment's like does not
    exist): the verification ahead of the pause refuses, naming the chain, and the source serves on."""
    with psycopg.connect(keyed, autocommit=True) as c:
        c.execute(COMMENTS.replace(" REFERENCES likes (id) ON DELETE CASCADE", ""))
    assert start_import(two, keyed, schema="public", key="user_id", skip=["countries"], key_of=CHAIN, follow=True).step == "copied"
    with psycopg.connect(keyed, autocommit=True) as c:
        c.execute("INSERT INTO comments (like_id, body) VALUES (100000, 'no like')")
    with pytest.raises(PgidgenError, match=r"verification failed before the cutover: 1 rows of public\.comments (whose like_id is 100000 )?"
                                           r"reach no photos row \(through comments -> likes -> photos\): they have no shard"):
        resume_import(two, keyed, schema="public", cutover=True)
    rollback_import(two, keyed, schema="public")
    with psycopg.connect(keyed, autocommit=True) as c:
        c.execute("DELETE FROM comments WHERE like_id = 100000")  # writable again
    assert leftovers({"source": keyed, **two.databases}) == []
