"""An image model whose int8 output depends on session.x64quantprecision on the saturating AVX2 path, and variants
folders of it written as a recipe search writes them: real static QDQ quantization, the recipe recording a
session requirement (shared by tests/hosts/, tests/analysis/, tests/release/)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from models import saturating_flat_model as saturating_image_model  # noqa: F401 (the catalogue: tests/models.py)

X64 = {"session.x64quantprecision": "1"}
CLASSES = [f"c{i}" for i in range(8)]
SIDE = {"classes": CLASSES,
        "input": {"name": "images", "shape": [1, 3, 8, 8], "layout": "NCHW", "color": "RGB", "dtype": "float32",
                  "scale": 1 / 255, "mean": [0.0, 0.0, 0.0], "std": [1.0, 1.0, 1.0]},
        "decode": {"kind": "classifier-softmax", "logits": "logits", "threshold": None}}


def bright_images(root, count: int = 4, seed: int = 3) -> Path:
    """root/images/*.png (pixels 230..255) and root/labels.json (COCO, every image in the eval split)."""
    from PIL import Image

    root = Path(root)
    (root / "images").mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    images = []
    for i in range(count):
        Image.fromarray(rng.integers(230, 256, (8, 8, 3), dtype=np.uint8)).save(root / "images" / f"im{i}.png")
        images.append({"id": i, "file_name": f"im{i}.png", "width": 8, "height": 8, "split": "eval"})
    (root / "labels.json").write_text(json.dumps({"images": images, "annotations": [], "categories": []}))
    return root / "labels.json"


def image_feeds(root) -> list[dict]:
    """The model's input tensors of root/images, preprocessed as the sidecar says."""
    from quantbench.inputs.preprocess import load_rgb, to_tensor

    return [{"images": to_tensor(load_rgb(p), SIDE["input"])} for p in sorted(Path(root, "images").glob("*.png"))]


def variants_folder(root, name: str, required: dict | None, shared: bool = False) -> Path:
    """root/variants/<name>: fp32 and static-minmax of the saturating model (calibrated on root's images), the
    static recipe recording `required` as its session requirement (None: none); returns the folder."""
    from quantbench.quantize import variants as qv
    from quantbench.quantize import intake
    from quantbench.inputs.variantdir import write_index

    root = Path(root)
    src = saturating_image_model(root / ("shared.onnx" if shared else "sat.onnx"), shared=shared)
    vdir = root / "variants" / name
    vdir.mkdir(parents=True)
    prepared = root / f"{name}.prepared.onnx"
    intake.prepare(src, prepared)
    extra = {"sidecar": SIDE}
    req = {"session_requirements": dict(required)} if required else {}
    vs = [qv.make_fp32(src, vdir / "fp32.onnx", model_name="sat", recipe_extra=extra),
          qv.make_static(prepared, vdir / "static-minmax.onnx", inputs=image_feeds(root), method="minmax",
                         name="static-minmax", model_name="sat", recipe_extra={**extra, **req})]
    write_index(vdir, vs)
    return vdir


def hashes(tables_root, host: str, variant: str, how: str) -> dict:
    """{(fixture_id, output): sha256} of `variant` on `host` in the outputs table, of the results run `how`:
    "required" (x64quantprecision added as the variant's requirement), "session" (set by the host's session, as
    remedy's x64quantprecision row and --session-config set it) or "baseline" (not set)."""
    from quantbench.store.hostresults import load_outputs

    def kind(options: str) -> str:
        s = json.loads(options)
        if "session.x64quantprecision" not in s["config_entries"]:
            return "baseline"
        return "required" if "session.x64quantprecision" in s.get("required_entries", {}) else "session"

    t = load_outputs(host=host, tensors=False, tables_root=tables_root).to_pylist()
    return {(r["fixture_id"], r["output_name"]): r["sha256"] for r in t
            if r["variant"] == variant and kind(r["session_options"]) == how}


def add_required_copy(vdir, name: str, required: dict, of: str = "static-minmax") -> Path:
    """vdir/<name>: variant `of`'s model bytes under another name, its recipe recording `required` as its session
    requirement (what the recipe search writes when a session entry alone meets the budget; {}: none, a plain
    copy), listed in the index."""
    from quantbench.inputs.variantdir import load_variants, write_index

    vdir = Path(vdir)
    (vdir / f"{name}.onnx").write_bytes((vdir / f"{of}.onnx").read_bytes())
    recipe = json.loads((vdir / f"{of}.recipe.json").read_text())
    recipe.update(name=name, session_requirements=dict(required))
    if not required:   # a plain copy: the same variant under another name
        recipe.pop("session_requirements")
    (vdir / f"{name}.recipe.json").write_text(json.dumps(recipe))
    variants = load_variants(vdir)
    write_index(vdir, variants + [type(variants[0])(name=name, path=vdir / f"{name}.onnx", model=variants[0].model)])
    return vdir / f"{name}.onnx"
