"""Model variants: where `quantbench calibrate` put them, as plain data.

A variants folder (default ``results/variants/<model>/``) holds one ONNX file
per variant, its recipe JSON beside it, and ``index.json`` written last::

    [{"name": "fp32", "file": "fp32.onnx", "recipe_file": "fp32.recipe.json"}, ...]

``results/variants/latest.json`` points at the folder of the last calibrate
run: ``{"model": "<model>", "folder": "<path>"}``, where a relative folder is
relative to ``<results_dir>/variants``. Later stages (hosts, equiv, explain,
release) read variants only through this module, and the sidecar and input spec a
variant runs with only through quantbench.inputs.sidecarfile.
"""

from __future__ import annotations

import contextlib
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from quantbench.inputs.assets import MODELS_DIR
from quantbench.errors import DiskFull, ParameterError, UserError, flag_mark
from quantbench.fsutil import (atomic_write_json, inside, clean_stale_tmp, no_space, owner_tag, read_json, regular_file,
                               replace_dir, sha256_file)
from quantbench.inputs.modelio import model_facts
from quantbench.inputs.sidecarfile import REQUIREMENTS, allow_recorded, check_requirements

INDEX_FILE = "index.json"
LATEST_FILE = "latest.json"
#: files that mark a folder quantbench may replace with --force: a variants folder or a calibration set
REPLACEABLE_MARKERS = (INDEX_FILE, "recipe.json")
_PLAIN_RE = re.compile(r"[A-Za-z0-9_+-][A-Za-z0-9._+-]*")


def is_plain_name(name) -> bool:
    """A name that is safe as one path component: letters, digits, '.', '_', '+', '-', not starting with '.'."""
    return isinstance(name, str) and len(name) <= 200 and bool(_PLAIN_RE.fullmatch(name))


def check_plain_name(name, what: str) -> str:
    if not is_plain_name(name):
        raise UserError(f"{what} {name!r} is not a plain name (use letters, digits, '.', '_', '+', '-'; "
                        "not starting with '.')")
    return name


@dataclass
class Variant:
    """One runnable model: `name` (fp32, dynamic, static-minmax, ...), the ONNX
    `path`, the source `model` name, and the `recipe` that made it."""

    name: str
    path: Path
    model: str
    recipe: dict = field(default_factory=dict)
    #: the recipe file it was read from (None: a bare model)
    recipe_path: Path | None = None
    #: its identity (sidecarfile.variant_identity: the semantic hash, with its session requirement if any), once
    #: checked against the recipe (sidecarfile.check_identity); None: not computed yet
    variant_id: str | None = None
    #: its model's semantic hash (set with variant_id)
    semantic_sha256: str | None = None
    #: (the sidecar beside its file,) once quantbench.inputs.sidecarfile.sidecar_for read it; None: not read yet
    beside_sidecar: tuple | None = field(default=None, repr=False, compare=False)


def _read_json(path: Path):
    try:
        return read_json(path, "JSON", "rerun `quantbench calibrate --force`")
    except FileNotFoundError:
        raise UserError(f"{path}: not found; run `quantbench calibrate`") from None


def variants_folder_of(path: str | os.PathLike) -> Path | None:
    """The variants folder (one holding calibrate's index.json, or the folder of them holding latest.json) that
    `path` is or lies in, else None: a command writing files of its own there would leave files the index does not
    list."""
    here = Path(path).absolute()
    for folder in (here, *here.parents):
        if (folder / INDEX_FILE).is_file() or (folder / LATEST_FILE).is_file():
            return folder
    return None


def load_variants(folder: str | os.PathLike) -> list[Variant]:
    """The variants listed in `folder`/index.json, in index order."""
    folder = Path(folder)
    index_path = folder / INDEX_FILE
    entries = _read_json(index_path)
    if not isinstance(entries, list):
        raise UserError(f"{index_path}: expected a list of variants; rerun `quantbench calibrate {flag_mark('force')}`")
    out = []
    for e in entries:
        if not isinstance(e, dict) or not {"name", "file", "recipe_file"} <= set(e):
            raise UserError(f"{index_path}: entry without name/file/recipe_file: {e!r}")
        check_plain_name(e["name"], f"{index_path}: variant name")
        for key in ("file", "recipe_file"):
            if inside(folder, e[key]) is None:
                raise UserError(f"{index_path}: variant {e['name']!r}: {key} {e[key]!r} is not a file inside {folder}")
        path = folder / e["file"]
        if not path.exists():
            raise UserError(f"{index_path}: variant {e['name']!r} file {path} is missing; rerun `quantbench calibrate {flag_mark('force')}`")
        recipe = _read_json(folder / e["recipe_file"])
        if not isinstance(recipe, dict):
            raise UserError(f"{folder / e['recipe_file']}: expected a recipe object; rerun `quantbench calibrate {flag_mark('force')}`")
        model = recipe.get("model", folder.name)
        if "model" in recipe:
            check_plain_name(model, f"{folder / e['recipe_file']}: model name")
        if REQUIREMENTS in recipe:
            check_requirements(recipe[REQUIREMENTS], str(folder / e["recipe_file"]))
        out.append(Variant(name=e["name"], path=path, model=str(model), recipe=recipe,
                           recipe_path=folder / e["recipe_file"]))
        allow_recorded(recipe)
    return out


def latest_folder(results_dir: str | os.PathLike = "results") -> Path:
    """The variants folder of the last calibrate run."""
    vdir = Path(results_dir) / "variants"
    latest = vdir / LATEST_FILE
    if not latest.exists():
        raise UserError("no variants yet: run `quantbench calibrate`")
    info = _read_json(latest)
    if not isinstance(info, dict) or "folder" not in info:
        raise UserError(f"{latest}: no 'folder'; rerun `quantbench calibrate`")
    folder = Path(info["folder"])
    return folder if folder.is_absolute() else vdir / folder


def latest_variants(results_dir: str | os.PathLike = "results") -> list[Variant]:
    """The variants of the last `quantbench calibrate` run (via results/variants/latest.json)."""
    return load_variants(latest_folder(results_dir))


#: the first line of a run on the bundled demo models (when there is no calibrate output) and a line of its report
DEMO_NOTE = ("demo: these are the bundled demo models (litter-cnn, litter-detr-tiny) on the bundled demo images, "
             "not a model of yours; `quantbench calibrate --model YOUR.onnx --labels LABELS` makes your own variants")


def is_demo(paths) -> bool:
    """Whether every one of the variant `paths` is a bundled demo model file."""
    paths = [Path(p) for p in paths]
    return bool(paths) and all(p.resolve().parent == MODELS_DIR.resolve() for p in paths)


def default_variants(results_dir: str | os.PathLike = "results") -> list[Variant]:
    """The latest calibrate output; the bundled demo models only when there is no calibrate output at all.

    A damaged output (latest.json unreadable, a file of the folder missing, index.json
    malformed, latest.json gone while a variants folder remains) is an error naming the
    file, never a silent switch to the demo.
    """
    vdir = Path(results_dir) / "variants"
    latest = vdir / LATEST_FILE
    if os.path.lexists(latest):
        return latest_variants(results_dir)
    left = sorted(p.parent for p in vdir.glob(f"*/{INDEX_FILE}")
                  if not p.parent.name.startswith(".")) if vdir.is_dir() else []  # not a dead run's staging
    if left:
        raise UserError(f"{latest}: missing, though {left[0]} holds variants of a calibrate run; rerun "
                        f"`quantbench calibrate`, or pass {flag_mark('variants')} {left[0]}")
    models = sorted(MODELS_DIR.glob("*.onnx"))
    if not models:
        raise UserError(f"no variants: run `quantbench calibrate` or pass {flag_mark('variants')} FILE.onnx")
    return [fp32_variant(m) for m in models]


def fp32_variant(model_path: str | os.PathLike) -> Variant:
    """A bare model as the fp32 variant (no calibrate run needed; its sidecar is the file beside it)."""
    path = Path(model_path)
    if not path.exists():
        raise UserError(f"{path}: model file not found")
    model = path.stem
    return Variant(name="fp32", path=path, model=model,
                   recipe={"variant": "fp32", "method": "fp32", "model": model,
                           "source_model": {"path": str(path), "raw_sha256": sha256_file(path)}})


# ---- choosing variants (every command's --variants / --variant) ---------------------------

def bare_variant(model_path: str | os.PathLike) -> Variant:
    """A bare .onnx file: a float one as its model's fp32, a quantized one named by its stem (never an fp32)."""
    v = fp32_variant(model_path)
    if model_facts(v.path).quantized_ops:
        v.name = v.recipe["variant"] = Path(model_path).stem
        v.recipe["method"] = "as-given"
    return v


def with_fp32(variants: list[Variant], fp32: str | os.PathLike) -> list[Variant]:
    """`variants` with the float model `fp32` as the fp32 reference of their one model (--fp32 FILE)."""
    models = sorted({v.model for v in variants})
    ref = fp32_variant(fp32)
    if model_facts(ref.path).quantized_ops:
        raise UserError(f"{fp32}: is quantized itself; the fp32 reference must be the float model")
    if len(models) != 1 or any(v.name == "fp32" for v in variants):
        raise UserError(f"{fp32}: the fp32 reference is for the variants of one model without an fp32 "
                        f"(given: {', '.join(f'{v.model}/{v.name}' for v in variants)})")
    ref.model = ref.recipe["model"] = models[0]
    for key in ("preprocess", "sidecar", "eval_labels"):   # fed and evaluated exactly as the variants it judges
        if key in (variants[0].recipe or {}):
            ref.recipe[key] = variants[0].recipe[key]
    return [ref, *variants]


def resolve_variants(items, fp32: str | os.PathLike | None = None) -> list[Variant]:
    """Variant folders (index.json from calibrate), folders of .onnx files, or .onnx files -> variants;
    none given: default_variants (the latest calibrate output; the demo models only without any). `fp32`: the
    float model that is their fp32 reference (with_fp32)."""
    if fp32 is not None:
        return with_fp32(resolve_variants(items), fp32)
    if not items:
        return default_variants()
    out = []
    for item in items:
        p = Path(item)
        if p.is_dir():
            if (p / INDEX_FILE).exists():
                out.extend(load_variants(p))
            else:
                files = sorted(p.glob("*.onnx"))
                if not files:
                    raise UserError(f"{flag_mark('variants')} {p}: folder has no index.json and no .onnx files")
                out.extend(bare_variant(regular_file(f, "model (.onnx)")) for f in files)
        elif p.suffix == ".onnx" or p.exists():
            regular_file(p, "model (.onnx)")   # a FIFO would block whoever opens it (stat only, never opened)
            found = None
            if (p.parent / INDEX_FILE).exists():
                found = next((v for v in load_variants(p.parent) if Path(v.path).resolve() == p.resolve()), None)
            out.append(found or bare_variant(p))
        else:
            raise UserError(f"{flag_mark('variants')} {p}: not found")
    return out


def pick_variant(text: str) -> Variant:
    """A variant by name (from the last calibrate run) or by .onnx path."""
    p = Path(text)
    if p.suffix == ".onnx" or p.exists():
        return resolve_variants([str(p)])[0]   # a bare quantized file is named after the file, not "fp32"
    if not os.path.lexists(Path("results") / "variants" / LATEST_FILE):
        raise UserError(f"{flag_mark('variant')} {text}: no calibrate run yet; run `quantbench calibrate` or pass an .onnx file")
    found = latest_variants()  # a damaged calibrate output is named as such
    for v in found:
        if v.name == text:
            return v
    raise UserError(f"{flag_mark('variant')} {text}: not among the latest variants ({', '.join(v.name for v in found)})")


# ---- writing (used by `quantbench calibrate`) -------------------------------------------

def write_index(folder: str | os.PathLike, variants: list[Variant]) -> Path:
    """folder/index.json, written last, so a folder with an index is complete."""
    folder = Path(folder)
    entries = [{"name": v.name, "file": Path(v.path).name,
                "recipe_file": Path(v.path).with_name(Path(v.path).stem + ".recipe.json").name} for v in variants]
    return atomic_write_json(folder / INDEX_FILE, entries)


def write_latest(folder: str | os.PathLike, model: str, results_dir: str | os.PathLike = "results") -> Path:
    """results/variants/latest.json -> `folder` (relative when it lies under results/variants)."""
    vdir = Path(results_dir) / "variants"
    folder = Path(folder)
    try:
        rel = os.path.relpath(os.path.abspath(folder), os.path.abspath(vdir))
        stored = rel if not rel.startswith("..") else os.path.abspath(folder)
    except ValueError:
        stored = os.path.abspath(folder)
    return atomic_write_json(vdir / LATEST_FILE, {"model": model, "folder": stored})


def clean_stale_staging(dest: str | os.PathLike) -> list[Path]:
    """Remove the staging folders of `dest` left by runs that died (SIGKILL, power loss); returns them.

    Only folders named by staging_folder, owned by this machine and by a pid that no longer
    exists, are removed: a concurrent live run's folder (or another machine's) is never touched.
    """
    dest = Path(dest)
    return clean_stale_tmp(dest.parent, dest.name)


def _staged_disk_full(dest: Path, stage: Path, path) -> DiskFull:
    """What a full disk stopped, named by the destination (`path`: the file being written, when known)."""
    what = ""
    if path:
        inner = Path(path).absolute()
        what = " " + (inner.relative_to(stage.absolute()).as_posix() if inner.is_relative_to(stage.absolute())
                      else str(inner))
    return DiskFull(f"{dest}: no space left on device while writing{what or ' it'}; nothing of {dest.name} was "
                    "written: free some space and rerun", dest)


@contextlib.contextmanager
def staging_folder(dest: str | os.PathLike):
    """A fresh temporary folder beside `dest`, removed afterwards whatever happens.

    Named `.<dest name>.<pid>@<host>.<random>.tmp`, so that the next run can tell a
    SIGKILLed run's leftover (dead pid: removed first, see clean_stale_staging) from a
    concurrent live run's folder (left alone).
    """
    import shutil
    import tempfile

    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    clean_stale_staging(dest)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.{owner_tag()}.", suffix=".tmp", dir=dest.parent))
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o777 & ~umask)  # mkdtemp makes 0700; the published folder gets normal permissions
    try:
        yield tmp
    except DiskFull as exc:  # name what was being made, not the staging folder's private name
        raise _staged_disk_full(dest, tmp, exc.path) from None
    except OSError as exc:  # a library's own write into the stage (onnx.save, onnxruntime)
        if not no_space(exc):
            raise
        raise _staged_disk_full(dest, tmp, exc.filename) from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _folder_digest(folder: Path) -> dict[str, str]:
    return {p.relative_to(folder).as_posix(): sha256_file(p) for p in sorted(folder.rglob("*")) if p.is_file()}


#: the results folder's subfolders that hold what other commands own: no variants folder goes inside them
NOT_FOR_VARIANTS = {"releases": "releases (each checked by verify, file by file)", "tables": "result tables"}


def check_variants_place(out: str | os.PathLike, results_dir: str | os.PathLike) -> None:
    """A variants folder goes anywhere but into the results folder's releases or tables (`out=results/releases/x`
    was accepted: a release folder verify then fails, or a table folder the readers trip on)."""
    target = Path(out).resolve()
    for sub, holds in NOT_FOR_VARIANTS.items():
        folder = Path(results_dir) / sub
        if target == folder.resolve() or folder.resolve() in target.parents:
            raise ParameterError("out", f"is inside {folder}, which holds {holds}, not variants; choose a folder "
                                        "outside it (the default is under results/variants)", str(out))


def check_replaceable(dest: str | os.PathLike, what: str = "variants") -> None:
    """Refuse a `dest` that quantbench must never replace: a file, or a non-empty folder that is
    not itself a variants folder or calibration set (no index.json / recipe.json), e.g. results/."""
    dest = Path(dest)
    if dest.is_symlink() or (dest.exists() and not dest.is_dir()):
        raise UserError(f"{dest}: exists and is not a folder; remove it or choose another {flag_mark('out')}")
    if dest.is_dir() and any(dest.iterdir()) and not any((dest / m).is_file() for m in REPLACEABLE_MARKERS):
        raise UserError(f"{dest}: is not a {what} folder (no {' or '.join(REPLACEABLE_MARKERS)}) and is not "
                        f"empty; quantbench never replaces it, even with {flag_mark('force')}: choose another {flag_mark('out')} / {flag_mark('name')}")


def _check_no_foreign_folders(tmp: Path, dest: Path, what: str) -> None:
    """Replacing `dest` deletes what it holds: a subfolder the new folder does not make (a results folder kept
    inside it, `--results results/variants/m/res`) is someone's work, so it is refused, even with force."""
    foreign = sorted(p.name for p in dest.iterdir() if p.is_dir() and not (tmp / p.name).is_dir())
    if foreign:
        raise UserError(f"{dest}: holds folder(s) calibrate did not make ({', '.join(foreign[:3])}"
                        f"{' ...' if len(foreign) > 3 else ''}), which replacing the {what} would delete; quantbench "
                        f"never deletes them, even with {flag_mark('force')}: move them out of {dest} (a results "
                        "folder does not belong inside a variants folder), then rerun; nothing was changed")


def publish_folder(tmp: str | os.PathLike, dest: str | os.PathLike, force: bool = False, what: str = "variants") -> str:
    """Move the completely written `tmp` onto `dest`.

    Returns "new", "unchanged" (dest already held identical files) or "replaced".
    A dest holding different files is refused unless `force`, and even with `force`
    only a dest that is itself a variants folder or calibration set is replaced.
    """
    tmp, dest = Path(tmp), Path(dest)
    check_replaceable(dest, what)
    if dest.is_dir() and any(dest.iterdir()):
        old, new = _folder_digest(dest), _folder_digest(tmp)
        if old == new:
            return "unchanged"
        if not force:
            differ = sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k))
            raise UserError(f"{dest}: already holds different {what} ({', '.join(differ[:3])}"
                            f"{' ...' if len(differ) > 3 else ''} differ); pass {flag_mark('force')} to replace them, "
                            f"or choose another {flag_mark('out')} / {flag_mark('name')}")
        _check_no_foreign_folders(tmp, dest, what)
        replace_dir(tmp, dest)
        return "replaced"
    replace_dir(tmp, dest)  # an empty dest folder goes
    return "new"
