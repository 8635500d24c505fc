"""A decode plug-in that declares `geometry` is given each fixture's geometry (a letterbox's scale, pad offsets and
the original size) wherever decisions are decoded, not only in equiv: noise's flips, remedy's flips and the
search's evaluations (explain.localize.decode_runs). Real onnxruntime on this machine (masked tiers for remedy's
two hosts), a hand-built head, non-square images through a letterbox sidecar."""

import json

import numpy as np
from PIL import Image

import quantbench
from decode_helpers import GEOMETRY_SIZES, RECORD_GEOMETRY, input_matmul_head, make_variants
from quantbench import Fixtures, Fleet
from quantbench.analysis.decode import spec_for_variant
from quantbench.api.plan import explain_hosts
from quantbench.api.options import Session
from quantbench.explain.search.evaluator import Evaluator
from quantbench.inputs import plugins
from quantbench.inputs.variantdir import pick_variant

SIZE = 32
SIZES = GEOMETRY_SIZES

PLUGIN = RECORD_GEOMETRY + '''
def whole(outputs, spec, geometry=None):
    """One decision whatever the outputs: only the geometry it is given matters here."""
    record(geometry)
    return {"cls": [0], "score": [0.9], "kept": [True]}
'''


def _letterboxed(tmp_path):
    """fp32 + dynamic variants of a head behind a centre letterbox, labels of three non-square images, and the
    plug-in (allowed); returns (variants folder, labels, plug-in reference)."""
    plugins.allow_all()
    (tmp_path / "geo.py").write_text(PLUGIN)
    ref = f"{tmp_path / 'geo.py'}:whole"
    side = {"classes": ["thing"],
            "input": {"name": "images", "shape": [1, 3, SIZE, SIZE], "scale": 1 / 255, "resize": "letterbox",
                      "pad": "center"},
            "decode": {"kind": ref, "threshold": 0.5}}
    vdir, labels = make_variants(tmp_path, lambda p: input_matmul_head(p, np.zeros((1, 4)), SIZE), side,
                                 [{"width": w, "height": h} for h, w in SIZES], SIZE)
    rng = np.random.default_rng(0)
    for i, (h, w) in enumerate(SIZES):
        Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)).save(tmp_path / "images" / f"im{i:02d}.png")
    return vdir, labels, ref


def _seen(tmp_path) -> dict:
    """{image size: the geometry the plug-in was given}; every call had one."""
    got = [json.loads(line) for line in (tmp_path / "seen.jsonl").read_text().splitlines()]
    assert got and all(g is not None for g in got)
    return {tuple(g["image_size"]): g for g in got}


def _check(seen: dict) -> None:
    assert sorted(seen) == sorted(SIZES)
    assert seen[(30, 60)]["resized"] == [16, 32] and seen[(30, 60)]["offset"] == [8, 0]
    assert seen[(60, 20)]["resized"] == [32, 11] and seen[(60, 20)]["input_size"] == [SIZE, SIZE]


def test_noise_gives_the_plugin_each_fixtures_geometry(workdir):
    vdir, labels, ref = _letterboxed(workdir)
    quantbench.noise(str(vdir / "dynamic.onnx"), Fleet("x86"), Fixtures(labels=str(labels), split="all"),
                     limit=len(SIZES), factors="repeat", decode=ref)
    _check(_seen(workdir))


def test_remedy_gives_the_plugin_each_fixtures_geometry(workdir):
    vdir, labels, ref = _letterboxed(workdir)
    quantbench.remedy(str(vdir / "dynamic.onnx"), Fleet("x86,local"), Fixtures(labels=str(labels), split="all"),
                      fp32=str(vdir / "fp32.onnx"), limit=len(SIZES), remedies="baseline", decode=ref)
    _check(_seen(workdir))


def test_the_search_evaluator_gives_the_plugin_each_fixtures_geometry(workdir):
    vdir, labels, ref = _letterboxed(workdir)
    picked = pick_variant(str(vdir / "dynamic.onnx"))
    hosts, plan = explain_hosts(Fleet("x86"), Session(), Fixtures(labels=str(labels), split="all"), picked,
                                len(SIZES))
    (vi,) = plan.variants
    fixtures = plan.fixtures_for[vi.variant_id]
    fleet = Evaluator(hosts, fixtures, spec_for_variant(picked, ref, vi.outputs), workdir / "cache.jsonl")
    try:
        fleet.start(vdir / "fp32.onnx")
        (workdir / "seen.jsonl").unlink()   # the fp32 reference's decisions: what follows is an evaluation
        [got] = fleet.evaluate(vdir / "dynamic.onnx", vi.variant_id, {}, [0], [fx.fixture_id for fx in fixtures])
    finally:
        fleet.close()
    assert got.flips == 0
    _check(_seen(workdir))
