"""Transient faults: which errors are a lost connection (the network, a server restarting), which a move rides
through within --fault-wait (steps/ride.py), and which are not (anything else fails the move at once).

A lost connection shows in three ways: a psycopg error of SQLSTATE class 08 (connection exception), 57P01-57P03
(the server shutting down, crashed, or not yet accepting connections), 25P03 (a session silent too long in a transaction) or none at all (libpq's own "server closed
the connection unexpectedly"); pgidgen's own DatabaseError from connecting, or a MoveError that wraps one of
these (raised `from None`, the original stays its __context__); and the text of a client program's error (psql,
pg_dump), where libpq's wording is all there is.
"""
from __future__ import annotations

import re

import psycopg

from ..errors import PgidgenError
from .context import MoveError

#: SQLSTATEs of a connection that went away, or a server that will take connections again shortly; and 25P03, a
#: session the server ended when it went silent in a transaction (the pause's guard, sqltext.pause_guard_sql: the
#: link stalled).
LOST_STATES = ("57P01", "57P02", "57P03", "25P03")
#: libpq's words for a connection lost or not made on the way (not refused by the server): as a client program
#: (psql, pg_dump) prints them, or a subscription's login reports them.
LOST_WORDS = re.compile(
    r"server closed the connection unexpectedly|could not receive data from (server|WAL stream)|could not send data to server"
    r"|no connection to the server|the connection is (closed|lost)|connection (reset|refused|timed out)|timeout expired"
    r"|terminating connection due to administrator command|the database system is (starting up|shutting down|in recovery mode)"
    r"|SSL SYSCALL error|broken pipe|no route to host|network is unreachable|could not translate host name",
    re.IGNORECASE,
)
#: A server's refusal that the next try meets again: not a lost connection, whatever the SQLSTATE.
REFUSED_WORDS = re.compile(r"authentication failed|no pg_hba\.conf entry|does not exist|permission denied|password", re.IGNORECASE)


class ConnectionLost(MoveError):
    """A connection of the move was lost, or could not be made, where pgidgen knows it at once (a subscription
    whose login to the source failed on the network): ridden through like any other lost connection."""


def lost(error: BaseException) -> str | None:
    """The lost connection an error stands for (its message, one line), or None when it is anything else."""
    seen: BaseException | None = error
    for _ in range(6):
        if seen is None:
            return None
        if isinstance(seen, ConnectionLost):
            return _short(seen.what)
        if isinstance(seen, psycopg.Error):
            return _lost_psycopg(seen)
        if isinstance(seen, PgidgenError) and _lost_words(seen.what):
            return _short(seen.what)
        seen = seen.__cause__ or seen.__context__
    return None


def _lost_psycopg(e: psycopg.Error) -> str | None:
    state = e.sqlstate
    text = _one_line(e)
    if REFUSED_WORDS.search(str(e)):
        return None
    if state is None:
        return text if isinstance(e, psycopg.OperationalError) else None
    return text if state.startswith("08") or state in LOST_STATES else None


def _lost_words(text: str) -> bool:
    return bool(LOST_WORDS.search(text)) and not REFUSED_WORDS.search(text)


def _short(text: str) -> str:
    """Without libpq's "This probably means the server terminated abnormally ..." (a message made one line)."""
    return text.split(" This probably means")[0]


def _one_line(e: BaseException) -> str:
    """The error's first line (libpq adds "This probably means the server terminated abnormally..." below it)."""
    lines = [" ".join(line.split()) for line in str(e).splitlines() if line.strip()]
    return lines[0] if lines else type(e).__name__


def refusal_lost(sqlstate: str, message: str) -> bool:
    """Whether a refusal of the subscription's login (check.subscribe_quietly) was the network's (class 08, in
    libpq's words for a connection lost on the way); not a login the source refused, nor one that did not answer
    within its bound (57014: a source that holds connections and never answers is not a blip)."""
    return (sqlstate.startswith("08") or sqlstate in LOST_STATES) and _lost_words(message)
