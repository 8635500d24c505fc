"""The search's space: the global choices a static QDQ variant can be re-made with, the nodes that can be kept in
float, and the measurements that rank those nodes.

Every candidate is made from the same prepared float model (``prepared.onnx`` beside the variants, as
calibrate left it) and calibration ranges (the ``<variant>.ranges.json`` calibrate wrote, and those of the
other static variants beside it, for the other calibration methods): only the choice and the nodes kept in
float change, so a candidate is a pure function of (choice, excluded nodes) and is named by its semantic hash.
"""

from __future__ import annotations

import math
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from quantbench.calibset import builder
from quantbench.errors import UserError
from quantbench.explain.lint import lint_model
from quantbench.explain.search.patterns import PATTERNS
from quantbench.explain.search.tensors import sixteen_bit_nodes, tensor_extra
from quantbench.inputs.modelio import dims_of, load_model, semantic_sha256
from quantbench.quantize import ort_api
from quantbench.quantize import variants
from quantbench.quantize.calibration import ImageInputs, load_ranges, ranges_dict, ranges_sha256
from quantbench.quantize.ort_api import load_with_shape_infer, method_name
from quantbench.inputs.sidecarfile import input_spec_for

#: the op types whose nodes the search may keep in float (the multiply-accumulate ones int8 kernels run)
NODE_OPS = ("Conv", "ConvTranspose", "MatMul", "Gemm")
X64_ENTRY = "session.x64quantprecision"
#: op types left out of QDQ as one global choice each, where the graph has one the base quantizes or its decomposed
#: form (explain.search.patterns: a LayerNorm as older opsets export it, a Gelu in its Erf form, their quantized
#: Add/Mul nodes by name): a transformer keeps its MatMuls in int8 while its normalisations and activations stay
#: float (a Gelu op is not among onnxruntime's static op types: already float; its Erf form's Add/Mul are)
FLOAT_OP_CHOICES = ("Softmax", "LayerNormalization", "Sigmoid", "Gelu")
#: the SQNR at which a tensor counts as exact (onnxruntime reports inf for no noise, and 300+ dB for an input
#: whose values fall on the quantization grid): higher values are taken as this, so a node's loss is not its
#: input's rounding luck
EXACT_DB = 100.0


@dataclass(frozen=True)
class Choice:
    """One global way to make the variant: calibration ranges (method), types, per-channel, reduce_range, and
    the session entries every host must set to get its results (a deployment requirement)."""

    name: str
    method: str
    ranges_file: str
    activation_type: str
    weight_type: str
    per_channel: bool
    reduce_range: bool
    session: tuple = ()     # sorted (key, value) pairs
    exclude_op_types: tuple = ()   # op types left in float everywhere (the op types quantized: the rest)
    extra_options: tuple = ()      # sorted (key, value) pairs for the quantizer (ActivationSymmetric)
    node_forms: tuple = ()         # sorted (node, form) pairs: per-node tensor choices (tensors.FORMS)
    float_nodes: tuple = ()        # nodes left out of QDQ by the choice itself (a decomposed LayerNorm's Add/Mul)
    quantize_outputs: bool = False  # float graph outputs through Q/DQ at their calibrated ranges (identity walk)

    @property
    def entries(self) -> dict:
        return dict(self.session)

    def session_with(self, key: str, value: str) -> tuple:
        """The choice's session requirements plus `key`=`value` (sorted pairs, as `session` holds them)."""
        return tuple(sorted({*self.session, (key, value)}))

    def describe(self) -> dict:
        out = asdict(self)
        out["session"] = self.entries
        out["extra_options"] = dict(self.extra_options)
        out["node_forms"] = dict(self.node_forms)
        out["float_nodes"] = list(self.float_nodes)
        return out


#: the op types that compute or carry int8: a candidate holding none of them is the float model (explain.search
#: never evaluates, chooses nor writes it: all-float is the baseline the search is measured against)
INT8_OPS = ("QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear")


@dataclass
class Built:
    path: Path
    variant_id: str
    size: int
    float_share: float
    int8_ops: int = 0       # its QuantizeLinear/DequantizeLinear/integer nodes (0: no int8 left)


def int8_op_count(path) -> int:
    """The nodes of the model at `path` that quantize, dequantize or compute in integers (QLinear*, *Integer), its
    weights not read."""
    graph = load_model(path, check=False, load_external_data=False).graph
    return sum(1 for n in graph.node
               if n.op_type in INT8_OPS or n.op_type.startswith("QLinear") or n.op_type.endswith("Integer"))


@dataclass
class Space:
    """The prepared float model, the ranges, the base recipe; builds candidates into `workdir`."""

    base: object            # quantbench.inputs.variantdir.Variant
    prepared: Path
    workdir: Path
    ranges_files: dict = field(default_factory=dict)    # method -> ranges file
    built: dict = field(default_factory=dict)
    weights: dict = field(default_factory=dict)         # node -> weight elements
    op_types: dict = field(default_factory=dict)        # node -> op type
    macs: dict = field(default_factory=dict)            # node -> multiply-accumulates per inference (shape-inferred)
    model: object = None
    named: list = field(default_factory=list)           # the unnamed MAC nodes given names here (name_unnamed)

    @staticmethod
    def check(base) -> tuple[Path, Path]:
        """(its ranges file, the prepared float model) of a base variant the search can start from."""
        stem = Path(base.path)
        ranges = stem.with_name(stem.stem + ".ranges.json")
        recipe = base.recipe or {}
        if recipe.get("method") != "static" or recipe.get("quant_format") != "QDQ":
            raise UserError(f"{base.path}: not a static QDQ variant (its recipe says method "
                            f"{recipe.get('method')!r}); search starts from a static variant calibrate wrote")
        prepared = stem.parent / "prepared.onnx"
        for need in (ranges, prepared):
            if not need.exists():
                raise UserError(f"{need}: missing (calibrate leaves it beside the variants); rerun `quantbench "
                                "calibrate` to make it")
        return ranges, prepared

    @classmethod
    def open(cls, base, workdir: Path) -> "Space":
        stem = Path(base.path)
        ranges, prepared = cls.check(base)
        space = cls(base, prepared, workdir)
        for f in sorted(stem.parent.glob("*.ranges.json")):
            method = method_name(checked_ranges(f))
            space.ranges_files.setdefault(method, f)
        space.ranges_files[(base.recipe or {}).get("calibration_method", method_name(checked_ranges(ranges)))] = ranges
        space.model = load_with_shape_infer(prepared)
        space._check_base(ranges)   # before naming: the variant as calibrated keeps the model's own (empty) names
        space.named = name_unnamed(space.model)
        space._index_nodes()
        return space

    def _check_base(self, ranges: Path) -> None:
        """The variant as calibrated, re-made from its ranges and the prepared model, is the variant calibrate
        wrote: its ranges those its recipe records (ranges_sha256) and its model of its recipe's semantic hash;
        else one line naming the file, before anything runs (an edited ranges file or prepared.onnx passed as
        "the variant as calibrated")."""
        recipe, name = self.base.recipe or {}, self.base.name
        want, got = recipe.get("ranges_sha256"), ranges_sha256(checked_ranges(ranges))
        if want and got != want:
            raise UserError(f"{ranges}: not the ranges {name} was calibrated with (SHA-256 {got[:12]}, its recipe "
                            f"records {str(want)[:12]}); rerun `quantbench calibrate` to remake them; nothing was run")
        built = self.build(self.base_choice(), ())
        if built is None or built.variant_id != recipe.get("semantic_sha256"):
            made = "nothing (the quantizer refuses it)" if built is None else f"semantic hash {built.variant_id[:12]}"
            raise UserError(f"{self.prepared}: {name} re-made from it and {ranges.name} is not the variant calibrate "
                            f"wrote ({made}, its recipe records {str(recipe.get('semantic_sha256'))[:12]}); rerun "
                            "`quantbench calibrate` to remake them; nothing was run")

    def _index_nodes(self) -> None:
        from onnx import numpy_helper

        g = self.model.graph
        inits = {i.name: numpy_helper.to_array(i).shape for i in g.initializer}
        dims = {v.name: dims_of(v) for v in list(g.value_info) + list(g.output) + list(g.input)}
        for node in g.node:
            if node.op_type in NODE_OPS and node.name:
                self.op_types[node.name] = node.op_type
                self.weights[node.name] = sum(int(np.prod(inits[x])) for x in node.input if x in inits)
                self.macs[node.name] = _macs(node, inits, dims)

    def int8_share(self, exclude, choice: Choice | None = None) -> dict:
        """{"weights", "macs"}: the share of the candidate nodes' weights and multiply-accumulates left in int8 (a
        node reading 16-bit activations keeps its weights in int8, not its MACs; a node the choice itself leaves in
        float, such as an attention MatMul of two activations, neither)."""
        out = {}
        wide = sixteen_bit_nodes(self, choice) if choice is not None else set()
        floated = {*exclude, *(n for n in (choice.float_nodes if choice is not None else ()) if n in self.op_types)}
        for what, per, off in (("weights", self.weights, floated), ("macs", self.macs, {*floated, *wide})):
            total = sum(per.values())
            out[what] = 1 - sum(per[n] for n in off) / total if total else 1.0
        return out

    def nodes(self) -> list[str]:
        return sorted(self.op_types)

    def share(self, exclude) -> float:
        total = sum(self.weights.values())
        return sum(self.weights[n] for n in exclude) / total if total else 0.0

    def base_choice(self) -> Choice:
        r = self.base.recipe
        method = r.get("calibration_method", "minmax")
        return Choice("base", method, str(self.ranges_files[method]), r.get("activation_type", "u8"),
                      r.get("weight_type", "s8"), bool(r.get("per_channel", True)), bool(r.get("reduce_range", False)),
                      (), tuple(sorted(r.get("exclude_op_types") or ())),
                      quantize_outputs=bool(r.get("quantize_outputs", False)))

    def choices(self) -> list[Choice]:
        """The global choices, the variant as calibrated first."""
        b = self.base_choice()
        out = [b, Choice("x64quantprecision", b.method, b.ranges_file, b.activation_type, b.weight_type,
                         b.per_channel, b.reduce_range, ((X64_ENTRY, "1"),))]
        if not b.reduce_range:
            out.append(_with(b, "reduce_range", reduce_range=True))
        for at, wt in (("s8", "s8"), ("u8", "u8")):
            if (at, wt) != (b.activation_type, b.weight_type):
                out.append(_with(b, f"{at}{wt}", activation_type=at, weight_type=wt))
        out.append(_with(b, "per_tensor" if b.per_channel else "per_channel", per_channel=not b.per_channel))
        for method, f in sorted(self.ranges_files.items()):
            if method != b.method:
                out.append(_with(b, method, method=method, ranges_file=str(f)))
        present = {n.op_type for n in self.model.graph.node}
        quantized = (present & set(variants.static_op_types())) - set(b.exclude_op_types)
        for op in FLOAT_OP_CHOICES:
            nodes = self.pattern_nodes(op, quantized)
            if op in quantized or nodes:
                ops = tuple(sorted({*b.exclude_op_types, op})) if op in quantized else b.exclude_op_types
                out.append(_with(b, f"float_{op.lower()}", exclude_op_types=ops, float_nodes=nodes))
        attention = self.pattern_nodes("ActivationMatMul", quantized)
        if attention:   # MatMuls of two activations (attention's): the weighted MatMuls stay int8
            out.append(_with(b, "float_activation_matmuls", float_nodes=attention))
        if not (self.base.recipe.get("extra_options") or {}).get("ActivationSymmetric"):
            out.append(_with(b, "symmetric_activations", extra_options=(("ActivationSymmetric", True),)))
        mac_only = tuple(sorted((present & set(variants.static_op_types())) - set(NODE_OPS) | set(b.exclude_op_types)))
        if mac_only != b.exclude_op_types:   # only the multiply-accumulate ops quantized
            out.append(_with(b, "mac_only", exclude_op_types=mac_only))
        return out

    def pattern_nodes(self, op: str, quantized: set) -> tuple:
        """The named nodes of `op`'s decomposed form (explain.search.patterns) that the base quantizes, sorted (an
        unnamed one cannot be excluded by name, and is left as it is)."""
        finder = PATTERNS.get(op)
        if finder is None:
            return ()
        types = {n.name: n.op_type for n in self.model.graph.node if n.name}
        return tuple(sorted(n for n in finder(self.model) if n and types.get(n) in quantized))

    def build(self, choice: Choice, exclude: tuple) -> Built | None:
        """The candidate (choice, nodes kept in float), built once; None when the quantizer refuses it."""
        key = (choice, tuple(sorted(exclude)))
        if key not in self.built:
            self.built[key] = self._make(choice, key[1], self.workdir / f"c{len(self.built)}.onnx")
        return self.built[key]

    def _make(self, choice: Choice, exclude: tuple, path: Path, name: str = "candidate", recipe_extra=None):
        try:
            extra = {**dict(choice.extra_options), **tensor_extra(self, choice)}
            variants.make_static(self.prepared, path, ranges=load_ranges(Path(choice.ranges_file)),
                                 method=choice.method,
                                 percentile=(self.base.recipe.get("calibration_options") or {}).get("percentile"),
                                 activation_type=choice.activation_type, weight_type=choice.weight_type,
                                 per_channel=choice.per_channel, reduce_range=choice.reduce_range,
                                 exclude_nodes=tuple(sorted({*exclude, *choice.float_nodes})),
                                 exclude_op_types=choice.exclude_op_types, extra_options=extra,
                                 name=name, model_name=self.base.model, model=self.model, recipe_extra=recipe_extra,
                                 quantize_outputs=choice.quantize_outputs)
        except UserError:
            raise
        except Exception:  # the quantizer refuses a combination (e.g. U8U8 per-channel): not a candidate
            return None
        return Built(path, semantic_sha256(path), path.stat().st_size, self.share(exclude), int8_op_count(path))

    def write(self, choice: Choice, exclude: tuple, path: Path, name: str, recipe_extra: dict) -> Built:
        built = self._make(choice, exclude, path, name, recipe_extra)
        if built is None:
            raise UserError(f"{path}: the quantizer refused the chosen recipe when writing it")
        return built


def checked_ranges(path: Path):
    """The ranges a ranges file holds (quantize.calibration.load_ranges), each a finite [lowest, highest] pair and
    at least one of them; else one line naming the file (a string, NaN or empty ranges left the search nothing to
    build, "space exhausted" without a word, or a ValueError)."""
    try:
        data = load_ranges(path)
        pairs = ranges_dict(data)
    except (ValueError, TypeError, IndexError) as exc:
        raise UserError(f"{path}: not a quantbench ranges file ({str(exc).splitlines()[0] if str(exc) else exc!r}); "
                        "rerun `quantbench calibrate` to remake it") from None
    bad = next((t for t, (lo, hi) in pairs.items() if not (math.isfinite(lo) and math.isfinite(hi) and lo <= hi)), None)
    if not pairs or bad is not None:
        why = "holds no ranges" if not pairs else f"tensor {bad!r} has the range {pairs[bad]}, not finite lowest <= highest"
        raise UserError(f"{path}: {why}; rerun `quantbench calibrate` to remake it")
    return data


def name_unnamed(model) -> list[str]:
    """Stable names for the multiply-accumulate nodes (NODE_OPS) a model leaves unnamed (CenterFace's 63 Convs), so
    the search can rank them and keep them in float (the quantizer excludes nodes by name): `<op type>@<its first
    output>` (output names are unique in a graph; a name already taken gets `#k`). Returns the names given; every
    candidate is built from this model, so the written variant carries them."""
    taken = {n.name for n in model.graph.node if n.name}
    given = []
    for node in model.graph.node:
        if node.op_type not in NODE_OPS or node.name:
            continue
        stem = f"{node.op_type}@{node.output[0]}"
        name, k = stem, 1
        while name in taken:
            name, k = f"{stem}#{k}", k + 1
        node.name = name
        taken.add(name)
        given.append(name)
    return given


def _macs(node, inits: dict, dims: dict) -> int:
    """Multiply-accumulates of one Conv/MatMul/Gemm node: output elements x reduction length (unknown dims: 1)."""
    out = [d if isinstance(d, int) and d > 0 else 1 for d in dims.get(node.output[0], [])]
    w = next((inits[x] for x in node.input[1:2] if x in inits), None)
    if node.op_type.startswith("Conv") and w is not None and len(w) > 1:
        red = int(np.prod(w[1:]))
    elif w is not None and len(w) == 2:
        red = int(np.prod(w)) // max(1, out[-1] if out else 1)
    else:
        a = dims.get(node.input[0], [])
        red = a[-1] if a and isinstance(a[-1], int) and a[-1] > 0 else 1
    return int(np.prod(out)) * red if out else 0


def _with(b: Choice, name: str, **changes) -> Choice:
    fields = {**asdict(b), "name": name, **changes}
    fields["session"] = tuple(fields["session"])
    fields["exclude_op_types"] = tuple(fields["exclude_op_types"])
    fields["extra_options"] = tuple(tuple(kv) for kv in fields["extra_options"])
    return Choice(**fields)


def lint_ranking(model_path, fleet: list) -> dict:
    """{node: (saturating pairs, hosts of the fleet it can make diverge, reason)} of the layers lint marks as
    able to diverge on a host of this fleet."""
    return {layer.node: (layer.x86_saturating_pairs + layer.neon_wrapping_pairs, layer.fleet_hosts, layer.reason)
            for layer in lint_model(model_path, fleet) if layer.fleet_hosts}


def error_feeds(base, fixtures, count: int) -> tuple[list[dict], str]:
    """(up to `count` inputs, where they come from) to measure per-node error on: the calibration set's first
    images, preprocessed as calibrated; without a calibration set, the eval fixtures."""
    info = (base.recipe or {}).get("calibration_set") or {}
    folder = info.get("folder")
    if folder and Path(folder).exists():
        paths, _, _ = builder.load(folder)
        spec = input_spec_for(base)
        return list(ImageInputs(paths[:count], spec)), f"{min(count, len(paths))} calibration images"
    picked = sorted(fixtures, key=lambda fx: fx.fixture_id)[:count]
    return [{fx.input_name: fx.array} for fx in picked], f"{len(picked)} eval fixtures (no calibration set)"


def error_ranking(space: Space, qdq_path, feeds: list[dict]) -> dict:
    """{node: SQNR lost across it (dB)}: per-tensor error of the QDQ model against the float one
    (onnxruntime's qdq_loss_debug, quantize.ort_api.activation_errors); a node's loss is its worst input's
    SQNR minus its worst output's."""
    with tempfile.TemporaryDirectory(dir=space.workdir) as tmp:
        sqnr = ort_api.activation_errors(space.prepared, qdq_path, feeds, tmp)
    sqnr = {k: (min(v, EXACT_DB) if math.isfinite(v) else EXACT_DB) for k, v in sqnr.items()}
    out = {}
    for node in space.model.graph.node:
        if node.name not in space.op_types:
            continue
        ins = [sqnr[t] for t in node.input if t in sqnr]
        outs = [sqnr[t] for t in node.output if t in sqnr]
        if outs:
            out[node.name] = round((min(ins) if ins else max(outs)) - min(outs), 6)
    return out


def mac_node_of(model, tensor: str, names) -> str | None:
    """The multiply-accumulate node (NODE_OPS, one of `names`) nearest upstream of `tensor` in a QDQ model: its
    producers walked breadth first through everything else (QuantizeLinear, DequantizeLinear, Relu, ...), inputs
    in order; None when no such node feeds it. A first divergent tensor localize names (often the QuantizeLinear
    output a fused QLinearConv writes) maps to the node the search can keep in float."""
    producer = {t: n for n in model.graph.node for t in n.output}
    names, queue, seen = set(names), [tensor], {tensor}
    while queue:
        node = producer.get(queue.pop(0))
        if node is None:
            continue
        if node.op_type in NODE_OPS and node.name in names:
            return node.name
        for t in node.input:
            if t and t not in seen:
                seen.add(t)
                queue.append(t)
    return None
