"""Imports only go down: no import cycle anywhere in ottvid_cli (module-level and function-level imports
alike, relative imports resolved), and no library module imports the command-line package. The command
line uses only the public API of `ottvid_cli.eval` (the names its `__all__` lists), and each room stays
small: no command module over 500 lines, no module of the decoder package over 400. No module of
ottvid_cli or benchmarks reads another's underscore name through an import (`kernels._launch`).

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


def _stem(node: ast.ImportFrom, name: str, path: Path) -> str:
    """The module a `from ... import` in module `name` (file `path`) imports from, relative levels resolved."""
    here = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    if node.level:
        return ".".join(here[:len(here) - node.level + 1] + ([node.module] if node.module else []))
    return node.module or ""


def imported_names(root: Path, package: str):
    """(module, imported module, name) for every import of every module of `package`: `from a import b`
    gives (m, "a", "b"), `import a.b` gives (m, "a.b", None); relative imports resolved."""
    for name, path in _modules(root, package).items():
        for node in _imports(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    yield name, alias.name, None
                continue
            stem = _stem(node, name, path)
            for alias in node.names:
                yield name, stem, alias.name


def import_graph(root: Path, package: str) -> dict[str, set[str]]:
    """module -> the modules of `package` it imports (a `from pkg import name` names pkg.name where that
    is a module, else pkg itself, whose __init__ defines the name)."""
    modules = _modules(root, package)
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, stem, imported in imported_names(root, package):
        target = f"{stem}.{imported}" if imported is not None and f"{stem}.{imported}" in modules else stem
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


def private_uses(root: Path, package: str, users: str, api: str, public: set[str]) -> list[str]:
    """'module: what' for each import by a module of `users` (a subpackage) of anything of the `api`
    package other than a name of `public` taken from the package itself: its submodules (`api.store`)
    and names outside its public API are private to it."""
    def inside(name: str, pkg: str) -> bool:
        return name == pkg or name.startswith(pkg + ".")

    found = []
    for module, stem, name in imported_names(root, package):
        if not inside(module, users) or not inside(stem, api):
            continue
        if name is None and stem == api:
            continue  # `import api`: its attributes are checked where they are used, which this walk does not see
        if stem != api or name is None or name not in public:
            found.append(f"{module}: {stem}" + (f".{name}" if name else ""))
    return sorted(found)


def oversized(root: Path, limit: int) -> list[str]:
    """'file: N lines' for each .py file under `root` longer than `limit` lines."""
    return [f"{path.relative_to(root)}: {n} lines" for path in sorted(root.rglob("*.py"))
            if (n := len(path.read_text().splitlines())) > limit]


def _graph():
    return import_graph(Path(ottvid_cli.__file__).parent, "ottvid_cli")


ROOT = Path(ottvid_cli.__file__).parent


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


def test_the_cli_uses_only_the_public_api_of_eval():
    import ottvid_cli.eval as api

    assert any(stem == "ottvid_cli.eval" for m, stem, _ in imported_names(ROOT, "ottvid_cli")
               if m == "ottvid_cli.cli.eval")  # the walk sees the command's imports
    assert private_uses(ROOT, "ottvid_cli", CLI, "ottvid_cli.eval", set(api.__all__)) == []


def test_no_command_module_over_500_lines_and_no_decoder_module_over_400():
    assert oversized(ROOT / "cli", 500) == []
    assert oversized(ROOT / "video", 400) == []


def test_the_checks_find_a_private_eval_name_and_an_oversized_module(tmp_path):
    root = tmp_path / "pkg"
    for folder in ("cli", "eval"):
        (root / folder).mkdir(parents=True)
        (root / folder / "__init__.py").write_text("")
    (root / "__init__.py").write_text("")
    (root / "eval" / "store.py").write_text("def score():\n    return 1\n")
    (root / "cli" / "run.py").write_text("from ..eval import run, _helper\nfrom ..eval.store import score\n"
                                        "def f():\n    import pkg.eval.store\n    from pkg.eval import table\n")
    assert private_uses(root, "pkg", "pkg.cli", "pkg.eval", {"run", "table"}) == [
        "pkg.cli.run: pkg.eval._helper", "pkg.cli.run: pkg.eval.store", "pkg.cli.run: pkg.eval.store.score"]
    (root / "cli" / "run.py").write_text("from ..eval import run\n" + "x = 1\n" * 9)
    assert private_uses(root, "pkg", "pkg.cli", "pkg.eval", {"run"}) == []
    assert oversized(root, 10) == [] and oversized(root, 9) == ["cli/run.py: 10 lines"]


def folder_graph(graph: dict[str, set[str]], package: str) -> dict[str, set[str]]:
    """The module graph seen a level below `package`: each module stands for its top-level folder (or
    itself, for a module directly in `package`); the package's own __init__ is left out."""
    def unit(name: str) -> str | None:
        parts = name.split(".")
        return ".".join(parts[:2]) if len(parts) > 1 else None

    folders: dict[str, set[str]] = {}
    for module, targets in graph.items():
        here = unit(module)
        if here is None:
            continue
        folders.setdefault(here, set())
        folders[here] |= {t for t in map(unit, targets) if t is not None and t != here}
    return folders


def private_imports(root: Path, package: str) -> list[str]:
    """'module: imported.name' for each import of an underscore name from another module of `package`
    (dunder names aside): what a module keeps private, no other module takes."""
    found = []
    for module, stem, name in imported_names(root, package):
        if name is None or not name.startswith("_") or name.startswith("__") or stem == module:
            continue
        if stem == package or stem.startswith(package + "."):
            found.append(f"{module}: {stem}.{name}")
    return sorted(found)


def private_attribute_reads(root: Path, package: str, others: tuple[str, ...] = ()) -> list[str]:
    """'module: name._attr' for each read of an underscore attribute (dunder names aside) through a name the
    module imports from `package` or from one of `others` (`from a import mod`, `import a.mod as m`, ...):
    what a module keeps private, no other module reads through an import either."""
    def ours(stem: str) -> bool:
        return any(stem == p or stem.startswith(p + ".") for p in (package, *others))

    found = []
    for name, path in _modules(root, package).items():
        tree = ast.parse(path.read_text(), filename=str(path))
        bound = set()
        for node in _imports(tree):
            if isinstance(node, ast.Import):
                bound |= {a.asname or a.name.partition(".")[0] for a in node.names if ours(a.name)}
            elif ours(_stem(node, name, path)):
                bound |= {a.asname or a.name for a in node.names}
        for node in ast.walk(tree):
            if not isinstance(node, ast.Attribute) or not node.attr.startswith("_") or node.attr.startswith("__"):
                continue
            chain, value = [node.attr], node.value
            while isinstance(value, ast.Attribute):
                chain.append(value.attr)
                value = value.value
            if isinstance(value, ast.Name) and value.id in bound:
                found.append(f"{name}: {'.'.join([value.id, *reversed(chain)])}")
    return sorted(found)


def wide_functions(root: Path, limit: int) -> list[str]:
    """'file: function (N parameters)' for each function under `root` taking more than `limit`
    parameters, except Typer commands (one parameter an option, by Typer's design: a function
    decorated with `<app>.command(...)` / `<app>.callback(...)`, or registered as
    `<app>.command(...)(module.function)`)."""
    def registrar(node: ast.AST) -> bool:
        call = node.func if isinstance(node, ast.Call) else node
        return isinstance(call, ast.Attribute) and call.attr in ("command", "callback")

    trees = {path: ast.parse(path.read_text(), filename=str(path)) for path in sorted(root.rglob("*.py"))}
    registered = set()
    for tree in trees.values():
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Call) and registrar(node.func) and node.args:
                target = node.args[0]
                registered.add(target.attr if isinstance(target, ast.Attribute) else getattr(target, "id", None))

    found = []
    for path, tree in trees.items():
        for node in ast.walk(tree):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) or node.name in registered or any(
                    registrar(d) for d in node.decorator_list):
                continue
            a = node.args
            n = len(a.posonlyargs) + len(a.args) + len(a.kwonlyargs) + bool(a.vararg) + bool(a.kwarg)
            n -= bool(a.args) and a.args[0].arg in ("self", "cls")
            if n > limit:
                found.append(f"{path.relative_to(root)}: {node.name} ({n} parameters)")
    return found


def test_no_arrow_runs_back_up_between_folders():
    assert cycles(folder_graph(_graph(), "ottvid_cli")) == []


def test_no_private_name_is_imported_across_modules():
    assert private_imports(ROOT, "ottvid_cli") == []


def test_no_module_reads_a_private_attribute_through_an_import():
    benchmarks = Path(__file__).resolve().parent.parent / "benchmarks"
    assert private_attribute_reads(ROOT, "ottvid_cli") == []
    assert private_attribute_reads(benchmarks, "benchmarks", others=("ottvid_cli",)) == []


def test_the_check_finds_a_private_attribute_read_through_an_import(tmp_path):
    root = tmp_path / "pkg"
    (root / "a").mkdir(parents=True)
    (root / "__init__.py").write_text("")
    (root / "a" / "__init__.py").write_text("")
    (root / "a" / "z.py").write_text("_state = {}\nBUILT = 1\n")
    (root / "b.py").write_text("import os\nimport pkg.a.z\nfrom .a import z\nfrom .a import z as zed\n"
                               "def f():\n    from other import mod\n    import pkg.a.z as w\n"
                               "    return z._state, zed._state[1], pkg.a.z._state, w._state, z.__file__, z.BUILT, "
                               "os._exit, mod._x\n")
    assert private_attribute_reads(root, "pkg") == [
        "pkg.b: pkg.a.z._state", "pkg.b: w._state", "pkg.b: z._state", "pkg.b: zed._state"]
    assert private_attribute_reads(root, "pkg", others=("other",))[0] == "pkg.b: mod._x"
    (root / "b.py").write_text("from .a import z\ndef f(z):\n    return z.BUILT, z.__file__\n")
    assert private_attribute_reads(root, "pkg") == []


def test_no_cli_function_takes_more_than_ten_parameters():
    assert wide_functions(ROOT / "cli", 10) == []


def test_the_checks_find_a_folder_cycle_a_private_import_and_a_wide_function(tmp_path):
    root = tmp_path / "pkg"
    for folder in ("a", "b", "cli"):
        (root / folder).mkdir(parents=True)
        (root / folder / "__init__.py").write_text("")
    (root / "__init__.py").write_text("")
    (root / "a" / "x.py").write_text("from ..b.y import f\n")
    (root / "a" / "z.py").write_text("def _g():\n    return 1\n")
    (root / "b" / "y.py").write_text("def f():\n    from ..a.z import _g\n    return _g()\n")
    (root / "cli" / "run.py").write_text(
        "import typer\napp = typer.Typer()\n"
        "@app.command()\ndef ask(a, b, c, d, e, f, g, h, i, j, k):\n    pass\n"
        "def helper(a, b, c, d, e, f, g, h, i, j, k=1):\n    pass\n"
        "def run(a, b, c, d, e, f, g, h, i, j, k):\n    pass\napp.command('go')(run)\n"
        "class C:\n    def m(self, a, b, c, d, e, f, g, h, i, j):\n        pass\n")
    graph = import_graph(root, "pkg")
    assert cycles(graph) == []  # no module cycle: x -> y -> z
    assert cycles(folder_graph(graph, "pkg")) == [["pkg.a", "pkg.b"]]
    assert private_imports(root, "pkg") == ["pkg.b.y: pkg.a.z._g"]
    assert wide_functions(root / "cli", 10) == ["run.py: helper (11 parameters)"]
    (root / "b" / "y.py").write_text("def f():\n    return 1\n")
    graph = import_graph(root, "pkg")
    assert cycles(folder_graph(graph, "pkg")) == [] and private_imports(root, "pkg") == []
