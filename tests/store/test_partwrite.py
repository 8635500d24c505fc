"""Content-addressed parts and their ledger: rows already stored are not serialised again, also after a
compaction, and a part that went away is written again."""

from quantbench.store import compaction, partread, partwrite


def test_ledger_skips_serialising_stored_rows(tmp_path, monkeypatch):
    rows = [{"variant_id": f"v{i}", "raw_sha256": "r", "model": "m", "variant": "fp32", "path": "p", "recipe": "{}"}
            for i in range(3)]
    p1 = partwrite.append("models", rows, root=tmp_path, ledger=True)
    calls = []
    real = partwrite.serialize
    monkeypatch.setattr(partwrite, "serialize", lambda *a, **k: calls.append(1) or real(*a, **k))
    assert partwrite.append("models", rows, root=tmp_path, ledger=True) == p1
    assert calls == []
    p2 = partwrite.append("models", rows[:2], root=tmp_path, ledger=True)  # other rows: written
    assert calls == [1] and p2 != p1
    p1.unlink()  # the part went away (e.g. compacted and lost): written again
    assert partwrite.append("models", rows, root=tmp_path, ledger=True) == p1 and p1.exists()
    assert partread.read("models", tmp_path).num_rows == 3


def test_ledger_follows_compacted_rows(tmp_path, monkeypatch):
    root = tmp_path / "t"
    sets = [[{"variant_id": f"v{i}{j}", "raw_sha256": "r", "model": "m", "variant": "fp32", "path": "p",
              "recipe": "{}"} for j in range(2)] for i in range(3)]
    for rows in sets:
        partwrite.append("models", rows, root=root, ledger=True)
    compaction.compact("models", root)
    (only,) = partread.parts("models", root)
    calls = []
    real = partwrite.serialize
    monkeypatch.setattr(partwrite, "serialize", lambda *a, **k: calls.append(1) or real(*a, **k))
    assert all(partwrite.append("models", rows, root=root, ledger=True) == only for rows in sets)
    assert calls == []
