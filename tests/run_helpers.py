"""A one-variant folder for tests that drive `quantbench run` / `equiv` on the command line."""

from __future__ import annotations

import json
from pathlib import Path

from hosts_helpers import image_model
from quantbench.inputs.variantdir import Variant, write_index


def variants_folder(folder, size: int = 8) -> Path:
    """`folder` with fp32.onnx (images[1,3,size,size] -> logits), its recipe, sidecar and index.json."""
    folder = Path(folder)
    side = {"input": {"name": "images", "shape": [1, 3, size, size], "layout": "NCHW", "color": "RGB",
                      "dtype": "float32", "scale": 1 / 255}}
    folder.mkdir(parents=True)
    image_model(folder / "fp32.onnx", size=size)
    recipe = {"variant": "fp32", "method": "fp32", "model": "tiny", "sidecar": side}
    (folder / "fp32.recipe.json").write_text(json.dumps(recipe))
    (folder / "fp32.json").write_text(json.dumps(side))
    write_index(folder, [Variant(name="fp32", path=folder / "fp32.onnx", model="tiny", recipe=recipe)])
    return folder
