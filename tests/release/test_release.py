"""`quantbench release` and `quantbench verify` on a tiny model run on the local host."""

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from quantbench.cli import main

from release_helpers import release
from release_helpers import write_tar as _tar


def test_release_writes_record_and_verify_reruns_on_local_host(results, capsys):
    assert release(results, "v1") == 0
    out = capsys.readouterr().out
    assert "release v1: 2 variant(s) x 1 host(s)" in out
    folder = results / "releases" / "v1"
    rec = json.loads((folder / "release.json").read_text())
    assert {v["name"] for v in rec["variants"]} == {"fp32", "dynamic"}
    for v in rec["variants"]:
        assert v["raw_sha256"] != v["semantic_sha256"]          # the doc_string path is in the raw bytes only
        assert v["environment"]["onnxruntime"] and v["recipe"]["method"] in ("fp32", "dynamic")
        assert v["artifact"]["retained"] and (folder / v["artifact"]["file"]).exists()
        (t,) = v["targets"]
        assert t["host"] == "x86" and t["fixtures"] == 5 and len(t["release_key"]) == 64
        assert t["fingerprint"]["identity"] and t["byte_class"] == "A" and t["equiv"]["class_label"] == "A"
    dyn = next(v for v in rec["variants"] if v["name"] == "dynamic")
    flips = dyn["targets"][0]["flips_vs_fp32"]["own-fp32"]
    assert flips["total"] >= 1 and flips["total"] == flips["class"]      # the near-tied classes flip under int8
    keys = {t["release_key"] for v in rec["variants"] for t in v["targets"]}
    registry = json.loads((results / "releases" / "index.json").read_text())
    assert keys == set(registry["keys"])
    assert rec["equiv_ids"] and dyn["targets"][0]["equiv"]["equiv_id"] == rec["equiv_ids"][0]
    for name in ("fixtures", "models", "hosts", "outputs", "classes", "decisions", "flips"):
        assert rec["tables"][name]["rows"] > 0
    report = (folder / "report.md").read_text()
    assert report.startswith("# Release v1") and "## Analysis report at release time" in report

    assert main(["verify", str(folder), "--host", "x86", "--sample", "2"]) == 0
    out = capsys.readouterr().out
    assert "verify" in out and ": PASS" in out
    rerun = [line for line in out.splitlines() if line.startswith("re-run")]
    assert len(rerun) == 2 and all(" PASS " in line and "2 fixtures" in line for line in rerun)


def test_verify_detects_tampered_parquet_and_missing_artifact(results, capsys):
    assert release(results, "v1") == 0
    folder = results / "releases" / "v1"
    rec = json.loads((folder / "release.json").read_text())
    part = folder / rec["tables"]["outputs"]["files"][0]["path"]
    t = pq.read_table(part)
    sha = t.column("sha256").to_pylist()
    sha[0] = "0" * 64                                              # one forged output hash
    forged_variant = t.column("variant").to_pylist()[0]
    pq.write_table(t.set_column(t.schema.get_field_index("sha256"), "sha256", pa.array(sha)), part)
    capsys.readouterr()
    assert main(["verify", str(folder), "--host", "x86", "--sample", "5"]) == 1
    out = capsys.readouterr().out
    rerun = {ln.split()[1]: ln for ln in out.splitlines() if ln.startswith("re-run")}
    assert "1 of 5 output hashes differ" in rerun[forged_variant] and " FAIL " in rerun[forged_variant]
    other = ({"fp32", "dynamic"} - {forged_variant}).pop()
    assert " PASS " in rerun[other]

    (folder / "artifacts" / "dynamic.onnx").unlink()
    assert main(["verify", str(folder)]) == 1
    out = capsys.readouterr().out
    line = next(ln for ln in out.splitlines() if "tables/outputs/" in ln)
    assert " FAIL " in line and "modified" in line
    line = next(ln for ln in out.splitlines() if ln.startswith("artifact") and " dynamic " in ln)
    assert " FAIL " in line and "missing" in line
    line = next(ln for ln in out.splitlines() if ln.startswith("artifact") and " fp32 " in ln)
    assert " PASS " in line
    assert "FAIL (" in out.splitlines()[-1]

    # "Re-sealing" the record to match the forged table is caught by the registry's hash of release.json.
    from quantbench.fsutil import sha256_file

    rec["tables"]["outputs"]["files"][0]["sha256"] = sha256_file(part)
    (folder / "release.json").write_text(json.dumps(rec))
    assert main(["verify", str(folder)]) == 1
    out = capsys.readouterr().out
    assert " PASS " in next(ln for ln in out.splitlines() if "tables/outputs/" in ln)
    line = next(ln for ln in out.splitlines() if ln.startswith("registry") and "release.json" in ln)
    assert " FAIL " in line and "record edited" in line

    (folder / "release.json").write_text("{")                    # a damaged record fails (1), not a usage error (2)
    assert main(["verify", str(folder)]) == 1
    assert "the release record is damaged" in capsys.readouterr().err


def test_not_retained_is_reported_as_such(results, capsys):
    assert release(results, "slim", "--no-retain") == 0
    folder = results / "releases" / "slim"
    assert not (folder / "artifacts").exists()
    capsys.readouterr()
    assert main(["verify", str(folder)]) == 0                      # a decision, not a failure
    out = capsys.readouterr().out
    rows = [ln for ln in out.splitlines() if ln.startswith("artifact")]
    assert len(rows) == 2 and all("NOT RETAINED" in r and "deliberately not retained" in r for r in rows)
    assert "missing" not in out
    assert "2 artifact(s) deliberately not retained" in out
    assert main(["verify", str(folder), "--json"]) == 0
    checks = json.loads(capsys.readouterr().out)["checks"]
    assert sorted(c["status"] for c in checks if c["check"] == "artifact") == ["NOT RETAINED", "NOT RETAINED"]
    # The source files still exist and match; once one is gone, verify says so (still not a failure).
    (results / "variants" / "tiny" / "dynamic.onnx").unlink()
    assert main(["verify", str(folder)]) == 0
    assert "source no longer present" in capsys.readouterr().out


def test_second_artifact_under_existing_release_key_is_refused(results, capsys):
    assert release(results, "v1") == 0
    registry = (results / "releases" / "index.json").read_bytes()
    # Same recipe, different bytes: the export moved folders, so the doc_string paths differ.
    import onnx

    path = results / "variants" / "tiny" / "dynamic.onnx"
    m = onnx.load(str(path))
    for node in m.graph.node:
        node.doc_string = "/home/alice/a/much/longer/checkout/export.py(12): forward"
    onnx.save(m, str(path))
    capsys.readouterr()
    assert release(results, "v2") == 1
    out = capsys.readouterr().out
    assert "REFUSED" in out and "registered by release 'v1'" in out
    assert "semantically identical (differs only in non-executing content)" in out
    assert out.count("release key ") >= 1 and "dynamic on x86" in out
    assert not (results / "releases" / "v2").exists()
    assert (results / "releases" / "index.json").read_bytes() == registry    # nothing stored silently


def test_same_artifacts_under_new_tag_and_user_errors(results, capsys):
    assert release(results, "v1") == 0
    assert release(results, "v1b") == 0                            # same artifacts, same keys: a re-release
    assert "already registered with the same artifact" in capsys.readouterr().out
    reg = json.loads((results / "releases" / "index.json").read_text())
    assert all(e["tags"] == ["v1", "v1b"] for e in reg["keys"].values())
    assert release(results, "v1") == 2                             # tags are never overwritten
    assert "already exists" in capsys.readouterr().err
    assert release(results, "../x") == 2
    assert release(results, "v9", "--hosts", "pi") == 2
    assert "no results of variant" in capsys.readouterr().err
    assert main(["verify", str(results / "releases" / "nope")]) == 2
    assert main(["verify", str(results / "releases" / "v1"), "--host", "pi3"]) == 2
    err = capsys.readouterr().err
    assert "no such release folder" in err and "--host pi3: the release has no results for it" in err


def test_release_key_is_recipe_environment_target_without_artifact_hash():
    from quantbench.release.record import environment_of, release_key

    recipe = {"method": "static", "per_channel": True, "versions": {"onnxruntime": "1.32.0"},
              "semantic_sha256": "a" * 64, "ranges_sha256": "b" * 64, "input_model_sha256": "c" * 64,
              "source_model": {"path": "/home/alice/m.onnx", "raw_sha256": "d" * 64},
              "calibration_set": {"name": "s", "folder": "calib_sets/s", "manifest_sha256": "e" * 64}}
    target = {"fingerprint_id": "f" * 64, "session_key": "0" * 64}
    key = release_key(recipe, environment_of(recipe), target)

    def variant(**changes):
        r = json.loads(json.dumps(recipe))
        for path, value in changes.items():
            *parents, leaf = path.split("__")
            d = r
            for p in parents:
                d = d[p]
            d[leaf] = value
        return release_key(r, environment_of(r), target)

    # build products and where things lay: same key
    assert variant(semantic_sha256="9" * 64, ranges_sha256="9" * 64, input_model_sha256="9" * 64) == key
    assert variant(source_model__path="/elsewhere/m.onnx", calibration_set__folder="/x") == key
    # recipe inputs, environment, target: new key
    assert variant(per_channel=False) != key
    assert variant(source_model__raw_sha256="9" * 64) != key
    assert variant(calibration_set__manifest_sha256="9" * 64) != key
    assert variant(versions__onnxruntime="1.31.0") != key
    assert release_key(recipe, environment_of(recipe), dict(target, session_key="1" * 64)) != key


def test_byte_classes_compare_the_fixtures_every_host_ran():
    from quantbench.release.record import _byte_classes

    same = [("f1", "y", "h1"), ("f2", "y", "h2")]
    targets = [{"host": "x86", "_lines": same + [("f3", "y", "h3")]},     # ran one fixture more
               {"host": "pi", "_lines": list(same)},
               {"host": "x86-avx2", "_lines": [("f1", "y", "h1"), ("f2", "y", "DIFFERENT")]}]
    _byte_classes(targets)
    assert [t["byte_class"] for t in targets] == ["A", "A", "B"]
    assert targets[0]["byte_class_hosts"] == ["pi", "x86"] and targets[2]["byte_class_hosts"] == ["x86-avx2"]
    assert all(t["byte_class_fixtures"] == 2 for t in targets)


def test_one_release_cannot_hold_two_artifacts_under_one_key():
    from quantbench.release.record import check_registry

    e = {"release_key": "k" * 64, "variant": "dynamic", "host": "x86", "semantic_sha256": "s" * 64}
    reg = {"keys": {}}
    assert check_registry(reg, [dict(e, raw_sha256="1" * 64), dict(e, raw_sha256="1" * 64, host="x86b")], "v1") == []
    (c,) = check_registry(reg, [dict(e, raw_sha256="1" * 64), dict(e, raw_sha256="2" * 64, host="x86b")], "v1")
    assert c.registered_tag == "v1 (this release)" and c.new_raw == "2" * 64 and c.host == "x86b"


# --- one-file archive -----------------------------------------------------------

def _verify_rows(out: str) -> list[str]:
    return [ln for ln in out.splitlines() if " FAIL " in ln]


def test_archive_round_trips_and_is_deterministic(results, capsys):
    import tarfile

    assert release(results, "v1", "--archive") == 0
    out = capsys.readouterr().out
    archive = results / "releases" / "v1.tar.gz"
    assert archive.is_file() and f"archive: {archive}" in out
    with tarfile.open(archive) as tar:
        names = tar.getnames()
        members = tar.getmembers()
    assert names[0] == "v1/manifest.json" and names[1:] == sorted(names[1:])
    assert all(m.mtime == 0 and m.uid == 0 and m.gid == 0 and m.uname == "" and m.mode == 0o644 for m in members)
    models = [n for n in names if n.startswith("v1/models/")]
    assert len(models) == 2 and not any(n.startswith("v1/artifacts/") for n in names)   # by hash, once each
    assert {"v1/release.json", "v1/report.md"} <= set(names) and any("/tables/outputs/" in n for n in names)

    assert main(["verify", str(archive)]) == 0
    out = capsys.readouterr().out
    assert "verify" in out and ": PASS" in out.splitlines()[-1]
    assert main(["verify", str(archive), "--json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert rep["pass"] and {c["check"] for c in rep["checks"]} >= {"archive", "archive member", "table", "artifact",
                                                                  "registry"}
    # same release folder, same archive bytes
    from quantbench.release.archive import write_archive

    again, sha = write_archive(results / "releases" / "v1", results / "again.tar.gz")
    assert again.read_bytes() == archive.read_bytes()


def test_archive_verify_reruns_from_the_archive(results, capsys):
    assert release(results, "v1", "--archive") == 0
    capsys.readouterr()
    assert main(["verify", str(results / "releases" / "v1.tar.gz"), "--host", "x86", "--sample", "2"]) == 0
    out = capsys.readouterr().out
    assert len([ln for ln in out.splitlines() if ln.startswith("re-run") and " PASS " in ln]) == 2


@pytest.mark.parametrize("where", [4, 9, 0.5, -5, -1])
def test_one_changed_byte_anywhere_fails_verify(results, capsys, where):
    assert release(results, "v1", "--archive") == 0
    archive = results / "releases" / "v1.tar.gz"
    data = bytearray(archive.read_bytes())
    i = int(len(data) * where) if isinstance(where, float) else where % len(data)
    data[i] ^= 0x01
    archive.write_bytes(bytes(data))
    capsys.readouterr()
    assert main(["verify", str(archive)]) == 1
    out = capsys.readouterr().out
    assert _verify_rows(out) and "Traceback" not in out


@pytest.mark.parametrize("bad", ["abs", "dotdot", "symlink", "hardlink", "outside-tag"])
def test_archive_member_that_could_escape_is_refused(results, tmp_path, capsys, bad):
    import tarfile

    assert release(results, "v1", "--archive") == 0
    archive = results / "releases" / "v1.tar.gz"
    with tarfile.open(archive) as tar:
        members = [(m, tar.extractfile(m).read()) for m in tar.getmembers()]
    evil = tarfile.TarInfo({"abs": "/tmp/qb-evil", "dotdot": "v1/../../qb-evil", "symlink": "v1/tables/link",
                            "hardlink": "v1/tables/hard", "outside-tag": "other/qb-evil"}[bad])
    payload = b"evil"
    if bad == "symlink":
        evil.type, evil.linkname, payload = tarfile.SYMTYPE, "/etc/passwd", None
    elif bad == "hardlink":
        evil.type, evil.linkname, payload = tarfile.LNKTYPE, "v1/release.json", None
    else:
        evil.size = len(payload)
    forged = tmp_path / "forged.tar.gz"
    _tar(forged, members[:2] + [(evil, payload)] + members[2:])
    capsys.readouterr()
    assert main(["verify", str(forged)]) == 1
    out = capsys.readouterr().out
    line = next(ln for ln in out.splitlines() if ln.startswith("archive "))
    assert " FAIL " in line
    assert not (tmp_path.parent / "qb-evil").exists() and not __import__("os").path.exists("/tmp/qb-evil")


def test_archive_member_edited_and_resealed_by_tar_fails_the_manifest(results, tmp_path, capsys):
    import tarfile

    assert release(results, "v1", "--archive") == 0
    with tarfile.open(results / "releases" / "v1.tar.gz") as tar:
        members = [(m, tar.extractfile(m).read()) for m in tar.getmembers()]
    out_members = []
    for m, data in members:
        if m.name == "v1/report.md":
            data = data.replace(b"Release", b"Relaese", 1)
            m.size = len(data)
        out_members.append((m, data))
    forged = tmp_path / "resealed.tar.gz"
    _tar(forged, out_members)
    capsys.readouterr()
    assert main(["verify", str(forged)]) == 1
    out = capsys.readouterr().out
    assert any(ln.startswith("archive member") and "report.md" in ln and " FAIL " in ln for ln in out.splitlines())


def test_release_holds_only_the_analysed_runs_outputs(results, base_results, capsys):
    """A later run with other session options adds outputs to the tables; the release (scoped to the
    equiv analysis) leaves them out."""
    labels = base_results.parent / "labels.json"
    assert main(["run", "--hosts", "x86", "--fixtures", str(labels), "--images", str(base_results.parent / "images"),
                 "--graph-opt", "basic", "--limit", "2", "--tables", str(results / "tables"), "-q"]) == 0
    assert release(results, "v1") == 0
    rec = json.loads((results / "releases" / "v1" / "release.json").read_text())
    t = pq.read_table(results / "releases" / "v1" / rec["tables"]["outputs"]["files"][0]["path"])
    assert len(set(t.column("session_key").to_pylist())) == 1 and t.num_rows == 10   # 2 variants x 5 fixtures
    assert all(len(v["targets"]) == 1 for v in rec["variants"])


def test_release_letters_follow_the_analysis_reference_first():
    """Was: release.json said pi = A, x86 = B while the classes table of the same analysis said A = x86."""
    from quantbench.release.record import _byte_classes

    targets = [{"host": "pi", "_lines": [("f", "y", "1" * 64)]}, {"host": "x86", "_lines": [("f", "y", "2" * 64)]}]
    _byte_classes(targets, ["x86", "x86", "pi"])
    assert {t["host"]: t["byte_class"] for t in targets} == {"x86": "A", "pi": "B"}
    _byte_classes(targets)  # no analysis: host order
    assert {t["host"]: t["byte_class"] for t in targets} == {"pi": "A", "x86": "B"}
