"""A command SIGKILLed at a known point leaves nothing behind once the next run has finished.

Each kill happens inside the child process itself, at a point chosen by patching one
function in that process (never by timing): the temporary folders of model intake
(once under the system temp folder), the temporary file of a table part being written,
and the forked report child (quantbench/report/forkedfiles.py), which outlived its killed parent and
kept the tables lock.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from calib_helpers import make_corpus, tiny_model
from hosts_helpers import make_corpus as eval_corpus
from run_helpers import variants_folder
from quantbench.store import partread, tablelock
from quantbench.cli import main
from quantbench.errors import UserError

TESTS = str(Path(__file__).resolve().parents[1])
REPO = str(Path(__file__).resolve().parents[2])

KILL_IN_PRE_PROCESS = """
import os, signal, sys
sys.path[:0] = [{repo!r}]
import onnxruntime.quantization.shape_inference as si
def killed(*args, **kwargs):  # intake's temporary folders exist now
    os.kill(os.getpid(), signal.SIGKILL)
si.quant_pre_process = killed
from quantbench.cli import main
sys.exit(main({argv!r}))
"""

KILL_WRITING_OUTPUTS = """
import contextlib, os, signal, sys
from pathlib import Path
sys.path[:0] = [{repo!r}]
from quantbench.store import partwrite
real = partwrite.atomic_path
@contextlib.contextmanager
def killing(path, suffix=""):
    with real(path, suffix) as tmp:
        yield tmp
        if Path(path).parent.name == "outputs":  # the part's bytes are in its temporary file, not yet renamed
            os.kill(os.getpid(), signal.SIGKILL)
partwrite.atomic_path = killing
from quantbench.cli import main
sys.exit(main({argv!r}))
"""

KILL_IN_ORT_TEMP = """
import os, signal, sys
from pathlib import Path
sys.path[:0] = [{repo!r}]
import onnxruntime
from onnxruntime.quantization import quant_utils
real_session, real_load = onnxruntime.InferenceSession, quant_utils.load_model_with_shape_infer
def _kill_in(path, prefix):  # onnxruntime's own temporary folder holds a model now
    if Path(str(path)).parent.name.startswith(prefix) and Path(str(path)).is_file():
        os.kill(os.getpid(), signal.SIGKILL)
def session(model, *args, **kwargs):  # quant_pre_process's optimizer pass on pre.quant.*/preprocessed.onnx
    if isinstance(model, (str, os.PathLike)):
        _kill_in(model, {prefix!r})
    return real_session(model, *args, **kwargs)
def load(path):  # save_and_reload_model_with_shape_infer's ort.quant.*/model.onnx
    _kill_in(path, {prefix!r})
    return real_load(path)
onnxruntime.InferenceSession, quant_utils.load_model_with_shape_infer = session, load
from quantbench.cli import main
sys.exit(main({argv!r}))
"""

KILL_WRITING_PNG = """
import contextlib, os, signal, sys
from pathlib import Path
sys.path[:0] = [{repo!r}]
from quantbench.report import charts, gallery
def killing(real):
    @contextlib.contextmanager
    def atomic_path(path, suffix=""):
        with real(path, suffix) as tmp:
            yield tmp
            if Path(path).parent.name == {folder!r} and Path(path).suffix == ".png":  # drawn, not yet renamed
                os.kill(os.getpid(), signal.SIGKILL)
    return atomic_path
charts.atomic_path, gallery.atomic_path = killing(charts.atomic_path), killing(gallery.atomic_path)
from quantbench.cli import main
sys.exit(main({argv!r}))
"""

AHEAD_UNDER_LOCK = """
import os, sys, time
sys.path[:0] = [{repo!r}]
from pathlib import Path
from quantbench.store import tablelock
from quantbench.report.forkedfiles import Ahead
def blocked():  # the child's job: say it started, then never end
    Path({started!r}).write_text(str(os.getpid()))
    while True:
        time.sleep(1)
with tablelock.lock({root!r}):
    a = Ahead([blocked])
    while True:
        time.sleep(1)
"""


def _killed(script: str, env=None) -> None:
    proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]


def _in_temp(folder: Path) -> list[str]:
    """What is in the (private) system temp folder, but onnxruntime's own `.ses` file (its native library
    writes it there when it loads)."""
    return sorted(p.name for p in folder.iterdir() if p.name != ".ses")


def _leftovers(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.name.endswith(".tmp")
                  or p.name.startswith("qb-"))


def test_killed_calibrate_leaves_no_intake_folder_in_the_system_temp_folder(workdir):
    """Was: qb-intake-* folders (a copy of the model) stayed in the system temp folder after a killed calibrate."""
    labels, _ = make_corpus(workdir / "corpus", n_litter=8, n_negative=8, n_eval=4)
    model = tiny_model(workdir / "m.onnx")
    argv = ["calibrate", "--model", str(model), "--labels", str(labels), "--per-cell", "2", "--methods", "dynamic",
            "--no-progress"]
    systmp = workdir / "systmp"
    systmp.mkdir()
    _killed(KILL_IN_PRE_PROCESS.format(repo=REPO, argv=argv), env={**os.environ, "TMPDIR": str(systmp)})
    assert _in_temp(systmp) == []
    assert _leftovers(workdir / "results") != []  # the killed run's stage, for the next run to remove
    assert main(argv) == 0
    assert _leftovers(workdir / "results") == [] and _in_temp(systmp) == []


@pytest.mark.parametrize("prefix, opset, extra", [
    ("pre.quant.", 17, []),                       # quant_pre_process: pre.quant.*/preprocessed.onnx
    ("ort.quant.", 10, ["--no-per-channel"]),     # save_and_reload_model_with_shape_infer of an opset-10 model
    ("ort.quant.", 9, ["--no-per-channel", "--no-pre-process", "--methods", "minmax"]),  # qdq_quantize: opset 9 to 11
    ("ort.quant.", 10, ["--no-per-channel", "--no-pre-process"]),  # ... in quantize_dynamic
])
def test_killed_calibrate_leaves_no_onnxruntime_temp_folder_in_the_system_temp_folder(workdir, prefix, opset, extra):
    """Was: $TMPDIR/pre.quant.*/preprocessed.onnx and $TMPDIR/ort.quant.* (onnxruntime's own temporary folders)
    stayed after calibrate was SIGKILLed in them; now they are made in the run's staging folder, which the next
    run removes."""
    labels, _ = make_corpus(workdir / "corpus", n_litter=8, n_negative=8, n_eval=4)
    model = tiny_model(workdir / "m.onnx", opset=opset)
    argv = ["calibrate", "--model", str(model), "--labels", str(labels), "--per-cell", "2", "--methods", "dynamic",
            "--no-progress", *extra]
    systmp = workdir / "systmp"
    systmp.mkdir()
    _killed(KILL_IN_ORT_TEMP.format(repo=REPO, argv=argv, prefix=prefix), env={**os.environ, "TMPDIR": str(systmp)})
    assert _in_temp(systmp) == []
    left = [p for p in (workdir / "results").rglob(f"{prefix}*") if p.is_dir()]
    assert left and all(any(f.suffix == ".onnx" for f in p.iterdir()) for p in left), left  # killed in there
    assert main(argv) == 0
    assert _leftovers(workdir / "results") == [] and _in_temp(systmp) == []
    assert not list((workdir / "results").rglob(f"{prefix}*"))


def test_part_file_of_a_killed_run_is_removed_by_the_next_run(workdir):
    """Was: .part-*.tmp files under results/tables/* stayed after the successful rerun."""
    vdir = variants_folder(workdir / "v")
    labels = eval_corpus(workdir / "corpus")
    argv = ["run", "--hosts", "x86", "--variants", str(vdir), "--fixtures", str(labels), "--no-progress"]
    systmp = workdir / "systmp"
    systmp.mkdir()
    _killed(KILL_WRITING_OUTPUTS.format(repo=REPO, argv=argv), env={**os.environ, "TMPDIR": str(systmp)})
    tdir = workdir / "results" / "tables"
    assert [p for p in _leftovers(tdir) if p.startswith("outputs/.part-")] != []
    assert _in_temp(systmp) == []  # the input store too is in the results folder, not the system temp folder
    assert main(argv) == 0
    assert _leftovers(tdir) == []
    assert partread.read("outputs", tdir).num_rows == 3


@pytest.mark.parametrize("folder", ["plots", "gallery"])
def test_png_of_a_killed_equiv_is_removed_by_the_next_run(workdir, folder):
    """Was: results/plots/.*.png.*.tmp and results/report.d/gallery/.*.png.*.tmp (a plot or flip thumbnail drawn
    by a SIGKILLed equiv, not yet renamed) survived the successful rerun."""
    from bench_helpers import make_bench

    vdir, labels = make_bench(workdir / "bench")
    argv = ["equiv", "--hosts", "x86", "--variants", str(vdir), "--fixtures", str(labels), "--no-progress"]
    _killed(KILL_WRITING_PNG.format(repo=REPO, argv=argv, folder=folder))
    where = workdir / "results" / ("plots" if folder == "plots" else "report.d/gallery")
    assert [p.name for p in where.iterdir() if p.name.endswith(".png.tmp")] != []
    assert main(argv) == 0
    assert _leftovers(workdir / "results") == []
    assert any(where.glob("*.png"))


def test_forked_report_child_dies_with_its_killed_parent(workdir):
    """Was: the forked plot/gallery child kept running after its parent was killed, holding the tables lock."""
    root, started = workdir / "tables", workdir / "started"
    proc = subprocess.Popen([sys.executable, "-c", AHEAD_UNDER_LOCK.format(repo=REPO, root=str(root),
                                                                           started=str(started))])
    try:
        for _ in range(3000):  # the child has started its job (a known point, not a guessed delay)
            if started.exists() and started.read_text():
                break
            assert proc.poll() is None
            time.sleep(0.01)
        child = int(started.read_text())
    finally:
        proc.kill()
        proc.wait()
    try:
        for _ in range(3000):  # the kernel kills the child at once; this only bounds a failure
            try:
                with tablelock.lock(root, wait=False):
                    break
            except UserError:
                time.sleep(0.01)
        else:
            raise AssertionError("the tables lock is still held after the parent was killed")
    finally:
        try:
            os.kill(child, signal.SIGKILL)
        except ProcessLookupError:
            pass
