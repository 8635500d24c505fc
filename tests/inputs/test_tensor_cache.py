"""The fixture tensor cache: an image is decoded once per input recipe, and the cache keeps within its bound."""

import numpy as np
import pytest

from hosts_helpers import make_corpus


def test_fixture_tensors_decoded_once(workdir, home, monkeypatch):
    from quantbench.inputs import fixtures as F

    labels = make_corpus(workdir / "corpus", count=3, size=8)
    spec = {"name": "images", "shape": [1, 3, 8, 8], "layout": "NCHW", "color": "RGB", "dtype": "float32",
            "scale": 1 / 255, "mean": [0.5, 0.5, 0.5], "std": [0.25, 0.25, 0.25]}
    first = F.build_fixtures(spec, labels, split=None)
    monkeypatch.setattr(F, "load_rgb", lambda path: pytest.fail(f"decoded {path} again"))
    again = F.build_fixtures(spec, labels, split=None)
    assert [f.fixture_id for f in again] == [f.fixture_id for f in first]
    assert all(np.array_equal(a.array, b.array) and a.array.dtype == b.array.dtype for a, b in zip(first, again))
    other = dict(spec, mean=[0.0, 0.0, 0.0])  # another recipe: decoded again
    monkeypatch.undo()
    monkeypatch.setenv("QUANTBENCH_HOME", str(home))
    assert {f.fixture_id for f in F.build_fixtures(other, labels, split=None)}.isdisjoint(f.fixture_id for f in first)


def test_tensor_cache_is_bounded(workdir, home, monkeypatch):
    from quantbench.inputs import fixtures as F

    labels = make_corpus(workdir / "corpus", count=4, size=8)
    spec = {"name": "images", "shape": [1, 3, 8, 8], "layout": "NCHW", "color": "RGB", "dtype": "float32",
            "scale": 1 / 255, "mean": [0.0, 0.0, 0.0], "std": [1.0, 1.0, 1.0]}
    monkeypatch.setenv("QUANTBENCH_TENSOR_CACHE_MB", str(2.5 * 896 / (1 << 20)))  # room for two 8x8x3 tensors
    F.build_fixtures(spec, labels, split=None)
    kept = list((home / "tensors").rglob("*.npy"))
    assert len(kept) == 2
