"""The layering holds: no import loop inside quantbench, nothing below the CLI imports a command; the tests
mirror the package, one file per thing protected, sharing code only through helper modules."""

from __future__ import annotations

import ast
import functools
import importlib.util
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "quantbench"
TESTS = Path(__file__).resolve().parent


@functools.cache
def parsed(path: Path) -> ast.Module:
    """A source file's tree, parsed once for all the rules (the rules only read it)."""
    return ast.parse(path.read_text())


def import_graph() -> dict[str, set[str]]:
    """module -> quantbench modules it imports (at any level: lazy imports count too); a copy each rule may edit."""
    return {module: set(edges) for module, edges in _import_graph().items()}


@functools.cache
def _import_graph() -> dict[str, set[str]]:
    mods = {}
    for p in ROOT.rglob("*.py"):
        name = ".".join(p.relative_to(ROOT.parent).with_suffix("").parts)
        mods[name.removesuffix(".__init__")] = p
    graph = {}
    for m, p in mods.items():
        edges = set()
        for node in ast.walk(parsed(p)):
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
    upward = {m: sorted(t for t in ts if t == "quantbench.cli" or t.startswith("quantbench.cli."))
              for m, ts in graph.items()
              if not (m == "quantbench.cli" or m.startswith("quantbench.cli.") or m == "quantbench.__main__")}
    assert {m: ts for m, ts in upward.items() if ts} == {}


# The layers, lowest first: one folder, one layer (name, the folder's package, its one job). A module imports its own
# layer or a lower one. The package root is the shared layer (its own modules: at most ROOT_MODULES); the CLI layer is
# listed by module (the entry point stays in the root: `python -m quantbench`). tensorcode.py, the canonical tensor
# encoding, travels with the worker (standard library and numpy only), below everything that hashes a tensor; the
# worker, shipped to every host as its sources, sits right above it. docs/architecture.md lists these folders, in this order, with their jobs
# (python scripts/update_architecture_doc.py writes it).
LAYERS = [
    ("shared", ["quantbench"],
     "what every layer shares: errors (UserError, ParameterError, flag_mark), fsutil (atomic writes, hashing, JSON), "
     "tensorcode (the canonical tensor encoding; it travels with the worker), textfmt (text and Markdown tables)"),
    ("worker", ["quantbench.worker"],
     "the worker every host runs, shipped as its sources: the protocol's frames, onnxruntime sessions, the "
     "fingerprint, the request loop"),
    ("store", ["quantbench.store"],
     "the results folder on disk: the result tables' schema, their Parquet parts written, locked, read and "
     "compacted, host results read back as arrays, the folder's layout"),
    ("inputs", ["quantbench.inputs"],
     "a model's inputs: its sidecar and input recipe, the variants calibrate published, images to tensors, plug-ins "
     "and their consent, strata, the ONNX file's facts and hashes, labels and fixtures, the bundled demo"),
    ("calibset", ["quantbench.calibset"], "calibration sets: stratified, reproducible, disjoint from the eval split"),
    ("hosts", ["quantbench.hosts"],
     "hosts of every kind and the hosts file, their runtimes and set-up, the worker's one client"),
    ("runs", ["quantbench.runs"],
     "run execution: the run plan, its scheduler and each host run's state, the task loop, the worker pool, a run's "
     "result rows, the Dask cluster's host runs, thread placement"),
    ("analysis", ["quantbench.analysis"],
     "equivalence classes and what separates them, decoders, decisions, gates, accuracy, the analysis cache"),
    ("quantize", ["quantbench.quantize"],
     "calibrate: model intake, calibration ranges, variants and their recipes, smoke tests before publication"),
    ("report", ["quantbench.report"],
     "report.md and report.html assembled from sections; the equiv section (tables, verdict, accuracy, plots, "
     "flip gallery), the explain section and the terminal summary"),
    ("explain", ["quantbench.explain"], "localize, kernel evidence, lint, remedies, noise floors, latency"),
    ("release", ["quantbench.release"], "release record, archive, verify, ONNX diff, the CI recipe"),
    ("api", ["quantbench.api"],
     "the public Python API (quantbench.calibrate, run, equiv, search, localize, lint, remedy, noise, latency, "
     "make_release, verify) and its typed option groups: "
     "parameters in, result objects with pyarrow tables out"),
    ("cli", ["quantbench.cli", "quantbench.__main__"],
     "flags, defaults files, printing: a command parses flags into option groups, calls one API function, prints"),
]
#: the package root holds at most this many modules, __init__.py and __main__.py counted
ROOT_MODULES = 6


def root_modules() -> list[str]:
    """The modules directly in the package root (`quantbench.errors`, ...; the package itself is `quantbench`)."""
    return sorted(["quantbench"] + [f"quantbench.{p.stem}" for p in ROOT.glob("*.py") if p.name != "__init__.py"])


def layer_of(module: str) -> int | None:
    """The rank in LAYERS of `module`: the layer of the longest prefix naming it, where "quantbench" names only the
    root's own modules (a module in a folder belongs to its folder's layer, or to none)."""
    root = set(root_modules())
    best = max(((len(p), rank) for rank, (_, prefixes, _) in enumerate(LAYERS) for p in prefixes
                if module == p or (p == "quantbench" and module in root)
                or (p != "quantbench" and module.startswith(p + "."))), default=None)
    return None if best is None else best[1]


def test_every_module_has_a_layer():
    assert [m for m in import_graph() if layer_of(m) is None] == []


def test_the_root_holds_only_the_shared_modules():
    """The root is the shared layer, at most ROOT_MODULES modules counting __init__ and the entry point
    (__main__.py: `python -m quantbench`, the CLI layer's one module outside cli/)."""
    assert len(root_modules()) <= ROOT_MODULES, root_modules()
    assert [m for m in root_modules() if LAYERS[layer_of(m)][0] not in ("shared", "cli")] == []


def test_every_folder_is_a_layer():
    """Every module outside the root lives in a folder that is one layer of the map (or is a CLI module)."""
    folders = {p for _, prefixes, _ in LAYERS for p in prefixes if p != "quantbench"}
    outside = [m for m in import_graph() if m not in root_modules()]
    assert [m for m in outside if ".".join(m.split(".")[:2]) not in folders] == []
    assert sorted(p.name for p in ROOT.iterdir() if p.is_dir() and (p / "__init__.py").exists()) == sorted(
        p.removeprefix("quantbench.") for p in folders if (ROOT / p.removeprefix("quantbench.")).is_dir())


def layers_markdown() -> str:
    """The layer table of docs/architecture.md, from LAYERS."""
    out = ["| layer | folder | its one job |", "|---|---|---|"]
    for name, prefixes, job in LAYERS:
        where = ", ".join("`quantbench/*.py` (the root)" if p == "quantbench" else
                          f"`{p.replace('.', '/')}/`" if (ROOT.parent / p.replace(".", "/")).is_dir() else
                          f"`{p.replace('.', '/')}.py`" for p in prefixes)
        out.append(f"| {name} | {where} | {job} |")
    return "\n".join(out)


LAYERS_DOC = ROOT.parent / "docs" / "architecture.md"


def test_the_architecture_doc_lists_the_layers():
    """docs/architecture.md's layer table is the folder map: every layer, in order, with its one job."""
    text = LAYERS_DOC.read_text()
    section = text.split("<!-- section:layers -->", 1)[1].split("<!-- /section:layers -->", 1)[0]
    assert section.strip() == layers_markdown(), "python scripts/update_architecture_doc.py"


def test_no_import_from_a_lower_layer_up():
    graph = import_graph()
    upward = sorted(f"{m} ({LAYERS[layer_of(m)][0]}) imports {t} ({LAYERS[layer_of(t)][0]})"
                    for m, ts in graph.items() for t in ts if layer_of(t) > layer_of(m))
    assert upward == []


def test_the_worker_imports_only_the_tensor_encoding_and_its_earlier_sources():
    """The worker runs on a bare host (started by path, or sent as source over ssh, or in a kit) as its sources in
    load order (worker.jobs.SOURCES, the entry last): each imports only the ones before it, the first of which is the
    tensor encoding, which imports nothing of quantbench; every module of the folder but its __init__ ships."""
    from quantbench.worker.jobs import SOURCES

    graph = import_graph()
    order = [module for module, _path in SOURCES] + ["quantbench.worker.jobs"]
    assert order[0] == "quantbench.tensorcode" and graph["quantbench.tensorcode"] == set()
    for rank, module in enumerate(order[1:], 1):
        assert graph[module] <= set(order[:rank]), f"{module} imports {sorted(graph[module] - set(order[:rank]))}"
    assert {m for m in graph if m.startswith("quantbench.worker.")} == set(order[1:])


def test_no_command_imports_another_command():
    graph = import_graph()
    cross = {m: sorted(t for t in ts if t.startswith("quantbench.cli.commands.") and t != m)
             for m, ts in graph.items() if m.startswith("quantbench.cli.commands.")}
    assert {m: ts for m, ts in cross.items() if ts} == {}


#: what a command module may import of quantbench: the API, the command line and the errors (a command parses its
#: flags, calls one API function, prints)
COMMAND_IMPORTS = ("quantbench.api", "quantbench.cli", "quantbench.errors")
#: command modules that still import below the API: module -> (those imports, why). It may only shrink: an entry
#: whose imports are gone fails until it is removed, and no command may add one.
COMMANDS_BELOW_THE_API: dict[str, tuple[tuple[str, ...], str]] = {
    "quantbench.cli.commands.calibrate": (
        ("quantbench.analysis.decode", "quantbench.inputs.sidecarfile", "quantbench.quantize.methods",
         "quantbench.quantize.pipeline", "quantbench.quantize.variants", "quantbench.textfmt"),
        "its flags' choices and defaults (calibration methods, decode kinds, requirement keys) and its summary table; "
        "quantbench.calibrate is its API, these are still read from their owners"),
    "quantbench.cli.commands.ci": (
        ("quantbench.hosts.keys", "quantbench.release.ci"),
        "writes the CI workflow (release.ci.write_ci) with no API function of its own yet"),
    "quantbench.cli.commands.hosts": (
        ("quantbench.hosts.cpuprofiles", "quantbench.hosts.deploy", "quantbench.hosts.emulated",
         "quantbench.hosts.keys", "quantbench.hosts.kinds", "quantbench.hosts.masked", "quantbench.hosts.registry",
         "quantbench.hosts.workerclient", "quantbench.hosts.setup", "quantbench.textfmt"),
        "hosts list/setup/check have no API functions yet"),
}


def commands_below_the_api() -> dict[str, set[str]]:
    """Each command module's imports of quantbench outside COMMAND_IMPORTS."""
    found = {}
    for m, ts in import_graph().items():
        if m.startswith("quantbench.cli.commands."):
            below = {t for t in ts if not any(t == a or t.startswith(a + ".") for a in COMMAND_IMPORTS)}
            if below:
                found[m] = below
    return found


def test_a_command_imports_only_the_api_the_cli_and_errors():
    """A command parses its flags into option groups, calls its one API function and prints: whatever it needs of a
    lower layer moves into the API (quantbench.api), so a Python caller gets the same function."""
    found = commands_below_the_api()
    new = {m: sorted(ts - set(COMMANDS_BELOW_THE_API.get(m, ((), ""))[0])) for m, ts in found.items()}
    assert {m: ts for m, ts in new.items() if ts} == {}
    stale = {m: sorted(set(listed) - found.get(m, set())) for m, (listed, _) in COMMANDS_BELOW_THE_API.items()}
    assert {m: ts for m, ts in stale.items() if ts} == {}, "no longer imported: remove them from COMMANDS_BELOW_THE_API"


# Test files at tests/ top level: only those that protect no one module (docs and the package as a whole).
CROSS_CUTTING = {"test_architecture.py", "test_schema.py", "test_tables_docs.py",
                 "test_qemu_watch.py"}   # the last protects the suite itself: the fast subset's guard


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
        for node in ast.walk(parsed(p)):
            names = [node.module or ""] if isinstance(node, ast.ImportFrom) else \
                [a.name for a in node.names] if isinstance(node, ast.Import) else []
            found += [f"{p.relative_to(TESTS)}:{node.lineno} imports {n}" for n in names
                      if n.split(".")[-1].startswith("test_") or n.startswith("tests.")]
    assert found == []


def _is_fixture(decorator) -> bool:
    node = decorator.func if isinstance(decorator, ast.Call) else decorator
    return (node.attr if isinstance(node, ast.Attribute) else getattr(node, "id", None)) == "fixture"


def helper_fixtures() -> dict[str, set[str]]:
    """The fixtures each helper module (tests/*.py that is no test module and not conftest.py) defines."""
    found = {}
    for p in sorted(TESTS.glob("*.py")):
        if p.name.startswith("test_") or p.name == "conftest.py":
            continue
        names = {n.name for n in parsed(p).body
                 if isinstance(n, ast.FunctionDef) and any(_is_fixture(d) for d in n.decorator_list)}
        if names:
            found[p.stem] = names
    return found


def test_no_module_imports_a_fixture():
    """A fixture imported into a module is a new fixture of that module: a session fixture imported into nine test
    modules is built nine times. Helper modules that define fixtures are plugins (conftest.py's pytest_plugins),
    so a test asks for a fixture by name and pytest builds a session fixture once per session (per xdist worker)."""
    fixtures = helper_fixtures()
    conftest = ast.parse((TESTS / "conftest.py").read_text())
    plugins = next(ast.literal_eval(n.value) for n in conftest.body
                   if isinstance(n, ast.Assign) and any(getattr(t, "id", "") == "pytest_plugins" for t in n.targets))
    assert sorted(plugins) == sorted(fixtures), "conftest.py's pytest_plugins lists the helper modules with fixtures"
    found = []
    for p in sorted(TESTS.rglob("*.py")):
        for node in ast.walk(parsed(p)):
            if isinstance(node, ast.ImportFrom) and node.module in fixtures:
                found += [f"{p.relative_to(TESTS)}:{node.lineno} imports the fixture {node.module}.{a.name}"
                          for a in node.names if a.name in fixtures[node.module]]
    assert found == [], "ask for the fixture by name instead (its helper module is a plugin)"


# Third-party packages too heavy to load before a command needs them (`quantbench CMD --help` needs none).
HEAVY = ("onnxruntime", "onnx", "pyarrow", "matplotlib", "PIL", "sklearn", "pycocotools", "tqdm", "pandas", "torch")


def test_importing_every_module_loads_no_heavy_package():
    """Internal imports sit at module top, so a heavy package must be imported where it is used (or bound with
    quantbench.store.lazy), never at a module's top: otherwise every command, and its --help, pays for it."""
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
    trees = {m: parsed(p) for m, p in mods.items()}
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


def _docstring_lines(node) -> int:
    """The lines of a function's docstring: an API function's Parameters section documents, it is no logic to
    split (tests/api/test_api_docstrings.py asks for one)."""
    first = node.body[0] if node.body else None
    if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
        return first.end_lineno - first.lineno + 1
    return 0


def long_functions() -> dict[str, int]:
    """path:function -> its lines, its docstring not counted, for each function over MAX_FUNCTION_LINES."""
    out = {}
    for p in sorted(ROOT.rglob("*.py")):
        for node in ast.walk(parsed(p)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1 - _docstring_lines(node)
                if lines > MAX_FUNCTION_LINES:
                    out[f"{p.relative_to(ROOT.parent)}:{node.name}"] = lines
    return out


def test_no_function_over_60_lines():
    found = long_functions()
    grown = {k: v for k, v in found.items() if k not in LONG_FUNCTIONS or v > LONG_FUNCTIONS[k]}
    assert grown == {}, "split them by meaning"
    assert sorted(found) == sorted(LONG_FUNCTIONS), "a function got short: drop it from LONG_FUNCTIONS"


# ---------------------------------------------------------------- names spelled out

#: the short aliases every reader knows (numpy, pyarrow, pyarrow.parquet, pyarrow.compute)
SHORT_ALIASES = {"np", "pa", "pq", "pc"}


def short_aliases(files) -> dict[str, list[str]]:
    """path -> `line: import ... as X` for each import bound to a 1-2 letter name other than SHORT_ALIASES."""
    found: dict[str, list[str]] = {}
    for path, text in files:
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                for alias in node.names:
                    if alias.asname and len(alias.asname) <= 2 and alias.asname not in SHORT_ALIASES:
                        found.setdefault(path, []).append(f"{node.lineno}: {alias.name} as {alias.asname}")
    return found


def test_no_module_imports_under_a_one_or_two_letter_alias():
    """`C.separation(...)` makes the reader look up what C is; `classes.separation(...)` does not. A name that would
    clash with a local imports the names it needs, or takes a longer alias that says what it is."""
    files = [(p.relative_to(ROOT.parent).as_posix(), p.read_text()) for p in sorted(ROOT.rglob("*.py"))]
    found = short_aliases(files)
    assert found == {}, "spell the module's name out"
    # the rule sees an alias in either form, and lets numpy's and pyarrow's pass
    rogue = "import numpy as np\nfrom quantbench.analysis import classes as C\nimport quantbench.analysis.gates as G\n"
    assert short_aliases([("quantbench/rogue.py", rogue)]) == {
        "quantbench/rogue.py": ["2: classes as C", "3: quantbench.analysis.gates as G"]}


# ---------------------------------------------------------------- the API's results are typed

#: what a field of a result class must not be annotated with: a caller learns nothing from it
UNTYPED = ("object", "Any")


def _module_file(module: str) -> Path | None:
    """The source file of a quantbench module (`quantbench.analysis.equiv` -> quantbench/analysis/equiv.py)."""
    base = ROOT.parent.joinpath(*module.split("."))
    return next((p for p in (base.with_suffix(".py"), base / "__init__.py") if p.exists()), None)


def _module_names(tree) -> dict[str, tuple[str, str | None]]:
    """name -> (module, class name or None for a module) for what a module imports from quantbench."""
    out = {}
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("quantbench"):
            for alias in node.names:
                is_module = _module_file(f"{node.module}.{alias.name}") is not None
                out[alias.asname or alias.name] = ((f"{node.module}.{alias.name}", None) if is_module
                                                   else (node.module, alias.name))
    return out


def _dataclasses_of(path: Path):
    """(tree, {name: ClassDef}) of a module's top-level dataclasses."""
    tree = parsed(path)
    return tree, {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)
                  and any("dataclass" in ast.unparse(d) for d in n.decorator_list)}


def untyped_result_fields() -> list[str]:
    """`path:Class.field: annotation` of each field annotated with UNTYPED in the API's public dataclasses and in
    every quantbench dataclass their fields name, followed through the modules' imports."""
    todo = [(p, name) for p in sorted((ROOT / "api").glob("*.py"))
            for name in _dataclasses_of(p)[1] if not name.startswith("_")]
    seen, found = set(), []
    while todo:
        path, name = todo.pop()
        if (path, name) in seen:
            continue
        seen.add((path, name))
        tree, classes = _dataclasses_of(path)
        imported = _module_names(tree)
        for field in (b for b in classes[name].body if isinstance(b, ast.AnnAssign)):
            text = ast.unparse(field.annotation)
            if any(n.id in UNTYPED for n in ast.walk(field.annotation) if isinstance(n, ast.Name)):
                found.append(f"{path.relative_to(ROOT.parent)}:{name}.{ast.unparse(field.target)}: {text}")
            for node in ast.walk(field.annotation):
                if isinstance(node, ast.Name) and node.id in classes:
                    todo.append((path, node.id))
                elif isinstance(node, ast.Name) and node.id in imported and imported[node.id][1]:
                    module, cls = imported[node.id]
                    todo += [(f, cls) for f in [_module_file(module)] if f and cls in _dataclasses_of(f)[1]]
                elif (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                      and node.value.id in imported and imported[node.value.id][1] is None):
                    f = _module_file(imported[node.value.id][0])
                    todo += [(f, node.attr)] if f and node.attr in _dataclasses_of(f)[1] else []
    return sorted(found)


def test_the_apis_result_classes_are_typed():
    """What quantbench.equiv(...) and the other API functions return says what each field holds, down to the
    classes it exposes (EquivResult, RunSummary, ...): a field of type `object` makes every caller read the code."""
    assert untyped_result_fields() == [], "name the field's type"


# ---------------------------------------------------------------- the library speaks parameters, the CLI flags

#: the CLI layer (cli.py names a ParameterError's flag; commands parse flags).
CLI_MODULES = ("cli/", "__main__.py")
#: library modules whose output is a command line (release/ci.py writes a CI workflow's shell steps): their flags
#: are that file's text, no message.
COMMAND_LINE_WRITERS = ("release/ci.py",)
#: library modules whose text still names a flag (module -> how many literals); the list only shrinks. Most quote
#: another command's line (`quantbench run --export`, `quantbench report` with --fixtures); tableschema's are column
#: descriptions naming the option that set a value.
FLAG_MESSAGES: dict[str, int] = {"analysis/accuracy.py": 2, "analysis/decode.py": 1, "hosts/imported.py": 2,
                                 "inputs/variantdir.py": 2, "release/record.py": 1, "report/equivsection.py": 1,
                                 "store/tableschema.py": 4}


def option_strings() -> set[str]:
    """Every long option any subcommand of the real parser defines."""
    from quantbench import cli

    parser = cli.build_parser(config=False)
    return {o for leaf in parser._qb_leaves.values() for a in leaf._actions for o in a.option_strings
            if o.startswith("--")}


def _docstrings(tree) -> set[int]:
    """The ids of the docstring constants of a module, its classes and functions."""
    return {id(n.body[0].value) for n in ast.walk(tree)
            if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and n.body
            and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}


def _built_flags(tree) -> list[str]:
    """f-strings that make a flag out of a name (f"--{name}"): a flag no literal shows."""
    return [f"{a.value}{{...}}" for n in ast.walk(tree) if isinstance(n, ast.JoinedStr)
            for a, b in zip(n.values, n.values[1:])
            if isinstance(a, ast.Constant) and isinstance(b, ast.FormattedValue) and a.value.endswith("--")
            and a.value[:-2][-1:] in ("", " ", "`", "(", "'", '"')]


#: an argument of a command the library runs (pip, qemu, ssh, debootstrap): the whole literal is one option
ARGV_ITEM = r"--[\w-]+(=\S*)?"


def library_flag_messages() -> dict[str, list[str]]:
    """module -> its text that names a flag: every string literal but docstrings and argv items, raised, returned
    or printed alike (a verdict line or a hint is a message too), and flags an f-string builds."""
    import re

    pattern = re.compile(r"(?<![\w-])(" + "|".join(sorted(map(re.escape, option_strings()), key=len, reverse=True))
                         + r")(?![\w-])")
    out = {}
    for p in sorted(ROOT.rglob("*.py")):
        rel = p.relative_to(ROOT).as_posix()
        if rel.startswith(CLI_MODULES) or rel in COMMAND_LINE_WRITERS:
            continue
        tree = parsed(p)
        docs = _docstrings(tree)
        hits = [n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)
                and id(n) not in docs and not re.fullmatch(ARGV_ITEM, n.value) and pattern.search(n.value)]
        hits += _built_flags(tree)
        if hits:
            out[rel] = hits
    return out


def test_no_library_message_names_a_flag():
    """A library error says which parameter (ParameterError) and the CLI says which flag. Every text counts, not
    only what is raised: a verdict line or a hint returned for a message (and a flag an f-string builds) slipped
    past a check of raises alone. Argv built for pip, qemu or ssh is no message, nor a comment or a docstring."""
    found = {m: len(h) for m, h in library_flag_messages().items()}
    grown = {m: library_flag_messages()[m] for m, n in found.items() if n > FLAG_MESSAGES.get(m, 0)}
    assert grown == {}, "raise ParameterError(name, ...); the CLI adds the flag"
    assert found == FLAG_MESSAGES, "fewer now: lower FLAG_MESSAGES"


# The one owner of sidecars and recipes (quantbench/inputs/sidecarfile.py): only it reads a sidecar file and checks an input
# block (preprocess.py defines check_input_block and guards to_tensor with it).
RECIPE_OWNER = "quantbench/inputs/sidecarfile.py"
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
            elif name == "check_input_block" and path != "quantbench/inputs/preprocess.py":
                out.append(f"{path}:{node.lineno} checks an input block")
    return out


def test_only_the_recipe_module_reads_sidecars():
    files = [(p.relative_to(ROOT.parent).as_posix(), p.read_text()) for p in sorted(ROOT.rglob("*.py"))]
    assert recipe_owner_breaches(files) == []
    # the rule sees a second reader
    rogue = ('import json\nfrom quantbench.fsutil import read_json\nfrom quantbench.inputs.preprocess import check_input_block\n'
             'def f(p, model):\n    side = read_json(p, "sidecar JSON")\n'
             '    raw = json.loads(model.with_suffix(".json").read_text())\n    check_input_block(raw["input"], p)\n')
    assert recipe_owner_breaches([("quantbench/rogue.py", rogue)]) == [
        "quantbench/rogue.py:5 reads a sidecar", "quantbench/rogue.py:6 reads a sidecar",
        "quantbench/rogue.py:7 checks an input block"]


# No module reads another module's private attribute: `x._name` where x is not self/cls and `_name` is defined
# nowhere in the reading module (a function, class, assignment, parameter, import or keyword of its own). What a
# module keeps private may change without a caller noticing; a name another module needs is made public.
#: the public names spelled with an underscore: read anywhere
PUBLIC_UNDERSCORED = {"os._exit": "the standard library's documented exit without clean-up (a forked child)"}
#: reads that stay: module -> ({expression as written}, why). It may only shrink: an entry no longer read fails
#: until it is removed, and no module may add one.
PRIVATE_READS: dict[str, tuple[tuple[str, ...], str]] = {
    "quantbench/cli/cli.py": (
        ("argparse._SubParsersAction",),
        "argparse has no public name for its sub-command action, which the help walks"),
    "quantbench/cli/config.py": (
        ("argparse._CountAction", "argparse._StoreFalseAction", "argparse._StoreTrueAction", "parser._actions"),
        "argparse has no public list of a parser's actions nor names for their kinds; a defaults file is checked "
        "against them"),
    "quantbench/cli/groups.py": (
        ("argparse._StoreFalseAction", "argparse._StoreTrueAction", "p._actions", "parser._actions"),
        "argparse has no public list of a parser's actions nor names for their kinds; a group reads its own back"),
    "quantbench/cli/commands/config.py": (
        ("args._parser", "parser._qb_builtin", "parser._qb_leaves", "parser._qb_sources"),
        "the parser cli.main built, carried on the namespace with the defaults files it applied (underscored so no "
        "option's destination can clash); they wait for a defaults API"),
    "quantbench/release/kitscript.py": (
        ("decode._sigmoid", "decode._squeeze_batch"),
        "a kit's check.py copies the source text of the helpers the simple decoders call (it calls neither)"),
}


def _names_defined(tree) -> set[str]:
    """Every name a module defines or binds: functions, classes, assignments (attributes too), parameters,
    imports and call keywords (argparse's set_defaults(_run=...) sets a namespace attribute)."""
    out = set()
    for n in ast.walk(tree):
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out.add(n.name)
        elif isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Store):
            out.add(n.attr)
        elif isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store):
            out.add(n.id)
        elif isinstance(n, ast.arg):
            out.add(n.arg)
        elif isinstance(n, ast.alias):
            out.add(n.asname or n.name.split(".")[0])
        elif isinstance(n, ast.keyword) and n.arg:
            out.add(n.arg)
    return out


def private_reads(files) -> dict[str, set[str]]:
    """path -> the `x._name` expressions it reads of another module's private attributes."""
    found = {}
    for path, text in files:
        tree = ast.parse(text)
        mine = _names_defined(tree)
        for n in ast.walk(tree):
            if not (isinstance(n, ast.Attribute) and n.attr.startswith("_") and not n.attr.startswith("__")):
                continue
            if isinstance(n.value, ast.Name) and n.value.id in ("self", "cls") or n.attr in mine:
                continue
            if ast.unparse(n) not in PUBLIC_UNDERSCORED:
                found.setdefault(path, set()).add(ast.unparse(n))
    return found


def test_no_module_reads_another_modules_private_attribute():
    files = [(p.relative_to(ROOT.parent).as_posix(), p.read_text()) for p in sorted(ROOT.rglob("*.py"))]
    found = private_reads(files)
    new = {p: sorted(xs - set(PRIVATE_READS.get(p, ((), ""))[0])) for p, xs in found.items()}
    assert {p: xs for p, xs in new.items() if xs} == {}, "make the name public in its module, or read it another way"
    stale = {p: sorted(set(listed) - found.get(p, set())) for p, (listed, _) in PRIVATE_READS.items()}
    assert {p: xs for p, xs in stale.items() if xs} == {}, "no longer read: remove them from PRIVATE_READS"
    # the rule sees a read of another module's private method, and lets a module read its own
    rogue = "def run_host(run):\n    run._run()\n\nclass A:\n    def _own(self):\n        return other._own\n"
    assert private_reads([("quantbench/rogue.py", rogue)]) == {"quantbench/rogue.py": {"run._run"}}
