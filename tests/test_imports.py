"""The package's modules import one another without a circle (the command line's families of commands once
imported the module that registered them, and it imported them back)."""
from __future__ import annotations

import ast
from pathlib import Path

import pgidgen

ROOT = Path(pgidgen.__file__).parent


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> dict[str, set[str]]:
    """module -> the pgidgen modules it imports, anywhere in it (a function's lazy import too). `from P import n`
    counts as an import of P.n when that is a module, else of P."""
    paths = {_module_name(p): p for p in ROOT.rglob("*.py")}
    graph: dict[str, set[str]] = {name: set() for name in paths}
    for name, path in paths.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                graph[name] |= {a.name for a in node.names if a.name in paths}
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                    base = ".".join([*anchor, *([node.module] if node.module else [])])
                for alias in node.names:
                    target = f"{base}.{alias.name}" if f"{base}.{alias.name}" in paths else base
                    if target in paths and target != name:
                        graph[name].add(target)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_circle() -> None:
    graph = import_graph()
    assert "pgidgen.cli.group" in graph and "pgidgen.move.engine" in graph["pgidgen.move.request"]  # the walk sees the package
    assert cycles(graph) == []


def test_the_walk_finds_a_circle() -> None:
    """The check can fail: the command line's old shape (a command module importing the group that imports it)."""
    graph = {"pgidgen.cli": {"pgidgen.cli_move"}, "pgidgen.cli_move": {"pgidgen.cli", "pgidgen.errors"}, "pgidgen.errors": set()}
    assert cycles(graph) == [["pgidgen.cli", "pgidgen.cli_move"]]


def test_no_command_module_imports_the_registry_or_another_command() -> None:
    graph = import_graph()
    families = {"ids", "ddl", "moves", "importing", "fleet", "check", "sandbox", "psql"}
    for family in families:
        imported = graph[f"pgidgen.cli.{family}"]
        assert "pgidgen.cli" not in imported, family
        assert not {f"pgidgen.cli.{f}" for f in families - {family}} & imported, family
    assert not {m for m in graph["pgidgen.cli.common"] | graph["pgidgen.cli.group"] if m.startswith("pgidgen.cli")}


#: package (or top-level module) -> what it must not import (docs/ARCHITECTURE.md's layers)
FORBIDDEN = {
    "routing": {"move", "ddl", "cli", "init", "integrations", "docgen", "importing"},
    "integrations": {"move", "ddl", "cli", "init", "docgen"},
    "move": {"routing", "integrations", "cli", "docgen", "importing"},
    "ddl": {"move", "routing", "integrations", "cli", "docgen", "importing"},
    "importing": {"move", "routing", "integrations", "cli", "docgen", "init"},
}
UPPER = {"move", "ddl", "routing", "cli", "integrations", "docgen", "init", "shardmap", "check", "sizes", "importing"}


def test_layers() -> None:
    def part(module: str) -> str:
        return module.split(".")[1] if "." in module else ""

    crossing = []
    for module, imported in import_graph().items():
        mine = part(module)
        banned = FORBIDDEN.get(mine, UPPER if mine not in UPPER and mine not in ("", "__main__") else set())
        crossing += [f"{module} -> {m}" for m in sorted(imported) if part(m) != mine and part(m) in banned]
    assert crossing == []
