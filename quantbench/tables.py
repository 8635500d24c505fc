"""The result tables: one schema version, content-addressed Parquet parts.

Each table is a folder of Parquet files, ``results/tables/<table>/part-<sha>.parquet``,
read together as one Arrow dataset. Appending writes one new part atomically
(temporary file, then rename), named by the SHA-256 of its rows, so writing the
same rows twice is a no-op, runs on different machines merge by copying parts,
and a crash loses at most the part being written. Readers de-duplicate on the
table's key columns.

The column lists below are the schema docs/schema.md documents
(``python -m quantbench.tables`` prints the Markdown); a test checks that the
docs/schema.md and this module agree.
"""

from __future__ import annotations

import contextlib
import io
import itertools
import operator
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Iterable, Mapping, Sequence

from quantbench import SCHEMA_VERSION, lazy
from quantbench.assets import TABLES_DIR
from quantbench.errors import DiskFull, UserError, flag
from quantbench.fsutil import atomic_path, clean_stale_tmp, content_key, disk_full, no_space, sha256_bytes

if TYPE_CHECKING:
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq
else:  # pyarrow loads on first use: importing this module (every command's does) stays cheap
    pa, pc, pq = lazy.module("pyarrow"), lazy.module("pyarrow.compute"), lazy.module("pyarrow.parquet")


class ArrowType:
    """An Arrow type named without importing pyarrow: `.arrow` makes it (once) when a table is built or read."""

    def __init__(self, make):
        self._make, self._arrow = make, None

    @property
    def arrow(self) -> pa.DataType:
        if self._arrow is None:
            self._arrow = self._make()
        return self._arrow


def _list(t: ArrowType) -> ArrowType:
    return ArrowType(lambda: pa.list_(t.arrow))


# (column, arrow type, meaning)
_S = ArrowType(lambda: pa.string())
_I = ArrowType(lambda: pa.int64())
_F = ArrowType(lambda: pa.float64())
_B = ArrowType(lambda: pa.bool_())
_BIN = ArrowType(lambda: pa.large_binary())
_TS = ArrowType(lambda: pa.timestamp("us", tz="UTC"))
_OBJ = ArrowType(lambda: pa.list_(pa.struct([("category_id", _I.arrow), ("bbox", pa.list_(_F.arrow))])))

# every table ends with these two (created_at never enters a part name or any id: see append_chunks)
_CREATED = ("created_at", _TS, "when the row was first written (UTC); not part of any hash or key")
_RUN = ("run_id", _S, "the `run`/`equiv` invocation that first wrote the row: SHA-256 of its hosts, variants, "
        "fixtures and session (null: written outside one, or by schema version 1)")

COLUMNS: dict[str, list[tuple[str, ArrowType, str]]] = {
    "fixtures": [
        ("fixture_id", _S, "SHA-256 of the canonical encoding of the input tensor (see docs/schema.md: tensor hash)"),
        ("input_name", _S, "model input the tensor feeds"),
        ("dtype", _S, "numpy dtype string of the input tensor, little-endian (e.g. <f4)"),
        ("shape", _list(_I), "input tensor shape"),
        ("source", _S, "source image path, relative to the corpus or images folder"),
        ("image_sha256", _S, "SHA-256 of the source image file bytes"),
        ("labels", _S, "ground-truth labels as JSON (COCO annotations of the image)"),
        ("objects", _OBJ, "the labels, typed: one {category_id, bbox [x, y, w, h] pixels (null: no box)} per annotation"),
        ("stratum", _S, "the image's stratum: empty, objects, or its one label (classifier labels)"),
        ("split", _S, "corpus split: train, val or eval"),
        ("preprocess", _S, "preprocessing recipe as canonical JSON"),
        ("preprocess_id", _S, "SHA-256 of the preprocess JSON: tells fixtures of one image under two recipes apart"),
        ("tensor", _BIN, "raw C-order little-endian bytes of the input tensor"),
    ],
    "models": [
        ("variant_id", _S, "semantic hash: SHA-256 of the ONNX with node doc_strings removed"),
        ("raw_sha256", _S, "SHA-256 of the ONNX file bytes"),
        ("model", _S, "source model name (e.g. litter-detr-tiny)"),
        ("variant", _S, "variant name: fp32, dynamic, static-minmax, static-percentile, static-entropy, ..."),
        ("path", _S, "where the variant's ONNX was written"),
        ("recipe", _S, "the variant's recipe as canonical JSON"),
        ("method", _S, "recipe: fp32, dynamic, minmax, percentile, entropy, ..."),
        ("activation_type", _S, "recipe: activation integer type (static; null otherwise)"),
        ("weight_type", _S, "recipe: weight integer type (null for fp32)"),
        ("per_channel", _B, "recipe: per-channel weight scales"),
        ("reduce_range", _B, "recipe: 7-bit weights"),
        ("percentile", _F, "recipe: Percentile calibration's percentile (null: other methods)"),
        ("entropy_bins", _I, "recipe: Entropy calibration's histogram bins (null: other methods)"),
        ("calibration_set", _S, "recipe: calibration set name (null: not calibrated)"),
    ],
    "hosts": [
        ("fingerprint_id", _S, "SHA-256 of the canonical JSON fingerprint"),
        ("host", _S, "host name as the user called it (x86, pi, pi4, ...)"),
        ("kind", _S, "local, emulated, ssh or imported"),
        ("arch", _S, "machine architecture (x86_64, aarch64)"),
        ("cpu", _S, "CPU identity: x86 vendor/family/model name, ARM implementer/part/variant"),
        ("isa_flags", _list(_S), "ISA feature flags relevant to kernel dispatch, sorted"),
        ("ort_version", _S, "onnxruntime version on the host"),
        ("fingerprint", _S, "the whole fingerprint as canonical JSON"),
        ("os", _S, "fingerprint: operating system"),
        ("libc", _S, "fingerprint: C library"),
        ("python_version", _S, "fingerprint: Python version"),
        ("numpy_version", _S, "fingerprint: numpy version"),
        ("resolved_providers", _list(_S), "fingerprint: execution providers the probe session resolved"),
        ("does_not_start", _S, "fingerprint: why the host's runtime cannot start on its CPU, e.g. 'onnxruntime "
         "1.21.0 does not start on Cortex-A72: SIGILL at import' (null: it started)"),
    ],
    "outputs": [
        ("run_key", _S, "SHA-256 of (variant_id, fixture_id, fingerprint_id, session_key): the cache key"),
        ("host", _S, "host name"),
        ("fingerprint_id", _S, "fingerprint the row was produced under"),
        ("session_key", _S, "SHA-256 of the canonical JSON session options"),
        ("session_options", _S, "session options as canonical JSON (threads, optimisation level, config entries)"),
        ("variant_id", _S, "semantic hash of the model variant"),
        ("variant", _S, "variant name"),
        ("fixture_id", _S, "fixture (input tensor hash)"),
        ("output_name", _S, "model output name"),
        ("dtype", _S, "numpy dtype string, little-endian"),
        ("shape", _list(_I), "output tensor shape"),
        ("sha256", _S, "SHA-256 of the canonical encoding of the output tensor"),
        ("tensor", _BIN, "raw C-order little-endian bytes of the output tensor"),
        ("providers", _list(_S), "execution providers that ran at least one node (read from the run's profile)"),
        ("placement", _S, "which provider ran the nodes, from the run's profile: canonical JSON {provider: {op type: nodes}}"),
    ],
    "calib_manifest": [
        ("path", _S, "image path relative to the images folder named in the set's recipe.json (calib_sets/<name>/manifest.parquet, not under results/tables)"),
        ("sha256", _S, "SHA-256 of the image file bytes"),
        ("split", _S, "corpus split of the image (never eval)"),
        ("objects", _I, "number of labelled objects (0: an empty image)"),
        ("density", _S, "stratum: empty, objects (objects-<a>-<b> with --count-bins), or the image's label (--strata label)"),
        ("luminance", _F, "measured mean Rec. 709 luma 0.2126 R + 0.7152 G + 0.0722 B of the decoded RGB, 0..255"),
        ("lighting", _S, "dark (below the median luminance of its stratum) or bright (at or above)"),
        ("cell", _S, "stratum cell <stratum>/<lighting>"),
        ("seed", _I, "selection seed"),
        ("status", _S, "selected, or skipped (unreadable image, --skip-bad)"),
        ("note", _S, "why an image was skipped"),
        ("cell_wanted", _I, "images asked per cell (--per-cell)"),
        ("cell_available", _I, "candidates the cell had (fewer than cell_wanted: a recorded shortfall, --allow-short)"),
    ],
    "classes": [
        ("equiv_id", _S, "SHA-256 of the equiv settings and of each host's (fingerprint, session): one analysis"),
        ("variant_id", _S, "semantic hash of the model variant"),
        ("variant", _S, "variant name"),
        ("model", _S, "source model name"),
        ("class_label", _S, "equivalence class (A, B, ...; A holds the first host named)"),
        ("hosts", _list(_S), "hosts whose output hashes are identical over every fixture"),
        ("fingerprint_ids", _list(_S), "fingerprint of each host, in the same order"),
        ("digest", _S, "SHA-256 over the class's sorted (fixture, output, sha256) lines"),
        ("fixtures", _I, "fixtures compared"),
        ("reference", _B, "the class holds the reference host"),
        ("separating_features", _list(_S), "smallest fingerprint feature set telling this variant's classes apart, "
                                           "preferring the ISA flags onnxruntime's kernel dispatch reads, in MLAS's "
                                           "order (isa:avx512f, isa:avx512_vnni, isa:i8mm, ...; null: none found)"),
        ("agreement", _S, "JSON: per host pair, fixtures on which every output hash agrees"),
        ("distance", _S, "JSON: per output, |delta| max/mean and remaining precision bits against the reference class"),
        ("provider_findings", _list(_S), "flagged: a host of the class whose requested execution provider was not available or ran no node (HOST: requested ...)"),
        ("placements", _S, "JSON: per host, which provider ran how many nodes of each op type (from the run's profile)"),
        ("settings", _S, "the equiv settings as canonical JSON (hosts, reference, variants, fixtures, decode, gates)"),
    ],
    "decisions": [
        ("equiv_id", _S, "the analysis (see classes)"),
        ("host", _S, "host name"),
        ("fingerprint_id", _S, "fingerprint the outputs were produced under"),
        ("variant_id", _S, "semantic hash of the model variant"),
        ("variant", _S, "variant name"),
        ("fixture_id", _S, "fixture (input tensor hash)"),
        ("source", _S, "source image of the fixture"),
        ("slot", _I, "decision slot: detector query, classifier 0, map region or NMS'd detection index"),
        ("class_id", _I, "decoded class (-1: none)"),
        ("class_name", _S, "class name from the sidecar (ctc: the decoded string)"),
        ("score", _F, "score the threshold applies to (sigmoid, softmax or map value), float64"),
        ("kept", _B, "served: score >= threshold (and within top-k)"),
        ("margin", _F, "signed distance to the decision boundary (score - threshold; classifier without threshold: top-1 minus top-2)"),
        ("box", _list(_F), "the decision's box or region as decoded, xyxy (null: the decoder has no boxes)"),
        ("flip_own_fp32", _S, "flip kind against fp32 on the same host: threshold, class, box-shift, text, or empty"),
        ("flip_ref_fp32", _S, "flip kind against fp32 on the reference host, or empty"),
    ],
    "flips": [
        ("equiv_id", _S, "the analysis (see classes)"),
        ("comparison", _S, "own-fp32 (vs fp32 on the same host), ref-fp32 (vs fp32 on the reference host), ref-same (vs this variant on the reference host)"),
        ("host", _S, "candidate host"),
        ("variant_id", _S, "candidate variant"),
        ("variant", _S, "candidate variant name"),
        ("ref_host", _S, "reference host"),
        ("ref_variant", _S, "reference variant name"),
        ("fixture_id", _S, "fixture (input tensor hash)"),
        ("source", _S, "source image of the fixture"),
        ("ref_slot", _I, "reference slot (-1: served by the candidate only)"),
        ("slot", _I, "candidate slot (-1: served by the reference only)"),
        ("kind", _S, "threshold (kept on one side only), class (kept on both, other class), box-shift (IoU < 0.9), "
                     "text (ctc: the decoded string changed)"),
        ("ref_class", _S, "reference class name (ctc: the reference's decoded string)"),
        ("class_name", _S, "candidate class name (ctc: the candidate's decoded string)"),
        ("ref_score", _F, "reference score (NaN: no such decision)"),
        ("score", _F, "candidate score"),
        ("iou", _F, "IoU of the two boxes or regions (NaN: not applicable)"),
        ("threshold", _F, "decision threshold (null: classifier top-1 without one)"),
        ("margin", _F, "the reference (fp32) score's signed distance to the threshold"),
        ("band", _S, "|margin| band, e.g. [0.01,0.02)"),
    ],
    # explain (localize, evidence, lint, remedies, noise, latency)
    "localize": [
        ("localize_id", _S, "SHA-256 of (variant, fixture, both hosts' fingerprints and sessions, localisation level)"),
        ("variant_id", _S, "semantic hash of the model variant"),
        ("variant", _S, "variant name"),
        ("fixture_id", _S, "fixture the localisation ran on"),
        ("host_a", _S, "first host (as named, with its session overrides)"),
        ("host_b", _S, "second host"),
        ("fingerprint_a", _S, "fingerprint of host_a"),
        ("fingerprint_b", _S, "fingerprint of host_b"),
        ("opt_level", _S, "graph optimisation level the localisation ran at"),
        ("group_size", _I, "intermediates exposed per run (memory bound: K tensors + outputs + arena)"),
        ("position", _I, "topological position of the producing node"),
        ("node", _S, "producing node name"),
        ("op_type", _S, "producing node op type"),
        ("tensor", _S, "tensor name"),
        ("observable", _B, "false when exposing this tensor changes the final outputs (fusion broken): not compared"),
        ("sha_a", _S, "SHA-256 of the tensor on host_a (canonical encoding)"),
        ("sha_b", _S, "SHA-256 of the tensor on host_b"),
        ("same", _B, "byte-identical on both hosts"),
        ("first_divergent", _B, "one of the first divergent node's outputs"),
        ("is_output", _B, "a model output"),
        ("bits_mean", _F, "remaining precision bits, mean (first divergent tensors and outputs only; float32)"),
        ("bits_min", _F, "remaining precision bits, minimum"),
        ("max_abs", _F, "max |a - b| (first divergent tensors and outputs only)"),
    ],
    "evidence": [
        ("evidence_id", _S, "SHA-256 of (host fingerprint, variant, fixtures, qemu CPU)"),
        ("host", _S, "emulated host name"),
        ("fingerprint_id", _S, "fingerprint of the host the log was taken on"),
        ("qemu_cpu", _S, "qemu CPU model"),
        ("variant_id", _S, "semantic hash of the model variant run"),
        ("variant", _S, "variant name"),
        ("arch", _S, "aarch64 or x86_64"),
        ("family", _S, "instruction family (e.g. UDOT/SDOT (by element), SMULL/SMLAL, VPMADDUBSW)"),
        ("kind", _S, "int8-dot, int8-matmul, int8-widening, int8-saturating-pair, int16-pair, fp32-fma, sve (any SVE instruction)"),
        ("sites", _I, "distinct instruction addresses of the family inside onnxruntime's code"),
        ("translations", _I, "times qemu translated one of them (-d in_asm lines; not executions)"),
        ("from_bytes", _I, "of those, lines the disassembler printed as .byte/.inst, decoded from the word"),
    ],
    "lint": [
        ("variant_id", _S, "semantic hash of the linted model"),
        ("model", _S, "model path as given"),
        ("node", _S, "GEMM-like node the weights feed"),
        ("op_type", _S, "Conv, MatMul, Gemm (QDQ) or QLinearConv, QLinearMatMul, MatMulInteger, ConvInteger"),
        ("weight", _S, "int8 weight initializer"),
        ("shape", _list(_I), "weight shape"),
        ("act_type", _S, "activation integer type (uint8, int8, unknown)"),
        ("weight_type", _S, "weight integer type"),
        ("k", _I, "reduction length per output"),
        ("pairs", _I, "adjacent K pairs (2i, 2i+1) over all outputs"),
        ("x86_saturating_pairs", _I, "pairs whose vpmaddubsw int16 sum can saturate (same sign, 255*(|wi|+|wj|) > 32767)"),
        ("neon_wrapping_pairs", _I, "pairs of -128 weights whose smull/smlal int16 sum can wrap (S8 activations)"),
        ("int32_ok", _B, "K*255*128 < 2^31"),
        ("tiers", _list(_S), "int8 paths that can diverge: x86-vpmaddubsw (AVX2, AVX-512BW without VNNI), arm-neon, all"),
        ("reason", _S, "why"),
    ],
    "remedies": [
        ("remedy_id", _S, "SHA-256 of (base variant, remedy, hosts, fixtures)"),
        ("base_variant_id", _S, "the variant whose hosts split"),
        ("remedy", _S, "baseline, reduce_range, x64quantprecision, s8s8, u8u8"),
        ("variant_id", _S, "variant the remedy ran (the base one for session remedies)"),
        ("session_options", _S, "session options as canonical JSON"),
        ("hosts", _list(_S), "hosts compared"),
        ("supported", _B, "false when the remedy could not be built or run (see note)"),
        ("classes", _I, "number of equivalence classes over the hosts"),
        ("one_class", _B, "all hosts byte-identical"),
        ("class_map", _S, "host -> class label as canonical JSON"),
        ("flips_total", _I, "decision flips against fp32 on the same host, summed over hosts"),
        ("flips_max", _I, "decision flips against fp32, worst host"),
        ("fixtures", _I, "fixtures compared"),
        ("note", _S, "why unsupported, or what the remedy changes"),
    ],
    "noise": [
        ("host", _S, "host name"),
        ("fingerprint_id", _S, "host fingerprint"),
        ("variant_id", _S, "semantic hash of the variant"),
        ("variant", _S, "variant name"),
        ("factor", _S, "repeat, threads, batch, opt_level"),
        ("setting_a", _S, "baseline setting (e.g. threads=1)"),
        ("setting_b", _S, "compared setting (e.g. threads=2)"),
        ("fixtures", _I, "fixtures compared"),
        ("same_bytes", _B, "every output byte-identical under both settings (null: not measurable, see note)"),
        ("differing_fixtures", _I, "fixtures whose outputs differ"),
        ("flips", _I, "decision flips between the two settings"),
        ("harness_fault", _B, "repeat row only: repeated runs of one session differ"),
        ("note", _S, "e.g. fixed batch axis"),
    ],
    "latency": [
        ("host", _S, "host name (local or ssh only)"),
        ("fingerprint_id", _S, "host fingerprint"),
        ("variant_id", _S, "semantic hash of the variant"),
        ("variant", _S, "variant name"),
        ("session_options", _S, "session options as canonical JSON"),
        ("warmup", _I, "untimed warm-up runs"),
        ("runs", _I, "timed runs per repeat"),
        ("repeats", _I, "repeats (each gives one median)"),
        ("median_ms", _F, "median of the repeat medians, milliseconds per inference"),
        ("spread_ms", _F, "max - min of the repeat medians"),
        ("peak_rss_mb", _F, "peak resident set size of the measuring process, MiB"),
        ("speedup_vs_fp32", _F, "fp32 median / this median on the same host (>1 faster, <1 slower)"),
        ("sign", _S, "faster, slower or same against fp32 (same: within the spreads)"),
    ],
}

# calib_manifest is not a results table: its bytes are hashed into every variant's recipe
# (manifest_sha256), so no timestamp may enter it
for _name, _cols in COLUMNS.items():
    if _name != "calib_manifest":
        _cols += [_RUN, _CREATED]

# Tables of later pipeline stages (classes, decisions, flips, ...) are declared
# here too, so this module stays the one place the schema lives.

KEYS: dict[str, list[str]] = {
    "fixtures": ["fixture_id", "preprocess_id"],
    "models": ["variant_id"],
    "hosts": ["fingerprint_id", "host"],
    "calib_manifest": ["path"],
    "outputs": ["run_key", "host", "output_name"],
    "classes": ["equiv_id", "variant_id", "class_label"],
    "decisions": ["equiv_id", "host", "variant_id", "fixture_id", "slot"],
    "flips": ["equiv_id", "comparison", "host", "variant_id", "fixture_id", "ref_slot", "slot"],
    "localize": ["localize_id", "tensor"],
    "evidence": ["evidence_id", "family"],
    "lint": ["variant_id", "node", "weight"],
    "remedies": ["remedy_id"],
    "noise": ["fingerprint_id", "host", "variant_id", "factor"],
    "latency": ["fingerprint_id", "host", "variant_id"],
}


def schema(name: str) -> pa.Schema:
    if name not in COLUMNS:
        raise KeyError(f"unknown table {name!r}; known: {', '.join(sorted(COLUMNS))}")
    return pa.schema(
        [pa.field(c, t.arrow) for c, t, _ in COLUMNS[name]],
        metadata={"quantbench.schema_version": str(SCHEMA_VERSION), "quantbench.table": name},
    )


# --- derived (typed) columns: computed from the JSON column they mirror when a writer leaves them out

def _json(text):
    import json

    try:
        return json.loads(text) if isinstance(text, str) and text else {}
    except ValueError:
        return {}


def _objects(row):
    anns = _json(row.get("labels")) if isinstance(row.get("labels"), str) else []
    out = []
    for a in anns if isinstance(anns, list) else []:
        if not isinstance(a, dict):
            continue
        cid = a.get("category_id")
        bbox = a.get("bbox")
        out.append({"category_id": cid if isinstance(cid, int) and not isinstance(cid, bool) else None,
                    "bbox": [float(v) for v in bbox] if isinstance(bbox, list) and all(
                        isinstance(v, (int, float)) and not isinstance(v, bool) for v in bbox) else None})
    return {"objects": out}


def _preprocess_id(row):
    p = row.get("preprocess")
    return {"preprocess_id": content_key(_json(p)) if p is not None else None}


def _recipe_cols(row):
    r = _json(row.get("recipe"))
    opts = r.get("calibration_options") if isinstance(r.get("calibration_options"), dict) else {}
    calib = r.get("calibration_set") if isinstance(r.get("calibration_set"), dict) else {}

    def typed(v, t):
        return v if isinstance(v, t) and not (t is not bool and isinstance(v, bool)) else None
    return {"method": typed(r.get("method"), str), "activation_type": typed(r.get("activation_type"), str),
            "weight_type": typed(r.get("weight_type"), str), "per_channel": typed(r.get("per_channel"), bool),
            "reduce_range": typed(r.get("reduce_range"), bool),
            "percentile": float(opts["percentile"]) if isinstance(opts.get("percentile"), (int, float)) else None,
            "entropy_bins": typed(opts.get("entropy_bins"), int), "calibration_set": typed(calib.get("name"), str)}


def _fingerprint_cols(row):
    ident = _json(row.get("fingerprint")).get("identity") or {}
    ident = ident if isinstance(ident, dict) else {}
    prov = ident.get("resolved_providers")
    s = lambda k: ident.get(k) if isinstance(ident.get(k), str) else None  # noqa: E731
    return {"os": s("os"), "libc": s("libc"), "python_version": s("python"), "numpy_version": s("numpy"),
            "resolved_providers": [p for p in prov if isinstance(p, str)] if isinstance(prov, list) else None,
            "does_not_start": s("does_not_start")}


# table -> [(derived columns, source columns, function row -> {column: value})]
DERIVED = {
    "fixtures": [(("objects",), ("labels",), _objects), (("preprocess_id",), ("preprocess",), _preprocess_id)],
    "models": [(("method", "activation_type", "weight_type", "per_channel", "reduce_range", "percentile",
                 "entropy_bins", "calibration_set"), ("recipe",), _recipe_cols)],
    "hosts": [(("os", "libc", "python_version", "numpy_version", "resolved_providers", "does_not_start"),
               ("fingerprint",),
               _fingerprint_cols)],
}

_RUN_ID = None


@contextlib.contextmanager
def run_scope(run_id: str | None):
    """Rows written inside get this run_id (when their writer sets none)."""
    global _RUN_ID
    old, _RUN_ID = _RUN_ID, run_id
    try:
        yield run_id
    finally:
        _RUN_ID = old


def run_id_of(**parts) -> str:
    """A run's id: SHA-256 of what determines its rows (never a time)."""
    return content_key(parts)


def _now():
    from datetime import datetime, timezone

    return datetime.now(timezone.utc)


def _complete(name: str, table: pa.Table) -> pa.Table:
    """Add the derived, run_id and created_at columns a table lacks (computed, the run scope's, now)."""
    have = set(table.column_names)
    for cols, sources, fn in DERIVED.get(name, []):
        if all(c in have for c in cols) or not all(c in have for c in sources):
            continue
        src = table.select(list(sources)).to_pylist()
        vals = [fn(r) for r in src]
        for c in cols:
            if c not in have:
                table = table.append_column(c, _array([v[c] for v in vals], schema(name).field(c).type))
    n = table.num_rows
    if name == "calib_manifest":
        return table
    if "run_id" not in have:
        table = table.append_column("run_id", _array([_RUN_ID] * n, _S.arrow))
    if "created_at" not in have:
        table = table.append_column("created_at", _array([_now()] * n, _TS.arrow))
    return table


def to_arrow(name: str, rows: Iterable[Mapping] | pa.Table) -> pa.Table:
    """Rows (dicts) or a table -> an Arrow table with exactly the declared schema.

    Derived typed columns (see DERIVED), run_id and created_at are filled when absent.
    """
    sch = schema(name)
    if not isinstance(rows, pa.Table):
        rows = list(rows)
        given = {k for r in rows for k, v in r.items() if v is not None} if rows else set()
        cols = {f.name: [r.get(f.name) for r in rows] for f in sch if f.name in given or not rows}
        base = [f for f in sch if f.name in cols]
        rows = pa.Table.from_arrays([_array(cols[f.name], f.type) for f in base], schema=pa.schema(base))
        for f in sch:   # declared columns every row left out (and are not derived): nulls
            if f.name not in rows.column_names and not _is_filled(name, f.name):
                rows = rows.append_column(f, pa.nulls(rows.num_rows, f.type))
    rows = _complete(name, rows)
    missing = [f.name for f in sch if f.name not in rows.column_names]
    if missing:
        raise ValueError(f"table {name}: missing columns {missing}")
    return rows.select([f.name for f in sch]).cast(sch)


def _is_filled(name: str, col: str) -> bool:
    return (col in ("run_id", "created_at") and name != "calib_manifest") or any(col in cols for cols, _, _ in DERIVED.get(name, []))


class _Hasher:
    """A write-only file that hashes what is written (the part name's input)."""

    def __init__(self):
        import hashlib

        self.h = hashlib.sha256()
        self.closed = False

    def write(self, b):
        self.h.update(b)
        return len(b)

    def flush(self):
        pass

    def close(self):
        self.closed = True


def _serialize(chunks: Iterable[pa.Table], name_hash=None, row_group_rows: int | None = None) -> bytes | None:
    """Parquet bytes of the chunks, one row group each (or of at most `row_group_rows`); same chunks, same bytes.

    Binary columns hold tensors: float data that compresses little, where LZ4 takes
    about a third of zstd's time. Dictionary encoding is for repeated values; on
    unique tensors it would cost a hash of every byte and save nothing.
    """
    buf, w = io.BytesIO(), None
    for chunk in chunks:
        if not chunk.num_rows:
            continue
        if w is None:
            sch = chunk.schema
            plain = {f.name for f in sch if pa.types.is_large_binary(f.type) or pa.types.is_binary(f.type)}
            # Min/max statistics on every column but the tensors: a filtered read (host, variant,
            # fixture, fingerprint...) skips row groups, and compacted parts are sorted so it can.
            w = pq.ParquetWriter(buf, sch, compression={c: ("lz4" if c in plain else "zstd") for c in sch.names},
                                 write_statistics=[c for c in sch.names if c not in plain],
                                 use_dictionary=[c for c in sch.names if c not in plain])
        w.write_table(chunk, row_group_size=row_group_rows)
        if name_hash is not None:  # the rows without their timestamps: same rows, same part name
            body = chunk.drop_columns([c for c in ("created_at",) if c in chunk.column_names])
            if name_hash.get("w") is None:
                name_hash["w"] = pa.ipc.new_stream(name_hash["sink"], body.schema)
            name_hash["w"].write_table(body)
    if w is None:
        return None
    if name_hash is not None:
        name_hash["w"].close()
    w.close()
    return buf.getvalue()


def append(name: str, rows: Iterable[Mapping] | pa.Table, root: str | os.PathLike = TABLES_DIR,
           ledger: bool = False, made_from: str | None = None) -> Path | None:
    """Write rows as one new content-addressed part; returns its path (None if no rows).

    `ledger=True` (rows given as dicts): rows stored before are not serialised again. The
    table's ledger (``<table>/.ledger/<digest of the rows>``, naming the part that holds
    them) is checked first; a hit whose part is still there returns that part.
    `made_from`: the content key of what the rows are computed from (same key, same rows);
    the ledger is then keyed by it, and rows already stored are neither hashed nor even
    looked at (a lazy sequence of rows is not built).
    """
    digest = None
    if ledger and not isinstance(rows, pa.Table):
        if made_from is not None:
            digest = content_key({"table": name, "schema": SCHEMA_VERSION, "made_from": made_from})
            hit = _ledger_get(name, root, digest)
            if hit is not None:
                return hit
        rows = list(rows)
        if not rows:
            return None
        if digest is None:
            digest = rows_digest(name, rows)
            hit = _ledger_get(name, root, digest)
            if hit is not None:
                return hit
    path = append_chunks(name, [rows], root)
    if digest is not None and path is not None:
        _ledger_put(name, root, digest, path.name)
    return path


def append_chunks(name: str, chunks: Iterable, root: str | os.PathLike = TABLES_DIR) -> Path | None:
    """Like append, from chunks (Arrow tables or lists of rows) written one row group each.

    For large tensor columns: each chunk is built, compressed and dropped in turn, so
    the whole column never sits in memory uncompressed (first-touch page faults on
    hundreds of MB cost seconds on a small VM).
    """
    nh = {"sink": _Hasher(), "w": None}
    data = _serialize((to_arrow(name, c) for c in chunks), nh)
    if data is None:
        return None
    # named by the rows without created_at, so writing the same rows again is a no-op and the
    # first writing's timestamps stay
    path = Path(root) / name / f"part-{nh['sink'].h.hexdigest()[:32]}.parquet"
    if not path.exists():
        with atomic_path(path) as tmp:
            tmp.write_bytes(data)
    return path


LOCK_FILE = ".lock"


def _lock_holder(path: Path) -> str:
    try:
        pid = path.read_text().strip()
    except OSError:
        pid = ""
    return f"pid {pid}" if pid.isdigit() else "another process"


@contextlib.contextmanager
def lock(root: str | os.PathLike = TABLES_DIR, wait: bool = True):
    """Hold the advisory write lock of a tables folder (`fcntl.flock` on <root>/.lock).

    `quantbench run` and `equiv` hold it for their whole duration, so two of them on one
    results folder take turns instead of both doing every run. A second command waits,
    saying so on stderr, or with wait=False fails at once (a UserError naming the holder).
    The lock file holds the holder's pid while held and is empty otherwise; it is never
    removed (removing a flock file races with the next locker).
    """
    import fcntl
    import sys

    root = Path(root)
    path = root / LOCK_FILE
    try:
        root.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    except OSError as exc:
        raise UserError(f"{path}: cannot create the tables lock file ({exc.strerror})") from None
    with os.fdopen(fd, "r+") as fh:
        try:
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _lock_holder(path)
            if not wait:
                raise UserError(f"{root}: locked by {holder} (another quantbench run or equiv is writing these "
                                f"tables); retry when it ends, or drop {flag('no_wait')} to wait for it") from None
            sys.stderr.write(f"waiting for the lock on {root} held by {holder} ...\n")
            sys.stderr.flush()
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
        try:  # unbuffered: a full disk fails here, once, never again when the file closes
            os.ftruncate(fh.fileno(), 0)
            try:
                os.pwrite(fh.fileno(), f"{os.getpid()}\n".encode(), 0)
            except OSError as exc:
                raise (disk_full(path, exc, "the tables lock was not taken") if no_space(exc) else exc) from None
            clean_stale_parts(root)
            quarantine_unreadable(root)
            _HELD.add(_resolved(root))
            yield path
        finally:
            _HELD.discard(_resolved(root))
            os.ftruncate(fh.fileno(), 0)
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)


def clean_stale_parts(root: str | os.PathLike = TABLES_DIR) -> list[Path]:
    """Remove the temporary parts, ledger files and input stores of runs that died (SIGKILLed); returns them.

    A live writer's file (its pid still runs) is never touched, even one of a command that does not take the lock.
    """
    removed = clean_stale_tmp(root)  # a killed run's input store (hosts/runner.py)
    for d in sorted(p for p in Path(root).iterdir() if p.is_dir() and not p.is_symlink()):
        removed += clean_stale_tmp(d) + clean_stale_tmp(d / ".ledger")
    return removed


def rows_digest(name: str, rows: Sequence[Mapping]) -> str:
    """SHA-256 of the table name, schema version and the rows' values in schema order.

    Each column's values are pickled without the memo (``fast``): exact like repr (floats
    by their bits, True apart from 1) and independent of which equal objects are shared,
    at a fifth of repr's cost on a large equiv's decisions.
    """
    import hashlib
    import pickle

    cols = [c for c, _, _ in COLUMNS[name]]
    h = hashlib.sha256(f"{name}|{SCHEMA_VERSION}|{cols}|{len(rows)}|pickle5|".encode())
    for c in cols:  # column by column: one list per column is much cheaper than one per row
        buf = io.BytesIO()
        p = pickle.Pickler(buf, protocol=5)
        p.fast = True
        p.dump([r.get(c) for r in rows])
        h.update(buf.getbuffer())
        h.update(b"\n")
    return h.hexdigest()


def _ledger_dir(name: str, root) -> Path:
    return Path(root) / name / ".ledger"


def _ledger_get(name: str, root, digest: str) -> Path | None:
    try:
        part = (_ledger_dir(name, root) / digest).read_text().strip()
    except OSError:
        return None
    path = Path(root) / name / part
    return path if part.startswith("part-") and path.exists() else None


def _ledger_put(name: str, root, digest: str, part: str) -> None:
    try:
        with atomic_path(_ledger_dir(name, root) / digest) as tmp:
            tmp.write_text(part + "\n")
    except (OSError, DiskFull):
        pass  # the ledger only saves work


def parts(name: str, root: str | os.PathLike = TABLES_DIR) -> list[Path]:
    d = Path(root) / name
    return sorted(d.glob("part-*.parquet")) if d.is_dir() else []


def read(name: str, root: str | os.PathLike = TABLES_DIR, columns: Sequence[str] | None = None,
         filter=None) -> pa.Table:
    """All parts of a table, de-duplicated on its key, sorted by key (deterministic).

    `filter` keeps some rows while reading, so large tables (outputs with tensors) can be
    read a slice at a time: a mapping {column: value, or a list/set of values} (every
    column must match; row groups whose min/max statistics rule it out are not read), or
    a pyarrow compute expression (read as one dataset). Without a filter or with a mapping,
    parts are read one by one with pyarrow.parquet: neither pyarrow.dataset nor pandas
    (which it imports when installed) is loaded. A part removed
    while reading (compacted by another process: its rows are in the new part) restarts
    the read.
    """
    gone = 0
    while True:
        try:
            return _read(name, parts(name, root), columns, filter)
        except FileNotFoundError:
            gone += 1
            if gone == 5:
                raise
        except CorruptPart as exc:
            if _resolved(root) not in _HELD:
                raise
            quarantine(exc.path, root, exc.reason)


class DecodedTooLarge(ValueError):
    """A Parquet file from elsewhere decoded past the bytes its reader allowed (read_bounded)."""


def read_bounded(source, limit: int, batch: int = 256) -> pa.Table:
    """The whole Parquet file `source` (a path, a file object or a ParquetFile), decoded a batch of rows at a time
    and stopped (DecodedTooLarge) once the decoded rows pass `limit` bytes: a small file of repeated, dictionary
    encoded or well-compressed values is never decoded whole. What its footer declares is not trusted for this (a
    dictionary-encoded column's declared size is its dictionary's)."""
    pf = source if isinstance(source, pq.ParquetFile) else pq.ParquetFile(source)
    got, size = [], 0
    for b in pf.iter_batches(batch_size=batch):
        size += b.nbytes
        if size > limit:
            raise DecodedTooLarge(f"decodes to more than {limit} bytes")
        got.append(b)
    return pa.Table.from_batches(got, schema=pf.schema_arrow)


class CorruptPart(UserError):
    """A part that cannot be read (damaged on disk or not a Parquet file); `path` names it."""

    def __init__(self, path: Path, name: str, reason: str):
        super().__init__(f"{path}: damaged {name} table part ({reason}); move it out of {path.parent} (or delete it) "
                         "and rerun: `quantbench run` and `equiv` set such a part aside themselves and recompute its rows")
        self.path, self.reason = path, reason


#: tables folders whose write lock (see lock) this process holds: a damaged part read there is set aside
_HELD: set[str] = set()
QUARANTINE_DIR = ".quarantine"


def _resolved(root) -> str:
    return str(Path(root).resolve())


def quarantine_unreadable(root: str | os.PathLike = TABLES_DIR) -> list[Path]:
    """Set aside every part of every table whose footer cannot be read (see quarantine), also parts this command
    would not read (an analysis reused from the cache): a later reader (release, report) then finds none."""
    moved = []
    for name in sorted(COLUMNS):
        for f in parts(name, root):
            try:
                _part_footer(f)
            except Exception as exc:  # damaged, truncated, not Parquet
                moved.append(quarantine(f, root, f"{type(exc).__name__}: {(str(exc).strip().splitlines() or [''])[0]}"))
    return moved


def quarantine(part: Path, root: str | os.PathLike, reason: str) -> Path:
    """Move a damaged part to <root>/.quarantine/<table>/ (kept, never read again), saying so on stderr.

    Its rows are missing from then on, so the run recomputes them; the ledger forgets it (a ledger
    entry names a part only while that part is there).
    """
    import sys

    dest_dir = Path(root) / QUARANTINE_DIR / part.parent.name
    dest_dir.mkdir(parents=True, exist_ok=True)
    dest = dest_dir / part.name
    n = 1
    while dest.exists():
        n += 1
        dest = dest_dir / f"{part.stem}.{n}{part.suffix}"
    os.replace(part, dest)
    _PART_FOOTERS.pop(str(part), None)
    sys.stderr.write(f"note: {part}: damaged ({reason}); moved to {dest}, its rows are recomputed\n")
    sys.stderr.flush()
    return dest


def _read(name: str, files: list[Path], columns, filter) -> pa.Table:
    sch = schema(name)
    want = list(columns) if columns else [f.name for f in sch]
    key = KEYS[name]
    read_cols = list(dict.fromkeys(want + key))
    target = pa.schema([sch.field(c) for c in read_cols])
    if not files:  # no pa.Table.from_pylist: converting Python values imports pandas
        return pa.Table.from_arrays([pa.nulls(0, f.type) for f in target], schema=target).select(want)
    table = None
    if isinstance(filter, Mapping):
        filter = _where(filter)  # read part by part below (no dataset)
    elif filter is not None and _all_current(files):
        try:
            # one dataset over every part: files opened in parallel, row groups the filter's
            # statistics rule out skipped, no per-file set-up
            import pyarrow.dataset as ds

            table = ds.dataset([str(f) for f in files], format="parquet").to_table(columns=read_cols, filter=filter)
            table = table.cast(target)
        except Exception:
            table = None  # name the part at fault (or notice one that went away) below
    if table is None:
        def one(f: Path) -> pa.Table:
            try:
                return _read_part(name, f, read_cols, filter).cast(target)
            except (UserError, FileNotFoundError):
                raise
            except Exception as exc:  # corrupt or foreign file: name it
                if not f.exists():
                    raise FileNotFoundError(str(f)) from None
                reason = f"{type(exc).__name__}: {(str(exc).strip().splitlines() or [''])[0]}"
                raise CorruptPart(f, name, reason) from None

        if len(files) < 4:
            table = pa.concat_tables([one(f) for f in files])
        else:  # parts decoded in parallel (pyarrow releases the GIL), kept in name order
            with ThreadPoolExecutor(min(READ_THREADS, len(files)), thread_name_prefix="read-parts") as pool:
                table = pa.concat_tables(list(pool.map(one, files)))
    if table.num_rows:
        table = _first_by_key(table, key)
    return table.select(want)


def _first_by_key(table: pa.Table, key: list[str]) -> pa.Table:
    """The first row (in table order: parts in name order) of each key, sorted by key.

    A stable sort of the key columns (in one chunk: sorting many chunks is slower) puts each
    key's rows together in table order; a row is kept when its key
    differs from the previous row's (nulls equal each other, as in a group-by). Compute
    kernels on Arrow data only: no pyarrow.acero (its import loads pyarrow.dataset and
    pandas) and no Python value converted to Arrow (pyarrow imports pandas for that).
    """
    keys = pa.Table.from_arrays([table.column(k) for k in key], names=list(key)).combine_chunks()
    order = pc.sort_indices(keys, sort_keys=[(k, "ascending") for k in key])
    n = table.num_rows
    if n < 2:
        return table.take(order)
    keys = keys.take(order)
    new = None
    for k in key:
        col = keys.column(k).combine_chunks()
        a, b = col.slice(1), col.slice(0, n - 1)
        ne = pc.not_equal(a, b)
        if ne.null_count:
            ne = pc.if_else(pc.is_null(ne), pc.invert(pc.and_(pc.is_null(a), pc.is_null(b))), ne)
        new = ne if new is None else pc.or_(new, ne)
    return table.take(pa.concat_arrays([order.slice(0, 1), order.slice(1).filter(new)]))


def _where(filter: Mapping) -> dict:
    """A mapping filter as {column: [values], sorted}; one value stands for a list of one. None matches
    nothing (as `==` in an expression: a null equals nothing)."""
    out = {}
    for col, val in filter.items():
        vals = val if isinstance(val, (list, tuple, set, frozenset)) else [val]
        out[col] = sorted({v for v in vals if v is not None})
    return out


# --- Python values -> Arrow arrays. pa.array(), Table.from_pydict and from_pylist import pandas (when installed,
# ~0.2 s) on their first call, so the values the tables hold are laid into Arrow buffers here instead.

def _array(vals: list, typ: pa.DataType) -> pa.Array:
    """`vals` as the Arrow array pa.array(vals, type=typ) makes: laid into buffers (_from_buffers) when they are
    the Python values the tables hold, through pa.array otherwise (other types, a value it must refuse)."""
    arr = _from_buffers(vals, typ)
    return pa.array(vals, type=typ) if arr is None else arr


def _kind(typ: pa.DataType) -> str | None:
    t = pa.types
    for kind, test in (("str", t.is_string), ("str64", t.is_large_string), ("bin", t.is_binary),
                       ("bin64", t.is_large_binary), ("int", t.is_int64), ("float", t.is_float64),
                       ("bool", t.is_boolean), ("list", t.is_list), ("struct", t.is_struct)):
        if test(typ):
            return kind
    return "ts" if t.is_timestamp(typ) and typ.unit == "us" and typ.tz is not None else None


def _py_types(kind: str) -> set:
    """The Python types a column of `kind` lays out itself (exact types: a subclass goes through pa.array)."""
    from datetime import datetime

    return {"bin": {bytes}, "bin64": {bytes}, "int": {int}, "float": {float, int}, "bool": {bool}, "list": {list},
            "struct": {dict}, "ts": {datetime}}[kind] | {type(None)}


def _from_buffers(vals: list, typ: pa.DataType) -> pa.Array | None:
    """pa.array(vals, type=typ) built from buffers, or None for a type or value it leaves to pa.array."""
    kind = _kind(typ)
    # strings are checked by str.join (it takes str alone, None aside); every other kind by the values' types
    types = None if kind in (None, "str", "str64") else set(map(type, vals))
    if kind is None or (types is not None and not types <= _py_types(kind)):
        return None
    nulls = vals.count(None) if types is None or type(None) in types else 0
    validity = _validity(vals) if nulls else None
    if kind == "list":
        filled = _filled(vals, nulls, ())
        child = _from_buffers(list(itertools.chain.from_iterable(filled)), typ.value_type)
        offsets = _offsets(_lengths(filled), "int32")
        if child is None or offsets is None:
            return None
        return pa.Array.from_buffers(typ, len(vals), [validity, offsets], null_count=nulls, children=[child])
    if kind == "struct":
        children = [_from_buffers([None if v is None else v.get(f.name) for v in vals], f.type) for f in typ]
        if any(c is None for c in children):
            return None
        return pa.Array.from_buffers(typ, len(vals), [validity], null_count=nulls, children=children)
    data = _data(kind, _filled(vals, nulls, b"" if kind.startswith("bin") else "" if kind.startswith("str") else 0))
    return None if data is None else pa.Array.from_buffers(typ, len(vals), [validity, *data], null_count=nulls)


def _filled(vals: list, nulls: int, fill) -> list:
    """`vals` with each None replaced by `fill` (the value laid under a null slot)."""
    return [fill if v is None else v for v in vals] if nulls else vals


def _validity(vals: list):
    """The validity bitmap of `vals`."""
    import numpy as np

    valid = np.fromiter(map(operator.is_not, vals, itertools.repeat(None)), dtype=bool, count=len(vals))
    return pa.py_buffer(np.packbits(valid, bitorder="little"))


def _lengths(values) -> "np.ndarray":
    import numpy as np

    return np.fromiter(map(len, values), dtype=np.int64, count=len(values))


def _offsets(lengths, dtype: str):
    """The offsets buffer of values of these lengths, or None when they overflow `dtype`."""
    import numpy as np

    ends = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=ends[1:])
    if ends[-1] > np.iinfo(dtype).max:
        return None
    return pa.py_buffer(ends.astype(dtype))


def _data(kind: str, vals: list) -> list | None:
    """The buffers after the validity bitmap of a flat column of `kind` (no None left in `vals`), or None for a value
    it leaves to pa.array: an int out of range, one a float64 cannot hold exactly, a value of a string column that
    is no str or not UTF-8, a naive time."""
    import numpy as np

    if kind in ("str", "str64", "bin", "bin64"):
        data, lengths = _utf8(vals) if kind.startswith("str") else (b"".join(vals), _lengths(vals))
        offsets = None if data is None else _offsets(lengths, "int32" if kind in ("str", "bin") else "int64")
        return None if offsets is None else [offsets, pa.py_buffer(data)]
    if kind == "bool":
        return [pa.py_buffer(np.packbits(np.array(vals, dtype=bool), bitorder="little"))]
    if kind == "ts":
        vals, kind = _microseconds(vals), "int"
        if vals is None:
            return None
    if kind == "float" and int in set(map(type, vals)) and not all(
            -(1 << 53) <= v <= (1 << 53) for v in vals if type(v) is int):
        return None
    try:
        return [pa.py_buffer(np.array(vals, dtype=np.float64 if kind == "float" else np.int64))]
    except OverflowError:
        return None


def _utf8(strings: list) -> tuple:
    """(the UTF-8 bytes of `strings` joined, each one's byte length), or (None, None): a value that is no str, or
    a str that is not UTF-8."""
    try:
        joined = "".join(strings).encode()
    except (TypeError, UnicodeEncodeError):
        return None, None
    lengths = _lengths(strings)
    if int(lengths.sum()) != len(joined):  # not ASCII: a character may take several bytes
        lengths = _lengths([v.encode() for v in strings])
    return joined, lengths


def _microseconds(times: list) -> list | None:
    """Each time (0: a null's slot) as microseconds since the epoch (UTC), or None for a naive one."""
    from datetime import datetime, timedelta, timezone

    epoch, us = datetime(1970, 1, 1, tzinfo=timezone.utc), timedelta(microseconds=1)
    distinct = {t: t if t == 0 else None if t.utcoffset() is None else (t - epoch) // us for t in set(times)}
    return None if None in distinct.values() else [distinct[t] for t in times]


def _row_groups(meta, where: dict) -> list[int]:
    """The row groups of a part whose min/max statistics do not rule `where` out (flat columns only)."""
    leaf = {meta.schema.column(i).path: i for i in range(meta.num_columns)}  # a list column has its own path
    idx = {c: leaf[c] for c in where if c in leaf}
    keep = []
    for g in range(meta.num_row_groups):
        rg = meta.row_group(g)
        ok = True
        for col, i in idx.items():
            st = rg.column(i).statistics
            if st is None or not st.has_min_max:
                continue
            lo, hi = st.min, st.max
            try:
                if not any(lo <= v <= hi for v in where[col]):
                    ok = False
                    break
            except TypeError:  # statistics of another type than the values: no pruning
                continue
        if ok:
            keep.append(g)
    return keep


def _read_where(f: Path, cols: list[str], where: dict) -> pa.Table:
    """The rows of one part that match `where` (pyarrow.parquet only: row groups pruned, then a mask)."""
    meta, sch = _part_footer(f)
    names = sch.names
    groups = _row_groups(meta, where)
    if not groups:
        return pa.Table.from_batches([], schema=pa.schema([sch.field(c) for c in cols]))
    need = list(dict.fromkeys(cols + [c for c in where if c in names]))
    with pa.OSFile(str(f)) as fh:
        t = pq.ParquetFile(fh, metadata=meta).read_row_groups(groups, columns=need)
    mask = None
    for col, vals in where.items():
        if col not in names:
            continue
        m = pc.is_in(t.column(col), value_set=_array(vals, sch.field(col).type), skip_nulls=True)
        mask = m if mask is None else pc.and_(mask, m)
    if mask is not None:
        t = t.filter(mask)
    return t.select(cols)


def _part_version(part_schema: pa.Schema) -> int | None:
    meta = part_schema.metadata or {}
    v = meta.get(b"quantbench.schema_version")
    try:
        return int(v) if v is not None else None
    except ValueError:
        return None


def _read_part(name: str, f: Path, read_cols: list[str], filter) -> pa.Table:
    """One part; a part of an older schema version is upgraded as it is read.

    Version 1 parts lack run_id and created_at (read as null) and the typed columns, which
    are computed from the JSON columns they mirror. A part of a newer version is refused.
    """
    ps = _part_schema(f)
    version = _part_version(ps)
    if version is not None and version > SCHEMA_VERSION:
        raise UserError(f"{f}: {name} table of schema version {version}, newer than this quantbench's "
                        f"{SCHEMA_VERSION}; upgrade quantbench to read it")
    missing = [c for c in read_cols if c not in ps.names]
    if not missing:
        return _read_table(f, read_cols, filter)
    unfillable = {c for c in missing if not _is_filled(name, c)}
    if unfillable:
        raise UserError(f"{f}: {name} table of schema version {version or 'unknown'} lacks column(s) "
                        f"{', '.join(sorted(unfillable))} of schema version {SCHEMA_VERSION}; "
                        "rewrite it with this quantbench (rerun the command that made it)")
    sources = [c for cols, src, _ in DERIVED.get(name, []) if set(cols) & set(missing) for c in src]
    cols = list(dict.fromkeys([c for c in read_cols if c in ps.names] + [c for c in sources if c in ps.names]))
    t = _read_table(f, cols, filter)
    t = _complete(name, t)
    if "created_at" in missing:  # unknown for an old part: null, not "now"
        t = t.set_column(t.column_names.index("created_at"), "created_at", pa.nulls(t.num_rows, _TS.arrow))
    return t.select(read_cols)


def _read_table(f: Path, cols: list[str], filter) -> pa.Table:
    if isinstance(filter, dict):
        return _read_where(f, cols, filter)
    if filter is None:
        with pa.OSFile(str(f)) as fh:  # a native file: no filesystem resolution; the footer parsed once
            return pq.ParquetFile(fh, metadata=_part_footer(f)[0]).read(columns=cols)
    return pq.read_table(f, columns=cols, filters=filter)


#: Threads that read a table's parts (each part is decoded with the GIL released).
READ_THREADS = 4


#: Footer (metadata and schema) of each part read so far (part names are content hashes: a
#: name's bytes never change), so a footer is parsed once per process, not once per read.
_PART_FOOTERS: dict[str, tuple] = {}


def _part_footer(f: Path) -> tuple:
    """(FileMetaData, Arrow schema) of a part."""
    key = str(f)
    ft = _PART_FOOTERS.get(key)
    if ft is None:
        with pa.OSFile(key) as fh:
            meta = pq.read_metadata(fh)
        ft = _PART_FOOTERS[key] = (meta, meta.schema.to_arrow_schema())
    return ft


def _part_schema(f: Path) -> pa.Schema:
    return _part_footer(f)[1]


def _all_current(files: list[Path]) -> bool:
    """Whether every part is of this schema version (only then is one dataset read exact)."""
    for f in files:
        try:
            if _part_version(_part_schema(f)) != SCHEMA_VERSION:
                return False
        except Exception:
            return False
    return True


# --------------------------------------------------------------------------- compaction

#: Column order compacted parts are sorted by: the filters the readers use come first, so
#: each row group covers few hosts/variants and the statistics let a read skip the rest.
SORT_KEYS: dict[str, list[str]] = {
    "outputs": ["host", "fingerprint_id", "session_key", "variant_id", "fixture_id", "output_name", "run_key"],
    "decisions": ["equiv_id", "host", "variant_id", "fixture_id", "slot"],
    "flips": ["equiv_id", "comparison", "host", "variant_id", "fixture_id", "ref_slot", "slot"],
}
#: A part under this size is "small": compaction merges small parts only.
SMALL_PART_BYTES = 32 << 20
#: Compaction writes a new part per this many bytes of small parts (bounds its memory).
COMPACT_BATCH_BYTES = 256 << 20
#: Automatic compaction starts when a table has more small parts than this.
AUTO_COMPACT_PARTS = 64
#: Rows per row group in a compacted part (tensor tables: a few MB each).
ROW_GROUP_ROWS = {"outputs": 2048, "fixtures": 64}


def compact(name: str, root: str | os.PathLike = TABLES_DIR, min_parts: int = 2,
            small_bytes: int = SMALL_PART_BYTES) -> dict:
    """Merge the table's small parts into sorted, statistics-bearing parts; returns what it did.

    Rows and keys are exactly what `read` returned before (duplicates across parts
    are dropped the same way: the first in name order). Each new part is written
    atomically and named by its content hash before any old part is removed, so a
    crash leaves duplicates that readers drop, never a lost row; a reader that finds
    a part gone restarts (see read). The ledger follows the rows to their new part.
    """
    files = [p for p in parts(name, root) if _size(p) < small_bytes]
    if len(files) < max(2, min_parts):
        return {"table": name, "parts_in": 0, "parts_out": 0, "rows": 0}
    batches, cur, size = [], [], 0
    for p in files:
        cur.append(p)
        size += _size(p)
        if size >= COMPACT_BATCH_BYTES:
            batches.append(cur)
            cur, size = [], 0
    if cur:
        batches.append(cur)
    out, rows, merged = [], 0, 0
    for batch in batches:
        if len(batch) < 2:
            continue
        try:
            table = _read(name, batch, None, None)
        except FileNotFoundError:  # another compaction got there first
            continue
        sort = SORT_KEYS.get(name, KEYS[name])
        table = table.sort_by([(k, "ascending") for k in sort])
        data = _serialize([to_arrow(name, table)], row_group_rows=ROW_GROUP_ROWS.get(name, 8192))
        path = Path(root) / name / f"part-{sha256_bytes(data)[:32]}.parquet"
        if not path.exists():
            with atomic_path(path) as tmp:
                tmp.write_bytes(data)
        _ledger_move(name, root, {p.name for p in batch if p != path}, path.name)
        for p in batch:
            if p != path:
                try:
                    p.unlink()
                except FileNotFoundError:
                    pass
        out.append(path)
        rows += table.num_rows
        merged += len(batch)
    return {"table": name, "parts_in": merged, "parts_out": len(out), "rows": rows}


def maybe_compact(name: str, root: str | os.PathLike = TABLES_DIR, threshold: int | None = None) -> dict | None:
    """compact() when the table holds more small parts than the threshold (AUTO_COMPACT_PARTS,
    or QUANTBENCH_COMPACT_PARTS; 0 turns automatic compaction off)."""
    if threshold is None:
        threshold = int(os.environ.get("QUANTBENCH_COMPACT_PARTS", AUTO_COMPACT_PARTS))
    if threshold <= 0:
        return None
    files = parts(name, root)
    if len(files) <= threshold or sum(1 for p in files if _size(p) < SMALL_PART_BYTES) <= threshold:
        return None
    return compact(name, root)


def _size(p: Path) -> int:
    try:
        return p.stat().st_size
    except OSError:
        return 0


def _ledger_move(name: str, root, old: set, new: str) -> None:
    d = _ledger_dir(name, root)
    if not old or not d.is_dir():
        return
    for entry in d.iterdir():
        if entry.name.startswith("."):
            continue
        try:
            if entry.read_text().strip() in old:
                _ledger_put(name, root, entry.name, new)
        except OSError:
            pass


def _type_text(t: pa.DataType) -> str:
    """`list<int64>` rather than Arrow's `list<item: int64>` (Parquet names the child `element`)."""
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return f"list<{_type_text(t.value_type)}>"
    if pa.types.is_struct(t):
        return "struct<" + ", ".join(f"{t.field(i).name}: {_type_text(t.field(i).type)}" for i in range(t.num_fields)) + ">"
    return str(t)


def markdown() -> str:
    """The schema section of docs/schema.md."""
    out = [f"Schema version {SCHEMA_VERSION}. Each table is `results/tables/<table>/part-*.parquet`.", ""]
    for name, cols in COLUMNS.items():
        out.append(f"### `{name}` (key: {', '.join(KEYS[name])})")
        out.append("")
        out.append("| column | type | meaning |")
        out.append("|---|---|---|")
        for c, t, meaning in cols:
            out.append(f"| `{c}` | `{_type_text(t.arrow)}` | {meaning} |")
        out.append("")
    return "\n".join(out)


if __name__ == "__main__":
    print(markdown())
