"""Shared test fixtures.

Markers: `slow` (qemu emulation and other slow tests; `-m "not slow"` is the fast
subset), `ssh` (starts a real sshd on 127.0.0.1). The README's test command runs all.
"""

import os

import pytest


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    """Run a test inside an empty working folder (results/, calib_sets/ land here)."""
    monkeypatch.chdir(tmp_path)
    return tmp_path


# Tests live in subfolders mirroring the package (tests/hosts/, tests/analysis/, ...) and import the shared helpers
# (tests/hosts_helpers.py, tests/ssh_helpers.py, ...) from anywhere: tests/ is on sys.path.
import sys as _sys
from pathlib import Path as _Path

_TESTS = str(_Path(__file__).resolve().parent)
if _TESTS not in _sys.path:
    _sys.path.insert(0, _TESTS)
@pytest.fixture(autouse=True)
def no_plugin_consent():
    """Each test starts, like each command, with no plug-in allowed (quantbench.inputs.plugins keeps consent per process)."""
    from quantbench.inputs import plugins

    plugins.reset_consent()
    yield
    plugins.reset_consent()
