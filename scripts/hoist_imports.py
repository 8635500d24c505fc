"""Move function-level quantbench imports to their module's top import block.

Why: issue 15 asks for internal imports at module top, so a module's dependencies read in
one place and import errors surface at import, not deep inside a command. Lazy imports stay
only where they buy something: heavy third-party modules (onnxruntime, pyarrow, matplotlib: each
loaded where it is used, or bound with quantbench.store.lazy) and `cli.py` importing the command modules
(by name, with importlib: `quantbench CMD` imports CMD alone). So an internal import stays lazy when
- the imported module pulls (through its own top-level imports) a heavy third-party package the
  importer does not already pull (none does today: keep it so);
- tests/test_architecture.py's LAZY_EXEMPT names it ("importer:imported module" -> why).

Edits the source text by line ranges (formatting elsewhere untouched); idempotent, so it can be
rerun after other branches merge:

    python scripts/hoist_imports.py            # rewrite quantbench/ in place, report what stays lazy
    python scripts/hoist_imports.py --check    # list what would move; exit 1 if anything would

Name clashes: a hoisted name that is already bound differently at module level, or imported from
two places by different functions, is imported under an alias (`<module>_<name>`) and the uses in
the importing function are rewritten. An import whose name the function (or an enclosing one)
also binds otherwise is left lazy and reported.
"""

from __future__ import annotations

import argparse
import ast
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "quantbench"
# Third-party modules too heavy to load before a command needs them: imported only where used.
HEAVY = {"onnxruntime", "pyarrow", "matplotlib"}
EXEMPT_FROM = Path("tests") / "test_architecture.py"
WIDTH = 120
FUNCS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)


def module_files(root: Path) -> dict[str, Path]:
    out = {}
    for p in sorted((root / PACKAGE).rglob("*.py")):
        out[".".join(p.relative_to(root).with_suffix("").parts).removesuffix(".__init__")] = p
    return out


def is_internal(name: str | None) -> bool:
    return bool(name) and (name == PACKAGE or name.startswith(PACKAGE + "."))


def top_statements(tree: ast.Module):
    """Module-level statements, descending into if/try (not function or class bodies), skipping TYPE_CHECKING."""
    stack = list(tree.body)
    while stack:
        node = stack.pop(0)
        if isinstance(node, ast.If):
            if "TYPE_CHECKING" in ast.unparse(node.test):
                continue
            stack[:0] = node.body + node.orelse
        elif isinstance(node, ast.Try):
            stack[:0] = node.body + [s for h in node.handlers for s in h.body] + node.orelse + node.finalbody
        else:
            yield node


def imported_modules(node, mods: dict[str, Path]) -> list[str]:
    """The quantbench modules an import statement loads (a `from pkg import sub` loads pkg.sub too)."""
    out = []
    if isinstance(node, ast.Import):
        out = [a.name for a in node.names]
    elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
        out = [node.module] + [f"{node.module}.{a.name}" for a in node.names if f"{node.module}.{a.name}" in mods]
    return out


def import_closures(mods: dict[str, Path], trees: dict[str, ast.Module]) -> tuple[dict, dict]:
    """-> (module -> quantbench modules importing it loads, module -> heavy third-party packages it loads),
    through module-level imports only (parent packages included: they run first)."""
    direct, edges = {}, {}
    for m, tree in trees.items():
        heavy, deps = set(), set()
        parts = m.split(".")
        deps |= {".".join(parts[:i]) for i in range(1, len(parts))}
        for node in top_statements(tree):
            for name in imported_modules(node, mods):
                if is_internal(name):
                    bits = name.split(".")
                    deps |= {".".join(bits[:i]) for i in range(1, len(bits) + 1)} & mods.keys()
                elif name.split(".")[0] in HEAVY:
                    heavy.add(name.split(".")[0])
        direct[m], edges[m] = heavy, deps - {m}
    closure, heavy = {}, {}
    for m in trees:
        seen, todo = {m}, [m]
        while todo:
            for w in edges[todo.pop()] - seen:
                seen.add(w)
                todo.append(w)
        closure[m] = frozenset(seen)
        heavy[m] = frozenset().union(*(direct[v] for v in seen))
    return closure, heavy


def lazy_exempt(root: Path) -> dict[str, str]:
    """LAZY_EXEMPT of tests/test_architecture.py ("importer:imported module" -> why), read without importing it."""
    path = root / EXEMPT_FROM
    if not path.is_file():
        return {}
    for node in ast.parse(path.read_text()).body:
        targets = getattr(node, "targets", None) or [getattr(node, "target", None)]
        if any(isinstance(t, ast.Name) and t.id == "LAZY_EXEMPT" for t in targets):
            return ast.literal_eval(node.value)
    return {}


class Scopes(ast.NodeVisitor):
    """Parent links and, per function scope, the names it binds (parameters, assignments, imports, ...)."""

    def __init__(self, tree):
        self.parent = {}
        for node in ast.walk(tree):
            for child in ast.iter_child_nodes(node):
                self.parent[child] = node
        self.binds = defaultdict(lambda: defaultdict(list))  # scope node -> name -> binding nodes
        self.globals_declared = set()
        self._collect(tree)

    def scope_of(self, node):
        """Nearest enclosing function/lambda/class/module node (comprehensions count as their parent)."""
        p = self.parent.get(node)
        while p is not None and not isinstance(p, FUNCS + (ast.ClassDef, ast.Module)):
            p = self.parent.get(p)
        return p

    def _collect(self, tree):
        for node in ast.walk(tree):
            scope = self.scope_of(node)
            if isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
                self.binds[scope][node.id].append(node)
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                self.binds[scope][node.name].append(node)
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                for a in node.names:
                    self.binds[scope][(a.asname or a.name).split(".")[0]].append(node)
            elif isinstance(node, ast.arg):
                self.binds[self.parent_scope_of_arg(node)][node.arg].append(node)
            elif isinstance(node, ast.ExceptHandler) and node.name:
                self.binds[scope][node.name].append(node)
            elif isinstance(node, (ast.Global, ast.Nonlocal)):
                self.globals_declared |= set(node.names)
            elif isinstance(node, ast.MatchAs) and node.name:
                self.binds[scope][node.name].append(node)

    def parent_scope_of_arg(self, node):
        p = self.parent.get(node)
        while not isinstance(p, FUNCS):
            p = self.parent[p]
        return p

    def enclosing_functions(self, node):
        p = self.scope_of(node)
        while p is not None and not isinstance(p, ast.Module):
            if isinstance(p, FUNCS):
                yield p
            p = self.scope_of(p)


def binding(node: ast.ImportFrom | ast.Import, alias: ast.alias) -> tuple[str, tuple]:
    """(bound name, what it is bound to) for one alias of an import."""
    if isinstance(node, ast.ImportFrom):
        return alias.asname or alias.name, ("from", node.module, alias.name)
    if alias.asname:
        return alias.asname, ("module", alias.name)
    return alias.name.split(".")[0], ("module", alias.name.split(".")[0])


def render_from(module: str, names: list[tuple[str, str | None]]) -> list[str]:
    """`from module import a, b as c`, wrapped in the project's aligned-parenthesis style past WIDTH."""
    parts = [n if a is None or a == n else f"{n} as {a}" for n, a in names]
    one = f"from {module} import {', '.join(parts)}"
    if len(one) <= WIDTH:
        return [one + "\n"]
    head = f"from {module} import ("
    pad = " " * len(head)
    lines, cur = [], head
    for i, part in enumerate(parts):
        piece = part + (")" if i == len(parts) - 1 else ",")
        if cur not in (head, pad) and len(cur) + 1 + len(piece) > WIDTH:
            lines.append(cur + "\n")
            cur = pad
        cur += piece if cur in (head, pad) else " " + piece
    lines.append(cur + "\n")
    return lines


def name_key(name: str) -> tuple:
    """isort's order_by_type: CONSTANTS, then Classes, then functions, each case-insensitively."""
    kind = 0 if name.isupper() and len(name) > 1 else 1 if name[0].isupper() else 2
    return kind, name.lower(), name


def render_import(module: str, asname: str | None) -> list[str]:
    return [f"import {module}" + (f" as {asname}" if asname else "") + "\n"]


class Module:
    def __init__(self, name: str, path: Path, mods: dict[str, Path], closure: dict, heavy: dict,
                 exempt: dict[str, str] | None = None):
        self.name, self.path, self.mods = name, path, mods
        self.closure, self.heavy, self.exempt = closure, heavy, exempt or {}
        self.text = path.read_text()
        self.lines = self.text.splitlines(keepends=True)
        self.tree = ast.parse(self.text)
        self.scopes = Scopes(self.tree)
        self.left_lazy: list[str] = []

    def lazy_imports(self):
        for node in ast.walk(self.tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)) and any(map(is_internal, imported_modules(node, self.mods))):
                if any(True for _ in self.scopes.enclosing_functions(node)):
                    yield node

    def cost(self, node) -> str | None:
        """Why hoisting this import would cost at import time (None: it would not)."""
        heavy = set()
        for m in imported_modules(node, self.mods):
            heavy |= self.heavy.get(m, frozenset()) - self.heavy[self.name]
        if heavy:
            return f"would import {', '.join(sorted(heavy))} at top"
        return None

    def exemption(self, node) -> str | None:
        """LAZY_EXEMPT's reason for keeping this import lazy (None: not exempt)."""
        keys = [f"{self.name}:{m}" for m in imported_modules(node, self.mods)]
        return next((self.exempt[k] for k in keys if k in self.exempt), None)

    def plan(self):
        """-> (top imports to add {(kind, module): {bound name: imported name}}, lazy nodes to remove, renames)."""
        top_binds = self.scopes.binds[self.tree]
        top_imports = {}  # bound name -> what, for module-level imports (excluding TYPE_CHECKING)
        for node in top_statements(self.tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                for a in node.names:
                    top_imports.setdefault(*binding(node, a))
        wanted = {}  # bound name -> what, for hoisted bindings
        adds = defaultdict(dict)
        remove, renames = [], []  # renames: (function scope, old name, new name)
        for node in sorted(self.lazy_imports(), key=lambda n: n.lineno):
            where = f"{self.path.relative_to(ROOT)}:{node.lineno}"
            why = self.cost(node) or self.exemption(node)
            if why:
                self.left_lazy.append(f"{where}: stays lazy ({why})")
                continue
            if any(self.name == m for m in imported_modules(node, self.mods)):
                self.left_lazy.append(f"{where}: stays lazy (imports its own module)")
                continue
            if ";" in "".join(self.lines[node.lineno - 1:node.end_lineno]):
                self.left_lazy.append(f"{where}: stays lazy (shares a line with another statement)")
                continue
            parent = self.scopes.parent[node]
            body = next(v for _, v in ast.iter_fields(parent) if isinstance(v, list) and any(x is node for x in v))
            if all(isinstance(x, (ast.Import, ast.ImportFrom)) for x in body):
                self.left_lazy.append(f"{where}: stays lazy (its block holds nothing but imports)")
                continue
            scope = self.scopes.scope_of(node)
            plan_node, ok = [], True
            for a in node.names:
                name, what = binding(node, a)
                local_binds = [b for b in self.scopes.binds[scope][name] if b is not node]
                outer = [f for f in self.scopes.enclosing_functions(node) if f is not scope and name in self.scopes.binds[f]]
                if local_binds or outer or name in self.scopes.globals_declared:
                    ok = False
                    self.left_lazy.append(f"{where}: stays lazy ({name!r} is also bound in the function)")
                    break
                clash = (top_imports.get(name, what) != what
                         or (name in top_binds and name not in top_imports)
                         or wanted.get(name, what) != what)
                if clash:
                    if what[0] != "from":
                        ok = False
                        self.left_lazy.append(f"{where}: stays lazy ({name!r} clashes with a module-level name)")
                        break
                    new = f"{what[1].rsplit('.', 1)[-1]}_{what[2]}"
                    if new in top_binds and top_imports.get(new) != what or wanted.get(new, what) != what:
                        ok = False
                        self.left_lazy.append(f"{where}: stays lazy ({name!r} clashes; alias {new!r} taken)")
                        break
                    plan_node.append((new, what, name))
                else:
                    plan_node.append((name, what, None))
            if not ok:
                continue
            for bound, what, old in plan_node:
                wanted[bound] = what
                if old is not None:
                    renames.append((scope, old, bound))
                if top_imports.get(bound) == what:
                    continue
                if what[0] == "from":
                    adds[("from", what[1])][bound] = what[2]
                else:
                    alias = next(a for a in node.names if binding(node, a)[0] == bound)
                    adds[("import", alias.name)][alias.asname or alias.name] = alias.name
            remove.append(node)
        return adds, remove, renames

    def rename_edits(self, renames):
        """Replace Load/Store uses of the old name by the alias inside the importing scope (and nested ones)."""
        edits = []
        for scope, old, new in renames:
            for node in ast.walk(scope):
                if isinstance(node, ast.Name) and node.id == old:
                    # Skip uses inside a nested scope that rebinds the name itself.
                    s = self.scopes.scope_of(node)
                    shadowed = False
                    while s is not scope and s is not None:
                        if old in self.scopes.binds[s]:
                            shadowed = True
                        s = self.scopes.scope_of(s)
                    if not shadowed:
                        edits.append((node.lineno, node.col_offset, node.end_col_offset, new))
        return edits

    def rewrite(self) -> bool:
        adds, remove, renames = self.plan()
        if not remove:
            return False
        lines = list(self.lines)
        # 1. renames (byte columns; a line's later edits first).
        for lineno, c0, c1, new in sorted(self.rename_edits(renames), reverse=True):
            raw = lines[lineno - 1].encode()
            lines[lineno - 1] = (raw[:c0] + new.encode() + raw[c1:]).decode()
        # 2. drop the lazy import statements (and the blank line that separated them from the code).
        drop = set()
        for node in remove:
            drop |= set(range(node.lineno - 1, node.end_lineno))
        drop |= self.orphan_blank_lines(remove)
        # 3. the top block: replacements, then an insertion.
        replace, after, text = self.top_edit(adds)
        out = [] if after >= 0 or not text else list(text)
        skip_to = -1
        for i, line in enumerate(lines):
            if i in replace:
                end, new = replace[i]
                out.extend(new)
                skip_to = end
            if i >= skip_to and i not in drop:
                out.append(line)
            if i == after:
                out.extend(text)
        new_text = "".join(out)
        ast.parse(new_text)  # never write a file that does not parse
        self.path.write_text(new_text)
        return True

    def orphan_blank_lines(self, remove) -> set:
        """Blank lines that separated a removed run of imports from the code below, when nothing is above the run
        but the def/docstring or a blank line (so no double or leading blank line is left behind)."""
        extra = set()
        bodies = []
        for node in remove:
            parent = self.scopes.parent[node]
            for _, value in ast.iter_fields(parent):
                if isinstance(value, list) and any(v is node for v in value) and (parent, value) not in bodies:
                    bodies.append((parent, value))
        for parent, body in bodies:
            i = 0
            while i < len(body):
                if body[i] not in remove:
                    i += 1
                    continue
                j = i
                while j < len(body) and body[j] in remove:
                    j += 1
                if j < len(body):
                    at_start = i == 0 or (i == 1 and self.is_docstring(body[0], parent))
                    prev_blank = self.lines[body[i].lineno - 2].strip() == ""
                    if at_start or prev_blank:
                        nxt = body[j]
                        start = min([nxt.lineno] + [d.lineno for d in getattr(nxt, "decorator_list", [])]) - 1
                        for k in range(body[j - 1].end_lineno, start):
                            if self.lines[k].strip():
                                break
                            extra.add(k)
                i = j
        return extra

    @staticmethod
    def is_docstring(stmt, parent) -> bool:
        return (isinstance(parent, (ast.FunctionDef, ast.AsyncFunctionDef)) and parent.body and parent.body[0] is stmt
                and isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant) and isinstance(stmt.value.value, str))

    def top_edit(self, adds) -> tuple[dict[int, tuple[int, list[str]]], int, list[str]]:
        """Where the hoisted imports go -> ({first line: (end line, new text)} replacements, insert-after line, text).

        A contiguous block of quantbench imports is rebuilt sorted with the new names; otherwise new names join
        the existing statement for their module and new modules follow the last quantbench (else any) import.
        """
        body = self.tree.body
        internal = [s for s in body if isinstance(s, (ast.Import, ast.ImportFrom)) and imported_modules(s, self.mods)
                    and all(is_internal(m) for m in imported_modules(s, self.mods))]
        keyed = defaultdict(dict)
        for key, names in adds.items():
            keyed[key].update(names)
        existing = defaultdict(list)
        for s in internal:
            for a in s.names:
                key = ("from", s.module) if isinstance(s, ast.ImportFrom) else ("import", a.name)
                existing[key].append(s)
        contiguous = bool(internal) and all(b.lineno == a.end_lineno + 1 for a, b in zip(internal, internal[1:]))
        if contiguous:
            merged = defaultdict(dict)
            for s in internal:
                for a in s.names:
                    key = ("from", s.module) if isinstance(s, ast.ImportFrom) else ("import", a.name)
                    merged[key].setdefault(a.asname or a.name, a.name)
            for key, names in keyed.items():
                merged[key].update(names)
            start, end = internal[0].lineno - 1, internal[-1].end_lineno
            return {start: (end, self.render(merged))}, -1, []
        replace = {}
        for key in [k for k in keyed if k[0] == "from" and k in existing]:
            s = existing[key][-1]
            names = {a.asname or a.name: a.name for a in s.names}
            names.update(keyed.pop(key))
            replace[s.lineno - 1] = (s.end_lineno, self.render({key: names}))
        if not keyed:
            return replace, -1, []
        text = self.render(keyed)
        if internal:
            return replace, internal[-1].end_lineno - 1, text
        imports = [s for s in body if isinstance(s, (ast.Import, ast.ImportFrom))]
        if imports:
            return replace, imports[-1].end_lineno - 1, ["\n"] + text
        first = body[0] if body else None
        doc = isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str)
        if doc:
            blank_follows = first.end_lineno < len(self.lines) and not self.lines[first.end_lineno].strip()
            return replace, first.end_lineno - 1, ["\n"] + text + ([] if blank_follows or len(body) == 1 else ["\n"])
        return replace, -1, text + ["\n"]

    @staticmethod
    def render(merged) -> list[str]:
        """isort's default layout: modules sorted, names CONSTANTS, Classes, functions, one line per `as` alias."""
        out = []
        for kind, module in sorted(merged, key=lambda k: (k[1], k[0])):
            names = merged[(kind, module)]
            if kind == "from":
                plain = sorted((orig, None) for bound, orig in names.items() if bound == orig)
                if plain:
                    out += render_from(module, sorted(plain, key=lambda kv: name_key(kv[0])))
                for n, a in sorted(((orig, bound) for bound, orig in names.items() if bound != orig),
                                   key=lambda kv: name_key(kv[0])):
                    out += render_from(module, [(n, a)])
            else:
                for bound, orig in names.items():
                    out += render_import(orig, None if bound == orig else bound)
        return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="report only; exit 1 if an import would move")
    ap.add_argument("--root", type=Path, help="repository root (default: this checkout)")
    args = ap.parse_args(argv)
    global ROOT
    ROOT = root = (args.root or ROOT).resolve()
    mods = module_files(root)
    trees = {m: ast.parse(p.read_text()) for m, p in mods.items()}
    closure, heavy = import_closures(mods, trees)
    exempt = lazy_exempt(root)
    moved, lazy = 0, []
    for name, path in mods.items():
        mod = Module(name, path, mods, closure, heavy, exempt)
        if args.check:
            adds, remove, _ = mod.plan()
            moved += len(remove)
            for node in remove:
                print(f"{path.relative_to(root)}:{node.lineno}: would move")
        elif mod.rewrite():
            moved += 1
            print(f"{path.relative_to(root)}: imports hoisted")
        lazy += mod.left_lazy
    for line in lazy:
        print(line)
    print(f"{moved} {'imports would move' if args.check else 'modules rewritten'}; {len(lazy)} stay lazy", file=sys.stderr)
    return 1 if args.check and moved else 0


if __name__ == "__main__":
    sys.exit(main())
