"""Subgraphs the search leaves out of QDQ as one global choice where no single op type names them: a LayerNorm as
older exporters (opset < 17) write it, ReduceMean/Sub/Pow/ReduceMean/Add/Sqrt/Div then the scale Mul and bias Add,
and a Gelu in its Erf form, Div (or Mul by 1/sqrt 2)/Erf/Add/Mul/Mul. onnxruntime's static quantizer quantizes their
Add and Mul (not ReduceMean, Pow, Sqrt, Div, Erf), so an int8 Add on a variance of 1e-5 scale or on Erf's output is
what such a choice takes back to float, by node name (the quantizer excludes nodes by name).

Attention's own MatMuls multiply two activations (Q by K transposed, the softmax's weights by V): no weight to keep
in int8, both operands quantized at their calibrated ranges, the scores feeding a Softmax that turns a step of the
grid into a shift of the weights. Kept in float as one group (what NNCF's transformer preset leaves out of int8),
every MatMul with a weight stays int8."""

from __future__ import annotations

from quantbench.inputs.modelio import constant_names


def _graph_maps(model) -> tuple[dict, dict, set]:
    """(tensor -> producing node, tensor -> consuming nodes, initializer and Constant output names)."""
    producer, consumers = {}, {}
    for node in model.graph.node:
        for t in node.output:
            producer[t] = node
        for t in node.input:
            consumers.setdefault(t, []).append(node)
    return producer, consumers, constant_names(model.graph)


def _only(consumers: dict, tensor: str, *ops) -> object | None:
    """The one consumer of `tensor` of one of `ops`, else None."""
    found = [n for n in consumers.get(tensor, []) if n.op_type in ops]
    return found[0] if len(found) == 1 else None


def _affine_tail(node, consumers: dict, consts: set) -> list:
    """The scale Mul and bias Add after a normalisation's last node, those present (each by a constant)."""
    out = []
    for op in ("Mul", "Add"):
        nxt = _only(consumers, node.output[0], op)
        if nxt is None or len(consumers.get(node.output[0], [])) != 1 or not set(nxt.input) & consts:
            break
        out.append(nxt)
        node = nxt
    return out


def _layernorm_from(mean, consumers: dict, consts: set) -> list:
    """The decomposed LayerNorm's nodes starting at its first ReduceMean `mean`, or [] when the chain differs."""
    x = mean.input[0]
    sub = next((n for n in consumers.get(mean.output[0], []) if n.op_type == "Sub" and list(n.input) == [x, mean.output[0]]),
               None)
    if sub is None:
        return []
    d = sub.output[0]
    sq = next((n for n in consumers.get(d, []) if (n.op_type == "Pow" and n.input[0] == d)
               or (n.op_type == "Mul" and list(n.input) == [d, d])), None)
    var = _only(consumers, sq.output[0], "ReduceMean") if sq is not None else None
    eps = _only(consumers, var.output[0], "Add") if var is not None else None
    root = _only(consumers, eps.output[0], "Sqrt") if eps is not None else None
    div = _only(consumers, root.output[0], "Div") if root is not None else None
    if div is None or list(div.input) != [d, root.output[0]]:
        return []
    chain = [mean, sub, sq, var, eps, root, div]
    return chain + _affine_tail(div, consumers, consts)


def decomposed_layernorms(model) -> list[str]:
    """The names of every node of the model's decomposed LayerNorms, in graph order."""
    _, consumers, consts = _graph_maps(model)
    found = set()
    for node in model.graph.node:
        if node.op_type == "ReduceMean":
            found |= {id(n) for n in _layernorm_from(node, consumers, consts)}
    return [n.name for n in model.graph.node if id(n) in found]


def _gelu_from(erf, producer: dict, consumers: dict, consts: set) -> list:
    """The Erf-form Gelu around `erf`: x/sqrt2 (Div or Mul) -> Erf -> +1 -> *x (and *0.5, before or after)."""
    scale = producer.get(erf.input[0])
    if scale is None or scale.op_type not in ("Div", "Mul") or not set(scale.input[1:]) & consts:
        return []
    x = scale.input[0]
    one = _only(consumers, erf.output[0], "Add")
    mul = _only(consumers, one.output[0], "Mul") if one is not None else None
    if mul is None:
        return []
    other = next(t for t in mul.input if t != one.output[0])
    half = producer.get(other)
    if other == x:   # x * (1 + erf): the 0.5 after
        tail = _only(consumers, mul.output[0], "Mul")
        return [scale, erf, one, mul] + ([tail] if tail is not None and set(tail.input) & consts else [])
    if half is not None and half.op_type == "Mul" and x in half.input and set(half.input) & consts:
        return [half, scale, erf, one, mul]   # (0.5 * x) * (1 + erf)
    return []


def erf_gelus(model) -> list[str]:
    """The names of every node of the model's Erf-form Gelus, in graph order."""
    producer, consumers, consts = _graph_maps(model)
    found = set()
    for node in model.graph.node:
        if node.op_type == "Erf":
            found |= {id(n) for n in _gelu_from(node, producer, consumers, consts)}
    return [n.name for n in model.graph.node if id(n) in found]


def _constant_tensors(model) -> set:
    """The tensors computed from constants alone (initializers, Constant outputs, and what nodes make of only
    those: a transposed or reshaped weight is still a weight)."""
    consts = constant_names(model.graph)
    for node in model.graph.node:   # graph order: a node's inputs are made before it
        if node.input and all(t in consts or not t for t in node.input):
            consts |= set(node.output)
    return consts


def activation_matmuls(model) -> list[str]:
    """The names of the MatMuls neither of whose operands is made of constants alone (attention's scores and
    context), in graph order."""
    consts = _constant_tensors(model)
    return [n.name for n in model.graph.node
            if n.op_type == "MatMul" and not any(t in consts for t in n.input)]


#: the global choices of a pattern: the choice's op type -> the finder of its decomposed nodes
PATTERNS = {"LayerNormalization": decomposed_layernorms, "Gelu": erf_gelus,
            "ActivationMatMul": activation_matmuls}
