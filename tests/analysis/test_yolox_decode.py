"""`yolox`: a raw anchor-free grid head [1, N, 5+C] decoded on its stride 8/16/32 grids, class-aware NMS
(the one nms of quantbench.analysis.decode), compared by matching; hand-computed, then through equiv."""

import contextlib
import json
import math

import numpy as np
import pytest

from decode_helpers import input_matmul_head, make_variants, sidecar
from quantbench.analysis.decode import check_outputs, decode, spec_from_sidecar, yolox_grids
from quantbench.cli import main
from quantbench.errors import UserError

SIZE = 64   # 8x8 + 4x4 + 2x2 = 84 rows
CLASSES = ["a", "b"]


def raw_head() -> np.ndarray:
    """[1, 84, 7]: four rows that say something, the rest near zero."""
    h = np.zeros((1, 84, 7), np.float32)
    h[0, :, 4:] = 0.01
    # stride 8, grid (x 2, y 3): class b 0.9 * 0.8 = 0.72, box cx 20 cy 26 w 16 h 8
    h[0, 26] = [0.5, 0.25, math.log(2), 0, 0.9, 0.1, 0.8]
    # stride 8, grid (3, 3): the same box, class b 0.56 -> suppressed by row 26
    h[0, 27] = [-0.5, 0.25, math.log(2), 0, 0.8, 0.1, 0.7]
    # stride 16, grid (1, 1): the same box, class a 0.54 -> another class, kept
    h[0, 64 + 5] = [0.25, 0.625, 0, math.log(0.5), 0.9, 0.6, 0.1]
    # stride 32, grid (0, 1): class a 0.25 -> a candidate under the 0.3 threshold (not served)
    h[0, 80 + 2] = [0.5, 0.5, 0, 0, 0.5, 0.5, 0.1]
    return h


def yolox_spec(**decode):
    side = sidecar(SIZE, CLASSES, {"kind": "yolox", **decode})
    return check_outputs(spec_from_sidecar(side), ["output"])


def test_grid_decode_objectness_times_class_and_class_aware_nms():
    d = decode(yolox_spec(), {"output": raw_head()})
    assert d.slot.tolist() == [26, 69, 82]
    assert d.cls.tolist() == [1, 0, 0]
    np.testing.assert_allclose(d.score, [0.72, 0.54, 0.25], rtol=1e-6)
    assert d.kept.tolist() == [True, True, False]
    np.testing.assert_allclose(d.box[0], [12, 22, 28, 30], rtol=1e-6)
    np.testing.assert_allclose(d.box[1], [12, 22, 28, 30], rtol=1e-6)
    np.testing.assert_allclose(d.box[2], [0, 32, 32, 64], rtol=1e-6)
    np.testing.assert_allclose(d.margin, d.score - 0.3)


def test_grids_run_stride_by_stride_row_by_row_and_the_size_follows_from_the_rows():
    grid, stride = yolox_grids(3549, (8, 16, 32), None)    # 416 x 416, as YOLOX-nano exports
    assert grid.shape == (3549, 2) and stride[0] == 8 and stride[-1] == 32
    assert grid[:3].tolist() == [[0, 0], [1, 0], [2, 0]] and grid[52].tolist() == [0, 1]
    assert grid[52 * 52].tolist() == [0, 0] and stride[52 * 52] == 16
    grid, _ = yolox_grids(84, (8, 16, 32), (64, 64))
    assert grid.shape == (84, 2)
    with pytest.raises(ValueError, match="gives 84 grid rows"):
        yolox_grids(85, (8, 16, 32), (64, 64))


def test_rows_that_do_not_fit_the_grids_are_a_one_line_error():
    spec = yolox_spec(input_size=[64, 96])
    with pytest.raises(UserError, match=r"84 rows.*input_size"):
        decode(spec, {"output": raw_head()})
    with pytest.raises(UserError, match="objectness"):
        yolox_spec(objectness=False)
    with pytest.raises(UserError, match="strides"):
        yolox_spec(strides=[8, 0])


@pytest.fixture(scope="module")
def yolox_bench(tmp_path_factory):
    d = tmp_path_factory.mktemp("yolox")
    side = sidecar(SIZE, CLASSES, {"kind": "yolox", "threshold": 0.3})
    boxes = [{"id": 2 * i + k, "image_id": i, "category_id": k + 1, "bbox": [12, 22, 16, 8]}
             for i in range(3) for k in range(2)]
    vdir, labels = make_variants(d, lambda p: input_matmul_head(p, raw_head(), SIZE), side, [{}] * 3, SIZE,
                                 annotations=boxes, categories=[{"id": 1, "name": "a"}, {"id": 2, "name": "b"}])
    return d, vdir, labels


def test_equiv_decodes_a_yolox_head_through_onnxruntime(yolox_bench, capsys):
    d, vdir, labels = yolox_bench
    with contextlib.chdir(d):
        code = main(["equiv", "--hosts", "x86", "--variants", str(vdir), "--fixtures", str(labels),
                     "--no-progress", "--no-plots", "--json"])
        out = json.loads(capsys.readouterr().out)
        assert code == 0
        own = next(c for c in out["comparisons"] if c["comparison"] == "own-fp32")
        assert own["decisions_compared"] and own["fixtures"] == 3
        assert own["ref_total"] == 6          # two served boxes per image
        from quantbench.store import partread

        rows = [r for r in partread.read("decisions").to_pylist() if r["variant"] == "fp32"]
        assert sorted({r["slot"] for r in rows}) == [26, 69, 82]
        assert all(r["box"] is not None for r in rows)
        report = (d / "results" / "report.md").read_text()
        assert "AP50 / AP50:95" in report and "| fp32 | 1.000 / " in report   # AP50 1: each served box on its label
