"""The decode block of existing variants changed without re-quantizing.

A variant's bytes depend on the model, its preprocessing and the calibration options, never on
how its outputs are decoded, so a new decode block (a new kind, a plug-in, box_frame, a
threshold, classes) is written into the variants' recipes (their recorded sidecar, and the
decode plug-in's SHA-256) and nothing is calibrated or quantized again. Every check comes before
any write: the variants folder exists and holds variants of this very model file (its SHA-256),
the sidecar's input block makes the preprocessing they were calibrated with, and the decode
block fits the variants' outputs. The folder is rewritten as calibrate writes it: completely in
a staging folder, then moved into place.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from quantbench.inputs import sidecarfile
from quantbench.analysis.decode import check_outputs, is_plugin, spec_from_sidecar
from quantbench.store.resultpaths import VARIANTS_DIR
from quantbench.errors import UserError, flag_mark
from quantbench.fsutil import atomic_write_json, canonical_json
from quantbench.inputs.modelio import graph_inputs, load_model, raw_sha256
from quantbench.inputs.variantdir import INDEX_FILE, load_variants, publish_folder, staging_folder


@dataclass
class DecodeChange:
    out: Path
    state: str            # publish_folder's "unchanged" | "replaced"
    variants: list        # the variants' names
    before: str           # the decode kind recorded before
    after: str            # the decode kind recorded now


def _kind(sidecar: dict | None) -> str:
    block = (sidecar or {}).get("decode") or {}
    return str(block.get("kind") or "none")


def _preprocess_differs(spec: dict, variant) -> list[str]:
    """The keys in which `spec` differs from the preprocessing `variant` was calibrated with."""
    old = (variant.recipe or {}).get("preprocess") or {}
    if canonical_json(spec) == canonical_json(old):
        return []
    return sorted(k for k in set(spec) | set(old) if spec.get(k) != old.get(k))


def check_variants(out: Path, model_path: Path) -> list:
    """The variants in `out`, each made from the file at `model_path` (its SHA-256), else a UserError."""
    if not (out / INDEX_FILE).is_file():
        raise UserError(f"{out}: holds no variants (no {INDEX_FILE}); calibrate {model_path} first")
    variants = load_variants(out)
    sha = raw_sha256(model_path)
    other = [v.name for v in variants if ((v.recipe or {}).get("source_model") or {}).get("raw_sha256") != sha]
    if other:
        raise UserError(f"{out}: variant(s) {', '.join(other)} were not made from {model_path} (its SHA-256 "
                        f"{sha[:12]} is not the one their recipes record); name the model they were calibrated from")
    return variants


def new_sidecar(model_path: Path, variants: list, sidecar_file=None, decode: str | None = None) -> tuple:
    """(the sidecar with the new decode block, the decode plug-in record or None), checked against the variants:
    the same preprocessing, a decode block that fits their outputs."""
    sidecar, where = sidecarfile.calibration_sidecar(model_path, sidecar_file, decode)
    model = load_model(model_path, check=False)
    (name, dims), = graph_inputs(model).items()
    spec = sidecarfile.derive_spec(sidecar, dims, name, where, f"{where}: input 'plugin'", where, override=True)
    for v in variants:
        differ = _preprocess_differs(spec, v)
        if differ:
            raise UserError(f"{where}: its input block makes other tensors than variant {v.name} was calibrated with "
                            f"({', '.join(differ)} differ): only the decode block can change without calibrating "
                            f"again; keep the input block, or recalibrate with {flag_mark('force')}")
    record = None
    if sidecar and sidecar.get("decode"):
        decoder = check_outputs(spec_from_sidecar(sidecar, source=where), [o.name for o in model.graph.output])
        if is_plugin(decoder.kind):
            record = sidecarfile.plugin_records(decode_plugin=decoder.kind)["decode_plugin"]
    return sidecar, record


def set_decode(model_path: str | os.PathLike, sidecar_file=None, decode: str | None = None, out=None,
               variants_dir=None) -> DecodeChange:
    """Record the decode block of `sidecar_file` (else the sidecar beside the model), with `decode` as its kind when
    given, in every variant of the model at `model_path` in `out` (default: <variants_dir>/<model name>), without
    re-quantizing."""
    model_path = Path(model_path)
    out = Path(out) if out else Path(variants_dir or VARIANTS_DIR) / model_path.stem
    variants = check_variants(out, model_path)
    sidecar, record = new_sidecar(model_path, variants, sidecar_file, decode)
    before = _kind((variants[0].recipe or {}).get("sidecar"))
    with staging_folder(out) as stage:
        for f in sorted(out.iterdir()):
            if f.is_file():
                shutil.copy2(f, stage / f.name)
        for v in variants:
            rec = {k: val for k, val in v.recipe.items() if k != "decode_plugin"}
            rec["sidecar"] = sidecarfile.plain_sidecar(sidecar)
            if record is not None:
                rec["decode_plugin"] = record
            atomic_write_json(stage / v.recipe_path.name, rec)
        state = publish_folder(stage, out, force=True, what="variants")
    return DecodeChange(out=out, state=state, variants=[v.name for v in variants], before=before,
                        after=_kind(sidecar))


def only_decode_differs(out: Path, model_path: Path, spec: dict, sidecar: dict | None) -> str | None:
    """Before calibrate does any work: when `out` holds variants of this model file calibrated with this
    preprocessing and another decode block, the words for what differs (calibrate would make the same bytes and
    then refuse to replace the folder); else None."""
    if not (out / INDEX_FILE).is_file():
        return None
    try:
        variants = check_variants(out, model_path)
    except UserError:
        return None
    if any(_preprocess_differs(spec, v) for v in variants):
        return None
    old = (variants[0].recipe or {}).get("sidecar") or {}
    new = sidecarfile.plain_sidecar(sidecar)
    if canonical_json({k: v for k, v in old.items() if k != "decode"}) != \
            canonical_json({k: v for k, v in new.items() if k != "decode"}):
        return None
    if canonical_json(old.get("decode")) == canonical_json(new.get("decode")):
        return None
    return f"decode {_kind(old)} -> {_kind(new)}"
