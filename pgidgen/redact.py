"""Passwords pgidgen has seen, so that no message, log line or journal entry ever shows one.

Connection strings come from the environment (interpolated into the config, or --subscription-dsn) and may hold
a password. libpq quotes parts of a connection string it cannot use in its messages ("unexpected spaces found in
...", "invalid percent-encoded token ...", a host name that was really the tail of a password with a '/' or '@'
in it), so patterns alone cannot find every password in a message: each connection string's password is
registered here when pgidgen first sees it, and scrub() takes it (and its parts of 5 characters or more; shorter
ones are left to the patterns) out of any text.
"""
from __future__ import annotations

import re
import threading
from urllib.parse import unquote

import psycopg.conninfo

_lock = threading.Lock()
_known: set[str] = set()
#: password=... in a conninfo (a quoted value may hold spaces and escaped quotes; an unquoted one backslash
#: escapes) and user:password@ in a URI.
_PASSWORD_RE = re.compile(r"(password\s*=\s*)('(?:[^'\\]|\\.)*'?|(?:\\.|\S)+)|(://[^:/@\s]*:)([^@\s?#]*)(@)", re.I)
_URI_RE = re.compile(r"^\s*postgres(?:ql)?://", re.I)
#: a password, or a part of one, shorter than this is left to the patterns (it would take letters out of words)
_MIN_PART = 5


#: a query parameter (?key= or &key=): an '@' after one is in the query (user=admin@server), not ending user info
_QUERY_PARAM_RE = re.compile(r"[?&][A-Za-z_][A-Za-z0-9_]*=")


def _userinfo_end(dsn: str) -> tuple[int, int] | None:
    """Where a postgresql:// URI's user info ends: (start of what follows '://', index of its '@'). The '@' is the
    last one before the query (a password may hold '/', '@', '?', '#' or spaces, which libpq then misreads); an
    '@' after a query parameter is a query value's (user=admin@server)."""
    m = _URI_RE.match(dsn)
    if not m:
        return None
    rest = dsn[m.end():]
    at = rest.rfind("@")
    if not _bogus_port(rest):  # host:notaport is user:password misread, whatever follows
        while at >= 0 and _QUERY_PARAM_RE.search(rest, 0, at):
            at = rest.rfind("@", 0, at)
    return None if at < 0 else (m.end(), m.end() + at)


def _bogus_port(rest: str) -> bool:
    """Would libpq read a port that is not a number (the part after a ':' of a host before the first '/')? Then
    what it reads as host:port is user:password of a URI whose password holds a '/'."""
    authority = re.split(r"[/?#]", rest, maxsplit=1)[0]
    for host in authority.split(","):
        if host.startswith("["):
            host = host[host.find("]") + 1:] if "]" in host else ""
        if ":" in host and not host.rsplit(":", 1)[1].isdigit():
            return True
    return False


def _last_at_password(dsn: str) -> str | None:
    """The password the widest reading would see (everything between '://user:' and the last '@'): for a string
    libpq cannot parse (whose pieces its messages quote), registered even where _userinfo_end reads that '@' as a
    query value's."""
    m = _URI_RE.match(dsn)
    if not m:
        return None
    rest = dsn[m.end():]
    at = rest.rfind("@")
    return rest[:at].split(":", 1)[1] if at >= 0 and ":" in rest[:at] else None


def uri_password(dsn: str) -> str | None:
    """The password part of a postgresql:// URI's user info, as written (None when it has none)."""
    where = _userinfo_end(dsn)
    if where is None:
        return None
    userinfo = dsn[where[0]:where[1]]
    return userinfo.split(":", 1)[1] if ":" in userinfo else None


def strip_userinfo(dsn: str) -> str:
    """The URI without its user info (user and password), for parsing host, port and database safely."""
    where = _userinfo_end(dsn)
    return dsn if where is None else dsn[: where[0]] + dsn[where[1] + 1:]


#: password=... as a URI query parameter (its key may be %-encoded: matched on the decoded text): up to '&' or '#'
_QUERY_PASSWORD_RE = re.compile(r"[?&]password=([^&#]*)", re.I)


#: password=... in a keyword string libpq cannot parse, read widest: up to the next key= or the end
_WIDE_PASSWORD_RE = re.compile(r"password\s*=\s*(.*?)(?=\s+[A-Za-z_]+\s*=|$)", re.I | re.S)


def parses(dsn: str) -> bool:
    try:
        psycopg.conninfo.conninfo_to_dict(dsn)
        return True
    except psycopg.ProgrammingError:
        return False


def passwords_in(dsn: str) -> list[str]:
    """Every password a connection string holds, as written and as libpq decodes it. One that libpq cannot parse
    is read every way it could be meant (the widest user info, a %-encoded password key), since libpq's messages
    then quote pieces of it."""
    found: list[str] = []
    unparsable = not parses(dsn)
    for raw in {uri_password(dsn), _last_at_password(dsn) if unparsable else None} - {None}:
        assert raw is not None
        found += [raw, unquote(raw)]
    if not unparsable:
        pw = psycopg.conninfo.conninfo_to_dict(dsn).get("password")
        if pw:
            found.append(str(pw))
    for m in _PASSWORD_RE.finditer(dsn):
        value = m.group(2) if m.group(1) else m.group(4)
        if value:
            found.append(value.strip("'"))
    if _URI_RE.match(dsn):
        found += [m.group(1) for m in _QUERY_PASSWORD_RE.finditer(unquote(dsn))]
    elif unparsable:  # password=pa ss/wo'rd: libpq quotes the tokens after the first space ("ss/wo'rd")
        found += [m.group(1).strip() for m in _WIDE_PASSWORD_RE.finditer(dsn)]
        found += _bare_words(dsn)
    return [p for p in found if p]


#: a keyword string's key = value pair (a value quoted, or up to a space not escaped), and a word that is neither
_PAIR_RE = re.compile(r"\s*[^\s=']+\s*=\s*(?:'(?:[^'\\]|\\.)*'|(?:\\.|[^\s\\])*)")
_WORD_RE = re.compile(r"\s*('(?:[^'\\]|\\.)*'?|(?:\\.|\S)+)")


def _bare_words(dsn: str) -> list[str]:
    """The words of a keyword string that are no key = value pair: libpq quotes the first ('missing "=" after
    ...'), and one is most likely a password put where the whole string goes (a ${VAR} holding only it), or
    one whose 'password=' was left out."""
    words: list[str] = []
    i = 0
    while i < len(dsn):
        m = _PAIR_RE.match(dsn, i)
        if m is None or m.end() == i:
            m = _WORD_RE.match(dsn, i)
            if m is None or m.end() == i:
                break
            words.append(m.group(1).strip("'"))
        i = m.end()
    return words


#: A config's ${VAR} reference, as written (not a password: the value comes from the environment, and is registered
#: once read).
_REF_RE = re.compile(r"\$\{[A-Za-z_][A-Za-z0-9_]*\}")


def register(dsn: str | None) -> None:
    """Remember the passwords of a connection string pgidgen is about to use."""
    if not dsn:
        return
    secrets: set[str] = set()
    for pw in passwords_in(dsn):
        # too short a password (or part) would be taken out of every word that holds it: those rely on the patterns;
        # the parts are cut where libpq cuts a misread string (host lists, query keys and values), at any of those
        # characters and not at the others (a keyword string's token ends at a space only: "ss/wo'rd")
        secrets.update(part for part in _pieces(pw) if len(part) >= _MIN_PART and not _REF_RE.fullmatch(part))
    with _lock:
        _known.update(secrets)


def _pieces(pw: str) -> list[str]:
    """pw and every run of it from a start or a special character to a special character or its end."""
    cuts = [m.span() for m in re.finditer(r"[\s@/:?#%\\'=&,]+", pw)]
    starts, ends = [0, *(b for _, b in cuts)], [*(a for a, _ in cuts), len(pw)]
    return [pw, *(pw[i:j] for i in starts for j in ends if j > i)]


def scrub(text: str) -> str:
    """Remove anything that is, or looks like, a password from a message."""
    text = _PASSWORD_RE.sub(lambda m: (m.group(1) + "***") if m.group(1) else (m.group(3) + "***" + m.group(5)), text)
    with _lock:
        known = sorted(_known, key=len, reverse=True)
    for secret in known:
        if secret in text:
            text = text.replace(secret, "***")
    return text
