"""A decode plug-in that declares `geometry` is given each fixture's geometry (a letterbox's scale, pad offsets and
the original size) wherever decisions are decoded, not only in equiv: noise's flips, remedy's flips and the
search's evaluations (explain.localize.decode_runs). Real onnxruntime on this machine (masked tiers for remedy's
two hosts), a hand-built head, non-square images through a letterbox sidecar."""

import quantbench
from decode_helpers import GEOMETRY_SIZES, check_geometry, letterboxed, seen_geometry
from quantbench import Fixtures, Fleet
from quantbench.analysis.decode import spec_for_variant
from quantbench.api.plan import explain_hosts
from quantbench.api.options import Session
from quantbench.explain.search.evaluator import Evaluator
from quantbench.inputs.variantdir import pick_variant


def test_noise_gives_the_plugin_each_fixtures_geometry(workdir):
    vdir, labels, ref = letterboxed(workdir)
    quantbench.noise(str(vdir / "dynamic.onnx"), Fleet("x86"), Fixtures(labels=str(labels), split="all"),
                     limit=len(GEOMETRY_SIZES), factors="repeat", decode=ref)
    check_geometry(seen_geometry(workdir))


def test_remedy_gives_the_plugin_each_fixtures_geometry(workdir):
    vdir, labels, ref = letterboxed(workdir)
    quantbench.remedy(str(vdir / "dynamic.onnx"), Fleet("x86,local"), Fixtures(labels=str(labels), split="all"),
                      fp32=str(vdir / "fp32.onnx"), limit=len(GEOMETRY_SIZES), remedies="baseline", decode=ref)
    check_geometry(seen_geometry(workdir))


def test_the_search_evaluator_gives_the_plugin_each_fixtures_geometry(workdir):
    vdir, labels, ref = letterboxed(workdir)
    picked = pick_variant(str(vdir / "dynamic.onnx"))
    hosts, plan = explain_hosts(Fleet("x86"), Session(), Fixtures(labels=str(labels), split="all"), picked,
                                len(GEOMETRY_SIZES))
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
    check_geometry(seen_geometry(workdir))
