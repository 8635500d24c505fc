"""`quantbench search --json` prints one JSON document on stdout: the plan's notes (the images a --limit took, an
imported host split by fingerprint) go to stderr, as equiv's and run's do under --json, so a pipe into a JSON
parser reads the outcome."""

from __future__ import annotations

import json

from quantbench.cli import main


def test_search_json_keeps_stdout_json_and_says_the_limit_on_stderr(run_dir, capsys):
    rc = main(["search", "--variant", "static-minmax", "--hosts", "x86", "--space", "global", "--limit", "2",
               "--json", "--no-progress"])
    captured = capsys.readouterr()
    shown = json.loads(captured.out)
    assert rc in (0, 1) and shown["passed"] is (rc == 0)
    assert "--limit 2: " in captured.err, captured.err
