"""`search --identical`: the answer must also give byte-identical outputs (one class) on every measured host, or
the search exits 1 naming the nearest candidate's classes and the ops that separate them.

On the saturating classifier (tests/explain_helpers.saturating_image_model) a host whose int8 path saturates
(VPMADDUBSW: AVX2 without VNNI) and x86-sse4 split; the exact integer paths (x64quantprecision, reduce_range, U8U8)
make them one class. The saturating host is x86 where this machine's own path saturates (read from its CPU
features), else its masked x86-avx2 tier.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from explain_helpers import saturating_int8_host
from quantbench.analysis.tiers import int8_path
from quantbench.cli import main
from quantbench.errors import ParameterError
from quantbench.hosts.masked import here_features
from setup_required import need_tier

FLEET = "x86,x86-sse4"


def _here_saturates() -> bool:
    return int8_path("x86", "x86_64", here_features()).kind == "saturates"


def _need_a_split() -> tuple[str, str]:
    """(the fleet `<saturating host>,x86-sse4`, which splits as calibrated; its saturating host)."""
    need_tier("x86-sse4")
    sat = saturating_int8_host()
    return f"{sat},x86-sse4", sat


def _classes_in_a_fresh_equiv(cwd, hosts, folder, name, *more) -> list:
    """The classes a fresh `equiv` (its own run, results/equiv.json) finds for variant `name` beside its fp32."""
    proc = subprocess.run([sys.executable, "-m", "quantbench", "equiv", "--hosts", hosts, *more, "--variants",
                           str(folder / "fp32.onnx"), str(folder / f"{name}.onnx"), "--no-progress"], cwd=cwd,
                          capture_output=True, text=True)
    assert proc.returncode in (0, 1), proc.stdout[-3000:] + proc.stderr[-3000:]
    found = json.loads((cwd / "results/equiv.json").read_text())
    return [c["hosts"] for v in found["variants"] if v["variant"] == name for c in v["classes"]]


def test_an_identical_search_answer_is_one_class_in_a_fresh_equiv(run_dir, capsys):
    need_tier("x86-sse4")
    rc = main(["search", "--variant", "static-minmax", "--hosts", FLEET, "--identical", "--space", "global",
               "--no-progress"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "identical outputs: one class (x86, x86-sse4) on the whole fleet" in out
    name = out.split("chosen: ", 1)[1].split()[0]
    folder = run_dir / "results/variants/m"
    if _here_saturates():   # the variant as calibrated splits the two: the answer is a new variant
        assert name != "static-minmax"
        assert json.loads((folder / f"{name}.recipe.json").read_text())["search"]["one_class"] == ["x86", "x86-sse4"]
    assert _classes_in_a_fresh_equiv(run_dir, FLEET, folder, name) == [["x86", "x86-sse4"]]


def test_an_identical_search_without_one_class_exits_1_naming_the_classes_and_the_separating_op(run_dir, capsys):
    """Stopped after the variant as calibrated (3 evaluations): it splits x86 from x86-sse4, and localize on that
    pair names the op whose outputs differ first."""
    fleet, sat = _need_a_split()
    rc = main(["search", "--variant", "static-minmax", "--hosts", fleet, "--identical", "--max-evaluations", "3",
               "--no-progress"])
    out = capsys.readouterr().out
    assert rc == 1, out
    line = next(ln for ln in out.splitlines() if ln.startswith("not one class: "))
    assert line.startswith(f"not one class: nearest base gives 2 classes (A: {sat} | B: x86-sse4); separated by: A|B: ")
    assert "MatMul" in line, line
    assert (run_dir / "results/variants/m/index.json").read_text().count('"name"') == 2   # nothing written


def test_the_api_outcome_carries_the_classes_and_the_separating_ops(run_dir):
    import quantbench

    fleet, sat = _need_a_split()
    with pytest.raises(ParameterError):
        quantbench.search("static-minmax", quantbench.Fleet(fleet), identical="yes")
    done = quantbench.search("static-minmax", quantbench.Fleet(fleet), identical=True, max_evaluations=3)
    assert not done.passed
    assert done.identity["classes"] == [[sat], ["x86-sse4"]] and done.identity["candidate"] == "base"
    (sep,) = done.identity["separating"]
    assert sep["classes"] == ["A", "B"] and sep["hosts"] == [sat, "x86-sse4"] and sep["evaluations"] > 0
    assert done.outcome()["identity"] == done.identity
    assert "identity" not in quantbench.search("static-minmax", quantbench.Fleet("x86"), max_evaluations=3).outcome()


@pytest.mark.slow
def test_an_identical_search_on_the_demo_detector_ends_in_one_class_or_names_the_separating_ops(workdir):
    """The demo detector over x86 and x86-sse4 (4 fixtures; a budget every candidate meets, so identity decides): a
    variant a fresh equiv puts in one class, or exit 1 with the nearest candidate's classes and the ops."""
    need_tier("x86-sse4")

    def qb(*args):
        return subprocess.run([sys.executable, "-m", "quantbench", *args], cwd=workdir, capture_output=True,
                              text=True)

    assert qb("calibrate", "--model", "litter-detr-tiny", "--methods", "minmax", "--no-progress").returncode == 0
    found = qb("search", "--variant", "static-minmax", "--hosts", FLEET, "--identical", "--budget", "100%",
               "--limit", "4", "--space", "global", "--json", "--no-progress")
    assert "{" in found.stdout, found.stdout[-3000:] + found.stderr[-3000:]
    outcome = json.loads(found.stdout[found.stdout.index("{"):])   # after the --limit note
    assert found.returncode == (0 if outcome["passed"] else 1), found.stderr[-3000:]
    if not outcome["passed"]:
        assert len(outcome["identity"]["classes"]) > 1 and outcome["identity"]["separating"], outcome
        return
    assert outcome["identity"]["classes"] == [["x86", "x86-sse4"]]
    folder = next((workdir / "results" / "variants").glob("*/index.json")).parent
    assert _classes_in_a_fresh_equiv(workdir, FLEET, folder, outcome["variant"], "--limit", "4") == [
        ["x86", "x86-sse4"]]


def _tried(hashes: dict, flips: dict | None = None):
    from types import SimpleNamespace

    return SimpleNamespace(hashes=hashes, flips=flips or {h: 0 for h in hashes})


def test_classes_group_hosts_by_their_outputs_and_an_unknown_host_is_a_class_of_its_own():
    from types import SimpleNamespace

    from quantbench.explain.search.identity import class_text, classes_of, differing_fixtures, one_class, pair_of

    t = _tried({"pi": {"f1": "a", "f2": "b"}, "x86": {"f1": "a", "f2": "c"}, "x86-sse4": {"f1": "a", "f2": "b"}})
    assert classes_of(t) == [["pi", "x86-sse4"], ["x86"]] and not one_class(t)
    assert class_text(classes_of(t)) == "2 classes (A: pi, x86-sse4 | B: x86)"
    assert differing_fixtures(t) == ["f2"] and pair_of(t, ["pi", "x86-sse4"], ["x86"]) == ("pi", "x86", "f2")
    # a host that could not run the candidate is not known to give anyone's bytes
    assert classes_of(_tried({"a": {"f": "h"}, "b": {"f": "h"}}, {"a": 0, "b": None})) == [["a"], ["b"]]
    # an imported host joins the host standing in for it; one with no stand-in stays apart
    board = SimpleNamespace(label="board", stand_in_label="b")
    t = _tried({"a": {"f": "h"}, "b": {"f": "h"}}, {"a": 0, "b": 0, "board": 0})
    assert one_class(t, [board]) and class_text(classes_of(t, [board])) == "one class (a, b, board)"
    assert classes_of(t, [SimpleNamespace(label="board", stand_in_label=None)]) == [["a", "b"], ["board"]]


def test_what_moves_the_first_divergent_op_towards_identity_is_stacked_on_the_choice(tmp_path):
    """A multiply-accumulate op (or a Relu fused into it) gets the exact integer paths it lacks; an elementwise op,
    an activation or a normalisation the graph has, kept out of QDQ, then that with its outputs quantized; the float
    tail writing the outputs, the outputs quantized; an op no measurement speaks for, nothing."""
    from types import SimpleNamespace

    from onnx import helper

    from quantbench.explain.search.identity import stacked
    from quantbench.explain.search.space import Choice

    from onnx import TensorProto

    nodes = [helper.make_node(op, ["x"], [f"y{i}"]) for i, op in enumerate(("Conv", "Add", "Softmax"))]
    out = [helper.make_tensor_value_info("y2", TensorProto.FLOAT, [1])]
    space = SimpleNamespace(model=helper.make_model(helper.make_graph(nodes, "g", [], out)))
    ranges = tmp_path / "r.ranges.json"
    ranges.write_text(json.dumps({"method": "minmax", "ranges": {"y2": [0.0, 1.0]}}))
    base = Choice("base", "minmax", str(ranges), "u8", "s8", True, False)
    assert [c.name for c in stacked(base, "Conv", space)] == ["x64quantprecision", "reduce_range", "u8u8"]
    rr = stacked(base, "Relu", space)[1]
    assert rr.reduce_range and [c.name for c in stacked(rr, "Conv", space)] == [
        "reduce_range+x64quantprecision", "reduce_range+u8u8"]
    assert stacked(rr, "Conv", space)[0].entries == {"session.x64quantprecision": "1"}
    soft, soft_q = stacked(rr, "Softmax", space)
    assert soft.name == "reduce_range+float_softmax" and soft.exclude_op_types == ("Softmax",) and soft.reduce_range
    assert not soft.quantize_outputs   # then its now float outputs put on the grid, on top of it
    assert soft_q.name == "reduce_range+float_softmax+quantized_outputs" and soft_q.quantize_outputs
    assert soft_q.exclude_op_types == ("Softmax",)
    assert stacked(soft, "Softmax", space) == [] and stacked(base, "Sigmoid", space) == []   # done / not in the graph
    assert stacked(base, "Transpose", space) == []
    assert [c.name for c in stacked(base, "Add", space)] == ["float_add"]   # inside the graph: its output not one
    (tail,) = stacked(base, None, space)   # the float tail writing the outputs differs: the outputs quantized
    assert tail.name == "quantized_outputs" and tail.quantize_outputs and stacked(tail, None, space) == []
    ranges.write_text(json.dumps({"method": "minmax", "ranges": {"y1": [0.0, 1.0]}}))   # no output calibrated
    assert stacked(base, None, space) == [] and len(stacked(rr, "Softmax", space)) == 1


def test_without_an_answer_a_candidate_in_one_class_over_the_budget_is_named_rather_than_a_split_one():
    """The identity line must not say "not one class" when a confirmed candidate is one class and another constraint
    (the flip budget) kept it out; no localize runs for it."""
    from types import SimpleNamespace

    from quantbench.explain.search.identity import identity_line, outcome

    def cand(name, hashes, stage="confirm"):
        return SimpleNamespace(choice=SimpleNamespace(name=name), exclude=(), stage=stage, int8_ops=5,
                               int8={"macs": 1.0, "weights": 1.0}, hashes=hashes, flips={h: 3 for h in hashes},
                               worst=3)

    split = cand("base", {"x86": {"f": "a"}, "x86-sse4": {"f": "b"}})
    whole = cand("reduce_range", {"x86": {"f": "c"}, "x86-sse4": {"f": "c"}})
    walk = SimpleNamespace(tried=[split, whole], fleet=SimpleNamespace(imported=[]))
    got = outcome(walk, None)
    assert got["candidate"] == "reduce_range" and got["classes"] == [["x86", "x86-sse4"]] and not got["separating"]
    assert identity_line(got, None) == ("one class: reduce_range gives one class (x86, x86-sse4) on the whole fleet, "
                                        "but does not meet the other constraints (see the nearest candidate)")


def test_the_identity_walk_stops_at_a_step_that_makes_one_class_but_misses_the_budget(tmp_path):
    """A stacked step that gives one class but flips over the budget lowers the classes: the walk keeps it, has no
    pair of classes left to localize on, and ends without an answer (it once asked for a second class and died)."""
    from types import SimpleNamespace

    import onnx
    from onnx import TensorProto, helper

    from quantbench.explain.search.identity import identity_phase
    from quantbench.explain.search.space import Choice

    g = helper.make_graph([helper.make_node("Conv", ["x", "w"], ["y"], name="conv"),
                           helper.make_node("QuantizeLinear", ["y", "s"], ["y_q"], name="q")], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 2, 2])],
                          [helper.make_tensor_value_info("y_q", TensorProto.UINT8, [1, 1, 2, 2])])
    onnx.save(helper.make_model(g), tmp_path / "m.onnx")

    def cand(choice, hashes):
        return SimpleNamespace(choice=choice, exclude=(), stage="confirm", int8_ops=2, passes=False, worst=3,
                               int8={"macs": 1.0}, hashes=hashes, flips={h: 3 for h in hashes},
                               path=tmp_path / "m.onnx", variant_id="v")

    base = Choice("base", "minmax", "r.json", "u8", "s8", True, False)
    tried = [cand(base, {"x86": {"f": "a"}, "x86-sse4": {"f": "b"}})]

    def try_candidate(choice, exclude):
        tried.append(cand(choice, {"x86": {"f": "c"}, "x86-sse4": {"f": "c"}}))
        return tried[-1]

    fleet = SimpleNamespace(imported=[], hosts=[SimpleNamespace(label="x86"), SimpleNamespace(label="x86-sse4")],
                            localize=lambda *a: (["y_q"], 2, False))
    walk = SimpleNamespace(tried=tried, fleet=fleet, try_candidate=try_candidate, say=lambda line: None,
                           params=SimpleNamespace(max_evaluations=200), evaluations=0, localize_spent=0,
                           space=SimpleNamespace(op_types={"conv": "Conv"}, model=onnx.load(tmp_path / "m.onnx")))
    assert identity_phase(walk) is None
    assert [t.choice.name for t in tried] == ["base", "x64quantprecision", "reduce_range", "u8u8"]
    assert walk.evaluations == 4   # one localize: 2 runs on each host


@pytest.mark.slow
def test_a_session_entry_the_pis_onnxruntime_does_not_know_is_a_candidate_it_cannot_run(run_dir):
    """session.x64quantprecision is an x86 key: the Pi's onnxruntime (aarch64) does not know it, so `equiv` refuses
    to run a variant requiring it there; the search must count that candidate as one the Pi cannot run (it once ran
    it with the key silently ignored and called it one class), so its answer is one a fresh equiv can run
    everywhere."""
    import quantbench
    from pipeline_helpers import _need_pi

    _need_pi()
    done = quantbench.search("static-minmax", quantbench.Fleet(f"{saturating_int8_host()},pi"), identical=True, space="global")
    x64 = next(r for r in done.result.tried if r["choice"] == "x64quantprecision")
    assert x64["stage"] == "confirm" and x64["flips"]["pi"] is None and not x64["passes"], x64
    assert "cannot make this session on pi" in x64["note"] and "session.x64quantprecision" in x64["note"], x64
    if done.passed:
        assert "session.x64quantprecision" not in done.result.chosen["session_requirements"]


def test_a_confirmed_candidate_within_the_budget_but_split_says_so_in_its_status_line(run_dir):
    """Within a budget of 100% the variant as calibrated is kept out by its classes alone: its status line names them
    rather than calling it over the budget."""
    import quantbench

    fleet, sat = _need_a_split()
    lines = []
    quantbench.search("static-minmax", quantbench.Fleet(fleet), identical=True, budget="100%", max_evaluations=3,
                      on_status=lines.append)
    base = next(ln for ln in lines if ln.startswith("search: confirmed static-minmax ("))
    assert f"flips {sat} 4, x86-sse4 0, within the budget but 2 classes (A: {sat} | B: x86-sse4)" in base, base
