"""One value type for onnxruntime session options (worker/session.SessionOptions): normalised, keyed, layered and sent
the same way everywhere, and its keys and wire bytes are the ones every stored result and content-keyed cache was
made with (a change here would silently orphan them)."""

from __future__ import annotations

import pytest

from quantbench.errors import UserError
from quantbench.fsutil import canonical_json, content_key
from quantbench.hosts.deploy import deployed_session
from quantbench.hosts.keys import normalize_session, session_key, session_options
from quantbench.hosts.registry import resolve_hosts
from quantbench.hosts.requirements import applied, host_session
from quantbench.worker import REQUIRED, SessionOptions

XNN = ["XnnpackExecutionProvider", "CPUExecutionProvider"]
GIVEN = {"intra_op_num_threads": 4, "providers": XNN, "config_entries": {"b": 2, "a": "x"}}


def test_session_keys_and_wire_bytes_stay_what_the_stored_results_were_keyed_with():
    assert session_key(None) == "cbd4b1ba8ae0ef60763104bcd7a23a34fa61430501006ef13425f670ecf2b251"
    assert session_key(GIVEN) == "9a34f998e2739464a40bb13f1859136086b462d842c20e114b3478fd78d9ee7d"
    assert SessionOptions(GIVEN).json() == (
        '{"batch":1,"config_entries":{"a":"x","b":"2"},"execution_mode":"sequential","graph_optimization_level":"all",'
        '"inter_op_num_threads":1,"intra_op_num_threads":4,"providers":["XnnpackExecutionProvider",'
        '"CPUExecutionProvider"]}')
    required = applied(normalize_session(GIVEN), {"session.x64quantprecision": "1"})
    assert session_key(required) == "2f98b1edee10a82174f1dfe659d2435dc57dd16626ab244717ac96d0bcc02e4c"
    assert required[REQUIRED] == {"session.x64quantprecision": "1"}
    assert host_session(required) == normalize_session(GIVEN)
    pi = resolve_hosts(["pi"], None)[0]
    layered = deployed_session(pi, {"config_entries": {"k": "v"}, "graph_optimization_level": None,
                                    "intra_op_num_threads": 2})
    assert session_key(layered) == "f7034864eb794c5aaa4de6da855fe59ac74507fc1f7afec605a994dfd6b1ccb4"


def test_the_value_keys_as_the_workbench_always_did():
    """Its key is content_key of its canonical JSON, the wire form that JSON: the worker (standard library only)
    and the workbench (fsutil) agree byte for byte."""
    for given in (None, GIVEN, {"config_entries": {"z": 1, "a": True}}, {"graph_optimization_level": "basic"}):
        opts = SessionOptions(given)
        assert opts.json() == canonical_json(opts.wire()) and opts.key() == content_key(opts.wire())
        assert SessionOptions(opts) == opts and SessionOptions(opts.wire()).key() == opts.key()


def test_layers_merge_config_entries_key_by_key_and_skip_unset_options():
    base = SessionOptions({"config_entries": {"a": "1", "b": "2"}, "intra_op_num_threads": 3})
    top = base.layered({"config_entries": {"b": "9", "c": "3"}, "intra_op_num_threads": None,
                        "graph_optimization_level": "basic"})
    assert top["config_entries"] == {"a": "1", "b": "9", "c": "3"}
    assert top["intra_op_num_threads"] == 3 and top["graph_optimization_level"] == "basic"
    assert base.with_entries({"c": "3"})["config_entries"] == {"a": "1", "b": "2", "c": "3"}
    assert base.with_entries(None) == base
    assert base["config_entries"] == {"a": "1", "b": "2"}   # a value: layering made new ones
    wire = base.wire()
    wire["config_entries"]["a"] = "changed"
    assert base["config_entries"]["a"] == "1"               # the wire form is a copy


def test_required_entries_are_named_and_taken_off_again():
    host = SessionOptions({"config_entries": {"a": "1"}})
    ran = host.required({"session.x64quantprecision": "1"})
    assert ran[REQUIRED] == {"session.x64quantprecision": "1"} and ran.key() != host.key()
    assert ran.own() == host and host.required({}) is host


def test_a_bad_option_is_one_line_naming_it():
    with pytest.raises(UserError, match="unknown session option 'threads'"):
        session_options({"threads": 2})
    with pytest.raises(UserError, match="graph_optimization_level 'fast'"):
        session_key({"graph_optimization_level": "fast"})
