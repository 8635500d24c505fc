"""`ctc` on a real text recogniser: PaddleOCR's PP-OCRv4 rec (CRNN-style, CTC head) from the
rapidocr-onnxruntime wheel, calibrated and compared with `quantbench` exactly as a user would: the alphabet is
the model's own character list in a file beside the sidecar; the strings are checked against an independent
greedy decode (plain onnxruntime + numpy, RapidOCR's CTCLabelDecode rule) of the same fixture tensors."""

import contextlib
import json
import shutil

import numpy as np
import pytest

import real_models as R
from quantbench.cli import main
from setup_required import missing_setup

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

# the model inputs-side tests pin too (same wheel, same file, same SHA-256)
PPOCR_REC = R.RealModel(key="ppocr-rec", wheel="rapidocr-onnxruntime", version="1.4.4",
                        member="rapidocr_onnxruntime/models/ch_PP-OCRv4_rec_infer.onnx",
                        sha256="48fc40f24f6d2a207a2b1091d3437eb3cc3eb6b676dc3ef9c37384005483683b",
                        sidecar={}, kind="recogniser", tile=(320, 48), train_tiles=0, eval_tiles=0)
# rapidocr_onnxruntime 1.4.4 ch_ppocr_rec: image as BGR, height 48 (width 320 here: every tile is 320x48, so the
# resize keeps the aspect), (x / 255 - 0.5) / 0.5; output softmax [1, T, 6625]: blank, the 6623 characters of the
# model's 'character' metadata, the space (use_space_char)
SIDECAR = {"input": {"name": "x", "shape": [1, 3, 48, 320], "layout": "NCHW", "color": "BGR", "dtype": "float32",
                     "scale": 1 / 255, "mean": [0.5, 0.5, 0.5], "std": [0.5, 0.5, 0.5]},
           "decode": {"kind": "ctc", "alphabet": "ppocr_keys.txt", "space": True, "blank": 0, "layout": "NTC"}}
TRAIN = ["calibrate", "onnx runtime", "Raspberry Pi 5", "x86 AVX2", "release v1", "int8 QDQ", "MinMax",
         "Percentile", "Entropy", "equivalence", "decision flips", "fp32 reference"]
EVAL = ["HELLO", "quantbench 2026", "EXIT 12", "Release gate"]


def _tile(word: str):
    from PIL import Image, ImageDraw, ImageFont

    img = Image.new("RGB", (320, 48), "white")
    ImageDraw.Draw(img).text((8, 6), word, fill="black", font=ImageFont.load_default(size=30))
    return img


def _workdir(root, model_file):
    import onnx

    (root / "models").mkdir()
    shutil.copy(model_file, root / "models" / "ppocr-rec.onnx")
    chars = [p.value for p in onnx.load(str(model_file)).metadata_props if p.key == "character"][0].splitlines()
    (root / "models" / "ppocr_keys.txt").write_text("\n".join(chars) + "\n", encoding="utf-8")
    (root / "models" / "ppocr-rec.json").write_text(json.dumps(SIDECAR))
    (root / "images").mkdir()
    images = []
    for i, word in enumerate(TRAIN + EVAL):
        _tile(word).save(root / "images" / f"t{i:02d}.png")
        split = "eval" if word in EVAL else ("val" if i % 4 == 0 else "train")
        images.append({"id": i + 1, "file_name": f"t{i:02d}.png", "width": 320, "height": 48, "split": split,
                       **({"text": word} if split == "eval" else {})})
    (root / "labels.json").write_text(json.dumps({"images": images, "annotations": [], "categories": []}))
    return ["blank", *chars, " "]


def _independent(model: str, tensor: bytes, chars: list) -> str:
    import onnxruntime as ort

    x = np.frombuffer(tensor, "<f4").reshape(1, 3, 48, 320)
    out = ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0][0]
    ids, text = out.argmax(axis=1), ""
    for t, k in enumerate(ids):
        if k != 0 and (t == 0 or k != ids[t - 1]):
            text += chars[k]
    return text


def test_ctc_on_pp_ocrv4_rec_matches_an_independent_decode(tmp_path, capsys):
    try:
        model_file = R.fetch(PPOCR_REC)
    except R.FetchError as exc:
        missing_setup(f"{PPOCR_REC.wheel}=={PPOCR_REC.version}: download failed: {exc}")
    chars = _workdir(tmp_path, model_file)
    with contextlib.chdir(tmp_path):
        assert main(["calibrate", "--model", "models/ppocr-rec.onnx", "--labels", "labels.json", "--methods",
                     "dynamic", "--per-cell", "3", "--no-progress", "-q"]) == 0
        capsys.readouterr()
        assert main(["equiv", "--hosts", "x86", "--fixtures", "labels.json", "--no-progress", "--no-plots"]) == 0
        out = capsys.readouterr().out
        from quantbench.store import partread

        fx = {r["fixture_id"]: r for r in partread.read("fixtures").to_pylist()}
        rows = partread.read("decisions").to_pylist()
        variants = sorted(partread.read("models").to_pylist(), key=lambda r: r["variant"])
    assert len(rows) == 2 * len(EVAL)
    paths = {v["variant_id"]: str(tmp_path / v["path"]) if not v["path"].startswith("/") else v["path"]
             for v in variants}
    for r in rows:   # quantbench's strings are the ones an independent decoder reads from the same tensors
        assert r["class_name"] == _independent(paths[r["variant_id"]], fx[r["fixture_id"]]["tensor"], chars), r
    fp32 = {fx[r["fixture_id"]]["source"]: r["class_name"] for r in rows if r["variant"] == "fp32"}
    assert fp32["t12.png"] == "HELLO" and fp32["t13.png"] == "quantbench 2026"
    report = (tmp_path / "results" / "report.md").read_text()
    assert "Text accuracy on 4 labelled images" in report
    assert "| fp32 | 0.500 (2/4), CER 0.051 |" in report     # "EXIT12" and "Release gate " miss by a space each
    assert "Against fp32 on the same host: dynamic vs fp32 on x86 exact match" in report and "CER" in report
    assert out.startswith("runs: ") and "decode ctc, greedy" in out
