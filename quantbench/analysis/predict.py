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

A prediction is never a measurement: callers keep predicted rows apart from classes, and no gate counts them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

from quantbench.analysis import classes as C
from quantbench.analysis.tiers import canonical_flags
from quantbench.fsutil import canonical_json

TABLES = Path(__file__).resolve().parents[1] / "data" / "dispatch"


@dataclass(frozen=True)
class DispatchTable:
    """One onnxruntime version's x86 dispatch: routine -> [(required features, kernel, bytes)], first match wins."""

    version: str
    source: str
    routines: dict
    ops: dict
    weight_input: dict
    session: dict

    def kernel(self, routine: str, features, config: dict | None = None) -> tuple[str, str]:
        """(kernel, bytes) the routine dispatches on a CPU with `features` under session config `config`."""
        have = set(canonical_flags(features))
        for need, kernel, value in self.routines[routine]:
            if set(need) <= have:
                for entry, remap in self.session.items():
                    key, _, want = entry.partition("=")
                    if str((config or {}).get(key, "")) == want:
                        value = remap.get(routine, {}).get(value, value)
                return kernel, value
        raise ValueError(f"dispatch table {self.version}: routine {routine} has no baseline kernel")


def _version_key(version: str) -> str:
    return ".".join(str(version).split(".")[:2])


@lru_cache(maxsize=8)
def table_for(ort_version: str) -> DispatchTable | None:
    """The x86 dispatch table of an onnxruntime version (by major.minor); None when quantbench has none."""
    path = TABLES / f"x86-onnxruntime-{_version_key(ort_version)}.json"
    if not path.is_file():
        return None
    raw = json.loads(path.read_text())
    routines = {name: [(tuple(need), kernel, value) for need, kernel, value in r["kernels"]]
                for name, r in raw["routines"].items()}
    return DispatchTable(raw["onnxruntime"], raw["source"], routines, raw["ops"], raw["int8_weight_input"],
                         raw.get("session", {}))


def no_table_note(ort_version: str) -> str:
    known = sorted(p.stem.rsplit("-", 1)[1] for p in TABLES.glob("x86-onnxruntime-*.json"))
    return (f"no prediction: quantbench has no x86 dispatch table for onnxruntime {ort_version} "
            f"(tables: {', '.join(known) or 'none'})")


def graph_routines(model_path, table: DispatchTable, level: str = "all") -> dict[str, list[str]]:
    """{routine: [op types]} of the model as onnxruntime optimizes it here (NCHWc and QDQ fusions included).

    The optimized graph's op types do not depend on the tier (NCHWc applies on every x86, in blocks of 8 or 16),
    only its kernels do. int8 ops with uint8 weights reach the exact U8U8 kernels on every tier: left out."""
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
        graph = onnx.load(so.optimized_model_filepath).graph
    inits = {t.name: t.data_type for t in graph.initializer}
    out: dict[str, set] = {}
    for node in graph.node:
        op = f"{node.domain}:{node.op_type}" if node.domain == "com.microsoft.nchwc" else node.op_type
        routines = table.ops.get(op, [])
        w = table.weight_input.get(node.op_type)
        if w is not None and len(node.input) > w and inits.get(node.input[w]) == onnx.TensorProto.UINT8:
            routines = [r for r in routines if r != "u8s8_gemm"]
        for r in routines:
            out.setdefault(r, set()).add(node.op_type)
    return {r: sorted(ops) for r, ops in sorted(out.items())}


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
    does not model may differ beside them."""
    merges: dict[str, list[set]] = {}
    hosts = sorted(shown)
    for i, a in enumerate(hosts):
        for b in hosts[i + 1:]:
            (sa, ca), (sb, cb) = shown[a], shown[b]
            differ = [r for r in routines if sa[r] != sb[r]]
            if ca != cb or len(differ) != 1:
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


def _shown_x86(hosts: dict, table: DispatchTable) -> dict[str, dict]:
    """Measured hosts a prediction may stand on: x86-64, the table's onnxruntime version, the CPU provider only."""
    return {h: i for h, i in hosts.items()
            if str(i.get("arch", "")).lower() in ("x86_64", "amd64") and i.get("isa_flags")
            and _version_key(i.get("ort_version", "")) == table.version
            and list((i.get("session") or {}).get("providers") or ["CPUExecutionProvider"]) == ["CPUExecutionProvider"]}


def predict_fleet(hosts: dict, variants: list, targets: dict[str, list], ort_version: str) -> tuple[list[dict], list[str]]:
    """(rows, notes): a predicted row per variant and tier no machine in reach shows (`targets`: tier ->
    features), from the measured classes of the x86 hosts (`hosts`: host -> selection with arch, isa_flags,
    ort_version, session; `variants`: equiv's per-variant dicts with model, variant, path and classes)."""
    if not targets:
        return [], []
    table = table_for(ort_version)
    if table is None:
        return [], [no_table_note(ort_version)]
    shown_info = _shown_x86(hosts, table)
    configs = {canonical_json((i.get("session") or {}).get("config_entries") or {}) for i in shown_info.values()}
    config = json.loads(next(iter(configs))) if len(configs) == 1 else {}
    rows = []
    for v in variants:
        label = {h: c["label"] for c in v["classes"] for h in c["hosts"]}
        shown = {h: (i["isa_flags"], label[h]) for h, i in shown_info.items() if h in label}
        routines = graph_routines(v["path"], table, _level(shown_info))
        for p in predict(table, routines, shown, targets, config):
            rows.append({"model": v["model"], "variant": v["variant"], "host": p.host, "joins": p.joins,
                         "like": p.like, "peers": p.peers, "deciding": p.deciding, "learned": p.learned,
                         "text": p.describe()})
    note = (f"predicted from onnxruntime {table.version}'s kernel dispatch ({table.source.split(';')[0]}), over "
            f"{', '.join(sorted(shown_info)) or 'no measured x86 host'}: not measured, counted by no gate")
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
    shown = _shown_x86(hosts, table) if table is not None else {}
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
            v["pairs"] = C.with_kernels(v["pairs"], dispatched_kernels(result.hosts, paths[v["variant_id"]], ort_version))
