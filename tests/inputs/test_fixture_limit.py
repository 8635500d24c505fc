"""--limit N picks N fixtures balanced over the strata, deterministically, and says how."""

import json

import numpy as np
from PIL import Image

from quantbench.inputs.fixtures import build_fixtures, limit_note

SPEC = {"name": "images", "shape": [1, 3, 8, 8], "layout": "NCHW", "dtype": "float32", "scale": 1 / 255,
        "mean": [0, 0, 0], "std": [1, 1, 1]}


def _corpus(folder, empty=8, full=4):
    """`empty` images without annotations named first by file name (a*.png), then `full` with one box (z*.png)."""
    (folder / "images").mkdir(parents=True)
    images, anns = [], []
    names = [f"a{i:02d}.png" for i in range(empty)] + [f"z{i:02d}.png" for i in range(full)]
    for i, name in enumerate(names):
        px = np.random.RandomState(i).randint(0, 256, (8, 8, 3), dtype=np.uint8)
        Image.fromarray(px).save(folder / "images" / name)
        images.append({"id": i + 1, "file_name": name, "width": 8, "height": 8, "split": "eval"})
        if name.startswith("z"):
            anns.append({"id": i, "image_id": i + 1, "category_id": 1, "bbox": [1, 1, 3, 3]})
    labels = folder / "labels.json"
    labels.write_text(json.dumps({"images": images, "annotations": anns, "categories": [{"id": 1, "name": "can"}]}))
    return labels


def test_limit_covers_every_stratum_not_the_first_files_by_name(tmp_path, monkeypatch):
    monkeypatch.setenv("QUANTBENCH_HOME", str(tmp_path / "home"))
    labels = _corpus(tmp_path / "corpus")
    picked = build_fixtures(SPEC, labels, tmp_path / "corpus" / "images", limit=4)
    # the old selection took a00..a03: four empty strips, no image with an object
    assert sorted(fx.stratum for fx in picked) == ["empty", "empty", "objects", "objects"]
    assert [fx.source for fx in picked] == ["a00.png", "a01.png", "z00.png", "z01.png"]   # file-name order
    again = build_fixtures(SPEC, labels, tmp_path / "corpus" / "images", limit=4)
    assert [fx.fixture_id for fx in again] == [fx.fixture_id for fx in picked]


def test_limit_fills_from_the_larger_stratum_when_a_small_one_runs_out(tmp_path, monkeypatch):
    monkeypatch.setenv("QUANTBENCH_HOME", str(tmp_path / "home"))
    labels = _corpus(tmp_path / "corpus", empty=8, full=1)
    picked = build_fixtures(SPEC, labels, tmp_path / "corpus" / "images", limit=5)
    assert sorted(fx.stratum for fx in picked) == ["empty"] * 4 + ["objects"]
    assert len({fx.source for fx in picked}) == 5


def test_limit_says_how_it_picked_in_one_line(tmp_path, monkeypatch):
    monkeypatch.setenv("QUANTBENCH_HOME", str(tmp_path / "home"))
    labels = _corpus(tmp_path / "corpus")
    picked = build_fixtures(SPEC, labels, tmp_path / "corpus" / "images", limit=4)
    line = limit_note(picked)
    assert "\n" not in line
    assert line == "4 images taken in turn from each stratum (by file name within one): empty 2, objects 2"


def test_run_says_how_the_limit_picked_in_one_line(tmp_path, monkeypatch, capsys):
    import json as _json

    from quantbench.cli import main
    from bench_helpers import make_bench

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("QUANTBENCH_HOME", str(tmp_path / "home"))
    vdir, labels = make_bench(tmp_path / "bench", n_images=4)
    common = ["run", "--hosts", "x86", "--variants", str(vdir), "--fixtures", str(labels), "--limit", "3",
              "--no-progress", "--jobs", "1"]
    assert main(common) == 0
    out = capsys.readouterr().out
    assert "--limit 3: 3 images taken in turn from each stratum (by file name within one): empty 3" in out.splitlines()
    assert main([*common, "--json"]) == 0                        # --json: the line goes to stderr, stdout stays JSON
    cap = capsys.readouterr()
    assert isinstance(_json.loads(cap.out), dict) and "--limit 3: 3 images" in cap.err
