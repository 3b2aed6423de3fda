"""Where a sharded DDL file's positions are found: a character index as line and column, pglast's parse-error
index (in characters on some versions, bytes on others), and what a statement is in the user's words."""
from __future__ import annotations

import re
from functools import lru_cache

from pglast import parse_sql
from pglast.parser import ParseError


def line_col(text: str, index: int) -> tuple[int, int]:
    index = max(0, min(index, len(text)))
    line = text.count("\n", 0, index) + 1
    return line, index - (text.rfind("\n", 0, index) + 1) + 1


@lru_cache(maxsize=1)
def _parse_error_reports_chars() -> bool:
    """Whether pglast's ParseError index is a character index (some versions convert it twice)."""
    probe = "SELECT 'é'; SELEC 1"
    try:
        parse_sql(probe)
    except ParseError as e:
        return bool(e.args[1] == probe.index("SELEC 1"))
    return True  # pragma: no cover


def parse_error_index(text: str, e: ParseError) -> int | None:
    reported = e.args[1] if len(e.args) > 1 else None
    if reported is None:
        return None
    if _parse_error_reports_chars():
        return int(reported)
    return len(text[: int(reported)].encode("utf-8"))


def _skip_space(text: str, i: int) -> int:
    """The first character of a statement's first token (statements may start after comments)."""
    n = len(text)
    while i < n:
        if text[i].isspace():
            i += 1
        elif text.startswith("--", i):
            j = text.find("\n", i)
            i = n if j < 0 else j + 1
        elif text.startswith("/*", i):
            depth, i = 1, i + 2
            while i < n and depth:
                if text.startswith("/*", i):
                    depth, i = depth + 1, i + 2
                elif text.startswith("*/", i):
                    depth, i = depth - 1, i + 2
                else:
                    i += 1
        else:
            break
    return i


_MODIFIERS = {"OR", "REPLACE", "UNIQUE", "UNLOGGED", "TEMP", "TEMPORARY", "CONSTRAINT", "GLOBAL", "LOCAL", "RECURSIVE", "TRUSTED"}


def _kind(text: str, start: int) -> str:
    """What a statement is, in the user's words: CREATE TABLE, ALTER TABLE, INSERT, ..."""
    words = [w.upper() for w in re.findall(r"[A-Za-z_]+", text[start:start + 120])]
    if not words:
        return "?"
    if words[0] in ("CREATE", "ALTER", "DROP"):
        rest = [w for w in words[1:4] if w not in _MODIFIERS]
        if rest[:1] == ["MATERIALIZED"]:
            rest = rest[:2]
        return " ".join([words[0]] + rest[:1 if rest[:1] != ["MATERIALIZED"] else 2])
    if words[0] == "COMMENT":
        return "COMMENT ON"
    return str(words[0])
