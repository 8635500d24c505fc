"""Small ONNX models built with onnx.helper, saved checked: the one way the tests save a hand-built graph."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def save_model(graph, path: Path, opset: int = 17) -> Path:
    """`graph` as a checked model (IR 8, default-domain `opset`) at path (its folder made); returns path."""
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))
    return path


def make_model(path, *, casts=2, doc="", value_info=False, producer="pytorch", version="2.6.0",
               weight_seed=0, metadata=None):
    """A tiny MatMul + Cast chain; `doc` goes into every node's doc_string."""
    w = np.random.default_rng(weight_seed).standard_normal((4, 4)).astype(np.float32)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h0"], name="mm", doc_string=doc)]
    prev = "h0"
    for i in range(casts):
        to = TensorProto.FLOAT16 if i % 2 == 0 else TensorProto.FLOAT
        nodes.append(helper.make_node("Cast", [prev], [f"c{i}"], to=to, name=f"cast{i}", doc_string=doc))
        prev = f"c{i}"
    out_type = TensorProto.FLOAT16 if casts % 2 == 1 else TensorProto.FLOAT
    nodes.append(helper.make_node("Relu", [prev], ["y"], name="relu", doc_string=doc))
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                              [helper.make_tensor_value_info("y", out_type, [1, 4])],
                              initializer=[numpy_helper.from_array(w, "w")])
    if value_info:
        graph.value_info.extend([helper.make_tensor_value_info("h0", TensorProto.FLOAT, [1, 4])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name=producer,
                              producer_version=version)
    model.ir_version = 8
    for k, v in (metadata or {}).items():
        model.metadata_props.add(key=k, value=v)
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


def _layernorm_nodes(x: str, out: str, decomposed: bool) -> tuple[list, list]:
    """(nodes, initializers) normalising `x` over its last axis into `out`: one LayerNormalization, or the
    ReduceMean/Sub/Pow/ReduceMean/Add/Sqrt/Div/Mul/Add chain older exporters write for it."""
    inits = [numpy_helper.from_array(np.ones(192, np.float32), "ln_g"),
             numpy_helper.from_array(np.zeros(192, np.float32), "ln_b")]
    if not decomposed:
        return [helper.make_node("LayerNormalization", [x, "ln_g", "ln_b"], [out], name="ln", axis=-1)], inits
    inits += [numpy_helper.from_array(np.array(2.0, np.float32), "ln_two"),
              numpy_helper.from_array(np.array(1e-5, np.float32), "ln_eps")]
    chain = [("ReduceMean", [x], "ln_mu"), ("Sub", [x, "ln_mu"], "ln_d"), ("Pow", ["ln_d", "ln_two"], "ln_d2"),
             ("ReduceMean", ["ln_d2"], "ln_var"), ("Add", ["ln_var", "ln_eps"], "ln_ve"), ("Sqrt", ["ln_ve"], "ln_sd"),
             ("Div", ["ln_d", "ln_sd"], "ln_n"), ("Mul", ["ln_n", "ln_g"], "ln_s"), ("Add", ["ln_s", "ln_b"], out)]
    nodes = [helper.make_node(op, ins, [o], name=f"ln_{i}", **({"axes": [-1]} if op == "ReduceMean" else {}))
             for i, (op, ins, o) in enumerate(chain)]
    return nodes, inits


def _erf_gelu_nodes(x: str, out: str) -> tuple[list, list]:
    """(nodes, initializers) of a Gelu in its Erf form, x * 0.5 * (1 + erf(x / sqrt 2)), as exporters write it."""
    inits = [numpy_helper.from_array(np.array(v, np.float32), k) for k, v in
             (("gelu_sqrt2", np.sqrt(2.0)), ("gelu_one", 1.0), ("gelu_half", 0.5))]
    chain = [("Div", [x, "gelu_sqrt2"], "gelu_s"), ("Erf", ["gelu_s"], "gelu_e"), ("Add", ["gelu_e", "gelu_one"], "gelu_a"),
             ("Mul", [x, "gelu_a"], "gelu_m"), ("Mul", ["gelu_m", "gelu_half"], out)]
    return [helper.make_node(op, ins, [o], name=f"gelu_{i}") for i, (op, ins, o) in enumerate(chain)], inits


def transformer_like_classifier(path, *, decomposed_layernorm: bool = False, gelu: bool = False,
                                seed: int = 0) -> Path:
    """images[1,3,8,8] -> Flatten -> LayerNorm -> `fc1` (MatMul, + a bias whose first channel is 1000) -> `fc2`
    (MatMul, blind to that channel) -> Softmax -> logits[1,8]: a transformer block's op types (MatMul, Softmax,
    LayerNormalization, or its decomposed form) where int8 activations flip decisions and int8 weights do not.
    The outlier channel stretches fc1's output range to [.., 1000]: a u8 step of about 4 rounds the informative
    channels (spread about 0.7) away, a u16 step (0.016) keeps them; every weight is well inside its int8 grid.
    `gelu`: an Erf-form Gelu between fc1's bias and fc2."""
    rng = np.random.default_rng(seed)
    w1 = rng.normal(0, 0.05, (192, 16)).astype(np.float32)
    w1[:, 0] = 0
    b1 = np.zeros(16, np.float32)
    b1[0] = 1000
    w2 = rng.normal(0, 1.0, (16, 8)).astype(np.float32)
    w2[0] = 0
    ln, ln_inits = _layernorm_nodes("f", "n", decomposed_layernorm)
    gelu_nodes, gelu_inits = _erf_gelu_nodes("h", "g") if gelu else ([], [])
    nodes = [helper.make_node("Flatten", ["images"], ["f"], name="flatten"), *ln,
             helper.make_node("MatMul", ["n", "w1"], ["a"], name="fc1"),
             helper.make_node("Add", ["a", "b1"], ["h"], name="fc1_bias"),
             *gelu_nodes,
             helper.make_node("MatMul", ["g" if gelu else "h", "w2"], ["z"], name="fc2"),
             helper.make_node("Softmax", ["z"], ["logits"], name="attn_softmax", axis=-1)]
    g = helper.make_graph(nodes, "transformer_like",
                          [helper.make_tensor_value_info("images", TensorProto.FLOAT, [1, 3, 8, 8])],
                          [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, 8])],
                          [*ln_inits, *gelu_inits, *(numpy_helper.from_array(w, k) for k, w in
                                        (("w1", w1), ("b1", b1), ("w2", w2)))])
    return save_model(g, Path(path), opset=13 if decomposed_layernorm else 17)   # as an older exporter writes it
