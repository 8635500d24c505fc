"""What differs between two ONNX files, ranked by what it can change at run time.

Two exports of one checkpoint can differ by hundreds of KB of doc_string paths
and shape annotations that execute nothing, and by a few hundred bytes of Cast
nodes that make the model unloadable. So findings are ranked by *semantic risk*
(interface, opset, op types, initializers, node wiring first; producer, metadata,
value_info, doc_strings after), never by byte size. Byte counts are reported as
"bytes attributable": the serialized size with the content minus without it.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

from quantbench.fsutil import sha256_file
from quantbench.inputs.modelio import load_model, semantic_sha256, stripped_copy
from quantbench.textfmt import text_table

SEMANTIC = "semantic"
METADATA = "metadata"

# Ranking order: every semantic category above every metadata category.
CATEGORIES = [
    ("inputs/outputs", SEMANTIC),
    ("opset", SEMANTIC),
    ("op types", SEMANTIC),
    ("initializers", SEMANTIC),
    ("nodes", SEMANTIC),
    ("producer", METADATA),
    ("metadata_props", METADATA),
    ("value_info", METADATA),
    ("doc_strings", METADATA),
]
_ORDER = {name: i for i, (name, _) in enumerate(CATEGORIES)}
_RISK = dict(CATEGORIES)

# An absolute path: POSIX /a/b..., Windows C:\a\... or C:/a/...
_ABS_PATH = re.compile(r"(?<![\w.~])(/(?:[^\s/:'\"()]+/)+[^\s/:'\"()]*|[A-Za-z]:[\\/][^\s'\"()]+)")


@dataclass
class Finding:
    """One compared aspect. `a`/`b` are short summaries, `detail` readable lines,
    `bytes_a`/`bytes_b` the serialized bytes attributable to it (metadata only)."""

    category: str
    risk: str
    differs: bool
    a: str
    b: str
    detail: list[str] = field(default_factory=list)
    bytes_a: int | None = None
    bytes_b: int | None = None
    data: dict = field(default_factory=dict)


@dataclass
class ModelDiff:
    a: dict
    b: dict
    semantic_equal: bool
    findings: list[Finding]

    def ranked(self) -> list[Finding]:
        """Differences first, then by risk category (semantic before metadata); never by size."""
        return sorted(self.findings, key=lambda f: (not f.differs, _ORDER[f.category]))

    def to_json(self) -> dict:
        return {"a": self.a, "b": self.b, "semantic_equal": self.semantic_equal,
                "semantic_differences": sum(f.differs and f.risk == SEMANTIC for f in self.findings),
                "findings": [dict(asdict(f), rank=i + 1) for i, f in enumerate(self.ranked())]}


# --- walking a model ---------------------------------------------------------

def _graphs(graph):
    """The graph and every subgraph (If/Loop/Scan bodies), depth first."""
    import onnx

    yield graph
    for node in graph.node:
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                yield from _graphs(attr.g)
            elif attr.type == onnx.AttributeProto.GRAPHS:
                for g in attr.graphs:
                    yield from _graphs(g)


def _all_nodes(model):
    for g in _graphs(model.graph):
        yield from g.node
    for f in model.functions:
        yield from f.node


def _doc_strings(model):
    if model.doc_string:
        yield model.doc_string
    for f in model.functions:
        if f.doc_string:
            yield f.doc_string
    for g in _graphs(model.graph):
        if g.doc_string:
            yield g.doc_string
        for vi in list(g.input) + list(g.output) + list(g.value_info):
            if vi.doc_string:
                yield vi.doc_string
        for t in g.initializer:
            if t.doc_string:
                yield t.doc_string
    for node in _all_nodes(model):
        if node.doc_string:
            yield node.doc_string
        for attr in node.attribute:
            if attr.doc_string:
                yield attr.doc_string


def _size(model) -> int:
    return model.ByteSize()


def _attributable(base, extra: str) -> int:
    """Serialized bytes of `extra` in `base` (a copy already without doc_strings)."""
    return _size(base) - _size(stripped_copy(base, (extra,)))


def _type_str(vi) -> str:
    import onnx

    t = vi.type
    if t.HasField("tensor_type"):
        tt = t.tensor_type
        dt = onnx.TensorProto.DataType.Name(tt.elem_type).lower() if tt.elem_type else "?"
        if not tt.HasField("shape"):
            return f"{dt}[?]"
        dims = [str(d.dim_value) if d.HasField("dim_value") else (d.dim_param or "?") for d in tt.shape.dim]
        return f"{dt}[{','.join(dims)}]"
    return t.WhichOneof("value") or "?"


def _interface(model) -> dict:
    inits = {t.name for t in model.graph.initializer}
    return {"inputs": [f"{vi.name}: {_type_str(vi)}" for vi in model.graph.input if vi.name not in inits],
            "outputs": [f"{vi.name}: {_type_str(vi)}" for vi in model.graph.output]}


def _opset(model) -> dict:
    d = {(o.domain or "ai.onnx"): int(o.version) for o in model.opset_import}
    d["ir_version"] = int(model.ir_version)
    return dict(sorted(d.items()))


def _op_counts(model) -> Counter:
    return Counter((f"{n.domain}::{n.op_type}" if n.domain not in ("", "ai.onnx") else n.op_type)
                   for n in _all_nodes(model))


def _initializer_hashes(model) -> dict[str, str]:
    from onnx import numpy_helper

    out = {}
    for g in _graphs(model.graph):
        for t in g.initializer:
            arr = numpy_helper.to_array(t)
            h = hashlib.sha256(f"{t.data_type}|{','.join(map(str, t.dims))}|".encode())
            h.update(arr.tobytes() if arr.dtype != object else "\x00".join(map(str, arr.ravel())).encode())
            out[t.name] = h.hexdigest()
    return out


def _node_signatures(model) -> Counter:
    """Each node serialized without its name and doc_string: wiring, op, attributes."""
    import onnx

    sigs = Counter()
    for node in _all_nodes(model):
        n = onnx.NodeProto()
        n.CopyFrom(node)
        n.name = ""
        n.doc_string = ""
        sigs[hashlib.sha256(n.SerializeToString(deterministic=True)).hexdigest()] += 1
    return sigs


def _path_stats(docs: list[str]) -> dict:
    with_paths = 0
    occurrences = 0
    roots = Counter()
    for d in docs:
        found = _ABS_PATH.findall(d)
        if found:
            with_paths += 1
            occurrences += len(found)
            for p in found:
                parts = re.split(r"[\\/]", p)
                roots[("\\" if "\\" in p else "/").join(parts[:3])] += 1
    return {"count": len(docs), "with_absolute_paths": with_paths, "path_occurrences": occurrences,
            "top_roots": [r for r, _ in roots.most_common(3)], "root_counts": dict(roots.most_common(3))}


def _kb(n: int | None) -> str:
    if n is None:
        return "-"
    if n < 10_000:
        return f"{n} B"
    if n < 10_000_000:
        return f"{n / 1000:.1f} KB"
    return f"{n / 1e6:.2f} MB"


def _signed(n: int) -> str:
    return ("+" if n > 0 else "") + (_kb(n) if n >= 0 else "-" + _kb(-n))


# --- comparing ---------------------------------------------------------------

def diff_models(path_a: str | os.PathLike, path_b: str | os.PathLike, strip: tuple = ("doc_string",)) -> ModelDiff:
    """Compare two ONNX files; both hashes of each file are part of the result."""
    ma, mb = load_model(path_a, check=False), load_model(path_b, check=False)
    sa_, sb_ = stripped_copy(ma, ("doc_string",)), stripped_copy(mb, ("doc_string",))
    ha = {"raw_sha256": sha256_file(path_a), "semantic_sha256": semantic_sha256(ma, strip), "semantic_strip": list(strip)}
    hb = {"raw_sha256": sha256_file(path_b), "semantic_sha256": semantic_sha256(mb, strip), "semantic_strip": list(strip)}
    info_a = {"path": str(path_a), "bytes": Path(path_a).stat().st_size, **ha}
    info_b = {"path": str(path_b), "bytes": Path(path_b).stat().st_size, **hb}
    findings = [f(ma, mb) for f in (_interface_finding, _opset_finding, _op_types_finding, _initializers_finding,
                                    _nodes_finding)]
    findings += [f(ma, mb, sa_, sb_) for f in (_producer_finding, _metadata_props_finding, _value_info_finding,
                                                _doc_strings_finding)]
    return ModelDiff(info_a, info_b, ha["semantic_sha256"] == hb["semantic_sha256"], findings)


def _interface_finding(ma, mb) -> Finding:
    ia, ib = _interface(ma), _interface(mb)
    detail = []
    for kind in ("inputs", "outputs"):
        for x in ia[kind]:
            if x not in ib[kind]:
                detail.append(f"{kind[:-1]} only in A: {x}")
        for x in ib[kind]:
            if x not in ia[kind]:
                detail.append(f"{kind[:-1]} only in B: {x}")
        if not detail and ia[kind] != ib[kind]:
            detail.append(f"{kind} in a different order")
    return Finding("inputs/outputs", SEMANTIC, ia != ib,
                   f"{len(ia['inputs'])} in, {len(ia['outputs'])} out",
                   f"{len(ib['inputs'])} in, {len(ib['outputs'])} out", detail,
                   data={"a": ia, "b": ib})


def _opset_finding(ma, mb) -> Finding:
    oa, ob = _opset(ma), _opset(mb)

    def fmt(d):
        others = [k for k in d if k not in ("ai.onnx", "ir_version")]
        return (f"ai.onnx {d.get('ai.onnx', '-')}, ir {d['ir_version']}"
                + (f", +{len(others)} domain{'s' if len(others) > 1 else ''}" if others else ""))

    detail = [f"{k}: {oa.get(k, '-')} vs {ob.get(k, '-')}" for k in sorted(set(oa) | set(ob)) if oa.get(k) != ob.get(k)]
    return Finding("opset", SEMANTIC, oa != ob, fmt(oa), fmt(ob), detail, data={"a": oa, "b": ob})


def _op_types_finding(ma, mb) -> Finding:
    ca, cb = _op_counts(ma), _op_counts(mb)
    changed = sorted((k for k in set(ca) | set(cb) if ca[k] != cb[k]), key=lambda k: (-abs(ca[k] - cb[k]), k))
    detail = [f"{k} {ca[k]} vs {cb[k]} ({cb[k] - ca[k]:+d})" for k in changed]
    return Finding("op types", SEMANTIC, bool(changed),
                   f"{sum(ca.values())} nodes, {len(ca)} types", f"{sum(cb.values())} nodes, {len(cb)} types",
                   detail, data={"a": dict(sorted(ca.items())), "b": dict(sorted(cb.items())), "changed": changed})


def _initializers_finding(ma, mb) -> Finding:
    wa, wb = _initializer_hashes(ma), _initializer_hashes(mb)
    same = sorted(n for n in wa if n in wb and wa[n] == wb[n])
    differ = sorted(n for n in wa if n in wb and wa[n] != wb[n])
    only_a = sorted(set(wa) - set(wb))
    only_b = sorted(set(wb) - set(wa))
    detail = [f"{len(names)} {what}: {', '.join(names[:8])}{' ...' if len(names) > 8 else ''}"
              for what, names in (("differ", differ), ("only in A", only_a), ("only in B", only_b)) if names]
    if not detail:
        detail.append(f"all {len(same)} bit-identical")
    return Finding("initializers", SEMANTIC, bool(differ or only_a or only_b),
                   f"{len(wa)}", f"{len(wb)}", detail,
                   data={"bit_identical": len(same), "differ": differ, "only_a": only_a, "only_b": only_b})


def _nodes_finding(ma, mb) -> Finding:
    """Node wiring and attributes: what op counts alone do not show."""
    sa, sb = _node_signatures(ma), _node_signatures(mb)
    only_sa, only_sb = sum((sa - sb).values()), sum((sb - sa).values())
    return Finding("nodes", SEMANTIC, bool(only_sa or only_sb),
                   f"{sum(sa.values())}", f"{sum(sb.values())}",
                   [f"{only_sa} nodes of A and {only_sb} of B have no identical counterpart "
                    "(op, inputs, outputs, attributes; names ignored)"] if (only_sa or only_sb) else [],
                   data={"unmatched_a": only_sa, "unmatched_b": only_sb})


def _producer_finding(ma, mb, sa_, sb_) -> Finding:
    pa_ = f"{ma.producer_name} {ma.producer_version}".strip() or "-"
    pb_ = f"{mb.producer_name} {mb.producer_version}".strip() or "-"
    return Finding("producer", METADATA, pa_ != pb_, pa_, pb_, [],
                   _attributable(sa_, "producer"), _attributable(sb_, "producer"))


def _metadata_props_finding(ma, mb, sa_, sb_) -> Finding:
    mpa = {p.key: p.value for p in ma.metadata_props}
    mpb = {p.key: p.value for p in mb.metadata_props}
    detail = [f"{k}: {mpa.get(k, '-')!r} vs {mpb.get(k, '-')!r}"[:160] for k in sorted(set(mpa) | set(mpb)) if mpa.get(k) != mpb.get(k)]
    return Finding("metadata_props", METADATA, mpa != mpb, f"{len(mpa)} keys", f"{len(mpb)} keys", detail,
                   _attributable(sa_, "metadata"), _attributable(sb_, "metadata"))


def _value_info_finding(ma, mb, sa_, sb_) -> Finding:
    va = sum(len(g.value_info) for g in _graphs(ma.graph))
    vb = sum(len(g.value_info) for g in _graphs(mb.graph))
    ba, bb = _attributable(sa_, "value_info"), _attributable(sb_, "value_info")
    via = {vi.name: _type_str(vi) for g in _graphs(ma.graph) for vi in g.value_info}
    vib = {vi.name: _type_str(vi) for g in _graphs(mb.graph) for vi in g.value_info}
    return Finding("value_info", METADATA, via != vib, f"{va} entries, {_kb(ba)}", f"{vb} entries, {_kb(bb)}",
                   [f"{_signed(bb - ba)} of shape annotations; {vb - va:+d} entries"] if via != vib else [],
                   ba, bb, data={"entries_a": va, "entries_b": vb})


def _doc_strings_finding(ma, mb, sa_, sb_) -> Finding:
    da, db = list(_doc_strings(ma)), list(_doc_strings(mb))
    ba, bb = _size(ma) - _size(sa_), _size(mb) - _size(sb_)
    psa, psb = _path_stats(da), _path_stats(db)
    differs = Counter(da) != Counter(db)
    detail = []
    if differs:
        detail.append(f"{_signed(bb - ba)} of doc_strings")
    for tag, ps in (("A", psa), ("B", psb)):
        if ps["with_absolute_paths"]:
            detail.append(f"{tag}: {ps['with_absolute_paths']} of {ps['count']} doc_strings embed absolute paths "
                          f"({ps['path_occurrences']} paths; roots "
                          + ", ".join(f"{r} x{n}" for r, n in ps["root_counts"].items()) + ")")
    return Finding("doc_strings", METADATA, differs,
                   f"{len(da)}, {_kb(ba)}, {psa['with_absolute_paths']} with paths",
                   f"{len(db)}, {_kb(bb)}, {psb['with_absolute_paths']} with paths",
                   detail, ba, bb, data={"a": psa, "b": psb})


def format_diff(d: ModelDiff) -> str:
    lines = []
    for tag, info in (("A", d.a), ("B", d.b)):
        lines.append(f"{tag}: {info['path']}  ({_kb(info['bytes'])})")
        lines.append(f"   raw      {info['raw_sha256']}")
        lines.append(f"   semantic {info['semantic_sha256']}  (without {', '.join(info['semantic_strip'])})")
    raw_same = d.a["raw_sha256"] == d.b["raw_sha256"]
    lines.append(f"raw hash {'same' if raw_same else 'differs'}; semantic hash {'same' if d.semantic_equal else 'differs'}")
    lines.append("")
    rows = []
    for i, f in enumerate(d.ranked(), 1):
        cut = lambda x: x if len(x) <= 32 else x[:29] + "..."  # noqa: E731
        rows.append([str(i), f.risk, f.category, "DIFFERS" if f.differs else "same", cut(f.a), cut(f.b),
                     f.detail[0] if f.detail else ""])
        for extra in f.detail[1:]:
            rows.append(["", "", "", "", "", "", extra])
    lines.append(text_table(["rank", "risk", "what", "status", "A", "B", "detail"], rows, rule=True))
    n_sem = sum(f.differs and f.risk == SEMANTIC for f in d.findings)
    n_meta = sum(f.differs and f.risk == METADATA for f in d.findings)
    lines.append("")
    lines.append(f"{n_sem} semantic and {n_meta} metadata difference(s); ranked by semantic risk, not by bytes.")
    return "\n".join(lines)
