#!/usr/bin/env python3
"""Train the demo classifier litter-cnn on the bundled corpus and export it to ONNX.

Image-level label (--label): "binary" (default) is "litter" when the image has at least
one annotation, else "none"; "dominant" is the class of the annotation with the largest
box area, or "none" (7-way; on this corpus it reaches only about 64% eval accuracy in a
30-epoch CPU budget, against 90% litter/none agreement, hence the binary default).

Inputs are made with quantbench.inputs.preprocess.to_tensor and the sidecar's own input
block, so training, evaluation and every later quantbench run see the same tensors.
Writes quantbench/data/models/litter-cnn.onnx + litter-cnn.json; the sidecar records
the seed, the torch version, the corpus hash and the eval accuracy measured with
onnxruntime on the exported model.

    python scripts/train_classifier.py            # needs torch (CPU) and onnxruntime
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from quantbench.inputs.assets import CORPUS_DIR, CORPUS_IMAGES, CORPUS_LABELS, MODELS_DIR  # noqa: E402
from quantbench.inputs.fixtures import annotations_by_image, load_coco  # noqa: E402
from quantbench.fsutil import atomic_path, atomic_write_json  # noqa: E402
from quantbench.inputs.preprocess import load_rgb, to_tensor  # noqa: E402

NAME = "litter-cnn"
LABEL_RULES = {
    "binary": "litter present: 'litter' when the image has at least one annotation, else 'none'",
    "dominant": ("dominant class: the category of the annotation with the largest bbox area "
                 "(w*h, ties to the lower annotation id); 'none' when the image has no annotation"),
}


def _make_corpus_module():
    spec = importlib.util.spec_from_file_location("make_corpus", REPO / "scripts" / "make_corpus.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def image_labels(coco: dict, mode: str = "binary") -> tuple[list[str], dict]:
    """Class names (index 0 = none) and image id -> class index, per LABEL_RULES[mode]."""
    if mode == "binary":
        with_litter = {a["image_id"] for a in coco["annotations"]}
        return ["none", "litter"], {im["id"]: int(im["id"] in with_litter) for im in coco["images"]}
    if mode != "dominant":
        raise ValueError(f"unknown label mode {mode!r}")
    cats = sorted(coco["categories"], key=lambda c: c["id"])
    classes = ["none"] + [c["name"] for c in cats]
    index_of = {c["id"]: i + 1 for i, c in enumerate(cats)}
    by = annotations_by_image(coco)
    labels = {}
    for im in coco["images"]:
        anns = sorted(by.get(im["id"], []), key=lambda a: a["id"])
        if not anns:
            labels[im["id"]] = 0
            continue
        best = max(anns, key=lambda a: a["bbox"][2] * a["bbox"][3])  # first max wins ties
        labels[im["id"]] = index_of[best["category_id"]]
    return classes, labels


def load_split(coco, labels, split, spec):
    ims = sorted((im for im in coco["images"] if im["split"] == split), key=lambda im: im["file_name"])
    x = np.concatenate([to_tensor(load_rgb(CORPUS_IMAGES / im["file_name"]), spec) for im in ims])
    y = np.array([labels[im["id"]] for im in ims], dtype=np.int64)
    return x, y


def evaluate(onnx_path: Path, spec: dict, mode: str) -> tuple[float, int, float]:
    """(accuracy, images, majority-class baseline) on the eval split: onnxruntime on the
    exported file, one image at a time, tensors from preprocess.to_tensor."""
    import onnxruntime as ort

    coco = load_coco(CORPUS_LABELS, CORPUS_IMAGES)
    _, labels = image_labels(coco, mode)
    x, y = load_split(coco, labels, "eval", spec)
    sess = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    pred = np.array([int(sess.run(["logits"], {"images": x[i:i + 1]})[0].argmax()) for i in range(len(x))])
    return float((pred == y).mean()), int(len(y)), float(np.bincount(y).max() / len(y))


def build_model(n_classes: int):
    import torch.nn as nn

    def block(cin, cout, stride=1):
        return [nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False), nn.BatchNorm2d(cout),
                nn.ReLU(inplace=True)]

    layers = []
    layers += block(3, 16, stride=2) + [nn.MaxPool2d(2)]                  # 128 -> 64 -> 32
    layers += block(16, 24) + block(24, 24) + [nn.MaxPool2d(2)]            # 16
    layers += block(24, 48) + block(48, 48) + [nn.MaxPool2d(2)]            # 8
    layers += block(48, 64) + block(64, 72) + block(72, 72) + block(72, 72)  # 9 conv layers in all
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(72, n_classes)]
    return nn.Sequential(*layers)


def augment(torch, xb, gen):
    """Label-preserving flips and quarter turns (the scenes are seen from above)."""
    if torch.rand(1, generator=gen).item() < 0.5:
        xb = xb.flip(3)
    if torch.rand(1, generator=gen).item() < 0.5:
        xb = xb.flip(2)
    k = int(torch.randint(0, 4, (1,), generator=gen).item())
    return torch.rot90(xb, k, (2, 3)) if k else xb


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--label", choices=sorted(LABEL_RULES), default="binary", help="image-level label")
    p.add_argument("--epochs", type=int, default=25, help="training epochs")
    p.add_argument("--seed", type=int, default=1234, help="torch / numpy seed")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads (1 trains faster than 2 on a busy shared machine)")
    p.add_argument("--batch", type=int, default=32, help="minibatch size")
    p.add_argument("--lr", type=float, default=3e-3, help="AdamW peak learning rate")
    p.add_argument("--out", type=Path, default=MODELS_DIR, help="output folder")
    p.add_argument("--evaluate", action="store_true",
                   help="no training: print the eval-split accuracy of the model in --out (onnxruntime)")
    args = p.parse_args(argv)
    if args.evaluate:
        model = args.out / f"{NAME}.onnx"
        sidecar = json.loads((args.out / f"{NAME}.json").read_text())
        acc, n, majority = evaluate(model, sidecar["input"], sidecar["label_mode"])
        print(f"{model}: eval accuracy {acc:.4f} ({100 * acc:.1f}%) on {n} images, "
              f"label {sidecar['label_mode']}, majority baseline {majority:.4f}; "
              f"sidecar reports {sidecar['metrics']['eval_accuracy']:.4f}")
        return 0

    import onnx
    import torch
    from tqdm import tqdm

    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)
    np.random.seed(args.seed)

    coco = load_coco(CORPUS_LABELS, CORPUS_IMAGES)
    classes, labels = image_labels(coco, args.label)

    # Normalisation from the train split's pixel statistics (rounded so the sidecar is readable).
    raw = np.stack([load_rgb(CORPUS_IMAGES / im["file_name"]) for im in coco["images"] if im["split"] == "train"])
    raw = raw.astype(np.float64) / 255.0
    mean = [round(float(v), 3) for v in raw.mean(axis=(0, 1, 2))]
    std = [round(float(v), 3) for v in raw.std(axis=(0, 1, 2))]
    spec = {"name": "images", "shape": [1, 3, 128, 128], "layout": "NCHW", "color": "RGB",
            "dtype": "float32", "scale": 1.0 / 255.0, "mean": mean, "std": std}

    xtr, ytr = load_split(coco, labels, "train", spec)
    xva, yva = load_split(coco, labels, "val", spec)
    xev, yev = load_split(coco, labels, "eval", spec)
    print("train label counts:", dict(zip(classes, np.bincount(ytr, minlength=len(classes)).tolist())))

    model = build_model(len(classes))
    counts = np.bincount(ytr, minlength=len(classes)).astype(np.float64)
    weights = torch.tensor((counts.sum() / np.maximum(counts, 1.0) / len(classes)) ** 0.5, dtype=torch.float32)
    loss_fn = torch.nn.CrossEntropyLoss(weight=weights)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=1e-4)
    steps = args.epochs * ((len(ytr) + args.batch - 1) // args.batch)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=args.lr, total_steps=steps, pct_start=0.15)
    gen = torch.Generator().manual_seed(args.seed)
    xt, yt = torch.from_numpy(xtr), torch.from_numpy(ytr)
    xv = torch.from_numpy(xva)

    def accuracy(x, y):
        model.eval()
        with torch.no_grad():
            pred = torch.cat([model(x[i:i + 64]) for i in range(0, len(x), 64)]).argmax(1).numpy()
        return float((pred == y).mean())

    best = (-1.0, None, -1)
    t0 = time.time()
    bar = tqdm(range(args.epochs), desc="epochs", file=sys.stderr)
    for epoch in bar:
        model.train()
        perm = torch.randperm(len(yt), generator=gen)
        for i in range(0, len(perm), args.batch):
            idx = perm[i:i + args.batch]
            xb = augment(torch, xt[idx], gen)
            loss = loss_fn(model(xb), yt[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
        va = accuracy(xv, yva)
        if va >= best[0]:
            best = (va, {k: v.clone() for k, v in model.state_dict().items()}, epoch)
        bar.set_postfix(loss=f"{loss.item():.3f}", val=f"{va:.3f}", best=f"{best[0]:.3f}")
    model.load_state_dict(best[1])
    model.eval()
    train_seconds = time.time() - t0

    args.out.mkdir(parents=True, exist_ok=True)
    onnx_path = args.out / f"{NAME}.onnx"
    with atomic_path(onnx_path, suffix=".onnx") as tmp:
        torch.onnx.export(model, torch.from_numpy(xev[:1]), str(tmp), input_names=["images"],
                          output_names=["logits"], opset_version=17, dynamo=False,
                          dynamic_axes={"images": {0: "batch"}, "logits": {0: "batch"}})
        m = onnx.load(str(tmp))
        onnx.checker.check_model(m)
        m.producer_name = "quantbench/scripts/train_classifier.py"
        onnx.save(m, str(tmp))

    eval_acc, _, majority = evaluate(onnx_path, spec, args.label)

    make_corpus = _make_corpus_module()
    sidecar = {
        "name": NAME,
        "classes": classes,
        "input": spec,
        "decode": {"kind": "classifier-softmax", "logits": "logits", "threshold": None},
        "label": LABEL_RULES[args.label],
        "label_mode": args.label,
        "metrics": {"eval_accuracy": round(eval_acc, 4), "eval_images": int(len(yev)),
                    "eval_majority_baseline": round(majority, 4),
                    "val_accuracy": round(best[0], 4)},
        "training": {"seed": args.seed, "torch_version": torch.__version__,
                     "corpus_sha256": make_corpus.corpus_sha256(CORPUS_DIR),
                     "epochs": args.epochs, "best_epoch": best[2] + 1, "batch": args.batch,
                     "lr": args.lr, "threads": args.threads, "optimizer": "AdamW + OneCycle",
                     "augment": "flips and quarter turns", "split": "train (val for model selection)",
                     "script": "scripts/train_classifier.py"},
    }
    atomic_write_json(args.out / f"{NAME}.json", sidecar)
    size = onnx_path.stat().st_size
    print(f"{NAME}: eval accuracy {eval_acc:.4f} on {len(yev)} images (majority baseline {majority:.4f}), "
          f"val {best[0]:.4f} @ epoch {best[2] + 1}, {size} bytes, trained {train_seconds:.0f} s -> {onnx_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
