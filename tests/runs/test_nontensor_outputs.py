"""Outputs that are not tensors (ZipMap's sequence of maps, string tensors) are refused by name.

onnxruntime returns such outputs as Python lists of dicts (or object arrays); their
"bytes" are object pointers, so hashing them would make two different fixtures share a
hash. calibrate refuses the model at intake and the worker refuses it before any run.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from calib_helpers import make_corpus
from cli_helpers import digest, one_line
from hosts_helpers import fixtures, variant
from quantbench.cli import main
from quantbench.errors import UserError
from quantbench.runs.runner import run_hosts

SEQ_MAP = "seq(map(int64,tensor(float)))"


def zipmap_model(path, shape=(1, 3, 16, 16), input_name="images") -> Path:
    """input -> Flatten -> LinearClassifier -> (label, ZipMap(scores)): a scikit-learn style export."""
    n = int(np.prod(shape[1:]))
    coef = np.random.default_rng(0).normal(0, 0.05, (2 * n,)).astype(np.float32).tolist()
    nodes = [helper.make_node("Flatten", [input_name], ["flat"], axis=1),
             helper.make_node("LinearClassifier", ["flat"], ["label", "scores"], domain="ai.onnx.ml",
                              coefficients=coef, intercepts=[0.1, -0.1], classlabels_ints=[0, 1],
                              post_transform="SOFTMAX"),
             helper.make_node("ZipMap", ["scores"], ["probabilities"], domain="ai.onnx.ml", classlabels_int64s=[0, 1])]
    probs = helper.make_value_info("probabilities", helper.make_sequence_type_proto(
        helper.make_map_type_proto(TensorProto.INT64, helper.make_tensor_type_proto(TensorProto.FLOAT, []))))
    g = helper.make_graph(nodes, "zipmap", [helper.make_tensor_value_info(input_name, TensorProto.FLOAT, list(shape))],
                          [helper.make_tensor_value_info("label", TensorProto.INT64, [1]), probs])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("ai.onnx.ml", 3)])
    m.ir_version = 8
    onnx.checker.check_model(m)
    onnx.save(m, str(path))
    Path(path).with_suffix(".json").write_text(json.dumps({"input": {
        "name": input_name, "shape": list(shape), "layout": "NCHW", "color": "RGB", "dtype": "float32",
        "scale": 1 / 255, "mean": [0.485, 0.456, 0.406], "std": [0.229, 0.224, 0.225]}}))
    return Path(path)


def test_zipmap_output_really_is_a_list_of_maps(tmp_path):
    """The premise: real onnxruntime returns ZipMap's output as Python dicts, no tensor bytes."""
    model = zipmap_model(tmp_path / "zm.onnx")
    sess = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    assert [o.type for o in sess.get_outputs()] == ["tensor(int64)", SEQ_MAP]
    label, probs = sess.run(None, {"images": np.zeros((1, 3, 16, 16), np.float32)})
    assert isinstance(probs, list) and isinstance(probs[0], dict)


def test_calibrate_refuses_a_zipmap_output_by_name_before_writing(workdir, capsys):
    """Was: calibrate published the variants, then the outputs table stored object pointers as tensor bytes."""
    labels, _ = make_corpus(workdir / "corpus", n_litter=8, n_negative=8, n_eval=4)
    model = zipmap_model(workdir / "zm.onnx")
    rc = main(["calibrate", "--model", str(model), "--labels", str(labels), "--per-cell", "2", "--methods", "dynamic"])
    err = capsys.readouterr().err
    assert rc == 2
    assert err.count("\n") == 1 and "Traceback" not in err
    assert str(model) in err and "'probabilities'" in err and SEQ_MAP in err and "skl2onnx: options={'zipmap': False}" in err
    assert not (workdir / "results").exists() and not (workdir / "calib_sets").exists()


def test_a_run_refuses_a_non_tensor_output_before_anything_is_written(workdir):
    """Was: equiv died in np.frombuffer (OBJECT array from memory buffer); two fixtures shared a hash. Then: the
    worker refused it after the fixtures, models and hosts tables were written. Now the plan refuses it."""
    model = zipmap_model(workdir / "zm.onnx", shape=(1, 16), input_name="x")
    root = workdir / "t"
    with pytest.raises(UserError) as exc:
        run_hosts(["x86"], [variant(model)], fixtures(2), progress=False, tables_root=root, jobs=1)
    msg = str(exc.value)
    assert "\n" not in msg and "'probabilities'" in msg and SEQ_MAP in msg and "skl2onnx: options={'zipmap': False}" in msg
    assert not root.exists()


@pytest.mark.parametrize("command", ["run", "equiv"])
def test_a_bare_zipmap_variant_is_refused_before_any_table_is_written(workdir, capsys, command):
    """Was: `--variants zm.onnx` wrote the fixtures, models and hosts tables, then failed with "rerun to resume"
    (a rerun fails the same way)."""
    labels, _ = make_corpus(workdir / "corpus", n_litter=2, n_negative=2, n_eval=2)
    model = zipmap_model(workdir / "zm.onnx")
    before = digest(workdir)
    rc = main([command, "--hosts", "x86", "--variants", str(model), "--fixtures", str(labels), "--no-progress"])
    line = one_line(capsys.readouterr().err, command)
    assert rc == 2 and f"{model}: output 'probabilities' is {SEQ_MAP}, not a numeric tensor" in line
    assert "rerun" not in line
    assert digest(workdir) == before and not (workdir / "results").exists()
