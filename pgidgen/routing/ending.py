"""A unit of work's transaction is the claim's: whatever ends it before the unit does would let the statements
after it run unclaimed (on an autocommit connection, each its own transaction), perhaps on a database that no
longer serves the shard. conn.commit() and rollback() are refused inside a unit (claiming.py); so are SQL
statements that end the transaction, found here before they are sent: COMMIT (END, COMMIT AND CHAIN), ROLLBACK
(ABORT; ROLLBACK TO SAVEPOINT does not end it), PREPARE TRANSACTION, alone or among several in one string, by
execute() and copy() of the connection's cursors, and by every other way a statement leaves through the
connection (executemany, stream, a server-side cursor, a ClientCursor or RawCursor the application makes itself:
refuse_sending). And should one get through still, the next statement of the unit finds the transaction gone and
is refused (claiming._Unit._start_query)."""
from __future__ import annotations

import functools
import re
from typing import Any

import psycopg
import psycopg.sql
from pglast import ast, parse_sql
from pglast.enums.parsenodes import TransactionStmtKind as Kind

ENDED = ("COMMIT, ROLLBACK and PREPARE TRANSACTION are not allowed inside a Router unit of work: it commits when the"
         " block ends (nothing of this statement ran)")
GONE = ("the unit of work's transaction was ended by a statement inside it: the rest of the unit would run unclaimed"
        " (nothing of this statement ran; the Router commits when the block ends)")

_ENDING = frozenset({Kind.TRANS_STMT_COMMIT, Kind.TRANS_STMT_ROLLBACK, Kind.TRANS_STMT_PREPARE, Kind.TRANS_STMT_COMMIT_PREPARED,
                     Kind.TRANS_STMT_ROLLBACK_PREPARED})
#: a word that may start a statement ending the transaction: only texts holding one are parsed
_WORDS = re.compile(rb"(?i)\b(commit|rollback|end|abort|prepare)\b")
#: psycopg's placeholders, which the parser does not know: any value will do for telling statements apart
_PLACEHOLDERS = re.compile(rb"%(\([^)]*\))?[sbt]")


#: texts up to this size are remembered (an application's statements repeat; a large one, literals and all, is
#: parsed each time rather than kept alive by the cache)
_CACHED = 4096


def ends_transaction(text: bytes) -> bool:
    """Whether the SQL text holds a statement that ends the transaction it runs in."""
    if not _WORDS.search(text):
        return False
    if len(text) > _CACHED:
        return _ends(text)
    return _ends_cached(text)


@functools.lru_cache(maxsize=1024)
def _ends_cached(text: bytes) -> bool:
    return _ends(text)


def _ends(text: bytes) -> bool:
    """Text the parser cannot read is the server's to refuse (False)."""
    try:
        stmts = parse_sql(_PLACEHOLDERS.sub(b"NULL", text).decode("utf-8", "replace"))
    except Exception:  # noqa: BLE001 - pglast's ParseError, or a syntax newer than it: the server decides
        return False
    return any(isinstance(s.stmt, ast.TransactionStmt) and s.stmt.kind in _ENDING for s in stmts)


#: psycopg's generators that send a statement given to them: their argument that holds its text
_SENDING = {"_execute_gen": "query", "_executemany_gen_pipeline": "query", "_executemany_gen_no_pipeline": "query",
            "_stream_send_gen": "query", "_declare_gen": "query", "_start_copy_gen": "statement"}


def refuse_sending(conn: Any, gen: Any, checked: tuple[type, ...]) -> None:
    """refuse_ending() for the statement psycopg's generator gen is about to send on conn, found among its
    arguments before it starts (every cursor's execute, executemany, stream and copy hands the connection such a
    generator to run: Connection.wait). The connection's own cursor classes (checked) have looked at execute()'s
    and copy()'s text already. Another shape of generator (commit, a later psycopg) is not looked into."""
    code = getattr(gen, "gi_code", None)
    name = _SENDING.get(code.co_name) if code is not None else None
    if name is None or gen.gi_frame is None:
        return
    args = gen.gi_frame.f_locals
    if isinstance(args.get("self"), checked) and code is not None and code.co_name in ("_execute_gen", "_start_copy_gen"):
        return
    query = args.get(name)
    if isinstance(query, (str, bytes, psycopg.sql.Composable)):
        refuse_ending(conn, query)


@functools.lru_cache(maxsize=1024)
def _str_ends(text: str) -> bool:
    """ends_transaction of a str of at most _CACHED characters: an application's statements are the same str
    objects again and again, whose hash Python keeps, so the answer is a lookup (0.1 us, where encoding and
    searching take 0.6). At most 1024 texts of 4 kB: 4 MB."""
    return ends_transaction(text.encode("utf-8"))


def refuse_ending(conn: Any, query: Any) -> None:
    """Raise psycopg's ProgrammingError if query (str, bytes or psycopg.sql) would end conn's unit of work."""
    if type(query) is str and len(query) <= _CACHED:
        if _str_ends(query):
            raise psycopg.ProgrammingError(ENDED)
        return
    if isinstance(query, str):
        text = query.encode("utf-8")
    elif isinstance(query, bytes):
        text = query
    else:
        text = query.as_bytes(conn)
    if ends_transaction(text):
        raise psycopg.ProgrammingError(ENDED)
