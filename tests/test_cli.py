"""The CLI's surface: help for every command, and user mistakes as one line + exit 2."""

import json
import subprocess
import sys

import pytest

from quantbench.cli import build_parser, main
from quantbench.commands import COMMANDS


def _err_lines(text):
    return [l for l in text.splitlines() if l.strip()]


def test_help_lists_every_command_with_a_sentence(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    for name in COMMANDS:
        assert f"    {name}" in out, name


@pytest.mark.parametrize("name", COMMANDS)
def test_each_command_help_shows_options_with_defaults(name, capsys):
    with pytest.raises(SystemExit) as exc:
        main([name, "--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: quantbench {name}")
    assert "options:" in out
    # each default once: never an empty one appended, never a second one after the help's own
    for empty in ("(default: None)", "(default: False)", "(default: [])"):
        assert empty not in out, (name, empty)
    text = " ".join(out.split())
    assert "(default: the bundled corpus) (default:" not in text


def test_unknown_option_is_one_line_exit_2_in_a_real_process():
    proc = subprocess.run([sys.executable, "-m", "quantbench", "diff", "a.onnx", "b.onnx", "--no-such-option"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2
    lines = _err_lines(proc.stderr)
    assert len(lines) == 1 and "--no-such-option" in lines[0] and "Traceback" not in proc.stderr


def test_missing_model_file(tmp_path, capsys):
    missing = tmp_path / "nowhere.onnx"
    assert main(["lint", str(missing)]) == 2
    lines = _err_lines(capsys.readouterr().err)
    assert len(lines) == 1 and str(missing) in lines[0] and "not found" in lines[0]


def test_non_onnx_file(tmp_path, capsys):
    bogus = tmp_path / "photo.onnx"
    bogus.write_bytes(b"\x89PNG\r\n\x1a\n not a model at all")
    assert main(["diff", str(bogus), str(bogus)]) == 2
    lines = _err_lines(capsys.readouterr().err)
    assert len(lines) == 1 and str(bogus) in lines[0] and "not an ONNX model" in lines[0]


def test_coco_json_referencing_a_missing_image(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "images").mkdir()
    labels = tmp_path / "labels.json"
    labels.write_text(json.dumps({
        "images": [{"id": 1, "file_name": "gone.png", "width": 128, "height": 128, "split": "eval"}],
        "annotations": [], "categories": [{"id": 1, "name": "bottle"}],
    }))
    rc = main(["run", "--hosts", "x86", "--fixtures", str(labels), "--no-progress"])
    assert rc == 2
    lines = _err_lines(capsys.readouterr().err)
    assert len(lines) == 1 and "gone.png" in lines[0] and str(labels) in lines[0]
    assert not (tmp_path / "results" / "tables" / "outputs").exists()


def test_parser_builds_without_heavy_imports():
    code = ("import sys; from quantbench.cli import build_parser; build_parser(); "
            "print(sorted(m for m in ('onnxruntime', 'torch', 'sklearn') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
