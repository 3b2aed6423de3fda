"""`python -m pgidgen.docgen [--check] [DOCS_DIR]`: regenerate the docs generated from the code."""
from __future__ import annotations

import sys
from pathlib import Path

from . import errors, generate


def main(argv: list[str]) -> int:
    check = "--check" in argv
    rest = [a for a in argv if a != "--check"]
    docs = Path(rest[0]) if rest else Path(__file__).resolve().parents[2] / "docs"
    for line in generate(docs, check=check):
        print(line)
    todo = errors.undocumented((docs / "errors.md").read_text()) if (docs / "errors.md").exists() else []
    if todo:
        print(f"docs/errors.md: {len(todo)} entries still say TODO: write what each means and what to do", file=sys.stderr)
    return 1 if check and (todo or generate(docs, check=True)) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
