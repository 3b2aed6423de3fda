"""README.md runs as written: every fenced block of its quick path ("The four verbs") and of "In an application",
in order, on a real `pgidgen sandbox up` in an empty directory, through the real `pgidgen` console script; the
output each block shows is compared with what the command printed, by shape (IDs, times and durations differ from
run to run). A README edit that breaks a step, or a change that breaks the README, fails here.

How a block runs, by its language:
- `sh`: each command through bash, which must succeed; the README shows no output for it.
- `console`: each `$ ` line through bash, its output compared with the lines under it.
- `sql` whose first line is `-- NAME.sql`: written to NAME.sql, for a later command to use.
- other `sql`: through `pgidgen psql DB`, DB the one the prose just before the block names (`pgidgen psql db1`);
  its trailing `-- ` lines are psql's output.
- `python`: exec'd in this process, in the same directory (so `Router.from_config()` finds pgidgen.toml).
IDs the README shows in one output and uses in a later command (step 3 decodes step 2's IDs) are replaced in
that command by the IDs this run printed in their place. A block of any other language fails the test: a new
block must be runnable, or this test taught how to run it.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
SECTIONS = ("The four verbs", "In an application")
ID = re.compile(r"\b\d{15,}\b")
# What differs from run to run, each replaced by a placeholder in both the README's lines and the real ones.
VARYING = [
    (ID, "<id>"),
    (re.compile(r"\b\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z"), "<time>"),
    (re.compile(r"_moved_\d{14}\b"), "_moved_<stamp>"),
    (re.compile(r"[+-]?\d+(\.\d+)? ?(ms|s)\b"), "<duration>"),
    (re.compile(r"\bsequence \d+"), "sequence <n>"),  # two rows of one INSERT may fall in different milliseconds
    (re.compile(r"\battempts: \d+"), "attempts: <n>"),
    (re.compile(r"-{3,}"), "---"),  # psql's column widths follow the IDs' length
    (re.compile(r"\s+"), " "),
]


@dataclass
class Block:
    section: str
    lang: str
    text: str
    prose: str  # the text between the previous block (or the heading) and this one
    line: int  # of the opening fence, 1-based

    @property
    def where(self) -> str:
        return f"README.md:{self.line} ({self.section})"


def readme_blocks(markdown: str, section: str) -> list[Block]:
    lines = markdown.splitlines()
    try:
        start = lines.index(f"## {section}")
    except ValueError:
        pytest.fail(f"README.md has no section '## {section}': rename it in SECTIONS too")
    blocks: list[Block] = []
    prose: list[str] = []
    i = start + 1
    while i < len(lines) and not lines[i].startswith("## "):
        fence = re.match(r"^```(\w*)\s*$", lines[i])
        if fence is None:
            prose.append(lines[i])
            i += 1
            continue
        end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
        blocks.append(Block(section, fence.group(1), "\n".join(lines[i + 1:end]) + "\n", "\n".join(prose), i + 1))
        prose = []
        i = end + 1
    return blocks


def shape(line: str) -> str:
    for pattern, placeholder in VARYING:
        line = pattern.sub(placeholder, line)
    return line.strip()


def output_lines(text: str) -> list[str]:
    lines = [line.rstrip() for line in text.splitlines()]
    while lines and not lines[-1]:
        lines.pop()
    return lines


class Run:
    """The README followed in one directory: the commands' environment, and the IDs it printed."""

    def __init__(self, work: Path) -> None:
        self.work = work
        bindir = Path(sys.executable).parent  # the virtualenv's: its `pgidgen` is the console script pip made
        assert (bindir / "pgidgen").exists(), f"no pgidgen console script beside {sys.executable}: pip install -e ."
        self.env = {k: v for k, v in os.environ.items() if k != "PGIDGEN_CONFIG"}
        self.env["PATH"] = f"{bindir}{os.pathsep}{self.env.get('PATH', '')}"
        self.ids: dict[str, str] = {}  # an ID the README shows -> the one this run printed in its place

    def run(self, argv: list[str], where: str, stdin: str | None = None) -> str:
        done = subprocess.run(argv, cwd=self.work, env=self.env, input=stdin, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, f"{where}: {' '.join(argv)} exited {done.returncode}:\n{done.stdout}{done.stderr}"
        return done.stdout

    def command(self, line: str) -> str:
        return ID.sub(lambda m: self.ids.get(m.group(0), m.group(0)), line)

    def compare(self, shown: list[str], printed: str, where: str, what: str) -> None:
        got = output_lines(printed)
        assert [shape(x) for x in got] == [shape(x) for x in shown], (
            f"{where}: {what} printed (left) what the README does not show (right):\n"
            + "\n".join(f"  {a!r:70} | {b!r}" for a, b in zip(got + [""] * len(shown), shown + [""] * len(got), strict=True) if a or b))
        for readme, real in zip(shown, got, strict=True):  # equal lengths: asserted above
            self.ids.update(zip(ID.findall(readme), ID.findall(real), strict=True))  # the same shape: as many IDs


def shell_lines(text: str) -> list[str]:
    """A shell block's commands, each run on its own so that every one must succeed (under `set -e` the first
    command of an `a && b` list may fail unnoticed)."""
    joined = re.sub(r"\\\n", " ", text)
    return [x for x in joined.splitlines() if x.strip() and not x.lstrip().startswith("#")]


def run_console(run: Run, block: Block) -> None:
    commands: list[tuple[str, list[str]]] = []
    for line in block.text.splitlines():
        if line.startswith("$ "):
            commands.append((line[2:], []))
        else:
            assert commands, f"{block.where}: a console block starts with a `$ ` line"
            commands[-1][1].append(line)
    for command, shown in commands:
        real = run.command(command)
        run.compare(shown, run.run(["bash", "-c", real], block.where), block.where, f"`{real}`")


def run_sql(run: Run, block: Block) -> None:
    lines = block.text.splitlines()
    named = re.fullmatch(r"-- ([\w.-]+\.sql)", lines[0])
    if named:
        (run.work / named.group(1)).write_text(block.text)
        return
    psql = re.findall(r"`pgidgen psql (\w+)`", block.prose)
    assert psql, f"{block.where}: the prose before a SQL block names the database it runs on (`pgidgen psql db1`)"
    statements = [x for x in lines if not x.startswith("--")]
    shown = [x[3:] if x.startswith("-- ") else x[2:] for x in lines[len(statements):]]
    assert all(x.startswith("--") for x in lines[len(statements):]), f"{block.where}: psql's output comes after the statements"
    printed = run.run(["pgidgen", "psql", psql[-1], "-q", "-v", "ON_ERROR_STOP=1"], block.where, stdin="\n".join(statements) + "\n")
    run.compare(shown, printed, block.where, f"the SQL on {psql[-1]}")


def run_python(run: Run, block: Block, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    monkeypatch.chdir(run.work)
    monkeypatch.delenv("PGIDGEN_CONFIG", raising=False)
    namespace: dict[str, Any] = {"__name__": "readme"}
    try:
        exec(compile(block.text, block.where, "exec"), namespace)
    finally:
        for value in list(namespace.values()):
            if type(value).__name__ in ("Router", "AsyncRouter") and hasattr(value, "close"):
                value.close()
    return namespace


def test_the_readme_runs_as_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    markdown = README.read_text()
    sections = {name: readme_blocks(markdown, name) for name in SECTIONS}
    assert all(sections.values()), f"a section the test runs has no block: {[n for n, b in sections.items() if not b]}"
    work = tmp_path / "follow"
    work.mkdir()
    run = Run(work)
    ran: list[str] = []
    app: dict[str, Any] = {}
    try:
        for blocks in sections.values():
            for block in blocks:
                if block.lang == "sh":
                    for line in shell_lines(block.text):
                        run.run(["bash", "-c", run.command(line)], block.where)
                elif block.lang == "console":
                    run_console(run, block)
                elif block.lang == "sql":
                    run_sql(run, block)
                elif block.lang == "python":
                    app = run_python(run, block, monkeypatch)
                else:
                    pytest.fail(f"{block.where}: a ```{block.lang} block, which this test does not know how to run")
                ran.append(block.lang)
        assert (work / ".pgidgen-sandbox").is_dir(), "the README's steps start no sandbox (`pgidgen sandbox up`)"
        assert {"sh", "console", "sql", "python"} <= set(ran), ran

        # what the app snippet says it did: two photos of user_id's shard, on the database that shard moved to
        from pgidgen.routing import Router

        with Router.from_config(str(work / "pgidgen.toml")) as router:
            shard = router.shard_for(app["user_id"])
            rows = router.execute(shard, "SELECT id FROM photos WHERE user_id = %s AND caption = 'hi' ORDER BY id", (app["user_id"],))
            assert [r[0] for r in rows][-1:] == [app["photo_id"]] and len(rows) == 2, rows
            assert router.shard_of(app["photo_id"]) == shard
            assert router.database_for(shard) == "db2", "the snippet's comment: the shard is on db2 since step 4"
    finally:  # as the README says: `pgidgen sandbox down` when done (checked below, unless a step failed first)
        down = subprocess.run(["pgidgen", "sandbox", "down"], cwd=work, env=run.env, capture_output=True, text=True, timeout=120)
    assert down.returncode == 0 and not (work / ".pgidgen-sandbox").exists(), down.stdout + down.stderr


def test_the_block_reader_keeps_blocks_prose_and_order() -> None:
    text = "## A\nsay `pgidgen psql db1`:\n\n```sql\nSELECT 1;\n-- x\n```\n\n```console\n$ pgidgen map\n```\n## B\n```sh\nno\n```\n"
    got = readme_blocks(text, "A")
    assert [(b.lang, b.line) for b in got] == [("sql", 4), ("console", 9)]
    assert "pgidgen psql db1" in got[0].prose and got[0].text == "SELECT 1;\n-- x\n" and got[1].prose == ""
    assert shape("238205839553336320\t2026-11-25T15:52:28.900Z\tshard 5\tsequence 1") == "<id> <time> shard 5 sequence <n>"
    assert shape("write pause: 32 ms (cutover attempts: 1)") == "write pause: <duration> (cutover attempts: <n>)"
    assert shape("moved shard 5 from db1 to db2 (online) in 0.3s") == "moved shard 5 from db1 to db2 (online) in <duration>"


def test_the_readme_ids_decode_to_what_it_shows(tmp_path: Path) -> None:
    """The IDs the README shows are one run's: its decode example, run as written (no servers needed), prints
    exactly the lines under it."""
    decodes = [b for name in SECTIONS for b in readme_blocks(README.read_text(), name)
               if b.lang == "console" and b.text.startswith("$ pgidgen decode ")]
    assert decodes, "README.md shows no `pgidgen decode` example"
    for block in decodes:
        command, *shown = block.text.splitlines()
        done = subprocess.run(["bash", "-c", command[2:]], cwd=tmp_path, env=Run(tmp_path).env, capture_output=True, text=True)
        assert (done.returncode, output_lines(done.stdout)) == (0, shown), f"{block.where}: {done.stdout}{done.stderr}"
