"""A model saved with external data (`onnx.save(..., save_as_external_data=True)`).

Was: calibrate refused it with an internal temporary path in the message (the data file
was not carried along). Now data inside the model's folder works end to end: calibrate
(variants written self-contained), the semantic hash (that of the same model embedded),
run/equiv on local, emulated and ssh hosts (the worker gets the model with its data
embedded); data outside the folder is refused by name, nothing written.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from calib_helpers import make_corpus, tiny_model
from hosts_helpers import fixtures, matmul_model, variant
from hosts_helpers import make_corpus as eval_corpus
from run_helpers import variants_folder
from quantbench.fsutil import sha256_file
from quantbench.store import partread
from quantbench.cli import main
from quantbench.store import hostresults
from quantbench.runs.runner import run_hosts
from quantbench.tensorcode import tensor_sha256
from quantbench.inputs.modelio import external_data_files, raw_sha256, semantic_sha256
from quantbench.inputs.variantdir import latest_variants


def external(src: Path, folder: Path, location: str = "weights.bin") -> Path:
    """`src` saved into `folder` with every tensor in one external data file (and its sidecar, if any)."""
    folder.mkdir(parents=True, exist_ok=True)
    dest = folder / src.name
    onnx.save(onnx.load(str(src)), str(dest), save_as_external_data=True, all_tensors_to_one_file=True,
              location=location, size_threshold=0)
    if src.with_suffix(".json").exists():
        shutil.copy(src.with_suffix(".json"), dest.with_suffix(".json"))
    assert external_data_files(dest) == [(folder / location).resolve()]
    return dest


@pytest.fixture
def corpus(workdir):
    return make_corpus(workdir / "corpus", n_litter=8, n_negative=8, n_eval=4)


def test_calibrate_a_model_with_external_data_writes_self_contained_variants(workdir, corpus, capsys):
    labels, _ = corpus
    plain = tiny_model(workdir / "plain" / "m.onnx")
    model = external(plain, workdir / "export")
    rc = main(["calibrate", "--model", str(model), "--labels", str(labels), "--per-cell", "2",
               "--methods", "dynamic,minmax", "--no-progress"])
    assert rc == 0, capsys.readouterr().err
    vs = {v.name: v for v in latest_variants()}
    assert set(vs) == {"fp32", "dynamic", "static-minmax"}
    for v in vs.values():
        assert external_data_files(v.path) == []  # one file each: nothing to carry
    assert vs["fp32"].recipe["semantic_sha256"] == semantic_sha256(model) == semantic_sha256(plain)
    x = np.random.default_rng(0).random((1, 3, 16, 16), dtype=np.float32)
    want = ort.InferenceSession(str(plain), providers=["CPUExecutionProvider"]).run(None, {"images": x})
    got = ort.InferenceSession(str(vs["fp32"].path), providers=["CPUExecutionProvider"]).run(None, {"images": x})
    assert [tensor_sha256(a) for a in got] == [tensor_sha256(a) for a in want]
    # and on through equiv, release and verify (which re-runs the retained artifacts)
    assert main(["equiv", "--hosts", "x86", "--fixtures", str(labels), "--no-progress", "-q"]) == 0
    assert main(["release", "--tag", "v1"]) == 0
    capsys.readouterr()
    assert main(["verify", "results/releases/v1", "--host", "x86", "--sample", "2"]) == 0
    assert "FAIL" not in capsys.readouterr().out


def test_external_data_outside_the_model_folder_is_refused_by_name(workdir, corpus, capsys):
    labels, _ = corpus
    model = external(tiny_model(workdir / "plain" / "m.onnx"), workdir / "export" / "model")
    m = onnx.load(str(model), load_external_data=False)
    (workdir / "export" / "model" / "weights.bin").rename(workdir / "export" / "weights.bin")
    for t in m.graph.initializer:
        for e in t.external_data:
            if e.key == "location":
                e.value = "../weights.bin"
    model.write_bytes(m.SerializeToString())
    rc = main(["calibrate", "--model", str(model), "--labels", str(labels), "--per-cell", "2", "--methods", "dynamic"])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and "Traceback" not in err
    assert f"{model}: tensor " in err and "'../weights.bin', outside the model's folder" in err
    assert not (workdir / "results").exists() and not (workdir / "calib_sets").exists()


def _hashes(root, host):
    rows = hostresults.load_outputs(host=host, tables_root=root).to_pylist()
    return sorted((r["fixture_id"], r["output_name"], r["sha256"]) for r in rows)


def test_local_run_of_a_model_with_external_data_matches_the_embedded_model(workdir):
    (workdir / "plain").mkdir()
    plain = matmul_model(workdir / "plain" / "m.onnx")
    model = external(plain, workdir / "export")
    fxs = fixtures(3)
    run_hosts(["x86"], [variant(plain)], fxs, progress=False, tables_root=workdir / "a", jobs=1)
    s = run_hosts(["x86"], [variant(model)], fxs, progress=False, tables_root=workdir / "b", jobs=1)
    assert (s.hosts[0].ran, s.errors) == (3, [])
    assert _hashes(workdir / "b", "x86") == _hashes(workdir / "a", "x86") and len(_hashes(workdir / "b", "x86")) == 6
    assert partread.read("models", workdir / "b").column("variant_id").to_pylist() == [semantic_sha256(plain)]


@pytest.mark.slow
def test_emulated_pi_runs_a_model_with_external_data(workdir):
    from quantbench.hosts import emulated
    from setup_required import missing_setup

    ok, msg = emulated.ready("pi")
    if not ok:
        missing_setup(f"pi not set up: {msg}")
    (workdir / "plain").mkdir()
    plain = matmul_model(workdir / "plain" / "m.onnx")
    model = external(plain, workdir / "export")
    fxs = fixtures(2)
    s = run_hosts(["pi"], [variant(model)], fxs, progress=False, tables_root=workdir / "t", jobs=1)
    assert (s.hosts[0].ran, s.errors) == (2, [])
    run_hosts(["pi"], [variant(plain)], fxs, progress=False, tables_root=workdir / "u", jobs=1)
    assert _hashes(workdir / "t", "pi") == _hashes(workdir / "u", "pi")


@pytest.mark.ssh
def test_ssh_host_runs_a_model_with_external_data(workdir, sshd):
    """The remote gets the model with its data (a path on this machine would mean nothing there)."""
    from ssh_helpers import ssh_machine_is_this_cpu

    ssh_machine_is_this_cpu()
    (workdir / "plain").mkdir()
    plain = matmul_model(workdir / "plain" / "m.onnx")
    model = external(plain, workdir / "export")
    fxs = fixtures(2)
    s = run_hosts(["robot", "x86"], [variant(model)], fxs, hosts_file=sshd, progress=False, tables_root=workdir / "t",
                  jobs=2)
    assert [(h.name, h.ran, h.errors) for h in s.hosts] == [("robot", 2, []), ("x86", 2, [])]
    assert _hashes(workdir / "t", "robot") == _hashes(workdir / "t", "x86") != []


def test_release_retains_a_variant_with_external_data_as_one_file_and_verify_passes(workdir, capsys):
    vdir = variants_folder(workdir / "v")
    m = vdir / "fp32.onnx"
    onnx.save(onnx.load(str(m)), str(m), save_as_external_data=True, all_tensors_to_one_file=True,
              location="fp32.weights", size_threshold=0)
    assert external_data_files(m) == [(vdir / "fp32.weights").resolve()]
    labels = eval_corpus(workdir / "corpus")
    assert main(["equiv", "--hosts", "x86", "--variants", str(vdir), "--fixtures", str(labels), "--no-progress",
                 "--decode", "none", "-q"]) == 0
    assert main(["release", "--tag", "v1", "--variants", str(vdir)]) == 0
    folder = workdir / "results" / "releases" / "v1"
    (v,) = json.loads((folder / "release.json").read_text())["variants"]
    artifact = folder / v["artifact"]["file"]
    assert external_data_files(artifact) == [] and sorted(p.name for p in artifact.parent.iterdir()) == ["fp32.onnx"]
    assert v["raw_sha256"] == sha256_file(artifact) == raw_sha256(m) and v["semantic_sha256"] == semantic_sha256(m)
    capsys.readouterr()
    assert main(["verify", str(folder), "--host", "x86", "--sample", "2"]) == 0
    assert "FAIL" not in capsys.readouterr().out
