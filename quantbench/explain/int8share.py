"""Which multiply-accumulate nodes of a quantized model compute in int8, read from the model itself.

A search candidate knows its nodes kept in float (its exclude list); a model another tool made (NNCF's
accuracy-aware quantization, onnxruntime's own recipes) does not say, so the int8 share of its weights and MACs
is read from its graph: a Conv/ConvTranspose/MatMul/Gemm runs in int8 where every tensor it multiplies comes out
of a DequantizeLinear of 8-bit integers (the QDQ form onnxruntime fuses into an integer kernel; one of 16-bit
activations, the A16W8 form of onnxruntime's per-tensor overrides, runs dequantized to float), and a
QLinear*/*Integer node is int8 by construction. Nodes are keyed as the search keys them (an unnamed one
`<op type>@<its first output>`).
"""

from __future__ import annotations

from quantbench.inputs.modelio import constant_names

#: the multiply-accumulate op types whose share is counted (explain.search.space.NODE_OPS)
MAC_OPS = ("Conv", "ConvTranspose", "MatMul", "Gemm")
#: onnx.TensorProto's UINT8 and INT8 (the element types an int8 kernel takes; onnx is not imported to say so)
UINT8, INT8 = 2, 3
EIGHT_BIT = (UINT8, INT8)
#: ops that pass a quantized tensor on unchanged in type (a transposed or reshaped weight)
_TYPE_KEEPING = ("Transpose", "Reshape", "Squeeze", "Unsqueeze", "Identity", "Flatten")
#: integer forms of those ops (QOperator and dynamic quantization): int8 whatever feeds them
INTEGER_MAC_OPS = {"QLinearConv": "Conv", "QLinearMatMul": "MatMul", "ConvInteger": "Conv",
                   "MatMulInteger": "MatMul", "QGemm": "Gemm"}


def node_key(node) -> str:
    """The name the search gives a multiply-accumulate node (search.space.name_unnamed without the `#k` suffix)."""
    op = INTEGER_MAC_OPS.get(node.op_type, node.op_type)
    return node.name or f"{op}@{node.output[0]}"


def _element_types(graph) -> dict:
    """{tensor: its element type} where the graph states it: initializers, Constant nodes, value_info and I/O."""
    out = {i.name: i.data_type for i in graph.initializer}
    for node in graph.node:
        if node.op_type == "Constant" and node.attribute and node.attribute[0].name == "value":
            out[node.output[0]] = node.attribute[0].t.data_type
    for v in [*graph.value_info, *graph.input, *graph.output]:
        out.setdefault(v.name, v.type.tensor_type.elem_type)
    return out


def _quantized_type(tensor: str, producer: dict, types: dict, seen=()) -> int | None:
    """The integer type of `tensor` (what a DequantizeLinear reads): stated in the graph, else its QuantizeLinear's
    zero point or output_dtype (uint8 by default, as ONNX says), through ops that keep the type; None: not known."""
    if types.get(tensor):
        return types[tensor]
    node = producer.get(tensor)
    if node is None or tensor in seen:
        return None
    if node.op_type == "QuantizeLinear":
        if len(node.input) > 2 and node.input[2]:
            return _quantized_type(node.input[2], producer, types, (*seen, tensor))
        dtype = next((a.i for a in node.attribute if a.name == "output_dtype"), 0)
        return dtype or UINT8
    if node.op_type in _TYPE_KEEPING and node.input:
        return _quantized_type(node.input[0], producer, types, (*seen, tensor))
    return None


def _eight_bit(dq, producer: dict, types: dict) -> bool:
    """Whether DequantizeLinear `dq` reads 8-bit integers (its zero point, else its input, says which)."""
    dtype = None
    if len(dq.input) > 2 and dq.input[2]:
        dtype = _quantized_type(dq.input[2], producer, types)
    if dtype is None:
        dtype = _quantized_type(dq.input[0], producer, types)
    return dtype in EIGHT_BIT


def _mac_inputs(model) -> tuple[list, dict, dict]:
    """([(multiply-accumulate node, [the producer of each tensor it multiplies])], producers, element types)."""
    producer = {out: n for n in model.graph.node for out in n.output}
    macs = [(n, [producer.get(x) for x in n.input[:2] if x]) for n in model.graph.node
            if n.op_type in MAC_OPS or n.op_type in INTEGER_MAC_OPS]
    return macs, producer, _element_types(model.graph)


def _dequantized_8_bit(node, producer: dict, types: dict) -> bool:
    return node is not None and node.op_type == "DequantizeLinear" and _eight_bit(node, producer, types)


def int8_nodes(model) -> dict[str, bool]:
    """{multiply-accumulate node: True where it computes in int8} of an onnx ModelProto: every tensor it multiplies
    dequantized from 8-bit integers (a 16-bit or unknown type is not int8)."""
    macs, producer, types = _mac_inputs(model)
    return {node_key(node): node.op_type in INTEGER_MAC_OPS
            or bool(ins) and all(_dequantized_8_bit(dq, producer, types) for dq in ins) for node, ins in macs}


def int8_weight_nodes(model) -> dict[str, bool]:
    """{multiply-accumulate node: True where its weights are held in 8 bits}: each constant it multiplies
    dequantized from 8-bit integers, whatever its activations (A16W8 keeps its weights int8, as the search counts
    them: explain.search.space.Space.int8_share); a node multiplying no constant, as int8_nodes says."""
    macs, producer, types = _mac_inputs(model)
    g = model.graph
    constant = constant_names(g)
    out = {}
    for node, ins in macs:
        held = [dq for dq in ins if dq is not None and dq.op_type == "DequantizeLinear" and dq.input[0] in constant]
        out[node_key(node)] = node.op_type in INTEGER_MAC_OPS or bool(ins) and all(
            _dequantized_8_bit(dq, producer, types) for dq in (held or ins))
    return out


def int8_share(flags: dict, weights: dict, macs: dict, weight_flags: dict | None = None) -> dict:
    """{"weights", "macs"}: the share of the float model's multiply-accumulate weights and MACs (`weights`, `macs`:
    node -> count, as explain.search.space.Space indexes them) whose node is int8 in `flags` (int8_nodes; the weights
    by `weight_flags` where given, int8_weight_nodes); a node the quantized model no longer holds counts as float.
    With no such node at all, 0.0 (nothing is int8)."""
    out = {}
    for what, per, marks in (("weights", weights, flags if weight_flags is None else weight_flags),
                             ("macs", macs, flags)):
        total = sum(per.values())
        out[what] = sum(v for n, v in per.items() if marks.get(n)) / total if total else 0.0
    return out
