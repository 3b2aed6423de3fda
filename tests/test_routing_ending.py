"""The statements that would end a unit's transaction, refused whichever way they are sent (routing/ending.py)."""
from __future__ import annotations

import asyncio
from typing import Any

import psycopg
import pytest
from test_routing import count, router, sharded  # noqa: F401 - fixtures

from pgidgen.config import Config
from pgidgen.routing import AsyncRouter, Router

UNCLAIMED = "INSERT INTO items (k, note) VALUES (1, 'unclaimed')"


def _send(c: Any, way: str) -> Any:
    """The statement that ends the transaction and the one after it, sent the way named (sync or async alike:
    the call's result is awaited by the caller when it is a coroutine)."""
    if way == "ClientCursor":
        return psycopg.ClientCursor(c).execute("COMMIT; " + UNCLAIMED)
    if way == "RawCursor":
        return psycopg.RawCursor(c).execute("COMMIT; " + UNCLAIMED)
    if way == "copy":
        return c.cursor().copy("COMMIT; " + UNCLAIMED + "; COPY items (k, note) FROM STDIN")
    if way == "ClientCursor copy":
        return psycopg.ClientCursor(c).copy("COMMIT; " + UNCLAIMED + "; COPY items (k, note) FROM STDIN")
    if way == "executemany":
        return c.cursor().executemany("COMMIT; " + UNCLAIMED, [()])
    if way == "executemany COMMIT":  # one statement: the server runs it, and it commits the claimed row
        return c.cursor().executemany("COMMIT", [()])
    raise AssertionError(way)


WAYS = ["ClientCursor", "RawCursor", "copy", "ClientCursor copy", "executemany", "executemany COMMIT"]


@pytest.mark.parametrize("way", WAYS)
def test_every_cursor_and_copy_refuse_what_ends_the_unit(router: Router, sharded: Config, way: str) -> None:
    """A cursor class other than the connection's (ClientCursor, RawCursor send a string of several statements
    as one simple query), COPY and executemany: a COMMIT among them would let the statements after it run
    unclaimed, so it is refused before anything is sent."""
    def work(c: psycopg.Connection[Any]) -> None:
        c.execute("INSERT INTO items (k, note) VALUES (1, 'claimed')")
        if way.endswith("copy"):
            with _send(c, way) as cp:
                cp.write_row((1, "copied"))
        else:
            _send(c, way)

    with pytest.raises(psycopg.Error):
        router.run(1, work)
    assert count(sharded.dsn("db1"), "shard_1") == 0
    assert router.run(1, lambda c: c.execute("SELECT 1").fetchone()) == (1,)


def _asend(c: Any, way: str) -> Any:
    if way == "ClientCursor":
        return psycopg.AsyncClientCursor(c).execute("COMMIT; " + UNCLAIMED)
    if way == "RawCursor":
        return psycopg.AsyncRawCursor(c).execute("COMMIT; " + UNCLAIMED)
    if way == "executemany":
        return c.cursor().executemany("COMMIT; " + UNCLAIMED, [()])
    if way == "executemany COMMIT":
        return c.cursor().executemany("COMMIT", [()])
    raise AssertionError(way)


@pytest.mark.parametrize("way", WAYS)
def test_every_async_cursor_and_copy_refuse_what_ends_the_unit(sharded: Config, way: str) -> None:
    async def work(c: psycopg.AsyncConnection[Any]) -> None:
        await c.execute("INSERT INTO items (k, note) VALUES (1, 'claimed')")
        if way.endswith("copy"):
            cursor = psycopg.AsyncClientCursor(c) if way == "ClientCursor copy" else c.cursor()
            async with cursor.copy("COMMIT; " + UNCLAIMED + "; COPY items (k, note) FROM STDIN") as cp:
                await cp.write_row((1, "copied"))
        else:
            await _asend(c, way)

    async def main() -> None:
        async with AsyncRouter(sharded, listen=False) as r:
            with pytest.raises(psycopg.Error):
                await r.run(1, work)

    asyncio.run(main())
    assert count(sharded.dsn("db1"), "shard_1") == 0


def test_large_texts_are_not_kept_by_the_cache(router: Router) -> None:
    """The parse of a text is cached for the statements an application repeats; a large text (literals and all,
    each one different) is not kept alive by the cache (1024 of them of 1 MB would be 1 GB)."""
    from pgidgen.routing import ending

    before = ending._ends_cached.cache_info().currsize, ending._str_ends.cache_info().currsize
    big = "SELECT length(%s) -- commit\n" + "-- " + "x" * 100_000
    assert router.run(1, lambda c: c.execute(big, ("a",)).fetchone()) == (1,)
    assert (ending._ends_cached.cache_info().currsize, ending._str_ends.cache_info().currsize) == before


@pytest.mark.parametrize("api", ["run", "async run"])
def test_a_first_statement_refused_before_it_left_keeps_the_claim_for_the_next(sharded: Config, api: str) -> None:
    """A first statement psycopg refuses before sending anything (its parameters do not match): the claim did not
    leave with it, so it goes with the next statement, which runs claimed inside the unit's transaction (it was
    refused as if the transaction had ended, and before that it ran unclaimed)."""
    bad = "INSERT INTO items (k, note) VALUES (%s, %s)"

    def work(c: psycopg.Connection[Any]) -> Any:
        with pytest.raises(psycopg.ProgrammingError, match="placeholder"):
            c.execute(bad, (1,))
        c.execute(bad, (1, "claimed"))
        return c.info.transaction_status

    async def awork(c: psycopg.AsyncConnection[Any]) -> Any:
        with pytest.raises(psycopg.ProgrammingError, match="placeholder"):
            await c.execute(bad, (1,))
        await c.execute(bad, (1, "claimed"))
        return c.info.transaction_status

    if api == "run":
        with Router(sharded, listen=False) as r:
            status = r.run(1, work)
    else:
        async def main() -> Any:
            async with AsyncRouter(sharded, listen=False) as r:
                return await r.run(1, awork)
        status = asyncio.run(main())
    assert status == psycopg.pq.TransactionStatus.INTRANS
    assert count(sharded.dsn("db1"), "shard_1") == 1
