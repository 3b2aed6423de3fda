"""The rewrite alone (no database): positions, placeholders, what stays as written."""
from __future__ import annotations

import pytest

from pgidgen.ddl import parse_file
from pgidgen.errors import InputError


def test_syntax_error_position_counts_characters_not_bytes() -> None:
    with pytest.raises(InputError) as e:
        parse_file("CREATE TABLE café (note text DEFAULT 'œuvre');\nCREATE TABL x (a int);\n", "s.sql")
    assert e.value.render() == 'syntax error at or near "TABL" (s.sql:2:8): fix the SQL; nothing was applied'


def test_statement_positions_skip_comments() -> None:
    f = parse_file("/* header */\n-- photos\n  CREATE TABLE a (x int);   CREATE TABLE b (y int);\n", "s.sql")
    assert [(s.number, s.line, s.column, s.kind) for s in f.statements] == [(1, 3, 3, "CREATE TABLE"), (2, 3, 29, "CREATE TABLE")]


def test_placeholder_never_collides_with_the_file() -> None:
    f = parse_file("CREATE TABLE pgidgen_shard_schema (x text DEFAULT 'pgidgen_shard_schema_1');\n", "s.sql")
    assert f.placeholder == "pgidgen_shard_schema_2"
    assert f.for_shard(7) == (
        "SET LOCAL search_path = shard_7, pg_catalog, pg_temp;\n"
        "CREATE TABLE shard_7.pgidgen_shard_schema (x text DEFAULT 'pgidgen_shard_schema_1');\n"
    )


def test_user_qualified_references_stay_and_builtin_calls_are_untouched() -> None:
    f = parse_file("CREATE VIEW v AS SELECT c.code, now(), lower(p.caption) FROM photos p JOIN public.countries c ON c.code = p.country;", "v.sql")
    assert f.for_shard(2).splitlines()[1] == (
        "CREATE VIEW shard_2.v AS SELECT c.code, now(), lower(p.caption) FROM shard_2.photos AS p INNER JOIN public.countries AS c ON c.code = p.country;"
    )


def test_drop_and_rename_and_grant_are_qualified() -> None:
    f = parse_file(
        "DROP INDEX photos_user; DROP TRIGGER t ON photos; ALTER TABLE photos RENAME TO pics; GRANT SELECT ON pics TO app;"
        " DROP FUNCTION touch();",
        "d.sql",
    )
    assert f.for_shard(1).splitlines()[1:] == [
        "DROP INDEX shard_1.photos_user;",
        "DROP TRIGGER t ON shard_1.photos;",
        "ALTER TABLE shard_1.photos RENAME TO pics;",
        "GRANT SELECT ON TABLE shard_1.pics TO app;",
        "DROP FUNCTION shard_1.touch ();",
    ]


def test_types_policies_materialized_views_and_revoke() -> None:
    f = parse_file(
        "CREATE TYPE span AS RANGE (subtype = int4); CREATE DOMAIN pos AS int CHECK (VALUE > 0);"
        " CREATE TYPE pair AS (a pos, b span); ALTER TYPE mood ADD VALUE 'meh';"
        " CREATE POLICY own ON photos USING (user_id = current_setting('app.user')::bigint);"
        " CREATE MATERIALIZED VIEW counts AS SELECT user_id, count(*) FROM photos GROUP BY user_id;"
        " REVOKE ALL ON photos FROM PUBLIC;",
        "t.sql",
    )
    assert f.for_shard(3).splitlines()[1:] == [
        "CREATE TYPE shard_3.span AS RANGE (subtype = int4);",
        "CREATE DOMAIN shard_3.pos AS integer CHECK (value > 0);",
        "CREATE TYPE shard_3.pair AS (a shard_3.pos,  b shard_3.span);",
        "ALTER TYPE shard_3.mood ADD VALUE 'meh';",
        "CREATE POLICY own ON shard_3.photos AS PERMISSIVE FOR all TO PUBLIC USING (user_id = CAST(current_setting('app.user') AS bigint));",
        "CREATE MATERIALIZED VIEW shard_3.counts AS SELECT user_id, count(*) FROM shard_3.photos GROUP BY user_id;",
        "REVOKE ALL PRIVILEGES ON TABLE shard_3.photos FROM PUBLIC;",
    ]


def test_error_at_end_of_input_points_past_the_last_statement() -> None:
    with pytest.raises(InputError) as e:
        parse_file("CREATE TABLE a (\n  x int,\n", "s.sql")
    assert e.value.render() == "syntax error at end of input (s.sql:2:9): fix the SQL; nothing was applied"


def test_comments_only() -> None:
    with pytest.raises(InputError) as e:
        parse_file("-- nothing yet\n", "s.sql")
    assert e.value.render() == "s.sql holds no SQL statements: give a file with CREATE TABLE and the like"
