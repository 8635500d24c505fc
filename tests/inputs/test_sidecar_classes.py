"""A sidecar's "classes" names each class index once: an empty list, a repeated name or an empty name is refused,
naming the sidecar and the entries, before anything is written (a repeat made two classes one name in every flip)."""

from __future__ import annotations

import json

import pytest

from cli_helpers import digest, one_line
from hosts_helpers import image_model, make_corpus
from quantbench.cli import main
from quantbench.errors import UserError
from quantbench.inputs.sidecarfile import load_sidecar_file


@pytest.mark.parametrize("classes, message", [
    ([], "'classes' must be a non-empty list of class names, one per class index (got [])"),
    ("cat,dog", "'classes' must be a non-empty list of class names"),
    (["cat", "dog", "cat"], "'classes' names 'cat' twice (entries 0 and 2); each class index needs its own name"),
    (["cat", ""], "'classes' entry 1 must be a non-empty name (got '')"),
    (["cat", None], "'classes' entry 1 must be a non-empty name (got None)"),
])
def test_a_class_list_that_does_not_name_each_class_once_is_refused(workdir, capsys, classes, message):
    side = workdir / "m.json"
    side.write_text(json.dumps({"classes": classes}))
    with pytest.raises(UserError) as err:
        load_sidecar_file(side)
    assert str(err.value).startswith(f"{side}: {message}")
    model = image_model(workdir / "m.onnx")
    corpus = make_corpus(workdir / "corpus")
    before = digest(workdir)
    rc = main(["equiv", "--hosts", "x86", "--variants", str(model), "--fixtures", str(corpus), "--no-progress"])
    assert rc == 2 and message in one_line(capsys.readouterr().err, "equiv")
    assert digest(workdir) == before


def test_a_list_of_distinct_names_is_kept(workdir):
    side = workdir / "m.json"
    side.write_text(json.dumps({"classes": ["cat", "dog", 3]}))
    assert load_sidecar_file(side)["classes"] == ["cat", "dog", 3]
