"""The pipeline's sync leaves the interpreter lock to other threads (pgidgen/routing/nogil.py): it goes by ctypes
to the very libpq psycopg's C layer runs on, or falls back to psycopg's own."""
from __future__ import annotations

import ctypes
import os
import threading

import psycopg
import pytest
from test_routing import insert, sharded  # noqa: F401 - fixtures

from pgidgen.config import Config
from pgidgen.routing import Router, nogil


@pytest.mark.skipif(psycopg.pq.__impl__ not in ("c", "binary"), reason="psycopg's Python layer releases the lock by itself")
def test_the_sync_is_psycopgs_own_libpq_called_without_the_lock(sharded: Config) -> None:
    sync = nogil.PQ_PIPELINE_SYNC
    assert sync is not None, "the libpq psycopg runs on was not found: every pipeline is sent holding the lock"
    assert not sync._flags_ & ctypes._FUNCFLAG_PYTHONAPI  # type: ignore[attr-defined] # a CDLL call drops the lock
    lib = ctypes.CDLL(nogil._mapped_libpq(), mode=os.RTLD_NOLOAD)
    lib.PQbackendPID.argtypes, lib.PQbackendPID.restype = [ctypes.c_void_p], ctypes.c_int
    with psycopg.connect(sharded.dsn("db1")) as conn:
        # the same library and the same PGconn layout: what it reads of psycopg's connection is right
        assert lib.PQbackendPID(conn.pgconn.pgconn_ptr) == conn.info.backend_pid > 0


def test_a_sync_outside_a_pipeline_fails_as_psycopgs_does(sharded: Config) -> None:
    with psycopg.connect(sharded.dsn("db1")) as conn:
        with pytest.raises(psycopg.OperationalError):
            conn.pgconn.pipeline_sync()
        with pytest.raises(psycopg.OperationalError):
            nogil.pipeline_sync(conn.pgconn)
        assert conn.execute("SELECT 1").fetchone() == (1,)  # nothing sent: the connection is as it was


def test_threads_write_through_the_lockless_sync(sharded: Config) -> None:
    """Eight threads, four pooled connections: every unit's pipeline sent by it, every write there."""
    with Router(sharded, listen=False, min_size=4, max_size=4) as r:
        def work(t: int) -> None:
            for i in range(50):
                r.run(3, insert(3, f"t{t}-{i}"))

        ts = [threading.Thread(target=work, args=(t,)) for t in range(8)]
        for t in ts:
            t.start()
        for t in ts:
            t.join(60)
        n = r.run(3, lambda c: c.execute("SELECT count(*) FROM items WHERE note LIKE 't%%-%%'").fetchone()[0], read_only=True)
    assert n == 400
