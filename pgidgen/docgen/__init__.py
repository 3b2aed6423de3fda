"""Documentation generated from the code (`make docs`, or `python -m pgidgen.docgen`): the command reference
from the click commands and the error index from the error messages in the source. tests/test_docs.py fails
when what is committed differs from what this would write now."""
from __future__ import annotations

from pathlib import Path

from . import commands, errors

__all__ = ["commands", "errors", "generate"]


def generate(docs: Path, *, check: bool = False) -> list[str]:
    """Write docs/commands/ and docs/errors.md (or, with check, only say which would change). Returns one
    line per file changed, stale page removed, or entry carried over or dropped."""
    said: list[str] = []
    want = commands.expected(docs)
    text, carried, dropped = errors.expected(docs)
    want[docs / "errors.md"] = text
    for path, content in want.items():
        if not path.exists() or path.read_text() != content:
            said.append(f"{'would write' if check else 'wrote'} {path}")
            if not check:
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(content)
    for path in commands.stale(docs):
        said.append(f"{'would remove' if check else 'removed'} {path} (no such command)")
        if not check:
            path.unlink()
    said += [f"errors.md: kept the text of {old!r} for the reworded {new!r}: check it still fits" for old, new in carried]
    said += [f"errors.md: dropped {old!r}: no longer in the code" for old in dropped]
    return said
