"""The worker's side of a variant's session requirement: a session's required entries are among its config entries
(a session without any keys as it always did), and a required key the worker's own onnxruntime does not know is
refused as the session is made (onnxruntime ignores an unknown key: the session would run without it)."""

from __future__ import annotations

import pytest

from quantbench import worker as W
from quantbench.hosts.keys import probe_model, session_key
from quantbench.hosts.requirements import RequirementConflict, applied, host_session, ran_as
from quantbench.fsutil import canonical_json

X64 = {"session.x64quantprecision": "1"}


def test_a_requirement_added_to_a_host_session_is_recorded_and_taken_off_exactly():
    host = W.normalize_session({"intra_op_num_threads": 2})
    s = applied(host, X64)
    assert s["config_entries"] == X64 and s[W.REQUIRED] == X64
    assert session_key(s) != session_key(host) and host_session(s) == host
    assert ran_as(canonical_json(s), X64) and not ran_as(canonical_json(host), X64)
    assert not ran_as(canonical_json(s), {})      # a result under a requirement is not the plain variant's
    already = W.normalize_session({"config_entries": X64})
    assert applied(already, X64) == already and ran_as(canonical_json(already), X64)
    with pytest.raises(RequirementConflict, match="its session sets session.x64quantprecision=0; the variant "
                                                  "requires session.x64quantprecision=1"):
        applied(W.normalize_session({"config_entries": {"session.x64quantprecision": "0"}}), X64)
    assert W.normalize_session({W.REQUIRED: {}}) == W.normalize_session(None)
    with pytest.raises(ValueError, match="not among the config entries"):
        W.normalize_session({W.REQUIRED: X64})


def test_a_required_key_this_onnxruntime_does_not_know_is_refused_as_the_session_is_made():
    data, _ = probe_model()
    known = W.normalize_session({"config_entries": X64, W.REQUIRED: X64})
    W.make_session(data, known)   # known to this onnxruntime: made
    entries = {"session.no_such_entry_anywhere": "1"}
    with pytest.raises(ValueError, match=r"this onnxruntime \S+ does not know session config key "
                                         r"session.no_such_entry_anywhere"):
        W.make_session(data, W.normalize_session({"config_entries": entries, W.REQUIRED: entries}))
    W.make_session(data, W.normalize_session({"config_entries": entries}))  # not required: onnxruntime's own say
