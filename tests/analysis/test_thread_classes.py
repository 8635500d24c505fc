"""On the emulated Pi 5 the CPU provider's fp32 bytes depend on the intra-op thread count (the Pi's deployed 4
against 1: two classes, separated by the threads), static QDQ int8's do not (one class). Slow: qemu runs, on
one fixture per stratum."""

import json
import shutil

import numpy as np
import pytest

from quantbench.cli import main
from quantbench.hosts import emulated as E
from setup_required import missing_setup


def _int8_variants(root):
    """fp32 and a static QDQ int8 (S8S8, MinMax on a few fixed inputs) of the bundled demo classifier."""
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    from quantbench.inputs.assets import demo_model
    from quantbench.inputs.sidecarfile import load_sidecar
    from quantbench.inputs.variantdir import Variant, write_index

    class Reader(CalibrationDataReader):
        def __init__(self):
            rng = np.random.RandomState(0)
            self.items = iter([{"images": rng.rand(1, 3, 128, 128).astype(np.float32)} for _ in range(4)])

        def get_next(self):
            return next(self.items, None)

    src, vdir = demo_model("litter-cnn"), root / "variants"
    side = load_sidecar(src)
    vdir.mkdir(parents=True)
    shutil.copyfile(src, vdir / "fp32.onnx")
    quantize_static(str(src), str(vdir / "static.onnx"), Reader(), quant_format=QuantFormat.QDQ,
                    activation_type=QuantType.QInt8, weight_type=QuantType.QInt8)
    vs = []
    for name in ("fp32", "static"):
        recipe = {"variant": name, "method": "fp32" if name == "fp32" else "minmax", "model": "litter-cnn",
                  "sidecar": side, "source_model": {"path": f"bundled:models/{src.name}"}}
        (vdir / f"{name}.recipe.json").write_text(json.dumps(recipe))
        (vdir / f"{name}.json").write_text(json.dumps(side))
        vs.append(Variant(name=name, path=vdir / f"{name}.onnx", model="litter-cnn", recipe=recipe))
    write_index(vdir, vs)
    return vdir


@pytest.mark.slow
def test_threads_split_fp32_but_not_int8_on_the_emulated_pi(workdir, capsys):
    ok, msg = E.ready("pi")
    if not ok:
        missing_setup(f"pi not set up: {msg}")
    vdir = _int8_variants(workdir)
    (workdir / "quantbench.toml").write_text('pi1 = { kind = "emulated", preset = "pi", intra_op_num_threads = 1 }\n')
    code = main(["equiv", "--hosts", "pi,pi1", "--variants", str(vdir), "--limit", "1", "--no-progress", "--no-plots",
                 "--json"])
    s = json.loads(capsys.readouterr().out)
    assert code == 0
    assert s["hosts"]["pi"]["session"]["intra_op_num_threads"] == 4   # the Pi 5's deployed default
    assert s["hosts"]["pi1"]["session"]["intra_op_num_threads"] == 1
    by = {v["variant"]: v for v in s["variants"]}
    assert [c["hosts"] for c in by["fp32"]["classes"]] == [["pi"], ["pi1"]]
    assert by["fp32"]["separating_features"] == ["session.intra_op_num_threads"]
    assert [c["hosts"] for c in by["static"]["classes"]] == [["pi", "pi1"]]
    for v in by.values():   # every node on the CPU provider, on both hosts, nothing flagged
        assert {h: set(p["placement"]) for h, p in v["providers"].items()} == {"pi": {"CPUExecutionProvider"},
                                                                                "pi1": {"CPUExecutionProvider"}}
        assert not any(p["findings"] for p in v["providers"].values())
