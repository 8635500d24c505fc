"""User code named as ``module:function``: the one loader for decode and preprocessing plug-ins.

A reference is ``dotted.module:function`` (imported like any module) or
``path/to/file.py:function`` (a path, relative to the current folder, ending in
``.py`` or containing a slash). Files are loaded under a private module name
derived from their path and content hash, so two files called ``decoders.py``
never shadow each other and an edited file is loaded afresh.

Every failure (bad reference, missing file, import error, missing or
non-callable function) is a one-line UserError naming the reference and the
flag or sidecar key it came from. ``plugin_identity`` gives the SHA-256 of the
file that defines the function (found, never run), so a recipe can record exactly
which code decided.

Consent: no plug-in runs unless this process was told it may (``allow``): the user
named it (``--decode`` / ``--preprocess``), allowed every plug-in (``allow_all``:
``--allow-plugins``), or a recipe recorded it with its SHA-256 when the user allowed it
at calibrate (``allow(ref, sha256)``: a changed file is refused). Anything else a file
names (a sidecar travelling with a downloaded model) is a ``PluginNotAllowed`` naming
the file and the code, and nothing of it runs.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.machinery
import importlib.util
import os
import sys
from pathlib import Path

from quantbench.errors import PluginNotAllowed, UserError

_FILE_MODULES: dict = {}   # (resolved path, sha256) -> module
_FILE_SHAS: dict = {}      # (resolved path, mtime_ns, size, inode) -> sha256
#: what this process may run: every plug-in, or these refs (None: the user named it; else its pinned SHA-256)
_CONSENT: dict = {"all": False, "refs": {}}


def reset_consent() -> None:
    """Nothing allowed (each command starts so, cli.py)."""
    _CONSENT["all"] = False
    _CONSENT["refs"] = {}


def allow_all() -> None:
    """Every plug-in may run (the user said so)."""
    _CONSENT["all"] = True


def allow(ref: str, sha256: str | None = None) -> None:
    """`ref` may run: named by the user (sha256 None), or recorded with the SHA-256 its file must still have."""
    if _CONSENT["refs"].get(ref, "") is not None:   # a user-named ref stays unpinned
        _CONSENT["refs"][ref] = sha256


def require(ref: str, asked_by: str) -> None:
    """Return if `ref` may run; else PluginNotAllowed saying that `asked_by` (a file and key) asked for it."""
    if _CONSENT["all"]:
        return
    refs = _CONSENT["refs"]
    if ref in refs and refs[ref] is None:
        return
    mod, _ = _split(ref, asked_by)
    if ref in refs:
        now = plugin_identity(ref, asked_by)["sha256"]
        if now == refs[ref]:
            return
        raise UserError(f"{asked_by} {ref}: the plug-in changed since it was allowed at calibrate (SHA-256 "
                        f"{str(now)[:12]}, recorded {refs[ref][:12]}); restore it or recalibrate")
    what = f"the file {_file_path(mod, ref, asked_by)}" if _is_path(mod) else f"the installed module {mod}"
    raise PluginNotAllowed(f"{asked_by} asks to run plug-in {ref} ({what}); code a file names runs only when "
                           "you ask for it", ref)


def is_ref(text) -> bool:
    """True when `text` looks like ``module:function`` (both parts non-empty)."""
    if not isinstance(text, str) or ":" not in text:
        return False
    mod, _, fn = text.rpartition(":")
    return bool(mod.strip()) and bool(fn.strip())


def _split(ref: str, where: str) -> tuple[str, str]:
    if not is_ref(ref):
        raise UserError(f"{where} {ref!r}: not a plug-in reference; write module:function or path/to/file.py:function")
    mod, _, fn = ref.rpartition(":")
    if not fn.isidentifier():
        raise UserError(f"{where} {ref}: {fn!r} is not a function name; write module:function")
    return mod, fn


def same_ref(a, b) -> bool:
    """Whether two plug-in references name the same function: "dec.py:fn", "./dec.py:fn" and its absolute path do
    (a file module by its resolved path, an installed module by its dotted name)."""
    if not (is_ref(a) and is_ref(b)):
        return False
    (ma, _, fa), (mb, _, fb) = a.rpartition(":"), b.rpartition(":")
    if fa != fb or _is_path(ma) != _is_path(mb):
        return False
    return Path(ma).resolve() == Path(mb).resolve() if _is_path(ma) else ma == mb


def _is_path(mod: str) -> bool:
    return mod.endswith(".py") or "/" in mod or os.sep in mod


def one_line(exc: BaseException) -> str:
    if isinstance(exc, SystemExit):
        return f"SystemExit (it called sys.exit({exc.code!r}); a plug-in returns or raises, it never exits)"
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


#: what a plug-in's call may raise that is its own failure: any exception, and SystemExit (`sys.exit(0)` in a
#: plug-in ended a gated equiv with exit 0 and no verdict); Ctrl-C (KeyboardInterrupt) stays the user's.
#: `os._exit` ends the process itself: only a subprocess could contain it (docs/your-model.md).
FAILURES = (Exception, SystemExit)


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _loaded_sha256(path: Path) -> str:
    """_sha256 for the loader, re-read only when the file's stat changes (to_tensor loads per image)."""
    st = path.stat()
    key = (str(path), st.st_mtime_ns, st.st_size, st.st_ino)
    if key not in _FILE_SHAS:
        _FILE_SHAS[key] = _sha256(path)
    return _FILE_SHAS[key]


def _file_path(mod: str, ref: str, where: str) -> Path:
    path = Path(mod).expanduser()
    path = path if path.is_absolute() else Path.cwd() / path
    if not path.is_file():
        raise UserError(f"{where} {ref}: no such file {str(path)!r} (relative paths are read from the current folder)")
    return path.resolve()


def _import(mod: str, ref: str, where: str):
    if _is_path(mod):
        path = _file_path(mod, ref, where)
        sha = _loaded_sha256(path)
        key = (str(path), sha)
        if key not in _FILE_MODULES:
            name = f"_quantbench_plugin_{hashlib.sha256(str(path).encode()).hexdigest()[:12]}_{sha[:12]}"
            spec = importlib.util.spec_from_file_location(name, path)
            module = importlib.util.module_from_spec(spec)
            sys.modules[name] = module
            try:
                spec.loader.exec_module(module)
            except FAILURES as exc:  # user code: any failure is the user's to fix
                sys.modules.pop(name, None)
                raise UserError(f"{where} {ref}: loading {path.name} failed ({one_line(exc)})") from None
            _FILE_MODULES[key] = module
        return _FILE_MODULES[key]
    try:
        return importlib.import_module(mod)
    except FAILURES as exc:
        raise UserError(f"{where} {ref}: cannot import module {mod!r} ({one_line(exc)}); "
                        f"install it, or name a file as path/to/file.py:function") from None


def check_ref(ref: str, where: str = "plug-in") -> str:
    """`ref` if it names a file that exists or a module that can be found (nothing of it runs)."""
    mod, _ = _split(ref, where)
    if _is_path(mod):
        _file_path(mod, ref, where)
    elif _module_origin(mod, ref, where) is None and mod not in sys.builtin_module_names:
        raise UserError(f"{where} {ref}: no module {mod!r} is installed; install it, or name a file as "
                        f"path/to/file.py:function")
    return ref


def load(ref: str, where: str = "plug-in", asked_by: str | None = None):
    """The callable a ``module:function`` reference names, if it may run (require: `asked_by`, default `where`,
    names who asked); `where` (a flag or sidecar key) prefixes errors."""
    mod, fn = _split(ref, where)
    require(ref, asked_by or where)
    module = _import(mod, ref, where)
    obj = getattr(module, fn, None)
    if obj is None:
        raise UserError(f"{where} {ref}: {mod} defines no {fn!r}")
    if not callable(obj):
        raise UserError(f"{where} {ref}: {fn!r} in {mod} is not a function")
    return obj


def plugin_identity(ref: str, where: str = "plug-in") -> dict:
    """{"ref": ref, "sha256": SHA-256 of the file defining the module (None for a module without a file)}."""
    mod, _ = _split(ref, where)
    if _is_path(mod):
        return {"ref": ref, "sha256": _sha256(_file_path(mod, ref, where))}
    origin = _module_origin(mod, ref, where)
    return {"ref": ref, "sha256": _loaded_sha256(origin) if origin is not None else None}


def _module_origin(mod: str, ref: str, where: str) -> Path | None:
    """The file defining module `mod`, found without running it or its packages (None: none found)."""
    if mod in sys.modules:
        origin = getattr(sys.modules[mod], "__file__", None)
        return Path(origin) if origin and Path(origin).is_file() else None
    search, spec = None, None
    try:
        for part in mod.split("."):
            spec = importlib.machinery.PathFinder.find_spec(part, search)
            if spec is None:
                return None
            search = spec.submodule_search_locations
            if search is None and part != mod.split(".")[-1]:
                return None
    except (ImportError, ValueError) as exc:
        raise UserError(f"{where} {ref}: cannot find module {mod!r} ({one_line(exc)})") from None
    origin = spec.origin if spec else None
    return Path(origin) if origin and Path(origin).is_file() else None
