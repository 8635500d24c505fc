"""Loading ONNX models with errors a user can act on, and their identity.

The *semantic hash* (a variant's id) is the SHA-256 of the model serialized
deterministically after removing content that does not execute. By default that is
every doc_string (model, graph, nodes, functions, subgraphs); `strip` may add
"producer" (producer_name/version), "value_info" (shape annotations) and
"metadata" (metadata_props). The raw file hash is always reported beside it.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

from quantbench.inputs.assets import quantbench_home
from quantbench.errors import UserError, flag_mark
from quantbench.fsutil import cache_on, file_state, regular_file, sha256_bytes, sha256_file, write_cache_entry

STRIP_DEFAULT = ("doc_string",)
STRIP_OPTIONAL = ("producer", "value_info", "metadata")


def load_model(path: str | os.PathLike, check: bool = True, load_external_data: bool = True):
    """onnx.ModelProto from `path`; missing, non-ONNX or invalid files are UserErrors naming the file."""
    import onnx

    path = Path(path)
    if not path.exists():
        raise UserError(f"{path}: model file not found")
    regular_file(path, "model (.onnx file)")
    size = path.stat().st_size
    if size > PROTO_LIMIT:   # (a sparse 3 GiB file was read whole, 3.2 GB of memory, before protobuf said no)
        raise UserError(f"{path}: {size:,} bytes, more than a protobuf message can hold ({PROTO_LIMIT:,}): not an "
                        "ONNX model file (a larger model keeps its weights as external data)")
    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception as exc:
        raise UserError(f"{path}: not an ONNX model ({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})") from None
    if not model.graph.node and not model.graph.output:
        raise UserError(f"{path}: not an ONNX model (empty graph)")
    if load_external_data and _external_files(model, path):  # located inside the model's folder, or refused
        _embed_external_data(model, path)
    if check:
        try:
            onnx.checker.check_model(model)
        except Exception as exc:
            raise UserError(f"{path}: fails onnx.checker ({str(exc).splitlines()[0]})") from None
    return model


#: protobuf's limit: a model above it cannot be one file (its weights must stay external data)
PROTO_LIMIT = 2 ** 31 - 1


def external_data_files(path: str | os.PathLike) -> list[Path]:
    """The external data files a model's tensors name (`onnx.save(..., save_as_external_data=True)`), sorted.

    Each must be a regular file inside the model's own folder (the folder travels with the model);
    a location outside it (absolute, `..`, a symbolic link leading out) or a missing file is a
    UserError naming the model and the location.
    """
    return _external_files(load_model(path, check=False, load_external_data=False), Path(path))


def _external_files(model, path: Path) -> list[Path]:
    from onnx.external_data_helper import _get_all_tensors, uses_external_data

    folder = path.resolve().parent
    files = set()
    for t in _get_all_tensors(model):
        if not uses_external_data(t):
            continue
        loc = next((e.value for e in t.external_data if e.key == "location"), "")
        target = (folder / loc).resolve()
        if not loc or os.path.isabs(loc) or not target.is_relative_to(folder):
            raise UserError(f"{path}: tensor {t.name!r} keeps its data in {loc!r}, outside the model's folder; "
                            "keep the external data file beside the model (onnx.save ... location=<file name>)")
        if not target.is_file():
            raise UserError(f"{path}: tensor {t.name!r} keeps its data in {loc!r}, which is not a file in {folder}")
        files.add(target)
    return sorted(files)


def load_with_data(path: str | os.PathLike) -> tuple:
    """(model with its external data embedded, the external data files it came from: [] for a one-file model)."""
    path = Path(path)
    model = load_model(path, check=False, load_external_data=False)
    files = _external_files(model, path)
    if files:
        _embed_external_data(model, path)
    return model, files


def _one_file_bytes(model, path: Path) -> bytes:
    if model.ByteSize() > PROTO_LIMIT:
        raise UserError(f"{path}: {model.ByteSize() / 2 ** 30:.1f} GiB with its external data, over protobuf's "
                        "2 GiB for one model file; quantbench runs models with their data embedded")
    return model.SerializeToString(deterministic=True)


def self_contained_bytes(path: str | os.PathLike) -> bytes:
    """The model's bytes with every external tensor embedded (the file's own bytes when it has none).

    What travels to a host and what a variant or a release artifact is written as: one
    self-contained file. A model that would exceed protobuf's 2 GiB this way is a UserError.
    """
    model, files = load_with_data(path)
    return _one_file_bytes(model, Path(path)) if files else Path(path).read_bytes()


def write_self_contained(src: str | os.PathLike, dst: str | os.PathLike) -> None:
    """Copy a model to `dst` as one file (its bytes as they are; with external data, the data embedded)."""
    import shutil

    model, files = load_with_data(src)
    if files:
        Path(dst).write_bytes(_one_file_bytes(model, Path(src)))
    else:
        shutil.copyfile(src, dst)


def raw_sha256(path: str | os.PathLike, files: list | None = None, model=None) -> str:
    """SHA-256 of the file's bytes; of a model with external data (`files`, or looked up), of its self-contained
    bytes: the .onnx alone does not hold the weights, and that is what a variant or an artifact is written as.
    `model`: the model of `path` with its data embedded (load_with_data), when the caller has it."""
    files = external_data_files(path) if files is None else files
    if files and model is not None:
        return sha256_bytes(_one_file_bytes(model, Path(path)))
    return sha256_bytes(self_contained_bytes(path)) if files else sha256_file(path)


def _embed_external_data(model, path: Path) -> None:
    """Read every external tensor's data into the model, which becomes exactly the model saved in one file
    (no data_location field left behind), so both have one semantic hash."""
    from onnx.external_data_helper import _get_all_tensors, load_external_data_for_tensor, uses_external_data

    for t in _get_all_tensors(model):
        if not uses_external_data(t):
            continue
        try:
            load_external_data_for_tensor(t, str(path.parent))
        except Exception as exc:
            loc = next((e.value for e in t.external_data if e.key == "location"), "")
            raise UserError(f"{path}: cannot read the external data of tensor {t.name!r} from {loc!r} "
                            f"({type(exc).__name__}: {(str(exc).splitlines() or [''])[0]})") from None
        del t.external_data[:]
        t.ClearField("data_location")


def _strip_graph(graph, strip: tuple) -> None:
    if "doc_string" in strip:
        graph.ClearField("doc_string")
        for vi in list(graph.input) + list(graph.output) + list(graph.value_info):
            vi.ClearField("doc_string")
        for init in graph.initializer:
            init.ClearField("doc_string")
    if "value_info" in strip:
        del graph.value_info[:]
    _strip_nodes(graph.node, strip)


def _strip_nodes(nodes, strip: tuple) -> None:
    import onnx

    for node in nodes:
        if "doc_string" in strip:
            node.ClearField("doc_string")
        for attr in node.attribute:
            if "doc_string" in strip:
                attr.ClearField("doc_string")
            if attr.type == onnx.AttributeProto.GRAPH:
                _strip_graph(attr.g, strip)
            elif attr.type == onnx.AttributeProto.GRAPHS:
                for g in attr.graphs:
                    _strip_graph(g, strip)


def parse_strip(spec: str | None) -> tuple:
    """`--strip` text ("producer,value_info") -> the strip tuple (doc_string always included)."""
    names = [s.strip() for s in (spec or "").split(",") if s.strip()]
    unknown = sorted(set(names) - set(STRIP_DEFAULT) - set(STRIP_OPTIONAL))
    if unknown:
        raise UserError(f"{flag_mark('strip')}: unknown option(s) {', '.join(unknown)}; choose from {', '.join(STRIP_OPTIONAL)}")
    return STRIP_DEFAULT + tuple(n for n in STRIP_OPTIONAL if n in names)


def stripped_copy(model, strip: tuple = STRIP_DEFAULT):
    """A copy of `model` without the named non-executing content."""
    import onnx

    unknown = set(strip) - set(STRIP_DEFAULT) - set(STRIP_OPTIONAL)
    if unknown:
        raise UserError(f"unknown strip option(s) {sorted(unknown)}; choose from {list(STRIP_DEFAULT + STRIP_OPTIONAL)}")
    m = onnx.ModelProto()
    m.CopyFrom(model)
    if "doc_string" in strip:
        m.ClearField("doc_string")
        for f in m.functions:
            f.ClearField("doc_string")
    for f in m.functions:
        _strip_nodes(f.node, tuple(strip))
    if "producer" in strip:
        m.ClearField("producer_name")
        m.ClearField("producer_version")
    if "metadata" in strip:
        del m.metadata_props[:]
    _strip_graph(m.graph, tuple(strip))
    return m


def semantic_sha256(model_or_path, strip: tuple = STRIP_DEFAULT) -> str:
    """SHA-256 of the deterministic serialization without non-executing content."""
    model = load_model(model_or_path, check=False) if isinstance(model_or_path, (str, os.PathLike)) else model_or_path
    return sha256_bytes(stripped_copy(model, tuple(strip)).SerializeToString(deterministic=True))


def model_hashes(path: str | os.PathLike, strip: tuple = STRIP_DEFAULT) -> dict:
    """{"raw_sha256": file bytes, "semantic_sha256": ..., "semantic_strip": [...]}: always shown together."""
    return {"raw_sha256": raw_sha256(path), "semantic_sha256": semantic_sha256(path, strip),
            "semantic_strip": list(strip)}


def constant_names(graph) -> set:
    """The names of the graph's constant tensors: its initializers and its Constant nodes' outputs."""
    return {i.name for i in graph.initializer} | {n.output[0] for n in graph.node if n.op_type == "Constant"}


def dims_of(value_info) -> list:
    """A graph input's dims: positive ints, or None for dynamic ones.

    onnxruntime treats every non-positive `dim_value` (paddle2onnx writes -1 for the
    batch) and every `dim_param` as dynamic, so quantbench does too.
    """
    return [d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else None
            for d in value_info.type.tensor_type.shape.dim]


def declared_dims(value_info) -> list:
    """A graph input's or output's dims as the file declares them: ints, names (dim_param), None (neither)."""
    return [d.dim_value if d.HasField("dim_value") else (d.dim_param or None)
            for d in value_info.type.tensor_type.shape.dim]


def overridden_dims(dims: list, shape: list) -> bool:
    """Whether a sidecar `shape` overrides some static dim of `dims` (modelio.dims_of: None for a dynamic one)."""
    return len(dims) == len(shape) and any(d is not None and d != s for d, s in zip(dims, shape))


def with_input_shape(model, name: str, shape: list) -> dict:
    """Rewrite `model` (in place) to take input `name` at `shape` (a sidecar's 'shape' over a static-batch export's
    declared dims): that input's dims set, the shape annotations (value_info) dropped, each output's dims those
    ONNX shape inference gives at the new shape (or none declared). Returns the record a recipe keeps:
    {"input", "declared", "used", "outputs": {output: {"declared", "used"}}}."""
    import onnx

    vi = next(i for i in model.graph.input if i.name == name)
    record = {"input": name, "declared": declared_dims(vi), "used": list(shape), "outputs": {}}
    dims = vi.type.tensor_type.shape.dim
    for d, n in zip(dims, shape):
        d.Clear()
        d.dim_value = int(n)
    del model.graph.value_info[:]
    declared = {o.name: declared_dims(o) for o in model.graph.output}
    for o in model.graph.output:
        o.type.tensor_type.ClearField("shape")
    try:
        inferred = {o.name: o for o in onnx.shape_inference.infer_shapes(model).graph.output}
    except Exception:  # onnx cannot infer this graph: the outputs declare no shape, onnxruntime reports one
        inferred = {}
    for o in model.graph.output:
        got = inferred.get(o.name)
        if got is not None and got.type.tensor_type.HasField("shape"):
            o.type.tensor_type.shape.CopyFrom(got.type.tensor_type.shape)
        record["outputs"][o.name] = {"declared": declared[o.name], "used": declared_dims(o)}
    return record


def write_with_input_shape(src: str | os.PathLike, dst: str | os.PathLike, shape_override: dict) -> None:
    """`src` written to `dst` as one file taking its input at the shape a with_input_shape record says."""
    model, _ = load_with_data(src)
    with_input_shape(model, shape_override["input"], shape_override["used"])
    Path(dst).write_bytes(_one_file_bytes(model, Path(src)))


def graph_inputs(model) -> dict:
    """{input name: dims} of the inputs that are fed (initializers listed as inputs excluded)."""
    inits = {i.name for i in model.graph.initializer}
    return {i.name: dims_of(i) for i in model.graph.input if i.name not in inits}


def fits(input_name: str, shape, inputs: dict) -> bool:
    """Whether a tensor of `shape` can feed a single-input model's `input_name` (dynamic dims fit any size)."""
    dims = inputs.get(input_name)
    if dims is None or len(inputs) != 1:
        return False
    return len(dims) == len(shape) and all(d is None or d == s for d, s in zip(dims, shape))


#: op types that only a quantized graph holds: QDQ pairs, QOperator kernels, integer dynamic quantization
QUANTIZED_OPS = {"QuantizeLinear": "QDQ", "DequantizeLinear": "QDQ", "QLinearConv": "QOperator",
                 "QLinearMatMul": "QOperator", "QLinearAdd": "QOperator", "QLinearMul": "QOperator",
                 "QGemm": "QOperator", "QAttention": "QOperator", "ConvInteger": "integer",
                 "MatMulInteger": "integer", "DynamicQuantizeLinear": "integer",
                 "DynamicQuantizeMatMul": "integer", "DynamicQuantizeLSTM": "integer"}


def quantized_ops(model) -> dict:
    """{op type: count} of the quantized ops in the graph (QUANTIZED_OPS); empty for a float model."""
    found: dict = {}
    for node in model.graph.node:
        if node.op_type in QUANTIZED_OPS:
            found[node.op_type] = found.get(node.op_type, 0) + 1
    return dict(sorted(found.items()))


#: what to tell the user about an output that is not a tensor (ZipMap is the common case)
NON_TENSOR_HINT = ("quantbench hashes tensors only: export the classifier without ZipMap "
                   "(skl2onnx: options={'zipmap': False}) and with integer class labels")


def type_text(tp) -> str:
    """An ONNX TypeProto in onnxruntime's notation: tensor(float), seq(map(int64,tensor(float)))."""
    from onnx import TensorProto

    kind = tp.WhichOneof("value")
    if kind == "tensor_type":
        return f"tensor({TensorProto.DataType.Name(tp.tensor_type.elem_type).lower()})"
    if kind == "sequence_type":
        return f"seq({type_text(tp.sequence_type.elem_type)})"
    if kind == "map_type":
        return f"map({TensorProto.DataType.Name(tp.map_type.key_type).lower()},{type_text(tp.map_type.value_type)})"
    return kind or "unknown"


def non_tensor_outputs(model) -> dict:
    """{output: its type} of the outputs that are not numeric tensors (ZipMap's sequence of maps, strings)."""
    texts = {out.name: type_text(out.type) for out in model.graph.output}
    return {n: t for n, t in texts.items() if not t.startswith("tensor(") or t == "tensor(string)"}


def check_tensor_outputs(model, model_path) -> None:
    """Refuse outputs that are not numeric tensors: their bytes are pointers."""
    refuse_non_tensors(non_tensor_outputs(model), model_path)


def refuse_non_tensors(found: dict, model_path) -> None:
    """Refuse the outputs non_tensor_outputs found (a model's facts hold them): one line naming the first."""
    for name, text in found.items():
        raise UserError(f"{model_path}: output {name!r} is {text}, not a numeric tensor; {NON_TENSOR_HINT}")


# --------------------------------------------------------------------------- what a run plan reads of a model


@dataclass(frozen=True)
class ModelFacts:
    """What planning a run reads of a model file: its identity (semantic and raw hashes), the inputs it is fed,
    its outputs, its quantized ops and its external data files. model_facts keeps them with the file's state."""

    semantic_sha256: str
    raw_sha256: str
    inputs: dict
    outputs: list
    quantized_ops: dict
    external_data: list   # the external data files (paths), [] for a one-file model
    not_tensors: dict = dataclasses.field(default_factory=dict)   # output -> type, of the non-numeric-tensor ones


def facts_of(model, path: str | os.PathLike, files: list) -> ModelFacts:
    """The facts of a model parsed with load_with_data (its data embedded; `files`: where it came from)."""
    return ModelFacts(semantic_sha256(model), raw_sha256(path, files, model), graph_inputs(model),
                      [o.name for o in model.graph.output], quantized_ops(model), [str(f) for f in files],
                      non_tensor_outputs(model))


#: bump when what facts_of computes changes (the cache also keys on this module's source)
FACTS_VERSION = 1
FACTS_FILES = 1024   # model files remembered; the least recently parsed go first


def model_facts(path: str | os.PathLike, parsed: tuple | None = None, fresh: bool = False) -> ModelFacts:
    """The facts of the model at `path`, parsed and hashed only when the file (or one of its external data
    files) changed since they were worked out: they are remembered with each file's state (size, mtime, ctime,
    inode; any write changes the ctime) under QUANTBENCH_HOME/model-facts/. Parsing and hashing every variant
    was most of planning an unchanged run (the onnx import alone ~0.05 s; a 100 MB model's semantic hash
    seconds). `parsed`: (model, files) of load_with_data, when the caller has them; `fresh`: parsed and
    hashed now whatever is remembered (a release re-derives every identity from its bytes).
    QUANTBENCH_MODEL_CACHE=0 turns the memory off."""
    path = Path(path)
    entry_path = _facts_path(path)
    if not fresh and entry_path is not None:
        entry = _read_facts(entry_path, path)
        if entry is not None:
            return entry
    model, files = parsed if parsed is not None else load_with_data(path)
    facts = facts_of(model, path, files)
    if entry_path is not None:
        _write_facts(entry_path, path, facts)
    return facts


def _facts_path(path: Path) -> Path | None:
    if not cache_on("QUANTBENCH_MODEL_CACHE"):
        return None
    digest = hashlib.sha256(os.path.abspath(path).encode()).hexdigest()[:32]
    return quantbench_home() / "model-facts" / f"{digest}.json"


@functools.lru_cache(maxsize=1)
def _facts_code() -> str:
    return f"{FACTS_VERSION}:{sha256_file(__file__)}"


def _read_facts(entry_path: Path, path: Path) -> ModelFacts | None:
    """The remembered facts, if they are of this code and every file is in the state they were worked out at."""
    try:
        entry = json.loads(entry_path.read_text())
        if entry["code"] != _facts_code() or entry["path"] != os.path.abspath(path):
            return None
        states = entry["states"]
        files = [os.path.abspath(path), *entry["facts"]["external_data"]]
        if len(states) != len(files) or any(file_state(f) != s for f, s in zip(files, states)):
            return None
        return ModelFacts(**entry["facts"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _write_facts(entry_path: Path, path: Path, facts: ModelFacts) -> None:
    """Remember `facts` with the state of each file they were worked out from (a cache: unwritten is only slower)."""
    files = [os.path.abspath(path), *facts.external_data]
    entry = {"code": _facts_code(), "path": files[0], "states": [file_state(f) for f in files],
             "facts": dataclasses.asdict(facts)}
    write_cache_entry(entry_path, entry, FACTS_FILES)
