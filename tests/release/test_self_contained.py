"""A release (and its archive) holds what a receiver needs to read and rerun it as published: the
sidecars the variants ran with, the plug-in files their recipes name, report.html and its images;
`verify` checks each against its recorded SHA-256 (and never runs a plug-in)."""

import json
import shutil
import tarfile

import pytest

from quantbench.cli import main

from release_helpers import PRE_PY, make_release_results


@pytest.fixture(scope="module")
def plugged(tmp_path_factory):
    return make_release_results(tmp_path_factory.mktemp("plugged"), "doc", plugin=True)


@pytest.fixture
def released(plugged, tmp_path, monkeypatch, capsys):
    shutil.copytree(plugged.parent, tmp_path / "w")
    monkeypatch.chdir(tmp_path / "w")   # the recipes' plug-in reference pre.py is read from here
    assert main(["release", "--tag", "v1", "--results", "results", "--archive"]) == 0
    capsys.readouterr()
    return tmp_path / "w" / "results" / "releases"


def test_the_archive_holds_sidecars_plugins_and_report_html(released, capsys):
    rec = json.loads((released / "v1" / "release.json").read_text())
    with tarfile.open(released / "v1.tar.gz") as tar:
        names = set(tar.getnames())
        html = tar.extractfile("v1/report.html").read().decode()
    assert {"v1/sidecars/fp32.json", "v1/sidecars/dynamic.json", "v1/report.html"} <= names
    for v in rec["variants"]:
        assert json.loads((released / "v1" / v["sidecar"]["file"]).read_text())["classes"][0] == "bottle"
    (plug,) = rec["plugins"]
    assert plug["ref"] == "pre.py:prep" and (released / "v1" / plug["file"]).read_text() == PRE_PY
    assert f"v1/{plug['file']}" in names
    images = [a["file"] for a in rec["report"]["html"]["attachments"]]
    assert images and all(f'src="{f}"' in html and f"v1/{f}" in names for f in images)
    assert main(["verify", str(released / "v1.tar.gz")]) == 0
    out = capsys.readouterr().out
    rows = {ln.split()[0] + " " + ln.split()[1] for ln in out.splitlines() if " PASS " in ln}
    assert {"sidecar sidecars/fp32.json", "sidecar sidecars/dynamic.json", f"plug-in {plug['file']}",
            "report report.html"} <= rows


@pytest.mark.parametrize("what", ["sidecar", "plug-in", "report.html", "html image"])
def test_a_changed_carried_file_fails_verify(released, capsys, what):
    folder = released / "v1"
    rec = json.loads((folder / "release.json").read_text())
    rel = {"sidecar": lambda: rec["variants"][0]["sidecar"]["file"], "plug-in": lambda: rec["plugins"][0]["file"],
           "report.html": lambda: "report.html",
           "html image": lambda: rec["report"]["html"]["attachments"][0]["file"]}[what]()
    p = folder / rel
    p.write_bytes(p.read_bytes() + b"\n")
    assert main(["verify", str(folder)]) == 1
    out = capsys.readouterr().out
    (line,) = [ln for ln in out.splitlines() if " FAIL " in ln and not ln.startswith("verify ")]
    assert rel in line and "(modified)" in line
