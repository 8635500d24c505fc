"""`quantbench equiv` on the local x86 host when decisions cannot or should not be decoded.

A model whose sidecar has no decode block, or `--decode none`, still gets its
equivalence classes, distances and tensor gate; decisions are reported as not
compared (never as zero flips), and `--gate decision` is refused. A decoder that
does not fit the outputs stays an error, and says how to get the classes anyway.
"""

import contextlib
import json
from pathlib import Path

import pytest

from quantbench.cli import main
from bench_helpers import SIDE, make_bench


@pytest.fixture(scope="module")
def bench_nodecode(tmp_path_factory):
    """fp32 + dynamic of the tiny classifier whose sidecars carry no decode block, run once on x86."""

    d = tmp_path_factory.mktemp("equiv-nodecode")
    with contextlib.chdir(d):  # module fixtures cannot use monkeypatch
        vdir, labels = make_bench(d / "bench", n_images=4)
        side = {k: v for k, v in SIDE.items() if k != "decode"}
        for name in ("fp32", "dynamic"):
            (vdir / f"{name}.json").write_text(json.dumps(side))
            r = json.loads((vdir / f"{name}.recipe.json").read_text())
            r["sidecar"] = side
            (vdir / f"{name}.recipe.json").write_text(json.dumps(r))
        common = ["--variants", str(vdir), "--fixtures", str(labels), "--no-progress"]
        assert main(["run", "--hosts", "x86", *common]) == 0
    return d, common


@pytest.fixture
def nodecode(bench_nodecode, monkeypatch):
    d, common = bench_nodecode
    monkeypatch.chdir(d)
    return ["equiv", "--no-run", "--no-plots", "--hosts", "x86", *common]


def test_no_decode_block_still_gives_classes_and_says_decisions_not_compared(nodecode, capsys):
    capsys.readouterr()
    assert main(nodecode) == 0
    out = capsys.readouterr().out
    assert "Equivalence classes" in out and "x86" in out
    assert "decisions: not compared (decode none" in out
    assert "0 (0 img)" not in out
    code = main([*nodecode, "--json"])
    s = json.loads(capsys.readouterr().out)
    assert code == 0
    assert {v["variant"] for v in s["variants"]} == {"fp32", "dynamic"}
    assert all(len(v["classes"]) == 1 for v in s["variants"])
    own = next(c for c in s["comparisons"] if c["comparison"] == "own-fp32")
    assert own["flips"] is None and own["decision_passed"] is None
    assert own["tensor_gate"]["elements"] > 0
    from quantbench.store import partread

    assert partread.read("classes").num_rows >= 2
    for name in ("decisions", "flips"):
        p = Path("results/tables") / name
        assert not p.exists() or partread.read(name).num_rows == 0


def test_decode_none_and_the_decision_gate(nodecode, capsys):
    capsys.readouterr()
    assert main([*nodecode, "--decode", "none"]) == 0
    assert "decisions: not compared (decode none)" in capsys.readouterr().out
    assert main([*nodecode, "--decode", "none", "--gate", "tensor", "--atol", "1000"]) == 0
    capsys.readouterr()
    assert main([*nodecode, "--decode", "none", "--gate", "decision"]) == 2
    err = capsys.readouterr().err
    assert "--gate decision" in err and "decode none" in err and len(err.strip().splitlines()) == 1


def test_a_decoder_that_does_not_fit_says_how_to_get_classes(nodecode, capsys):
    capsys.readouterr()
    assert main([*nodecode, "--decode", "detr-sigmoid"]) == 2
    err = capsys.readouterr().err
    assert "pred_logits" in err and "--decode none" in err and len(err.strip().splitlines()) == 1
    with pytest.raises(SystemExit) as e:   # a usage mistake: argparse's one line, exit 2
        main([*nodecode, "--decode", "nosuchkind"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "--decode" in err and "module:function" in err


YOLO_SIDE = {"classes": ["bottle", "can", "bag"],
             "input": {"name": "images", "shape": [1, 3, 16, 16], "layout": "NCHW", "color": "RGB",
                       "dtype": "float32", "scale": 1 / 255, "mean": [0, 0, 0], "std": [1, 1, 1],
                       "resize": "letterbox"},
             "decode": {"kind": "yolo", "output": "output0", "threshold": 0.5, "iou": 0.45}}


def tiny_yolo(path: Path) -> None:
    """images [1,3,16,16] -> output0 [1, 4+3, 16]: a raw YOLOv8-style head (boxes in pixels, class probs)."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(11)
    w = rng.normal(0, 0.6, (7, 3, 4, 4)).astype(np.float32)
    b = rng.normal(0, 0.3, 7).astype(np.float32)
    scale = np.float32([16, 16, 8, 8, 1, 1, 1]).reshape(1, 7, 1)
    inits = [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b"),
             numpy_helper.from_array(np.int64([1, 7, 16]), "shape"), numpy_helper.from_array(scale, "scale")]
    nodes = [helper.make_node("Conv", ["images", "w", "b"], ["c"], strides=[4, 4]),
             helper.make_node("Reshape", ["c", "shape"], ["r"]),
             helper.make_node("Sigmoid", ["r"], ["s"]),
             helper.make_node("Mul", ["s", "scale"], ["output0"])]
    g = helper.make_graph(nodes, "tiny-yolo", [helper.make_tensor_value_info("images", TensorProto.FLOAT, [1, 3, 16, 16])],
                          [helper.make_tensor_value_info("output0", TensorProto.FLOAT, [1, 7, 16])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8
    onnx.save(m, path)


def test_equiv_on_a_raw_yolo_head_and_with_a_decode_plugin(workdir, capsys):
    import numpy as np
    from onnxruntime.quantization import QuantType, quantize_dynamic
    from PIL import Image

    from quantbench.inputs.variantdir import Variant, write_index

    vdir = workdir / "variants"
    vdir.mkdir()
    tiny_yolo(vdir / "fp32.onnx")
    quantize_dynamic(str(vdir / "fp32.onnx"), str(vdir / "dynamic.onnx"), weight_type=QuantType.QInt8)
    vs = []
    for name in ("fp32", "dynamic"):
        recipe = {"variant": name, "method": name, "model": "tiny-yolo", "sidecar": YOLO_SIDE}
        (vdir / f"{name}.recipe.json").write_text(json.dumps(recipe))
        (vdir / f"{name}.json").write_text(json.dumps(YOLO_SIDE))
        vs.append(Variant(name=name, path=vdir / f"{name}.onnx", model="tiny-yolo", recipe=recipe))
    write_index(vdir, vs)
    (workdir / "images").mkdir()
    rng = np.random.default_rng(5)
    images = []
    for i in range(4):   # 24 x 12 images: letterboxed into 16 x 16
        Image.fromarray(rng.integers(0, 256, (12, 24, 3), dtype=np.uint8)).save(workdir / "images" / f"im{i}.png")
        images.append({"id": i, "file_name": f"im{i}.png", "width": 24, "height": 12, "split": "eval"})
    (workdir / "labels.json").write_text(json.dumps({"images": images, "annotations": [], "categories": []}))
    common = ["--hosts", "x86", "--variants", str(vdir), "--fixtures", str(workdir / "labels.json"), "--no-progress"]
    capsys.readouterr()
    assert main(["equiv", *common, "--no-plots", "--json"]) == 0
    s = json.loads(capsys.readouterr().out)
    fp32 = next(v for v in s["variants"] if v["variant"] == "fp32")
    assert fp32["decode"]["kind"] == "yolo" and fp32["decode"]["iou"] == 0.45 and fp32["decode"]["max_det"] == 300
    own = next(c for c in s["comparisons"] if c["comparison"] == "own-fp32")
    assert own["decisions_compared"] and own["fixtures"] == 4 and own["flips"] == sum(own["by_kind"].values())
    from quantbench.store import partread

    dec = partread.read("decisions", columns=["variant", "slot", "kept", "score"]).to_pylist()
    fp32_rows = [r for r in dec if r["variant"] == "fp32"]
    assert fp32_rows and all(0 <= r["slot"] < 16 for r in fp32_rows)
    assert sum(r["kept"] for r in fp32_rows) == own["ref_total"]
    assert all(r["score"] >= 0.25 for r in fp32_rows)   # candidates: threshold 0.5 * 0.5

    # the same outputs through a decode plug-in file: its hash is part of the analysis settings
    (workdir / "dec.py").write_text(
        "import numpy as np\n"
        "def best(outputs, spec):\n"
        "    p = np.asarray(outputs['output0'], np.float64)[0, 4:]\n"
        "    c = p.max(axis=1)\n"
        "    return {'cls': np.arange(3), 'score': c, 'kept': c >= 0.5}\n")
    assert main(["equiv", "--no-run", *common, "--no-plots", "--json", "--decode", "dec.py:best"]) == 0
    cap = capsys.readouterr()
    s = json.loads(cap.out)
    # the decoder given wins over the variants' stored block, and says so (was: silently, the block unused)
    assert ("note: model tiny-yolo: decoder dec.py:best differs from the one the variants' decode block is for "
            "(yolo): that block's settings are not used") in cap.err, cap.err
    assert s["variants"][0]["decode"]["kind"] == "dec.py:best"
    assert s["settings"]["decode_plugins"]["tiny-yolo"]["ref"] == "dec.py:best"
    assert len(s["settings"]["decode_plugins"]["tiny-yolo"]["sha256"]) == 64


def test_a_bad_decode_block_fails_before_any_host_runs(workdir, capsys):
    """Was: every host ran (tables written) before the sidecar's misspelt decode kind was noticed."""
    vdir, labels = make_bench(workdir / "bench", n_images=2)
    for name in ("fp32", "dynamic"):
        recipe = json.loads((vdir / f"{name}.recipe.json").read_text())
        recipe["sidecar"] = {**SIDE, "decode": {"kind": "clasifier-softmax"}}
        (vdir / f"{name}.recipe.json").write_text(json.dumps(recipe))
    code = main(["equiv", "--hosts", "x86", "--variants", str(vdir), "--fixtures", str(labels), "--no-progress"])
    assert code == 2 and "unknown decode kind" in capsys.readouterr().err
    assert not (workdir / "results").exists()


def test_without_a_decoder_the_default_tolerance_gives_no_verdict_and_a_set_one_gates(nodecode, capsys):
    capsys.readouterr()
    assert main(nodecode) == 0
    out = capsys.readouterr().out
    dyn = next(ln for ln in out.splitlines() if ln.startswith("- ") and " dynamic: " in ln)
    assert dyn.startswith("- NO VERDICT dynamic") and "largest |delta| vs fp32" in dyn, dyn
    assert "DO NOT SHIP" not in out
    assert main([*nodecode, "--atol", "1e-9", "--rtol", "1e-9"]) == 0
    out = capsys.readouterr().out
    dyn = next(ln for ln in out.splitlines() if ln.startswith("- ") and " dynamic: " in ln)
    assert dyn.startswith("- DO NOT SHIP dynamic") and "gate tensor: FAIL" in dyn, dyn


def test_a_decode_plugin_that_calls_sys_exit_is_an_error_naming_it(workdir, capsys):
    """`sys.exit(0)` in a decode plug-in made a gated equiv exit 0 with no verdict: now exit 2, one line naming the
    plug-in, no report; the API raises UserError, not SystemExit, into its caller."""
    import quantbench
    from cli_helpers import one_line
    from quantbench.api.options import Fixtures, Fleet, Output
    from quantbench.errors import UserError
    from quantbench.inputs import plugins

    vdir, labels = make_bench(workdir / "bench", n_images=2)
    (workdir / "dec.py").write_text("import sys\n\ndef exits(outputs, spec):\n    sys.exit(0)\n")
    common = ["--hosts", "x86", "--variants", str(vdir), "--fixtures", str(labels), "--no-progress", "--no-plots"]
    capsys.readouterr()
    rc = main(["equiv", *common, "--gate", "decision", "--decode", "dec.py:exits"])
    line = one_line(capsys.readouterr().err, "equiv")
    assert rc == 2 and "decode plug-in dec.py:exits: raised SystemExit (it called sys.exit(0)" in line, line
    assert not (workdir / "results" / "report.md").exists() and not (workdir / "results" / "equiv.json").exists()
    plugins.allow("dec.py:exits")   # the API caller names it, as --decode does
    with pytest.raises(UserError, match="decode plug-in dec.py:exits: raised SystemExit"):
        quantbench.equiv([str(vdir)], Fleet("x86"), Fixtures(labels=str(labels)), output=Output(progress=False),
                         decode="dec.py:exits", plots=False)


def test_fewer_class_names_than_the_models_classes_is_one_line(workdir, capsys):
    """A 5-class model whose sidecar names 2 classes: equiv served the top-1 of the first 2 logits alone (another
    decision than the model's) without a word; now one line naming the output and both counts, exit 2."""
    vdir, labels = make_bench(workdir / "bench", n_images=2)
    side = dict(SIDE, classes=["bottle", "can"])
    for name in ("fp32", "dynamic"):
        (vdir / f"{name}.json").write_text(json.dumps(side))
        r = json.loads((vdir / f"{name}.recipe.json").read_text())
        r["sidecar"] = side
        (vdir / f"{name}.recipe.json").write_text(json.dumps(r))
    capsys.readouterr()
    assert main(["equiv", "--hosts", "x86", "--variants", str(vdir), "--fixtures", str(labels), "--no-progress"]) == 2
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.startswith("quantbench")]
    assert len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith("quantbench equiv: error: model tiny: --decode classifier-softmax: output 'logits' has 5 "
                               "classes; the sidecar's 'classes' names 2: name one class per output column"), lines[0]
