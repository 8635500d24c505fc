"""Which multiply-accumulate nodes of a quantized model compute in int8, read from the model itself.

A search candidate knows its nodes kept in float (its exclude list); a model another tool made (NNCF's
accuracy-aware quantization, onnxruntime's own recipes) does not say, so the int8 share of its weights and MACs
is read from its graph: a Conv/ConvTranspose/MatMul/Gemm runs in int8 where every tensor it multiplies comes out
of a DequantizeLinear (the QDQ form onnxruntime fuses into an integer kernel), and a QLinear*/*Integer node is
int8 by construction. Nodes are keyed as the search keys them (an unnamed one `<op type>@<its first output>`).
"""

from __future__ import annotations

#: the multiply-accumulate op types whose share is counted (explain.search.space.NODE_OPS)
MAC_OPS = ("Conv", "ConvTranspose", "MatMul", "Gemm")
#: integer forms of those ops (QOperator and dynamic quantization): int8 whatever feeds them
INTEGER_MAC_OPS = {"QLinearConv": "Conv", "QLinearMatMul": "MatMul", "ConvInteger": "Conv",
                   "MatMulInteger": "MatMul", "QGemm": "Gemm"}


def node_key(node) -> str:
    """The name the search gives a multiply-accumulate node (search.space.name_unnamed without the `#k` suffix)."""
    op = INTEGER_MAC_OPS.get(node.op_type, node.op_type)
    return node.name or f"{op}@{node.output[0]}"


def int8_nodes(model) -> dict[str, bool]:
    """{multiply-accumulate node: True where it computes in int8} of an onnx ModelProto."""
    producer = {out: n.op_type for n in model.graph.node for out in n.output}
    found = {}
    for node in model.graph.node:
        if node.op_type in INTEGER_MAC_OPS:
            found[node_key(node)] = True
        elif node.op_type in MAC_OPS:
            multiplied = [x for x in node.input[:2] if x]
            found[node_key(node)] = bool(multiplied) and all(producer.get(x) == "DequantizeLinear"
                                                              for x in multiplied)
    return found


def int8_share(flags: dict, weights: dict, macs: dict) -> dict:
    """{"weights", "macs"}: the share of the float model's multiply-accumulate weights and MACs (`weights`, `macs`:
    node -> count, as explain.search.space.Space indexes them) whose node is int8 in `flags` (int8_nodes); a node
    the quantized model no longer holds counts as float. With no such node at all, 0.0 (nothing is int8)."""
    out = {}
    for what, per in (("weights", weights), ("macs", macs)):
        total = sum(per.values())
        out[what] = sum(v for n, v in per.items() if flags.get(n)) / total if total else 0.0
    return out
