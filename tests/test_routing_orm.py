"""docs/orm.md's snippets (the shipped integrations and the mechanism), executed as written against real servers
(SQLAlchemy and Django), also across a move."""
from __future__ import annotations

import re
import sys
import types
from pathlib import Path
from typing import Any

import psycopg
import pytest
from sqlalchemy import func, select
from test_example import photos
from test_routing import hand_move

from pgidgen.config import Config
from pgidgen.init import init
from pgidgen.routing import Router

DOC = Path(__file__).resolve().parent.parent / "docs" / "orm.md"
SHARDS = 16
USER = 42  # shard 10: db2 of db1/db2


def snippets(heading: str) -> list[str]:
    """The ```python blocks of one `## heading` section of docs/orm.md, in order."""
    text = DOC.read_text(encoding="utf-8")
    section = text.split(f"\n## {heading}", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```python\n(.*?)```", section, flags=re.S)


def doc_module(name: str) -> dict[str, Any]:
    """A real module's namespace (ORMs resolve annotations through sys.modules)."""
    mod = types.ModuleType(name)
    sys.modules[name] = mod
    return mod.__dict__


def run(block: str, ns: dict[str, Any]) -> None:
    exec(compile(block, str(DOC), "exec", dont_inherit=True), ns)  # as written: no __future__ from this file


@pytest.fixture
def tables(config: Config, config_file: Path, monkeypatch: pytest.MonkeyPatch) -> Config:
    assert all(o.ok for o in init(config, SHARDS, ["db1", "db2"]))
    assert all(o.ok for o in photos.create_tables(config))
    monkeypatch.setenv("PGIDGEN_CONFIG", str(config_file))
    return config


def rows_on(config: Config, name: str, schema: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(config.dsn(name)) as conn:
        return conn.execute(f'SELECT id, caption FROM "{schema}".photos ORDER BY id').fetchall()


def test_sqlalchemy_snippets(tables: Config) -> None:
    blocks = snippets("SQLAlchemy")
    assert len(blocks) == 2
    ns = doc_module("orm_doc")
    try:
        for block in blocks:
            run(block, ns)
        shard = USER % SHARDS
        assert rows_on(tables, "db2", f"shard_{shard}")[0][1] == "sunset"
        first = rows_on(tables, "db2", f"shard_{shard}")[0][0]
        later = ns["add_photo"](USER, "later")
        assert ns["photos_between"](USER, photos.ms_to_datetime(tables.layout.decode(first)[0]), photos.ms_to_datetime(tables.layout.decode(later)[0])) == [first, later]
        # a move the (non-listening) router learns of only through PGR01: the write lands on the new database
        ns["router"].close()
        ns["router"] = Router(tables, listen=False)
        ns["router"].route(shard)
        retired = hand_move(tables, shard, "db2", "db3", ddl=photos.SCHEMA_FILE.read_text(), tables=("photos", "likes"))
        moved_id = ns["add_photo"](USER, "after the move")
        assert ns["router"].database_for(shard) == "db3"
        assert rows_on(tables, "db3", f"shard_{shard}")[-1] == (moved_id, "after the move")
        assert len(rows_on(tables, "db2", retired)) == 2  # nothing written to the old copy
        assert ns["get_photo"](moved_id).caption == "after the move"
    finally:
        if "router" in ns:
            ns["router"].close()
        for engine in ns.get("engines", {}).values():
            engine.dispose()


def shipped(heading: str) -> list[str]:
    """The ```python blocks of one `### heading` of docs/orm.md's shipped integrations."""
    text = DOC.read_text(encoding="utf-8").split("\n## The shipped integrations", 1)[1].split("\n## ", 1)[0]
    section = text.split(f"\n### {heading}", 1)[1].split("\n### ", 1)[0]
    return re.findall(r"```python\n(.*?)```", section, flags=re.S)


def test_shipped_sqlalchemy_snippet(tables: Config) -> None:
    model = doc_module("orm_doc_shipped_model")
    run(snippets("SQLAlchemy")[0], model)  # the Photo model
    model["router"].close()
    (block,) = shipped("SQLAlchemy")
    ns = doc_module("orm_doc_shipped")
    ns["Photo"] = model["Photo"]
    try:
        run(block, ns)
        shard = USER % SHARDS
        photo_id = ns["add_photo"](USER, "shipped")
        assert rows_on(tables, "db2", f"shard_{shard}") == [(photo_id, "shipped")]
        assert ns["get_photo"](photo_id).caption == "shipped"
        retired = hand_move(tables, shard, "db2", "db3", ddl=photos.SCHEMA_FILE.read_text(), tables=("photos", "likes"))
        moved_id = ns["add_photo"](USER, "after the move")
        assert rows_on(tables, "db3", f"shard_{shard}") == [(photo_id, "shipped"), (moved_id, "after the move")]
        assert len(rows_on(tables, "db2", retired)) == 1
        assert ns["get_photo"](moved_id).caption == "after the move"
        # every shard at once: the snippet as written, after the move
        (fan_block, _) = shipped("Every shard at once")
        every = {**ns, "select": select, "func": func}
        run(fan_block, every)
        assert [p.id for p in every["newest"]] == [moved_id, photo_id] and every["total"] == 2
    finally:
        if "sharding" in ns:
            ns["sharding"].dispose()
        if "router" in ns:
            ns["router"].close()
        for engine in model["engines"].values():
            engine.dispose()


def test_django_snippets(tables: Config) -> None:
    django = pytest.importorskip("django")
    from django.conf import settings
    from django.db import connections

    from pgidgen.integrations.django import get_router, use_router

    blocks = snippets("Django")
    assert len(blocks) == 3
    ns = doc_module("orm_doc_django")
    run(blocks[0], ns)
    shipped_settings, shipped_usage = shipped("Django")
    conf = doc_module("orm_doc_django_settings")
    run(shipped_settings, conf)
    keys = ("NAME", "USER", "HOST", "PORT")
    assert {a: [d.get(k) for k in keys] for a, d in conf["DATABASES"].items()} == {a: [d[k] for k in keys] for a, d in ns["DATABASES"].items()}
    settings.configure(DATABASES=conf["DATABASES"], DATABASE_ROUTERS=conf["DATABASE_ROUTERS"],
                       PGIDGEN_SHARDED_APPS=conf["PGIDGEN_SHARDED_APPS"], INSTALLED_APPS=[], USE_TZ=True)
    django.setup()
    try:
        for block in blocks[1:]:
            run(block, ns)
        shard = USER % SHARDS
        assert rows_on(tables, "db2", f"shard_{shard}")[0][1] == "sunset"
        # a block for another shard of the same database, nested: each write lands in its own block's shard
        other = next(s for s in range(SHARDS) if s != shard and ns["router"].database_for(s) == "db2")
        with ns["shard_atomic"](shard) as db:
            with ns["shard_atomic"](other) as inner_db:
                inner = ns["Photo"].objects.using(inner_db).create(user_id=other, caption="inner")
            outer = ns["Photo"].objects.using(db).create(user_id=USER, caption="outer")
        assert (ns["router"].shard_of(inner.id), ns["router"].shard_of(outer.id)) == (other, shard)
        assert rows_on(tables, "db2", f"shard_{shard}")[-1] == (outer.id, "outer")
        assert rows_on(tables, "db2", f"shard_{other}") == [(inner.id, "inner")]
        ns["router"].close()
        ns["router"] = Router(tables, listen=False)
        ns["router"].route(shard)
        retired = hand_move(tables, shard, "db2", "db1", ddl=photos.SCHEMA_FILE.read_text(), tables=("photos", "likes"))
        moved_id = ns["add_photo"](USER, "after the move")
        assert ns["router"].database_for(shard) == "db1"
        assert rows_on(tables, "db1", f"shard_{shard}")[-1] == (moved_id, "after the move")
        assert len(rows_on(tables, "db2", retired)) == 2  # "sunset" and "outer"
        assert ns["get_photo"](moved_id).caption == "after the move"
        # the shipped integration, on the same model: routed by ShardRouter inside run_on_shard's block
        app = doc_module("orm_doc_django_shipped")
        app["Photo"] = ns["Photo"]
        run(shipped_usage, app)
        shipped_id = app["add_photo"](USER, "shipped")
        assert rows_on(tables, "db1", f"shard_{shard}")[-1] == (shipped_id, "shipped")
        assert app["get_photo"](shipped_id).caption == "shipped"
    finally:
        if "router" in ns:
            ns["router"].close()
        get_router().close()
        use_router(None)
        connections.close_all()
