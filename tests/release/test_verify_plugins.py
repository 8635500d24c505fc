"""`verify` of a received archive never runs a plug-in the release carries: its recipes name one (calibrate
ran it, allowed), the archive travels, and verify (re-run included) passes without running it."""

import os

from quantbench.inputs import plugins
from quantbench.cli import main
from plugin_helpers import _calibrate, _sidecar


def test_verify_archive_runs_no_carried_plugin(proj, capsys, monkeypatch):  # noqa: F811
    workdir, model, labels = proj
    _sidecar(model, input={"plugin": "evil.py:prep"}, decode={"kind": "evil.py:dec"})
    assert _calibrate(model, labels, "--allow-plugins") == 0, capsys.readouterr().err
    assert main(["equiv", "--hosts", "x86", "--fixtures", str(labels), "--no-progress", "--no-plots"]) == 0
    assert main(["release", "--tag", "v1", "--archive"]) == 0, capsys.readouterr().err
    capsys.readouterr()
    (workdir / "evil-ran").unlink()
    monkeypatch.setattr(plugins, "_FILE_MODULES", {})   # a fresh load would leave the marker again
    archive = workdir / "results" / "releases" / "v1.tar.gz"
    assert main(["verify", str(archive), "--host", "x86", "--sample", "1"]) == 0, capsys.readouterr().out
    out = capsys.readouterr().out
    assert ": PASS" in out and [ln for ln in out.splitlines() if ln.startswith("re-run") and " PASS " in ln]
    assert not (workdir / "evil-ran").exists()
