"""results/.cache/accuracy.json is never trusted as it is: an edited entry is recomputed, not shown."""

import json
import re
import shutil

import pytest

from quantbench.analysis import accuracy as A
from quantbench.cli import main

from release_helpers import make_release_results


@pytest.fixture(scope="module")
def labelled(tmp_path_factory):
    """results/ of the tiny classifier with one class label per image: report.md shows a top-1 accuracy."""
    return make_release_results(tmp_path_factory.mktemp("acc"), "doc", labelled=True)


@pytest.fixture
def results(labelled, tmp_path, monkeypatch):
    shutil.copytree(labelled.parent, tmp_path / "w")
    monkeypatch.chdir(tmp_path / "w")
    return tmp_path / "w" / "results"


def _accuracy_rows(results) -> dict:
    text = (results / "report.md").read_text()
    return dict(re.findall(r"^\| (fp32|dynamic) \| ([0-9.]+ \(\d+/\d+\))", text, re.M))


def _report(results) -> int:
    return main(["report", "--results", str(results), "--no-plots", "--fixtures", "labels.json"])


def _entries(data: dict) -> list[dict]:
    """The score dicts in the cache file (whatever wraps them)."""
    return [e.get("score", e) for e in data["scores"].values()]


@pytest.mark.parametrize("edit", ["score", "score-and-checksum-of-another", "key"])
def test_an_edited_cache_entry_is_recomputed_not_shown(results, capsys, edit):
    assert _report(results) == 0
    real = _accuracy_rows(results)
    assert real == {"fp32": "0.400 (2/5)", "dynamic": "0.600 (3/5)"}
    path = results / A.CACHE_FILE
    data = json.loads(path.read_text())
    if edit == "key":   # an entry filed under another content key (e.g. copied from another results folder)
        a, b = sorted(data["scores"])
        data["scores"][a], data["scores"][b] = data["scores"][b], data["scores"][a]
    else:
        for e in _entries(data):
            e.update(correct=e["images"], value=1.0)
        if edit == "score-and-checksum-of-another":
            for e in data["scores"].values():
                if "sha256" in e:
                    e["sha256"] = "0" * 64
    path.write_text(json.dumps(data))
    capsys.readouterr()
    assert _report(results) == 0
    assert _accuracy_rows(results) == real
    # and the cache now holds the real scores again
    assert sorted((e["correct"], e["value"]) for e in _entries(json.loads(path.read_text()))) == [(2, 0.4), (3, 0.6)]


def test_an_intact_cache_is_used_again(results, monkeypatch):
    assert _report(results) == 0
    before = (results / "report.md").read_bytes()
    monkeypatch.setattr(A, "score", lambda *a: pytest.fail("scored again although the cache holds the score"))
    assert _report(results) == 0
    assert (results / "report.md").read_bytes() == before
