"""A sidecar travels with a downloaded model: the code it names (input 'plugin', a decode kind module:function)
runs only when the user asked on the command line (--preprocess / --decode, --allow-plugins), or when calibrate
recorded it, allowed, with its SHA-256. Otherwise one line names the file and the code, and nothing runs."""

import os
import sys

from plugin_helpers import PLUGIN, _calibrate, _sidecar
from quantbench.inputs import plugins
from quantbench.cli import main
from quantbench.inputs.variantdir import latest_variants


def _refused(capsys, side, key, ref, what):
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert err.endswith(f"{side}: {key} asks to run plug-in {ref} ({what}); code a file names runs only when you "
                        "ask for it: pass --allow-plugins to run it\n"), err


def test_sidecar_input_plugin_runs_nothing_at_calibrate(proj, capsys):
    workdir, model, labels = proj
    side = _sidecar(model, input={"plugin": "evil.py:prep"})
    assert _calibrate(model, labels) == 2
    _refused(capsys, side, "input 'plugin'", "evil.py:prep", f"the file {workdir / 'evil.py'}")
    assert not (workdir / "evil-ran").exists()
    assert sorted(os.listdir(workdir)) == ["corpus", "evil.py", "m"]   # nothing written


def test_sidecar_input_plugin_runs_nothing_at_run(proj, capsys):
    workdir, model, labels = proj
    side = _sidecar(model, input={"plugin": "evil.py:prep"})
    assert main(["run", "--hosts", "x86", "--variants", str(model), "--fixtures", str(labels), "--no-progress"]) == 2
    _refused(capsys, side, "input 'plugin'", "evil.py:prep", f"the file {workdir / 'evil.py'}")
    assert not (workdir / "evil-ran").exists() and not (workdir / "results").exists()


def test_sidecar_decode_module_is_not_imported(proj, capsys, monkeypatch):
    """`"kind": "this:x"` imported any installed module (the Zen of Python was printed before the error)."""
    workdir, model, labels = proj
    (workdir / "lib").mkdir()
    (workdir / "lib" / "evilmod.py").write_text(PLUGIN.format(marker="evilmod-ran"))
    monkeypatch.syspath_prepend(str(workdir / "lib"))
    for ref, what in (("evilmod:dec", "the installed module evilmod"), ("this:x", "the installed module this")):
        side = _sidecar(model, decode={"kind": ref})
        zen_before = "this" in sys.modules
        assert main(["equiv", "--hosts", "x86", "--variants", str(model), "--fixtures", str(labels),
                     "--no-progress", "--no-plots"]) == 2
        out = capsys.readouterr()
        assert "Beautiful is better than ugly" not in out.out + out.err
        assert ("this" in sys.modules) == zen_before and "evilmod" not in sys.modules
        sys.stderr.write(out.err)
        _refused(capsys, side, "decode 'kind'", ref, what)
    assert not (workdir / "lib" / "evilmod-ran").exists() and not (workdir / "results").exists()


def test_defaults_table_cannot_name_or_allow_plugins(proj, capsys):
    workdir, model, labels = proj
    for line in ('decode = "evil.py:dec"', "allow-plugins = true"):
        (workdir / "quantbench.toml").write_text(f"[defaults]\n{line}\n")
        rc = main(["equiv", "--hosts", "x86", "--variants", str(model), "--fixtures", str(labels), "--no-progress"])
        err = capsys.readouterr().err
        assert rc == 2 and err.count("\n") == 1 and "a defaults table cannot name or allow plug-ins" in err, err
        assert "quantbench.toml" in err
    assert not (workdir / "evil-ran").exists() and not (workdir / "results").exists()


def test_allowed_at_calibrate_recorded_and_run_later_unasked(proj, capsys, monkeypatch):
    """--allow-plugins at calibrate: the recipe records both plug-ins with their SHA-256; run and equiv run them
    without asking again, and refuse an edited file."""
    workdir, model, labels = proj
    _sidecar(model, input={"plugin": "evil.py:prep"}, decode={"kind": "evil.py:dec"})
    assert _calibrate(model, labels, "--allow-plugins") == 0, capsys.readouterr().err
    recipe = latest_variants()[0].recipe
    assert recipe["preprocess_plugin"]["ref"] == "evil.py:prep" and len(recipe["preprocess_plugin"]["sha256"]) == 64
    assert recipe["decode_plugin"]["ref"] == "evil.py:dec" and len(recipe["decode_plugin"]["sha256"]) == 64
    (workdir / "evil-ran").unlink()
    monkeypatch.setattr(plugins, "_FILE_MODULES", {})   # loaded afresh: the marker shows the later run ran it
    assert main(["equiv", "--hosts", "x86", "--fixtures", str(labels), "--no-progress", "--no-plots"]) == 0, \
        capsys.readouterr().err
    assert (workdir / "evil-ran").exists()
    assert main(["report", "--no-plots"]) == 0, capsys.readouterr().err   # report re-decodes: recorded, allowed
    (workdir / "evil.py").write_text(PLUGIN.format(marker="evil-ran") + "# edited\n")
    capsys.readouterr()
    assert main(["run", "--hosts", "x86", "--fixtures", str(labels), "--no-progress"]) == 2
    assert "preprocessing plug-in evil.py:prep changed since calibration" in capsys.readouterr().err


def test_named_on_the_command_line_runs(proj, capsys):
    """--decode names the code: the user asked; calibrate records it with its SHA-256."""
    workdir, model, labels = proj
    assert _calibrate(model, labels, "--decode", "evil.py:dec") == 0, capsys.readouterr().err
    assert latest_variants()[0].recipe["decode_plugin"]["ref"] == "evil.py:dec"
    assert latest_variants()[0].recipe["sidecar"]["decode"] == {"kind": "evil.py:dec"}


def test_report_asks_again_for_a_decode_plugin_read_from_the_tables(proj, capsys):
    """equiv --decode F:fn names it; report reads that name back from a table (a file): it runs with consent."""
    workdir, model, labels = proj
    argv = ["--hosts", "x86", "--variants", str(model), "--fixtures", str(labels), "--no-progress", "--no-plots"]
    assert main(["equiv", *argv, "--decode", "evil.py:dec"]) == 0, capsys.readouterr().err
    capsys.readouterr()
    before = sorted(os.listdir(workdir / "results"))
    assert main(["report", "--no-plots"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "classes (analysis " in err and \
        "decode asks to run plug-in evil.py:dec" in err and err.endswith("pass --allow-plugins to run it\n"), err
    assert sorted(os.listdir(workdir / "results")) == before
    assert main(["report", "--no-plots", "--allow-plugins"]) == 0, capsys.readouterr().err
