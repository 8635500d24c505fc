"""A command SIGKILLed at a known point leaves nothing behind once the next run has finished.

Each kill happens inside the child process itself, at a point chosen by patching one
function in that process (never by timing): the temporary folders of model intake
(once under the system temp folder), the temporary file of a table part being written,
and the forked report child (quantbench/ahead.py), which outlived its killed parent and
kept the tables lock.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from calib_helpers import make_corpus, tiny_model
from hosts_helpers import make_corpus as eval_corpus
from run_helpers import variants_folder
from quantbench import tables
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
from quantbench import tables
real = tables.atomic_path
@contextlib.contextmanager
def killing(path, suffix=""):
    with real(path, suffix) as tmp:
        yield tmp
        if Path(path).parent.name == "outputs":  # the part's bytes are in its temporary file, not yet renamed
            os.kill(os.getpid(), signal.SIGKILL)
tables.atomic_path = killing
from quantbench.cli import main
sys.exit(main({argv!r}))
"""

AHEAD_UNDER_LOCK = """
import os, sys, time
sys.path[:0] = [{repo!r}]
from pathlib import Path
from quantbench import tables
from quantbench.ahead import Ahead
def blocked():  # the child's job: say it started, then never end
    Path({started!r}).write_text(str(os.getpid()))
    while True:
        time.sleep(1)
with tables.lock({root!r}):
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
    assert tables.read("outputs", tdir).num_rows == 3


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
                with tables.lock(root, wait=False):
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
