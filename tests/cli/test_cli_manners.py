"""Command-line manners: -q, -v, --json on every summary command, --no-progress, warnings captured,
option defaults from quantbench.toml / pyproject.toml and `quantbench config`."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from calib_helpers import make_corpus, tiny_model
from quantbench.cli import build_parser, main
from quantbench.cli.commands import COMMANDS

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}


def qb(*args, cwd, stderr_tty=False, timeout=600):
    """quantbench in a real process (real fd 2); stderr on a pseudo-terminal when asked."""
    cmd = [sys.executable, "-m", "quantbench", *map(str, args)]
    if not stderr_tty:
        return subprocess.run(cmd, cwd=cwd, env=ENV, capture_output=True, text=True, timeout=timeout)
    import pty

    import fcntl
    import struct
    import termios

    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 120, 0, 0))   # tqdm sizes bars to the terminal
    proc = subprocess.Popen(cmd, cwd=cwd, env=ENV, stdout=subprocess.PIPE, stderr=slave, text=True)
    os.close(slave)
    chunks = []
    while True:
        try:
            data = os.read(master, 65536)
        except OSError:
            break
        if not data:
            break
        chunks.append(data)
    out = proc.stdout.read()
    proc.wait(timeout=timeout)
    os.close(master)
    return subprocess.CompletedProcess(cmd, proc.returncode, out, b"".join(chunks).decode("utf-8", "replace"))


def test_every_command_has_the_output_group():
    parser = build_parser(config=False)
    for name, leaf in parser._qb_leaves.items():
        opts = {o for a in leaf._actions for o in a.option_strings}
        assert {"-q", "--quiet", "-v", "--verbose", "--json", "--no-progress"} <= opts | {"-q", "-v"}, name
        assert {"--json", "--no-progress"} <= opts, name
    assert set(COMMANDS) <= {n.split()[0] for n in parser._qb_leaves}


@pytest.fixture(scope="module")
def proj(tmp_path_factory):
    """A working folder with a tiny model, a corpus, a calibrated variants folder and one run."""
    wd = tmp_path_factory.mktemp("manners")
    make_corpus(wd / "corpus", n_litter=12, n_negative=12, n_eval=4)
    tiny_model(wd / "models" / "tiny.onnx")
    tiny_model(wd / "models" / "other.onnx", seed=1)
    with contextlib.chdir(wd):  # module fixtures cannot use monkeypatch
        assert main(["calibrate", "--model", "models/tiny.onnx", "--labels", "corpus/labels.json", "--per-cell", "3",
                     "--methods", "dynamic", "--no-progress", "-q"]) == 0
    return wd


SUMMARY_COMMANDS = {
    "calibrate": ["calibrate", "--model", "models/tiny.onnx", "--labels", "corpus/labels.json", "--per-cell", "3",
                  "--methods", "dynamic", "--no-progress"],
    "config": ["config"],
    "hosts list": ["hosts", "list"],
    "lint": ["lint", "models/tiny.onnx"],
    "diff": ["diff", "models/tiny.onnx", "models/other.onnx"],
    "run": ["run", "--hosts", "x86", "--fixtures", "corpus/labels.json", "--limit", "2", "--jobs", "1"],
    "equiv": ["equiv", "--hosts", "x86", "--fixtures", "corpus/labels.json", "--limit", "2", "--jobs", "1",
              "--no-plots"],
}


@pytest.mark.parametrize("command", sorted(SUMMARY_COMMANDS))
@pytest.mark.parametrize("flag", ["-q", "-v", "--json"])
def test_quiet_verbose_json_on_each_summary_command(proj, command, flag, monkeypatch, capsys):
    monkeypatch.chdir(proj)
    argv = SUMMARY_COMMANDS[command]
    rc_plain = main(argv)
    plain = capsys.readouterr().out
    assert plain.strip(), f"{command} printed no summary"
    rc = main([*argv, flag])
    out = capsys.readouterr().out
    assert rc == rc_plain
    if flag == "-q":
        assert out == ""
    elif flag == "--json":
        data = json.loads(out)
        assert isinstance(data, dict) and data
        native = {"calibrate": "variants", "run": "hosts", "equiv": "variants", "config": "options"}
        if command in native:  # a structured summary, not the text lines wrapped
            assert native[command] in data and "lines" not in data, data
    else:
        assert out.strip()


def test_json_is_json_even_with_quiet(proj, monkeypatch, capsys):
    monkeypatch.chdir(proj)
    assert main(["hosts", "list", "--json", "-q"]) == 0
    assert json.loads(capsys.readouterr().out)["exit_code"] == 0


def test_calibrate_no_progress_on_a_terminal(proj, tmp_path):
    make_corpus(tmp_path / "corpus", n_litter=12, n_negative=12, n_eval=4)
    tiny_model(tmp_path / "models" / "tiny.onnx")
    base = ["calibrate", "--model", "models/tiny.onnx", "--labels", "corpus/labels.json", "--per-cell", "3",
            "--methods", "dynamic,minmax", "--force"]
    bars = qb(*base, cwd=tmp_path, stderr_tty=True)
    assert bars.returncode == 0, bars.stderr
    assert "calibrate:" in bars.stderr or "calibration set:" in bars.stderr     # bars on a terminal
    quiet = qb(*base, "--no-progress", cwd=tmp_path, stderr_tty=True)
    assert quiet.returncode == 0, quiet.stderr
    assert "it/s" not in quiet.stderr and "img/s" not in quiet.stderr and "%|" not in quiet.stderr
    piped = qb(*base, cwd=tmp_path)                                              # not a terminal: no bars either
    assert piped.returncode == 0 and "%|" not in piped.stderr


def test_quantizer_warnings_are_summarised_and_shown_with_verbose(proj, tmp_path):
    make_corpus(tmp_path / "corpus", n_litter=12, n_negative=12, n_eval=4)
    tiny_model(tmp_path / "models" / "tiny.onnx")
    base = ["calibrate", "--model", "models/tiny.onnx", "--labels", "corpus/labels.json", "--per-cell", "3",
            "--methods", "dynamic,minmax", "--no-pre-process", "--force"]
    p = qb(*base, cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert "WARNING:root" not in p.stderr
    assert "from onnxruntime (-v to show)" in p.stderr
    p = qb(*base, "-v", cwd=tmp_path)
    assert p.returncode == 0
    assert "WARNING:root:Please consider to run pre-processing" in p.stderr and "(shown above)" in p.stderr


def test_onnxruntime_cpp_log_lines_on_fd2_are_captured(tmp_path):
    code = ("import os, sys, argparse\n"
            "from quantbench.cli import console\n"
            "for v in (0, 1):\n"
            "    a = argparse.Namespace(verbose=v, quiet=False, json=False, no_progress=True)\n"
            "    with console.session(a, 'x') as st:\n"
            "        os.write(2, b'\\x1b[0;93m[W:onnxruntime:, graph.cc:4470 CleanUnusedInitializers] unused\\x1b[m\\n')\n"
            "        os.write(2, b'plain C line\\n')\n"
            "        print('ours', file=sys.stderr)\n")
    p = subprocess.run([sys.executable, "-c", code], env=ENV, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    err = p.stderr.splitlines()
    assert err.count("plain C line") == 2 and err.count("ours") == 2
    assert sum("[W:onnxruntime" in ln for ln in err) == 1                    # only with -v
    assert "1 warning from onnxruntime (-v to show)" in err and "1 warning from onnxruntime (shown above)" in err


# --- option defaults ------------------------------------------------------------

def _defaults(wd, monkeypatch, capsys):
    monkeypatch.chdir(wd)
    assert main(["config", "--json"]) == 0
    opts = json.loads(capsys.readouterr().out)["options"]
    return {(o["key"], c["command"]): (c["value"], c["source"]) for o in opts for c in o["commands"]}


def test_config_precedence_flag_over_quantbench_toml_over_pyproject_over_builtin(tmp_path, monkeypatch, capsys):
    d = _defaults(tmp_path, monkeypatch, capsys)
    assert d[("budget", "equiv")] == (0, "built-in") and d[("hosts", "equiv")] == ("pi,x86", "built-in")
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "x"\n\n[tool.quantbench]\nbudget = 3\n'
                                             'hosts = ["x86", "pi4"]\nthreshold = 0.4\n\n'
                                             '[tool.quantbench.run]\nhosts = "x86"\n')
    d = _defaults(tmp_path, monkeypatch, capsys)
    assert d[("budget", "equiv")] == (3, "pyproject.toml [tool.quantbench]")
    assert d[("hosts", "equiv")][0] == ["x86", "pi4"] and d[("hosts", "run")] == ("x86", "pyproject.toml [tool.quantbench.run]")
    (tmp_path / "quantbench.toml").write_text('board = { kind = "emulated", preset = "pi4" }\n\n'
                                              '[defaults]\nbudget = 5\nfixtures = "labels.json"\n')
    d = _defaults(tmp_path, monkeypatch, capsys)
    assert d[("budget", "equiv")] == (5, "quantbench.toml [defaults]")
    assert d[("threshold", "equiv")] == (0.4, "pyproject.toml [tool.quantbench]")
    assert d[("fixtures", "run")] == ("labels.json", "quantbench.toml [defaults]")
    # what the commands actually parse
    parser = build_parser()
    args = parser.parse_args(["equiv"])
    assert (args.budget, args.hosts, args.threshold, args.fixtures) == (5, "x86,pi4", 0.4, "labels.json")
    args = parser.parse_args(["equiv", "--budget", "1", "--hosts", "pi"])
    assert (args.budget, args.hosts) == (1, "pi")                      # a flag wins
    assert parser.parse_args(["run"]).hosts == "x86"
    # the hosts file still works beside [defaults], and its trust rules hold
    from quantbench.hosts.registry import load_hosts_file

    assert set(load_hosts_file("quantbench.toml")) == {"board"}
    capsys.readouterr()
    assert main(["config"]) == 0
    out = capsys.readouterr().out
    assert "quantbench.toml [defaults]" in out and "precedence: flag > quantbench.toml" in out


def test_defaults_do_not_weaken_the_hosts_file_rules(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "quantbench.toml").write_text('x86 = { kind = "ssh", address = "a@b" }\n\n[defaults]\nhosts = "x86"\n')
    from quantbench.errors import UserError
    from quantbench.hosts.registry import load_hosts_file

    with pytest.raises(UserError, match="override = true"):
        load_hosts_file("quantbench.toml")


@pytest.mark.parametrize("text, words", [
    ('[defaults]\nbudget = "many"\n', ["budget", "many"]),
    ('[defaults]\nthreshold = nan\n', ["threshold"]),
    ('[defaults]\nno_such_option = 1\n', ["no_such_option", "no command"]),
    ('[defaults]\ndecode = "banana"\n', ["decode"]),
    ('[defaults.nosuchcommand]\nhosts = "x86"\n', ["nosuchcommand"]),
    ('[defaults]\nhosts = "x86"\nboard = { kind = "ssh", address = "a@b" }\n', ["board", "above it"]),
])
@pytest.mark.parametrize("argv", [["config"], ["equiv", "--help"]])   # every command / one that takes these options
def test_a_bad_default_is_one_line_naming_the_file(tmp_path, monkeypatch, capsys, text, words, argv):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "quantbench.toml").write_text(text)
    assert main(argv) == 2
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(err) == 1 and "quantbench.toml" in err[0] and all(w in err[0] for w in words), err


_UNKNOWN = [
    ('[defaults]\nno_such_option = 1\n', ["no_such_option", "no command"]),
    ('[defaults.nosuchcommand]\nhosts = "x86"\n', ["nosuchcommand", "hosts list"]),
]


@pytest.mark.parametrize("argv, text, words", [
    *((["--help"], t, w) for t, w in _UNKNOWN),
    *((["lint", "nowhere.onnx"], t, w) for t, w in _UNKNOWN),
    (["lint", "nowhere.onnx"], '[defaults.lint]\nbudget = 2\n',
     ["[defaults.lint] budget", "`quantbench lint` has no option --budget"]),
])
def test_an_unknown_default_is_an_error_whichever_command_runs(tmp_path, monkeypatch, capsys, argv, text, words):
    """Only the command that runs is imported; a key or table no command knows is still refused, and the running
    command checks its own table (`lint` has no --budget)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "quantbench.toml").write_text(text)
    assert main(argv) == 2
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(err) == 1 and "quantbench.toml" in err[0] and all(w in err[0] for w in words), err


def test_a_default_is_checked_by_the_commands_taking_it(tmp_path, monkeypatch, capsys):
    """A value is checked by the commands that take the option (only the running command is imported): a bad
    --budget default stops equiv, not lint; `quantbench config` checks every command."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "quantbench.toml").write_text('[defaults]\nbudget = "many"\n')
    assert main(["lint", "nowhere.onnx"]) == 2
    assert "not found" in capsys.readouterr().err
    for argv in (["equiv", "--no-run"], ["config"]):
        assert main(argv) == 2
        assert "budget" in capsys.readouterr().err
