"""The layering holds: no import loop inside quantbench, nothing below the CLI imports a command; the tests
mirror the package, one file per thing protected, sharing code only through helper modules."""

from __future__ import annotations

import ast
import importlib.util
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "quantbench"
TESTS = Path(__file__).resolve().parent


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


# The layers, lowest first (docs/architecture.md): a module imports its own layer or a lower one. A module belongs to
# the layer of the longest prefix naming it. tensorcode.py, the canonical tensor encoding, travels with the worker
# (standard library and numpy only), below everything that hashes a tensor; the worker itself is a hosts module.
LAYERS = [
    ("shared", ["quantbench", "quantbench.errors", "quantbench.fsutil", "quantbench.lazy", "quantbench.textfmt",
                "quantbench.tensorcode"]),
    ("recipe", ["quantbench.assets", "quantbench.recipe", "quantbench.variants", "quantbench.preprocess", "quantbench.plugins",
                "quantbench.strata", "quantbench.modelio", "quantbench.hosts.configkeys"]),
    ("tables", ["quantbench.tables"]),
    ("fixtures", ["quantbench.fixtures"]),
    ("calibset", ["quantbench.calibset"]),
    ("hosts", ["quantbench.hosts"]),
    ("analysis", ["quantbench.analysis"]),
    ("quantize", ["quantbench.quantize"]),
    ("report", ["quantbench.report", "quantbench.gallery", "quantbench.ahead"]),
    ("explain", ["quantbench.explain"]),
    ("release", ["quantbench.release"]),
    ("cli", ["quantbench.cli", "quantbench.__main__", "quantbench.console", "quantbench.config",
             "quantbench.equivcli", "quantbench.runargs", "quantbench.commands"]),
]


def layer_of(module: str) -> int | None:
    """The rank in LAYERS of `module` (the package itself, "quantbench", names only its __init__)."""
    best = max(((len(p), rank) for rank, (_, prefixes) in enumerate(LAYERS) for p in prefixes
                if module == p or (p != "quantbench" and module.startswith(p + "."))), default=None)
    return None if best is None else best[1]


def test_every_module_has_a_layer():
    assert [m for m in import_graph() if layer_of(m) is None] == []


def test_no_import_from_a_lower_layer_up():
    graph = import_graph()
    upward = sorted(f"{m} ({LAYERS[layer_of(m)][0]}) imports {t} ({LAYERS[layer_of(t)][0]})"
                    for m, ts in graph.items() for t in ts if layer_of(t) > layer_of(m))
    assert upward == []


def test_the_worker_imports_only_the_tensor_encoding():
    """The worker runs on a bare host (started by path, or sent as source over ssh) with the one module that
    travels with it, the tensor encoding, which imports nothing of quantbench."""
    graph = import_graph()
    assert graph["quantbench.hosts.worker"] == {"quantbench.tensorcode"}
    assert graph["quantbench.tensorcode"] == set()


def test_no_command_imports_another_command():
    graph = import_graph()
    cross = {m: sorted(t for t in ts if t.startswith("quantbench.commands.") and t != m)
             for m, ts in graph.items() if m.startswith("quantbench.commands.")}
    assert {m: ts for m, ts in cross.items() if ts} == {}


# Test files at tests/ top level: only those that protect no one module (docs and the package as a whole).
CROSS_CUTTING = {"test_architecture.py", "test_schema.py", "test_tables_docs.py"}


def test_tests_mirror_the_package():
    """Every test file lives in the subfolder of what it protects (tests/hosts/, tests/analysis/, ...), except
    CROSS_CUTTING; a subfolder holds test files only (shared code sits in tests/*_helpers.py, which conftest.py
    puts on sys.path), and basenames are unique: the subfolders are not packages, pytest imports by basename."""
    top = sorted(p.name for p in TESTS.glob("test_*.py"))
    assert top == sorted(CROSS_CUTTING), "move them into the subfolder of what they protect"
    nested = [p for p in TESTS.rglob("*.py") if p.parent != TESTS and "__pycache__" not in p.parts]
    assert [str(p.relative_to(TESTS)) for p in nested if not p.name.startswith("test_")] == []
    names = [p.name for p in TESTS.rglob("test_*.py")]
    assert sorted({n for n in names if names.count(n) > 1}) == []


def test_no_test_module_imports_another():
    """Fixtures and helpers two test files share live in a helper module (tests/ssh_helpers.py,
    tests/cli_helpers.py, ...), never in a test module another one imports."""
    found = []
    for p in sorted(TESTS.rglob("*.py")):
        for node in ast.walk(ast.parse(p.read_text())):
            names = [node.module or ""] if isinstance(node, ast.ImportFrom) else \
                [a.name for a in node.names] if isinstance(node, ast.Import) else []
            found += [f"{p.relative_to(TESTS)}:{node.lineno} imports {n}" for n in names
                      if n.split(".")[-1].startswith("test_") or n.startswith("tests.")]
    assert found == []


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
    "quantbench.__main__:quantbench.cli": "inside entry()'s try: a Ctrl-C while the command line loads (numpy, onnx, "
                                          "pyarrow) is one line and exit 130, not a KeyboardInterrupt traceback",
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


# ---------------------------------------------------------------- functions stay short

MAX_FUNCTION_LINES = 60
#: functions still over the limit (name -> lines today); the list only shrinks.
LONG_FUNCTIONS: dict[str, int] = {}


def long_functions() -> dict[str, int]:
    out = {}
    for p in sorted(ROOT.rglob("*.py")):
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    out[f"{p.relative_to(ROOT.parent)}:{node.name}"] = lines
    return out


def test_no_function_over_60_lines():
    found = long_functions()
    grown = {k: v for k, v in found.items() if k not in LONG_FUNCTIONS or v > LONG_FUNCTIONS[k]}
    assert grown == {}, "split them by meaning"
    assert sorted(found) == sorted(LONG_FUNCTIONS), "a function got short: drop it from LONG_FUNCTIONS"


# ---------------------------------------------------------------- the library speaks parameters, the CLI flags

#: the CLI layer (cli.py names a ParameterError's flag; commands parse flags).
CLI_MODULES = ("cli.py", "console.py", "config.py", "equivcli.py", "runargs.py", "__main__.py", "commands/")
#: library modules whose messages still name a flag (module -> how many literals); the list only shrinks. The hosts'
#: messages become text (a run's error list, an import's status line) before the CLI sees them.
FLAG_MESSAGES: dict[str, int] = {}


def option_strings() -> set[str]:
    """Every long option any subcommand of the real parser defines."""
    from quantbench import cli

    parser = cli.build_parser(config=False)
    return {o for leaf in parser._qb_leaves.values() for a in leaf._actions for o in a.option_strings
            if o.startswith("--")}


def _message_literals(node) -> list[str]:
    """The string literals inside a raise's (or an error constructor's) arguments, f-string parts included."""
    args = node.args + [k.value for k in node.keywords] if isinstance(node, ast.Call) else [node]
    return [c.value for a in args for c in ast.walk(a) if isinstance(c, ast.Constant) and isinstance(c.value, str)]


ERROR_NAMES = {"UserError", "ParameterError", "PluginNotAllowed", "DiskFull", "GateFailed"}


def library_flag_messages() -> dict[str, list[str]]:
    import re

    pattern = re.compile(r"(?<![\w-])(" + "|".join(sorted(map(re.escape, option_strings()), key=len, reverse=True))
                         + r")(?![\w-])")
    out = {}
    for p in sorted(ROOT.rglob("*.py")):
        rel = p.relative_to(ROOT).as_posix()
        if rel.startswith(CLI_MODULES):
            continue
        calls = {}
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call):
                calls[id(node.exc)] = node.exc
            elif isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", None)) in ERROR_NAMES:
                calls[id(node)] = node
        hits = [s for call in calls.values() for s in _message_literals(call) if pattern.search(s)]
        if hits:
            out[rel] = hits
    return out


def test_no_library_message_names_a_flag():
    """A library error says which parameter (ParameterError) and the CLI says which flag: argv built for pip, qemu
    or ssh is no message, and neither is a comment or a docstring."""
    found = {m: len(h) for m, h in library_flag_messages().items()}
    grown = {m: library_flag_messages()[m] for m, n in found.items() if n > FLAG_MESSAGES.get(m, 0)}
    assert grown == {}, "raise ParameterError(name, ...); the CLI adds the flag"
    assert found == FLAG_MESSAGES, "fewer now: lower FLAG_MESSAGES"


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
