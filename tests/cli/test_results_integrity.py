"""Results stay whole and where they belong, whatever the input: calibrate never replaces results/, release
and verify keep to the folder and catch tampering, imports are re-hashed, a hosts file cannot take over a
built-in, one writer per tables folder. Each case asserts the exit code, the one-line message and that
nothing was written, nothing was lost and nothing landed outside the folder it belongs to."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from cli_helpers import LOCK_NAME, digest, one_line
from hosts_helpers import reseal_export
from quantbench.cli import main

# ---------------------------------------------------------------- calibrate --force never replaces results/


@pytest.fixture
def calib_setup(workdir):
    from calib_helpers import make_corpus, tiny_model

    labels, _ = make_corpus(workdir / "corpus", n_litter=4, n_negative=4, n_eval=2)
    model = tiny_model(workdir / "models" / "tiny.onnx")
    results = workdir / "results"
    for rel, text in (("tables/outputs/part-x.parquet", "rows"), ("report.md", "# report"),
                      ("releases/index.json", '{"keys": {}}'), ("releases/v1/release.json", "{}")):
        (results / rel).parent.mkdir(parents=True, exist_ok=True)
        (results / rel).write_text(text)
    return workdir, model, labels


def calibrate(model, labels, *extra):
    return main(["calibrate", "--model", str(model), "--labels", str(labels), "--methods", "dynamic",
                 "--per-cell", "2", *map(str, extra)])


def test_calibrate_force_refuses_to_replace_a_results_folder(calib_setup, capsys):
    wd, model, labels = calib_setup
    before = digest(wd)
    assert calibrate(model, labels, "--out", "results", "--force") == 2
    line = one_line(capsys.readouterr().err, "calibrate")
    assert "results: is not a variants folder (no index.json or recipe.json)" in line and "even with --force" in line
    assert digest(wd) == before                                   # nothing lost, nothing written (no calib set either)
    assert not (wd / "calib_sets").exists()


@pytest.mark.parametrize("how", ["model-dotdot", "name-dotdot", "name-slash"])
def test_calibrate_names_cannot_make_the_output_folder_results(calib_setup, capsys, how):
    wd, model, labels = calib_setup
    if how == "model-dotdot":                                     # Path('...onnx').stem == '..'
        shutil.copyfile(model, wd / "...onnx")
        shutil.copyfile(model.with_suffix(".json"), wd / "...json")
        args = (wd / "...onnx", labels, "--force")
        words = "model name '..' is not a plain name"
    else:
        args = (model, labels, "--name", ".." if how == "name-dotdot" else "../results", "--force")
        words = "--name: '..' is not a plain name" if how == "name-dotdot" else "is not a plain name"
    before = digest(wd)
    assert calibrate(*args) == 2
    assert words in one_line(capsys.readouterr().err, "calibrate")
    assert digest(wd) == before


def test_calibrate_force_still_replaces_its_own_variants_folder(calib_setup, capsys):
    wd, model, labels = calib_setup
    assert calibrate(model, labels, "--out", "v") == 0
    assert calibrate(model, labels, "--out", "v", "--seed", "1", "--force") == 0
    assert "replaced (--force)" in capsys.readouterr().out
    assert (wd / "v" / "index.json").exists() and (wd / "results" / "report.md").read_text() == "# report"


# ---------------------------------------------------------------- release and verify


@pytest.fixture(scope="module")
def twin_results(tmp_path_factory):
    """results/ with fp32, dynamic and dynamic-twin (a byte-identical copy of dynamic, so one variant_id
    for two records, like static-entropy = static-minmax) of a tiny classifier, run on x86 over 5
    images, plus a `quantbench equiv` analysis."""
    from release_helpers import make_release_results

    return make_release_results(tmp_path_factory.mktemp("hostile-release"), "export.py(12): forward", twin=True)


@pytest.fixture
def rel(twin_results, tmp_path, monkeypatch):
    """A private copy of the twin results in tmp_path/results (cwd = tmp_path)."""
    dest = tmp_path / "results"
    shutil.copytree(twin_results, dest, symlinks=True)
    monkeypatch.chdir(tmp_path)
    return dest


def test_release_copies_no_report_image_from_outside_results(rel, tmp_path, capsys):
    (tmp_path / "secret.txt").write_text("root:x:0:0\n")
    (rel / "plots").mkdir(exist_ok=True)
    (rel / "plots" / "ok.png").write_bytes(b"\x89PNG ok")
    os.symlink("../../secret.txt", rel / "plots" / "link.png")
    report = rel / "report.md"
    report.write_text(report.read_text() + "\n![ok](plots/ok.png)\n![up](plots/../../secret.txt)\n"
                      "![link](plots/link.png)\n![abs](/etc/hostname)\n")
    before = digest(tmp_path)
    assert main(["release", "--tag", "v1", "--results", str(rel)]) == 0
    out = capsys.readouterr().out
    assert "note: report image 'plots/../../secret.txt' not copied: it leads outside" in out
    assert "note: report image 'plots/link.png' not copied" in out
    after = digest(tmp_path)
    new = sorted(set(after) - set(before))
    assert all(k.startswith("results/releases/v1/") or k in ("results/releases/index.json", "results/releases/.index.lock")
               for k in new), new
    assert {k: after[k] for k in before} == before                # nothing outside the release changed
    v1 = rel / "releases" / "v1"
    assert (v1 / "plots" / "ok.png").read_bytes() == b"\x89PNG ok"
    assert not (v1 / "plots" / "link.png").exists()
    assert [p for p in tmp_path.rglob("secret.txt")] == [tmp_path / "secret.txt"]
    att = json.loads((v1 / "release.json").read_text())["report"]["attachments"]
    # plots/ok.png and the equiv report's own images (flip gallery), nothing from outside results/
    files = [a["file"] for a in att]
    assert "plots/ok.png" in files and "plots/link.png" not in files
    assert all(f == "plots/ok.png" or f.startswith("report.d/gallery/") for f in files), files


@pytest.mark.parametrize("field, value, words", [
    ("name", "../../../../evil_dynamic", "variant name '../../../../evil_dynamic' is not a plain name"),
    ("name", ".hidden", "variant name '.hidden' is not a plain name"),
    ("file", "../../../evil.onnx", "file '../../../evil.onnx' is not a file inside"),
    ("file", "link.onnx", "file 'link.onnx' is not a file inside"),
    ("recipe_file", "/etc/hostname", "recipe_file '/etc/hostname' is not a file inside"),
    ("calibration", "../../../../evil", "recipe's calibration set name '../../../../evil' is not a plain name"),
])
def test_release_refuses_names_and_files_that_leave_the_folder(rel, tmp_path, capsys, field, value, words):
    vdir = tmp_path / "evil_variants"
    shutil.copytree(rel / "variants" / "tiny", vdir)
    shutil.copyfile(vdir / "dynamic.onnx", tmp_path / "evil.onnx")
    os.symlink("../evil.onnx", vdir / "link.onnx")
    index = json.loads((vdir / "index.json").read_text())
    if field == "calibration":
        (tmp_path / "cal").mkdir()
        (tmp_path / "cal" / "manifest.parquet").write_bytes(b"manifest")
        recipe = json.loads((vdir / "dynamic.recipe.json").read_text())
        recipe["calibration_set"] = {"name": value, "folder": str(tmp_path / "cal"), "manifest_sha256": "0" * 64}
        (vdir / "dynamic.recipe.json").write_text(json.dumps(recipe))
    else:
        index[1][field] = value
    (vdir / "index.json").write_text(json.dumps(index))
    before = digest(tmp_path)
    assert main(["release", "--tag", "v1", "--results", str(rel), "--variants", str(vdir)]) == 2
    assert words in one_line(capsys.readouterr().err, "release")
    assert digest(tmp_path) == before                             # nothing written, here or in the parent
    assert not any(p.name.startswith("evil_dynamic") for p in tmp_path.parent.rglob("evil_dynamic*"))


def _tamper_twin(v1: Path, also_variant_id: bool = False) -> None:
    """Swap the twin's retained artifact for another model and re-seal release.json with its hashes."""
    import onnx
    from onnx import numpy_helper

    from quantbench.inputs.modelio import model_hashes

    art = v1 / "artifacts" / "dynamic-twin.onnx"
    m = onnx.load(str(art))
    for init in m.graph.initializer:
        if init.name.startswith("b2"):
            init.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(init) + 0.75, init.name))
    onnx.save(m, str(art))
    h = model_hashes(art)
    rec = json.loads((v1 / "release.json").read_text())
    twin = next(v for v in rec["variants"] if v["name"] == "dynamic-twin")
    twin.update(raw_sha256=h["raw_sha256"], semantic_sha256=h["semantic_sha256"])
    if also_variant_id:
        twin["variant_id"] = h["semantic_sha256"]
    (v1 / "release.json").write_text(json.dumps(rec))


def _rows(out: str, check: str) -> dict:
    return {ln.split()[1]: ln for ln in out.splitlines() if ln.startswith(check + " ")}


def test_verify_fails_a_tampered_twin_without_registry(rel, capsys):
    assert main(["release", "--tag", "v1", "--results", str(rel)]) == 0
    v1 = rel / "releases" / "v1"
    assert main(["verify", str(v1), "--host", "x86", "--sample", "2"]) == 0   # the twins verify when untouched
    _tamper_twin(v1)
    (rel / "releases" / "index.json").unlink()
    capsys.readouterr()
    before = digest(rel)

    assert main(["verify", str(v1)]) == 1                      # a missing registry is a failure...
    out = capsys.readouterr().out
    (line,) = [ln for ln in out.splitlines() if ln.startswith("registry")]
    assert " FAIL " in line and "missing: nothing vouches for release.json" in line and "--no-registry" in line

    assert main(["verify", str(v1), "--host", "x86", "--sample", "2", "--no-registry"]) == 1   # ...skipped on request
    out = capsys.readouterr().out
    assert "not checked (--no-registry)" in out
    art = _rows(out, "artifact")
    assert " FAIL " in art["dynamic-twin"] and "is not the identity" in art["dynamic-twin"]
    rerun = _rows(out, "re-run")
    assert " PASS " in rerun["dynamic"] and " PASS " in rerun["fp32"]
    assert " FAIL " in rerun["dynamic-twin"] and "output hashes differ from the record" in rerun["dynamic-twin"]
    assert "the host returned no result" not in out
    assert digest(rel) == before                               # verify writes nothing


def test_verify_fails_a_twin_resealed_with_its_new_variant_id(rel, capsys):
    assert main(["release", "--tag", "v1", "--results", str(rel)]) == 0
    v1 = rel / "releases" / "v1"
    _tamper_twin(v1, also_variant_id=True)
    capsys.readouterr()
    assert main(["verify", str(v1), "--host", "x86", "--sample", "2", "--no-registry"]) == 1
    out = capsys.readouterr().out
    rerun = _rows(out, "re-run")
    assert " FAIL " in rerun["dynamic-twin"] and "holds no results of variant_id" in rerun["dynamic-twin"]
    assert " PASS " in rerun["dynamic"]
    # with the registry in place the re-sealed record is caught without any re-run
    assert main(["verify", str(v1)]) == 1
    assert "record edited" in capsys.readouterr().out


# ---------------------------------------------------------------- imported results are re-hashed


@pytest.fixture(scope="module")
def export_file(tmp_path_factory):
    """pi.qbr: a genuine export of host `local` (one tiny model, 3 images), and the model and labels."""
    from hosts_helpers import image_model, make_corpus

    root = tmp_path_factory.mktemp("hostile-import")
    model = image_model(root / "m.onnx")
    labels = make_corpus(root / "corpus")
    with contextlib.chdir(root):  # module fixtures cannot use monkeypatch
        assert main(["run", "--hosts", "local", "--tables", "a", "--export", "pi.qbr", "--variants", str(model),
                     "--fixtures", str(labels), "--no-progress", "--jobs", "1"]) == 0
    return root / "pi.qbr", model, labels


def forge(src: Path, dst: Path, table: str, edit) -> Path:
    """Copy an export with `edit(rows)` applied to one of its tables (schema and members kept)."""
    import io
    import tarfile

    import pyarrow as pa
    import pyarrow.parquet as pq

    with tarfile.open(src) as tar:
        members = [(m.name, tar.extractfile(m).read()) for m in tar.getmembers()]
    out = []
    for name, data in members:
        if name == f"{table}.parquet":
            t = pq.read_table(io.BytesIO(data))
            rows = t.to_pylist()
            edit(rows)
            buf = io.BytesIO()
            pq.write_table(pa.Table.from_pylist(rows, schema=t.schema), buf)
            data = buf.getvalue()
        out.append((name, data))
    with tarfile.open(dst, "w", format=tarfile.PAX_FORMAT) as tar:
        for name, data in out:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return reseal_export(dst)


def _set(col, fn):
    def edit(rows):
        for r in rows:
            r[col] = fn(r)
    return edit


def _arch_in_fingerprint(rows):
    for r in rows:
        fp = json.loads(r["fingerprint"])
        fp["identity"]["arch"] = "aarch64"
        r["fingerprint"] = json.dumps(fp)
        r["arch"] = "aarch64"


FORGERIES = {
    "zeroed-outputs": ("outputs", _set("tensor", lambda r: bytes(len(r["tensor"]))),
                       "outputs row 0 (host local, fixture", "output tensor hashes to"),
    "fake-hashes": ("outputs", _set("sha256", lambda r: "ab" * 32),
                    "outputs row 0", "not to its recorded sha256 abababababab"),
    "no-tensor": ("outputs", _set("tensor", lambda r: None), "outputs row 0", "has no tensor"),
    "garbage-run-keys": ("outputs", _set("run_key", lambda r: "0" * 64), "outputs row 0",
                         "run_key is not the hash of its variant, fixture, fingerprint and session"),
    "session-options": ("outputs", _set("session_options", lambda r: r["session_options"].replace('"all"', '"basic"')),
                        "outputs row 0", "session_key is not the hash of its session options"),
    "arch-column": ("hosts", _set("arch", lambda r: "aarch64"), "hosts row 0 (host local",
                    "arch 'aarch64' disagrees with the fingerprint"),
    "arch-in-fingerprint": ("hosts", _arch_in_fingerprint, "hosts row 0",
                            "fingerprint hashes to"),
    "fixture-tensors": ("fixtures", _set("tensor", lambda r: bytes(len(r["tensor"]))), "fixtures row 0",
                        "input tensor hashes to"),
}


@pytest.mark.parametrize("case", sorted(FORGERIES))
def test_import_rejects_forged_results(export_file, workdir, capsys, case):
    src, model, labels = export_file
    table, edit, where, why = FORGERIES[case]
    forged = forge(src, workdir / "forged.qbr", table, edit)
    (workdir / "hosts.toml").write_text('air = { kind = "imported", file = "forged.qbr" }\n')
    rc = main(["run", "--hosts", "x86,air", "--hosts-file", "hosts.toml", "--tables", "b", "--variants", str(model),
               "--fixtures", str(labels), "--no-progress", "--jobs", "1"])
    line = one_line(capsys.readouterr().err, "run")
    assert rc == 2
    assert f"host air: {forged}: {where}" in line and why in line and "nothing was imported" in line
    assert digest(workdir / "b") == {}                            # nothing written, not even the local host's runs


def test_import_rejects_a_file_that_covers_none_of_the_run(export_file, workdir, capsys):
    from hosts_helpers import image_model

    src, _, labels = export_file
    other = image_model(workdir / "other.onnx", classes=3)         # a variant the export never ran
    (workdir / "hosts.toml").write_text(f'air = {{ kind = "imported", file = "{src}" }}\n')
    rc = main(["run", "--hosts", "air", "--hosts-file", "hosts.toml", "--tables", "b", "--variants", str(other),
               "--fixtures", str(labels), "--no-progress"])
    line = one_line(capsys.readouterr().err, "run")
    assert rc == 2
    assert f"host air: {src}: its results cover none of the 3 requested runs (it holds none of the requested variants)" in line
    assert digest(workdir / "b") == {}


def test_genuine_export_still_imports(export_file, workdir, capsys):
    src, model, labels = export_file
    (workdir / "hosts.toml").write_text(f'air = {{ kind = "imported", file = "{src}" }}\n')
    assert main(["run", "--hosts", "air", "--hosts-file", "hosts.toml", "--tables", "b", "--variants", str(model),
                 "--fixtures", str(labels), "--no-progress"]) == 0
    assert " air " in capsys.readouterr().out.replace("\n", " ")


# ---------------------------------------------------------------- a hosts file cannot silently take over built-ins


@pytest.mark.parametrize("command", ["equiv", "run"])
def test_hosts_file_cannot_redefine_a_builtin_without_override(workdir, capsys, command):
    from hosts_helpers import image_model, make_corpus

    model = image_model(workdir / "m.onnx")
    labels = make_corpus(workdir / "corpus", count=1)
    evil = workdir / "evil.sh"
    evil.write_text(f"#!/bin/sh\ntouch {workdir / 'PWNED'}\nexec {sys.executable} \"$@\"\n")
    evil.chmod(0o755)
    (workdir / "quantbench.toml").write_text('x86 = { kind = "local", python = "./evil.sh" }\n')
    before = digest(workdir)
    rc = main([command, "--hosts", "x86", "--variants", str(model), "--fixtures", str(labels), "--no-progress"])
    line = one_line(capsys.readouterr().err, command)
    assert rc == 2
    assert "quantbench.toml:1: host 'x86' is a built-in host; a hosts file redefines it only with `override = true`" in line
    assert not (workdir / "PWNED").exists()                       # the script never ran
    assert digest(workdir) == before and not (workdir / "results").exists()


def test_run_and_equiv_say_which_hosts_file_they_read(workdir, capsys):
    from hosts_helpers import image_model, make_corpus

    model = image_model(workdir / "m.onnx")
    labels = make_corpus(workdir / "corpus", count=1)
    (workdir / "quantbench.toml").write_text(f'x86 = {{ kind = "local", python = "{sys.executable}", override = true }}\n'
                                             'board1 = { kind = "ssh", address = "pi@board1" }\n')
    common = ["--variants", str(model), "--fixtures", str(labels), "--no-progress"]
    assert main(["run", "--hosts", "x86", *common]) == 0
    common += ["--decode", "classifier-softmax"]
    out = capsys.readouterr().out
    assert out.splitlines()[0] == "hosts file: ./quantbench.toml (defines: board1, x86 [overrides built-in])"
    assert main(["equiv", "--hosts", "x86", "--no-run", "--no-plots", *common]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0] == "hosts file: ./quantbench.toml (defines: board1, x86 [overrides built-in])"
    (workdir / "other.toml").write_text('lab = { kind = "emulated", preset = "pi4" }\n')
    assert main(["equiv", "--hosts", "x86", "--no-run", "--no-plots", "--json", "--hosts-file", "other.toml", *common]) == 0
    cap = capsys.readouterr()
    assert "hosts file: other.toml (defines: lab)" not in cap.out          # stdout stays pure JSON
    assert "hosts file: ./other.toml (defines: lab)" in cap.err
    json.loads(cap.out)


# ---------------------------------------------------------------- one writer per tables folder


@pytest.fixture
def lock_setup(workdir):
    from hosts_helpers import image_model, make_corpus

    model = image_model(workdir / "m.onnx")
    labels = make_corpus(workdir / "corpus", count=2)
    return workdir, ["--hosts", "x86", "--variants", str(model), "--fixtures", str(labels), "--no-progress",
                     "--jobs", "1"]


@pytest.mark.parametrize("command", ["run", "equiv"])
def test_no_wait_fails_while_another_process_holds_the_tables_lock(lock_setup, capsys, command):
    from quantbench.store import tablelock

    wd, common = lock_setup
    extra = ["--decode", "classifier-softmax", "--no-plots"] if command == "equiv" else []
    with tablelock.lock(wd / "results" / "tables"):
        before = digest(wd, skip_lock=False)
        assert main([command, "--no-wait", *common, *extra]) == 2
        line = one_line(capsys.readouterr().err, command)
        assert f"results/tables: locked by pid {os.getpid()} (another quantbench run or equiv" in line
        assert digest(wd, skip_lock=False) == before                # nothing ran, nothing written
    assert (wd / "results" / "tables" / LOCK_NAME).read_text() == ""  # released: empty again
    assert main([command, "--no-wait", *common, *extra]) == 0


def test_second_run_waits_for_the_lock_then_proceeds(lock_setup):
    import queue

    from quantbench.store import tablelock
    from quantbench.store.hostresults import load_outputs

    wd, common = lock_setup
    root = wd / "results" / "tables"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(Path(__file__).resolve().parents[2]),
                                                       os.environ.get("PYTHONPATH", "")]))
    lines: queue.Queue = queue.Queue()
    with tablelock.lock(root):
        proc = subprocess.Popen([sys.executable, "-m", "quantbench", "run", *common], cwd=wd, env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        threading.Thread(target=lambda: [lines.put(ln) for ln in proc.stderr], daemon=True).start()
        try:
            line = lines.get(timeout=120)                           # poll the child's stderr, with a timeout
            while not line.startswith("waiting"):
                line = lines.get(timeout=120)
        except queue.Empty:
            proc.kill()
            pytest.fail("the second run never said it was waiting for the lock")
        assert line.strip() == f"waiting for the lock on results/tables held by pid {os.getpid()} ..."
        assert proc.poll() is None                                  # still waiting while the lock is held
        assert load_outputs(tensors=False, tables_root=root).num_rows == 0
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, out
    assert load_outputs(tensors=False, tables_root=root).num_rows == 2
