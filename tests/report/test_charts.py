"""Charts: a plot whose data did not change is not drawn again."""

import pytest

from quantbench.report import charts


def test_plots_not_redrawn_for_the_same_data(tmp_path, monkeypatch):
    pytest.importorskip("matplotlib")
    from types import SimpleNamespace


    result = SimpleNamespace(hosts={"pi": {}, "x86": {}}, flip_rows=[],
                             variants=[{"model": "m", "variant": "fp32",
                                        "classes": [{"label": "A", "hosts": ["pi", "x86"]}]}])
    path = tmp_path / "plots" / "classes.png"
    assert charts.plot_class_map(result, path) == path
    drawn = []
    monkeypatch.setattr(charts, "_savefig", lambda fig, p, key=None: drawn.append(p) or p)
    assert charts.plot_class_map(result, path) == path and drawn == []
    result.variants[0]["classes"] = [{"label": "A", "hosts": ["pi"]}, {"label": "B", "hosts": ["x86"]}]
    charts.plot_class_map(result, path)
    assert drawn == [path]
