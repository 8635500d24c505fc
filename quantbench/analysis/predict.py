"""Predicted classes for x86 tiers that no machine in reach can show, from onnxruntime's kernel dispatch.

A CPUID mask only takes features away, so a machine without AVX-512 cannot show the VNNI or AMX tiers. For such a
tier this module predicts a class instead: each op of the variant's optimized graph reaches MLAS routines, each
routine's kernel follows from the tier's features (a dispatch table per onnxruntime version, quantbench/data/
dispatch/, its source named in it), and each kernel has a `bytes` value: kernels with the same value give the same
bytes. A tier's *signature* is that value per routine the graph uses; two hosts with the same signature are
predicted byte-identical, and a tier whose signature matches no shown host is predicted to stand apart, naming the
routines (and the ops using them) that decide it.

What the measurements of the shown hosts teach is used too: two shown hosts whose signatures differ in one routine,
yet whose bytes are identical, show that on this graph that routine's kernels agree (a learned merge).

On arm64 (its own table) the signature also reads what a host's fingerprint recorded beside its HWCAP features: the
SVE and SME vector lengths (the SVE sum of exps and KleidiAI's SME tiles follow them) and the intra-op thread count
(it changes fp32 bytes there): `host_features`.

A prediction is never a measurement: callers keep predicted rows apart from classes, and no gate counts them.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

from quantbench.analysis.classes import with_kernels
from quantbench.analysis.tiers import canonical_flags
from quantbench.fsutil import canonical_json

TABLES = Path(__file__).resolve().parents[1] / "data" / "dispatch"


@dataclass(frozen=True)
class DispatchTable:
    """One onnxruntime version's dispatch on one architecture: routine -> [(required features, kernel, bytes)], first
    match wins. A required feature is an ISA flag, `!flag` (absent), or `key=value` (a host value such as
    `sve_vector_bits=256`, or a session config entry); a bytes value may name a host value (`{sve_vector_bits}`)."""

    version: str
    source: str
    routines: dict
    ops: dict
    weight_input: dict
    session: dict
    arch: str = "x86_64"
    weight_routines: dict = field(default_factory=dict)
    every_graph: tuple = ()
    short_reduction: dict = field(default_factory=dict)

    def kernel(self, routine: str, features, config: dict | None = None) -> tuple[str, str]:
        """(kernel, bytes) the routine dispatches on a CPU with `features` under session config `config`."""
        have, values = _have(features, config)
        for need, kernel, value in self.routines[routine]:
            if all(n[1:] not in have if n.startswith("!") else n in have for n in need):
                for entry, remap in self.session.items():
                    key, _, want = entry.partition("=")
                    if str((config or {}).get(key, "")) == want:
                        value = remap.get(routine, {}).get(value, value)
                return _fill(kernel, values), _fill(value, values)
        raise ValueError(f"dispatch table {self.version}: routine {routine} has no baseline kernel")


#: what a bytes value holds where the host did not record a value it names (never joins a class)
UNKNOWN = "?"


def _have(features, config: dict | None) -> tuple[set, dict]:
    """The features as a set (flags canonical, `key=value` kept) plus the config entries as `key=value`, and the
    host values by key."""
    flags = [f for f in features or () if "=" not in str(f)]
    pairs = [str(f) for f in features or () if "=" in str(f)]
    pairs += [f"{k}={v}" for k, v in (config or {}).items()]
    return set(canonical_flags(flags)) | set(pairs), dict(p.split("=", 1) for p in pairs)


def _fill(text: str, values: dict) -> str:
    return re.sub(r"\{(\w+)\}", lambda m: values.get(m.group(1), UNKNOWN), text)


ARCH_TAGS = {"x86_64": "x86", "amd64": "x86", "aarch64": "arm64", "arm64": "arm64"}


def arch_tag(arch: str) -> str | None:
    """The dispatch tables' name for an architecture (x86, arm64); None for one quantbench has no tables for."""
    return ARCH_TAGS.get(str(arch or "").lower())


def _version_key(version: str) -> str:
    return ".".join(str(version).split(".")[:2])


@lru_cache(maxsize=8)
def table_for(ort_version: str, arch: str = "x86_64") -> DispatchTable | None:
    """The dispatch table of an onnxruntime version (by major.minor) on `arch`; None when quantbench has none."""
    path = TABLES / f"{arch_tag(arch)}-onnxruntime-{_version_key(ort_version)}.json"
    if arch_tag(arch) is None or not path.is_file():
        return None
    raw = json.loads(path.read_text())
    routines = {name: [(tuple(need), kernel, value) for need, kernel, value in r["kernels"]]
                for name, r in raw["routines"].items()}
    return DispatchTable(raw["onnxruntime"], raw["source"], routines, raw["ops"], raw["int8_weight_input"],
                         raw.get("session", {}), raw.get("arch", arch), raw.get("int8_weight_routines", {}),
                         tuple(raw.get("every_graph", ())), raw.get("short_reduction", {}))


def no_table_note(ort_version: str, arch: str = "x86_64") -> str:
    tag = arch_tag(arch) or str(arch)
    known = sorted(p.stem.rsplit("-", 1)[1] for p in TABLES.glob(f"{tag}-onnxruntime-*.json"))
    return (f"no prediction: quantbench has no {tag} dispatch table for onnxruntime {ort_version} "
            f"(tables: {', '.join(known) or 'none'})")


#: host values an aarch64 signature reads beside the ISA flags (the vector lengths the host recorded, read inside
#: it: never assumed from a preset; the thread count, which changes fp32 bytes there)
ARM_VALUES = ("sve_vector_bits", "sme_vector_bits")


def host_features(info: dict) -> list[str]:
    """What a signature reads of a host (equiv's host summary, or a fingerprint identity): its ISA flags and, on
    aarch64, `sve_vector_bits=N`, `sme_vector_bits=N` where the host recorded them (0: none) and
    `intra_op_num_threads=N`. A vector length the host did not record stays out, so a kernel naming it reads "?"
    and joins no class."""
    feats = canonical_flags(info.get("isa_flags"))
    if arch_tag(info.get("arch", "")) != "arm64":
        return feats
    cpu = info.get("cpu") if isinstance(info.get("cpu"), dict) else {}
    for key in ARM_VALUES:
        value = info.get(key, cpu.get(key))
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            feats.append(f"{key}={value}")
    threads = (info.get("session") or {}).get("intra_op_num_threads")
    if threads:
        feats.append(f"intra_op_num_threads={int(threads)}")
    return feats


def graph_routines(model_path, table: DispatchTable, level: str = "all") -> dict[str, list[str]]:
    """{routine: [op types]} of the model as onnxruntime optimizes it here (NCHWc and QDQ fusions included).

    The optimized graph's op types do not depend on the tier (NCHWc applies on every x86, in blocks of 8 or 16),
    only its kernels do; the arm64 table reads the same graph (its ops reach its own routines). An int8 op's weight
    can move it to another routine (`table.weight_routines`): on x86 uint8 weights reach the exact U8U8 kernels on
    every tier (left out); on arm64 a weight holding -128 reaches the routine where the NEON kernel's pairs wrap,
    and a Softmax whose reduction is known to span few values one whose order no vector length changes
    (`table.short_reduction`)."""
    import tempfile

    import onnx
    import onnxruntime as ort

    levels = {"disabled": ort.GraphOptimizationLevel.ORT_DISABLE_ALL, "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
              "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED, "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL}
    with tempfile.TemporaryDirectory(prefix="quantbench-predict-") as tmp:
        so = ort.SessionOptions()
        so.intra_op_num_threads, so.log_severity_level = 1, 3
        so.graph_optimization_level = levels.get(level, levels["all"])
        so.optimized_model_filepath = str(Path(tmp) / "optimized.onnx")
        ort.InferenceSession(str(model_path), so, providers=["CPUExecutionProvider"])
        # a model whose weights are external: the optimized copy still points at the original's data file
        model = onnx.load(so.optimized_model_filepath, load_external_data=False)
        onnx.external_data_helper.load_external_data_for_model(model, str(Path(model_path).resolve().parent))
    graph = model.graph
    inits = {t.name: t for t in graph.initializer}
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 13)
    out: dict[str, set] = {}
    for node in graph.node:
        op = f"{node.domain}:{node.op_type}" if node.domain == "com.microsoft.nchwc" else node.op_type
        remap = dict(table.weight_routines.get(_weight_kind(node, table, inits), {}), **_reduction_remap(node, table, graph, opset))
        for r in table.ops.get(op, []):
            r = remap.get(r, r)
            if r is not None:
                out.setdefault(r, set()).add(node.op_type)
    if out:
        for r in table.every_graph:
            out.setdefault(r, set()).update(["(every op)"])
    return {r: sorted(ops) for r, ops in sorted(out.items())}


def _reduction_remap(node, table: DispatchTable, graph, opset: int) -> dict:
    """{routine: its short form} for a Softmax/LogSoftmax whose reduction length the optimized graph knows and is at
    most `short_reduction.max_len` (opset 13: the axis; before: every dimension from the axis on); {} otherwise."""
    short = table.short_reduction
    if not short or node.op_type not in short["ops"] or node.domain not in ("", "ai.onnx"):
        return {}
    shapes = {v.name: v.type.tensor_type.shape for v in [*graph.value_info, *graph.output, *graph.input]}
    shape = shapes.get(node.output[0]) or shapes.get(node.input[0])
    if shape is None or not shape.dim:
        return {}
    dims = [d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else None for d in shape.dim]
    axis = next((a.i for a in node.attribute if a.name == "axis"), -1 if opset >= 13 else 1) % len(dims)
    span = dims[axis:axis + 1] if opset >= 13 else dims[axis:]
    if None in span or math.prod(span) > short["max_len"]:
        return {}
    return {short["routine"]: short["short"]}


def _weight_kind(node, table: DispatchTable, inits: dict) -> str:
    """"uint8", "int8_with_-128" or "" for an int8 op's constant weight (the input `table.weight_input` names)."""
    import onnx
    from onnx import numpy_helper

    w = table.weight_input.get(node.op_type)
    init = inits.get(node.input[w]) if w is not None and len(node.input) > w else None
    if init is None:
        return ""
    if init.data_type == onnx.TensorProto.UINT8:
        return "uint8"
    if init.data_type == onnx.TensorProto.INT8 and (numpy_helper.to_array(init) == -128).any():
        return "int8_with_-128"
    return ""


def signature(table: DispatchTable, routines: dict, features, config: dict | None = None) -> dict[str, str]:
    """{routine: bytes} of a CPU with `features` over the graph's routines."""
    return {r: table.kernel(r, features, config)[1] for r in routines}


@dataclass
class Prediction:
    """A tier's predicted class: `joins` the measured class of `like` (hosts with its signature), or stands apart
    (`joins` None), decided by `deciding` (routine: ops, its kernel here against the nearest shown host's)."""

    host: str
    joins: str | None
    like: list[str] = field(default_factory=list)
    deciding: list[str] = field(default_factory=list)
    learned: list[str] = field(default_factory=list)
    peers: list[str] = field(default_factory=list)  # other predicted tiers with its signature (one predicted class)

    def describe(self) -> str:
        where = (f"predicted with class {self.joins} ({', '.join(self.like)})" if self.joins
                 else "predicted to stand apart" + (f" (with {', '.join(self.peers)})" if self.peers else ""))
        why = f"; decided by {'; '.join(self.deciding)}" if self.deciding else ""
        return f"{self.host}: {where}{why}"


def learned_merges(routines: dict, shown: dict[str, tuple[dict, str]]) -> dict[str, list[set]]:
    """{routine: [sets of bytes values that agreed]}: two shown hosts (host -> (signature, measured class)) in one
    measured class whose signatures differ in one routine only show that its kernels gave the same bytes on this
    graph. A pair differing in several teaches nothing: one difference may hide another (measured: x86-avx2 and
    x86-avx512 agree on a dynamic int8 detector while differing in exp and quantize_linear, and x86-avxvnni,
    differing from the native VNNI host in those same two, does not), and the kernels of a routine the table
    does not model may differ beside them. A value the host did not record ("?") teaches nothing either."""
    merges: dict[str, list[set]] = {}
    hosts = sorted(shown)
    for i, a in enumerate(hosts):
        for b in hosts[i + 1:]:
            (sa, ca), (sb, cb) = shown[a], shown[b]
            differ = [r for r in routines if sa[r] != sb[r]]
            if ca != cb or len(differ) != 1 or UNKNOWN in sa[differ[0]] + sb[differ[0]]:
                continue
            for r in differ:
                groups = merges.setdefault(r, [])
                hit = [g for g in groups if sa[r] in g or sb[r] in g]
                merges[r] = [g for g in groups if g not in hit] + [set().union({sa[r], sb[r]}, *hit)]
    return merges


def _canon(sig: dict, merges: dict) -> dict:
    return {r: min(next((g for g in merges.get(r, []) if v in g), {v})) for r, v in sig.items()}


def predict(table: DispatchTable, routines: dict, shown: dict[str, tuple[list, str]], targets: dict[str, list],
            config: dict | None = None) -> list[Prediction]:
    """Predictions for `targets` (tier -> features) from `shown` hosts (host -> (features, measured class))."""
    sigs = {h: (signature(table, routines, f, config), c) for h, (f, c) in shown.items()}
    merges = learned_merges(routines, sigs)
    learned = [f"{r}: {' = '.join(sorted(g))} agreed on this graph" for r, gs in sorted(merges.items()) for g in gs]
    canon = {h: _canon(s, merges) for h, (s, _) in sigs.items()}
    out = []
    wanted = {t: _canon(signature(table, routines, f, config), merges) for t, f in targets.items()}
    for tier, feats in targets.items():
        mine = wanted[tier]
        peers = sorted(t for t, s in wanted.items() if t != tier and s == mine)
        like = sorted(h for h, s in canon.items() if s == mine)
        classes = sorted({sigs[h][1] for h in like})
        unknown = [f"{r} ({', '.join(routines[r])}): {table.kernel(r, feats, config)[0]}: the host recorded no "
                   "value it names" for r in routines if UNKNOWN in mine[r]]
        if unknown:
            out.append(Prediction(tier, None, [], unknown, learned, peers))
            continue
        if len(classes) == 1:
            out.append(Prediction(tier, classes[0], like, [], learned, peers))
            continue
        nearest = min(sorted(canon), key=lambda h: sum(canon[h][r] != mine[r] for r in routines), default=None)
        deciding = [] if nearest is None else [
            f"{r} ({', '.join(routines[r])}): {table.kernel(r, feats, config)[0]} here, "
            f"{table.kernel(r, shown[nearest][0], config)[0]} on {nearest}"
            for r in routines if canon[nearest][r] != mine[r]]
        if len(classes) > 1:  # same signature, different bytes: the table cannot tell them apart
            deciding = [f"hosts with its signature differ ({', '.join(like)}): a kernel the table does not model"]
        out.append(Prediction(tier, None, [], deciding, learned, peers))
    return out


def _shown(hosts: dict, table: DispatchTable) -> dict[str, dict]:
    """Measured hosts a prediction may stand on: the table's architecture and onnxruntime version, the CPU
    provider only."""
    return {h: i for h, i in hosts.items()
            if arch_tag(i.get("arch", "")) == arch_tag(table.arch) and i.get("isa_flags")
            and _version_key(i.get("ort_version", "")) == table.version
            and list((i.get("session") or {}).get("providers") or ["CPUExecutionProvider"]) == ["CPUExecutionProvider"]}


def _by_arch(targets: dict) -> dict[str, dict[str, list]]:
    """{arch: {target: features}}: a target given as features is an x86 tier (no machine here shows it); one given
    as a host summary (arch, isa_flags, vector lengths, session) is read by host_features on its own arch."""
    out: dict = {}
    for t, f in targets.items():
        arch = str(f.get("arch", "")) if isinstance(f, dict) else "x86_64"
        arch = {"x86": "x86_64", "arm64": "aarch64"}.get(arch_tag(arch), arch)
        out.setdefault(arch, {})[t] = host_features(f) if isinstance(f, dict) else list(f)
    return out


def predict_fleet(hosts: dict, variants: list, targets: dict, ort_version: str) -> tuple[list[dict], list[str]]:
    """(rows, notes): a predicted row per variant and target host (`targets`: tier -> features, an x86 tier no
    machine in reach shows; or host -> its summary with arch, isa_flags, vector lengths and session, an x86 or
    arm64 host), from the measured classes of the hosts of its architecture (`hosts`: host -> selection with arch,
    isa_flags, ort_version, session; `variants`: equiv's per-variant dicts with model, variant, path and classes).
    The arm64 prediction reads the vector lengths and thread count (host_features): measured on the ARM presets,
    results/bench/predict-arm.json."""
    rows, notes = [], []
    for arch, tg in sorted(_by_arch(targets).items()):
        r, n = _predict_arch(hosts, variants, tg, ort_version, arch)
        rows, notes = rows + r, notes + n
    return rows, notes


def _predict_arch(hosts: dict, variants: list, targets: dict, ort_version: str, arch: str):
    table = table_for(ort_version, arch)
    if table is None:
        return [], [no_table_note(ort_version, arch)]
    shown_info = _shown(hosts, table)
    configs = {canonical_json((i.get("session") or {}).get("config_entries") or {}) for i in shown_info.values()}
    config = json.loads(next(iter(configs))) if len(configs) == 1 else {}
    rows = []
    for v in variants:
        label = {h: c["label"] for c in v["classes"] for h in c["hosts"]}
        shown = {h: (host_features(i), label[h]) for h, i in shown_info.items() if h in label}
        routines = graph_routines(v["path"], table, _level(shown_info))
        for p in predict(table, routines, shown, targets, config):
            rows.append({"model": v["model"], "variant": v["variant"], "host": p.host, "joins": p.joins,
                         "like": p.like, "peers": p.peers, "deciding": p.deciding, "learned": p.learned,
                         "text": p.describe()})
    note = (f"predicted from onnxruntime {table.version}'s {arch_tag(arch)} kernel dispatch "
            f"({table.source.split(';')[0]}), over {', '.join(sorted(shown_info)) or f'no measured {arch_tag(arch)} host'}"
            ": not measured, counted by no gate")
    return rows, [note]


def _level(shown_info: dict) -> str:
    levels = {(i.get("session") or {}).get("graph_optimization_level", "all") for i in shown_info.values()}
    return levels.pop() if len(levels) == 1 else "all"


def attach_predictions(result, refs: list, targets: dict[str, list], ort_version: str) -> None:
    """Set `result.predicted` and `result.predicted_notes` (an analysis.equiv.EquivResult) for `targets`."""
    paths = {r.variant_id: r.path for r in refs}
    variants = [dict(v, path=paths[v["variant_id"]]) for v in result.variants if paths.get(v["variant_id"])]
    result.predicted, result.predicted_notes = predict_fleet(result.hosts, variants, targets, ort_version)


def dispatched_kernels(hosts: dict, model_path, ort_version: str) -> dict[str, dict[str, str]]:
    """host -> {routine: kernel} onnxruntime's x86 dispatch chose on each measured x86 host (`hosts`: host ->
    selection, as predict_fleet's) for the routines the model's optimized graph uses; {} without a table."""
    table = table_for(ort_version)
    shown = _shown(hosts, table) if table is not None else {}
    if not shown:
        return {}
    routines = graph_routines(model_path, table, _level(shown))
    return {h: {r: table.kernel(r, i["isa_flags"], (i.get("session") or {}).get("config_entries"))[0]
                for r in routines} for h, i in shown.items()}


def attach_pair_kernels(result, refs: list, ort_version: str) -> None:
    """Each per-pair separation row of `result` (an analysis.equiv.EquivResult) with the kernels the pair's x86
    hosts dispatch differently (classes.with_kernels): the kernel family each class ran, by onnxruntime's dispatch."""
    paths = {r.variant_id: r.path for r in refs}
    for v in result.variants:
        if v.get("pairs") and paths.get(v["variant_id"]):
            v["pairs"] = with_kernels(v["pairs"], dispatched_kernels(result.hosts, paths[v["variant_id"]], ort_version))
