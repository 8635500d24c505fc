"""A heavy third-party module (pyarrow, ...) bound at module top but imported on first use.

Why: a library module that names `pa.Table` in many functions would otherwise import
pyarrow (~100 ms) whenever anything imports it, `quantbench CMD --help` included. Bind it as

    if TYPE_CHECKING:
        import pyarrow as pa
    else:
        pa = lazy.module("pyarrow")

and the function bodies stay as they are; annotations stay strings (`from __future__ import annotations`).
"""

from __future__ import annotations

import importlib


class _Module:
    """Stands for the named module; the first attribute read imports it (then every read delegates)."""

    __slots__ = ("_name", "_mod")

    def __init__(self, name: str):
        self._name, self._mod = name, None

    def __getattr__(self, attr: str):
        mod = self._mod
        if mod is None:
            mod = self._mod = importlib.import_module(self._name)
        return getattr(mod, attr)

    def __repr__(self) -> str:
        return f"<lazy module {self._name!r}{'' if self._mod is None else ' (imported)'}>"


def module(name: str) -> _Module:
    """The module `name`, imported when one of its attributes is first read."""
    return _Module(name)
