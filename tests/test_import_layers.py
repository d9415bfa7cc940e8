"""Imports only go down: no import cycle anywhere in ottvid_cli (module-level and function-level imports
alike, relative imports resolved), and no library module imports the command-line package.

The walk reads the source with `ast`, so it sees imports inside functions that a run would only reach
on some paths. Imports under `if TYPE_CHECKING:` are not run and are left out.
"""

from __future__ import annotations

import ast
from pathlib import Path

import ottvid_cli

CLI = "ottvid_cli.cli"


def _modules(root: Path, package: str) -> dict[str, Path]:
    """Dotted module name -> file, for every .py file under `root` (the folder of `package`)."""
    found = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join([package, *parts])] = path
    return found


def _type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(tree: ast.AST):
    """Every Import / ImportFrom node, at any depth, except those under `if TYPE_CHECKING:`."""
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If) and _type_checking(node):
            stack.extend(node.orelse)
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        stack.extend(ast.iter_child_nodes(node))


def import_graph(root: Path, package: str) -> dict[str, set[str]]:
    """module -> the modules of `package` it imports (a `from pkg import name` names pkg.name where that
    is a module, else pkg itself, whose __init__ defines the name)."""
    modules = _modules(root, package)
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        is_package = path.name == "__init__.py"
        here = name.split(".") if is_package else name.split(".")[:-1]
        for node in _imports(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                if node.level:
                    base = here[:len(here) - node.level + 1]
                    stem = ".".join(base + ([node.module] if node.module else []))
                else:
                    stem = node.module or ""
                targets = []
                for alias in node.names:
                    sub = f"{stem}.{alias.name}"
                    targets.append(sub if sub in modules else stem)
            for target in targets:
                while target and target not in modules:  # `import a.b.c` where c is a name: its module
                    target = target.rpartition(".")[0]
                if target and target != name:
                    graph[name].add(target)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def cli_importers(graph: dict[str, set[str]], cli: str, exempt: tuple[str, ...] = ()) -> list[str]:
    """'module -> target' for each module outside the `cli` package (and not exempt) importing into it."""
    def inside(name: str) -> bool:
        return name == cli or name.startswith(cli + ".")

    return sorted(f"{m} -> {t}" for m, targets in graph.items() if not inside(m) and m not in exempt
                  for t in targets if inside(t))


def _graph():
    return import_graph(Path(ottvid_cli.__file__).parent, "ottvid_cli")


def test_no_import_cycle_in_ottvid_cli():
    assert cycles(_graph()) == []


def test_no_library_module_imports_the_cli_package():
    graph = _graph()
    assert any(t.startswith(CLI) for t in graph["ottvid_cli.__main__"])  # the walk sees the one that may
    assert cli_importers(graph, CLI, exempt=("ottvid_cli.__main__",)) == []


def test_the_walk_finds_a_function_level_cycle_and_a_library_module_importing_the_cli(tmp_path):
    root = tmp_path / "pkg"
    (root / "cli").mkdir(parents=True)
    (root / "sub").mkdir()
    (root / "__init__.py").write_text("")
    (root / "a.py").write_text("from .sub import b\n")
    (root / "sub" / "__init__.py").write_text("")
    (root / "sub" / "b.py").write_text("def f():\n    from .. import a\n    from ..cli.app import run\n")
    (root / "cli" / "__init__.py").write_text("")
    (root / "cli" / "app.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ..a import x\n"
                                         "def run():\n    import pkg.sub.b\n")
    graph = import_graph(root, "pkg")
    assert graph["pkg.a"] == {"pkg.sub.b"}
    assert graph["pkg.sub.b"] == {"pkg.a", "pkg.cli.app"}
    assert graph["pkg.cli.app"] == {"pkg.sub.b"}  # the TYPE_CHECKING import is left out
    assert cycles(graph) == [["pkg.a", "pkg.cli.app", "pkg.sub.b"]]
    assert cli_importers(graph, "pkg.cli") == ["pkg.sub.b -> pkg.cli.app"]
    (root / "sub" / "b.py").write_text("def f():\n    return 1\n")
    graph = import_graph(root, "pkg")
    assert cycles(graph) == [] and cli_importers(graph, "pkg.cli") == []
