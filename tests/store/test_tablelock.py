"""The tables folder's write lock: it names its holder while held and nothing after, and a command that may not wait
is refused in one line naming the holder."""

import os

import pytest

from quantbench.errors import UserError
from quantbench.store import tablelock


def test_a_held_lock_names_its_holder_and_refuses_a_second_writer_that_may_not_wait(tmp_path):
    root = tmp_path / "results" / "tables"
    with tablelock.lock(root) as path:
        assert path.read_text() == f"{os.getpid()}\n"
        with pytest.raises(UserError, match=f"locked by pid {os.getpid()} "):
            with tablelock.lock(root, wait=False):
                pass
    assert path.read_text() == ""   # released: held by no one, the file stays
    with tablelock.lock(root, wait=False):
        pass
