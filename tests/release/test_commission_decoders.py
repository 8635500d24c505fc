"""The commissioning kit of a DETR-style detector, a threshold-map text detector and a batch-of-two model: each
kit records per class the per-fixture served decisions of its built-in rule (the same the equiv decisions table
holds), check.py re-applies the rule on the device, and says how many fixtures' decisions differ from the nearest
class when the device's bytes match no measured class. Real onnxruntime sessions on the local host."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import numpy as np
import pytest

from decode_helpers import make_variants
from model_helpers import save_model
from quantbench.cli import main
from quantbench.release import kitscript
from release_helpers import commission, run_check

SIZE, QUERIES, CLASSES = 16, 6, ["a", "b", "c"]


def detr_model(path: Path) -> Path:
    """images -> pred_logits [1, Q, C] and pred_boxes [1, Q, 4] (sigmoid cx, cy, w, h) from the image's mean colour."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(7)
    inits = [numpy_helper.from_array(rng.normal(0, 3, (3, QUERIES * len(CLASSES))).astype(np.float32), "wl"),
             numpy_helper.from_array(rng.normal(0, 1, (QUERIES * len(CLASSES),)).astype(np.float32) - 1.5, "bl"),
             numpy_helper.from_array(rng.normal(0, 1, (3, QUERIES * 4)).astype(np.float32), "wb"),
             numpy_helper.from_array(np.array([1, QUERIES, len(CLASSES)], np.int64), "sl"),
             numpy_helper.from_array(np.array([1, QUERIES, 4], np.int64), "sb")]
    nodes = [helper.make_node("GlobalAveragePool", ["images"], ["g"]),
             helper.make_node("Flatten", ["g"], ["f"]),
             helper.make_node("MatMul", ["f", "wl"], ["ml"]), helper.make_node("Add", ["ml", "bl"], ["al"]),
             helper.make_node("Reshape", ["al", "sl"], ["pred_logits"]),
             helper.make_node("MatMul", ["f", "wb"], ["mb"]), helper.make_node("Sigmoid", ["mb"], ["sg"]),
             helper.make_node("Reshape", ["sg", "sb"], ["pred_boxes"])]
    g = helper.make_graph(nodes, "detr", [helper.make_tensor_value_info("images", TensorProto.FLOAT, [1, 3, SIZE, SIZE])],
                          [helper.make_tensor_value_info("pred_logits", TensorProto.FLOAT, [1, QUERIES, len(CLASSES)]),
                           helper.make_tensor_value_info("pred_boxes", TensorProto.FLOAT, [1, QUERIES, 4])], inits)
    return save_model(g, path)


def map_model(path: Path, batch: int = 1) -> Path:
    """images [batch, 3, S, S] -> map [batch, 1, S, S]: a sigmoid of a 3x3 convolution (DBNet's probability map in
    miniature: regions follow the image's texture)."""
    from onnx import TensorProto, helper, numpy_helper

    w = np.random.default_rng(3).normal(0, 1.5, (1, 3, 3, 3)).astype(np.float32)
    nodes = [helper.make_node("Conv", ["images", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Sigmoid", ["c"], ["map"])]
    g = helper.make_graph(nodes, "map", [helper.make_tensor_value_info("images", TensorProto.FLOAT, [batch, 3, SIZE, SIZE])],
                          [helper.make_tensor_value_info("map", TensorProto.FLOAT, [batch, 1, SIZE, SIZE])],
                          [numpy_helper.from_array(w, "w"), numpy_helper.from_array(np.array([-0.2], np.float32), "b")])
    return save_model(g, path)


#: a preprocessing plug-in making a batch of two: the image and its mirror
TWO = '''
import numpy as np

def two(rgb, spec):
    from PIL import Image
    x = np.asarray(Image.fromarray(rgb).resize((16, 16)), np.float32) / 255
    return np.ascontiguousarray(np.stack([x, x[:, ::-1]]).transpose(0, 3, 1, 2))
'''

BENCHES = {
    "detr": (detr_model, {"kind": "detr-sigmoid", "threshold": 0.5}, {}),
    "map": (map_model, {"kind": "threshold-map", "threshold": 0.5}, {}),
    "batch2": (lambda p: map_model(p, batch=2), {"kind": "threshold-map", "threshold": 0.5},
               {"shape": [2, 3, SIZE, SIZE], "plugin": "two.py:two"}),
}


@pytest.fixture(scope="module", params=sorted(BENCHES))
def measured(request, tmp_path_factory):
    """(name, results folder) after `equiv --hosts x86` on fp32 and dynamic int8 of one bench over 6 images."""
    name = request.param
    build, decode, inp = BENCHES[name]
    root = tmp_path_factory.mktemp(f"kit-{name}")
    (root / "two.py").write_text(TWO)
    side = {"classes": CLASSES if name == "detr" else ["text"],
            "input": {"name": "images", "shape": [1, 3, SIZE, SIZE], "scale": 1 / 255, **inp}, "decode": decode}
    vdir, labels = make_variants(root, build, side, [{}] * 6, SIZE)
    with contextlib.chdir(root):
        assert main(["equiv", "--hosts", "x86", "--variants", str(vdir), "--fixtures", str(labels), "--allow-plugins",
                     "--no-progress", "--no-plots", "--results", str(root / "results")]) == 0
    return name, root / "results"


def _table_decisions(results: Path) -> list:
    """The equiv decisions table's served [slot, class] pairs of fp32 on x86, per fixture."""
    from quantbench.store import partread

    rows = [r for r in partread.read("decisions", root=results / "tables").to_pylist()
            if r["variant"] == "fp32" and r["host"] == "x86" and r["kept"]]
    out: dict = {}
    for r in rows:
        out.setdefault(r["fixture_id"], []).append([r["slot"], r["class_id"]])
    return out


def test_the_kit_records_each_fixtures_served_decisions_and_check_passes(measured, tmp_path):
    name, results = measured
    kit = tmp_path / "kit"
    assert commission(results, kit, "--variant", "fp32", "--count", "4") == 0
    exp = json.loads((kit / "expected.json").read_text())
    assert exp["decode"]["decoder"] == ("decode_detr" if name == "detr" else "decode_map")
    (cls,) = exp["classes"]
    assert len(cls["decisions"]) == 4 and len(exp["fixtures"]) == 4
    if name == "detr":
        table = _table_decisions(results)
        assert [d["served"] for d in cls["decisions"]] == [sorted(table.get(f["fixture_id"], []))
                                                             for f in exp["fixtures"]]
        assert any(d["served"] for d in cls["decisions"])      # the threshold serves some queries
    else:
        assert all(len(d["mask_sha256"]) == 64 for d in cls["decisions"])   # which pixels are served
        assert any(d["served"] for d in cls["decisions"])
    if name == "batch2":
        assert all(f["shape"] == [2, 3, SIZE, SIZE] for f in exp["fixtures"])
    r = run_check(kit)
    assert (r.returncode, r.stdout) == (0, "PASS: identical to class A (x86): 4 of 4 fixtures\n"), r.stdout + r.stderr


def _forged(kit: Path, change) -> None:
    """The kit as a release measured elsewhere would have it: expected.json edited by `change`, and check.py
    rewritten with its new hash (as the kit's build writes it)."""
    import hashlib

    exp = json.loads((kit / "expected.json").read_text())
    change(exp)
    data = json.dumps(exp, indent=1, sort_keys=True).encode()
    (kit / "expected.json").write_bytes(data)
    (kit / "check.py").write_text(kitscript.render(hashlib.sha256(data).hexdigest()))


def test_a_device_in_no_measured_class_is_told_how_many_fixtures_decisions_differ(measured, tmp_path):
    """Class A's hashes as another machine gave them (every fixture but the first differs), and on fixture 3 other
    served decisions: check.py runs the rule on this device's outputs and counts the fixtures whose decisions
    differ from class A's."""
    _, results = measured
    kit = tmp_path / "kit"
    assert commission(results, kit, "--variant", "fp32", "--count", "4") == 0

    def elsewhere(exp):
        cls = exp["classes"][0]
        for out in cls["outputs"][1:]:
            for k in out:
                out[k] = "0" * 64
        cls["decisions"][2] = {**cls["decisions"][2], "served": [[99, 0]]}

    _forged(kit, elsewhere)
    r = run_check(kit)
    assert (r.returncode, r.stdout) == (1, "NEW CLASS: matches no measured class; first differs on fixture 2; "
                                           "decisions: 1 of 4 fixtures differ from class A\n"), r.stdout + r.stderr
    got = json.loads(run_check(kit, "--json").stdout)
    assert (got["result"], got["identical"], got["decisions_differ"]) == ("NEW CLASS", 1, 1)
