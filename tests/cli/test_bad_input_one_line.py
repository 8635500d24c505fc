"""Bad input is one line and writes nothing: absurd sizes, malformed labels and sidecars, dying hosts.

Every refusal is checked the same way: the exit code, a stable substring of the one
line the CLI prints, no "Traceback" on stderr, and nothing written (a digest of the
whole working folder, files and folders, is the same before and after).
"""

from __future__ import annotations

import json
import os
import re
import resource
import struct
import subprocess
import sys
import textwrap
import zlib
from pathlib import Path

import numpy as np
import pytest

from calib_helpers import make_corpus, tiny_model
from quantbench.cli import main
from quantbench.errors import UserError
from quantbench.fsutil import sha256_file

# --------------------------------------------------------------------------- helpers


def digest(root: Path) -> dict:
    """Every file (by content) and folder under root: what "nothing was written" compares."""
    return {p.relative_to(root).as_posix(): (sha256_file(p) if p.is_file() else "dir")
            for p in sorted(root.rglob("*"))}


def error_lines(stderr: str) -> list[str]:
    """stderr's `quantbench ...` lines (tqdm progress lines left out)."""
    return [ln for ln in stderr.replace("\r", "\n").splitlines() if ln.startswith("quantbench")]


def cli(capsys, *args) -> tuple[int, str]:
    try:
        rc = main([str(a) for a in args])
    except SystemExit as exc:  # argparse refusals
        rc = exc.code
    return rc, capsys.readouterr().err


def assert_refused(capsys, wd: Path, args, expect: str, rc: int = 2) -> str:
    before = digest(wd)
    got, err = cli(capsys, *args)
    lines = error_lines(err)
    assert got == rc, err
    assert len(lines) == 1 and expect in lines[0], err
    assert "Traceback" not in err
    assert digest(wd) == before, "something was written"
    return lines[0]


def png_bytes(arr: np.ndarray | None, depth: int, color_type: int, size: tuple[int, int] | None = None) -> bytes:
    """A PNG written by hand (any bit depth, any declared size: `size` overrides the header's w, h)."""
    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    if arr is None:
        w, h = size
        idat = zlib.compress(b"\0" * 64)
    else:
        h, w = arr.shape[:2]
        dt = ">u2" if depth == 16 else "u1"
        idat = zlib.compress(b"".join(b"\0" + arr[y].astype(dt).tobytes() for y in range(h)))
        if size:
            w, h = size
    ihdr = struct.pack(">IIBBBBB", w, h, depth, color_type, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", idat) + chunk(b"IEND", b"")


@pytest.fixture
def calib(workdir):
    """A tiny model with its sidecar and a stand-in COCO corpus; returns (workdir, model, labels, base args)."""
    labels, _ = make_corpus(workdir / "corpus", n_litter=6, n_negative=6, n_eval=2)
    model = tiny_model(workdir / "models" / "tiny.onnx")
    args = ["calibrate", "--model", model, "--labels", labels, "--per-cell", 2, "--no-pre-process",
            "--methods", "minmax"]
    return workdir, model, labels, args


def _edit_json(path: Path, fn) -> None:
    data = json.loads(path.read_text())
    data = fn(data) or data
    path.write_text(json.dumps(data))


# --------------------------------------------------------------------------- caps, decoding, thresholds


def _limited(args, cwd, gib: int = 6):
    """The CLI in a child process whose address space is capped, so a regression fails fast instead of
    OOM-killing the machine."""
    def cap():
        resource.setrlimit(resource.RLIMIT_AS, (gib << 30, gib << 30))

    return subprocess.run([sys.executable, "-m", "quantbench", *map(str, args)], cwd=cwd, capture_output=True,
                          text=True, timeout=300, preexec_fn=cap)


@pytest.mark.parametrize("declared_by", ["sidecar", "model"])
def test_huge_declared_input_is_refused_before_allocating(calib, declared_by):
    from quantbench.inputs.preprocess import MAX_INPUT_ELEMENTS

    wd, _, labels, args = calib
    big = tiny_model(wd / "models" / "big.onnx", hw=100000, sidecar=declared_by == "sidecar")
    args[args.index("--model") + 1] = big
    before = digest(wd)
    proc = _limited(args, wd)
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = error_lines(proc.stderr)
    assert len(lines) == 1 and "big" in lines[0] and f"limit of {MAX_INPUT_ELEMENTS}" in lines[0], proc.stderr
    assert "30000000000 elements" in lines[0]
    assert "Traceback" not in proc.stderr
    assert digest(wd) == before
    assert MAX_INPUT_ELEMENTS == 2 ** 28


def test_decompression_bomb_png_is_one_line(calib, capsys):
    from quantbench.inputs.preprocess import MAX_IMAGE_PIXELS, load_rgb

    wd, _, labels, args = calib
    coco = json.loads(labels.read_text())
    victim = next(im for im in coco["images"] if im["split"] == "train")["file_name"]
    bomb = labels.parent / "images" / victim
    bomb.write_bytes(png_bytes(None, 8, 2, size=(60000, 60000)))
    with pytest.raises(UserError, match=rf"{victim}: image is 3600 megapixels, more than the limit of 100 megapixels"):
        load_rgb(bomb)
    # just over our cap, far below Pillow's own bomb error: still refused, by us
    side = int((MAX_IMAGE_PIXELS + 1) ** 0.5) + 1
    bomb.write_bytes(png_bytes(None, 8, 0, size=(side, side)))
    with pytest.raises(UserError, match=rf"{victim}: image is 100 megapixels \({side}x{side}\), more than the limit"):
        load_rgb(bomb)
    bomb.write_bytes(png_bytes(None, 8, 2, size=(60000, 60000)))
    assert_refused(capsys, wd, args, f"{victim}: image is 3600 megapixels, more than the limit of 100 megapixels")


def test_16bit_and_grayscale_pngs_decode_to_8bit_rgb(tmp_path):
    """16-bit samples become 8-bit by v >> 8 (the high byte), as Pillow already does for 16-bit RGB."""
    from quantbench.inputs.preprocess import load_rgb

    g16 = np.array([[0, 255, 1000, 0x8000], [0x80FF, 0xFF00, 0xFFFE, 65535]], np.uint16)
    want = (g16 >> 8).astype(np.uint8)
    cases = {
        "gray16": (png_bytes(g16, 16, 0), np.stack([want] * 3, -1)),
        "gray8": (png_bytes(want, 8, 0), np.stack([want] * 3, -1)),
        "rgb16": (png_bytes(np.stack([g16, g16 // 2, g16 // 4], -1), 16, 2),
                  np.stack([want, (g16 // 2) >> 8, (g16 // 4) >> 8], -1).astype(np.uint8)),
        "gray-alpha16": (png_bytes(np.stack([g16, g16], -1), 16, 4), np.stack([want] * 3, -1)),
    }
    for name, (data, expect) in cases.items():
        p = tmp_path / f"{name}.png"
        p.write_bytes(data)
        got = load_rgb(p)
        assert got.dtype == np.uint8 and got.shape == (2, 4, 3), name
        assert np.array_equal(got, expect), (name, got[..., 0].tolist())
    # an 8-bit image stored as 16-bit (v * 257) decodes to exactly the 8-bit values
    v8 = np.arange(0, 256, 32, dtype=np.uint16).reshape(2, 4)
    (tmp_path / "widened.png").write_bytes(png_bytes(v8 * 257, 16, 0))
    assert np.array_equal(load_rgb(tmp_path / "widened.png")[..., 0], v8)


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "NaN"])
def test_non_finite_threshold_is_refused(workdir, capsys, value):
    assert_refused(capsys, workdir, ["equiv", "--hosts", "x86", "--threshold", value, "--gate", "decision"],
                   "--threshold")


@pytest.mark.parametrize("option", ["--atol", "--rtol"])
def test_non_finite_tolerance_is_refused(workdir, capsys, option):
    assert_refused(capsys, workdir, ["equiv", "--hosts", "x86", option, "nan"], option)


def test_non_finite_threshold_in_a_sidecar_is_refused():
    """From a sidecar the message names the file; from the caller the library names the parameter
    (ParameterError) and the command line renders it as --threshold."""
    import types

    from quantbench.cli import cli
    from quantbench.analysis.decode import spec_from_sidecar
    from quantbench.errors import ParameterError

    for bad in (float("nan"), float("inf")):
        with pytest.raises(UserError, match=r"^m.json: decode 'threshold' .*finite"):
            spec_from_sidecar({"decode": {"kind": "detr-sigmoid", "threshold": bad}}, source="m.json")
        with pytest.raises(ParameterError, match=r"^threshold=.*finite") as e:
            spec_from_sidecar({"decode": {"kind": "detr-sigmoid"}}, threshold=bad)
        assert e.value.param == "threshold" and "--" not in str(e.value)
        shown = cli._for_cli(e.value, cli.build_parser(commands=["equiv"], config=False),
                             types.SimpleNamespace(command="equiv"))
        assert re.match(r"--threshold.*finite", shown), shown


def test_non_finite_percentile_is_refused(calib, capsys):
    wd, _, _, args = calib
    assert_refused(capsys, wd, [*args, "--percentile", "nan"], "--percentile")


# --------------------------------------------------------------------------- labels and sidecars


def test_sidecar_that_is_a_json_list(calib, capsys):
    wd, model, _, args = calib
    model.with_suffix(".json").write_text("[1, 2, 3]")
    assert_refused(capsys, wd, args, "tiny.json: sidecar must be a JSON object")


@pytest.mark.parametrize("case,expect", [
    ("std0", "'std' must be non-zero"),
    ("mean2", "'mean' must be a list of 3 numbers"),
    ("std_text", "'std' must be a list of 3 numbers"),
    ("scale_text", "'scale' must be a finite non-zero number"),
    ("scale_nan", "'scale' must be a finite non-zero number"),
    ("input_list", "'input' must be an object"),
    ("shape_neg", "'shape' must be a list of positive integers"),
])
def test_bad_sidecar_input_block(calib, capsys, case, expect):
    wd, model, _, args = calib
    side = model.with_suffix(".json")

    def edit(s):
        inp = s["input"]
        if case == "std0":
            inp["std"] = [0.229, 0.0, 0.225]
        elif case == "mean2":
            inp["mean"] = [0.5, 0.5]
        elif case == "std_text":
            inp["std"] = ["a", "b", "c"]
        elif case == "scale_text":
            inp["scale"] = "1/255"
        elif case == "scale_nan":
            inp["scale"] = float("nan")
        elif case == "input_list":
            s["input"] = [1, 3, 16, 16]
        elif case == "shape_neg":
            inp["shape"] = [1, 3, -16, 16]

    _edit_json(side, edit)
    line = assert_refused(capsys, wd, args, expect)
    assert "tiny.json" in line


def test_bad_sidecar_in_run_is_refused_not_skipped(workdir, capsys):
    """`run` used to skip an unreadable sidecar silently (and feed un-normalised inputs)."""
    from hosts_helpers import image_model, make_corpus as hosts_corpus

    labels = hosts_corpus(workdir / "c", count=2)
    model = image_model(workdir / "img.onnx")
    model.with_suffix(".json").write_text(json.dumps({"input": {"name": "images", "shape": [1, 3, 8, 8],
                                                                "mean": [0, 0, 0], "std": [1, 0, 1]}}))
    line = assert_refused(capsys, workdir, ["run", "--hosts", "x86", "--variants", model, "--fixtures", labels,
                                            "--no-progress"], "'std' must be non-zero")
    assert "img.json" in line


def _coco_case(coco: dict, case: str) -> None:
    anns = coco["annotations"]
    if case == "no_image_id":
        del anns[0]["image_id"]
    elif case == "annotations_not_list":
        coco["annotations"] = {"0": anns[0]}
    elif case == "duplicate_image_id":
        coco["images"][1]["id"] = coco["images"][0]["id"]
    elif case == "unknown_category":
        anns[0]["category_id"] = 99
    elif case == "missing_image":
        anns[0]["image_id"] = 4242
    elif case == "bbox_text":
        anns[0]["bbox"] = ["a", 1, 2, 3]
    elif case == "bbox_short":
        anns[0]["bbox"] = [1, 2]
    elif case == "image_not_object":
        coco["images"][0] = "img_000.png"
    elif case == "image_id_list":
        coco["images"][0]["id"] = [1]


@pytest.mark.parametrize("case,expect", [
    ("no_image_id", "annotation 0 has no 'image_id'"),
    ("annotations_not_list", "'annotations' must be a list"),
    ("duplicate_image_id", "image id 1 appears twice"),
    ("unknown_category", "annotation 0: category_id 99 is not in 'categories'"),
    ("missing_image", "annotation 0: image_id 4242 is not in 'images'"),
    ("bbox_text", "annotation 0: bbox must be 4 finite numbers"),
    ("bbox_short", "annotation 0: bbox must be 4 finite numbers"),
    ("image_not_object", "image entry 0 is not an object"),
    ("image_id_list", "image entry 0: 'id' must be an integer or a string"),
])
def test_malformed_coco_is_one_line(calib, capsys, case, expect):
    wd, _, labels, args = calib
    _edit_json(labels, lambda c: _coco_case(c, case))
    line = assert_refused(capsys, wd, args, expect)
    assert str(labels) in line


def test_malformed_coco_in_run_fixtures(workdir, capsys):
    """The same checks guard `run --fixtures` (one loader): nothing reaches the tables."""
    from hosts_helpers import image_model, make_corpus as hosts_corpus

    labels = hosts_corpus(workdir / "c", count=2)
    model = image_model(workdir / "img.onnx")
    _edit_json(labels, lambda c: c.update(annotations=[{"id": 1, "category_id": 1, "bbox": [0, 0, 1, 1]}]))
    assert_refused(capsys, workdir, ["run", "--hosts", "x86", "--variants", model, "--fixtures", labels,
                                     "--no-progress"], "annotation 0 has no 'image_id'")


@pytest.mark.parametrize("density,expect", [("-3", "density -3 is negative"), ("1e9", "is not an object count")])
def test_csv_density_out_of_range(calib, capsys, density, expect):
    wd, _, labels, args = calib
    coco = json.loads(labels.read_text())
    rows = ["image,density,split"] + [f"{im['file_name']},{1 if not im['negative'] else 0},{im['split']}"
                                      for im in coco["images"]]
    rows[3] = rows[3].split(",")[0] + f",{density}," + rows[3].split(",")[2]
    csv_path = labels.parent / "images" / "labels.csv"
    csv_path.write_text("\n".join(rows) + "\n")
    args[args.index("--labels") + 1] = csv_path
    line = assert_refused(capsys, wd, args, expect)
    assert "labels.csv:4" in line


@pytest.mark.parametrize("per_cell,expect", [
    (10 ** 9, "--per-cell 1000000000: more than the maximum of 100000"),
    (10 ** 20, "--per-cell 100000000000000000000: more than the maximum"),
    (13, "--per-cell 13: more than the 12 images in the calibration pool"),
])
def test_absurd_per_cell(calib, capsys, per_cell, expect):
    wd, _, _, args = calib
    args[args.index("--per-cell") + 1] = per_cell
    assert_refused(capsys, wd, [*args, "--allow-short"], expect)


@pytest.mark.parametrize("entry,expect", [
    ('airgap = { kind = "imported", file = 5 }', "host 'airgap': file must be a string"),
    ('robot = { kind = "ssh", address = 7 }', "host 'robot': address must be a string"),
    ('robot = { kind = "ssh", address = "pi@robot", python = ["python3"] }', "host 'robot': python must be a string"),
    ('lab = { kind = "emulated", preset = 4 }', "host 'lab': preset must be a string"),
])
def test_hosts_file_option_types(workdir, capsys, entry, expect):
    hf = workdir / "hosts.toml"
    hf.write_text(entry + "\n")
    line = assert_refused(capsys, workdir, ["hosts", "--hosts-file", hf, "list"], expect)
    assert "hosts.toml:1" in line


def _fake_ssh(folder: Path, name: str, body: str) -> Path:
    p = folder / name
    p.write_text("#!" + sys.executable + "\n" + textwrap.dedent(body))
    p.chmod(0o755)
    return p


REFUSED = "ssh: connect to host nowhere.invalid port 22: Connection refused"

# dies at once, never reading its input; with a preamble larger than any pipe the parent's first write
# deterministically meets the closed pipe ("while receiving its job")
DIES_AT_ONCE = f"""
import os, sys
os.close(0)
sys.stderr.write({REFUSED!r} + "\\n")
sys.exit(255)
"""

# reads the worker's source and the whole first request, then the connection drops: the parent
# deterministically meets the end of the answers ("before finishing")
DIES_AFTER_REQUEST = f"""
import struct, sys
b = sys.stdin.buffer
for _ in range(int(b.readline())):  # the bootstrap's sources (hosts.ssh.worker_preamble): each named, then sized
    b.readline()
    b.read(int(b.readline()))
magic, hlen, plen = struct.unpack(">4sIQ", b.read(16))
b.read(hlen + plen)
sys.stderr.write({REFUSED!r} + "\\n")
sys.exit(255)
"""


def _dying_ssh(workdir, monkeypatch, script) -> Path:
    if script == "at_once":
        from quantbench.hosts import ssh

        # the fake never reads it: only its size matters (more than a pipe holds, so the write must wait)
        monkeypatch.setattr(ssh, "worker_preamble", lambda: b"#" * (8 << 20))
    return _fake_ssh(workdir, "fake-ssh", DIES_AT_ONCE if script == "at_once" else DIES_AFTER_REQUEST)


@pytest.mark.parametrize("script", ["at_once", "after_request"])
def test_hosts_check_on_a_dying_ssh_host(workdir, capsys, monkeypatch, script):
    fake = _dying_ssh(workdir, monkeypatch, script)
    hf = workdir / "hosts.toml"
    hf.write_text(f'dead = {{ kind = "ssh", address = "nowhere.invalid", ssh = "{fake}" }}\n')
    for _ in range(3):  # whichever stage the death is noticed in, the same line
        assert_refused(capsys, workdir, ["hosts", "--hosts-file", hf, "check", "dead"],
                       f"host dead: ssh nowhere.invalid failed: {REFUSED}")


@pytest.mark.parametrize("script", ["at_once", "after_request"])
def test_run_on_a_dying_ssh_host_names_host_and_ssh_message(workdir, monkeypatch, script):
    from hosts_helpers import fixtures, matmul_model, variant
    from quantbench.runs.runner import RunFailed, run_hosts

    fake = _dying_ssh(workdir, monkeypatch, script)
    hf = workdir / "hosts.toml"
    hf.write_text(f'dead = {{ kind = "ssh", address = "nowhere.invalid", ssh = "{fake}" }}\n')
    model = matmul_model(workdir / "m.onnx")
    for _ in range(3):
        with pytest.raises(RunFailed) as err:
            run_hosts(["dead"], [variant(model)], fixtures(1), hosts_file=hf, progress=False,
                      tables_root=workdir / "t")
        assert str(err.value).startswith(f"host dead: ssh nowhere.invalid failed: {REFUSED};"), str(err.value)


# --------------------------------------------------------------------------- leftovers and tags


KILLED_IN_STAGING = """
import os, signal, sys
sys.path.insert(0, {repo!r})
from quantbench.inputs.variantdir import staging_folder
with staging_folder({dest!r}) as tmp:
    (tmp / "half-written.onnx").write_bytes(b"x" * 100)
    print(tmp, flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
"""


def _killed_staging(dest: Path) -> Path:
    repo = str(Path(__file__).resolve().parents[2])
    proc = subprocess.run([sys.executable, "-c", KILLED_IN_STAGING.format(repo=repo, dest=str(dest))],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == -9, proc.stderr
    left = Path(proc.stdout.strip())
    assert left.is_dir() and left.parent == dest.parent and left.name.startswith(f".{dest.name}.")
    return left


def test_stale_staging_folder_of_a_killed_run_is_cleaned(calib, capsys):
    from quantbench.inputs.variantdir import staging_folder

    wd, _, _, args = calib
    dest = wd / "results" / "variants" / "tiny"
    stale = _killed_staging(dest)
    # a live run's staging folder (this process) must survive the cleanup
    with staging_folder(dest) as live:
        (live / "busy").write_text("in use")
        assert cli(capsys, *args)[0] == 0
        assert live.is_dir() and (live / "busy").exists()
        assert not stale.exists()
    leftovers = [p.name for p in dest.parent.iterdir() if p.name.startswith(".")]
    assert leftovers == [], leftovers
    # the calibration-set folder goes through the same staging
    stale_set = _killed_staging(wd / "calib_sets" / "tiny-n2-seed0")
    assert cli(capsys, *args)[0] == 0
    assert not stale_set.exists()


@pytest.mark.parametrize("tag", ["v1\n", "v1\nv2", " v1", "v1/../x", ""])
def test_release_tag_must_match_whole_string(workdir, capsys, tag):
    assert_refused(capsys, workdir, ["release", "--tag", tag], "--tag")
