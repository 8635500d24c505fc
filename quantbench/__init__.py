"""quantbench: what quantizing one ONNX model does on each CPU it ships to.

The Python API (quantbench.api; docs/api.md), loaded on first use so `import quantbench` stays light:
`calibrate`, `run`, `equiv`, `search`, `localize`, `lint`, `remedy`, `noise`, `latency`, `diff`, `make_release`,
`verify`, `commission` and their option groups `Fleet`, `Fixtures`, `Session`, `Results`, `Output` (and `Gates` of equiv).
`make_release`, since `quantbench.release` is the release package.
"""

import importlib

__version__ = "0.1.0"
SCHEMA_VERSION = 2

#: public name -> (module, attribute)
_API = {
    "calibrate": ("quantbench.api.calibrate", "calibrate"),
    "run": ("quantbench.api.run", "run"),
    "equiv": ("quantbench.api.equiv", "equiv"),
    "Gates": ("quantbench.api.equiv", "Gates"),
    "make_release": ("quantbench.api.release", "release"),
    "verify": ("quantbench.api.release", "verify"),
    "search": ("quantbench.api.search", "search"),
    "commission": ("quantbench.api.commission", "commission"),
    "diff": ("quantbench.api.diff", "diff"),
    **{name: (f"quantbench.api.{name}", name) for name in ("localize", "lint", "remedy", "noise", "latency")},
    **{name: ("quantbench.api.options", name) for name in ("Fleet", "Fixtures", "Session", "Results", "Output")},
}
__all__ = sorted(_API)


def __getattr__(name: str):
    """An API name, its module imported on first use (onnxruntime and pyarrow load only when a function runs)."""
    if name not in _API:
        raise AttributeError(f"module 'quantbench' has no attribute {name!r}")
    module, attr = _API[name]
    value = getattr(importlib.import_module(module), attr)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_API))
