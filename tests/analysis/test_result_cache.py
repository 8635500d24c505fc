"""The analysis cache on a rerun of equiv: the analysis is reused (also for models with sidecars) and the
outputs' hashes and placements are read once."""

from quantbench.store import partread


def _cached_equiv_reads(workdir, capsys, monkeypatch) -> list:
    """(table, columns) of every tables.read of a second `equiv` on the bundled demo models (bare models with their
    sidecars beside them), after a first one; the report must come out the same."""
    from quantbench.cli import main

    argv = ["equiv", "--hosts", "x86", "--limit", "1", "--no-progress", "--no-plots"]
    assert main(argv) == 0, capsys.readouterr().err
    first = (workdir / "results" / "report.md").read_bytes()
    reads = []
    real = partread.read
    monkeypatch.setattr(partread, "read", lambda name, *a, **k: reads.append((name, tuple(k.get("columns") or ())))
                        or real(name, *a, **k))
    assert main(argv) == 0, capsys.readouterr().err
    assert "runs: x86 0 ran," in capsys.readouterr().out
    assert (workdir / "results" / "report.md").read_bytes() == first
    return reads


def test_a_cached_equiv_of_models_with_sidecars_reuses_the_analysis(workdir, capsys, monkeypatch):
    """A sidecar's checked input block (recipe.CheckedInput, a dict subclass) kept in the result made the analysis
    cache refuse to save it (a JSON round trip gives a plain dict), so every rerun on a bare model with a sidecar
    recomputed the analysis, its tensors read again; the result holds the sidecar as plain data now."""
    reads = _cached_equiv_reads(workdir, capsys, monkeypatch)
    assert not [cols for name, cols in reads if name == "outputs" and "tensor" in cols]


def test_a_cached_equiv_reads_the_outputs_hashes_and_placements_once(workdir, capsys, monkeypatch):
    """The analysis reads the outputs rows of its hosts and variants once: hashes (classes, selection) and the
    placements and session options (resolved providers) come from one read, not one read each."""
    reads = _cached_equiv_reads(workdir, capsys, monkeypatch)
    hashes = [cols for name, cols in reads if name == "outputs" and "sha256" in cols]
    assert len(hashes) == 1 and {"placement", "session_options"} <= set(hashes[0]), hashes
