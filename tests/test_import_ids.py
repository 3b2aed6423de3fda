"""pgidgen import --ids next_id: new rows take next_id() IDs while old rows keep theirs; an ID that next_id() could
make again is refused before anything is written; an old ID is not decoded as a pgidgen one; the verify step's
checksum catches a row changed on a shard."""
from __future__ import annotations

import json
import re
from pathlib import Path

import psycopg
import pytest
from click.testing import CliRunner
from movekit import leftovers
from test_import import SHARDS, _config_file, _rows, source, two  # noqa: F401

from pgidgen.cli import main
from pgidgen.config import Config
from pgidgen.errors import PgidgenError
from pgidgen.importing import plan_import, rollback_import, start_import
from pgidgen.routing import Router

#: an identity column besides SOURCE's bigserial photos.id; a json column (no hash function: checksummed by the rows'
#: text). An enum column is not importable yet: each shard has its own copy of the type, and the staging table's
#: partitions must share their parent's.
COMMENTS = """
CREATE TABLE comments (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, user_id bigint NOT NULL, body text);
INSERT INTO comments (user_id, body) SELECT g % 30, 'b' || g FROM generate_series(1, 60) g;
ALTER TABLE logs ADD COLUMN extra json DEFAULT '{"a": [1, 2]}';
"""


def test_ids_next_id_new_rows_from_next_id_old_rows_kept(source: str, two: Config, tmp_path: Path) -> None:
    with psycopg.connect(source, autocommit=True) as c:
        c.execute(COMMENTS)
        old = sorted(c.execute("SELECT id, user_id FROM photos").fetchall())
        old_comments = sorted(c.execute("SELECT id, user_id FROM comments").fetchall())
    plan = plan_import(two, source, schema="public", key="user_id", skip=["countries"], ids="next_id")
    assert plan.id_columns == {"comments": "id", "photos": "id"} and plan.identity == ["comments"]
    assert "comments_id_seq" not in plan.sequences and "photos_id_seq" in plan.sequences  # the identity's goes with it
    assert plan.id_bound is not None and plan.id_bound > 300
    dry = CliRunner().invoke(main, ["--config", _config_file(two, tmp_path), "import", source, "--key", "user_id", "--skip", "countries",
                                    "--ids", "next_id", "--dry-run"])
    assert dry.exit_code == 0, dry.output
    assert "-- --ids next_id: every ID next_id() may return is >= " in dry.output
    assert 'ALTER TABLE "public"."comments" ALTER COLUMN "id" DROP IDENTITY;' in dry.output
    assert 'ALTER TABLE "public"."photos" ALTER COLUMN "id" SET DEFAULT next_id();' in dry.output

    run = CliRunner().invoke(main, ["--config", _config_file(two, tmp_path), "import", source, "--key", "user_id", "--skip", "countries",
                                    "--ids", "next_id", "--json"])
    assert run.exit_code == 0, run.output
    done = json.loads(run.stdout)
    assert done["step"] == "done" and done["verified_rows"] == {"comments": 60, "logs": 100, "photos": 300, "users": 126}
    assert done["id_columns"] == {"comments": "id", "photos": "id"} and done["id_bound"] >= plan.id_bound
    assert sorted(r for _, r in _rows(two, "photos", "id, user_id")) == old
    assert sorted(r for _, r in _rows(two, "comments", "id, user_id")) == old_comments
    with Router(two, listen=False) as router:
        for user in (7, -3):
            shard = router.shard_for(user)
            new = router.run_for_key(user, lambda c, u=user: c.execute(
                "INSERT INTO photos (user_id, caption) VALUES (%s, 'new') RETURNING id", (u,)).fetchone())
            assert new is not None and new[0] >= plan.id_bound and router.shard_of(new[0]) == shard == user % SHARDS
            made = router.run_for_key(user, lambda c, u=user: c.execute("INSERT INTO comments (user_id) VALUES (%s) RETURNING id", (u,)).fetchone())
            assert made is not None and router.shard_of(made[0]) == shard
    decoded = CliRunner().invoke(main, ["--config", _config_file(two, tmp_path), "decode", str(new[0])])  # the last: user -3
    assert decoded.exit_code == 0 and decoded.output.split("\t")[2] == "shard 13"
    with psycopg.connect(two.databases["db1"]) as c:  # the ledger holds the defaults with the tables
        text = c.execute("SELECT string_agg(source, '') FROM pgidgen.ddl_files").fetchone()
        assert text is not None and "SET DEFAULT next_id()" in text[0]
    assert leftovers({"source": source, **two.databases}) == []


@pytest.mark.parametrize("setup, message", [
    ("UPDATE photos SET id = 4611686018427387904 WHERE id = 1",
     r"public\.photos\.id holds IDs up to 4611686018427387904, and next_id\(\) may return any ID from \d+ on \(made at 20\d\d-.*Z\): they could collide"
     r" \(the source\): import without --ids next_id \(the table keeps its own IDs\), or renumber its rows below that bound first"),
    ("ALTER TABLE photos ALTER COLUMN id TYPE integer",
     r"public\.photos\.id is integer, and next_id\(\) makes bigint IDs \(the source\): widen it first"
     r" \(ALTER TABLE \"public\"\.\"photos\" ALTER COLUMN \"id\" TYPE bigint\), or import without --ids next_id"),
])
def test_ids_refused_before_anything_is_written(source: str, two: Config, tmp_path: Path, setup: str, message: str) -> None:
    with psycopg.connect(source, autocommit=True) as c:
        c.execute(setup)
    result = CliRunner().invoke(main, ["--config", _config_file(two, tmp_path), "import", source, "--key", "user_id", "--skip", "countries",
                                       "--ids", "next_id"])
    assert result.exit_code == 1 and "Traceback" not in result.output, result.output
    assert re.fullmatch(f"Error: {message}\n", result.output), result.output
    with psycopg.connect(source) as c:
        assert c.execute("SELECT to_regnamespace('pgidgen_import')").fetchone() == (None,)
    with psycopg.connect(two.databases["db1"]) as c:
        assert c.execute("SELECT count(*) FROM pgidgen.ddl_files").fetchone() == (0,)


def test_an_old_id_is_not_a_pgidgen_id(two: Config, tmp_path: Path) -> None:
    path = _config_file(two, tmp_path)
    said = "Error: 300 is not a pgidgen ID (its time field is 0: no next_id() made it): an ID from before an import is kept as it was: find its row by its key, pgidgen locate KEY\n"
    for args in (["decode", "300"], ["locate", "--id", "300"]):
        r = CliRunner().invoke(main, ["--config", path, *args])
        assert (r.exit_code, r.stdout, r.stderr) == (1, "", said), r.output
    with psycopg.connect(two.databases["db1"]) as c:
        row = c.execute("SELECT shard_3.next_id()").fetchone()
    assert row is not None
    r = CliRunner().invoke(main, ["--config", path, "locate", "--id", str(row[0])])
    assert r.exit_code == 0 and r.stdout.startswith(f"id {row[0]}: shard 3 on db1"), r.output


@pytest.mark.parametrize("column", ["", "ALTER TABLE users ADD COLUMN extra jsonb DEFAULT '{}', ADD COLUMN at point DEFAULT '(1,2)'"])
def test_a_row_changed_on_a_shard_fails_the_checksum(source: str, two: Config, column: str) -> None:
    """Hashed by column, and by the rows' text (point has no hash function)."""
    if column:
        with psycopg.connect(source, autocommit=True) as c:
            c.execute(column)

    def tamper(where: str) -> None:
        if where == "after:frozen":  # counts still agree: only the checksum can tell (the pause compares the key written)
            with psycopg.connect(two.databases["db2"], autocommit=True) as c:
                c.execute("UPDATE shard_9.users SET name = 'changed' WHERE user_id = 9")

    with pytest.raises(PgidgenError, match=r"^verification failed: shard_9\.users on db2, rows whose user_id is 9: its 1 row differs from the source's \(checksum\): "
                                           r"the source's writes are stopped"):
        start_import(two, source, schema="public", key="user_id", skip=["countries"], hook=tamper)
    rollback_import(two, source, schema="public")
    assert leftovers({"source": source, **two.databases}) == []
