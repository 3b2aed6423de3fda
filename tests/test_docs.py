"""The docs generated from the code stay in step with it: the command pages with `--help`, docs/errors.md with
every error message in the source. When one fails: run `make docs` (and, for errors, fill in the TODOs)."""
from __future__ import annotations

from pathlib import Path

import click
from click.testing import CliRunner

from pgidgen import __version__
from pgidgen.cli import main
from pgidgen.docgen import commands, errors
from pgidgen.docgen.errorscan import normalise, scan, unique

DOCS = Path(__file__).resolve().parent.parent / "docs"


def test_command_pages_match_help() -> None:
    want = commands.expected(DOCS)
    differ = [str(p.relative_to(DOCS.parent)) for p, text in want.items() if not p.exists() or p.read_text() != text]
    stale = [str(p.relative_to(DOCS.parent)) for p in commands.stale(DOCS)]
    assert not differ and not stale, (
        f"the command reference is out of step with the commands' --help: {', '.join(differ + stale)}: run `make docs`"
        " (it keeps each page's hand-written Examples section)")


def test_every_command_has_a_page_with_examples() -> None:
    slugs = {p.slug for p in commands.pages()}
    assert {"move-shard", "rebalance", "sandbox-up", "check", "cleanup", "apply-ddl", "decode"} <= slugs
    todo = [s for s in sorted(slugs) if "TODO" in (DOCS / "commands" / f"{s}.md").read_text().split(commands.EXAMPLES, 1)[1]]
    assert not todo, f"these command pages have no examples yet (TODO): {', '.join(todo)}"


def test_a_page_shows_the_help_verbatim_and_keeps_its_examples(tmp_path: Path) -> None:
    page = next(p for p in commands.pages() if p.slug == "move-shard")
    help_text = CliRunner().invoke(main, ["move-shard", "--help"], prog_name="pgidgen", terminal_width=commands.WIDTH).output
    assert help_text.strip() in page.generated
    assert "| `--max-pause` | `DURATION` | `1s` |" in page.generated
    old = commands.render(page, None).replace(commands.STUB, "pgidgen move-shard 5 db2\n")
    changed = page.generated.replace("Move logical SHARD", "Move the logical SHARD")
    assert commands.render(commands.Page(page.slug, page.path, page.short, changed), old).endswith(f"{commands.EXAMPLES}\n\npgidgen move-shard 5 db2\n")


def test_every_error_message_is_documented() -> None:
    text = (DOCS / "errors.md").read_text()
    missing = errors.missing(text)
    assert not missing, (
        f"docs/errors.md does not document {len(missing)} error messages; run `make docs` to add stubs for them, then write"
        " what each means and what to do:\n" + "\n".join(f"  {f.key}  ({f.path}:{f.line})" for f in missing))
    todo = errors.undocumented(text)
    assert not todo, "docs/errors.md: these entries still say TODO; write what each means and what to do:\n" + "\n".join(f"  {k}" for k in todo)
    gone = errors.orphaned(text)
    assert not gone, "docs/errors.md documents messages no longer in the code; run `make docs` to drop them:\n" + "\n".join(f"  {k}" for k in gone)
    assert errors.expected(DOCS)[0] == text, "docs/errors.md is out of step with the code (headings, order, places): run `make docs`"


def test_the_scan_finds_messages_as_the_code_writes_them() -> None:
    keys = set(unique(scan()))
    assert "ConfigError: TARGET_DB is missing" in keys  # a literal
    assert "InputError: {} must be more than 0, not {}" in keys  # an f-string
    assert "ConfigError: --sql needs --shards N" in keys
    assert any(k.startswith("MoveError: ") for k in keys)  # a subclass defined outside errors.py
    assert any(k.startswith("Refused: ") for k in keys)  # apply-ddl's refusals
    assert any(k.startswith("ClickException: ") for k in keys)
    assert "Finding: wal_level = {}, an online move out of it needs logical" in keys  # check's FAIL lines
    assert not any(k.startswith("Finding: logical") for k in keys)  # ... not its ok ones
    assert "ClickException: interrupted; each database's transaction was rolled back unless reported done" in keys  # `x or "..."`
    assert "ConfigError: no pgidgen.toml in {}" in keys  # a module-level constant stands for its text
    assert normalise("a  {}{}\n  b") == "a {} b"


def test_a_new_error_fails_until_documented_and_a_reworded_one_keeps_its_text(tmp_path: Path) -> None:
    pkg = tmp_path / "pgidgen"
    pkg.mkdir()
    (pkg / "errors.py").write_text("class PgidgenError(Exception): pass\nclass InputError(PgidgenError): pass\n")
    (pkg / "cli.py").write_text("from .errors import InputError\ndef f(n):\n    raise InputError(f'shard {n} is out of range', hint='pick another')\n")
    found = scan(pkg)
    assert [f.key for f in found] == ["InputError: shard {} is out of range"] and found[0].hint == "pick another"
    text, _, _ = errors.render(found, errors.HEAD)
    assert errors.undocumented(text) == ["InputError: shard {} is out of range"]
    text = text.replace(errors.TODO, "The shard number is too big. Use a smaller one.")
    assert errors.undocumented(text) == []
    (pkg / "cli.py").write_text("from .errors import InputError\ndef f(n):\n    raise InputError(f'shard {n} is outside the range')\n")
    text2, carried, dropped = errors.render(scan(pkg), text)
    assert carried == [("InputError: shard {} is out of range", "InputError: shard {} is outside the range")] and not dropped
    assert "The shard number is too big." in text2 and errors.undocumented(text2) == []


def test_version() -> None:
    result = CliRunner().invoke(main, ["--version"])
    assert result.exit_code == 0, result.output
    assert result.output == f"pgidgen, version {__version__}\n"
    from importlib.metadata import version

    assert __version__ == version("pgidgen")


def test_help_is_documentation() -> None:
    """Every command and option says in one line what it is for (the pages are made of it)."""
    for page in commands.pages():
        assert page.short and "TODO" not in page.short, page.path
    root_ctx = click.Context(main, info_name="pgidgen")
    for name in main.list_commands(root_ctx):
        sub = main.get_command(root_ctx, name)
        assert sub is not None
        for p in sub.params:
            if isinstance(p, click.Option) and not p.hidden:
                assert p.help, f"pgidgen {name} {p.opts[0]} has no help"


def _slugs(markdown: str) -> set[str]:
    """GitHub's anchors for a page's headings."""
    import re

    out = set()
    for line in markdown.splitlines():
        m = re.match(r"^#{1,6} (.+)$", line)
        if m:
            out.add(re.sub(r"[^\w\- ]", "", m.group(1).strip().lower()).replace(" ", "-"))
    return out


def test_links_between_the_docs_resolve() -> None:
    """Every relative link in README.md, CHANGELOG.md and docs/ names a file that exists and, with #anchor, one
    of its headings: an operator following one at 3 a.m. lands where it says."""
    import re

    root = DOCS.parent
    pages = [root / "README.md", root / "CHANGELOG.md", *sorted(DOCS.rglob("*.md"))]
    broken = []
    for page in pages:
        text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"^[a-z]+:", target):
                continue
            path, _, anchor = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            if not dest.exists():
                broken.append(f"{page.relative_to(root)}: {target} (no such file)")
            elif anchor and dest.suffix == ".md" and anchor not in _slugs(dest.read_text()):
                broken.append(f"{page.relative_to(root)}: {target} (no such heading)")
    assert not broken, "broken links:\n" + "\n".join(broken)
