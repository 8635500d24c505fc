"""A tiny released results folder (shared by the tests in tests/release/)."""

import contextlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from quantbench.cli import main
from setup_required import missing_setup
from models import documented_classifier as tiny_classifier  # noqa: F401 (the catalogue: tests/models.py)


SIDE = {"classes": ["bottle", "can", "bag", "cup", "lid"],
        "input": {"name": "images", "shape": [1, 3, 8, 8], "layout": "NCHW", "color": "RGB", "dtype": "float32",
                  "scale": 1 / 255, "mean": [0.0, 0.0, 0.0], "std": [1.0, 1.0, 1.0]},
        "decode": {"kind": "classifier-softmax", "logits": "logits", "threshold": None}}
# (0..1 inputs: the range tiny_classifier's near-tied classes are built for)


PRE_PY = "def prep(image, spec):\n    return image\n"   # a preprocessing plug-in file (root/pre.py)


def make_release_results(root: Path, doc: str, twin: bool = False, labelled: bool = False,
                         plugin: bool = False) -> Path:
    """root/results with fp32 + dynamic variants of a tiny classifier (and, with `twin`, a byte-identical
    dynamic-twin: one variant_id for two records), run on x86 over 5 images, plus an equiv analysis.
    With `labelled`, each image has one class label (bottle or can), so the report shows a top-1 accuracy.
    With `plugin`, the recipes record the preprocessing plug-in pre.py:prep (root/pre.py; never run)."""

    from PIL import Image

    from quantbench.quantize import variants as qv
    from quantbench.inputs.variantdir import Variant, write_index, write_latest

    results = root / "results"
    vdir = results / "variants" / "tiny"
    vdir.mkdir(parents=True)
    tiny_classifier(root / "src.onnx", doc=doc)
    extra = {"sidecar": SIDE}
    if plugin:
        import hashlib

        (root / "pre.py").write_text(PRE_PY)
        extra["preprocess_plugin"] = {"ref": "pre.py:prep", "sha256": hashlib.sha256(PRE_PY.encode()).hexdigest()}
    vs = [qv.make_fp32(root / "src.onnx", vdir / "fp32.onnx", model_name="tiny", recipe_extra=extra),
          qv.make_dynamic(root / "src.onnx", vdir / "dynamic.onnx", model_name="tiny", recipe_extra=extra)]
    if twin:
        shutil.copyfile(vdir / "dynamic.onnx", vdir / "dynamic-twin.onnx")
        shutil.copyfile(vdir / "dynamic.recipe.json", vdir / "dynamic-twin.recipe.json")
        vs.append(Variant("dynamic-twin", vdir / "dynamic-twin.onnx", "tiny", vs[1].recipe))
    write_index(vdir, vs)
    write_latest(vdir, "tiny", results_dir=results)
    (root / "images").mkdir()
    rng = np.random.default_rng(3)
    images = []
    for i in range(5):
        Image.fromarray(rng.integers(0, 256, (8, 8, 3), dtype=np.uint8)).save(root / "images" / f"im{i}.png")
        images.append({"id": i, "file_name": f"im{i}.png", "width": 8, "height": 8, "split": "eval"})
    anns = [{"id": i, "image_id": i, "category_id": 1 + i % 2} for i in range(5)] if labelled else []
    cats = [{"id": 1, "name": "bottle"}, {"id": 2, "name": "can"}] if labelled else []
    (root / "labels.json").write_text(json.dumps({"images": images, "annotations": anns, "categories": cats}))
    with contextlib.chdir(root):  # module fixtures cannot use monkeypatch
        common = ["--hosts", "x86", "--fixtures", "labels.json", "--no-progress"]
        assert main(["run", *common]) == 0
        assert main(["equiv", "--no-run", "--no-plots", *common]) == 0
    return results


@pytest.fixture(scope="session")
def base_results(tmp_path_factory):
    """results/ with fp32 + dynamic variants of a tiny classifier, run on the local host (x86) over
    5 images, and a `quantbench equiv` analysis (classes, decisions, flips, report.md). Built once per session (per
    xdist worker), not per module: tests read it or write into their own copy (`results`)."""
    return make_release_results(tmp_path_factory.mktemp("release"), "/home/alice/export.py(12): forward")


@pytest.fixture
def results(base_results, tmp_path, monkeypatch):
    """A private copy of the base results (tests write releases into it)."""
    dest = tmp_path / "results"
    shutil.copytree(base_results, dest)
    # latest.json points at the variants folder relative to results/variants: still valid in the copy
    monkeypatch.chdir(tmp_path)
    return dest


def release(results, tag, *extra):
    return main(["release", "--tag", tag, "--results", str(results), *extra])


def write_tar(path, members):
    """A gzip'd tar from (TarInfo, bytes or None) pairs, with the gzip header quantbench writes."""
    import gzip
    import io
    import tarfile

    with open(path, "wb") as raw, gzip.GzipFile(filename="", mode="wb", fileobj=raw, compresslevel=9, mtime=0) as gz, \
            tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for ti, data in members:
            tar.addfile(ti, data if hasattr(data, "read") or data is None else io.BytesIO(data))


def run_read_only(folder, argv, cwd):
    """`quantbench ARGV` in a subprocess that sees `folder` read-only (non-root: chmod -R a-w; root, whom
    permissions do not stop: a read-only bind mount in a private mount namespace, gone with the process)."""
    import os
    import subprocess
    import sys

    repo = str(Path(__file__).resolve().parents[1])
    cmd = [sys.executable, "-m", "quantbench", *argv]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([repo, os.environ.get("PYTHONPATH", "")]))  # a mask's copy stays
    if os.geteuid() != 0:
        modes = {p: p.stat().st_mode for p in [Path(folder), *Path(folder).rglob("*")] if not p.is_symlink()}
        for p, m in modes.items():
            p.chmod(m & ~0o222)
        try:
            return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
        finally:
            for p, m in modes.items():
                p.chmod(m)
    if not shutil.which("unshare"):
        missing_setup("needs unshare(1) to make a folder read-only for root")
    script = 'mount --bind "$1" "$1" && mount -o remount,bind,ro "$1" || exit 97; shift; exec "$@"'
    p = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", script, "sh", str(folder), *cmd],
                       cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    if p.returncode == 97:
        missing_setup(f"cannot bind-mount read-only here: {p.stderr.strip()}")
    return p


# ---- a commissioning kit run as a device runs it (tests/release/test_commission*.py) ----

#: check.py as a device runs it: its own interpreter, `quantbench` unimportable (a device has none)
DEVICE = ("import runpy, sys; sys.modules['quantbench'] = None; sys.argv = sys.argv[1:]; "
          "runpy.run_path(sys.argv[0], run_name='__main__')")


def run_check(kit: Path, *args, prefix=(sys.executable,), env=None) -> subprocess.CompletedProcess:
    return subprocess.run([*prefix, "-c", DEVICE, str(kit / "check.py"), *args], capture_output=True, text=True,
                          timeout=1800, env=env, cwd=kit.parent)


def commission(results, out, *extra) -> int:
    return main(["commission", "--results", str(results), "--out", str(out), *extra])
