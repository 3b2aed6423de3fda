"""The pipeline's sync without the interpreter lock.

psycopg's C layer sends a lone statement with the interpreter lock released: libpq writes to the socket inside
PQsendQueryParams. A pipeline is written by PQpipelineSync, which psycopg calls holding the lock. Where the
client shares its CPU with the server, the write wakes the server, the kernel switches to it, and the thread is
switched out still holding the lock: every other thread of the application waits for it. With four threads on
one CPU that cost a routed unit of work about a quarter more than plain psycopg (`make bench`, routing).

So the sync goes through ctypes, which releases the lock around the call, to the very libpq psycopg's C layer
runs on (the one loaded in the process: psycopg-binary's bundled copy or the system's), given psycopg's
PGconn pointer. Where that library cannot be told for certain (not Linux, psycopg's pure-Python layer, two
libpqs loaded), the sync is psycopg's own."""
from __future__ import annotations

import ctypes
import os
from collections.abc import Callable
from typing import Any

from psycopg import errors as e
from psycopg import pq


def _mapped_libpq() -> str | None:
    """The one libpq this process has loaded, if it is one."""
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as maps:
            paths = {line.split(None, 5)[-1].strip() for line in maps if "/libpq" in line}
    except OSError:
        return None
    paths = {p for p in paths if os.path.basename(p).startswith("libpq")}
    return paths.pop() if len(paths) == 1 else None


def _load() -> Callable[[int], int] | None:
    if pq.__impl__ not in ("c", "binary") or not hasattr(os, "RTLD_NOLOAD"):
        return None  # the Python layer calls libpq by ctypes already: the lock is released there
    path = _mapped_libpq()
    if path is None:
        return None
    try:
        lib = ctypes.CDLL(path, mode=os.RTLD_NOLOAD)  # the library already loaded, never another copy
        sync = lib.PQpipelineSync
    except (OSError, AttributeError):
        return None
    sync.argtypes = [ctypes.c_void_p]
    sync.restype = ctypes.c_int
    return sync


PQ_PIPELINE_SYNC = _load()


def pipeline_sync(pgconn: Any) -> None:
    """pgconn.pipeline_sync(), the write to the server made without the interpreter lock."""
    if PQ_PIPELINE_SYNC is None:
        pgconn.pipeline_sync()
        return
    if PQ_PIPELINE_SYNC(pgconn.pgconn_ptr) != 1:  # as psycopg: 0 when not in pipeline mode or the write failed
        raise e.OperationalError(f"sending the pipeline failed: {pgconn.get_error_message()}")
