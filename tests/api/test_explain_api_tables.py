"""`quantbench.localize/lint/remedy/noise/latency`: each API function writes and returns the rows its command
writes for the same inputs (one small calibrated image model, this machine and a CPUID-masked tier it shows), and
names parameters, never flags, in its one-line errors."""

from __future__ import annotations

import json

import pytest

import quantbench
from quantbench import Fleet, Results
from quantbench.errors import UserError

#: columns a second writing of the same rows differs in: when it was written; latency's timings
WRITTEN_AT = ("created_at",)
TIMINGS = ("median_ms", "spread_ms", "peak_rss_mb", "speedup_vs_fp32", "sign")


@pytest.fixture(scope="module")
def calibrated(tmp_path_factory):
    """static-minmax and fp32 of a saturating image classifier calibrated on bright images (cwd: its folder)."""
    from explain_helpers import bright_corpus, saturating_image_model
    from quantbench.cli import main

    folder = tmp_path_factory.mktemp("explain-api")
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(folder)
        model = saturating_image_model(folder / "m.onnx")
        (folder / "m.json").write_text(json.dumps({"decode": {"kind": "classifier-softmax", "logits": "logits"}}))
        labels = bright_corpus(folder / "corpus", count=8)
        assert main(["calibrate", "--model", str(model), "--labels", str(labels), "--per-cell", "2", "--methods",
                     "minmax", "--allow-short", "--no-progress"]) == 0
        yield folder


@pytest.fixture(scope="module")
def tier():
    """A masked x86 tier this CPU shows (x86-avx2 on an AVX2 machine), else the first it shows."""
    from quantbench.hosts import cpuprofiles, masked
    from setup_required import missing_setup

    shown = [t for t, p in cpuprofiles.PROFILES.items() if masked.masked_unavailable(p) is None]
    if not shown:
        missing_setup("this CPU shows no masked x86 tier")
    return "x86-avx2" if "x86-avx2" in shown else shown[0]


def rows(table, drop=WRITTEN_AT) -> list[dict]:
    """A table's rows without the columns a rewrite differs in, in one order."""
    out = [{k: v for k, v in r.items() if k not in drop} for r in table.to_pylist()]
    return sorted(out, key=lambda r: json.dumps(r, sort_keys=True, default=str))


def command_rows(name: str, argv: list[str], results, drop=WRITTEN_AT, code: int = 0) -> list[dict]:
    """The rows table `name` holds after the command `argv` wrote into the results folder `results`."""
    from quantbench.cli import main
    from quantbench.store import partread

    assert main([*argv, "--results", str(results)]) == code
    return rows(partread.read(name, root=results / "tables"), drop)


def test_lint_returns_the_commands_rows(calibrated, tier, capsys):
    model = str(calibrated / "results" / "variants" / "m" / "static-minmax.onnx")
    hosts = f"x86,{tier}:masked"
    done = quantbench.lint(model, Fleet(hosts), Results("api"))
    assert done.table().num_rows == len(done.layers) >= 3 and done.risky
    assert [p.host for p in done.fleet] == ["x86", f"{tier}:masked"]
    assert rows(done.table()) == command_rows("lint", ["lint", model, "--hosts", hosts], calibrated / "cli")
    out = capsys.readouterr().out
    assert f"{len(done.layers)} int8 weight tensor(s), {len(done.risky)} that some host tier" in out
    assert done.listing() in out and done.fleet_note() in out
    assert "## Explaining divergences" in done.report.read_text()


def test_localize_returns_the_commands_rows(calibrated, tier, capsys):
    hosts = f"x86,{tier}:masked"
    done = quantbench.localize("static-minmax", Fleet(hosts), results=Results("api"), group=4)
    assert done.table().num_rows == len(done.result.rows) > 0
    assert done.table().column("host_b").to_pylist()[0] == f"{tier}:masked"
    argv = ["localize", "--variant", "static-minmax", "--hosts", hosts, "--group", "4", "--no-progress"]
    assert rows(done.table()) == command_rows("localize", argv, calibrated / "cli")
    assert done.summary() in capsys.readouterr().out


def test_noise_returns_the_commands_rows(calibrated, tier, capsys):
    hosts = f"x86,{tier}:masked"
    done = quantbench.noise("static-minmax", Fleet(hosts), results=Results("api"), limit=2,
                            factors=["repeat", "opt_level"])
    assert [(r.host, r.factor) for r in done.rows] == [(h, f) for h in ("x86", f"{tier}:masked")
                                                       for f in ("repeat", "opt_level")]
    assert done.harness_faults == []
    argv = ["noise", "--variant", "static-minmax", "--hosts", hosts, "--limit", "2", "--factors", "repeat,opt_level"]
    assert rows(done.table()) == command_rows("noise", argv, calibrated / "cli")
    assert done.text() in capsys.readouterr().out


def test_remedy_returns_the_commands_rows(calibrated, tier, capsys):
    hosts = f"x86,{tier}:masked"
    done = quantbench.remedy("static-minmax", Fleet(hosts), results=Results("api"), limit=2,
                             remedies="baseline,x64quantprecision", out="")   # '': the default, as on the command line
    assert [r.remedy for r in done.rows] == ["baseline", "x64quantprecision"]
    assert done.out.resolve() == calibrated / "api" / "remedies" / "static-minmax"
    argv = ["remedy", "--variant", "static-minmax", "--hosts", hosts, "--limit", "2", "--remedies",
            "baseline,x64quantprecision", "--no-progress"]
    assert rows(done.table()) == command_rows("remedies", argv, calibrated / "cli")
    out = capsys.readouterr().out
    assert done.text() in out and "remedies that bring every host into one class: " in out


def test_latency_returns_the_commands_rows_but_the_timings(calibrated, capsys):
    counts = {"warmup": 1, "runs": 10, "repeats": 3}
    done = quantbench.latency("fp32,static-minmax", Fleet("x86"), results=Results("api"), **counts)
    assert [r.variant for r in done.rows] == ["fp32", "static-minmax"] and done.rows[1].sign
    argv = ["latency", "--variants", "fp32,static-minmax", "--hosts", "x86"]
    argv += [x for k, v in counts.items() for x in (f"--{k}", str(v))]
    assert rows(done.table(), WRITTEN_AT + TIMINGS) == command_rows("latency", argv, calibrated / "cli",
                                                                    WRITTEN_AT + TIMINGS)
    assert "latency table: " in capsys.readouterr().out


def test_their_errors_name_parameters(calibrated, tier):
    with pytest.raises(UserError, match=r"^factors: name at least one factor of repeat, "):
        quantbench.noise("static-minmax", Fleet("x86"), factors="")
    with pytest.raises(UserError, match=r"^remedies: unknown remedy nope; choose from baseline, "):
        quantbench.remedy("static-minmax", Fleet(f"x86,{tier}:masked"), limit=1, remedies=["nope"])
    with pytest.raises(UserError, match=r"^threads=0: must be at least 1$"):
        quantbench.latency("fp32", threads=0)
    with pytest.raises(UserError, match=r"^variants '': name at least one variant, or 'all'$"):
        quantbench.latency("")
    with pytest.raises(UserError, match=r"^fleet=.*must be a Fleet\(\.\.\.\)"):
        quantbench.localize("static-minmax", "x86,x86")
    with pytest.raises(UserError, match=r"^model: must be a file or folder name"):
        quantbench.lint(None)
