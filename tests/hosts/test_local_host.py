"""The local host through the runner: tables, cache, fingerprint changes, bad input, failures."""

import json
import sys
import textwrap

import numpy as np
import onnxruntime as ort
import pytest

from hosts_helpers import fixtures, gather_model, host_results_index, image_model, make_corpus, matmul_model, variant
from quantbench.store import partread
from quantbench.errors import UserError
from quantbench.store import hostresults
from quantbench.hosts.registry import load_hosts_file, resolve_hosts
from quantbench.runs.runner import RunFailed, run_hosts
from quantbench.tensorcode import tensor_sha256


def _parts(root):
    return len(partread.parts("outputs", root))


def test_local_run_tables_and_cache(workdir):
    model = matmul_model(workdir / "m.onnx")
    fxs = fixtures(4)
    root = workdir / "t"
    s = run_hosts(["x86"], [variant(model)], fxs, progress=False, tables_root=root, jobs=2)
    h = s.hosts[0]
    assert (h.ran, h.cached, h.errors) == (4, 0, [])
    out = hostresults.load_outputs(host="x86", tables_root=root).to_pylist()
    assert len(out) == 8 and {r["output_name"] for r in out} == {"logits", "probs"}
    sess = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    for fx in fxs:
        want = dict(zip(["logits", "probs"], sess.run(None, {"x": fx.array})))
        rows = [r for r in out if r["fixture_id"] == fx.fixture_id]
        for r in rows:
            assert r["sha256"] == tensor_sha256(want[r["output_name"]])
            assert np.array_equal(hostresults.tensor_from_row(r), want[r["output_name"]])
            assert r["providers"] == ["CPUExecutionProvider"] and r["fingerprint_id"] == h.fingerprint_id
    hosts = partread.read("hosts", root).to_pylist()
    assert [(r["host"], r["kind"], r["fingerprint_id"]) for r in hosts] == [("x86", "local", h.fingerprint_id)]
    assert hosts[0]["ort_version"] == ort.__version__
    assert partread.read("models", root).num_rows == 1
    stored = {r["fixture_id"]: r for r in partread.read("fixtures", root).to_pylist()}
    assert set(stored) == {fx.fixture_id for fx in fxs}
    for fx in fxs:  # the tensor column holds each input's canonical bytes, hashing to its id
        r = stored[fx.fixture_id]
        assert r["tensor"] == fx.array.astype("<f4").tobytes() and r["shape"] == list(fx.array.shape)
        assert tensor_sha256(np.frombuffer(r["tensor"], r["dtype"]).reshape(r["shape"])) == fx.fixture_id
    fixture_parts = partread.parts("fixtures", root)
    idx = host_results_index(root)
    assert len(idx) == 8
    before = _parts(root)
    again = run_hosts(["x86"], [variant(model)], fxs, progress=False, tables_root=root, jobs=1)
    assert (again.hosts[0].ran, again.hosts[0].cached) == (0, 4)
    assert _parts(root) == before  # nothing new written
    more = fixtures(6)  # two new fixtures: only they are added to the fixtures table
    run_hosts(["x86"], [variant(model)], more, progress=False, tables_root=root, jobs=1)
    new_parts = [p for p in partread.parts("fixtures", root) if p not in fixture_parts]
    assert len(new_parts) == 1 and partread.read("fixtures", root).num_rows == 6
    import pyarrow.parquet as pq

    assert pq.read_table(new_parts[0]).num_rows == 2


def test_changed_fingerprint_never_reuses_cache(workdir):
    """Another session option, or another onnxruntime version (faked: it cannot exist here), reruns everything."""
    model = matmul_model(workdir / "m.onnx")
    fxs = fixtures(3)
    root = workdir / "t"
    base = run_hosts(["x86"], [variant(model)], fxs, progress=False, tables_root=root, jobs=1).hosts[0]
    opt = run_hosts(["x86"], [variant(model)], fxs, progress=False, tables_root=root, jobs=1,
                    session={"config_entries": {"session.x64quantprecision": "1"}}).hosts[0]
    assert (opt.ran, opt.cached) == (3, 0) and opt.fingerprint_id != base.fingerprint_id
    # A shim interpreter whose onnxruntime reports another version: same host name, other fingerprint.
    shim = workdir / "shim.py"
    shim.write_text(textwrap.dedent("""
        import runpy, sys
        import onnxruntime
        onnxruntime.__version__ = "1.99.0"
        worker = sys.argv[-1]
        sys.argv = [worker]
        runpy.run_path(worker, run_name="__main__")
    """))
    py = workdir / "python-shim"
    py.write_text(f"#!/bin/sh\nexec {sys.executable} {shim} \"$@\"\n")
    py.chmod(0o755)
    hf = workdir / "hosts.toml"
    hf.write_text(f'x86 = {{ kind = "local", python = "{py}", override = true }}\n')
    fake = run_hosts(["x86"], [variant(model)], fxs, progress=False, tables_root=root, jobs=1, hosts_file=hf).hosts[0]
    assert (fake.ran, fake.cached) == (3, 0)
    assert fake.fingerprint_id not in (base.fingerprint_id, opt.fingerprint_id)
    versions = {r["fingerprint_id"]: r["ort_version"] for r in partread.read("hosts", root).to_pylist()}
    assert versions[fake.fingerprint_id] == "1.99.0" and versions[base.fingerprint_id] == ort.__version__
    # each fingerprint's results are separate rows; the default session is still cached under the real version
    assert hostresults.load_outputs(host="x86", tensors=False, tables_root=root).num_rows == 3 * 3 * 2
    back = run_hosts(["x86"], [variant(model)], fxs, progress=False, tables_root=root, jobs=1).hosts[0]
    assert (back.ran, back.cached, back.fingerprint_id) == (0, 3, base.fingerprint_id)


def test_worker_exception_reports_host_variant_fixture_and_keeps_results(workdir):
    model = gather_model(workdir / "g.onnx")
    fxs = fixtures(4, first_values=[1, 2, 9, 3])
    root = workdir / "t"
    with pytest.raises(RunFailed) as err:
        run_hosts(["x86"], [variant(model, name="gathered")], fxs, progress=False, tables_root=root, jobs=1)
    msg = str(err.value)
    assert "host x86" in msg and "variant gathered" in msg and fxs[2].fixture_id[:12] in msg and "fx02.png" in msg
    kept = set(hostresults.load_outputs(tensors=False, tables_root=root).column("fixture_id").to_pylist())
    assert kept == {fxs[0].fixture_id, fxs[1].fixture_id}
    assert err.value.summary.hosts[0].ran == 2


def test_unresolved_provider_is_an_error_when_required(workdir):
    model = matmul_model(workdir / "m.onnx")
    root = workdir / "t"
    with pytest.raises(RunFailed, match="providers are required: CUDAExecutionProvider is not available"):
        run_hosts(["x86"], [variant(model)], fixtures(1), progress=False, tables_root=root, jobs=1,
                  session={"providers": ["CUDAExecutionProvider", "CPUExecutionProvider"]}, require_providers=True)
    assert hostresults.load_outputs(tables_root=root).num_rows == 0


def test_unknown_host_lists_known_names(workdir):
    with pytest.raises(UserError) as err:
        resolve_hosts(["x86", "raspberry"])
    msg = str(err.value)
    assert "unknown host 'raspberry'" in msg
    for name in ("x86", "local", "pi", "pi4"):
        assert name in msg
    (workdir / "quantbench.toml").write_text('robot = { kind = "ssh", address = "pi@robot.local" }\n')
    assert resolve_hosts(["robot"])[0].options["address"] == "pi@robot.local"
    with pytest.raises(UserError, match="robot"):
        resolve_hosts(["nope"])


@pytest.mark.parametrize("text, line, words", [
    ('x86 = { kind = "local" }\npi = { kind = "ssh", address = "pi@robot" \n', 2, "not valid TOML"),
    ('x86 = { kind = "local", override = true }\n\nlab = { kind = "qemu" }\n', 3, "kind 'qemu'"),
    ('[hosts]\nbox = { kind = "ssh" }\n', 2, "needs address"),
    ('pi = { kind = "ssh", address = "a@b", pasword = "x" }\n', 1, "unknown option(s) pasword"),
    ('pi = "pi@robot"\n', 1, "must be a table"),
    ('lab = { kind = "emulated", preset = "pi9" }\n', 1, "unknown preset 'pi9'"),
])
def test_malformed_hosts_file_names_the_line(workdir, text, line, words):
    f = workdir / "hosts.toml"
    f.write_text(text)
    with pytest.raises(UserError) as err:
        load_hosts_file(f)
    assert f"{f}:{line}" in str(err.value) and words in str(err.value)


def test_hosts_file_redefines_builtin_names(workdir):
    (workdir / "quantbench.toml").write_text(
        '[hosts]\npi = { kind = "ssh", address = "pi@robot.local", ssh_options = ["-p", "2222"], override = true }\n'
        'lab = { kind = "emulated", preset = "pi4" }\nair = { kind = "imported", file = "x.qbr" }\n')
    pi, lab, air, x86 = resolve_hosts(["pi", "lab", "air", "x86"])
    assert (pi.kind, pi.options["ssh_options"]) == ("ssh", ["-p", "2222"])
    assert (lab.kind, lab.options["preset"]) == ("emulated", "pi4")
    assert air.options["file"] == str(workdir / "x.qbr") and x86.kind == "local"
    with pytest.raises(UserError, match="hosts file not found"):
        resolve_hosts(["x86"], hosts_file=workdir / "missing.toml")


def test_hosts_commands(workdir, capsys):
    from quantbench.cli import main

    (workdir / "quantbench.toml").write_text('robot = { kind = "ssh", address = "pi@robot.local" }\n'
                                             'air = { kind = "imported", file = "none.qbr" }\n')
    assert main(["hosts", "list"]) == 0
    out = capsys.readouterr().out
    lines = {ln.split()[0]: ln for ln in out.splitlines()[1:]}
    assert {"x86", "local", "pi", "pi4", "robot", "air"} <= set(lines)
    assert "quantbench.toml:1" in lines["robot"] and " ssh " in lines["robot"]
    assert " no " in lines["air"] and "results file not found" in lines["air"]
    assert main(["hosts", "check", "x86", "--session-config", "session.x64quantprecision=1"]) == 0
    out = capsys.readouterr().out
    assert "fingerprint" in out and "resolved CPUExecutionProvider" in out and "(same as this machine)" in out
    assert "session.x64quantprecision" in out
    assert main(["hosts", "check", "nowhere"]) == 2
    assert "hosts check: unknown host 'nowhere'; known hosts:" in capsys.readouterr().err


def test_a_worker_importing_another_version_than_its_runtime_is_refused(workdir, monkeypatch, capsys):
    """A host carries its runtime's onnxruntime version (pi4@1.20.1); a worker that imports another one is a
    stale setup, refused in one line naming the setup command. qemu start-up is not the point here, so the
    preset's command is this interpreter (which imports the local version, not 1.20.1)."""
    import quantbench.hosts.emulated as EM
    from quantbench.cli import main

    monkeypatch.setattr(EM, "ready", lambda name, rt=None, host=None, cpu=None: (True, "ready"))
    monkeypatch.setattr(EM, "python_command", lambda name, qemu_args=(), rt=None, cpu=None: ([sys.executable, "-u"], None))
    model = matmul_model(workdir / "m.onnx")
    root = workdir / "t"
    with pytest.raises(RunFailed, match=r"host pi4@1\.20\.1: its worker imported onnxruntime .*, not the 1\.20\.1 "
                                        r"of its runtime .*rerun `quantbench hosts setup pi4@1\.20\.1`"):
        run_hosts(["pi4@1.20.1"], [variant(model)], fixtures(1), progress=False, tables_root=root, jobs=1)
    assert hostresults.load_outputs(tables_root=root).num_rows == 0
    argv = ["run", "--hosts", "pi4@1.20.1", "--variants", str(image_model(workdir / "i.onnx")), "--fixtures",
            str(make_corpus(workdir / "corpus")), "--no-progress", "--jobs", "1", "--tables", "c"]
    assert main(argv) == 2
    assert "rerun `quantbench hosts setup pi4@1.20.1`; finished results are kept" in capsys.readouterr().err
    s = run_hosts(["pi"], [variant(model)], fixtures(1), progress=False, tables_root=root, jobs=1)
    assert s.hosts[0].ran == 1 and s.hosts[0].kind == "emulated"  # the host's own version: no refusal
