"""`quantbench equiv` on the local x86 host when decisions cannot or should not be decoded.

A model whose sidecar has no decode block, or `--decode none`, still gets its
equivalence classes, distances and tensor gate; decisions are reported as not
compared (never as zero flips), and `--gate decision` is refused. A decoder that
does not fit the outputs stays an error, and says how to get the classes anyway.
"""

import json
from pathlib import Path

import pytest

from quantbench.cli import main
from test_equiv_cli import SIDE, make_bench


@pytest.fixture(scope="module")
def bench_nodecode(tmp_path_factory):
    """fp32 + dynamic of the tiny classifier whose sidecars carry no decode block, run once on x86."""
    import os

    d = tmp_path_factory.mktemp("equiv-nodecode")
    old = os.getcwd()
    os.chdir(d)
    try:
        vdir, labels = make_bench(d / "bench", n_images=4)
        side = {k: v for k, v in SIDE.items() if k != "decode"}
        for name in ("fp32", "dynamic"):
            (vdir / f"{name}.json").write_text(json.dumps(side))
            r = json.loads((vdir / f"{name}.recipe.json").read_text())
            r["sidecar"] = side
            (vdir / f"{name}.recipe.json").write_text(json.dumps(r))
        common = ["--variants", str(vdir), "--fixtures", str(labels), "--no-progress"]
        assert main(["run", "--hosts", "x86", *common]) == 0
    finally:
        os.chdir(old)
    return d, common


@pytest.fixture
def nodecode(bench_nodecode, monkeypatch):
    d, common = bench_nodecode
    monkeypatch.chdir(d)
    return ["equiv", "--no-run", "--no-plots", "--hosts", "x86", *common]


def test_no_decode_block_still_gives_classes_and_says_decisions_not_compared(nodecode, capsys):
    capsys.readouterr()
    assert main(nodecode) == 0
    out = capsys.readouterr().out
    assert "Equivalence classes" in out and "x86" in out
    assert "decisions: not compared (decode none" in out
    assert "0 (0 img)" not in out
    code = main([*nodecode, "--json"])
    s = json.loads(capsys.readouterr().out)
    assert code == 0
    assert {v["variant"] for v in s["variants"]} == {"fp32", "dynamic"}
    assert all(len(v["classes"]) == 1 for v in s["variants"])
    own = next(c for c in s["comparisons"] if c["comparison"] == "own-fp32")
    assert own["flips"] is None and own["decision_passed"] is None
    assert own["tensor_gate"]["elements"] > 0
    from quantbench import tables

    assert tables.read("classes").num_rows >= 2
    for name in ("decisions", "flips"):
        p = Path("results/tables") / name
        assert not p.exists() or tables.read(name).num_rows == 0


def test_decode_none_and_the_decision_gate(nodecode, capsys):
    capsys.readouterr()
    assert main([*nodecode, "--decode", "none"]) == 0
    assert "decisions: not compared (decode none)" in capsys.readouterr().out
    assert main([*nodecode, "--decode", "none", "--gate", "tensor", "--atol", "1000"]) == 0
    capsys.readouterr()
    assert main([*nodecode, "--decode", "none", "--gate", "decision"]) == 2
    err = capsys.readouterr().err
    assert "--gate decision" in err and "decode none" in err and len(err.strip().splitlines()) == 1


def test_a_decoder_that_does_not_fit_says_how_to_get_classes(nodecode, capsys):
    capsys.readouterr()
    assert main([*nodecode, "--decode", "detr-sigmoid"]) == 2
    err = capsys.readouterr().err
    assert "pred_logits" in err and "--decode none" in err and len(err.strip().splitlines()) == 1
    with pytest.raises(SystemExit) as e:   # a usage mistake: argparse's one line, exit 2
        main([*nodecode, "--decode", "nosuchkind"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "--decode" in err and "module:function" in err
