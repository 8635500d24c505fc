"""A damaged Parquet part: run/equiv set it aside and recompute its rows; other readers name it.

Was: "not a readable quantbench outputs table (...)" followed by "rerun to resume", but
every rerun failed the same way until someone found and removed the part.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from hosts_helpers import make_corpus as eval_corpus
from run_helpers import variants_folder
from quantbench.store import partread
from quantbench.cli import main
from quantbench.errors import UserError


def _damage(part: Path) -> bytes:
    """Overwrite the part's footer metadata (before its length and the closing PAR1), as a bad disk would."""
    data = bytearray(part.read_bytes())
    data[-72:-8] = b"\xff" * 64
    part.write_bytes(bytes(data))
    partread._PART_FOOTERS.clear()  # this process read the footers before: a new command would not have them
    return bytes(data)


@pytest.fixture
def bench(workdir):
    vdir, labels = variants_folder(workdir / "v"), eval_corpus(workdir / "corpus")
    argv = ["equiv", "--hosts", "x86", "--variants", str(vdir), "--fixtures", str(labels), "--no-progress",
            "--decode", "none", "-q"]
    assert main(argv) == 0
    return workdir / "results" / "tables", argv


def test_equiv_sets_a_damaged_outputs_part_aside_and_recomputes_its_rows(bench, capsys):
    tdir, argv = bench
    rows = partread.read("outputs", tdir, columns=["run_key", "output_name", "sha256"]).to_pylist()
    part = partread.parts("outputs", tdir)[0]
    damaged = _damage(part)
    capsys.readouterr()
    assert main(argv) == 0
    err = capsys.readouterr().err
    notes = [line for line in err.splitlines() if "damaged" in line]
    moved = tdir / ".quarantine" / "outputs" / part.name
    assert notes == [f"note: {part.relative_to(tdir.parents[1])}: damaged "
                     f"({notes[0].split('damaged (', 1)[1].split('); moved', 1)[0]}); moved to "
                     f"{moved.relative_to(tdir.parents[1])}, its rows are recomputed"]
    assert moved.read_bytes() == damaged  # kept, not deleted
    assert partread.read("outputs", tdir, columns=["run_key", "output_name", "sha256"]).to_pylist() == rows
    assert main(argv) == 0 and "damaged" not in capsys.readouterr().err


def test_equiv_sets_aside_a_damaged_part_it_would_not_read(bench, capsys):
    """An analysis reused from the cache reads no classes part: the damaged one is found all the same, so a
    later reader (release, report) does not stop on it."""
    tdir, argv = bench
    part = partread.parts("classes", tdir)[0]
    before = partread.read("classes", tdir).to_pylist()
    _damage(part)
    capsys.readouterr()
    assert main(argv) == 0
    assert f"{part.relative_to(tdir.parents[1])}: damaged" in capsys.readouterr().err
    assert (tdir / ".quarantine" / "classes" / part.name).exists()
    assert partread.read("classes", tdir, columns=["variant_id", "class_label"]).to_pylist() == \
        [{k: r[k] for k in ("variant_id", "class_label")} for r in before]


def test_a_reader_without_the_lock_names_the_part_to_move(bench):
    tdir, _ = bench
    part = partread.parts("fixtures", tdir)[0]
    damaged = _damage(part)
    with pytest.raises(UserError) as exc:
        partread.read("fixtures", tdir)
    msg = str(exc.value)
    assert "\n" not in msg and msg.startswith(f"{part}: damaged fixtures table part (")
    assert f"move it out of {part.parent} (or delete it) and rerun" in msg
    assert part.read_bytes() == damaged  # a reader moves nothing


def test_equiv_sets_aside_a_part_whose_strings_are_not_utf8(bench, capsys):
    """A flipped byte inside a string value (the part parses, its footer is intact): equiv and report died with
    UnicodeDecodeError ('placement'). Every value of a part is checked as it is read: equiv sets it aside and
    recomputes its rows, a reader without the lock names it in one line."""
    import pyarrow.parquet as pq

    tdir, argv = bench
    rows = partread.read("outputs", tdir, columns=["run_key", "output_name", "sha256"]).to_pylist()
    part = partread.parts("outputs", tdir)[0]
    t = pq.read_table(part)
    pq.write_table(t, part, compression="none", write_statistics=False)
    data = bytearray(part.read_bytes())
    value = t.column("placement").to_pylist()[0].encode()
    data[bytes(data).index(value) + 2] = 0x8B
    part.write_bytes(bytes(data))
    partread._PART_FOOTERS.clear()
    with pytest.raises(UserError) as exc:
        partread.read("outputs", tdir)
    assert str(exc.value).startswith(f"{part}: damaged outputs table part (ArrowInvalid: ") and "\n" not in str(exc.value)
    capsys.readouterr()
    assert main(argv) == 0
    assert f"{part.relative_to(tdir.parents[1])}: damaged (" in capsys.readouterr().err
    assert (tdir / ".quarantine" / "outputs" / part.name).exists()
    assert partread.read("outputs", tdir, columns=["run_key", "output_name", "sha256"]).to_pylist() == rows
