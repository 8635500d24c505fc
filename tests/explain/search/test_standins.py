"""Imported hosts in the search (explain.search.standins): their exported rows are decoded as the hosts the search
runs are, so a decode plug-in that declares `geometry` is given each fixture's geometry there too (a letterbox
undone on an imported host's rows as on a run host's). Real onnxruntime on this machine, a hand-built head behind a
letterbox sidecar, non-square images."""

import quantbench
from decode_helpers import GEOMETRY_SIZES, check_geometry, letterboxed, seen_geometry
from quantbench import Fixtures, Fleet
from quantbench.analysis.decode import spec_for_variant
from quantbench.api.options import Session
from quantbench.api.plan import explain_hosts
from quantbench.explain.search.evaluator import Evaluator
from quantbench.inputs.variantdir import pick_variant


def test_an_imported_hosts_rows_are_decoded_with_each_fixtures_geometry(workdir):
    """board holds x86's exported results of fp32 and the base variant; reading them for the search gives the
    plug-in the geometry of each fixture, as the fp32 reference on x86 does."""
    vdir, labels, ref = letterboxed(workdir)
    fixtures_given = Fixtures(labels=str(labels), split="all")
    quantbench.run([str(vdir / "fp32.onnx"), str(vdir / "dynamic.onnx")], Fleet("x86"), fixtures_given,
                   export=str(workdir / "board.qbr")).check()
    (workdir / "seen.jsonl").unlink(missing_ok=True)   # a run decodes nothing; what follows is the search's
    (workdir / "hosts.toml").write_text('board = { kind = "imported", file = "board.qbr" }\n')
    picked = pick_variant(str(vdir / "dynamic.onnx"))
    hosts, plan = explain_hosts(Fleet("x86,board", hosts_file=str(workdir / "hosts.toml")), Session(),
                                fixtures_given, picked, len(GEOMETRY_SIZES))
    (vi,) = plan.variants
    fleet = Evaluator(hosts, plan.fixtures_for[vi.variant_id], spec_for_variant(picked, ref, vi.outputs),
                      workdir / "cache.jsonl")
    try:
        fleet.start(vdir / "fp32.onnx", picked)
    finally:
        fleet.close()
    (board,) = fleet.imported
    assert board.label == "board" and sorted(board.fp32) == sorted(fx.fixture_id for fx in fleet.fixtures)
    # x86's fp32 reference, then board's fp32 and base rows: each fixture decoded three times, each with its geometry
    assert len((workdir / "seen.jsonl").read_text().splitlines()) == 3 * len(GEOMETRY_SIZES)
    check_geometry(seen_geometry(workdir))
