"""The API's surface: `import quantbench` stays light, each public name resolves to its function on first use, and
the functions take the command line's defaults."""

import inspect
import subprocess
import sys
from pathlib import Path

import quantbench
from quantbench.api.options import Fixtures, Fleet, Results

ROOT = Path(__file__).resolve().parents[2]


def test_import_quantbench_loads_no_api_module_nor_heavy_package():
    code = ("import sys, quantbench\n"
            "print(sorted(m for m in sys.modules if m.startswith('quantbench.api') or m in "
            "('onnxruntime', 'pyarrow', 'onnx', 'numpy')))\n")
    p = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "[]"


def test_every_public_name_resolves_to_the_api():
    for name in quantbench.__all__:
        assert getattr(quantbench, name).__module__.startswith("quantbench.api."), name
    assert set(quantbench.__all__) <= set(dir(quantbench))


def test_the_defaults_are_the_command_lines():
    from quantbench.cli import build_parser

    parser = build_parser(config=False, commands=["run", "equiv"])
    defaults = {n: {a.dest: a.default for a in p._actions} for n, p in parser._qb_leaves.items()}
    run, equiv = inspect.signature(quantbench.run).parameters, inspect.signature(quantbench.equiv).parameters
    assert run["fleet"].default == Fleet(defaults["run"]["hosts"])
    assert equiv["fleet"].default == Fleet(defaults["equiv"]["hosts"])
    assert run["results"].default == Results(defaults["run"]["results"])
    assert run["fixtures"].default.split == defaults["run"]["split"] == Fixtures().split
    gates = equiv["gates"].default
    assert (gates.atol, gates.rtol, gates.budget) == tuple(defaults["equiv"][k] for k in ("atol", "rtol", "budget"))
    assert str(equiv["confirm"].default) == defaults["equiv"]["confirm"]


def test_the_search_defaults_are_the_command_lines():
    from quantbench.cli import build_parser

    parser = build_parser(config=False, commands=["search"])
    cli = {a.dest: a.default for a in parser._qb_leaves["search"]._actions}
    params = inspect.signature(quantbench.search).parameters
    shared = [k for k in params if k in cli and k not in ("variant", "fixtures", "results")]
    assert len(shared) >= 12, shared
    assert {k: params[k].default for k in shared} == {k: cli[k] for k in shared}


def test_the_explain_defaults_are_the_command_lines():
    """localize, lint, remedy, noise and latency take their commands' defaults (a list of names: comma-joined)."""
    from quantbench.cli import build_parser

    names = ["localize", "lint", "remedy", "noise", "latency"]
    parser = build_parser(config=False, commands=names)
    for name in names:
        cli = {a.dest: a.default for a in parser._qb_leaves[name]._actions}
        params = inspect.signature(getattr(quantbench, name)).parameters
        shared = [k for k in params if k in cli and k not in ("variant", "model", "fixtures", "results", "fleet")]
        api = {k: ",".join(d) if isinstance(d := params[k].default, tuple) else d for k in shared}
        assert api == {k: cli[k] for k in shared}, name
        assert len(shared) >= {"lint": 0, "localize": 5, "remedy": 5, "noise": 5, "latency": 5}[name], (name, shared)
    assert inspect.signature(quantbench.latency).parameters["fleet"].default == Fleet(
        {a.dest: a.default for a in parser._qb_leaves["latency"]._actions}["hosts"])
