"""The decomposed forms of a transformer's normalisation and activation (a LayerNorm as opset < 17 exporters write
it, a Gelu in its Erf form) found in the graph and left out of QDQ as the float_layernormalization and float_gelu
global choices, by node name: their Add/Mul go back to float while the MatMuls stay int8."""

from __future__ import annotations

import onnx
import pytest

from model_helpers import transformer_like_classifier
from search_helpers import calibrate_small


def _space(workdir):
    from quantbench.explain.search.space import Space
    from quantbench.inputs.variantdir import latest_variants

    base = next(v for v in latest_variants() if v.name == "static-minmax")
    return Space.open(base, workdir)


def _reads_dequantized(path, node_names) -> dict:
    """{node: whether every input comes from a DequantizeLinear (a QDQ group onnxruntime may run in int8)} for
    `node_names` of the model at `path`."""
    g = onnx.load(str(path)).graph
    producer = {o: n.op_type for n in g.node for o in n.output}
    return {n.name: all(producer.get(t) == "DequantizeLinear" for t in n.input) for n in g.node if n.name in node_names}


def test_a_decomposed_layernorm_and_an_erf_gelu_are_one_global_choice_each(workdir):
    from quantbench.explain.search.patterns import decomposed_layernorms, erf_gelus

    calibrate_small(workdir, lambda p: transformer_like_classifier(p, decomposed_layernorm=True, gelu=True))
    space = _space(workdir)
    assert decomposed_layernorms(space.model) == [f"ln_{i}" for i in range(9)]   # as calibrate's intake left it
    assert erf_gelus(space.model) == [f"gelu_{i}" for i in range(5)]
    choices = {c.name: c for c in space.choices()}
    ln, gelu = choices["float_layernormalization"], choices["float_gelu"]
    # the quantized members only (onnxruntime's static quantizer takes Add and Mul, not ReduceMean/Pow/Sqrt/Div/Erf)
    assert ln.float_nodes == ("ln_4", "ln_7", "ln_8") and ln.exclude_op_types == choices["base"].exclude_op_types
    assert gelu.float_nodes == ("gelu_2", "gelu_3", "gelu_4")
    members = {*ln.float_nodes, *gelu.float_nodes}
    base = _reads_dequantized(space.build(choices["base"], ()).path, members | {"fc2"})
    assert all(base[n] for n in members)
    for choice, nodes in ((ln, ln.float_nodes), (gelu, gelu.float_nodes)):
        built = space.build(choice, ())
        got = _reads_dequantized(built.path, members | {"fc2"})
        assert not any(got[n] for n in nodes) and got["fc2"] and built.int8_ops > 0, (choice.name, got)
        assert all(got[n] for n in members - set(nodes))   # the other pattern stays as the base makes it
    assert ln.describe()["float_nodes"] == ["ln_4", "ln_7", "ln_8"]


def test_a_graph_without_the_decomposed_forms_offers_neither_choice(workdir):
    calibrate_small(workdir, transformer_like_classifier)
    names = {c.name for c in _space(workdir).choices()}
    assert "float_gelu" not in names and "float_layernormalization" in names   # the LayerNormalization op itself


def test_attentions_matmuls_of_two_activations_are_one_global_choice(workdir):
    """Q @ K^T and softmax @ V (neither operand a weight, a transposed weight still a weight) go back to float
    together; the q/k/v projections and the classifier's last MatMul stay int8."""
    from quantbench.explain.search.patterns import activation_matmuls

    calibrate_small(workdir, lambda p: transformer_like_classifier(p, attention=True))
    space = _space(workdir)
    assert activation_matmuls(space.model) == ["attn_scores", "attn_context"]
    choice = {c.name: c for c in space.choices()}["float_activation_matmuls"]
    assert choice.float_nodes == ("attn_context", "attn_scores")
    assert choice.exclude_op_types == space.base_choice().exclude_op_types
    weighted = {"attn_q", "attn_k", "attn_v", "fc2"}
    base = _reads_dequantized(space.build(space.base_choice(), ()).path, weighted | set(choice.float_nodes))
    assert all(base.values()), base
    built = space.build(choice, ())
    got = _reads_dequantized(built.path, weighted | set(choice.float_nodes))
    assert not got["attn_scores"] and not got["attn_context"] and all(got[n] for n in weighted), got
    assert built.int8_ops > 0
    # the share the search reports is the built graph's: the two MatMuls' MACs are not int8 (they have no weights)
    from quantbench.explain.int8share import int8_nodes, int8_share

    graph = int8_share(int8_nodes(onnx.load(str(built.path))), space.weights, space.macs)
    reported = space.int8_share((), choice)
    assert graph["macs"] < 1.0 and reported["macs"] == pytest.approx(graph["macs"]) and reported["weights"] == 1.0


def test_a_graph_without_two_activation_matmuls_does_not_offer_the_choice(workdir):
    calibrate_small(workdir, transformer_like_classifier)
    assert "float_activation_matmuls" not in {c.name for c in _space(workdir).choices()}
