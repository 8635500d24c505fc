"""The layering holds: no import loop inside quantbench, nothing below the CLI imports a command."""

from __future__ import annotations

import ast
import importlib.util
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "quantbench"


def import_graph() -> dict[str, set[str]]:
    """module -> quantbench modules it imports (at any level: lazy imports count too)."""
    mods = {}
    for p in ROOT.rglob("*.py"):
        name = ".".join(p.relative_to(ROOT.parent).with_suffix("").parts)
        mods[name.removesuffix(".__init__")] = p
    graph = {}
    for m, p in mods.items():
        edges = set()
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("quantbench"):
                for a in node.names:
                    full = f"{node.module}.{a.name}"
                    edges.add(full if full in mods else node.module)
            elif isinstance(node, ast.Import):
                edges |= {a.name for a in node.names if a.name.startswith("quantbench")}
        graph[m] = {e for e in edges if e in mods and e != m}
    return graph


def cycles(graph) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, out, n = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = n[0]
        n[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in graph:
        if v not in index:
            visit(v)
    return out


def test_no_import_loops():
    assert cycles(import_graph()) == []


def test_nothing_below_the_cli_imports_a_command():
    graph = import_graph()
    upward = {m: sorted(t for t in ts if t.startswith("quantbench.commands") or t == "quantbench.cli")
              for m, ts in graph.items()
              if not (m.startswith("quantbench.commands") or m in ("quantbench.cli", "quantbench.__main__"))}
    assert {m: ts for m, ts in upward.items() if ts} == {}


def test_no_command_imports_another_command():
    graph = import_graph()
    cross = {m: sorted(t for t in ts if t.startswith("quantbench.commands.") and t != m)
             for m, ts in graph.items() if m.startswith("quantbench.commands.")}
    assert {m: ts for m, ts in cross.items() if ts} == {}


# Third-party packages too heavy to load before a command needs them (`quantbench CMD --help` needs none).
HEAVY = ("onnxruntime", "onnx", "pyarrow", "matplotlib", "PIL", "sklearn", "pycocotools", "tqdm", "pandas", "torch")


def test_importing_every_module_loads_no_heavy_package():
    """Internal imports sit at module top, so a heavy package must be imported where it is used (or bound with
    quantbench.lazy), never at a module's top: otherwise every command, and its --help, pays for it."""
    code = ("import importlib, pkgutil, sys, quantbench\n"
            "for m in pkgutil.walk_packages(quantbench.__path__, 'quantbench.'):\n"
            "    if not m.name.endswith('__main__'):\n"
            "        importlib.import_module(m.name)\n"
            f"print(sorted(h for h in {HEAVY!r} if h in sys.modules))\n")
    p = subprocess.run([sys.executable, "-c", code], cwd=ROOT.parent, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "[]"


# Function-level quantbench imports that must stay lazy for a reason the hoisting script does not see:
# "module:imported module" -> why. Keep it tiny; scripts/hoist_imports.py reads it (a plain literal).
LAZY_EXEMPT: dict[str, str] = {
    "quantbench.commands:quantbench.variants": "every invocation imports commands/__init__; only --variants needs it",
    "quantbench.commands:quantbench.recipe": "every invocation imports commands/__init__; only --sidecar needs it",
    "quantbench.commands:quantbench.fixtures": "every invocation imports commands/__init__; only fixture flags need it",
    "quantbench.commands:quantbench.analysis.equiv": "every invocation imports commands/__init__; only equiv output",
    "quantbench.commands:quantbench.report": "every invocation imports commands/__init__; only equiv output needs it",
}


def _hoister():
    """scripts/hoist_imports.py, the one owner of when an internal import may stay lazy."""
    path = ROOT.parent / "scripts" / "hoist_imports.py"
    spec = importlib.util.spec_from_file_location("hoist_imports", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_internal_imports_are_at_module_top():
    """A function-level quantbench import hides a dependency. It stays lazy only where hoisting it would load a heavy
    third-party package at import (scripts/hoist_imports.py: the imported module pulls onnxruntime, pyarrow or
    matplotlib at its top and the importer does not; none does today), or with a reason in LAZY_EXEMPT. cli.py
    imports the command modules by name (importlib), not with import statements: `quantbench CMD` loads CMD alone."""
    h = _hoister()
    mods = h.module_files(ROOT.parent)
    trees = {m: ast.parse(p.read_text()) for m, p in mods.items()}
    closure, heavy = h.import_closures(mods, trees)
    assert h.lazy_exempt(ROOT.parent) == LAZY_EXEMPT
    lazy = []
    for name, path in mods.items():
        mod = h.Module(name, path, mods, closure, heavy)
        for node in mod.lazy_imports():
            targets = [t for t in h.imported_modules(node, mods) if t.startswith("quantbench")]
            if mod.cost(node) is None and not any(f"{name}:{t}" in LAZY_EXEMPT for t in targets):
                lazy.append(f"{path.relative_to(ROOT.parent)}:{node.lineno} imports {targets[0]} inside a function")
    assert lazy == [], "hoist them (python scripts/hoist_imports.py):\n" + "\n".join(lazy)


# The one owner of sidecars and recipes (quantbench/recipe.py): only it reads a sidecar file and checks an input
# block (preprocess.py defines check_input_block and guards to_tensor with it).
RECIPE_OWNER = "quantbench/recipe.py"
JSON_READERS = ("read_json", "json.load", "json.loads")


def _called(node) -> str | None:
    """The called function as written: `read_json`, `json.loads`, `preprocess.check_input_block` -> its last part
    unless it is one of JSON_READERS."""
    f = node.func
    if isinstance(f, ast.Name):
        return f.id
    if isinstance(f, ast.Attribute):
        dotted = ast.unparse(f)
        return dotted if dotted in JSON_READERS else f.attr
    return None


def recipe_owner_breaches(files) -> list[str]:
    """`path:line` of each sidecar JSON read (a JSON reader whose arguments mention a sidecar, or that reads the
    file beside a model: `.with_suffix(".json")`) or check_input_block call outside the recipe owner."""
    out = []
    for path, text in files:
        if path == RECIPE_OWNER:
            continue
        for node in ast.walk(ast.parse(text)):
            if not isinstance(node, ast.Call):
                continue
            name = _called(node)
            args = " ".join(ast.unparse(a) for a in [*node.args, *(k.value for k in node.keywords)]).lower()
            if name in JSON_READERS and ("sidecar" in args or 'with_suffix(".json")' in args.replace("'", '"')):
                out.append(f"{path}:{node.lineno} reads a sidecar")
            elif name == "check_input_block" and path != "quantbench/preprocess.py":
                out.append(f"{path}:{node.lineno} checks an input block")
    return out


def test_only_the_recipe_module_reads_sidecars():
    files = [(p.relative_to(ROOT.parent).as_posix(), p.read_text()) for p in sorted(ROOT.rglob("*.py"))]
    assert recipe_owner_breaches(files) == []
    # the rule sees a second reader
    rogue = ('import json\nfrom quantbench.fsutil import read_json\nfrom quantbench.preprocess import check_input_block\n'
             'def f(p, model):\n    side = read_json(p, "sidecar JSON")\n'
             '    raw = json.loads(model.with_suffix(".json").read_text())\n    check_input_block(raw["input"], p)\n')
    assert recipe_owner_breaches([("quantbench/rogue.py", rogue)]) == [
        "quantbench/rogue.py:5 reads a sidecar", "quantbench/rogue.py:6 reads a sidecar",
        "quantbench/rogue.py:7 checks an input block"]
