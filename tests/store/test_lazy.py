"""A lazily bound module is imported on the first attribute read, not when it is bound (why `quantbench CMD --help`
loads no pyarrow)."""

import sys

from quantbench.store import lazy


def test_a_lazy_module_is_imported_on_first_use(tmp_path, monkeypatch):
    (tmp_path / "qb_lazy_probe.py").write_text("VALUE = 42\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "qb_lazy_probe", raising=False)
    probe = lazy.module("qb_lazy_probe")
    assert "qb_lazy_probe" not in sys.modules and "imported" not in repr(probe)
    assert probe.VALUE == 42
    assert "qb_lazy_probe" in sys.modules and "(imported)" in repr(probe)
    monkeypatch.delitem(sys.modules, "qb_lazy_probe")
