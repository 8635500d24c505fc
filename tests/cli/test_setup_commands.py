"""The README's two commands: the first sets up only what the demo's main job needs (the virtualenv and `pi`), the
second (and CI, which runs it) everything the tests need; scripts/setup.sh refuses an argument it does not know."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _readme_commands() -> list[str]:
    text = (ROOT / "README.md").read_text()
    return [ln.strip() for ln in text.splitlines()[:8] if ln.startswith("    bash scripts/setup.sh")]


def test_the_first_command_sets_up_the_demo_and_the_test_command_everything():
    demo, tests = _readme_commands()
    assert demo.startswith("bash scripts/setup.sh && ") and "equiv --hosts pi,x86" in demo
    assert tests.startswith("bash scripts/setup.sh --for-tests && ") and tests.endswith("pytest -ra -n 2 --dist loadgroup")
    ci = [ln for ln in (ROOT / ".ci" / "run").read_text().splitlines() if ln.startswith("bash ")]
    assert ci == [tests]  # CI runs the README's test command


def test_the_demo_setup_sets_up_pi_and_the_test_setup_every_host():
    script = (ROOT / "scripts" / "setup.sh").read_text()
    demo, tests = script.split('if [ $for_tests = 0 ]; then', 1)[1].split("\nfi\n", 1)
    setups = lambda text: re.findall(r"quantbench hosts setup ([^\n]+)", text)  # noqa: E731
    assert setups(demo) == ["pi"] and "exit 0" in demo
    assert setups(tests) == ["--all", "pi4@1.20.1 x86@1.20.1"]


def test_an_unknown_setup_argument_is_one_line_and_does_nothing(tmp_path):
    proc = subprocess.run(["bash", str(ROOT / "scripts" / "setup.sh"), "--everything"], capture_output=True,
                          text=True, cwd=tmp_path)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr == ("scripts/setup.sh: unknown argument --everything; run it without one (the demo) or with "
                           "--for-tests\n")
    assert list(tmp_path.iterdir()) == []
