"""What a user's file is allowed to be before quantbench reads it: a regular file (never a FIFO, a device or a
folder, refused by stat before any open, so a named pipe cannot block a command), of a bounded size (hosts and
settings files), nested no deeper than a parser's stack. Each refusal is one line, exit code 2, no traceback,
nothing written; the commands run as real subprocesses with a time limit, so a regression that blocks or reads
without end fails instead of hanging the suite."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from calib_helpers import make_corpus, tiny_model
from cli_helpers import digest, one_line

#: generous: each command here is refused before it loads a model (a blocking open would never end)
LIMIT_S = 120


def quantbench(args, cwd) -> tuple[int, str]:
    proc = subprocess.run([sys.executable, "-m", "quantbench", *map(str, args)], cwd=cwd, capture_output=True,
                          text=True, timeout=LIMIT_S, stdin=subprocess.DEVNULL)
    return proc.returncode, proc.stderr


def refused(cwd: Path, args, command: str, expect: str) -> str:
    before = digest(cwd)
    rc, err = quantbench(args, cwd)
    assert rc == 2, err
    line = one_line(err, command)
    assert expect in line, line
    assert digest(cwd) == before, "something was written"
    return line


def refused_before_the_command(cwd: Path, args, expect: str) -> None:
    """A hosts file is read for its [defaults] before the command starts (as ./quantbench.toml is): one
    `quantbench: error:` line, nothing written."""
    before = digest(cwd)
    rc, err = quantbench(args, cwd)
    lines = [ln for ln in err.splitlines() if ln.startswith("quantbench")]
    assert rc == 2 and len(lines) == 1 and lines[0].startswith("quantbench: error: ") and expect in lines[0], err
    assert "Traceback" not in err and digest(cwd) == before


@pytest.fixture
def calib(workdir):
    labels, images = make_corpus(workdir / "corpus", n_litter=4, n_negative=4, n_eval=2)
    model = tiny_model(workdir / "models" / "tiny.onnx")
    args = ["calibrate", "--model", model, "--labels", labels, "--per-cell", 2, "--no-pre-process",
            "--methods", "minmax", "--no-progress"]
    return workdir, model, labels, images, args


def _swap_for_fifo(path: Path) -> Path:
    path.unlink()
    os.mkfifo(path)
    return path


@pytest.mark.parametrize("which", ["model", "labels", "image", "sidecar"])
def test_a_fifo_where_a_file_is_expected_is_refused_without_blocking(calib, which):
    wd, model, labels, images, args = calib
    target = {"model": Path(model), "labels": Path(labels), "sidecar": Path(model).with_suffix(".json"),
              "image": sorted(Path(images).iterdir())[0]}[which]
    _swap_for_fifo(target)
    line = refused(wd, args, "calibrate", "is a named pipe (FIFO), expected a")
    assert str(target.name) in line


def test_a_fifo_as_hosts_file_is_refused_without_blocking(workdir):
    fifo = workdir / "hosts.toml"
    os.mkfifo(fifo)
    refused(workdir, ["hosts", "--hosts-file", fifo, "list"], "hosts",
            f"{fifo.name}: is a named pipe (FIFO), expected a hosts file")


def test_a_fifo_named_quantbench_toml_is_refused_not_skipped(workdir):
    os.mkfifo(workdir / "quantbench.toml")
    rc, err = quantbench(["hosts", "list"], workdir)
    assert rc == 2 and "quantbench.toml: is a named pipe (FIFO)" in err and "Traceback" not in err, err


def test_diff_of_a_device_is_refused_before_reading_it(workdir):
    model = tiny_model(workdir / "tiny.onnx")
    refused(workdir, ["diff", "/dev/zero", model], "diff", "/dev/zero: is a character device, expected a model")


def test_a_folder_named_like_an_image_is_refused(calib):
    wd, model, labels, images, args = calib
    first = sorted(Path(images).iterdir())[0]
    first.unlink()
    first.mkdir()
    refused(wd, args, "calibrate", f"{first.name}: is a folder, expected a image")


def test_a_hosts_file_over_the_size_limit_is_refused_before_parsing(workdir):
    from quantbench.fsutil import MAX_SETTINGS_BYTES

    hf = workdir / "big.toml"
    line = "h{} = {{ kind = \"local\" }}\n"
    with open(hf, "w") as fh:
        i = 0
        while fh.tell() <= MAX_SETTINGS_BYTES:
            fh.write(line.format(i))
            i += 1
    refused_before_the_command(workdir, ["hosts", "--hosts-file", hf, "list"],
                               f"{hf.name}: hosts file is {hf.stat().st_size:,} bytes, more than the limit of "
                               f"{MAX_SETTINGS_BYTES:,}")


def test_a_large_hosts_file_within_the_limit_is_read_in_one_pass(workdir):
    """Was: each host's line found by a scan of the whole file (a 10 MB file took 46 s per run)."""
    from quantbench.hosts.registry import load_hosts_file

    hf = workdir / "many.toml"
    hf.write_text("".join(f'h{i} = {{ kind = "local" }}\n' for i in range(20000)))
    specs = load_hosts_file(hf)
    assert len(specs) == 20000 and specs["h19999"].origin == f"{hf}:20000"


def test_deeply_nested_toml_is_one_line(workdir):
    hf = workdir / "deep.toml"
    hf.write_text("x = " + "[" * 100000 + "]" * 100000 + "\n")
    refused_before_the_command(workdir, ["hosts", "--hosts-file", hf, "list"], f"{hf.name}: not valid TOML (nested too deeply)")


def test_deeply_nested_labels_json_is_one_line(calib):
    wd, model, labels, images, args = calib
    Path(labels).write_text('{"images": ' + "[" * 100000 + "]" * 100000 + "}")
    refused(wd, args, "calibrate", f"{Path(labels).name}: not a readable labels JSON (nested too deeply)")


@pytest.mark.parametrize("command", ["run", "equiv", "latency"])
def test_a_fifo_as_variants_model_is_refused_without_blocking(workdir, command):
    fifo = workdir / "f.onnx"
    os.mkfifo(fifo)
    refused(workdir, [command, "--hosts", "x86", "--variants", fifo, "--no-progress"], command,
            "f.onnx: is a named pipe (FIFO), expected a model (.onnx)")


@pytest.fixture
def fifo_part(workdir):
    """A results folder with a run's tables, and a FIFO named like a part of its outputs table."""
    from hosts_helpers import image_model, make_corpus as eval_corpus
    from quantbench.cli import main

    model = image_model(workdir / "m.onnx")
    labels = eval_corpus(workdir / "corpus", count=1)
    argv = ["equiv", "--hosts", "x86", "--variants", str(model), "--fixtures", str(labels), "--decode", "none",
            "--no-progress"]
    assert main(argv) == 0
    fifo = workdir / "results" / "tables" / "outputs" / "part-fifo.parquet"
    os.mkfifo(fifo)
    return workdir, fifo, argv


@pytest.mark.parametrize("argv", [["report"], ["tables", "compact"]])   # release: tests/release/test_damaged_inputs.py
def test_a_fifo_part_is_named_without_blocking(fifo_part, argv):
    wd, fifo, _ = fifo_part
    rc, err = quantbench(argv, wd)
    assert rc == 2 or (rc == 0 and "moved to" in err), err   # named (or, under the write lock, set aside)
    assert "part-fifo.parquet" in err and "is a named pipe (FIFO), not a Parquet file" in err, err
    assert "Traceback" not in err


def test_equiv_sets_a_fifo_part_aside(fifo_part):
    wd, fifo, argv = fifo_part
    rc, err = quantbench(argv, wd)
    assert rc == 0, err
    assert "part-fifo.parquet: damaged (NotAPart: is a named pipe (FIFO), not a Parquet file); moved to" in err, err
    assert not os.path.lexists(fifo)


def test_diff_of_a_model_over_protobufs_limit_is_refused_by_its_size(workdir):
    """A 3 GiB (sparse) .onnx was read whole (3.2 GB of memory, 20 s) before protobuf said no: a protobuf
    message cannot exceed 2 GiB, so the size alone refuses it."""
    model = tiny_model(workdir / "tiny.onnx")
    big = workdir.parent / f"{workdir.name}-big" / "big.onnx"  # outside the digested folder: hashing 3 GiB took 15 s
    big.parent.mkdir()
    with open(big, "wb") as fh:
        fh.truncate(3 << 30)
    before = big.stat()
    line = refused(workdir, ["diff", big, model], "diff", f"big.onnx: {3 << 30:,} bytes, more than a protobuf message")
    assert "external data" in line
    after = big.stat()  # any write to it would change its ctime
    assert (after.st_size, after.st_mtime_ns, after.st_ctime_ns) == (before.st_size, before.st_mtime_ns,
                                                                    before.st_ctime_ns)
    big.unlink()


@pytest.mark.parametrize("kind", ["json", "csv"])
def test_labels_over_the_labels_limit_are_refused_before_parsing(calib, kind):
    """A 180 MB labels JSON took 2.7 GB parsed: labels are read up to MAX_LABELS_BYTES (documented in
    docs/trust.md), a larger file refused by its size before a byte is parsed."""
    from quantbench.inputs.fixtures import MAX_LABELS_BYTES

    wd, model, labels, images, args = calib
    big = wd / "corpus" / f"big.{kind}"
    with open(big, "wb") as fh:
        fh.truncate(180 * 10 ** 6)
    args = [str(big) if a == labels else a for a in args]
    line = refused(wd, args, "calibrate", f"big.{kind}: labels file is {180 * 10 ** 6:,} bytes, more than the "
                                          f"limit of {MAX_LABELS_BYTES:,}")
    assert "split it" in line
