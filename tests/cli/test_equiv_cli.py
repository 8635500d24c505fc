"""`quantbench equiv` end to end: real onnxruntime runs, in-process CLI, gate exit codes, bad input.

The fast tests use a tiny classifier built with onnx.helper (two near-tied classes,
so int8 flips decisions) and two local hosts that differ by one session option
(graph optimisation all vs disabled: Conv+BatchNorm folding changes fp32 bits).
The slow test runs the bundled demo models natively and on the emulated Pi.
"""

import contextlib
import json
import shutil
from pathlib import Path

import pytest

from bench_helpers import make_bench
import quantbench
from quantbench.api.options import Fixtures, Fleet, Output
from quantbench.cli import main
from quantbench.errors import UserError


@pytest.fixture(scope="module")
def bench_dir(tmp_path_factory):
    """x86 (graph optimisation all) and x86b (disabled) results for fp32 + dynamic on 8 fixtures (run once)."""

    d = tmp_path_factory.mktemp("equiv")
    with contextlib.chdir(d):  # module fixtures cannot use monkeypatch
        vdir, labels = make_bench(d / "bench")
        (d / "quantbench.toml").write_text('x86b = { kind = "local" }\n')
        common = ["--variants", str(vdir), "--fixtures", str(labels), "--no-progress"]
        assert main(["run", "--hosts", "x86", *common]) == 0
        assert main(["run", "--hosts", "x86b", "--graph-opt", "disabled", *common]) == 0
    return d, common


@pytest.fixture
def two_sessions(bench_dir, monkeypatch):
    d, common = bench_dir
    monkeypatch.chdir(d)
    return common


def _equiv_json(capsys, args) -> tuple[int, dict]:
    capsys.readouterr()
    code = main(["equiv", "--no-run", "--json", *args])
    out = capsys.readouterr().out
    return code, json.loads(out)


def test_equiv_classes_flips_and_gate_exit_codes(two_sessions, capsys):
    workdir = Path.cwd()
    common = ["--hosts", "x86,x86b", *two_sessions]
    code, s = _equiv_json(capsys, common)
    assert code == 0
    by_var = {v["variant"]: v for v in s["variants"]}
    # graph optimisation changes fp32 bytes: two classes, separated by that session option
    fp32 = by_var["fp32"]
    assert [c["hosts"] for c in fp32["classes"]] == [["x86"], ["x86b"]]
    assert fp32["separating_features"] == ["session.graph_optimization_level"]
    d = fp32["distances"][0]
    assert d["output"] == "logits" and 0 < d["max_abs"] < 1e-3 and d["bits_min"] < 23
    comps = {(c["variant"], c["host"], c["comparison"]): c for c in s["comparisons"]}
    assert set(comps) == {("dynamic", "x86", "own-fp32"), ("dynamic", "x86b", "own-fp32"),
                          ("dynamic", "x86b", "ref-fp32"), ("dynamic", "x86b", "ref-same"), ("fp32", "x86b", "ref-fp32")}
    own = comps[("dynamic", "x86", "own-fp32")]
    # near-tied classes: int8 flips some top-1 decisions while the totals (one per image) stay equal; equal by
    # construction (top-1 without a threshold serves one decision per image), so nothing is concealed
    assert own["flips"] == 8 and own["ref_total"] == own["total"] == 8 and not own["concealed"]
    assert own["by_kind"]["class"] == own["flips"]
    # tensor gate fails int8 vs fp32 at 1e-5; fp32 across sessions passes it (sub-1e-5 relative) or not:
    # either way the verdicts are reported next to each other
    assert not own["tensor_gate"]["passed"]
    assert own["margins"]["half_width"] is not None
    flips_total = sum(c["flips"] for c in s["comparisons"])

    # gate exit codes
    assert main(["equiv", "--no-run", "--no-plots", *common, "--gate", "decision", "--budget", "1000"]) == 0
    assert main(["equiv", "--no-run", "--no-plots", *common, "--gate", "decision"]) == (1 if flips_total else 0)
    assert main(["equiv", "--no-run", "--no-plots", *common, "--gate", "classes"]) == 1
    assert main(["equiv", "--no-run", "--no-plots", *common, "--gate", "tensor", "--atol", "0", "--rtol", "0"]) == 1
    assert main(["equiv", "--no-run", "--no-plots", *common, "--gate", "tensor", "--atol", "1000"]) == 0
    assert main(["equiv", "--no-run", "--no-plots", *common, "--gate", "speed"]) == 2
    err = capsys.readouterr().err
    assert "gate failed: classes: fp32 splits into 2 classes" in err
    assert "unknown gate speed" in err

    # tables and report
    from quantbench.store import partread

    assert partread.read("classes").num_rows >= 3
    fl = partread.read("flips").to_pylist()
    assert {r["kind"] for r in fl} == {"class"} and all(r["band"] != "" for r in fl)
    # gate settings (atol, rtol, budget) do not change the analysis id: one set of rows
    dec = partread.read("decisions", columns=["equiv_id", "host", "variant", "flip_own_fp32"]).to_pylist()
    assert {r["equiv_id"] for r in dec} == {s["equiv_id"]}
    assert sum(1 for r in dec if r["variant"] == "dynamic" and r["host"] == "x86" and r["flip_own_fp32"]) == own["flips"]
    report = (workdir / "results" / "report.md").read_text()
    assert "Equivalence classes" in report and "concealed" in report
    # the last equiv ran with --no-plots: re-rendering from the tables gives the same report
    assert main(["report", "--no-plots"]) == 0
    assert (workdir / "results" / "report.md").read_text() == report


def test_equiv_text_summary_and_same_bytes(two_sessions, capsys):
    workdir = Path.cwd()
    args = ["equiv", "--no-run", "--hosts", "x86,x86b", *two_sessions, "--no-plots"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "Equivalence classes" in out and "vs own fp32" in out and "Gates over 5 comparisons" in out
    assert "wrote results/report.md" in out
    parts = sorted(p.name for p in (workdir / "results" / "tables" / "flips").glob("*.parquet"))
    report = (workdir / "results" / "report.md").read_bytes()
    assert main(args) == 0
    assert sorted(p.name for p in (workdir / "results" / "tables" / "flips").glob("*.parquet")) == parts
    assert (workdir / "results" / "report.md").read_bytes() == report


def test_the_run_hint_names_flags_on_the_command_line_and_parameters_in_the_api(two_sessions, capsys):
    """A host without results gets the command that makes them, repeating the options given: the command line
    names their flags, the API (the library) their parameters, never a flag."""
    vdir, labels = two_sessions[1], two_sessions[3]
    assert main(["equiv", "--no-run", *two_sessions, "--hosts", "x86,pi4", "--limit", "3"]) == 2
    err = capsys.readouterr().err
    assert f"`quantbench run --hosts pi4 --variants " in err and f" --fixtures {labels} --limit 3`" in err
    with pytest.raises(UserError) as exc:
        quantbench.equiv([vdir], fleet=Fleet("x86,pi4"), fixtures=Fixtures(labels=labels, limit=3), run=False,
                         output=Output(progress=False))
    said = str(exc.value)
    assert "`quantbench run hosts pi4 variants " in said and f" fixtures {labels} limit 3`" in said
    assert "--" not in said and "\x1e" not in said


def test_equiv_bad_input(two_sessions, capsys):
    workdir = Path.cwd()
    base = ["equiv", "--no-run", *two_sessions]
    assert main([*base, "--hosts", "x86,pi4"]) == 2
    err = capsys.readouterr().err
    assert "host pi4: no results for variant(s) fp32" in err and "quantbench run --hosts pi4" in err
    assert main([*base, "--hosts", "x86,x86b", "--decode", "detr-sigmoid"]) == 2
    err = capsys.readouterr().err
    assert "pred_logits" in err and "'logits'" in err and "Traceback" not in err
    assert main([*base, "--hosts", "x86,x86b", "--reference", "pi"]) == 2
    assert "--reference pi" in capsys.readouterr().err
    # a host that ran the same images under another preprocessing (other input hashes) is refused
    vdir = Path(two_sessions[1])
    other = workdir / "bench" / "variants-other"
    shutil.copytree(vdir, other)
    for name in ("fp32", "dynamic"):  # the variants' own input recipe says another mean
        recipe = json.loads((other / f"{name}.recipe.json").read_text())
        recipe["sidecar"]["input"]["mean"] = [0.4, 0.4, 0.4]
        (other / f"{name}.recipe.json").write_text(json.dumps(recipe))
    (workdir / "quantbench.toml").write_text('x86b = { kind = "local" }\nx86c = { kind = "local" }\n')
    assert main(["run", "--hosts", "x86c", "--variants", str(other), *two_sessions[2:]]) == 0
    capsys.readouterr()
    assert main([*base, "--hosts", "x86,x86c"]) == 2
    err = capsys.readouterr().err
    assert "input hash differs between hosts" in err and "meaningless" in err


def test_report_sections_assemble_in_fixed_order(workdir):
    from quantbench.report import document

    document.write_section("zeta", "## Zeta\n")
    document.write_section("release", "## Release\n")
    document.write_section("equiv", "## Old equiv\n")
    document.write_section("equiv", "## Equiv\n\nbody")      # a rerun replaces its own section only
    path = document.assemble()
    text = path.read_text()
    assert text.index("## Equiv") < text.index("## Release") < text.index("## Zeta")
    assert "Old equiv" not in text and text.startswith("# quantbench report")
    assert not [p for p in (workdir / "results" / "report.d").iterdir() if p.name.startswith(".")]
    with pytest.raises(ValueError):
        document.write_section("../x", "no")


def demo_variants(root: Path, model: str) -> Path:
    """fp32 + dynamic int8 of a bundled demo model, sidecar beside each, as a variants folder."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    from quantbench.inputs.assets import demo_model
    from quantbench.inputs.sidecarfile import load_sidecar
    from quantbench.inputs.variantdir import Variant, write_index

    src = demo_model(model)
    side = load_sidecar(src)
    vdir = root / "variants" / model
    vdir.mkdir(parents=True)
    shutil.copyfile(src, vdir / "fp32.onnx")
    quantize_dynamic(str(src), str(vdir / "dynamic.onnx"), weight_type=QuantType.QInt8)
    vs = []
    for name in ("fp32", "dynamic"):
        # made from the bundled demo model, as a calibrate recipe says: evaluated on the bundled corpus
        recipe = {"variant": name, "method": name, "model": model, "sidecar": side,
                  "source_model": {"path": f"bundled:models/{src.name}"}}
        (vdir / f"{name}.recipe.json").write_text(json.dumps(recipe))
        (vdir / f"{name}.json").write_text(json.dumps(side))
        vs.append(Variant(name=name, path=vdir / f"{name}.onnx", model=model, recipe=recipe))
    write_index(vdir, vs)
    return vdir


@pytest.mark.slow
@pytest.mark.parametrize("model,limit", [("litter-cnn", 4), ("litter-detr-tiny", 2)])
def test_equiv_demo_models_native_x86_and_emulated_pi(workdir, capsys, model, limit):
    vdir = demo_variants(workdir, model)
    capsys.readouterr()
    code = main(["equiv", "--hosts", "x86,pi", "--variants", str(vdir), "--limit", str(limit), "--no-progress",
                 "--no-plots", "--json"])
    out = capsys.readouterr().out
    assert code == 0
    s = json.loads(out)
    assert s["hosts"]["pi"]["arch"] == "aarch64" and s["hosts"]["x86"]["arch"] == "x86_64"
    by = {v["variant"]: v for v in s["variants"]}
    assert all(v["fixtures"] == limit for v in by.values())
    kind = by["fp32"]["decode"]["kind"]
    assert kind == ("classifier-softmax" if model == "litter-cnn" else "detr-sigmoid")
    # dynamic int8 computes with different integer kernels on x86 and ARM (measured in the notes):
    # two classes, told apart by the fingerprint
    assert [c["hosts"] for c in by["dynamic"]["classes"]] == [["x86"], ["pi"]]
    assert by["dynamic"]["separating_features"]
    dist = {d["output"]: d for d in by["dynamic"]["distances"]}
    assert dist and all(d["max_abs"] > 0 and d["bits_min"] < 23 for d in dist.values())
    comps = {(c["variant"], c["host"], c["comparison"]): c for c in s["comparisons"]}
    same = comps[("dynamic", "pi", "ref-same")]
    # different bytes: a non-zero delta (whether it exceeds 1e-5 is the tensor gate's business)
    assert same["tensor_gate"]["max_abs"] > 0 and same["tensor_gate"]["passed"] == (same["tensor_gate"]["failing"] == 0)
    for c in comps.values():
        assert c["fixtures"] == limit and c["ref_total"] >= 0 and c["total"] >= 0
        assert c["flips"] == sum(c["by_kind"].values())
        assert c["concealed"] == (c["flips"] > 0 and abs(c["ref_total"] - c["total"]) <= 1)
    from quantbench.store import partread

    dec = partread.read("decisions", columns=["host", "variant", "kept"]).to_pylist()
    served = sum(1 for r in dec if r["host"] == "pi" and r["variant"] == "dynamic" and r["kept"])
    assert served == comps[("dynamic", "pi", "own-fp32")]["total"]


def _copy_bench(two_sessions, dest: Path) -> list:
    """The module's runs copied to `dest` (this test's own results folder, no cache); equiv args for it."""
    shutil.copytree(Path.cwd() / "results", dest / "results", ignore=shutil.ignore_patterns(".cache"))
    shutil.copy(Path.cwd() / "quantbench.toml", dest / "quantbench.toml")
    return ["equiv", "--no-run", "--hosts", "x86,x86b", *two_sessions, "--no-plots"]


def _counting(monkeypatch) -> list:
    """Counts the variants the equiv analysis computes (none when its result is reused)."""
    from quantbench.analysis import equiv as E

    calls = []
    real = E._analyze_variant

    def counted(*a, **k):
        calls.append(a[2].name)
        return real(*a, **k)

    monkeypatch.setattr(E, "_analyze_variant", counted)
    return calls


def _outputs(results: Path) -> dict:
    """What an equiv leaves in the results folder: report, summary, table parts (rows without created_at)."""
    import pyarrow.parquet as pq

    out = {n: (results / n).read_bytes() for n in ("report.md", "report.html", "equiv.json")}
    for t in ("classes", "decisions", "flips"):
        for p in sorted((results / "tables" / t).glob("part-*.parquet")):
            rows = pq.read_table(p).drop_columns(["created_at"]).to_pylist()
            out[f"{t}/{p.name}"] = json.dumps(rows, sort_keys=True)   # (NaN as a token: equal to itself)
    return out


def test_equiv_analysis_reused_while_its_inputs_are_unchanged(two_sessions, tmp_path, monkeypatch, capsys):
    args = _copy_bench(two_sessions, tmp_path)
    monkeypatch.chdir(tmp_path)
    results = tmp_path / "results"
    calls = _counting(monkeypatch)
    assert main(args) == 0                       # computed, and kept under its content key
    assert calls == ["fp32", "dynamic"]
    first, text = _outputs(results), capsys.readouterr().out
    assert len(list((results / ".cache" / "equiv").glob("*.json"))) == 1
    assert main(args) == 0                       # same inputs: reused, same bytes out
    assert calls == ["fp32", "dynamic"]
    assert _outputs(results) == first and capsys.readouterr().out == text
    # the reused result rebuilds its decisions rows when their part is gone: the same part again
    dec = results / "tables" / "decisions"
    for p in [*dec.glob("part-*.parquet"), *(dec / ".ledger").iterdir()]:
        p.unlink()
    assert main(args) == 0
    assert calls == ["fp32", "dynamic"] and _outputs(results) == first
    # one input changed (a tolerance of the tensor gate): computed again
    assert main([*args, "--atol", "0.5"]) == 0
    assert calls == ["fp32", "dynamic"] * 2
    assert main(args) == 0                       # and back: the first entry is still there
    assert calls == ["fp32", "dynamic"] * 2 and _outputs(results) == first
    # an uncached analysis (no entry) writes the same bytes
    shutil.rmtree(results / ".cache" / "equiv")
    capsys.readouterr()
    assert main(args) == 0
    assert calls == ["fp32", "dynamic"] * 3 and _outputs(results) == first and capsys.readouterr().out == text


def test_equiv_damaged_cache_entry_is_recomputed(two_sessions, tmp_path, monkeypatch, capsys):
    import hashlib

    from quantbench.analysis.resultcache import seal

    args = _copy_bench(two_sessions, tmp_path)
    monkeypatch.chdir(tmp_path)
    results = tmp_path / "results"
    calls = _counting(monkeypatch)
    assert main(args) == 0
    first, text = _outputs(results), capsys.readouterr().out
    (entry,) = (results / ".cache" / "equiv").glob("*.json")
    good = entry.read_bytes()
    head, body = good.split(b"\n", 1)
    meta = json.loads(head)
    payload = json.loads(body)
    wrong_type = dict(payload, variants="not a list")
    bad_array = json.loads(body)
    bad_array["decoded"]["arrays"]["score"][4] = "AAAA"      # arrays whose bytes do not fit their shapes
    bad_row = json.loads(body)
    bad_row["flip_rows"][0]["score"] = "high"                # a row the flips table cannot hold
    damaged = [good[: len(good) // 2],                        # truncated
               good.replace(b'"flips"', b'"flipz"', 1),       # altered: the checksum no longer matches
               b"not json\n" + body]
    for p in (wrong_type, bad_array, bad_row):                # well-formed JSON, sealed here, contents wrong
        b = json.dumps(p).encode()
        damaged.append(json.dumps(dict(meta, seal=seal(meta["key"].encode() + b"\n" + b))).encode() + b"\n" + b)
    b = json.dumps(dict(payload, flip_rows=[])).encode()      # forged: a checksum anyone can recompute seals nothing
    damaged.append(json.dumps(dict(meta, seal=hashlib.sha256(b).hexdigest())).encode() + b"\n" + b)
    for n, data in enumerate(damaged, start=2):
        entry.write_bytes(data)
        assert main(args) == 0, n
        assert calls == ["fp32", "dynamic"] * n, n          # computed again, never trusted
        assert _outputs(results) == first and capsys.readouterr().out == text
        assert "Traceback" not in capsys.readouterr().err
        assert entry.read_bytes() == good                     # and the entry written anew


def test_a_decision_budget_as_a_share_counts_against_the_decisions_fp32_serves(two_sessions, capsys):
    """dynamic flips 8 of the 8 top-1 decisions fp32 serves on x86: a budget of 100% passes them, 50% allows 4 and
    the failure names the variant, the comparison and the count the share allows; the analysis keeps the budget as
    given."""
    common = ["--hosts", "x86,x86b", *two_sessions, "--no-plots", "--gate", "decision"]
    code, s = _equiv_json(capsys, [*common, "--budget", "100%"])
    assert code == 0 and s["settings"]["budget"] == "100%"
    assert main(["equiv", "--no-run", *common, "--budget", "50%"]) == 1
    err = capsys.readouterr().err
    assert "decision: dynamic on x86 vs fp32 on x86: 8 flips > budget 50% of 8 served decisions (4)" in err, err
    with pytest.raises(SystemExit) as refused:   # argparse's refusal, before any work
        main(["equiv", "--no-run", *common, "--budget", "5.5%x"])
    assert refused.value.code == 2
    assert "argument --budget: '5.5%x': give a number of flips (3) or a share of the served decisions (1%)" in \
        capsys.readouterr().err


def test_one_variant_by_name_is_analysed_beside_its_fp32_and_a_gate_failure_names_it(workdir, capsys):
    """`equiv --variant NAME` (the spelling for gating the one variant a search wrote): that variant of the last
    calibrate run with the run's fp32 added as its reference; the decision gate's failure names the variant."""
    from explain_helpers import bright_corpus, near_tie_image_model

    model = near_tie_image_model(workdir / "m.onnx")
    (workdir / "m.json").write_text(json.dumps({"decode": {"kind": "classifier-softmax", "logits": "logits"}}))
    labels = bright_corpus(workdir / "corpus", count=8)
    assert main(["calibrate", "--model", str(model), "--labels", str(labels), "--per-cell", "2", "--methods",
                 "minmax", "--allow-short", "--no-progress"]) == 0
    capsys.readouterr()
    rc = main(["equiv", "--variant", "static-minmax", "--hosts", "x86", "--gate", "decision", "--no-progress",
               "--no-plots"])
    err = capsys.readouterr().err
    assert rc == 1
    assert "decision: static-minmax on x86 vs fp32 on x86: 4 flips > budget 0" in err, err
    summary = json.loads((workdir / "results" / "equiv.json").read_text())
    assert sorted(v["variant"] for v in summary["variants"]) == ["fp32", "static-minmax"]
    rc = main(["equiv", "--variant", "static-minmax", "--variants", "results/variants/m", "--hosts", "x86",
               "--no-progress", "--no-plots"])
    assert rc == 2
    assert "--variant static-minmax: give one variant by name or a list of variants, not both" in \
        capsys.readouterr().err
