"""An instruction trace of one model run: the guest's Python, started by a host that traces instructions
(`EmulatedHost.trace_run`: qemu-user with `-d in_asm -D LOG`), runs a small probe that loads onnxruntime the
way the worker does (the worker's session and fingerprint, its entry run with its sources: worker/jobs.py), runs the
fixtures and reports where onnxruntime's code is mapped in the guest (/proc/self/maps): what qemu's log is
read against (quantbench.explain.evidence). The probe is not a worker request: the trace must see one
process that loads onnxruntime and runs the model, with no protocol around it.
"""

from __future__ import annotations

import json
import subprocess
import tempfile
from pathlib import Path

import numpy as np

from quantbench.errors import UserError
from quantbench.hosts.process import WORKER_PATH
from quantbench import tensorcode

PROBE = r'''
import json, sys, time
spec = json.load(open(sys.argv[1]))
import runpy, types
import numpy as np
W = types.SimpleNamespace(**runpy.run_path(spec["worker_entry"], init_globals={"_SOURCES": None}))
session = W.normalize_session(spec["session"])
with open(spec["model"], "rb") as fh:
    sess, resolved, readback = W.make_session(fh.read(), session)
ranges = []
with open("/proc/self/maps") as fh:
    for line in fh:
        parts = line.split()
        if len(parts) >= 6 and "x" in parts[1] and "onnxruntime" in parts[5].rsplit("/", 1)[-1]:
            lo, hi = parts[0].split("-")
            ranges.append([int(lo, 16), int(hi, 16), parts[5]])
outs = []
for item in spec["inputs"]:
    arr = np.load(item["path"])
    res = sess.run(None, {item["input_name"]: arr})
    outs.append({"fixture_id": item["fixture_id"], "sha256": [W.tensor_sha256(o) for o in res]})
fp = W.collect_fingerprint(session, resolved, readback)
with open(spec["out"], "w") as fh:
    json.dump({"ranges": ranges, "outputs": outs, "fingerprint": fp, "fingerprint_id": W.fingerprint_id(fp),
               "providers": resolved}, fh)
'''


def run_probe(label: str, command, model_path, fixtures, session: dict, timeout: float | None = None) -> dict:
    """Run the probe on `fixtures` under `command(probe_argv) -> (argv, env)` (the tracing host's command line);
    returns {"ranges": [[lo, hi, file], ...], "outputs", "fingerprint", "fingerprint_id", "providers"}.
    A failed run, or one where onnxruntime's code is not found in the guest, is one UserError naming `label`."""
    with tempfile.TemporaryDirectory(prefix="qb-trace-") as tmp:
        tmp = Path(tmp)
        inputs = []
        for i, fx in enumerate(fixtures):
            p = tmp / f"in{i}.npy"
            np.save(p, tensorcode.canonical(fx.array))
            inputs.append({"path": str(p), "input_name": fx.input_name, "fixture_id": fx.fixture_id})
        spec = {"worker_entry": str(WORKER_PATH), "session": session,
                "model": str(Path(model_path).resolve()), "inputs": inputs, "out": str(tmp / "probe.json")}
        (tmp / "spec.json").write_text(json.dumps(spec))
        (tmp / "probe.py").write_text(PROBE)
        argv, env = command([str(tmp / "probe.py"), str(tmp / "spec.json")])
        proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout)
        if proc.returncode != 0 or not (tmp / "probe.json").exists():
            tail = (proc.stderr or "").strip().splitlines()[-1:] or [f"exit code {proc.returncode}"]
            raise UserError(f"host {label}: the evidence run failed under qemu ({tail[0]})")
        info = json.loads((tmp / "probe.json").read_text())
    if not info["ranges"]:
        raise UserError(f"host {label}: onnxruntime's code was not found in the guest's memory map")
    return info
