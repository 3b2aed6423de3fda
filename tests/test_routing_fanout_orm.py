"""The ORM paths of a fan-out (issue 34): a Django queryset through pgidgen.integrations.django.fan_out (in a process
of its own: Django is configured once a process), and a SQLAlchemy query that names no shard through a Sharding's
session, merged and ordered across the shards."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from sqlalchemy import BigInteger, Text, func, select
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column
from test_routing_fanout import ROWS, Row, reference, rows, spread  # noqa: F401 (fixtures)

from pgidgen.config import Config
from pgidgen.errors import InputError, RoutingError
from pgidgen.integrations.sqlalchemy import Sharding
from pgidgen.routing import Router

HERE = Path(__file__).resolve().parent


class Base(DeclarativeBase):
    pass


class Item(Base):
    __tablename__ = "items"
    id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    k: Mapped[int] = mapped_column(BigInteger)
    note: Mapped[str | None] = mapped_column(Text)

DJANGO = textwrap.dedent('''
    import json
    import django
    from django.conf import settings
    from pgidgen.integrations.django import databases
    settings.configure(DATABASES=databases(), DATABASE_ROUTERS=["pgidgen.integrations.django.ShardRouter"],
                       PGIDGEN_SHARDED_APPS=["app"], INSTALLED_APPS=[], USE_TZ=True)
    django.setup()
    from django.db import models
    from django.db.models import Count, Max
    from django.db.models.functions import Length
    from pgidgen.errors import InputError
    from pgidgen.integrations.django import fan_out, get_router

    class Item(models.Model):
        id = models.BigAutoField(primary_key=True)
        k = models.BigIntegerField()
        note = models.TextField(null=True)

        class Meta:
            app_label = "app"
            db_table = "items"
            managed = False
            ordering = ["id"]

    out = {}
    newest = fan_out(Item.objects.order_by("-id")[:5])
    out["newest"] = [(o.id, o.k, o.note, o._state.db) for o in newest]
    out["shards"] = [get_router().shard_of(o.id) for o in newest]
    out["k2"] = fan_out(Item.objects.filter(k=2).values_list("id", flat=True))  # the model's ordering: id
    out["pairs"] = fan_out(Item.objects.filter(note__isnull=True).order_by("-note", "pk").values_list("id", "note")[:3])
    out["per_k"] = fan_out(Item.objects.values("k").annotate(n=Count("id"), top=Max("id")).order_by("-n", "k"), combine=(None, "sum", "max"))
    out["few"] = [o.id for o in fan_out(Item.objects.all()[:4], shards=[5])]
    errors = []
    for qs, kw in ((Item.objects.all()[2:4], {}), (Item.objects.values("k").annotate(n=Count("id")), {}),
                   (Item.objects.order_by(Length("note")), {})):
        try:
            fan_out(qs, **kw)
        except InputError as e:
            errors.append(str(e))
    out["errors"] = errors
    print(json.dumps(out))
''')


def test_a_django_queryset_fanned_out(spread: Config, rows: list[Row], config_file: Path) -> None:  # noqa: F811
    env = {**os.environ, "PGIDGEN_CONFIG": str(config_file), "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-c", DJANGO], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    newest = reference(rows, [(1, True)], 5)
    assert [tuple(r[:3]) for r in out["newest"]] == [r[1:] for r in newest]
    assert [r[3] for r in out["newest"]] == ["db1" if s < 4 else "db2" for s, *_ in newest] and out["shards"] == [r[0] for r in newest]
    assert out["k2"] == sorted(r[1] for r in rows if r[2] == 2)
    assert [tuple(p) for p in out["pairs"]] == [(r[1], None) for r in reference([r for r in rows if r[3] is None], [(1, False)], 3)]
    per_k: dict[int, list[int]] = {}
    for r in rows:
        per_k.setdefault(r[2], []).append(r[1])
    assert out["per_k"] == [{"k": k, "n": len(ids), "top": max(ids)} for k, ids in sorted(per_k.items(), key=lambda kv: (-len(kv[1]), kv[0]))]
    assert out["few"] == sorted(r[1] for r in rows if r[0] == 5)[:4]
    assert out["errors"] == [
        "an offset cannot be fanned out: each shard would skip its own first rows: page by the order key instead (id__lt=the last ID seen)",
        "the queryset groups or aggregates: each shard returns its own groups: give combine, one for each column (None for the columns"
        " grouped by), e.g. (None, 'sum')",
        "the queryset is ordered by Length(F(note)), which a fan-out cannot merge by: order by the model's own fields or annotations that"
        " the queryset selects",
    ]
    assert sum(ROWS.values()) == len(rows)




def test_a_sqlalchemy_query_naming_no_shard_runs_on_every_shard(spread: Config, rows: list[Row]) -> None:  # noqa: F811
    with Router(spread, listen=False) as router:
        sharding = Sharding(router)
        try:
            with sharding.session(read_only=True) as session:
                newest = session.scalars(select(Item).where(Item.k != 3).order_by(Item.id.desc()).limit(6)).all()
                assert [(i.id, i.k, i.note) for i in newest] == [r[1:] for r in reference([r for r in rows if r[2] != 3], [(1, True)], 6)]
                pairs = session.execute(select(Item.note, Item.id).order_by(Item.note.desc(), Item.id).limit(4)).all()
                assert [tuple(p) for p in pairs] == [(r[3], r[1]) for r in reference(rows, [(3, True), (1, False)], 4)]
                assert session.scalar(select(func.count()).select_from(Item).execution_options(pgidgen_combine="sum")) == len(rows)
                per_k = session.execute(select(Item.k, func.count().label("n")).group_by(Item.k).order_by("k")
                                        .execution_options(pgidgen_combine=(None, "sum"))).all()
                assert [tuple(r) for r in per_k] == sorted((k, sum(1 for r in rows if r[2] == k)) for k in {r[2] for r in rows})
                with pytest.raises(InputError, match="groups or aggregates returns a row a shard"):
                    session.scalar(select(func.count()).select_from(Item))
                with pytest.raises(InputError, match="an OFFSET cannot run on every shard"):
                    session.scalars(select(Item).order_by(Item.id).offset(2).limit(2)).all()
                assert session.get(Item, newest[0].id).id == newest[0].id  # by ID: its shard, as before
            with sharding.session() as session, session.begin():
                item = session.scalars(select(Item).order_by(Item.id).limit(1)).one()
                item.note = "changed"
                with pytest.raises(RoutingError, match="objects read from every shard at once are read-only"):
                    session.flush()
        finally:
            sharding.dispose()
