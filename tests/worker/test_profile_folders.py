"""A worker profiles its first run of a session in a folder named after its owner (pid@host): a worker killed
mid-run leaves it behind ($TMPDIR/quantbench-profile-* piled up), so the next worker sweeps the folders whose
owner is gone, and never a live worker's."""

from __future__ import annotations

import os
import subprocess
import sys

from hosts_helpers import image_model
from quantbench import worker


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def test_a_dead_workers_profile_folder_is_swept_and_a_live_ones_kept(tmp_path):
    host = worker.session._owner().split("@")[1]
    dead = tmp_path / f"{worker.PROFILE_PREFIX}{_dead_pid()}@{host}-abc123"
    live = tmp_path / f"{worker.PROFILE_PREFIX}{os.getppid()}@{host}-def456"
    elsewhere = tmp_path / f"{worker.PROFILE_PREFIX}{_dead_pid()}@00000000-ghi789"   # another machine's
    unnamed = tmp_path / f"{worker.PROFILE_PREFIX}jkl012"                              # an older quantbench's
    for d in (dead, live, elsewhere, unnamed):
        d.mkdir()
        (d / "run_1.json").write_text("[]")
    model = image_model(tmp_path / "m.onnx")
    sess = worker.make_session(str(model), worker.normalize_session(None), profile=True, scratch=str(tmp_path))[0]
    assert not dead.exists()
    assert live.is_dir() and elsewhere.is_dir() and unnamed.is_dir()
    mine = [p for p in tmp_path.iterdir() if p.name.startswith(f"{worker.PROFILE_PREFIX}{os.getpid()}@{host}-")]
    assert len(mine) == 1   # this session's own, named after this process
    import numpy as np

    inp = sess.get_inputs()[0]
    sess.run(None, {inp.name: np.zeros([d if isinstance(d, int) else 1 for d in inp.shape], np.float32)})
    assert worker.read_placement(sess)
    assert not mine[0].exists()   # ended and removed as before
