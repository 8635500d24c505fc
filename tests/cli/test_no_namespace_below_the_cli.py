"""The argparse namespace stays in the command line: below it (every module outside quantbench/cli/ and
__main__.py) no function takes a Namespace, by annotation or by the name `args`, and nothing reads `args.X`.
The command line hands down typed option groups (quantbench.api.options) and plain parameters."""

import ast
from pathlib import Path

import quantbench

ROOT = Path(quantbench.__file__).resolve().parent
NAMES = {"args", "namespace", "ns"}


def _library_modules():
    for p in sorted(ROOT.rglob("*.py")):
        rel = p.relative_to(ROOT).as_posix()
        if not (rel.startswith("cli/") or rel == "__main__.py"):
            yield rel, ast.parse(p.read_text(encoding="utf-8"))


def _params(fn) -> list:
    a = fn.args
    return [x for x in [*a.posonlyargs, *a.args, *a.kwonlyargs, a.kwarg] if x is not None]


def _parameter_hits(rel: str, fn) -> list[str]:
    """A parameter annotated as a Namespace, or named like one (args, namespace, ns; *args is a tuple)."""
    out = []
    for arg in _params(fn):
        note = ast.unparse(arg.annotation) if arg.annotation is not None else ""
        if "Namespace" in note or arg.arg in NAMES:
            out.append(f"{rel}:{fn.lineno} {getattr(fn, 'name', 'lambda')}({arg.arg}: {note or '?'})")
    return out


def _namespace_uses(rel: str, tree) -> list[str]:
    """Each Namespace parameter and each `args.X` read, except of a local variable that only shares the name (a
    trace event's `args` dict assigned in the function)."""
    found, local = [], set()
    for fn in ast.walk(tree):
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            found += _parameter_hits(rel, fn)
            params = {x.arg for x in _params(fn)}
            stored = {n.id for n in ast.walk(fn) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
            local |= {id(n) for n in ast.walk(fn) if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name)
                      and n.value.id in stored - params}
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in NAMES \
                and id(node) not in local:
            found.append(f"{rel}:{node.lineno} {node.value.id}.{node.attr}")
    return sorted(set(found), key=lambda h: int(h.split(":")[1].split()[0]))


def test_no_library_module_takes_or_reads_an_argparse_namespace():
    found = [hit for rel, tree in _library_modules() for hit in _namespace_uses(rel, tree)]
    assert found == [], "pass the option group's value (quantbench.api.options) or plain parameters instead"


def test_the_check_sees_a_namespace_where_there_is_one():
    """The inspection itself finds each form it looks for (else the test above could never fail)."""
    code = ("import argparse\n"
            "def a(args):\n    return 1\n"
            "def b(opts: argparse.Namespace):\n    return 2\n"
            "def c(x):\n    return args.hosts\n"
            "def d(*args):\n    return args\n"
            "def e(event):\n    args = event.get('args')\n    return args.get('op')\n")
    hits = _namespace_uses("m.py", ast.parse(code))
    assert hits == ["m.py:2 a(args: ?)", "m.py:4 b(opts: argparse.Namespace)", "m.py:7 args.hosts"]
