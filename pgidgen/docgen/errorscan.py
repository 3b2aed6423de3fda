"""Find every error message pgidgen can print, in its own source: the first argument of each error it
constructs (PgidgenError and its subclasses, MoveError, the DDL rewriter's Refused, click's exceptions),
as a template with `{}` where the message takes a value. docs/errors.md documents each by that key."""
from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent
#: Errors click itself prints for pgidgen (raised by name in the CLI).
CLICK_ERRORS = {"ClickException", "UsageError", "BadParameter"}
#: Not an error class of pgidgen's but shown to the user all the same: a statement apply-ddl cannot shard.
EXTRA_ERRORS = {"Refused"}
#: A failed finding of `pgidgen check` (Finding(database, item, ok, text, fix)): a FAIL line there, and the
#: error move-shard and rebalance stop with. Only calls whose `ok` is not the literal True are failures.
FINDING = "Finding"
HOLE = "{}"


@dataclass(frozen=True)
class Found:
    """One place that makes an error: its class, the message template and where it is."""

    cls: str
    template: str
    path: str
    line: int
    hint: str | None = None

    @property
    def key(self) -> str:
        return f"{self.cls}: {self.template}"


def error_classes(package: Path = PACKAGE) -> set[str]:
    """The names of every exception class pgidgen defines that derives (by name) from PgidgenError."""
    bases: dict[str, list[str]] = {}
    for path in sorted(package.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ClassDef):
                bases[node.name] = [b.id if isinstance(b, ast.Name) else b.attr if isinstance(b, ast.Attribute) else "" for b in node.bases]
    found = {"PgidgenError"}
    grew = True
    while grew:
        grew = False
        for name, parents in bases.items():
            if name not in found and any(p in found for p in parents):
                found.add(name)
                grew = True
    return found | EXTRA_ERRORS


def _templates(node: ast.expr, consts: dict[str, str] | None = None) -> list[str]:
    """The message an expression makes, with `{}` for every value; an if-expression makes one per branch, and a
    module-level string constant stands for its text."""
    consts = consts or {}
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, ast.Name) and node.id in consts:
        return [consts[node.id]]
    if isinstance(node, ast.JoinedStr):
        parts = [[""]]
        for v in node.values:
            if isinstance(v, ast.FormattedValue) and isinstance(v.value, ast.Name) and v.value.id in consts:
                parts.append([consts[v.value.id]])
            else:
                parts.append(_templates(v) if isinstance(v, ast.Constant) else [HOLE])
        out = [""]
        for options in parts:
            out = [a + b for a in out for b in options]
        return out
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        return [a + b for a in _templates(node.left, consts) for b in _templates(node.right, consts)]
    if isinstance(node, ast.IfExp):
        return _templates(node.body, consts) + _templates(node.orelse, consts)
    if isinstance(node, ast.BoolOp) and isinstance(node.op, ast.Or):  # `str(e) or "default"`
        return [t for v in node.values for t in _templates(v, consts)]
    return [HOLE]


def normalise(template: str) -> str:
    """Whitespace collapsed and adjacent holes merged, so reflowing the source does not change a key."""
    text = re.sub(r"\s+", " ", template).strip()
    while HOLE + HOLE in text:
        text = text.replace(HOLE + HOLE, HOLE)
    return text


def _message_arg(call: ast.Call) -> ast.expr | None:
    if _name(call) == FINDING:
        ok = call.args[2] if len(call.args) > 2 else None
        if len(call.args) < 4 or (isinstance(ok, ast.Constant) and ok.value is True):
            return None
        return call.args[3]
    if call.args and not isinstance(call.args[0], ast.Starred):
        return call.args[0]
    for kw in call.keywords:
        if kw.arg in ("what", "message"):
            return kw.value
    return None


def _name(call: ast.Call) -> str | None:
    f = call.func
    return f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else None


def scan(package: Path = PACKAGE) -> list[Found]:
    """Every error message template in the package (messages with no literal word of their own, which only
    pass on a message made elsewhere, are left out: that other place is scanned)."""
    names = error_classes(package) | CLICK_ERRORS | {FINDING}
    out: list[Found] = []
    for path in sorted(package.rglob("*.py")):
        if path.parent.name == "docgen":
            continue
        tree = ast.parse(path.read_text(), str(path))
        consts = {t.id: n.value.value for n in tree.body if isinstance(n, ast.Assign) and isinstance(n.value, ast.Constant)
                  and isinstance(n.value.value, str) for t in n.targets if isinstance(t, ast.Name)}
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            cls = _name(node)
            if cls not in names:
                continue
            arg = _message_arg(node)
            if arg is None:
                continue
            hint = next((normalise(_templates(kw.value, consts)[0]) for kw in node.keywords if kw.arg == "hint"), None)
            if cls == "Refused" and len(node.args) > 1:
                hint = normalise(_templates(node.args[1], consts)[0])
            if cls == FINDING and len(node.args) > 4:
                hint = next((normalise(t) for t in _templates(node.args[4], consts) if t != HOLE), None)
            if hint is not None and not re.search(r"[A-Za-z]", hint.replace(HOLE, "")):
                hint = None
            for t in _templates(arg, consts):
                t = normalise(t)
                if re.search(r"[A-Za-z]", t.replace(HOLE, "")):
                    out.append(Found(cls, t, str(path.relative_to(package.parent)), node.lineno, hint))
    return sorted(out, key=lambda f: (f.path, f.line))


def unique(found: list[Found]) -> dict[str, list[Found]]:
    """Keys in source order, each with every place that makes it."""
    keyed: dict[str, list[Found]] = {}
    for f in found:
        keyed.setdefault(f.key, []).append(f)
    return keyed
