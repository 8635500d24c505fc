"""The result tables' schema: one version, each table's columns (name, Arrow type, meaning) and key.

The column lists below are the schema docs/schema.md documents
(``python -m quantbench.store.tableschema`` prints the Markdown); a test checks that
docs/schema.md and this module agree. Tables of later pipeline stages (classes, decisions,
flips, ...) are declared here too, so this module stays the one place the schema lives.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from quantbench import SCHEMA_VERSION
from quantbench.store import lazy

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
STRING = ArrowType(lambda: pa.string())

_I = ArrowType(lambda: pa.int64())

_F = ArrowType(lambda: pa.float64())

_B = ArrowType(lambda: pa.bool_())

_BIN = ArrowType(lambda: pa.large_binary())

TIMESTAMP = ArrowType(lambda: pa.timestamp("us", tz="UTC"))

_OBJ = ArrowType(lambda: pa.list_(pa.struct([("category_id", _I.arrow), ("bbox", pa.list_(_F.arrow))])))


# every table ends with these two (created_at never enters a part name or any id: see append_chunks)
_CREATED = ("created_at", TIMESTAMP, "when the row was first written (UTC); not part of any hash or key")

_RUN = ("run_id", STRING, "the `run`/`equiv` invocation that first wrote the row: SHA-256 of its hosts, variants, "
        "fixtures and session (null: written outside one, or by schema version 1)")


COLUMNS: dict[str, list[tuple[str, ArrowType, str]]] = {
    "fixtures": [
        ("fixture_id", STRING, "SHA-256 of the canonical encoding of the input tensor (see docs/schema.md: tensor hash)"),
        ("input_name", STRING, "model input the tensor feeds"),
        ("dtype", STRING, "numpy dtype string of the input tensor, little-endian (e.g. <f4)"),
        ("shape", _list(_I), "input tensor shape"),
        ("source", STRING, "source image path, relative to the corpus or images folder"),
        ("image_sha256", STRING, "SHA-256 of the source image file bytes"),
        ("labels", STRING, "ground-truth labels as JSON (COCO annotations of the image)"),
        ("objects", _OBJ, "the labels, typed: one {category_id, bbox [x, y, w, h] pixels (null: no box)} per annotation"),
        ("stratum", STRING, "the image's stratum: empty, objects, or its one label (classifier labels)"),
        ("split", STRING, "corpus split: train, val or eval"),
        ("preprocess", STRING, "preprocessing recipe as canonical JSON"),
        ("preprocess_id", STRING, "SHA-256 of the preprocess JSON: tells fixtures of one image under two recipes apart"),
        ("geometry", STRING, "JSON: where the image went in the input (image_size, input_size, resized, offset [top, "
                             "left], scale, resize, transpose_hw; preprocess.Geometry); null: unknown (a "
                             "preprocessing plug-in, or written before it was recorded)"),
        ("tensor", _BIN, "raw C-order little-endian bytes of the input tensor"),
    ],
    "models": [
        ("variant_id", STRING, "the variant's identity: its semantic hash, or with a session requirement the SHA-256 "
                               "of (semantic hash, the requirement's entries)"),
        ("semantic_sha256", STRING, "semantic hash: SHA-256 of the ONNX with node doc_strings removed"),
        ("raw_sha256", STRING, "SHA-256 of the ONNX file bytes"),
        ("model", STRING, "source model name (e.g. litter-detr-tiny)"),
        ("variant", STRING, "variant name: fp32, dynamic, static-minmax, static-percentile, static-entropy, ..."),
        ("path", STRING, "where the variant's ONNX was written"),
        ("recipe", STRING, "the variant's recipe as canonical JSON"),
        ("method", STRING, "recipe: fp32, dynamic, minmax, percentile, entropy, ..."),
        ("activation_type", STRING, "recipe: activation integer type (static; null otherwise)"),
        ("weight_type", STRING, "recipe: weight integer type (null for fp32)"),
        ("per_channel", _B, "recipe: per-channel weight scales"),
        ("reduce_range", _B, "recipe: 7-bit weights"),
        ("percentile", _F, "recipe: Percentile calibration's percentile (null: other methods)"),
        ("entropy_bins", _I, "recipe: Entropy calibration's histogram bins (null: other methods)"),
        ("calibration_set", STRING, "recipe: calibration set name (null: not calibrated)"),
    ],
    "hosts": [
        ("fingerprint_id", STRING, "SHA-256 of the canonical JSON fingerprint"),
        ("host", STRING, "host name as the user called it (x86, pi, pi4, ...)"),
        ("kind", STRING, "local, emulated, ssh or imported"),
        ("arch", STRING, "machine architecture (x86_64, aarch64)"),
        ("cpu", STRING, "CPU identity: x86 vendor/family/model name, ARM implementer/part/variant"),
        ("isa_flags", _list(STRING), "ISA feature flags relevant to kernel dispatch, sorted"),
        ("ort_version", STRING, "onnxruntime version on the host"),
        ("fingerprint", STRING, "the whole fingerprint as canonical JSON"),
        ("os", STRING, "fingerprint: operating system"),
        ("libc", STRING, "fingerprint: C library"),
        ("python_version", STRING, "fingerprint: Python version"),
        ("numpy_version", STRING, "fingerprint: numpy version"),
        ("resolved_providers", _list(STRING), "fingerprint: execution providers the probe session resolved"),
        ("does_not_start", STRING, "fingerprint: why the host's runtime cannot start on its CPU, e.g. 'onnxruntime "
         "1.21.0 does not start on Cortex-A72: SIGILL at import' (null: it started)"),
    ],
    "outputs": [
        ("run_key", STRING, "SHA-256 of (variant_id, fixture_id, fingerprint_id, session_key): the cache key"),
        ("host", STRING, "host name"),
        ("fingerprint_id", STRING, "fingerprint the row was produced under"),
        ("session_key", STRING, "SHA-256 of the canonical JSON session options"),
        ("session_options", STRING, "session options as canonical JSON (threads, optimisation level, config entries; "
                                     "`required_entries`: the config entries a variant's deployment requirement added "
                                     "to the host's session, absent when none)"),
        ("variant_id", STRING, "the model variant's identity (models.variant_id)"),
        ("variant", STRING, "variant name"),
        ("fixture_id", STRING, "fixture (input tensor hash)"),
        ("output_name", STRING, "model output name"),
        ("dtype", STRING, "numpy dtype string, little-endian"),
        ("shape", _list(_I), "output tensor shape"),
        ("sha256", STRING, "SHA-256 of the canonical encoding of the output tensor"),
        ("tensor", _BIN, "raw C-order little-endian bytes of the output tensor"),
        ("providers", _list(STRING), "execution providers that ran at least one node (read from the run's profile)"),
        ("placement", STRING, "which provider ran the nodes, from the run's profile: canonical JSON {provider: {op type: nodes}}"),
        ("inherited", STRING, "confirmed by equiv (its confirm K): the host whose measured row this is (the host was predicted to share "
                              "its class and byte-identical on every confirming fixture); null: measured on this host"),
    ],
    "calib_manifest": [
        ("path", STRING, "image path relative to the images folder named in the set's recipe.json (calib_sets/<name>/manifest.parquet, not under results/tables)"),
        ("sha256", STRING, "SHA-256 of the image file bytes"),
        ("split", STRING, "corpus split of the image (never eval)"),
        ("objects", _I, "number of labelled objects (0: an empty image)"),
        ("density", STRING, "stratum: empty, objects (objects-<a>-<b> with --count-bins), or the image's label (--strata label)"),
        ("luminance", _F, "measured mean Rec. 709 luma 0.2126 R + 0.7152 G + 0.0722 B of the decoded RGB, 0..255"),
        ("lighting", STRING, "dark (below the median luminance of its stratum) or bright (at or above)"),
        ("cell", STRING, "stratum cell <stratum>/<lighting>"),
        ("seed", _I, "selection seed"),
        ("status", STRING, "selected, or skipped (unreadable image, --skip-bad)"),
        ("note", STRING, "why an image was skipped"),
        ("cell_wanted", _I, "images asked per cell (--per-cell)"),
        ("cell_available", _I, "candidates the cell had (fewer than cell_wanted: a recorded shortfall, --allow-short)"),
    ],
    "classes": [
        ("equiv_id", STRING, "SHA-256 of the equiv settings and of each host's (fingerprint, session): one analysis"),
        ("variant_id", STRING, "the model variant's identity (models.variant_id)"),
        ("variant", STRING, "variant name"),
        ("model", STRING, "source model name"),
        ("class_label", STRING, "equivalence class (A, B, ...; A holds the first host named)"),
        ("hosts", _list(STRING), "hosts whose output hashes are identical over every fixture"),
        ("fingerprint_ids", _list(STRING), "fingerprint of each host, in the same order"),
        ("digest", STRING, "SHA-256 over the class's sorted (fixture, output, sha256) lines"),
        ("fixtures", _I, "fixtures compared"),
        ("reference", _B, "the class holds the reference host"),
        ("separating_features", _list(STRING), "smallest fingerprint feature set telling this variant's classes apart, "
                                           "preferring the ISA flags onnxruntime's kernel dispatch reads, in MLAS's "
                                           "order (isa:avx512f, isa:avx512_vnni, isa:i8mm, ...; null: none found)"),
        ("agreement", STRING, "JSON: per host pair, fixtures on which every output hash agrees"),
        ("distance", STRING, "JSON: per output, |delta| max/mean and remaining precision bits against the reference class"),
        ("provider_findings", _list(STRING), "flagged: a host of the class whose requested execution provider was not available or ran no node (HOST: requested ...)"),
        ("placements", STRING, "JSON: per host, which provider ran how many nodes of each op type (from the run's profile)"),
        ("settings", STRING, "the equiv settings as canonical JSON (hosts, reference, variants, fixtures, decode, gates)"),
        ("inherited_hosts", _list(STRING), "confirmed by equiv (its confirm K): hosts of the class that ran only the confirming "
                                           "fixtures and inherited the others' rows (outputs.inherited); null: none"),
    ],
    "decisions": [
        ("equiv_id", STRING, "the analysis (see classes)"),
        ("host", STRING, "host name"),
        ("fingerprint_id", STRING, "fingerprint the outputs were produced under"),
        ("variant_id", STRING, "the model variant's identity (models.variant_id)"),
        ("variant", STRING, "variant name"),
        ("fixture_id", STRING, "fixture (input tensor hash)"),
        ("source", STRING, "source image of the fixture"),
        ("slot", _I, "decision slot: detector query, classifier 0, map region or NMS'd detection index"),
        ("class_id", _I, "decoded class (-1: none)"),
        ("class_name", STRING, "class name from the sidecar (ctc: the decoded string)"),
        ("score", _F, "score the threshold applies to (sigmoid, softmax or map value), float64"),
        ("kept", _B, "served: score >= threshold (and within top-k)"),
        ("margin", _F, "signed distance to the decision boundary (score - threshold; classifier without threshold: top-1 minus top-2)"),
        ("box", _list(_F), "the decision's box or region as decoded, xyxy (null: the decoder has no boxes)"),
        ("flip_own_fp32", STRING, "flip kind against fp32 on the same host: threshold, class, box-shift, text, or empty"),
        ("flip_ref_fp32", STRING, "flip kind against fp32 on the reference host, or empty"),
    ],
    "flips": [
        ("equiv_id", STRING, "the analysis (see classes)"),
        ("comparison", STRING, "own-fp32 (vs fp32 on the same host), ref-fp32 (vs fp32 on the reference host), ref-same (vs this variant on the reference host)"),
        ("host", STRING, "candidate host"),
        ("variant_id", STRING, "candidate variant"),
        ("variant", STRING, "candidate variant name"),
        ("ref_host", STRING, "reference host"),
        ("ref_variant", STRING, "reference variant name"),
        ("fixture_id", STRING, "fixture (input tensor hash)"),
        ("source", STRING, "source image of the fixture"),
        ("ref_slot", _I, "reference slot (-1: served by the candidate only)"),
        ("slot", _I, "candidate slot (-1: served by the reference only)"),
        ("kind", STRING, "threshold (kept on one side only), class (kept on both, other class), box-shift (IoU < 0.9), "
                     "text (ctc: the decoded string changed)"),
        ("ref_class", STRING, "reference class name (ctc: the reference's decoded string)"),
        ("class_name", STRING, "candidate class name (ctc: the candidate's decoded string)"),
        ("ref_score", _F, "reference score (NaN: no such decision)"),
        ("score", _F, "candidate score"),
        ("iou", _F, "IoU of the two boxes or regions (NaN: not applicable)"),
        ("threshold", _F, "decision threshold (null: classifier top-1 without one)"),
        ("margin", _F, "the reference (fp32) score's signed distance to the threshold"),
        ("band", STRING, "|margin| band, e.g. [0.01,0.02)"),
    ],
    # explain (localize, evidence, lint, remedies, noise, latency)
    "localize": [
        ("localize_id", STRING, "SHA-256 of (variant, fixture, both hosts' fingerprints and sessions, localisation level)"),
        ("variant_id", STRING, "the model variant's identity (models.variant_id)"),
        ("variant", STRING, "variant name"),
        ("fixture_id", STRING, "fixture the localisation ran on"),
        ("host_a", STRING, "first host (as named, with its session overrides)"),
        ("host_b", STRING, "second host"),
        ("fingerprint_a", STRING, "fingerprint of host_a"),
        ("fingerprint_b", STRING, "fingerprint of host_b"),
        ("opt_level", STRING, "graph optimisation level the localisation ran at"),
        ("group_size", _I, "intermediates exposed per run (memory bound: K tensors + outputs + arena)"),
        ("position", _I, "topological position of the producing node"),
        ("node", STRING, "producing node name"),
        ("op_type", STRING, "producing node op type"),
        ("tensor", STRING, "tensor name"),
        ("observable", _B, "false when exposing this tensor changes the final outputs (fusion broken): not compared"),
        ("sha_a", STRING, "SHA-256 of the tensor on host_a (canonical encoding)"),
        ("sha_b", STRING, "SHA-256 of the tensor on host_b"),
        ("same", _B, "byte-identical on both hosts"),
        ("first_divergent", _B, "one of the first divergent node's outputs"),
        ("is_output", _B, "a model output"),
        ("bits_mean", _F, "remaining precision bits, mean (first divergent tensors and outputs only; float32)"),
        ("bits_min", _F, "remaining precision bits, minimum"),
        ("max_abs", _F, "max |a - b| (first divergent tensors and outputs only)"),
    ],
    "evidence": [
        ("evidence_id", STRING, "SHA-256 of (host fingerprint, variant, fixtures, qemu CPU)"),
        ("host", STRING, "emulated host name"),
        ("fingerprint_id", STRING, "fingerprint of the host the log was taken on"),
        ("qemu_cpu", STRING, "qemu CPU model"),
        ("variant_id", STRING, "the identity of the model variant run (models.variant_id)"),
        ("variant", STRING, "variant name"),
        ("arch", STRING, "aarch64 or x86_64"),
        ("family", STRING, "instruction family (e.g. UDOT/SDOT (by element), SMULL/SMLAL, VPMADDUBSW)"),
        ("kind", STRING, "int8-dot, int8-matmul, int8-widening, int8-saturating-pair, int16-pair, fp32-fma, sve (any SVE instruction)"),
        ("sites", _I, "distinct instruction addresses of the family inside onnxruntime's code"),
        ("translations", _I, "times qemu translated one of them (-d in_asm lines; not executions)"),
        ("from_bytes", _I, "of those, lines the disassembler printed as .byte/.inst, decoded from the word"),
    ],
    "lint": [
        ("variant_id", STRING, "semantic hash of the linted model"),
        ("model", STRING, "model path as given"),
        ("node", STRING, "GEMM-like node the weights feed"),
        ("op_type", STRING, "Conv, MatMul, Gemm (QDQ) or QLinearConv, QLinearMatMul, MatMulInteger, ConvInteger"),
        ("weight", STRING, "int8 weight initializer"),
        ("shape", _list(_I), "weight shape"),
        ("act_type", STRING, "activation integer type (uint8, int8, unknown)"),
        ("weight_type", STRING, "weight integer type"),
        ("k", _I, "reduction length per output"),
        ("pairs", _I, "adjacent K pairs (2i, 2i+1) over all outputs"),
        ("x86_saturating_pairs", _I, "pairs whose vpmaddubsw int16 sum can saturate (same sign, 255*(|wi|+|wj|) > 32767)"),
        ("neon_wrapping_pairs", _I, "pairs of -128 weights whose smull/smlal int16 sum can wrap (S8 activations)"),
        ("int32_ok", _B, "K*255*128 < 2^31"),
        ("tiers", _list(STRING), "int8 paths that can diverge: x86-vpmaddubsw (AVX2, AVX-512BW without VNNI), arm-neon, all"),
        ("reason", STRING, "why"),
    ],
    "remedies": [
        ("remedy_id", STRING, "SHA-256 of (base variant, remedy, hosts, fixtures)"),
        ("base_variant_id", STRING, "the variant whose hosts split"),
        ("remedy", STRING, "baseline, reduce_range, x64quantprecision, s8s8, u8u8"),
        ("variant_id", STRING, "variant the remedy ran (the base one for session remedies)"),
        ("session_options", STRING, "session options as canonical JSON"),
        ("hosts", _list(STRING), "hosts compared"),
        ("supported", _B, "false when the remedy could not be built or run (see note)"),
        ("classes", _I, "number of equivalence classes over the hosts"),
        ("one_class", _B, "all hosts byte-identical"),
        ("class_map", STRING, "host -> class label as canonical JSON"),
        ("flips_total", _I, "decision flips against fp32 on the same host, summed over hosts"),
        ("flips_max", _I, "decision flips against fp32, worst host"),
        ("fixtures", _I, "fixtures compared"),
        ("note", STRING, "why unsupported, or what the remedy changes"),
    ],
    "noise": [
        ("host", STRING, "host name"),
        ("fingerprint_id", STRING, "host fingerprint"),
        ("variant_id", STRING, "semantic hash of the variant"),
        ("variant", STRING, "variant name"),
        ("factor", STRING, "repeat, threads, batch, opt_level"),
        ("setting_a", STRING, "baseline setting (e.g. threads=1)"),
        ("setting_b", STRING, "compared setting (e.g. threads=2)"),
        ("fixtures", _I, "fixtures compared"),
        ("same_bytes", _B, "every output byte-identical under both settings (null: not measurable, see note)"),
        ("differing_fixtures", _I, "fixtures whose outputs differ"),
        ("flips", _I, "decision flips between the two settings"),
        ("harness_fault", _B, "repeat row only: repeated runs of one session differ"),
        ("note", STRING, "e.g. fixed batch axis"),
    ],
    "latency": [
        ("host", STRING, "host name (local or ssh only)"),
        ("fingerprint_id", STRING, "host fingerprint"),
        ("variant_id", STRING, "semantic hash of the variant"),
        ("variant", STRING, "variant name"),
        ("session_options", STRING, "session options as canonical JSON"),
        ("warmup", _I, "untimed warm-up runs"),
        ("runs", _I, "timed runs per repeat"),
        ("repeats", _I, "repeats (each gives one median)"),
        ("median_ms", _F, "median of the repeat medians, milliseconds per inference"),
        ("spread_ms", _F, "max - min of the repeat medians"),
        ("peak_rss_mb", _F, "peak resident set size of the measuring process, MiB"),
        ("speedup_vs_fp32", _F, "fp32 median / this median on the same host (>1 faster, <1 slower)"),
        ("sign", STRING, "faster, slower or same against fp32 (same: within the spreads)"),
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
