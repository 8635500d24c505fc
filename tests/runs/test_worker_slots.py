"""--jobs: a non-positive count is refused (it meant "all cores" or 1 by accident); a count above the usable
cores is capped, with a note saying so (more workers than cores only made runs slower)."""

import json
import os

import pytest

from hosts_helpers import fixtures, matmul_model, variant
from quantbench.cli import main
from quantbench.errors import ParameterError
from quantbench.runs.runner import capped_jobs, run_hosts, usable_cores, worker_slots


@pytest.mark.parametrize("command", ["run", "equiv"])
@pytest.mark.parametrize("jobs", ["0", "-3"])
def test_non_positive_jobs_refused_before_anything(workdir, capsys, command, jobs):
    assert main([command, "--hosts", "x86", "--jobs", jobs, "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err == f"quantbench {command}: error: --jobs {jobs}: must be at least 1 (leave it out for one worker per core)\n"
    assert os.listdir(workdir) == []  # nothing written, not even the lock


def test_library_refuses_non_positive_jobs(workdir):
    model = matmul_model(workdir / "m.onnx")
    with pytest.raises(ParameterError, match=r"^jobs=0: must be at least 1"):
        run_hosts(["x86"], [variant(model)], fixtures(2), progress=False, tables_root=workdir / "t", jobs=0)
    assert not (workdir / "t").exists()


def test_jobs_above_cores_are_capped_with_a_note(workdir, capsys):
    cores = usable_cores()
    assert capped_jobs(10000) == (cores, f"using {cores} jobs: this machine has {cores} cores")
    assert capped_jobs(cores) == (cores, None) and capped_jobs(None) == (None, None)
    # the library takes an explicit count as given (tests ask for two workers on one core); the command caps it
    assert worker_slots(10000) == 10000 and worker_slots(None) == cores
    assert main(["run", "--hosts", "x86", "--limit", "8", "--jobs", "10000", "--no-progress", "--json"]) == 0
    cap = capsys.readouterr()
    # the demo's own announcement comes first (no calibrate output here), then the note; on stderr with --json
    assert cap.err.splitlines()[0].startswith("demo: "), cap.err
    assert cap.err.splitlines()[1] == f"note: using {cores} jobs: this machine has {cores} cores", cap.err
    summary = json.loads(cap.out)
    assert 1 <= summary["hosts"][0]["workers"] <= cores, summary["hosts"]
