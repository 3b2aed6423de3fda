"""docs/errors.md: every error message pgidgen can print (found in its source by errorscan), each with what it
means and what to do. The generator writes each entry's heading and key; the text under it is hand-written and
kept. A new message gets a TODO stub; a reworded one keeps its text when the old wording is close enough."""
from __future__ import annotations

import difflib
import re
from pathlib import Path

from .errorscan import FINDING, Found, scan, unique

BEGIN = "<!-- BEGIN generated entries: `make docs` writes headings and keys; the text under each is hand-written and kept -->"
END = "<!-- END generated entries -->"
KEY = re.compile(r"^<!-- error: (.+) -->$")
TODO = "TODO: what it means, and what to do."

#: (path prefix, section title, the command page most entries link to), first match wins.
AREAS = [
    ("pgidgen/cli/check.py", "pgidgen check", "commands/check.md"),
    ("pgidgen/check.py", "pgidgen check", "commands/check.md"),
    ("pgidgen/cli/fleet.py", "Moves: move-shard, rebalance, cleanup", "commands/cleanup.md"),
    ("pgidgen/cli/moves.py", "Moves: move-shard, rebalance, cleanup", "commands/move-shard.md"),
    ("pgidgen/cli/importing.py", "import", "commands/import.md"),
    ("pgidgen/cli/", "The command line", "commands/README.md"),
    ("pgidgen/config.py", "Configuration and layout", "configuration.md"),
    ("pgidgen/layout.py", "Configuration and layout", "configuration.md"),
    ("pgidgen/decode.py", "Configuration and layout", "commands/decode.md"),
    ("pgidgen/db.py", "Connecting to databases", "configuration.md"),
    ("pgidgen/redact.py", "Connecting to databases", "configuration.md"),
    ("pgidgen/init.py", "init and the catalog", "commands/init.md"),
    ("pgidgen/catalog.py", "init and the catalog", "commands/init.md"),
    ("pgidgen/render.py", "init and the catalog", "commands/init.md"),
    ("pgidgen/idgen.py", "init and the catalog", "commands/init.md"),
    ("pgidgen/shardmap.py", "map and status", "commands/map.md"),
    ("pgidgen/sizes.py", "map and status", "commands/map.md"),
    ("pgidgen/ddl/", "apply-ddl and status --drift", "commands/apply-ddl.md"),
    ("pgidgen/importing/", "import", "commands/import.md"),
    ("pgidgen/move/", "Moves: move-shard, rebalance, cleanup", "commands/move-shard.md"),
    ("pgidgen/routing/", "The Router (application side)", "guide.md#the-application-side-routing-connections-an-example-app"),
    ("pgidgen/integrations/", "The Router (application side)", "orm.md"),
    ("pgidgen/pgbouncer.py", "The Router (application side)", "guide.md#the-application-side-routing-connections-an-example-app"),
    ("pgidgen/sandbox.py", "sandbox and PostgreSQL's programs", "commands/sandbox.md"),
    ("pgidgen/pgbin.py", "sandbox and PostgreSQL's programs", "commands/sandbox.md"),
    ("pgidgen/versions.py", "sandbox and PostgreSQL's programs", "commands/sandbox.md"),
    ("pgidgen/", "Elsewhere", "commands/README.md"),
]


ORDER = ["The command line", "Configuration and layout", "Connecting to databases", "init and the catalog", "map and status",
         "apply-ddl and status --drift", "Moves: move-shard, rebalance, cleanup", "import", "pgidgen check", "The Router (application side)",
         "sandbox and PostgreSQL's programs", "Elsewhere"]


def area(path: str) -> tuple[str, str]:
    return next((title, link) for prefix, title, link in AREAS if path.startswith(prefix))


def _code(text: str) -> str:
    """A markdown code span that holds any text (backticks included)."""
    longest = max((len(m) for m in re.findall(r"`+", text)), default=0)
    fence = "`" * (longest + 1)
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def read_entries(text: str) -> dict[str, str]:
    """The hand-written text of each documented key in an existing errors.md."""
    out: dict[str, str] = {}
    key: str | None = None
    body: list[str] = []
    section = text.split(BEGIN, 1)[1].split(END, 1)[0] if BEGIN in text else ""
    for line in section.splitlines():
        m = KEY.match(line)
        if m:
            if key is not None:
                out[key] = _trim(body)
            key, body = m.group(1), []
        elif line.startswith("## ") or line.startswith("### "):
            if key is not None:
                out[key] = _trim(body)
            key, body = None, []
        elif key is not None and not line.startswith(("_Raised as ", "_A failed check in ")):
            body.append(line)
    if key is not None:
        out[key] = _trim(body)
    return out


def _trim(lines: list[str]) -> str:
    return "\n".join(lines).strip("\n")


def carry_over(keys: list[str], old: dict[str, str]) -> tuple[dict[str, str], list[tuple[str, str]], list[str]]:
    """Bodies for the current keys: their own, or a reworded message's (same class, close wording). Returns
    the bodies, the (old, new) keys carried over, and the old keys dropped."""
    bodies = {k: old[k] for k in keys if k in old}
    unused = [k for k in old if k not in keys]
    carried = []
    for k in keys:
        if k in bodies:
            continue
        cls = k.split(":", 1)[0]
        same = [o for o in unused if o.split(":", 1)[0] == cls]
        best = max(same, key=lambda o: difflib.SequenceMatcher(None, o, k).ratio(), default=None)
        if best is not None and difflib.SequenceMatcher(None, best, k).ratio() >= 0.75:
            bodies[k] = old[best]
            unused.remove(best)
            carried.append((best, k))
    return bodies, carried, unused


def render(found: list[Found], existing: str) -> tuple[str, list[tuple[str, str]], list[str]]:
    """errors.md as the generator writes it, given the current file (its text outside the generated entries
    and each entry's hand-written part are kept)."""
    keyed = unique(found)
    head, tail = existing, ""
    if BEGIN in existing:
        head = existing.split(BEGIN, 1)[0]
        tail = existing.split(END, 1)[1] if END in existing else ""
    bodies, carried, dropped = carry_over(list(keyed), read_entries(existing))
    sections: dict[str, list[tuple[str, list[str]]]] = {}
    for key, places in keyed.items():
        title, link = area(places[0].path)
        first = places[0]
        where = ", ".join(sorted({p.path for p in places}))
        hint = next((p.hint for p in places if p.hint), None)
        entry = [
            f"### {_code(first.template)}",
            f"<!-- error: {key} -->",
            (f"_A failed check in {where}: `pgidgen check` prints it as `DB: FAIL item: ...`, move-shard and rebalance stop"
             f" with it (`MoveError`); see [check.md](commands/check.md)._" if first.cls == FINDING else
             f"_Raised as `{first.cls}` in {where}; see [{link.rsplit('/', 1)[-1].split('#')[0] or 'README'}]({link})._")
            + (f" _Its hint: {_code(hint)}_" if hint else ""),
            "",
            bodies.get(key) or TODO,
            "",
        ]
        sections.setdefault(title, []).append((first.template.lower(), entry))
    out = [head.rstrip("\n"), "", BEGIN, ""]
    for title in sorted(sections, key=ORDER.index):
        out += [f"## {title}", ""]
        for _, entry in sorted(sections[title]):
            out += entry
    out += [END]
    return "\n".join(out) + (tail if tail.startswith("\n") else "\n" + tail if tail else "\n"), carried, dropped


def undocumented(text: str) -> list[str]:
    """Keys in errors.md whose text is still the stub."""
    return [k for k, body in read_entries(text).items() if not body.strip() or TODO in body]


def missing(text: str) -> list[Found]:
    """Messages in the code that errors.md has no entry for."""
    have = set(read_entries(text))
    return [places[0] for key, places in unique(scan()).items() if key not in have]


def orphaned(text: str) -> list[str]:
    """Entries in errors.md whose message is no longer in the code."""
    keys = set(unique(scan()))
    return [k for k in read_entries(text) if k not in keys]


HEAD = """# Errors

Every error pgidgen prints is one line, `Error: what is wrong (where): what to do`, with exit status 1 and
nothing half-written. This page lists each message as the code writes it, `{}` standing for a value (a shard
number, a database name, ...), grouped by the command or area that prints it: find yours by its first words
(the values differ). Each entry says what it means and what to do; the [runbook](runbook.md) has the longer
procedures. The failed findings of `pgidgen check` are here too: move-shard and rebalance stop with the same
text.

A test (`tests/test_docs.py`) scans pgidgen's source for error messages and fails when one is missing here:
`make docs` adds a stub for it (and keeps the text of a message only reworded), then write what it means and
what to do in place of the TODO.
"""


def expected(docs: Path) -> tuple[str, list[tuple[str, str]], list[str]]:
    path = docs / "errors.md"
    existing = path.read_text() if path.exists() else HEAD
    return render(scan(), existing)
