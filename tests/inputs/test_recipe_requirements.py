"""A recipe's session requirement (session_requirements: onnxruntime session config key -> value) is read back
checked: a misspelt key (one onnxruntime does not know), a value that is not a string, or a field that is not a
mapping stops every command that reads the variants with one line naming the recipe file, before anything runs."""

from __future__ import annotations

import json

import pytest

from cli_helpers import one_line
from quantbench.cli import main
from quantbench.errors import UserError
from quantbench.inputs.variantdir import load_variants
from requirement_helpers import X64, bright_images, variants_folder


@pytest.fixture
def folder(workdir):
    bright_images(workdir)
    return variants_folder(workdir, "required", X64)


def _set(folder, value) -> None:
    recipe = folder / "static-minmax.recipe.json"
    r = json.loads(recipe.read_text())
    r["session_requirements"] = value
    recipe.write_text(json.dumps(r))


def test_the_recipe_field_is_read_back(folder):
    by = {v.name: v for v in load_variants(folder)}
    assert by["static-minmax"].recipe["session_requirements"] == X64
    assert "session_requirements" not in by["fp32"].recipe


@pytest.mark.parametrize("value, says", [
    ({"session.x64quantprecison": "1"}, "onnxruntime has no session config key 'session.x64quantprecison'; did you "
                                        "mean session.x64quantprecision?"),
    ({"session.x64quantprecision": 1}, "session_requirements must map onnxruntime session config keys to string values"),
    (["session.x64quantprecision=1"], "session_requirements must map onnxruntime session config keys to string values"),
])
def test_a_bad_field_is_one_line_naming_the_recipe(folder, workdir, capsys, value, says):
    _set(folder, value)
    with pytest.raises(UserError) as exc:
        load_variants(folder)
    assert str(exc.value).startswith(f"{folder / 'static-minmax.recipe.json'}: ") and says in str(exc.value)
    capsys.readouterr()
    assert main(["run", "--hosts", "x86", "--variants", str(folder), "--fixtures", "labels.json", "--no-progress"]) == 2
    line = one_line(capsys.readouterr().err, "run")
    assert str(folder / "static-minmax.recipe.json") in line and says in line
    assert not (workdir / "results").exists()     # refused before anything ran or was written
