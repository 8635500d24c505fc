"""A model's recipe, one owner: its sidecar read and validated once, the input spec derived, the plug-ins attached.

Every command gets a sidecar and an input spec here: `calibrate` (calibration_sidecar,
derive_spec, plugin_records) and every later command (sidecar_for, input_spec_for, and an
explicit ``--sidecar FILE`` read once per command by load_sidecar_file). Only this module
reads sidecar files; their "input" block is checked (preprocess.check_input_block) once
when read, and a derived spec only for what the sidecar did not state (derive_spec).

A sidecar (docs/your-model.md) is the JSON beside a model (``x.onnx`` -> ``x.json``):
classes, input, decode, ... A decode block's ``"alphabet": "FILE"`` is read into the
characters it holds. A variant's recipe (written by calibrate) records the sidecar, the
preprocessing spec, the labels and the plug-ins that ran with their SHA-256
(``preprocess_plugin``, ``decode_plugin``): those may run again unasked while unchanged
(allow_recorded); a plug-in only a file names runs only when allowed (plugins.require).
"""

from __future__ import annotations

import os
from pathlib import Path

from quantbench.errors import UserError, flag_mark
from quantbench.fsutil import MAX_JSON_BYTES, canonical_json, read_json, read_user_bytes, sha256_bytes
from quantbench.inputs.configkeys import check_entries
from quantbench.inputs.modelio import ModelFacts, model_facts
from quantbench.inputs.plugins import allow, is_ref, plugin_identity, require, same_ref
from quantbench.inputs.preprocess import check_input_block, input_spec

#: the top-level keys of a sidecar (docs/your-model.md); anything else is a typo, refused
SIDECAR_KEYS = ("name", "classes", "input", "decode", "label", "label_mode", "metrics", "score_calibration", "training")
#: the recipe keys recording the plug-ins calibrate ran: {"ref", "sha256"}
PLUGIN_RECORDS = ("preprocess_plugin", "decode_plugin")
#: the recipe key of a variant's deployment requirement: {onnxruntime session config key: value} a host must set
#: to get the variant's recorded results (every run of the variant applies it: hosts/requirements.py)
REQUIREMENTS = "session_requirements"


# ---- reading a sidecar (the one reader) ---------------------------------------------------

class CheckedInput(dict):
    """A sidecar's "input" block as read_sidecar checked it (preprocess.check_input_block): derive_spec does not
    check it again. Any copy (dict(...), a recipe file read back) is a plain dict, so it is checked where used."""

def sidecar_path(model_path: str | os.PathLike) -> Path:
    """The sidecar JSON beside a model: `x.onnx` -> `x.json`."""
    p = Path(model_path)
    return p.with_suffix(".json")


def read_sidecar(p: Path, required: bool = False) -> dict | None:
    """A sidecar JSON object read from `p` and validated; None when absent (unless `required`)."""
    if not p.exists():
        if required:
            raise UserError(f"{p}: sidecar file not found")
        return None

    data = read_json(p, "sidecar JSON")
    if not isinstance(data, dict):
        raise UserError(f"{p}: sidecar must be a JSON object like {{\"input\": {{...}}, \"decode\": {{...}}}}, "
                        f"not a {type(data).__name__}")
    unknown = [k for k in data if k not in SIDECAR_KEYS]
    if unknown:
        raise UserError(f"{p}: unknown key {unknown[0]!r}; a sidecar takes {', '.join(map(repr, SIDECAR_KEYS))}")
    if "classes" in data:
        _check_classes(data["classes"], p)
    if data.get("input") is not None:
        data = {**data, "input": CheckedInput(check_input_block(data["input"], p))}
    return _inline_alphabet(data, p)


def _check_classes(classes, p: Path) -> None:
    """A sidecar's "classes": a non-empty list of distinct names, one per class index (a repeat makes two classes
    one name in every flip; an empty list names none)."""
    if not isinstance(classes, list) or not classes:
        raise UserError(f"{p}: 'classes' must be a non-empty list of class names, one per class index "
                        f"(got {classes!r:.40}); leave the key out when the model has none")
    seen: dict = {}
    for i, c in enumerate(classes):
        if isinstance(c, bool) or not isinstance(c, (str, int)) or c == "":
            raise UserError(f"{p}: 'classes' entry {i} must be a non-empty name (got {c!r:.40})")
        if seen.setdefault(c, i) != i:
            raise UserError(f"{p}: 'classes' names {c!r} twice (entries {seen[c]} and {i}); each class index "
                            "needs its own name")


def plain_sidecar(sidecar: dict | None) -> dict:
    """A sidecar as plain data, as one read back from JSON is: its checked input block (CheckedInput) a dict
    again. For what keeps a sidecar as data (an analysis result, which its cache stores only when JSON gives it
    back the same)."""
    out = dict(sidecar or {})
    if isinstance(out.get("input"), CheckedInput):
        out["input"] = dict(out["input"])
    return out


def _inline_alphabet(data: dict, p: Path) -> dict:
    """A decode block's "alphabet": "FILE" (a ctc alphabet, one character per line, in the sidecar's folder) read
    into the list it holds, with "alphabet_file": {"file", "sha256"}: the recipe then carries the characters."""
    block = data.get("decode")
    name = block.get("alphabet") if isinstance(block, dict) else None
    if not isinstance(name, str):
        return data
    if not name or "/" in name or "\\" in name or name.startswith("."):
        raise UserError(f"{p}: decode 'alphabet' {name!r}: name a file in the sidecar's folder (no folders, no "
                        "leading '.'), or list the characters")
    path = p.parent / name
    try:
        raw = read_user_bytes(path, "alphabet file", MAX_JSON_BYTES)
        text = raw.decode("utf-8")
    except OSError as exc:
        raise UserError(f"{path}: alphabet file not readable ({exc.strerror or exc})") from None
    except UnicodeDecodeError:
        raise UserError(f"{path}: alphabet file is not UTF-8 text") from None
    lines = text.split("\n")   # newlines only: an alphabet may hold any other character
    if lines[-1] == "":
        lines.pop()
    chars = [c[:-1] if c.endswith("\r") else c for c in lines]
    empty = [i + 1 for i, c in enumerate(chars) if not c]
    if not chars or empty:
        raise UserError(f"{path}: alphabet file needs one character per line"
                        + (f"; line {empty[0]} is empty" if empty else "; it is empty"))
    decode = {**block, "alphabet": chars,
              "alphabet_file": {"file": name, "sha256": sha256_bytes(raw)}}
    return {**data, "decode": decode}


def load_sidecar(model_path: str | os.PathLike) -> dict | None:
    """The model's sidecar (classes, input size, normalisation, decode) beside it, or None.

    A sidecar that is not a JSON object, or whose 'input' block is malformed (see
    quantbench.inputs.preprocess.check_input_block), is a UserError naming it.
    """
    return read_sidecar(sidecar_path(model_path))


def load_sidecar_file(path: str | os.PathLike) -> dict:
    """An explicit sidecar file (must exist and be a JSON object); a command reads it once."""
    return read_sidecar(Path(path), required=True)


# ---- the recipe calibrate makes ------------------------------------------------------------

def with_decode(sidecar: dict | None, kind: str | None) -> dict | None:
    """The sidecar with `kind` as its decoder (its decode block kept when it is for that kind)."""
    if kind is None:
        return sidecar
    if kind and is_ref(kind):
        allow(kind)   # the caller named it
    block = dict((sidecar or {}).get("decode") or {})
    own = block.get("kind") == kind or same_ref(block.get("kind"), kind)   # "./dec.py:fn" is the block of dec.py:fn
    return {**(sidecar or {}), "decode": {**block, "kind": kind} if own else {"kind": kind}}


def calibration_sidecar(model_path: Path, sidecar_file=None, decode: str | None = None) -> tuple[dict | None, str]:
    """(the sidecar a model is calibrated with, where it was read): `sidecar_file`, else the one beside the model;
    `decode` (a kind or plug-in the caller named) as its decoder."""
    sidecar = load_sidecar_file(sidecar_file) if sidecar_file else load_sidecar(model_path)
    return with_decode(sidecar, decode), str(sidecar_file or sidecar_path(model_path))


def derive_spec(sidecar: dict | None, dims, name: str, source, asked_by: str, check_source,
                plugin: str | None = None, override: bool = False) -> dict:
    """The preprocessing spec the sidecar makes for a model input (`name`, `dims`), checked once.

    `plugin`: a preprocessing plug-in the caller named (allowed, it replaces the sidecar's); a plug-in
    only the sidecar names must be allowed (plugins.require: `asked_by` names the file and key). `source` names
    the model or file in input_spec's errors, `check_source` in check_input_block's. A block read_sidecar
    checked that states the shape is not checked again (the defaults input_spec adds are valid); what the
    sidecar left to the model (its shape: channels, size cap) or to the caller (`plugin`) is checked here.
    `override`: the sidecar's shape may override the model's declared dims (calibrate, see shape_override).
    """
    block = (sidecar or {}).get("input")
    spec = input_spec(sidecar, dims, name, source=source, override=override)
    if plugin:
        allow(plugin)   # the caller named it
        spec["plugin"] = plugin
    elif spec.get("plugin"):
        require(spec["plugin"], asked_by)
    if plugin or not (isinstance(block, CheckedInput) and "shape" in block):
        check_input_block(spec, check_source)  # channels, size cap: before allocating
    return spec


def plugin_records(spec: dict | None = None, decode_plugin: str | None = None) -> dict:
    """{"preprocess_plugin"/"decode_plugin": {"ref", "sha256"}} of the plug-ins a recipe runs: the preprocessing
    spec's, the decoder's (allow_recorded lets later commands run them again unasked while unchanged)."""
    plugin = (spec or {}).get("plugin")
    records = {"preprocess_plugin": plugin_identity(plugin, "preprocess")} if plugin else {}
    if decode_plugin:
        records["decode_plugin"] = plugin_identity(decode_plugin, "decode")
    return records


def allow_recorded(recipe: dict) -> None:
    """The plug-ins calibrate ran (the user allowed them there) may run again while their files are unchanged."""
    for key in PLUGIN_RECORDS:
        rec = recipe.get(key)
        if isinstance(rec, dict) and isinstance(rec.get("ref"), str) and isinstance(rec.get("sha256"), str):
            allow(rec["ref"], rec["sha256"])


def check_requirements(value, where: str) -> dict:
    """A session requirement as given (`where`: the recipe file or parameter that gave it): a dict of non-empty
    str keys to str values, each key one onnxruntime knows (inputs/configkeys.py); returns it sorted."""
    if not isinstance(value, dict) or not all(isinstance(k, str) and k.strip() == k and k and isinstance(v, str)
                                              for k, v in value.items()):
        raise UserError(f"{where}: {REQUIREMENTS} must map onnxruntime session config keys to string values, "
                        f'e.g. {{"session.x64quantprecision": "1"}}; got {value!r}')
    check_entries(value, f"{where}: {REQUIREMENTS}")
    return dict(sorted(value.items()))


def requirements_of(variant) -> dict:
    """The session config entries `variant` requires of every host ({}: none), as its recipe records them."""
    return dict((getattr(variant, "recipe", None) or {}).get(REQUIREMENTS) or {})


# ---- the recipe a variant runs with (one owner for every later command) -------------------

def sidecar_for(variant, override: dict | None = None) -> dict | None:
    """The sidecar (classes, input, decode) a variant (quantbench.inputs.variantdir.Variant) runs with.

    An explicit override (--sidecar) wins; then the copy `calibrate` stored in the
    variant's recipe; then the JSON beside the model file (x.onnx -> x.json), read
    once per variant (kept on it). Never a guess by model name.
    """
    if override is not None:
        return override
    recipe = variant.recipe or {}
    if isinstance(recipe.get("sidecar"), dict) and recipe["sidecar"]:
        return recipe["sidecar"]
    read = getattr(variant, "beside_sidecar", None)
    if read is None:
        read = (load_sidecar(variant.path),)
        if hasattr(variant, "beside_sidecar"):
            variant.beside_sidecar = read
    return read[0]


def sidecar_source(variant, override_path=None) -> str:
    """Where sidecar_for(variant) reads (for messages): the --sidecar file, the recipe's copy, or the JSON beside."""
    if override_path:
        return str(override_path)
    recipe = variant.recipe or {}
    if isinstance(recipe.get("sidecar"), dict) and recipe["sidecar"]:
        return f"{variant.path} (its recipe's sidecar)"
    return str(sidecar_path(variant.path))


def calibrated_spec(variant) -> dict | None:
    """The preprocessing the variant was calibrated with (its recipe's "preprocess"), if any."""
    spec = (variant.recipe or {}).get("preprocess")
    return spec if isinstance(spec, dict) and "shape" in spec else None


def variant_identity(semantic: str, required: dict | None = None) -> str:
    """A variant's identity (its variant_id, the key of all its results): the model's semantic hash when it has
    no session requirement, else the SHA-256 of (semantic hash, the requirement's entries, canonical): the same
    model deployed under another session requirement is another variant."""
    if not required:
        return semantic
    entries = {str(k): str(v) for k, v in sorted(required.items())}
    return sha256_bytes(canonical_json({"semantic_sha256": semantic, REQUIREMENTS: entries}).encode())


def check_identity(variant, facts: ModelFacts | None = None) -> str:
    """The variant's identity (variant_identity of its semantic hash and session requirement, computed once, kept
    on it with the semantic hash); a model whose semantic hash is not the one its recipe records (edited, or
    another variant's file copied over it) is refused before anything runs it.

    `facts`: variant.path's modelio.ModelFacts, when the caller has them (else modelio.model_facts).
    """
    if variant.variant_id is None:
        variant.semantic_sha256 = (facts if facts is not None else model_facts(variant.path)).semantic_sha256
        variant.variant_id = variant_identity(variant.semantic_sha256, requirements_of(variant))
    recorded = (variant.recipe or {}).get("semantic_sha256")
    if isinstance(recorded, str) and recorded != variant.semantic_sha256:
        recipe = variant.recipe_path or Path(variant.path).with_name(Path(variant.path).stem + ".recipe.json")
        raise UserError(f"{variant.path}: semantic hash {variant.semantic_sha256[:12]} is not the {recorded[:12]} "
                        f"its recipe {recipe} records (the model was edited or replaced since calibration); restore "
                        f"it, or recalibrate with `quantbench calibrate {flag_mark('force')}`")
    return variant.variant_id


def input_spec_for(variant, override: dict | None = None, override_source: str = flag_mark("sidecar"),
                   facts: ModelFacts | None = None) -> dict:
    """The exact input recipe (preprocess spec) to feed `variant`, checked (check_input_block) once.

    The recipe's calibrated preprocessing, else the sidecar beside the file; a
    sidecar given as `override` must make the same tensors as the calibration
    recipe (eval fixtures preprocessed unlike the calibration set compare
    nothing meaningful), so a difference stops here. A model without either
    whose input dims are not all static is an error, never a 1x1 guess.
    `facts`: variant.path's modelio.ModelFacts, when the caller has them (else modelio.model_facts).
    """
    facts = facts if facts is not None else model_facts(variant.path)
    check_identity(variant, facts)
    ins = facts.inputs
    if not ins:
        raise UserError(f"{variant.path}: the model has no input to feed")
    name, dims = next(iter(ins.items()))
    where = f"{variant.path}"
    calibrated = calibrated_spec(variant)
    if override is not None:
        spec = derive_spec(override, dims, name, override_source, f"{override_source}: input 'plugin'", variant.path)
        if calibrated is not None and canonical_json(spec) != canonical_json(calibrated):
            differ = sorted(k for k in set(spec) | set(calibrated) if spec.get(k) != calibrated.get(k))
            raise UserError(f"{override_source}: its input block differs from the preprocessing variant {variant.name} "
                            f"({where}) was calibrated with ({', '.join(differ)}); fixtures made this way would not "
                            f"match the calibration recipe: drop {flag_mark('sidecar')}, or recalibrate with this sidecar")
        return spec
    if calibrated is None:
        return derive_spec(sidecar_for(variant), dims, name, where, f"{sidecar_source(variant)}: input 'plugin'",
                           variant.path)
    _check_recorded_plugin(variant, calibrated)
    return derive_spec({"input": calibrated}, dims, name, where, f"{where}: recipe preprocess 'plugin'", variant.path)


def _check_recorded_plugin(variant, calibrated: dict) -> None:
    """The preprocessing plug-in a variant was calibrated with still has the SHA-256 its recipe records."""
    recorded = (variant.recipe or {}).get("preprocess_plugin")
    if calibrated.get("plugin") and isinstance(recorded, dict) and recorded.get("sha256"):
        now = plugin_identity(calibrated["plugin"], f"{variant.path}: preprocessing plug-in")
        if now["sha256"] != recorded["sha256"]:
            raise UserError(f"{variant.path}: preprocessing plug-in {calibrated['plugin']} changed since calibration "
                            f"(SHA-256 {str(now['sha256'])[:12]}, recorded {recorded['sha256'][:12]}); fixtures "
                            "would not match the calibration recipe: restore it or recalibrate")
