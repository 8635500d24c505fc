"""Small constructed models and stand-in corpora for the calibrate tests (fast, no bundled data)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from models import tiny_model, static_batch_model  # noqa: F401 (the catalogue: tests/models.py)


def make_corpus(root, n_litter: int = 16, n_negative: int = 16, n_eval: int = 4, size: int = 16, seed: int = 0):
    """A COCO corpus of random-texture PNGs with spread luminance; returns (labels.json, images/)."""
    from PIL import Image

    root = Path(root)
    images = root / "images"
    images.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    coco = {"images": [], "annotations": [], "categories": [{"id": 1, "name": "bottle"}]}
    kinds = ["litter"] * n_litter + ["negative"] * n_negative + ["eval"] * n_eval
    ann_id = 1
    for i, kind in enumerate(kinds):
        level = 30 + 190 * ((i * 7919) % 97) / 96.0
        px = np.clip(rng.normal(level, 25, (size, size, 3)), 0, 255).astype(np.uint8)
        name = f"img_{i:03d}.png"
        Image.fromarray(px).save(images / name)
        split = "eval" if kind == "eval" else ("val" if i % 5 == 0 else "train")
        neg = kind == "negative" or (kind == "eval" and i % 2)
        coco["images"].append({"id": i + 1, "file_name": name, "width": size, "height": size, "split": split,
                               "negative": bool(neg)})
        if not neg:
            for _ in range(1 + i % 3):
                coco["annotations"].append({"id": ann_id, "image_id": i + 1, "category_id": 1,
                                            "bbox": [2.0, 2.0, 5.0, 5.0]})
                ann_id += 1
    labels = root / "labels.json"
    labels.write_text(json.dumps(coco, indent=1))
    return labels, images


def random_feeds(n: int, hw: int = 16, seed: int = 1, name: str = "images"):
    rng = np.random.default_rng(seed)
    return [{name: (rng.random((1, 3, hw, hw), dtype=np.float32) * 2 - 0.5)} for _ in range(n)]
