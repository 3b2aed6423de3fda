"""The testcontainers path: runs init against a PostgresContainer when a Docker daemon answers, else skips."""
from __future__ import annotations

import pytest

from pgidgen.config import Config
from pgidgen.init import init
from pgidgen.layout import Layout


def docker_available() -> bool:
    try:
        import docker  # type: ignore[import-untyped]

        client = docker.from_env(timeout=3)
        client.ping()
        return True
    except Exception:
        return False


@pytest.mark.skipif(not docker_available(), reason="no Docker daemon answers on this machine")
def test_init_in_a_container() -> None:
    from testcontainers.postgres import PostgresContainer

    with PostgresContainer("postgres:15", driver=None) as pg:
        dsn = pg.get_connection_url()
        out = init(Config(layout=Layout.make(), databases={"c1": dsn}), 8, ["c1"])
        assert out[0].ok and out[0].summary == "catalog installed, created 8 shards (0-7)"
