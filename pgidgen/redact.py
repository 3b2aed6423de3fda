"""Passwords pgidgen has seen, so that no message, log line or journal entry ever shows one.

Connection strings come from the environment (interpolated into the config, or --subscription-dsn) and may hold
a password. libpq quotes parts of a connection string it cannot use in its messages ("unexpected spaces found in
...", "invalid percent-encoded token ...", a host name that was really the tail of a password with a '/' or '@'
in it), so patterns alone cannot find every password in a message: each connection string's password is
registered here when pgidgen first sees it, and scrub() takes it (and its parts) out of any text.
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
_PASSWORD_RE = re.compile(r"(password\s*=\s*)('(?:[^'\\]|\\.)*'?|(?:\\.|\S)+)|(://[^:/@\s]*:)([^@\s]*)(@)", re.I)
_URI_RE = re.compile(r"^\s*postgres(?:ql)?://", re.I)
#: parts of a password shorter than this are not taken out of messages on their own (too many false matches)
_MIN_PART = 4


def uri_password(dsn: str) -> str | None:
    """The password part of a postgresql:// URI's user info, as written: everything between the first ':' and the
    last '@' of what follows '://' (a password may hold '/', '@' or spaces, which libpq then misreads)."""
    m = _URI_RE.match(dsn)
    if not m:
        return None
    rest = dsn[m.end():]
    at = rest.rfind("@")
    if at < 0:
        return None
    userinfo = rest[:at]
    if ":" not in userinfo:
        return None
    return userinfo.split(":", 1)[1]


def strip_userinfo(dsn: str) -> str:
    """The URI without its user info (user and password), for parsing host, port and database safely."""
    m = _URI_RE.match(dsn)
    if not m:
        return dsn
    rest = dsn[m.end():]
    at = rest.rfind("@")
    return dsn if at < 0 else dsn[: m.end()] + rest[at + 1:]


def passwords_in(dsn: str) -> list[str]:
    """Every password a connection string holds, as written and as libpq decodes it."""
    found: list[str] = []
    raw = uri_password(dsn)
    if raw:
        found += [raw, unquote(raw)]
    try:
        pw = psycopg.conninfo.conninfo_to_dict(dsn).get("password")
        if pw:
            found.append(str(pw))
    except psycopg.ProgrammingError:
        pass
    for m in _PASSWORD_RE.finditer(dsn):
        value = m.group(2) if m.group(1) else m.group(4)
        if value:
            found.append(value.strip("'"))
    return [p for p in found if p]


def register(dsn: str | None) -> None:
    """Remember the passwords of a connection string pgidgen is about to use."""
    if not dsn:
        return
    secrets = set()
    for pw in passwords_in(dsn):
        secrets.add(pw)
        secrets.update(part for part in re.split(r"[\s@/:?#%\\']+", pw) if len(part) >= _MIN_PART)
    with _lock:
        _known.update(secrets)


def register_password(password: str | None) -> None:
    if password:
        with _lock:
            _known.add(password)


def scrub(text: str) -> str:
    """Remove anything that is, or looks like, a password from a message."""
    text = _PASSWORD_RE.sub(lambda m: (m.group(1) + "***") if m.group(1) else (m.group(3) + "***" + m.group(5)), text)
    with _lock:
        known = sorted(_known, key=len, reverse=True)
    for secret in known:
        if secret in text:
            text = text.replace(secret, "***")
    return text
