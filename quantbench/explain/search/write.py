"""The search's answer written as a variant: into the base variant's own folder, listed in its index.json like the
variants calibrate writes, with its ranges and a recipe that records everything that makes it (method and
options, the nodes kept in float, the session entries every host must set: ``session_requirements``).

Built in a staging folder beside the variants and moved in file by file (ranges, model, recipe), the index
rewritten last (atomically): a run killed on the way leaves no half-written variant listed.
"""

from __future__ import annotations

import os
from pathlib import Path

from quantbench.errors import UserError
from quantbench.inputs.sidecarfile import REQUIREMENTS, requirements_of, variant_identity
from quantbench.inputs.variantdir import Variant, load_variants, staging_folder, write_index


def write_variant(space, choice, exclude: tuple, variant_id: str, name: str, extra: dict) -> tuple[Path, str]:
    """(the written variant's path, "new" | "unchanged" | "replaced"); `variant_id`: the semantic hash the fleet
    measured; `extra`: recipe keys besides make_static's (its session requirement among them). A variant of that
    name is unchanged when it is the same model under the same requirement (sidecarfile.variant_identity)."""
    folder = Path(space.base.path).parent
    if not (folder / "index.json").is_file():
        raise UserError(f"{folder}: no index.json; the search writes into a variants folder calibrate made")
    variants = load_variants(folder)
    old = next((v for v in variants if v.name == name), None)
    identity = variant_identity(variant_id, extra.get(REQUIREMENTS))   # the model under its session requirement
    if old is not None and variant_identity(old.recipe.get("semantic_sha256"), requirements_of(old)) == identity:
        return Path(old.path), "unchanged"
    if old is not None and "search" not in old.recipe:
        raise UserError(f"{folder}: already holds a variant {name!r} that calibrate made; name the search's "
                        "variant otherwise")
    with staging_folder(folder / name) as stage:
        built = space.write(choice, exclude, stage / f"{name}.onnx", name, extra)
        if built.variant_id != variant_id:
            raise UserError(f"{stage / name}.onnx: semantic hash {built.variant_id[:12]} is not the "
                            f"{variant_id[:12]} the fleet measured; nothing was written")
        for suffix in (".ranges.json", ".onnx", ".recipe.json"):
            os.replace(stage / f"{name}{suffix}", folder / f"{name}{suffix}")
    entry = Variant(name=name, path=folder / f"{name}.onnx", model=space.base.model)
    write_index(folder, [v for v in variants if v.name != name] + [entry])
    return entry.path, "new" if old is None else "replaced"
